"""Token counts on every engine: ``(key, tokens, mac)`` rows, at most ``max_entries``.

* SQL (SQLite, PostgreSQL): the table ``protoprompt_token_counts`` (:data:`COUNTS`), the
  oldest written first out (SQLite: by ``rowid``, a rewritten count becomes the newest;
  PostgreSQL: by an identity column ``seq``). A SQLite ``tokens`` has no type: a value is
  stored exactly as written.
* Redis: the hash ``{prefix}:protoprompt:counts``, field = key, value = the count (8 bytes,
  little-endian) and its check (8 bytes); random fields evicted beyond ``max_entries``.

What the rows mean (keys, checks) is ``protoprompt.count_store``'s; here they are only read
and written. :class:`SQLiteCounts` works on the caller's connection; :class:`SQLCounts` and
:class:`RedisCounts` are a ``RemoteCountStore``'s backends (coroutines on the server's I/O
loop). Every failure raises.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from .dialect import POSTGRESQL
from .tables import SQLiteTable, SQLTable, Table

__all__ = ["COUNTS", "SQLITE_COUNTS", "Found", "RedisCounts", "SQLCounts", "SQLiteCounts"]

COUNTS = Table(
    "protoprompt_token_counts",
    key=("key", "blob"),
    columns=(("tokens", "exact"), ("mac", "blob")),
    aged=True,
)

Found = dict[bytes, tuple[object, object]]
"""The stored ``(tokens, mac)`` of each stored key, as the engine returned them (unchecked)."""

CountRow = tuple[bytes, int, bytes]


def _found(rows: Sequence[tuple[Any, ...]]) -> Found:
    return {k: (n, mac) for k, n, mac in rows if type(k) is bytes}


class SQLiteCounts:
    """The counts table of a SQLite database, on the caller's connection."""

    _ops = SQLiteTable(COUNTS)

    def fetch(self, conn: sqlite3.Connection, keys: Sequence[bytes]) -> Found:
        return _found(self._ops.get_many(conn, keys))

    def write(self, conn: sqlite3.Connection, rows: Sequence[CountRow], max_entries: int) -> None:
        """Store the rows and trim (the caller commits)."""
        self._ops.put_many(conn, rows)
        self._ops.trim(conn, max_entries)

    def delete_all(self, conn: sqlite3.Connection) -> None:
        self._ops.delete(conn)

    def size(self, conn: sqlite3.Connection) -> int:
        return self._ops.size(conn)


SQLITE_COUNTS = SQLiteCounts()


class SQLCounts:
    """The counts table of a PostgreSQL database (``server.engine``: a SQLAlchemy
    ``AsyncEngine`` of the I/O loop)."""

    _ops = SQLTable(COUNTS, POSTGRESQL)

    def __init__(self, server: Any) -> None:
        self._server = server

    async def fetch(self, keys: Sequence[bytes]) -> Found:
        async with self._server.engine.connect() as conn:
            return _found(await self._ops.get_many(conn, keys))

    async def write(self, rows: Sequence[CountRow], max_entries: int) -> None:
        async with self._server.engine.begin() as conn:
            await self._ops.put_many(conn, rows)
            await self._ops.trim(conn, max_entries)

    async def delete_all(self) -> None:
        async with self._server.engine.begin() as conn:
            await self._ops.delete(conn)

    async def size(self) -> int:
        async with self._server.engine.connect() as conn:
            return await self._ops.size(conn)


class RedisCounts:
    """The counts hash ``server.counts_key`` (``server.client``: a ``redis.asyncio`` client
    of the I/O loop answering bytes)."""

    def __init__(self, server: Any) -> None:
        self._server = server

    async def fetch(self, keys: Sequence[bytes]) -> Found:
        values = await self._server.client.hmget(self._server.counts_key, list(keys))
        found: Found = {}
        for k, v in zip(keys, values, strict=True):
            if v is None:
                continue
            if type(v) is bytes and len(v) == 16:
                found[k] = (int.from_bytes(v[:8], "little"), v[8:])
            else:
                found[k] = ("damaged", None)
        return found

    async def write(self, rows: Sequence[CountRow], max_entries: int) -> None:
        client = self._server.client
        key = self._server.counts_key
        await client.hset(key, mapping={k: n.to_bytes(8, "little") + m for k, n, m in rows})
        extra = int(await client.hlen(key)) - max_entries
        if extra > 0:
            victims = await client.hrandfield(key, extra)
            if victims:
                await client.hdel(key, *victims)

    async def delete_all(self) -> None:
        await self._server.client.delete(self._server.counts_key)

    async def size(self) -> int:
        return int(await self._server.client.hlen(self._server.counts_key))
