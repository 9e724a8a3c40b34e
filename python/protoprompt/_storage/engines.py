"""The engines a session record lives in: a SQLite file, a PostgreSQL database (through
SQLAlchemy), a Redis database. Each runs the kind's statements on connections of its own
(SQLite: one per call, inside the fork gate; PostgreSQL and Redis: the server's, on
protoprompt's I/O loop) and never raises (see :mod:`.records`)."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

from .._process import sqlite_gate
from .dialect import SQLITE
from .records import Decide, Kind, Record

__all__ = [
    "RedisRecord",
    "SQLRecord",
    "SQLiteRecord",
    "redis_record",
    "sql_record",
    "sqlite_record",
]

_log = logging.getLogger("protoprompt")


def _why(exc: BaseException) -> str:
    return str(exc).split("\n", 1)[0] or type(exc).__name__


class _Base:
    def __init__(self, kind: Kind, where: tuple[str, str]) -> None:
        self.kind = kind
        self.where = where

    def _keys(self) -> dict[str, Any]:
        return {"messages_table": self.where[0], "session_id": self.where[1]}

    def _params(self, values: dict[str, Any]) -> dict[str, Any]:
        return {**self._keys(), **{c: values[c] for c in self.kind.columns}}

    def _row(self, row: Any) -> dict[str, Any] | None:
        return None if row is None else dict(zip(self.kind.columns, row, strict=True))

    def _failed(self, what: str, exc: BaseException) -> str:
        _log.debug("protoprompt: %s of %r not %s: %s", self.kind.table, self.where[1], what, exc)
        return _why(exc)


# ------------------------------------------------------------------ SQLite


class SQLiteRecord(_Base):
    """A record in a SQLite database file; the table is made on the first write (and made
    again when it has another layout, whose rows no version reading this one can use)."""

    def __init__(self, db_path: str, kind: Kind, where: tuple[str, str]) -> None:
        super().__init__(kind, where)
        self.db_path = db_path

    def _run(self, work: Callable[[sqlite3.Connection], Any], *, write: bool) -> Any:
        with (
            sqlite_gate(),
            contextlib.closing(
                sqlite3.connect(self.db_path, timeout=5.0, check_same_thread=False)
            ) as conn,
            conn,
        ):
            if write:
                columns = [r[1] for r in conn.execute(f"PRAGMA table_info({self.kind.table})")]
                if columns and columns != ["messages_table", "session_id", *self.kind.columns]:
                    conn.execute(f"DROP TABLE {self.kind.table}")
                conn.execute(self.kind.create(SQLITE))
            return work(conn)

    def load(self) -> dict[str, Any] | None:
        try:
            row = self._run(lambda c: c.execute(self.kind.select(), self._keys()).fetchone(),
                            write=False)  # fmt: skip
        except sqlite3.Error:
            return None  # no table yet, or an unreadable database
        return self._row(row)

    def save(self, values: dict[str, Any]) -> str | None:
        try:
            self._run(lambda c: c.execute(self.kind.upsert(), self._params(values)), write=True)
            return None
        except sqlite3.Error as exc:
            return self._failed("written", exc)

    def swap(self, expected: int | None, values: dict[str, Any]) -> bool | str:
        def work(conn: sqlite3.Connection) -> bool:
            if expected is None:
                cur = conn.execute(self.kind.insert_new(), self._params(values))
            else:
                cur = conn.execute(
                    self.kind.update_if(), {**self._params(values), "expected": expected}
                )
            return cur.rowcount == 1

        try:
            return bool(self._run(work, write=True))
        except sqlite3.Error as exc:
            return self._failed("written", exc)

    def update(self, decide: Decide, *, outlive: int | None = None) -> bool | str:
        def work(conn: sqlite3.Connection) -> bool:
            conn.execute("BEGIN IMMEDIATE")  # the row stays as read until the commit
            row = conn.execute(self.kind.select(), self._keys()).fetchone()
            values = decide(self._row(row))
            if values is None:
                return False
            statement = self.kind.insert_new() if row is None else self.kind.replace()
            return conn.execute(statement, self._params(values)).rowcount == 1

        try:
            return bool(self._run(work, write=True))
        except sqlite3.Error as exc:
            return self._failed("written", exc)

    def delete(self) -> None:
        with contextlib.suppress(sqlite3.Error):  # no table: nothing to delete
            self._run(lambda c: c.execute(self.kind.delete(), self._keys()), write=False)


# ------------------------------------------------------------------ PostgreSQL


class SQLRecord(_Base):
    """A record in a PostgreSQL database whose tables the server made (``_Server.ready``
    creates every kind's table with protoprompt's others)."""

    def __init__(self, server: Any, kind: Kind, where: tuple[str, str]) -> None:
        super().__init__(kind, where)
        self._server = server

    def _run(self, statement: str, params: dict[str, Any], *, write: bool) -> Any:
        from sqlalchemy import text

        async def work() -> Any:
            engine = self._server.engine
            async with engine.begin() if write else engine.connect() as conn:
                result = await conn.execute(text(statement), params)
                return result.rowcount if write else result.first()

        return self._server.run(work)

    def load(self) -> dict[str, Any] | None:
        try:
            return self._row(self._run(self.kind.select(), self._keys(), write=False))
        except Exception as exc:  # noqa: BLE001 - an unreadable record is absent
            self._failed("read", exc)
            return None

    def save(self, values: dict[str, Any]) -> str | None:
        try:
            self._run(self.kind.upsert(), self._params(values), write=True)
            return None
        except Exception as exc:  # noqa: BLE001 - a lost record only costs a rebuild
            return self._failed("written", exc)

    def swap(self, expected: int | None, values: dict[str, Any]) -> bool | str:
        params = self._params(values)
        if expected is None:
            statement = self.kind.insert_new()
        else:
            statement, params = self.kind.update_if(), {**params, "expected": expected}
        try:
            return int(self._run(statement, params, write=True)) == 1
        except Exception as exc:  # noqa: BLE001 - a lost record only costs a rebuild
            return self._failed("written", exc)

    def update(self, decide: Decide, *, outlive: int | None = None) -> bool | str:
        from sqlalchemy import text

        async def work() -> bool:
            async with self._server.engine.begin() as conn:
                found = await conn.execute(text(self.kind.select() + " FOR UPDATE"), self._keys())
                row = found.first()
                values = decide(self._row(row))
                if values is None:
                    return False
                # No row to lock: another worker's insert may come first (then nothing).
                statement = self.kind.insert_new() if row is None else self.kind.replace()
                result = await conn.execute(text(statement), self._params(values))
                return int(result.rowcount) == 1

        try:
            return bool(self._server.run(work))
        except Exception as exc:  # noqa: BLE001 - said to the caller
            return self._failed("written", exc)

    def delete(self) -> None:
        try:
            self._run(self.kind.delete(), self._keys(), write=True)
        except Exception as exc:  # noqa: BLE001 - what it described is gone
            self._failed("deleted", exc)


# ------------------------------------------------------------------ Redis

# Compare-and-set of a hash in one step: KEYS[1] the record, ARGV: the version field, the
# expected version ('' = no record), the expiry (ms since the epoch, 0 = none), then fields
# and values.
_SWAP = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
elseif cur ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
if tonumber(ARGV[3]) > 0 then redis.call('PEXPIREAT', KEYS[1], ARGV[3])
else redis.call('PERSIST', KEYS[1]) end
return 1
"""


class RedisRecord(_Base):
    """A hash ``{session key}:protoprompt:{suffix}`` that expires with the session's list
    (``where[0]``): written when the list is gone, it is deleted instead."""

    def __init__(self, server: Any, kind: Kind, where: tuple[str, str]) -> None:
        super().__init__(kind, where)
        self._server = server
        self.key = f"{where[0].removesuffix(':messages')}:protoprompt:{kind.suffix}"

    def _mapping(self, values: dict[str, Any]) -> dict[str, Any]:
        return {f.hash_field: values[f.name] for f in self.kind.redis_fields}

    def _values(self, found: list[Any]) -> dict[str, Any] | None:
        if all(v is None for v in found):
            return None
        return {f.name: v for f, v in zip(self.kind.redis_fields, found, strict=True)}

    def load(self) -> dict[str, Any] | None:
        fields = [f.hash_field for f in self.kind.redis_fields]

        async def read() -> Any:
            return await self._server.client.hmget(self.key, fields)

        try:
            found = self._server.run(read)
        except Exception as exc:  # noqa: BLE001 - an unreadable record is absent
            self._failed("read", exc)
            return None
        return self._values(found)

    async def _expiry(self) -> int | None:
        """The list's expiry (ms; 0: none), or ``None`` when the list is gone (the record
        is then deleted)."""
        client = self._server.client
        at = int(await client.pexpiretime(self.where[0]))
        if at == -2:
            await client.delete(self.key)  # the history is gone: nothing of it is kept
            return None
        return max(at, 0)

    def save(self, values: dict[str, Any]) -> str | None:
        async def write() -> None:
            at = await self._expiry()
            if at is None:
                return
            async with self._server.client.pipeline(transaction=True) as pipe:
                pipe.hset(self.key, mapping=self._mapping(values))
                if at > 0:
                    pipe.pexpireat(self.key, at)
                else:
                    pipe.persist(self.key)
                await pipe.execute()

        try:
            self._server.run(write)
            return None
        except Exception as exc:  # noqa: BLE001 - a lost record only costs a rebuild
            return self._failed("written", exc)

    def swap(self, expected: int | None, values: dict[str, Any]) -> bool | str:
        assert self.kind.version is not None
        version = next(f.hash_field for f in self.kind.redis_fields if f.name == self.kind.version)
        flat = [x for kv in self._mapping(values).items() for x in kv]

        async def write() -> bool:
            at = await self._expiry()
            if at is None:
                return False
            args = [version, "" if expected is None else str(expected), str(at), *flat]
            return int(await self._server.client.eval(_SWAP, 1, self.key, *args)) == 1

        try:
            return bool(self._server.run(write))
        except Exception as exc:  # noqa: BLE001 - a lost record only costs a rebuild
            return self._failed("written", exc)

    def update(self, decide: Decide, *, outlive: int | None = None) -> bool | str:
        from redis.exceptions import WatchError

        fields = [f.hash_field for f in self.kind.redis_fields]

        async def write() -> bool:
            async with self._server.client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(self.key)
                    values = decide(self._values(await pipe.hmget(self.key, fields)))
                    if values is None:
                        return False
                    at = int(await pipe.pexpiretime(self.where[0]))
                    if at == -2 and outlive is None:
                        return False  # the history is gone: nothing of it is kept
                    pipe.multi()
                    pipe.delete(self.key)
                    pipe.hset(self.key, mapping=self._mapping(values))
                    if outlive is not None:
                        pipe.expire(self.key, outlive)
                    elif at > 0:
                        pipe.pexpireat(self.key, at)
                    await pipe.execute()
                    return True
                except WatchError:
                    return False  # written meanwhile

        try:
            return bool(self._server.run(write))
        except Exception as exc:  # noqa: BLE001 - said to the caller
            return self._failed("written", exc)

    def delete(self) -> None:
        async def delete() -> None:
            await self._server.client.delete(self.key)

        try:
            self._server.run(delete)
        except Exception as exc:  # noqa: BLE001 - what it described is gone
            self._failed("deleted", exc)


# ------------------------------------------------------------------ a session's record


def sqlite_record(db_path: str, kind: Kind, table: str, session_id: str) -> Record:
    """The record in a SQLite database file."""
    return SQLiteRecord(db_path, kind, (table, session_id))


def sql_record(server: Any, kind: Kind, table: str, session_id: str) -> Record:
    """The record in a PostgreSQL database (``server``: its ``_Server``, whose tables hold
    the kind's)."""
    return SQLRecord(server, kind, (table, session_id))


def redis_record(server: Any, kind: Kind, list_key: str, session_id: str) -> Record:
    """The record of the session whose list is ``list_key``, expiring with it."""
    return RedisRecord(server, kind, (list_key, session_id))
