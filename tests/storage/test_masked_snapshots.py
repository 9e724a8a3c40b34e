"""The masked costs a session's index has counted travel in its snapshot: a restarted process
finds the token window a warm one finds (before, every tool output counted at an item's
overhead after a restart and the window reached far back: 7x the warm read in the 10k
benchmark). A snapshot written before masked costs were stored (``tests/data/main_format.db``,
written by the main build at d2e9a87) still loads, and the index's masked costs stay right
when the calibration of opaque payloads changes between packs."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import protoprompt as pp

pytest.importorskip("agents")

from agents.memory import SQLiteSession  # noqa: E402
from agents.run_internal.session_persistence import prepare_input_with_session  # noqa: E402

from protoprompt.integrations import ProtoPromptSession  # noqa: E402

import history_gen  # noqa: E402  (benches/, on the path by conftest)
from shared_histories import early_turns  # noqa: E402
from snapshot_stamp import restamp  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"


def _main_format_module() -> Any:
    """``tests/data/make_main_format_db.py``: the history and builder of ``main_format.db``."""
    spec = importlib.util.spec_from_file_location(
        "make_main_format_db", DATA / "make_main_format_db.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAIN = _main_format_module()


class Turns:
    """A session (windowed reads or full reads) with the builder's default masking, and the
    runner's preparation of a turn through it: what each turn read, its report and request."""

    def __init__(self, db: str, windowed: bool, budget: int, session_id: str) -> None:
        self.session = ProtoPromptSession(
            session_id, db, windowed_reads=windowed, snapshot_min_items=8
        )
        self.builder = pp.TokenBudgetedContextBuilder(
            pp.MemoryStore(), max_tokens=budget, output_reserve=200
        )
        callback = self.session.input_callback(self.builder, system_prompt="Be brief.")
        self.reads: list[int] = []
        self.reports: list[tuple[str, str, str]] = []

        async def recording(history: list[Any], new_input: list[Any]) -> list[Any]:
            self.reads.append(len(history))
            return await callback(history, new_input)

        recording._protoprompt_turn = callback._protoprompt_turn  # type: ignore[attr-defined]
        self.callback = recording

    async def turn(self, question: str) -> str:
        prepared, _ = await prepare_input_with_session(
            [{"role": "user", "content": question}], self.session, self.callback
        )
        plan = self.builder.last_plan
        assert plan is not None and plan.turn is not None
        self.reports.append((plan.turn.read, plan.turn.index, plan.turn.snapshot))
        return hashlib.sha256(
            json.dumps(prepared, sort_keys=True, default=str).encode()
        ).hexdigest()

    def masked_counted(self) -> tuple[int, int, tuple[str, int] | None]:
        return self.session._index_state.index._index._masked_counted()

    def close(self) -> None:
        self.session.close()


def _spy_windows(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, int]]:
    """The masked costs (``_masked_counted``: costs, fields, key) and the number of whole
    costs an index held each time a token window was looked for."""
    seen: list[tuple[Any, int]] = []
    real = pp.HistoryIndex.window

    def window(self: pp.HistoryIndex, *args: Any, **kwargs: Any) -> Any:
        seen.append((self._index._masked_counted(), self._index._costs_counted()))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pp.HistoryIndex, "window", window)
    return seen


def _agentic(n: int) -> list[dict[str, Any]]:
    return history_gen.generate(n, "agentic", seed=25)


HISTORIES: dict[str, tuple[Callable[[], list[dict[str, Any]]], int]] = {
    # (history, budget): every item shape of the agentic mix, and long function outputs only
    "agentic": (lambda: _agentic(1500), 30_000),
    "tool_outputs": (MAIN.history, MAIN.MAX_TOKENS),
}


@pytest.mark.parametrize("name", sorted(HISTORIES))
async def test_a_restart_reads_the_window_a_warm_turn_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_process: Callable[[], None], name: str
) -> None:
    make_history, budget = HISTORIES[name]
    items = make_history()
    db = str(tmp_path / "s.db")
    seed = SQLiteSession("s", db)
    await seed.add_items(items)
    seed.close()
    question = "And what is left to do?"

    # The first process: a full read builds the index and counts the window's costs, whole
    # and masked; the snapshot is written with them. A warm turn then reads its window.
    first = Turns(db, True, budget, "s")
    digests = [await first.turn(question)]
    first.session._debug_state(wait_for_save=True)
    assert first.masked_counted()[0] > 0
    digests.append(await first.turn(question))
    first.close()
    assert first.reports[0][:1] == ("full",) and first.reports[1][0] == "window"
    warm = first.reads[1]
    assert warm < len(items) // 2, first.reads

    # A restarted process: the snapshot brings the masked costs, so the restart's window is
    # the warm turn's (without them it read the whole history here).
    new_process()
    windows = _spy_windows(monkeypatch)
    restarted = Turns(db, True, budget, "s")
    digests.append(await restarted.turn(question))
    assert restarted.reports[0] == ("window", "incremental", "loaded"), restarted.reports
    assert restarted.reads[0] <= warm, (restarted.reads, first.reads)
    assert restarted.reads[0] == warm
    # The window was found with the snapshot's masked costs (the fast path taken).
    [((counted, _, key), _)] = windows
    assert counted > 0 and key == ("o200k_base", pp.Masking().excerpt_tokens)
    restarted.close()

    # Every request is the one a session reading the whole history sends.
    full = Turns(db, False, budget, "s")
    assert {await full.turn(question)} == set(digests)
    assert full.reads == [len(items)]
    full.close()


async def test_a_snapshot_of_the_main_format_still_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, new_process: Callable[[], None]
) -> None:
    db = str(tmp_path / "main_format.db")
    shutil.copy(DATA / "main_format.db", db)
    # Written by 0.2.0; the core loads only its own version's snapshots (releases never share
    # them), so the layout under test is restamped with this version (tests/snapshot_stamp.py).
    assert restamp(db, pp.__version__) == ["0.2.0"]
    new_process()
    n = len(MAIN.history())
    question = "And the last invoice?"
    windows = _spy_windows(monkeypatch)
    restarted = Turns(db, True, MAIN.MAX_TOKENS, MAIN.SESSION)
    digests = [await restarted.turn(question)]
    assert restarted.reports[0][2] == "loaded"
    index = restarted.session._index_state.index
    assert index.snapshot_costs_dropped is None
    # The snapshot had no masked costs; its whole costs were reused.
    (masked, whole), *_ = windows
    assert masked == (0, 0, None) and whole > 0
    assert restarted.masked_counted()[0] > 0  # counted after that turn
    digests.append(await restarted.turn(question))
    assert restarted.reports[1][0] == "window" and restarted.reads[1] < n // 2
    restarted.close()
    full = Turns(db, False, MAIN.MAX_TOKENS, MAIN.SESSION)
    assert {await full.turn(question)} == set(digests)
    full.close()


def test_the_main_format_database_holds_a_snapshot_without_masked_costs() -> None:
    import sqlite3

    with sqlite3.connect(DATA / "main_format.db") as conn:
        ((data,),) = conn.execute("SELECT data FROM protoprompt_index_snapshots").fetchall()
        rows = conn.execute("SELECT COUNT(*) FROM agent_messages").fetchone()[0]
    assert rows == len(MAIN.history())
    assert data[:8] == b"PPINDEX\0" and int.from_bytes(data[8:12], "little") == 3
    with pytest.raises(pp.SnapshotError):  # never loadable without its binding
        pp.HistoryIndex.from_snapshot(data)


# --------------------------------------------------------------------------------------------
# The index's masked costs under a change of calibration


def _fernet(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return base64.urlsafe_b64encode(b"\x80" + rng.randbytes(n - 1)).decode()


def test_masked_costs_stay_right_when_the_calibration_changes() -> None:
    """A unit with encrypted reasoning counted masked under one calibration of opaque
    payloads, then packed under another: the reasoning's cost is the new one (the index
    keeps masked costs of tool outputs only, which no calibration changes). Before, the
    old cost was reused and the pack failed (an ``InvalidItemError`` claiming the item had
    changed) or counted the unit at the old cost."""
    history: list[dict[str, Any]] = []
    for t in range(6):
        history += [
            {"role": "user", "content": f"turn {t}"},
            {
                "type": "reasoning",
                "id": f"rs_{t}",
                "summary": [],
                "encrypted_content": _fernet(3000, t),
            },
            {"type": "function_call", "call_id": f"c{t}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{t}", "output": "word " * 800},
            {
                "type": "message",
                "role": "assistant",
                "id": f"m{t}",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok"}],
            },
        ]
    new = [{"role": "user", "content": "next"}]
    masking = pp.Masking()
    masked_packs = 0
    for budget in range(1000, 9000, 200):
        for first, second in ((2.0, 0.25), (0.25, 2.0), (1.0, 2.0), (2.0, 1.0)):
            index = pp.HistoryIndex()
            index.pack(history, new, budget, masking=masking, opaque_scale=first)
            got = index.pack(history, new, budget, masking=masking, opaque_scale=second)
            want = pp.pack(history, new, budget, masking=masking, opaque_scale=second)
            assert (got.items, got.masked, got.used) == (want.items, want.masked, want.used)
            masked_packs += bool(want.masked)
    assert masked_packs > 20


# --------------------------------------------------------------------------------------------
# A restart after an early snapshot, with the builder's default masking


@pytest.mark.parametrize("budget", [140, 200, 220, 300])
async def test_a_restart_after_an_early_snapshot_packs_its_first_turn(
    tmp_path: Path, new_process: Callable[[], None], budget: int
) -> None:
    """The snapshot was written before the last rows were stored, and its index never
    counted the rows before its window: the restarted worker's first turn reads a token
    window and packs it (it raised "before history_offset" when the masked fill's check of
    a turn read before the window), sending what a full read sends."""
    items = early_turns()
    db = str(tmp_path / "s.db")
    seed = SQLiteSession("s", db)
    await seed.add_items(items[:10])

    async def turn(windowed: bool) -> tuple[list[Any], str]:
        session = ProtoPromptSession("s", db, windowed_reads=windowed, snapshot_min_items=4)
        builder = pp.TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=20)
        callback = session.input_callback(builder)
        new = [{"role": "user", "content": "next"}]
        prepared, _ = await prepare_input_with_session(new, session, callback)
        assert builder.last_plan is not None and builder.last_plan.turn is not None
        session._debug_state(wait_for_save=True)
        session.close()
        return prepared, builder.last_plan.turn.snapshot

    await turn(True)
    await seed.add_items(items[10:])
    seed.close()
    new_process()
    got, snapshot = await turn(True)
    assert snapshot == "loaded"
    want, _ = await turn(False)
    assert got == want
