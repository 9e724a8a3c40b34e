"""ProtoPromptSession over the SDK's other sessions: AdvancedSQLiteSession, SQLAlchemySession
(SQLite through aiosqlite, PostgreSQL through psycopg), EncryptedSession, and RedisSession
(PostgreSQL and redis-server: the test servers of scripts/services.sh).

Over SQLAlchemySession and RedisSession the session takes the fast path (its store reads
the rows with their keys, see tests/storage/test_session_engines.py); over the others the plain
path (``incremental`` is off: their rows cannot be read the way they read them). Either
way every request is a fresh pack of what the inner session returns — also after another
writer changed it, or a branch switch.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402
from agents.memory import SQLiteSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402

SYSTEM = "Answer briefly."
BUDGET = 250


@function_tool
def lookup(name: str) -> str:
    """Look a name up."""
    return f"{name}: " + "found " * 30


# ------------------------------------------------------------------ the inner sessions


async def make_inner(kind: str, sid: str, tmp_path: Path, url: str | None) -> Any:
    if kind == "advanced":
        from agents.extensions.memory import AdvancedSQLiteSession

        return AdvancedSQLiteSession(
            session_id=sid, db_path=tmp_path / "adv.db", create_tables=True
        )
    if kind == "sqlalchemy":
        pytest.importorskip("aiosqlite")
        from agents.extensions.memory import SQLAlchemySession

        return SQLAlchemySession.from_url(
            sid, url=f"sqlite+aiosqlite:///{tmp_path}/sa.db", create_tables=True
        )
    if kind == "postgres":
        pytest.importorskip("psycopg")
        from agents.extensions.memory import SQLAlchemySession

        assert url is not None
        return SQLAlchemySession.from_url(
            sid, url=url.replace("postgresql://", "postgresql+psycopg://", 1), create_tables=True
        )
    if kind == "encrypted":
        pytest.importorskip("cryptography")
        from agents.extensions.memory import EncryptedSession

        return EncryptedSession(sid, SQLiteSession(sid, tmp_path / "enc.db"), "a-key", ttl=600)
    assert kind == "redis" and url is not None
    pytest.importorskip("redis")
    from agents.extensions.memory import RedisSession

    session = RedisSession.from_url(sid, url=url)
    await session.clear_session()
    return session


async def close_inner(kind: str, inner: Any) -> None:
    if kind in ("sqlalchemy", "postgres"):
        await inner.clear_session()
        await inner.engine.dispose()
    elif kind == "redis":
        await inner.clear_session()
        await inner.close()
    elif kind == "encrypted":
        inner.underlying_session.close()
    else:
        inner.close()


KINDS = ["advanced", "sqlalchemy", "postgres", "encrypted", "redis"]
STORES = {"sqlalchemy", "postgres", "redis"}
"""The inner sessions whose rows protoprompt reads (the fast path)."""


@pytest.fixture
async def inner(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    kind = request.param
    url = None
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_url")
    session = await make_inner(kind, f"chat-{kind}-{uuid.uuid4().hex[:8]}", tmp_path, url)
    session._protoprompt_kind = kind
    try:
        yield session
    finally:
        await close_inner(kind, session)


def script() -> list[Any]:
    return [
        [function_call("lookup", {"name": "a"}, call_id="c1")],
        [assistant_message("a is found", item_id="msg_1")],
        [function_call("lookup", {"name": "b"}, call_id="c2")],
        [assistant_message("b is found", item_id="msg_2")],
        [assistant_message("done", item_id="msg_3")],
    ]


async def turn(agent: Agent, session: Any, callback: Any, text: str) -> None:
    await Runner.run(
        agent,
        text,
        session=session,
        run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
    )


def fresh_request(history: list[Any], text: str, builder: TokenBudgetedContextBuilder) -> list[Any]:
    plan = builder.build(history, [{"content": text, "role": "user"}], system_prompt=SYSTEM)
    return [dict(i) for i in plan.items]


@pytest.mark.parametrize("inner", KINDS, indirect=True)
async def test_every_request_is_a_fresh_pack_of_the_inner_history(inner: Any) -> None:
    session = ProtoPromptSession(inner.session_id, inner_session=inner)
    builder = TokenBudgetedContextBuilder(None, max_tokens=BUDGET)
    reports: list[Any] = []
    callback = session.input_callback(
        builder, system_prompt=SYSTEM, on_plan=lambda plan: reports.append(plan.turn)
    )
    model = ScriptedModel(script())
    agent = Agent(name="a", model=model, tools=[lookup])
    for n, text in enumerate(["first question", "second question", "third question"]):
        history = await inner.get_items()
        calls_before = len(model.calls)
        if n == 2:  # another writer appends to the store between turns
            await inner.add_items([{"role": "user", "content": "written elsewhere"}])
            history = await inner.get_items()
        await turn(agent, session, callback, text)
        assert model.calls[calls_before].input == fresh_request(history, text, builder)
    # The fast path where protoprompt reads the rows (an index), the plain one elsewhere.
    assert len(reports) == 3
    if inner._protoprompt_kind in STORES:
        assert all(r.index != "unused" for r in reports) and reports[-1].index == "incremental"
    else:
        assert all((r.index, r.index_reason) == ("unused", "no_index") for r in reports)
    stored = await inner.get_items()
    # Only what the SDK persists is stored: never the context message.
    assert not any(i.get("role") == "system" for i in stored)
    assert [i.get("type", "message") for i in stored[:4]] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert stored[-1]["content"][0]["text"] == "done"
    # The budget made the last request drop the oldest turn, in whole units.
    last = model.calls[-1].input
    assert not any(i.get("call_id") == "c1" for i in last)
    # The correction workflow: pop the answer and the question, both come back newest first.
    answer = await session.pop_item()
    question = await session.pop_item()
    assert answer["content"][0]["text"] == "done"
    assert question == {"role": "user", "content": "third question"}
    assert await inner.get_items() == stored[:-2]


async def test_advanced_sqlite_branches_are_what_the_callback_packs(tmp_path: Path) -> None:
    from agents.extensions.memory import AdvancedSQLiteSession

    inner = AdvancedSQLiteSession(
        session_id="chat", db_path=tmp_path / "adv.db", create_tables=True
    )
    try:
        session = ProtoPromptSession("chat", inner_session=inner)
        builder = TokenBudgetedContextBuilder(None, max_tokens=100_000)
        callback = session.input_callback(builder)
        model = ScriptedModel([[assistant_message(t)] for t in ("one", "two", "three")])
        agent = Agent(name="a", model=model)
        await turn(agent, session, callback, "first")
        await turn(agent, session, callback, "second")
        await inner.create_branch_from_turn(2)  # the second turn rewritten on a branch
        branch_history = await inner.get_items()
        assert [i.get("content") for i in branch_history if i.get("role") == "user"] == ["first"]
        await turn(agent, session, callback, "second, again")
        assert model.calls[-1].input == [
            dict(i)
            for i in pp.pack(
                branch_history, [{"content": "second, again", "role": "user"}], 100_000
            ).items
        ]
    finally:
        inner.close()


async def test_redis_session_keeps_its_data_in_the_server(redis_url: str) -> None:
    pytest.importorskip("redis")
    from agents.extensions.memory import RedisSession

    sid = f"durable-{uuid.uuid4().hex[:8]}"
    inner = RedisSession.from_url(sid, url=redis_url)
    await inner.clear_session()
    try:
        session = ProtoPromptSession(sid, inner_session=inner)
        builder = TokenBudgetedContextBuilder(None, max_tokens=100_000)
        model = ScriptedModel([[assistant_message("stored")]])
        await turn(
            Agent(name="a", model=model), session, session.input_callback(builder), "remember me"
        )
        # A second client of the same server (another worker) sees the turn.
        other = RedisSession.from_url(sid, url=redis_url)
        try:
            items = await other.get_items()
            assert items[0] == {"role": "user", "content": "remember me"}
            assert len(items) == 2
        finally:
            await other.close()
    finally:
        await inner.clear_session()
        await inner.close()


async def test_encrypted_session_outside_keeps_the_index(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("cryptography")
    from agents.extensions.memory import EncryptedSession

    clock = [1000]
    monkeypatch.setattr("cryptography.fernet.time.time", lambda: clock[0])
    store = ProtoPromptSession("chat", tmp_path / "h.db")
    session = EncryptedSession("chat", store, "a-key", ttl=100)
    builder = TokenBudgetedContextBuilder(None, max_tokens=100_000)
    callback = store.input_callback(builder)  # no context message: nothing to keep out
    model = ScriptedModel([[assistant_message(t)] for t in ("one", "two", "three", "four")])
    agent = Agent(name="a", model=model)
    for n, text in enumerate(["first", "second", "third", "fourth"]):
        if n == 3:
            clock[0] += 150  # everything stored so far expires: EncryptedSession skips it
        history = await session.get_items()
        await turn(agent, session, callback, text)
        assert model.calls[-1].input == [
            dict(i) for i in pp.pack(history, [{"content": text, "role": "user"}], 100_000).items
        ]
        if n == 2:  # the incremental path was taken: the index holds the 4 items
            report = builder.last_plan.turn
            assert report.index == "incremental" and report.history_items == 4
    assert [i["role"] for i in model.calls[-1].input] == ["user"]
    assert all(i.get("__enc__") == 1 for i in await store.get_items())
    store.close()


async def test_encrypted_session_outside_warns_that_context_is_stored(tmp_path: Path) -> None:
    """Outside the runner (the callback called directly, its result stored by hand), the
    context message reaches ``add_items`` through ``EncryptedSession`` encrypted: it cannot
    be told apart, is stored, and a warning says how to wrap instead."""
    pytest.importorskip("cryptography")
    from agents.extensions.memory import EncryptedSession

    store = ProtoPromptSession("chat", tmp_path / "h.db")
    session = EncryptedSession("chat", store, "a-key")
    callback = store.input_callback(
        TokenBudgetedContextBuilder(None, max_tokens=100_000), system_prompt=SYSTEM
    )
    sent = await callback([], [{"role": "user", "content": "hello"}])
    assert store.pending_context_count == 1
    with pytest.warns(RuntimeWarning, match="inner_session=EncryptedSession"):
        await session.add_items(sent)
    assert [i["role"] for i in await session.get_items()] == ["system", "user"]
    store.close()


async def test_encrypted_session_outside_stores_no_context_message(tmp_path: Path) -> None:
    """``EncryptedSession(ProtoPromptSession(...))``: the items reach the session encrypted,
    so it cannot tell its context message apart. Whatever wraps the session, the SDK must
    not be handed the context message to store: the decrypted history holds the turns'
    questions and answers only, and every request is a fresh build of that history."""
    pytest.importorskip("cryptography")
    from agents.extensions.memory import EncryptedSession

    store = ProtoPromptSession("chat", tmp_path / "h.db")
    session = EncryptedSession("chat", store, "a-key")
    builder = TokenBudgetedContextBuilder(None, max_tokens=100_000)
    callback = store.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel([[assistant_message(f"answer {n}")] for n in range(3)])
    agent = Agent(name="a", model=model)
    for n in range(3):
        history = await session.get_items()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing stored that the session could not see
            await turn(agent, session, callback, f"question {n}")
        assert model.calls[-1].input == fresh_request(history, f"question {n}", builder)
    stored = await session.get_items()
    assert [(i.get("role"), i.get("type")) for i in stored] == [
        ("user", None),
        ("assistant", "message"),
    ] * 3
    assert store.pending_context_count == 0
    store.close()
