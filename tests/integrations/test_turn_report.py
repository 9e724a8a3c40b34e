"""Every fast path of a session turn is observable: the plan says how the history was read
(window or full, and why), how the index was used (incremental, rebuilt, unused, and why),
what happened to the index snapshot and the count store (``plan.turn``, printed by
``explain()``); a fallback that costs more than ten times the fast path logs once at INFO.

The fast paths are asserted to be *taken* on the richest histories (every item shape of
docs/item-graph.md, streamed anonymous tool searches included), not only to give the same
requests; each reason a fast path can be off for has a test that produces it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import RunConfig, Runner  # noqa: E402
from agents.memory import SQLiteSession  # noqa: E402
from agents.run_internal.session_persistence import prepare_input_with_session  # noqa: E402
from history_gen import generate  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import TokenBudgetedContextBuilder, TurnReport  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.turn_report import (  # noqa: E402
    INDEX_REASONS,
    READ_REASONS,
    fallback_cost,
    index_outcome,
)

USER = {"role": "user", "content": "next question"}


def answer(k: int) -> dict[str, Any]:
    return {
        "type": "message",
        "role": "assistant",
        "id": f"msg_turn_{k}",
        "status": "completed",
        "content": [{"type": "output_text", "text": f"answer {k}", "annotations": []}],
    }


def streamed_search(k: int) -> list[dict[str, Any]]:
    """What a model turn with a streamed anonymous tool search stores (TV25)."""
    call = {"type": "tool_search_call", "id": f"ts_t{k}", "arguments": {}, "status": "completed"}
    chunks = [
        {"type": "tool_search_output", "id": f"tso_t{k}_{j}", "tools": [], "status": s}
        for j, s in enumerate(["in_progress", "in_progress", "completed"])
    ]
    return [
        {"type": "reasoning", "id": f"rs_t{k}", "summary": [], "encrypted_content": "e"},
        call,
        *chunks,
        answer(k),
    ]


def seed(db: str, items: list[dict[str, Any]], session_id: str = "s") -> None:
    async def go() -> None:
        plain = SQLiteSession(session_id, db)
        await plain.add_items(items)
        plain.close()

    asyncio.run(go())


class Turns:
    """A session with its budgeted callback; ``turn()`` runs the runner's preparation of one
    turn (``prepare_input_with_session``) and returns the plan, then stores what a model
    would (``store``)."""

    def __init__(
        self,
        db: str,
        *,
        max_tokens: int = 20_000,
        policy: str = "contiguous",
        session_id: str = "s",
        wrap: bool = False,
        **options: Any,
    ) -> None:
        self.session = ProtoPromptSession(session_id, db, **options)
        self.builder = TokenBudgetedContextBuilder(
            None,
            max_tokens=max_tokens,
            output_reserve=1000,
            policy=policy,  # type: ignore[arg-type]
        )
        self.plans: list[Any] = []
        inner = self.session.input_callback(self.builder, on_plan=self.plans.append)
        if wrap:  # another callback, wrapping this session's

            async def wrapped(history: list[Any], new_input: list[Any]) -> list[Any]:
                return await inner(history, new_input)

            self.callback: Any = wrapped
        else:
            self.callback = inner

    def turn(self, new_input: list[Any] | None = None) -> Any:
        asyncio.run(
            prepare_input_with_session(list(new_input or [USER]), self.session, self.callback)
        )
        return self.plans[-1]

    def store(self, items: list[dict[str, Any]]) -> None:
        asyncio.run(self.session.add_items(items))

    def close(self) -> None:
        self.session.close()


# ----------------------------------------------------------------------- decision tables


@pytest.mark.parametrize(
    ("code", "use", "held", "kept", "expected"),
    [
        ("compared", True, 0, 0, ("rebuilt", "new")),
        ("compared", True, 500, 0, ("rebuilt", "rows_replaced")),
        ("pop_or_clear", True, 500, 0, ("rebuilt", "pop_or_clear")),
        ("longer", True, 500, 0, ("rebuilt", "longer")),
        ("compared", True, 500, 480, ("incremental", None)),
        ("trusted", True, 500, 500, ("incremental", None)),
        ("changed", False, 500, 500, ("unused", "changed")),
        ("not_the_read", False, 500, 500, ("unused", "not_the_read")),
    ],
)
def test_index_outcome_table(code, use, held, kept, expected) -> None:
    assert index_outcome(code, use, held, kept) == expected
    if expected[1] is not None:
        assert expected[1] in INDEX_REASONS


def _use(regrouped_from: int, appended: int, reason: str | None = "r") -> pp.IndexUse:
    return pp.IndexUse(held=5000, appended=appended, regrouped_from=regrouped_from, reason=reason)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        # A full read of 5000 items where a window would read 100: worth a log.
        (dict(read="full", read_reason="no_window", first_kept=4900), ("read", 5000, 100)),
        (dict(read="full", read_reason="another_callback", first_kept=4900), ("read", 5000, 100)),
        # ... not when it is no fallback, or not 10x, or too small to matter.
        (dict(read="full", read_reason="first_turn", first_kept=4900), None),
        (dict(read="full", read_reason="fits", first_kept=0), None),
        (dict(read="full", read_reason="windowed_reads_off", first_kept=4900), None),
        (dict(read="full", read_reason="no_window", first_kept=4000), None),
        (dict(read="full", read_reason="no_window", first_kept=4900, history_items=900), None),
        (dict(read="window", read_reason=None, first_kept=4900), None),
        # A regroup reaching back 5000 items for 3 new ones: worth a log.
        (dict(index_use=_use(0, 3)), ("regroup", 5000, 4)),
        (dict(index_use=_use(4990, 3)), None),
        (dict(index_use=_use(0, 3, reason=None)), None),
    ],
)
def test_fallback_cost_table(kwargs, expected) -> None:
    args: dict[str, Any] = dict(
        read="window",
        read_reason=None,
        history_items=5000,
        first_kept=None,
        index_use=None,
        new_items=1,
    )
    args.update(kwargs)
    assert fallback_cost(**args) == expected


def test_report_lines() -> None:
    report = TurnReport(
        read="full",
        read_reason="no_window",
        read_detail="history[3] and history[9120] are one unit",
        history_items=9200,
        read_items=9200,
        window_row=None,
        window_reach=None,
        index="incremental",
        index_reason=None,
        index_kept=9100,
        index_held=9150,
        snapshot="ignored",
        snapshot_detail="damaged index snapshot: checksum mismatch",
        count_store="failing",
        count_store_detail="read failed: disk I/O error",
        pack_index=pp.IndexUse(9100, 100, 9190, None),
        count_store_hits=0,
        count_store_writes=12,
    )
    assert report.lines() == [
        "read: full (no window provable: history[3] and history[9120] are one unit; 9,200 items)",
        "index: incremental (kept 9,100 of 9,150 items: rows popped or replaced before the "
        "index's end; regrouped from position 9,190; 100 items appended)",
        "snapshot: ignored (damaged index snapshot: checksum mismatch)",
        "count store: 0 hits, 12 new counts (failing: read failed: disk I/O error; counted in "
        "this process)",
    ]
    assert not report.windowed
    assert set(READ_REASONS) >= {
        "first_turn",
        "no_index",
        "greedy_policy",
        "memory_database",
        "fits",
        "popped",
        "another_callback",
        "no_window",
    }


# ------------------------------------------------------- the fast paths, on rich histories


def _same_request(plan: Any, db: str, new_input: list[Any], builder: Any) -> None:
    """The plan's request equals a fresh pack of the whole stored history."""
    rows = sqlite3.connect(db).execute(
        "SELECT message_data FROM agent_messages WHERE session_id = 's' ORDER BY id"
    )
    history = [json.loads(r[0]) for r in rows]
    fresh = builder.build(history, new_input)
    assert [json.dumps(i, sort_keys=True) for i in plan.items] == [
        json.dumps(i, sort_keys=True) for i in fresh.items
    ]


@pytest.mark.parametrize("seed_value", [1, 2])
def test_rich_histories_take_every_fast_path(tmp_path, new_process, seed_value) -> None:
    """On an agentic history of every item shape (streamed shell and anonymous-search
    outputs, programs, approval chains, id-less and long reasoning ...), with streamed
    anonymous searches appended every turn: after the first turn every turn reads a small
    token window and regroups only what is new; a restarted process loads the snapshot,
    reads a window and finds its counts in the database. Each request is a fresh pack."""
    db = str(tmp_path / "rich.db")
    history = generate(3000, "agentic", seed_value)
    assert any(
        a.get("type") == b.get("type") == "tool_search_output" and "call_id" not in a
        for a, b in zip(history, history[1:])
    ), "the history holds a streamed anonymous search"
    seed(db, history)
    t = Turns(db, windowed_reads=True)
    first = t.turn()
    assert (first.turn.read, first.turn.read_reason) == ("full", "first_turn")
    assert (first.turn.index, first.turn.index_reason) == ("rebuilt", "new")
    assert first.turn.snapshot == "none_stored"
    for k in range(4):
        t.store([USER, *streamed_search(k)])
        plan = t.turn()
        report = plan.turn
        assert report.windowed, report.lines()
        assert report.read_items < report.history_items // 10, report.lines()
        assert report.index == "incremental" and report.index_kept is None
        assert report.pack_index is not None and report.pack_index.regrouped <= 12
        assert report.snapshot == "in_memory"
        assert report.count_store == "on"
        assert "read: window from row" in plan.explain()
        _same_request(plan, db, [USER], t.builder)
    t.session._debug_state(wait_for_save=True)
    t.close()
    # A restarted process: the snapshot, a window, the counts kept in the database.
    new_process()
    again = Turns(db, windowed_reads=True)
    plan = again.turn()
    report = plan.turn
    assert report.windowed, report.lines()
    assert report.snapshot == "loaded" and report.snapshot_detail is not None
    assert report.index == "incremental"
    assert report.count_store == "on"  # the snapshot carries the counted costs
    _same_request(plan, db, [USER], again.builder)
    again.close()
    # Without the snapshot, a restarted process reads everything once and finds the token
    # counts of the long texts it packs in the database.
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM protoprompt_index_snapshots")
    new_process()
    third = Turns(db, windowed_reads=True)
    report = third.turn().turn
    assert (report.read_reason, report.snapshot) == ("first_turn", "none_stored")
    assert report.count_store == "on" and (report.count_store_hits or 0) > 0, report.lines()
    third.close()


async def test_a_windowed_run_through_the_runner_on_a_rich_history(tmp_path) -> None:
    """The same through ``Runner.run`` with a scripted model whose turns stream an anonymous
    tool search: the window is read every turn after the first."""
    from agents import Agent
    from agents.testing import ScriptedModel, assistant_message

    db = str(tmp_path / "run.db")
    await asyncio.to_thread(seed, db, generate(2000, "agentic", 3))
    session = ProtoPromptSession("s", db, windowed_reads=True)
    builder = TokenBudgetedContextBuilder(None, max_tokens=16_000, output_reserve=1000)
    plans: list[Any] = []
    config = RunConfig(
        session_input_callback=session.input_callback(builder, on_plan=plans.append),
        tracing_disabled=True,
    )
    for k in range(3):
        agent = Agent(name="a", model=ScriptedModel([[assistant_message(f"ok {k}")]]))
        await Runner.run(agent, f"question {k}", session=session, run_config=config)
        await session.add_items(streamed_search(k))
    assert [p.turn.read for p in plans] == ["full", "window", "window"]
    assert all(p.turn.index == "incremental" for p in plans[1:])
    session.close()


# ------------------------------------------------------------ why a read is not a window


def _chat(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        out.append({"role": "user", "content": f"q{i} " + "word " * 40})
        out.append(answer(i) | {"content": [{"type": "output_text", "text": "w " * 60}]})
    return out


def _second_turn(db: str, items: list[dict[str, Any]], **options: Any) -> Any:
    seed(db, items)
    new_input = options.pop("new_input", None)
    t = Turns(db, max_tokens=options.pop("max_tokens", 3000), **options)
    t.turn()
    t.store([USER, answer(99)])
    plan = t.turn(new_input)
    t.close()
    return plan


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        ({"windowed_reads": False}, "windowed_reads_off"),
        ({"incremental": False}, "no_index"),
        ({"policy": "greedy"}, "greedy_policy"),
        ({"max_tokens": 1_000_000}, "fits"),
        ({"wrap": True}, "another_callback"),
    ],
)
def test_why_a_read_is_full(tmp_path, options, reason) -> None:
    plan = _second_turn(str(tmp_path / "x.db"), _chat(80), **options)
    assert (plan.turn.read, plan.turn.read_reason) == ("full", reason), plan.turn.lines()
    assert f"read: full ({READ_REASONS[reason]}" in plan.explain()


def test_a_session_reads_a_token_window_by_default(tmp_path) -> None:
    plan = _second_turn(str(tmp_path / "x.db"), _chat(80))
    assert plan.turn.read == "window", plan.turn.lines()
    assert "read: window from row " in plan.explain()


def test_a_memory_database_and_an_inner_session_say_so(tmp_path) -> None:
    t = Turns(":memory:", windowed_reads=True)
    t.store(_chat(20))
    t.turn()
    plan = t.turn()
    assert (plan.turn.read_reason, plan.turn.snapshot) == ("memory_database", "off")
    assert (plan.turn.count_store, plan.turn.count_store_detail) == ("off", "memory database")
    t.close()

    class Inner(SQLiteSession):
        async def get_items(self, limit: int | None = None) -> list[Any]:
            return await super().get_items(limit)

    inner = Inner("s", str(tmp_path / "inner.db"))
    session = ProtoPromptSession("s", inner_session=inner, windowed_reads=True)
    builder = TokenBudgetedContextBuilder(None, max_tokens=3000)
    plans: list[Any] = []
    callback = session.input_callback(builder, on_plan=plans.append)
    asyncio.run(inner.add_items(_chat(10)))
    asyncio.run(prepare_input_with_session([USER], session, callback))
    assert plans[-1].turn.read_reason == "inner_session"
    assert plans[-1].turn.index == "unused"  # no index for an inner session by default
    assert plans[-1].turn.count_store == "off"
    inner.close()


def test_no_window_says_which_relation(tmp_path) -> None:
    """The same hosted call id at the start and at the end: one unit across the history."""
    ws = {"type": "web_search_call", "id": "ws_same", "status": "completed", "action": {}}
    items = [{"role": "user", "content": "first"}, ws, answer(1000), *_chat(80)]
    db2 = str(tmp_path / "y.db")
    seed(db2, items)
    t = Turns(db2, max_tokens=3000, windowed_reads=True)
    t.turn()
    t.store([USER, ws, answer(98)])
    plan = t.turn()
    t.close()
    assert (plan.turn.read, plan.turn.read_reason) == ("full", "no_window"), plan.turn.lines()
    assert plan.turn.read_detail == f"the id of history[{len(items) + 1}] is that of history[1]"


def test_rows_popped_past_the_index_and_a_read_outside_the_runner(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    seed(db, _chat(80))
    t = Turns(db, max_tokens=3000, windowed_reads=True)
    t.turn()

    async def other_writer() -> None:
        other = SQLiteSession("s", db)
        await other.pop_item()
        await other.add_items([answer(7), USER])
        other.close()

    asyncio.run(other_writer())
    plan = t.turn()
    assert (plan.turn.read, plan.turn.read_reason) == ("full", "popped"), plan.turn.lines()
    assert plan.turn.index == "incremental" and plan.turn.index_kept is not None

    # The callback called directly after a read of the user's own (in one task).
    async def direct(drop: int) -> Any:
        history = await t.session.get_items()
        await t.callback(history[: len(history) - drop], [USER])
        return t.plans[-1]

    plan = asyncio.run(direct(0))
    assert (plan.turn.read, plan.turn.read_reason) == ("full", "not_runner")
    # ... or with a history no read returned.
    plan = asyncio.run(direct(1))
    assert (plan.turn.read, plan.turn.index, plan.turn.index_reason) == (
        "none",
        "unused",
        "not_the_read",
    )
    t.close()


def test_a_session_limit_and_no_user_text(tmp_path) -> None:
    db = str(tmp_path / "x.db")
    seed(db, _chat(80))
    t = Turns(db, max_tokens=3000, windowed_reads=True, session_settings={"limit": 30})
    t.turn()
    plan = t.turn()
    assert (plan.turn.read, plan.turn.read_reason, plan.turn.read_items) == (
        "limit",
        "session_limit",
        30,
    )
    assert (plan.turn.index, plan.turn.index_reason) == ("unused", "not_the_read")
    t.close()
    # A resumed call whose window would hold no user message: the recall query would come
    # from before it, so the whole history is read.
    db2 = str(tmp_path / "y.db")
    calls = []
    for i in range(200):  # the turn check of a masked pack stops before its user message
        calls.append({"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"})
        calls.append({"type": "function_call_output", "call_id": f"c{i}", "output": "o " * 200})
    seed(db2, [*_chat(5), {"role": "user", "content": "go"}, *calls])
    t = Turns(db2, max_tokens=3000, windowed_reads=True)
    t.turn(
        [{"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": []}]
    )
    t.store([{"type": "function_call", "call_id": "last", "name": "f", "arguments": "{}"}])
    plan = t.turn([{"type": "function_call_output", "call_id": "last", "output": "done"}])
    assert (plan.turn.read, plan.turn.read_reason) == ("full", "no_user_text"), plan.turn.lines()
    t.close()


def test_a_failed_window_read_and_a_failing_count_store(tmp_path, monkeypatch) -> None:
    from protoprompt.integrations._stores import _sync

    db = str(tmp_path / "x.db")
    seed(db, _chat(80))
    t = Turns(db, max_tokens=3000, windowed_reads=True)
    t.turn()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(_sync.RowReader, "read_window", broken)
    store = t.session._index_state.index.count_store
    monkeypatch.setattr(store, "_open_reader", broken)
    t.store([USER, answer(5) | {"content": [{"type": "output_text", "text": "long " * 200}]}])
    plan = t.turn()
    assert (plan.turn.read, plan.turn.read_reason) == ("full", "read_failed")
    assert plan.turn.read_detail == "disk I/O error"
    assert plan.turn.count_store == "failing", plan.turn.lines()
    assert "read failed: disk I/O error" in plan.turn.count_store_line()
    t.close()


# -------------------------------------------------------------------- snapshot, index


def test_snapshot_ignored_and_index_rebuilt_says_why(tmp_path, new_process) -> None:
    db = str(tmp_path / "x.db")
    seed(db, _chat(400))
    t = Turns(db, max_tokens=3000, windowed_reads=True)
    t.turn()
    t.session._debug_state(wait_for_save=True)
    t.close()
    with sqlite3.connect(db) as conn:
        data = conn.execute("SELECT data FROM protoprompt_index_snapshots").fetchone()[0]
        # The middle of the index's own section (the end holds the masked costs, an
        # extension whose damage only drops it).
        mid = len(data) // 3
        damaged = data[:mid] + bytes(10) + data[mid + 10 :]
        conn.execute("UPDATE protoprompt_index_snapshots SET data = ?", (damaged,))
    new_process()
    t = Turns(db, max_tokens=3000, windowed_reads=True)
    plan = t.turn()
    assert plan.turn.snapshot == "ignored", plan.turn.lines()
    assert "snapshot" in (plan.turn.read_detail or "") or plan.turn.read_reason == "first_turn"
    assert "damaged" in (plan.turn.snapshot_detail or "")
    assert (plan.turn.index, plan.turn.index_reason) == ("rebuilt", "new")

    # Rows replaced behind the index (another writer cleared and wrote the history again).
    async def rewrite() -> None:
        other = SQLiteSession("s", db)
        items = await other.get_items()
        await other.clear_session()
        await other.add_items(items)
        other.close()

    asyncio.run(rewrite())
    plan = t.turn()
    assert (plan.turn.index, plan.turn.index_reason) == ("rebuilt", "rows_replaced")
    t.close()
    # A memory database: a pop through the session starts the index again.
    m = Turns(":memory:")
    m.store(_chat(10))
    m.turn()
    asyncio.run(m.session.pop_item())
    plan = m.turn()
    assert (plan.turn.index, plan.turn.index_reason) == ("rebuilt", "pop_or_clear")
    m.close()


# ------------------------------------------------------------------- costly fallbacks log


def test_a_costly_fallback_logs_once_per_session(tmp_path, caplog) -> None:
    db = str(tmp_path / "x.db")
    seed(db, generate(3000, "agentic", 4))
    t = Turns(db, max_tokens=8000, windowed_reads=True, wrap=True)
    with caplog.at_level(logging.INFO, logger="protoprompt"):
        t.turn()
        first = [r for r in caplog.records if "fast path" in r.getMessage()]
        assert first == []  # nothing was indexed yet: no window could have been read
        for k in range(3):
            t.store([USER, answer(k)])
            t.turn()
    logged = [r for r in caplog.records if "fast path" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].levelno == logging.INFO
    assert "another callback" in logged[0].getMessage()
    t.close()
    # A regroup that reaches back to the start for one new item (the new input answers an
    # approval requested first) logs too.
    db2 = str(tmp_path / "y.db")
    request = {
        "type": "mcp_approval_request",
        "id": "mcpr_0",
        "name": "t",
        "server_label": "s",
        "arguments": "{}",
    }
    seed(db2, [request, *_chat(700)])
    caplog.clear()
    t = Turns(db2, max_tokens=1_000_000)
    with caplog.at_level(logging.INFO, logger="protoprompt"):
        t.turn()
        plan = t.turn(
            [{"type": "mcp_approval_response", "approval_request_id": "mcpr_0", "approve": True}]
        )
    assert plan.turn.pack_index.regrouped_from == 0
    assert "approval_request_id of new_input[0]" in plan.turn.index_line()
    logged = [r.getMessage() for r in caplog.records if "fast path" in r.getMessage()]
    assert len(logged) == 1 and "regroup" in logged[0], logged
    t.close()


def test_a_window_widened_by_a_relation_says_so_and_logs(tmp_path, caplog) -> None:
    """A window that a relation stretches to almost the whole history is read, named and
    logged (once) as the fallback it is: the budget reaches a few dozen items."""
    ws = {"type": "web_search_call", "id": "ws_same", "status": "completed", "action": {}}
    db = str(tmp_path / "x.db")
    seed(db, [{"role": "user", "content": "first"}, ws, answer(1000), *_chat(600)])
    t = Turns(db, max_tokens=3000, windowed_reads=True)
    t.turn()
    with caplog.at_level(logging.INFO, logger="protoprompt"):
        # The repeat arrives: it ties the new rows to history[1], no window is provable.
        t.store([USER, ws])
        report = t.turn().turn
        assert (report.read, report.read_reason) == ("full", "no_window"), report.lines()
        # Once indexed, the tie is one unit: the window starts at it, far beyond the budget.
        for k in range(2):
            t.store([USER, answer(k)])
            report = t.turn().turn
            assert report.windowed and report.read_items > 1000, report.lines()
            assert (report.window_reach or 0) < 100
            assert "widened: history[1] and history[" in report.read_line()
    logged = [r.getMessage() for r in caplog.records if "fast path" in r.getMessage()]
    # Each cause once: regrouping the whole tied span, then the widened windows.
    assert len(logged) == 2, logged
    assert "regroup took" in logged[0] and "widened" in logged[1], logged
    t.close()


def test_damaged_counts_and_a_failed_snapshot_write_are_reported(
    tmp_path, new_process, monkeypatch
) -> None:
    from protoprompt.count_store import _TABLE
    from protoprompt.integrations._stores import _snapshots

    db = str(tmp_path / "x.db")
    seed(db, generate(1500, "agentic", 8))
    t = Turns(db, max_tokens=20_000, windowed_reads=True)
    t.turn()
    t.session._debug_state(wait_for_save=True)
    t.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute(f"UPDATE {_TABLE} SET tokens = tokens + 1").rowcount > 0
        conn.execute("DELETE FROM protoprompt_index_snapshots")
    new_process()
    monkeypatch.setattr(_snapshots.Snapshots, "save", lambda *args: "database or disk is full")
    t = Turns(db, max_tokens=20_000, windowed_reads=True)
    report = t.turn().turn
    assert report.count_store == "on"
    assert "damaged counts ignored" in report.count_store_line(), report.lines()
    t.session._debug_state(wait_for_save=True)
    t.store([USER, answer(1)])
    report = t.turn().turn
    assert report.windowed
    assert report.snapshot_line() == (
        "snapshot: not needed (the index is in memory) "
        "(the last snapshot write failed: database or disk is full)"
    )
    t.close()


def test_a_pack_reports_what_it_reused_and_regrouped() -> None:
    """``PackResult.index``: what a ``HistoryIndex.pack`` held, appended and regrouped (a
    plain ``pack`` has no index); the count store's hits and writes."""
    import os

    history = generate(600, "agentic", 9)
    index = pp.HistoryIndex()
    first = index.pack(history[:500], [USER], 50_000)
    assert first.index == pp.IndexUse(held=0, appended=500, regrouped_from=0, reason=None)
    got = index.pack(history, [USER], 50_000)
    assert got.index is not None
    assert (got.index.held, got.index.appended) == (500, 100)
    assert 450 < got.index.regrouped_from <= 500 and got.index.regrouped < 50
    assert got.index.reason == "the caller_id of history[500] is that of history[496]"
    plain = pp.pack(history, [USER], 50_000)
    assert plain.index is None and plain.count_store_hits is None

    class Store:
        def __init__(self) -> None:
            self.data: dict[bytes, int] = {}
            self.secret = os.urandom(16)

        def get_many(self, keys: Any) -> list[int | None]:
            return [self.data.get(k) for k in keys]

        def put_many(self, pairs: Any) -> None:
            self.data.update(pairs)

    from protoprompt import _core

    store = Store()
    _core._clear_count_cache()
    a = pp.HistoryIndex(count_store=store).pack(history, [USER], 50_000)
    assert a.count_store_hits == 0 and (a.count_store_writes or 0) > 0
    _core._clear_count_cache()
    b = pp.HistoryIndex(count_store=store).pack(history, [USER], 50_000)
    assert (b.count_store_hits or 0) > 0 and b.count_store_writes == 0
    assert b.kept_history == a.kept_history
