"""Shared measurement code for ``benches/test_bench_packing.py`` and ``benches/report.py``.

What is measured, and how (kept honest on purpose, so the numbers stay comparable while the
Rust packer changes):

* **history objects are always fresh**: every timed call gets a list decoded from JSON just
  before it (untimed), like ``SQLiteSession.get_items()`` returns new dicts each turn; a
  cache keyed on object identity would not survive a real turn, so it must not help here.
* **cold** = the first ``pack`` in a fresh interpreter (a child process): tokenizer
  initialisation and every lazy cache included; interpreter start, imports and JSON decoding
  are excluded (import time is reported separately).
* **warm** = in one process, pack the previous turn's history first (untimed), then time the
  pack of that history plus the 3 items one more turn adds (user message, reasoning,
  answer) -- each round repeats the untimed previous-turn pack on fresh objects.
* **SDK overhead** = ``agents.run_internal.session_persistence.prepare_input_with_session``
  with a pass-through callback ``lambda h, n: h + n`` on a file ``SQLiteSession`` preloaded
  with the same history: what the Agents SDK itself spends per turn before the model call.
* **reference** = ``benches/reference_packer.py`` (pure Python + real tiktoken), cold (child
  process, vocabulary load included) and warm (memo of token counts per canonical text).
* **session cold / restart** = what protoprompt adds to the first SDK turn of a fresh process
  through ``ProtoPromptSession`` on the database: the callback's time plus the time its
  ``get_items`` takes beyond the read of the rows itself (which is the SDK session's read:
  ``_sync.read_rows`` does what ``SQLiteSession.get_items`` does, with the row ids), i.e.
  comparing the rows with the index, and waiting for the index snapshot if loading it
  outlasts the read it overlaps. *cold* = the first turn
  protoprompt ever serves on it (the token counts and index snapshot it keeps there are
  deleted first), *restart* = the same turn in another fresh process afterwards, which finds
  what the first one kept.
* **memory** = peak RSS growth of one ``pack`` call (Rust allocations included), measured in
  the child by resetting the kernel's peak-RSS counter (``/proc/self/clear_refs``) right
  before the call; falls back to ``ru_maxrss`` growth when that is not permitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent


def ensure_paths() -> None:
    """Make ``benches/`` and (if protoprompt is not installed) ``python/`` importable."""
    if sys.path[:1] != [str(BENCH_DIR)]:
        if str(BENCH_DIR) in sys.path:
            sys.path.remove(str(BENCH_DIR))
        sys.path.insert(0, str(BENCH_DIR))
    import importlib.util

    if importlib.util.find_spec("protoprompt") is None:
        sys.path.insert(0, str(REPO / "python"))


ensure_paths()

# protoprompt is imported inside the functions: a child process must be able to time its
# own first import.
from history_gen import generate, new_user_message, next_turn  # noqa: E402

ENCODING = "o200k_base"
DEFAULT_SIZES = (1000, 10000)

WHOLE_TURN_TARGETS: dict[int, dict[str, float]] = {
    10_000: {"next": 20.0},
    100_000: {"next": 100.0, "restart": 50.0, "first": 1.0},
}
"""Whole SDK turns at 128k, windowed reads against the SDK alone, measured in one run (each
number from a fresh process): ``next`` and ``restart`` = at least that many times faster
than the SDK alone's next turn; ``first`` = the first turn ever at most that share of the
SDK alone's first turn (issue 21)."""


def turn_targets(row: dict[str, Any]) -> dict[str, tuple[float, float, bool]]:
    """The targets of :data:`WHOLE_TURN_TARGETS` for a :func:`whole_turns` row: name ->
    (measured ratio, target, met)."""
    targets = WHOLE_TURN_TARGETS.get(row["items"] - 3) or WHOLE_TURN_TARGETS.get(row["items"], {})
    measured = {
        "next": row["sdk_next"] / row["windowed_next"],
        "restart": row["sdk_next"] / row["windowed_restart"],
        "first": row["windowed_first"] / row["sdk_first"],
    }
    return {
        name: (measured[name], target, measured[name] <= target)
        if name == "first"
        else (measured[name], target, measured[name] >= target)
        for name, target in targets.items()
    }


DEFAULT_BUDGETS = (8000, 128000, 400000)


def output_reserve_for(budget: int) -> int:
    """8k output reserve, capped at 1/8 of the budget (an 8k window cannot reserve 8k)."""
    return min(8000, budget // 8)


# --------------------------------------------------------------------------------------------
# Cases


@dataclass
class Case:
    """One benchmark history: the previous turn's view and the current one, as JSON."""

    label: str
    prev_json: str  # history before the new turn (n items)
    prev_new_input: list[dict[str, Any]]
    json: str  # history now (n + 3 items)
    new_input: list[dict[str, Any]]
    n_items: int = 0
    json_bytes: int = 0

    def history(self) -> list[dict[str, Any]]:
        return json.loads(self.json)

    def prev_history(self) -> list[dict[str, Any]]:
        return json.loads(self.prev_json)


def make_case(size: int, mix: str, seed: int = 0) -> Case:
    """``generate(size)`` as the previous turn's history, plus the 3 items of one more turn."""
    prev = generate(size, mix, seed)
    turn = next_turn(seed, mix)
    cur = prev + turn
    s = json.dumps(cur, ensure_ascii=False)
    return Case(
        label=f"{mix}-{size}",
        prev_json=json.dumps(prev, ensure_ascii=False),
        prev_new_input=[turn[0]],
        json=s,
        new_input=[new_user_message(seed)],
        n_items=len(cur),
        json_bytes=len(s.encode("utf-8")),
    )


def case_from_items(items: list[dict[str, Any]], label: str) -> Case:
    """A case from a real history: the previous turn is everything before the last user
    message (when there is one), the new input a fresh user message."""
    last_user = max((i for i, it in enumerate(items) if it.get("role") == "user"), default=None)
    if last_user is None or last_user == 0:
        last_user = max(0, len(items) - 3)
    prev = items[:last_user]
    prev_new = items[last_user : last_user + 1] or [new_user_message(1)]
    s = json.dumps(items, ensure_ascii=False)
    return Case(
        label=label,
        prev_json=json.dumps(prev, ensure_ascii=False),
        prev_new_input=prev_new,
        json=s,
        new_input=[new_user_message(0)],
        n_items=len(items),
        json_bytes=len(s.encode("utf-8")),
    )


def copy_db(db_path: str, directory: str) -> str:
    """Copy a SQLite database (with its WAL files) into ``directory``; return the copy."""
    import shutil

    if not os.path.isfile(db_path):
        raise FileNotFoundError(f"no such database: {db_path}")
    copy = os.path.join(directory, "user-session.db")
    shutil.copyfile(db_path, copy)
    for suffix in ("-wal", "-shm"):
        if os.path.exists(db_path + suffix):
            shutil.copyfile(db_path + suffix, copy + suffix)
    return copy


def load_sqlite_session(
    db_path: str, session_id: str, directory: str | None = None
) -> tuple[list[dict[str, Any]], str]:
    """Items of a user's ``SQLiteSession``, read from a copy (the file itself is untouched).

    Returns the items and the path of the copy."""
    from agents.memory import SQLiteSession

    copy = copy_db(db_path, directory or tempfile.mkdtemp(prefix="protoprompt-bench-db-"))
    session = SQLiteSession(session_id, copy)
    try:
        return asyncio.run(session.get_items()), copy
    finally:
        session.close()


# --------------------------------------------------------------------------------------------
# Small statistics helpers


def summary(times: list[float]) -> dict[str, float]:
    return {
        "min": min(times),
        "median": statistics.median(times),
        "max": max(times),
        "rounds": len(times),
    }


def ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:,.1f}"


# --------------------------------------------------------------------------------------------
# protoprompt and reference, in process


def pack_pp(history, new_input, budget: int):
    import protoprompt

    return protoprompt.pack(
        history, new_input, budget, output_reserve=output_reserve_for(budget), encoding=ENCODING
    )


def warm_setup_pp(case: Case, budget: int) -> list[dict[str, Any]]:
    """Untimed part of a warm round: pack the previous turn, then decode the current history."""
    pack_pp(case.prev_history(), case.prev_new_input, budget)
    return case.history()


def time_warm_pp(case: Case, budget: int, rounds: int = 3) -> list[float]:
    out = []
    for _ in range(rounds):
        hist = warm_setup_pp(case, budget)
        t0 = time.perf_counter()
        pack_pp(hist, case.new_input, budget)
        out.append(time.perf_counter() - t0)
    return out


def pack_index(index, history, new_input, budget: int):
    return index.pack(
        history, new_input, budget, output_reserve=output_reserve_for(budget), encoding=ENCODING
    )


def warm_setup_index(case: Case, budget: int):
    """Untimed part of a warm round for a session's HistoryIndex: a new index packs the
    previous turn (the index now holds that history), then the current history is decoded
    afresh (the SDK hands over new objects every turn)."""
    import protoprompt

    index = protoprompt.HistoryIndex()
    pack_index(index, case.prev_history(), case.prev_new_input, budget)
    return index, case.history()


class RefRunner:
    """A reference packer kept across turns (its memo is its warm state)."""

    def __init__(self) -> None:
        from reference_packer import ReferencePacker

        self.packer = ReferencePacker(ENCODING, warm=True)

    def pack(self, history, new_input, budget: int):
        return self.packer.pack(
            history, new_input, budget, output_reserve=output_reserve_for(budget)
        )

    def warm_setup(self, case: Case, budget: int) -> list[dict[str, Any]]:
        self.pack(case.prev_history(), case.prev_new_input, budget)
        return case.history()


def time_warm_ref(case: Case, budget: int, rounds: int = 3) -> list[float]:
    out = []
    for _ in range(rounds):
        runner = RefRunner()  # memo filled by the previous turn only
        hist = runner.warm_setup(case, budget)
        t0 = time.perf_counter()
        runner.pack(hist, case.new_input, budget)
        out.append(time.perf_counter() - t0)
    return out


def same_result(pp, ref) -> tuple[bool, str]:
    """Compare a protoprompt PackResult with a ReferenceResult; explain the first difference."""
    if pp.kept_history != ref.kept_history:
        a, b = set(pp.kept_history), set(ref.kept_history)
        return False, (
            f"kept items differ: protoprompt only {sorted(a - b)[:10]}, "
            f"reference only {sorted(b - a)[:10]}"
        )
    for name in ("new_input_tokens", "dependency_tokens", "history_tokens", "used", "remaining"):
        if getattr(pp, name) != getattr(ref, name):
            a, b = getattr(pp, name), getattr(ref, name)
            return False, f"{name}: protoprompt {a} != reference {b}"
    return True, ""


# --------------------------------------------------------------------------------------------
# SDK overhead


class SdkOverhead:
    """``prepare_input_with_session`` on a file ``SQLiteSession`` holding the history."""

    def __init__(
        self,
        history: list[dict[str, Any]],
        workdir: str | None = None,
        *,
        db_path: str | None = None,
        session_id: str = "bench",
    ) -> None:
        """Preload a new database with ``history``, or (``db_path``) use an existing copy
        of a user's database that already holds ``history`` under ``session_id``."""
        from agents.memory import SQLiteSession
        from agents.run_internal.session_persistence import prepare_input_with_session

        self._prepare = prepare_input_with_session
        self._dir = workdir or tempfile.mkdtemp(prefix="protoprompt-bench-sdk-")
        self._owns_db = db_path is None
        self.db_path = db_path or os.path.join(self._dir, f"sdk-{os.getpid()}-{id(self)}.db")
        self.session = SQLiteSession(session_id, self.db_path)
        self.loop = asyncio.new_event_loop()  # persistent, like an application's loop
        if self._owns_db:
            self.loop.run_until_complete(self.session.add_items(history))
        self.n_items = len(history)
        from reference_packer import dedup_key

        keys = [dedup_key(it) for it in history]
        self.n_duplicates = sum(1 for k in keys if k is not None) - len({k for k in keys if k})

    def run(self, new_input: list[dict[str, Any]]) -> int:
        prepared, _ = self.loop.run_until_complete(
            self._prepare(list(new_input), self.session, lambda h, n: h + n)
        )
        return len(prepared)

    def time(self, new_input, rounds: int = 3, warmup: int = 1) -> list[float]:
        for _ in range(warmup):
            self.run(new_input)
        out = []
        for _ in range(rounds):
            gc.collect()
            t0 = time.perf_counter()
            n = self.run(new_input)
            out.append(time.perf_counter() - t0)
            assert n == self.expected_len(new_input)
        return out

    def expected_len(self, new_input) -> int:
        """Items the SDK sends: everything, minus what its de-duplication collapses
        (streamed outputs sharing a key; nothing is pruned in these histories)."""
        return self.n_items - self.n_duplicates + len(new_input)

    def close(self) -> None:
        self.session.close()
        self.loop.close()
        if not self._owns_db:
            return
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(self.db_path + suffix)
            except OSError:
                pass


class SessionTurn:
    """One warm turn through the SDK with ``ProtoPromptSession`` and its callback, against the
    same turn with a pass-through callback on a plain ``SQLiteSession`` (same database
    content): ``prepare_input_with_session`` end to end, so protoprompt's whole cost is in
    the difference — comparing the rows with the index in ``get_items``, and the callback.

    Setup (untimed): a database holding the previous turn's history; the session runs that
    turn (its index syncs), then stores the turn's items like the SDK does.
    """

    def __init__(self, case: Case, budget: int, workdir: str) -> None:
        import shutil

        from agents.memory import SQLiteSession

        from protoprompt import MemoryStore, TokenBudgetedContextBuilder
        from protoprompt.integrations import ProtoPromptSession

        self.case, self.budget = case, budget
        self.loop = asyncio.new_event_loop()
        base = os.path.join(workdir, f"turn-{case.label}.db")
        if not os.path.exists(base):
            seed = SQLiteSession("bench", base)
            self.loop.run_until_complete(seed.add_items(case.prev_history()))
            seed.close()
        self.db = os.path.join(workdir, f"turn-{case.label}-{os.getpid()}-{id(self)}.db")
        shutil.copyfile(base, self.db)
        self.store = MemoryStore()
        self.session = ProtoPromptSession("bench", self.db)
        builder = TokenBudgetedContextBuilder(
            self.store,
            max_tokens=budget,
            output_reserve=output_reserve_for(budget),
            encoding=ENCODING,
        )
        self.callback = self.session.input_callback(builder, system_prompt="Be brief.")
        self.builder = builder
        from agents.run_internal.session_persistence import prepare_input_with_session

        self._prepare = prepare_input_with_session
        self.loop.run_until_complete(
            self._prepare(list(case.prev_new_input), self.session, self.callback)
        )
        n_prev = len(case.prev_history())
        turn_items = case.history()[n_prev:]
        self.loop.run_until_complete(self.session.add_items(turn_items))
        self.plain = SQLiteSession("bench", self.db)

    def run_pp(self) -> Any:
        prepared, _ = self.loop.run_until_complete(
            self._prepare(list(self.case.new_input), self.session, self.callback)
        )
        return prepared

    def run_sdk(self) -> int:
        prepared, _ = self.loop.run_until_complete(
            self._prepare(list(self.case.new_input), self.plain, lambda h, n: h + n)
        )
        return len(prepared)

    def close(self) -> None:
        self.session.close()
        self.plain.close()
        self.store.close()
        self.loop.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(self.db + suffix)
            except OSError:
                pass


# --------------------------------------------------------------------------------------------
# Child process: cold packs and memory


def _child_env() -> dict[str, str]:
    import protoprompt

    env = dict(os.environ)
    paths = [str(BENCH_DIR), str(Path(protoprompt.__file__).resolve().parent.parent)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    try:  # resolve the tiktoken asset once, not in every child
        from reference_tokenizer import find_asset

        env.setdefault("PROTOPROMPT_TIKTOKEN_ASSETS", str(find_asset(ENCODING).parent))
    except Exception:
        pass
    return env


def write_case(case: Case, directory: str) -> tuple[str, str]:
    """Write a case's two histories to JSON files (for child processes)."""
    cur = os.path.join(directory, f"{case.label}.json")
    prev = os.path.join(directory, f"{case.label}.prev.json")
    for path, text in ((cur, case.json), (prev, case.prev_json)):
        if not os.path.exists(path):
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
    return cur, prev


def _spawn_child(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run this file's ``--child`` mode on ``spec`` in a fresh interpreter; its JSON result."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        env=_child_env(),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_child(
    case: Case,
    budget: int,
    directory: str,
    *,
    reference: bool = True,
    warm_rounds: int = 0,
    memory: bool = False,
    timeout: float = 900,
) -> dict[str, Any]:
    """Cold (and optionally warm/memory) measurements in a fresh interpreter."""
    cur, prev = write_case(case, directory)
    spec = {
        "history": cur,
        "prev_history": prev,
        "new_input": case.new_input,
        "prev_new_input": case.prev_new_input,
        "budget": budget,
        "output_reserve": output_reserve_for(budget),
        "encoding": ENCODING,
        "reference": reference,
        "warm_rounds": warm_rounds,
        "memory": memory,
    }
    return _spawn_child(spec, timeout)


COUNTS_TABLE = "protoprompt_token_counts"
SNAPSHOTS_TABLE = "protoprompt_index_snapshots"


def stored_counts(db_path: str) -> int:
    """Token counts ``ProtoPromptSession`` has kept in a database (0 if none)."""
    with contextlib.closing(sqlite3.connect(db_path)) as conn:
        try:
            return int(conn.execute(f"SELECT COUNT(*) FROM {COUNTS_TABLE}").fetchone()[0])
        except sqlite3.OperationalError:
            return 0


def run_session_child(
    db_path: str,
    session_id: str,
    new_input: list[dict[str, Any]],
    budget: int,
    timeout: float = 900,
    *,
    restart: bool = False,
    warm_turn: bool = False,
) -> dict[str, Any]:
    """The first SDK turn of a fresh process through ``ProtoPromptSession`` on an existing
    database: ``prepare_input_with_session`` end to end, and the callback's own share.

    ``restart=False``: the first turn ever served by protoprompt (the token counts and index
    snapshots it keeps in the database are deleted first). ``restart=True``: a process
    restarted after serving the session, which finds what its predecessor kept there.
    ``warm_turn``: then time the next turn in the same process too (``session_warm_s``; its
    items are popped afterwards)."""
    if not restart:
        with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
            conn.execute(f"DROP TABLE IF EXISTS {COUNTS_TABLE}")
            conn.execute(f"DROP TABLE IF EXISTS {SNAPSHOTS_TABLE}")
    spec = {
        "session_db": db_path,
        "session_id": session_id,
        "new_input": new_input,
        "budget": budget,
        "output_reserve": output_reserve_for(budget),
        "encoding": ENCODING,
        "warm_turn": warm_turn,
    }
    return _spawn_child(spec, timeout)


def _restore_peak(session: Any) -> int | None:
    """Peak memory growth of loading the session's index snapshot on a fresh state."""
    from protoprompt.integrations._stores._snapshots import IndexState

    state = session._index_state
    if state.snapshot_at is None or not state.saved_len:
        return None
    fresh = IndexState(state.snapshot_at)
    _, restore_peak, _ = _peak_growth(fresh.restore)
    return restore_peak if len(fresh.index) else None


def _warm_turns(
    loop: asyncio.AbstractEventLoop,
    session: Any,
    spec: dict[str, Any],
    timed: Callable[..., Any],
    spent: list[float],
    reads: list[tuple[float, float]],
) -> tuple[float | None, list[float]]:
    """With ``warm_turn``: the median next turn and each of them (else ``None``, [])."""
    from agents.run_internal.session_persistence import prepare_input_with_session

    warm_all: list[float] = []
    if not spec.get("warm_turn"):
        return None, warm_all
    # The next turns in the same process (median of 3): the model's answer was stored,
    # the user asks again. Their items are popped afterwards: the database is left as
    # it was. (The first of them may also pay a garbage collection of the SDK's freshly
    # read history, which lands in whatever code allocates next.)
    added = 0
    for k in range(3):
        answer = {
            "type": "message",
            "role": "assistant",
            "id": f"msg_bench_warm_{k}",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Noted.", "annotations": []}],
        }
        turn_items = [*spec["new_input"], answer]
        loop.run_until_complete(session.add_items(turn_items))
        added += len(turn_items)
        spent.clear()
        reads.clear()
        loop.run_until_complete(
            prepare_input_with_session([{"role": "user", "content": "And then?"}], session, timed)
        )
        warm_all.append(spent[0] + (max(0.0, reads[0][0] - reads[0][1]) if reads else 0.0))
    for _ in range(added):
        loop.run_until_complete(session.pop_item())
    return statistics.median(warm_all), warm_all


def _time_reads(session: Any) -> list[tuple[float, float]]:
    # What protoprompt's get_items adds to the SDK session's own read (the session reads the
    # rows like SQLiteSession.get_items does, through _sync.read_rows, minus the time it
    # spends there comparing them with the index, which is protoprompt's own; the SDK's
    # read is timed too for sessions that use it).
    # Returns the list each read appends (outer, inner) to.
    from protoprompt.integrations._stores import _sync
    from protoprompt.integrations._stores._snapshots import IndexState

    inner_read = session.inner_session.get_items
    read_rows = _sync.read_rows
    compare = IndexState.compare
    outer_read = session.get_items
    reads: list[tuple[float, float]] = []  # (outer, inner)
    inner_spent: list[float] = []
    compare_spent: list[float] = []

    def timed_compare(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return compare(*args, **kwargs)
        finally:
            compare_spent.append(time.perf_counter() - t)

    async def timed_inner(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await inner_read(*args, **kwargs)
        finally:
            inner_spent.append(time.perf_counter() - t)

    def timed_rows(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        compare_spent.clear()
        try:
            return read_rows(*args, **kwargs)
        finally:
            inner_spent.append(time.perf_counter() - t - sum(compare_spent))

    async def timed_outer(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return await outer_read(*args, **kwargs)
        finally:
            reads.append((time.perf_counter() - t, inner_spent[-1] if inner_spent else 0.0))

    session.inner_session.get_items = timed_inner  # type: ignore[method-assign]
    _sync.read_rows = timed_rows  # type: ignore[assignment]
    IndexState.compare = timed_compare  # type: ignore[method-assign]
    session.get_items = timed_outer  # type: ignore[method-assign]
    return reads


def _session_child(spec: dict[str, Any]) -> None:
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt import MemoryStore, TokenBudgetedContextBuilder
    from protoprompt.integrations import ProtoPromptSession

    loop = asyncio.new_event_loop()
    store = MemoryStore()
    session = ProtoPromptSession(spec["session_id"], spec["session_db"])
    builder = TokenBudgetedContextBuilder(
        store,
        max_tokens=spec["budget"],
        output_reserve=spec["output_reserve"],
        encoding=spec["encoding"],
    )
    t_start = time.perf_counter()
    callback = session.input_callback(builder, system_prompt="Be brief.")
    spent: list[float] = []
    reads = _time_reads(session)  # (outer, inner) of each read

    peaks: list[int | None] = []
    restored: list[int] = []  # items the index held when the callback began

    async def timed(history: list[Any], new_input: list[Any]) -> list[Any]:
        # Peak RSS growth of the callback alone (the tokenizer was started by input_callback
        # and is normally built while the SDK read the history, as in production).
        restored.append(len(session._index_state.index))
        before = _status_kb("VmRSS") if _reset_peak() else None
        t = time.perf_counter()
        try:
            return await callback(history, new_input)
        finally:
            spent.append(time.perf_counter() - t)
            peak = _status_kb("VmHWM") if before is not None else None
            peaks.append(peak - before if peak is not None and before is not None else None)

    prepared, _ = loop.run_until_complete(
        prepare_input_with_session(list(spec["new_input"]), session, timed)
    )
    total = time.perf_counter() - t_start
    plan = builder.last_plan
    read_extra = max(0.0, reads[0][0] - reads[0][1]) if reads else 0.0
    first_callback = spent[0]
    # Loading the index snapshot overlaps the SDK's read (its memory is not in `peaks`):
    # measured again on its own, on a fresh state (the snapshot bytes and the index).
    restore_peak = _restore_peak(session)
    warm, warm_all = _warm_turns(loop, session, spec, timed, spent, reads)
    print(
        json.dumps(
            {
                "session_cold_callback_s": first_callback + read_extra,
                "session_warm_s": warm,
                "session_warm_all_s": warm_all,
                "session_cold_read_extra_s": read_extra,
                "session_cold_turn_s": total,
                "session_cold_peak_bytes": peaks[0],
                "session_restore_peak_bytes": restore_peak,
                "session_restored_items": restored[0] if restored else None,
                "session_cold_items": len(prepared),
                "session_cold_history_tokens": plan.pack.history_tokens if plan else None,
            }
        )
    )
    session.close()
    store.close()
    loop.close()


# --------------------------------------------------------------------------------------------
# Whole turns: SDK alone vs ProtoPromptSession reading everything vs reading a token window

TURN_MODES = ("sdk", "full", "windowed")


def _turn_child(spec: dict[str, Any]) -> None:
    """One process's whole SDK turns (``prepare_input_with_session`` end to end, from the
    session's construction on): ``first_s``, then with ``next_turns`` that many next turns
    (the answer and the question stored, then the next question; median in ``next_s``),
    popped again so the database is left as it was. ``mode``: ``sdk`` = SQLiteSession and
    a pass-through callback; ``full`` / ``windowed`` = ProtoPromptSession with its callback,
    ``windowed_reads`` off / on. ``digests``: each turn's request, for comparing modes."""
    import hashlib

    from agents.memory import SQLiteSession
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt import MemoryStore, TokenBudgetedContextBuilder
    from protoprompt.integrations import ProtoPromptSession

    loop = asyncio.new_event_loop()
    mode, db, sid = spec["mode"], spec["turn_db"], spec["session_id"]
    store = MemoryStore()
    windows: list[int] = []
    reports: list[list[str]] = []  # each turn's TurnReport: read, index, snapshot, store

    def digest(items: list[Any]) -> str:
        return hashlib.sha256(json.dumps(items, sort_keys=True, default=str).encode()).hexdigest()

    gc.collect()
    t0 = time.perf_counter()
    if mode == "sdk":
        session: Any = SQLiteSession(sid, db)

        async def callback(history: list[Any], new_input: list[Any]) -> list[Any]:
            return history + new_input
    else:
        session = ProtoPromptSession(sid, db, windowed_reads=mode == "windowed")
        builder = TokenBudgetedContextBuilder(
            store,
            max_tokens=spec["budget"],
            output_reserve=spec["output_reserve"],
            encoding=spec["encoding"],
        )
        inner_callback = session.input_callback(builder, system_prompt="Be brief.")

        async def callback(history: list[Any], new_input: list[Any]) -> list[Any]:
            windows.append(len(history))
            out = await inner_callback(history, new_input)
            turn = builder.last_plan.turn if builder.last_plan is not None else None
            if turn is not None:
                reports.append([turn.read, turn.index, turn.snapshot, turn.read_line()])
            return out

        callback._protoprompt_turn = inner_callback._protoprompt_turn  # type: ignore[attr-defined]

    def turn(new_input: list[Any]) -> tuple[float, str]:
        t = time.perf_counter()
        prepared, _ = loop.run_until_complete(
            prepare_input_with_session(list(new_input), session, callback)
        )
        return time.perf_counter() - t, digest(prepared)

    _, first_digest = turn(spec["new_input"])
    first = time.perf_counter() - t0  # from the session's construction on
    next_times, digests = [], [first_digest]
    added = 0
    for k in range(spec.get("next_turns", 0)):
        answer = {
            "type": "message",
            "role": "assistant",
            "id": f"msg_turn_bench_{k}",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Noted.", "annotations": []}],
        }
        items = [*spec["new_input"], answer]
        loop.run_until_complete(session.add_items(items))
        added += len(items)
        gc.collect()
        dt, d = turn([{"role": "user", "content": f"And then? ({k})"}])
        next_times.append(dt)
        digests.append(d)
    for _ in range(added):
        loop.run_until_complete(session.pop_item())
    print(
        json.dumps(
            {
                "first_s": first,
                "next_s": statistics.median(next_times) if next_times else None,
                "digests": digests,
                "read_items": windows,
                "reports": reports,
            }
        )
    )
    session.close()
    store.close()
    loop.close()


def run_turn_child(
    db_path: str,
    mode: str,
    new_input: list[dict[str, Any]],
    budget: int,
    *,
    fresh: bool,
    next_turns: int = 0,
    session_id: str = "bench",
    timeout: float = 1800,
) -> dict[str, Any]:
    """:func:`_turn_child` in a fresh interpreter. ``fresh``: the first turn protoprompt
    ever serves on the database (its token counts and index snapshots are deleted first);
    otherwise a restarted process that finds what the previous one kept there."""
    if fresh:
        with contextlib.closing(sqlite3.connect(db_path)) as conn, conn:
            conn.execute(f"DROP TABLE IF EXISTS {COUNTS_TABLE}")
            conn.execute(f"DROP TABLE IF EXISTS {SNAPSHOTS_TABLE}")
    spec = {
        "turn_db": db_path,
        "mode": mode,
        "session_id": session_id,
        "new_input": new_input,
        "budget": budget,
        "output_reserve": output_reserve_for(budget),
        "encoding": ENCODING,
        "next_turns": next_turns,
    }
    return _spawn_child(spec, timeout)


def whole_turns(
    case: Case, budget: int, workdir: str, next_turns: int = 3, rounds: int | None = None
) -> dict[str, Any]:
    """The whole-turn comparison on one stored history, every number from a fresh process:
    the SDK alone (first and next turn), then ProtoPromptSession reading everything and
    reading a token window, each with its first turn ever on the database, then a restart
    (first turn of a new process) and the next turns there. Returns seconds per measurement
    (``<mode>_first``, ``<mode>_restart``, ``<mode>_next``), whether the windowed requests
    equal the full-read ones (``same``), and the items the windowed next turn read.

    The numbers the targets compare (the SDK alone's and the windowed first turns, the
    windowed restart) are medians of ``rounds`` fresh processes each, interleaved so that
    the machine's load hits both alike (default: 3 for histories of 50k items or more,
    where one turn takes seconds, else 1)."""
    from agents.memory import SQLiteSession

    if rounds is None:
        rounds = 3 if case.n_items >= 50_000 else 1
    db = os.path.join(workdir, f"whole-turn-{case.label}-{os.getpid()}.db")
    loop = asyncio.new_event_loop()
    try:
        seed = SQLiteSession("bench", db)
        loop.run_until_complete(seed.add_items(case.history()))
        seed.close()
    finally:
        loop.close()
    out: dict[str, Any] = {"items": case.n_items, "budget": budget, "rounds": rounds}

    def run(mode: str, *, fresh: bool, turns: int = 0) -> dict[str, Any]:
        return run_turn_child(db, mode, case.new_input, budget, fresh=fresh, next_turns=turns)

    try:
        sdk = run("sdk", fresh=True, turns=next_turns)
        out["sdk_next"] = sdk["next_s"]
        f1, f2 = run("full", fresh=True), run("full", fresh=False, turns=next_turns)
        out["full_first"], out["full_restart"], out["full_next"] = (
            f1["first_s"],
            f2["first_s"],
            f2["next_s"],
        )
        sdk_firsts, windowed_firsts = [sdk["first_s"]], []
        for _ in range(rounds - 1):
            windowed_firsts.append(run("windowed", fresh=True)["first_s"])
            sdk_firsts.append(run("sdk", fresh=True)["first_s"])
        w1 = run("windowed", fresh=True)
        windowed_firsts.append(w1["first_s"])
        restarts = [run("windowed", fresh=False)["first_s"] for _ in range(rounds - 1)]
        w2 = run("windowed", fresh=False, turns=next_turns)
        restarts.append(w2["first_s"])
        out["sdk_first"] = statistics.median(sdk_firsts)
        out["windowed_first"] = statistics.median(windowed_firsts)
        out["windowed_restart"] = statistics.median(restarts)
        out["windowed_next"] = w2["next_s"]
        out["same"] = f1["digests"] == w1["digests"] and f2["digests"] == w2["digests"]
        out["windowed_read_items"] = w2["read_items"]
        out["full_read_items"] = f2["read_items"]
        out["windowed_reports"] = w1["reports"] + w2["reports"]
    finally:
        for suffix in ("", "-wal", "-shm"):
            try:
                os.remove(db + suffix)
            except OSError:
                pass
    return out


def _status_kb(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_growth(fn: Callable[[], Any]) -> tuple[Any, int | None, str]:
    """Run ``fn``; return its result and the growth of peak RSS above the RSS before it."""
    import resource

    gc.collect()
    if _reset_peak() and _status_kb("VmHWM") is not None:
        before = _status_kb("VmRSS")
        result = fn()
        peak = _status_kb("VmHWM")
        return result, (peak - before) if peak is not None and before is not None else None, "hwm"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result = fn()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result, after - before, "ru_maxrss (lower bound)"


def _reference_times(
    spec: dict[str, Any], out: dict[str, Any], history_text: str, prev_text: str
) -> None:
    """The reference packer's cold and warm times into ``out`` (as protoprompt's above)."""
    budget, reserve, enc = spec["budget"], spec["output_reserve"], spec["encoding"]
    new_input, prev_new = spec["new_input"], spec["prev_new_input"]
    from reference_packer import ReferencePacker
    from reference_tokenizer import find_asset

    find_asset(enc)  # locating the file is harness work, not packing
    hist = json.loads(history_text)
    t = time.perf_counter()
    packer = ReferencePacker(enc, warm=True)
    out["ref_vocab_s"] = time.perf_counter() - t
    r = packer.pack(hist, new_input, budget, output_reserve=reserve)
    out["ref_cold_s"] = time.perf_counter() - t
    out["ref_kept"] = r.kept_history
    out["ref_totals"] = [
        r.new_input_tokens,
        r.dependency_tokens,
        r.history_tokens,
        r.used,
        r.remaining,
    ]
    ref_warm = []
    for _ in range(spec["warm_rounds"]):
        packer = ReferencePacker(enc, warm=True)
        packer.pack(json.loads(prev_text), prev_new, budget, output_reserve=reserve)
        hist = json.loads(history_text)
        t = time.perf_counter()
        packer.pack(hist, new_input, budget, output_reserve=reserve)
        ref_warm.append(time.perf_counter() - t)
    out["ref_warm_s"] = ref_warm


def _child_main() -> None:
    spec = json.loads(sys.stdin.read())
    if "turn_db" in spec:
        _turn_child(spec)
        return
    if "session_db" in spec:
        _session_child(spec)
        return
    out: dict[str, Any] = {}
    with open(spec["history"], encoding="utf-8") as f:
        history_text = f.read()
    with open(spec["prev_history"], encoding="utf-8") as f:
        prev_text = f.read()
    budget, reserve, enc = spec["budget"], spec["output_reserve"], spec["encoding"]
    new_input, prev_new = spec["new_input"], spec["prev_new_input"]

    t0 = time.perf_counter()
    import protoprompt as pp

    out["pp_import_s"] = time.perf_counter() - t0

    def pp_pack(hist, new):
        return pp.pack(hist, new, budget, output_reserve=reserve, encoding=enc)

    history = json.loads(history_text)
    gc.collect()

    def cold():
        t = time.perf_counter()
        r = pp_pack(history, new_input)
        return r, time.perf_counter() - t

    if spec["memory"]:
        (res, dt), peak, method = _peak_growth(cold)
        out["pp_cold_peak_bytes"], out["memory_method"] = peak, method
    else:
        res, dt = cold()
    out["pp_cold_s"] = dt
    out["pp_kept"] = res.kept_history
    out["pp_totals"] = [
        res.new_input_tokens,
        res.dependency_tokens,
        res.history_tokens,
        res.used,
        res.remaining,
    ]

    def warm_rounds(packer: Callable[[], Any], key: str) -> None:
        """Time the next turn ``warm_rounds`` times: each round a packer from ``packer()`` packs
        the previous turn (untimed), then the current one from fresh copies; the first round's
        peak memory growth goes to ``key + '_peak_bytes'``."""
        times = []
        for i in range(spec["warm_rounds"]):
            pack_fn = packer()
            pack_fn(json.loads(prev_text), prev_new)
            hist = json.loads(history_text)
            gc.collect()

            def call(hist=hist, pack_fn=pack_fn):
                t = time.perf_counter()
                r = pack_fn(hist, new_input)
                dt = time.perf_counter() - t
                assert r.kept_history == out["pp_kept"]
                return dt

            if spec["memory"] and i == 0:
                dt, peak, _ = _peak_growth(call)
                out[key + "_peak_bytes"] = peak
            else:
                dt = call()
            times.append(dt)
        out[key + "_s"] = times

    warm_rounds(lambda: pp_pack, "pp_warm")

    def index_packer() -> Callable[[Any, Any], Any]:
        index = pp.HistoryIndex()
        return lambda hist, new: index.pack(hist, new, budget, output_reserve=reserve, encoding=enc)

    warm_rounds(index_packer, "pp_index_warm")

    if spec["reference"]:
        _reference_times(spec, out, history_text, prev_text)
    print(json.dumps(out))


# --------------------------------------------------------------------------------------------
# Token counting throughput


@dataclass
class Throughput:
    engine: str
    threads: int
    seconds: float
    n_bytes: int
    n_tokens: int
    per_thread_tokens: list[int] = field(default_factory=list)
    #: Each share counted in its own process (the machine's ceiling for threads).
    processes: bool = False

    @property
    def mb_per_s(self) -> float:
        return self.n_bytes / self.seconds / 1e6

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds


def counter(engine: str) -> Callable[[list[str]], int]:
    """``texts -> total tokens`` for ``protoprompt`` (count_tokens_batch) or ``tiktoken``."""
    if engine == "protoprompt":
        import protoprompt

        def count(texts: list[str]) -> int:
            return sum(protoprompt.count_tokens_batch(texts, encoding=ENCODING))
    elif engine == "tiktoken":
        from reference_tokenizer import get_encoding

        enc = get_encoding(ENCODING)

        def count(texts: list[str]) -> int:
            return sum(len(enc.encode_ordinary(t)) for t in texts)
    else:
        raise ValueError(engine)
    return count


def count_in_threads(
    count: Callable[[list[str]], int], texts: list[str], threads: int
) -> list[int]:
    """Deal ``texts`` round-robin into ``threads`` parts; count each part in its own thread."""
    if threads == 1:
        return [count(texts)]
    parts = [texts[i::threads] for i in range(threads)]
    results = [0] * threads
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = count(parts[i])
        except BaseException as e:  # pragma: no cover - surfaced below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    return results


def _process_main(fn: Callable[[], Any], barrier: Any, times: Any, i: int) -> None:
    barrier.wait()
    t0 = time.perf_counter()
    fn()
    times.put((i, t0, time.perf_counter()))


def run_in_processes(fns: list[Callable[[], Any]]) -> float | None:
    """Wall time of running every ``fns[i]`` at once, each in its own forked process.

    The ceiling for threads: separate processes share nothing but the machine (cores,
    caches, memory bandwidth), so ``sequential / this`` is the best any two threads could
    do here. Returns None where ``fork`` is unavailable.
    """
    import multiprocessing as mp

    if "fork" not in mp.get_all_start_methods():
        return None
    ctx = mp.get_context("fork")
    barrier, times = ctx.Barrier(len(fns)), ctx.Queue()
    procs = [
        ctx.Process(target=_process_main, args=(fn, barrier, times, i)) for i, fn in enumerate(fns)
    ]
    for p in procs:
        p.start()
    got = [times.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError("a benchmark process failed")
    return max(e for _, _, e in got) - min(s for _, s, _ in got)


def measure_throughput(
    texts: list[str], engine: str, threads: int, rounds: int = 3, processes: bool = False
) -> Throughput | None:
    """Best of ``rounds``: ``threads`` threads (or, with ``processes``, forked processes)
    each counting a round-robin share of ``texts``. None if processes cannot be forked."""
    count = counter(engine)
    count(texts[:4])  # load the vocabulary outside the timing (forked children inherit it)
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    parts = [texts[i::threads] for i in range(threads)]
    best = None
    tokens: list[int] = []
    for _ in range(rounds):
        if processes:
            dt = run_in_processes([lambda part=part: count(part) for part in parts])
            if dt is None:
                return None
        else:
            t0 = time.perf_counter()
            tokens = count_in_threads(count, texts, threads)
            dt = time.perf_counter() - t0
        best = dt if best is None else min(best, dt)
    if processes:
        tokens = [count(part) for part in parts]
    return Throughput(
        engine, threads, best or 0.0, n_bytes, sum(tokens), tokens, processes=processes
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child_main()
    else:
        print(__doc__)
