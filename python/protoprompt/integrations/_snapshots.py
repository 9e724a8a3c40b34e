"""Index snapshots kept in a session's SQLite database (table ``protoprompt_index_snapshots``).

A restarted process would otherwise read and classify the whole history on its first turn
(100k items: ~75 ms of the callback). :class:`~protoprompt.HistoryIndex` snapshots hold the
classified items (graph fields only: ids, call ids, types, statuses — no text), the item graph
and the token costs counted so far; loading one costs a fraction of that.

A snapshot is stored with the session's rows it describes: ``max_id`` (the largest row id
when it was taken) and ``row_count``. Rows are only appended, popped newest first or cleared
and ids are never reused, so the caller checks it exactly as it checks a live index (how many
rows with ``id <= max_id`` are left) and keeps the prefix that still holds, then reads only
what was appended since. All I/O errors make a snapshot absent; they never fail a turn.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3

_log = logging.getLogger("protoprompt")

TABLE = "protoprompt_index_snapshots"
_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (messages_table TEXT NOT NULL, "
    "session_id TEXT NOT NULL, max_id INTEGER NOT NULL, row_count INTEGER NOT NULL, "
    "items INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (messages_table, session_id))"
)


def _connect(db_path: str) -> sqlite3.Connection:
    return sqlite3.connect(db_path, timeout=5.0, check_same_thread=False)


def load(db_path: str, table: str, session_id: str) -> tuple[int, int, bytes] | None:
    """``(max_id, row_count, data)`` of the session's snapshot, or ``None``."""
    try:
        with contextlib.closing(_connect(db_path)) as conn:
            row = conn.execute(
                f"SELECT max_id, row_count, data FROM {TABLE} "
                "WHERE messages_table = ? AND session_id = ?", (table, session_id)).fetchone()
    except sqlite3.Error:
        return None  # no table yet, or an unreadable database
    if row is None or not isinstance(row[2], bytes):
        return None
    return int(row[0]), int(row[1]), row[2]


def save(db_path: str, table: str, session_id: str, max_id: int, row_count: int,
         items: int, data: bytes) -> bool:
    """Replace the session's snapshot; ``False`` if it could not be written."""
    try:
        with contextlib.closing(_connect(db_path)) as conn, conn:
            conn.execute(_CREATE)
            conn.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?, ?, ?)",
                         (table, session_id, max_id, row_count, items, data))
        return True
    except sqlite3.Error as exc:
        _log.debug("protoprompt: index snapshot of %r not written: %s", session_id, exc)
        return False


def delete(db_path: str, table: str, session_id: str) -> None:
    """Remove the session's snapshot (after ``clear_session``), if there is one."""
    try:
        with contextlib.closing(_connect(db_path)) as conn, conn:
            conn.execute(f"DELETE FROM {TABLE} WHERE messages_table = ? AND session_id = ?",
                         (table, session_id))
    except sqlite3.Error:
        pass  # no table: nothing to delete; a locked database keeps a snapshot that the
        # row check turns into an empty index (its rows are gone)
