"""Whole SDK turns on PostgreSQL and Redis: the SDK alone against ProtoPromptSession's fast path
over the same session (``SQLAlchemySession`` through asyncpg, ``RedisSession``), every number
from a fresh process, in one run.

* **SDK alone** = ``prepare_input_with_session`` end to end with the SDK's own session and a
  pass-through callback (its read of the whole history, decoding, the runner's copies): the
  *first* turn of a process (from the session's construction on) and the *next* ones
  (median), as a worker serves them.
* **windowed** = ``ProtoPromptSession(inner_session=..., windowed_reads=True)`` with its
  callback (recall of an empty memory store, the pack): *first* = the first turn protoprompt
  ever serves on the session (its snapshot and counts deleted first: the whole history is
  read and classified), *restart* = the first turn of another new process, which finds the
  index snapshot and the counts the first one kept beside the history, *next* = the turns
  after it in that process (median). A worker's turns stay in the session (a few items per
  process), as they would; the SDK alone's are popped again.
* **same**: every windowed request equals a fresh pack (``TokenBudgetedContextBuilder.build``)
  of the history the SDK's own session returns at that moment, through the same SDK step
  (checked in the child, after the timing).

Targets (:data:`TARGETS`, issue 26): at 100k items the windowed next turn at least 50x and the
restart at least 20x faster than the SDK alone's next turn, on each engine.

Run: ``python benches/session_engines.py --sizes 10000,100000`` (URLs from
``PROTOPROMPT_TEST_POSTGRES_URL`` / ``PROTOPROMPT_TEST_REDIS_URL``, see scripts/services.sh);
``benches/report.py --engines-only`` writes the table into benches/README.md.
"""

from __future__ import annotations

import asyncio
import gc
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

ENGINES = ("postgres", "redis")
TARGETS: dict[int, dict[str, float]] = {
    10_000: {"next": 10.0},
    100_000: {"next": 50.0, "restart": 20.0},
}
BUDGET = 128_000


def urls() -> dict[str, str]:
    """The engines' URLs from the environment (those that are set)."""
    out = {}
    pg = os.environ.get("PROTOPROMPT_TEST_POSTGRES_URL", "")
    if pg:
        out["postgres"] = pg.replace("postgresql://", "postgresql+asyncpg://", 1)
    redis = os.environ.get("PROTOPROMPT_TEST_REDIS_URL", "")
    if redis:
        out["redis"] = redis
    return out


def _inner(spec: dict[str, Any]) -> Any:
    if spec["engine"] == "postgres":
        from agents.extensions.memory import SQLAlchemySession

        return SQLAlchemySession.from_url(spec["session_id"], url=spec["url"], create_tables=True)
    from agents.extensions.memory import RedisSession

    return RedisSession.from_url(spec["session_id"], url=spec["url"], key_prefix=spec["prefix"])


async def _close_inner(spec: dict[str, Any], inner: Any) -> None:
    if spec["engine"] == "postgres":
        await inner.engine.dispose()
    else:
        await inner.close()


def _digest(items: list[Any]) -> str:
    return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()


def _requests_equal_fresh_packs(
    loop: asyncio.AbstractEventLoop,
    inner: Any,
    added: int,
    questions: list[list[Any]],
    requests: list[list[Any]],
    fresh: Any,
) -> bool:
    """Every request against a fresh pack of what the SDK's session returns, through the
    same SDK step (prepare_input_with_session) over a session holding the history as it
    was before each turn."""
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt import _core

    same = True
    history = loop.run_until_complete(inner.get_items())
    base = len(history) - added

    class Before:
        session_settings = None

        def __init__(self, items: list[Any]) -> None:
            self.items = items

        async def get_items(self, limit: int | None = None) -> list[Any]:
            return json.loads(json.dumps(self.items))

    async def fresh_pack(history: list[Any], new_input: list[Any]) -> list[Any]:
        _core._clear_count_cache()
        return list(fresh.build(history, new_input, system_prompt="Be brief.").items)

    for n, (question, request) in enumerate(zip(questions, requests, strict=True)):
        before = history[: base + sum(len(q) + 1 for q in questions[:n])]
        expected, _ = loop.run_until_complete(
            prepare_input_with_session(list(question), Before(before), fresh_pack)
        )
        same = same and _digest(request) == _digest(expected)
    return same


def _child(spec: dict[str, Any]) -> None:
    """One process's turns (see the module note); prints a JSON line."""
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt import MemoryStore, TokenBudgetedContextBuilder
    from protoprompt.integrations import ProtoPromptSession

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    mode = spec["mode"]
    store = MemoryStore()
    reports: list[list[str]] = []
    read_items: list[int] = []
    requests: list[list[Any]] = []

    def builder() -> TokenBudgetedContextBuilder:
        return TokenBudgetedContextBuilder(
            store, max_tokens=spec["budget"], output_reserve=spec["output_reserve"],
            encoding=harness.ENCODING,
        )  # fmt: skip

    gc.collect()
    t0 = time.perf_counter()
    inner = _inner(spec)
    if mode == "sdk":
        session: Any = inner

        async def callback(history: list[Any], new_input: list[Any]) -> list[Any]:
            return history + new_input
    else:
        session = ProtoPromptSession(spec["session_id"], inner_session=inner, windowed_reads=True)
        packer = builder()
        inner_callback = session.input_callback(packer, system_prompt="Be brief.")

        async def callback(history: list[Any], new_input: list[Any]) -> list[Any]:
            read_items.append(len(history))
            out = await inner_callback(history, new_input)
            turn = packer.last_plan.turn if packer.last_plan is not None else None
            if turn is not None:
                reports.append([turn.read, turn.index, turn.snapshot, turn.read_line()])
            return out

        callback._protoprompt_turn = inner_callback._protoprompt_turn  # type: ignore[attr-defined]

    def turn(new_input: list[Any]) -> float:
        t = time.perf_counter()
        prepared, _ = loop.run_until_complete(
            prepare_input_with_session(list(new_input), session, callback)
        )
        elapsed = time.perf_counter() - t
        requests.append(prepared)
        return elapsed

    questions = [spec["new_input"]] + [
        [{"role": "user", "content": f"And then? ({k})"}] for k in range(spec["next_turns"])
    ]
    turn(questions[0])
    first = time.perf_counter() - t0  # from the session's construction on
    next_times = []
    added = 0
    for k, question in enumerate(questions[1:]):
        answer = {
            "type": "message",
            "role": "assistant",
            "id": f"msg_engine_bench_{k}",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Noted.", "annotations": []}],
        }
        loop.run_until_complete(session.add_items([*questions[k], answer]))
        added += len(questions[k]) + 1
        gc.collect()
        next_times.append(turn(question))
    if mode != "sdk":
        session.close()  # the snapshot and queued counts are written (as a worker's close)
    same = mode == "sdk" or _requests_equal_fresh_packs(
        loop, inner, added, questions, requests, builder()
    )
    if mode == "sdk":  # the SDK's turns are taken back; a worker's stay (its snapshot has them)
        for _ in range(added):
            loop.run_until_complete(inner.pop_item())
    loop.run_until_complete(_close_inner(spec, inner))
    store.close()
    print(
        json.dumps(
            {
                "first_s": first,
                "next_s": statistics.median(next_times) if next_times else None,
                "reports": reports,
                "read_items": read_items,
                "same": same,
            }
        )
    )


def _spawn(spec: dict[str, Any], timeout: float = 1800) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=harness._child_env(),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


async def _seed(spec: dict[str, Any], history: list[Any]) -> None:
    inner = _inner(spec)
    try:
        await inner.clear_session()
        for start in range(0, len(history), 5000):
            await inner.add_items(history[start : start + 5000])
    finally:
        await _close_inner(spec, inner)


async def _forget(spec: dict[str, Any]) -> None:
    """Delete what protoprompt keeps of the session (snapshot, counts): a first turn ever."""
    if spec["engine"] == "postgres":
        from sqlalchemy import text
        from sqlalchemy.ext.asyncio import create_async_engine

        db = create_async_engine(spec["url"])
        try:
            async with db.begin() as conn:
                for table in ("protoprompt_index_snapshots", "protoprompt_token_counts"):
                    await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
        finally:
            await db.dispose()
    else:
        import redis.asyncio as redis

        client = redis.from_url(spec["url"])
        try:
            prefix = spec["prefix"]
            await client.delete(
                f"{prefix}:{spec['session_id']}:protoprompt:snapshot",
                f"{prefix}:protoprompt:counts",
            )
        finally:
            await client.aclose()


async def _drop(spec: dict[str, Any]) -> None:
    inner = _inner(spec)
    try:
        await inner.clear_session()
    finally:
        await _close_inner(spec, inner)


def engine_turns(
    case: harness.Case,
    engine: str,
    url: str,
    *,
    budget: int = BUDGET,
    next_turns: int = 3,
    rounds: int | None = None,
) -> dict[str, Any]:
    """The comparison on one engine (see the module note): seconds per measurement
    (``sdk_first``, ``sdk_next``, ``windowed_first``, ``windowed_restart``,
    ``windowed_next``), ``same``, the items the windowed turns read and their reports. The
    target numbers (SDK next, windowed restart) are medians of ``rounds`` processes
    (default 3 from 50k items on, else 1), interleaved."""
    if rounds is None:
        rounds = 3 if case.n_items >= 50_000 else 1
    sid = f"bench-{uuid.uuid4().hex[:10]}"
    spec: dict[str, Any] = {
        "engine": engine,
        "url": url,
        "session_id": sid,
        "prefix": f"bench-{sid}",
        "new_input": case.new_input,
        "budget": budget,
        "output_reserve": harness.output_reserve_for(budget),
        "next_turns": next_turns,
    }
    asyncio.run(_seed(spec, case.history()))
    out: dict[str, Any] = {"engine": engine, "items": case.n_items, "budget": budget}
    try:
        sdk_next, sdk_first = [], []
        asyncio.run(_forget(spec))
        w1 = _spawn({**spec, "mode": "windowed"})
        restarts, windowed_next, reports, read_items, same = [], [], [], [], w1["same"]
        for _ in range(rounds):
            s = _spawn({**spec, "mode": "sdk"})
            sdk_first.append(s["first_s"])
            sdk_next.append(s["next_s"])
            w = _spawn({**spec, "mode": "windowed"})
            restarts.append(w["first_s"])
            windowed_next.append(w["next_s"])
            reports, read_items = w["reports"], w["read_items"]
            same = same and w["same"]
        out.update(
            sdk_first=statistics.median(sdk_first),
            sdk_next=statistics.median(sdk_next),
            windowed_first=w1["first_s"],
            windowed_restart=statistics.median(restarts),
            windowed_next=statistics.median(windowed_next),
            same=same,
            first_reports=w1["reports"],
            windowed_reports=reports,
            windowed_read_items=read_items,
        )
    finally:
        asyncio.run(_drop(spec))
        asyncio.run(_forget(spec)) if engine == "redis" else None
    return out


def targets(row: dict[str, Any]) -> dict[str, tuple[float, float, bool]]:
    """name -> (measured ratio, target, met) for a row of :func:`engine_turns`."""
    measured = {
        "next": row["sdk_next"] / row["windowed_next"],
        "restart": row["sdk_next"] / row["windowed_restart"],
    }
    wanted = TARGETS.get(row["items"] - 3) or TARGETS.get(row["items"], {})
    return {k: (measured[k], t, measured[k] >= t) for k, t in wanted.items()}


def print_rows(rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    header = (
        f"{'engine':<9} {'items':>8}  {'SDK first':>10} {'SDK next':>9}  "
        f"{'pp first':>9} {'restart':>8} {'next':>8}  {'read':>6}  ratios (target)   same"
    )
    print(header, file=out)
    for r in rows:
        ratios = ", ".join(
            f"{k} {v:.0f}x ({t:.0f}x{'' if ok else ' MISSED'})"
            for k, (v, t, ok) in targets(r).items()
        )
        print(
            f"{r['engine']:<9} {r['items']:>8,}  {r['sdk_first']:>9.3f}s {r['sdk_next']:>8.3f}s  "
            f"{r['windowed_first']:>8.3f}s {r['windowed_restart']:>7.3f}s "
            f"{r['windowed_next'] * 1e3:>6.1f}ms  {max(r['windowed_read_items']):>6,}  "
            f"{ratios}   {r['same']}",
            file=out,
        )


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| engine | items | SDK alone: first | SDK alone: next | windowed: first ever | "
        "windowed: restart | windowed: next | items read | next vs SDK | restart vs SDK | "
        "same requests |"
    )
    lines = [head, "|" + "---|" * 11]
    for r in rows:
        t = targets(r)

        def ratio(name: str) -> str:
            if name not in t:
                return "-"
            v, target, ok = t[name]
            return f"{v:.0f}x (target {target:.0f}x{'' if ok else ', missed'})"

        lines.append(
            f"| {r['engine']} | {r['items']:,} | {r['sdk_first']:.2f} s | {r['sdk_next']:.2f} s | "
            f"{r['windowed_first']:.2f} s | {r['windowed_restart'] * 1e3:.0f} ms | "
            f"{r['windowed_next'] * 1e3:.1f} ms | {max(r['windowed_read_items']):,} | "
            f"{ratio('next')} | {ratio('restart')} | {'yes' if r['same'] else 'NO'} |"
        )
    return "\n".join(lines) + "\n"


def measure(sizes: list[int], mix: str = "agentic", seed: int = 0) -> list[dict[str, Any]]:
    found = urls()
    rows = []
    for size in sizes:
        case = harness.make_case(size, mix, seed)
        for engine in ENGINES:
            if engine in found:
                rows.append(engine_turns(case, engine, found[engine]))
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="10000", help="history sizes (comma separated)")
    args = p.parse_args(argv)
    rows = measure([int(s) for s in args.sizes.split(",")])
    print_rows(rows)
    return 0 if all(v[2] for r in rows for v in targets(r).values()) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(json.loads(sys.stdin.read()))
    else:
        sys.exit(main())
