"""The PostgreSQL engine's statements and literals: the words of a record as a
``tsvector``, a query as a ``tsquery``, the search and pgvector ranking statements."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from .._storage.dialect import POSTGRESQL
from . import _sql
from ._backend import ScopeParams
from ._ranking import words
from ._sql import COLUMNS, scope_eq
from ._stem import stem

_MAX_LEXEME_BYTES = 2046  # PostgreSQL's limit for one word (2 KiB less the terminator)
_MAX_POSITION = 16383  # positions beyond are stored as this one
_MAX_POSITIONS = 256  # positions kept per word
MAX_VECTOR_DIMS = 16000  # pgvector's limit for the vector type
_MAX_LEXEME_TOTAL = 1_000_000  # bytes of one record's tsvector data (PostgreSQL: < 1 MiB)

SCOPE_EQ = scope_eq(POSTGRESQL.mark)


# --------------------------------------------------------------------------- words


def _quote(word: str) -> str:
    return "'" + word.replace("\\", "\\\\").replace("'", "''") + "'"


def _indexable(word: str) -> bool:
    return len(word.encode("utf-8")) <= _MAX_LEXEME_BYTES


def terms(text: str, stemmed: bool = False) -> list[str]:
    """The words of ``text`` as a ``tsvector`` holds them: :func:`words`, or (``stemmed``,
    the history layer) their Porter stems, the terms SQLite's ``porter`` tokenizer makes."""
    found = words(text)
    return [stem(w) for w in found] if stemmed else found


def tsvector_literal(text: str, stemmed: bool = False) -> str:
    """The ``tsvector`` of ``text``: each of its :func:`terms` with its 1-based positions
    (positions past 16383 count as 16383; at most 256 per word; words longer than
    PostgreSQL's 2046-byte limit are not indexed, nor further words or positions once the
    ``tsvector`` would take 1,000,000 bytes -- PostgreSQL's limit is 1 MiB)."""
    positions: dict[str, list[int]] = {}
    total = 0  # PostgreSQL's count: each word (aligned to 2 bytes), 2 + 2 per position
    for number, word in enumerate(terms(text, stemmed), start=1):
        kept = positions.get(word)
        if kept is None:
            size = len(word.encode("utf-8"))
            cost = size + (size & 1) + 4
            if size > _MAX_LEXEME_BYTES or total + cost > _MAX_LEXEME_TOTAL:
                continue
            total += cost
            positions[word] = [min(number, _MAX_POSITION)]
        elif len(kept) < _MAX_POSITIONS and total + 2 <= _MAX_LEXEME_TOTAL:
            total += 2
            kept.append(min(number, _MAX_POSITION))
    return " ".join(
        _quote(word) + ":" + ",".join(map(str, sorted(set(kept))))
        for word, kept in positions.items()
    )


def tsquery_literal(pieces: Sequence[str], stemmed: bool = False) -> str | None:
    """The ``tsquery`` of a search's pieces: each piece the phrase of its :func:`terms`,
    OR-combined; ``None`` when no piece has a word that can be indexed."""
    phrases = []
    for piece in pieces:
        found = terms(piece, stemmed)
        if found and all(_indexable(word) for word in found):
            phrases.append("(" + " <-> ".join(_quote(word) for word in found) + ")")
    return " | ".join(dict.fromkeys(phrases)) or None


def lock_key(scope: ScopeParams, doc_id: str) -> int:
    digest = hashlib.blake2b("\x00".join((*scope, doc_id)).encode("utf-8"), digest_size=4)
    return int.from_bytes(digest.digest(), "big", signed=True)


def search_statement(
    query: str, kinds: Sequence[str], scopes: Sequence[ScopeParams], pool: int
) -> tuple[str, list[Any]]:
    """The full-text search statement and its parameters: records of ``kinds`` in ``scopes``
    matching the ``tsquery`` ``query``, best ``ts_rank`` first, ties by id, at most
    ``pool``."""
    where, params = scope_filter(scopes)
    sql = (
        f"SELECT {COLUMNS}, ts_rank(r.tsv, q.q, 1) AS rank"
        " FROM pp_mem_records AS r, (SELECT %s::tsquery AS q) AS q"
        f" WHERE r.tsv @@ q.q AND r.rtype = ANY(%s) AND {where}"
        " ORDER BY rank DESC, r.id LIMIT %s"
    )
    return sql, [query, list(kinds), *params, pool]


def vector_statement(
    schema: str,
    query: Sequence[float],
    kinds: Sequence[str],
    scopes: Sequence[ScopeParams],
    pool: int,
) -> tuple[str, list[Any]]:
    """The pgvector ranking statement (``schema``: the extension's, quoted): records of
    ``kinds`` in ``scopes`` with a vector of ``query``'s length, by cosine similarity (1 -
    cosine distance; NaN for a zero vector), best first, ties by id, at most ``pool``."""
    where, params = scope_filter(scopes)
    distance = f"r.vec OPERATOR({schema}.<=>) q.v"
    sql = (
        f"SELECT {COLUMNS}, 1 - ({distance}) AS sim"
        f" FROM pp_mem_records AS r, (SELECT %s::{schema}.vector AS v) AS q"
        f" WHERE r.vec IS NOT NULL AND {schema}.vector_dims(r.vec) = %s"
        f" AND r.rtype = ANY(%s) AND {where}"
        f" ORDER BY {distance}, r.id LIMIT %s"
    )
    literal = "[" + ",".join(repr(float(x)) for x in query) + "]"
    return sql, [literal, len(query), list(kinds), *params, pool]


def scope_filter(scopes: Sequence[ScopeParams], alias: str = "r") -> tuple[str, list[Any]]:
    """A row is of one of ``scopes`` (psycopg's placeholders), with its parameters."""
    return _sql.scope_filter(scopes, alias, POSTGRESQL.mark)
