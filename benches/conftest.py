"""pytest configuration for the benchmark harness (``pytest benches -q``).

* ``benches/`` and, when protoprompt is not installed, ``python/`` go on ``sys.path``.
* ``--bench-100k`` (or ``PROTOPROMPT_BENCH_100K=1``) adds the 100k-item scenarios.
* Ratios collected by the benchmarks are printed in the terminal summary.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402  (also puts python/ on sys.path when needed)
import pytest  # noqa: E402

# Filled by the benchmarks: (section, key) -> row dict; printed at the end of the session.
RESULTS: dict[tuple[str, tuple], dict] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench-100k",
        action="store_true",
        default=False,
        help="also run the 100k-item benchmark scenarios (slow, ~2 GB RAM)",
    )


def bench_100k(config: pytest.Config) -> bool:
    return bool(config.getoption("--bench-100k")) or os.environ.get(
        "PROTOPROMPT_BENCH_100K", ""
    ) not in ("", "0")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "size" in metafunc.fixturenames:
        sizes = list(harness.DEFAULT_SIZES)
        if bench_100k(metafunc.config):
            sizes.append(100_000)
        metafunc.parametrize("size", sizes, ids=[f"n{s}" for s in sizes])


class CaseStore:
    """Histories are generated once per session and kept as JSON text only (keeping
    millions of live dicts around would slow every later measurement via the GC)."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self._cases: dict[tuple[int, str], harness.Case] = {}

    def get(self, size: int, mix: str) -> harness.Case:
        key = (size, mix)
        if key not in self._cases:
            self._cases[key] = harness.make_case(size, mix, seed=0)
        return self._cases[key]


@pytest.fixture(scope="session")
def cases(tmp_path_factory: pytest.TempPathFactory) -> CaseStore:
    return CaseStore(str(tmp_path_factory.mktemp("bench-cases")))


@pytest.fixture(scope="session")
def results() -> dict:
    return RESULTS


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if not RESULTS:
        return
    tr = terminalreporter
    tr.section("protoprompt benchmark ratios")
    _write_pack_rows(tr)
    for k, v in sorted(RESULTS.items(), key=lambda kv: repr(kv[0])):
        _write_result(tr, k, v)


def _write_pack_rows(tr) -> None:
    """The packing cases: the SDK, protoprompt and the reference, and the sessions."""
    sdk = {k[1]: v for k, v in RESULTS.items() if k[0] == "sdk"}
    rows = sorted((k[1], v) for k, v in RESULTS.items() if k[0] == "pack")
    if rows:
        tr.write_line(
            f"{'case':<16}{'budget':>8}{'SDK ms':>10}{'pp cold':>10}{'pp warm':>10}"
            f"{'index':>9}{'warm/SDK':>10}{'index/SDK':>10}{'ref cold':>10}"
            f"{'ref warm':>10}{'ref/pp warm':>12}{'ref/index':>11}{'ref/pp cold':>12}"
        )
    for (size, mix, budget), v in rows:
        s = sdk.get((size, mix), {}).get("median")
        pw, pc, pi = v.get("pp_warm"), v.get("pp_cold"), v.get("pp_index_warm")
        rw, rc = v.get("ref_warm"), v.get("ref_cold")

        def ratio(a, b, pct=False):
            if a is None or b is None or b == 0:
                return "-"
            return f"{100 * a / b:.3f}%" if pct else f"{a / b:,.1f}x"

        index_ms = "-" if pi is None else f"{pi * 1e3:.3f}"
        tr.write_line(
            f"{mix + '-' + str(size):<16}{budget:>8}{harness.ms(s):>10}"
            f"{harness.ms(pc):>10}{harness.ms(pw):>10}{index_ms:>9}"
            f"{ratio(pw, s, True):>10}{ratio(pi, s, True):>10}"
            f"{harness.ms(rc):>10}{harness.ms(rw):>10}{ratio(rw, pw):>12}"
            f"{ratio(rw, pi):>11}{ratio(rc, pc):>12}"
        )
    for (size, mix, budget), v in rows:
        if v.get("session_cold") is not None:
            rc = v.get("ref_cold")
            vs = (
                ""
                if rc is None
                else (
                    f" = {rc / v['session_cold']:.1f}x / "
                    f"{rc / v['session_restart']:.1f}x the reference cold"
                )
            )
            tr.write_line(
                f"session {mix}-{size} budget={budget}: cold "
                f"{v['session_cold'] * 1e3:.1f} ms, restart "
                f"{v['session_restart'] * 1e3:.1f} ms{vs}, next turn "
                f"{v['session_warm'] * 1e3:.2f} ms"
            )


def _write_result(tr, k, v) -> None:
    """One line for each other kind of result."""
    _write_turn_result(tr, k, v)
    _write_filter_result(tr, k, v)
    _write_store_result(tr, k, v)


def _write_turn_result(tr, k, v) -> None:
    if k[0] == "threads":
        tr.write_line(
            f"pack two 10k sessions ({k[1][0]}): sequential "
            f"{v['sequential'] * 1e3:.1f} ms, "
            f"two threads {v['threaded'] * 1e3:.1f} ms, "
            f"scaling {v['sequential'] / v['threaded']:.2f}x"
        )
    if k[0] == "recall":
        shared = f", {k[1][1]} other sessions in the store" if k[1][1] else ""
        tr.write_line(
            f"SDK turn with recall_evicted ({k[1][0]:.0%} budget{shared}): {v['on'] * 1e3:.1f} ms, "
            f"without {v['off'] * 1e3:.1f} ms, ratio {v['ratio']:.2f}x (target <= 1.2x)"
        )
    if k[0] == "history search":
        large, small = k[1]
        tr.write_line(
            f"history search (recall's), {large:,} passages {v['large'] * 1e3:.2f} ms, "
            f"{small:,} passages {v['small'] * 1e3:.2f} ms: {v['ratio']:.2f}x (at most 2.5x)"
        )
    if k[0] == "session search":
        large, small = k[1]
        tr.write_line(
            f"session search (recall's), one session among {large // small} ({large:,}"
            f" passages) {v['large'] * 1e3:.2f} ms, alone ({small:,}) {v['small'] * 1e3:.2f} ms:"
            f" {v['ratio']:.2f}x (at most 2.5x)"
        )
    if k[0] == "turn":
        size, mix = k[1]
        tr.write_line(
            f"SDK turn {mix}-{size} (128k budget): with ProtoPromptSession "
            f"{v['pp'] * 1e3:.1f} ms, pass-through callback {v['sdk'] * 1e3:.1f} ms"
        )


def _write_filter_result(tr, k, v) -> None:
    if k[0] == "whole_turn":
        size = k[1][0]
        small = RESULTS.get(("whole_turn", (10_000,)))
        grow = (
            f"; windowed next turn {v['windowed_next'] / small['windowed_next']:.2f}x the 10k one"
            if small and size > 10_000
            else ""
        )
        tr.write_line(
            f"whole turn agentic-{size} (128k, seconds, first / next / restart): SDK alone "
            f"{v['sdk_first']:.2f} / {v['sdk_next']:.2f}; full read {v['full_first']:.2f} / "
            f"{v['full_next']:.2f} / {v['full_restart']:.2f}; windowed "
            f"{v['windowed_first']:.2f} / {v['windowed_next']:.3f} / "
            f"{v['windowed_restart']:.2f}; windowed next {v['next_vs_sdk']:.0f}x and "
            f"restart {v['restart_vs_sdk']:.1f}x faster than the SDK's turn, first turn "
            f"{v['first_vs_sdk_first']:.2f}x the SDK's first{grow}"
        )
    if k[0] == "filter_loop":
        tr.write_line(
            f"20-step tool loop over {k[1][0]} items: filter {v['filter']:.2f} s, "
            f"pass-through {v['pass']:.2f} s, ratio {v['filter'] / v['pass']:.3f}; "
            f"inside the filter {v['inside'] * 1e3:.0f} ms "
            f"({100 * v['inside'] / v['pass']:.2f}% of the run)"
        )
    if k[0] == "filter_call":
        small = RESULTS.get(("filter_call", (10_000,)))
        vs = (
            f", {v['per_call'] / small['per_call']:.2f}x the 10k call"
            if small and k[1][0] > 10_000
            else ""
        )
        tr.write_line(
            f"model filter per call, {k[1][0]} items: "
            f"{v['per_call'] * 1e3:.2f} ms (first {v['first'] * 1e3:.1f} ms; "
            f"warm index turn {v['index_turn'] * 1e3:.2f} ms){vs}"
        )
    if k[0] == "filter_vs_json":
        tr.write_line(
            f"model filter per call ({k[1][0]}, {k[1][1]} items) vs json.dumps of its "
            f"request: {v['per_call'] * 1e3:.3f} / {v['dumps'] * 1e3:.3f} ms, ratio "
            f"{v['ratio']:.2f}"
        )
    if k[0] == "filter_masking":
        tr.write_line(
            f"model filter per call ({k[1][0]}), masking on / off: "
            f"{v['on'] * 1e3:.2f} / {v['off'] * 1e3:.2f} ms, ratio {v['ratio']:.2f}"
        )


def _write_store_result(tr, k, v) -> None:
    if k[0] == "memory_search" and {"sqlite", "postgresql"} <= set(v):
        lite, pg = v["sqlite"], v["postgresql"]
        tr.write_line(
            f"memory search, {k[1][0]:,} records over {k[1][1]:,} scopes (ms, p50 / p95): "
            f"SQLite {lite['p50']:.2f} / {lite['p95']:.2f}, PostgreSQL {pg['p50']:.2f} / "
            f"{pg['p95']:.2f}; PostgreSQL p50 {pg['p50'] / lite['p50']:.2f}x SQLite's"
        )
    if k[0] == "count":
        engine, threads = k[1]
        workers = threads if isinstance(threads, str) else f"{threads} thread(s)"
        tr.write_line(
            f"count {engine:<12} {workers:<11}: {v['mb_s']:8.2f} MB/s "
            f"{v['tok_s'] / 1e6:8.2f} Mtok/s"
        )
    if k[0] == "count-pathological":
        tr.write_line(
            f"count {k[1][0]:<24}: {v['mb_s']:8.2f} MB/s, {v['slower']:.2f}x "
            "the corpus' time per byte"
        )
