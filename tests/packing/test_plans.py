"""One vocabulary for a request: every plan's sections add up, count each item once, say
why they are empty, and the turn's plan agrees with the run's first model call.

Plans are compared with what was really sent (the items the SDK's ScriptedModel recorded,
costed by protoprompt's documented cost model), not only with each other.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

agents = pytest.importorskip("agents")

from agents import Agent, ModelProvider, RunConfig, Runner, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import (  # noqa: E402
    MemoryScope,
    MemoryStore,
    TokenBudgetedContextBuilder,
    item_tokens,
)
from protoprompt.integrations import (  # noqa: E402
    ModelCallPlan,
    ProtoPromptSession,
    model_input_filter,
)
from protoprompt.plan import SECTIONS, RequestSections  # noqa: E402

SCOPE = MemoryScope(tenant="acme", user="alice")
ITEM_SECTIONS = ("context_message", "run_input", "newest_step", "earlier_steps", "kept_history")


@function_tool
def lookup(name: str) -> str:
    """Look up a clause of the contract."""
    return f"clause {name}: " + "the parties agree to many things. " * 30


class Answer(BaseModel):
    text: str
    confidence: float


class Provider(ModelProvider):
    """Serves ``Agent(model="gpt-5")`` with a scripted model (offline)."""

    def __init__(self, model: ScriptedModel) -> None:
        self.model = model

    def get_model(self, model_name: str | None) -> Any:
        return self.model


def loop(n_steps: int, final: str = "done", turn: int = 0) -> list[list[Any]]:
    """One run: ``n_steps`` tool calls, then an answer."""
    steps: list[list[Any]] = [
        [function_call("lookup", {"name": f"c{i}"}, call_id=f"call_{turn}_{i}")]
        for i in range(n_steps)
    ]
    return [*steps, [assistant_message(final, item_id=f"msg_{turn}")]]


def check_sections(sections: RequestSections, used: int) -> None:
    """The shared rules: all sections in order, adding up to ``used``; every empty section
    says so."""
    assert tuple(s.name for s in sections) == SECTIONS
    assert sections.used == used
    for s in sections:
        if s.counted and s.tokens == 0 and s.name != "output_reserve":
            assert s.note and s.note.startswith("empty"), s
        assert (s.items is None) == (s.name not in ITEM_SECTIONS), s


def sent_tokens(items: list[Any]) -> int:
    return sum(item_tokens(x).total for x in items)


def check_call(plan: ModelCallPlan, recorded: Any) -> None:
    """A model call's plan against what the model received: the item sections count every
    sent item once (the context message too), with the items' own costs."""
    sections = plan.sections
    check_sections(sections, plan.used)
    items = sum(sections[n].tokens for n in ITEM_SECTIONS)
    assert items == plan.items_tokens
    assert sum(sections[n].items or 0 for n in ITEM_SECTIONS) == len(plan.items)
    sent = list(recorded.input)
    assert len(sent) == len(plan.items)
    if not plan.truncated and not plan.pack.masked:
        assert items == sent_tokens(sent)
    assert sections["instructions"].tokens == plan.instructions_tokens
    assert sections["tools"].tokens == plan.tools_tokens
    assert sections["output_schema"].tokens == plan.output_schema_tokens


# --------------------------------------------------------------------------- pp.pack


def test_a_packs_sections_add_up_and_name_the_run_input() -> None:
    history = [{"role": "user", "content": f"question {i} " * 20} for i in range(6)]
    new = [{"role": "user", "content": "next"}]
    for budget in (60, 200, 10_000):
        r = pp.pack(history, new, budget, output_reserve=10, context_tokens=7)
        s = r.sections
        assert [x.name for x in s] == [
            "context_message",
            "run_input",
            "kept_history",
            "output_reserve",
        ]
        assert s.used == r.used and s.remaining == r.remaining
        assert s["run_input"].tokens == item_tokens(new[0]).total
        assert s["kept_history"].tokens == sent_tokens([history[p] for p in r.kept_history])
        text = r.explain()
        assert text.startswith(f"used: {r.used:,} of {budget:,} tokens")
        assert "  run input" in text and "new input" not in text and "dependency" not in text


def test_the_calls_a_run_input_answers_are_kept_history_marked_mandatory() -> None:
    history = [
        {"role": "user", "content": "look it up"},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": "{}"},
    ]
    new = [{"type": "function_call_output", "call_id": "c1", "output": "found"}]
    r = pp.pack(history, new, 1000)
    section = r.sections["kept_history"]
    assert section.tokens == sent_tokens(history)
    assert section.note is not None and "1 mandatory" in section.note


# --------------------------------------------------------------------------- reasons


def unit(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_the_unit_that_stopped_the_fill_is_named_with_what_was_left() -> None:
    """The issue's case: the older user message does not fit; the newer unit of its turn
    would have (13 tokens with 14 left) and is dropped because of it."""
    big = unit("word " * 200)
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    out = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    newer = [unit("small"), {"role": "assistant", "content": "done"}]
    history = [big, call, out, *newer]
    new = [unit("next")]
    room = 5
    budget = sent_tokens(new + newer + [call, out]) + room
    for policy in ("contiguous", "greedy"):
        r = pp.pack(history, new, budget, policy=policy)  # type: ignore[arg-type]
        assert r.stop is not None and r.stop.positions == [0] and r.stop.left == room
        by_pos = {d.positions[0]: d for d in r.decisions}
        stop_reason = r.reason(by_pos[0])
        assert stop_reason.startswith(
            f"the fill stopped here: needs {item_tokens(big).total} tokens, {room} left"
        )
        incomplete = r.reason(by_pos[1])
        assert by_pos[1].decision == "turn_incomplete"
        assert "history[0] did not fit" in incomplete
        # what the turn_incomplete unit gave back is left over
        assert r.remaining == room + sent_tokens([call, out])
        assert "budget was full" not in r.explain()


def test_older_units_were_not_tried_after_a_contiguous_stop() -> None:
    history = [unit(f"turn {i} " + "word " * 50) for i in range(5)]
    new = [unit("next")]
    budget = sent_tokens(new + history[-2:]) + 3
    r = pp.pack(history, new, budget)
    assert r.stop is not None and r.stop.positions == [2]
    reasons = {d.positions[0]: r.reason(d) for d in r.decisions}
    assert reasons[2].startswith("the fill stopped here")
    for p in (0, 1):
        assert reasons[p] == (
            "not tried: the fill stopped at history[2] (policy contiguous sends an unbroken "
            "newest part)"
        )
    assert r.reason(next(d for d in r.decisions if d.positions == [4])) == "fits"


def test_a_masked_stop_says_so() -> None:
    turns: list[dict[str, Any]] = []
    for t in range(6):
        turns += [
            unit(f"question {t}"),
            {"type": "function_call", "call_id": f"c{t}", "name": "db", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{t}", "output": "row data " * 400},
            {"role": "assistant", "content": f"answer {t}"},
        ]
    new = [unit("next")]
    budget = sent_tokens(new + turns[-4:]) + 400
    r = pp.pack(turns, new, budget, masking=pp.Masking())
    assert r.masked and r.stop is not None
    assert r.stop.cause in ("masked", "turn_masked")
    stop_reason = r.reason(next(d for d in r.decisions if d.unit == r.stop.unit))
    assert "mask" in stop_reason and f"{r.stop.left:,} left" in stop_reason
    check_sections_pack = r.sections
    assert check_sections_pack.used == r.used
    assert "tool outputs masked" in (check_sections_pack["kept_history"].note or "")


# --------------------------------------------------------------------------- the session


@pytest.mark.parametrize("shape", ["plain", "tools", "output_type", "memory"])
async def test_the_turn_plan_is_the_first_model_calls_plan(tmp_path: Any, shape: str) -> None:
    """With ``run_config(agent=...)`` the callback counts what the filter counts: the plan of
    each turn and that of the run's first model call have the same sections, and both match
    what the model received."""
    db = str(tmp_path / "s.db")
    tools = [lookup] if shape == "tools" else []
    steps: list[list[Any]] = []
    for t in range(4):
        if shape == "tools":
            steps += loop(2, final=f"answer {t}", turn=t)
        elif shape == "output_type":
            answer = Answer(text=f"a{t} " + "word " * 150, confidence=0.5).model_dump_json()
            steps.append([assistant_message(answer, item_id=f"msg_{t}")])
        else:
            steps.append([assistant_message(f"answer {t} " + "more words " * 90, item_id=f"m{t}")])
    model = ScriptedModel(steps)
    agent = Agent(
        name="assistant",
        instructions="Answer briefly, from the contract.",
        model="gpt-5",
        tools=tools,
        output_type=Answer if shape == "output_type" else None,
    )
    session = ProtoPromptSession("chat", db)
    calls: list[ModelCallPlan] = []
    turns: list[Any] = []
    if shape == "memory":
        store = MemoryStore(db)
        store.remember("Alice reviews every contract renewal.", scope=SCOPE)
        builder = TokenBudgetedContextBuilder(
            store, max_tokens=600, model="gpt-5", scope=SCOPE, output_reserve=50
        )
        config = session.run_config(
            builder,
            agent=agent,
            system_prompt="You help Alice.",
            on_call=calls.append,
            on_plan=turns.append,
            model_provider=Provider(model),
            tracing_disabled=True,
        )
    else:
        config = session.run_config(
            agent=agent,
            max_tokens=600,
            output_reserve=50,
            on_call=calls.append,
            on_plan=turns.append,
            model_provider=Provider(model),
            tracing_disabled=True,
        )
        assert config.call_model_input_filter.builder.model == "gpt-5"  # read from the agent
    every_call: list[ModelCallPlan] = []
    for t in range(4):
        calls.clear()
        await Runner.run(agent, f"question {t} about Alice", session=session, run_config=config)
        every_call += calls
        turn = turns[-1]
        first = calls[0]
        check_sections(turn.sections, turn.used)
        shown = (turn.explain(), first.explain())
        counts = [(x.name, x.tokens, x.items) for x in turn.sections]
        assert counts == [(x.name, x.tokens, x.items) for x in first.sections], shown
        if not turn.pack.masked and not turn.pack.dropped:
            # (the call sees masked copies' costs and not what the turn dropped: the notes
            # differ only there)
            assert turn.sections == first.sections, shown
        assert turn.used == first.used
        assert turn.request is not None and turn.request.tools == first.tools_tokens
        n_calls = len(calls)
        for k, plan in enumerate(calls):
            check_call(plan, model.calls[len(model.calls) - n_calls + k])
    # The history outgrew the budget: the turn dropped units, and the packs that chose what
    # to drop (the turn's, or the model calls' when the turn continued the model's last
    # request) said which unit stopped them.
    assert turns[-1].pack.dropped
    chose = [p.pack for p in [*turns, *every_call] if p.prefix in ("set", "moved", None)]
    chose = [pack for pack in chose if pack.dropped]
    assert chose and all(pack.stop is not None for pack in chose), [t.prefix for t in turns]


async def test_a_tool_loop_names_its_newest_and_earlier_steps(tmp_path: Any) -> None:
    model = ScriptedModel(loop(3))
    agent = Agent(name="a", instructions="Use the tool.", model=model, tools=[lookup])
    session = ProtoPromptSession("loop", str(tmp_path / "s.db"))
    calls: list[ModelCallPlan] = []
    config = session.run_config(
        agent=agent, model="gpt-5", max_tokens=4000, on_call=calls.append, tracing_disabled=True
    )
    await Runner.run(agent, "look up three clauses", session=session, run_config=config)
    assert len(calls) == 4
    for k, plan in enumerate(calls):
        check_call(plan, model.calls[k])
        s = plan.sections
        received = list(model.calls[k].input)
        if k == 0:
            assert s["newest_step"].items == 0 and s["newest_step"].note.startswith("empty")
            continue
        # The newest step: the previous call's function call and its output, nothing else.
        step = received[-2:]
        assert [x.get("type") for x in step] == ["function_call", "function_call_output"]
        assert s["newest_step"].tokens == sent_tokens(step) and s["newest_step"].items == 2
        assert s["earlier_steps"].items == 2 * (k - 1)
        assert s["earlier_steps"].tokens == sent_tokens(received[1:-2])
        assert s["run_input"].tokens == sent_tokens(received[:1])
        text = plan.explain()
        assert "new input" not in text and "dependency" not in text


@pytest.mark.parametrize("masking", [None, pp.Masking()])
async def test_a_call_that_masks_or_drops_earlier_steps_says_how_many(
    tmp_path: Any, masking: pp.Masking | None
) -> None:
    model = ScriptedModel(loop(4))
    agent = Agent(name="a", model=model, tools=[lookup])
    session = ProtoPromptSession("loop", str(tmp_path / "s.db"))
    calls: list[ModelCallPlan] = []
    builder = TokenBudgetedContextBuilder(None, max_tokens=900, model="gpt-5", masking=masking)
    config = session.run_config(  # newest first: each call masks or drops what is older
        builder, agent=agent, on_call=calls.append, tracing_disabled=True, cache=None
    )
    await Runner.run(agent, "look up four clauses", session=session, run_config=config)
    last = calls[-1]
    check_call(last, model.calls[-1])
    earlier = last.sections["earlier_steps"]
    assert earlier.note is not None
    if masking is None:
        assert "items dropped" in earlier.note and not last.pack.masked
    else:
        assert last.pack.masked
        assert f"{len(last.pack.masked)} tool output" in earlier.note
    dropped = [d for d in last.pack.dropped]
    assert all(last.pack.reason(d) for d in dropped)
    assert "input[" in last.explain()


# --------------------------------------------------------------------------- standalone


async def test_the_standalone_filter_counts_its_context_message_once(tmp_path: Any) -> None:
    store = MemoryStore(str(tmp_path / "m.db"))
    store.remember("Alice likes short answers.", scope=SCOPE)
    builder = TokenBudgetedContextBuilder(
        store, max_tokens=3000, model="gpt-5", scope=SCOPE, output_reserve=100
    )
    calls: list[ModelCallPlan] = []
    flt = model_input_filter(builder, system_prompt="You help.", on_call=calls.append)
    model = ScriptedModel(loop(2))
    agent = Agent(name="a", instructions="Be brief.", model=model, tools=[lookup])
    history = [
        {"role": "user", "content": "earlier question"},
        {"role": "assistant", "content": "earlier answer"},
    ]
    await Runner.run(
        agent,
        [*history, {"role": "user", "content": "What does Alice like?"}],
        run_config=RunConfig(call_model_input_filter=flt, tracing_disabled=True),
    )
    for k, plan in enumerate(calls):
        check_call(plan, model.calls[k])
        assert plan.context is not None and plan.context.context_message is not None
        message = plan.context.context_message
        s = plan.sections
        assert s["context_message"].tokens == item_tokens(message).total
        assert s["context_message"].items == 1
        assert s["kept_history"].items == 2
        # The builder's plan of the same call: the same sections (the same request).
        assert plan.context.sections == s
        first_line = plan.explain().splitlines()[0]
        assert first_line == (
            f"model call {k + 1} of the run: {plan.input_items} of {plan.input_items} input "
            "items sent, plus the context message"
        )
    assert builder.last_plan is calls[-1].context


def test_run_config_checks_its_one_line_arguments() -> None:
    session = ProtoPromptSession("s")
    builder = TokenBudgetedContextBuilder(None, max_tokens=100)
    with pytest.raises(TypeError, match="either a builder or max_tokens"):
        session.run_config(builder, max_tokens=100)
    with pytest.raises(TypeError, match="needs a builder, or max_tokens"):
        session.run_config()
    with pytest.raises(TypeError, match="needs model="):
        session.run_config(max_tokens=100)
    scripted = Agent(name="scripted", model=ScriptedModel([]))
    with pytest.raises(
        TypeError, match="no name to choose a tokenizer by: pass model=.* or encoding="
    ):
        session.run_config(agent=scripted, max_tokens=100)
    with pytest.raises(TypeError, match="agent must be an agents.Agent"):
        session.run_config(agent="gpt-5", max_tokens=100)  # type: ignore[arg-type]
    with pytest.raises(pp.UnknownModelError, match="pass encoding= explicitly") as unknown:
        session.run_config(max_tokens=100, model="no-such-model")
    # ... which run_config takes: the error's advice works where it is raised.
    named = session.run_config(max_tokens=100, model="no-such-model", encoding="cl100k_base")
    assert named.call_model_input_filter.builder.encoding == "cl100k_base"
    assert unknown.value.model == "no-such-model"
    unnamed = session.run_config(agent=scripted, max_tokens=100, encoding="o200k_base")
    assert unnamed.call_model_input_filter.builder.encoding == "o200k_base"
    with pytest.raises(pp.UnknownEncodingError):
        session.run_config(max_tokens=100, encoding="no-such-encoding")
    with pytest.raises(TypeError, match="either a builder or max_tokens"):
        session.run_config(builder, encoding="o200k_base")
    config = session.run_config(agent=Agent(name="d"), max_tokens=100, output_reserve=10)
    from agents.models.default_models import get_default_model

    made = config.call_model_input_filter.builder
    assert made.model == get_default_model() and made.output_reserve == 10
    assert made.store is None and made.max_tokens == 100


async def test_instructions_made_per_run_are_left_to_the_model_calls(tmp_path: Any) -> None:
    def instructions(ctx: Any, agent: Any) -> str:
        return f"You help {ctx.context['user']}."

    model = ScriptedModel([[assistant_message("hi")]])
    agent = Agent(name="a", instructions=instructions, model=model)
    session = ProtoPromptSession("s", str(tmp_path / "s.db"))
    turns: list[Any] = []
    calls: list[ModelCallPlan] = []
    config = session.run_config(
        agent=agent,
        model="gpt-5",
        max_tokens=500,
        on_plan=turns.append,
        on_call=calls.append,
        tracing_disabled=True,
    )
    await Runner.run(agent, "hello", session=session, run_config=config, context={"user": "Al"})
    note = turns[0].sections["instructions"].note
    assert note is not None and "made per run" in note
    assert calls[0].instructions_tokens > 0
    assert turns[0].used + calls[0].instructions_tokens == calls[0].used


def test_one_vocabulary_request_used_remaining_on_every_plan(tmp_path) -> None:
    """``request`` never includes the output reserve; ``used`` does; ``remaining`` is on every
    plan (docs/reading-a-plan.md, the glossary) -- and explain() says it the same way."""
    agent = Agent(
        name="a", instructions="Be brief.", model=ScriptedModel([[assistant_message("ok")]])
    )
    session = ProtoPromptSession("v", str(tmp_path / "v.db"))
    turns: list[Any] = []
    config = session.run_config(
        agent=agent, model="gpt-5", max_tokens=4_000, output_reserve=300, on_plan=turns.append
    )
    asyncio.run(Runner.run(agent, "hello", session=session, run_config=config))
    call = config.call_model_input_filter.last_plan
    pack = pp.pack([], [{"role": "user", "content": "hi"}], 500, output_reserve=50)
    for plan in (call, turns[0], pack):
        assert plan.used == plan.request_tokens + plan.sections["output_reserve"].tokens
        assert plan.remaining == plan.budget - plan.used == plan.sections.remaining
        header = next(x for x in plan.explain().splitlines() if x.startswith("used: "))
        assert header.startswith(f"used: {plan.used:,} of {plan.budget:,} tokens")
        reserve = plan.sections["output_reserve"].tokens
        assert f"request {plan.request_tokens:,} + output reserve {reserve:,})" in header


def test_every_budget_error_section_has_a_plan_section() -> None:
    from protoprompt.plan import SECTIONS

    for section, named in pp.TokenBudgetExceededError.PLAN_SECTIONS.items():
        assert named in SECTIONS, section
        assert pp.TokenBudgetExceededError(9, 5, section).plan_section == named
    with pytest.raises(pp.TokenBudgetExceededError) as caught:
        pp.pack([], [{"role": "user", "content": "word " * 50}], 20)
    assert (caught.value.section, caught.value.plan_section) == ("new_input", "run_input")


def test_totals_have_the_plans_names_too() -> None:
    history: list[Any] = [
        {"role": "user", "content": "look it up " * 20},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    ]
    new = [{"type": "function_call_output", "call_id": "c1", "output": "found " * 30}]
    for budget in (400, 4_000):
        r = pp.pack(history, new, budget, output_reserve=20, context_tokens=9)
        t, s = r.totals, r.sections
        assert t.run_input == t.new_input == s["run_input"].tokens
        assert t.context_message == t.context == s["context_message"].tokens
        assert t.kept_history == t.history + t.dependency == s["kept_history"].tokens
        assert t.request_tokens == r.request_tokens == s.request_tokens
        assert t.dependency > 0  # the call the run input answers: kept history, mandatory
