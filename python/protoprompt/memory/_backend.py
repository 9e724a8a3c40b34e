"""The storage engines behind :class:`~protoprompt.memory.MemoryStore`.

A backend stores records (document chunks and facts) and profiles, and answers the two
ranking questions of a search: which records match the query's words, best first by the
engine's text relevance, and which records carry an embedding. Everything else -- input
checks, chunking, embedding, the fusion of rankings (:mod:`._ranking`), turning rows into
:class:`~protoprompt.memory.MemoryHit` -- is the store's, the same for every engine.

Engines: SQLite (:mod:`._sqlite`; a file path or ``":memory:"``) and PostgreSQL
(:mod:`._postgres`; a ``postgresql://`` URL). :func:`._open.open_backend` picks one by its target.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

__all__ = [
    "HISTORY_COLUMNS",
    "RECORD_COLUMNS",
    "Backend",
    "Chunk",
    "HistoryEntry",
    "Row",
    "ScopeParams",
    "is_postgres_url",
]

ScopeParams = tuple[str, str, str, str]
"""A scope as stored: ``(tenant, user, thread, kind)`` with ``""`` for an unset level."""

Row = tuple[Any, ...]
"""One record as :data:`RECORD_COLUMNS` lists its columns."""

RECORD_COLUMNS = (
    "id",
    "rtype",
    "s_tenant",
    "s_user",
    "s_thread",
    "s_kind",
    "doc_id",
    "chunk_index",
    "char_start",
    "char_end",
    "fact_id",
    "importance",
    "text",
    "metadata",
    "created_at",
)
"""The columns of a record row, in the order every backend returns them."""

HISTORY_COLUMNS = (
    "id",
    "s_tenant",
    "s_user",
    "s_thread",
    "s_kind",
    "session_id",
    "row_key",
    "passage",
    "char_start",
    "char_end",
    "digest",
    "text",
    "metadata",
    "created_at",
)
"""The columns of a history passage row (the ``history`` layer: passages of the turns a
session evicted), in the order every backend returns them."""


class Chunk(NamedTuple):
    """One chunk of a document to store."""

    chunk_index: int
    start: int
    end: int
    text: str
    embedding: bytes | None


class HistoryEntry(NamedTuple):
    """One stored history row (an item of a session) to index, as its passages."""

    row_key: int
    """The row's key in its session: its row id, or its position (see
    ``MemoryStore.index_history``)."""
    digest: str
    """Digest of the row's rendered text (what was indexed)."""
    metadata: str
    """JSON of the row's metadata, returned with each of its passages."""
    passages: Sequence[Chunk]
    """The passages, in order (none: the row is forgotten)."""


class Backend(Protocol):
    """What a storage engine does for the store. Every method is one transaction (or one
    consistent read); a failed call changes nothing. A backend opened ``read_only`` never
    changes the database: its writes raise ``PermissionError`` and, on a database without
    the memory tables, its reads find nothing."""

    def describe(self) -> str:
        """The database, for ``repr`` (no secrets)."""

    def replace_document(
        self,
        scope: ScopeParams,
        doc_id: str,
        chunks: Sequence[Chunk],
        metadata: str,
        created_at: float,
    ) -> None:
        """Replace document ``doc_id`` of exactly ``scope`` by ``chunks`` (none: delete it)."""

    def add_fact(
        self,
        scope: ScopeParams,
        fact_id: str,
        importance: float,
        text: str,
        created_at: float,
        embedding: bytes | None,
    ) -> None:
        """Store one fact."""

    def set_profile(self, scope: ScopeParams, profile: str, updated_at: float) -> None:
        """Set (replace) the profile of exactly ``scope``."""

    def clear_profile(self, scope: ScopeParams) -> int:
        """Delete the profile of exactly ``scope``; the rows deleted (0 or 1)."""

    def forget(self, scope: ScopeParams, doc_id: str | None, fact_id: str | None) -> int:
        """Delete from exactly ``scope`` (see ``MemoryStore.forget``); the rows deleted."""

    def presence(self, scopes: Sequence[ScopeParams]) -> tuple[bool, bool, bool]:
        """Whether any of ``scopes`` has a profile, a fact, a document chunk (one read)."""

    def profiles(self, scopes: Sequence[ScopeParams]) -> list[tuple[str, str, str, str, str]]:
        """The profiles of ``scopes``: ``(tenant, user, thread, kind, profile)`` rows."""

    def facts(self, scopes: Sequence[ScopeParams], limit: int | None) -> list[Row]:
        """Facts of ``scopes``, most recent first, at most ``limit``."""

    def text_search(
        self,
        pieces: Sequence[str],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        """Records of ``kinds`` in ``scopes`` that contain any of the query ``pieces`` (each
        a phrase of its words), with the engine's relevance (higher is better, > 0), best
        first and by id on ties, at most ``pool``."""

    @property
    def vector_ranking(self) -> str:
        """Where vectors are ranked: ``"client"`` (:meth:`embedded`, cosine similarity in
        this process) or ``"pgvector"`` (:meth:`vector_ranked`, by the server)."""

    def embedded(
        self, kinds: Sequence[str], scopes: Sequence[ScopeParams]
    ) -> list[tuple[Row, bytes]]:
        """Records of ``kinds`` in ``scopes`` with an embedding (float32) that the server does
        not rank (:meth:`vector_ranked`): every such record when vectors are ranked in the
        client."""

    def vector_ranked(
        self,
        query: Sequence[float],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        """Records of ``kinds`` in ``scopes`` that the server ranks by cosine similarity to
        ``query`` (vectors of its length only), best first and by id on ties, at most
        ``pool``; ``[]`` when vectors are ranked in the client."""

    def replace_history(
        self,
        scope: ScopeParams,
        session_id: str,
        entries: Sequence[HistoryEntry],
        created_at: float,
    ) -> None:
        """Replace the passages of each entry's row of ``session_id`` in exactly ``scope`` by
        the entry's (one transaction for all; a row indexed twice at once is stored once)."""

    def history_digests(
        self,
        scope: ScopeParams,
        session_id: str,
        start: int | None,
        end: int | None,
        digest: str | None = None,
    ) -> list[tuple[int, str]]:
        """``(row_key, digest)`` of the rows of ``session_id`` in exactly ``scope`` that have
        passages, with ``start <= row_key < end`` (``None``: unbounded) and that ``digest``
        (``None``: any), by row key."""

    def forget_history(
        self, scope: ScopeParams, session_id: str | None, from_row: int | None
    ) -> int:
        """Delete the passages of ``session_id`` (``None``: of every session) in exactly
        ``scope`` whose row key is at least ``from_row`` (``None``: all); the rows deleted."""

    def history_common_words(self, words: Sequence[str]) -> set[str]:
        """Those of ``words`` (as :func:`._ranking.words` makes them) that occur in more
        than half of the history passages, as far as the engine knows without a scan
        (SQLite: its full-text vocabulary; PostgreSQL: the column's statistics; an empty
        set when it does not know)."""

    def history_search(
        self,
        pieces: Sequence[str],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
        pool: int,
    ) -> list[tuple[Row, float]]:
        """History passages in ``scopes`` (of ``session_id`` only, unless ``None``) that
        contain any of the query ``pieces``, as :data:`HISTORY_COLUMNS` rows with the
        engine's relevance (the ranking of :meth:`text_search`), best first, by id on ties,
        at most ``pool``."""

    def history_counts(
        self,
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[int, dict[str, int]]:
        """The history passages in ``scopes`` (of ``session_id`` only, unless ``None``), and
        for each ``(term, word)`` of ``terms`` (a Porter stem and a word that has it) how
        many of them hold the term."""

    def history_statistics(
        self,
        words: Sequence[str],
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[set[str], int, dict[str, int]]:
        """Those of ``words`` common enough to leave out of a match, and
        :meth:`history_counts` of ``terms``, in one read where the engine can. PostgreSQL
        takes the common words from :meth:`history_common_words` (the column's
        statistics); SQLite from the counts themselves: the terms held by more than half
        of the passages searched, and the words that are not terms (stop words)."""

    def history_adjacent(
        self, scope: ScopeParams, session_id: str, row_keys: Sequence[int]
    ) -> list[tuple[int, int, Row]]:
        """The passages of the rows next to each of ``row_keys`` of ``session_id`` in
        exactly ``scope``, as ``(row key, side, passage row)``: side 0 for passages of the
        nearest indexed row before it, 1 for the nearest one after it (none when there is
        no such row). At least the passage the caller keeps of each -- the last of the row
        before, the first of the row after -- and possibly the row's others (SQLite returns
        only that one, PostgreSQL every passage of the row)."""

    def history_embedded(
        self, scopes: Sequence[ScopeParams], session_id: str | None
    ) -> list[tuple[Row, bytes]]:
        """History passages in ``scopes`` (of ``session_id`` only, unless ``None``) with an
        embedding (float32), ranked in the client."""

    def close(self) -> None:
        """Release the connections; idempotent. Later calls raise ``RuntimeError``."""


_POSTGRES_SCHEMES = ("postgresql", "postgres")


def is_postgres_url(target: object) -> bool:
    """Whether ``target`` is a PostgreSQL URL (``postgresql://``, ``postgres://``, or
    SQLAlchemy's ``postgresql+<driver>://``) rather than a SQLite path."""
    if not isinstance(target, str) or "://" not in target:
        return False
    scheme = target.split("://", 1)[0].lower()
    return scheme.split("+", 1)[0] in _POSTGRES_SCHEMES
