"""Ranking helpers shared by the memory store and the context builder.

Both rank memory the same way: words are runs of non-whitespace, rankings are fused by
reciprocal rank fusion with one constant, and embeddings are compared by cosine similarity.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

__all__ = ["RRF_K", "WORD", "cosine", "rrf_weight"]

WORD = re.compile(r"\S+")
"""A word: a run of non-whitespace (chunking, truncation at word boundaries)."""

RRF_K = 60
"""The usual reciprocal-rank-fusion constant."""


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
