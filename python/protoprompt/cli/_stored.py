"""Where ``protoprompt inspect`` reads a stored session from: the seam between the command and
the engines, read-only everywhere.

===================================  ========================================================
``DB``                               sessions of
===================================  ========================================================
a file path                          ``SQLiteSession`` (rows in id order)
``sqlite+aiosqlite:///path``         ``SQLAlchemySession`` on SQLite (``created_at, id``)
``postgresql://...`` (``postgres``,  ``SQLAlchemySession`` on PostgreSQL (``created_at, id``),
``postgresql+asyncpg://``...)        read with psycopg in a read-only transaction
``redis://``, ``rediss://``,         ``RedisSession`` (``{prefix}:{id}:messages`` lists;
``unix://``                          ``--key-prefix``); an item's "row" is its position
===================================  ========================================================

Each reads the items exactly as the SDK's ``get_items`` of that session returns them (rows
the SDK skips are listed as skipped) and the size of protoprompt's stored index snapshot.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Protocol
from urllib.parse import urlsplit

from ..memory._pg_connect import redact
from ._inspect import InspectError, SessionRows, connect_read_only, list_sessions, read_session
from ._next_turn import stored_snapshot_items
from ._text import JsonReadError, read_json

__all__ = ["StoredSessions", "open_stored"]


class StoredSessions(Protocol):
    """The sessions of one database, read-only (every failure an :class:`InspectError`)."""

    name: str
    """The database as the report names it (no password)."""

    def list_sessions(self) -> list[dict[str, Any]]:
        """Every session: ``session``, ``items`` (rows), ``first`` and ``last`` (times)."""
        ...

    def read_session(self, session_id: str, limit: int | None) -> SessionRows:
        """The session's items as the SDK returns them (the newest ``limit``), with row keys."""
        ...

    def snapshot_items(self, session_id: str) -> int | None:
        """Items of protoprompt's stored index snapshot of the session (``None``: none)."""
        ...

    def close(self) -> None: ...


def open_stored(target: str, *, messages_table: str, key_prefix: str) -> StoredSessions:
    """The stored sessions ``target`` names (see the module note)."""
    scheme = target.split("://", 1)[0].lower() if "://" in target else ""
    base = scheme.split("+", 1)[0]
    if base in ("postgresql", "postgres"):
        return _Postgres(target, messages_table)
    if base in ("redis", "rediss", "unix"):
        return _Redis(target, key_prefix)
    if base == "sqlite":
        path = urlsplit(target).path
        if target.startswith(f"{scheme}:////"):
            path = "/" + path.lstrip("/")
        else:
            path = path.removeprefix("/")
        return _SQLite(path, messages_table, ordered_by_time=True, name=target)
    if scheme:
        raise InspectError(
            f"cannot read {scheme}:// URLs (a SQLite file, postgresql:// or redis:// URLs)"
        )
    return _SQLite(target, messages_table, ordered_by_time=False, name=target)


def _rows_to_session(
    rows: list[tuple[Any, Any]], session_id: str, skip: tuple[type[Exception], ...]
) -> SessionRows:
    items: list[Any] = []
    keys: list[int] = []
    skipped: list[int] = []
    for key, data in rows:
        try:
            text = data.decode("utf-8") if isinstance(data, bytes) else data
            item = read_json(text)
        except skip:  # skipped by the SDK too
            skipped.append(int(key))
            continue
        except JsonReadError as exc:
            raise InspectError(
                f"row {key} of session {session_id!r} cannot be read: {exc} (the Agents SDK "
                "cannot read this session either)"
            ) from None
        items.append(item)
        keys.append(int(key))
    return SessionRows(items, keys, skipped)


def _missing(session_id: str, name: str, known: list[str]) -> InspectError:
    shown = ", ".join(repr(k) for k in known[:10]) + (" ..." if len(known) > 10 else "")
    return InspectError(
        f"no session {session_id!r} in {name!r}"
        + (f" (sessions: {shown})" if known else " (it has no sessions)")
    )


class _SQLite:
    """A SQLite file: ``SQLiteSession``'s tables, or ``SQLAlchemySession``'s
    (``ordered_by_time``)."""

    def __init__(self, path: str, table: str, *, ordered_by_time: bool, name: str) -> None:
        self.name = name
        self._path = path
        self._table = table
        self._timed = ordered_by_time
        self._conn = connect_read_only(path)

    def list_sessions(self) -> list[dict[str, Any]]:
        return list_sessions(self._conn, self._table, self._path)

    def read_session(self, session_id: str, limit: int | None) -> SessionRows:
        if not self._timed:
            return read_session(
                self._conn, session_id, messages_table=self._table, path=self._path, limit=limit
            )
        list_sessions(self._conn, self._table, self._path)  # the table's check
        table = '"' + self._table.replace('"', '""') + '"'
        order = "created_at DESC, id DESC" if limit is not None else "created_at, id"
        try:
            rows = self._conn.execute(
                f"SELECT id, message_data FROM {table} WHERE session_id = ? ORDER BY {order}"
                + (" LIMIT ?" if limit is not None else ""),
                (session_id, limit) if limit is not None else (session_id,),
            ).fetchall()
        except sqlite3.DatabaseError as exc:
            raise InspectError(f"cannot read table {self._table!r}: {exc}") from None
        if limit is not None:
            rows.reverse()
        if not rows:
            raise _missing(session_id, self.name, [s["session"] for s in self.list_sessions()])
        return _rows_to_session(rows, session_id, (json.JSONDecodeError,))

    def snapshot_items(self, session_id: str) -> int | None:
        return stored_snapshot_items(self._conn, self._table, session_id)

    def close(self) -> None:
        self._conn.close()


class _Postgres:
    """``SQLAlchemySession``'s tables on PostgreSQL, in a read-only transaction."""

    def __init__(self, url: str, table: str) -> None:
        self.name = redact(url)
        self._table = table
        try:
            import psycopg
        except ImportError:
            raise InspectError(
                "reading PostgreSQL needs psycopg: pip install 'protoprompt[postgres]'"
            ) from None
        scheme, rest = url.split("://", 1)
        dsn = scheme.split("+", 1)[0].lower() + "://" + rest
        try:
            self._conn = psycopg.connect(
                dsn, options="-c default_transaction_read_only=on", connect_timeout=10
            )
        except psycopg.Error as exc:
            raise InspectError(f"cannot connect to {self.name}: {_first_line(exc)}") from None
        self._errors = psycopg.Error

    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        from psycopg import sql as q

        try:
            with self._conn.transaction():
                statement = q.SQL(sql).format(table=q.Identifier(self._table))
                return list(self._conn.execute(statement, params).fetchall())
        except self._errors as exc:
            message = f"cannot read {self._table!r} in {self.name}: {_first_line(exc)}"
            raise InspectError(message) from None

    def list_sessions(self) -> list[dict[str, Any]]:
        rows = self._query(
            "SELECT session_id, count(*), min(created_at), max(created_at) FROM {table} "
            "GROUP BY session_id ORDER BY max(created_at) DESC"
        )
        return [
            {"session": s, "items": n, "first": str(first), "last": str(last)}
            for s, n, first, last in rows
        ]

    def read_session(self, session_id: str, limit: int | None) -> SessionRows:
        if limit is None:
            rows = self._query(
                "SELECT id, message_data FROM {table} WHERE session_id = %s "
                "ORDER BY created_at, id",
                (session_id,),
            )
        else:
            rows = self._query(
                "SELECT id, message_data FROM {table} WHERE session_id = %s "
                "ORDER BY created_at DESC, id DESC LIMIT %s",
                (session_id, limit),
            )
            rows.reverse()
        if not rows:
            raise _missing(session_id, self.name, [s["session"] for s in self.list_sessions()])
        return _rows_to_session([(r[0], r[1]) for r in rows], session_id, (json.JSONDecodeError,))

    def snapshot_items(self, session_id: str) -> int | None:
        try:
            rows = self._query(
                "SELECT length(row_ids) FROM protoprompt_index_snapshots WHERE session_id = %s "
                "AND messages_table = %s || '#' || to_regclass(%s)::oid::text",
                (session_id, self._table, self._table),
            )
        except InspectError:
            return None  # no table: protoprompt never saved one here
        return int(rows[0][0]) // 8 if rows and isinstance(rows[0][0], int) else None

    def close(self) -> None:
        self._conn.close()


class _Redis:
    """``RedisSession``'s lists under one key prefix."""

    def __init__(self, url: str, prefix: str) -> None:
        self.name = redact(url)
        self._prefix = prefix
        try:
            import redis
        except ImportError:
            raise InspectError("reading Redis needs the redis package: pip install redis") from None
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=10)
            self._client.ping()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise InspectError(f"cannot connect to {self.name}: {_first_line(exc)}") from None
        self._errors: tuple[type[Exception], ...] = (redis.RedisError, OSError)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._client, name)(*args)
        except self._errors as exc:
            raise InspectError(f"cannot read {self.name}: {_first_line(exc)}") from None

    def list_sessions(self) -> list[dict[str, Any]]:
        out = []
        head, tail = f"{self._prefix}:", ":messages"
        try:
            keys = list(self._client.scan_iter(match=f"{head}*{tail}", count=1000))
        except self._errors as exc:
            raise InspectError(f"cannot read {self.name}: {_first_line(exc)}") from None
        for raw in keys:
            key = raw.decode("utf-8", "replace")
            sid = key[len(head) : -len(tail)]
            if ":protoprompt:" in sid or self._call("type", raw) != b"list":
                continue
            meta = self._call("hmget", f"{head}{sid}", ["created_at", "updated_at"])
            out.append(
                {
                    "session": sid,
                    "items": int(self._call("llen", raw)),
                    "first": _time(meta[0]),
                    "last": _time(meta[1]),
                }
            )
        return sorted(out, key=lambda s: str(s["last"]), reverse=True)

    def read_session(self, session_id: str, limit: int | None) -> SessionRows:
        key = f"{self._prefix}:{session_id}:messages"
        start = 0 if limit is None else -limit
        raw = self._call("lrange", key, start, -1) if limit != 0 else []
        if not raw:
            raise _missing(session_id, self.name, [s["session"] for s in self.list_sessions()])
        first = 0 if limit is None else max(int(self._call("llen", key)) - len(raw), 0)
        rows = [(first + n, value) for n, value in enumerate(raw)]
        return _rows_to_session(rows, session_id, (json.JSONDecodeError, UnicodeDecodeError))

    def snapshot_items(self, session_id: str) -> int | None:
        n = self._call("hstrlen", f"{self._prefix}:{session_id}:protoprompt:snapshot", "ids")
        return int(n) // 8 if n else None

    def close(self) -> None:
        self._client.close()


def _time(value: Any) -> str | None:
    """A ``RedisSession`` hash's time (Unix seconds) as text."""
    if value is None:
        return None
    import datetime

    try:
        seconds = int(value)
    except ValueError:
        return None
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S"
    )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
