"""The storage seam of :class:`ProtoPromptSession`'s fast path: one *history store* per engine.

A history store reads a stored session's history the way the SDK's own session reads it --
the same items, in the same order -- together with the key of each item's row (see
``_sync``), reads token windows (only the newest rows, with what proves that the rows before
them are still the index's), and keeps the index snapshots and token counts beside the
history, in the same engine, shared by every worker:

===================  ==========================  ==========================================
inner session        rows and keys               snapshots, counts, database id
===================  ==========================  ==========================================
``SQLiteSession``    ``RowReader`` (ids)         tables ``protoprompt_*`` of the file
(a database file)
``SQLAlchemySession`` its engine, ``(created_at,  tables ``protoprompt_*`` of the database
(PostgreSQL, SQLite)  id)`` order (ids)          (``_sqlalchemy_store``)
``RedisSession``     its client, ``LRANGE``      keys under the session's key prefix
                     (keyed digests)             (``_redis_store``)
===================  ==========================  ==========================================

:func:`open_store` picks the store for an inner session, or says why there is none (the
session then takes the plain path, and its turn reports say why). The session itself never
knows which engine it talks to.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from ..._storage import sqlite_record
from ...count_store import CountStore
from .. import pool
from . import _sync
from ._prefix_state import KIND as PREFIX
from ._prefix_state import PrefixState
from ._snapshots import SnapshotStore, SQLiteSnapshots
from ._store_base import StoreBase
from ._store_types import StoreReadError as StoreReadError
from ._store_types import Unsupported as Unsupported
from ._store_types import WindowRows as WindowRows
from ._store_types import unsupported_override as unsupported_override
from ._turn_state import KIND as TURN
from ._turn_state import TurnState

__all__ = [
    "HistoryStore",
    "SQLiteStore",
    "StoreReadError",
    "Unsupported",
    "open_store",
]

T = TypeVar("T")


class HistoryStore(Protocol):
    """One stored session's history, read the way its SDK session reads it (module note)."""

    kind: str
    """``"sqlite"``, ``"sqlalchemy"`` or ``"redis"``."""
    monotone: bool
    """Keys only grow along the history (SQLite ids): see ``_sync.kept_prefix``."""
    key: pool.Key | None
    """The stored session's identity for the process's index pool (``None`` until
    :meth:`open` found the database's id, or when it has none)."""
    snapshots: SnapshotStore | None
    """Where index snapshots are kept (``None``: nowhere, see :attr:`no_store`)."""
    prefixes: PrefixState | None
    """Where the session's cache-stable prefix is kept (``None``: nowhere)."""
    turns: TurnState | None
    """Where the session callback's prefix is kept (``None``: nowhere)."""
    no_store: str
    """Why snapshots and counts are off (when they are)."""

    async def open(self) -> None:
        """Find the database's id and create protoprompt's tables or keys, once (never
        raises: without them snapshots and counts are off and :attr:`no_store` says why)."""
        ...

    async def read(self, look: Callable[[_sync.Rows], T]) -> tuple[list[Any], T]:
        """The session's items exactly as the SDK's ``get_items()`` returns them (no limit),
        from one read, and what ``look`` (called in a worker thread) makes of the rows.
        Raises :class:`StoreReadError`."""
        ...

    async def read_window(
        self, view: _sync.WindowView, choose: _sync.Chooser
    ) -> WindowRows | _sync.Gone:
        """The newest rows after an index (``view``), the rows from the window's start on
        (``choose``, called in a worker thread, picks it from the rows appended after the
        index), proved to follow the index's first rows unchanged -- or why not. Raises
        :class:`StoreReadError`."""
        ...

    def count_store(self, max_open_readers: int) -> CountStore | None:
        """The database's count store (one per database, shared by its sessions)."""
        ...

    async def before_rewrite(self) -> None:
        """Called before a pop, clear or compaction rewrite through the session (a
        ``RedisSession`` marks its history as changed: no window is read on a stale index)."""
        ...

    async def after_rewrite(self) -> None: ...

    def close(self) -> None: ...


# ------------------------------------------------------------------ SQLiteSession


class SQLiteStore(StoreBase):
    """An ``SQLiteSession`` in a database file (see ``_sync.RowReader``)."""

    kind = "sqlite"
    monotone = True

    def __init__(self, db_path: str, table: str, session_id: str) -> None:
        super().__init__("the database has no id of its own (read-only?)")
        self.reader = _sync.RowReader(db_path, table, session_id)
        # That comparison makes sharing the index between objects safe, keyed by the
        # database's own identity and its file (see pool.Key).
        db_id = pool.database_id(db_path)
        if db_id is not None:
            self.key = (db_id, os.path.realpath(db_path), table, session_id)
            self.snapshots = SQLiteSnapshots(db_path, db_id, table, session_id)
            self.prefixes = PrefixState(sqlite_record(db_path, PREFIX, table, session_id), db_id)
            self.turns = TurnState(sqlite_record(db_path, TURN, table, session_id), db_id)
            self.no_store = "its database could not be opened for counts"

    async def read(self, look: Callable[[_sync.Rows], T]) -> tuple[list[Any], T]:
        try:
            return await asyncio.to_thread(self.reader.read, look)
        except sqlite3.Error as exc:
            raise StoreReadError(str(exc) or type(exc).__name__) from exc

    async def read_window(
        self, view: _sync.WindowView, choose: _sync.Chooser
    ) -> WindowRows | _sync.Gone:
        try:
            return await asyncio.to_thread(self.reader.read_window, view, choose)
        except sqlite3.Error as exc:
            raise StoreReadError(str(exc) or type(exc).__name__) from exc

    def count_store(self, max_open_readers: int) -> CountStore | None:
        return None if self.key is None else pool.count_store(self.key, max_open_readers)

    def close(self) -> None:
        super().close()
        self.reader.close()


# ------------------------------------------------------------------ picking a store


def _class_named(inner: Any, module: str, name: str) -> type[Any] | None:
    """The SDK class ``module.name`` if ``inner`` is an instance of it (without importing
    its optional dependencies when it is not)."""
    for cls in type(inner).__mro__:
        if cls.__name__ == name and cls.__module__ == module:
            return cls
    return None


def open_store(inner: Any, session_id: str) -> HistoryStore | Unsupported:
    """The history store of ``inner`` (the session's inner session), or why it has none."""
    from .._sdk._names import SQLiteSession

    if isinstance(inner, SQLiteSession):
        if type(inner).get_items is not SQLiteSession.get_items:
            return Unsupported(
                "inner_session", f"{type(inner).__name__} overrides SQLiteSession.get_items"
            )
        db = os.fspath(inner.db_path)
        if db == ":memory:":  # a memory database has no other writer
            return Unsupported("memory_database", None)
        return SQLiteStore(db, inner.messages_table, session_id)
    sa = _class_named(inner, "agents.extensions.memory.sqlalchemy_session", "SQLAlchemySession")
    if sa is not None:
        from . import _sqlalchemy_store

        return _sqlalchemy_store.open_store(inner, sa, session_id)
    redis = _class_named(inner, "agents.extensions.memory.redis_session", "RedisSession")
    if redis is not None:
        from . import _redis_store

        return _redis_store.open_store(inner, redis, session_id)
    return Unsupported(
        "inner_session",
        f"{type(inner).__name__} is not a session whose rows protoprompt can read "
        "(SQLiteSession, SQLAlchemySession, RedisSession)",
    )
