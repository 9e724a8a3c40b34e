"""What the SQL engines of the memory store do alike, written once over a dialect.

:class:`SQLMemory` holds the statements of the memory tables that differ between SQLite and
PostgreSQL only by what the dialect (:mod:`protoprompt._storage.dialect`) says: the
driver's placeholder, "one of these values", the upsert. An engine
(:class:`~._sqlite.SQLiteBackend`, :class:`~._postgres.PostgresBackend`) gives its
connections (:meth:`SQLMemory._read`, :meth:`SQLMemory._transaction`) and what is its own:
full text (FTS5 or ``tsvector`` columns, see :meth:`SQLMemory._indexed`), vectors
(client-side ranking or pgvector), locks between writers.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from .._storage.dialect import Dialect
from ._backend import HISTORY_COLUMNS, RECORD_COLUMNS, Chunk, HistoryEntry, Row, ScopeParams

__all__ = ["COLUMNS", "HISTORY", "SQLMemory", "scope_eq", "scope_filter"]

COLUMNS = ", ".join(f"r.{column}" for column in RECORD_COLUMNS)
HISTORY = ", ".join(f"h.{column}" for column in HISTORY_COLUMNS)
_SCOPE = ("s_tenant", "s_user", "s_thread", "s_kind")
_MAX_KEYS = 500  # row keys per statement: below every SQLite build's variable limit


def scope_eq(mark: str, alias: str = "") -> str:
    """A row is of one scope (its four parameters)."""
    prefix = f"{alias}." if alias else ""
    return " AND ".join(f"{prefix}{col} = {mark}" for col in _SCOPE)


def scope_filter(
    scopes: Sequence[ScopeParams], alias: str = "r", mark: str = "?"
) -> tuple[str, list[Any]]:
    """A row is of one of ``scopes``, with its parameters."""
    clause = scope_eq(mark, alias)
    params: list[Any] = []
    for scope in scopes:
        params.extend(scope)
    return "(" + " OR ".join(f"({clause})" for _ in scopes) + ")", params


class SQLMemory:
    """The memory tables' statements shared by the SQL engines (see the module note)."""

    dialect: Dialect

    # ------------------------------------------------------------------ the engine's

    def _read(
        self, sql: str, params: Sequence[Any], *, history: bool = False
    ) -> list[Any]:  # pragma: no cover - every engine has its own
        """The rows of a read (none while the tables, or with ``history`` the history
        table, do not exist)."""
        raise NotImplementedError

    def _transaction(self) -> AbstractContextManager[Any]:  # pragma: no cover
        """One write transaction: a cursor (or connection) whose ``execute`` returns one
        with the ``rowcount``."""
        raise NotImplementedError

    def _lock_rows(self, cur: Any, scope: ScopeParams, name: str) -> None:
        """Serialise the writers of ``name``'s rows in ``scope`` (until the commit)."""

    def _indexed(self, text: str, embedding: bytes | None, *, history: bool) -> tuple[Any, ...]:
        """The values of the engine's own index columns of a row (:meth:`_index_columns`)."""
        return ()

    def _index_columns(self, *, history: bool) -> tuple[str, str]:
        """The engine's own index columns of an INSERT and their value placeholders (each
        with a leading ``", "``)."""
        return "", ""

    def _embedded_filter(self) -> str:
        """More of :meth:`embedded`'s filter (records the server ranks are not read)."""
        return ""

    # ------------------------------------------------------------------ helpers

    def _marks(self, n: int) -> str:
        return ", ".join(self.dialect.mark for _ in range(n))

    def _scope_eq(self) -> str:
        return scope_eq(self.dialect.mark)

    def _scopes(self, scopes: Sequence[ScopeParams], alias: str = "r") -> tuple[str, list[Any]]:
        return scope_filter(scopes, alias, self.dialect.mark)

    def _history_scopes(
        self, scopes: Sequence[ScopeParams], session_id: str | None
    ) -> tuple[str, list[Any]]:
        where, params = self._scopes(scopes, alias="h")
        if session_id is not None:
            where += f" AND h.session_id = {self.dialect.mark}"
            params.append(session_id)
        return where, params

    # ------------------------------------------------------------------ writes

    def replace_document(
        self,
        scope: ScopeParams,
        doc_id: str,
        chunks: Sequence[Chunk],
        metadata: str,
        created_at: float,
    ) -> None:
        rows = [
            (
                *scope,
                doc_id,
                *c[:4],
                metadata,
                created_at,
                c.embedding,
                *self._indexed(c.text, c.embedding, history=False),
            )
            for c in chunks
        ]
        m = self.dialect.mark
        columns, values = self._index_columns(history=False)
        with self._transaction() as cur:
            self._lock_rows(cur, scope, doc_id)
            cur.execute(
                f"DELETE FROM pp_mem_records WHERE rtype = 'document' AND doc_id = {m}"
                f" AND {self._scope_eq()}",
                (doc_id, *scope),
            )
            if rows:
                cur.executemany(
                    "INSERT INTO pp_mem_records (rtype, s_tenant, s_user, s_thread, s_kind,"
                    " doc_id, chunk_index, char_start, char_end, text, metadata, created_at,"
                    f" embedding{columns}) VALUES ('document', {self._marks(12)}{values})",
                    rows,
                )

    def add_fact(
        self,
        scope: ScopeParams,
        fact_id: str,
        importance: float,
        text: str,
        created_at: float,
        embedding: bytes | None,
    ) -> None:
        columns, values = self._index_columns(history=False)
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO pp_mem_records (rtype, s_tenant, s_user, s_thread, s_kind, fact_id,"
                f" importance, text, created_at, embedding{columns})"
                f" VALUES ('fact', {self._marks(9)}{values})",
                (
                    *scope,
                    fact_id,
                    importance,
                    text,
                    created_at,
                    embedding,
                    *self._indexed(text, embedding, history=False),
                ),
            )

    def set_profile(self, scope: ScopeParams, profile: str, updated_at: float) -> None:
        with self._transaction() as cur:
            cur.execute(
                "INSERT INTO pp_mem_profiles"
                " (s_tenant, s_user, s_thread, s_kind, profile, updated_at)"
                f" VALUES ({self._marks(6)})"
                " ON CONFLICT (s_tenant, s_user, s_thread, s_kind)"
                " DO UPDATE SET profile = excluded.profile, updated_at = excluded.updated_at",
                (*scope, profile, updated_at),
            )

    def clear_profile(self, scope: ScopeParams) -> int:
        with self._transaction() as cur:
            return int(
                cur.execute(f"DELETE FROM pp_mem_profiles WHERE {self._scope_eq()}", scope).rowcount
            )

    def forget(self, scope: ScopeParams, doc_id: str | None, fact_id: str | None) -> int:
        deleted = 0
        m, eq = self.dialect.mark, self._scope_eq()
        with self._transaction() as cur:
            if doc_id is None and fact_id is None:
                for table in ("pp_mem_records", "pp_mem_profiles", "pp_mem_history"):
                    deleted += cur.execute(f"DELETE FROM {table} WHERE {eq}", scope).rowcount
            if doc_id is not None:
                deleted += cur.execute(
                    f"DELETE FROM pp_mem_records WHERE rtype = 'document' AND doc_id = {m}"
                    f" AND {eq}",
                    (doc_id, *scope),
                ).rowcount
            if fact_id is not None:
                deleted += cur.execute(
                    f"DELETE FROM pp_mem_records WHERE rtype = 'fact' AND fact_id = {m} AND {eq}",
                    (fact_id, *scope),
                ).rowcount
        return deleted

    # ------------------------------------------------------------------ reads

    def presence(self, scopes: Sequence[ScopeParams]) -> tuple[bool, bool, bool]:
        profiles, params = self._scopes(scopes, alias="p")
        records, record_params = self._scopes(scopes)
        rows = self._read(
            f"SELECT EXISTS (SELECT 1 FROM pp_mem_profiles AS p WHERE {profiles}),"
            f" EXISTS (SELECT 1 FROM pp_mem_records AS r WHERE r.rtype = 'fact' AND {records}),"
            " EXISTS (SELECT 1 FROM pp_mem_records AS r WHERE r.rtype = 'document'"
            f" AND {records})",
            [*params, *record_params, *record_params],
        )
        if not rows:
            return False, False, False
        profile, fact, document = rows[0]
        return bool(profile), bool(fact), bool(document)

    def profiles(self, scopes: Sequence[ScopeParams]) -> list[tuple[str, str, str, str, str]]:
        where, params = self._scopes(scopes, alias="p")
        return self._read(
            "SELECT p.s_tenant, p.s_user, p.s_thread, p.s_kind, p.profile"
            f" FROM pp_mem_profiles AS p WHERE {where}",
            params,
        )

    def facts(self, scopes: Sequence[ScopeParams], limit: int | None) -> list[Row]:
        where, params = self._scopes(scopes)
        sql = (
            f"SELECT {COLUMNS} FROM pp_mem_records AS r"
            f" WHERE r.rtype = 'fact' AND {where} ORDER BY r.id DESC"
        )
        if limit is not None:
            sql += f" LIMIT {self.dialect.mark}"
            params.append(limit)
        return self._read(sql, params)

    def embedded(
        self, kinds: Sequence[str], scopes: Sequence[ScopeParams]
    ) -> list[tuple[Row, bytes]]:
        where, params = self._scopes(scopes)
        kind_in, kind_params = self.dialect.any_of("r.rtype", kinds)
        rows = self._read(
            f"SELECT {COLUMNS}, r.embedding FROM pp_mem_records AS r"
            f" WHERE r.embedding IS NOT NULL{self._embedded_filter()} AND {kind_in}"
            f" AND {where}",
            (*kind_params, *params),
        )
        return [(tuple(row[:-1]), bytes(row[-1])) for row in rows]

    # ------------------------------------------------------------------ history layer

    def replace_history(
        self,
        scope: ScopeParams,
        session_id: str,
        entries: Sequence[HistoryEntry],
        created_at: float,
    ) -> None:
        rows = [
            (
                *scope,
                session_id,
                e.row_key,
                *c[:4],
                e.digest,
                e.metadata,
                created_at,
                c.embedding,
                *self._indexed(c.text, c.embedding, history=True),
            )
            for e in entries
            for c in e.passages
        ]
        m = self.dialect.mark
        keys = sorted({e.row_key for e in entries})
        columns, values = self._index_columns(history=True)
        with self._transaction() as cur:
            # Two writers of one session's rows (several workers evicting the same turn)
            # take turns, so each row is stored once.
            self._lock_rows(cur, scope, "\x1fhistory\x1f" + session_id)
            for start in range(0, len(keys), _MAX_KEYS):
                key_in, key_params = self.dialect.any_of("row_key", keys[start : start + _MAX_KEYS])
                cur.execute(
                    f"DELETE FROM pp_mem_history WHERE {self._scope_eq()} AND session_id = {m}"
                    f" AND {key_in}",
                    (*scope, session_id, *key_params),
                )
            if rows:
                cur.executemany(
                    "INSERT INTO pp_mem_history (s_tenant, s_user, s_thread, s_kind,"
                    " session_id, row_key, passage, char_start, char_end, text, digest,"
                    f" metadata, created_at, embedding{columns})"
                    f" VALUES ({self._marks(14)}{values})",
                    rows,
                )

    def history_digests(
        self,
        scope: ScopeParams,
        session_id: str,
        start: int | None,
        end: int | None,
        digest: str | None = None,
    ) -> list[tuple[int, str]]:
        m = self.dialect.mark
        sql = (
            f"SELECT row_key, digest FROM pp_mem_history WHERE {self._scope_eq()}"
            f" AND session_id = {m} AND passage = 0"
        )
        params: list[Any] = [*scope, session_id]
        if start is not None:
            sql += f" AND row_key >= {m}"
            params.append(start)
        if end is not None:
            sql += f" AND row_key < {m}"
            params.append(end)
        if digest is not None:
            sql += f" AND digest = {m}"
            params.append(digest)
        rows = self._read(sql + " ORDER BY row_key", params, history=True)
        return [(int(r), str(d)) for r, d in rows]

    def forget_history(
        self, scope: ScopeParams, session_id: str | None, from_row: int | None
    ) -> int:
        m = self.dialect.mark
        sql = f"DELETE FROM pp_mem_history WHERE {self._scope_eq()}"
        params: list[Any] = list(scope)
        if session_id is not None:
            sql += f" AND session_id = {m}"
            params.append(session_id)
        if from_row is not None:
            sql += f" AND row_key >= {m}"
            params.append(from_row)
        with self._transaction() as cur:
            return int(cur.execute(sql, params).rowcount)

    def history_embedded(
        self, scopes: Sequence[ScopeParams], session_id: str | None
    ) -> list[tuple[Row, bytes]]:
        where, params = self._history_scopes(scopes, session_id)
        rows = self._read(
            f"SELECT {HISTORY}, h.embedding FROM pp_mem_history AS h"
            f" WHERE h.embedding IS NOT NULL AND {where}",
            params,
            history=True,
        )
        return [(tuple(row[:-1]), bytes(row[-1])) for row in rows]
