"""The history store of an ``SQLAlchemySession`` (PostgreSQL, or SQLite through aiosqlite).

Rows are read through the inner session's own engine and ``AsyncSession`` (its connection
guard included), with the SDK's own statement plus the row ids: ``SELECT id, message_data
... ORDER BY created_at, id`` -- the same in openai-agents 0.22.3, 0.23.1 and 0.24.0, whose
tables are alike (``id`` an autoincrementing integer, ``created_at`` a timestamp stamped by the
server, an index on ``(session_id, created_at)``).

**Why a window can be trusted.** A window reads only the rows from the window's first row
on. The rows before it are the index's when, in the *same statement* (one snapshot): the
window's rows are the index's rows from that position on, then the rows appended since;
the session's first row is the index's first row; and the session has exactly as many
rows as the index before the window plus the window. Ids are never reused and the SDK only
appends, pops the newest row, clears, or replaces a suffix (compaction, which may also
delete rows from the start); the one thing that can put a row *between* rows already read
is a transaction that began before them and committed after (PostgreSQL stamps
``created_at`` when a transaction begins) -- the count catches it, the first row catches a
deleted prefix. The count is an index-only scan of the SDK's ``(session_id, created_at)``
index (about 4 ms per 100k rows on PostgreSQL).

**Identity.** Ids start over in a table dropped and created again: on PostgreSQL a stored
session is the database's id, the table's oid and the session id (the index pool's key, the
snapshots' binding).

**protoprompt's own state** (database id, index snapshots, token counts) lives in tables of
the same database: for PostgreSQL ``protoprompt_meta``, ``protoprompt_index_snapshots``,
``protoprompt_token_counts`` and ``protoprompt_summaries`` (``_summary_stores``), created
on first use under an advisory lock and used through an engine cloned from the inner
session's (its pool's connection arguments, on protoprompt's I/O loop, see ``_io``); for a
SQLite file the tables and code of ``SQLiteSession``'s fast path. A memory database keeps
no snapshots or counts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from ... import _process
from ..._seams import (
    sqlalchemy_ensure_tables,
    sqlalchemy_readable,
    sqlalchemy_session,
    sqlalchemy_shares_a_connection,
    sqlalchemy_table,
)
from ..._storage import POSTGRESQL, sql_record, sqlite_record
from ..._storage.counts import COUNTS, SQLCounts
from ..._storage.tables import META, SQLTable
from ...count_store import CountStore
from ...summaries import KIND as SUMMARIES
from .. import pool
from . import _sync
from ._prefix_state import KIND as PREFIX
from ._prefix_state import PrefixState
from ._servers import Server, shared
from ._snapshots import KIND as SNAPSHOTS
from ._snapshots import Snapshots, SQLiteSnapshots
from ._store_base import StoreBase, server_errors, unreadable
from ._store_types import StoreReadError, Unsupported, WindowRows
from ._turn_state import KIND as TURN
from ._turn_state import TurnState

T = TypeVar("T")

_log = logging.getLogger("protoprompt")

SKIP = (json.JSONDecodeError,)
"""What ``SQLAlchemySession.get_items`` skips when it decodes a row."""

_LOCK_CLASS = 0x70705353  # advisory lock class of protoprompt's session tables ("ppSS")

_SCHEMA = (
    *META.create(POSTGRESQL),
    SNAPSHOTS.create(POSTGRESQL),
    PREFIX.create(POSTGRESQL),
    TURN.create(POSTGRESQL),
    *COUNTS.create(POSTGRESQL),
    SUMMARIES.create(POSTGRESQL),
)


def _errors() -> tuple[type[BaseException], ...]:
    from sqlalchemy.exc import SQLAlchemyError

    return server_errors(SQLAlchemyError, ConnectionError)


def open_store(inner: Any, base: type[Any], session_id: str) -> SQLAlchemyStore | Unsupported:
    """The store of an ``SQLAlchemySession``, or why it has none."""
    why = unreadable(inner, base, sqlalchemy_readable(inner))
    if why is not None:
        return why
    dialect = inner.engine.dialect.name
    if dialect not in ("postgresql", "sqlite"):
        return Unsupported(
            "inner_session", f"SQLAlchemySession on {dialect} (PostgreSQL and SQLite are read)"
        )
    return SQLAlchemyStore(inner, session_id)


def _is_memory(engine: Any) -> bool:
    url = engine.url
    if engine.dialect.name != "sqlite":
        return False
    database = url.database or ""
    return database in ("", ":memory:") or "mode=memory" in str(url.query.get("mode", ""))


class SQLAlchemyStore(StoreBase):
    """See the module note."""

    kind = "sqlalchemy"
    monotone = False

    def __init__(self, inner: Any, session_id: str) -> None:
        engine = inner.engine
        memory = _is_memory(engine)
        super().__init__("memory database" if memory else "not opened yet")
        self._inner = inner
        self._session_id = session_id
        self._table = sqlalchemy_table(inner)
        self.table_name = str(self._table.name)
        self.dialect = str(engine.dialect.name)
        self.memory = memory
        self._count_store: CountStore | None = None

    # -------------------------------------------------------------- protoprompt's state

    async def open(self) -> None:
        if self._opened or self.memory:
            return
        try:
            await sqlalchemy_ensure_tables(self._inner)  # the table's identity is in the key
        except _errors() as exc:
            _log.debug("protoprompt: tables of %r not ensured: %s", self._session_id, exc)
        await self.open_once()

    def _open(self) -> None:
        engine = self._inner.engine
        if self.dialect == "sqlite":
            path = os.fspath(engine.url.database)
            db_id = pool.database_id(path)
            if db_id is None:
                self.no_store = "the database has no id of its own (read-only?)"
                return
            self.key = (db_id, "sqlalchemy:" + os.path.realpath(path), self.table_name,
                        self._session_id)  # fmt: skip
            self.snapshots = SQLiteSnapshots(path, db_id, self.table_name, self._session_id)
            self.prefixes = PrefixState(
                sqlite_record(path, PREFIX, self.table_name, self._session_id), db_id
            )
            self.turns = TurnState(
                sqlite_record(path, TURN, self.table_name, self._session_id), db_id
            )
            self.no_store = "its database could not be opened for counts"
            return
        try:
            server = _server(engine)
            server.ready()
        except Exception as exc:  # noqa: BLE001 - without our tables the rows still work
            _log.debug("protoprompt: no protoprompt tables in %s: %s", engine.url, exc)
            self.no_store = f"protoprompt's tables could not be used: {exc}"
            return
        assert server.database_id is not None
        # A table dropped and created again starts its ids over: its rows are bound to
        # the table's own identity as well (its oid).
        try:
            table = f"{self.table_name}#{server.table_oid(self.table_name)}"
        except Exception as exc:  # noqa: BLE001 - no identity: nothing shared or stored
            self.no_store = f"the table's identity could not be read: {exc}"
            return
        self.key = (server.database_id, server.location, table, self._session_id)
        self.snapshots = Snapshots(
            sql_record(server, SNAPSHOTS, table, self._session_id), server.database_id
        )
        self.prefixes = PrefixState(
            sql_record(server, PREFIX, table, self._session_id), server.database_id
        )
        self.turns = TurnState(
            sql_record(server, TURN, table, self._session_id), server.database_id
        )
        self._count_store = server.count_store
        self.no_store = "its database could not be opened for counts"

    def count_store(self, max_open_readers: int) -> CountStore | None:
        if self.key is None:
            return None
        if self.dialect == "sqlite":
            return pool.count_store(
                (self.key[0], self.key[1].removeprefix("sqlalchemy:"), "", ""), max_open_readers
            )
        return self._count_store

    # -------------------------------------------------------------- the history

    def _sa(self) -> Any:
        """The inner session's ``AsyncSession`` (0.24: through its connection guard)."""
        return sqlalchemy_session(self._inner)

    async def _rows(self, statement: Any, *, one_statement: bool = False) -> list[tuple[Any, ...]]:
        """The rows of ``statement``, read the way the inner session reads (its
        ``AsyncSession``). ``one_statement``: a read that needs no transaction around it
        (one statement is one snapshot) on a connection of the engine's pool in autocommit
        mode -- half the round trips -- unless the inner session guards a shared connection
        (0.24 over a ``StaticPool``)."""
        inner = self._inner
        try:
            await sqlalchemy_ensure_tables(inner)
            if one_statement and not sqlalchemy_shares_a_connection(inner):
                async with inner.engine.connect() as conn:
                    conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    result = await conn.execute(statement)
                    return [tuple(row) for row in result.all()]
            async with self._sa() as sess:
                result = await sess.execute(statement)
                return [tuple(row) for row in result.all()]
        except _errors() as exc:
            raise StoreReadError(str(exc).split("\n", 1)[0] or type(exc).__name__) from exc

    def _ordered(self, statement: Any) -> Any:
        m = self._table
        return statement.order_by(m.c.created_at.asc(), m.c.id.asc())

    def _from(self, row_id: int) -> Any:
        """Rows of the session from the row ``row_id`` on, in the session's order."""
        from sqlalchemy import and_, or_, select

        m = self._table
        at = (
            select(m.c.created_at)
            .where(m.c.id == row_id, m.c.session_id == self._session_id)
            .scalar_subquery()
        )
        return and_(
            m.c.session_id == self._session_id,
            m.c.created_at >= at,
            or_(m.c.created_at > at, m.c.id >= row_id),
        )

    async def read(self, look: Callable[[_sync.Rows], T]) -> tuple[list[Any], T]:
        from sqlalchemy import select

        m = self._table
        rows = await self._rows(
            self._ordered(
                select(m.c.id, m.c.message_data).where(m.c.session_id == self._session_id)
            )
        )

        def decode() -> tuple[list[Any], T]:
            items, seen = _sync.decoded(rows, SKIP)
            return items, look(seen)

        return await asyncio.to_thread(decode)

    async def read_window(
        self, view: _sync.WindowView, choose: _sync.Chooser
    ) -> WindowRows | _sync.Gone:
        from sqlalchemy import func, select

        m, sid = self._table, self._session_id
        tail_rows = await self._rows(
            self._ordered(select(m.c.id, m.c.message_data).where(self._from(view.last_id))),
            one_statement=True,
        )
        tail_items, tail = _sync.decoded(tail_rows, SKIP)
        if not tail_items or tail.id_at(0) != view.last_id:
            return _sync.Gone("popped", "the index's last row is gone")
        chosen = await asyncio.to_thread(choose, tail_items[1:], tail)
        if chosen is None:
            return _sync.Gone("", None)
        w, w_id = chosen
        total = select(func.count()).select_from(m).where(m.c.session_id == sid)
        first = self._ordered(select(m.c.id).where(m.c.session_id == sid)).limit(1)
        rows = await self._rows(
            self._ordered(
                select(
                    m.c.id,
                    m.c.message_data,
                    total.scalar_subquery(),
                    first.scalar_subquery(),
                ).where(self._from(w_id))
            ),
            one_statement=True,
        )
        if not rows:
            return _sync.Gone("popped", "a row of the window is gone")
        count, first_id = rows[0][2], rows[0][3]
        keys = [int(r[0]) for r in rows]
        try:
            at = keys.index(view.last_id)
        except ValueError:
            return _sync.Gone("popped", "the index's last row is gone")
        if keys[at:] != [int(r[0]) for r in tail_rows]:
            return _sync.Gone("changed", "rows were appended while the window was read")
        if first_id != view.first_id:
            return _sync.Gone("rewritten", "the session's first row is not the index's")
        if count != w + len(rows):
            return _sync.Gone(
                "rewritten",
                f"{count - len(rows):,} rows before the window where the index has {w:,}",
            )
        head_items, head = _sync.decoded([(r[0], r[1]) for r in rows[:at]], SKIP)
        return head_items, tail_items, tail, head.ids_from(0)


# ------------------------------------------------------------------ PostgreSQL tables


class _Server(Server):
    """protoprompt's tables in one PostgreSQL database, used through an engine of its own on
    the I/O loop (one per database URL and process): the inner engine's pool recreated
    (the same connection arguments, new connections)."""

    def __init__(self, engine: Any) -> None:
        super().__init__(engine, engine.url.render_as_string(hide_password=True))

    engine = Server.connection

    def _make(self) -> Any:
        from sqlalchemy.ext.asyncio import create_async_engine

        pool = self._source.sync_engine.pool.recreate()
        return create_async_engine(self._source.url, pool=pool)

    def _counts(self) -> Any:
        return SQLCounts(self)

    async def _meta(self) -> tuple[str | None, str | None]:
        found = await self._create()
        return found.get("database_id"), found.get("count_secret")

    def table_oid(self, table: str) -> int | None:
        """The oid of the table ``table`` names on the search path (``None``: none yet)."""
        from sqlalchemy import text

        async def read() -> Any:
            async with self.engine.connect() as conn:
                result = await conn.execute(text("SELECT to_regclass(:t)::oid"), {"t": table})
                return result.scalar()

        found = self.run(read)
        return None if found is None else int(found)

    async def _create(self) -> dict[str, str]:
        from sqlalchemy import text

        async with self.engine.begin() as conn:
            await conn.execute(text("SELECT pg_advisory_xact_lock(:c, 0)"), {"c": _LOCK_CLASS})
            for statement in _SCHEMA:
                await conn.execute(text(statement))
            meta = SQLTable(META, POSTGRESQL)
            await meta.put_new_many(
                conn, [("database_id", uuid.uuid4().hex), ("count_secret", secrets.token_hex(16))]
            )
            rows = await meta.get_many(conn, ["database_id", "count_secret"])
            return {str(k): str(v) for k, v in rows}


def _server(engine: Any) -> _Server:
    key = engine.url.render_as_string(hide_password=False)
    return shared(_process.SQL_SERVERS, key, _Server, engine)
