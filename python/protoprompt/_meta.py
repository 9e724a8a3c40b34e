"""The ``protoprompt_meta`` table that protoprompt keeps in a SQLite database it uses."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence

from ._storage.dialect import SQLITE
from ._storage.tables import META, SQLiteTable

_META = SQLiteTable(META)
_SCHEMA = META.create(SQLITE)[0]


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
    try:
        rows = _META.get_many(conn, [key])
        for name, _ in tables:
            conn.execute(f'SELECT 1 FROM "{name}" LIMIT 0')
    except sqlite3.OperationalError:
        rows = []  # a table is missing
    if not rows:
        with conn:
            conn.execute(_SCHEMA)
            for _, create in tables:
                conn.execute(create)
            _META.put_new_many(conn, [(key, make())])
        rows = _META.get_many(conn, [key])
    return str(rows[0][1]) if rows else None
