"""What stays visible with masking: user turns and tool calls in the request, with and
without ``pp.Masking``, at budgets that are a share of the history's cost, and what warm
``HistoryIndex`` turns cost with masking against the same turns without it: the harness's
next turn (3 items), and the history's own last turns one after the other.

Used by ``benches/test_bench_masking.py`` (asserts the 2x bound on the warm index turn) and
``benches/report.py`` (the README's table). A history's *cost* is the tokens of its valid
units (what a pack with an unbounded budget keeps); the budget of a share ``s`` is
``s * cost`` plus the new input, with no output reserve, so the shares say how much of the
history can be sent.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import harness

SHARES = (0.05, 0.10, 0.25)

CALL_TYPES = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "tool_search_call",
        "mcp_call",
        "mcp_approval_request",
        "program",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
    }
)


def maskings() -> dict[str, Any]:
    """The settings compared: no masking, the builder's default, and masking every output
    older than the two newest turns."""
    import protoprompt

    return {
        "off": None,
        "masking": protoprompt.Masking(),
        "after 2 turns": protoprompt.Masking(after_turns=2),
    }


@dataclass
class Visible:
    """What one request holds."""

    user_turns: int
    tool_calls: int
    masked_outputs: int
    history_tokens: int
    used: int

    @property
    def tokens_per_turn(self) -> float | None:
        return self.history_tokens / self.user_turns if self.user_turns else None


def is_user(item: dict[str, Any]) -> bool:
    return item.get("role") == "user" and item.get("type") in (None, "message")


def visible(history: list[dict[str, Any]], result: Any) -> Visible:
    kept = [history[p] for p in result.kept_history]
    return Visible(
        user_turns=sum(1 for i in kept if is_user(i)),
        tool_calls=sum(1 for i in kept if i.get("type") in CALL_TYPES),
        masked_outputs=len(result.masked),
        history_tokens=result.history_tokens + result.dependency_tokens,
        used=result.used,
    )


def history_cost(history: list[dict[str, Any]], new_input: list[dict[str, Any]]) -> int:
    import protoprompt

    r = protoprompt.pack(history, new_input, 2**62, encoding=harness.ENCODING)
    return r.history_tokens + r.dependency_tokens


def budget_for(case: harness.Case, share: float) -> int:
    history = case.history()
    new_tokens = sum(_tokens(i) for i in case.new_input)
    return int(share * history_cost(history, case.new_input)) + new_tokens


def _tokens(item: dict[str, Any]) -> int:
    import protoprompt

    return protoprompt.item_tokens(item, encoding=harness.ENCODING).total


def pack_index(index: Any, history: list[Any], new_input: list[Any], budget: int, masking: Any):
    return index.pack(history, new_input, budget, encoding=harness.ENCODING, masking=masking)


def warm_setup(case: harness.Case, budget: int, masking: Any):
    """A warm round's untimed part: a new index packs the previous turn with the same
    masking (masked costs kept), then the current history is decoded afresh."""
    import protoprompt

    index = protoprompt.HistoryIndex()
    pack_index(index, case.prev_history(), case.prev_new_input, budget, masking)
    return index, case.history()


def time_warm(
    case: harness.Case, budget: int, masking: Any, rounds: int, stat: Any = statistics.median
) -> float:
    """Seconds of a warm index turn (fresh objects each round; the median by default)."""
    times = []
    for _ in range(rounds):
        index, history = warm_setup(case, budget, masking)
        t0 = time.perf_counter()
        pack_index(index, history, case.new_input, budget, masking)
        times.append(time.perf_counter() - t0)
    return float(stat(times))


def time_turns(case: harness.Case, budget: int, masking: Any, turns: int = 8) -> float:
    """Seconds of the last ``turns`` turns of the case's history packed one after the other
    through one ``HistoryIndex`` (each turn: the history up to its user message, that
    message as new input, fresh objects): a running session's warm turns over the mix's own
    turns, where the turns that move the whole/masked boundary into an older turn (and mask
    that turn's outputs for the first time) come at the mix's own rate."""
    import protoprompt

    history = case.history()
    starts = [i for i, item in enumerate(history) if is_user(item)][-turns:]
    index = protoprompt.HistoryIndex()
    pack_index(index, history[: starts[0]], [history[starts[0]]], budget, masking)
    total = 0.0
    for start in starts[1:]:
        fresh = case.history()
        t0 = time.perf_counter()
        pack_index(index, fresh[:start], [fresh[start]], budget, masking)
        total += time.perf_counter() - t0
    return total / (len(starts) - 1)


def measure(case: harness.Case, shares=SHARES, rounds: int = 3) -> list[dict[str, Any]]:
    """One row per share: what stays visible under each setting, and the warm index turn's
    time with each (``warm_<name>``: the fastest of ``rounds``, seconds)."""
    import protoprompt

    history = case.history()
    cost = history_cost(history, case.new_input)
    rows = []
    for share in shares:
        budget = budget_for(case, share)
        row: dict[str, Any] = {"label": case.label, "share": share, "budget": budget}
        row["cost"] = cost
        for name, m in maskings().items():
            r = protoprompt.pack(
                history, case.new_input, budget, encoding=harness.ENCODING, masking=m
            )
            row[name] = visible(history, r)
            row[f"warm_{name}"] = time_warm(case, budget, m, rounds, stat=min)
            row[f"turns_{name}"] = min(time_turns(case, budget, m) for _ in range(4))
        rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]], out: Any = None) -> None:
    import sys

    out = out or sys.stdout
    names = list(maskings())
    head = f"{'history':<16} {'budget':>10} " + " ".join(
        f"{n + ': turns/calls/masked':>34}" for n in names
    )
    print(head, file=out)
    for row in rows:
        cells = []
        for n in names:
            v: Visible = row[n]
            cells.append(f"{v.user_turns:>8}/{v.tool_calls:>6}/{v.masked_outputs:>6}")
        print(
            f"{row['label']:<16} {row['budget']:>10,} " + " ".join(f"{c:>34}" for c in cells),
            file=out,
        )


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table: per history and share, turns and calls sent, tokens per kept
    turn, and the warm index turn's time, without masking and with each setting."""
    names = list(maskings())
    header = ["history", "share", "budget"]
    for n in names:
        header += [f"{n}: turns", f"{n}: calls", f"{n}: masked"]
    header += [f"{n}: tokens/turn" for n in names]
    header += [f"{n}: warm index ms" for n in names if n == "off"]
    header += [f"{n}: x warm" for n in names if n != "off"]
    header += [f"{n}: ms/turn" for n in names if n == "off"]
    header += [f"{n}: x turns" for n in names if n != "off"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["label"], f"{row['share']:.0%}", f"{row['budget']:,}"]
        for n in names:
            v: Visible = row[n]
            cells += [str(v.user_turns), str(v.tool_calls), str(v.masked_outputs)]
        for n in names:
            per = row[n].tokens_per_turn
            cells.append("-" if per is None else f"{per:,.0f}")
        for kind in ("warm", "turns"):
            base = row[f"{kind}_off"]
            cells.append(f"{base * 1e3:.3f}")
            cells += [f"{row[f'{kind}_{n}'] / base:.2f}x" for n in names if n != "off"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
