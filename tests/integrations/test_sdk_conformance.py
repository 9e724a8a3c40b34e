"""ProtoPromptSession and its callback behave like the SDK's own sessions (issue 13).

The item rules follow what the SDK itself sends (id-less reasoning under
``reasoning_item_id_policy="omit"``, a caller-supplied pending shell call), settings are
validated like ``SQLiteSession``'s, and every optional attribute the 0.22.3 / 0.24.0 runners
and wrapper sessions probe is forwarded, implemented or hidden on purpose (docs/item-graph.md
§11.3). The SDK's own session tests run against ProtoPromptSession in CI as well
(tests/sdk_conformance/, step "SDK conformance" of scripts/test.sh).
"""

from __future__ import annotations

import copy
import inspect
import sqlite3
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402
from agents.memory import (  # noqa: E402
    OpenAIConversationsSession,
    OpenAIResponsesCompactionSession,
    SessionSettings,
    SQLiteSession,
    is_openai_responses_compaction_aware_session,
)
from agents.run_internal.session_persistence import rewind_session_items  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseReasoningItem  # noqa: E402
from openai.types.responses.response_reasoning_item import Summary  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import InvalidNewInputError, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.integrations._sdk._shims import FORWARDED_HOOKS  # noqa: E402

NATIVE_SUFFIX_COMPACTION = hasattr(SQLiteSession, "_get_compaction_snapshot")  # 0.24+
ATOMIC_ENCRYPTED_POP = hasattr(SQLiteSession, "_pop_item_with_validation")  # 0.24+


@function_tool
def lookup(name: str) -> str:
    """Look a name up."""
    return f"{name}: found"


def reasoning(rid: str, text: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=rid, type="reasoning", summary=[Summary(text=text, type="summary_text")]
    )


def callback_for(session: ProtoPromptSession, budget: int = 1_000_000) -> Any:
    return session.input_callback(TokenBudgetedContextBuilder(None, max_tokens=budget))


async def run(agent: Agent, text: Any, session: Any, callback: Any = None, **config: Any) -> Any:
    cfg = RunConfig(session_input_callback=callback, tracing_disabled=True, **config)
    return await Runner.run(agent, text, session=session, run_config=cfg)


async def report_of_turn(session: ProtoPromptSession, text: str) -> Any:
    """The report (``plan.turn``) of a runner turn of ``session`` through its callback."""
    builder = TokenBudgetedContextBuilder(None, max_tokens=1_000_000)
    model = ScriptedModel([[assistant_message(f"{text}: ok")]])
    await run(Agent(name="a", model=model), text, session, session.input_callback(builder))
    assert builder.last_plan is not None
    return builder.last_plan.turn


# ------------------------------------------------------------------ item rules (1, 2)


def omit_script() -> list[Any]:
    """Two turns, each with reasoning before a tool call and before the answer."""
    return [
        [reasoning("rs_1", "look it up"), function_call("lookup", {"name": "a"}, call_id="c1")],
        [reasoning("rs_2", "answer"), assistant_message("a found", item_id="msg_1")],
        [reasoning("rs_3", "look it up"), function_call("lookup", {"name": "b"}, call_id="c2")],
        [reasoning("rs_4", "answer"), assistant_message("b found", item_id="msg_2")],
    ]


async def omit_run(with_callback: bool) -> list[list[Any]]:
    session = ProtoPromptSession("omit")
    model = ScriptedModel(omit_script())
    agent = Agent(name="a", model=model, tools=[lookup])
    callback = callback_for(session) if with_callback else None
    for text in ("first", "second"):
        await run(agent, text, session, callback, reasoning_item_id_policy="omit")
    return [call.input for call in model.calls]


async def test_omit_policy_sends_the_whole_history_like_the_sdk() -> None:
    with_cb, without_cb = await omit_run(True), await omit_run(False)
    assert with_cb == without_cb
    second_turn = with_cb[2]
    kinds = [i.get("type", "message") for i in second_turn]
    assert kinds == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "reasoning",
        "message",
        "message",
    ]
    assert not any("id" in i for i in second_turn if i.get("type") == "reasoning")


def pending_shell_call() -> dict[str, Any]:
    return {
        "type": "shell_call",
        "id": "shell_1",
        "call_id": "manual_shell",
        "status": "in_progress",
        "action": {"type": "exec", "commands": ["echo hi"], "timeout_ms": 1000},
    }


@pytest.mark.parametrize("streamed", [False, True])
async def test_pending_shell_call_in_new_input_is_sent(streamed: bool) -> None:
    session = ProtoPromptSession("shell")
    model = ScriptedModel([[assistant_message("done")]])
    agent = Agent(name="a", model=model)
    cfg = RunConfig(session_input_callback=callback_for(session), tracing_disabled=True)
    if streamed:
        result = Runner.run_streamed(agent, [pending_shell_call()], session=session, run_config=cfg)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, [pending_shell_call()], session=session, run_config=cfg)
    assert result.final_output == "done"
    assert model.calls[-1].input[0]["call_id"] == "manual_shell"
    # Stored, it is history on the next turn, where the SDK drops it too (no output).
    stored = await session.get_items()
    assert pp.pack(stored, [{"role": "user", "content": "next"}], 10_000).kept_history == [1]


def test_invalid_new_input_says_what_is_wrong_with_it() -> None:
    history = [{"role": "user", "content": "q"}]
    with pytest.raises(InvalidNewInputError) as info:
        pp.pack(
            history, [{"type": "function_call_output", "call_id": "c404", "output": "x"}], 10_000
        )
    message = str(info.value)
    assert message == "new_input[0] cannot be sent: new_input[0]: output without its call"
    assert "history" not in message
    assert info.value.reasons == ["output without its call"]
    # A completed shell call in new input still needs its output.
    done = dict(pending_shell_call(), status="completed")
    with pytest.raises(InvalidNewInputError, match=r"new_input\[0\]: call without output"):
        pp.pack(history, [done], 10_000)


def test_a_broken_dependency_is_named_as_history() -> None:
    history = [
        {"role": "user", "content": "q"},
        {"type": "function_call_output", "call_id": "c1", "output": "early"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    with pytest.raises(InvalidNewInputError) as info:
        pp.pack(history, [{"type": "function_call_output", "call_id": "c1", "output": "x"}], 10_000)
    assert str(info.value) == (
        "new_input[0] cannot be sent: history[1] (history it depends on): output before its call"
    )
    assert info.value.location == "new_input[0]"


# ------------------------------------------------------------------ session_settings (3)


@pytest.mark.parametrize("bad", [{"limitt": 1}, {"limit": 1, "other": 2}])
def test_unknown_session_settings_are_refused_like_sqlite_session(bad: dict[str, Any]) -> None:
    with pytest.raises(TypeError) as expected:
        SQLiteSession("s", session_settings=bad)
    with pytest.raises(TypeError) as ours:
        ProtoPromptSession("s", session_settings=bad)
    assert str(ours.value) == str(expected.value)
    assert str(ours.value).startswith("Unknown session settings:")
    with pytest.raises(TypeError, match="Unknown session settings"):
        ProtoPromptSession("s", inner_session=SQLiteSession("s"), session_settings=bad)
    session = ProtoPromptSession("s")
    with pytest.raises(TypeError, match="Unknown session settings"):
        session.session_settings = bad
    assert session.session_settings == SessionSettings()


def test_bad_session_setting_values_are_refused_like_sqlite_session() -> None:
    with pytest.raises(Exception) as expected:
        SQLiteSession("s", session_settings={"limit": "many"})
    with pytest.raises(type(expected.value)):
        ProtoPromptSession("s", session_settings={"limit": "many"})


async def test_session_settings_come_from_the_inner_session_unless_set() -> None:
    inner = SQLiteSession("s", session_settings={"limit": 2})
    session = ProtoPromptSession("s", inner_session=inner)
    assert session.session_settings == SessionSettings(limit=2)
    await session.add_items([{"role": "user", "content": str(i)} for i in range(4)])
    assert [i["content"] for i in await session.get_items()] == ["2", "3"]
    session.session_settings = {"limit": 3}
    assert [i["content"] for i in await session.get_items()] == ["1", "2", "3"]


# ------------------------------------------------------------------ probed attributes (4)

COMPACTION_HOOKS = (
    "run_compaction",
    "_defer_compaction",
    "_get_deferred_compaction_response_id",
    "_clear_deferred_compaction",
    "_get_items_with_generation",
    "_add_items_with_generation",
)


def compaction_client(output: list[Any]) -> MagicMock:
    client = MagicMock()
    client.responses.compact = AsyncMock(
        return_value=SimpleNamespace(output=copy.deepcopy(output), usage=None)
    )
    return client


def test_compaction_hooks_are_hidden_without_a_compaction_inner() -> None:
    session = ProtoPromptSession("s")
    assert not is_openai_responses_compaction_aware_session(session)
    for name in COMPACTION_HOOKS + ("_read_compaction_items",):
        assert not hasattr(session, name), name
    # Private SQLiteSession internals are not reachable through the wrapper either.
    assert not hasattr(session, "_connections")
    assert not hasattr(session, "_shared_connection")


def test_compaction_hooks_of_a_compaction_inner_are_forwarded() -> None:
    inner = OpenAIResponsesCompactionSession("s", SQLiteSession("s"), client=compaction_client([]))
    session = ProtoPromptSession("s", inner_session=inner)
    assert is_openai_responses_compaction_aware_session(session)
    for name in COMPACTION_HOOKS:
        if hasattr(inner, name):  # 0.22.3 lacks some of them
            assert callable(getattr(session, name)), name
    assert session._get_deferred_compaction_response_id() is None


def test_encrypted_inner_gives_its_compaction_read_and_settings() -> None:
    encrypted = pytest.importorskip("agents.extensions.memory.encrypt_session")
    inner = encrypted.EncryptedSession(
        "s", SQLiteSession("s", session_settings={"limit": 4}), "key"
    )
    session = ProtoPromptSession("s", inner_session=inner)
    assert hasattr(session, "_read_compaction_items") == hasattr(inner, "_read_compaction_items")
    assert not is_openai_responses_compaction_aware_session(session)  # no compaction inside
    assert session.session_settings == SessionSettings(limit=4)


def test_public_attributes_of_the_inner_session_read_through(tmp_path) -> None:
    session = ProtoPromptSession("s", tmp_path / "h.db", messages_table="msgs")
    assert session.db_path == str(tmp_path / "h.db")
    assert session.messages_table == "msgs"
    assert session.sessions_table == "agent_sessions"
    with pytest.raises(AttributeError):
        session.no_such_attribute  # noqa: B018
    with pytest.raises(ValueError, match="tables"):
        ProtoPromptSession("s", inner_session=SQLiteSession("s"), messages_table="other")


def test_conversations_session_cannot_be_wrapped() -> None:
    inner = OpenAIConversationsSession(conversation_id="conv_1", openai_client=MagicMock())
    inner.session_id = "s"  # type: ignore[misc]
    with pytest.raises(ValueError, match="OpenAIConversationsSession"):
        ProtoPromptSession("s", inner_session=inner)


class IdStrippingSession:
    """A store that reassigns ids (drops them on write) and says so, like hosted stores."""

    session_settings = None
    _ignore_ids_for_matching = True

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.items: list[Any] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return copy.deepcopy(self.items if limit is None else self.items[-limit:])

    async def add_items(self, items: list[Any]) -> None:
        self.items.extend({k: v for k, v in i.items() if k != "id"} for i in items)

    async def pop_item(self) -> Any:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items.clear()


async def test_id_ignoring_inner_session_keeps_the_runner_rollback_working() -> None:
    inner = IdStrippingSession("s")
    session = ProtoPromptSession("s", inner_session=inner)
    assert session._ignore_ids_for_matching is True
    assert ProtoPromptSession("s")._ignore_ids_for_matching is False
    item = {"id": "msg_9", "type": "message", "role": "user", "content": "hello"}
    await session.add_items([item])
    # The runner rolls back its input this way before a conversation-lock retry; it only
    # finds the stored (id-less) row when the wrapper reports the store's matching policy.
    await rewind_session_items(session, [item])
    assert inner.items == []


@pytest.mark.parametrize("file_db", [False, True], ids=["memory", "file"])
async def test_compaction_over_the_session_keeps_every_request_a_fresh_pack(
    tmp_path, file_db: bool
) -> None:
    db = tmp_path / "h.db" if file_db else ":memory:"
    store = ProtoPromptSession("s", db)
    # The summary is as long as the history and holds an item the packer must drop (a Chat
    # Completions tool message): an index that missed the rewrite would keep it.
    summary = [
        {"role": "user" if i % 2 else "assistant", "content": f"summary {i}"} for i in range(25)
    ]
    summary[5] = {"role": "tool", "tool_call_id": "x", "content": "foreign"}
    client = compaction_client(summary)
    session = OpenAIResponsesCompactionSession(
        "s", store, client=client, should_trigger_compaction=lambda ctx: True
    )
    await store.add_items(
        [{"role": "assistant" if i % 2 else "user", "content": f"old {i}"} for i in range(20)]
    )
    model = ScriptedModel([[assistant_message("one")], [assistant_message("two")]])
    agent = Agent(name="a", model=model)
    callback = callback_for(store)
    await run(agent, "first", session, callback)
    assert client.responses.compact.await_count == 1
    stored = await store.get_items()
    assert [i["content"] for i in stored[:25]] == [i["content"] for i in summary]
    await run(agent, "second", session, callback)
    expected = pp.pack(stored, [{"content": "second", "role": "user"}], 1_000_000).items
    assert model.calls[-1].input == [dict(i) for i in expected]
    assert {"role": "tool", "tool_call_id": "x", "content": "foreign"} not in model.calls[-1].input
    store.close()


async def test_snapshot_hook_is_the_inner_sessions() -> None:
    session = ProtoPromptSession("s")
    snapshot = await session._get_compaction_snapshot(5)
    if not NATIVE_SUFFIX_COMPACTION:
        assert snapshot is None  # 0.22.3: no snapshot, the SDK replaces the whole history
        return
    await session.add_items([{"role": "user", "content": str(i)} for i in range(3)])
    await report_of_turn(session, "3")  # the index takes the three items
    snapshot = await session._get_compaction_snapshot(5)
    assert snapshot.complete and [i["role"] for i in snapshot.items] == ["user"] * 4 + ["assistant"]
    # As long as the history the index took (3 items): only its reset tells the next turn.
    replacement = [{"role": "user", "content": "s"}, {"role": "user", "content": "t"}]
    assert await snapshot.replace_suffix(1, replacement)
    assert [i["content"] for i in await session.get_items()] == ["0", "s", "t"]
    # The index was reset, not trusted: the next turn rebuilds it from the history.
    report = await report_of_turn(session, "u")
    assert (report.index, report.index_reason) == ("rebuilt", "pop_or_clear"), report.lines()
    # An inner session without the hook: none, so the SDK requires complete coverage.
    wrapped = ProtoPromptSession("s", inner_session=IdStrippingSession("s"))
    assert await wrapped._get_compaction_snapshot(5) is None


class AtomicStore(IdStrippingSession):
    _ignore_ids_for_matching = False
    replaced: list[Any] | None = None

    async def _atomic_replace_items(self, items: list[Any]) -> bool:
        self.items = list(items)
        self.replaced = list(items)
        return True


async def test_atomic_replace_is_the_inner_types() -> None:
    inner = AtomicStore("s")
    session = ProtoPromptSession("s", inner_session=inner, incremental=True)
    await session.add_items([{"role": "user", "content": "old"}])
    await report_of_turn(session, "q")  # the index takes the one item
    new = [{"role": "user", "content": "n"}]
    assert await type(session)._atomic_replace_items(session, new)
    assert inner.replaced == new
    report = await report_of_turn(session, "r")  # the index was reset, not trusted
    assert (report.index, report.index_reason) == ("rebuilt", "pop_or_clear"), report.lines()
    plain = ProtoPromptSession("s", inner_session=IdStrippingSession("s"))
    assert await type(plain)._atomic_replace_items(plain, []) is False  # SDK: clear + add


async def test_manual_compaction_through_a_compaction_inner_resets_the_index() -> None:
    # The summary is longer than what the index has seen and holds an item the packer drops.
    summary = [
        {"role": "user", "content": "summary"},
        {"role": "tool", "tool_call_id": "x", "content": "foreign"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "go on"},
    ]
    inner = OpenAIResponsesCompactionSession(
        "s", SQLiteSession("s"), client=compaction_client(summary), compaction_mode="input"
    )
    session = ProtoPromptSession("s", inner_session=inner, incremental=True)
    model = ScriptedModel([[assistant_message(t)] for t in ("one", "two", "three")])
    agent = Agent(name="a", model=model)
    callback = callback_for(session)
    await run(agent, "first", session, callback)
    await run(agent, "second", session, callback)  # the index now holds two items
    await session.run_compaction({"force": True})
    assert await session.get_items() == summary
    await run(agent, "third", session, callback)
    assert model.calls[-1].input == [summary[0]] + summary[2:] + [
        {"content": "third", "role": "user"}
    ]


# ------------------------------------------------------------------ EncryptedSession pop


async def wrong_key_pop(backend: Any, db: Any) -> tuple[str, int]:
    encrypted = pytest.importorskip("agents.extensions.memory.encrypt_session")
    right = encrypted.EncryptedSession("s", backend, "right-key")
    wrong = encrypted.EncryptedSession("s", backend, "wrong-key")
    await right.add_items([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    try:
        outcome = repr(await wrong.pop_item())
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        outcome = type(exc).__name__
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM agent_messages").fetchone()[0]
    if ATOMIC_ENCRYPTED_POP and rows:
        assert [i["content"] for i in await right.get_items()] == ["a", "b"]
    return outcome, rows


async def test_encrypted_pop_with_a_wrong_key_behaves_as_over_sqlite(tmp_path) -> None:
    pytest.importorskip("cryptography")
    plain = await wrong_key_pop(SQLiteSession("s", tmp_path / "a.db"), tmp_path / "a.db")
    ours = await wrong_key_pop(ProtoPromptSession("s", tmp_path / "b.db"), tmp_path / "b.db")
    assert ours == plain
    if ATOMIC_ENCRYPTED_POP:
        assert ours == ("InvalidToken", 2)  # raised inside the transaction: nothing lost


async def test_a_session_over_native_sqlite_is_an_sqlite_session() -> None:
    session = ProtoPromptSession("s")
    assert isinstance(session, ProtoPromptSession)
    assert isinstance(session, SQLiteSession) is ATOMIC_ENCRYPTED_POP
    await session.add_items([{"role": "user", "content": "a"}])
    assert await session.pop_item() == {"role": "user", "content": "a"}
    assert await session.pop_item() is None
    other = ProtoPromptSession("s", inner_session=IdStrippingSession("s"))
    assert not isinstance(other, SQLiteSession)


def _shape(method: Any) -> list[tuple[str, Any, Any]]:
    """A method's parameters as the SDK's dispatch reads them (names, kinds, defaults)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]


async def test_every_hook_keeps_the_sdks_signature(tmp_path: Any) -> None:
    """Every SDK hook the session implements or forwards shows the SDK's parameters, names
    included, to the SDK's own dispatch (``_session_method_accepts_wrapper``: ``wrapper``
    is passed only to a parameter of that name); a forwarded hook is the inner's exactly.
    ``run_compaction`` forwarded through ``*args, **kwargs`` never got the run's wrapper,
    so every automatic compaction inside a ProtoPromptSession ran as a manual one."""
    from agents.memory import session as sdk

    accepts = sdk._session_method_accepts_wrapper
    db = str(tmp_path / "h.db")
    native = SQLiteSession("ref", db)
    plain = ProtoPromptSession("s", db)
    for name in ("get_items", "add_items", "pop_item", "clear_session"):
        theirs, ours = _shape(getattr(native, name)), _shape(getattr(plain, name))
        assert ours[: len(theirs)] == theirs, name
        extra = [(n, d) for n, k, d in ours[len(theirs) :]]
        # The SDK passes its run context to ``wrapper``; over native SQLite (0.24) pop_item
        # is SQLiteSession's own (the validated pop EncryptedSession relies on).
        assert extra == [("wrapper", None)] or (name == "pop_item" and not extra), name
        assert accepts(getattr(plain, name)) == bool(extra), name

    inner = OpenAIResponsesCompactionSession(
        "s", SQLiteSession("s", db), client=compaction_client([])
    )
    wrapped = ProtoPromptSession("s", inner_session=inner)
    assert sdk._session_accepts_wrapper(wrapped)
    for name in sorted(FORWARDED_HOOKS):
        if not hasattr(inner, name):
            assert not hasattr(wrapped, name), name
            continue
        theirs, ours = getattr(inner, name), getattr(wrapped, name)
        assert inspect.signature(ours) == inspect.signature(theirs), name
        assert accepts(ours) == accepts(theirs), name

    if NATIVE_SUFFIX_COMPACTION:  # implemented hooks: the SDK's own sessions' parameters
        assert _shape(plain._get_compaction_snapshot) == _shape(native._get_compaction_snapshot)
        await plain.add_items([{"role": "user", "content": "hi"}])
        ours_snap = await plain._get_compaction_snapshot(3)
        raw_snap = await native._get_compaction_snapshot(3)
        assert ours_snap is not None and raw_snap is not None
        assert _shape(ours_snap.replace_suffix) == _shape(raw_snap.replace_suffix)
    if hasattr(SQLiteSession, "_pop_item_with_validation"):  # EncryptedSession's pop (0.24)
        assert _shape(plain._pop_item_with_validation) == _shape(native._pop_item_with_validation)
    try:
        from agents.extensions.memory.redis_session import RedisSession
    except ImportError:
        RedisSession = None  # noqa: N806 - the redis extra is not installed
    if RedisSession is not None and hasattr(RedisSession, "_atomic_replace_items"):
        assert _shape(ProtoPromptSession._atomic_replace_items) == _shape(
            RedisSession._atomic_replace_items
        )
    plain.close()
