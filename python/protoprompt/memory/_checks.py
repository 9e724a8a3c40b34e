"""The checks of the memory store's arguments, and the scope parameters its engines read."""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

from ._backend import ScopeParams
from ._ranking import cosine
from .scope import MemoryScope

RECORD_KINDS = ("document", "fact")
"""The kinds :meth:`MemoryStore.search` reads by default."""


def check_scope(scope: object) -> MemoryScope:
    if not isinstance(scope, MemoryScope):
        raise TypeError(f"scope must be a MemoryScope, got {type(scope).__name__}")
    return scope


def check_str(name: str, value: object, *, non_empty: bool = False, stored: bool = True) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if non_empty and not value.strip():
        raise ValueError(f"{name} must be a non-empty string")
    if stored and "\x00" in value:  # PostgreSQL text cannot hold NUL; kept out everywhere
        raise ValueError(f"{name} must not contain NUL characters")
    return value


def check_positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    return value


MAX_INT = 2**63 - 1


def check_limit(value: object) -> int:
    """A row limit: a positive int that SQL can hold (``sys.maxsize`` means no limit)."""
    limit = check_positive_int("limit", value)
    if limit > MAX_INT:
        raise ValueError(f"limit must be at most 2**63 - 1, got {limit}")
    return limit


def check_kinds(kinds: object) -> tuple[str, ...]:
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise TypeError(
            "kinds must be an iterable of 'document' / 'fact' strings, not a single str"
        )
    result = tuple(dict.fromkeys(kinds))
    bad = [k for k in result if k not in RECORD_KINDS]
    if bad:
        raise ValueError(f"kinds may only contain 'document' and 'fact', got {bad!r}")
    return result


def scope_params(scope: MemoryScope) -> ScopeParams:
    # None is stored as '' (MemoryScope forbids empty strings), which keeps
    # equality and UNIQUE constraints simple.
    tenant, user, thread, kind = scope.key()
    return (tenant, user or "", thread or "", kind or "")


def visible_scopes(scope: MemoryScope, include_parents: bool) -> list[MemoryScope]:
    if not isinstance(include_parents, bool):
        raise TypeError(f"include_parents must be a bool, got {type(include_parents).__name__}")
    return [scope, *reversed(scope.ancestors())] if include_parents else [scope]


def blob_cosine(query: Sequence[float], query_norm: float, blob: bytes) -> float:
    vec = array("f")
    vec.frombytes(blob)
    # A vector of another length was stored by a different embedder: similarity 0.
    return cosine(query, vec, query_norm)


def blob_cosines(query: Sequence[float], query_norm: float, blobs: Sequence[bytes]) -> list[float]:
    """:func:`blob_cosine` of each blob; in one matrix product when numpy is installed (the
    ``embed`` extra brings it): the client-side ranking of a long session's passages then
    costs well under a millisecond per thousand, not tens."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - the plain loop, the same numbers
        return [blob_cosine(query, query_norm, blob) for blob in blobs]
    width = 4 * len(query)
    sims = [0.0] * len(blobs)  # a vector of another length: similarity 0
    same = [i for i, blob in enumerate(blobs) if len(blob) == width]
    if not same or query_norm == 0.0:
        return sims
    matrix = np.frombuffer(b"".join(blobs[i] for i in same), dtype=np.float32)
    matrix = matrix.reshape(len(same), len(query)).astype(np.float64)
    norms = np.linalg.norm(matrix, axis=1)
    dots = matrix @ np.asarray(query, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        found = np.where(norms > 0.0, dots / (norms * query_norm), 0.0)
    for i, sim in zip(same, found.tolist(), strict=True):
        sims[i] = float(sim)
    return sims


# --------------------------------------------------------------------------- store
