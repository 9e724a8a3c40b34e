"""Every model call of a run fits the budget: the per-call ``call_model_input_filter``.

End to end with ``Runner.run`` and the SDK's ``ScriptedModel``, which records what each model
call received (input items, instructions, tools): the budget is checked on those recorded
requests with protoprompt's documented cost model, independently of the filter's own plan.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402
from agents.models.openai_responses import Converter  # noqa: E402
from agents.run_internal.items import drop_orphan_function_calls  # noqa: E402
from agents.run_config import CallModelData, ModelInputData  # noqa: E402
from agents.testing import ModelStep, ScriptedModel, assistant_message, function_call  # noqa: E402
from openai.types.responses import ResponseFunctionWebSearch, ResponseReasoningItem  # noqa: E402
from openai.types.responses.response_function_web_search import ActionSearch  # noqa: E402
from openai.types.responses.response_reasoning_item import Summary  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import (  # noqa: E402
    MemoryScope,
    MemoryStore,
    TokenBudgetedContextBuilder,
    TokenBudgetExceededError,
    item_tokens,
)
from protoprompt.integrations import (  # noqa: E402
    ModelCallPlan,
    ProtoPromptSession,
    model_input_filter,
)
from protoprompt.integrations._calls._steps import newest_step_start, water_level  # noqa: E402
from protoprompt.integrations.model_filter import (  # noqa: E402
    TOOLS_OVERHEAD,
    tool_definitions,
)

TABLE = "\n".join(f"row {i}: " + " ".join(f"v{i}_{j}" for j in range(12)) for i in range(700))
TABLE_TOKENS = pp.count_tokens(TABLE)  # ~42k tokens, the issue's ~40k-token table


@function_tool
def get_table(name: str) -> str:
    """Return a large table by name."""
    return TABLE


def lookup_output(q: str) -> str:
    return f"result for {q}: " + "lorem ipsum dolor sit amet " * 100


@function_tool
def lookup(q: str) -> str:
    """Look something up (a ~600-token answer)."""
    return lookup_output(q)


def request_tokens(call: Any) -> int:
    """What one recorded model call sent, by protoprompt's documented cost model."""
    items = sum(item_tokens(i).total for i in call.input)
    instructions = (
        item_tokens({"role": "system", "content": call.system_instructions}).total
        if call.system_instructions
        else 0
    )
    definitions = tool_definitions(call.tools, call.handoffs)
    tools = TOOLS_OVERHEAD + sum(item_tokens(d).total for d in definitions) if definitions else 0
    text = Converter.get_response_format(call.output_schema)
    schema = item_tokens(text).total if isinstance(text, dict) else 0
    return items + instructions + tools + schema


def assert_sendable(request: list[Any]) -> None:
    """The request is what the API accepts: no orphan call or output, reasoning followed by
    a model item, the SDK would not change it."""
    assert drop_orphan_function_calls(copy.deepcopy(request)) == request
    calls = set()
    for i, item in enumerate(request):
        kind = item.get("type")
        if kind == "function_call":
            calls.add(item["call_id"])
        if kind == "function_call_output":
            assert item["call_id"] in calls, f"orphan output at {i}"
        if kind == "reasoning":
            follower = request[i + 1] if i + 1 < len(request) else {}
            assert follower.get("type") in ("function_call", "message", "web_search_call"), (
                f"reasoning at {i} followed by {follower}"
            )
    outputs = {i["call_id"] for i in request if i.get("type") == "function_call_output"}
    assert calls <= outputs | set(), "every call in the request is answered"


def run_config(
    session: ProtoPromptSession, builder: TokenBudgetedContextBuilder, **kw: Any
) -> RunConfig:
    return session.run_config(builder, tracing_disabled=True, **kw)


# ------------------------------------------------------------------ the scenario


@pytest.mark.parametrize("mode", ["error", "truncate"])
async def test_a_tool_loop_with_huge_outputs_never_overflows(tmp_path: Any, mode: str) -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=20_000, output_reserve=1_000)
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    model = ScriptedModel(
        [
            [function_call("get_table", {"name": "a"}, call_id="c1")],
            [function_call("get_table", {"name": "b"}, call_id="c2")],
            [assistant_message("done", item_id="m1")],
        ]
    )
    agent = Agent(name="a", model=model, tools=[get_table], instructions="Be brief.")
    plans: list[ModelCallPlan] = []
    config = run_config(session, builder, oversized_output=mode, on_call=plans.append)
    if mode == "error":
        with pytest.raises(TokenBudgetExceededError) as info:
            await Runner.run(agent, "show the tables", session=session, run_config=config)
        err = info.value
        assert err.section == "tool_output"
        assert "c1" in err.detail and "get_table" in err.detail
        assert err.used > err.budget == 20_000
        assert len(model.calls) == 1, "the oversized request was never sent"
    else:
        result = await Runner.run(agent, "show the tables", session=session, run_config=config)
        assert result.final_output == "done"
        assert len(model.calls) == 3
        for call, plan in zip(model.calls, plans):
            sent = request_tokens(call)
            assert sent + 1_000 <= 20_000
            assert sent == plan.request_tokens, "the plan reports what was sent"
            assert_sendable(call.input)
        # Calls 2 and 3 carry their newest output cut, with the marker, head and tail.
        for call, cid in ((model.calls[1], "c1"), (model.calls[2], "c2")):
            out = next(i for i in call.input if i.get("type") == "function_call_output")
            assert out["call_id"] == cid
            assert "tokens removed by protoprompt" in out["output"]
            assert out["output"].startswith("row 0: ") and out["output"].endswith("v699_11")
        assert plans[1].truncated[0].original_tokens > TABLE_TOKENS
        assert plans[2].truncated[0].call_id == "c2" and plans[2].truncated[0].tool == "get_table"
        assert "truncated function_call_output" in plans[2].explain()
        # The stored outputs are whole: truncation is for the model's copy only.
        stored = await session.get_items()
        outputs = [i for i in stored if i.get("type") == "function_call_output"]
        assert [o["output"] for o in outputs] == [TABLE, TABLE]
    assert model.calls[0].input == [{"content": "show the tables", "role": "user"}]


async def test_every_call_of_a_thirty_step_loop_fits_and_keeps_its_newest_steps() -> None:
    """Masking off: a long run drops its middle steps whole (with masking, the default, they
    are masked first: ``test_a_fifty_step_loop_keeps_every_call_visible...``)."""
    budget = 6_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500, masking=None)
    session = ProtoPromptSession("loop")
    steps = [[function_call("lookup", {"q": f"q{i}"}, call_id=f"c{i}")] for i in range(30)]
    model = ScriptedModel([*steps, [assistant_message("all done", item_id="m1")]])
    agent = Agent(name="a", model=model, tools=[lookup], instructions="Use the tool.")
    result = await Runner.run(
        agent,
        "look up thirty things",
        session=session,
        run_config=run_config(session, builder, cache=None),  # newest first
        max_turns=40,
    )
    assert result.final_output == "all done"
    assert len(model.calls) == 31
    for n, call in enumerate(model.calls):
        assert request_tokens(call) + 500 <= budget, f"call {n + 1}"
        assert call.input[0] == {"content": "look up thirty things", "role": "user"}
        assert_sendable(call.input)
        ids = [i["call_id"] for i in call.input if i.get("type") == "function_call"]
        if n:
            # The newest step is always there, and the kept steps are the newest ones.
            assert ids and ids[-1] == f"c{n - 1}"
            assert ids == [f"c{k}" for k in range(n - len(ids), n)]
    # What the session stores is the whole run.
    stored = await session.get_items()
    assert sum(1 for i in stored if i.get("type") == "function_call_output") == 30
    step_tokens = {
        i["call_id"]: 0 for i in stored if i.get("type") == "function_call"
    }  # a step: the call and its output
    for i in stored:
        if i.get("type") in ("function_call", "function_call_output"):
            step_tokens[i["call_id"]] += item_tokens(i).total
    [step] = set(step_tokens.values())  # every step costs the same (556 tokens)
    base = request_tokens(model.calls[0])  # the question, instructions and tool
    most = (budget - 500 - base) // step  # the newest steps that fit (9)
    assert 0 < most < 30
    # Late calls had to drop their middle steps, and each dropped no more than it had to:
    # call n + 1 sends the newest min(n, most) steps, exactly.
    for n, call in enumerate(model.calls):
        kept = sum(1 for i in call.input if i.get("type") == "function_call")
        assert kept == min(n, most), f"call {n + 1}"
        assert request_tokens(call) == base + kept * step


async def test_instructions_and_tools_are_in_the_budget() -> None:
    @function_tool
    def noop(x: int) -> str:
        """Do nothing."""
        return "ok"

    many = []
    for k in range(30):

        def make(k: int) -> Any:
            def tool(query: str, limit: int = 5) -> str:
                return f"tool {k}: {query}"

            tool.__name__ = f"tool_{k}"
            tool.__doc__ = f"Tool number {k}. " + "It searches a very large catalogue. " * 12
            return function_tool(tool)

        many.append(make(k))
    instructions = "You are a careful assistant. " * 150
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 40}
        for i in range(40)
    ]
    budget = 9_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500)
    session = ProtoPromptSession("tools")
    await session.add_items(history)
    plans: list[ModelCallPlan] = []
    model = ScriptedModel(
        [[function_call("noop", {"x": 1}, call_id="c1")], [assistant_message("ok", item_id="m1")]]
    )
    agent = Agent(name="a", model=model, tools=[noop, *many], instructions=instructions)
    await Runner.run(
        agent,
        "next question",
        session=session,
        run_config=run_config(session, builder, on_call=plans.append),
    )
    assert plans[0].tools_tokens > 3_000 and plans[0].instructions_tokens > 700
    for call, plan in zip(model.calls, plans):
        assert request_tokens(call) == plan.request_tokens
        assert plan.request_tokens + 500 <= budget
    # Without counting them the callback alone would have sent more history.
    callback_only = ScriptedModel([[assistant_message("ok", item_id="m2")]])
    await Runner.run(
        Agent(name="a", model=callback_only, tools=[noop, *many], instructions=instructions),
        "again",
        session=session,
        run_config=RunConfig(
            session_input_callback=session.input_callback(builder), tracing_disabled=True
        ),
    )
    assert request_tokens(callback_only.calls[0]) + 500 > budget


async def test_tool_definitions_are_counted_once_per_agent() -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=50_000)
    session = ProtoPromptSession("cache")
    model = ScriptedModel(
        [[function_call("lookup", {"q": str(i)}, call_id=f"c{i}")] for i in range(5)]
        + [[assistant_message("ok", item_id="m")]]
    )
    agent = Agent(name="a", model=model, tools=[lookup])
    config = run_config(session, builder)
    await Runner.run(agent, "go", session=session, run_config=config)
    assert len(model.calls) == 6
    assert config.call_model_input_filter._request.counted == 1  # rendered 6 times, counted once


async def test_a_tool_schema_edited_in_place_is_counted_again() -> None:
    """Issue 22 #3: a cached tool cost is keyed by the rendered definition, not the object."""

    @function_tool
    def search(q: str) -> str:
        """Search."""
        return "found"

    budget = 3_000
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget), on_call=plans.append
    )
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("ok", item_id="m")]]))
    agent.tools = [search]
    await Runner.run(agent, "hi", run_config=config)
    small = plans[-1].tools_tokens
    search.params_json_schema["properties"]["q"]["description"] = "a long field note " * 1000
    agent.model = ScriptedModel([])
    with pytest.raises(TokenBudgetExceededError) as info:
        await Runner.run(agent, "hi", run_config=config)
    assert info.value.section == "instructions_and_tools"
    assert len(agent.model.calls) == 0, "the oversized request was never sent"
    search.params_json_schema["properties"]["q"]["description"] = "a field note " * 100
    agent.model = ScriptedModel([[assistant_message("ok", item_id="m")]])
    await Runner.run(agent, "hi", run_config=config)
    assert plans[-1].tools_tokens > small + 300
    assert plans[-1].tools_tokens == request_tokens(agent.model.calls[0]) - sum(
        item_tokens(i).total for i in agent.model.calls[0].input
    )


async def test_reasoning_and_hosted_items_inside_the_run_stay_valid() -> None:
    def think(n: int) -> ResponseReasoningItem:
        return ResponseReasoningItem(
            id=f"rs_{n}",
            type="reasoning",
            summary=[Summary(text="thinking " * 200, type="summary_text")],
        )

    def search(n: int) -> ResponseFunctionWebSearch:
        return ResponseFunctionWebSearch(
            id=f"ws_{n}",
            type="web_search_call",
            status="completed",
            action=ActionSearch(type="search", query=f"query {n}"),
        )

    steps = []
    for i in range(8):
        steps.append([think(i), search(i), function_call("lookup", {"q": str(i)}, call_id=f"c{i}")])
    steps.append([think(99), assistant_message("answer", item_id="m1")])
    model = ScriptedModel(steps)
    budget = 4_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=200)
    session = ProtoPromptSession("reasoning")
    agent = Agent(name="a", model=model, tools=[lookup])
    await Runner.run(
        agent, "research this", session=session, run_config=run_config(session, builder)
    )
    for n, call in enumerate(model.calls):
        assert request_tokens(call) + 200 <= budget
        assert_sendable(call.input)
        if n:
            kinds = [i.get("type") for i in call.input]
            # The newest step is there whole: reasoning, the hosted search, the call, its output.
            assert kinds[-4:] == [
                "reasoning",
                "web_search_call",
                "function_call",
                "function_call_output",
            ]


async def test_the_first_request_of_a_turn_starts_at_a_user_message() -> None:
    """The callback (and the filter) never send an answer whose question was dropped."""
    session = ProtoPromptSession("coherent")
    await session.add_items(
        [
            {"role": "user", "content": "old question"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_0",
                "status": "completed",
                "content": [{"type": "output_text", "text": "old answer", "annotations": []}],
            },
            {"role": "user", "content": "a long question " * 400},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "short answer", "annotations": []}],
            },
        ]
    )
    builder = TokenBudgetedContextBuilder(None, max_tokens=600)
    model = ScriptedModel([[assistant_message("ok", item_id="m2")]])
    await Runner.run(
        Agent(name="a", model=model),
        "new question",
        session=session,
        run_config=run_config(session, builder),
    )
    sent = model.calls[0].input
    assert sent == [{"content": "new question", "role": "user"}]
    plan = builder.last_plan
    assert plan is not None
    assert {d.decision for d in plan.pack.decisions if 3 in d.positions} == {"turn_incomplete"}


# ------------------------------------------------------------------ standalone filter


async def test_standalone_filter_over_a_to_input_list_history() -> None:
    from history_gen import generate

    scope = MemoryScope("acme", user="bob")
    store = MemoryStore()
    store.remember("Bob prefers metric units and short answers.", scope=scope)
    budget = 12_000
    builder = TokenBudgetedContextBuilder(store, max_tokens=budget, output_reserve=800, scope=scope)
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(builder, on_call=plans.append)
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    history: list[Any] = generate(600, "tools", 3)
    for turn in range(3):
        model = ScriptedModel(
            [
                [function_call("lookup", {"q": str(turn)}, call_id=f"t{turn}")],
                [assistant_message(f"answer {turn}", item_id=f"a{turn}")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[lookup])
        question = {"role": "user", "content": f"units for question {turn}?"}
        result = await Runner.run(agent, [*history, question], run_config=config)
        for call in model.calls:
            assert request_tokens(call) + 800 <= budget
            assert_sendable(call.input)
            assert call.input[0]["role"] == "system" and "metric" in call.input[0]["content"]
            assert question in call.input
        # The first request keeps some of the long history, the second also the new step.
        assert len(model.calls[0].input) > 3
        assert model.calls[1].input[-1]["type"] == "function_call_output"
        history = result.to_input_list()
    assert [p.call for p in plans] == [1, 2] * 3
    store.close()


@pytest.mark.parametrize("masking", [pp.Masking(), None], ids=["masking", "no_masking"])
async def test_filter_request_equals_a_fresh_pack_of_what_the_sdk_sent(
    monkeypatch: Any, masking: pp.Masking | None
) -> None:
    """The per-run index never changes a result: each call's request is exactly a fresh
    ``pp.pack`` of the SDK's input with the same mandatory positions. Every plan is kept
    alive meanwhile, and none of them makes the run's index copy its item graph when the
    next call appends (results do not pin the index's graph)."""
    import protoprompt.integrations._calls._runs as runs

    indexes: list[pp.HistoryIndex] = []

    class RecordedIndex(pp.HistoryIndex):
        __slots__ = ()

        def __init__(self) -> None:
            super().__init__()
            indexes.append(self)

    monkeypatch.setattr(runs, "HistoryIndex", RecordedIndex)
    seen: list[tuple[list[Any], ModelCallPlan]] = []
    builder = TokenBudgetedContextBuilder(
        None, max_tokens=5_000, output_reserve=300, policy="greedy", masking=masking
    )
    flt = model_input_filter(builder)
    original = flt.__call__

    async def spy(data: Any) -> Any:
        before = copy.deepcopy(data.model_data.input)
        out = await original(data)
        assert flt.last_plan is not None
        seen.append((before, flt.last_plan))
        return out

    config = RunConfig(call_model_input_filter=spy, tracing_disabled=True)
    model = ScriptedModel(
        [[function_call("lookup", {"q": str(i)}, call_id=f"c{i}")] for i in range(12)]
        + [[assistant_message("ok", item_id="m")]]
    )
    await Runner.run(
        Agent(name="a", model=model, tools=[lookup]), "go", run_config=config, max_turns=20
    )
    assert len(seen) == 13
    for items, plan in seen:
        s, _ = plan.step
        fresh = pp.pack(
            items[:s],
            items[s:],
            5_000,
            output_reserve=300,
            policy="greedy",
            context_tokens=plan.instructions_tokens + plan.tools_tokens,
            pinned=plan.pinned,
            masking=masking,
        )
        assert plan.pack.items == fresh.items
        assert plan.pack.masked == fresh.masked
        assert (plan.pack.used, plan.pack.history_tokens) == (fresh.used, fresh.history_tokens)
        assert plan.pack.decisions.item_counts() == fresh.decisions.item_counts()
    assert len(indexes) == 1 and len(indexes[0]) > 0  # the run's index, used for every call
    assert indexes[0]._index._graph_copies() == 0  # the kept plans pinned nothing
    if masking is not None:
        assert seen[-1][1].pack.masked, "late calls masked middle steps"


# ------------------------------------------------------------------ persistence unchanged


def _loop_script() -> list[Any]:
    return [
        [function_call("get_table", {"name": "a"}, call_id="c1")],
        [function_call("lookup", {"q": "x"}, call_id="c2")],
        [assistant_message("done", item_id="m1")],
    ]


async def _stored(mode: str, with_filter: bool) -> list[Any]:
    session = ProtoPromptSession("p")
    builder = TokenBudgetedContextBuilder(None, max_tokens=8_000)
    config = (
        run_config(session, builder, oversized_output="truncate")
        if with_filter
        else RunConfig(tracing_disabled=True)
    )
    agent = Agent(name="a", model=ScriptedModel(_loop_script()), tools=[get_table, lookup])
    for question in ("first", "second"):
        agent.model = ScriptedModel(_loop_script())
        if mode == "run":
            await Runner.run(agent, question, session=session, run_config=config)
        else:
            streamed = Runner.run_streamed(agent, question, session=session, run_config=config)
            async for _ in streamed.stream_events():
                pass
    return await session.get_items()


@pytest.mark.parametrize("mode", ["run", "run_streamed"])
async def test_the_session_stores_what_it_stores_without_the_filter(mode: str) -> None:
    with_filter = await _stored(mode, True)
    without = await _stored(mode, False)
    assert with_filter == without
    assert not any(i.get("role") == "system" for i in with_filter)
    assert any(i.get("output") == TABLE for i in with_filter)


def test_run_sync_stores_the_same_with_the_filter() -> None:
    def stored(with_filter: bool) -> list[Any]:
        session = ProtoPromptSession("sync")
        builder = TokenBudgetedContextBuilder(None, max_tokens=8_000)
        config = (
            run_config(session, builder, oversized_output="truncate")
            if with_filter
            else RunConfig(tracing_disabled=True)
        )
        agent = Agent(name="a", model=ScriptedModel(_loop_script()), tools=[get_table, lookup])
        Runner.run_sync(agent, "question", session=session, run_config=config)
        return asyncio.run(session.get_items())

    assert stored(True) == stored(False)


@function_tool(needs_approval=True)
def delete_rows(table: str) -> str:
    """Delete the rows of a table (a human must approve)."""
    return f"deleted {table}"


async def test_approval_interruption_and_resume_store_the_same() -> None:
    async def run(with_filter: bool) -> tuple[list[Any], ScriptedModel]:
        session = ProtoPromptSession("approve")
        builder = TokenBudgetedContextBuilder(None, max_tokens=9_000)
        config = (
            run_config(session, builder, oversized_output="truncate")
            if with_filter
            else RunConfig(tracing_disabled=True)
        )
        model = ScriptedModel(
            [
                [function_call("get_table", {"name": "a"}, call_id="c1")],
                [function_call("delete_rows", {"table": "a"}, call_id="c2")],
                [assistant_message("deleted", item_id="m1")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[get_table, delete_rows])
        first = await Runner.run(agent, "clean table a", session=session, run_config=config)
        assert len(first.interruptions) == 1
        state = first.to_state()
        state.approve(first.interruptions[0])
        resumed = await Runner.run(agent, state, session=session, run_config=config)
        assert resumed.final_output == "deleted"
        return await session.get_items(), model

    with_filter, model = await run(True)
    without, _ = await run(False)
    assert with_filter == without
    for call in model.calls:
        assert request_tokens(call) <= 9_000
        assert_sendable(call.input)


# ------------------------------------------------------------------ API and helpers


def test_run_config_sets_both_hooks_and_passes_fields_through() -> None:
    session = ProtoPromptSession("api")
    builder = TokenBudgetedContextBuilder(None, max_tokens=1_000)
    config = session.run_config(
        builder, system_prompt="x", workflow_name="w", tracing_disabled=True
    )
    assert callable(config.session_input_callback)
    assert config.call_model_input_filter.session is session
    assert config.workflow_name == "w" and config.tracing_disabled
    with pytest.raises(TypeError, match="call_model_input_filter"):
        session.run_config(builder, call_model_input_filter=lambda d: d.model_data)
    with pytest.raises(ValueError, match="oversized_output"):
        session.model_input_filter(builder, oversized_output="drop")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="TokenBudgetedContextBuilder"):
        model_input_filter(object())  # type: ignore[arg-type]


def test_newest_step_is_the_last_model_output_and_its_answers() -> None:
    user = {"role": "user", "content": "q"}
    fc = {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "a", "output": "x"}
    rs = {"type": "reasoning", "id": "rs_1", "summary": []}
    msg = {"type": "message", "role": "assistant", "id": "m", "status": "completed", "content": []}
    items = [user, msg, rs, fc, out]
    assert newest_step_start(items, 1) == 1  # msg, reasoning and call are one response
    assert newest_step_start([user, fc, out, rs, fc, out], 1) == 3
    assert newest_step_start([user], 1) == 1  # nothing after the run's input
    assert newest_step_start([user, out], 1) == 1


def test_water_level_shares_the_room_among_outputs() -> None:
    assert water_level([100, 5000, 3000], 10_000) == 5000
    assert water_level([100, 5000, 3000], 3100) == 1500
    assert water_level([100, 5000, 3000], 250) == 83  # 3 x 83 <= 250
    assert water_level([10], -1) is None


def test_truncated_structured_outputs_fit_and_say_what_was_removed() -> None:
    from protoprompt import _core

    def fit(item: dict[str, Any], target: int) -> tuple[dict[str, Any], int] | None:
        out = _core.fit_output(item, target, encoding="o200k_base")
        return None if out is None else (out[0], out[1])

    image = {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"}
    item = {
        "type": "function_call_output",
        "call_id": "c",
        "output": [
            {"type": "input_text", "text": TABLE},
            image,
            {"type": "input_text", "text": "tail"},
        ],
    }
    for target in (30_000, 2_000, 120):
        cut = fit(item, target)
        assert cut is not None
        assert target - 12 <= cut[1] <= target, "the room is used, not wasted"
        assert cut[1] == item_tokens(cut[0]).total, "the cost said is the copy's cost"
        assert item["output"][0]["text"] == TABLE, "the stored item is untouched"
    cut = fit(item, 2_000)
    assert cut is not None and cut[0]["output"][1] == image, "the image fits once the text is cut"
    assert fit(item, 10) is None, "not even the markers fit"
    cut = fit(item, 120)
    assert cut is not None
    assert [p["type"] for p in cut[0]["output"]] == ["input_text"] * 3
    assert "removed by protoprompt" in json.dumps(cut[0])
    shell = {
        "type": "shell_call_output",
        "call_id": "s",
        "output": [{"stdout": TABLE, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
    }
    cut = fit(shell, 1_000)
    assert cut is not None and cut[1] <= 1_000
    assert cut[0]["output"][0]["outcome"] == {"type": "exit", "exit_code": 0}
    screenshot = {
        "type": "computer_call_output",
        "call_id": "x",
        "output": {"type": "computer_screenshot", "image_url": "https://example.com/s.png"},
    }
    assert fit(screenshot, 100) is None, "a screenshot cannot be cut"


# ------------------------------------------------------------------ tools of every kind


class _FakeMCP(agents.mcp.MCPServer):
    """An in-process MCP server with a few large tools (no transport)."""

    def __init__(self) -> None:
        super().__init__()
        self.listed = 0

    @property
    def name(self) -> str:
        return "catalogue"

    async def connect(self) -> None:
        return None

    async def cleanup(self) -> None:
        return None

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[Any]:
        import mcp.types

        self.listed += 1
        schema = {
            "type": "object",
            "properties": {
                f"field_{k}": {"type": "string", "description": "a searchable field " * 8}
                for k in range(12)
            },
        }
        return [
            mcp.types.Tool(
                name=f"search_{i}", description="Search the catalogue. " * 20, inputSchema=schema
            )
            for i in range(4)
        ]

    async def call_tool(self, tool_name: str, arguments: Any, meta: Any = None) -> Any:
        raise AssertionError("not called in this test")

    async def list_prompts(self) -> Any:
        raise NotImplementedError

    async def get_prompt(self, name: str, arguments: Any = None) -> Any:
        raise NotImplementedError


async def test_mcp_hosted_and_handoff_tools_are_counted() -> None:
    from agents import WebSearchTool

    server = _FakeMCP()
    helper = Agent(
        name="helper",
        handoff_description="Answers billing questions. " * 10,
        model=ScriptedModel([[assistant_message("billing answer", item_id="h1")]]),
    )
    model = ScriptedModel([[assistant_message("ok", item_id="m1")]])
    agent = Agent(
        name="a",
        model=model,
        tools=[lookup, WebSearchTool()],
        handoffs=[helper],
        mcp_servers=[server],
    )
    plans: list[ModelCallPlan] = []
    builder = TokenBudgetedContextBuilder(None, max_tokens=50_000)
    session = ProtoPromptSession("kinds")
    await Runner.run(
        agent, "hi", session=session, run_config=run_config(session, builder, on_call=plans.append)
    )
    call = model.calls[0]
    names = {getattr(t, "name", None) for t in call.tools}
    assert {"search_0", "lookup"} <= names, "the SDK sent the MCP tools"
    assert (
        plans[0].tools_tokens
        == request_tokens(call)
        - sum(item_tokens(i).total for i in call.input)
        - plans[0].instructions_tokens
    )
    plain = tool_definitions([lookup])
    assert plans[0].tools_tokens > 4 * 250 + sum(item_tokens(d).total for d in plain)


async def test_a_handoff_inside_the_run_keeps_every_call_within_the_budget() -> None:
    budget = 5_000
    steps_b = [[function_call("lookup", {"q": str(i)}, call_id=f"b{i}")] for i in range(6)]
    model = ScriptedModel(
        [
            [function_call("lookup", {"q": "a"}, call_id="a1")],
            [function_call("transfer_to_billing", {}, call_id="h1")],
            *steps_b,
            [assistant_message("billing done", item_id="m1")],
        ]
    )
    billing = Agent(
        name="billing", model=model, tools=[lookup], instructions="You handle billing. " * 30
    )
    front = Agent(name="front", model=model, tools=[lookup], handoffs=[billing])
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=300)
    session = ProtoPromptSession("handoff")
    result = await Runner.run(
        front,
        "please sort out my bill",
        session=session,
        run_config=run_config(session, builder),
        max_turns=20,
    )
    assert result.final_output == "billing done"
    assert len(model.calls) == 9
    for call in model.calls:
        assert request_tokens(call) + 300 <= budget
        assert_sendable(call.input)


# ------------------------------------------------------------------ issue 22: run identity


@function_tool
def note(q: str) -> str:
    """Take a note (a ~110-token answer)."""
    return f"note {q}: " + "noted and filed " * 35


def numbered_steps(steps: int, tool: str = "note") -> Any:
    """A responder for ``ModelStep.respond``: a call of ``tool`` numbered per run
    (``call_0``, ``call_1`` … in every run, as models that number calls per response do)
    until ``steps`` outputs are in, then an answer. It reads the newest output's number from
    the input it is given, so concurrent runs may share it."""

    def respond(call: Any) -> list[Any]:
        done = [
            int(i["call_id"].rsplit("_", 1)[1])
            for i in call.input
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        n = max(done) + 1 if done else 0
        if n < steps:
            return [function_call(tool, {"q": str(n)}, call_id=f"call_{n}")]
        return [assistant_message("done", item_id="m_done")]

    return respond


def responder_model(calls: int, respond: Any) -> ScriptedModel:
    return ScriptedModel([ModelStep.respond(respond) for _ in range(calls)])


def user_parts(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


async def test_concurrent_runs_with_list_content_keep_their_own_costs() -> None:
    """Issue 22 #1: two runs through one filter and one agent at once; their user messages
    have list content of very different sizes. Each run's calls are costed as its own."""
    budget = 3_500
    flt = model_input_filter(TokenBudgetedContextBuilder(None, max_tokens=budget))
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    model = responder_model(8, numbered_steps(3))
    agent = Agent(name="a", model=model, tools=[note])
    big = user_parts("word " * 3_200)
    small = user_parts("hi there")
    results = await asyncio.gather(
        Runner.run(agent, [big], run_config=config),
        Runner.run(agent, [small], run_config=config),
    )
    assert [r.final_output for r in results] == ["done", "done"]
    assert len(model.calls) == 8
    for call in model.calls:
        assert request_tokens(call) <= budget
        assert_sendable(call.input)
    big_calls = [c for c in model.calls if c.input[0] == big]
    assert len(big_calls) == 4
    assert request_tokens(big_calls[-1]) > 3_300, "the big run kept what fits"


async def test_runs_are_told_apart_by_the_sdk_not_by_their_items() -> None:
    """Concurrent, streamed, nested (agent as tool) runs and runs inside one user trace
    each continue only their own state: every later call of a run reuses the index of that
    run's previous call, and a call made outside a run is packed from scratch."""
    from agents import trace

    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=50_000), on_call=plans.append
    )

    def runs_of(plans: list[ModelCallPlan]) -> dict[str, list[ModelCallPlan]]:
        out: dict[str, list[ModelCallPlan]] = {}
        for p in plans:
            first = next(i for i in p.items if i.get("role") == "user")
            out.setdefault(str(first["content"]), []).append(p)
        return out

    async def check(tracing_disabled: bool) -> None:
        plans.clear()
        config = RunConfig(call_model_input_filter=flt, tracing_disabled=tracing_disabled)
        inner = Agent(name="inner", model=responder_model(3, numbered_steps(2)), tools=[note])
        helper = inner.as_tool(tool_name="ask_inner", tool_description="Ask the inner agent.")
        outer_model = ScriptedModel(
            [
                [function_call("ask_inner", {"input": "nested question"}, call_id="call_0")],
                [assistant_message("outer done", item_id="m_outer")],
            ]
        )
        outer = Agent(name="outer", model=outer_model, tools=[helper])
        shared = Agent(name="a", model=responder_model(12, numbered_steps(3)), tools=[note])

        async def streamed(q: str) -> None:
            result = Runner.run_streamed(shared, q, run_config=config)
            async for _ in result.stream_events():
                pass

        with trace("user workflow"):
            await asyncio.gather(
                Runner.run(shared, "run one", run_config=config),
                Runner.run(shared, "run two", run_config=config),
                streamed("run three"),
            )
        await Runner.run(outer, "outer question", run_config=config)
        by_run = runs_of(plans)
        assert {k: len(v) for k, v in by_run.items()} == {
            "run one": 4,
            "run two": 4,
            "run three": 4,
            "outer question": 2,
            "nested question": 3,
        }
        for name, run_plans in by_run.items():
            assert [p.call for p in run_plans] == list(range(1, len(run_plans) + 1)), name
            assert run_plans[0].reuse == "first call of the run"
            for prev, p in zip(run_plans, run_plans[1:]):
                assert p.reuse == "the run's earlier calls", name
                # Everything the previous call indexed (its history) came from the index.
                assert p.reused == prev.step[0] > 0, name

    await check(tracing_disabled=True)
    await check(tracing_disabled=False)

    # Outside a run there is no agent span: every call is packed from scratch.
    from agents.run_config import CallModelData, ModelInputData

    agent = Agent(name="a", tools=[note])
    items: list[Any] = [{"role": "user", "content": "direct"}]
    for k in range(3):
        await flt(CallModelData(ModelInputData(input=list(items), instructions=None), agent, None))
        assert flt.last_plan is not None
        assert (flt.last_plan.call, flt.last_plan.reused) == (1, 0)
        assert flt.last_plan.reuse == "no run in scope"
        items += [
            {"type": "function_call", "call_id": f"c{k}", "name": "note", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{k}", "output": "ok"},
        ]


async def test_call_ids_reused_across_runs_do_not_tie_old_outputs_to_the_new_step() -> None:
    """Issue 22 #2: a model that numbers its calls per response sends ``call_0`` in every
    run. With the history of earlier runs passed back as input, the old run's huge output is
    not part of this run's mandatory step: the list is packed as the SDK sends it, after its
    de-duplication (the old output is collapsed into the new one)."""

    @function_tool
    def dump(q: str) -> str:
        """Dump a big table."""
        return TABLE if q == "big" else "a short answer"

    budget = 8_000
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget),
        oversized_output="truncate",
        on_call=plans.append,
    )
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    first = ScriptedModel(
        [
            [function_call("dump", {"q": "big"}, call_id="call_0")],
            [assistant_message("one", item_id="m1")],
        ]
    )
    agent = Agent(name="a", model=first, tools=[dump])
    r1 = await Runner.run(agent, "first question", run_config=config)
    assert plans[-1].truncated, "the big output was cut in the first run"
    second = ScriptedModel(
        [
            [function_call("dump", {"q": "small"}, call_id="call_0")],
            [assistant_message("two", item_id="m2")],
        ]
    )
    agent.model = second
    history = [*r1.to_input_list(), {"role": "user", "content": "second question"}]
    r2 = await Runner.run(agent, history, run_config=config)
    assert r2.final_output == "two"
    for call in second.calls:
        assert request_tokens(call) <= budget
        assert_sendable(call.input)
    assert plans[-1].deduplicated == 2, "the old call and output collapse into the new ones"
    sent = second.calls[1].input
    outputs = [i for i in sent if i.get("type") == "function_call_output"]
    assert [o["output"] for o in outputs] == ["a short answer"]


# ------------------------------------------------------------------ issue 22: edits in place


async def test_an_item_edited_in_place_between_calls_is_counted_again() -> None:
    """Issue 22 #3: a filter chained before ours keeps a scratchpad (list content) that it
    grows in place on every call; every call is costed as it is now."""
    budget = 3_500
    flt = model_input_filter(TokenBudgetedContextBuilder(None, max_tokens=budget))
    pad = {"role": "developer", "content": [{"type": "input_text", "text": "scratchpad:"}]}

    async def chained(data: Any) -> Any:
        pad["content"][0]["text"] += " a growing line of notes" * 250
        items = data.model_data.input
        data.model_data.input = [items[0], pad, *items[1:]]
        return await flt(data)

    model = ScriptedModel(
        [[function_call("note", {"q": str(i)}, call_id=f"c{i}")] for i in range(5)]
        + [[assistant_message("ok", item_id="m")]]
    )
    config = RunConfig(call_model_input_filter=chained, tracing_disabled=True)
    await Runner.run(Agent(name="a", model=model, tools=[note]), "go", run_config=config)
    assert pp.count_tokens(pad["content"][0]["text"]) > budget
    for call in model.calls:
        assert request_tokens(call) <= budget
    assert pad not in model.calls[-1].input, "the pad no longer fits: dropped, not mis-costed"
    assert flt.last_plan is not None and "changed" in flt.last_plan.reuse


# ------------------------------------------------------------------ issue 22: output schema


def _big_output_type() -> Any:
    from pydantic import BaseModel, Field, create_model

    fields: dict[str, Any] = {
        f"field_{i}": (str, Field(description=f"The {i}th finding, " + "carefully cited " * 40))
        for i in range(70)
    }
    model: type[BaseModel] = create_model("Report", **fields)
    return model


async def test_the_output_type_schema_is_in_the_budget() -> None:
    """Issue 22 #4: ``Agent(output_type=...)`` sends its JSON schema (Responses
    ``text.format``) with every call; it is counted like the tools."""
    from agents.agent_output import AgentOutputSchema

    report = _big_output_type()
    text = Converter.get_response_format(AgentOutputSchema(report))
    schema_tokens = item_tokens(text).total
    assert schema_tokens > 7_000
    budget = 12_000
    history = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " * 60}
        for i in range(60)
    ]
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500),
        on_call=plans.append,
    )
    answer = json.dumps({f"field_{i}": "x" for i in range(70)})
    model = ScriptedModel([[assistant_message(answer, item_id="m")]])
    agent = Agent(name="a", model=model, output_type=report)
    config = RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    await Runner.run(agent, [*history, {"role": "user", "content": "report"}], run_config=config)
    call = model.calls[0]
    assert request_tokens(call) + 500 <= budget
    assert plans[0].output_schema_tokens == schema_tokens
    assert request_tokens(call) == plans[0].request_tokens
    assert sum(item_tokens(i).total for i in call.input) < budget - schema_tokens
    assert "output schema" in plans[0].explain()


async def test_a_stored_prompt_template_is_named_as_not_counted() -> None:
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=5_000), on_call=plans.append
    )
    model = ScriptedModel([[assistant_message("ok", item_id="m")]])
    agent = Agent(name="a", model=model, prompt={"id": "pmpt_123", "version": "2"})
    await Runner.run(
        agent, "hi", run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True)
    )
    assert model.calls[0].prompt is not None
    [note_text] = plans[0].not_counted
    assert "pmpt_123" in note_text and "not in the per-call budget" in note_text
    assert "not counted: the stored prompt template" in plans[0].explain()


# ------------------------------------------------------------------ issue 22: many-part outputs


@pytest.mark.parametrize("images", [0, 5])
async def test_many_part_outputs_are_cut_by_parts(images: int) -> None:
    """Issue 22 #5: an output of many small text parts (each below the 32-token floor), with
    or without images, is cut: images first, then the middle parts give way to a marker."""
    from agents import ToolOutputImage, ToolOutputText

    n = 800 if not images else 300

    @function_tool
    def listing(q: str) -> list[Any]:
        """A listing in many parts."""
        parts: list[Any] = [
            ToolOutputText(text=f"entry {i}: " + "alpha beta " * 6) for i in range(n)
        ]
        for k in range(images):
            parts.insert(k * 50, ToolOutputImage(image_url=f"https://example.com/{k}.png"))
        return parts

    budget = 6_000
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget),
        oversized_output="truncate",
        on_call=plans.append,
    )
    model = ScriptedModel(
        [
            [function_call("listing", {"q": "all"}, call_id="c1")],
            [assistant_message("ok", item_id="m")],
        ]
    )
    await Runner.run(
        Agent(name="a", model=model, tools=[listing]),
        "list everything",
        run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True),
    )
    call = model.calls[1]
    assert request_tokens(call) <= budget
    assert request_tokens(call) > budget - 200, "the room is used"
    [cut] = plans[1].truncated
    assert cut.original_tokens > budget and cut.parts_removed > 0
    assert cut.media_removed == images
    out = next(i for i in call.input if i.get("type") == "function_call_output")["output"]
    texts = [p.get("text", "") for p in out]
    assert texts[0].startswith("entry 0:") or images
    assert texts[-1].startswith(f"entry {n - 1}:")
    assert any("parts (" in t and "removed by protoprompt" in t for t in texts)


async def test_the_standalone_filter_cuts_to_fit_with_a_system_prompt() -> None:
    """Issue 22 #5: with a non-empty ``system_prompt`` the cut leaves room for it."""
    budget = 3_000
    system_prompt = "Answer from the recalled facts only. " * 20
    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=200),
        oversized_output="truncate",
        system_prompt=system_prompt,
        on_call=plans.append,
    )
    model = ScriptedModel(
        [
            [function_call("get_table", {"name": "a"}, call_id="c1")],
            [assistant_message("ok", item_id="m")],
        ]
    )
    await Runner.run(
        Agent(name="a", model=model, tools=[get_table]),
        "show table a",
        run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True),
    )
    call = model.calls[1]
    assert call.input[0]["role"] == "system" and system_prompt.strip() in call.input[0]["content"]
    assert request_tokens(call) + 200 <= budget
    assert request_tokens(call) + 200 > budget - 40, "the room is used"
    assert plans[1].truncated[0].call_id == "c1"


# ------------------------------------------------------------------ issue 22: the property


def _reference_tokens(value: Any) -> int:
    """An independent lower bound of what the model reads in ``value``: OpenAI's own
    ``tiktoken`` over every string in it (no keys, no framing)."""
    from reference_tokenizer import count

    if isinstance(value, str):
        return count(value)
    if isinstance(value, dict):
        return sum(_reference_tokens(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_reference_tokens(v) for v in value)
    return 0


class _RequestRecorder(ScriptedModel):
    """A scripted model that also builds, at call time, the request the SDK's Responses model
    would send (``OpenAIResponsesModel._build_response_create_kwargs``), so the check sees
    tools and schemas as they were at that moment (a later in-place edit cannot hide)."""

    def __init__(self, steps: Any) -> None:
        super().__init__(steps)
        from agents import OpenAIResponsesModel
        from openai import AsyncOpenAI

        self.responses = OpenAIResponsesModel(
            model="gpt-5",
            openai_client=AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9"),
        )
        self.requests: list[dict[str, Any]] = []

    async def get_response(
        self,
        system_instructions: Any,
        input: Any,
        model_settings: Any,
        tools: Any,
        output_schema: Any,
        handoffs: Any,
        tracing: Any,
        **kw: Any,
    ) -> Any:  # noqa: E501
        request = self.responses._build_response_create_kwargs(
            system_instructions,
            copy.deepcopy(input),
            model_settings,
            tools,
            output_schema,
            handoffs,
            prompt=kw.get("prompt"),
        )
        recorded = copy.deepcopy(
            {k: request.get(k) for k in ("input", "instructions", "tools", "text")}
        )
        call = SimpleNamespace(
            input=input,
            system_instructions=system_instructions,
            tools=tools,
            handoffs=handoffs,
            output_schema=output_schema,
        )
        recorded["exact"] = request_tokens(call)  # now: a later in-place edit cannot change it
        self.requests.append(recorded)
        return await super().get_response(
            system_instructions,
            input,
            model_settings,
            tools,
            output_schema,
            handoffs,
            tracing,
            **kw,
        )


def _scenario_tools(parts: int, text_tokens: int, images: int) -> Any:
    from agents import ToolOutputImage, ToolOutputText

    @function_tool
    def fetch(q: str) -> Any:
        """Fetch a document (text, or many parts with images)."""
        if parts <= 1:
            return f"doc {q}: " + "payload words " * (text_tokens // 2)
        out: list[Any] = [
            ToolOutputText(text=f"part {i} of {q}: " + "w " * (text_tokens // parts))
            for i in range(parts)
        ]
        for k in range(images):
            out.insert(k * 3, ToolOutputImage(image_url=f"https://example.com/{q}/{k}.png"))
        return out

    return fetch


def _scenario_steps(steps: int, reasoning: bool, answer: str) -> Any:
    def respond(call: Any) -> list[Any]:
        done = [
            int(i["call_id"].rsplit("_", 1)[1])
            for i in call.input
            if isinstance(i, dict) and i.get("type") == "function_call_output"
        ]
        n = max(done) + 1 if done else 0
        out: list[Any] = []
        if reasoning:  # ids reused in every run, like the call ids
            out.append(
                ResponseReasoningItem(
                    id=f"rs_{n}",
                    type="reasoning",
                    summary=[Summary(text="thinking " * 30, type="summary_text")],
                )
            )
        if n < steps:
            return [*out, function_call("fetch", {"q": f"d{n}"}, call_id=f"call_{n}")]
        return [*out, assistant_message(answer, item_id="m_final")]

    return respond


@st.composite
def _filter_scenarios(draw: Any) -> dict[str, Any]:
    return {
        "budget": draw(st.integers(2_500, 14_000)),
        "reserve": draw(st.sampled_from([0, 200, 800])),
        "runs": draw(st.integers(1, 3)),
        "rounds": draw(st.integers(1, 2)),
        "steps": draw(st.integers(0, 7)),
        "parts": draw(st.sampled_from([1, 1, 40, 300])),
        "text_tokens": draw(st.sampled_from([50, 400, 3_000, 20_000])),
        "images": draw(st.sampled_from([0, 0, 2])),
        "reasoning": draw(st.booleans()),
        "output_fields": draw(st.sampled_from([0, 0, 5, 60])),
        "history_turns": draw(st.integers(0, 30)),
        "list_content": draw(st.booleans()),
        "scratchpad": draw(st.booleans()),
        "edit_schema": draw(st.booleans()),
        "system_prompt": draw(st.sampled_from(["", "Use the recalled facts. " * 10])),
        "masking": draw(
            st.sampled_from(
                [
                    None,
                    pp.Masking(),
                    pp.Masking(excerpt_tokens=16),
                    pp.Masking(excerpt_tokens=120, after_turns=1),
                    pp.Masking(after_turns=0),
                ]
            )
        ),
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_filter_scenarios())
def test_every_call_of_every_run_fits_whatever_the_agent_sends(sc: dict[str, Any]) -> None:
    """The per-call budget holds in every shape a real agent produces: concurrent runs on
    one agent and one filter, call and reasoning ids reused in every run, histories passed
    back, in-place edits of a tool's schema (between rounds) and of an item (a chained
    filter's scratchpad), structured outputs of every size, many-part outputs with images.
    Every model call the SDK made is checked against an independent count (``tiktoken`` over
    every string of the request the SDK's Responses model builds: a lower bound), the exact
    cost model, and the SDK's own ``drop_orphan_function_calls``; with masking drawn on and
    off (the builder's), the SDK's items and the caller's are left as they were."""
    asyncio.run(_run_scenario(sc))


async def _run_scenario(sc: dict[str, Any]) -> None:
    from pydantic import Field, create_model

    budget, reserve = sc["budget"], sc["reserve"]
    builder = TokenBudgetedContextBuilder(
        None, max_tokens=budget, output_reserve=reserve, masking=sc["masking"]
    )
    flt = model_input_filter(
        builder, oversized_output="truncate", system_prompt=sc["system_prompt"]
    )
    pads: dict[str, dict[str, Any]] = {}  # a chained filter's scratchpad, one per run

    async def chained(data: Any) -> Any:
        if sc["scratchpad"]:
            items = data.model_data.input
            run = json.dumps(next(i for i in reversed(items) if i.get("role") == "user"))
            pad = pads.setdefault(
                run, {"role": "developer", "content": [{"type": "input_text", "text": "pad:"}]}
            )
            pad["content"][0]["text"] += " note" * 150  # grows in place on every call
            data.model_data.input = [*items[:1], pad, *items[1:]]
        before = copy.deepcopy(data.model_data.input)
        out = await flt(data)
        assert data.model_data.input == before, "the filter changed the SDK's items"
        if flt.last_plan is not None and flt.last_plan.pack.masked:
            event("masked")
        return out

    output_type: Any = None
    answer = "the answer"
    if sc["output_fields"]:
        fields = {
            f"f{i}": (str, Field(description="a finding, cited " * 12))
            for i in range(sc["output_fields"])
        }
        output_type = create_model("Findings", **fields)  # type: ignore[call-overload]
        answer = json.dumps({f"f{i}": "x" for i in range(sc["output_fields"])})
    tool = _scenario_tools(sc["parts"], sc["text_tokens"], sc["images"])
    calls = sc["runs"] * sc["rounds"] * (sc["steps"] + 1)
    model = _RequestRecorder(
        [
            ModelStep.respond(_scenario_steps(sc["steps"], sc["reasoning"], answer))
            for _ in range(calls)
        ]
    )
    agent = Agent(
        name="a", model=model, tools=[tool], output_type=output_type, instructions="Be exact."
    )
    config = RunConfig(call_model_input_filter=chained, tracing_disabled=True)
    histories: list[list[Any]] = [
        [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"run {r} turn {i} " * 20}
            for i in range(sc["history_turns"])
        ]
        for r in range(sc["runs"])
    ]
    refused: list[int] = []
    for round_ in range(sc["rounds"]):
        if round_ and sc["edit_schema"]:
            tool.params_json_schema["properties"]["q"]["description"] = "the document id " * 300

        async def one(r: int) -> Any:
            text = f"run {r} round {round_}: fetch the documents " + "please " * (r * 400)
            question = user_parts(text) if sc["list_content"] else {"role": "user", "content": text}
            given = [*histories[r], question]
            kept = copy.deepcopy(given)
            try:
                return await Runner.run(agent, given, run_config=config, max_turns=20)
            except TokenBudgetExceededError:
                refused.append(r)  # the mandatory part did not fit: refused before sending
                return None
            finally:
                assert given == kept, "the caller's items are unchanged"

        results = await asyncio.gather(*(one(r) for r in range(sc["runs"])))
        for r, result in enumerate(results):
            if result is not None:
                histories[r] = result.to_input_list()
    assert model.requests or refused
    for request in model.requests:
        sent = request["input"]
        assert drop_orphan_function_calls(copy.deepcopy(sent)) == sent
        lower = _reference_tokens(
            [request["instructions"], sent, request["tools"], request["text"]]
        )
        assert lower + reserve <= budget, f"tiktoken lower bound {lower} over {budget - reserve}"
        assert request["exact"] + reserve <= budget


_DEDUP_SHAPES = [
    lambda k: {"type": "function_call", "call_id": f"c{k}", "name": "f", "arguments": "{}"},
    lambda k: {"type": "function_call_output", "call_id": f"c{k}", "output": f"out {k}"},
    lambda k: {"type": "reasoning", "id": f"rs_{k}", "summary": []},
    lambda k: {"type": "web_search_call", "id": f"ws_{k}", "status": "completed"},
    lambda k: {
        "type": "mcp_approval_request",
        "id": f"ar_{k}",
        "name": "t",
        "arguments": "{}",
        "server_label": "s",
    },
    lambda k: {"type": "mcp_approval_response", "approval_request_id": f"ar_{k}", "approve": True},
    lambda k: {"role": "user", "content": f"q{k}"},
    lambda k: {"type": "message", "role": "assistant", "id": f"m{k}", "content": []},
]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(_DEDUP_SHAPES) - 1), st.integers(0, 3), st.integers(0, 99)),
        max_size=30,
    ),
    st.integers(0, 30),
)
def test_packing_sees_the_list_the_sdk_deduplicates_to(draws: list[Any], start: int) -> None:
    """``collapse`` makes of a list exactly what the SDK's
    ``deduplicate_input_items_preferring_latest`` makes of it, and maps every position:
    each original item's key survives at ``position(i)``, positions keep their order, and a
    region's start maps to the first position standing at or after it."""
    from agents.run_internal.items import deduplicate_input_items_preferring_latest

    from protoprompt import _core
    from protoprompt.integrations._calls._runs import collapse, dedupe_keys
    from protoprompt.integrations._sdk._names import DEDUPE_ANCHOR_TYPES

    items = [{**_DEDUP_SHAPES[s](k), "n": n} for s, k, n in draws]  # "n": content differs
    keys = dedupe_keys(items)
    digests, _ = _core.digests(items)
    out = collapse(items, keys, digests)
    assert out.items == deduplicate_input_items_preferring_latest(copy.deepcopy(items))
    assert out.digests == _core.digests(out.items)[0]
    # Where each position went, by the SDK's rule (tested above by the items themselves):
    # a key's survivor stands at its first occurrence, or at its last occurrence of a type
    # that is not a call, reasoning or approval request.
    anchor: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is not None and (key not in anchor or items[i]["type"] not in DEDUPE_ANCHOR_TYPES):
            anchor[key] = i
    stands = sorted({i for i, k in enumerate(keys) if k is None} | set(anchor.values()))
    for i, key in enumerate(keys):
        assert out.position(i) == stands.index(i if key is None else anchor[key])
    s = min(start, len(items))
    assert out.start(s) == bisect.bisect_left(stands, s)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(_DEDUP_SHAPES) - 1), st.integers(0, 3), st.integers(0, 99)),
        max_size=30,
    ),
    st.lists(st.integers(0, 12), min_size=1, max_size=5),
)
def test_a_runs_collapse_of_a_growing_list_is_the_sdks(draws: list[Any], grow: list[int]) -> None:
    """A run's calls collapse each input (its previous input plus what was appended, a fresh
    copy each call) exactly as :func:`collapse` does, also when only the part from a
    position on is read, though the positions are kept between calls while nothing they
    cover changed."""
    from protoprompt.integrations._calls._runs import Run, collapse, dedupe_keys

    items = [{**_DEDUP_SHAPES[s](k), "n": n} for s, k, n in draws]
    run = Run(None, None, None)
    end = 0
    for g in [*grow, len(items)]:
        end = min(len(items), end + g)
        current = copy.deepcopy(items[:end])
        observed, _ = run.observe(current)
        got = run.collapse(current, observed.digests)
        want = collapse(current, dedupe_keys(current), observed.digests)
        assert len(got) == len(want.items)
        assert got.digests == want.digests
        for start in range(len(want.items) + 1):
            tail = got.tail(start)
            assert len(tail) == len(want.items) - start
            assert all(a is b for a, b in zip(tail, want.items[start:], strict=True))
        assert all(a is b for a, b in zip(got.items, want.items, strict=True))


# ------------------------------------------------------------------ issue 25: masking


LOOP_STEPS = 50


def _loop_steps(steps: int) -> list[Any]:
    return [
        *(
            [function_call("lookup", {"q": f"thing number {i}"}, call_id=f"c{i}")]
            for i in range(steps)
        ),
        [assistant_message("all done", item_id="m_done")],
    ]


def _spying(flt: Any, seen: list[dict[str, Any]]) -> Any:
    """Wrap a filter: each call's SDK input is checked unchanged by the filter, and what it
    returned, its plan and the run's index are recorded."""

    async def spy(data: Any) -> Any:
        items = data.model_data.input
        before = copy.deepcopy(items)
        objects = [id(x) for x in items]
        out = await flt(data)
        assert items == before and [id(x) for x in items] == objects, "the SDK's items"
        plan = flt.last_plan
        [run] = [r for r in flt._runs.values() if r.span is not None][-1:]
        seen.append({"input": items, "sent": out.input, "plan": plan, "index": run.index})
        return out

    return spy


def _visible(request: list[Any]) -> dict[str, dict[str, Any]]:
    """Every step of the request by call id: its arguments and its output as sent."""
    steps: dict[str, dict[str, Any]] = {}
    for item in request:
        if item.get("type") == "function_call":
            steps[item["call_id"]] = {"arguments": item["arguments"], "output": None}
        elif item.get("type") == "function_call_output":
            steps[item["call_id"]]["output"] = item["output"]
    return steps


def _assert_masked_steps(
    sent: list[dict[str, Any]], call: dict[str, Any], whole: list[bool], budget: int
) -> int:
    """One call of the fifty-step loop: its plan names the masked steps, not one more step
    could have been sent whole, and only the masked outputs are copies. Returns how many
    steps were masked."""
    masked = sum(1 for w in whole if not w)
    plan = call["plan"]
    assert len(plan.pack.masked) == masked
    if masked:
        assert plan.pack.masking_saved > 0
        units, outputs = ("unit", "output") if masked == 1 else ("units", "outputs")
        assert f"masked: {masked} {units} ({masked} tool {outputs})" in plan.explain()
        # Not one more step could have been sent whole.
        step_whole = item_tokens(sent[-2]).total + item_tokens(sent[-1]).total
        newest_masked = max(i for i, w in enumerate(whole) if not w)
        masked_cost = sum(
            item_tokens(x).total for x in sent if x.get("call_id") == f"c{newest_masked}"
        )
        assert plan.used - masked_cost + step_whole > budget
    # The masked outputs are new objects; the SDK's own are sent as they are.
    sdk = {id(x) for x in call["input"]}
    for item in call["sent"]:
        copied = id(item) not in sdk
        is_masked = isinstance(item.get("output"), str) and "masked by" in item["output"]
        assert copied == is_masked
    return masked


@pytest.mark.parametrize("mode", ["session", "standalone"])
async def test_a_fifty_step_loop_keeps_every_call_visible_while_its_masked_steps_fit(
    mode: str,
) -> None:
    """Issue 25 #5: the per-call filter masks a run's middle steps before it drops any, so
    every call of a 50-step tool loop and its arguments stay in every request while the
    masked steps fit, the newest steps whole. Every request is within the budget by an
    independent count (``tiktoken`` over the request the SDK's Responses model builds, and
    the exact cost model), a fixed point of the SDK's ``drop_orphan_function_calls``, leaves
    the SDK's items (and the caller's) as they were; the session stores exactly what it
    stores without the filter. The run's index keeps its masked costs between calls."""
    budget, reserve = 9_000, 500
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=reserve)
    assert builder.masking == pp.Masking(), "the builder masks by default"
    model = _RequestRecorder(_loop_steps(LOOP_STEPS))
    agent = Agent(name="a", model=model, tools=[lookup], instructions="Use the tool.")
    seen: list[dict[str, Any]] = []
    question = "look up fifty things"
    if mode == "session":
        session = ProtoPromptSession("fifty")
        config = run_config(session, builder, cache=None)  # newest first (the cache: below)
        config.call_model_input_filter = _spying(config.call_model_input_filter, seen)
        result = await Runner.run(
            agent, question, session=session, run_config=config, max_turns=LOOP_STEPS + 5
        )
    else:
        flt = model_input_filter(builder)
        history = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
        given = [*history, {"role": "user", "content": question}]
        kept = copy.deepcopy(given)
        config = RunConfig(call_model_input_filter=_spying(flt, seen), tracing_disabled=True)
        result = await Runner.run(agent, given, run_config=config, max_turns=LOOP_STEPS + 5)
        assert given == kept, "the caller's items are unchanged"
    assert result.final_output == "all done"
    assert len(model.requests) == len(seen) == LOOP_STEPS + 1
    masked_calls = 0
    for n, (request, call) in enumerate(zip(model.requests, seen)):
        sent = request["input"]
        # Within the budget, counted independently of the filter.
        lower = _reference_tokens(
            [request["instructions"], sent, request["tools"], request["text"]]
        )
        assert lower + reserve <= budget and request["exact"] + reserve <= budget, f"call {n}"
        assert request["exact"] == call["plan"].request_tokens
        assert drop_orphan_function_calls(copy.deepcopy(sent)) == sent
        # Every call of the run so far, with its arguments; the newest steps whole.
        steps = _visible(sent)
        assert list(steps) == [f"c{i}" for i in range(n)], f"call {n}: every call is visible"
        for i in range(n):
            assert steps[f"c{i}"]["arguments"] == json.dumps(
                {"q": f"thing number {i}"}, separators=(",", ":")
            )
        outputs = [steps[f"c{i}"]["output"] for i in range(n)]
        whole = [o == lookup_output(f"thing number {i}") for i, o in enumerate(outputs)]
        if n:
            assert whole[-1], "the newest step is whole"
            first_whole = whole.index(True)
            assert all(whole[first_whole:]), "the whole steps are the newest ones"
        for i, (o, w) in enumerate(zip(outputs, whole)):
            if not w:
                assert f"lookup output (call c{i}) masked by protoprompt" in o
                assert pp.count_tokens(o) <= 64
        masked = _assert_masked_steps(sent, call, whole, budget)
        masked_calls += bool(masked)
    assert masked_calls > LOOP_STEPS // 2, "late calls mask their middle steps"
    # The run's index is one and keeps its masked costs between calls.
    indexes = {id(c["index"]) for c in seen}
    assert len(indexes) == 1
    memo = [c["index"]._index._masked_counted()[1] for c in seen]
    assert memo == sorted(memo) and memo[-1] >= seen[-1]["plan"].pack.masked.__len__()
    if mode == "session":
        stored = await session.get_items()
        assert not any("masked by protoprompt" in json.dumps(i) for i in stored)
        plain = ProtoPromptSession("plain")
        await Runner.run(
            Agent(name="a", model=ScriptedModel(_loop_steps(LOOP_STEPS)), tools=[lookup]),
            question,
            session=plain,
            run_config=RunConfig(tracing_disabled=True),
            max_turns=LOOP_STEPS + 5,
        )
        assert stored == await plain.get_items(), "stored exactly as without the filter"


def _loop(prefix: str, steps: int) -> list[Any]:
    return [
        *(
            [function_call("lookup", {"q": f"{prefix} {i}"}, call_id=f"{prefix}{i}")]
            for i in range(steps)
        ),
        [assistant_message(f"{prefix} done", item_id=f"m_{prefix}")],
    ]


async def test_the_callbacks_masked_copies_are_sent_as_they_are_and_never_stored() -> None:
    """Session mode, turn after turn: the callback masks the older turn's steps; those
    copies reach the filter in the SDK's input and are too short to be masked again (sent as
    the same objects), while the filter masks the new run's own middle steps. The session
    stores exactly what it stores without either hook."""
    budget = 9_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500)
    session = ProtoPromptSession("turns")
    callback_copies: list[Any] = []
    config = run_config(  # newest first: a cached run resends its own copies
        session,
        builder,
        on_plan=lambda plan: callback_copies.extend(plan.masked_items),
        cache=None,
    )
    seen: list[dict[str, Any]] = []
    config.call_model_input_filter = _spying(config.call_model_input_filter, seen)
    agent = Agent(name="a", model=ScriptedModel(_loop("a", 20)), tools=[lookup])
    await Runner.run(agent, "first", session=session, run_config=config, max_turns=30)
    assert not callback_copies, "the first turn's history is empty"
    first_run = len(seen)
    agent.model = ScriptedModel(_loop("b", 18))
    await Runner.run(agent, "second", session=session, run_config=config, max_turns=30)
    assert callback_copies, "the callback masked the first turn's steps"
    filter_masked = sent_older = 0
    for call in seen[first_run:]:
        plan = call["plan"]
        assert plan.deduplicated == 0 and plan.used <= budget
        assert drop_orphan_function_calls(copy.deepcopy(call["sent"])) == call["sent"]
        sdk = {id(x) for x in call["input"]}
        older = [x for x in call["sent"] if str(x.get("call_id", "")).startswith("a")]
        for x in older:  # the first turn's steps sent: the callback's copies, as they are
            assert id(x) in sdk, "the SDK's object, not masked again"
            if x.get("type") == "function_call_output":
                assert x in callback_copies and x["output"].count("masked by protoprompt") == 1
        sent_older += len(older)
        for p in plan.pack.masked:
            assert call["input"][p]["call_id"].startswith("b"), "only the run's own steps"
        filter_masked += len(plan.pack.masked)
    assert filter_masked, "the filter masked the second run's middle steps"
    assert sent_older, "the first turn's masked steps were sent"
    stored = await session.get_items()
    plain = ProtoPromptSession("plain")
    for prefix, steps, q in (("a", 20, "first"), ("b", 18, "second")):
        bare = Agent(name="a", model=ScriptedModel(_loop(prefix, steps)), tools=[lookup])
        await Runner.run(
            bare, q, session=plain, run_config=RunConfig(tracing_disabled=True), max_turns=30
        )
    assert stored == await plain.get_items()


async def test_a_call_plan_reports_what_the_session_turn_masked_and_dropped(tmp_path) -> None:
    from protoprompt.integrations import ProtoPromptSession

    session = ProtoPromptSession("turns", str(tmp_path / "turns.db"))
    stored: list[Any] = []
    for i in range(12):
        stored += [
            {"role": "user", "content": f"check batch {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "line item " * 120},
            {"role": "assistant", "content": f"batch {i} ok"},
        ]
    await session.add_items(stored)
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("ok")]]))
    config = session.run_config(agent=agent, model="gpt-5", max_tokens=1_500)
    await Runner.run(agent, "and now?", session=session, run_config=config)
    call = config.call_model_input_filter.last_plan
    turn = call.turn_plan
    assert turn is not None and turn.pack.masked and turn.pack.dropped
    # The call's own pack saw only excerpts, so it masked and dropped nothing itself ...
    assert not call.pack.masked and not call.dropped
    # ... and the call's plan says what the turn did before it.
    assert call.turn_masked == len(turn.pack.masked) > 0
    assert call.turn_masking_saved == turn.pack.masking_saved > 0
    assert call.turn_dropped == sum(len(d.positions) for d in turn.pack.dropped) > 0
    line = next(x for x in call.explain().splitlines() if x.startswith("before the run"))
    assert f"masked {call.turn_masked} tool output" in line
    assert f"({call.turn_masking_saved:,} tokens saved; sent as excerpts)" in line
    assert f"dropped {call.turn_dropped} stored items" in line
    session.close()


# ------------------------------------------------------------------ issue 34: a stable prefix


def _prefix_len(a: list[Any], b: list[Any]) -> int:
    """How many leading items of ``b`` equal ``a``'s, byte for byte (as JSON)."""
    n = 0
    for x, y in zip(a, b):
        if json.dumps(x, sort_keys=True) != json.dumps(y, sort_keys=True):
            break
        n += 1
    return n


async def _loop_run(cache: pp.CachePolicy | None, steps: int = 30) -> tuple[Any, list[Any]]:
    budget = 6_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500)
    session = ProtoPromptSession("prefix")
    plans: list[ModelCallPlan] = []
    script = [[function_call("lookup", {"q": f"q{i}"}, call_id=f"c{i}")] for i in range(steps)]
    model = ScriptedModel([*script, [assistant_message("all done", item_id="m1")]])
    agent = Agent(name="a", model=model, tools=[lookup], instructions="Use the tool.")
    config = session.run_config(builder, cache=cache, on_call=plans.append)
    await Runner.run(
        agent, "look up thirty things", session=session, run_config=config, max_turns=40
    )
    stored = await session.get_items()
    assert sum(1 for i in stored if i.get("type") == "function_call_output") == steps
    return model, plans


async def test_a_cache_policy_makes_each_call_extend_the_previous_one() -> None:
    """Issue 34 #2: within a run each model call's request is the previous call's request
    plus what was appended, byte for byte, until one does not fit; then the cut moves once
    to the low-water mark and the following calls extend that request again."""
    # A move that drops from the start (the default keeps a head: test_session_prefix.py).
    model, plans = await _loop_run(pp.CachePolicy(low_water=0.6, head=0.0))
    calls = model.calls
    assert len(calls) == 31
    codes = [p.prefix for p in plans]
    assert codes[0] == "set" and "moved" in codes, codes
    assert codes.count("moved") <= 6, "the cut moves rarely, not at every call"
    for n in range(1, len(calls)):
        prev, cur = calls[n - 1].input, calls[n].input
        assert request_tokens(calls[n]) + 500 <= 6_000, f"call {n + 1}"
        assert_sendable(cur)
        start, end = plans[n].run_input or (0, 0)
        assert cur[start:end] == [{"content": "look up thirty things", "role": "user"}]
        if plans[n].prefix == "stayed":
            assert _prefix_len(prev, cur) == len(prev), f"call {n + 1} extends call {n}"
            assert plans[n].shared_tokens == request_tokens(calls[n - 1])
        else:
            assert plans[n].shared_tokens == 0
            assert "did not fit: cut moved from" in plans[n].prefix_reason
            assert request_tokens(calls[n]) + 500 <= int(6_000 * 0.6)
    assert "prefix: call" in plans[-1].explain()
    repeated = sum(p.shared_tokens for p in plans) / sum(request_tokens(c) for c in calls)
    # Newest first moves the cut at almost every call once the run overflows.
    base_model, base_plans = await _loop_run(None)
    base_repeated = sum(
        request_tokens(base_model.calls[n - 1])
        for n in range(1, len(base_model.calls))
        if _prefix_len(base_model.calls[n - 1].input, base_model.calls[n].input)
        == len(base_model.calls[n - 1].input)
    ) / sum(request_tokens(c) for c in base_model.calls)
    assert all(p.prefix is None for p in base_plans)
    assert repeated >= 0.6 and repeated > base_repeated + 0.2, (repeated, base_repeated)


def test_cache_must_be_a_cache_policy() -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=6_000)
    with pytest.raises(TypeError, match="cache must be a CachePolicy"):
        ProtoPromptSession("x").model_input_filter(builder, cache=0.7)  # type: ignore[arg-type]


@pytest.mark.parametrize("system_prompt", ["", "Be brief."])
async def test_the_next_run_of_the_session_extends_the_previous_runs_last_request(
    system_prompt: str,
) -> None:
    """Issue 34 #1: the first call of a session's next run sends the previous run's last
    request, then what was stored after it (the final answer) and the new input -- also
    behind the callback's context message when it is unchanged; the stored history is the
    runs' items, unchanged."""
    budget = 6_000
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=500)
    session = ProtoPromptSession("runs")
    plans: list[ModelCallPlan] = []
    script: list[Any] = []
    for r in range(3):
        script += [
            [function_call("lookup", {"q": f"{r}.{i}"}, call_id=f"c{r}_{i}")] for i in range(3)
        ]
        script.append([assistant_message(f"answer {r}", item_id=f"m{r}")])
    model = ScriptedModel(script)
    agent = Agent(name="a", model=model, tools=[lookup], instructions="Use the tool.")
    config = session.run_config(
        builder, cache=pp.CachePolicy(), on_call=plans.append, system_prompt=system_prompt
    )
    for r in range(3):
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
    calls = model.calls
    assert len(calls) == 12
    if system_prompt:
        assert all(system_prompt in json.dumps(c.input[0]) for c in calls)
    firsts = [4, 8]  # the first calls of runs 2 and 3
    for n in firsts:
        if plans[n].prefix != "stayed":
            continue
        prev, cur = calls[n - 1].input, calls[n].input
        assert _prefix_len(prev, cur) == len(prev)
        start, end = plans[n].run_input or (0, 0)
        assert cur[start:end] == [{"content": f"question {n // 4}", "role": "user"}]
        added = cur[len(prev) :]
        assert [i.get("role") for i in added] == ["assistant", "user"], added
        assert added[-1]["content"] == f"question {n // 4}"
        assert plans[n].shared_tokens == request_tokens(calls[n - 1])
    assert all(plans[n].prefix == "stayed" for n in firsts), [p.prefix for p in plans]
    for n, call in enumerate(calls):
        assert request_tokens(call) + 500 <= budget, f"call {n + 1}"
        assert_sendable(call.input)
    stored = await session.get_items()
    assert [i.get("call_id") for i in stored if i.get("type") == "function_call_output"] == [
        f"c{r}_{i}" for r in range(3) for i in range(3)
    ]
    assert all(
        i.get("output") == lookup_output(i["call_id"][1:].replace("_", "."))
        for i in stored
        if i.get("type") == "function_call_output"
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.integers(20, 900), min_size=0, max_size=6), min_size=1, max_size=4),
    st.integers(3_000, 9_000),
    st.floats(0.3, 1.0),
    st.integers(0, 3),
)
@example([[], [], [20, 20, 20, 20, 115], [900, 900]], 3_000, 1.0, 0)  # a move keeps the head
def test_consecutive_requests_share_their_prefix(
    runs: list[list[int]], budget: int, low_water: float, keep_recent: int
) -> None:
    """Issue 34 #8 over generated tool loops (runs of steps with outputs of drawn sizes):
    every request fits and is sendable; a call that keeps the prefix sends the previous
    request plus what was appended, byte for byte, and says how many tokens it repeats;
    the stored history is the runs' items, unchanged."""
    asyncio.run(_prefix_runs(runs, budget, pp.CachePolicy(low_water, keep_recent)))


async def _prefix_runs(runs: list[list[int]], budget: int, cache: pp.CachePolicy) -> None:
    sizes: dict[str, int] = {}

    @function_tool
    def fetch(q: str) -> str:
        """Fetch something of a given size."""
        return f"{q}: " + "data " * sizes[q]

    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=300)
    session = ProtoPromptSession("prop")
    plans: list[ModelCallPlan] = []
    script: list[Any] = []
    for r, steps in enumerate(runs):
        for s, size in enumerate(steps):
            sizes[f"{r}.{s}"] = size
            script.append([function_call("fetch", {"q": f"{r}.{s}"}, call_id=f"c{r}_{s}")])
        script.append([assistant_message(f"answer {r}", item_id=f"m{r}")])
    model = ScriptedModel(script)
    agent = Agent(name="a", model=model, tools=[fetch], instructions="Use the tool.")
    config = session.run_config(
        builder, cache=cache, on_call=plans.append, oversized_output="truncate"
    )
    for r in range(len(runs)):
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
    calls = model.calls
    assert len(plans) == len(calls)
    for n, call in enumerate(calls):
        assert request_tokens(call) + 300 <= budget, f"call {n + 1}"
        assert_sendable(call.input)
        if n and plans[n].prefix == "stayed":
            prev = calls[n - 1].input
            assert _prefix_len(prev, call.input) == len(prev), f"call {n + 1}"
            assert plans[n].shared_tokens == request_tokens(calls[n - 1])
            event("stayed")
        elif plans[n].prefix == "moved" and "kept the head" in plans[n].prefix_reason:
            # A move that keeps the head (CachePolicy's default) repeats the start of the
            # previous request, and says how many tokens that is.
            prev = calls[n - 1].input
            assert _prefix_len(prev, call.input) > 0, f"call {n + 1}"
            assert 0 < plans[n].shared_tokens < request_tokens(call), f"call {n + 1}"
            event("moved, keeping the head")
        elif plans[n].prefix == "moved":
            assert plans[n].shared_tokens == 0
            event("moved")
    stored = await session.get_items()
    outputs = [i for i in stored if i.get("type") == "function_call_output"]
    assert [o["call_id"] for o in outputs] == [
        f"c{r}_{s}" for r, steps in enumerate(runs) for s in range(len(steps))
    ]
    for o in outputs:
        q = o["call_id"][1:].replace("_", ".")
        assert o["output"] == f"{q}: " + "data " * sizes[q]


async def test_a_changed_context_message_starts_the_prefix_afresh() -> None:
    """Issue 34 #3: a run whose context message differs from the one the previous request
    starts with (a fact remembered between the runs) does not resume it: the prefix would
    not repeat. An unchanged one does (the third run)."""
    scope = MemoryScope("acme", user="bob")
    store = MemoryStore()
    store.remember("Bob prefers metric units.", scope=scope)
    builder = TokenBudgetedContextBuilder(store, max_tokens=6_000, output_reserve=500, scope=scope)
    session = ProtoPromptSession("ctx")
    plans: list[ModelCallPlan] = []
    script: list[Any] = []
    for r in range(3):
        script.append([function_call("lookup", {"q": f"bob {r}"}, call_id=f"b{r}")])
        script.append([assistant_message(f"a{r}", item_id=f"m{r}")])
    model = ScriptedModel(script)
    agent = Agent(name="a", model=model, tools=[lookup])
    config = session.run_config(builder, cache=pp.CachePolicy(), on_call=plans.append)
    for r in range(3):
        if r == 1:
            store.remember("Bob works in Lyon.", scope=scope)
        await Runner.run(agent, f"what about Bob? {r}", session=session, run_config=config)
    calls = model.calls
    assert "Lyon" not in json.dumps(calls[1].input[0])
    assert "Lyon" in json.dumps(calls[2].input[0])
    assert [p.prefix for p in plans] == ["set", "stayed", "set", "stayed", "stayed", "stayed"]
    for n in (1, 3, 4, 5):
        assert _prefix_len(calls[n - 1].input, calls[n].input) == len(calls[n - 1].input)


# ------------------------------------------------------------------ issue 33: O(appended)


def _history(n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for t in range(n // 2):
        items.append({"role": "user", "content": f"question {t} " + "words " * 5})
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"answer {t}", "annotations": []}],
            }
        )
    return items


def _step(k: int, call_id: str | None = None) -> list[dict[str, Any]]:
    cid = call_id or f"s{k}"
    return [
        {"type": "function_call", "call_id": cid, "name": "lookup", "arguments": "{}"},
        {"type": "function_call_output", "call_id": cid, "output": f"result {k}"},
    ]


def _calls(
    inputs: list[list[dict[str, Any]]], budget: int = 200_000, fresh: Any = copy.deepcopy
) -> tuple[list[ModelCallPlan], Any]:
    """The standalone filter called as the SDK calls it, inside one run's agent span, on a
    fresh copy of each input (the SDK copies every item on every call; ``fresh`` makes it);
    each call's plan."""
    from agents.tracing import agent_span

    plans: list[ModelCallPlan] = []
    flt = model_input_filter(
        TokenBudgetedContextBuilder(None, max_tokens=budget), on_call=plans.append
    )
    agent = Agent(name="a", instructions="x")
    loop = asyncio.new_event_loop()
    span = agent_span(name="a")
    span.start(mark_as_current=True)
    try:
        for items in inputs:
            data = CallModelData(
                model_data=ModelInputData(input=fresh(items), instructions="x"),
                agent=agent,
                context=None,
            )
            loop.run_until_complete(flt(data))
    finally:
        span.finish(reset_current=True)
        loop.close()
    return plans, flt


def _fresh_pack_equal(
    plan: ModelCallPlan, items: list[dict[str, Any]], budget: int = 200_000
) -> None:
    """The plan's request equals a fresh pack of the same input (nothing stale reused)."""
    _, fresh = _calls([items], budget)
    assert fresh.last_plan is not None
    assert plan.items == fresh.last_plan.items
    assert plan.pack.request_tokens == fresh.last_plan.pack.request_tokens


def test_a_call_reads_only_what_was_appended_and_a_sample() -> None:
    """Issue 33: a run's later calls re-read only what the SDK appended and a sample of the
    rest (the plan's ``checked``), not the whole input."""
    base = _history(2_000)
    inputs = [base + [s for k in range(j) for s in _step(k)] for j in range(4)]
    plans, _ = _calls(inputs)
    assert plans[0].checked == plans[0].input_items
    for p in plans[1:]:
        assert p.reuse == "the run's earlier calls"
        assert p.checked <= 2 + 4 + 8 + 32, p.checked
    _fresh_pack_equal(plans[-1], inputs[-1])


class _Reads(list):  # type: ignore[type-arg]
    """A list that records the positions read from it by index or slice (a C-level
    gather reads by index too)."""

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.read: set[int] = set()

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            self.read.update(range(*key.indices(len(self))))
        else:
            self.read.add(key % len(self))
        return super().__getitem__(key)


def test_a_later_call_reads_a_window_of_a_deduplicated_input() -> None:
    """Issue 33: when the SDK's de-duplication changes the list (a reused call id), the
    standalone filter packs a collapsed copy; a later call of the run takes the fast path
    and reads from the SDK's list only what was appended, the sample and the part its pack
    reaches (from a margin before where the previous call's pack reached), not the whole
    input; every request is a fresh pack's."""
    base = [*_history(200), *_step(0, "a"), *_step(1, "a"), *_history(3_000)[200:]]
    inputs = [base + [s for k in range(j) for s in _step(k + 2)] for j in range(5)]
    lists: list[_Reads] = []

    def fresh(items: list[Any]) -> _Reads:
        lists.append(_Reads(copy.deepcopy(items)))
        return lists[-1]

    plans, _ = _calls(inputs, budget=3_000, fresh=fresh)
    assert [p.deduplicated for p in plans] == [2] * 5
    assert plans[0].pack.stop is not None, "the budget holds only the newest part"
    for p, read, items in zip(plans[1:], lists[1:], inputs[1:], strict=True):
        assert p.reuse == "the run's earlier calls"
        assert p.checked < p.input_items
        assert len(read.read) < len(items) // 4, len(read.read)
        assert min(p.pack.kept_history) >= min(read.read - set(range(8))) - 2
        _fresh_pack_equal(p, items, budget=3_000)


def test_a_call_whose_pack_reaches_before_the_window_reads_the_whole_list() -> None:
    """A later call whose pack keeps history older than the window its previous call's
    reach gave (a long newest step made room for little history; the next step is short,
    the long one masked) reads the whole collapsed list: the same request as a fresh
    pack."""
    base = [*_history(200), *_step(0, "a"), *_step(1, "a"), *_history(3_000)[200:]]
    big = _step(2)
    big[1]["output"] = "a long result " * 900
    after = _step(3)
    after[1]["output"] = "a shorter result " * 100
    inputs = [base, base + big, base + big + after, base + big + after + _step(4)]
    plans, _ = _calls(inputs, budget=3_000)
    assert min(plans[2].pack.kept_history) < min(plans[1].pack.kept_history) - 64
    for p, items in zip(plans[1:], inputs[1:], strict=True):
        assert p.reuse == "the run's earlier calls"
        _fresh_pack_equal(p, items, budget=3_000)


def test_an_item_changed_in_the_sample_reads_the_whole_input() -> None:
    """An item of the previous input whose content changed (here the head, where a chained
    filter inserts, and the tail, where the SDK prunes) sends the call down the full path."""
    base = _history(2_000)
    second = base + _step(0)
    head = copy.deepcopy(second) + _step(1)
    head[1]["content"][0]["text"] = "an answer edited in place " * 40
    tail = copy.deepcopy(head) + _step(2)
    tail[-3]["output"] = "a replaced output " * 30
    plans, _ = _calls([base, second, head, tail])
    assert plans[1].checked < plans[1].input_items
    for p, items in ((plans[2], head), (plans[3], tail)):
        assert p.checked == p.input_items
        _fresh_pack_equal(p, items)


def test_an_edit_outside_the_sample_is_found_within_its_rotation() -> None:
    """An edit in the middle of a long input is found when the rotating sample reaches it:
    within ``ceil(n / 32)`` calls (every later request is a fresh pack's)."""
    base = _history(640)
    edited = copy.deepcopy(base)
    edited[321]["content"][0]["text"] = "a long answer edited in place " * 50
    inputs = [base] + [edited + [s for k in range(j) for s in _step(k)] for j in range(25)]
    plans, _ = _calls(inputs)
    full = [i for i, p in enumerate(plans) if i and p.checked == p.input_items]
    assert full and full[0] <= 1 + -(-640 // 32)
    for i in range(full[0], len(plans)):
        _fresh_pack_equal(plans[i], inputs[i])


def test_a_rewritten_or_shorter_history_reads_the_whole_input() -> None:
    """A handoff input filter that rewrites the history (fewer items), or a list whose
    items were replaced wholesale, is read whole."""
    base = _history(400)
    second = base + _step(0)
    shorter = [{"role": "user", "content": "a summary of the conversation"}, *base[-50:]]
    replaced = [*_history(402)[2:], *_step(0), *_step(1)]
    plans, _ = _calls([base, second, shorter, shorter + _step(1), replaced])
    assert plans[1].checked < plans[1].input_items
    assert plans[2].checked == plans[2].input_items
    assert plans[3].checked < plans[3].input_items
    assert plans[4].checked == plans[4].input_items
    _fresh_pack_equal(plans[4], replaced)


def test_an_appended_step_reusing_an_old_call_id_collapses_as_the_sdk_does() -> None:
    """The SDK's de-duplication: a step that reuses an earlier call id replaces the earlier
    content (the appended part changes the collapsed prefix): packed as a fresh pack."""
    base = _history(400) + _step(0, "a") + _step(1, "a") + _step(2, "b")
    inputs = [base, base + _step(3), base + _step(3) + _step(4, "b")]
    plans, _ = _calls(inputs)
    assert [p.deduplicated for p in plans] == [2, 2, 4]
    assert plans[2].checked < plans[2].input_items
    _fresh_pack_equal(plans[2], inputs[2])


def test_instructions_edited_at_equal_cost_are_a_changed_request() -> None:
    """Instructions made per call that change without changing their token count: the
    cache-stable prefix reports the request as changed (nothing repeated), and the plan's
    text says so."""
    seen: list[str] = []

    def instructions(ctx: Any, agent: Any) -> str:
        seen.append("mode alpha" if len(seen) % 2 == 0 else "mode omega")
        return seen[-1]

    @function_tool
    def ping() -> str:
        """Ping."""
        return "pong"

    model = ScriptedModel([[function_call("ping", {}, call_id="p1")], [assistant_message("ok")]])
    agent = Agent(name="a", model=model, tools=[ping], instructions=instructions)
    assert pp.count_tokens("mode alpha") == pp.count_tokens("mode omega")
    session = ProtoPromptSession("edited")
    plans: list[Any] = []
    config = session.run_config(
        agent=agent,
        max_tokens=4000,
        model="gpt-5",
        cache=pp.CachePolicy(),
        on_call=plans.append,
        tracing_disabled=True,
    )
    asyncio.run(Runner.run(agent, "hi", session=session, run_config=config))
    assert [p.prefix for p in plans] == ["set", "stayed"]
    assert plans[0].instructions_tokens == plans[1].instructions_tokens
    assert plans[1].request_changed and plans[1].shared_tokens == 0
    assert "request: the instructions, tools or output schema differ" in plans[1].explain()
    session.close()
