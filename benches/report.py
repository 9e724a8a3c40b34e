"""Readable benchmark report: protoprompt vs the Agents SDK's own per-turn work.

    python benches/report.py [--sizes 1000,10000] [--budgets 8000,128000,400000]
                             [--mix agentic] [--db path/to/sdk_session.db --session-id ID]
                             [--no-turns]

Per history size and budget it prints: the SDK's per-turn overhead
(``prepare_input_with_session`` with a pass-through callback on a file ``SQLiteSession``),
protoprompt's cold pack (first call in a fresh process), warm pack (previous turn packed
in the same process by ``protoprompt.pack``) and index warm pack (the same turn through a
``HistoryIndex`` that holds the previous turn's history — what ``ProtoPromptSession`` does)
in ms and as % of the SDK overhead, the pure-Python reference packer
(real tiktoken) cold/warm and protoprompt's speed-up over it, the peak RSS growth of one pack
call relative to the history's JSON size, and whether protoprompt kept exactly the items the
reference kept. Then token-counting throughput for 1 and 2 threads. With ``--db`` the same
measurements run on a copy of your own ``SQLiteSession`` database (the file is not modified).

Use a release build of the extension for meaningful numbers::

    cargo build -p protoprompt-python --release --features pyo3/extension-module
    cp target/release/lib_core.so python/protoprompt/_core.abi3.so
    PYTHONPATH=python python benches/report.py --sizes 1000,10000

What each column measures is documented in ``benches/harness.py``. Exit status 1 when
protoprompt and the reference packer disagree on a case, or a whole-turn target
(``harness.WHOLE_TURN_TARGETS``) is missed.

``--markdown benches/README.md`` also writes the run's tables there (the file is generated:
run this again rather than editing it), and ``--readme README.md`` replaces the short table
between the ``<!-- bench-summary -->`` markers of the project README with this run's.
``REPORT=1 scripts/bench.sh`` builds the release extension and does both.
"""

from __future__ import annotations

import argparse
import datetime
import io
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
import masking  # noqa: E402
import retention  # noqa: E402


class Progress:
    """One status line on stderr (rewritten in place on a terminal)."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total, self.done, self.enabled = total, 0, enabled
        self.t0 = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, what: str) -> None:
        if not self.enabled:
            return
        elapsed = time.perf_counter() - self.t0
        line = f"[{self.done + 1}/{self.total}] {elapsed:6.1f}s  {what}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line)
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        self.done += 1

    def finish(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


def _ints(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


def _pct(a: float | None, b: float | None, digits: int = 1) -> str:
    return "-" if a is None or not b else f"{100 * a / b:.{digits}f}%"


def _ms3(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.3f}"


def _x(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:,.1f}x"


def _mb(n: float | None, digits: int = 1) -> str:
    return "-" if n is None else f"{n / 1e6:.{digits}f}"


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def measure_case(
    case: harness.Case,
    budgets: list[int],
    args,
    progress: Progress,
    workdir: str,
    db_copy: str | None = None,
) -> list[dict]:
    progress.step(f"{case.label}: SDK overhead ({args.rounds} rounds)")
    if db_copy:
        sdk = harness.SdkOverhead(
            case.history(), workdir, db_path=db_copy, session_id=args.session_id
        )
    else:
        sdk = harness.SdkOverhead(case.history(), workdir)
    try:
        sdk_s = _median(sdk.time(case.new_input, rounds=args.rounds))
        session_cold, session_restart = {}, {}
        sid = args.session_id if db_copy else "bench"
        for budget in budgets:
            progress.step(
                f"{case.label} budget={budget}: first turn of a fresh process "
                "through ProtoPromptSession"
            )
            session_cold[budget] = harness.run_session_child(
                sdk.db_path, sid, case.new_input, budget
            )
            progress.step(
                f"{case.label} budget={budget}: the same after a restart "
                f"({harness.stored_counts(sdk.db_path)} token counts kept)"
            )
            session_restart[budget] = harness.run_session_child(
                sdk.db_path, sid, case.new_input, budget, restart=True, warm_turn=True
            )
    finally:
        sdk.close()
    rows = []
    for budget in budgets:
        progress.step(f"{case.label} budget={budget}: fresh process (cold, warm, memory)")
        first = harness.run_child(
            case,
            budget,
            workdir,
            reference=not args.no_reference,
            warm_rounds=args.rounds,
            memory=True,
        )
        children = [first]
        for i in range(args.cold_rounds - 1):
            progress.step(f"{case.label} budget={budget}: cold run {i + 2}/{args.cold_rounds}")
            children.append(
                harness.run_child(case, budget, workdir, reference=not args.no_reference)
            )
        row = {
            "case": case.label,
            "items": case.n_items,
            "json": case.json_bytes,
            "budget": budget,
            "reserve": harness.output_reserve_for(budget),
            "kept": len(first["pp_kept"]),
            "sdk": sdk_s,
            "pp_cold": min(c["pp_cold_s"] for c in children),
            "pp_warm": _median(first["pp_warm_s"]),
            "pp_index": _median(first["pp_index_warm_s"]),
            "pp_import": first["pp_import_s"],
            "mem_cold": first.get("pp_cold_peak_bytes"),
            "mem_warm": first.get("pp_warm_peak_bytes"),
            "mem_index": first.get("pp_index_warm_peak_bytes"),
            "mem_method": first.get("memory_method"),
            "session_cold": session_cold[budget]["session_cold_callback_s"],
            "session_restart": session_restart[budget]["session_cold_callback_s"],
            "session_warm": session_restart[budget]["session_warm_s"],
            "mem_session": session_cold[budget].get("session_cold_peak_bytes"),
            "mem_restart": _sum_known(
                session_restart[budget].get("session_cold_peak_bytes"),
                session_restart[budget].get("session_restore_peak_bytes"),
            ),
        }
        if not args.no_reference:
            row.update(
                ref_cold=min(c["ref_cold_s"] for c in children),
                ref_warm=_median(first["ref_warm_s"]),
                ref_vocab=first["ref_vocab_s"],
                same=all(
                    c["pp_kept"] == c["ref_kept"] and c["pp_totals"] == c["ref_totals"]
                    for c in children
                ),
            )
            if not row["same"]:
                a, b = set(first["pp_kept"]), set(first["ref_kept"])
                row["diff"] = (
                    f"protoprompt-only {sorted(a - b)[:8]}, reference-only "
                    f"{sorted(b - a)[:8]}, totals pp {first['pp_totals']} "
                    f"ref {first['ref_totals']}"
                )
        rows.append(row)
    return rows


def _sum_known(*values: int | None) -> int | None:
    known = [max(v, 0) for v in values if v is not None]
    return sum(known) if known else None


def _print_cols(cols: list, rows: list[dict], out, first_left: bool) -> None:
    """A plain-text table: a header, a rule, one line a row; numbers right-aligned."""
    cells = [[name for name, _ in cols]] + [[f(r) for _, f in cols] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    for j, row in enumerate(cells):
        line = "  ".join(
            c.ljust(w) if i == 0 and first_left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths))
        )
        print(line, file=out)
        if j == 0:
            print("  ".join("-" * w for w in widths), file=out)


#: The per-case columns: the text table shows them all, the markdown tables a selection.
_CASE_COLS = [
    ("history", lambda r: r["case"]),
    ("items", lambda r: f"{r['items']:,}"),
    ("JSON MB", lambda r: _mb(r["json"])),
    ("budget", lambda r: f"{r['budget']:,}"),
    ("kept", lambda r: f"{r['kept']:,}"),
    ("SDK ms", lambda r: harness.ms(r["sdk"])),
    ("pp cold ms", lambda r: harness.ms(r["pp_cold"])),
    ("pp warm ms", lambda r: harness.ms(r["pp_warm"])),
    ("index warm ms", lambda r: _ms3(r.get("pp_index"))),
    ("cold/SDK", lambda r: _pct(r["pp_cold"], r["sdk"])),
    ("warm/SDK", lambda r: _pct(r["pp_warm"], r["sdk"])),
    ("index/SDK", lambda r: _pct(r.get("pp_index"), r["sdk"], 3)),
    ("ref cold ms", lambda r: harness.ms(r.get("ref_cold"))),
    ("ref warm ms", lambda r: harness.ms(r.get("ref_warm"))),
    ("x cold", lambda r: _x(r.get("ref_cold"), r["pp_cold"])),
    ("session cold ms", lambda r: harness.ms(r.get("session_cold"))),
    ("x session cold", lambda r: _x(r.get("ref_cold"), r.get("session_cold"))),
    ("restart ms", lambda r: harness.ms(r.get("session_restart"))),
    ("x restart", lambda r: _x(r.get("ref_cold"), r.get("session_restart"))),
    ("session warm ms", lambda r: _ms3(r.get("session_warm"))),
    ("session warm/SDK", lambda r: _pct(r.get("session_warm"), r["sdk"], 3)),
    ("x warm", lambda r: _x(r.get("ref_warm"), r["pp_warm"])),
    ("x index", lambda r: _x(r.get("ref_warm"), r.get("pp_index"))),
    ("peak cold MB", lambda r: _mb(r["mem_cold"])),
    ("peak warm MB", lambda r: _mb(r["mem_warm"], 2)),
    ("warm/JSON", lambda r: _pct(r["mem_warm"], r["json"])),
    ("index warm MB", lambda r: _mb(r.get("mem_index"), 2)),
    ("cold/JSON", lambda r: _pct(r["mem_cold"], r["json"])),
    ("session peak MB", lambda r: _mb(r.get("mem_session"))),
    ("session/JSON", lambda r: _pct(r.get("mem_session"), r["json"])),
    ("restart peak MB", lambda r: _mb(r.get("mem_restart"))),
    ("restart/JSON", lambda r: _pct(r.get("mem_restart"), r["json"])),
    ("same", lambda r: {True: "yes", False: "NO"}.get(r.get("same"), "-")),
]
_CASE_COL = dict(_CASE_COLS)


def print_table(rows: list[dict], out=sys.stdout) -> None:
    _print_cols(_CASE_COLS, rows, out, first_left=True)
    for r in rows:
        if r.get("diff"):
            print(f"  ! {r['case']} budget={r['budget']}: {r['diff']}", file=out)


def _targets(row: dict) -> str:
    """The whole-turn targets of the row's size (harness.WHOLE_TURN_TARGETS), met or not."""
    parts = []
    for name, (measured, target, met) in harness.turn_targets(row).items():
        if name == "first":
            shown = f"first {100 * measured:.0f}% <= {100 * target:.0f}%"
        else:
            shown = f"{name} {measured:,.0f}x >= {target:.0f}x"
        parts.append(shown + ("" if met else " MISSED"))
    return ", ".join(parts) or "-"


def print_turns(turns: list[dict], out=sys.stdout) -> None:
    """The whole-turn table: seconds per SDK turn at 128k, and the ratios to the SDK alone."""
    cols = [
        ("items", lambda r: f"{r['items']:,}"),
        ("SDK first s", lambda r: f"{r['sdk_first']:.2f}"),
        ("SDK next s", lambda r: f"{r['sdk_next']:.2f}"),
        (
            "full first/next/restart s",
            lambda r: f"{r['full_first']:.2f} / {r['full_next']:.2f} / {r['full_restart']:.2f}",
        ),
        (
            "windowed first/next/restart s",
            lambda r: (
                f"{r['windowed_first']:.2f} / {r['windowed_next']:.3f} / "
                f"{r['windowed_restart']:.2f}"
            ),
        ),
        ("SDK/windowed next", lambda r: _x(r["sdk_next"], r["windowed_next"])),
        ("SDK/windowed restart", lambda r: _x(r["sdk_next"], r["windowed_restart"])),
        ("windowed first/SDK first", lambda r: _pct(r["windowed_first"], r["sdk_first"], 0)),
        ("items read", lambda r: f"{max(r['windowed_read_items']):,}"),
        ("same", lambda r: "yes" if r["same"] else "NO"),
        ("targets", _targets),
    ]
    _print_cols(cols, turns, out, first_left=False)


def measure_index_sizes(cases: list[harness.Case]) -> list[dict]:
    """Resident size of a ``HistoryIndex`` over each case (``nbytes``) and of its snapshot
    after a pack has counted the kept items (the figures the docstrings point here for)."""
    import protoprompt as pp

    out = []
    for case in cases:
        index = pp.HistoryIndex()
        index.pack(
            case.history(),
            case.new_input,
            128_000,
            output_reserve=harness.output_reserve_for(128_000),
            encoding=harness.ENCODING,
        )
        snapshot = index.snapshot()
        out.append(
            {
                "case": case.label,
                "items": len(index),
                "json": case.json_bytes,
                "nbytes": index.nbytes,
                "snapshot": len(snapshot),
            }
        )
    return out


def print_index_sizes(sizes: list[dict], out=sys.stdout) -> None:
    print(
        f"{'history':<18} {'items':>9} {'index MB':>9} {'KB/item':>8} {'of JSON':>8} "
        f"{'snapshot MB':>12} {'KB/item':>8}",
        file=out,
    )
    for r in sizes:
        print(
            f"{r['case']:<18} {r['items']:>9,} {r['nbytes'] / 1e6:>9.1f} "
            f"{r['nbytes'] / r['items'] / 1e3:>8.2f} {_pct(r['nbytes'], r['json']):>8} "
            f"{r['snapshot'] / 1e6:>12.1f} {r['snapshot'] / r['items'] / 1e3:>8.2f}",
            file=out,
        )


# ------------------------------------------------------------------------------- markdown

_MARKDOWN_INTRO = """\
# Benchmarks

<!-- Generated by `python benches/report.py --markdown benches/README.md` (run by
`REPORT=1 scripts/bench.sh`). Do not edit: run it again. -->

Two entry points, both on an optimised build (`scripts/bench.sh` makes one in `target/bench`):

* `scripts/bench.sh`: the pytest-benchmark suite in `benches/` (`test_bench_*.py`). Each
  benchmark asserts that protoprompt's result is correct (against the pure-Python reference
  packer in `benches/reference_packer.py`, with the same tokenizer) and reports its time as
  a ratio to a reference measured in the same run: the SDK's own per-turn work, the
  reference packer, tiktoken. `scripts/test.sh` runs it once per CI run.
* `python benches/report.py`: the tables below, for generated histories or your own
  `SQLiteSession` database (`--db path --session-id ID`, on a copy).

What the columns mean (details in `benches/harness.py`):

* **SDK**: the SDK's own per-turn work, `prepare_input_with_session` with a pass-through
  callback on a file `SQLiteSession` (reading and decoding the history).
* **pp cold**: the first `pp.pack` of a fresh process (tokenizer build included);
  **pp warm**: `pp.pack` of the next turn in the same process (fresh item objects);
  **index warm**: the same turn through a `HistoryIndex` that holds the previous turn.
* **session cold**: what `ProtoPromptSession` adds to the first turn it ever serves on the
  database (callback + `get_items` beyond the SDK's read); **restart**: the same in a new
  process that finds the index snapshot and token counts in the database; **session warm**:
  the next turn of the running session.
* **ref**: the pure-Python reference packer (real tiktoken), cold and warm; **x** columns are
  its time over protoprompt's.
* **peak**: growth of the peak RSS during one call; **/JSON**: as a share of the history's
  JSON size.
* **index** / **snapshot**: `HistoryIndex.nbytes` and `len(HistoryIndex.snapshot())` after a
  pack at a 128k budget.

Timings on a shared virtual machine drift by ±30-40% between runs; compare ratios measured in
the same run, not absolute times across runs.
"""


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _md_times(rows: list[dict]) -> str:
    header = [
        "history",
        "budget",
        "kept",
        "SDK ms",
        "pp cold ms",
        "pp warm ms",
        "index warm ms",
        "session cold ms",
        "restart ms",
        "session warm ms",
        "ref cold ms",
        "ref warm ms",
        "x cold",
        "x warm",
        "x index",
        "same",
    ]
    return _md_table(header, [[_CASE_COL[h](r) for h in header] for r in rows])


def _md_memory(rows: list[dict]) -> str:
    header = [
        "history",
        "JSON MB",
        "budget",
        "peak cold MB",
        "cold/JSON",
        "peak warm MB",
        "index warm MB",
        "session peak MB",
        "session/JSON",
        "restart peak MB",
        "restart/JSON",
    ]
    return _md_table(header, [[_CASE_COL[h](r) for h in header] for r in rows])


def _md_sizes(sizes: list[dict]) -> str:
    header = [
        "history",
        "items",
        "index MB",
        "index KB/item",
        "index/JSON",
        "snapshot MB",
        "snapshot KB/item",
    ]
    body = [
        [
            r["case"],
            f"{r['items']:,}",
            f"{r['nbytes'] / 1e6:.1f}",
            f"{r['nbytes'] / r['items'] / 1e3:.2f}",
            _pct(r["nbytes"], r["json"]),
            f"{r['snapshot'] / 1e6:.1f}",
            f"{r['snapshot'] / r['items'] / 1e3:.2f}",
        ]
        for r in sizes
    ]
    return _md_table(header, body)


def _span(values: list[str]) -> str:
    """'a' or 'a-b' of a column's values, in the order measured (smallest budget first)."""
    values = [v for v in values if v != "-"]
    if not values:
        return "-"
    return (
        values[0]
        if min(values) == max(values)
        else f"{min(values, key=_num)}-{max(values, key=_num)}"
    )


def _num(text: str) -> float:
    return float(text.rstrip("x%").replace(",", ""))


def md_summary(rows: list[dict]) -> str:
    """The README's short table: the largest history of the run, every budget as a range."""
    if not rows:
        return ""
    largest = max(rows, key=lambda r: r["items"])
    rs = [r for r in rows if r["case"] == largest["case"]]
    sdk = _span([harness.ms(r["sdk"]) for r in rs])
    budgets = _span([f"{r['budget']:,}" for r in rs])
    header = [
        f"{largest['items']:,} items ({_mb(largest['json'], 0)} MB JSON), budgets {budgets}",
        "protoprompt ms",
        f"share of the SDK's own per-turn work ({sdk} ms)",
        "vs the pure-Python reference packer",
    ]
    body = [
        [
            "next turn of a running `ProtoPromptSession`",
            _span([_ms3(r.get("session_warm")) for r in rs]),
            _span([_pct(r.get("session_warm"), r["sdk"], 3) for r in rs]),
            "-",
        ],
        [
            "warm turn through `HistoryIndex`",
            _span([_ms3(r.get("pp_index")) for r in rs]),
            _span([_pct(r.get("pp_index"), r["sdk"], 3) for r in rs]),
            _span([_x(r.get("ref_warm"), r.get("pp_index")) for r in rs]) + " faster",
        ],
        [
            "first turn of a restarted process (snapshot and counts in the database)",
            _span([harness.ms(r.get("session_restart")) for r in rs]),
            _span([_pct(r.get("session_restart"), r["sdk"], 3) for r in rs]),
            _span([_x(r.get("ref_cold"), r.get("session_restart")) for r in rs]) + " faster",
        ],
        [
            "cold `pp.pack` (fresh process, tokenizer build included)",
            _span([harness.ms(r["pp_cold"]) for r in rs]),
            _span([_pct(r["pp_cold"], r["sdk"]) for r in rs]),
            _span([_x(r.get("ref_cold"), r["pp_cold"]) for r in rs]) + " faster",
        ],
    ]
    return _md_table(header, body)


COSTS_ITEMS = 2_000
COSTS_BUDGET = 128_000


def measure_opaque_costs(args, progress: Progress) -> dict | None:
    """Per item kind, the cost of a reasoning-heavy history under cost rule 1 (base64 as text)
    and rule 2 (decoded size), and the turns a 128k budget keeps under each
    (``benches/opaque_costs.py``)."""
    import opaque_costs
    from history_gen import generate, new_user_message

    progress.step(f"opaque payloads: {args.mix} history of {COSTS_ITEMS:,} items, both rules")
    items = opaque_costs.realistic(generate(COSTS_ITEMS, args.mix, args.seed), seed=args.seed)
    reserve = harness.output_reserve_for(COSTS_BUDGET)
    return {
        "mix": args.mix,
        "kinds": opaque_costs.kind_costs(items),
        "turns": opaque_costs.turns_kept(
            items, [new_user_message(args.seed)], COSTS_BUDGET, reserve
        ),
        "reserve": reserve,
    }


def md_opaque_costs(costs: dict) -> str:
    kinds = costs["kinds"]
    total = kinds[-1]
    header = [
        "kind",
        "items",
        "as text (rule 1)",
        "decoded size (rule 2)",
        "rule 1 / rule 2",
        "Codex estimate",
        "tiktoken of the JSON",
        "share (rule 1 -> 2)",
    ]
    body = [
        [
            k.kind,
            f"{k.items:,}",
            f"{k.rule1:,}",
            f"{k.rule2:,}",
            f"{k.shrink:.2f}x",
            f"{k.codex:,}",
            f"{k.json:,}",
            f"{_pct(k.rule1, total.rule1, 0)} -> {_pct(k.rule2, total.rule2, 0)}",
        ]
        for k in kinds
        if k.rule1 != k.rule2 or k.kind == "all" or k.rule1 >= total.rule1 // 20
    ]
    t = costs["turns"]
    return (
        _md_table(header, body)
        + "\nKinds whose cost is the same under both rules and under 5% of the total are "
        f"left out. A {t.budget:,}-token budget (output reserve {costs['reserve']:,}, "
        f"contiguous policy) keeps **{t.rule2} of {t.turns} turns** ({t.rule2_items} items) "
        f"under rule 2 against {t.rule1} turns ({t.rule1_items} items) under rule 1: "
        f"{t.rule2 - t.rule1:+d} turns ({_pct(t.rule2 - t.rule1, t.rule1, 0)} more).\n"
    )


def print_opaque_costs(costs: dict, out=sys.stdout) -> None:
    print(
        f"opaque payloads ({costs['mix']} mix, {COSTS_ITEMS:,} items; tokens per kind, "
        "rule 1 = base64 as text, rule 2 = decoded size):",
        file=out,
    )
    print(
        f"{'kind':<30} {'items':>6} {'rule 1':>10} {'rule 2':>10} {'1/2':>6} "
        f"{'Codex':>10} {'JSON':>10}",
        file=out,
    )
    for k in costs["kinds"]:
        print(
            f"{k.kind:<30} {k.items:>6,} {k.rule1:>10,} {k.rule2:>10,} {k.shrink:>5.2f}x "
            f"{k.codex:>10,} {k.json:>10,}",
            file=out,
        )
    t = costs["turns"]
    print(
        f"turns kept at {t.budget:,}: rule 1 {t.rule1} ({t.rule1_items} items), rule 2 "
        f"{t.rule2} ({t.rule2_items} items) of {t.turns}",
        file=out,
    )


def write_markdown(
    path: str,
    meta: str,
    rows: list[dict],
    sizes: list[dict],
    counting: list[harness.Throughput],
    turns: list[dict],
    costs: dict | None = None,
    masked: list[dict] | None = None,
) -> None:
    parts = [_MARKDOWN_INTRO, "## This run\n", meta + "\n"]
    if rows:
        parts += [
            "## Summary (the README's table)\n",
            md_summary(rows),
            "## Time per turn\n",
            _md_times(rows),
            "## Memory\n",
            _md_memory(rows),
        ]
    if turns:
        text = io.StringIO()
        print_turns(turns, out=text)
        parts += [
            "## Whole SDK turns at 128k (SDK alone, full read, windowed reads)\n",
            "Each number from a fresh process, on the agentic mix (every item shape of "
            "docs/item-graph.md, streamed outputs, long reasoning); `same` = the windowed "
            "turns' requests equal the full read's; `targets` = the ratios to the SDK alone "
            "this run measured against `harness.WHOLE_TURN_TARGETS` (next and restart: times "
            "faster than the SDK alone's next turn; first: the share of its first turn).\n",
            "```\n" + text.getvalue() + "```\n",
        ]
    if costs:
        parts += [
            "## Opaque payloads: tokens per item kind, rule 1 and rule 2\n",
            f"A generated {costs['mix']} history of {COSTS_ITEMS:,} items with realistic "
            "encrypted payloads (`benches/opaque_costs.py`). **As text (rule 1)**: "
            "protoprompt up to 0.2.0, the base64 of `encrypted_content` tokenised as text; "
            "**decoded size (rule 2)**: protoprompt now (`docs/cost-model.md`: decoded bytes "
            "less a 650-byte envelope, 4 bytes per token, +25%); **Codex estimate**: "
            "OpenAI Codex's own estimate of each item (no margin); **tiktoken of the "
            "JSON**: the plain count of the item's JSON.\n",
            md_opaque_costs(costs),
        ]
    if masked:
        parts += [MASKING_INTRO, masking.markdown(masked)]
    if sizes:
        parts += ["## Index and snapshot size\n", _md_sizes(sizes)]
    if counting:
        text = io.StringIO()
        print_counting(counting, out=text)
        parts += ["## Token counting\n", "```\n" + text.getvalue() + "```\n"]
    # The sections written by their own runs (benches/memory_search.py, --engines-only,
    # benches/recall_quality.py): kept as they are.
    old = Path(path).read_text() if Path(path).exists() else ""
    for marker in ("session-engines", "recall-quality", "prompt-cache", "memory-search"):
        begin, end = old.find(f"<!-- {marker} -->"), old.find(f"<!-- /{marker} -->")
        if 0 <= begin < end:
            parts.append(old[begin : end + len(f"<!-- /{marker} -->")] + "\n")
    Path(path).write_text("\n".join(p.rstrip("\n") + "\n" for p in parts))


MASKING_INTRO = """## Masking: what stays visible

`benches/masking.py`: budgets of 5%, 10% and 25% of the history's cost (its valid units'
tokens), no output reserve. Per setting: user turns, tool calls and masked tool outputs in
the request; tokens of history per kept turn; warm `HistoryIndex` turns (fresh objects)
without masking, and with each setting as a ratio to it: *warm index* = the harness's next
turn (3 items) after the previous turn was packed with the same setting, *ms/turn* = the
history's own last 7 turns packed one after the other (the fastest of 4 runs; turns that
first mask an older turn come at the mix's rate). *masking* = `Masking()` (the builder's
default), *after 2 turns* = `Masking(after_turns=2)` (masks a turn's outputs the first time
they age past two turns). Sub-millisecond times on a shared 2-CPU machine: read the ratios
of one row, not across runs.
"""

_BEGIN, _END = "<!-- bench-summary -->", "<!-- /bench-summary -->"


def update_readme(path: str, rows: list[dict], meta: str) -> None:
    """Replace the table between the README's bench-summary markers with this run's."""
    text = Path(path).read_text()
    start, end = text.find(_BEGIN), text.find(_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no {_BEGIN} ... {_END} block to replace")
    block = f"{_BEGIN}\n{meta}\n\n{md_summary(rows)}"
    Path(path).write_text(text[:start] + block + text[end:])


def measure_counting(args, progress: Progress) -> list[harness.Throughput]:
    from history_gen import corpus_texts

    texts = corpus_texts(int(args.corpus_mb * 1e6), seed=0)
    out = []
    for engine in ("protoprompt", "tiktoken"):
        for threads in (1, 2):
            progress.step(f"token counting: {engine}, {threads} thread(s)")
            r = harness.measure_throughput(texts, engine, threads, rounds=3)
            assert r is not None
            out.append(r)
        progress.step(f"token counting: {engine}, 2 processes (the machine's ceiling)")
        procs = harness.measure_throughput(texts, engine, 2, rounds=3, processes=True)
        if procs is not None:
            out.append(procs)
    return out


def print_counting(results: list[harness.Throughput], out=sys.stdout) -> None:
    single = {r.engine: r for r in results if r.threads == 1}
    print(
        f"{'engine':<12} {'workers':>11} {'MB/s':>8} {'Mtok/s':>8} {'scaling':>8} "
        f"{'vs tiktoken':>12}",
        file=out,
    )
    for r in results:
        workers = f"{r.threads} {'procs' if r.processes else 'threads'}"
        scale = f"{r.mb_per_s / single[r.engine].mb_per_s:.2f}x" if r.threads > 1 else ""
        tk = next(
            (
                t
                for t in results
                if t.engine == "tiktoken" and t.threads == r.threads and t.processes == r.processes
            ),
            None,
        )
        vs = f"{r.mb_per_s / tk.mb_per_s:.2f}x" if tk and r.engine == "protoprompt" else ""
        print(
            f"{r.engine:<12} {workers:>11} {r.mb_per_s:>8.2f} {r.tokens_per_s / 1e6:>8.2f} "
            f"{scale:>8} {vs:>12}",
            file=out,
        )
    tokens = {r.n_tokens for r in results}
    print(
        f"corpus: {results[0].n_bytes / 1e6:.1f} MB, {results[0].n_tokens:,} tokens "
        f"({'all engines agree' if len(tokens) == 1 else 'COUNTS DIFFER: ' + str(tokens)}); "
        "2 processes share nothing but the machine: their scaling is the ceiling for 2 "
        "threads on it",
        file=out,
    )


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``report.py``."""
    p = argparse.ArgumentParser(prog="protoprompt-bench-report", description=__doc__.split("\n")[0])
    p.add_argument(
        "--sizes",
        type=_ints,
        default=list(harness.DEFAULT_SIZES),
        help="history sizes in items (comma separated; default 1000,10000)",
    )
    p.add_argument(
        "--budgets",
        type=_ints,
        default=list(harness.DEFAULT_BUDGETS),
        help="token budgets (default 8000,128000,400000)",
    )
    p.add_argument(
        "--mix",
        default="agentic",
        choices=["chat", "tools", "agentic"],
        help="generated history mix (default agentic)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--db", help="a SQLiteSession database to measure instead of generated data")
    p.add_argument("--session-id", help="session id inside --db")
    p.add_argument("--rounds", type=int, default=3, help="warm / SDK rounds (median reported)")
    p.add_argument(
        "--cold-rounds",
        type=int,
        default=1,
        help="fresh processes per cold measurement (minimum reported)",
    )
    p.add_argument("--corpus-mb", type=float, default=4.0, help="token-counting corpus size")
    p.add_argument("--no-reference", action="store_true", help="skip the pure-Python reference")
    p.add_argument("--no-counting", action="store_true", help="skip the throughput table")
    p.add_argument(
        "--no-costs",
        action="store_true",
        help="skip the opaque payload table (cost rule 1 vs 2 per item kind)",
    )
    p.add_argument(
        "--no-turns",
        action="store_true",
        help="skip the whole-turn table (SDK alone / full read / windowed reads)",
    )
    p.add_argument(
        "--no-masking", action="store_true", help="skip the masking table (what stays visible)"
    )
    p.add_argument(
        "--masking-only",
        action="store_true",
        help="measure the masking table only; with --markdown, replace just that section",
    )
    p.add_argument(
        "--no-retention",
        action="store_true",
        help="skip the retention table (planted facts reaching the request)",
    )
    p.add_argument(
        "--retention-only",
        action="store_true",
        help="measure the retention table only; with --markdown, replace just that section",
    )
    p.add_argument(
        "--prompt-cache-only",
        action="store_true",
        help="measure the prompt-cache table only (benches/prompt_cache.py); with --markdown, "
        "replace just that section",
    )
    p.add_argument(
        "--engines-only",
        action="store_true",
        help="measure whole turns on PostgreSQL and Redis only (benches/session_engines.py, "
        "--sizes; the servers of scripts/services.sh); with --markdown, replace just that "
        "section",
    )
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.add_argument(
        "--markdown", metavar="PATH", help="also write the tables as markdown (benches/README.md)"
    )
    p.add_argument(
        "--readme",
        metavar="PATH",
        help="replace the bench-summary table of this README with the run's",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.db and not args.session_id:
        p.error("--db needs --session-id")

    import protoprompt

    if args.masking_only:
        return masking_only(args)
    if args.retention_only:
        return retention_only(args)
    if args.engines_only:
        return engines_only(args)
    if args.prompt_cache_only:
        return prompt_cache_only(args)
    measured = _measure_all(args, p)
    machine = _print_report(measured)
    rows, turns, masked = measured["rows"], measured["turns"], measured["masked"]
    retained, counting = measured["retained"], measured["counting"]
    costs, sizes = measured["costs"], measured["sizes"]
    meta = (
        f"protoprompt {protoprompt.__version__}, {datetime.date.today().isoformat()}, "
        f"{machine}; {'--db ' + args.session_id if args.db else args.mix + ' mix'}, "
        f"budgets {', '.join(f'{b:,}' for b in args.budgets)}, output reserve "
        f"min(8000, budget/8), median of {args.rounds} warm rounds."
    )
    if args.markdown:
        write_markdown(args.markdown, meta, rows, sizes, counting, turns, costs, masked)
        if retained:
            replace_section(args.markdown, retention_section(retained))
    if args.readme and rows:
        update_readme(args.readme, rows, f"Measured by `benches/report.py` ({meta})")
    same = all(r.get("same", True) for r in rows) and all(t["same"] for t in turns)
    met = all(v[2] for t in turns for v in harness.turn_targets(t).values())
    met = met and retention.target_met(retained)
    return 0 if same and met else 1


def _measure_all(args: argparse.Namespace, p: argparse.ArgumentParser) -> dict:
    """Every table's measurements (the cases generated or read from ``--db``)."""
    n_cases = 1 if args.db else len(args.sizes)
    total = (
        n_cases * (1 + len(args.budgets) * (args.cold_rounds + 2))
        + n_cases
        + (0 if args.no_counting else 6)
        + (0 if args.no_turns or args.db else n_cases)
        + (0 if args.no_costs else 1)
        + (0 if args.no_masking else n_cases)
        + (0 if args.no_retention else 1)
    )  # 2 engines x (1, 2 threads, 2 procs)
    progress = Progress(total, enabled=not args.quiet)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="protoprompt-report-") as workdir:
        if args.db:
            progress.step(f"loading session {args.session_id!r} from {args.db}")
            try:
                items, db_copy = harness.load_sqlite_session(args.db, args.session_id, workdir)
            except FileNotFoundError as e:
                p.error(str(e))
            if not items:
                p.error(f"session {args.session_id!r} in {args.db} has no items")
            cases = [harness.case_from_items(items, f"db:{args.session_id}")]
        else:
            db_copy = None
            cases = []
            for size in args.sizes:
                progress.step(f"generating {args.mix} history of {size:,} items")
                cases.append(harness.make_case(size, args.mix, args.seed))
        for case in cases:
            rows += measure_case(case, args.budgets, args, progress, workdir, db_copy)
        turns = []
        if not args.no_turns and not args.db:
            for case in cases:
                progress.step(
                    f"{case.label}: whole turns at 128k (SDK alone, full read, "
                    "windowed), fresh processes"
                )
                turns.append(harness.whole_turns(case, 128_000, workdir, next_turns=args.rounds))
        masked: list[dict] = []
        if not args.no_masking:
            for case in cases:
                progress.step(f"{case.label}: masking, budgets of 5%, 10%, 25% of the history")
                masked += masking.measure(case, rounds=max(args.rounds, 5))
        retained: list[dict] = []
        if not args.no_retention:
            progress.step(f"retention of planted facts, {retention.N_ITEMS:,} items")
            retained = retention.measure()
        counting = [] if args.no_counting else measure_counting(args, progress)
        costs = None if args.no_costs else measure_opaque_costs(args, progress)
        sizes = measure_index_sizes(cases)
    progress.finish()
    return {
        "rows": rows,
        "turns": turns,
        "masked": masked,
        "retained": retained,
        "counting": counting,
        "costs": costs,
        "sizes": sizes,
    }


def _print_report(measured: dict) -> str:
    """Print the tables of ``_measure_all``; returns the machine's description."""
    import protoprompt

    rows, turns, masked = measured["rows"], measured["turns"], measured["masked"]
    retained, counting = measured["retained"], measured["counting"]
    costs, sizes = measured["costs"], measured["sizes"]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    machine = f"Python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs" + (
        f", load average {load[0]:.2f}" if load else ""
    )
    print(
        f"protoprompt {protoprompt.__version__} ({Path(protoprompt.__file__).parent}), " + machine
    )
    print(
        "output reserve: min(8000, budget/8); warm = pack after the previous turn was packed "
        "in the same process (generated: +3 items; --db: +the last turn); "
        "SDK = prepare_input_with_session, pass-through callback, file SQLiteSession"
    )
    print()
    print_table(rows)
    if rows:
        print(
            f"\npeak = growth of peak RSS during one pack call ({rows[0]['mem_method']}); "
            f"cold includes building the tokenizer. session cold = what protoprompt adds to "
            f"the first turn it ever serves on the database, in a fresh process through "
            f"ProtoPromptSession (callback + get_items beyond the SDK's read; its peak = "
            f"session peak, the tokenizer having been built while the SDK read the "
            f"history); restart = the same in a new process that finds the index snapshot "
            f"and token counts the first kept in the database (restart peak = callback + "
            f"loading the snapshot). "
            f"import protoprompt: "
            f"{harness.ms(rows[0]['pp_import'])} ms"
            + (
                f"; reference vocabulary load: {harness.ms(rows[0]['ref_vocab'])} ms "
                "(included in ref cold)"
                if rows[0].get("ref_vocab") is not None
                else ""
            )
        )
    if turns:
        print(
            "\nwhole SDK turns at 128k (prepare_input_with_session from the session's "
            "construction on, each from a fresh process): first = the first turn "
            "protoprompt serves on the database, restart = a new process's first turn, "
            "next = the turn after (median); windowed = ProtoPromptSession("
            "windowed_reads=True), the same requests as the full read (same)"
        )
        print_turns(turns)
    if masked:
        print("\nmasking: user turns / tool calls / masked outputs in the request")
        masking.print_rows(masked)
    if retained:
        print()
        retention.print_rows(retained)
    if counting:
        print()
        print_counting(counting)
    if costs:
        print()
        print_opaque_costs(costs)
    print()
    print_index_sizes(sizes)
    return machine


def replace_section(path: str, section: str) -> None:
    """Put ``section`` (a markdown section starting with its ``## `` title) in place of the
    file's section of the same title, or before the index-size section when it has none."""
    text = Path(path).read_text()
    title = section.split("\n", 1)[0]
    start = text.find(title)
    if start < 0:
        start = end = text.find("## Index and snapshot size")
        if start < 0:
            start = end = len(text)
    else:
        nxt = text.find("\n## ", start + len(title))
        end = len(text) if nxt < 0 else nxt + 1
    Path(path).write_text(text[:start] + section.rstrip("\n") + "\n\n" + text[end:].lstrip("\n"))


def masking_only(args) -> int:
    """``--masking-only``: the masking table of generated histories (``--sizes``)."""
    import protoprompt

    rows: list[dict] = []
    for size in args.sizes:
        case = harness.make_case(size, args.mix, args.seed)
        rows += masking.measure(case, rounds=max(args.rounds, 5))
    masking.print_rows(rows)
    if args.markdown:
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        when = (
            f"protoprompt {protoprompt.__version__}, {datetime.date.today().isoformat()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
            + (f", load average {load[0]:.2f}" if load else "")
            + f"; {args.mix} mix."
        )
        replace_section(
            args.markdown, MASKING_INTRO + "\n" + when + "\n\n" + masking.markdown(rows)
        )
    return 0


RETENTION_INTRO = """## Retention of evicted turns

`benches/retention.py`: a generated agentic session of 2,400 items with 20 facts planted in
its first quarter (10 in user messages, 10 in the middle of tool outputs longer than 2,000
characters), each asked about by a late question that shares words with it (the next
turn's new input over the whole history). A fact *reaches the request* when its code is in
what is sent: kept items (masked copies as sent) or the context message. Budgets: 5% and
10% of the history's cost plus the question, no output reserve. *drop-only* =
`masking=None`; *masking* = the builder's default `Masking()`; *masking + recall* = the
default masking with `recall_evicted=True` through a `ProtoPromptSession` (a first turn
evicts and indexes in the background; recall within the history layer's default 2,000
tokens). Target: at least 90% with recall at 10%. Deterministic (seeded history and codes,
BM25 ranking, no timing).
"""


def retention_section(rows: list[dict]) -> str:
    import protoprompt

    when = (
        f"protoprompt {protoprompt.__version__}, {datetime.date.today().isoformat()}, "
        f"Python {platform.python_version()}; target "
        f"{'met' if retention.target_met(rows) else 'MISSED'}."
    )
    return RETENTION_INTRO + "\n" + when + "\n\n" + retention.markdown(rows)


def retention_only(args) -> int:
    """``--retention-only``: the retention table (with ``--markdown``, that section only)."""
    rows = retention.measure()
    retention.print_rows(rows)
    if args.markdown:
        replace_section(args.markdown, retention_section(rows))
    return 0 if retention.target_met(rows) else 1


ENGINES_INTRO = """## Whole SDK turns on PostgreSQL and Redis

`benches/session_engines.py` (`report.py --engines-only`): one session of the agentic mix in
PostgreSQL (`SQLAlchemySession` through asyncpg) and in Redis (`RedisSession`), on the test
servers of `scripts/services.sh` (loopback; fsync off), budget 128k. *SDK alone* = the SDK's
own session and a pass-through callback (`prepare_input_with_session`; *first* from the
session's construction on); *windowed* = `ProtoPromptSession(inner_session=...,
windowed_reads=True)`: *first ever* reads and classifies the whole history, *restart* = the
first turn of a new worker process (the index snapshot and token counts the first one kept
beside the history), *next* = the turns after it. Each number from a fresh process; the
SDK's next turn and the restart are medians of 3 processes from 50k items on. *Same
requests*: every windowed request equals a fresh pack of what the SDK's session returns.
Targets (issue 26): at 100k items, next >= 50x and restart >= 20x the SDK alone's next turn.
"""


def engines_only(args) -> int:
    """``--engines-only``: whole turns on PostgreSQL and Redis (``--sizes``)."""
    import protoprompt
    import session_engines

    found = session_engines.urls()
    if not found:
        print(
            "no servers: set PROTOPROMPT_TEST_POSTGRES_URL / PROTOPROMPT_TEST_REDIS_URL "
            '(scripts/services.sh start && eval "$(scripts/services.sh env)")',
            file=sys.stderr,
        )
        return 2
    rows = session_engines.measure(args.sizes, args.mix, args.seed)
    session_engines.print_rows(rows)
    if args.markdown:
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        when = (
            f"protoprompt {protoprompt.__version__}, {datetime.date.today().isoformat()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
            + (f", load average {load[0]:.2f}" if load else "")
            + f"; {args.mix} mix."
        )
        section = (
            "<!-- session-engines -->\n"
            + ENGINES_INTRO
            + "\n"
            + when
            + "\n\n"
            + session_engines.markdown(rows)
            + "<!-- /session-engines -->\n"
        )
        _replace_marked(args.markdown, "session-engines", section)
    met = all(v[2] for r in rows for v in session_engines.targets(r).values())
    return 0 if met and all(r["same"] for r in rows) else 1


def _editable(package) -> bool:
    """Whether ``package`` is imported from this tree's ``python/`` (an editable build)."""
    here = Path(__file__).resolve().parent.parent / "python" / "protoprompt"
    return Path(package.__file__).resolve().parent == here


def prompt_cache_only(args) -> int:
    """``--prompt-cache-only``: newest-first against the stable prefix on every mix."""
    import prompt_cache
    import protoprompt

    rows = prompt_cache.measure()
    prompt_cache.print_rows(rows)
    sdk = prompt_cache.sdk_runs()
    prompt_cache.print_rows(sdk)
    # Every generated mix through whole SDK runs (issue 34 #7).
    mix = prompt_cache.mix_sdk_runs() + prompt_cache.mix_sdk_runs(memory=True)
    prompt_cache.print_rows(mix)
    # Turn after turn through the session callback: printed (its table and prose in
    # benches/README.md are kept by hand, carried over by --markdown).
    callback = prompt_cache.callback_runs() + prompt_cache.callback_runs(memory=True)
    prompt_cache.print_rows(callback)
    if args.markdown:
        load = os.getloadavg() if hasattr(os, "getloadavg") else None
        when = (
            f"protoprompt {protoprompt.__version__}, {datetime.date.today().isoformat()}, "
            f"Python {platform.python_version()}, {os.cpu_count()} CPUs"
            + (f", load average {load[0]:.2f}" if load else "")
            + (
                "; the tree's editable build (scripts/dev.sh: a debug build unless RELEASE=1)."
                if _editable(protoprompt)
                else "."
            )
        )
        section = prompt_cache.section(rows, when, sdk, mix)
        # The callback and masking tables are kept by hand: carried over as they are.
        text = Path(args.markdown).read_text()
        begin = text.find("### Turn after turn through the session callback")
        end = text.find("<!-- /prompt-cache -->")
        if 0 <= begin < end:
            kept = text[begin:end]
            section = section.replace(
                "<!-- /prompt-cache -->", "\n" + kept + "<!-- /prompt-cache -->"
            )
        _replace_marked(args.markdown, "prompt-cache", section)
    return 0 if all(r["stable"].broken == 0 for r in rows + callback + mix) else 1


def _replace_marked(path: str, marker: str, section: str) -> None:
    """Put ``section`` in place of the file's ``<!-- marker -->`` block, or before the
    memory-search block (or at the end) when it has none."""
    text = Path(path).read_text()
    begin, end = text.find(f"<!-- {marker} -->"), text.find(f"<!-- /{marker} -->")
    if 0 <= begin < end:
        stop = end + len(f"<!-- /{marker} -->")
        text = text[:begin] + section.rstrip("\n") + text[stop:]
    else:
        at = text.find("<!-- memory-search -->")
        at = len(text) if at < 0 else at
        text = text[:at] + section.rstrip("\n") + "\n\n" + text[at:]
    Path(path).write_text(text)


if __name__ == "__main__":
    sys.exit(main())
