"""Index snapshots kept in a session's SQLite database (table ``protoprompt_index_snapshots``).

A restarted process would otherwise read and classify the whole history on its first turn
(100k items: ~75 ms of the callback). :class:`~protoprompt.HistoryIndex` snapshots hold the
classified items (graph fields only: ids, call ids, types, statuses — no text), the item graph
and the token costs counted so far; loading one costs a fraction of that.

A snapshot is stored with the ids of the rows its items came from, and *bound* to them, to
the database (its random id in ``protoprompt_meta``) and to the session
(:func:`binding`): loaded anywhere else — another session's row, another database, rows
edited in the table — the core refuses it. The caller then compares those row ids with the
rows a read returns, exactly as for a live index, and keeps the prefix that still holds.
Every value is checked for its type when read; any error makes a snapshot absent, never a
failed turn.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import sys
from array import array

_log = logging.getLogger("protoprompt")

TABLE = "protoprompt_index_snapshots"
_COLUMNS = ["messages_table", "session_id", "row_ids", "data"]
_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {TABLE} (messages_table TEXT NOT NULL, "
    "session_id TEXT NOT NULL, row_ids BLOB NOT NULL, data BLOB NOT NULL, "
    "PRIMARY KEY (messages_table, session_id))"
)


def _connect(db_path: str) -> sqlite3.Connection:
    return sqlite3.connect(db_path, timeout=5.0, check_same_thread=False)


def binding(database_id: str, table: str, session_id: str, row_ids: bytes) -> bytes:
    """What a snapshot of a session's index is bound to (see the module note)."""
    out = bytearray()
    for part in ("protoprompt index snapshot 1", database_id, table, session_id):
        raw = part.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(8, "little") + raw  # length-prefixed: never ambiguous
    return bytes(out) + row_ids


def ids_to_bytes(ids: array) -> bytes:
    """Row ids as stored: 8-byte little-endian integers."""
    if sys.byteorder == "little":
        return ids.tobytes()
    swapped = array("q", ids)
    swapped.byteswap()
    return swapped.tobytes()


def ids_from_bytes(data: bytes) -> array | None:
    """The row ids :func:`ids_to_bytes` wrote, or ``None`` if ``data`` cannot be them."""
    if len(data) % 8:
        return None
    ids = array("q")
    ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


def load(db_path: str, table: str, session_id: str) -> tuple[bytes, bytes] | None:
    """``(row_ids, data)`` of the session's snapshot, or ``None``."""
    try:
        with contextlib.closing(_connect(db_path)) as conn:
            row = conn.execute(
                f"SELECT row_ids, data FROM {TABLE} "
                "WHERE messages_table = ? AND session_id = ?", (table, session_id)).fetchone()
    except sqlite3.Error:
        return None  # no table yet (or one of an earlier layout), or an unreadable database
    if row is None or type(row[0]) is not bytes or type(row[1]) is not bytes:
        return None
    return row[0], row[1]


def _ensure_table(conn: sqlite3.Connection) -> None:
    """Create the table, replacing one of an earlier layout (whose snapshots no version
    that reads this layout can load)."""
    columns = [row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})")]
    if columns and columns != _COLUMNS:
        conn.execute(f"DROP TABLE {TABLE}")
    conn.execute(_CREATE)


def save(db_path: str, table: str, session_id: str, row_ids: bytes, data: bytes) -> bool:
    """Replace the session's snapshot; ``False`` if it could not be written."""
    try:
        with contextlib.closing(_connect(db_path)) as conn, conn:
            _ensure_table(conn)
            conn.execute(f"INSERT OR REPLACE INTO {TABLE} VALUES (?, ?, ?, ?)",
                         (table, session_id, row_ids, data))
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
        pass  # no table: nothing to delete; a locked database keeps a snapshot whose rows
        # are gone, of which the row comparison then keeps nothing
