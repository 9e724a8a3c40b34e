"""The values of the memory store: hits, history records, digests, chunking and the
full-text query, and the hits made from the rows the engines return."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, NamedTuple

from ._backend import Row
from ._ranking import WORD, query_pieces
from ._sqlite import fts5_match
from .scope import MemoryScope

Embedder = Callable[[list[str]], list[list[float]]]
"""Maps a batch of texts to one embedding vector per text."""

LAYER_OF_KIND = {"fact": "facts", "document": "rag", "history": "history"}


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
        """The context layer the hit is recalled into: ``"facts"`` (a fact), ``"rag"``
        (a document chunk) or ``"history"`` (a passage of an evicted turn)."""
        return LAYER_OF_KIND.get(self.kind, self.kind)

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
    """The row's key in its session: its row id in the session's database, or, when the
    session has no row ids, a key of its position and content (``position_key``: position
    x 2**32 + 32 bits of its digest; a non-negative int)."""
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
    strength = _strengths(text, words)
    spans: list[tuple[int, int]] = []
    first = 0
    while True:
        stop = _cut(strength, first, chunk_words)
        spans.append((words[first][0], words[stop - 1][1]))
        if stop >= n:
            return spans
        nxt = max(stop - overlap, first + 1)
        for candidate in range(nxt, stop):
            if strength[candidate - 1]:
                nxt = candidate
                break
        first = nxt


def _strengths(text: str, words: list[tuple[int, int]]) -> list[int]:
    """Boundary strength after word i: 2 = paragraph break (or the end), 1 = sentence
    end, 0 = none."""
    n = len(words)
    strength: list[int] = []
    for i, (start, end) in enumerate(words):
        if i == n - 1 or _PARAGRAPH_GAP.search(text, end, words[i + 1][0]):
            strength.append(2)
        elif _SENTENCE_END.search(text, start, end):
            strength.append(1)
        else:
            strength.append(0)
    return strength


def _cut(strength: list[int], first: int, chunk_words: int) -> int:
    """Where the window from word ``first`` ends: the strongest boundary in its second
    half (the latest of equals), else after ``chunk_words`` words (or at the end)."""
    n = len(strength)
    stop = first + chunk_words
    if stop >= n:
        return n
    best, stop_at = 0, stop
    for cut in range(stop, first + max(1, chunk_words // 2) - 1, -1):
        if strength[cut - 1] > best:
            best, stop_at = strength[cut - 1], cut
            if best == 2:
                break
    return stop_at if best else stop


def fts_query(text: str) -> str | None:
    """Turn free user text into a safe SQLite FTS5 query, or ``None`` if it has no terms.

    The text is split on whitespace; pieces without any letter or digit are dropped;
    each remaining piece is double-quoted (embedded quotes doubled) so FTS5 syntax such as
    ``NEAR``, ``*``, ``-``, ``:`` or parentheses is treated literally, and the pieces are
    OR-combined.  A piece like ``foo-bar`` becomes the phrase "foo bar".  (PostgreSQL
    matches the same pieces the same way, through a ``tsquery``.)
    """
    return fts5_match(query_pieces(text))


@lru_cache(maxsize=1024)
def row_scope(tenant: str, user: str, thread: str, kind: str) -> MemoryScope:
    """The scope of a row's scope columns (kept: scopes are immutable, and a search's rows
    share a few)."""
    return MemoryScope(tenant, user or None, thread or None, kind or None)


_SCALARS = (str, int, float, bool, type(None))


@lru_cache(maxsize=4096)
def flat_meta(metadata: str) -> dict[str, Any] | None:
    """A history row's stored metadata, parsed, when it is an object of plain values (kept
    by its JSON text: the passages recent turns recalled come back turn after turn; a
    shallow copy of it is then a new object), else ``None``."""
    meta = json.loads(metadata)
    if isinstance(meta, dict) and all(isinstance(v, _SCALARS) for v in meta.values()):
        return meta
    return None


def _history_meta(metadata: str) -> Any:
    """A new object of a history row's stored metadata."""
    flat = flat_meta(metadata)
    return dict(flat) if flat is not None else json.loads(metadata)


def hit_of_row(row: Row, score: float) -> MemoryHit:
    """A hit of the document and fact layers from its row."""
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
        scope=row_scope(tenant, user, thread, kind),
        metadata=meta,
        span=span,
    )


def history_hit_of_row(row: Row, score: float) -> MemoryHit:
    """A hit of the history layer from its row."""
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
    meta = _history_meta(metadata)
    meta.update(session_id=session_id, row=int(row_key), passage=int(passage), digest=digest)
    return MemoryHit(
        kind="history",
        text=text,
        score=float(score),
        doc_id=None,
        chunk_index=int(passage),
        fact_id=None,
        scope=row_scope(tenant, user, thread, kind),
        metadata=meta,
        span=(int(start), int(end)),
    )
