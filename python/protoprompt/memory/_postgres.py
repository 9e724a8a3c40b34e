"""The PostgreSQL engine of the memory store: psycopg 3, a connection pool, a GIN index.

Design notes
------------
* **Words.** SQLite's FTS5 tokenizer is not available here, and PostgreSQL's own text search
  parser and dictionaries depend on the server's locale and configuration. So the words of a
  record are found in the client, the same way on every server: runs of letters and digits
  after Unicode compatibility decomposition, with combining marks removed and lower-cased
  (:func:`words`; ``"Café"`` -> ``cafe``, Cyrillic and other scripts alike). They are stored
  as a ``tsvector`` with their positions (:func:`tsvector_literal`), indexed by GIN, and a
  query is a ``tsquery`` of the same words (:func:`tsquery_literal`): each query piece a
  phrase (``<->``), the pieces OR-combined. No text search configuration is involved. The
  history layer stores the Porter stems of those words instead (``_stem``), the terms
  SQLite's ``porter`` tokenizer makes, so both engines match the same terms; a table an
  older store filled with plain words is stemmed again on first use (``pp_mem_meta`` key
  ``history_terms``). Both engines' history matches are ranked again in the client by the
  same BM25 (``_ranking.rank_passages``).
* **Relevance** is ``ts_rank(tsv, query, 1)``: term frequency, divided by ``1 + log`` of the
  record's length. SQLite ranks by bm25 instead; which records match is the same, and the
  rest of the ranking contract (fusion, ties, pool sizes) is the store's, shared.
* **Vectors** are stored as float32 ``bytea``, as in SQLite. When the database has the
  pgvector extension (``CREATE EXTENSION vector``, by a superuser: it is not a trusted
  extension), each record also gets its vector in a ``vec`` column (added on first use) and
  the server ranks the visible scopes' vectors by cosine distance, so no vector crosses the
  network; records without one (written by a store that did not know the column) are ranked
  in the client as before, and the two rankings merged. Without pgvector every vector is
  ranked in the client (:attr:`PostgresBackend.vector_ranking` says which).
* **Writers on many hosts.** Every write is one transaction. Replacing a document takes a
  transaction-scoped advisory lock on (scope, doc_id), so two writers of the same document
  cannot interleave their delete and insert; facts and profiles need none (an insert; an
  upsert).
* **Migrations on first use.** The tables are created by the first store that finds them
  missing, under a transaction-scoped advisory lock, so many workers starting at once
  create them once. ``pp_mem_meta`` holds the schema version; a database with another
  version is refused rather than guessed at.
* **Connections.** A pool (psycopg_pool) of at most :data:`MAX_CONNECTIONS` autocommit
  connections per store, checked before use. A forked child never touches its parent's
  connections: it opens a pool of its own on first use.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from .. import _process
from .._storage.dialect import POSTGRESQL
from ._backend import Row, ScopeParams
from ._pg_connect import database_errors, driver_url, imports, redact
from ._pg_schema import (
    LOCK_CLASS,
    SCHEMA_VERSION,
    check_version,
    has_history,
    history_stemmed,
    migrate,
    schema_version,
    vector_setup,
)
from ._pg_sql import (
    MAX_VECTOR_DIMS,
    SCOPE_EQ,
    lock_key,
    search_statement,
    tsquery_literal,
    tsvector_literal,
    vector_statement,
)
from ._ranking import words
from ._sql import HISTORY, SQLMemory

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = [
    "MAX_CONNECTIONS",
    "SCHEMA_VERSION",
    "PostgresBackend",
    "search_statement",
    "tsquery_literal",
    "tsvector_literal",
    "vector_statement",
    "words",
]

MAX_CONNECTIONS = 4
"""Connections one store opens at most (threads beyond wait for one). Writes use at most
all but one of them at a time, so a read (a turn's recall) never waits for writes that
wait for a lock."""
LOCK_TIMEOUT = 30.0
"""Seconds a write waits for a lock (another writer of the same document or session rows)
before it fails, as a SQLite store waits for the database's write lock."""


_INHERITED: list[Any] = []  # a fork parent's pools: never used, closed or collected here


def _after_fork(backend: PostgresBackend) -> None:
    """In a forked child (``_process``): new locks, and a pool of its own on first use."""
    backend._lock = threading.Lock()
    backend._writers = threading.BoundedSemaphore(MAX_CONNECTIONS - 1)
    if backend._pool is not None:
        _INHERITED.append(backend._pool)
        backend._pool = None


_process.POSTGRES_MEMORY_STORES.handle(after_fork=_after_fork)


class PostgresBackend(SQLMemory):
    """A PostgreSQL database by URL (the tables go to the connection's search path)."""

    dialect = POSTGRESQL

    def __init__(self, url: str, *, read_only: bool = False) -> None:
        driver, _ = imports()
        self._url = driver_url(url)
        self._lock = threading.Lock()
        self._writers = threading.BoundedSemaphore(MAX_CONNECTIONS - 1)
        self._pool: ConnectionPool[psycopg.Connection[tuple[Any, ...]]] | None = None
        self._closed = False
        self._read_only = read_only
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        if read_only:
            # Every session of the store refuses writes on the server too (added to the
            # URL's own options, such as a search_path, not in place of them).
            options = driver.conninfo.conninfo_to_dict(self._url).get("options") or ""
            self._connect_kwargs["options"] = f"{options} -c default_transaction_read_only=on"
        with database_errors(), driver.connect(self._url, **self._connect_kwargs) as conn:
            if read_only:
                self._tables = check_version(schema_version(conn))
                self._history = self._tables and has_history(conn)
                self._stemmed = self._history and history_stemmed(conn)
            else:
                migrate(conn)
                self._tables = self._history = self._stemmed = True
            self._vector = vector_setup(conn, create=not read_only) if self._tables else None
        _process.POSTGRES_MEMORY_STORES.add(self)

    @property
    def vector_ranking(self) -> str:
        """``"pgvector"`` when the server ranks vectors, else ``"client"``."""
        return "client" if self._vector is None else "pgvector"

    def describe(self) -> str:
        return redact(self._url)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def _connections(self) -> ConnectionPool[psycopg.Connection[tuple[Any, ...]]]:
        with self._lock:
            if self._closed:
                raise RuntimeError("MemoryStore is closed")
            if self._pool is None:
                _, psycopg_pool = imports()
                self._pool = psycopg_pool.ConnectionPool(
                    self._url,
                    min_size=1,
                    max_size=MAX_CONNECTIONS,
                    kwargs=self._connect_kwargs,
                    check=psycopg_pool.ConnectionPool.check_connection,
                    name="protoprompt-memory",
                    open=True,
                )
            return self._pool

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Cursor[tuple[Any, ...]]]:
        if self._read_only:
            raise PermissionError(f"MemoryStore({self.describe()!r}) was opened read_only")
        pool = self._connections()
        with (
            self._writers,
            database_errors(),
            pool.connection() as conn,
            conn.transaction(),
        ):
            cur = conn.cursor()
            cur.execute(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT * 1000)}ms'")
            yield cur

    def _read(
        self, sql: str, params: Sequence[Any], *, history: bool = False
    ) -> list[tuple[Any, ...]]:
        if not self._tables or (history and not self._history):
            return []  # read-only on a database without the memory tables: empty
        pool = self._connections()
        with database_errors(), pool.connection() as conn:
            return conn.execute(sql, params).fetchall()

    # ------------------------------------------------------------------ writes

    def _lock_rows(self, cur: Any, scope: ScopeParams, name: str) -> None:
        cur.execute("SELECT pg_advisory_xact_lock(%s, %s)", (LOCK_CLASS, lock_key(scope, name)))

    def _index_columns(self, *, history: bool) -> tuple[str, str]:
        """``tsv`` (and ``vec`` with pgvector, not in the history)."""
        if history:
            return ", tsv", ", %s::tsvector"
        vec_column, vec_value = self._vec_sql()
        return ", tsv" + vec_column, ", %s::tsvector" + vec_value

    def _indexed(self, text: str, embedding: bytes | None, *, history: bool) -> tuple[Any, ...]:
        if history:
            return (tsvector_literal(text, stemmed=True),)
        return (tsvector_literal(text), *self._vec_param(embedding))

    def _embedded_filter(self) -> str:
        # With pgvector, records with a vec are ranked by the server (vector_ranked).
        return "" if self._vector is None else " AND r.vec IS NULL"

    def _vec_sql(self) -> tuple[str, str]:
        """The ``vec`` column and its value placeholder of an INSERT (none without pgvector)."""
        if self._vector is None:
            return "", ""
        return ", vec", f", %s::{self._vector}.vector"

    def _vec_param(self, embedding: bytes | None) -> tuple[str | None, ...]:
        """The ``vec`` parameter of an INSERT: ``embedding`` as pgvector's text form
        (``None`` without one, or past pgvector's 16,000 dimensions; none without pgvector)."""
        if self._vector is None:
            return ()
        if embedding is None:
            return (None,)
        values = array("f")
        values.frombytes(embedding)
        if len(values) > MAX_VECTOR_DIMS:
            return (None,)
        return ("[" + ",".join(map(repr, values)) + "]",)

    # ------------------------------------------------------------------ reads

    def text_search(
        self,
        pieces: Sequence[str],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        query = tsquery_literal(pieces)
        if query is None:
            return []
        sql, params = search_statement(query, kinds, scopes, pool)
        rows = self._read(sql, params)
        return [(tuple(row[:-1]), float(row[-1])) for row in rows]

    def vector_ranked(
        self,
        query: Sequence[float],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        if self._vector is None or len(query) > MAX_VECTOR_DIMS:
            return []
        sql, params = vector_statement(self._vector, query, kinds, scopes, pool)
        rows = self._read(sql, params)
        return [(tuple(row[:-1]), float(row[-1])) for row in rows]

    # ------------------------------------------------------------------ history layer

    def history_common_words(self, words: Sequence[str]) -> set[str]:
        # The server's statistics of the tsv column (ANALYZE, run by autovacuum): the
        # lexemes found in most rows and the share of rows holding each, without a scan.
        rows = self._read(
            "SELECT most_common_elems::text::text[], most_common_elem_freqs FROM pg_stats"
            " WHERE schemaname = current_schema() AND tablename = 'pp_mem_history'"
            " AND attname = 'tsv'",
            (),
            history=True,
        )
        wanted = set(words)
        common: set[str] = set()
        for elems, freqs in rows:
            if elems is None or freqs is None:
                continue
            common.update(
                str(e) for e, f in zip(elems, freqs, strict=False) if e in wanted and f > 0.5
            )
        return common

    def history_search(
        self,
        pieces: Sequence[str],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
        pool: int,
    ) -> list[tuple[Row, float]]:
        query = tsquery_literal(pieces, stemmed=self._stemmed)
        if query is None:
            return []
        where, params = self._history_scopes(scopes, session_id)
        sql = (
            f"SELECT {HISTORY}, ts_rank(h.tsv, q.q, 1) AS rank"
            " FROM pp_mem_history AS h, (SELECT %s::tsquery AS q) AS q"
            f" WHERE h.tsv @@ q.q AND {where} ORDER BY rank DESC, h.id LIMIT %s"
        )
        rows = self._read(sql, [query, *params, pool], history=True)
        return [(tuple(row[:-1]), float(row[-1])) for row in rows]

    def history_counts(
        self,
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[int, dict[str, int]]:
        where, params = self._history_scopes(scopes, session_id)
        queries = []
        for term, word in terms:
            query = tsquery_literal([term if self._stemmed else word], stemmed=False)
            if query is not None:
                queries.append((term, query))
        filters = "".join(", count(*) FILTER (WHERE h.tsv @@ %s::tsquery)" for _ in queries)
        rows = self._read(
            f"SELECT count(*){filters} FROM pp_mem_history AS h WHERE {where}",
            [*(q for _, q in queries), *params],
            history=True,
        )
        if not rows:
            return 0, {}
        total, *found = rows[0]
        return int(total), {term: int(n) for (term, _), n in zip(queries, found, strict=True)}

    def history_statistics(
        self,
        words: Sequence[str],
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[set[str], int, dict[str, int]]:
        common = self.history_common_words(words) if words else set()
        return (common, *self.history_counts(terms, scopes, session_id))

    def history_adjacent(
        self, scope: ScopeParams, session_id: str, row_keys: Sequence[int]
    ) -> list[tuple[int, int, Row]]:
        if not row_keys:
            return []
        arms, params = [], []
        for key in row_keys:
            for side, (op, order) in enumerate((("<", "DESC"), (">", "ASC"))):
                # The passage next to the anchor: one step along the scope's index (an
                # ORDER BY ... LIMIT 1, not a max() the planner may work out by reading
                # every row before the anchor when its statistics are stale).
                arms.append(
                    f"SELECT {HISTORY}, %s::bigint AS anchor, {side} AS side"
                    " FROM pp_mem_history AS h WHERE h.id = (SELECT id FROM pp_mem_history"
                    f" WHERE {SCOPE_EQ} AND session_id = %s AND row_key {op} %s::bigint"
                    f" ORDER BY row_key {order}, passage {order} LIMIT 1)"
                )
                params += [key, *scope, session_id, key]
        rows = self._read(" UNION ALL ".join(arms), params, history=True)
        return [(int(row[-2]), int(row[-1]), tuple(row[:-2])) for row in rows]
