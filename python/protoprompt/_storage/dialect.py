"""What differs between SQLite and PostgreSQL for protoprompt's own tables.

Both read ``:name`` placeholders (``sqlite3`` natively, PostgreSQL through SQLAlchemy's
``text``) and ``INSERT ... ON CONFLICT (...) DO UPDATE SET c = excluded.c`` (SQLite 3.24+),
so a statement is written once; a dialect names the column types.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["POSTGRESQL", "SQLITE", "Dialect"]


@dataclass(frozen=True)
class Dialect:
    """Column types of one SQL engine."""

    name: str
    blob: str
    """Bytes (``BLOB`` / ``BYTEA``)."""
    bigint: str
    """A 64-bit integer."""
    real: str
    """A double-precision float."""

    def column_type(self, kind: str) -> str:
        """The engine's type for a column of kind ``"text"``, ``"blob"``, ``"int"`` or
        ``"real"``."""
        return {"text": "TEXT", "blob": self.blob, "int": self.bigint, "real": self.real}[kind]


SQLITE = Dialect("sqlite", blob="BLOB", bigint="INTEGER", real="REAL")
POSTGRESQL = Dialect("postgresql", blob="BYTEA", bigint="BIGINT", real="DOUBLE PRECISION")


def upsert(table: str, keys: tuple[str, ...], columns: tuple[str, ...]) -> str:
    """Insert a row or replace the non-key columns of the row with the same keys."""
    names = (*keys, *columns)
    values = ", ".join(f":{c}" for c in names)
    update = ", ".join(f"{c} = excluded.{c}" for c in columns)
    return (
        f"INSERT INTO {table} ({', '.join(names)}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {update}"
    )
