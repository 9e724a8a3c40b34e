"""ProtoPromptSession keeps a HistoryIndex between turns: the requests must be exactly those
of a session without it, whatever happens to the stored history (pops, clears, other
writers on the same database).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.memory import SQLiteSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402

SCOPE = MemoryScope("acme", user="alice")


def turn_script(i: int) -> list[Any]:
    if i % 2:
        return [
            [function_call("lookup", {"name": f"q{i}"}, call_id=f"call_{i}")],
            [assistant_message(f"answer {i} " + "words " * 30, item_id=f"msg_{i}")],
        ]
    return [[assistant_message(f"answer {i} " + "text " * 30, item_id=f"msg_{i}")]]


def sides(session_sides: Any) -> Any:
    """``make(db, incremental, **options)``: a ``SessionSide`` (conftest.py) over
    ``ProtoPromptSession("chat", db, incremental=incremental, **options)`` with this
    module's turns (also used by test_index_snapshots)."""

    def make(db: str, incremental: bool | None, **options: Any) -> Any:
        return session_sides(db, turn_script, incremental=incremental, **options)

    return make


@pytest.fixture
def make_side(session_sides: Any) -> Any:
    """See :func:`sides`."""
    return sides(session_sides)


async def reads_rows_itself(session: ProtoPromptSession) -> bool:
    """Whether ``get_items`` reads the stored rows itself (with their row ids, so the index
    is compared with exactly those rows) rather than through the inner session's own
    ``get_items``: a spy on the public ``inner_session`` sees no call then."""
    inner = session.inner_session
    real = inner.get_items
    calls: list[Any] = []

    async def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return await real(*args, **kwargs)

    inner.get_items = spy
    try:
        await session.get_items()
    finally:
        del inner.get_items
    return not calls


async def fast_and_plain(
    make_side: Any, tmp_path: Any, turns: int, **options: Any
) -> tuple[str, Any, Any]:
    """A session with an index (``fast.db``, returned first) and one without (``plain.db``)
    after the same ``turns`` turns (both made by ``make_side`` with ``options``)."""
    fast_db = str(tmp_path / "fast.db")
    fast = make_side(fast_db, incremental=None, **options)
    plain = make_side(str(tmp_path / "plain.db"), incremental=False, **options)
    for i in range(turns):
        await fast.turn(i)
        await plain.turn(i)
    return fast_db, fast, plain


async def test_requests_equal_a_session_without_index_through_pops_clears_and_other_writers(
    tmp_path, monkeypatch, make_side
) -> None:
    fast = make_side(str(tmp_path / "fast.db"), incremental=None)
    plain = make_side(str(tmp_path / "plain.db"), incremental=False)
    assert await reads_rows_itself(fast.session) and not await reads_rows_itself(plain.session)

    async def both(action: Any) -> None:
        for side, db in ((fast, "fast.db"), (plain, "plain.db")):
            await action(side, str(tmp_path / db))

    async def turn(i: int) -> None:
        await both(lambda side, _db: side.turn(i))

    async def pop(side: Any, _db: str) -> None:
        await side.session.pop_item()

    async def other_writer_replaces_last(side: Any, db: str) -> None:
        # Another object (another process, say) pops the newest item and writes a new one:
        # the row count is unchanged, only the row ids tell.
        other = SQLiteSession("chat", db)
        await other.pop_item()
        await other.add_items([{"role": "user", "content": "written elsewhere " * 10}])
        other.close()

    async def other_writer_appends(side: Any, db: str) -> None:
        other = SQLiteSession("chat", db)
        await other.add_items(
            [
                {"role": "user", "content": "appended elsewhere"},
                {"role": "assistant", "content": "noted"},
            ]
        )
        other.close()

    async def clear(side: Any, _db: str) -> None:
        await side.session.clear_session()

    for i in range(5):
        await turn(i)
    before = len(await fast.session.get_items())
    await turn(5)
    # The turn went through the index, which took the whole stored history of that time.
    report = fast.reports[-1]
    assert report.index == "incremental" and report.history_items == before > 0
    # Pops keep the index: it drops the popped items instead of reading everything again.
    from protoprompt import HistoryIndex
    from protoprompt.integrations._stores import _snapshots

    calls: list[str] = []
    for cls, name in ((HistoryIndex, "truncate"), (_snapshots.IndexState, "reset")):
        real = getattr(cls, name)
        monkeypatch.setattr(
            cls, name, lambda self, *a, _r=real, _n=name: (calls.append(_n), _r(self, *a))[1]
        )
    await both(pop)
    await both(pop)
    await turn(6)
    assert calls == []  # the popped rows were last turn's own, never indexed
    for _ in range(6):  # deeper than one turn: into the indexed history
        await both(pop)
    await turn(6)
    assert calls == ["truncate"]
    monkeypatch.undo()
    await both(other_writer_replaces_last)
    await turn(7)
    await both(other_writer_appends)
    await turn(8)
    await both(clear)
    await turn(9)
    await turn(10)

    assert fast.plans == plain.plans
    assert len(fast.plans) >= 11
    # The budget was tight: old history was dropped on the later turns.
    stored = len(await fast.session.get_items())
    assert stored > 0
    assert any(len(p) < 13 for p in fast.plans[4:])
    assert await fast.session.get_items() == await plain.session.get_items()
    fast.close()
    plain.close()


async def test_stale_index_is_detected_when_another_writer_rewrites_indexed_rows(
    tmp_path, make_side
) -> None:
    """Same row count, different rows: without the row check the index would still describe
    the removed tool output and let its unanswered call through."""
    db = str(tmp_path / "s.db")
    side = make_side(db, incremental=None)
    await side.turn(1)  # question, function_call call_1, its output, answer
    await side.turn(3)  # the index now holds turn 1's four items (the first it took)
    report = side.reports[-1]
    assert (report.index, report.index_reason, report.history_items) == ("rebuilt", "new", 4)
    other = SQLiteSession("chat", db)
    for _ in range(6):  # turn 3, then turn 1's answer and tool output
        await other.pop_item()
    await other.add_items([{"role": "user", "content": f"note {k}"} for k in range(6)])
    other.close()
    assert len(await side.session.get_items()) == 8
    await side.turn(5)
    sent = [json.loads(i) for i in side.plans[-1][:-1]]
    assert not any(
        i.get("type") == "function_call" and i.get("call_id") == "call_1" for i in sent
    ), "the unanswered call is invalid and never sent"
    assert any(i.get("content") == "note 0" for i in sent)
    side.close()


async def test_memory_database_and_limits_use_the_right_path(tmp_path, make_side) -> None:
    side = make_side(":memory:", incremental=None)
    assert not await reads_rows_itself(side.session)
    await side.turn(0)
    await side.turn(2)
    # The index took the history, the first it held: turn 0 (question, answer).
    report = side.reports[-1]
    assert (report.index, report.index_reason, report.history_items) == ("rebuilt", "new", 2)
    side.session.session_settings = {"limit": 2}
    await side.turn(4)  # a window of the history: packed without the index, left as it is
    report = side.reports[-1]
    assert report.read == "limit" and report.index == "unused" and report.index_held == 2
    side.close()


async def test_inner_session_limit_is_a_window_packed_without_the_index(tmp_path) -> None:
    inner = SQLiteSession("chat", str(tmp_path / "w.db"), session_settings={"limit": 3})
    session = ProtoPromptSession("chat", inner_session=inner, incremental=True)
    with MemoryStore() as store:
        builder = TokenBudgetedContextBuilder(store, max_tokens=2000, scope=SCOPE)
        reports: list[Any] = []
        callback = session.input_callback(builder, on_plan=lambda p: reports.append(p.turn))
        for i in range(4):
            model = ScriptedModel([[assistant_message(f"a{i}", item_id=f"m{i}")]])
            await Runner.run(
                Agent(name="a", model=model),
                f"q{i}",
                session=session,
                run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
            )
            sent = [i for i in model.calls[-1].input if i.get("role") != "system"]
            assert len(sent) <= 4  # the window of 3 plus the question
        # Every turn packed without the index, which never took an item.
        assert len(reports) == 4
        assert all(r.index == "unused" and r.index_held == 0 for r in reports)
    inner.close()


async def test_session_objects_created_per_request_share_the_index(
    tmp_path, monkeypatch, make_side
) -> None:
    """A server that builds a ProtoPromptSession per request: objects for the same stored
    session share one index (warm turns), pops through one are seen by the next, and every
    request equals that of a session without an index."""

    fast_db, plain_db = str(tmp_path / "fast.db"), str(tmp_path / "plain.db")
    plain = make_side(plain_db, incremental=False)
    shared = None
    plans: list[list[str]] = []
    for i in range(6):
        side = make_side(fast_db, incremental=None)  # a new object for every request
        state = side.session._debug_state()
        if shared is None:
            shared = state.index_id
        assert state.index_id == shared and state.shared
        if i in (3, 5):
            await side.session.pop_item()
            await plain.session.pop_item()
        await side.turn(i)
        await plain.turn(i)
        if i == 2:
            # This request started from the index the earlier ones built (in memory).
            report = side.reports[-1]
            assert report.index == "incremental" and report.index_held > 0
            assert report.snapshot == "in_memory"
        plans += side.plans
        side.close()
    assert plans == plain.plans

    # The pool keeps the most recent indexes within shared_index_bytes.
    other = ProtoPromptSession("someone-else", fast_db, shared_index_bytes=1)
    with MemoryStore() as store:
        builder = TokenBudgetedContextBuilder(store, max_tokens=900, scope=SCOPE)
        model = ScriptedModel([[assistant_message("hi", item_id="m_other")]])
        await Runner.run(
            Agent(name="a", model=model),
            "hello",
            session=other,
            run_config=RunConfig(
                session_input_callback=other.input_callback(builder), tracing_disabled=True
            ),
        )
    # The newest index stayed in the pool; the chat's was dropped from it (its last object
    # still holds it), so a new object for the chat starts from an empty index.
    assert other._debug_state().shared and not side.session._debug_state().shared
    fresh = ProtoPromptSession("chat", fast_db)
    state = fresh._debug_state()
    assert state.index_id != shared and state.index_items == 0 and state.shared
    other.close()
    fresh.close()
    plain.close()


async def test_a_database_created_again_at_the_same_path_does_not_reuse_the_index(
    tmp_path, make_side
) -> None:
    """Same path, same session id, same row ids and count — but a new database file: the
    shared index of the old one must not be used."""
    import os

    fast_db, plain_db = str(tmp_path / "fast.db"), str(tmp_path / "plain.db")
    first = make_side(fast_db, incremental=None)
    await first.turn(1)
    await first.turn(3)
    report = first.reports[-1]
    assert (report.index, report.history_items) == ("rebuilt", 4)  # the index took 4 items
    first.close()
    os.remove(fast_db)
    plain = make_side(plain_db, incremental=False)
    rows = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"new {k} " * 3}
        for k in range(8)
    ]  # row ids 1..8 again, other items and costs
    for db in (fast_db, plain_db):
        writer = SQLiteSession("chat", db)
        await writer.add_items(rows)
        writer.close()
    again = make_side(fast_db, incremental=None)
    for i in (5, 7):  # different items at the same positions and row ids
        await again.turn(i)
        await plain.turn(i)
    # The first turn started from a new, empty index: not the old file's (4 items).
    report = again.reports[0]
    assert (report.index, report.index_reason, report.index_held) == ("rebuilt", "new", 0)
    assert again.plans == plain.plans
    again.close()
    plain.close()


async def test_a_restarted_process_reads_token_counts_from_the_session_database(
    tmp_path, monkeypatch, make_side, new_process
) -> None:
    """Counts of long items are kept in the session's database: after a restart (new pool,
    empty count cache) the first turn reads them instead of tokenising, and its request is
    exactly that of a session without index or store."""
    from protoprompt import SQLiteCountStore

    fast_db, fast, plain = await fast_and_plain(make_side, tmp_path, 4)
    fast.close()  # writes queued counts
    with sqlite3.connect(fast_db) as conn:
        stored = conn.execute("SELECT COUNT(*) FROM protoprompt_token_counts").fetchone()[0]
    assert stored > 0

    new_process()
    answers: list[int | None] = []
    real_get_many = SQLiteCountStore.get_many

    def spy(self: SQLiteCountStore, keys: Any) -> list[int | None]:
        out = real_get_many(self, keys)
        answers.extend(out)
        return out

    monkeypatch.setattr(SQLiteCountStore, "get_many", spy)
    restarted = make_side(fast_db, incremental=None)
    await restarted.turn(4)
    await plain.turn(4)
    assert restarted.plans == plain.plans[-1:]
    assert sum(a is not None for a in answers) > 0  # history counts came from the database
    # One store (one connection) per database, whatever the number of sessions in it.
    other = ProtoPromptSession("someone-else", fast_db)
    store = restarted.session._debug_state().count_store
    assert store is not None and other._debug_state().count_store is store
    other.close()
    restarted.close()
    plain.close()
