"""The ``protoprompt_meta`` table that protoprompt keeps in a SQLite database it uses."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

_SCHEMA = "CREATE TABLE IF NOT EXISTS protoprompt_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"


def meta_value(
    conn: sqlite3.Connection,
    key: str,
    make: Callable[[], str],
    tables: Sequence[tuple[str, str]] = (),
) -> str | None:
    """The value stored under ``key``, written once (``make()``) if missing.

    Read first, so that a database that has it takes no write lock. ``tables`` are more
    ``(name, CREATE TABLE IF NOT EXISTS ...)`` the caller needs: created in the same
    transaction when one is missing. Raises ``sqlite3.Error`` if the database cannot be read
    or written."""
    select = "SELECT value FROM protoprompt_meta WHERE key = ?"
    try:
        row = conn.execute(select, (key,)).fetchone()
        for name, _ in tables:
            conn.execute(f'SELECT 1 FROM "{name}" LIMIT 0')
    except sqlite3.OperationalError:
        row = None  # a table is missing
    if row is None:
        with conn:
            conn.execute(_SCHEMA)
            for _, create in tables:
                conn.execute(create)
            conn.execute("INSERT OR IGNORE INTO protoprompt_meta VALUES (?, ?)", (key, make()))
        row = conn.execute(select, (key,)).fetchone()
    return str(row[0]) if row else None
