"""The ranking contract shared by the memory store (every engine) and the context builder.

* Words are runs of non-whitespace (chunking, truncation at word boundaries).
* A free-text query is a list of *pieces* (:func:`query_pieces`): its whitespace-separated
  parts that hold a letter or digit, each matched as a phrase of its words, OR-combined;
  query syntax of any engine is matched literally.
* Each engine ranks the matching records by its text relevance (higher is better); with an
  embedder, records are also ranked by cosine similarity to the query's vector, and the two
  rankings are fused by reciprocal rank fusion with one constant (:func:`fuse`); ties go to
  the older record (the smaller id).
* The history layer's hybrid ranking interleaves the two rankings instead, full-text
  first (:func:`interleave`): passages of one template look alike to an embedder.
* The history layer (passages of evicted turns) leaves out the query pieces whose words all
  occur in more than half of its passages, as far as the engine knows without a scan
  (SQLite's full-text vocabulary, PostgreSQL's column statistics), while the other pieces
  match something: bm25 weighs such words (almost) nothing, and matching them would rank
  every passage of a long session on every turn.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Sequence
from functools import lru_cache

__all__ = [
    "MAX_QUERY_TERMS",
    "RRF_K",
    "WORD",
    "cosine",
    "fuse",
    "interleave",
    "query_pieces",
    "rrf_weight",
    "words",
]

WORD = re.compile(r"\S+")
"""A word: a run of non-whitespace (chunking, truncation at word boundaries)."""

RRF_K = 60
"""The usual reciprocal-rank-fusion constant."""

MAX_QUERY_TERMS = 64
"""At most this many pieces of a query are matched (the first ones)."""


_LETTERS_DIGITS = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
    """The words of ``text`` as the engines match them: runs of letters and digits after
    NFKD decomposition, combining marks dropped, lower-cased (SQLite's ``unicode61
    remove_diacritics 2`` tokenizer; the PostgreSQL engine indexes exactly these)."""
    if text.isascii():  # nothing to decompose or drop: the common case, at C speed
        return _LETTERS_DIGITS.findall(text.lower())
    decomposed = unicodedata.normalize("NFKD", text)
    folded = "".join(ch for ch in decomposed if not unicodedata.combining(ch)).lower()
    return _LETTERS_DIGITS.findall(folded)


def rrf_weight(rank: int) -> float:
    """The reciprocal-rank-fusion weight of a 1-based ``rank``: ``1 / (RRF_K + rank)``."""
    return 1.0 / (RRF_K + rank)


def cosine(a: Sequence[float], b: Sequence[float], a_norm: float | None = None) -> float:
    """Cosine similarity of ``a`` and ``b``; 0.0 for vectors of different lengths or a zero
    vector. ``a_norm`` is ``a``'s Euclidean norm when the caller has it already."""
    if len(a) != len(b):
        return 0.0
    na = math.sqrt(sum(x * x for x in a)) if a_norm is None else a_norm
    nb = math.sqrt(sum(x * x for x in b))
    if na == 0.0 or nb == 0.0:
        return 0.0
    return sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


def query_pieces(text: str) -> list[str]:
    """The pieces of free user text that a search matches, in order, without duplicates.

    The text is split on whitespace; pieces without any letter or digit are dropped; at most
    :data:`MAX_QUERY_TERMS` are kept. NUL characters count as whitespace and lone surrogates
    are dropped (no engine can take them).
    """
    text = text.replace("\x00", " ").encode("utf-8", "ignore").decode("utf-8")
    pieces: dict[str, None] = {}
    for piece in text.split():
        if any(ch.isalnum() for ch in piece):
            pieces.setdefault(piece, None)
            if len(pieces) >= MAX_QUERY_TERMS:
                break
    return list(pieces)


def fuse(
    text_ranked: Sequence[tuple[int, float]],
    vector_ranked: Sequence[tuple[int, float]],
    limit: int,
) -> list[tuple[int, float]]:
    """The final ranking of a search from its two rankings of ``(record id, score)``, each
    best first: reciprocal rank fusion when both have hits, else whichever has them with its
    own scores; best first, ties by id, at most ``limit``."""
    scores: dict[int, float]
    if text_ranked and vector_ranked:
        scores = {}
        for ranked in (text_ranked, vector_ranked):
            for position, (rid, _) in enumerate(ranked, start=1):
                scores[rid] = scores.get(rid, 0.0) + rrf_weight(position)
    else:
        scores = dict(text_ranked or vector_ranked)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:limit]


def interleave(
    text_ranked: Sequence[tuple[int, float]], vector_ranked: Sequence[tuple[int, float]]
) -> list[tuple[int, float]]:
    """The history layer's hybrid ranking: the two rankings taken in turn, the full-text one
    first, each id at its best place (score ``1 / position``). Unlike reciprocal rank
    fusion, a passage that both rankings place fairly high does not overtake the full-text
    ranking's first: among passages of one template (twenty access codes of twenty
    projects) a static embedder sees them all alike, and only the rare term tells them
    apart; while a paraphrase that no full-text match finds still comes second."""
    out: list[tuple[int, float]] = []
    seen: set[int] = set()
    for i in range(max(len(text_ranked), len(vector_ranked))):
        for ranked in (text_ranked, vector_ranked):
            if i < len(ranked) and ranked[i][0] not in seen:
                seen.add(ranked[i][0])
                out.append((ranked[i][0], 1.0 / (len(out) + 1)))
    return out


# --------------------------------------------------------------------------- the history layer

BM25_K1 = 1.2
"""Term-frequency saturation of the history layer's ranking (BM25's ``k1``)."""
BM25_B = 0.3
"""Length normalisation of the history layer's ranking (BM25's ``b``): low, because turns
are short and a fact inside a long tool output must not lose to a short turn on length."""


def content_pieces(pieces: Sequence[str]) -> list[str]:
    """The pieces of a query that hold a word other than a stop word (all of them when
    none does): "What did Caroline research?" searches for ``Caroline research?``."""
    from ._stem import STOP_WORDS

    kept = [p for p in pieces if any(w not in STOP_WORDS for w in words(p))]
    return kept or list(pieces)


def query_terms(pieces: Sequence[str]) -> dict[str, str]:
    """The terms (Porter stems) of a query's pieces, each with the first word that gave it,
    leaving out stop words while there are others."""
    from ._stem import STOP_WORDS, stem

    found = [w for p in pieces for w in words(p)]
    content = [w for w in found if w not in STOP_WORDS] or found
    terms: dict[str, str] = {}
    for w in content:
        terms.setdefault(stem(w), w)
    return terms


@lru_cache(maxsize=8192)
def _bag(text: str) -> tuple[int, dict[str, int]]:
    """A passage's length in words and the count of each of its terms (kept for the
    passages recent turns ranked: the same passages come back turn after turn)."""
    from ._stem import stem

    counts: dict[str, int] = {}
    found = words(text)
    for w in found:
        t = stem(w)
        counts[t] = counts.get(t, 0) + 1
    return len(found), counts


WARM_PASSAGES = 512
"""Passages of one indexing call whose term counts are worked out as they are stored (at
most; the first ones)."""


def warm_passages(texts: Sequence[str]) -> None:
    """Work out the term counts of newly stored passages now (kept by their text, as
    :func:`rank_passages` finds them), so the turn whose search first matches them does
    not: indexing runs in the background, the search on the request's path."""
    for text in texts[:WARM_PASSAGES]:
        _bag(text)


def rank_passages(
    terms: Sequence[str], texts: Sequence[str], total: int, counts: dict[str, int]
) -> list[float]:
    """The history layer's relevance of each of ``texts`` to a query of ``terms``: BM25
    (:data:`BM25_K1`, :data:`BM25_B`; ``total`` passages searched, ``counts`` of them
    holding each term; lengths relative to ``texts``' mean) times the share of the query's
    weight the passage holds, so that among passages sharing a question's template words
    ("the access code for project ...") the one that also holds its rare term wins."""
    if not texts:
        return []
    n = max(total, len(texts))
    idf = {}
    for t in terms:
        df = min(counts.get(t, 0), n)
        if df > 0:
            idf[t] = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
    weight = sum(idf.values())
    bags = [_bag(text) for text in texts]
    mean = sum(length for length, _ in bags) / len(bags) or 1.0
    scores = []
    for length, counts_of in bags:
        tf = {t: counts_of[t] for t in idf if t in counts_of}
        norm = BM25_K1 * (1.0 - BM25_B + BM25_B * length / mean)
        bm25 = sum(idf[t] * f * (BM25_K1 + 1.0) / (f + norm) for t, f in tf.items())
        held = sum(idf[t] for t in tf)
        scores.append(bm25 * (held / weight) if weight > 0 else 0.0)
    return scores
