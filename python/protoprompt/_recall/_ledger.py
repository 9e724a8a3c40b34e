"""What the evictions of a session's turns remember between turns (the ledger), and the
values a turn hands over: the digest of an item, the eviction step, the turn's rows."""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _core
from ..errors import ProtoPromptError
from ..memory import MemoryScope
from ..packing import canonical_text

if TYPE_CHECKING:
    from ..summaries import SummaryStore


def item_digest(item: Any) -> str | None:
    """What identifies an item's content: BLAKE2b-128 of its canonical text (hex), or
    ``None`` for an item protoprompt cannot read."""
    try:
        text = canonical_text(item)
    except (ProtoPromptError, TypeError, ValueError):
        return None
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


MAX_KEPT_DIGESTS = 65536
"""Item digests :func:`item_digests` keeps at most (about 10 MB); when full, the older half
is dropped."""

_kept_digests: dict[bytes, str | None] = {}
digest_stats = {"hits": 0, "misses": 0}
"""Item digests :func:`item_digests` found kept and worked out since the process started:
what the tests read to see that the kept ones were used."""


def item_digests(items: Sequence[Any]) -> list[str | None]:
    """:func:`item_digest` of each of ``items``, kept for the process by the item's content
    (the native module's digest of the value as it is: its strings by their length and the
    interpreter's hash), so the items a session sends turn after turn -- new objects of the
    same content -- are not rendered again. A value that has no JSON form is never found
    kept (its digest is unique)."""
    if not items:
        return []
    raw, _ = _core.digests(items)
    out: list[str | None] = []
    for i, item in enumerate(items):
        key = raw[16 * i : 16 * i + 16]
        if key in _kept_digests:
            digest_stats["hits"] += 1
            out.append(_kept_digests[key])
            continue
        digest_stats["misses"] += 1
        found = item_digest(item)
        if len(_kept_digests) >= MAX_KEPT_DIGESTS:
            for old in list(_kept_digests)[: len(_kept_digests) // 2 + 1]:
                _kept_digests.pop(old, None)
        _kept_digests[key] = found
        out.append(found)
    return out


POSITION_SHIFT = 32
"""Bits of a position key below the position (32 bits of the item's digest)."""


def position_key(position: int, digest: str | None) -> int:
    """The record key of history ``position`` in a session without row ids: the position
    and 32 bits of the item's digest. A rewritten history (a compaction) puts other items at
    the positions: their records get keys of their own instead of overwriting the records
    of the rows they replaced. Positions below 2**31."""
    salt = int(digest[:8], 16) if digest else 0
    return (position << POSITION_SHIFT) | salt


# --------------------------------------------------------------------------- the ledger


@dataclass(frozen=True)
class EvictionStep:
    """One turn's hand-over (see :func:`eviction_step`)."""

    evicted: list[int]
    """Positions evicted that were held (kept by an earlier turn), in order."""
    start: int
    """Every position in ``[start, n)`` that the turn did not keep is evicted too."""
    held: list[int]
    """Positions below ``n`` the turn kept (to look at again next turn)."""


def eviction_step(frontier: int, held: Sequence[int], n: int, kept: Sequence[int]) -> EvictionStep:
    """Which rows a turn evicted that no earlier turn handed over.

    ``frontier`` and ``held``: the ledger before the turn (positions below ``frontier`` were
    handed over unless listed in ``held``); ``n``: the history's length; ``kept``: the
    positions the turn sent (sorted). Costs ``O(len(held) + len(kept))``; the positions of
    ``[start, n)`` are enumerated by whoever indexes them. A ledger ahead of the history
    (it shrank) starts again from 0."""
    if frontier > n:
        frontier, held = 0, ()
    kept_set = set(kept)
    evicted = [p for p in held if p < n and p not in kept_set]
    in_range = set(held)
    new_held = [p for p in kept if p < n and (p >= frontier or p in in_range)]
    return EvictionStep(evicted, frontier, new_held)


@dataclass
class Ledger:
    """What one stored session's turns handed over to one builder (see the module note)."""

    frontier: int = 0
    held: list[int] = field(default_factory=list)
    anchor: int | str | None = None
    """The row id (or item digest) at ``frontier - 1`` when it was handed over."""
    epoch: int | None = None
    users: array[int] = field(default_factory=lambda: array("q"))
    """Positions of the user messages below ``users_upto``."""
    users_upto: int = 0
    summarizing: bool = False
    pending: tuple[int, int, int] | None = None
    """Evicted prefix counted but not yet summarised: (first position, end, tokens)."""
    summary_store: Any = None
    """The summary of a session without a database file (kept here, by this process)."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        self.frontier, self.held, self.anchor = 0, [], None
        self.users, self.users_upto = array("q"), 0
        self.pending = None


@dataclass(frozen=True)
class TurnMemory:
    """What :meth:`Evictions.prepare` found for a turn (passed to ``builder.build``)."""

    turn: int | None
    """This turn's number: the user messages in the history plus one (``None``: unknown)."""
    summary: str | None
    """The session's summary of what it evicted (``None``: none yet)."""


@dataclass(frozen=True)
class TurnRows:
    """What a session turn hands over after its pack (see :meth:`Evictions.observe`)."""

    session_id: str
    scope: MemoryScope | None
    """The memory scope the rows are indexed in (``None``: no recall, a summary only)."""
    n_history: int
    offset: int
    """``items`` hold the history from this position on (a token window)."""
    items: Sequence[Any]
    kept: Sequence[int]
    """History positions the request sent (``plan.pack.kept_history``)."""
    dependency: Sequence[int]
    row_ids: Sequence[int] | None
    """The row id of every position ``[0, n_history)``, ascending; ``None``: rows are keyed
    by position (a session without row ids)."""
    fetch: Callable[[list[int]], dict[int, Any]] | None
    """Items by row id, for rows before the window (``None``: there are none)."""
    summaries: SummaryStore | None
    epoch: int
    read_all: Callable[[], Awaitable[list[Any]]] | None = None
    """The whole history as the inner session reads it (on the turn's event loop), for a
    summary of rows before the window when they cannot be read by row id (``fetch``)."""
