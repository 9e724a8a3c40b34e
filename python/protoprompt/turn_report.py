"""How a session turn read and packed its history: every fast path it took, and where it did
not take one, why (``ContextPlan.turn``; ``ContextPlan.explain()`` prints it).

A :class:`~protoprompt.integrations.ProtoPromptSession` turn has four fast paths: a
*windowed read* (only the newest rows the budget can reach), the *index* (the history
classified and grouped in earlier turns, only what is new regrouped), the index *snapshot*
(a restarted process loads the index instead of reading the whole history) and the *count
store* (token counts of long texts kept in the database). Each is reported with one reason
from a fixed set (the ``*_REASONS`` tables below), so a fast path that is off is never silent.

The decisions here are pure functions of what the session observed, tested as tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .packing import HistoryWindow, IndexUse

__all__ = [
    "FALLBACK_FACTOR",
    "FALLBACK_MIN_ITEMS",
    "INDEX_REASONS",
    "READ_REASONS",
    "SNAPSHOT_STATES",
    "TurnReport",
    "fallback_cost",
    "index_outcome",
    "window_widened",
]

ReadMode = Literal["window", "full", "limit", "none"]
IndexMode = Literal["incremental", "rebuilt", "unused"]
SnapshotState = Literal["loaded", "ignored", "none_stored", "in_memory", "off"]
StoreState = Literal["on", "off", "failing"]

READ_REASONS: dict[str, str] = {
    "first_turn": "first turn on this database",
    "no_index": "no index",
    "windowed_reads_off": "windowed reads off (windowed_reads=False)",
    "memory_database": "memory database: windows need a database file",
    "inner_session": "an inner session whose rows protoprompt does not read",
    "greedy_policy": "greedy policy",
    "fits": "the budget reaches every stored item",
    "popped": "rows popped past the index",
    "rewritten": "rows changed before the window",
    "another_callback": "another callback",
    "not_runner": "not the runner's read",
    "no_window": "no window provable",
    "no_user_text": "no user message in the window or the new input",
    "changed": "the index changed during the read",
    "read_failed": "the rows could not be read",
    "session_limit": "a session limit",
}
"""Why a turn read the whole history (or the newest ``limit`` items) instead of a token
window. ``no_window`` comes with the relation that ties the newest items to the oldest (see
:attr:`protoprompt.plans.HistoryWindow.reason`)."""

INDEX_REASONS: dict[str, str] = {
    "new": "nothing indexed yet in this process and no snapshot loaded",
    "rows_replaced": "rows popped or replaced before the index's end",
    "pop_or_clear": "a pop or clear ran since the index was synced",
    "longer": "the index is longer than the history",
    "no_index": "no index",
    "not_the_read": "not the history the last read returned",
    "changed": "the index changed after the read",
    "read_failed": "the rows could not be read",
    "prefix": "the previous request extended (cache-stable prefix), through its own index",
}
"""Why a turn rebuilt its index from the whole history (``rebuilt``) or packed without it
(``unused``)."""

SNAPSHOT_STATES: dict[str, str] = {
    "loaded": "loaded",
    "ignored": "ignored",
    "none_stored": "none stored",
    "in_memory": "not needed (the index is in memory)",
    "off": "off",
}
"""What the turn did with the index snapshot kept in the database."""

FALLBACK_FACTOR = 10
"""A fallback is logged (once per session and reason, at INFO) when it reads or regroups
more than this many times the items the fast path would have ..."""
FALLBACK_MIN_ITEMS = 1000
"""... and at least this many items (below that both take about a millisecond)."""


def index_outcome(
    plan_code: str, use_index: bool, held: int, kept: int
) -> tuple[IndexMode, str | None]:
    """How a turn used its index, from the session's sync decision (``_sync.plan``: its
    ``code`` and ``use_index``), the items the index ``held`` before the turn and the
    items of it that still hold for the history (``kept``)."""
    if not use_index:
        return "unused", plan_code
    if kept == 0:
        if held == 0:
            return "rebuilt", "new"
        if plan_code in ("pop_or_clear", "longer"):
            return "rebuilt", plan_code
        return "rebuilt", "rows_replaced"
    return "incremental", None


def window_widened(window: HistoryWindow, history_len: int) -> bool:
    """Whether relations made a window far larger than the budget's reach (a fallback: more
    than :data:`FALLBACK_FACTOR` times the items, and at least :data:`FALLBACK_MIN_ITEMS`)."""
    return window.start > 0 and _worth(history_len - window.start, history_len - window.reach)


def fallback_cost(
    *,
    indexed: bool = True,
    read: ReadMode,
    read_reason: str | None,
    history_items: int,
    first_kept: int | None,
    index_use: IndexUse | None,
    new_items: int,
    read_items: int | None = None,
    reached_items: int | None = None,
) -> tuple[str, int, int] | None:
    """The costliest fallback of a turn worth a log: ``(what, items, fast items)`` when a
    fallback read or regrouped more than :data:`FALLBACK_FACTOR` times the items the fast
    path would have (and at least :data:`FALLBACK_MIN_ITEMS`), else ``None``.

    A full read costs the history's items; a window would have read those from the first
    kept one on. A regrouping costs the items it rebuilt; the fast path rebuilds the items
    the turn appended and the new input. Reads that are not fallbacks (the first turn, a
    history that fits, windowed reads turned off, a limit) are never worth a log, nor a read
    before anything was ``indexed`` (no window could have been read then)."""
    quiet = ("first_turn", "fits", "windowed_reads_off", "session_limit", "no_index")
    if read == "full" and indexed and read_reason not in quiet:
        fast = history_items - (first_kept if first_kept is not None else history_items)
        if _worth(history_items, fast):
            return "read", history_items, max(fast, 1)
    # A window widened by relations (``window_widened``): it read far more than the budget
    # reaches.
    widened = read == "window" and read_items is not None and reached_items is not None
    if widened and _worth(read_items or 0, reached_items or 0):
        return "read", read_items or 0, max(reached_items or 0, 1)
    if index_use is not None and index_use.reason is not None:
        fast = index_use.appended + new_items
        if _worth(index_use.regrouped, fast):
            return "regroup", index_use.regrouped, max(fast, 1)
    return None


def _worth(items: int, fast: int) -> bool:
    return items >= FALLBACK_MIN_ITEMS and items > FALLBACK_FACTOR * max(fast, 1)


@dataclass(frozen=True)
class TurnReport:
    """How one session turn read and packed its history (see the module notes)."""

    read: ReadMode
    """``"window"`` (only the newest rows), ``"full"`` (every row), ``"limit"`` (the newest
    ``limit`` items: a session setting) or ``"none"`` (the callback was handed a history
    that is not what this session's last read returned, e.g. a direct call)."""
    read_reason: str | None
    """Why not a window: a key of :data:`READ_REASONS` (``None`` for a window)."""
    read_detail: str | None
    """More about ``read_reason`` (for ``no_window``: the relation)."""
    history_items: int
    """Items of the whole stored history (as far as the turn knows it)."""
    read_items: int
    """Items the read returned (the window's, or the history's)."""
    window_row: int | None
    """Row id of the window's first item -- for a ``RedisSession``, its position in the
    list -- (``None`` unless ``read == "window"``)."""
    window_reach: int | None
    """Items the budget alone reaches (a window reads more when units or relations span
    further back; ``read_detail`` then names the relation when that made it
    :func:`window_widened`)."""
    index: IndexMode
    """``"incremental"``, ``"rebuilt"`` (from the whole history) or ``"unused"``."""
    index_reason: str | None
    """A key of :data:`INDEX_REASONS` when not incremental."""
    index_kept: int | None
    """For an incremental index that lost items first (rows popped or replaced): how many
    of the items it held still hold (``None``: all of them)."""
    index_held: int
    """Items the index held before the turn."""
    snapshot: SnapshotState
    """A key of :data:`SNAPSHOT_STATES`."""
    snapshot_detail: str | None
    """Items loaded, or why a snapshot was ignored or is off."""
    count_store: StoreState
    """``"on"``, ``"off"`` (no store: why in ``count_store_detail``) or ``"failing"``
    (its reads failed this turn: every count was made in the process)."""
    count_store_detail: str | None
    pack_index: IndexUse | None
    """What the pack reused and regrouped (:attr:`PackResult.index`)."""
    count_store_hits: int | None
    count_store_writes: int | None

    @property
    def windowed(self) -> bool:
        """The turn read a token window (the fast path of windowed reads)."""
        return self.read == "window"

    def read_line(self) -> str:
        if self.read == "window":
            line = (
                f"read: window from row {self.window_row} "
                f"({self.read_items:,} of {self.history_items:,} items"
            )
            if self.read_detail:
                line += f"; the budget reaches {self.window_reach or 0:,}, widened: "
                line += self.read_detail
            return line + ")"
        why = READ_REASONS.get(self.read_reason or "", self.read_reason or "")
        if self.read_detail:
            why += f": {self.read_detail}"
        if self.read == "limit":
            return f"read: limit (the newest {self.read_items:,} items: {why})"
        if self.read == "none":
            return "read: none (the history was handed over by the caller)"
        return f"read: full ({why}; {self.read_items:,} items)"

    def index_line(self) -> str:
        use = self.pack_index
        if self.index == "unused":
            return f"index: unused ({INDEX_REASONS.get(self.index_reason or '', '')})"
        if self.index == "rebuilt":
            why = INDEX_REASONS.get(self.index_reason or "", self.index_reason or "")
            items = f"; {use.appended:,} items classified" if use is not None else ""
            return f"index: rebuilt ({why}{items})"
        parts = []
        if self.index_kept is not None:
            parts.append(
                f"kept {self.index_kept:,} of {self.index_held:,} items: "
                f"{INDEX_REASONS['rows_replaced']}"
            )
        if use is not None:
            regroup = f"regrouped from position {use.regrouped_from:,}"
            if use.reason is not None:
                regroup += f": {use.reason}"
            parts.append(regroup)
            parts.append(f"{use.appended:,} items appended")
        return f"index: incremental ({'; '.join(parts)})"

    def snapshot_line(self) -> str:
        text = SNAPSHOT_STATES[self.snapshot]
        if self.snapshot_detail:
            text += f" ({self.snapshot_detail})"
        return f"snapshot: {text}"

    def count_store_line(self) -> str:
        if self.count_store == "off":
            return f"count store: off ({self.count_store_detail})"
        hits = self.count_store_hits or 0
        writes = self.count_store_writes or 0
        line = f"count store: {hits:,} hits, {writes:,} new counts"
        if self.count_store == "failing":
            line += f" (failing: {self.count_store_detail}; counted in this process)"
        elif self.count_store_detail:
            line += f" ({self.count_store_detail})"
        return line

    def lines(self) -> list[str]:
        """The report as lines for a person (``ContextPlan.explain`` prints them)."""
        return [self.read_line(), self.index_line(), self.snapshot_line(), self.count_store_line()]
