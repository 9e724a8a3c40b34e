"""Scoped long-term memory: documents, facts and profiles in SQLite or PostgreSQL,
full-text search with optional hybrid vector search.

The engine is chosen by the database a :class:`MemoryStore` is given: a file path (or
``":memory:"``) is SQLite, a ``postgresql://`` URL is PostgreSQL (:mod:`._backend`). All
tables are prefixed ``pp_mem_``, so a store can share a database with the OpenAI Agents
SDK's session tables. See :mod:`protoprompt.memory.scope` for the scope (isolation) rule and
:mod:`._ranking` for the ranking contract both engines keep.
"""

from __future__ import annotations

import json
import math
import os
import time
import uuid
from array import array
from collections.abc import Collection, Iterable, Mapping, Sequence
from functools import lru_cache
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from ._backend import (
    Backend,
    Chunk,
    HistoryEntry,
    Row,
    ScopeParams,
    is_postgres_url,
)
from ._checks import (
    MAX_INT,
    RECORD_KINDS,
    blob_cosines,
    check_kinds,
    check_limit,
    check_positive_int,
    check_scope,
    check_str,
    scope_params,
    visible_scopes,
)
from ._open import open_backend
from ._ranking import (
    content_pieces,
    fuse,
    interleave,
    query_pieces,
    query_terms,
    rank_passages,
    warm_passages,
)
from ._ranking import words as _words
from ._records import (
    Embedder,
    HistoryRecord,
    MemoryHit,
    chunk_spans,
    fts_query,
    history_digest,
    history_hit_of_row,
    hit_of_row,
    row_scope,
)
from ._stem import stem
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

_MIN_POOL = 32  # candidates fetched per signal before fusion
_HISTORY_POOL = 128  # history passages the engine finds, ranked again here
CHARS_PER_TOKEN = 4
"""Characters a token of a passage is taken to hold when :meth:`MemoryStore.search_history`
is given ``tokens`` (English text with o200k/cl100k: about 4; text with fewer characters a
token, such as CJK or code, is underestimated, so more hits are counted, never fewer)."""
TOKENS_MIN_HITS = 4
"""Hits counted at least before ``tokens=`` stops the count (or ``limit`` of them, when
fewer): a long passage that holds the room may not fit the room a turn has left."""


class MemoryStore:
    """Scoped long-term memory in a SQLite database or on a PostgreSQL server.

    The ``path`` picks the engine: a file path (or ``":memory:"``) is SQLite, a
    ``postgresql://`` URL (also ``postgres://`` and SQLAlchemy's ``postgresql+<driver>://``)
    is PostgreSQL (``pip install 'protoprompt[postgres]'``). Both keep the same API, scope
    rule and ranking contract:

    * SQLite: documents are chunked and indexed in an FTS5 table (``unicode61
      remove_diacritics 2`` tokenizer, bm25 ranking); the history layer's passages with
      Porter stems (``porter unicode61 remove_diacritics 2``, see :meth:`search_history`).
      One connection is shared by all threads and guarded by a lock; file databases use WAL
      mode and a 30 s busy timeout, so other connections (another store, the Agents SDK's
      ``SQLiteSession``) can use the same file.
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

    search_history_uncounted: ClassVar[bool] = True
    """A capability the context builder's recall reads: this store's :meth:`search_history`
    takes ``uncounted=`` (the digests of the rows a request sends, returned but not counted
    in ``limit``). A store whose class does not declare it (or declares it ``False``: a
    subclass whose own ``search_history`` does not take the keyword) is searched without
    it."""

    search_history_tokens: ClassVar[bool] = True
    """Another capability the recall reads: this store's :meth:`search_history` takes
    ``tokens=`` (stop counting hits once their texts hold about that many tokens). A store
    whose class does not declare it is asked for ``limit`` hits only."""

    def __init__(
        self,
        path: str | os.PathLike[str] = ":memory:",
        *,
        embedder: Embedder | None = None,
        chunk_words: int = 200,
        chunk_overlap: int = 40,
        read_only: bool = False,
    ) -> None:
        self._chunk_words = check_positive_int("chunk_words", chunk_words)
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
        scope = check_scope(scope)
        check_str("doc_id", doc_id, non_empty=True)
        check_str("text", text)
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
        self._backend.replace_document(scope_params(scope), doc_id, chunks, meta_json, time.time())
        return len(chunks)

    def remember(self, text: str, *, scope: MemoryScope, importance: float = 1.0) -> str:
        """Store a session fact in exactly ``scope``; return its fact id.

        ``importance`` (a finite number, default 1.0) is kept with the fact and
        reported as its score by :meth:`facts`; it does not affect :meth:`search`.
        """
        scope = check_scope(scope)
        check_str("text", text, non_empty=True)
        if isinstance(importance, bool) or not isinstance(importance, (int, float)):
            raise TypeError(f"importance must be a number, got {type(importance).__name__}")
        if not math.isfinite(importance):
            raise ValueError("importance must be finite")
        (blob,) = self._embed([text])
        fact_id = uuid.uuid4().hex
        self._backend.add_fact(
            scope_params(scope), fact_id, float(importance), text, time.time(), blob
        )
        return fact_id

    def set_profile(self, profile: str | Mapping[str, str], *, scope: MemoryScope) -> None:
        """Set (replace) the profile text of exactly ``scope``.

        A mapping is rendered as ``"key: value"`` lines in insertion order.
        """
        scope = check_scope(scope)
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
        check_str("profile", text)
        self._backend.set_profile(scope_params(scope), text, time.time())

    def clear_profile(self, *, scope: MemoryScope) -> bool:
        """Remove the profile of exactly ``scope``: the scope has no profile of its own (an
        ancestor's is what :meth:`get_profile` with ``include_parents`` finds). Returns
        whether there was one."""
        scope = check_scope(scope)
        return self._backend.clear_profile(scope_params(scope)) > 0

    def forget(
        self, *, scope: MemoryScope, doc_id: str | None = None, fact_id: str | None = None
    ) -> int:
        """Delete from exactly ``scope`` (never narrower or wider scopes).

        With ``doc_id`` and/or ``fact_id``: delete that document (all its chunks)
        and/or that fact.  With neither: delete every document chunk, fact, history passage
        and the profile of the scope.  Returns the number of rows deleted (chunks, facts,
        passages and profile rows).
        """
        scope = check_scope(scope)
        if doc_id is not None:
            check_str("doc_id", doc_id, non_empty=True)
        if fact_id is not None:
            check_str("fact_id", fact_id, non_empty=True)
        return self._backend.forget(scope_params(scope), doc_id, fact_id)

    # ------------------------------------------------------------------ reads

    def get_profile(self, *, scope: MemoryScope, include_parents: bool = False) -> str | None:
        """Return the profile of ``scope`` (or ``None``).

        With ``include_parents=True`` the nearest profile among the scope and its
        ancestors is returned. A blank profile counts as none (it does not hide an
        ancestor's).
        """
        scopes = visible_scopes(check_scope(scope), include_parents)
        rows = self._backend.profiles([scope_params(s) for s in scopes])
        found = {row_scope(*row[:4]): row[4] for row in rows if row[4].strip()}
        return next((found[s] for s in scopes if s in found), None)

    def _presence(self, scope: MemoryScope, include_parents: bool) -> tuple[bool, bool, bool]:
        """Whether ``scope`` (and its ancestors with ``include_parents``) has a profile, a
        fact, a document chunk: one read, so a turn does not search layers that are empty
        (read on every turn: another process may have written since)."""
        scopes = visible_scopes(check_scope(scope), include_parents)
        return self._backend.presence([scope_params(s) for s in scopes])

    def facts(
        self, *, scope: MemoryScope, limit: int | None = None, include_parents: bool = False
    ) -> list[MemoryHit]:
        """Return facts of ``scope`` (and ancestors if asked), most recent first."""
        scopes = visible_scopes(check_scope(scope), include_parents)
        if limit is not None:
            check_limit(limit)
        rows = self._backend.facts([scope_params(s) for s in scopes], limit)
        return [hit_of_row(row, row[11]) for row in rows]

    def search(
        self,
        query: str,
        *,
        scope: MemoryScope,
        limit: int = 8,
        kinds: Iterable[str] = RECORD_KINDS,
        include_parents: bool = False,
    ) -> list[MemoryHit]:
        """Rank document chunks and/or facts of ``scope`` against ``query``.

        ``query`` is free user text (see :func:`fts_query`); a query without any
        letter or digit returns ``[]``.  Ranking is full-text relevance (bm25 on SQLite,
        ``ts_rank`` on PostgreSQL); with an embedder it is hybrid (reciprocal-rank fusion
        of the full-text and cosine rankings, or whichever signal alone has hits).  See
        :class:`MemoryHit` for the score meaning.
        """
        scope = check_scope(scope)
        check_str("query", query, stored=False)
        check_limit(limit)
        kind_list = check_kinds(kinds)
        scopes = [scope_params(s) for s in visible_scopes(scope, include_parents)]
        pieces = query_pieces(query)
        if not pieces or not kind_list:
            return []
        query_vec: list[float] | None = None
        if self._embedder is not None:
            (query_vec,) = self._vectors([query])
        pool = min(max(limit * 4, _MIN_POOL), MAX_INT)

        text_rows = self._backend.text_search(pieces, kind_list, scopes, pool)
        rows_by_id = {row[0]: row for row, _ in text_rows}
        text_ranked = [(row[0], score) for row, score in text_rows]
        vec_ranked: list[tuple[int, float]] = []
        if query_vec is not None:
            query_norm = math.sqrt(sum(x * x for x in query_vec))
            if query_norm > 0.0:
                # Ranked by the server (pgvector) where it can, in this process otherwise.
                ranked = self._backend.vector_ranked(query_vec, kind_list, scopes, pool)
                stored = self._backend.embedded(kind_list, scopes)
                sims = blob_cosines(query_vec, query_norm, [blob for _, blob in stored])
                ranked += [(row, sim) for (row, _), sim in zip(stored, sims, strict=True)]
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
            hit_of_row(rows_by_id[rid], score / top if top > 0.0 else 1.0) for rid, score in best
        ]

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
        scope = check_scope(scope)
        check_str("session_id", session_id, non_empty=True)
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
            if isinstance(row, bool) or not isinstance(row, int) or not 0 <= row <= MAX_INT:
                raise ValueError(f"records[{i}].row must be an int in [0, 2**63), got {row!r}")
            check_str(f"records[{i}].text", text)
            if not isinstance(metadata, Mapping):
                raise TypeError(f"records[{i}].metadata must be a mapping")
            if digest is None:
                digest = history_digest(text)
            check_str(f"records[{i}].digest", digest, non_empty=True)
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
            self._backend.replace_history(scope_params(scope), session_id, entries, time.time())
            warm_passages(texts)  # off the request's path when a turn's evictions index
        return sum(len(e.passages) for e in entries)

    def _passages(self, text: str) -> list[str]:
        """The passages :meth:`index_history` stores for a row of ``text``."""
        return [text[a:b] for a, b in chunk_spans(text, self._chunk_words, self._chunk_overlap)]

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
        scope = check_scope(scope)
        check_str("session_id", session_id, non_empty=True)
        for name, value in (("start", start), ("end", end)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
        if digest is not None:
            check_str("digest", digest, non_empty=True)
        return dict(
            self._backend.history_digests(scope_params(scope), session_id, start, end, digest)
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
        scope = check_scope(scope)
        if session_id is not None:
            check_str("session_id", session_id, non_empty=True)
        if from_row is not None and (isinstance(from_row, bool) or not isinstance(from_row, int)):
            raise TypeError(f"from_row must be an int or None, got {type(from_row).__name__}")
        return self._backend.forget_history(scope_params(scope), session_id, from_row)

    def search_history(
        self,
        query: str,
        *,
        scope: MemoryScope,
        session_id: str | None = None,
        limit: int = 8,
        include_parents: bool = False,
        neighbours: bool = False,
        uncounted: Collection[str] = (),
        tokens: int | None = None,
    ) -> list[MemoryHit]:
        """Rank the passages of the ``history`` layer of ``scope`` against ``query``: of
        session ``session_id`` only, or of every session of the scope (``None``); hits have
        ``kind == "history"``, best first, at most ``limit``, never two of the same text.
        Hits whose row digest (``metadata["digest"]``) is in ``uncounted`` are returned but
        not counted in ``limit`` (rows the caller leaves out: those its request sends).
        With ``tokens``, counting also stops once the counted hits' texts hold about that
        many tokens (:data:`CHARS_PER_TOKEN` characters a token, an estimate), once
        :data:`TOKENS_MIN_HITS` are counted (a text longer than all of them is not
        counted there): a caller that fills a room of ``tokens`` asks for what can fit,
        not for ``limit`` hits' worth when the passages are long.

        The ranking is the same on every engine: the query's words without stop words
        ("what", "did", "you", "tell"...) and Porter-stemmed ("research" finds
        "researching"), matched by the engine's full-text index, then ranked here by BM25
        tuned for short turns times the share of the query's weight a passage holds (so
        among passages sharing a question's template words, the one with its rare term
        wins; :func:`._ranking.rank_passages`); with an embedder, the cosine-similarity
        ranking is interleaved with it, full-text first (:func:`._ranking.interleave`).
        With ``neighbours``, each hit is followed by the passages next to it in
        its session (the end of the row before, the start of the row after, when indexed:
        the question an answer follows, the answer a question got), each once, marked with
        ``metadata["neighbour_of"]`` (the hit's :attr:`~MemoryHit.source`)."""
        found = self._history_found(
            query,
            scope=scope,
            session_id=session_id,
            limit=limit,
            include_parents=include_parents,
            neighbours=neighbours,
            uncounted=uncounted,
            tokens=tokens,
        )
        hits: list[MemoryHit] = []
        for row, score, anchor in found:
            hit = history_hit_of_row(row, score)
            if anchor >= 0:
                hit.metadata["neighbour_of"] = hits[anchor].source
            hits.append(hit)
        return hits

    def _history_found(
        self,
        query: str,
        *,
        scope: MemoryScope,
        session_id: str | None = None,
        limit: int = 8,
        include_parents: bool = False,
        neighbours: bool = False,
        uncounted: Collection[str] = (),
        tokens: int | None = None,
    ) -> list[tuple[Row, float, int]]:
        """What :meth:`search_history` returns, as the rows its hits are made of: (row, score,
        anchor), ``anchor`` being -1 for a hit and, for a neighbouring passage, the index of
        the hit it is next to. For a caller that reads a few of the hits' fields (the
        context builder's recall, on every turn) without making the hits."""
        scope = check_scope(scope)
        check_str("query", query, stored=False)
        check_limit(limit)
        if session_id is not None:
            check_str("session_id", session_id, non_empty=True)
        if not isinstance(neighbours, bool):
            raise TypeError(f"neighbours must be a bool, got {type(neighbours).__name__}")
        if isinstance(uncounted, str) or not all(isinstance(d, str) for d in uncounted):
            raise TypeError("uncounted must be a collection of digests (str)")
        uncounted = frozenset(uncounted)
        if tokens is not None:
            check_positive_int("tokens", tokens)
        scopes = [scope_params(s) for s in visible_scopes(scope, include_parents)]
        pieces = content_pieces(query_pieces(query))
        if not pieces:
            return []
        pool = min(max(limit * 4, _HISTORY_POOL), MAX_INT)
        text_rows = self._history_ranked(pieces, scopes, session_id, pool)
        rows_by_id = {row[0]: row for row, _ in text_rows}
        text_ranked = [(row[0], score) for row, score in text_rows]
        vec_ranked: list[tuple[int, float]] = []
        if self._embedder is not None:
            (query_vec,) = self._vectors([query])
            query_norm = math.sqrt(sum(x * x for x in query_vec))
            if query_norm > 0.0:
                stored = self._backend.history_embedded(scopes, session_id)
                sims = blob_cosines(query_vec, query_norm, [blob for _, blob in stored])
                for (row, _), sim in zip(stored, sims, strict=True):
                    if sim > 0.0:
                        vec_ranked.append((row[0], sim))
                        rows_by_id.setdefault(row[0], row)
                vec_ranked.sort(key=lambda item: (-item[1], item[0]))
                del vec_ranked[pool:]
        hits: list[tuple[Row, float, int]] = []
        seen: set[str] = set()
        ranked = interleave(text_ranked, vec_ranked) if vec_ranked else text_ranked
        counted = 0
        # Characters of the counted hits' texts: enough once they hold ``tokens``. A text
        # longer than all of it is not counted there (it may not fit: those after it then
        # fill the room).
        whole = MAX_INT if tokens is None else tokens * CHARS_PER_TOKEN
        room = whole
        for rid, score in ranked:
            row = rows_by_id[rid]
            key = _text_key(row[11])  # the passage's text
            if key not in seen:
                seen.add(key)
                hits.append((row, float(score), -1))
                if row[10] not in uncounted:  # the row's digest
                    counted += 1
                    if len(row[11]) <= whole:
                        room -= len(row[11])
                    if counted >= limit or (room <= 0 and counted >= TOKENS_MIN_HITS):
                        break
        return self._with_neighbours(hits, seen) if neighbours else hits

    def _with_neighbours(
        self, hits: list[tuple[Row, float, int]], seen: set[str]
    ) -> list[tuple[Row, float, int]]:
        """``hits`` (rows: see :meth:`_history_found`), each followed by the passages next
        to it in its session (once each): the last passage of the row before, the first
        of the row after, with half its score."""
        groups: dict[tuple[ScopeParams, str], list[int]] = {}
        places = []  # each hit's scope's parameters, session and row
        for row, _, _ in hits:
            params: ScopeParams = (row[1], row[2], row[3], row[4])  # as scope_params wrote
            sid, key = row[5], int(row[6])
            places.append((params, sid, key))
            groups.setdefault((params, sid), []).append(key)
        near: dict[tuple[ScopeParams, str, int, int], Row] = {}
        for (params, sid), keys in groups.items():
            for anchor, side, found in self._backend.history_adjacent(params, sid, keys):
                at = (params, sid, anchor, side)
                best = near.get(at)
                passage = int(found[7])
                if best is None or (
                    passage > int(best[7]) if side == 0 else passage < int(best[7])
                ):
                    near[at] = found
        taken = {(row[5], int(row[6]), int(row[7])) for row, _, _ in hits}
        out: list[tuple[Row, float, int]] = []
        for (params, sid, key), hit in zip(places, hits, strict=True):
            anchor = len(out)
            out.append(hit)
            for side in (0, 1):
                adjacent = near.get((params, sid, key, side))
                if adjacent is None:
                    continue
                # Its place and text first: a hit is made only of a passage taken.
                where = (sid, int(adjacent[6]), int(adjacent[7]))
                if where in taken:
                    continue
                text_key = _text_key(adjacent[11])
                if text_key in seen:
                    continue
                taken.add(where)
                seen.add(text_key)
                out.append((adjacent, hit[1] / 2, anchor))
        return out

    def _history_ranked(
        self, pieces: list[str], scopes: list[ScopeParams], session_id: str | None, pool: int
    ) -> list[tuple[Row, float]]:
        """The full-text ranking of the history layer: the engine's matches, ranked again
        by :func:`._ranking.rank_passages` (the same on every engine), best first, ties by
        id."""
        # One read for the words in most passages (left out of the match) and the counts
        # the ranking needs (before the match: it does not depend on it).
        words = {p: [stem(w) for w in _words(p)] for p in pieces}
        terms = query_terms(pieces)
        common, total, counts = self._backend.history_statistics(
            sorted({w for ws in words.values() for w in ws}),
            list(terms.items()),
            scopes,
            session_id,
        )
        found = self._history_text(pieces, words, common, scopes, session_id, pool, counts)
        if not found:
            return []
        scores = rank_passages(list(terms), [row[11] for row, _ in found], total, counts)
        ranked = [(row, score) for (row, _), score in zip(found, scores, strict=True)]
        ranked.sort(key=lambda item: (-item[1], item[0][0]))
        return [(row, score) for row, score in ranked if score > 0.0] or ranked

    def _history_text(
        self,
        pieces: list[str],
        words: dict[str, list[str]],
        common: set[str],
        scopes: list[ScopeParams],
        session_id: str | None,
        pool: int,
        counts: Mapping[str, int],
    ) -> list[tuple[Row, float]]:
        """The engine's matches in the history layer. Query pieces whose terms (``words``:
        each piece's stemmed words) are all ``common`` (occur in more than half of the
        passages) are left out while the others match something: they weigh (almost)
        nothing, and matching them ranks every passage (a turn's recall would cost a scan
        of the whole evicted history).

        When the passages holding each term (``counts``) prove that at most ``pool``
        passages match, they are read in no order and without the engine's relevance,
        where the engine can (:func:`_match_bound`): the caller ranks every one of them
        anyway, and ties go by id, so its ranking is the same."""
        matches = getattr(self._backend, "history_matches", None)

        def search(chosen: list[str]) -> list[tuple[Row, float]]:
            bound = _match_bound(chosen, words, counts)
            if matches is not None and bound is not None and bound <= pool:
                found: list[tuple[Row, float]] | None = matches(chosen, scopes, session_id, pool)
                if found is not None:
                    return found
            return self._backend.history_search(chosen, scopes, session_id, pool)

        rare = [p for p in pieces if not all(w in common for w in words[p])]
        if rare and len(rare) < len(pieces):
            found = search(rare)
            if found:
                return found
        return search(pieces)


def _match_bound(
    pieces: Sequence[str], words: Mapping[str, Sequence[str]], counts: Mapping[str, int]
) -> int | None:
    """At most how many passages a search for ``pieces`` matches, from the passages
    holding each term (``counts``): a piece matches only passages holding each of its
    terms (``words``: its stemmed words), so at most the count of its rarest counted one;
    ``None`` when a piece has no counted term."""
    total = 0
    for piece in pieces:
        known = [counts[w] for w in words[piece] if w in counts]
        if not known:
            return None
        total += min(known)
    return total


@lru_cache(maxsize=8192)
def _text_key(text: str) -> str:
    """What makes two passages the same text: their words, case-folded (kept by the text:
    the passages recent turns found come back turn after turn)."""
    return " ".join(text.split()).casefold()


def layers_present(
    store: Any, scope: MemoryScope, include_parents: bool
) -> tuple[bool, bool, bool]:
    """Whether ``store`` has a profile, facts, document chunks visible from ``scope``: one
    read on a :class:`MemoryStore`; for any other store, ``(True, True, True)`` (its layers
    are read as before)."""
    if isinstance(store, MemoryStore):
        return store._presence(scope, include_parents)
    return True, True, True
