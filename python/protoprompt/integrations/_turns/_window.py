"""Token windows: finding the runner's read before a turn (its frame on the stack) and
reading only the newest stored items that turn's budget can reach, with what the callback
needs to pack them as the whole history."""

from __future__ import annotations

import asyncio
import logging
from array import array
from typing import TYPE_CHECKING, Any, NamedTuple

from ..._context._query import message_text
from ...turn_report import window_widened
from .._sdk._names import ItemHelpers
from .._sdk._probes import PREPARE_CODE, runner_locals
from .._stores import _sync

if TYPE_CHECKING:
    from .._stores._snapshots import IndexState
    from .._stores._store import HistoryStore
    from ..session import ProtoPromptSession

_log = logging.getLogger("protoprompt")


class Turn:
    """What a session callback needs to know to window the read before it: its budget."""

    __slots__ = ("builder", "output_reserve", "session")

    def __init__(
        self, session: ProtoPromptSession, builder: Any, output_reserve: int | None
    ) -> None:
        self.session = session
        self.builder = builder
        self.output_reserve = output_reserve


class Refused(NamedTuple):
    """Why a read is not a token window: a code of ``protoprompt.turn_report.READ_REASONS``,
    more detail, and what the read did with the index snapshot (see ``IndexState.restore``)."""

    code: str
    detail: str | None = None
    snapshot: tuple[str, str | None] | None = None


TURN_ATTR = "_protoprompt_turn"
"""Attribute of a callback made by ``input_callback``: its ``Turn``."""


def runner_turn(session: ProtoPromptSession) -> tuple[Turn, list[Any]] | Refused:
    """When this ``get_items`` is the read of the runner's ``prepare_input_with_session``
    (0.22.3 and 0.24.0) for ``session`` whose result goes to a callback of this session that
    includes the history: that callback's ``Turn`` and the turn's new input, as the SDK
    makes it. Any other read (the user's, ``pop_item`` corrections, compaction, resuming a
    run, the retry clean-up) is refused (``not_runner``, or ``another_callback`` for a run
    whose callback is not this session's): it must see the whole history."""
    if PREPARE_CODE is None:
        return Refused("not_runner", "this SDK version is not known to protoprompt")
    scope = runner_locals(3)  # from get_items' caller on
    if scope is None:
        return Refused("not_runner")
    if scope.get("session") is not session:
        return Refused("not_runner", "the runner reads through another session")
    if not scope.get("include_history_in_prepared_input", False):
        return Refused("not_runner", "the run does not send the history")
    turn = getattr(scope.get("session_input_callback"), TURN_ATTR, None)
    if not isinstance(turn, Turn) or turn.session is not session:
        return Refused("another_callback")
    raw = scope.get("input")
    if not isinstance(raw, (str, list)):
        return Refused("not_runner", "the run's input is not a string or a list")
    try:
        new_items = list(ItemHelpers.input_to_new_input_list(raw))
    except Exception:  # noqa: BLE001 - the SDK will say what is wrong with it
        return Refused("not_runner", "the run's input cannot be read")
    return turn, new_items


def opaque_scale_of(builder: Any) -> float:
    """The calibration of opaque payloads ``builder`` packs with now (1.0 for a builder
    without one); the window must be found under the same one."""
    scale = getattr(builder, "opaque_scale", None)
    return float(scale()) if callable(scale) else 1.0


async def read_window(
    state: IndexState, store: HistoryStore, session_id: str, turn: Turn, new_items: list[Any]
) -> tuple[list[Any], _sync.ReadFacts] | Refused:
    """The newest items the turn's budget can reach and what the callback needs to pack
    them as the whole history, or why the whole history must be read (``Refused``): no
    index synced with the rows, the greedy policy, a gone row, rows changed before the
    window, no window smaller than the history (and which relation ties it together), no
    user message to recall from.

    The window comes from the index (in memory or its snapshot) and the rows appended
    after its last row, classified before anything is trusted (``HistoryIndex.window``);
    the store reads the rows and proves that the rows before the window are the index's
    (see ``_store``). The state's lock is only taken in worker threads, never on the event
    loop (which would stall every other session of the loop while a turn packs)."""
    builder = turn.builder
    if getattr(builder, "policy", None) != "contiguous":
        return Refused("greedy_policy")
    reserve = builder.output_reserve if turn.output_reserve is None else turn.output_reserve
    scale = opaque_scale_of(builder)
    options = builder.pack_options.replace(
        max_tokens=max(int(builder.max_tokens) - int(reserve), 0), opaque_scale=scale
    )

    def synced() -> tuple[tuple[str, str | None] | None, Any]:
        snapshot = state.restore()
        with state.lock:
            row_ids = state.row_ids
            n = len(state.index)
            if n < 2 or row_ids is None or len(row_ids) != n:
                return snapshot, None
            view = _sync.WindowView(row_ids[0], row_ids[-1], n, state.tag)
            return snapshot, (state.version, view)

    snapshot, found = await asyncio.to_thread(synced)
    if found is None:
        detail = snapshot[1] if snapshot is not None and snapshot[0] == "ignored" else None
        return Refused("first_turn", detail and f"snapshot ignored: {detail}", snapshot)
    version, view = found
    n = view.length
    chosen: list[Any] = []
    refused: list[Refused] = []

    def choose(appended: list[Any], rows: _sync.Rows) -> tuple[int, int] | None:
        with state.lock:
            row_ids = state.row_ids
            if state.version != version or row_ids is None:
                refused.append(Refused("changed", None, snapshot))
                return None
            try:
                window = state.index.window(
                    [*appended, *new_items], options=options, new_input=len(new_items)
                )
            except Exception as exc:  # noqa: BLE001 - the full read's pack reports it
                _log.debug("protoprompt: no window for %r: %s", session_id, exc)
                refused.append(Refused("no_window", f"an item cannot be read: {exc}", snapshot))
                return None
            w = window.start
            if w <= 0:
                if window.fits:
                    refused.append(Refused("fits", None, snapshot))
                else:
                    refused.append(Refused("no_window", window.reason, snapshot))
                return None
            w = min(w, n - 1)  # any earlier start packs the same; keep last_id's row
            total = n + len(appended)
            widened = window.reason if window_widened(window, total) else None
            chosen.append(w)
            chosen.append(array("q", row_ids[w : n - 1]))
            chosen.append((total - window.reach, widened))
            return w, int(row_ids[w])

    got = await store.read_window(view, choose)
    if isinstance(got, _sync.Gone):
        if refused:
            return refused[0]
        return Refused(got.code or "popped", got.detail, snapshot)
    head_items, tail_items, tail_rows, head_ids = got
    w, expected, (reached, widened) = chosen
    if head_ids != expected:  # a row of the window is gone: the index does not hold
        return Refused("popped", "a row of the window is gone", snapshot)
    window = head_items + tail_items
    if not any(message_text(i) is not None for i in new_items) and not any(
        message_text(i) is not None for i in window
    ):
        return Refused("no_user_text", None, snapshot)  # the recall query is before it
    window_ids = array("q", expected)
    window_ids.append(view.last_id)
    seen = _sync.Seen(version, n, tail_rows.ids_from(1), view.tag)
    facts = _sync.ReadFacts(
        len(window),
        False,
        0,
        True,
        seen,
        offset=w,
        window_ids=window_ids,
        opaque_scale=scale,
        snapshot=snapshot,
        reached=reached,
        widened=widened,
    )
    return window, facts


def window_keep(state: IndexState, facts: _sync.ReadFacts) -> tuple[int, _sync.RowIds] | None:
    """For a token window whose index changed after the read (another turn on a shared
    index ran in between): how many index items still hold for the window's history and
    the ids of the window's rows after them, or ``None`` when the rows before the window
    are no longer known to hold (caller holds the state's lock)."""
    w, ids = facts.offset, facts.window_ids
    row_ids = state.row_ids
    if (
        ids is None
        or facts.seen is None
        or row_ids is None
        or len(row_ids) != len(state.index)
        or len(row_ids) <= w
        or row_ids[w] != ids[0]
    ):
        return None
    lo, hi = w + 1, min(len(row_ids), w + len(ids))  # the prefix of lo holds (_sync)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if row_ids[mid - 1] == ids[mid - 1 - w]:
            lo = mid
        else:
            hi = mid - 1
    rest = array("q", ids[lo - w :])
    rest.extend(facts.seen.new_ids)
    return lo, rest
