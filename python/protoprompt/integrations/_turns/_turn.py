"""One turn of the session callback: its plan through the index (or without it), what the
next token window is found from, the turn's report and a fallback's log line.

The session hands over its setup (:class:`TurnSetup`, values) and the facts of the read
that returned the turn's history; the index state changes only through its own methods.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from ..._context._plan import recall_position
from ..._tokens import item_tokens
from ...errors import InvalidItemError, ProtoPromptError, TokenBudgetExceededError
from ...turn_report import (
    IndexMode,
    ReadMode,
    SnapshotState,
    StoreState,
    TurnReport,
    fallback_cost,
    index_outcome,
)
from .. import pool
from .._calls import _planner
from .._stores import _sync, _turn_state
from ._context import context_key

if TYPE_CHECKING:
    from ...context import ContextPlan, TokenBudgetedContextBuilder
    from .._stores._snapshots import IndexState
    from .._stores._store import HistoryStore
    from ._evicted import SessionMemory

Item = Any

_log = logging.getLogger("protoprompt")


@dataclasses.dataclass(frozen=True)
class TurnSetup:
    """What a session contributes to one of its turns (read once, at the turn's start)."""

    session_id: str
    state: IndexState
    """The index state of the session (its pooled one once attached)."""
    incremental: bool
    windowed_reads: bool
    snapshot_min_items: int
    shared_key: pool.Key | None
    """The pool's key of the state (``None``: not pooled)."""
    shared_index_bytes: int
    store: HistoryStore | None
    no_store: str
    """Why nothing outlives the process, when there is no store."""
    window_keep: Callable[[_sync.ReadFacts], tuple[int, _sync.RowIds] | None]
    """What of the index still holds for a token window (``_window.window_keep``)."""


@dataclasses.dataclass(frozen=True)
class TurnCall:
    """One call of the session callback, as every step of its turn reads it: the session's
    setup, the builder, the history and new input handed over, the facts of the read that
    returned the history (``None``: not this session's read), ``build``'s keywords and the
    session's memory of evicted turns."""

    setup: TurnSetup
    builder: TokenBudgetedContextBuilder
    history: list[Item]
    new_input: list[Item]
    facts: _sync.ReadFacts | None
    kwargs: dict[str, Any]
    memory: SessionMemory | None = None
    request: Callable[[], _planner.RunPrefix | None] | None = None
    """The latest request a model filter of the session sent (``RunLedger.latest``, a
    newer stored one first), read when the turn's own request no longer fits."""

    @property
    def read_all(self) -> bool:
        """Whether the read of :attr:`facts` returned the whole ``history`` handed over."""
        return self.facts is not None and self.facts.count == len(self.history)

    def remembered(self, offset: int) -> TurnCall:
        """This call with ``kwargs`` as :func:`remembered` makes them."""
        if self.memory is None:
            return self
        return dataclasses.replace(
            self, kwargs=remembered(self.memory, self.kwargs, self.history, offset)
        )


def plan_turn(
    planner: _planner.TurnPlanner | None, call: TurnCall
) -> tuple[ContextPlan, Callable[[], None] | None]:
    """The plan of one turn (in a worker thread): :func:`build_stable_turn` through the
    callback's cache-stable prefix (``planner``), else :func:`build_turn`."""
    return build_turn(call) if planner is None else build_stable_turn(planner, call)


def remembered(
    memory: SessionMemory | None, kwargs: dict[str, Any], history: list[Item], offset: int
) -> dict[str, Any]:
    """``kwargs`` of a turn's ``build`` with what ``memory`` adds (the session, the turn's
    number, the summary); a failure there only loses the addition."""
    if memory is None:
        return kwargs
    try:
        return {**kwargs, **memory.prepare(history, offset)}
    except Exception as exc:  # noqa: BLE001 - recall is never worth a failed turn
        _log.warning("protoprompt: evicted turns not recalled this turn: %s", exc)
        return {**kwargs, "session_id": memory.session.session_id}


def observed(
    memory: SessionMemory,
    plan: ContextPlan,
    history: list[Item],
    offset: int,
    row_ids: Sequence[int] | None,
) -> Callable[[], None] | None:
    """What starts the background work on what the turn evicted (never raises)."""
    try:
        return memory.observe(plan, history, offset, row_ids)
    except Exception as exc:  # noqa: BLE001 - a later turn hands the rows over
        _log.warning("protoprompt: the rows this turn evicted are left to a later turn: %s", exc)
        return None


def _count_window(
    setup: TurnSetup,
    builder: Any,
    history: list[Item],
    offset: int,
    output_reserve: int | None,
    opaque_scale: float,
) -> None:
    """After a turn, count the costs the next token window is found from (caller holds
    the state's lock). A cost that cannot be counted keeps its lower bound: the next
    window is then larger, never wrong."""
    if not setup.windowed_reads or getattr(builder, "policy", None) != "contiguous":
        return
    reserve = builder.output_reserve if output_reserve is None else output_reserve
    try:
        options = builder.pack_options.replace(
            max_tokens=max(int(builder.max_tokens) - int(reserve), 0), opaque_scale=opaque_scale
        )
        setup.state.index.count_window(history, options=options, history_offset=offset)
    except Exception as exc:  # noqa: BLE001 - an item the request did not need
        _log.debug("protoprompt: window costs of %r not counted: %s", setup.session_id, exc)


def _build_indexed(
    call: TurnCall, facts: _sync.ReadFacts, keep: int, new_ids: _sync.RowIds | None = None
) -> ContextPlan:
    """Build through the index, of which the first ``keep`` items hold for the call's
    history (which holds the history from ``facts.offset`` on; caller holds the state's
    lock). ``new_ids``: the rows after those ``keep`` items (default: the read's new rows).
    A failed build leaves the index as it was after dropping what no longer holds."""
    setup, builder, history, kwargs = call.setup, call.builder, call.history, call.kwargs
    state = setup.state
    offset = facts.offset
    state.begin_build(keep, facts.epoch)
    try:
        if offset and getattr(builder, "calibration", None) is not None:
            # A token window is packed under the calibration it was found under.
            kwargs = {**kwargs, "opaque_scale": facts.opaque_scale}
        plan = builder.build(
            history, call.new_input, index=state.index, history_offset=offset, **kwargs
        )
        _count_window(
            setup, builder, history, offset, kwargs.get("output_reserve"), plan.pack.opaque_scale
        )
    finally:
        state.measure()
    seen = facts.seen
    added = None if seen is None else (seen.new_ids if new_ids is None else new_ids)
    tag = None if seen is None else seen.tag
    if not state.end_build(facts.epoch, added, tag, offset + len(history)):
        # Never reached: an index that does not add up is dropped (the next turn rebuilds).
        _log.warning(
            "protoprompt: the index of session %r did not add up after a turn and was "
            "dropped; the next turn reads and classifies the whole history",
            setup.session_id,
        )
    elif state.due(setup.snapshot_min_items):
        state.save_in_background()
    if setup.shared_key is not None:
        pool.account(setup.shared_key, state, setup.shared_index_bytes)
    return plan


def _extend_indexed(
    setup: TurnSetup,
    builder: Any,
    history: list[Item],
    facts: _sync.ReadFacts,
    keep: int,
    kwargs: dict[str, Any],
    new_ids: _sync.RowIds | None = None,
) -> None:
    """What :func:`_build_indexed` does to the index, without a pack: the index takes the
    items of ``history`` it does not hold yet (a turn that extended the previous request
    packs through its own index; the session's must still follow the rows, for the next
    token window and snapshot). Caller holds the state's lock."""
    state = setup.state
    offset = facts.offset
    state.begin_build(keep, facts.epoch)
    try:
        held = len(state.index)
        if held >= offset:
            state.index.extend(history[held - offset :])
        _count_window(
            setup, builder, history, offset, kwargs.get("output_reserve"), facts.opaque_scale
        )
    finally:
        state.measure()
    seen = facts.seen
    added = None if seen is None else (seen.new_ids if new_ids is None else new_ids)
    tag = None if seen is None else seen.tag
    if state.end_build(facts.epoch, added, tag, offset + len(history)) and state.due(
        setup.snapshot_min_items
    ):
        state.save_in_background()
    if setup.shared_key is not None:
        pool.account(setup.shared_key, state, setup.shared_index_bytes)


def follow_rows(
    setup: TurnSetup,
    builder: Any,
    history: list[Item],
    facts: _sync.ReadFacts | None,
    kwargs: dict[str, Any],
) -> tuple[IndexMode, str | None]:
    """The session's index after a turn that did not pack through it: extended by the
    rows it does not hold, as :func:`build_turn` would have (its outcome for the report)."""
    state = setup.state
    if not setup.incremental or facts is None:
        return "unused", "prefix"
    with state.lock:
        held = len(state.index)
        decision = _sync.plan(facts, state.synced(), len(history), state.epoch)
        if decision.use_index:
            kept = min(decision.keep, held)
            _extend_indexed(setup, builder, history, facts, decision.keep, kwargs)
            return index_outcome(decision.code, True, held, kept)
        if facts.offset and facts.count == len(history):
            kept_at = setup.window_keep(facts)
            if kept_at is None:
                return "unused", "prefix"
            _extend_indexed(setup, builder, history, facts, kept_at[0], kwargs, kept_at[1])
            return index_outcome("compared", True, held, min(kept_at[0], held))
    return "unused", "prefix"


def _window_kept(setup: TurnSetup, facts: _sync.ReadFacts) -> tuple[int, _sync.RowIds]:
    """For a token window whose index changed after the read (caller holds the state's
    lock): how much of the index still holds and the ids of the window's rows after it.
    The window holds only the newest items: the index must hold the rest, also when
    another turn changed it since the read."""
    kept = setup.window_keep(facts)
    if kept is None:
        raise ProtoPromptError(
            "the session's history changed between the read of its newest "
            "items and this turn's request (a pop or clear through another "
            "session object): run the turn again"
        )
    return kept


def _count_failures(store: Any) -> tuple[int, int]:
    """The count store's failed reads and ignored counts so far (for the turn's report)."""
    return getattr(store, "read_failures", 0), getattr(store, "ignored_counts", 0)


def build_turn(call: TurnCall) -> tuple[ContextPlan, Callable[[], None] | None]:
    """The plan of one turn (in a worker thread), with its report (``plan.turn``): through
    the index when the call's ``facts`` — of the last read of this task, by this session —
    say it returned the history and the index holds for it (see ``_sync.plan``), else
    packed without the index, which is then left as it is. With the call's ``memory`` (the
    builder recalls evicted turns or summarises them), also what starts the background work
    on what the turn evicted."""
    setup, history, facts, memory = call.setup, call.history, call.facts, call.memory
    state = setup.state
    failures = _count_failures(state.index.count_store)
    held = kept = 0
    plan: ContextPlan | None = None
    evicted: Callable[[], None] | None = None
    index: tuple[IndexMode, str | None] = ("unused", "no_index")
    if setup.incremental:
        with state.lock:
            held = len(state.index)
            decision = _sync.plan(facts, state.synced(), len(history), state.epoch)
            index = ("unused", decision.code)
            through: tuple[str, int, _sync.RowIds | None] | None = None
            if decision.use_index and facts is not None:
                kept = min(decision.keep, held)
                through = (decision.code, decision.keep, None)
            elif facts is not None and facts.offset and facts.count == len(history):
                kept, rest = _window_kept(setup, facts)
                through = ("compared", kept, rest)
            if through is not None and facts is not None:
                code, keep, new_ids = through
                plan = _build_indexed(call.remembered(facts.offset), facts, keep, new_ids)
                index = index_outcome(code, True, held, min(keep, held))
            if plan is not None and memory is not None and facts is not None:
                evicted = observed(memory, plan, history, facts.offset, state.row_ids)
    if plan is None:
        # Not the history our last read returned (a limit, a direct call, or the rows
        # could not be compared): packed without the index, which is left as it is.
        plan = call.builder.build(history, call.new_input, **call.remembered(0).kwargs)
        if memory is not None:
            evicted = observed(memory, plan, history, 0, None)
    report = _call_report(call, plan, index, (held, kept), failures)
    log_fallback(setup, report, plan, len(call.new_input))
    return _replaced(call.builder, plan, dataclasses.replace(plan, turn=report)), evicted


def _read_mode(
    setup: TurnSetup, facts: _sync.ReadFacts
) -> tuple[ReadMode, str | None, str | None, int | None]:
    """How the read behind a turn went: its mode, reason, detail and the window's row."""
    if facts.offset and facts.window_ids is not None:
        # A list has no row ids: its window starts at a position (Redis).
        keyed = setup.store is not None and setup.store.kind == "redis"
        row = facts.offset if keyed else int(facts.window_ids[0])
        return "window", None, facts.widened, row
    reason, detail = facts.no_window or (None, None)
    return ("limit" if facts.limited else "full"), reason, detail, None


def _store_state(
    setup: TurnSetup, store: Any, failures: tuple[int, int]
) -> tuple[StoreState, str | None]:
    """The count store's state for a turn's report, from its failures before the turn."""
    if store is None:
        return "off", setup.no_store if setup.store is None else setup.store.no_store
    if getattr(store, "read_failures", 0) > failures[0]:
        return "failing", getattr(store, "last_failure", None) or "its reads failed"
    if getattr(store, "ignored_counts", 0) > failures[1]:
        ignored = getattr(store, "ignored_counts", 0) - failures[1]
        return "on", f"{ignored:,} damaged counts ignored (counted again, rewritten)"
    return "on", None


def turn_report(
    setup: TurnSetup,
    plan: ContextPlan,
    facts: _sync.ReadFacts | None,
    history_len: int,
    index: tuple[IndexMode, str | None],
    held_kept: tuple[int, int],
    failures: tuple[int, int],
) -> TurnReport:
    """How this turn read and packed its history (see ``protoprompt.turn_report``):
    ``facts`` of the read that returned the ``history_len`` items (``None``: they were
    handed over otherwise), how the index was used, the items it held before the turn
    and how many of them still held, and the count store's failed reads and ignored
    counts before it."""
    state = setup.state
    held, kept = held_kept
    read: ReadMode = "none"
    reason: str | None = None
    detail: str | None = None
    n_items = read_items = history_len
    row: int | None = None
    snapshot = facts.snapshot if facts is not None else None
    if facts is not None:
        read_items = facts.count
        n_items = facts.offset + facts.count
        read, reason, detail, row = _read_mode(setup, facts)
    if snapshot is None and state.save_failure is not None:
        snapshot = ("in_memory", f"the last snapshot write failed: {state.save_failure}")
    if snapshot is None:
        if state.snapshot_at is None:
            snapshot = ("off", setup.no_store if setup.store is None else setup.store.no_store)
        elif held or plan.pack.index is not None:
            snapshot = ("in_memory", None)
        else:
            snapshot = ("none_stored", None)
    store_state, store_detail = _store_state(setup, state.index.count_store, failures)
    return TurnReport(
        read=read,
        read_reason=reason,
        read_detail=detail,
        history_items=n_items,
        read_items=read_items,
        window_row=row,
        window_reach=facts.reached if facts is not None else None,
        index=index[0],
        index_reason=index[1],
        index_kept=kept if index[0] == "incremental" and 0 < kept < held else None,
        index_held=held,
        snapshot=cast("SnapshotState", snapshot[0]),
        snapshot_detail=snapshot[1],
        count_store=store_state,
        count_store_detail=store_detail,
        pack_index=plan.pack.index,
        count_store_hits=plan.pack.count_store_hits,
        count_store_writes=plan.pack.count_store_writes,
    )


def _call_report(
    call: TurnCall,
    plan: ContextPlan,
    index: tuple[IndexMode, str | None],
    held_kept: tuple[int, int],
    failures: tuple[int, int],
) -> TurnReport:
    """:func:`turn_report` of a call's plan (the read's facts when it returned the whole
    history handed over)."""
    facts = call.facts if call.read_all else None
    return turn_report(call.setup, plan, facts, len(call.history), index, held_kept, failures)


def log_fallback(setup: TurnSetup, report: TurnReport, plan: ContextPlan, new_items: int) -> None:
    """Log, once per stored session and cause, a fallback that cost more than ten times
    the fast path (see ``turn_report.fallback_cost``)."""
    kept = plan.pack.kept_history
    cost = fallback_cost(
        indexed=report.index_held > 0 or report.snapshot == "loaded",
        read=report.read,
        read_reason=report.read_reason,
        history_items=report.history_items,
        first_kept=kept[0] if kept else None,
        index_use=report.pack_index,
        new_items=new_items,
        read_items=report.read_items,
        reached_items=report.window_reach,
    )
    if cost is None:
        return
    what, items, fast = cost
    line = report.read_line() if what == "read" else report.index_line()
    key = f"{what}:{report.read_reason if what == 'read' else 'regroup'}"
    if not setup.state.log_once(key):
        return
    _log.info(
        "protoprompt: session %r: this turn's %s took %d items where its fast path "
        "takes about %d (%s); logged once per session",
        setup.session_id,
        what,
        items,
        fast,
        line,
    )


# ------------------------------------------------------------------ the cache-stable prefix


def _context_text(plan: ContextPlan) -> str | None:
    message = plan.context_message
    return None if message is None else str(message.get("content"))


def _fits_whole(plan: ContextPlan) -> bool:
    """Whether a pack sent every history unit it could (nothing masked, nothing dropped
    for room)."""
    counts = plan.pack.decision_counts()
    return not plan.pack.masked and not any(
        counts.get(code) for code in ("masked", "over_budget", "turn_incomplete")
    )


def _replaced(builder: Any, plan: ContextPlan, new: ContextPlan) -> ContextPlan:
    """``new``, which replaces ``plan`` as the builder's ``last_plan`` when that is it."""
    if builder.last_plan is plan:
        builder.last_plan = new
    return new


def _stepped(
    plan: ContextPlan, step: _planner.TurnStep, builder: Any, report: TurnReport | None = None
) -> ContextPlan:
    turned = dataclasses.replace(
        plan,
        turn=plan.turn if report is None else report,
        prefix=step.code,
        prefix_reason=step.reason,
        shared_tokens=step.shared_tokens,
    )
    return _replaced(builder, plan, turned)


def _without_mark(plan: ContextPlan, extra: int, builder: Any) -> ContextPlan:
    """A move's plan without the tokens it reserved to pack to the low-water mark: what the
    request uses of the whole budget."""
    pack = plan.pack
    pack = dataclasses.replace(
        pack,
        used=pack.used - extra,
        remaining=pack.remaining + extra,
        context_tokens=pack.context_tokens - extra,
    )
    unmarked = dataclasses.replace(plan, pack=pack, reserved_tokens=plan.reserved_tokens - extra)
    return _replaced(builder, plan, unmarked)


def _stay(
    last: _planner.TurnPrefix,
    cand: list[Item],
    call: TurnCall,
    offset: int,
    what: str = "the previous request",
) -> ContextPlan | None:
    """The turn as the previous request plus what was stored since and the new input,
    packed through the prefix's own index; ``None`` when it does not fit whole (``what``:
    the request extended, in the plan's words)."""
    setup, builder, history = call.setup, call.builder, call.history
    state = setup.state
    failures = _count_failures(state.index.count_store)
    held = len(state.index)
    if call.memory is not None:
        with state.lock:
            call = call.remembered(offset)
    _planner.sync_index(last, cand)
    try:
        plan = builder.build(cand, call.new_input, index=last.index, masking=None, **call.kwargs)
    except TokenBudgetExceededError:
        return None
    if not _planner.sent_whole(plan.pack, cand):
        return None
    packed = plan
    if last.leading is not None and last.masked and not last.whole:
        last.whole = _masked_whole(packed, last, history, offset, builder)
    plan = _replaced(
        builder,
        packed,
        dataclasses.replace(plan, pack=_planner.in_history(plan.pack, last, history, offset)),
    )
    index = follow_rows(setup, builder, history, call.facts, call.kwargs)
    context = _context_text(plan)
    shared = last.request_tokens if context == last.context else 0
    if last.leading is not None and shared:
        shared = _leading_tokens(packed, last.leading)
    before = len(last.sent)
    _planner.after_stay(last, cand, history, offset, plan.pack.request_tokens, packed.pack)
    last.context = context
    last.leading = None  # the next turn extends this turn's request, all of it
    report = _call_report(call, plan, index, (held, held), failures)
    step = _planner.TurnStep(
        "stayed",
        f"the turn extends {what} ({before:,} history items as sent, {shared:,} tokens repeated)",
        shared,
    )
    return _stepped(plan, step, builder, report)


def _masked_whole(
    plan: ContextPlan,
    last: _planner.TurnPrefix,
    history: list[Item],
    offset: int,
    builder: Any,
) -> dict[int, int]:
    """The whole tokens of each unit of a stay's pack (``plan``, in the positions of its
    candidate) that holds copies of an adopted prefix (:func:`.._calls._planner.adopt`): its sent
    tokens with each copy counted as the stored item it stands for, by the unit's first
    history position (what :func:`.._calls._planner.in_history` reports as saved)."""
    ids = {id(x) for x in last.masked}

    def cost(item: Any) -> int:
        return item_tokens(item, encoding=builder.encoding).total

    whole: dict[int, int] = {}
    for d in plan.pack.decisions:
        at = [p for p in d.positions if p < len(last.sent) and id(last.sent[p]) in ids]
        if not at or d.tokens is None:
            continue
        extra = sum(cost(history[last.kept[p] - offset]) - cost(last.sent[p]) for p in at)
        whole[last.kept[d.positions[0]]] = d.tokens + extra
    return whole


def _leading_tokens(plan: ContextPlan, leading: int) -> int:
    """Tokens of ``plan``'s context message (as the pack counted it) and of the units among
    its first ``leading`` history items (a stay's pack, in the positions of its candidate)."""
    fixed = plan.context_tokens if plan.context_message is not None else 0
    return _planner.leading_tokens(plan.pack.decisions, leading, fixed)


def _move(
    planner: _planner.TurnPlanner, call: TurnCall
) -> tuple[ContextPlan, Callable[[], None] | None, float] | None:
    """The history packed to the move's mark (:meth:`~.._calls._planner.TurnPlanner.mark`, else the
    policy's ``low_water`` when the lowered mark cannot hold the mandatory part or would
    send no history), with the older tool outputs masked; the plan without the mark's
    reservation, and the mark. ``None``: neither mark can be reached."""
    budget = int(call.builder.max_tokens)
    marks = [planner.mark(budget)]
    if marks[0] < planner.policy.low_water:
        marks.append(float(planner.policy.low_water))
    for mark in marks:
        reserve = budget - max(int(budget * mark), 1)
        moved = {
            **call.kwargs,
            "context_tokens": int(call.kwargs.get("context_tokens", 0)) + reserve,
            "masking": planner.masking(),
        }
        try:
            plan, evicted = build_turn(dataclasses.replace(call, kwargs=moved))
        except (TokenBudgetExceededError, InvalidItemError):
            continue
        if mark < marks[-1] and call.history and not plan.pack.kept_history:
            continue  # the lowered mark would send no history at all: the policy's mark
        return _without_mark(plan, reserve, call.builder), evicted, mark
    return None


def _recall_after_head(plan: ContextPlan, end: int, builder: Any) -> ContextPlan:
    """``plan`` (a pack whose first ``end`` history items are the pinned head) with its
    recall message after the kept history, as without the head: the head is not history
    the new input depends on."""
    if plan.recall_at is None:
        return plan
    pack = plan.pack
    dep = [p for p in pack.dependency if p >= end]
    at = recall_position(dataclasses.replace(pack, dependency=dep))
    at += 1 if plan.context_message is not None else 0
    if at == plan.recall_at:
        return plan
    items = list(plan.items)
    message = items.pop(plan.recall_at)
    items.insert(at, message)
    return _replaced(builder, plan, dataclasses.replace(plan, items=items, recall_at=at))


def _head_move(
    planner: _planner.TurnPlanner, call: TurnCall, base: _planner.TurnPrefix, offset: int
) -> tuple[ContextPlan, Callable[[], None] | None, float, _planner.TurnPrefix, int] | None:
    """A move that keeps the head of ``base`` (the previous request, or the model's last
    one): its history from the cut, whole units as sent, up to ``CachePolicy.head`` of the
    budget, pinned ahead of the stored items after its last one, which are packed newest
    first to the mark with the older tool outputs masked (the middle is dropped); the
    attempts over heads and marks are :func:`.._calls._planner.head_move`'s. The plan reads
    as a pack of the stored history; with it what starts the work on what it evicted, the
    mark and the head as a prefix (for :func:`.._calls._planner.in_history`), and the
    tokens of the context message and the head it repeats (0 when the context message
    changed). ``None``: no head to keep."""
    builder, history = call.builder, call.history
    budget = int(builder.max_tokens)
    total = offset + len(history)
    if not base.kept or base.kept[0] < offset or base.end > total:
        return None
    low = float(planner.policy.low_water)
    fractions = [planner.mark(budget)]
    if fractions[0] < low:
        fractions.append(low)
    marks = {max(int(budget * f), 1): f for f in fractions}
    if call.memory is not None:
        with call.setup.state.lock:
            call = call.remembered(offset)
    masked_ids = {id(x) for x in base.masked}
    kwargs = call.kwargs

    def attempt(
        limit: int, mark: int
    ) -> _planner.HeadPacked[tuple[ContextPlan, _planner.TurnPrefix]] | int | None:
        end = _planner.head_end(base.sent, 0, len(base.sent), limit, builder.encoding, base.costs)
        if end == 0:
            return None
        head = base.sent[:end]
        after = base.kept[end - 1] + 1
        cand = [*head, *history[after - offset :]]
        moved = {
            **kwargs,
            "context_tokens": int(kwargs.get("context_tokens", 0)) + max(budget - mark, 0),
            "masking": planner.masking(),
            "pinned": range(end),
        }
        try:
            plan = builder.build(cand, call.new_input, **moved)
        except InvalidItemError:
            return 0
        except TokenBudgetExceededError as exc:
            return max(exc.used - exc.max_tokens, 1)
        if not all(a is b for a, b in zip(plan.pack.items[:end], head, strict=False)):
            return 0
        plan = _recall_after_head(plan, end, builder)
        prefix = _planner.TurnPrefix(
            sent=head,
            kept=base.kept[:end],
            end=after,
            originals=base.originals[: 16 * end],
            masked=[x for x in head if id(x) in masked_ids],
            request_tokens=0,
            context=None,
            whole=dict(base.whole),
            costs=base.costs,
        )
        fixed = None
        if _context_text(plan) == base.context:
            fixed = plan.context_tokens if plan.context_message is not None else 0
        return _planner.HeadPacked((plan, prefix), plan.pack, end, fixed)

    got = _planner.head_move(budget, planner.policy.head_share, list(marks), attempt)
    if got is None:
        return None
    plan, prefix = got.value
    pack = _planner.in_history(plan.pack, prefix, history, offset, ("kept", "mandatory"))
    plan = _replaced(builder, plan, dataclasses.replace(plan, pack=pack))
    plan = _without_mark(plan, max(budget - got.mark, 0), builder)
    evicted = None
    if call.memory is not None:
        evicted = observed(call.memory, plan, history, offset, None)
    return plan, evicted, min(marks.get(got.mark, low), low), prefix, got.shared


def build_stable_turn(
    planner: _planner.TurnPlanner, call: TurnCall
) -> tuple[ContextPlan, Callable[[], None] | None]:
    """:func:`build_turn` through the callback's cache-stable prefix (``planner``): the
    previous turn's request plus what was stored since while that fits the budget (the cut
    and the masked set stay); otherwise (or with no request to extend) the history is
    packed as :func:`build_turn` does when it fits whole, else once to the policy's
    low-water mark with every tool output older than its newest ``keep_recent`` turns
    masked, so the turns after it extend that request. A stay's plan reads as a pack of the
    stored history: the masked copies it sends again are ``"masked"`` (``plan.masked_items``,
    never to be stored). The planner's prefix is stored beside the history after each turn
    and a newer one stored by another process or worker is taken first
    (:mod:`.._stores._turn_state`). When the previous request plus what was stored since does not
    fit, the turn continues the latest request the session's model filter sent
    (``call.request()``: a filter that moved within the run sent a shorter one) when that
    plus what was stored since fits, before it moves (:func:`.._calls._planner.adopt`)."""
    with planner.lock:
        facts, history = call.facts, call.history
        offset = facts.offset if call.read_all and facts is not None else 0
        stored = _turn_state.of(call.setup.store)
        budget = int(call.builder.max_tokens)
        if stored is not None:
            # Another process or worker's newer request, when the history holds it.
            _turn_state.resume(planner, stored, budget, history, offset)
        got = _stable_turn(planner, call, offset)
        if stored is not None:
            found = _turn_state.of_planner(planner, budget, history, offset)
            if found is not None:
                stored.save(found)
        return got


def _own(item: Any) -> bool:
    """Whether a pinned item of a model request is a message the callback made (a context
    or recall message), not a stored one."""
    return context_key(item) is not None


def _stable_turn(
    planner: _planner.TurnPlanner, call: TurnCall, offset: int
) -> tuple[ContextPlan, Callable[[], None] | None]:
    """:func:`build_stable_turn`'s plan (caller holds the planner's lock; ``offset``: the
    history's first position)."""
    builder, history = call.builder, call.history
    last = planner.last
    if last is not None:
        got = _planner.turn_candidate(last, history, offset)
        if got is not None:
            stayed = _stay(last, got[0], call, offset)
            if stayed is not None:
                planner.stayed()
                return stayed, None
        else:
            last = None  # the history no longer holds it: set afresh
    previous = last
    if last is None:
        plan, evicted = build_turn(call)
        if _fits_whole(plan):
            planner.last = _planner.after_pack(plan.pack, history, offset, [], _context_text(plan))
            step = _planner.TurnStep("set", "the session's history fits whole: every item sent", 0)
            planner.moved(None)
            return _stepped(plan, step, builder), evicted
    sent = call.request() if call.request is not None else None
    found = None if sent is None else _planner.adopt(sent, history, offset, _own)
    if found is not None:
        cand = [*found.sent, *history[found.end - offset :]]
        adopted = _stay(found, cand, call, offset, "the model's last request")
        if adopted is not None:
            planner.last = found
            planner.stayed()
            return adopted, None
    if planner.policy.head_share > 0:
        base = found if found is not None else previous
        headed = None if base is None else _head_move(planner, call, base, offset)
        if headed is not None:
            plan, evicted, mark, head, shared = headed
            index = follow_rows(call.setup, builder, history, call.facts, call.kwargs)
            failures = _count_failures(call.setup.state.index.count_store)
            held = len(call.setup.state.index)
            report = _call_report(call, plan, index, (held, held), failures)
            masked = plan.masked_items
            new = _planner.after_pack(plan.pack, history, offset, masked, _context_text(plan))
            before = None if previous is None else previous.request_tokens
            lowered = mark if mark < planner.policy.low_water - 0.005 else None
            reason = _planner.head_move_reason(
                previous, new, before, lowered, len(head.sent), shared
            )
            step = _planner.TurnStep("moved" if previous is not None else "set", reason, shared)
            planner.last = new
            planner.moved(new.request_tokens)
            return _stepped(plan, step, builder, report), evicted
    got_move = _move(planner, call)
    if got_move is None:
        # The mandatory part needs more than the mark, or a window read cannot reach
        # what the masked pack would keep: newest first at the whole budget.
        plan, evicted = build_turn(call)
        planner.last = None
        planner.moved(None)
        step = _planner.TurnStep(
            "set", "the low-water mark cannot be reached: packed newest first", 0
        )
        return _stepped(plan, step, builder), evicted
    plan, evicted, mark = got_move
    new = _planner.after_pack(plan.pack, history, offset, plan.masked_items, _context_text(plan))
    before = None if previous is None else previous.request_tokens
    lowered = mark if mark < planner.policy.low_water - 0.005 else None
    reason = _planner.turn_move_reason(previous, new, before, lowered)
    step = _planner.TurnStep("moved" if previous is not None else "set", reason, 0)
    planner.last = new
    planner.moved(new.request_tokens)
    return _stepped(plan, step, builder), evicted
