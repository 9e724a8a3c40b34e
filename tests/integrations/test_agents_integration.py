"""End-to-end: ProtoPromptSession + budgeted input callback with the Agents SDK's Runner.

The model is the SDK's offline test double ``agents.testing.ScriptedModel``: it records
every request, so the tests check both what the model receives and what the session stores.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402
from agents.exceptions import UserError  # noqa: E402
from agents.memory import Session, SQLiteSession  # noqa: E402
from agents.run_internal.items import drop_orphan_function_calls  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseReasoningItem  # noqa: E402
from openai.types.responses.response_reasoning_item import Summary  # noqa: E402

from protoprompt import (  # noqa: E402
    MemoryScope,
    MemoryStore,
    TokenBudgetedContextBuilder,
    TokenBudgetExceededError,
    item_tokens,
)
from protoprompt.integrations import ProtoPromptSession  # noqa: E402

SCOPE = MemoryScope("acme", user="alice", thread="legal-chat")
CONTRACT = (
    "Renewal. This agreement renews automatically on the first of March each year. "
    "Termination. Either party may terminate with ninety days written notice before renewal. "
    "Payment. Invoices are payable within thirty days of receipt."
)
FACT = "Alice negotiates the renewal for Acme and prefers short answers."
SYSTEM = "Answer from the recalled contract."


@function_tool
def lookup_clause(name: str) -> str:
    """Return the text of a contract clause."""
    return f"clause {name}: see section 4"


@pytest.fixture
def store() -> Iterator[MemoryStore]:
    with MemoryStore(chunk_words=30, chunk_overlap=0) as s:
        s.index_document("contract", CONTRACT, scope=SCOPE)
        s.remember(FACT, scope=SCOPE)
        yield s


def reasoning(rid: str, text: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=rid, type="reasoning", summary=[Summary(text=text, type="summary_text")]
    )


def script() -> list[Any]:
    """Three turns; the first two call a tool (the second after reasoning)."""
    return [
        [function_call("lookup_clause", {"name": "renewal"}, call_id="call_1")],
        [assistant_message("It renews on 1 March.", item_id="msg_1")],
        [
            reasoning("rs_1", "Need the notice clause."),
            function_call("lookup_clause", {"name": "termination"}, call_id="call_2"),
        ],
        [assistant_message("Ninety days before renewal.", item_id="msg_2")],
        [assistant_message("Renews 1 March; 90 days notice.", item_id="msg_3")],
    ]


QUESTIONS = [
    "When does the contract renew?",
    "What is the notice period for termination?",
    "Summarise the renewal terms.",
]


def tokens(items: list[Any]) -> int:
    return sum(item_tokens(i).total for i in items)


def context_text(model_input: list[Any]) -> str:
    first = model_input[0]
    assert first["role"] == "system"
    return first["content"]


async def run_turn(agent: Agent, text: Any, session: Any, callback: Any = None, **kw: Any):
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    return await Runner.run(agent, text, session=session, run_config=config, **kw)


# ------------------------------------------------------------------ the Session protocol


def test_is_an_sdk_session_backed_by_sqlite() -> None:
    session = ProtoPromptSession("chat")
    assert isinstance(session, Session)
    assert isinstance(session.inner_session, SQLiteSession)
    assert session.session_id == "chat"


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_session_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="session_id"):
        ProtoPromptSession(bad)


@pytest.mark.parametrize("bad", [None, 42, b"chat"])
def test_non_string_session_id_is_refused(bad: Any) -> None:
    with pytest.raises(TypeError, match="session_id must be a str"):
        ProtoPromptSession(bad)


def test_inner_session_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="agents.memory.Session"):
        ProtoPromptSession("chat", inner_session=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        ProtoPromptSession("chat", "x.db", inner_session=SQLiteSession("chat"))
    with pytest.raises(ValueError, match="session_id"):
        ProtoPromptSession("chat", inner_session=SQLiteSession("other"))


async def test_upstream_semantics_of_every_method() -> None:
    session = ProtoPromptSession("chat", session_settings={"limit": 2})
    items = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    await session.add_items(items[:3])
    await session.add_items([])
    await session.add_items(items[3:])
    assert await session.get_items(limit=10) == items
    assert await session.get_items() == items[2:], "session_settings.limit applies by default"
    assert await session.get_items(limit=1) == items[3:]
    assert await session.pop_item() == items[3]
    assert await session.get_items(limit=10) == items[:3]
    await session.clear_session()
    assert await session.get_items() == [] and await session.pop_item() is None


async def test_works_with_file_database(tmp_path, store: MemoryStore) -> None:
    db = str(tmp_path / "agents.db")
    session = ProtoPromptSession("chat", db)
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    model = ScriptedModel([[assistant_message("ok")]])
    await run_turn(
        Agent(name="a", model=model),
        "renewal?",
        session,
        session.input_callback(builder, system_prompt=SYSTEM),
    )
    session.close()
    reopened = SQLiteSession("chat", db)
    stored = await reopened.get_items()
    assert [i.get("role") for i in stored] == ["user", "assistant"]
    reopened.close()


# ------------------------------------------------------------------ end to end


async def test_multi_turn_with_tools_stores_only_the_original_items(store: MemoryStore) -> None:
    """Session content equals a plain SQLiteSession's; the model gets context + history."""
    budget, reserve = 4000, 200
    builder = TokenBudgetedContextBuilder(
        store, max_tokens=budget, scope=SCOPE, output_reserve=reserve
    )
    session = ProtoPromptSession("chat")
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel(script())
    agent = Agent(name="lawyer", model=model, tools=[lookup_clause])

    plain = SQLiteSession("plain")
    plain_model = ScriptedModel(script())
    plain_agent = Agent(name="lawyer", model=plain_model, tools=[lookup_clause])

    for turn, question in enumerate(QUESTIONS):
        calls_before = len(model.calls)
        result = await run_turn(agent, question, session, callback)
        await run_turn(plain_agent, question, plain)
        assert result.final_output == (await plain.get_items())[-1]["content"][0]["text"]

        stored = await session.get_items()
        assert stored == await plain.get_items(), f"turn {turn}: exactly the original items"
        assert not any(i.get("role") == "system" for i in stored)
        assert not any(FACT in json.dumps(i) or "Renewal." in json.dumps(i) for i in stored)
        assert len({json.dumps(i, sort_keys=True) for i in stored}) == len(stored), "no duplicates"

        plan = builder.last_plan
        assert plan is not None
        for call, plain_call in zip(model.calls[calls_before:], plain_model.calls[calls_before:]):
            text = context_text(call.input)
            assert text.startswith(SYSTEM) and FACT in text and "renews automatically" in text
            assert call.input[1:] == plain_call.input, "kept history + new input, unchanged"
        first = model.calls[calls_before].input
        assert first == plan.items
        assert tokens(first) == plan.request_tokens <= budget - reserve
    assert session.pending_context_count == 0
    assert [i.get("type") for i in await session.get_items()].count("function_call") == 2


async def test_tight_budget_drops_old_units_and_sends_a_valid_graph(store: MemoryStore) -> None:
    budget = 260
    builder = TokenBudgetedContextBuilder(
        store, max_tokens=budget, scope=SCOPE, max_context_tokens=110
    )
    session = ProtoPromptSession("chat")
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel(script())
    agent = Agent(name="lawyer", model=model, tools=[lookup_clause])
    for question in QUESTIONS:
        await run_turn(agent, question, session, callback)
    stored = await session.get_items()
    assert len(stored) == 4 + 5 + 2, "nothing is lost from the session"

    plan = builder.last_plan
    assert plan is not None and plan.pack.dropped, "older history did not fit"
    sent = model.calls[-1].input
    assert sent == plan.items and tokens(sent) <= budget
    assert sent[-1] == {"role": "user", "content": QUESTIONS[-1]}
    assert FACT in context_text(sent)
    history_positions = set(range(1, len(sent) - 1))
    assert (
        drop_orphan_function_calls(copy.deepcopy(sent), pruning_indexes=history_positions) == sent
    )
    calls = {i["call_id"] for i in sent if i.get("type") == "function_call"}
    outputs = {i["call_id"] for i in sent if i.get("type") == "function_call_output"}
    assert calls == outputs, "calls and outputs are kept or dropped together"
    text = plan.explain()
    assert "history[0] user_message" in text and "over_budget" in text
    assert "contract#0: fits" in text and FACT[:40] in text


async def test_tiny_budget_raises_before_the_model_is_called(store: MemoryStore) -> None:
    builder = TokenBudgetedContextBuilder(store, max_tokens=30, scope=SCOPE)
    session = ProtoPromptSession("chat")
    await session.add_items([{"role": "user", "content": "earlier"}])
    model = ScriptedModel([[assistant_message("never")]])
    with pytest.raises(TokenBudgetExceededError) as err:
        await run_turn(
            Agent(name="a", model=model),
            "word " * 100,
            session,
            session.input_callback(builder, system_prompt=SYSTEM),
        )
    assert err.value.section == "new_input" and err.value.budget == 30
    assert model.calls == ()
    assert await session.get_items() == [{"role": "user", "content": "earlier"}]

    roomy_input = TokenBudgetedContextBuilder(store, max_tokens=60, scope=SCOPE)
    with pytest.raises(TokenBudgetExceededError) as err:
        await run_turn(
            Agent(name="a", model=model),
            "renewal?",
            session,
            session.input_callback(roomy_input, system_prompt="Be exact. " * 40),
        )
    assert err.value.section == "system_prompt"
    assert model.calls == ()


@pytest.mark.parametrize("kind", ["function_call", "mcp_approval"])
async def test_resume_with_an_output_keeps_the_tail_dependency(
    store: MemoryStore, kind: str
) -> None:
    old = [
        {"role": "user", "content": "old question " * 60},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_old",
            "status": "completed",
            "content": [{"type": "output_text", "text": "old answer " * 60, "annotations": []}],
        },
        {"role": "user", "content": "Please check the renewal clause."},
    ]
    if kind == "function_call":
        pending = [
            {"type": "reasoning", "id": "rs_9", "summary": [], "encrypted_content": "gAAA"},
            {
                "type": "function_call",
                "id": "fc_9",
                "call_id": "call_9",
                "name": "lookup_clause",
                "arguments": '{"name": "renewal"}',
            },
        ]
        resume = [{"type": "function_call_output", "call_id": "call_9", "output": "1 March"}]
    else:
        pending = [
            {
                "type": "mcp_approval_request",
                "id": "mcpr_9",
                "server_label": "crm",
                "name": "renew",
                "arguments": "{}",
            }
        ]
        resume = [
            {"type": "mcp_approval_response", "approval_request_id": "mcpr_9", "approve": True}
        ]
    session = ProtoPromptSession("chat")
    await session.add_items(old + pending)
    builder = TokenBudgetedContextBuilder(store, max_tokens=300, scope=SCOPE)
    model = ScriptedModel([[assistant_message("Done.")]])
    await run_turn(
        Agent(name="a", model=model, tools=[lookup_clause]),
        resume,
        session,
        session.input_callback(builder, system_prompt=SYSTEM),
    )
    sent = model.calls[0].input
    plan = builder.last_plan
    assert plan is not None
    assert sent[-len(pending) - len(resume) :] == pending + resume, "dependency kept, in order"
    assert plan.pack.dependency == [3, 4][: len(pending)]
    assert not any("old question" in json.dumps(i) for i in sent), "old history dropped"
    assert plan.query == "Please check the renewal clause.", "query from the history's user turn"
    assert "renews automatically" in context_text(sent)
    assert tokens(sent) <= 300
    stored = await session.get_items()
    assert stored[:-1] == old + pending + resume, "the output is stored once, nothing else"
    assert stored[-1]["role"] == "assistant" and stored[-1]["content"][0]["text"] == "Done."


@function_tool(needs_approval=True)
def cancel_contract(reason: str) -> str:
    """Cancel the contract (a human must approve)."""
    return f"cancelled: {reason}"


async def test_approval_resume_from_run_state_keeps_context_out_of_the_session(
    store: MemoryStore,
) -> None:
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    session = ProtoPromptSession("chat")
    config = RunConfig(
        session_input_callback=session.input_callback(builder, system_prompt=SYSTEM),
        tracing_disabled=True,
    )
    model = ScriptedModel(
        [
            [function_call("cancel_contract", {"reason": "renewal"}, call_id="c1")],
            [assistant_message("Cancelled.", item_id="m1")],
        ]
    )
    agent = Agent(name="a", model=model, tools=[cancel_contract])
    first = await Runner.run(
        agent, "Cancel the contract before renewal.", session=session, run_config=config
    )
    assert len(first.interruptions) == 1
    state = first.to_state()
    state.approve(first.interruptions[0])
    resumed = await Runner.run(agent, state, session=session, run_config=config)
    assert resumed.final_output == "Cancelled."
    stored = await session.get_items()
    assert [i.get("type", "message") for i in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert not any(i.get("role") == "system" for i in stored)
    assert FACT in context_text(model.calls[-1].input), "the resumed request keeps its context"
    assert session.pending_context_count == 0


async def test_streamed_runs_store_only_the_original_items(store: MemoryStore) -> None:
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    session = ProtoPromptSession("chat")
    config = RunConfig(
        session_input_callback=session.input_callback(builder, system_prompt=SYSTEM),
        tracing_disabled=True,
    )
    model = ScriptedModel(script()[:4])
    agent = Agent(name="a", model=model, tools=[lookup_clause])
    for question in QUESTIONS[:2]:
        result = Runner.run_streamed(agent, question, session=session, run_config=config)
        async for _ in result.stream_events():
            pass
    stored = await session.get_items()
    assert len(stored) == 4 + 5 and not any(i.get("role") == "system" for i in stored)
    assert all(FACT in context_text(call.input) for call in model.calls)


async def test_session_refuses_server_managed_conversations(store: MemoryStore) -> None:
    session = ProtoPromptSession("chat")
    callback = session.input_callback(
        TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    )
    model = ScriptedModel([[assistant_message("never")]])
    with pytest.raises(UserError, match="Session persistence cannot be combined"):
        await run_turn(Agent(name="a", model=model), "hi", session, callback, conversation_id="c")
    with pytest.raises(UserError, match="Session persistence cannot be combined"):
        await run_turn(
            Agent(name="a", model=model), "hi", session, callback, previous_response_id="resp_1"
        )
    assert model.calls == () and await session.get_items() == []


async def test_correction_workflow_pop_twice_then_rerun(store: MemoryStore) -> None:
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    session = ProtoPromptSession("chat")
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel(
        [
            [assistant_message("A1", item_id="m1")],
            [assistant_message("A2", item_id="m2")],
            [assistant_message("A2 fixed", item_id="m3")],
        ]
    )
    agent = Agent(name="a", model=model)
    await run_turn(agent, "first question", session, callback)
    await run_turn(agent, "wrong question", session, callback)
    assert (await session.pop_item())["id"] == "m2"
    assert (await session.pop_item())["content"] == "wrong question"
    await run_turn(agent, "corrected question", session, callback)
    sent = model.calls[-1].input
    assert not any("wrong question" in json.dumps(i) for i in sent)
    stored = await session.get_items()
    assert [i.get("content") if i.get("role") == "user" else i["id"] for i in stored] == [
        "first question",
        "m1",
        "corrected question",
        "m3",
    ]


async def test_clear_session_never_deletes_long_term_memory(store: MemoryStore) -> None:
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    session = ProtoPromptSession("chat")
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel([[assistant_message("A1")], [assistant_message("A2")]])
    agent = Agent(name="a", model=model)
    await run_turn(agent, "When does the contract renew?", session, callback)
    await session.clear_session()
    assert await session.get_items() == []
    assert [h.text for h in store.facts(scope=SCOPE)] == [FACT]
    assert store.search("renews", scope=SCOPE, kinds=("document",))
    await run_turn(agent, "When does the contract renew?", session, callback)
    assert FACT in context_text(model.calls[-1].input)
    assert len(await session.get_items()) == 2


class ListSession:
    """A minimal third-party Session: a Python list, sync methods allowed by the SDK."""

    session_settings = None

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.items: list[Any] = []

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return copy.deepcopy(self.items if limit is None else self.items[-limit:] if limit else [])

    async def add_items(self, items: list[Any]) -> None:
        self.items.extend(copy.deepcopy(items))

    async def pop_item(self) -> Any:
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self.items.clear()


@pytest.mark.parametrize("make_inner", [ListSession, SQLiteSession], ids=["custom", "sqlite"])
async def test_inner_session_stores_the_history(store: MemoryStore, make_inner: Any) -> None:
    inner = make_inner("chat")
    session = ProtoPromptSession("chat", inner_session=inner)
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    model = ScriptedModel(script()[:2])
    await run_turn(
        Agent(name="a", model=model, tools=[lookup_clause]), QUESTIONS[0], session, callback
    )
    stored = await inner.get_items()
    assert [i.get("type", "message") for i in stored] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert stored[0] == {"role": "user", "content": QUESTIONS[0]}
    assert FACT in context_text(model.calls[0].input)
    session.close()  # an inner session belongs to its owner: still usable
    assert await inner.get_items() == stored


# ------------------------------------------------------------------ the pairing contract


async def test_callback_returns_the_sdk_objects_and_add_items_drops_only_its_context(
    store: MemoryStore,
) -> None:
    session = ProtoPromptSession("chat")
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    callback = session.input_callback(builder, system_prompt=SYSTEM)
    history = [{"role": "user", "content": "hello"}]
    new = [{"role": "user", "content": [{"type": "input_text", "text": "renewal date?"}]}]
    out = await callback(history, new)
    assert out[1] is history[0] and out[2] is new[0], "identity, never copies"
    context = out[0]
    assert builder.last_plan is not None and builder.last_plan.query == "renewal date?"

    genuine_system = {"role": "system", "content": "A user's own system note."}
    as_parts = {
        "type": "message",
        "role": "system",
        "content": [{"type": "input_text", "text": context["content"]}],
    }
    await session.add_items([copy.deepcopy(context), new[0], genuine_system])
    assert await session.get_items() == [new[0], genuine_system]
    # Consumed once: an equal item later is someone's genuine item and is stored.
    await session.add_items([as_parts])
    assert (await session.get_items())[-1] == as_parts

    # Identity match, and normalised shapes (content parts, type: message) match by content.
    out1 = await callback(history, new)
    out2 = await callback(history, new)
    assert session.pending_context_count == 2
    await session.add_items([out1[0], as_parts, new[0]])
    assert session.pending_context_count == 0
    assert (await session.get_items())[-1] == new[0]
    assert out2[0] == out1[0]


async def test_context_with_extra_fields_is_not_mistaken_for_ours(store: MemoryStore) -> None:
    session = ProtoPromptSession("chat")
    callback = session.input_callback(
        TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE), system_prompt=SYSTEM
    )
    context = (await callback([], [{"role": "user", "content": "renewal?"}]))[0]
    lookalike = {**context, "id": "msg_user"}
    await session.add_items([lookalike])
    assert await session.get_items() == [lookalike]
    assert session.pending_context_count == 1


async def test_session_limit_bounds_the_history_the_callback_sees(store: MemoryStore) -> None:
    session = ProtoPromptSession("chat", session_settings={"limit": 2})
    await session.add_items([{"role": "user", "content": f"u{i}"} for i in range(5)])
    seen: list[int] = []
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE)
    callback = session.input_callback(builder, on_plan=lambda p: seen.append(len(p.pack.decisions)))
    model = ScriptedModel([[assistant_message("ok")]])
    await run_turn(Agent(name="a", model=model), "renewal?", session, callback)
    assert [i["content"] for i in model.calls[0].input[1:]] == ["u3", "u4", "renewal?"]
    assert seen == [2]


def test_example_runs_offline() -> None:
    """The README's main-job example runs without a network or an API key."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    import protoprompt

    package_parent = Path(protoprompt.__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(package_parent), "OPENAI_API_KEY": ""}
    proc = subprocess.run(
        [sys.executable, str(root / "examples" / "openai_agents_session.py")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert len(out.splitlines()) < 130  # short enough to read in one screenful or two
    # What the turns dropped stays reachable: the rolling summary and recalled turns.
    assert "\n  summary summary         kept" in out and "\n  history history:" in out
    assert "dropped (over_budget)" in out and "sent (new input)" in out
    # The plan says how the turn read and packed the history (plan.turn, issue 21).
    assert "\nread: full (" in out and "\nindex: " in out and "\nsnapshot: " in out
    assert "RECALLED into the context message" in out and "contract#" in out


async def test_a_run_without_a_budget_warns_once_naming_run_config(tmp_path) -> None:
    import warnings

    from protoprompt import UnbudgetedSessionWarning

    session = ProtoPromptSession("chat", str(tmp_path / "chat.db"))
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("ok")]] * 3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await run_turn(agent, "hello", session)  # no session_input_callback: no budget
        await run_turn(agent, "again", session)
    unbudgeted = [w for w in caught if issubclass(w.category, UnbudgetedSessionWarning)]
    assert len(unbudgeted) == 1, [str(w.message) for w in caught]
    message = str(unbudgeted[0].message)
    assert "'chat'" in message and "run_config=session.run_config(" in message
    assert unbudgeted[0].message.session_id == "chat"

    # A budgeted run, and the session's own reads outside a run, say nothing.
    budgeted = ProtoPromptSession("chat2", str(tmp_path / "chat.db"))
    config = budgeted.run_config(agent=agent, max_tokens=4_000, model="gpt-5")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await Runner.run(agent, "hello", session=budgeted, run_config=config)
        await budgeted.get_items()
        await ProtoPromptSession("chat3").get_items()
    assert not [w for w in caught if issubclass(w.category, UnbudgetedSessionWarning)]


async def test_instructions_over_the_budget_are_named_in_one_line_from_the_callback(
    tmp_path,
) -> None:
    import traceback
    from pathlib import Path

    import protoprompt

    agent = Agent(
        name="a", instructions="word " * 3000, model=ScriptedModel([[assistant_message("x")]])
    )
    session = ProtoPromptSession("big", str(tmp_path / "big.db"))
    config = session.run_config(agent=agent, model="gpt-5", max_tokens=2_000)
    with pytest.raises(TokenBudgetExceededError) as caught:
        await Runner.run(agent, "hi", session=session, run_config=config)
    exc = caught.value
    # The same name the per-call filter gives, with the sizes, in one line.
    assert exc.section == "instructions_and_tools"
    assert "the agent's instructions (3,011 tokens)" in str(exc)
    assert "alone need 3,0" in exc.detail and "\n" not in str(exc)
    # Raised from the session's callback: no frames of the builder or the packer.
    package = Path(protoprompt.__file__).resolve().parent
    ours = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if Path(f.filename).is_relative_to(package)
    ]
    assert [f.name for f in ours] == ["protoprompt_session_input"], ours
    assert exc.__cause__ is None and exc.__suppress_context__
    assert await session.get_items() == []  # nothing was sent or stored
