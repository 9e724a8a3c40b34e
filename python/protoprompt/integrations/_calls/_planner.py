"""The session's cache-stable prefix (issue 34): each model call's request extends the
previous call's while it fits, so the provider's prompt cache bills the repeated part at its
cached-input price.

The per-call filter of a :class:`~protoprompt.integrations.ProtoPromptSession` given a
:class:`~protoprompt.CachePolicy` keeps the request it sent last (its items as sent: the
same objects, the same masked copies). The next call's candidate is that request plus what
the SDK appended since; when the whole candidate fits the budget it is sent as it is
(``"stayed"``): the previous request byte for byte, then the new items. When it does not
fit, the cut moves once (``"moved"``): the SDK's whole input is packed newest first to
``low_water`` times the budget, with the tool outputs of all but the policy's
``keep_recent`` newest turns masked, and that request becomes the new prefix, leaving room
for the calls that follow. A run's first call resumes the session's previous request when
its input (the callback's request) holds that request's last items and the same context
message (:func:`resume`); otherwise it sends the callback's request as it is when that fits.

Nothing is trusted because it was sent before: the candidate is packed by the core like any
request (classified through the prefix's index, which re-reads any item whose content
changed), and it is sent unchanged only when the core keeps every one of its units.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ... import _core
from ..._packing._types import UnitDecision
from ..._tokens import item_tokens
from ...packing import HistoryIndex, Masking, analyze

if TYPE_CHECKING:
    from ...packing import PackResult
    from ...prefix import CachePolicy
    from ._request import RequestExtras

T = TypeVar("T")

__all__ = [
    "CopyDigests",
    "HeadAttempt",
    "HeadCandidate",
    "HeadMoved",
    "HeadPacked",
    "InputLedger",
    "Observed",
    "RunPrefix",
    "SentCosts",
    "Stable",
    "TurnPlanner",
    "TurnPrefix",
    "TurnStep",
    "adopt",
    "after_head_move",
    "candidate",
    "head_candidate",
    "head_end",
    "head_move",
    "kept_whole",
    "leading_tokens",
    "move",
    "move_reason",
    "request_key",
    "resume",
    "stay",
]


def request_key(extras: RequestExtras) -> tuple[Any, ...]:
    """What the call sends before its input items (instructions, tools, output schema),
    as far as the filter can tell a change: their costs, what is not counted and the digest
    of their content (an edit of equal cost is a change too)."""
    return (
        extras.instructions,
        extras.tools,
        extras.output_schema,
        tuple(extras.not_counted),
        extras.digest,
    )


SAMPLE_HEAD = 4
"""Leading items of the previous input a call re-reads (where a chained filter inserts)."""
SAMPLE_TAIL = 8
"""Trailing items of the previous input a call re-reads (what the SDK's orphan pruning or a
rewrite of the run's steps touches first)."""
SAMPLE_SPREAD = 32
"""Items spread over the rest of the previous input a call re-reads, at an offset that
moves by one each call: every item is re-read at least once every
``ceil(n / SAMPLE_SPREAD)`` calls."""


def sample_positions(n: int, turn: int) -> list[int]:
    """The positions of a previous input of ``n`` items that call ``turn`` re-reads: all of
    them when ``n`` is small, else the head, the tail and a spread sample whose offset
    rotates with ``turn``."""
    if n <= SAMPLE_HEAD + SAMPLE_TAIL + SAMPLE_SPREAD:
        return list(range(n))
    stride = -(-n // SAMPLE_SPREAD)
    spread = range(turn % stride, n, stride)
    return sorted({*range(SAMPLE_HEAD), *spread, *range(n - SAMPLE_TAIL, n)})


@dataclass(frozen=True)
class Observed:
    """What one call found of its input, against the previous call's."""

    digests: bytes
    """Content digests of the whole input (those of the unchanged prefix carried over)."""
    same: int
    """Leading items whose content is unchanged since the previous call."""
    checked: int
    """Items digested by this call: what was appended plus the sample on the fast path,
    every item otherwise."""
    fast: bool
    """The prefix was checked by its sample (:func:`sample_positions`), not read whole."""


class InputLedger:
    """What a run's calls learned of its input list between them: its length, the content
    digests of its items and the turn of the rotating sample.

    A call whose input is at least as long as the previous one re-reads only what was
    appended and the sample of the rest (``O(appended)``); when every sampled item digests
    as before, the previous input is taken as an unchanged prefix. Anything else -- a
    shorter list, a sampled item that changed (a rewritten history, a pruned or replaced
    step, an item edited in place) -- reads the whole input, as the first call does.

    Why a sample is enough: the SDK builds every call's input afresh from its run state
    (``_prepare_turn_input_items``: the caller's items copied dict by dict and list by list,
    then each step's ``to_input_item()``, in 0.22.3, 0.23.1 and 0.24.0). No object the
    filter, another filter, a hook or the model saw on one call is an object of the next
    call, so an edit in place of any of them cannot reach it; the SDK changes what it
    copies from only by appending the run's steps (a handoff that rewrites the history
    starts a new run: a new agent span). What is left is code that edits the input list it
    passed to ``Runner.run`` (the SDK copies that list, not its dicts) while the run is
    going: such an edit is found when its item is sampled, at once in an input of at most
    44 items, else within ``ceil(n / 32)`` calls; :meth:`ModelInputFilter.reset` makes the
    next call read everything. A filter chained before this one that inserts its own
    objects puts them where the head sample reads them."""

    __slots__ = ("_digests", "turn")

    def __init__(self) -> None:
        self._digests = bytearray()
        self.turn = 0

    def __len__(self) -> int:
        return len(self._digests) // 16

    @property
    def nbytes(self) -> int:
        return len(self._digests)

    def observe(self, items: list[Any]) -> Observed:
        """Read ``items`` against the previous call's input and remember them."""
        n = len(self)
        self.turn += 1
        if n and len(items) >= n:
            positions = sample_positions(n, self.turn)
            sample, _ = _core.digests([items[p] for p in positions])
            old = self._digests
            if all(
                sample[16 * i : 16 * i + 16] == old[16 * p : 16 * p + 16]
                for i, p in enumerate(positions)
            ):
                added, _ = _core.digests(items[n:])
                old += added
                return Observed(bytes(old), n, len(positions) + len(items) - n, True)
        digests, same = _core.digests(items, bytes(self._digests))
        self._digests = bytearray(digests)
        return Observed(digests, same, len(items), False)


class _PackCosts:
    """The tokens a pack's request spent on each of its items, read from its decisions on
    first use, then kept."""

    __slots__ = ("_costs", "_pack")

    def __init__(self, pack: PackResult) -> None:
        self._pack: PackResult | None = pack
        self._costs: list[int | None] = []

    def get(self) -> list[int | None]:
        pack = self._pack
        if pack is not None:
            where = {p: i for i, p in enumerate(pack.kept_history)}
            costs: list[int | None] = [None] * len(pack.items)
            for d in pack.decisions:
                sent = [where[p] for p in d.positions if p in where] if d.kept else []
                if sent:
                    for i in sent:
                        costs[i] = 0
                    costs[max(sent)] = d.sent_tokens or 0
            self._costs, self._pack = costs, None
        return self._costs


class SentCosts:
    """The tokens a request spent on each of its items, as the pack that made it counted
    them (what :func:`head_end` reads instead of counting the items again): a unit's sent
    tokens on its last item sent, 0 on its other items (so a sum up to the end of any unit
    is the units' cost); ``None`` for an item the pack has no decision for (the newest
    step, sent as new input). Read from the pack's decisions on first use only (a move that
    keeps a head)."""

    __slots__ = ("_at", "_table")

    def __init__(self, pack: PackResult) -> None:
        self._table = _PackCosts(pack)
        self._at: list[int] | None = None
        """Item ``i`` of the request is item ``_at[i]`` of the pack's (``None``: the same)."""

    def __getitem__(self, i: int) -> int | None:
        costs = self._table.get()
        at = self._at
        j = i if at is None else (at[i] if 0 <= i < len(at) else -1)
        return costs[j] if 0 <= j < len(costs) else None

    def take(self, at: Sequence[int]) -> SentCosts:
        """The costs of the request made of this one's items ``at``, in that order."""
        view = SentCosts.__new__(SentCosts)
        view._table = self._table
        view._at = list(at) if self._at is None else [self._at[i] for i in at]
        return view


@dataclass
class RunPrefix:
    """The request a run sent last, as the next call's prefix."""

    items: list[Any]
    """The previous request's input items, as sent (masked copies included)."""
    source_len: int
    """Length of the SDK's input list that request was made from."""
    request_tokens: int
    """The previous request's tokens (items, instructions, tools, output schema)."""
    key: tuple[Any, ...]
    """:func:`request_key` of the previous call."""
    cut: int | None
    """The SDK input position of the first optional item sent at the last move."""
    pins: list[int]
    """Positions in :attr:`items` of the pinned items (context message, run input)."""
    copies: dict[int, bytes] = field(default_factory=dict)
    """The copies among :attr:`items` that stand for an input item (masked tool outputs,
    id-less calls whose reasoning was left out), by position: the content digest of the
    item each stands for (what :func:`adopt` finds in the stored history)."""
    index: HistoryIndex = field(default_factory=HistoryIndex)
    """The candidates' index: each candidate extends the previous one."""
    seen: InputLedger = field(default_factory=InputLedger)
    """The candidates read so far (each extends the previous one: ``O(appended)``)."""
    costs: SentCosts | None = None
    """The tokens the request spent on each of :attr:`items` (``None``: not known, as for
    a request read back from the store: :func:`head_end` counts them)."""

    def sync(self, items: list[Any]) -> Observed:
        """Cut the index back to the first item of ``items`` whose content it has not seen."""
        observed = self.seen.observe(items)
        if observed.same < len(self.index):
            self.index.truncate(observed.same)
        return observed

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + self.seen.nbytes + 8 * len(self.items)


def _content(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)


def resume(last: RunPrefix | None, items: list[Any], context: bool) -> RunPrefix | None:
    """The session's previous request as the prefix of a new run's first call, when
    ``items`` (the callback's request) holds the last two items that request sent, by
    content, with what followed them after: the previous run's stored output and this
    run's input. ``context``: ``items[0]`` is the callback's context message, which must
    then equal (by content) the one the previous request starts with. ``None`` when it
    does not (a pop, a clear, a cut the callback moved past them, a context message that
    changed): the call then starts afresh."""
    if last is None or not last.items:
        return None
    if context and (0 not in last.pins or _content(last.items[0]) != _content(items[0])):
        return None
    tail = [_content(x) for x in last.items[-2:]]
    for j in range(len(items) - 1, len(tail) - 2, -1):
        if _content(items[j]) != tail[-1]:
            continue
        if len(tail) == 2 and _content(items[j - 1]) != tail[0]:
            continue
        # The new run's input is appended: the old run's other pins are optional history
        # now. An index of its own: runs of one filter may pack at the same time.
        pins = [0] if context else []
        return RunPrefix(
            list(last.items), j + 1, last.request_tokens, last.key, last.cut, pins,
            dict(last.copies), costs=last.costs,
        )  # fmt: skip
    return None


def candidate(prefix: RunPrefix, items: list[Any]) -> tuple[list[Any], int]:
    """The previous request plus what the SDK appended since (``items`` extends the list
    that request was made from), and where the appended part starts."""
    return [*prefix.items, *items[prefix.source_len :]], len(prefix.items)


def placed_pins(prefix: RunPrefix, pinned: list[int]) -> list[int]:
    """Every pinned item's position in the candidate: those the previous request sent where
    it sent them, the appended ones (a resumed run's input) after it."""
    n = len(prefix.items)
    appended = [n + p - prefix.source_len for p in pinned if p >= prefix.source_len]
    return sorted({*prefix.pins, *appended})


def run_input_at(pins: list[int], context_at: int | None) -> tuple[int, int] | None:
    """``[start, end)`` of the run input in a candidate, from its pinned positions."""
    ins = [p for p in pins if p != context_at]
    return (ins[0], ins[-1] + 1) if ins else None


def kept_whole(result: PackResult, cand: list[Any]) -> bool:
    """Whether the core sent ``cand`` as it is: every item, the same objects, in order."""
    sent = result.items
    return len(sent) == len(cand) and all(a is b for a, b in zip(sent, cand, strict=True))


def move_reason(
    call: int, old_cut: int | None, new_cut: int | None, before: int, after: int, masked: int
) -> str:
    """Why the cut moved, in words (positions in the SDK's input list)."""

    def at(p: int | None) -> str:
        return "no optional item" if p is None else f"input[{p:,}]"

    return (
        f"call {call} did not fit: cut moved from {at(old_cut)} to {at(new_cut)}, "
        f"request {before:,} -> {after:,}"
        + (f" ({masked:,} tool outputs masked)" if masked else "")
    )


@dataclass(frozen=True)
class Stable:
    """A call planned through the run's prefix."""

    result: PackResult
    items: list[Any]
    """The list packed (the candidate, or the SDK's list on a move)."""
    pinned: list[int]
    """Pinned positions in :attr:`items`, appended ones included."""
    step_start: int
    shared_tokens: int
    """Tokens this request repeats from the start of the run's previous request (0 after
    a move or when the instructions, tools or output schema changed)."""
    code: str
    """``"stayed"``, ``"moved"`` or ``"set"`` (the run's first request through it)."""
    reason: str
    request_changed: bool
    """The instructions, tools or output schema differ from the previous call's."""


def stay(
    prefix: RunPrefix,
    result: PackResult,
    placed: list[int],
    source_len: int,
    key: tuple[Any, ...],
    call: int,
) -> tuple[int, str, str, bool]:
    """Record a call that sent the previous request plus what was appended: ``(shared
    tokens, code, reason, request changed)``."""
    changed = key != prefix.key
    shared = 0 if changed else prefix.request_tokens
    reason = (
        f"call {call} extends the previous request ({shared:,} tokens repeated)"
        if not changed
        else f"call {call} extends the previous input, but the instructions, tools or output "
        "schema changed: nothing is a repeated prefix"
    )
    prefix.pins = placed
    prefix.items = list(result.items)
    prefix.costs = SentCosts(result)
    prefix.source_len = source_len
    prefix.request_tokens = result.request_tokens
    prefix.key = key
    return shared, "stayed", reason, changed


def _first_cut(result: PackResult, pinned: list[int]) -> int | None:
    pins = set(pinned)
    return next((p for p in result.kept_history if p not in pins), None)


def sent_copies(
    result: PackResult, source: list[Any], known: Mapping[bytes, bytes]
) -> dict[int, bytes]:
    """The items ``result`` sent in place of a stored item, by position in
    ``result.items``, with the content digest of the item each stands for: those it made in
    place of an item of ``source`` (the list it packed: masked copies, id-less calls), and
    the items of ``source`` that are copies the session callback made (``known``: their
    digests to their originals')."""
    sent = result.items
    extra = len(sent) - len(result.kept_history)  # the newest step, sent after the history
    if not 0 <= extra <= len(source):
        return {}
    kept = [*result.kept_history, *range(len(source) - extra, len(source))]
    at = [i for i, p in enumerate(kept) if sent[i] is not source[p]]
    copies: dict[int, bytes] = {}
    if known:
        digests, _ = _core.digests([source[p] for p in kept], None)
        for i in range(len(kept)):
            found = known.get(bytes(digests[16 * i : 16 * i + 16]))
            if found is not None:
                copies[i] = found
    if at:
        digests, _ = _core.digests([source[kept[i]] for i in at], None)
        for k, i in enumerate(at):
            d = bytes(digests[16 * k : 16 * k + 16])
            copies[i] = known.get(d, d)
    return copies


def move(
    previous: RunPrefix | None,
    result: PackResult,
    pinned: list[int],
    source: list[Any],
    key: tuple[Any, ...],
    call: int,
    known: Mapping[bytes, bytes] | None = None,
) -> tuple[RunPrefix, int, str, str, bool]:
    """The run's new prefix after a move to the low-water mark (``result``: the pack of
    ``source``, the SDK's list; ``known``: see :func:`sent_copies`), with ``(shared tokens,
    code, reason, request changed)``."""
    cut = _first_cut(result, pinned)
    where = {p: i for i, p in enumerate(result.kept_history)}
    pins = [where[p] for p in pinned if p in where]
    prefix = RunPrefix(
        list(result.items), len(source), result.request_tokens, key, cut, pins,
        sent_copies(result, source, known or {}), costs=SentCosts(result),
    )  # fmt: skip
    if previous is None:
        reason = f"call {call}: the run's prefix set at {result.request_tokens:,} tokens"
        return prefix, 0, "set", reason, False
    reason = move_reason(
        call, previous.cut, cut, previous.request_tokens, result.request_tokens, len(result.masked)
    )
    return prefix, 0, "moved", reason, key != previous.key


def head_end(
    items: list[Any],
    start: int,
    stop: int,
    limit: int,
    encoding: str | None,
    costs: SentCosts | None = None,
) -> int:
    """The end of a move's head in ``items`` (a request's history as sent): the largest
    ``e`` in ``[start, stop]`` such that ``items[start:e]`` holds whole atomic units of
    ``items[start:]`` only and costs at most ``limit`` tokens (``start``: no head). An
    item's cost is what the request spent on it where ``costs`` records it (the pack that
    made the request counted it), else it is counted."""
    if limit <= 0 or stop <= start:
        return start
    report = analyze(items[start:], [])
    reach: dict[int, int] = {}
    for unit in report.units:
        if unit.positions:
            last = max(unit.positions)
            for p in unit.positions:
                reach[p] = last
    end = start
    far = -1
    cost = 0
    for k in range(stop - start):
        sent = None if costs is None else costs[start + k]
        cost += item_tokens(items[start + k], encoding=encoding).total if sent is None else sent
        if cost > limit:
            break
        far = max(far, reach.get(k, k))
        if far <= k:
            end = start + k + 1
    return end


def leading_tokens(decisions: Iterable[UnitDecision], head: int, fixed: int) -> int:
    """Tokens a request repeats from its start when its first ``head`` items (positions of
    the list packed) are the previous request's: ``fixed`` (what precedes the items: the
    instructions, tools and output schema, or the context message) plus the sent tokens of
    every kept unit wholly before ``head``."""
    return fixed + sum(
        d.sent_tokens or 0 for d in decisions if d.kept and d.positions and max(d.positions) < head
    )


@dataclass(frozen=True)
class HeadPacked(Generic[T]):
    """One packed candidate of a move that keeps a head (what an adapter's attempt returns
    to :func:`head_move` when its pack kept the head as sent)."""

    value: T
    """The adapter's own result (its plan, candidate, ...)."""
    pack: PackResult
    """The pack of the candidate (positions of the candidate)."""
    head: int
    """The candidate's items before this position are its leading pinned items and the
    head, sent as the previous request sent them."""
    fixed: int | None
    """Tokens sent before the candidate's items that the previous request sent too (its
    instructions, tools and output schema, or its context message); ``None`` when they
    changed: the move then repeats nothing."""


@dataclass(frozen=True)
class HeadMoved(Generic[T]):
    """A move that kept a head (:func:`head_move`)."""

    value: T
    """:attr:`HeadPacked.value` of the attempt that fit."""
    mark: int
    """The tokens it packed to (the mark it fit, or just above the last one)."""
    shared: int
    """Tokens it repeats from the start of the previous request (:func:`leading_tokens`)."""


HeadAttempt = Callable[[int, int], "HeadPacked[T] | int | None"]
"""How an adapter packs a move that keeps a head of at most ``limit`` tokens to ``mark``
tokens (its two arguments): the pack when it kept the head as sent; the tokens by which the
head and the mandatory part miss the mark (``0``: missed for another reason, e.g. the head
did not stay as sent); ``None``: no head to keep (nothing sent, or the head's items are no
longer where the candidate needs them)."""


def head_move(
    budget: int, share: float, marks: Sequence[int], attempt: HeadAttempt[T]
) -> HeadMoved[T] | None:
    """The move that keeps the head of the previous request (``CachePolicy.head_share``),
    for the session callback and the per-call filter alike: ``attempt`` (the adapter's
    packing, see :data:`HeadAttempt`) is tried with a head of ``share`` times ``budget``
    at each of ``marks`` (tokens) in turn; when the last mark is missed by ``over``
    tokens it is tried once more at ``mark + over`` (up to the whole budget: the head stays
    whole, so the next move repeats it again); when that misses too, the head is shortened
    by what the last attempt missed (at least an eighth of it: a shorter head is still the
    start of the previous one, so it repeats) while it holds :data:`HEAD_MIN` tokens.
    ``None``: no head to keep, or none fits."""
    limit = int(budget * share)
    while limit >= HEAD_MIN:
        tried = list(marks)
        raised = False
        over = 0
        while tried:
            mark = tried.pop(0)
            got = attempt(limit, mark)
            if got is None:
                return None
            if isinstance(got, HeadPacked):
                shared = 0
                if got.fixed is not None:
                    shared = leading_tokens(got.pack.decisions, got.head, got.fixed)
                return HeadMoved(got.value, mark, shared)
            over = got
            if not tried and not raised and over > 0 and mark + over <= budget:
                # The head and the mandatory part miss the mark: packed to just above it.
                tried.append(mark + over)
                raised = True
        limit -= max(over, limit // 8)
    return None


def find_in_order(
    wanted: list[bytes],
    digests: bytes,
    start: int,
    stop: int,
    optional: AbstractSet[int] = frozenset(),
) -> list[int | None] | None:
    """The earliest positions in ``[start, stop)`` whose digests (16 bytes each in
    ``digests``) are ``wanted``, in order (``None``: not all found); the ``optional``
    indices of ``wanted`` not found are ``None``."""
    found: list[int | None] = []
    j = start
    for k, w in enumerate(wanted):
        i = j
        while i < stop and digests[16 * i : 16 * i + 16] != w:
            i += 1
        if i >= stop:
            if k not in optional:
                return None
            found.append(None)
            continue
        found.append(i)
        j = i + 1
    return found


@dataclass(frozen=True)
class HeadCandidate:
    """What a move that keeps a head packs (:func:`head_candidate`)."""

    items: list[Any]
    """The leading pinned items of the SDK's list, the head as the previous request sent
    it, then the SDK's items after the last one the head stands for."""
    pinned: list[int]
    """The SDK list's pinned items (context, recall message, run input) in :attr:`items`."""
    head: int
    """:attr:`items` before this position are the leading pinned items and the head."""
    start: int
    """The newest step's start in :attr:`items`."""
    shift: int
    """Position in :attr:`items` minus position in the SDK's list, after the head."""
    copies: dict[int, bytes]
    """The previous request's copies in the head, by position in :attr:`items`."""


def head_candidate(
    prefix: RunPrefix,
    packed: list[Any],
    pinned: list[int],
    step_start: int,
    lo: int,
    limit: int,
    encoding: str | None,
    known: Mapping[bytes, bytes],
    own: Callable[[Any], Any],
    had_context: bool,
) -> HeadCandidate | None:
    """The candidate of a move that keeps ``prefix``'s head: its items after the leading
    ``lo`` pinned ones (the context message, which must be the same by content), whole
    units as sent up to ``limit`` tokens (:func:`head_end`), each found in ``packed`` (the
    SDK's list) in order before the newest step -- a copy by the digest of the item it
    stands for, the callback's copies (``known``) by their originals'; a message ``own``
    says the callback made (an earlier run's recall message) may be missing -- then what
    ``packed`` holds after the last one found; ``had_context``: whether ``prefix`` starts
    with a context message (else its first item, pinned or not, may start the head: a
    first run's input). ``None``: no such head."""
    ilo = 1 if had_context else 0
    if lo != ilo or not prefix.items:
        return None
    if lo:
        d, _ = _core.digests([prefix.items[0], packed[0]], None)
        if d[:16] != d[16:32]:
            return None
    end = head_end(prefix.items, ilo, len(prefix.items), limit, encoding, prefix.costs)
    head = prefix.items[ilo:end]
    if not head:
        return None
    mine, _ = _core.digests(head, None)
    wanted = []
    for k in range(len(head)):
        w = prefix.copies.get(ilo + k)
        if w is None:
            d = bytes(mine[16 * k : 16 * k + 16])
            w = known.get(d, d)
        wanted.append(w)
    got, _ = _core.digests(packed, None)
    digests = b"".join(
        known.get(bytes(got[16 * j : 16 * j + 16]), bytes(got[16 * j : 16 * j + 16]))
        for j in range(len(packed))
    )
    optional = {k for k, x in enumerate(head) if own(x) is not None}
    found = find_in_order(wanted, digests, lo, step_start, optional)
    at = [p for p in found or () if p is not None]
    if found is None or not at:
        return None
    after = at[-1] + 1
    n = lo + len(head)
    shift = n - after
    # The pinned items where the candidate has them: in the head, as the previous request
    # sent them, or after it.
    where = {p: lo + k for k, p in enumerate(found) if p is not None}
    placed: list[int] = []
    for p in pinned:
        if p < lo or p >= after:
            placed.append(p if p < lo else p + shift)
        elif p in where:
            placed.append(where[p])
        else:
            return None
    copies = {lo + k: prefix.copies[ilo + k] for k in range(len(head)) if ilo + k in prefix.copies}
    return HeadCandidate(
        [*packed[:lo], *head, *packed[after:]], placed, n, step_start + shift, shift, copies
    )


def after_head_move(
    new: RunPrefix, previous: RunPrefix, result: PackResult, got: HeadCandidate, source_len: int
) -> None:
    """Fix up :func:`move`'s prefix of a move that kept a head: the length of the SDK's
    list it was made from, the head's copies, and its cut in the SDK list's positions (the
    first optional item sent after the head)."""
    new.source_len = source_len
    new.copies.update(got.copies)
    pins = set(got.pinned)
    first = next((p for p in result.kept_history if p >= got.head and p not in pins), None)
    new.cut = None if first is None else first - got.shift


# --------------------------------------------------------------------------- the callback


@dataclass
class TurnPrefix:
    """The history part of the request a session callback sent last, as the next turn's
    prefix: the items it sent (masked copies in place) and the history positions they
    stand for."""

    sent: list[Any]
    """The history items the request sent, in order, as sent (masked copies included)."""
    kept: list[int]
    """The history position of each of :attr:`sent` (absolute: window offsets added)."""
    end: int
    """The history's length when the request was made (what follows is appended since)."""
    originals: bytes
    """Digests of the stored items at :attr:`kept` (the originals of masked copies)."""
    masked: list[Any]
    """The masked copies among :attr:`sent` (never to be stored)."""
    request_tokens: int
    context: str | None
    """The context message the request started with, by content (``None``: none)."""
    whole: dict[int, int] = field(default_factory=dict)
    """Tokens of each masked unit whole, by its first history position (what masking
    saves, reported again by every stay)."""
    index: HistoryIndex = field(default_factory=HistoryIndex)
    """The index of the candidates (:attr:`sent` plus what was appended)."""
    digests: bytes = b""
    """Digests of the items :attr:`index` holds."""
    leading: int | None = None
    """Set by :func:`adopt`: how many of :attr:`sent` the model's request sent first, one
    after the other (before a recall message the turn leaves out); ``None``: all of them,
    as :attr:`request_tokens` counts (the callback's own request)."""
    costs: SentCosts | None = None
    """The tokens the request spent on each of :attr:`sent` (``None``: not known, as for a
    prefix read back from the store: :func:`head_end` counts them)."""

    @property
    def cut(self) -> int:
        """The first history position sent (:attr:`end` when none is)."""
        return self.kept[0] if self.kept else self.end

    def copy_digests(self) -> CopyDigests:
        """The content digest of each copy :attr:`sent` holds (:attr:`masked`), to the
        digest of the stored item it stands for: digested when first read (only a model
        filter that moves reads them), from the lists as they are now (a later turn
        replaces them, never changes them)."""
        return CopyDigests(self.sent, self.masked, self.originals)


class CopyDigests(Mapping[bytes, bytes]):
    """:meth:`TurnPrefix.copy_digests`: computed on first use, then kept."""

    __slots__ = ("_found", "_masked", "_originals", "_sent")

    def __init__(self, sent: list[Any], masked: list[Any], originals: bytes) -> None:
        self._sent, self._masked, self._originals = sent, masked, originals
        self._found: dict[bytes, bytes] | None = None

    @property
    def computed(self) -> bool:
        """Whether the digests were computed (read by tests)."""
        return self._found is not None

    def _get(self) -> dict[bytes, bytes]:
        if self._found is None:
            ids = {id(x) for x in self._masked}
            at = [i for i, x in enumerate(self._sent) if id(x) in ids]
            found: dict[bytes, bytes] = {}
            if at:
                digests, _ = _core.digests([self._sent[i] for i in at], None)
                o = self._originals
                found = {
                    bytes(digests[16 * k : 16 * k + 16]): o[16 * i : 16 * i + 16]
                    for k, i in enumerate(at)
                }
            self._found = found
        return self._found

    def __getitem__(self, key: bytes) -> bytes:
        return self._get()[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True)
class TurnStep:
    """How a turn's request relates to the previous turn's (``ContextPlan.prefix``)."""

    code: str
    """``"stayed"`` (the previous request's history, byte for byte, then what was
    appended), ``"moved"`` (it did not fit: packed to the low-water mark with older tool
    outputs masked), ``"set"`` (the session's first request through the policy, or one
    whose previous request no longer matches the history)."""
    reason: str
    shared_tokens: int
    """Tokens of the previous request this one repeats from its start (0 unless stayed
    behind the same context message)."""


def turn_candidate(
    last: TurnPrefix, history: list[Any], offset: int
) -> tuple[list[Any], int] | None:
    """The previous request's history plus what was stored since, and how many of its
    items are appended; ``None`` when ``history`` (from position ``offset`` on) does not
    hold the stored items that request sent, unchanged, or is shorter than it was."""
    total = offset + len(history)
    if last.end > total or (last.kept and last.kept[0] < offset):
        return None
    originals = [history[p - offset] for p in last.kept]
    _, same = _core.digests(originals, last.originals)
    if same < len(originals):
        return None
    appended = history[last.end - offset :]
    return [*last.sent, *appended], len(appended)


def sync_index(last: TurnPrefix, cand: list[Any]) -> None:
    """Cut the candidates' index back to the first item of ``cand`` it has not seen."""
    digests, same = _core.digests(cand, last.digests)
    if same < len(last.index):
        last.index.truncate(same)
    last.digests = digests[: 16 * len(cand)]


def sent_whole(result: PackResult, cand: list[Any]) -> bool:
    """Whether the pack kept every item of the candidate history ``cand``, unchanged."""
    sent = result.items
    return (
        len(result.kept_history) == len(cand)
        and not result.masked
        and all(a is b for a, b in zip(sent, cand, strict=False))
    )


def after_stay(
    last: TurnPrefix,
    cand: list[Any],
    history: list[Any],
    offset: int,
    tokens: int,
    pack: PackResult | None = None,
) -> TurnPrefix:
    """The prefix after a turn that sent ``cand`` whole: every appended item joins it
    (``pack``: the candidate's pack, in its positions, whose costs the prefix keeps)."""
    total = offset + len(history)
    appended = history[last.end - offset :]
    added, _ = _core.digests(appended, None)
    last.sent = list(cand)
    last.kept = [*last.kept, *range(last.end, total)]
    last.originals = last.originals + added[: 16 * len(appended)]
    last.end = total
    last.request_tokens = tokens
    last.costs = None if pack is None else SentCosts(pack)
    return last


def after_pack(
    result: PackResult,
    history: list[Any],
    offset: int,
    masked: list[Any],
    context: str | None,
) -> TurnPrefix:
    """The prefix a turn packed from the stored history sets (``result.kept_history`` in
    the positions of the whole history)."""
    kept = list(result.kept_history)
    originals, _ = _core.digests([history[p - offset] for p in kept], None)
    whole = {}
    if masked:
        whole = {
            d.positions[0]: d.tokens
            for d in result.decisions
            if d.decision == "masked" and d.tokens is not None
        }
    return TurnPrefix(
        sent=list(result.items[: len(kept)]),
        kept=kept,
        end=offset + len(history),
        originals=originals[: 16 * len(kept)],
        masked=list(masked),
        request_tokens=result.request_tokens,
        context=context,
        whole=whole,
        costs=SentCosts(result),
    )


HEAD_MIN = 1_024
"""Tokens below which a move keeps no head (``CachePolicy.head``): a provider caches
nothing shorter."""

ADOPT_SCAN = 4096
"""History positions :func:`adopt` may read beyond four per item of the request (the items
a request left out between two it sent: dropped units, reasoning left out)."""


def _same_call(copy: Any, item: Any) -> bool:
    """Whether ``copy`` is of the kind, role and call of ``item`` (a masked output or an
    id-less call stands for an item of its own type and call id)."""
    if not (isinstance(copy, dict) and isinstance(item, dict)):
        return False
    return all(copy.get(k) == item.get(k) for k in ("type", "role", "call_id"))


def adopt(
    request: RunPrefix, history: list[Any], offset: int, own: Callable[[Any], bool]
) -> TurnPrefix | None:
    """The turn prefix that continues ``request`` (the session's latest model request, as
    its filter sent it): its items that stand for stored history items, each found in
    ``history`` (from position ``offset`` on) by content -- a copy by the digest of the item
    it stands for, and of its kind and call -- in the same order, the latest such
    positions. The pinned items ``own`` says the callback made (its context and recall
    messages) are not history: the first one is the request's context message. ``None``
    when any other item is not found (a pop, a clear, a rewritten history, another
    session's request) or the search would read more than :data:`ADOPT_SCAN` positions
    beyond four per item.

    Why: a filter that moved within a run masked and dropped what the callback's own
    previous request still holds whole, so that request plus what the run stored may no
    longer fit where the request the model last received, plus the same, does; continuing
    that one keeps the provider's cached prefix instead of moving the cut a second time."""
    items = request.items
    pins = set(request.pins)
    at = [i for i, x in enumerate(items) if not (i in pins and own(x))]
    if not at or not history:
        return None
    context = None
    if 0 in pins and at[0] != 0 and isinstance(items[0], dict):
        context = str(items[0].get("content"))
    digests, _ = _core.digests([items[i] for i in at], None)
    want = [request.copies.get(i) or bytes(digests[16 * k : 16 * k + 16]) for k, i in enumerate(at)]
    chunk = 256
    seen: dict[int, bytes] = {}

    def digest_at(p: int) -> bytes:
        c = p // chunk
        found = seen.get(c)
        if found is None:
            found, _ = _core.digests(history[c * chunk : (c + 1) * chunk], None)
            seen[c] = found = bytes(found)
        q = 16 * (p - c * chunk)
        return found[q : q + 16]

    limit = 4 * len(at) + ADOPT_SCAN
    kept = [0] * len(at)
    p = len(history)
    read = 0
    for k in range(len(at) - 1, -1, -1):
        p -= 1
        while p >= 0 and digest_at(p) != want[k]:
            p -= 1
            read += 1
            if read > limit:
                return None
        if p < 0:
            return None
        if at[k] in request.copies and not _same_call(items[at[k]], history[p]):
            return None  # a copy must be of the kind and call of the item it stands for
        kept[k] = p
    skipped = [i for i in range(len(items)) if i not in set(at) and i != 0]
    leading = len(at) if not skipped else sum(1 for i in at if i < skipped[0])
    return TurnPrefix(
        leading=leading,
        sent=[items[i] for i in at],
        kept=[offset + q for q in kept],
        end=offset + kept[-1] + 1,
        originals=b"".join(want),
        masked=[items[i] for i in at if i in request.copies],
        request_tokens=request.request_tokens,
        context=context,
        costs=None if request.costs is None else request.costs.take(at),
    )


def turn_move_reason(
    old: TurnPrefix | None, new: TurnPrefix, before: int | None, mark: float | None = None
) -> str:
    """Why the turn's cut moved, in words (positions in the stored history); ``mark``: the
    fraction of the budget the move packed to, said when it is below the policy's."""
    masked = len(new.masked)
    where = "no history" if not new.kept else f"history[{new.cut:,}]"
    if old is None or before is None:
        return (
            f"the session's history does not fit: cut set at {where}, request "
            f"{new.request_tokens:,} tokens"
            + (f" ({masked:,} tool outputs masked)" if masked else "")
        )
    was = "no history" if not old.kept else f"history[{old.cut:,}]"
    return (
        f"the turn did not fit: cut moved from {was} to {where}, request "
        f"{before:,} -> {new.request_tokens:,}"
        + (f" ({masked:,} tool outputs masked)" if masked else "")
        + (
            f"; packed to {mark:.0%} of the budget: the session grew fast since the last move"
            if mark is not None
            else ""
        )
    )


def head_move_reason(
    old: TurnPrefix | None,
    new: TurnPrefix,
    before: int | None,
    mark: float | None,
    head: int,
    shared: int,
) -> str:
    """Why the turn moved when it kept the head (its first ``head`` history items as sent,
    ``shared`` tokens repeated): which stored items it dropped after the head, in words."""
    reason = turn_move_reason(old, new, before, mark)
    kept = new.kept
    gap = next((k for k in range(max(head, 1), len(kept)) if kept[k] != kept[k - 1] + 1), None)
    if old is not None and before is not None and gap is not None:
        was = "no history" if not old.kept else f"history[{old.cut:,}]"
        dropped = f"history[{kept[gap - 1] + 1:,}:{kept[gap]:,}]"
        reason = reason.replace(
            f"cut moved from {was} to history[{new.cut:,}]",
            f"dropped {dropped} after the head",
            1,
        )
    return reason + f"; kept the head ({head:,} history items as sent, {shared:,} tokens repeated)"


HEADROOM_TURNS = 5
"""Turns of the size the session grew by since the previous move that a move leaves room
for (see :meth:`TurnPlanner.mark`): with fewer, the cut moves again before the repeated
prefix has paid for the move (measured: ``docs/prompt-cache.md``)."""
MARK_DROP = 0.1
"""How far below the policy's ``low_water`` a move's mark may go (never below half of it):
0.2 repeated more on the generated agentic sessions but showed 0.76x the user turns of
newest first (under the 0.8x target), at 128k and on whole SDK runs at 32k."""


class TurnPlanner:
    """The session callback's cache-stable prefix (one per callback): the request it sent
    last, which the next turn extends while that fits (see ``_turn.build_stable_turn``)."""

    def __init__(self, policy: CachePolicy) -> None:
        self.policy = policy
        self.last: TurnPrefix | None = None
        self.lock = threading.Lock()
        """Held for a whole turn: two turns of one callback at once plan one after the
        other, each extending the other's request."""
        self.turns_since_move = 0
        """Turns that extended the request since the last move (or set)."""
        self.moved_tokens: int | None = None
        """The request's tokens right after the last move (``None``: no move yet)."""

    def mark(self, budget: int) -> float:
        """The fraction of the budget the next move packs to: the policy's ``low_water``,
        lowered when the session grew fast since the previous move so that the headroom
        holds :data:`HEADROOM_TURNS` turns of that growth (a move every turn or two costs
        the whole request each time), never below ``low_water - MARK_DROP`` (nor half of
        ``low_water``)."""
        low = float(self.policy.low_water)
        if self.moved_tokens is None or budget <= 0:
            return low
        growth = max(budget - self.moved_tokens, 0) / (self.turns_since_move + 1)
        floor = max(low - MARK_DROP, low / 2)
        return min(low, max(floor, 1 - HEADROOM_TURNS * growth / budget))

    def stayed(self) -> None:
        """A turn extended the request."""
        self.turns_since_move += 1

    def moved(self, request_tokens: int | None) -> None:
        """A turn set or moved the cut (``None``: packed newest first, no mark)."""
        self.turns_since_move = 0
        self.moved_tokens = request_tokens

    def masking(self) -> Masking:
        """What a move masks: every tool output older than the newest ``keep_recent``
        turns, even where it would fit whole."""
        p = self.policy
        return Masking(
            excerpt_tokens=p.excerpt_tokens,
            after_turns=p.keep_recent,
            omit_reasoning=p.omit_reasoning,
        )


def _kind(item: Any) -> str:
    if isinstance(item, dict):
        kind = item.get("type")
        if isinstance(kind, str) and kind != "message":
            return kind
        role = item.get("role")
        if role == "user":
            return "user_message"
        if isinstance(role, str):
            return f"{role}_input_message"
    return "item"


def in_history(
    result: PackResult,
    last: TurnPrefix,
    history: list[Any],
    offset: int,
    resent: tuple[str, ...] = ("kept",),
) -> PackResult:
    """A stay's pack (of the candidate: :attr:`TurnPrefix.sent` then what was appended) in
    the positions of the stored history, as a pack of the history reads: the resent
    masked copies as ``"masked"``, the history items the request does not send (before
    the cut, or left out at an earlier move) as ``"over_budget"`` (``last`` is the prefix
    before :func:`after_stay`). A move that kept a head (``CachePolicy.head``) reads the
    same way (``last``: the head as its prefix; ``resent``: the decisions whose units
    may hold its copies, pinned ones ``"mandatory"``), the units it masked itself and the
    reasoning it left out included."""
    n_sent = len(last.sent)
    positions = [*last.kept, *range(last.end, offset + len(history))]
    masked_ids = {id(x) for x in last.masked}
    masked_at = {i for i in range(n_sent) if id(last.sent[i]) in masked_ids}
    decisions: list[tuple[int, UnitDecision]] = []
    saved = 0
    for d in result.decisions:
        code = d.decision
        moved = [positions[p] for p in d.positions]
        whole = d.tokens
        sent_tokens = d.masked_tokens  # a unit the pack masked itself: masked tokens were sent
        if code in resent and any(p in masked_at for p in d.positions):
            code = "masked"
            whole = last.whole.get(moved[0])
            sent_tokens = d.tokens  # the copies resent as they are: what the pack counted was sent
            if whole is not None and d.tokens is not None:
                saved += whole - d.tokens
        decisions.append(
            (
                moved[0],
                UnitDecision(
                    0,
                    moved,
                    list(d.kinds),
                    code,
                    whole,
                    list(d.problems),
                    sent_tokens,
                ),
            )
        )
    sent = set(positions)
    for p in range(offset, last.end):
        if p not in sent:
            item = history[p - offset]
            decisions.append((p, UnitDecision(0, [p], [_kind(item)], "over_budget", None)))
    decisions.sort(key=lambda x: x[0])
    return dataclasses.replace(
        result,
        kept_history=[positions[p] for p in result.kept_history],
        dependency=[positions[p] for p in result.dependency],
        masked=sorted({*(positions[i] for i in masked_at), *(positions[p] for p in result.masked)}),
        omitted_reasoning=[positions[p] for p in result.omitted_reasoning],
        masking_saved=saved + result.masking_saved,
        decisions=[dataclasses.replace(d, unit=u) for u, (_, d) in enumerate(decisions)],
        stop=None,
    )
