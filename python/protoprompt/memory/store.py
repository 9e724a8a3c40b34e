"""SQLite-backed, scoped long-term memory with FTS5 and optional hybrid vector search.

All tables are prefixed ``pp_mem_`` so a :class:`MemoryStore` can share a database
file with the OpenAI Agents SDK's ``SQLiteSession`` tables.  See
:mod:`protoprompt.memory.scope` for the scope (isolation) rule.
"""

from __future__ import annotations

import json
import math
import os
import re
import sqlite3
import threading
import time
import urllib.parse
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._ranking import WORD, cosine, rrf_weight
from .scope import MemoryScope

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Embedder", "MemoryHit", "MemoryStore", "chunk_spans", "fts_query"]

Embedder = Callable[[list[str]], list[list[float]]]
"""Maps a batch of texts to one embedding vector per text."""

_RECORD_KINDS = ("document", "fact")
_MAX_QUERY_TERMS = 64
_MIN_POOL = 32  # candidates fetched per signal before fusion

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pp_mem_records (
    id          INTEGER PRIMARY KEY,
    rtype       TEXT NOT NULL CHECK (rtype IN ('document', 'fact')),
    s_tenant    TEXT NOT NULL,
    s_user      TEXT NOT NULL,
    s_thread    TEXT NOT NULL,
    s_kind      TEXT NOT NULL,
    doc_id      TEXT,
    chunk_index INTEGER,
    char_start  INTEGER,
    char_end    INTEGER,
    fact_id     TEXT UNIQUE,
    importance  REAL,
    text        TEXT NOT NULL,
    metadata    TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    embedding   BLOB
);
CREATE INDEX IF NOT EXISTS pp_mem_records_scope
    ON pp_mem_records (s_tenant, s_user, s_thread, s_kind, rtype, doc_id);
CREATE VIRTUAL TABLE IF NOT EXISTS pp_mem_fts USING fts5(
    text,
    content = 'pp_mem_records',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS pp_mem_records_ai AFTER INSERT ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS pp_mem_records_ad AFTER DELETE ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (pp_mem_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS pp_mem_records_au AFTER UPDATE OF text ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (pp_mem_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO pp_mem_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TABLE IF NOT EXISTS pp_mem_profiles (
    s_tenant   TEXT NOT NULL,
    s_user     TEXT NOT NULL,
    s_thread   TEXT NOT NULL,
    s_kind     TEXT NOT NULL,
    profile    TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (s_tenant, s_user, s_thread, s_kind)
);
"""

_COLUMNS = (
    "r.id, r.rtype, r.s_tenant, r.s_user, r.s_thread, r.s_kind, r.doc_id, r.chunk_index,"
    " r.char_start, r.char_end, r.fact_id, r.importance, r.text, r.metadata, r.created_at"
)
_SCOPE_EQ = "s_tenant = ? AND s_user = ? AND s_thread = ? AND s_kind = ?"


@dataclass(frozen=True)
class MemoryHit:
    """One search or listing result.

    ``score`` is *higher is better* and only comparable within one result list:

    * FTS-only ranking: ``-bm25`` (positive; larger means more relevant);
    * vector-only ranking: cosine similarity in ``(0, 1]``;
    * hybrid ranking (both signals had hits): reciprocal-rank-fusion score
      ``sum(1 / (60 + rank))`` over the FTS and vector rankings;
    * :meth:`MemoryStore.facts`: the fact's ``importance``.

    ``span`` is the ``(start, end)`` character range of a document chunk inside the
    originally indexed text (``text == original[start:end]``); ``None`` for facts.
    Document hits carry the document's metadata; fact hits carry
    ``{"importance": ..., "created_at": ...}``.
    """

    kind: str
    text: str
    score: float
    doc_id: str | None
    chunk_index: int | None
    fact_id: str | None
    scope: MemoryScope
    metadata: dict[str, Any] = field(default_factory=dict, hash=False)
    span: tuple[int, int] | None = None


# --------------------------------------------------------------------------- helpers

_SENTENCE_END = re.compile(r"[.!?\u2026\u3002\uff01\uff1f][\"'\u201d\u2019\u00bb)\]]*$")
_PARAGRAPH_GAP = re.compile(r"\n[^\S\n]*\n")


def chunk_spans(text: str, chunk_words: int, overlap: int) -> list[tuple[int, int]]:
    """Split ``text`` into overlapping word windows; return ``(start, end)`` offsets.

    Each window holds at most ``chunk_words`` words.  A window is cut at the last
    paragraph break in its second half if there is one, else at the last sentence
    end there, else after exactly ``chunk_words`` words.  The next window starts
    ``overlap`` words before the cut, moved forward to a sentence start inside the
    overlap when possible.  Whitespace-only text yields no chunks.
    """
    words = [m.span() for m in WORD.finditer(text)]
    n = len(words)
    if n == 0:
        return []
    # Boundary strength after word i: 2 = paragraph break, 1 = sentence end, 0 = none.
    strength: list[int] = []
    for i, (start, end) in enumerate(words):
        if i == n - 1 or _PARAGRAPH_GAP.search(text, end, words[i + 1][0]):
            strength.append(2)
        elif _SENTENCE_END.search(text, start, end):
            strength.append(1)
        else:
            strength.append(0)

    spans: list[tuple[int, int]] = []
    first = 0
    while True:
        stop = first + chunk_words
        if stop >= n:
            stop = n
        else:
            best = 0
            for cut in range(stop, first + max(1, chunk_words // 2) - 1, -1):
                if strength[cut - 1] > best:
                    best, stop_at = strength[cut - 1], cut
                    if best == 2:
                        break
            if best:
                stop = stop_at
        spans.append((words[first][0], words[stop - 1][1]))
        if stop >= n:
            return spans
        nxt = max(stop - overlap, first + 1)
        for candidate in range(nxt, stop):
            if strength[candidate - 1]:
                nxt = candidate
                break
        first = nxt


def fts_query(text: str) -> str | None:
    """Turn free user text into a safe FTS5 query, or ``None`` if it has no terms.

    The text is split on whitespace; pieces without any letter or digit are dropped;
    each remaining piece is double-quoted (embedded quotes doubled) so FTS5 syntax
    such as ``NEAR``, ``*``, ``-``, ``:`` or parentheses is treated literally, and the
    pieces are OR-combined.  A piece like ``foo-bar`` becomes the phrase "foo bar".
    """
    # NUL would end the query string inside SQLite; lone surrogates cannot be encoded.
    text = text.replace("\x00", " ").encode("utf-8", "ignore").decode("utf-8")
    terms: dict[str, None] = {}
    for piece in text.split():
        if any(ch.isalnum() for ch in piece):
            terms.setdefault(piece.replace('"', '""'), None)
        if len(terms) >= _MAX_QUERY_TERMS:
            break
    if not terms:
        return None
    return " OR ".join(f'"{term}"' for term in terms)


def _check_scope(scope: object) -> MemoryScope:
    if not isinstance(scope, MemoryScope):
        raise TypeError(f"scope must be a MemoryScope, got {type(scope).__name__}")
    return scope


def _check_str(name: str, value: object, *, non_empty: bool = False) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if non_empty and not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    return value


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


_SQLITE_MAX_INT = 2**63 - 1


def _check_limit(value: object) -> int:
    """A row limit: a positive int that SQLite can hold (``sys.maxsize`` means no limit)."""
    limit = _check_positive_int("limit", value)
    if limit > _SQLITE_MAX_INT:
        raise ValueError(f"limit must be at most 2**63 - 1, got {limit}")
    return limit


def _check_kinds(kinds: object) -> tuple[str, ...]:
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise TypeError(
            "kinds must be an iterable of 'document' / 'fact' strings, not a single str"
        )
    result = tuple(dict.fromkeys(kinds))
    bad = [k for k in result if k not in _RECORD_KINDS]
    if bad:
        raise ValueError(f"kinds may only contain 'document' and 'fact', got {bad!r}")
    return result


def _scope_params(scope: MemoryScope) -> tuple[str, str, str, str]:
    # None is stored as '' (MemoryScope forbids empty strings), which keeps
    # equality and UNIQUE constraints simple.
    tenant, user, thread, kind = scope.key()
    return (tenant, user or "", thread or "", kind or "")


def _visible_scopes(scope: MemoryScope, include_parents: bool) -> list[MemoryScope]:
    if not isinstance(include_parents, bool):
        raise TypeError(f"include_parents must be a bool, got {type(include_parents).__name__}")
    return [scope, *reversed(scope.ancestors())] if include_parents else [scope]


def _scope_filter(scopes: Sequence[MemoryScope], alias: str = "r") -> tuple[str, list[Any]]:
    clause = " AND ".join(
        f"{alias}.{col} = ?" for col in ("s_tenant", "s_user", "s_thread", "s_kind")
    )
    params: list[Any] = []
    for scope in scopes:
        params.extend(_scope_params(scope))
    return "(" + " OR ".join(f"({clause})" for _ in scopes) + ")", params


def _row_scope(tenant: str, user: str, thread: str, kind: str) -> MemoryScope:
    return MemoryScope(tenant, user or None, thread or None, kind or None)


def _cosine(query: Sequence[float], query_norm: float, blob: bytes) -> float:
    vec = array("f")
    vec.frombytes(blob)
    # A vector of another length was stored by a different embedder: similarity 0.
    return cosine(query, vec, query_norm)


# --------------------------------------------------------------------------- store


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot change the database file (SQLite ``mode=ro``)."""
    if path in (":memory:", "") or path.startswith("file:"):
        raise ValueError(f"a read-only MemoryStore needs a database file path, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no database file {path!r} (a read-only store creates none)")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    return sqlite3.connect(
        uri, uri=True, timeout=30.0, check_same_thread=False, isolation_level=None
    )


class MemoryStore:
    """Scoped long-term memory in a SQLite database.

    Documents are chunked and indexed in an FTS5 table (``unicode61
    remove_diacritics 2`` tokenizer, bm25 ranking).  If an ``embedder`` is given,
    chunk and fact vectors are stored too (float32 blobs) and :meth:`search` fuses
    the FTS and cosine rankings by reciprocal-rank fusion.

    One connection is shared by all threads and guarded by a lock, so the store is
    safe to use from many threads and from asyncio via ``asyncio.to_thread``.  File
    databases use WAL mode and a 30 s busy timeout, so other connections (another
    store, the Agents SDK's ``SQLiteSession``) can use the same file.

    Args:
        path: database file, or ``":memory:"`` (default) for a private in-memory DB.
        embedder: optional ``list[str] -> list[list[float]]`` batch embedder.
        chunk_words: maximum words per document chunk.
        chunk_overlap: words shared by consecutive chunks (``0 <= overlap < chunk_words``).
        read_only: open an existing file read-only: the database is never changed (no
            schema is created, the journal mode is left as it is) and writes raise
            ``PermissionError``; a database without memory tables reads as empty.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        embedder: Embedder | None = None,
        chunk_words: int = 200,
        chunk_overlap: int = 40,
        read_only: bool = False,
    ) -> None:
        self._chunk_words = _check_positive_int("chunk_words", chunk_words)
        if not isinstance(read_only, bool):
            raise TypeError(f"read_only must be a bool, got {type(read_only).__name__}")
        if isinstance(chunk_overlap, bool) or not isinstance(chunk_overlap, int):
            raise TypeError(f"chunk_overlap must be an int, got {type(chunk_overlap).__name__}")
        if not 0 <= chunk_overlap < chunk_words:
            raise ValueError(f"chunk_overlap must be >= 0 and < chunk_words, got {chunk_overlap}")
        if embedder is not None and not callable(embedder):
            raise TypeError("embedder must be callable or None")
        self._chunk_overlap = chunk_overlap
        self._embedder = embedder
        self._path = os.fsdecode(path)
        self._lock = threading.RLock()
        self._read_only = read_only
        self._tables = not read_only  # a read-only store checks (until they exist)
        if read_only:
            conn = _connect_read_only(self._path)
        else:
            conn = sqlite3.connect(
                self._path, timeout=30.0, check_same_thread=False, isolation_level=None
            )
            try:
                if self._path not in (":memory:", ""):
                    conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
            except BaseException:
                conn.close()
                raise
        self._conn: sqlite3.Connection | None = conn

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the database connection.  Further calls raise ``RuntimeError``."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryStore({self._path!r}, hybrid={self._embedder is not None})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("MemoryStore is closed")
        return self._conn

    @property
    def read_only(self) -> bool:
        """Whether the store was opened ``read_only`` (writes raise ``PermissionError``)."""
        return self._read_only

    def _has_tables(self) -> bool:
        """Whether the memory tables exist (always, unless opened read-only on a database
        that has none yet: then it reads as empty)."""
        if not self._tables:
            with self._lock:
                found = (
                    self._connection()
                    .execute(
                        "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                        " AND name IN ('pp_mem_records', 'pp_mem_profiles', 'pp_mem_fts')"
                    )
                    .fetchone()
                )
            self._tables = found[0] == 3
        return self._tables

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        if self._read_only:
            raise PermissionError(f"MemoryStore({self._path!r}) was opened read_only")
        with self._lock:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def _vectors(self, texts: list[str]) -> list[list[float]]:
        """Call the embedder and validate its output (one finite vector per text)."""
        assert self._embedder is not None
        vectors = self._embedder(texts)
        if not isinstance(vectors, Sequence) or len(vectors) != len(texts):
            raise ValueError("embedder must return exactly one vector per input text")
        result = []
        for vec in vectors:
            values = [float(x) for x in vec]
            if not values or not all(math.isfinite(x) for x in values):
                raise ValueError("embedder returned an empty or non-finite vector")
            result.append(values)
        return result

    def _embed(self, texts: list[str]) -> list[bytes | None]:
        """Return float32 blobs for ``texts`` (``None`` each without an embedder)."""
        if self._embedder is None or not texts:
            return [None] * len(texts)
        return [array("f", vec).tobytes() for vec in self._vectors(texts)]

    # ------------------------------------------------------------------ writes

    def index_document(
        self,
        doc_id: str,
        text: str,
        *,
        scope: MemoryScope,
        metadata: dict[str, Any] | None = None,
    ) -> int:
        """Chunk and index ``text`` as document ``doc_id``; return the chunk count.

        Any previous version of ``doc_id`` in exactly this scope is replaced in the
        same transaction (readers see either the old or the new version).  The same
        ``doc_id`` in other scopes is unaffected.  ``metadata`` must be a
        JSON-serialisable dict and is returned with every hit of this document.
        Whitespace-only ``text`` removes the document and returns 0.
        """
        scope = _check_scope(scope)
        _check_str("doc_id", doc_id, non_empty=True)
        _check_str("text", text)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict):
            raise TypeError(f"metadata must be a dict or None, got {type(metadata).__name__}")
        try:
            meta_json = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"metadata must be JSON-serialisable: {exc}") from None

        spans = chunk_spans(text, self._chunk_words, self._chunk_overlap)
        chunks = [text[start:end] for start, end in spans]
        blobs = self._embed(chunks)  # outside the lock: embedders can be slow
        params = _scope_params(scope)
        now = time.time()
        rows = [
            (*params, doc_id, index, start, end, chunk, meta_json, now, blob)
            for index, ((start, end), chunk, blob) in enumerate(
                zip(spans, chunks, blobs, strict=True)
            )
        ]
        with self._transaction() as conn:
            conn.execute(
                "DELETE FROM pp_mem_records WHERE rtype = 'document' AND doc_id = ?"
                f" AND {_SCOPE_EQ}",
                (doc_id, *params),
            )
            conn.executemany(
                "INSERT INTO pp_mem_records (rtype, s_tenant, s_user, s_thread, s_kind, doc_id,"
                " chunk_index, char_start, char_end, text, metadata, created_at, embedding)"
                " VALUES ('document', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
        return len(rows)

    def remember(self, text: str, *, scope: MemoryScope, importance: float = 1.0) -> str:
        """Store a session fact in exactly ``scope``; return its fact id.

        ``importance`` (a finite number, default 1.0) is kept with the fact and
        reported as its score by :meth:`facts`; it does not affect :meth:`search`.
        """
        scope = _check_scope(scope)
        _check_str("text", text, non_empty=True)
        if isinstance(importance, bool) or not isinstance(importance, (int, float)):
            raise TypeError(f"importance must be a number, got {type(importance).__name__}")
        if not math.isfinite(importance):
            raise ValueError("importance must be finite")
        (blob,) = self._embed([text])
        fact_id = uuid.uuid4().hex
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO pp_mem_records (rtype, s_tenant, s_user, s_thread, s_kind, fact_id,"
                " importance, text, created_at, embedding)"
                " VALUES ('fact', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (*_scope_params(scope), fact_id, float(importance), text, time.time(), blob),
            )
        return fact_id

    def set_profile(self, profile: str | Mapping[str, str], *, scope: MemoryScope) -> None:
        """Set (replace) the profile text of exactly ``scope``.

        A mapping is rendered as ``"key: value"`` lines in insertion order.
        """
        scope = _check_scope(scope)
        if isinstance(profile, Mapping):
            lines = []
            for key, value in profile.items():
                if not isinstance(key, str) or not isinstance(value, str):
                    raise TypeError("profile mapping keys and values must be str")
                lines.append(f"{key}: {value}")
            text = "\n".join(lines)
        elif isinstance(profile, str):
            text = profile
        else:
            raise TypeError(
                f"profile must be a str or a Mapping[str, str], got {type(profile).__name__}"
            )
        with self._transaction() as conn:
            conn.execute(
                "INSERT INTO pp_mem_profiles"
                " (s_tenant, s_user, s_thread, s_kind, profile, updated_at)"
                " VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (s_tenant, s_user, s_thread, s_kind)"
                " DO UPDATE SET profile = excluded.profile, updated_at = excluded.updated_at",
                (*_scope_params(scope), text, time.time()),
            )

    def clear_profile(self, *, scope: MemoryScope) -> bool:
        """Remove the profile of exactly ``scope``: the scope has no profile of its own (an
        ancestor's is what :meth:`get_profile` with ``include_parents`` finds). Returns
        whether there was one."""
        scope = _check_scope(scope)
        with self._transaction() as conn:
            deleted = conn.execute(
                f"DELETE FROM pp_mem_profiles WHERE {_SCOPE_EQ}", _scope_params(scope)
            ).rowcount
        return deleted > 0

    def forget(
        self, *, scope: MemoryScope, doc_id: str | None = None, fact_id: str | None = None
    ) -> int:
        """Delete from exactly ``scope`` (never narrower or wider scopes).

        With ``doc_id`` and/or ``fact_id``: delete that document (all its chunks)
        and/or that fact.  With neither: delete every document chunk, fact and the
        profile of the scope.  Returns the number of rows deleted (chunks, facts
        and profile rows).
        """
        scope = _check_scope(scope)
        if doc_id is not None:
            _check_str("doc_id", doc_id, non_empty=True)
        if fact_id is not None:
            _check_str("fact_id", fact_id, non_empty=True)
        params = _scope_params(scope)
        deleted = 0
        with self._transaction() as conn:
            if doc_id is None and fact_id is None:
                for table in ("pp_mem_records", "pp_mem_profiles"):
                    sql = f"DELETE FROM {table} WHERE {_SCOPE_EQ}"
                    deleted += conn.execute(sql, params).rowcount
            if doc_id is not None:
                deleted += conn.execute(
                    "DELETE FROM pp_mem_records WHERE rtype = 'document' AND doc_id = ?"
                    f" AND {_SCOPE_EQ}",
                    (doc_id, *params),
                ).rowcount
            if fact_id is not None:
                deleted += conn.execute(
                    "DELETE FROM pp_mem_records WHERE rtype = 'fact' AND fact_id = ?"
                    f" AND {_SCOPE_EQ}",
                    (fact_id, *params),
                ).rowcount
        return deleted

    # ------------------------------------------------------------------ reads

    def get_profile(self, *, scope: MemoryScope, include_parents: bool = False) -> str | None:
        """Return the profile of ``scope`` (or ``None``).

        With ``include_parents=True`` the nearest profile among the scope and its
        ancestors is returned. A blank profile counts as none (it does not hide an
        ancestor's).
        """
        scopes = _visible_scopes(_check_scope(scope), include_parents)
        if not self._has_tables():
            return None
        where, params = _scope_filter(scopes, alias="p")
        with self._lock:
            rows = (
                self._connection()
                .execute(
                    "SELECT p.s_tenant, p.s_user, p.s_thread, p.s_kind, p.profile"
                    f" FROM pp_mem_profiles AS p WHERE {where}",
                    params,
                )
                .fetchall()
            )
        found = {_row_scope(*row[:4]): row[4] for row in rows if row[4].strip()}
        return next((found[s] for s in scopes if s in found), None)

    def facts(
        self, *, scope: MemoryScope, limit: int | None = None, include_parents: bool = False
    ) -> list[MemoryHit]:
        """Return facts of ``scope`` (and ancestors if asked), most recent first."""
        scopes = _visible_scopes(_check_scope(scope), include_parents)
        if limit is not None:
            _check_limit(limit)
        if not self._has_tables():
            return []
        where, params = _scope_filter(scopes)
        sql = (
            f"SELECT {_COLUMNS} FROM pp_mem_records AS r"
            f" WHERE r.rtype = 'fact' AND {where} ORDER BY r.id DESC"
        )
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._lock:
            rows = self._connection().execute(sql, params).fetchall()
        return [self._hit(row, row[11]) for row in rows]

    def search(
        self,
        query: str,
        *,
        scope: MemoryScope,
        limit: int = 8,
        kinds: Iterable[str] = _RECORD_KINDS,
        include_parents: bool = False,
    ) -> list[MemoryHit]:
        """Rank document chunks and/or facts of ``scope`` against ``query``.

        ``query`` is free user text (see :func:`fts_query`); a query without any
        letter or digit returns ``[]``.  Ranking is FTS5 bm25; with an embedder it is
        hybrid (reciprocal-rank fusion of bm25 and cosine rankings, or whichever
        signal alone has hits).  See :class:`MemoryHit` for the score meaning.
        """
        scope = _check_scope(scope)
        _check_str("query", query)
        _check_limit(limit)
        kind_list = _check_kinds(kinds)
        scopes = _visible_scopes(scope, include_parents)
        match = fts_query(query)
        if match is None or not kind_list or not self._has_tables():
            return []
        query_vec: list[float] | None = None
        if self._embedder is not None:
            (query_vec,) = self._vectors([query])
        pool = min(max(limit * 4, _MIN_POOL), _SQLITE_MAX_INT)
        where, scope_params = _scope_filter(scopes)
        kind_sql = ", ".join("?" for _ in kind_list)

        with self._lock:
            conn = self._connection()
            fts_rows = conn.execute(
                f"SELECT {_COLUMNS}, bm25(pp_mem_fts) AS rank FROM pp_mem_fts"
                " JOIN pp_mem_records AS r ON r.id = pp_mem_fts.rowid"
                f" WHERE pp_mem_fts MATCH ? AND r.rtype IN ({kind_sql}) AND {where}"
                " ORDER BY rank, r.id LIMIT ?",
                (match, *kind_list, *scope_params, pool),
            ).fetchall()
            vec_rows: list[Any] = []
            if query_vec is not None:
                vec_rows = conn.execute(
                    f"SELECT {_COLUMNS}, r.embedding FROM pp_mem_records AS r"
                    f" WHERE r.embedding IS NOT NULL AND r.rtype IN ({kind_sql}) AND {where}",
                    (*kind_list, *scope_params),
                ).fetchall()

        rows_by_id = {row[0]: row for row in fts_rows}
        fts_ranked = [(row[0], -row[-1]) for row in fts_rows]
        vec_ranked: list[tuple[int, float]] = []
        if query_vec is not None:
            query_norm = math.sqrt(sum(x * x for x in query_vec))
            if query_norm > 0.0:
                for row in vec_rows:
                    sim = _cosine(query_vec, query_norm, row[-1])
                    if sim > 0.0:
                        vec_ranked.append((row[0], sim))
                        rows_by_id.setdefault(row[0], row)
                vec_ranked.sort(key=lambda item: (-item[1], item[0]))
                del vec_ranked[pool:]

        scores: dict[int, float]
        if fts_ranked and vec_ranked:
            scores = {}
            for ranked in (fts_ranked, vec_ranked):
                for position, (rid, _) in enumerate(ranked, start=1):
                    scores[rid] = scores.get(rid, 0.0) + rrf_weight(position)
        else:
            scores = dict(fts_ranked or vec_ranked)
        best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]
        return [self._hit(rows_by_id[rid], score) for rid, score in best]

    @staticmethod
    def _hit(row: Sequence[Any], score: float) -> MemoryHit:
        (
            _,
            rtype,
            tenant,
            user,
            thread,
            kind,
            doc_id,
            chunk_index,
            start,
            end,
            fact_id,
            importance,
            text,
            metadata,
            created_at,
        ) = row[:15]
        if rtype == "fact":
            meta: dict[str, Any] = {"importance": importance, "created_at": created_at}
            span = None
        else:
            meta = json.loads(metadata)
            span = (start, end)
        return MemoryHit(
            kind=rtype,
            text=text,
            score=float(score),
            doc_id=doc_id,
            chunk_index=chunk_index,
            fact_id=fact_id,
            scope=_row_scope(tenant, user, thread, kind),
            metadata=meta,
            span=span,
        )
