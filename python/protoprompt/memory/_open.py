"""Which engine a :class:`~protoprompt.memory.MemoryStore` opens for its target.

Apart from :mod:`._backend` (the types every engine shares), so that the engines import
the types and this module imports the engines, one way; each engine is imported when a
store first needs it (the PostgreSQL one only for a ``postgresql://`` URL).
"""

from __future__ import annotations

import os

from ._backend import Backend, is_postgres_url

__all__ = ["open_backend"]


def open_backend(target: str | os.PathLike[str], *, read_only: bool = False) -> Backend:
    """The backend for ``target``: a PostgreSQL URL, else a SQLite path."""
    if is_postgres_url(target):
        from ._postgres import PostgresBackend

        return PostgresBackend(str(target), read_only=read_only)
    from ._sqlite import SQLiteBackend

    return SQLiteBackend(os.fsdecode(target), read_only=read_only)
