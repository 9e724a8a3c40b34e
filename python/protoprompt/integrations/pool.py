"""The process-wide pool of session indexes, and the count store of each SQLite database file.

A server that builds a ``ProtoPromptSession`` per request still gets warm turns: objects for
the same stored session (same database, table or key, and session id) share one index, and the
most recently used ones are kept up to ``ProtoPromptSession(shared_index_bytes=...)`` bytes
(about 0.23 KB per history item). An index dropped from the pool stays with the objects that
hold it and is rebuilt by new ones.
"""

from __future__ import annotations

import sqlite3
import uuid

from .. import _process
from .._meta import meta_value
from .._process import sqlite_gate
from ..count_store import SQLiteCountStore
from ._stores._snapshots import IndexState, SnapshotStore

DEFAULT_SHARED_INDEX_BYTES = 256 * 2**20
"""Default of ``ProtoPromptSession(shared_index_bytes=...)``."""

Key = tuple[str, str, str, str]
"""A stored session: (database id, location, messages table or list key, session id). The
id tells a database deleted and created again at one path (its row ids start over) from the
first; the location (a resolved file path, a server URL without its password) tells apart
copies of one database (they share the id, and their row ids go on from the same point with
different rows). Made by the history stores (``_store``)."""

_SHARED: _process.Registry[Key, IndexState] = _process.SHARED_INDEXES
_STORES = _process.FILE_COUNT_STORES


def database_id(db_path: str) -> str | None:
    """A random id stored once in the database (table ``protoprompt_meta``), or ``None`` if
    it cannot be read or written (then the session keeps an index of its own)."""
    try:
        with sqlite_gate():
            conn = sqlite3.connect(db_path, timeout=5.0)
            try:
                return meta_value(conn, "database_id", lambda: uuid.uuid4().hex)
            finally:
                conn.close()
    except sqlite3.Error:
        return None


def count_store(key: Key, max_open_readers: int) -> SQLiteCountStore | None:
    """The count store of a database file, one for all its sessions (one connection however
    many sessions are pooled), or ``None`` if it cannot be opened. ``max_open_readers``: the
    reader limit it applies from now on (that of the session made last for the file)."""
    database_id, db_path = key[0], key[1]
    with _STORES.lock:
        store = _STORES.items.get((database_id, db_path))
        if store is None:
            try:
                store = _STORES.items[(database_id, db_path)] = SQLiteCountStore(
                    db_path, max_open_readers=max_open_readers
                )
            except (sqlite3.Error, OSError):
                return None  # read-only or odd database: counts stay in memory
        store.max_open_readers = max_open_readers
        return store


def shared_state(key: Key, snapshot_at: SnapshotStore | None) -> IndexState:
    with _SHARED.lock:
        state = _SHARED.items.get(key)
        if state is None:
            state = _SHARED.items[key] = IndexState(snapshot_at)
        _SHARED.items.move_to_end(key)
        return state


def is_shared(key: Key, state: IndexState) -> bool:
    """Whether ``state`` is the pool's index for ``key`` (not dropped from it)."""
    with _SHARED.lock:
        return _SHARED.items.get(key) is state


def account(key: Key, state: IndexState, limit: int) -> None:
    """Record ``state``'s size after a build and trim the pool to ``limit`` bytes (the
    limit of the session that built; the most recent index always stays)."""
    with _SHARED.lock:
        if _SHARED.items.get(key) is not state:
            return  # dropped from the pool earlier: it belongs to its objects only
        _SHARED.items.move_to_end(key)
        total = sum(s.nbytes for s in _SHARED.items.values())
        while total > limit and len(_SHARED.items) > 1:
            _, old = _SHARED.items.popitem(last=False)
            total -= old.nbytes
