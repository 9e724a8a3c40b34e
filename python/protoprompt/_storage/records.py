"""Session records: one row (SQL) or hash (Redis) of a kind per stored session.

A record is keyed by the session's messages table (its identity: the table's name, with its
oid on PostgreSQL, or the Redis list key) and session id. It is read, replaced, deleted and
compared-and-set (on the kind's version field, so that two workers never overwrite each
other's newer state) or updated from what is stored in one transaction, the same way on
every engine; nothing raises: an unreadable record is absent, a failed write says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from .dialect import Dialect, upsert

__all__ = ["Decide", "Field", "Kind", "Record", "RecordStore"]

KEYS = ("messages_table", "session_id")

Decide = Callable[[dict[str, Any] | None], dict[str, Any] | None]
"""What :meth:`Record.update` makes of the stored values (``None``: leave them)."""


@dataclass(frozen=True)
class Field:
    """One value of a record."""

    name: str
    """Its column (and its name in the values a record reads and writes)."""
    type: str
    """``"blob"``, ``"int"``, ``"real"`` or ``"text"``."""
    redis: str | None = None
    """Its field in the Redis hash (``None``: the name)."""
    sql: bool = True
    """Kept in SQL too (``False``: Redis only, e.g. a generation tag)."""
    in_redis: bool = True
    """Kept in Redis too (``False``: SQL only, e.g. a time of writing)."""

    @property
    def hash_field(self) -> str:
        return self.redis or self.name


@dataclass(frozen=True)
class Kind:
    """A kind of session record: its SQL table, its Redis key suffix, its fields."""

    table: str
    suffix: str
    """The Redis key: ``{session key}:protoprompt:{suffix}``."""
    fields: tuple[Field, ...]
    version: str | None = None
    """The field compare-and-set compares (an ``int`` field), if any."""

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.sql)

    @property
    def redis_fields(self) -> tuple[Field, ...]:
        """The fields of the Redis hash."""
        return tuple(f for f in self.fields if f.in_redis)

    def create(self, dialect: Dialect) -> str:
        """``CREATE TABLE IF NOT EXISTS`` of the kind's table."""
        cols = ", ".join(
            f"{f.name} {dialect.column_type(f.type)} NOT NULL" for f in self.fields if f.sql
        )
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} (messages_table TEXT NOT NULL, "
            f"session_id TEXT NOT NULL, {cols}, PRIMARY KEY (messages_table, session_id))"
        )

    def select(self) -> str:
        return (
            f"SELECT {', '.join(self.columns)} FROM {self.table} "
            "WHERE messages_table = :messages_table AND session_id = :session_id"
        )

    def delete(self) -> str:
        return (
            f"DELETE FROM {self.table} "
            "WHERE messages_table = :messages_table AND session_id = :session_id"
        )

    def upsert(self) -> str:
        return upsert(self.table, KEYS, self.columns)

    def insert_new(self) -> str:
        names = (*KEYS, *self.columns)
        return (
            f"INSERT INTO {self.table} ({', '.join(names)}) "
            f"VALUES ({', '.join(':' + c for c in names)}) "
            "ON CONFLICT (messages_table, session_id) DO NOTHING"
        )

    def replace(self) -> str:
        """Replace the stored record's values."""
        sets = ", ".join(f"{c} = :{c}" for c in self.columns)
        return (
            f"UPDATE {self.table} SET {sets} WHERE messages_table = :messages_table "
            "AND session_id = :session_id"
        )

    def update_if(self) -> str:
        """Replace the record's values if its version is ``:expected``."""
        assert self.version is not None
        return f"{self.replace()} AND {self.version} = :expected"


class Record(Protocol):
    """One session's record of a kind, on one engine (never raises)."""

    kind: Kind
    where: tuple[str, str]
    """``(messages table identity, session id)``."""

    def load(self) -> dict[str, Any] | None:
        """The stored values by field name (as the engine returns them: check their types),
        or ``None`` (none stored, or unreadable)."""
        ...

    def save(self, values: dict[str, Any]) -> str | None:
        """Replace the record; why it could not be written, or ``None``."""
        ...

    def swap(self, expected: int | None, values: dict[str, Any]) -> bool | str:
        """Write ``values`` only if the stored version is ``expected`` (``None``: no record
        stored): ``True`` written, ``False`` another version is stored, a ``str``: why the
        write failed."""
        ...

    def update(self, decide: Decide, *, outlive: int | None = None) -> bool | str:
        """Replace the record by what ``decide`` makes of the stored values (as :meth:`load`
        reads them, damaged ones included; ``None``: none stored), unless it returns
        ``None``, in one transaction: no other write comes between the read and the write
        (SQL: the row is locked; Redis: the hash is watched). ``True`` written, ``False``
        left as it is (``decide`` said so, or another writer came first), a ``str``: why it
        failed. In Redis the hash expires with the session's list and is not written once
        the list is gone, unless ``outlive`` is given: it is then written anyway and kept
        that many seconds."""
        ...

    def delete(self) -> None:
        """Remove the record, if there is one."""
        ...


RecordStore = Record
