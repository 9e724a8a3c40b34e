"""``protoprompt inspect``'s answer to: can the next turn of this stored session read a token
window (``ProtoPromptSession(windowed_reads=True)``), and if not, why not -- with the reasons
a turn's plan gives (``protoprompt.turn_report.READ_REASONS``)."""

from __future__ import annotations

import sqlite3
from typing import Any

from .._context._query import message_text
from ..packing import HistoryIndex, PackOptions
from ..turn_report import READ_REASONS, window_widened

__all__ = ["next_turn_window", "render_next_turn", "stored_snapshot_items"]

_SNAPSHOTS = "protoprompt_index_snapshots"
_PLACEHOLDER = {"role": "user", "content": "(the next question)"}


def stored_snapshot_items(conn: sqlite3.Connection, table: str, session_id: str) -> int | None:
    """Items of the session's stored index snapshot (``None``: none stored)."""
    try:
        row = conn.execute(
            f"SELECT length(row_ids) FROM {_SNAPSHOTS} WHERE messages_table = ? AND session_id = ?",
            (table, session_id),
        ).fetchone()
    except sqlite3.Error:
        return None  # no table: protoprompt never saved one here
    return int(row[0]) // 8 if row and isinstance(row[0], int) else None


def next_turn_window(
    items: list[Any],
    row_ids: list[int],
    options: PackOptions,
    *,
    new_input: list[Any],
    limited: bool,
    snapshot_items: int | None = None,
) -> dict[str, Any]:
    """Whether the next turn's read can be a token window, computed as a session computes
    it once its index holds the history (costs counted): its start, row and size, or the
    reason code and text; and the stored index snapshot a restarted process would start
    from (``snapshot_items``, see :func:`stored_snapshot_items`). ``options``: the turn's
    (its ``max_tokens``, ``output_reserve``, tokenizer and policy; its ``masking``, the
    builder's -- a session's default is ``Masking()`` -- makes old units cheaper and so the
    window longer: a masked pack's window may also reach further back, to a turn's user
    message). ``new_input``: the next turn's input (default: a user message)."""
    out: dict[str, Any] = {
        "windowed": False,
        "reason": None,
        "why": None,
        "start": None,
        "row": None,
        "items": None,
        "snapshot_items": snapshot_items,
    }

    def refuse(code: str, detail: str | None = None) -> dict[str, Any]:
        why = READ_REASONS[code] + (f": {detail}" if detail else "")
        out.update(reason=code, why=why)
        return out

    if limited:
        return refuse("session_limit")
    if options.policy != "contiguous":
        return refuse("greedy_policy")
    nxt = new_input or [_PLACEHOLDER]
    room = options.replace(max_tokens=max(options.max_tokens - options.output_reserve, 0))
    index = HistoryIndex()
    index.extend(items)
    index.count_window(items, options=room)
    window = index.window(nxt, options=room, new_input=len(nxt))
    start = min(window.start, len(items) - 1)
    if start <= 0:
        return refuse("fits") if window.fits else refuse("no_window", window.reason)
    if not any(message_text(i) is not None for i in [*nxt, *items[start:]]):
        return refuse("no_user_text")
    out.update(windowed=True, start=start, row=row_ids[start], items=len(items) - start)
    if window_widened(window, len(items)):
        out["why"] = f"the budget reaches {len(items) - window.reach:,}, widened: {window.reason}"
    return out


def render_next_turn(report: dict[str, Any], total: int) -> list[str]:
    """The report's lines for a terminal."""
    if report["windowed"]:
        line = (
            f"next turn windowed: yes, from row {report['row']} "
            f"({report['items']:,} of {total:,} items, with windowed_reads=True"
            + (f"; {report['why']})" if report["why"] else ")")
        )
    else:
        line = f"next turn windowed: no ({report['why']})"
    snapshot = report["snapshot_items"]
    if snapshot is None:
        note = "no index snapshot stored: a new process reads the whole history once"
    else:
        note = f"index snapshot stored: {snapshot:,} items (a restarted process starts from it)"
    return [line, note]
