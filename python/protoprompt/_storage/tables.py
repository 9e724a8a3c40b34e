"""Tables keyed by one column, beside the session records: token counts, calibration.

A :class:`Table` names its columns once; its statements (``:name`` placeholders) are the same
on every SQL engine but for what a :class:`~.dialect.Dialect` says differs (column types, the
key's constraint, how a row is replaced, the column rows age by). One operation set runs
them: get many (by key, in chunks below every engine's parameter limit), put many, delete,
trim to the newest rows, size -- on a ``sqlite3`` connection (:class:`SQLiteTable`, the
caller's connection inside the fork gate) or a SQLAlchemy ``AsyncConnection``
(:class:`SQLTable`, PostgreSQL). Failures raise the engine's errors: the caller decides what
a failed read or write means.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .dialect import SQLITE, Dialect

__all__ = ["MAX_PARAMS", "META", "SQLTable", "SQLiteTable", "Table"]

MAX_PARAMS = 500
"""Keys per ``IN (...)`` query; below every SQLite build's variable limit."""

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Table:
    """A table of rows keyed by one column (``(name, kind)``: see
    :meth:`~.dialect.Dialect.column_type`)."""

    name: str
    key: tuple[str, str]
    columns: tuple[tuple[str, str], ...]
    key_constraint: str | None = None
    """Of the key column (``None``: the dialect's)."""
    aged: bool = False
    """Rows can be trimmed to the newest (SQLite: by ``rowid``; PostgreSQL: a ``seq``
    identity column, indexed)."""

    @property
    def names(self) -> tuple[str, ...]:
        """The key column, then the others."""
        return (self.key[0], *(c for c, _ in self.columns))

    def create(self, dialect: Dialect) -> tuple[str, ...]:
        """The statements that create the table (and its index) if missing."""
        key, kind = self.key
        constraint = self.key_constraint or dialect.key_constraint
        cols = [" ".join(filter(None, (key, dialect.column_type(kind), constraint)))]
        cols += [" ".join(filter(None, (c, dialect.column_type(k), "NOT NULL")))
                 for c, k in self.columns]  # fmt: skip
        if self.aged and dialect.age_column_type:
            cols.insert(0, f"{dialect.age_column} {dialect.age_column_type}")
        out = [f"CREATE TABLE IF NOT EXISTS {self.name} ({', '.join(cols)})"]
        if self.aged and dialect.age_column_type:
            out.append(
                f"CREATE INDEX IF NOT EXISTS {self.name}_{dialect.age_column} "
                f"ON {self.name} ({dialect.age_column})"
            )
        return tuple(out)

    def selects(self, keys: Sequence[Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        """The queries that read the rows of ``keys`` (at most :data:`MAX_PARAMS` each)."""
        for start in range(0, len(keys), MAX_PARAMS):
            chunk = keys[start : start + MAX_PARAMS]
            marks = ", ".join(f":k{i}" for i in range(len(chunk)))
            yield (
                f"SELECT {', '.join(self.names)} FROM {self.name} WHERE {self.key[0]} IN ({marks})",
                {f"k{i}": k for i, k in enumerate(chunk)},
            )

    def put(self, dialect: Dialect) -> str:
        """Write a row (``:column`` for each name), replacing the one with its key."""
        return dialect.replace(self.name, (self.key[0],), self.names[1:])

    def put_new(self) -> str:
        """Write a row (``:column`` for each name) unless one has its key."""
        names = self.names
        return (
            f"INSERT INTO {self.name} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + c for c in names)}) "
            f"ON CONFLICT ({self.key[0]}) DO NOTHING"
        )

    def params(self, rows: Sequence[Row]) -> list[dict[str, Any]]:
        return [dict(zip(self.names, row, strict=True)) for row in rows]

    def delete(self, keys: Sequence[Any] | None) -> tuple[str, dict[str, Any]]:
        """Delete the rows of ``keys`` (``None``: every row)."""
        if keys is None:
            return f"DELETE FROM {self.name}", {}
        marks = ", ".join(f":k{i}" for i in range(len(keys)))
        return (
            f"DELETE FROM {self.name} WHERE {self.key[0]} IN ({marks})",
            {f"k{i}": k for i, k in enumerate(keys)},
        )

    def trim(self, dialect: Dialect) -> str:
        """Delete all but the ``:keep`` newest rows (an :attr:`aged` table)."""
        age = dialect.age_column
        return (
            f"DELETE FROM {self.name} WHERE {age} <= (SELECT MAX({age}) FROM {self.name}) - :keep"
        )

    def size(self) -> str:
        return f"SELECT COUNT(*) FROM {self.name}"


META = Table(
    "protoprompt_meta",
    key=("key", "text"),
    key_constraint="PRIMARY KEY",
    columns=(("value", "text"),),
)
"""A database's own values (its id, the secrets of its counts and calibration), written
once."""


class SQLiteTable:
    """A :class:`Table`'s operations on a ``sqlite3`` connection (the caller holds the fork
    gate; a write is committed by the caller's ``with conn``)."""

    dialect = SQLITE

    def __init__(self, table: Table) -> None:
        self.table = table

    def get_many(self, conn: sqlite3.Connection, keys: Sequence[Any]) -> list[Row]:
        return [tuple(r) for q, p in self.table.selects(keys) for r in conn.execute(q, p)]

    def put_many(self, conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
        conn.executemany(self.table.put(self.dialect), self.table.params(rows))

    def put_new_many(self, conn: sqlite3.Connection, rows: Sequence[Row]) -> None:
        conn.executemany(self.table.put_new(), self.table.params(rows))

    def delete(self, conn: sqlite3.Connection, keys: Sequence[Any] | None = None) -> None:
        conn.execute(*self.table.delete(keys))

    def trim(self, conn: sqlite3.Connection, keep: int) -> None:
        conn.execute(self.table.trim(self.dialect), {"keep": keep})

    def size(self, conn: sqlite3.Connection) -> int:
        return int(conn.execute(self.table.size()).fetchone()[0])


class SQLTable:
    """A :class:`Table`'s operations on a SQLAlchemy ``AsyncConnection`` (PostgreSQL)."""

    def __init__(self, table: Table, dialect: Dialect) -> None:
        self.table = table
        self.dialect = dialect

    async def get_many(self, conn: Any, keys: Sequence[Any]) -> list[Row]:
        from sqlalchemy import text

        out: list[Row] = []
        for q, p in self.table.selects(keys):
            out += [tuple(r) for r in (await conn.execute(text(q), p)).all()]
        return out

    async def put_many(self, conn: Any, rows: Sequence[Row]) -> None:
        from sqlalchemy import text

        await conn.execute(text(self.table.put(self.dialect)), self.table.params(rows))

    async def put_new_many(self, conn: Any, rows: Sequence[Row]) -> None:
        from sqlalchemy import text

        await conn.execute(text(self.table.put_new()), self.table.params(rows))

    async def delete(self, conn: Any, keys: Sequence[Any] | None = None) -> None:
        from sqlalchemy import text

        q, p = self.table.delete(keys)
        await conn.execute(text(q), p)

    async def trim(self, conn: Any, keep: int) -> None:
        from sqlalchemy import text

        await conn.execute(text(self.table.trim(self.dialect)), {"keep": keep})

    async def size(self, conn: Any) -> int:
        from sqlalchemy import text

        return int((await conn.execute(text(self.table.size()))).scalar_one())
