"""Which run a model call belongs to, what the filter may reuse from its earlier calls, and
the SDK's de-duplication of what the filter returns.

**Run identity.** The SDK gives every run its own agent span before the run's first model
call (``Runner.run`` and ``Runner.run_streamed`` in 0.22.3, 0.23.1 and 0.24.0, with tracing
on or off: a disabled trace still makes a no-op span object per run) and keeps it current,
under that turn's span, while the model filter runs; a handoff starts a new one. Concurrent
runs, runs one after another in one task, runs inside one user ``trace()`` and nested runs
(an agent used as a tool) each have their own. :func:`run_span` finds it by walking the
tracing scope from the current span; a call made outside a run (no agent span in scope)
cannot be attributed and is packed from scratch. The span, not the items, identifies the run.

**What is reused.** Within a run the filter keeps a :class:`~protoprompt.HistoryIndex` of the
input it has packed and the content digests of what it saw. Nothing is trusted because it
was seen: every call digests what was appended and a rotating sample of the rest
(``protoprompt._core.digests``: a keyed hash of the content, no conversion; see
:class:`._planner.InputLedger` for why a sample suffices for the lists the SDK builds); a
sampled item that changed, or a shorter list, makes the call digest its whole input, and
the index is cut back to the first item whose digest changed (an item edited in place, a
list rearranged by another filter). The layout of the
previous call (where the run's input is, where the newest step starts) is reused only when
the previous input is an unchanged prefix of this one and nothing appended is a user
message.

**De-duplication.** After the filter the SDK collapses items that share an identity
(``deduplicate_input_items_preferring_latest``: the same ``call_id`` reused by a later
response, a repeated reasoning id): the last occurrence's content survives, at the first
position for calls and reasoning, at the last for outputs. The filter packs the list as the
SDK will send it (:func:`collapse`), so a ``call_0`` reused in every response neither ties an
old run's output to this run's step nor is counted twice. A run keeps where the collapsed
list's items stand in the SDK's list (:class:`Gather`) while its groups and the content
they cover are unchanged, so a later call reads only the part of it the pack needs.
"""

from __future__ import annotations

import bisect
import contextvars
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

from ..._seams import span_previous_token
from ...packing import HistoryIndex
from .._sdk._names import DEDUPE_ANCHOR_TYPES, DEDUPE_KEY, AgentSpanData, get_current_span
from ._planner import InputLedger, Observed

__all__ = [
    "CollapsePlan",
    "Collapsed",
    "Gather",
    "Run",
    "apply_collapse",
    "collapse",
    "collapse_groups",
    "collapse_plan",
    "common_prefix",
    "dedupe_keys",
    "run_span",
]

_SCOPE_DEPTH = 8
"""Spans walked down the tracing scope to the run's agent span (it is the current span, or
the one under the current turn span)."""


def run_span() -> Any | None:
    """The agent span of the run making the current model call, or ``None`` when there is
    none in scope (the call cannot be attributed to a run)."""
    span = get_current_span()
    for _ in range(_SCOPE_DEPTH):
        if span is None:
            return None
        if isinstance(getattr(span, "span_data", None), AgentSpanData):
            return span
        token = span_previous_token(span)
        if not isinstance(token, contextvars.Token):
            return None
        previous = token.old_value
        span = None if previous is contextvars.Token.MISSING else previous
    return None


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _dedupe_key(item: Any) -> str | None:
    if isinstance(item, Mapping) and ("role" in item or item.get("type") == "message"):
        return None  # what the SDK's key says for every message, without copying the item
    return DEDUPE_KEY(item) if DEDUPE_KEY is not None else None


def dedupe_keys(items: Sequence[Any]) -> list[str | None]:
    """The SDK's de-duplication key of each item (``None``: never collapsed)."""
    return [_dedupe_key(item) for item in items]


class Collapsed:
    """A list as the SDK's de-duplication leaves it, with where each item went.

    Its items are read from the SDK's list when asked for (:attr:`items`, or only the part
    from a position on: :meth:`tail`); its digests and positions need none of them."""

    __slots__ = ("_anchor", "_items", "_read", "_removed", "digests", "length")

    def __init__(
        self,
        items: list[Any] | None,
        digests: bytes,
        removed: list[int],
        anchor: dict[int, int],
        *,
        read: Callable[[int], list[Any]] | None = None,
        length: int = 0,
    ) -> None:
        self._items = items
        self._read = read
        self.length = len(items) if items is not None else length
        """How many items the collapsed list has."""
        self.digests = digests
        """Their digests (those of the items whose content survives)."""
        self._removed = removed
        self._anchor = anchor

    def __len__(self) -> int:
        return self.length

    @property
    def items(self) -> list[Any]:
        """The collapsed list (the SDK's objects, the surviving content of each key)."""
        if self._items is None:
            assert self._read is not None
            self._items = self._read(0)
        return self._items

    def tail(self, start: int) -> list[Any]:
        """The collapsed list from position ``start`` on (only those items are read)."""
        if self._items is not None or not start:
            return self.items[start:] if start else self.items
        assert self._read is not None
        return self._read(start)

    def position(self, i: int) -> int:
        """Where original item ``i`` (its key's survivor) is in the collapsed list."""
        i = self._anchor.get(i, i)
        return i - bisect.bisect_left(self._removed, i)

    def start(self, original: int) -> int:
        """The first collapsed position standing at or after original position ``original``."""
        return original - bisect.bisect_left(self._removed, original)


def _groups(keys: Sequence[str | None]) -> dict[str, list[int]]:
    first: dict[str, int] = {}
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        if key in first:
            groups.setdefault(key, [first[key]]).append(i)
        else:
            first[key] = i
    return groups


@dataclass(frozen=True)
class CollapsePlan:
    """Which positions the SDK's de-duplication removes and which survivor's content lands
    where: what :func:`collapse_groups` applies to a list (kept by a run while its groups
    and the items they name are unchanged)."""

    removed: list[int]
    replace: dict[int, int]
    anchor_of: dict[int, int]


def collapse_plan(items: Sequence[Any], groups: Mapping[str, Sequence[int]]) -> CollapsePlan:
    """The :class:`CollapsePlan` of ``items`` given the positions of every key that occurs
    more than once (see :func:`collapse_groups`)."""
    removed: list[int] = []
    replace: dict[int, int] = {}
    anchor_of: dict[int, int] = {}
    for positions in groups.values():
        anchor = positions[0]
        for p in positions[1:]:
            if _field(items[p], "type") not in DEDUPE_ANCHOR_TYPES:
                anchor = p
        for p in positions:
            if p != anchor:
                removed.append(p)
                anchor_of[p] = anchor
        if positions[-1] != anchor:
            replace[anchor] = positions[-1]
    removed.sort()
    return CollapsePlan(removed, replace, anchor_of)


def apply_collapse(items: Sequence[Any], plan: CollapsePlan, digests: bytes = b"") -> Collapsed:
    """``items`` collapsed by ``plan`` (with their digests, when given)."""
    removed = plan.removed
    out: list[Any] = []
    chunks: list[bytes] = []
    prev = 0
    for r in (*removed, len(items)):
        out.extend(items[prev:r])
        chunks.append(digests[16 * prev : 16 * r])
        prev = r + 1
    packed = bytearray(b"".join(chunks))
    collapsed = Collapsed(out, b"", removed, plan.anchor_of)
    for anchor, latest in plan.replace.items():
        d = collapsed.position(anchor)
        out[d] = items[latest]
        if digests:
            packed[16 * d : 16 * d + 16] = digests[16 * latest : 16 * latest + 16]
    collapsed.digests = bytes(packed)
    return collapsed


def _gather(items: Sequence[Any], positions: Sequence[int]) -> list[Any]:
    """``[items[p] for p in positions]``, read in C."""
    if len(positions) > 1:
        return list(itemgetter(*positions)(items))
    return [items[p] for p in positions]


class Gather:
    """:func:`apply_collapse` of one plan over a list's first :attr:`length` items, kept as
    the positions to read (no item is kept): a later list whose first :attr:`length` items
    have the same content digests collapses to the same positions, so its collapsed list is
    read from them (only the part a call needs: :meth:`Collapsed.tail`) and what was
    appended since is added as it is (a plan that has not changed collapses nothing
    appended)."""

    __slots__ = ("_order", "digests", "length", "plan", "source")

    def __init__(self, length: int, plan: CollapsePlan, digests: bytes) -> None:
        self.plan = plan
        self.length = length
        self.source = digests[: 16 * length]
        """The digests of the list the positions were made for (what a later list's prefix
        must match)."""
        removed = set(plan.removed)
        order = [p for p in range(length) if p not in removed]
        for anchor, latest in plan.replace.items():
            order[anchor - bisect.bisect_left(plan.removed, anchor)] = latest
        self._order = order
        """The position in the SDK's list of each collapsed position."""
        self.digests = b"".join([self.source[16 * p : 16 * p + 16] for p in order])
        """The collapsed prefix's digests."""

    def fits(self, plan: CollapsePlan | None, items: Sequence[Any], digests: bytes) -> bool:
        """Whether ``items`` (with ``digests``) collapse by ``plan`` through these positions:
        the same plan, and the first :attr:`length` items unchanged by content."""
        return (
            plan is self.plan
            and len(items) >= self.length
            and digests.startswith(self.source)  # compared in place (no copy of the list's)
        )

    def apply(self, items: list[Any], digests: bytes) -> Collapsed:
        """``items`` collapsed: the kept positions read from ``items`` (its own objects)
        when asked for, then what follows :attr:`length` as it is."""
        n, order = self.length, self._order

        def read(start: int) -> list[Any]:
            if start >= len(order):
                return items[n + start - len(order) :]
            out = _gather(items, order[start:] if start else order)
            out += items[n:]
            return out

        plan = self.plan
        return Collapsed(
            None,
            self.digests + digests[16 * n :],
            plan.removed,
            plan.anchor_of,
            read=read,
            length=len(order) + len(items) - n,
        )


def collapse_groups(
    items: Sequence[Any], groups: Mapping[str, Sequence[int]], digests: bytes = b""
) -> Collapsed:
    """``items`` collapsed as ``deduplicate_input_items_preferring_latest`` collapses them,
    given the positions of every key that occurs more than once: the last occurrence's
    content survives, at the first position for calls, reasoning and approval requests
    (the SDK's anchor types), else at the last one whose type is not an anchor type."""
    return apply_collapse(items, collapse_plan(items, groups), digests)


def collapse(items: Sequence[Any], keys: Sequence[str | None], digests: bytes = b"") -> Collapsed:
    """What ``deduplicate_input_items_preferring_latest`` makes of ``items`` (the same list,
    tested against the SDK's function), with the positions mapped."""
    return collapse_groups(items, _groups(keys), digests)


class Run:
    """What the filter knows of one run between its model calls."""

    __slots__ = (
        "agent",
        "calls",
        "candidates",
        "collapse_plan",
        "first",
        "gather",
        "groups",
        "index",
        "index_digests",
        "keys",
        "n_prev",
        "prefix",
        "reach",
        "run_input",
        "seen",
        "span",
        "step_start",
        "token",
    )

    def __init__(self, agent: Any, token: Any, span: Any) -> None:
        self.agent = agent
        self.token = token
        self.span = span
        """The run's agent span (held: its id cannot be reused while this state lives)."""
        self.index = HistoryIndex()
        self.index_digests = b""
        """Digests of the packed list's first ``len(index)`` items, as the index saw them."""
        self.calls = 0
        self.seen = InputLedger()
        """The previous call's input (as the SDK handed it over): length and digests."""
        self.n_prev = 0
        self.step_start = 0
        self.run_input: tuple[int, int] | None = None
        self.candidates: tuple[tuple[Any, ...], list[Any]] | None = None
        self.keys: list[str | None] = []
        """De-duplication keys of the previous input's items (unchanged ones are kept)."""
        self.first: dict[str, int] = {}
        """The first position of every key."""
        self.groups: dict[str, list[int]] = {}
        """The positions of every key that occurs more than once."""
        self.collapse_plan: CollapsePlan | None = None
        """:func:`collapse_plan` of :attr:`groups` (``None``: to be made again)."""
        self.gather: Gather | None = None
        """Where :attr:`collapse_plan` reads a list from (made again for another plan or
        when an item it covers changed)."""
        self.prefix: Any = None
        """The run's cache-stable prefix (a ``_planner.RunPrefix``; ``None``: none yet)."""
        self.reach: int | None = None
        """The oldest position of the packed list the previous call's pack kept or stopped
        at (``None``: unknown); where the next call's windowed read starts from."""

    @property
    def nbytes(self) -> int:
        return (
            self.index.nbytes
            + self.seen.nbytes
            + len(self.index_digests)
            + 8 * len(self.keys)
            + 100 * len(self.first)
            + (40 * self.gather.length if self.gather is not None else 0)
            + (self.prefix.nbytes if self.prefix is not None else 0)
        )

    def observe(self, items: list[Any]) -> tuple[Observed, bool]:
        """Read ``items`` against the previous call's input (:class:`._planner.InputLedger`:
        what was appended and a sample of the rest); ``(observed, extends)``: whether the
        previous call's input is an unchanged prefix of ``items`` with nothing but model
        output and tool results (no user message) appended: the same run continuing."""
        observed = self.seen.observe(items)
        same = observed.same
        n = self.n_prev
        extends = (
            bool(self.calls)
            and same >= n
            and len(items) >= n
            and not any(_is_user_message(items[p]) for p in range(n, len(items)))
        )
        self._update_keys(items, same)
        return observed, extends

    def collapse(self, items: list[Any], digests: bytes) -> Collapsed:
        """``items`` as the SDK's de-duplication leaves them (:attr:`groups` is theirs),
        through the plan kept since the groups last changed: its positions are read again
        only for another plan or when an item they cover changed by content (``digests``:
        those of ``items``), else what was appended is added (``O(appended)`` but for one
        C-level gather of the list)."""
        if self.collapse_plan is None:
            self.collapse_plan = collapse_plan(items, self.groups)
        gather = self.gather
        if gather is None or not gather.fits(self.collapse_plan, items, digests):
            gather = self.gather = Gather(len(items), self.collapse_plan, digests)
        return gather.apply(items, digests)

    def _update_keys(self, items: list[Any], same: int) -> None:
        keep = min(same, len(self.keys))
        if keep < len(self.keys):  # an item changed: the keys from there on are read again
            self.collapse_plan = None
            del self.keys[keep:]
            self.first = {}
            for i, key in enumerate(self.keys):
                if key is not None:
                    self.first.setdefault(key, i)
            self.groups = _groups(self.keys)
        for i in range(keep, len(items)):
            key = _dedupe_key(items[i])
            self.keys.append(key)
            if key is None:
                continue
            first = self.first.setdefault(key, i)
            if first != i:
                self.groups.setdefault(key, [first]).append(i)
                self.collapse_plan = None

    def sync_index(self, digests: bytes) -> None:
        """Cut the index back to the first item whose content it has not seen (``digests``:
        those of the list about to be packed)."""
        n = len(self.index)
        if n and common_prefix(digests, self.index_digests) < n:
            self.index.truncate(common_prefix(digests, self.index_digests))


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading 16-byte digests ``a`` and ``b`` share (a few slice compares; the
    common case, one a prefix of the other, compares in place without copying either)."""
    n = min(len(a), len(b)) // 16
    short, long = (a, b) if len(a) <= len(b) else (b, a)
    if len(short) == n * 16 and long.startswith(short):
        return n
    if len(short) != n * 16 and a[: n * 16] == b[: n * 16]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi], in digests
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: mid * 16] == b[: mid * 16]:
            lo = mid
        else:
            hi = mid
    return lo


def _is_user_message(item: Any) -> bool:
    return _field(item, "role") == "user" and _field(item, "type") in (None, "message")
