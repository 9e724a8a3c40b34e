"""ProtoPromptSession's fast path on every engine its history can live in: a SQLite file,
``SQLAlchemySession`` on SQLite (aiosqlite) and PostgreSQL (psycopg, the one driver
protoprompt uses, and asyncpg, a driver a user may give the SDK), and
``RedisSession`` -- token windows, the incremental index, snapshots and token counts kept
beside the history, shared by workers, with the same trust rules.

Every turn's request is checked against a fresh pack of what the SDK's own session returns
at that moment, and every test asserts that the fast path it is about was taken (or, where
it must not be, that the turn report says why). PostgreSQL and Redis are the servers of
scripts/services.sh (conftest.py: ``session_engine``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from conftest import lookup  # noqa: E402
import protoprompt as pp  # noqa: E402
from protoprompt import TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.turn_report import TurnReport  # noqa: E402

SYSTEM = "Be brief."


def question(i: int) -> str:
    return f"question {i} " + "please " * 20


def answer(i: int) -> Any:
    return assistant_message(f"answer {i} " + "details " * 40, item_id=f"msg_{i}")


class Worker:
    """One worker serving a stored session: a ProtoPromptSession over a new inner session
    with a budgeted callback; ``turn(i)`` runs a turn through ``Runner.run`` and checks its
    request against a fresh pack of the history the SDK's own session reads just before."""

    def __init__(self, engine: Any, sid: str, budget: int = 700, **options: Any) -> None:
        options.setdefault("windowed_reads", True)
        options.setdefault("snapshot_min_items", 16)
        self.session = engine.proto(sid, **options)
        self.builder = TokenBudgetedContextBuilder(None, max_tokens=budget)
        self.fresh = TokenBudgetedContextBuilder(None, max_tokens=budget)
        self.callback = self.session.input_callback(self.builder, system_prompt=SYSTEM)
        self.reference = engine.plain(sid)

    async def turn(self, i: int, script: list[list[Any]] | None = None) -> TurnReport:
        """Turn ``i``; ``script``: the model's outputs, one list per call (default: an
        answer)."""
        history = await self.reference.get_items()
        model = ScriptedModel(script or [[answer(i)]])
        await Runner.run(
            Agent(name="a", model=model, tools=[lookup()]),
            question(i),
            session=self.session,
            run_config=RunConfig(session_input_callback=self.callback, tracing_disabled=True),
        )
        expected = self.fresh.build(
            history, [{"content": question(i), "role": "user"}], system_prompt=SYSTEM
        )
        assert model.calls[0].input == [dict(x) for x in expected.items], f"turn {i}"
        plan = self.builder.last_plan
        assert plan is not None and plan.turn is not None
        return plan.turn


def tool_turn(i: int) -> list[list[Any]]:
    """A turn whose answer calls a tool first."""
    return [[function_call("lookup", {"name": f"n{i}"}, call_id=f"c{i}")], [answer(i)]]


# ------------------------------------------------------------------ raw access per engine


async def execute(engine: Any, statement: str, params: dict[str, Any] | None = None) -> Any:
    """Run SQL on the engine's database directly (as a tool outside the SDK would)."""
    if engine.kind == "sqlite":
        with sqlite3.connect(engine.db) as conn:
            return conn.execute(statement, params or {}).fetchall()
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    db = create_async_engine(engine.url)
    try:
        async with db.begin() as conn:
            result = await conn.execute(text(statement), params or {})
            return result.all() if result.returns_rows else None
    finally:
        await db.dispose()


async def redis(engine: Any) -> Any:
    import redis.asyncio as redis_

    return redis_.from_url(engine.url)


# ------------------------------------------------------------------ the fast path


async def test_turns_read_windows_and_equal_fresh_packs(session_engine: Any) -> None:
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    other = session_engine.plain(sid)  # another worker, without protoprompt, appends
    reports = []
    for i in range(24):
        if i % 5 == 3:
            await other.add_items(
                [{"role": "user", "content": f"written elsewhere {i} " + "words " * 30}]
            )
        reports.append(await worker.turn(i, tool_turn(i) if i % 4 == 1 else None))
    windows = [r for r in reports if r.read == "window"]
    assert len(windows) >= 15, [r.read_line() for r in reports]
    assert all(r.index == "incremental" for r in reports[3:]), [r.index_line() for r in reports]
    assert all(r.count_store == "on" for r in reports), reports[-1].count_store_line()
    assert windows[-1].read_items < windows[-1].history_items / 3
    state = worker.session._debug_state(wait_for_save=True)
    assert state.reads_rows and state.windowed_reads and state.snapshot_items >= 16


async def test_a_new_worker_starts_from_the_snapshot(session_engine: Any, new_process: Any) -> None:
    sid = session_engine.sid()
    first = Worker(session_engine, sid)
    for i in range(30):
        await first.turn(i)
    first.session.close()  # writes the snapshot
    new_process()
    second = Worker(session_engine, sid)
    report = await second.turn(30)
    assert report.snapshot == "loaded", report.snapshot_line()
    assert report.read == "window", report.read_line()
    assert report.index == "incremental", report.index_line()
    report = await second.turn(31)
    assert report.read == "window" and report.snapshot == "in_memory"


async def test_a_rewritten_history_replaces_the_stale_snapshot(
    session_engine: Any, new_process: Any
) -> None:
    """Another worker clears the history and stores it again, as long as the snapshot: the
    next worker reads it whole (the index's last row is gone) and its rebuilt index replaces
    the snapshot, so the worker after it reads a window again (before, every restart read
    the whole history until the index outgrew the stale snapshot)."""
    sid = session_engine.sid()
    first = Worker(session_engine, sid)
    for i in range(30):
        await first.turn(i)
    saved = first.session._debug_state(wait_for_save=True).snapshot_items
    writer = session_engine.plain(sid)
    items = await writer.get_items()
    await writer.clear_session()
    # New rows, as many as the snapshot's, the last one other (Redis keys rows by content).
    await writer.add_items([*items[: saved - 1], {"role": "user", "content": "rewritten"}])
    new_process()
    second = Worker(session_engine, sid)
    report = await second.turn(30)
    assert report.snapshot == "loaded" and report.read == "full", report.lines()
    second.session._debug_state(wait_for_save=True)
    new_process()
    report = await Worker(session_engine, sid).turn(31)
    assert report.snapshot == "loaded" and report.read == "window", report.lines()


async def test_a_new_worker_reads_the_stored_counts(session_engine: Any, new_process: Any) -> None:
    """Without a snapshot (too short a history for one) a new worker classifies the whole
    history, and its token counts come from the count store."""
    sid = session_engine.sid()
    options = {"windowed_reads": False, "snapshot_min_items": 10**9}
    # Texts of this test only: the engine's count table is shared by the run's tests.
    base = 1000 * (1 + int(session_engine.tag, 16) % 10**6)
    first = Worker(session_engine, sid, budget=3000, **options)
    for i in range(10):
        report = await first.turn(base + i)
    assert (report.count_store_writes or 0) > 0, report.count_store_line()
    first.session.close()  # writes the queued counts
    new_process()
    report = await Worker(session_engine, sid, budget=3000, **options).turn(base + 10)
    assert report.index == "rebuilt" and report.snapshot == "none_stored", report.lines()
    assert (report.count_store_hits or 0) >= 8, report.count_store_line()


async def test_pops_and_clears_by_another_worker_are_noticed(
    session_engine: Any, new_process: Any
) -> None:
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(20):
        await worker.turn(i)
    assert (await worker.turn(20)).read == "window"
    new_process()  # the other worker has an index of its own
    popper = session_engine.proto(sid)
    for _ in range(3):
        await popper.pop_item()
    writer = session_engine.plain(sid)
    await writer.add_items([{"role": "user", "content": f"instead {k}"} for k in range(3)])
    report = await worker.turn(21)
    assert report.read == "full", report.read_line()
    assert report.read_reason in ("popped", "rewritten"), report.read_line()
    assert (await worker.turn(22)).read == "window"  # synced again: windows again
    await popper.clear_session()
    await writer.add_items([{"role": "user", "content": "a new start " + "words " * 30}])
    report = await worker.turn(23)
    assert report.read != "window" and report.index == "rebuilt", report.lines()


async def test_rows_that_appear_or_vanish_before_the_window_are_noticed(
    session_engine: Any,
) -> None:
    """A transaction that began before rows already read and committed after them puts its
    row *between* them (PostgreSQL stamps ``created_at`` when a transaction begins; a
    clock set back does it on SQLite); a compaction may prune the oldest rows. Neither is in
    the window: the window is not read then."""
    if session_engine.kind == "redis":
        pytest.skip("a list changes only at its end (the tag test covers Redis)")
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(20):
        await worker.turn(i)
    assert (await worker.turn(20)).read == "window"
    if session_engine.kind != "sqlite":  # SQLiteSession orders by id: no row can go between
        # One turn a second (the rows of a fast test share SQLite's one-second timestamps).
        rows = await execute(
            session_engine,
            "SELECT id FROM agent_messages WHERE session_id = :s ORDER BY created_at, id",
            {"s": sid},
        )
        for n, (row_id,) in enumerate(rows):
            await execute(
                session_engine,
                "UPDATE agent_messages SET created_at = :t WHERE id = :i",
                {"t": datetime(2020, 1, 1) + timedelta(seconds=n), "i": row_id},
            )
        rows = await execute(
            session_engine,
            "SELECT id, created_at FROM agent_messages WHERE session_id = :s "
            "ORDER BY created_at, id",
            {"s": sid},
        )
        await execute(
            session_engine,
            "INSERT INTO agent_messages (session_id, message_data, created_at) VALUES (:s, :d, :t)",
            {"s": sid, "d": '{"role": "user", "content": "late"}', "t": rows[3][1]},
        )
        report = await worker.turn(21)
        assert (report.read, report.read_reason) == ("full", "rewritten"), report.read_line()
        assert (await worker.turn(22)).read == "window"
    first = await execute(
        session_engine,
        "SELECT id FROM agent_messages WHERE session_id = :s ORDER BY id LIMIT 2",
        {"s": sid},
    )
    await execute(
        session_engine,
        f"DELETE FROM agent_messages WHERE id IN ({first[0][0]}, {first[1][0]})",
    )
    report = await worker.turn(23)
    assert (report.read, report.read_reason) == ("full", "rewritten"), report.read_line()
    assert report.index_kept is None and report.index == "rebuilt", report.index_line()


async def test_a_worker_s_own_pop_is_read_whole_and_windows_follow(session_engine: Any) -> None:
    """The correction workflow through the session itself: pop twice, run again."""
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(18):
        await worker.turn(i)
    # The index holds the history up to the last turn's read: two pops take that turn's
    # items only, two more reach into the index. (On Redis any pop changes the session's
    # generation tag: the next turn reads the whole list once.)
    await worker.session.pop_item()
    await worker.session.pop_item()
    report = await worker.turn(18)
    if session_engine.kind == "redis":
        assert (report.read, report.read_reason) == ("full", "rewritten"), report.read_line()
    else:
        assert report.read == "window", report.read_line()
    for _ in range(4):
        await worker.session.pop_item()
    report = await worker.turn(19)
    assert report.read == "full" and report.read_reason in ("popped", "rewritten"), report.lines()
    assert (await worker.turn(20)).read == "window"


# ------------------------------------------------------------------ stored state and trust


async def snapshot_of(engine: Any, sid: str) -> tuple[bytes, bytes]:
    if engine.kind == "redis":
        client = await redis(engine)
        try:
            ids, data = await client.hmget(
                f"{engine.prefix}:{sid}:protoprompt:snapshot", ["ids", "data"]
            )
        finally:
            await client.aclose()
        return ids, data
    rows = await execute(
        engine,
        "SELECT row_ids, data FROM protoprompt_index_snapshots WHERE session_id = :s",
        {"s": sid},
    )
    assert len(rows) == 1
    return bytes(rows[0][0]), bytes(rows[0][1])


async def set_snapshot(engine: Any, sid: str, ids: bytes, data: bytes) -> None:
    if engine.kind == "redis":
        client = await redis(engine)
        try:
            await client.hset(
                f"{engine.prefix}:{sid}:protoprompt:snapshot", mapping={"ids": ids, "data": data}
            )
        finally:
            await client.aclose()
        return
    await execute(
        engine,
        "UPDATE protoprompt_index_snapshots SET row_ids = :i, data = :d WHERE session_id = :s",
        {"s": sid, "i": ids, "d": data},
    )


async def test_damaged_and_foreign_snapshots_are_ignored(
    session_engine: Any, new_process: Any
) -> None:
    a, b = session_engine.sid("a"), session_engine.sid("b")
    for sid in (a, b):
        worker = Worker(session_engine, sid)
        for i in range(24):
            await worker.turn(i)
        worker.session.close()
    ids_a, data_a = await snapshot_of(session_engine, a)
    await set_snapshot(session_engine, b, ids_a, data_a)  # a's snapshot where b's belongs
    damaged = bytearray(data_a)
    damaged[len(damaged) // 2] ^= 0x55
    await set_snapshot(session_engine, a, ids_a, bytes(damaged))
    new_process()
    for sid in (a, b):
        report = await Worker(session_engine, sid).turn(24)
        assert report.snapshot == "ignored", report.snapshot_line()
        assert report.index == "rebuilt" and report.read == "full", report.lines()


async def test_damaged_counts_are_ignored_and_counted_again(
    session_engine: Any, new_process: Any
) -> None:
    sid = session_engine.sid()
    worker = Worker(session_engine, sid, budget=2000, windowed_reads=False)
    for i in range(8):
        await worker.turn(i)
    worker.session.close()
    if session_engine.kind == "redis":
        client = await redis(engine=session_engine)
        key = f"{session_engine.prefix}:protoprompt:counts"
        try:
            for field, value in (await client.hgetall(key)).items():
                n = int.from_bytes(value[:8], "little") + 1
                await client.hset(key, field, n.to_bytes(8, "little") + value[8:])
        finally:
            await client.aclose()
    else:
        await execute(session_engine, "UPDATE protoprompt_token_counts SET tokens = tokens + 1")
    new_process()
    report = await Worker(session_engine, sid, budget=2000, windowed_reads=False).turn(8)
    assert report.count_store == "on" and report.count_store_detail, report.count_store_line()
    assert "damaged counts ignored" in report.count_store_line()
    assert report.count_store_hits == 0


async def test_a_table_dropped_and_created_again_is_another_table(session_engine: Any) -> None:
    """Its ids start over: an index of the old rows must not be taken for the new ones."""
    if session_engine.kind not in ("postgres-asyncpg", "postgres-psycopg"):
        pytest.skip("PostgreSQL tables are bound by their oid")
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(10):
        await worker.turn(i)
    worker.session.close()
    await execute(session_engine, "DROP TABLE agent_messages, agent_sessions")
    again = Worker(session_engine, sid)  # the same process: the same pool
    report = await again.turn(0, [[assistant_message("a different answer " * 20)]])
    assert report.index == "rebuilt" and report.index_held == 0, report.lines()
    for i in range(1, 6):
        await again.turn(i)


# ------------------------------------------------------------------ when a fast path is off


async def test_windowed_reads_off_is_said_on_every_engine(session_engine: Any) -> None:
    sid = session_engine.sid()
    worker = Worker(session_engine, sid, windowed_reads=False)
    for i in range(3):
        report = await worker.turn(i)
    assert (report.read, report.read_reason) == ("full", "windowed_reads_off")
    assert report.index == "incremental" and report.count_store == "on"


async def test_a_memory_database_keeps_no_snapshots_or_counts(tmp_path) -> None:
    pytest.importorskip("aiosqlite")
    from agents.extensions.memory import SQLAlchemySession

    from protoprompt.integrations import ProtoPromptSession

    inner = SQLAlchemySession.from_url("m", url="sqlite+aiosqlite://", create_tables=True)
    session = ProtoPromptSession("m", inner_session=inner, windowed_reads=True)
    builder = TokenBudgetedContextBuilder(None, max_tokens=600)
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    try:
        for i in range(16):
            model = ScriptedModel([[answer(i)]])
            await Runner.run(
                Agent(name="a", model=model),
                question(i),
                session=session,
                run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
            )
        report = builder.last_plan.turn
        assert report.read == "window", report.read_line()
        assert report.snapshot_line() == "snapshot: off (memory database)"
        assert report.count_store_line() == "count store: off (memory database)"
    finally:
        await inner.engine.dispose()


async def test_inner_sessions_it_cannot_read_say_why(tmp_path) -> None:
    pytest.importorskip("aiosqlite")
    pytest.importorskip("redis")
    from agents.extensions.memory import RedisSession, SQLAlchemySession
    from redis.asyncio.cluster import RedisCluster

    from protoprompt.integrations import ProtoPromptSession

    class Decorated(SQLAlchemySession):
        async def get_items(self, limit: int | None = None) -> list[Any]:
            return [{"role": "user", "content": "decorated"}, *await super().get_items(limit)]

    inner = Decorated.from_url(
        "d", url=f"sqlite+aiosqlite:///{tmp_path / 'd.db'}", create_tables=True
    )
    cluster = RedisSession("c", redis_client=RedisCluster(host="localhost", port=6379))
    try:
        for session, detail in (
            (
                ProtoPromptSession("d", inner_session=inner, windowed_reads=True),
                "overrides get_items",
            ),
            (
                ProtoPromptSession("c", inner_session=cluster, windowed_reads=True),
                "RedisSession over a RedisCluster client",
            ),
        ):
            assert session._debug_state().incremental is False
            assert session._no_window == "inner_session"
            assert detail in (session._no_window_detail or "")
        session = ProtoPromptSession("d", inner_session=inner, windowed_reads=True)
        builder = TokenBudgetedContextBuilder(None, max_tokens=600)
        model = ScriptedModel([[answer(0)]])
        await Runner.run(
            Agent(name="a", model=model),
            question(0),
            session=session,
            run_config=RunConfig(
                session_input_callback=session.input_callback(builder), tracing_disabled=True
            ),
        )
        report = builder.last_plan.turn
        assert report.read_reason == "inner_session" and "overrides get_items" in report.read_line()
        assert model.calls[0].input[0] == {"role": "user", "content": "decorated"}
    finally:
        await inner.engine.dispose()


async def test_without_protoprompt_s_own_tables_the_rows_still_go_fast(
    session_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database user that may not create tables (or a Redis ACL): no snapshots or
    counts, and the turn report says why; windows and the index still work."""
    if session_engine.kind not in ("postgres-psycopg", "redis"):
        pytest.skip("the SQLite tables are the SQLite fast path's")
    from protoprompt.integrations._stores import _redis_store, _sqlalchemy_store

    module = _redis_store if session_engine.kind == "redis" else _sqlalchemy_store

    def refused(self: Any) -> None:
        raise PermissionError("permission denied for schema public")

    monkeypatch.setattr(module._Server, "ready", refused)
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(16):
        report = await worker.turn(i)
    assert report.read == "window" and report.index == "incremental", report.lines()
    assert "permission denied" in report.snapshot_line(), report.snapshot_line()
    assert "permission denied" in report.count_store_line(), report.count_store_line()


# ------------------------------------------------------------------ Redis keys


async def test_redis_keys_stay_under_the_prefix_and_expire_with_the_session(
    session_engine: Any,
) -> None:
    if session_engine.kind != "redis":
        pytest.skip("Redis only")
    from agents.extensions.memory import RedisSession

    from protoprompt.integrations import ProtoPromptSession

    sid = session_engine.sid()
    inner = RedisSession.from_url(
        sid, url=session_engine.url, key_prefix=session_engine.prefix, ttl=600
    )
    session = ProtoPromptSession(
        sid, inner_session=inner, windowed_reads=True, snapshot_min_items=8
    )
    builder = TokenBudgetedContextBuilder(None, max_tokens=600)
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    client = await redis(session_engine)
    try:
        for i in range(12):
            await Runner.run(
                Agent(name="a", model=ScriptedModel([[answer(i)]])),
                question(i),
                session=session,
                run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
            )
        session.close()
        assert builder.last_plan.turn.read == "window"
        prefix = session_engine.prefix
        keys = sorted([k.decode() async for k in client.scan_iter(match=f"{prefix}:*")])
        assert keys == sorted(
            [
                f"{prefix}:{sid}",
                f"{prefix}:{sid}:messages",
                f"{prefix}:{sid}:protoprompt:generation",
                f"{prefix}:{sid}:protoprompt:snapshot",
                f"{prefix}:protoprompt:counts",
                f"{prefix}:protoprompt:meta",
            ]
        )
        # The SDK's own hash holds the SDK's fields only.
        assert sorted(await client.hkeys(f"{prefix}:{sid}")) == [
            b"created_at",
            b"session_id",
            b"updated_at",
        ]
        expires = await client.pexpiretime(f"{prefix}:{sid}:messages")
        for key in ("generation", "snapshot"):
            at = await client.pexpiretime(f"{prefix}:{sid}:protoprompt:{key}")
            assert 0 < at <= expires, key
        await session.clear_session()
        left = [k.decode() async for k in client.scan_iter(match=f"{prefix}:{sid}*")]
        # A builder with a summarizer that served sessions in this process (another test's)
        # leaves the cleared session's summary tombstone, which expires within a day.
        tombstone = f"{prefix}:{sid}:protoprompt:summary"
        assert [k for k in left if k != tombstone] == []
        if left:
            assert await client.hget(tombstone, "summary") == b""
            assert 0 < await client.ttl(tombstone) <= 86_400
    finally:
        await client.aclose()
        await inner.close()


async def test_a_forked_worker_uses_connections_of_its_own(session_engine: Any) -> None:
    """A server that forks its workers after serving (gunicorn with a preloaded app): the
    child's turns go through the index and count store it inherited, on connections of its
    own (protoprompt's I/O loop and its engines are made again; the parent's are left
    alone), and the parent goes on unharmed."""
    import asyncio
    import multiprocessing
    import os
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("needs fork")
    sid = session_engine.sid()
    worker = Worker(session_engine, sid)
    for i in range(16):
        await worker.turn(i)

    def child() -> list[str]:
        out: list[str] = []

        async def turns() -> None:
            forked = Worker(session_engine, sid)  # a new inner session: the child's own
            for i in (16, 17):
                report = await forked.turn(i)
                out.append(f"{report.read} {report.count_store} {report.index}")
            forked.session.close()

        # In a thread of its own: the forked thread still looks like it runs the test's loop.
        thread = threading.Thread(target=lambda: asyncio.run(turns()))
        thread.start()
        thread.join(120)
        return out

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=lambda: queue.put(child()))
    proc.start()
    got = await asyncio.to_thread(queue.get, True, 180)
    proc.join(60)
    assert proc.exitcode == 0
    assert got == ["window on incremental", "window on incremental"], got
    report = await worker.turn(18)  # the parent's connections still work
    assert report.count_store == "on" and report.index == "incremental", report.lines()


# ------------------------------------------------------------------ issue 34 #4: the prefix


def _prefix_agent() -> tuple[Any, Any]:
    model = ScriptedModel(
        [
            [function_call("lookup", {"name": "walrus"}, call_id="c1")],
            [assistant_message("one", item_id="m1")],
            [function_call("lookup", {"name": "otter"}, call_id="c2")],
            [assistant_message("two", item_id="m2")],
        ]
    )
    return model, Agent(name="a", model=model, tools=[lookup()], instructions="Use the tool.")


async def _prefix_run(session: Any, agent: Any, text: str, plans: list[Any]) -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=20_000, output_reserve=500)
    config = session.run_config(builder, cache=pp.CachePolicy(), on_call=plans.append)
    await Runner.run(agent, text, session=session, run_config=config)


async def test_another_session_object_continues_the_stored_prefix(session_engine: Any) -> None:
    """Issue 34 #4: the request a run sent last is stored beside the history, so a new
    session object (another worker, a restarted process: a filter with nothing in memory)
    resumes it: its first call repeats that request byte for byte."""
    sid = session_engine.sid("prefix")
    model, agent = _prefix_agent()
    plans: list[Any] = []
    first = session_engine.proto(sid)
    await _prefix_run(first, agent, "question one", plans)
    first.close()  # the latest request is stored before the object closes
    second = session_engine.proto(sid)
    await _prefix_run(second, agent, "question two", plans)
    assert [p.prefix for p in plans] == ["set", "stayed", "stayed", "stayed"], plans
    previous, resumed = model.calls[1].input, model.calls[2].input
    assert resumed[: len(previous)] == previous
    assert plans[2].shared_tokens > 0
    assert "extends the previous request" in plans[2].prefix_reason


def _first_run_in_a_subprocess(db: str, sid: str) -> None:
    code = (
        "import asyncio, sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "from protoprompt.integrations import ProtoPromptSession\n"
        "import test_session_engines as t\n"
        "model, agent = t._prefix_agent()\n"
        f"session = ProtoPromptSession({sid!r}, {db!r})\n"
        "asyncio.run(t._prefix_run(session, agent, 'question one', []))\n"
    )  # no close(): the exit hook writes the stored request
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


async def test_a_restarted_process_continues_the_prefix(tmp_path: Path) -> None:
    """Issue 34 #4 across processes: a run in another process (exiting without closing
    its session), then a run here on the same database resumes its last request."""
    db, sid = str(tmp_path / "s.db"), "restart"
    _first_run_in_a_subprocess(db, sid)
    _, agent = _prefix_agent()
    plans: list[Any] = []
    session = ProtoPromptSession(sid, db)
    await _prefix_run(session, agent, "question two", plans)
    assert plans[0].prefix == "stayed" and plans[0].shared_tokens > 0, plans[0].prefix_reason
    session.close()


def _prefix_row(db: str, sid: str) -> tuple[int, bytes]:
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT version, data FROM protoprompt_prefix_state WHERE session_id = ?", (sid,)
        ).fetchone()
    assert row is not None
    return int(row[0]), bytes(row[1])


def _set_prefix_row(db: str, sid: str, data: bytes) -> None:
    with sqlite3.connect(db) as conn:
        conn.execute(
            "UPDATE protoprompt_prefix_state SET data = ? WHERE session_id = ?", (data, sid)
        )


def _other_format(data: bytes) -> bytes:
    found = json.loads(zlib.decompress(data))
    found["format"] = "protoprompt prefix state 0"
    return zlib.compress(json.dumps(found).encode())


@pytest.mark.parametrize("spoil", ["foreign", "damaged", "other_format"])
async def test_a_foreign_damaged_or_stale_stored_prefix_is_ignored(
    tmp_path: Path, spoil: str
) -> None:
    """A stored request taken from another session (same items, other binding), damaged
    bytes, or another format: the next run starts a new prefix instead of failing, and
    its own request replaces the spoiled one (the run after resumes it)."""
    db = str(tmp_path / "s.db")
    for sid in ("a", "b"):
        model, agent = _prefix_agent()
        session = ProtoPromptSession(sid, db)
        await _prefix_run(session, agent, "question one", [])
        session.close()
    _, data_a = _prefix_row(db, "a")
    _, data_b = _prefix_row(db, "b")
    spoiled = {"foreign": data_a, "damaged": b"\x00garbage", "other_format": _other_format(data_b)}
    _set_prefix_row(db, "b", spoiled[spoil])
    plans: list[Any] = []
    for text in ("question two", "question three"):
        model, agent = _prefix_agent()
        session = ProtoPromptSession("b", db)
        await _prefix_run(session, agent, text, plans)
        session.close()
    assert plans[0].prefix == "set", plans[0].prefix_reason
    assert plans[2].prefix == "stayed" and plans[2].shared_tokens > 0


def test_compare_and_set_keeps_a_newer_record(tmp_path: Path) -> None:
    """Two workers' records of one session: a write on an older version never replaces
    the newer one (the stored prefix between workers)."""
    from protoprompt._storage import sqlite_record
    from protoprompt.integrations._stores._prefix_state import KIND

    db = str(tmp_path / "s.db")
    one, two = (sqlite_record(db, KIND, "messages", "s") for _ in range(2))
    assert one.swap(None, {"version": 1, "data": b"one"}) is True
    assert two.swap(None, {"version": 2, "data": b"two"}) is False  # one's is stored
    assert two.swap(1, {"version": 2, "data": b"two"}) is True
    assert one.swap(1, {"version": 3, "data": b"three"}) is False  # one read an older one
    assert one.load() == {"version": 2, "data": b"two"}


async def test_clearing_the_session_removes_its_stored_prefix(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    session = ProtoPromptSession("c", db)
    await _prefix_run(session, _prefix_agent()[1], "question one", [])
    session.close()
    assert _prefix_row(db, "c")
    session = ProtoPromptSession("c", db)
    await session.clear_session()
    session.close()
    with sqlite3.connect(db) as conn:
        assert not conn.execute("SELECT * FROM protoprompt_prefix_state").fetchall()


# ------------------------------------------- issue 34 #4: the callback's prefix, stored

TURN_BUDGET = 4_000


def _fetch_tool() -> Any:
    from agents import function_tool

    @function_tool
    def fetch(q: str) -> str:
        """Fetch something."""
        return f"{q}: " + "data " * 300

    return fetch


def _turn_agent(runs: int, first: int = 0) -> tuple[Any, Any]:
    """Runs ``first`` to ``runs - 1`` of two tool calls (300-word outputs) and an answer."""
    script: list[Any] = []
    for r in range(first, runs):
        script += [[function_call("fetch", {"q": f"{r}.{s}"}, call_id=f"c{r}_{s}")] for s in (0, 1)]
        script.append([assistant_message(f"answer {r} " + "word " * 10, item_id=f"m{r}")])
    model = ScriptedModel(script)
    return model, Agent(name="a", model=model, tools=[_fetch_tool()], instructions="Use it.")


async def _callback_turn(
    session: Any, agent: Any, r: int, plans: list[Any], head: float | None = None
) -> None:
    """Run ``r`` through the session callback alone (``cache=CachePolicy(head=head)``), then
    wait for its prefix to be stored (two workers serve a session's turns one after the
    other)."""
    from protoprompt.integrations._stores import _turn_state

    builder = TokenBudgetedContextBuilder(None, max_tokens=TURN_BUDGET, output_reserve=300)
    cache = pp.CachePolicy(head=head)
    callback = session.input_callback(builder, cache=cache, on_plan=plans.append)
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    await Runner.run(agent, f"question {r}", session=session, run_config=config)
    stored = _turn_state.of(session._store)
    assert stored is not None, "the engine keeps the callback's prefix"
    stored.wait(5.0)


async def _earlier_exchange(engine: Any, sid: str) -> None:
    """A stored question and answer before the turns (a Redis record is written only while
    the session's list exists: the very first turn of a session is not stored there)."""
    await engine.plain(sid).add_items(
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    )


def _json(item: Any) -> str:
    return json.dumps(item, sort_keys=True)


def _turn_requests(model: Any, runs: int) -> list[list[Any]]:
    """What the model received at each run's first call: the callback's requests."""
    return [list(model.calls[3 * r].input) for r in range(runs)]


def _assert_turns_extend(plans: list[Any], requests: list[list[Any]]) -> None:
    """Every turn that kept the prefix sent the previous turn's request plus what was
    stored since, byte for byte (as JSON)."""
    for n in range(1, len(plans)):
        if plans[n].prefix == "stayed":
            prev, cur = requests[n - 1], requests[n]
            assert [_json(x) for x in cur[: len(prev)]] == [_json(x) for x in prev], f"turn {n}"
            assert plans[n].shared_tokens > 0


@pytest.mark.parametrize("how", ["restart", "two_workers"])
async def test_the_callbacks_prefix_continues_in_another_session_object(
    session_engine: Any, how: str
) -> None:
    """Issue 34 #4 for the session callback: its previous request (cut, masked set, the
    masked copies) is stored beside the history, so a new session object on the same
    database (``restart``: each turn's object closed, the next made anew) or two live
    objects taking turns (``two_workers``) extend the same request, byte for byte: every
    turn after the first move stays, masked copies included."""
    sid = session_engine.sid(f"turns-{how}")
    runs = 9
    model, agent = _turn_agent(runs)
    plans: list[Any] = []
    await _earlier_exchange(session_engine, sid)
    workers = [session_engine.proto(sid), session_engine.proto(sid)]
    for r in range(runs):
        if how == "restart":
            session = session_engine.proto(sid)
        else:
            session = workers[r % 2]
        await _callback_turn(session, agent, r, plans)
        if how == "restart":
            session.close()
    codes = [p.prefix for p in plans]
    # Without the stored prefix every new object's first turn would pack afresh ("set").
    assert codes[0] == "set" and all(c in ("stayed", "moved") for c in codes[1:]), codes
    assert "moved" in codes and codes.count("stayed") >= 5, codes
    assert any(p.prefix == "stayed" and p.pack.masked for p in plans), "masked copies resent"
    _assert_turns_extend(plans, _turn_requests(model, runs))
    assert all(p.used <= TURN_BUDGET for p in plans)
    # The same requests as one session object serving every turn.
    one_sid = session_engine.sid(f"one-{how}")
    one_model, one_agent = _turn_agent(runs)
    one_plans: list[Any] = []
    await _earlier_exchange(session_engine, one_sid)
    one = session_engine.proto(one_sid)
    for r in range(runs):
        await _callback_turn(one, one_agent, r, one_plans)
    assert [p.prefix for p in one_plans] == codes
    got, want = _turn_requests(model, runs), _turn_requests(one_model, runs)
    assert [[_json(x) for x in req] for req in got] == [[_json(x) for x in req] for req in want]


async def _spoil_turn_record(engine: Any, sid: str, data: bytes) -> None:
    """Replace the stored callback prefix's data (its version kept) on ``engine``."""
    if engine.kind == "sqlite":
        with sqlite3.connect(engine.db) as conn:
            conn.execute(
                "UPDATE protoprompt_turn_prefix SET data = ? WHERE session_id = ?", (data, sid)
            )
    elif engine.kind == "redis":
        client = await redis(engine)
        try:
            key = f"{engine.prefix}:{sid}:protoprompt:turn"
            assert await client.exists(key)
            await client.hset(key, "data", data)
        finally:
            await client.aclose()
    else:
        await execute(
            engine,
            "UPDATE protoprompt_turn_prefix SET data = :d WHERE session_id = :s",
            {"d": data, "s": sid},
        )


async def _turn_record(engine: Any, sid: str) -> bytes:
    if engine.kind == "sqlite":
        with sqlite3.connect(engine.db) as conn:
            row = conn.execute(
                "SELECT data FROM protoprompt_turn_prefix WHERE session_id = ?", (sid,)
            ).fetchone()
    elif engine.kind == "redis":
        client = await redis(engine)
        try:
            row = [await client.hget(f"{engine.prefix}:{sid}:protoprompt:turn", "data")]
        finally:
            await client.aclose()
    else:
        rows = await execute(
            engine, "SELECT data FROM protoprompt_turn_prefix WHERE session_id = :s", {"s": sid}
        )
        row = rows[0] if rows else None
    assert row is not None and row[0] is not None
    return bytes(row[0])


def _respoiled(data: bytes, spoil: str, other: bytes) -> bytes:
    """A stored callback prefix spoiled: damaged bytes, another session's record, or one of
    the right form whose digest no longer matches the history (or whose masked copy
    stands for another call)."""
    if spoil == "damaged":
        return b"\x00garbage" + data[:20]
    if spoil == "foreign":
        return other
    found = json.loads(zlib.decompress(data))
    if spoil == "stale":
        found["digest"] = "0" * 32
    else:  # "other_call": a masked copy of another call
        assert found["copies"], "the stored prefix has masked copies"
        found["copies"][0][2]["call_id"] = "not-this-one"
    return zlib.compress(json.dumps(found).encode())


@pytest.mark.parametrize("spoil", ["damaged", "foreign", "stale", "other_call"])
async def test_a_spoiled_stored_callback_prefix_is_ignored(session_engine: Any, spoil: str) -> None:
    """A stored callback prefix that is damaged, another session's, no longer matching the
    stored items, or with a copy that stands for another call is never used: a new
    session object's turn packs afresh (``set``, nothing shared, every request within the
    budget) and its own prefix replaces the spoiled one (the next object's turn stays)."""
    if spoil in ("stale", "other_call") and session_engine.kind not in ("sqlite", "redis"):
        pytest.skip("the form's checks are the engine's same code: SQLite and Redis cover it")
    sid, other_sid = session_engine.sid(f"spoil-{spoil}"), session_engine.sid(f"other-{spoil}")
    runs = 9
    model, agent = _turn_agent(runs)
    plans: list[Any] = []
    await _earlier_exchange(session_engine, sid)
    await _earlier_exchange(session_engine, other_sid)
    for r in range(7):
        session = session_engine.proto(sid)
        await _callback_turn(session, agent, r, plans)
        session.close()
    assert any(p.pack.masked for p in plans), [p.prefix for p in plans]
    other_model, other_agent = _turn_agent(1)
    other = session_engine.proto(other_sid)
    await _callback_turn(other, other_agent, 0, [])
    other.close()
    data = await _turn_record(session_engine, sid)
    await _spoil_turn_record(
        session_engine, sid, _respoiled(data, spoil, await _turn_record(session_engine, other_sid))
    )
    for r in (7, 8):
        session = session_engine.proto(sid)
        await _callback_turn(session, agent, r, plans)
        session.close()
    assert plans[7].prefix in ("set", "moved") and plans[7].shared_tokens == 0, plans[7]
    assert plans[8].prefix == "stayed", plans[8].prefix_reason
    _assert_turns_extend(plans, _turn_requests(model, runs))
    assert all(p.used <= TURN_BUDGET for p in plans)


async def test_clearing_the_session_removes_the_callbacks_stored_prefix(tmp_path: Path) -> None:
    db = str(tmp_path / "s.db")
    _, agent = _turn_agent(1)
    session = ProtoPromptSession("c", db)
    await _callback_turn(session, agent, 0, [])
    session.close()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT * FROM protoprompt_turn_prefix").fetchall()
    session = ProtoPromptSession("c", db)
    await session.clear_session()
    session.close()
    with sqlite3.connect(db) as conn:
        assert not conn.execute("SELECT * FROM protoprompt_turn_prefix").fetchall()


def _turns_in_a_subprocess(db: str, sid: str, runs: int, head: float | None) -> None:
    """``runs`` turns in another process; with ``head=0.0`` one of its moves masked tool
    outputs, else one kept the head."""
    moved = (
        "any(p.pack.masked for p in plans)"
        if head == 0.0
        else "any('kept the head' in p.prefix_reason for p in plans)"
    )
    code = (
        "import asyncio, sys\n"
        f"sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]\n"
        "from protoprompt.integrations import ProtoPromptSession\n"
        "import test_session_engines as t\n"
        f"model, agent = t._turn_agent({runs})\n"
        f"session = ProtoPromptSession({sid!r}, {db!r})\n"
        "async def main():\n"
        "    plans = []\n"
        f"    for r in range({runs}):\n"
        f"        await t._callback_turn(session, agent, r, plans, {head!r})\n"
        f"    assert {moved}, [p.prefix_reason for p in plans]\n"
        "asyncio.run(main())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("head", [None, 0.0], ids=["default-head", "no-head"])
async def test_a_restarted_process_continues_the_callbacks_prefix(
    tmp_path: Path, head: float | None
) -> None:
    """Issue 34 #4 across processes (whose item digests are keyed apart): turns in another
    process up to a move (that kept the head by default; that masked tool outputs without
    one), then the next turn here on the same database extends that process's last
    request, head or masked copies included: the request one session object serving every
    turn sends, byte for byte."""
    # The first stay after a move that masked tool outputs (with the head: after one that
    # kept it and masked the outputs after it).
    db, runs = str(tmp_path / "s.db"), 7 if head == 0.0 else 8
    _turns_in_a_subprocess(db, "restart", runs, head)
    plans: list[Any] = []
    session = ProtoPromptSession("restart", db)
    await _callback_turn(session, _turn_agent(runs + 1, first=runs)[1], runs, plans, head)
    session.close()
    reference: list[Any] = []
    one = ProtoPromptSession("one", str(tmp_path / "one.db"))
    _, agent = _turn_agent(runs + 1)
    for r in range(runs + 1):
        await _callback_turn(one, agent, r, reference, head)
    one.close()
    assert reference[-1].prefix == "stayed" and reference[-1].pack.masked
    if head is None:
        reason = reference[-2].prefix_reason
        assert "kept the head" in reason and "after the head" in reason, reason
    assert plans[0].prefix == "stayed", plans[0].prefix_reason
    assert plans[0].shared_tokens == reference[-1].shared_tokens > 0
    assert [_json(x) for x in plans[0].items] == [_json(x) for x in reference[-1].items]


def test_the_stored_digest_reads_only_what_was_appended(monkeypatch: Any) -> None:
    """The callback prefix's content digest is the same from a cold memo (another process)
    and from the memo of the previous write, which digests only the items appended since
    (the fast path, asserted taken); an item edited in place changes it."""
    from protoprompt.integrations._stores import _turn_state

    items = [{"role": "user", "content": f"q{i}", "n": [i, {"b": 1, "a": 2}]} for i in range(50)]
    warm = _turn_state.DigestMemo()
    first = warm.digest(items[:40])
    read: list[Any] = []
    real = _turn_state._item_digest
    monkeypatch.setattr(_turn_state, "_item_digest", lambda x: read.append(x) or real(x))
    assert warm.digest(items) == _turn_state.DigestMemo().digest(items) != first
    assert read[:10] == items[40:] and len(read) == 60  # warm: 10 appended; cold: all 50
    reordered = [{**x, "n": [x["n"][0], {"a": 2, "b": 1}]} for x in items]
    assert _turn_state.DigestMemo().digest(reordered) == warm.digest(items)  # canonical JSON
    edited = [dict(x) for x in items]
    edited[3]["content"] = "edited"
    assert warm.digest(edited) != warm.digest(items)
