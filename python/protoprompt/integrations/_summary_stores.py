"""Where a session's rolling summary is kept: beside its history, in the same engine, shared
by every worker serving the session (see :mod:`protoprompt.summaries`).

===========================  ==========================================================
inner session                the summary
===========================  ==========================================================
``SQLiteSession`` (a file)   table ``protoprompt_summaries`` of the file
``SQLAlchemySession``        the same table in its database: on a SQLite file as for
                             ``SQLiteSession``; on PostgreSQL bound to the messages
                             table's identity (``name#oid``), like the index snapshots
``RedisSession``             a hash ``{prefix}:{id}:protoprompt:summary``
anything else, or a memory   kept by this process (:class:`MemorySummaryStore`)
database
===========================  ==========================================================

Every engine keeps the SQLite rules: a stored summary sits behind a checksum of its fields
(a damaged row, a row of another kind of key or of another table is read as no summary and
replaced by the next update); an update is a compare-and-set against the state it began
from, so workers never go back to an older summary; a clear stores an empty summary of the
next version (a *tombstone*), so an update that began before the clear -- from the old
state, or from none -- is not stored. On Redis the summary expires with the session's list
as it was when the summary was written (a session whose ``ttl`` keeps extending its list
may lose its summary: it is then made again from the rows still stored), a tombstone after
a day (far longer than an update may run), and nothing is written once the list is gone.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from .. import _seams
from ..summaries import SQLiteSummaryStore, SummaryState, SummaryStore
from ..summaries import _checksum as checksum
from ._io import io_loop

_log = logging.getLogger("protoprompt")

_TIMEOUT = 5.0
TOMBSTONE_SECONDS = 86_400
"""How long a Redis tombstone (the summary of a cleared session) is kept."""
_CAS_TRIES = 8


def summary_store_for(inner: Any, session_id: str, *, keyed: str) -> SummaryStore | None:
    """The store of the summary of ``inner``'s session beside its history (``None``: none,
    the summary is kept by the process). ``keyed``: what the summary's ``upto`` counts
    (``"row"`` ids or ``"position"``)."""
    from ._sdk import SQLiteSession
    from ._store import _class_named

    if isinstance(inner, SQLiteSession):
        db = getattr(inner, "db_path", None)
        if not isinstance(db, (str, os.PathLike)) or os.fspath(db) == ":memory:":
            return None
        return SQLiteSummaryStore(os.fspath(db), str(inner.messages_table), session_id, keyed=keyed)
    module = "agents.extensions.memory.sqlalchemy_session"
    if _class_named(inner, module, "SQLAlchemySession") is not None:
        return _sqlalchemy(inner, session_id, keyed)
    module = "agents.extensions.memory.redis_session"
    if _class_named(inner, module, "RedisSession") is not None and _seams.redis_readable(inner):
        return RedisSummaryStore(inner, session_id, keyed)
    return None


def _sqlalchemy(inner: Any, session_id: str, keyed: str) -> SummaryStore | None:
    from ._sqlalchemy_store import _is_memory

    engine = getattr(inner, "engine", None)
    readable = _seams.sqlalchemy_readable(inner)
    table = getattr(_seams.sqlalchemy_table(inner), "name", None) if readable else None
    if engine is None or not isinstance(table, str) or _is_memory(engine):
        return None
    dialect = engine.dialect.name
    if dialect == "sqlite":
        path = os.fspath(engine.url.database)
        return SQLiteSummaryStore(path, table, session_id, keyed=keyed)
    if dialect == "postgresql":
        return PostgresSummaryStore(inner, table, session_id, keyed)
    return None


def _state(
    fields: tuple[Any, ...] | None, table: str, session_id: str, keyed: str
) -> SummaryState | None:
    """The state a stored ``(keyed, upto, version, summary, checksum)`` holds, or ``None``
    (none, damaged, or foreign: never trusted)."""
    if fields is None:
        return None
    found, upto, version, text, check = fields
    if (
        found != keyed
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in (upto, version))
        or not isinstance(text, str)
        or check != checksum(table, session_id, keyed, upto, version, text)
    ):
        return None
    return SummaryState(text, upto, version)


# ------------------------------------------------------------------ PostgreSQL


class PostgresSummaryStore:
    """The summary of a ``SQLAlchemySession`` on PostgreSQL: a row of
    ``protoprompt_summaries`` keyed by the messages table's identity and the session, used
    on protoprompt's I/O loop (see ``_sqlalchemy_store``)."""

    def __init__(self, inner: Any, table: str, session_id: str, keyed: str) -> None:
        self._inner = inner
        self._table_name = table
        self._session = session_id
        self._keyed = keyed
        self._where: tuple[Any, str] | None = None  # (server, "name#oid")

    def _located(self) -> tuple[Any, str]:
        """protoprompt's tables of the database and the messages table's identity (found
        once; no lock is held while they are looked up, so none is held at a fork)."""
        where = self._where
        if where is None:
            from ._sqlalchemy_store import _server

            server = _server(self._inner.engine)
            server.ready()  # creates protoprompt's tables, this one included
            oid = server.table_oid(self._table_name)
            if oid is None:
                raise LookupError(f"the session's table {self._table_name!r} does not exist")
            where = self._where = (server, f"{self._table_name}#{oid}")
        return where

    async def _read(self, conn: Any, table: str, *, lock: bool) -> tuple[bool, SummaryState | None]:
        """Whether a row is stored, and the state it holds."""
        from sqlalchemy import text

        result = await conn.execute(
            text(
                "SELECT keyed, upto, version, summary, checksum FROM protoprompt_summaries"
                " WHERE messages_table = :t AND session_id = :s" + (" FOR UPDATE" if lock else "")
            ),
            {"t": table, "s": self._session},
        )
        row = result.first()
        fields = None if row is None else tuple(row)
        return row is not None, _state(fields, table, self._session, self._keyed)

    def load(self) -> SummaryState | None:
        try:
            server, table = self._located()

            async def read() -> SummaryState | None:
                async with server.engine.connect() as conn:
                    return (await self._read(conn, table, lock=False))[1]

            found: SummaryState | None = server.run(read)
            return found
        except Exception as exc:  # noqa: BLE001 - an unreadable summary is absent
            _log.debug("protoprompt: summary of %r not read: %s", self._session, exc)
            return None

    def _write_params(self, table: str, text: str, upto: int, version: int) -> dict[str, Any]:
        return {
            "t": table,
            "s": self._session,
            "k": self._keyed,
            "u": upto,
            "v": version,
            "x": text,
            "at": time.time(),
            "c": checksum(table, self._session, self._keyed, upto, version, text),
        }

    async def _put(self, conn: Any, exists: bool, params: dict[str, Any]) -> bool:
        """Write the row (insert or update); ``False`` when another worker inserted it
        first."""
        from sqlalchemy import text

        if exists:
            await conn.execute(
                text(
                    "UPDATE protoprompt_summaries SET keyed = :k, upto = :u, version = :v,"
                    " summary = :x, updated_at = :at, checksum = :c"
                    " WHERE messages_table = :t AND session_id = :s"
                ),
                params,
            )
            return True
        result = await conn.execute(
            text(
                "INSERT INTO protoprompt_summaries VALUES (:t, :s, :k, :u, :v, :x, :at, :c)"
                " ON CONFLICT (messages_table, session_id) DO NOTHING"
            ),
            params,
        )
        return bool(result.rowcount)

    def save(self, previous: SummaryState | None, text: str, upto: int) -> bool:
        server, table = self._located()

        async def write() -> bool:
            async with server.engine.begin() as conn:
                exists, current = await self._read(conn, table, lock=True)
                if current != previous or (previous is not None and upto <= previous.upto):
                    return False
                version = 1 if previous is None else previous.version + 1
                return await self._put(conn, exists, self._write_params(table, text, upto, version))

        done: bool = server.run(write)
        return done

    def clear(self) -> None:
        server, table = self._located()

        async def write() -> bool:
            async with server.engine.begin() as conn:
                exists, current = await self._read(conn, table, lock=True)
                version = (0 if current is None else current.version) + 1
                return await self._put(conn, exists, self._write_params(table, "", 0, version))

        for _ in range(_CAS_TRIES):
            if server.run(write):
                return
        raise RuntimeError(f"the summary of {self._session!r} could not be cleared")


# ------------------------------------------------------------------ Redis


class RedisSummaryStore:
    """The summary of a ``RedisSession``: a hash ``{prefix}:{id}:protoprompt:summary``
    (fields ``keyed``, ``upto``, ``version``, ``summary``, ``checksum``), written under
    ``WATCH`` (a compare-and-set), used on protoprompt's I/O loop (see ``_redis_store``)."""

    def __init__(self, inner: Any, session_id: str, keyed: str) -> None:
        self._inner = inner
        self._session = session_id
        self._keyed = keyed
        session_key, self._list, self._prefix = _seams.redis_keys(inner)
        self.key = f"{session_key}:protoprompt:summary"
        self._server: Any = None

    def _client(self) -> Any:
        """A client of protoprompt's I/O loop (the server's keys found once)."""
        server = self._server
        if server is None:
            from ._redis_store import _server

            server = _server(_seams.redis_client(self._inner), self._prefix)
            server.ready()
            self._server = server
        return server.client

    def _run(self, make: Callable[[], Any]) -> Any:
        return io_loop().run(make, _TIMEOUT)

    def _decode(self, raw: dict[Any, Any]) -> SummaryState | None:
        if not raw:
            return None

        def field(name: str) -> str | None:
            value = raw.get(name.encode())
            if not isinstance(value, bytes):
                return None
            try:
                return value.decode("utf-8")
            except UnicodeDecodeError:
                return None

        def number(name: str) -> int | None:
            value = field(name)
            return int(value) if value is not None and value.isascii() and value.isdigit() else None

        fields = (field("keyed"), number("upto"), number("version"), field("summary"))
        return _state((*fields, field("checksum")), self._list, self._session, self._keyed)

    def load(self) -> SummaryState | None:
        try:
            client = self._client()

            async def read() -> dict[Any, Any]:
                return dict(await client.hgetall(self.key))

            return self._decode(self._run(read))
        except Exception as exc:  # noqa: BLE001 - an unreadable summary is absent
            _log.debug("protoprompt: summary of %r not read: %s", self._session, exc)
            return None

    def _mapping(self, text: str, upto: int, version: int) -> dict[str, Any]:
        check = checksum(self._list, self._session, self._keyed, upto, version, text)
        return {"keyed": self._keyed, "upto": upto, "version": version, "summary": text,
                "checksum": check}  # fmt: skip

    async def _cas(
        self, client: Any, decide: Callable[[SummaryState | None], dict[str, Any] | None]
    ) -> bool:
        """Replace the hash with what ``decide`` makes of the stored state (``None``: leave
        it), if nothing changed it meanwhile; ``False`` when left or changed."""
        from redis.exceptions import WatchError

        async with client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(self.key)
                current = self._decode(dict(await pipe.hgetall(self.key)))
                mapping = decide(current)
                if mapping is None:
                    return False
                tombstone = mapping["summary"] == ""
                at = int(await pipe.pexpiretime(self._list))
                if at == -2 and not tombstone:
                    return False  # the history is gone: no summary of it
                pipe.multi()
                pipe.delete(self.key)
                pipe.hset(self.key, mapping=mapping)
                if tombstone:
                    pipe.expire(self.key, TOMBSTONE_SECONDS)
                elif at > 0:
                    pipe.pexpireat(self.key, at)
                await pipe.execute()
                return True
            except WatchError:
                return False

    def save(self, previous: SummaryState | None, text: str, upto: int) -> bool:
        def decide(current: SummaryState | None) -> dict[str, Any] | None:
            if current != previous or (previous is not None and upto <= previous.upto):
                return None
            return self._mapping(text, upto, 1 if previous is None else previous.version + 1)

        client = self._client()

        async def write() -> bool:
            return await self._cas(client, decide)

        done: bool = self._run(write)
        return done

    def clear(self) -> None:
        def decide(current: SummaryState | None) -> dict[str, Any]:
            return self._mapping("", 0, (0 if current is None else current.version) + 1)

        client = self._client()

        async def write() -> bool:
            return await self._cas(client, decide)

        for _ in range(_CAS_TRIES):
            if self._run(write):
                return
        raise RuntimeError(f"the summary of {self._session!r} could not be cleared")
