"""Scoped long-term memory: documents, facts and profiles in SQLite or PostgreSQL,
full-text search with optional hybrid vector search.

The engine is chosen by the database a :class:`MemoryStore` is given: a file path (or
``":memory:"``) is SQLite, a ``postgresql://`` URL is PostgreSQL (:mod:`._backend`). All
tables are prefixed ``pp_mem_``, so a store can share a database with the OpenAI Agents
SDK's session tables. See :mod:`protoprompt.memory.scope` for the scope (isolation) rule and
:mod:`._ranking` for the ranking contract both engines keep.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple

from ._backend import (
    Backend,
    Chunk,
    HistoryEntry,
    Row,
    ScopeParams,
    is_postgres_url,
    open_backend,
)
from ._ranking import WORD, cosine, fuse, query_pieces
from ._ranking import words as _words
from ._sqlite import fts5_match
from .scope import MemoryScope

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "Embedder",
    "HistoryRecord",
    "MemoryHit",
    "MemoryStore",
    "chunk_spans",
    "fts_query",
    "history_digest",
]

Embedder = Callable[[list[str]], list[list[float]]]
"""Maps a batch of texts to one embedding vector per text."""

_RECORD_KINDS = ("document", "fact")
_MIN_POOL = 32  # candidates fetched per signal before fusion


_LAYER_OF_KIND = {"fact": "session", "document": "rag", "history": "history"}


@dataclass(frozen=True)
class MemoryHit:
    """One search or listing result, named as the builder's context blocks and the MCP
    server's ``memory_search`` results name it: :attr:`layer`, :attr:`source`,
    :attr:`memory_id`, :attr:`score`, :attr:`text` (and for a document chunk
    :attr:`doc_id`, :attr:`chunk_index`, :attr:`span`).

    ``score`` (:meth:`MemoryStore.search`) is the hit's relevance relative to the best hit of
    the same list: the best has 1.0, the others their share of its relevance, in ``(0, 1]``
    (the engine's relevance: full text, bm25 on SQLite or ``ts_rank`` on PostgreSQL; with an
    embedder, cosine similarity, or the reciprocal-rank fusion of both rankings). It ranks
    hits of one list; it is not comparable across queries. :meth:`MemoryStore.facts` lists
    facts with their ``importance`` as the score.

    ``span`` is the ``(start, end)`` character range of a document chunk (or history
    passage) inside the originally indexed text (``text == original[start:end]``); ``None``
    for facts. Document hits carry the document's metadata; fact hits carry
    ``{"importance": ..., "created_at": ...}``; history hits (layer ``"history"``, see
    :meth:`MemoryStore.search_history`) carry their row's metadata with ``session_id``,
    ``row``, ``passage``, ``passages`` (of the row) and ``digest``, and the passage number as
    ``chunk_index``.

    ``kind`` (``"fact"`` / ``"document"`` / ``"history"``, the same as :attr:`layer` but for
    the names of the first two) and ``fact_id`` (a fact's :attr:`memory_id`) are the names of
    earlier versions, kept for compatibility (soft-deprecated: prefer :attr:`layer` and
    :attr:`memory_id`).
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

    @property
    def layer(self) -> str:
        """The context layer the hit is recalled into: ``"session"`` (a fact), ``"rag"``
        (a document chunk) or ``"history"`` (a passage of an evicted turn)."""
        return _LAYER_OF_KIND.get(self.kind, self.kind)

    @property
    def source(self) -> str:
        """Where the hit comes from, as a context block names it: ``"fact:<fact id>"``,
        ``"<doc_id>#<chunk_index>"`` or, for a history passage,
        ``"history:<session_id>/<row>#<passage>"``."""
        if self.kind == "fact":
            return f"fact:{self.fact_id}"
        if self.kind == "history":
            meta = self.metadata
            return f"history:{meta.get('session_id')}/{meta.get('row')}#{self.chunk_index}"
        return f"{self.doc_id}#{self.chunk_index}"

    @property
    def memory_id(self) -> str | None:
        """What :meth:`MemoryStore.forget` (and the MCP ``memory_forget`` tool) deletes it
        by: the fact's id, or ``"doc:<doc_id>"`` for the whole document of a chunk; ``None``
        for a history passage (kept by its session, cleared with it)."""
        if self.kind == "fact":
            return str(self.fact_id)
        if self.kind == "history":
            return None
        return f"doc:{self.doc_id}"


class HistoryRecord(NamedTuple):
    """One row of a session's history to index in the ``history`` layer
    (:meth:`MemoryStore.index_history`)."""

    row: int
    """The row's key in its session: its row id in the session's database, or its position
    in the history when the session has no row ids (a non-negative int)."""
    text: str
    """The row rendered as text (never the raw item)."""
    metadata: Mapping[str, Any] = {}
    """JSON-serialisable facts about the row returned with each of its passages (e.g. its
    ``turn`` and ``label``)."""
    digest: str | None = None
    """What identifies the row's content (returned by :meth:`MemoryStore.history_rows` and
    with each hit); default: :func:`history_digest` of ``text``."""


def history_digest(text: str) -> str:
    """The digest a history row is stored with: BLAKE2b-128 of its rendered text (hex),
    so a caller can tell whether a stored row holds the text it has."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


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
    """Turn free user text into a safe SQLite FTS5 query, or ``None`` if it has no terms.

    The text is split on whitespace; pieces without any letter or digit are dropped;
    each remaining piece is double-quoted (embedded quotes doubled) so FTS5 syntax such as
    ``NEAR``, ``*``, ``-``, ``:`` or parentheses is treated literally, and the pieces are
    OR-combined.  A piece like ``foo-bar`` becomes the phrase "foo bar".  (PostgreSQL
    matches the same pieces the same way, through a ``tsquery``.)
    """
    return fts5_match(query_pieces(text))


def _check_scope(scope: object) -> MemoryScope:
    if not isinstance(scope, MemoryScope):
        raise TypeError(f"scope must be a MemoryScope, got {type(scope).__name__}")
    return scope


def _check_str(name: str, value: object, *, non_empty: bool = False, stored: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if non_empty and not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if stored and "\x00" in value:  # PostgreSQL text cannot hold NUL; kept out everywhere
        raise ValueError(f"{name} must not contain NUL characters")
    return value


def _check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


_MAX_INT = 2**63 - 1


def _check_limit(value: object) -> int:
    """A row limit: a positive int that SQL can hold (``sys.maxsize`` means no limit)."""
    limit = _check_positive_int("limit", value)
    if limit > _MAX_INT:
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


def _scope_params(scope: MemoryScope) -> ScopeParams:
    # None is stored as '' (MemoryScope forbids empty strings), which keeps
    # equality and UNIQUE constraints simple.
    tenant, user, thread, kind = scope.key()
    return (tenant, user or "", thread or "", kind or "")


def _visible_scopes(scope: MemoryScope, include_parents: bool) -> list[MemoryScope]:
    if not isinstance(include_parents, bool):
        raise TypeError(f"include_parents must be a bool, got {type(include_parents).__name__}")
    return [scope, *reversed(scope.ancestors())] if include_parents else [scope]


def _row_scope(tenant: str, user: str, thread: str, kind: str) -> MemoryScope:
    return MemoryScope(tenant, user or None, thread or None, kind or None)


def _cosine(query: Sequence[float], query_norm: float, blob: bytes) -> float:
    vec = array("f")
    vec.frombytes(blob)
    # A vector of another length was stored by a different embedder: similarity 0.
    return cosine(query, vec, query_norm)


# --------------------------------------------------------------------------- store


class MemoryStore:
    """Scoped long-term memory in a SQLite database or on a PostgreSQL server.

    The ``path`` picks the engine: a file path (or ``":memory:"``) is SQLite, a
    ``postgresql://`` URL (also ``postgres://`` and SQLAlchemy's ``postgresql+<driver>://``)
    is PostgreSQL (``pip install 'protoprompt[postgres]'``). Both keep the same API, scope
    rule and ranking contract:

    * SQLite: documents are chunked and indexed in an FTS5 table (``unicode61
      remove_diacritics 2`` tokenizer, bm25 ranking). One connection is shared by all
      threads and guarded by a lock; file databases use WAL mode and a 30 s busy timeout,
      so other connections (another store, the Agents SDK's ``SQLiteSession``) can use the
      same file.
    * PostgreSQL: the words of each record (letters and digits, case and diacritics folded)
      are indexed as a ``tsvector`` with a GIN index and ranked by ``ts_rank``; the tables
      are created on first use (once, however many workers start together); many processes
      on many hosts can write at once; each store keeps a small connection pool. Database
      failures raise :class:`~protoprompt.errors.MemoryStoreError`.

    If an ``embedder`` is given, chunk and fact vectors are stored too (float32) and
    :meth:`search` fuses the full-text and cosine rankings by reciprocal-rank fusion. The
    cosine ranking is computed in this process, or by the server on a PostgreSQL database
    with the pgvector extension (:attr:`vector_ranking`). The store is safe to use from many
    threads and from asyncio via ``asyncio.to_thread``.

    Args:
        path: database file, ``":memory:"`` (default) for a private in-memory SQLite
            database, or a PostgreSQL URL.
        embedder: optional ``list[str] -> list[list[float]]`` batch embedder.
        chunk_words: maximum words per document chunk.
        chunk_overlap: words shared by consecutive chunks (``0 <= overlap < chunk_words``).
        read_only: open an existing database read-only: it is never changed (no schema is
            created, a SQLite file's journal mode is left as it is; a PostgreSQL session is
            ``default_transaction_read_only``) and writes raise ``PermissionError``; a
            database without memory tables reads as empty.
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
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or a path, got {type(path).__name__}")
        self._chunk_overlap = chunk_overlap
        self._embedder = embedder
        self._engine = "postgresql" if is_postgres_url(path) else "sqlite"
        self._read_only = read_only
        self._backend: Backend = open_backend(path, read_only=read_only)

    @property
    def engine(self) -> str:
        """``"sqlite"`` or ``"postgresql"``: the engine this store runs on."""
        return self._engine

    @property
    def read_only(self) -> bool:
        """Whether the store was opened ``read_only`` (writes raise ``PermissionError``)."""
        return self._read_only

    @property
    def vector_ranking(self) -> str:
        """Where a hybrid search ranks vectors: ``"pgvector"`` (by the PostgreSQL server,
        when the database has the pgvector extension) or ``"client"`` (in this process)."""
        return self._backend.vector_ranking

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the database connection(s).  Further calls raise ``RuntimeError``."""
        self._backend.close()

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
        return f"MemoryStore({self._backend.describe()!r}, hybrid={self._embedder is not None})"

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
        texts = [text[start:end] for start, end in spans]
        blobs = self._embed(texts)  # before the transaction: embedders can be slow
        chunks = [
            Chunk(index, start, end, chunk, blob)
            for index, ((start, end), chunk, blob) in enumerate(
                zip(spans, texts, blobs, strict=True)
            )
        ]
        self._backend.replace_document(_scope_params(scope), doc_id, chunks, meta_json, time.time())
        return len(chunks)

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
        self._backend.add_fact(
            _scope_params(scope), fact_id, float(importance), text, time.time(), blob
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
        _check_str("profile", text)
        self._backend.set_profile(_scope_params(scope), text, time.time())

    def clear_profile(self, *, scope: MemoryScope) -> bool:
        """Remove the profile of exactly ``scope``: the scope has no profile of its own (an
        ancestor's is what :meth:`get_profile` with ``include_parents`` finds). Returns
        whether there was one."""
        scope = _check_scope(scope)
        return self._backend.clear_profile(_scope_params(scope)) > 0

    def forget(
        self, *, scope: MemoryScope, doc_id: str | None = None, fact_id: str | None = None
    ) -> int:
        """Delete from exactly ``scope`` (never narrower or wider scopes).

        With ``doc_id`` and/or ``fact_id``: delete that document (all its chunks)
        and/or that fact.  With neither: delete every document chunk, fact, history passage
        and the profile of the scope.  Returns the number of rows deleted (chunks, facts,
        passages and profile rows).
        """
        scope = _check_scope(scope)
        if doc_id is not None:
            _check_str("doc_id", doc_id, non_empty=True)
        if fact_id is not None:
            _check_str("fact_id", fact_id, non_empty=True)
        return self._backend.forget(_scope_params(scope), doc_id, fact_id)

    # ------------------------------------------------------------------ reads

    def get_profile(self, *, scope: MemoryScope, include_parents: bool = False) -> str | None:
        """Return the profile of ``scope`` (or ``None``).

        With ``include_parents=True`` the nearest profile among the scope and its
        ancestors is returned. A blank profile counts as none (it does not hide an
        ancestor's).
        """
        scopes = _visible_scopes(_check_scope(scope), include_parents)
        rows = self._backend.profiles([_scope_params(s) for s in scopes])
        found = {_row_scope(*row[:4]): row[4] for row in rows if row[4].strip()}
        return next((found[s] for s in scopes if s in found), None)

    def facts(
        self, *, scope: MemoryScope, limit: int | None = None, include_parents: bool = False
    ) -> list[MemoryHit]:
        """Return facts of ``scope`` (and ancestors if asked), most recent first."""
        scopes = _visible_scopes(_check_scope(scope), include_parents)
        if limit is not None:
            _check_limit(limit)
        rows = self._backend.facts([_scope_params(s) for s in scopes], limit)
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
        letter or digit returns ``[]``.  Ranking is full-text relevance (bm25 on SQLite,
        ``ts_rank`` on PostgreSQL); with an embedder it is hybrid (reciprocal-rank fusion
        of the full-text and cosine rankings, or whichever signal alone has hits).  See
        :class:`MemoryHit` for the score meaning.
        """
        scope = _check_scope(scope)
        _check_str("query", query, stored=False)
        _check_limit(limit)
        kind_list = _check_kinds(kinds)
        scopes = [_scope_params(s) for s in _visible_scopes(scope, include_parents)]
        pieces = query_pieces(query)
        if not pieces or not kind_list:
            return []
        query_vec: list[float] | None = None
        if self._embedder is not None:
            (query_vec,) = self._vectors([query])
        pool = min(max(limit * 4, _MIN_POOL), _MAX_INT)

        text_rows = self._backend.text_search(pieces, kind_list, scopes, pool)
        rows_by_id = {row[0]: row for row, _ in text_rows}
        text_ranked = [(row[0], score) for row, score in text_rows]
        vec_ranked: list[tuple[int, float]] = []
        if query_vec is not None:
            query_norm = math.sqrt(sum(x * x for x in query_vec))
            if query_norm > 0.0:
                # Ranked by the server (pgvector) where it can, in this process otherwise.
                ranked = self._backend.vector_ranked(query_vec, kind_list, scopes, pool)
                ranked += [
                    (row, _cosine(query_vec, query_norm, blob))
                    for row, blob in self._backend.embedded(kind_list, scopes)
                ]
                for row, sim in ranked:
                    if sim > 0.0:  # False for NaN (a zero vector)
                        vec_ranked.append((row[0], sim))
                        rows_by_id.setdefault(row[0], row)
                vec_ranked.sort(key=lambda item: (-item[1], item[0]))
                del vec_ranked[pool:]

        best = fuse(text_ranked, vec_ranked, limit)
        top = best[0][1] if best else 0.0
        # Relative to the best hit: one scale for every engine and ranking, in (0, 1].
        return [
            self._hit(rows_by_id[rid], score / top if top > 0.0 else 1.0) for rid, score in best
        ]

    @staticmethod
    def _hit(row: Row, score: float) -> MemoryHit:
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

    # ------------------------------------------------------------------ history layer

    def index_history(
        self, session_id: str, records: Iterable[HistoryRecord], *, scope: MemoryScope
    ) -> int:
        """Index rows of session ``session_id``'s history in the ``history`` layer of
        exactly ``scope``, each as passages (chunked like documents, so a fact in the middle
        of a long row is found by the passage that holds it); return the passages stored.

        Idempotent by row: a row indexed again (by this or another process, at the same
        time or later) replaces its passages, so each row is stored once. A record whose
        text is blank removes the row. All records are written in one transaction.
        :class:`~protoprompt.integrations.ProtoPromptSession` turns with
        ``TokenBudgetedContextBuilder(..., recall_evicted=True)`` index the rows they
        evict here (see ``docs/recall.md``).
        """
        scope = _check_scope(scope)
        _check_str("session_id", session_id, non_empty=True)
        given: object = records
        if isinstance(given, (str, bytes)) or not isinstance(given, Iterable):
            raise TypeError("records must be an iterable of HistoryRecord")
        prepared: dict[int, tuple[str, str, str, list[tuple[int, int]]]] = {}
        for i, record in enumerate(records):
            if not isinstance(record, HistoryRecord):
                raise TypeError(
                    f"records[{i}] must be a HistoryRecord, got {type(record).__name__}"
                )
            row, text, metadata, digest = record
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row <= _MAX_INT:
                raise ValueError(f"records[{i}].row must be an int in [0, 2**63), got {row!r}")
            _check_str(f"records[{i}].text", text)
            if not isinstance(metadata, Mapping):
                raise TypeError(f"records[{i}].metadata must be a mapping")
            if digest is None:
                digest = history_digest(text)
            _check_str(f"records[{i}].digest", digest, non_empty=True)
            spans = chunk_spans(text, self._chunk_words, self._chunk_overlap)
            meta = {**metadata, "session_id": session_id, "row": row, "passages": len(spans)}
            try:
                meta_json = json.dumps(meta, ensure_ascii=False, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise TypeError(f"records[{i}].metadata must be JSON-serialisable: {exc}") from None
            prepared.pop(row, None)  # the last record of a row wins, as in separate calls
            prepared[row] = (text, meta_json, digest, spans)
        texts = [text[a:b] for text, _, _, spans in prepared.values() for a, b in spans]
        blobs = iter(self._embed(texts))  # before the transaction: embedders can be slow
        entries = [
            HistoryEntry(
                row,
                digest,
                meta_json,
                [Chunk(n, a, b, text[a:b], next(blobs)) for n, (a, b) in enumerate(spans)],
            )
            for row, (text, meta_json, digest, spans) in prepared.items()
        ]
        if entries:
            self._backend.replace_history(_scope_params(scope), session_id, entries, time.time())
        return sum(len(e.passages) for e in entries)

    def history_rows(
        self,
        session_id: str,
        *,
        scope: MemoryScope,
        start: int | None = None,
        end: int | None = None,
        digest: str | None = None,
    ) -> dict[int, str]:
        """The rows of ``session_id`` indexed in the ``history`` layer of exactly ``scope``
        (with ``start <= row < end`` and that ``digest`` when given), each with its
        record's ``digest``."""
        scope = _check_scope(scope)
        _check_str("session_id", session_id, non_empty=True)
        for name, value in (("start", start), ("end", end)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if digest is not None:
            _check_str("digest", digest, non_empty=True)
        return dict(
            self._backend.history_digests(_scope_params(scope), session_id, start, end, digest)
        )

    def forget_history(
        self,
        session_id: str | None = None,
        *,
        scope: MemoryScope,
        from_row: int | None = None,
    ) -> int:
        """Delete history passages of exactly ``scope``: of ``session_id`` (``None``: of
        every session), of the rows from ``from_row`` on (``None``: all). Returns the
        passages deleted. ``ProtoPromptSession.clear_session`` and ``pop_item`` call it
        for the stores of the builders the session served."""
        scope = _check_scope(scope)
        if session_id is not None:
            _check_str("session_id", session_id, non_empty=True)
        if from_row is not None and (isinstance(from_row, bool) or not isinstance(from_row, int)):
            raise TypeError(f"from_row must be an int or None, got {type(from_row).__name__}")
        return self._backend.forget_history(_scope_params(scope), session_id, from_row)

    def search_history(
        self,
        query: str,
        *,
        scope: MemoryScope,
        session_id: str | None = None,
        limit: int = 8,
        include_parents: bool = False,
    ) -> list[MemoryHit]:
        """Rank the passages of the ``history`` layer of ``scope`` against ``query``: of
        session ``session_id`` only, or of every session of the scope (``None``). The
        ranking is :meth:`search`'s (full text, hybrid with an embedder); hits have
        ``kind == "history"``."""
        scope = _check_scope(scope)
        _check_str("query", query, stored=False)
        _check_limit(limit)
        if session_id is not None:
            _check_str("session_id", session_id, non_empty=True)
        scopes = [_scope_params(s) for s in _visible_scopes(scope, include_parents)]
        pieces = query_pieces(query)
        if not pieces:
            return []
        pool = min(max(limit * 4, _MIN_POOL), _MAX_INT)
        text_rows = self._history_text(pieces, scopes, session_id, pool)
        rows_by_id = {row[0]: row for row, _ in text_rows}
        text_ranked = [(row[0], score) for row, score in text_rows]
        vec_ranked: list[tuple[int, float]] = []
        if self._embedder is not None:
            (query_vec,) = self._vectors([query])
            query_norm = math.sqrt(sum(x * x for x in query_vec))
            if query_norm > 0.0:
                for row, blob in self._backend.history_embedded(scopes, session_id):
                    sim = _cosine(query_vec, query_norm, blob)
                    if sim > 0.0:
                        vec_ranked.append((row[0], sim))
                        rows_by_id.setdefault(row[0], row)
                vec_ranked.sort(key=lambda item: (-item[1], item[0]))
                del vec_ranked[pool:]
        best = fuse(text_ranked, vec_ranked, limit)
        return [self._history_hit(rows_by_id[rid], score) for rid, score in best]

    def _history_text(
        self, pieces: list[str], scopes: list[ScopeParams], session_id: str | None, pool: int
    ) -> list[tuple[Row, float]]:
        """The full-text ranking of the history layer. Query pieces whose words all occur in
        more than half of the passages are left out while the others match something:
        bm25 weighs such words (almost) nothing, and matching them ranks every passage (a
        turn's recall would cost a scan of the whole evicted history)."""
        words = {p: _words(p) for p in pieces}
        common = self._backend.history_common_words(
            sorted({w for ws in words.values() for w in ws})
        )
        rare = [p for p in pieces if not all(w in common for w in words[p])]
        if rare and len(rare) < len(pieces):
            found = self._backend.history_search(rare, scopes, session_id, pool)
            if found:
                return found
        return self._backend.history_search(pieces, scopes, session_id, pool)

    @staticmethod
    def _history_hit(row: Row, score: float) -> MemoryHit:
        (
            _,
            tenant,
            user,
            thread,
            kind,
            session_id,
            row_key,
            passage,
            start,
            end,
            digest,
            text,
            metadata,
            _created_at,
        ) = row[:14]
        meta = json.loads(metadata)
        meta.update(session_id=session_id, row=int(row_key), passage=int(passage), digest=digest)
        return MemoryHit(
            kind="history",
            text=text,
            score=float(score),
            doc_id=None,
            chunk_index=int(passage),
            fact_id=None,
            scope=_row_scope(tenant, user, thread, kind),
            metadata=meta,
            span=(int(start), int(end)),
        )
