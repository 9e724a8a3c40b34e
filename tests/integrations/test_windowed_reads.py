"""ProtoPromptSession(windowed_reads=True): the runner's read before a turn returns only the
newest stored items the budget can reach. Every request and every stored row must be those
of a session that reads the whole history, whatever happens to the history in between
(pops, other writers, restarts, a huge newest unit, a budget larger than the history), in
``Runner.run``, ``run_sync`` and ``run_streamed``.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from typing import Any

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("agents")

from agents import RunConfig, Runner  # noqa: E402
from agents.memory import SQLiteSession  # noqa: E402
from agents.testing import assistant_message, function_call  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import MemoryScope  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.integrations._turns import _context  # noqa: E402
from protoprompt.integrations._stores import _sync  # noqa: E402

SCOPE = MemoryScope("acme", user="alice")


def turn_script(i: int) -> list[Any]:
    if i % 3 == 1:
        return [
            [function_call("lookup", {"name": f"q{i}"}, call_id=f"call_{i}")],
            [assistant_message(f"answer {i} " + "words " * 30, item_id=f"msg_{i}")],
        ]
    return [[assistant_message(f"answer {i} " + "text " * 30, item_id=f"msg_{i}")]]


@pytest.fixture
def make_side(session_sides: Any) -> Any:
    """``make_side(db, windowed, max_tokens=900, policy="contiguous", **options)``: a
    ``SessionSide`` (conftest.py) with this module's turns, over a session with windowed
    reads (``windowed``) or one reading the whole history without an index; its memory
    holds one fact."""

    def make(
        db: str,
        windowed: bool,
        max_tokens: int = 900,
        policy: str = "contiguous",
        **options: Any,
    ) -> Any:
        return session_sides(
            db,
            turn_script,
            max_tokens=max_tokens,
            policy=policy,
            remember="The customer prefers short answers.",
            windowed_reads=windowed,
            incremental=None if windowed else False,
            **options,
        )

    return make


def assert_same(win: Any, full: Any) -> None:
    assert win.plans == full.plans
    assert win.rows() == full.rows()


@pytest.mark.parametrize("mode", ["run", "streamed", "sync"])
async def test_windowed_turns_send_and_store_what_full_reads_do(tmp_path, mode, make_side) -> None:
    win = make_side(str(tmp_path / "win.db"), windowed=True)
    full = make_side(str(tmp_path / "full.db"), windowed=False)
    for i in range(20):
        await win.turn(i, mode)
        await full.turn(i, mode)
    assert_same(win, full)
    assert full.windows == []
    # The first turn reads everything (no index yet), and so do turns while the whole
    # history fits; later ones read a window that starts ever later.
    assert win.windows[0] is None
    later = win.windows[10:]
    assert all(w is not None and w > 0 for w in later), win.windows
    assert later == sorted(later) and later[-1] > later[0]
    assert any(len(p) < 20 for p in win.plans[4:])  # old history was dropped
    win.close()
    full.close()


async def test_pops_other_writers_restarts_and_a_huge_newest_unit(
    tmp_path, monkeypatch, make_side, new_process
) -> None:
    win = make_side(str(tmp_path / "win.db"), windowed=True, snapshot_min_items=8)
    full = make_side(str(tmp_path / "full.db"), windowed=False)

    async def both(action: Any) -> None:
        for side in (win, full):
            await action(side)

    async def turn(i: int) -> None:
        await both(lambda side: side.turn(i))

    async def pop(side: Any) -> None:
        await side.session.pop_item()

    async def other_writer(side: Any, items: list[Any], pops: int = 0) -> None:
        other = SQLiteSession("chat", side.db)
        for _ in range(pops):
            await other.pop_item()
        await other.add_items(items)
        other.close()

    for i in range(16):
        await turn(i)
    await both(pop)
    await both(pop)
    await turn(16)
    for _ in range(7):  # deeper than one turn: into the indexed history (and the window)
        await both(pop)
    await turn(17)
    # Another writer appends a call whose output answers nothing yet, then the output.
    await both(
        lambda s: other_writer(
            s,
            [
                {
                    "type": "function_call",
                    "call_id": "ext_1",
                    "name": "lookup",
                    "arguments": '{"name": "x"}',
                },
                {"type": "function_call_output", "call_id": "ext_1", "output": "found " * 30},
            ],
        )
    )
    await turn(18)
    await both(lambda s: other_writer(s, [{"role": "user", "content": "replaced " * 10}], pops=1))
    await turn(19)
    assert sum(w is not None for w in win.windows[-4:]) >= 3, win.windows
    # A restart: a new process loads the snapshot (the history is long enough to have one:
    # written at close).
    win.close()
    full.close()
    new_process()
    win2 = make_side(win.db, windowed=True, snapshot_min_items=8)
    full2 = make_side(full.db, windowed=False, snapshot_min_items=8)
    win2.plans, full2.plans = win.plans, full.plans
    for side in (win2, full2):
        await side.turn(20)
    assert win2.windows[-1] is not None  # windowed from the snapshot, not a full read
    # The newest unit alone is larger than the budget: an assistant reply that cannot fit.
    for side in (win2, full2):
        await other_writer(side, [{"role": "assistant", "content": "huge " * 3000}])
        await side.turn(21)
        await side.turn(22)
    assert_same(win2, full2)
    win2.close()
    full2.close()


async def test_a_budget_larger_than_the_history_reads_it_all(tmp_path, make_side) -> None:
    win = make_side(str(tmp_path / "win.db"), windowed=True, max_tokens=1_000_000)
    full = make_side(str(tmp_path / "full.db"), windowed=False, max_tokens=1_000_000)
    for i in range(6):
        await win.turn(i)
        await full.turn(i)
    assert_same(win, full)
    assert all(w is None for w in win.windows)  # nothing to leave out
    win.close()
    full.close()


async def test_reads_outside_the_runner_see_the_whole_history(tmp_path, make_side) -> None:
    win = make_side(str(tmp_path / "win.db"), windowed=True)
    for i in range(10):
        await win.turn(i)
    stored = win.rows()
    assert [json.dumps(i) for i in await win.session.get_items()] == [
        json.dumps(json.loads(r)) for r in stored
    ]
    assert len(await win.session.get_items(limit=3)) == 3
    # A run without this session's callback (another callback, or none) reads everything.
    seen: list[int] = []

    async def other_callback(history: list[Any], new_input: list[Any]) -> list[Any]:
        seen.append(len(history))
        return history + new_input

    await Runner.run(
        win.agent(0),
        "hi",
        session=win.session,
        run_config=RunConfig(session_input_callback=other_callback, tracing_disabled=True),
    )
    assert seen == [len(stored)]
    win.close()


def test_a_read_driven_by_the_event_loop_alone_is_a_full_read(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    plain = SQLiteSession("chat", db)
    items = [{"role": "user", "content": f"m{i}"} for i in range(5)]
    asyncio.run(plain.add_items(items))
    plain.close()
    session = ProtoPromptSession("chat", db, windowed_reads=True)
    assert asyncio.run(session.get_items()) == items  # no caller frame above get_items
    session.close()


async def test_windowed_reads_needs_a_bool_and_a_database_file(tmp_path, make_side) -> None:
    with pytest.raises(TypeError, match="windowed_reads must be a bool"):
        ProtoPromptSession("chat", str(tmp_path / "x.db"), windowed_reads=1)  # type: ignore[arg-type]
    in_memory = make_side(":memory:", windowed=True)
    on_file = make_side(str(tmp_path / "x.db"), windowed=True)
    for i in range(10):
        await in_memory.turn(i)
        await on_file.turn(i)
    # The same turns: token windows on a database file, never on a memory database.
    assert on_file.reports[-1].read == "window", on_file.reports[-1].lines()
    assert [r.read_reason for r in in_memory.reports] == ["memory_database"] * 10
    in_memory.close()
    on_file.close()


def test_pack_of_a_window_is_the_pack_of_the_whole_history() -> None:
    history: list[Any] = []
    for i in range(60):
        history.append({"role": "user", "content": f"q{i} " * (5 + i % 7)})
        history.append(
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"}
        )
        history.append(
            {"type": "function_call_output", "call_id": f"c{i}", "output": "o " * (3 + i % 11)}
        )
        history.append({"role": "assistant", "content": f"a{i} " * (4 + i % 5)})
    new = [{"role": "user", "content": "now"}]
    index = pp.HistoryIndex()
    index.pack(history[:-8], [], 400, encoding="o200k_base")
    w = index.window_start(history[-8:] + new, 400, encoding="o200k_base")
    assert 0 < w < len(history) - 8
    got = index.pack(history[w:], new, 400, encoding="o200k_base", history_offset=w)
    want = pp.pack(history, new, 400, encoding="o200k_base")
    assert got.items == want.items
    assert (got.used, got.history_tokens, got.remaining) == (
        want.used,
        want.history_tokens,
        want.remaining,
    )
    assert list(got.decisions) == list(want.decisions)
    # An offset past what the pack needs names the first item it would read.
    short = pp.HistoryIndex()
    short.pack(history, [], 400, encoding="o200k_base")
    with pytest.raises(pp.InvalidItemError, match="history_offset"):
        short.pack(
            history[-2:], new, 10_000, encoding="o200k_base", history_offset=len(history) - 2
        )


OTHER_ITEMS = [
    [{"role": "user", "content": "from elsewhere " * 8}],
    [{"role": "assistant", "content": "noted " * 20}],
    [{"type": "function_call", "call_id": "ext_{n}", "name": "lookup", "arguments": "{}"}],
    [{"type": "function_call_output", "call_id": "ext_{n}", "output": "found " * 25}],
    [{"type": "reasoning", "id": "rs_ext_{n}", "summary": []}],
    [{"role": "assistant", "content": "huge " * 1500}],
]


def _other_items(kind: int, n: int) -> list[Any]:
    return json.loads(json.dumps(OTHER_ITEMS[kind]).replace("{n}", str(n)))


OPS = st.one_of(
    st.tuples(st.just("turn"), st.sampled_from(["run", "streamed", "sync"])),
    st.tuples(st.just("pop"), st.integers(1, 6)),
    st.tuples(
        st.just("write"), st.lists(st.integers(0, len(OTHER_ITEMS) - 1), min_size=1, max_size=3)
    ),
    st.tuples(st.just("restart"), st.just(0)),
)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(OPS, min_size=4, max_size=12),
    st.sampled_from([500, 900, 2500]),
    st.sampled_from(["contiguous", "greedy"]),
)
def test_random_turns_pops_writers_and_restarts(
    make_side, new_process, ops, max_tokens, policy
) -> None:
    """Random runs of turns (all three Runner entry points), pops, other writers and
    restarts from the snapshot, after a history long enough for windows: a windowed
    session sends and stores exactly what a session reading everything does."""
    asyncio.run(_random_session(make_side, new_process, ops, max_tokens, policy))


async def _random_session(
    make_side: Any, new_process: Any, ops: list[tuple[str, Any]], max_tokens: int, policy: str
) -> None:
    options = {"snapshot_min_items": 16}
    with tempfile.TemporaryDirectory() as tmp:
        win = make_side(f"{tmp}/win.db", True, max_tokens, policy, **options)
        full = make_side(f"{tmp}/full.db", False, max_tokens, policy, **options)
        windows: list[int | None] = []
        try:
            step = 0
            for _ in range(12):
                step += 1
                await win.turn(step)
                await full.turn(step)
            for op, arg in ops:
                step += 1
                if op == "turn":
                    await win.turn(step, arg)
                    await full.turn(step, arg)
                elif op == "pop":
                    for side in (win, full):
                        for _ in range(arg):
                            await side.session.pop_item()
                elif op == "write":
                    for side in (win, full):
                        other = SQLiteSession("chat", side.db)
                        for kind in arg:
                            await other.add_items(_other_items(kind, step))
                        other.close()
                else:
                    windows += win.windows
                    plans = (win.plans, full.plans)
                    win.close()
                    full.close()
                    new_process()
                    win = make_side(win.db, True, max_tokens, policy, **options)
                    full = make_side(full.db, False, max_tokens, policy, **options)
                    win.plans, full.plans = plans
            step += 1
            await win.turn(step)
            await full.turn(step)
            assert_same(win, full)
            windows += win.windows
            if policy == "greedy":
                assert all(w is None for w in windows)
            elif max_tokens == 500:
                assert any(w is not None for w in windows)
        finally:
            win.close()
            full.close()


async def test_a_shared_index_changed_between_the_read_and_the_callback(
    tmp_path, make_side
) -> None:
    """Two objects of one stored session share its index. If the other one runs a turn
    between this one's windowed read and its callback, the window is checked against the
    index again: still the same rows before it -> the request of the whole history; rows
    before the window gone -> a clear error, never the window packed alone.

    White-box: the runner gives no point between its read and the callback to run another
    turn at, so the read (``_read_window``), its hand-off to the callback (``LAST_READ``)
    and the recheck (``_window_keep``) are driven directly."""
    db = str(tmp_path / "win.db")
    win = make_side(db, windowed=True)
    for i in range(20):
        await win.turn(i)
    other = make_side(db, windowed=True)
    assert other.session._debug_state().index_id == win.session._debug_state().index_id
    new_input = [{"role": "user", "content": "what now? " * 5}]
    turn = win.callback._protoprompt_turn  # type: ignore[attr-defined]

    async def read() -> tuple[list[Any], Any]:
        got = await win.session._read_window(turn, new_input)
        assert got is not None and got[1].offset > 0
        return got

    async def callback(window: list[Any], facts: Any) -> list[Any]:
        _context.LAST_READ.set(_context.SessionRead(win.session, facts))
        return await win.callback(json.loads(json.dumps(window)), list(new_input))

    rechecks: list[Any] = []
    real_keep = win.session._window_keep

    def keep(facts: Any) -> Any:
        rechecks.append(real_keep(facts))
        return rechecks[-1]

    win.session._window_keep = keep  # type: ignore[method-assign]
    window, facts = await read()
    await other.turn(20)  # the shared index now holds more rows, with a new version
    full = json.loads(json.dumps(await win.session.get_items()))[: facts.offset + len(window)]
    sent = await callback(window, facts)
    expected = win.callback._protoprompt_turn.builder.build(  # type: ignore[attr-defined]
        full, new_input, system_prompt="Be brief."
    )
    assert [json.dumps(i, sort_keys=True) for i in sent] == [
        json.dumps(i, sort_keys=True) for i in expected.items
    ]
    assert len(rechecks) == 1 and rechecks[0] is not None

    window, facts = await read()
    for _ in range(len(window) + 6):  # past the window's start
        await other.session.pop_item()
    await other.turn(21)
    with pytest.raises(pp.ProtoPromptError, match="run the turn again"):
        await callback(window, facts)
    assert len(rechecks) == 2 and rechecks[1] is None
    win.close()
    other.close()


async def test_rows_that_are_not_json_and_a_failing_read(tmp_path, monkeypatch, make_side) -> None:
    """A row that does not decode is skipped inside a window as SQLiteSession skips it; a
    window read that fails with a database error falls back to the full read."""
    win = make_side(str(tmp_path / "win.db"), windowed=True)
    full = make_side(str(tmp_path / "full.db"), windowed=False)
    for i in range(16):
        await win.turn(i)
        await full.turn(i)
    for side in (win, full):
        conn = sqlite3.connect(side.db)
        with conn:
            conn.execute(
                "INSERT INTO agent_messages (session_id, message_data) "
                "VALUES ('chat', 'not json {')"
            )
        conn.close()
    for i in range(16, 19):
        await win.turn(i)
        await full.turn(i)
    assert all(w is not None for w in win.windows[-3:]), win.windows

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(_sync.RowReader, "read_window", broken)
    await win.turn(19)
    await full.turn(19)
    monkeypatch.undo()
    await win.turn(20)
    await full.turn(20)
    assert win.windows[-1] is not None
    assert_same(win, full)
    win.close()
    full.close()
