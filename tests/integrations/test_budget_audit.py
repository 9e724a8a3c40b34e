"""The provider's count next to ours: ``BudgetAudit`` and calibration, end to end.

Offline: the SDK's ``ScriptedModel`` stands for the provider, and each scripted step reports
``usage.input_tokens`` computed from the request it actually received (a "provider" that
counts 90% of our conservative text estimate and a given share of the opaque payloads), so
the audit's pairing, totals, warnings and the calibration it feeds can all be checked
against what each call really sent.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import re
import sqlite3
import warnings
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, RunHooks, Runner, function_tool  # noqa: E402
from agents.testing import (  # noqa: E402
    ModelCall,
    ModelStep,
    ScriptedModel,
    assistant_message,
    function_call,
)
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseReasoningItem  # noqa: E402
from openai.types.responses.response_reasoning_item import Summary  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import (  # noqa: E402
    BudgetUnderestimateWarning,
    Calibration,
    TokenBudgetedContextBuilder,
    item_tokens,
)
from protoprompt.integrations import (  # noqa: E402
    BudgetAudit,
    ModelCallPlan,
    ProtoPromptSession,
    model_input_filter,
)


@function_tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"result for {q}: " + "figures and notes " * 40


def reasoning_item(i: int, decoded: int = 6000) -> ResponseReasoningItem:
    raw = b"\x80\x00\x00\x00\x00" + random.Random(i).randbytes(decoded - 5)
    return ResponseReasoningItem(
        id=f"rs_{i}",
        type="reasoning",
        summary=[Summary(text=f"thinking {i}", type="summary_text")],
        encrypted_content=base64.urlsafe_b64encode(raw).decode(),
    )


def provider_count(call: ModelCall, opaque_share: float, extra: int = 0) -> int:
    """What the fake provider reports: 90% of our text estimate of the items, the given share
    of their opaque payloads by the decoded-size rule, plus ``extra``."""
    items = [i for i in call.input if isinstance(i, dict)] if isinstance(call.input, list) else []
    costs = [item_tokens(i) for i in items]
    rest = sum(c.total - c.opaque for c in costs)
    opaque = sum(c.opaque for c in costs)
    return int(0.9 * rest) + int(opaque_share * opaque) + extra


def reporting(
    output: list[Any], opaque_share: float, extra: int = 0, seen: list[int] | None = None
) -> ModelStep:
    """A scripted step whose usage is computed from the request it receives."""

    def respond(call: ModelCall) -> ModelStep:
        n = provider_count(call, opaque_share, extra)
        if seen is not None:
            seen.append(n)
        return ModelStep(
            output=output,
            usage=Usage(requests=1, input_tokens=n, output_tokens=7, total_tokens=n + 7),
        )

    return ModelStep.respond(respond)


def turn_script(
    turn: int, opaque_share: float, extra: int = 0, seen: list[int] | None = None
) -> list[ModelStep]:
    """One turn: reasoning + a tool call, then reasoning + the answer."""
    return [
        reporting(
            [
                reasoning_item(2 * turn),
                function_call("lookup", {"q": f"t{turn}"}, call_id=f"c{turn}"),
            ],
            opaque_share,
            extra,
            seen,
        ),
        reporting(
            [reasoning_item(2 * turn + 1), assistant_message(f"answer {turn}", item_id=f"m{turn}")],
            opaque_share,
            extra,
            seen,
        ),
    ]


def builder_for(**kw: Any) -> TokenBudgetedContextBuilder:
    return TokenBudgetedContextBuilder(
        None, max_tokens=60_000, output_reserve=1_000, model="gpt-5", **kw
    )


async def run_turns(
    session: ProtoPromptSession,
    builder: TokenBudgetedContextBuilder,
    audit: BudgetAudit,
    turns: range,
    opaque_share: float,
    *,
    hooks: Any = "audit",
    extra: int = 0,
    seen: list[int] | None = None,
    plans: list[ModelCallPlan] | None = None,
    streamed: bool = False,
) -> list[Any]:
    results = []
    for t in turns:
        agent = Agent(
            name="analyst",
            model=ScriptedModel(turn_script(t, opaque_share, extra, seen)),
            tools=[lookup],
            instructions="Answer from the figures.",
        )
        config = session.run_config(
            builder,
            audit=audit,
            on_call=plans.append if plans is not None else None,
            tracing_disabled=True,
        )
        kwargs: dict[str, Any] = {"session": session, "run_config": config}
        if hooks == "audit":
            kwargs["hooks"] = audit
        elif hooks is not None:
            kwargs["hooks"] = hooks
        if streamed:
            result = Runner.run_streamed(agent, f"question {t}", **kwargs)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, f"question {t}", **kwargs)
        results.append(result)
    return results


# ------------------------------------------------------------------------- the audit


@pytest.mark.parametrize("streamed", [False, True])
async def test_every_call_is_paired_with_the_providers_count(
    tmp_path: Path, streamed: bool
) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    builder = builder_for()
    audit = BudgetAudit()
    seen: list[int] = []
    plans: list[ModelCallPlan] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetUnderestimateWarning)
        await run_turns(
            session, builder, audit, range(3), 0.5, seen=seen, plans=plans, streamed=streamed
        )
    calls = audit.calls
    assert len(calls) == len(plans) == len(seen) == 6
    for call, plan, reported in zip(calls, plans, seen):
        assert call.estimate == plan.request_tokens
        assert call.reported == reported
        assert call.model == "gpt-5" and call.agent == "analyst"
        assert call.ratio is not None and call.ratio < 1 and not call.underestimated
        assert call.opaque == sum(item_tokens(i).opaque for i in plan.items if isinstance(i, dict))
    assert calls[-1].opaque > calls[1].opaque > calls[0].opaque == 0, "reasoning accumulates"
    summary = audit.summary()
    assert (summary.calls, summary.reported_calls, summary.underestimated_calls) == (6, 6, 0)
    assert summary.estimate_tokens == sum(p.request_tokens for p in plans)
    assert summary.reported_tokens == sum(seen)
    assert summary.min_ratio <= summary.ratio <= summary.max_ratio < 1  # type: ignore[operator]
    text = audit.explain()
    assert "6 of 6 calls reported" in text and text.count("\n  call ") == 6


async def test_a_provider_count_above_the_estimate_warns(tmp_path: Path) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    builder = builder_for()
    audit = BudgetAudit()
    with pytest.warns(BudgetUnderestimateWarning) as caught:
        # The provider counts every opaque token and 5000 more than our whole estimate.
        await run_turns(session, builder, audit, range(1), 1.0, extra=5_000)
    # Only this category: pytest.warns records every warning while it is open, and a
    # library's first use in a worker process may warn (pydantic on the SDK's TypedDicts).
    under = [w for w in caught if issubclass(w.category, BudgetUnderestimateWarning)]
    assert len(under) == 2
    warning = under[0].message
    assert isinstance(warning, BudgetUnderestimateWarning)
    assert warning.reported > warning.estimate and warning.model == "gpt-5"
    assert "not conservative" in str(warning)
    assert audit.summary().underestimated_calls == 2
    assert "counted MORE than estimated" in audit.summary().explain()
    quiet = BudgetAudit(warn=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BudgetUnderestimateWarning)
        await run_turns(session, builder, quiet, range(1, 2), 1.0, extra=5_000)
    assert quiet.summary().underestimated_calls == 2


class Recorder(RunHooks[Any]):
    def __init__(self) -> None:
        self.events: list[str] = []

    async def on_agent_start(self, context: Any, agent: Any) -> None:
        self.events.append("agent_start")

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: Any, input_items: Any
    ) -> None:
        self.events.append("llm_start")

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.events.append("llm_end")

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self.events.append("tool_start")

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        self.events.append("tool_end")

    async def on_agent_end(self, context: Any, agent: Any, output: Any) -> None:
        self.events.append("agent_end")


async def test_the_users_hooks_still_see_every_event(tmp_path: Path) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    mine = Recorder()
    audit = BudgetAudit(hooks=mine)
    await run_turns(session, builder_for(), audit, range(1), 0.5)
    assert mine.events == [
        "agent_start",
        "llm_start",
        "llm_end",
        "tool_start",
        "tool_end",
        "llm_start",
        "llm_end",
        "agent_end",
    ]
    assert audit.summary().reported_calls == 2
    with pytest.raises(TypeError, match="RunHooks"):
        BudgetAudit(hooks=object())  # type: ignore[arg-type]


async def test_a_finished_run_is_paired_from_its_raw_responses(tmp_path: Path) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    audit = BudgetAudit()
    seen: list[int] = []
    paired: list[Any] = []
    for t in range(2):
        (result,) = await run_turns(
            session, builder_for(), audit, range(t, t + 1), 0.5, hooks=None, seen=seen
        )
        assert audit.calls[-1].reported is None
        paired += audit.add_result(result)
    assert [c.reported for c in paired] == seen
    assert [c.reported for c in audit.calls] == seen
    assert audit.add_result(result) == [], "nothing is paired twice"
    # A run the hooks already paired is not paired again from its result.
    hooked = await run_turns(session, builder_for(), audit, range(2, 3), 0.5)
    assert audit.add_result(hooked[0]) == []
    assert audit.summary().reported_calls == 6


async def test_a_failed_run_does_not_shift_the_pairing_of_the_next(tmp_path: Path) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    builder = builder_for()
    audit = BudgetAudit()
    failing = Agent(
        name="analyst",
        model=ScriptedModel([turn_script(0, 0.5)[0], ModelStep.raise_error(RuntimeError("down"))]),
        tools=[lookup],
    )
    config = session.run_config(builder, audit=audit, tracing_disabled=True)
    with pytest.raises(RuntimeError, match="down"):
        await Runner.run(failing, "question", session=session, run_config=config)
    assert len(audit.calls) == 2  # both plans were made; no response to pair them with
    seen: list[int] = []
    (result,) = await run_turns(session, builder, audit, range(1, 2), 0.5, hooks=None, seen=seen)
    paired = audit.add_result(result)
    assert [c.reported for c in paired] == seen and [c.serial for c in paired] == [3, 4]
    assert [c.reported for c in audit.calls[:2]] == [None, None]


async def test_concurrent_runs_sharing_one_audit_are_paired_exactly(tmp_path: Path) -> None:
    audit = BudgetAudit()
    builder = builder_for()
    seen: list[int] = []

    async def conversation(name: str, turns: int) -> None:
        session = ProtoPromptSession(name, str(tmp_path / f"{name}.db"))
        await run_turns(session, builder, audit, range(turns), 1.0, seen=seen)

    await asyncio.gather(conversation("a", 3), conversation("b", 2), conversation("c", 1))
    calls = audit.calls
    assert len(calls) == 12 and all(c.reported is not None for c in calls)
    # The provider counts the items only (its share of text, all opaque tokens); our
    # estimate adds the same instructions and tools to every call: had a call been paired
    # with another run's count, the difference would not be the same for all.
    gaps = {c.estimate - c.reported - int(0.1 * (c.estimate - c.opaque)) for c in calls}  # type: ignore[operator]
    assert max(gaps) - min(gaps) <= 40, gaps
    assert sorted(c.reported for c in calls) == sorted(seen)


async def test_a_standalone_filter_reports_to_the_audit(tmp_path: Path) -> None:
    builder = builder_for()
    audit = BudgetAudit()
    config = RunConfig(
        call_model_input_filter=model_input_filter(builder, on_call=audit.observer(builder)),
        tracing_disabled=True,
    )
    agent = Agent(name="solo", model=ScriptedModel(turn_script(0, 0.5)), tools=[lookup])
    await Runner.run(agent, "question", run_config=config, hooks=audit)
    assert [c.reported is not None for c in audit.calls] == [True, True]
    # Without a builder the model is the agent's (a Model object here: unknown).
    anonymous = BudgetAudit()
    config = RunConfig(
        call_model_input_filter=model_input_filter(builder, on_call=anonymous.on_call),
        tracing_disabled=True,
    )
    agent = Agent(name="solo", model=ScriptedModel(turn_script(1, 0.5)), tools=[lookup])
    await Runner.run(agent, "question", run_config=config, hooks=anonymous)
    assert [c.model for c in anonymous.calls] == [None, None]
    assert anonymous.summary().reported_calls == 2


async def test_run_config_checks_and_composes_on_call(tmp_path: Path) -> None:
    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    with pytest.raises(TypeError, match="BudgetAudit"):
        session.run_config(builder_for(), audit=object())  # type: ignore[arg-type]
    plans: list[ModelCallPlan] = []
    audit = BudgetAudit()
    await run_turns(session, builder_for(), audit, range(1), 0.5, plans=plans)
    assert len(plans) == len(audit.calls) == 2


def test_a_provider_that_reports_nothing_leaves_calls_unreported() -> None:
    from protoprompt.integrations.audit import _reported_input

    class R:
        def __init__(self, usage: Any) -> None:
            self.usage = usage

    assert _reported_input(R(Usage())) is None
    assert _reported_input(R(None)) is None
    assert _reported_input(R(Usage(requests=1, input_tokens=12, total_tokens=12))) == 12
    import dataclasses

    retried = Usage()
    retried.add(Usage(requests=1, input_tokens=40, total_tokens=40))  # one entry of 40
    (entry,) = retried.request_usage_entries
    failed = dataclasses.replace(entry, input_tokens=0, total_tokens=0)
    retried.request_usage_entries = [failed, entry]  # what the SDK makes of one retry
    assert _reported_input(R(retried)) == 40


# ------------------------------------------------------------------------- calibration


async def test_calibration_learns_the_opaque_share_and_is_kept_in_the_database(
    tmp_path: Path,
) -> None:
    db = str(tmp_path / "a.db")
    session = ProtoPromptSession("s", db)
    builder = builder_for(calibration=session.calibration)
    assert builder.opaque_scale() == 1.0
    audit = BudgetAudit()
    seen: list[int] = []
    await run_turns(session, builder, audit, range(1), 0.3, seen=seen)
    state = session.calibration.state("gpt-5")
    assert len(state.samples) >= 1
    await run_turns(session, builder, audit, range(1, 4), 0.3, seen=seen)
    state = session.calibration.state("gpt-5")
    assert len(state.samples) >= 3
    scale = builder.opaque_scale()
    assert 0.25 <= scale < 0.6, state
    # Every sample is covered: estimates at the learned scale stay above the provider.
    assert all(scale > s for s in state.samples)
    # Kept in the session's database: another process (a new object) reads the same.
    assert Calibration(db).opaque_scale("gpt-5") == scale
    assert ProtoPromptSession("s", db).calibration.opaque_scale("gpt-5") == scale
    # The next turn packs with it, says so, and is still conservative.
    before = len(audit.calls)
    await run_turns(session, builder, audit, range(4, 5), 0.3, seen=seen)
    later = audit.calls[before:]
    assert all(c.opaque_scale == scale for c in later)
    assert all(not c.underestimated for c in audit.calls)
    plan = builder.last_plan
    assert plan is not None and plan.pack.opaque_scale == scale
    text = plan.explain()
    assert f"calibration gpt-5: opaque payloads at x{scale:g}" in text
    assert f"opaque payloads at x{scale:g} of the decoded-size rule" in text
    # The text part never goes below the rule: the estimate minus the scaled opaque part
    # is the conservative rule's.
    for call in later:
        assert call.estimate - pp._core.scale_opaque(call.opaque, scale) > 0


async def test_without_calibration_nothing_is_learned(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    session = ProtoPromptSession("s", db)
    builder = builder_for()
    await run_turns(session, builder, BudgetAudit(), range(3), 0.3)
    assert session.calibration.samples("gpt-5") == ()
    assert builder.opaque_scale() == 1.0 and builder.calibration_state() is None


def test_calibration_needs_a_model() -> None:
    with pytest.raises(ValueError, match="model"):
        TokenBudgetedContextBuilder(None, max_tokens=1000, calibration=Calibration())
    with pytest.raises(TypeError, match="Calibration"):
        TokenBudgetedContextBuilder(None, max_tokens=1000, model="gpt-5", calibration=object())  # type: ignore[arg-type]


def learn(calibration: Calibration, model: str, share: float, n: int) -> None:
    """``n`` calls of 10k tokens of text and 20k opaque tokens, the provider counting
    ``share`` of the opaque part."""
    for _ in range(n):
        calibration.observe(
            model,
            estimate=30_000,
            opaque=20_000,
            opaque_scale=1.0,
            reported=10_000 + int(share * 20_000),
        )


@pytest.mark.parametrize("path", [None, "file"])
def test_calibration_is_per_model_bounded_and_resettable(tmp_path: Path, path: str | None) -> None:
    cal = Calibration(None if path is None else tmp_path / "c.db")
    learn(cal, "gpt-5", 0.4, 2)
    assert cal.opaque_scale("gpt-5") == 1.0, "3 samples needed"
    learn(cal, "gpt-5", 0.4, 1)
    assert cal.opaque_scale("gpt-5") == 0.5  # 0.4 + 1/16, in sixteenths
    assert cal.opaque_scale("o4-mini") == 1.0
    learn(cal, "o4-mini", 0.0, 3)
    assert cal.opaque_scale("o4-mini") == 0.3125  # the smallest sample (0.25) + 1/16
    learn(cal, "o4-mini", 9.0, 3)
    assert cal.opaque_scale("o4-mini") == 2.0  # bounded
    learn(cal, "gpt-5", 0.4, 40)
    assert len(cal.samples("gpt-5")) == 32
    assert cal.observe("gpt-5", estimate=1000, opaque=100, opaque_scale=1.0, reported=10) is None
    cal.reset("gpt-5")
    assert cal.samples("gpt-5") == () and cal.opaque_scale("o4-mini") == 2.0
    cal.reset()
    assert cal.samples("o4-mini") == ()
    for bad in ("", None):
        with pytest.raises(ValueError):
            cal.samples(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        cal.observe("m", estimate=-1, opaque=0, opaque_scale=1.0, reported=0)


@pytest.mark.parametrize(
    "damage",
    [
        'UPDATE protoprompt_calibration SET samples = \'{"v": 1, "samples": [0.1, 0.1, 0.1]}\'',
        'UPDATE protoprompt_calibration SET samples = \'{"v": 2, "samples": [0.4, 0.4, 0.4]}\'',
        "UPDATE protoprompt_calibration SET samples = 'not json'",
        "UPDATE protoprompt_calibration SET mac = x'00'",
        "UPDATE protoprompt_calibration SET samples = 42",
        "UPDATE protoprompt_calibration SET model = 'o4-mini'",  # moved to another model
        "UPDATE protoprompt_meta SET value = '" + "ab" * 16 + "' WHERE key = 'calibration_secret'",
    ],
)
def test_damaged_or_foreign_rows_are_ignored(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "c.db"
    learn(Calibration(db), "gpt-5", 0.4, 3)
    learn(Calibration(db), "o4-mini", 0.4, 0)
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    cal = Calibration(db)
    assert cal.opaque_scale("gpt-5") == 1.0
    assert cal.opaque_scale("o4-mini") == 1.0
    # The next observations replace the damaged row.
    learn(cal, "gpt-5", 0.4, 3)
    assert cal.opaque_scale("gpt-5") == 0.5


def test_a_calibration_row_holds_only_numbers_within_bounds(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    learn(Calibration(db), "gpt-5", 0.4, 3)
    with sqlite3.connect(db) as conn:
        (text,) = conn.execute("SELECT samples FROM protoprompt_calibration").fetchone()
    data = json.loads(text)
    assert data["v"] == 1 and len(data["samples"]) == 3
    assert all(0.25 <= s <= 2 for s in data["samples"])


def test_a_read_only_database_keeps_the_calibration_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import protoprompt.calibration as cal_module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise sqlite3.OperationalError("attempt to write a readonly database")

    session = ProtoPromptSession("s", str(tmp_path / "a.db"))
    monkeypatch.setattr(cal_module, "meta_value", refuse)
    cal = session.calibration
    assert cal.path is None
    learn(cal, "gpt-5", 0.4, 3)
    assert cal.opaque_scale("gpt-5") == 0.5


class Shifting(Calibration):
    """A calibration another process changes under the turn: its factor is ``high`` for the
    first ``flip`` reads, ``low`` after."""

    def __init__(self, flip: int, high: float = 2.0, low: float = 0.25) -> None:
        super().__init__()
        self.reads = 0
        self.flip, self.high, self.low = flip, high, low

    def state(self, model: str, *, encoding: str | None = None) -> pp.CalibrationState:
        self.reads += 1
        scale = self.high if self.reads <= self.flip else self.low
        return pp.CalibrationState(model, (scale,) * 3, scale)


@pytest.mark.parametrize("flip", [11, 13, 15])
async def test_a_token_window_is_packed_under_the_calibration_it_was_found_under(
    tmp_path: Path, flip: int
) -> None:
    """Windowed reads find the window under the builder's calibration; if it changes before
    the turn is packed (another process learned), the turn still packs under the window's
    one: a smaller factor could need items before the window."""
    db = str(tmp_path / "a.db")
    session = ProtoPromptSession("s", db, windowed_reads=True)
    calibration = Shifting(flip)
    builder = TokenBudgetedContextBuilder(
        None, max_tokens=16_000, output_reserve=500, model="gpt-5", calibration=calibration
    )
    callback = session.input_callback(builder)
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    # A short first exchange: the windows of the long turns after it start at one of their
    # user messages (a masked pack checks a turn back to its user message), never at 0.
    await session.add_items(
        [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]
    )
    windowed = []
    for t in range(10):
        agent = Agent(
            name="a",
            model=ScriptedModel(
                [[reasoning_item(t, 8000), assistant_message(f"answer {t}", item_id=f"m{t}")]]
            ),
        )
        await Runner.run(agent, f"question {t}", session=session, run_config=config)
        plan = builder.last_plan
        assert plan is not None and plan.turn is not None
        windowed.append(plan.turn.windowed)
        history = await session.get_items()
        # Every turn's request is a fresh pack of the stored history under the turn's factor.
        fresh = pp.pack(
            history[:-3],  # the turn stored its question, the reasoning and the answer
            [history[-3]],
            16_000,
            output_reserve=500,
            context_tokens=plan.pack.context_tokens,
            opaque_scale=plan.pack.opaque_scale,
        )
        assert plan.pack.used == fresh.used and plan.pack.history_tokens == fresh.history_tokens
    # Windows under the high factor; the factor falls between the read and the pack of a
    # windowed turn (after it, the history fits whole under the low factor).
    race = (flip + 1) // 2 - 1
    assert windowed[race], windowed
    assert calibration.reads > flip


# ------------------------------------------------------------------ issue 34: the prompt cache


async def test_the_providers_cached_tokens_are_reported_beside_the_expected_share() -> None:
    """Issue 34 #5: with a cache policy every plan says how many tokens repeat the previous
    request; the audit reads ``usage.input_tokens_details.cached_tokens`` and reports it
    beside that expected share."""
    from openai.types.responses.response_usage import InputTokensDetails

    previous: list[str] = []

    def cached(call: Any) -> ModelStep:
        # A provider that caches the items equal to the previous request's leading items.
        keys = [json.dumps(i, sort_keys=True) for i in call.input]
        n = 0
        while n < min(len(keys), len(previous)) and keys[n] == previous[n]:
            n += 1
        hit = sum(item_tokens(i).total for i in call.input[:n])
        previous[:] = keys
        total = sum(item_tokens(i).total for i in call.input)
        return ModelStep(
            output=outputs.pop(0),
            usage=Usage(
                requests=1,
                input_tokens=total,
                output_tokens=1,
                total_tokens=total + 1,
                input_tokens_details=InputTokensDetails.model_construct(cached_tokens=hit),
            ),
        )

    outputs: list[Any] = [
        [function_call("lookup", {"q": f"q{i}"}, call_id=f"c{i}")] for i in range(4)
    ]
    outputs.append([assistant_message("done", item_id="m")])
    model = ScriptedModel([ModelStep.respond(cached) for _ in range(5)])
    session = ProtoPromptSession("cache")
    builder = TokenBudgetedContextBuilder(None, max_tokens=50_000, output_reserve=500)
    audit = BudgetAudit()
    plans: list[ModelCallPlan] = []
    config = session.run_config(builder, cache=pp.CachePolicy(), audit=audit, on_call=plans.append)
    agent = Agent(name="a", model=model, tools=[lookup])
    await Runner.run(agent, "go", session=session, run_config=config, hooks=audit)
    calls = audit.calls
    assert len(calls) == 5
    assert [c.expected_cached for c in calls] == [p.shared_tokens for p in plans]
    assert calls[0].cached == 0 and all(c.cached for c in calls[1:])
    for c, p in zip(calls[1:], plans[1:]):
        # The plan's share counts instructions and tools too; the items alone are cached here.
        assert p.prefix == "stayed" and c.cached <= c.expected_cached
    summary = audit.summary()
    assert summary.cached_tokens == sum(c.cached or 0 for c in calls) > 0
    assert summary.expected_cached_tokens == sum(p.shared_tokens for p in plans)
    assert "prompt cache:" in summary.explain() and "expected" in calls[-1].explain()


# ------------------------------------------------------------------ an estimate (Claude)

CLAUDE = "claude-sonnet-4-5"


def claude_count(call: ModelCall, ratio: float) -> int:
    """What a fake Anthropic reports: ``ratio`` times our estimate of the items and the
    instructions (Claude's tokenizer is not public; the estimate may be low for a workload)."""
    items = [i for i in call.input if isinstance(i, dict)] if isinstance(call.input, list) else []
    n = sum(item_tokens(i, model=CLAUDE).total for i in items)
    n += pp.count_tokens(call.system_instructions or "", model=CLAUDE)
    return int(ratio * n) + 1


def claude_turn(turn: int, ratio: float, seen: list[int]) -> list[ModelStep]:
    def step(output: list[Any]) -> ModelStep:
        def respond(call: ModelCall) -> ModelStep:
            n = claude_count(call, ratio)
            seen.append(n)
            return ModelStep(
                output=output,
                usage=Usage(requests=1, input_tokens=n, output_tokens=7, total_tokens=n + 7),
            )

        return ModelStep.respond(respond)

    return [
        step([function_call("lookup", {"q": f"t{turn}"}, call_id=f"c{turn}")]),
        step([assistant_message(f"answer {turn} " + "in detail " * 30, item_id=f"m{turn}")]),
    ]


async def run_claude(
    tmp_path: Path, calibration: bool, ratio: float = 1.3, turns: int = 8
) -> tuple[list[int], BudgetAudit, TokenBudgetedContextBuilder, ProtoPromptSession]:
    tmp_path.mkdir(exist_ok=True)
    session = ProtoPromptSession("s", str(tmp_path / "claude.db"))
    builder = TokenBudgetedContextBuilder(
        None,
        max_tokens=4_000,
        output_reserve=500,
        model=CLAUDE,
        masking=None,
        calibration=session.calibration if calibration else None,
    )
    audit = BudgetAudit(warn=False)
    seen: list[int] = []
    for t in range(turns):
        agent = Agent(
            name="analyst",
            model=ScriptedModel(claude_turn(t, ratio, seen)),
            tools=[lookup],
            instructions="Answer from the figures.",
        )
        config = session.run_config(builder, audit=audit, tracing_disabled=True)
        await Runner.run(agent, f"question {t}", session=session, run_config=config, hooks=audit)
    return seen, audit, builder, session


async def test_an_estimate_learns_its_factor_from_the_providers_count(tmp_path: Path) -> None:
    """Claude counted 1.3x our estimate: without a calibration the requests of a full
    history go over the budget by the provider's count; with one, the next call's plan
    uses the learned factor (after one call: raising needs no more) and every later request
    fits by the provider's count."""
    room = 4_000 - 500
    seen, audit, _, _ = await run_claude(tmp_path / "a", calibration=False)
    assert max(seen) > room, "the uncalibrated estimate is too low for this provider"
    seen, audit, builder, session = await run_claude(tmp_path / "b", calibration=True)
    state = session.calibration.state(CLAUDE)
    # Every call but the first (too few item tokens to tell) gave a sample.
    assert state.estimate and len(state.samples) == len(seen) - 1
    scale = builder.opaque_scale()
    assert 1.3 < scale <= 1.5, state
    calls = audit.calls
    assert calls[0].opaque_scale == 1.0 and calls[0].items > 0
    assert all(c.opaque_scale > 1.0 for c in calls[2:])
    # Every request fits by the provider's own count; the estimate catches up within a turn
    # (the first samples carry more instructions and tools than items).
    assert all(n <= room for n in seen), seen
    assert not any(c.underestimated for c in calls[3:]), audit.explain()
    # The last plan says the factor and how many calls it rests on (those reported before).
    text = builder.last_plan.explain() if builder.last_plan else ""
    assert f"every item at x{scale:g} of the claude_estimate estimate" in text
    assert f"calibration {CLAUDE}: the estimate at x{scale:g}" in text
    rests_on = re.search(r"from (\d+) calls", text)
    assert rests_on is not None and len(seen) - 4 <= int(rests_on[1]) < len(seen), text
    # Kept in the session's database, apart from the opaque factor of the same name.
    db = str(tmp_path / "b" / "claude.db")
    assert Calibration(db).opaque_scale(CLAUDE) == scale
    assert Calibration(db).opaque_scale(CLAUDE, encoding="o200k_base") == 1.0


def test_an_estimate_is_lowered_only_after_three_samples(tmp_path: Path) -> None:
    cal = Calibration(tmp_path / "c.db")
    # 10k item tokens by the estimate, 1k besides; Claude counted 6k in all.
    for n in range(1, 4):
        cal.observe(CLAUDE, estimate=11_000, opaque=10_000, opaque_scale=1.0, reported=6_000)
        assert cal.opaque_scale(CLAUDE) == (1.0 if n < 3 else 0.5625), n
    state = cal.state(CLAUDE)
    assert state.estimate and "from 3 calls" in state.explain()
    assert cal.opaque_scale(CLAUDE, encoding="o200k_base") == 1.0


def test_a_wild_sample_is_never_learned(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A call the provider counted at more than twice the estimate (a mispairing, or a
    request that was not what the plan saw) is logged and ignored, not clamped to the cap."""
    cal = Calibration(tmp_path / "c.db")
    with caplog.at_level("WARNING", logger="protoprompt"):
        got = cal.observe(CLAUDE, estimate=11_000, opaque=10_000, opaque_scale=1.0, reported=40_000)
    assert got is None and cal.samples(CLAUDE) == ()
    assert cal.opaque_scale(CLAUDE) == 1.0
    assert "above the cap" in caplog.text
    # At the cap it is learned (and bounded).
    got = cal.observe(CLAUDE, estimate=11_000, opaque=10_000, opaque_scale=1.0, reported=21_000)
    assert got == 2.0 and cal.opaque_scale(CLAUDE) == 2.0


@pytest.mark.parametrize(
    "damage",
    [
        # The opaque kind's row for a Claude model, or samples out of the estimate's bounds.
        'UPDATE protoprompt_calibration SET samples = \'{"v": 1, "samples": [1.5]}\'',
        'UPDATE protoprompt_calibration SET samples = \'{"v": 2, "samples": [0.3, 0.3, 0.3]}\'',
        'UPDATE protoprompt_calibration SET samples = \'{"v": 2, "samples": [7.0]}\'',
        "UPDATE protoprompt_calibration SET mac = x'00'",
        "UPDATE protoprompt_calibration SET model = 'claude-opus-4-1'",
    ],
)
def test_damaged_or_foreign_estimate_rows_are_ignored(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "c.db"
    cal = Calibration(db)
    cal.observe(CLAUDE, estimate=11_000, opaque=10_000, opaque_scale=1.0, reported=14_000)
    assert cal.opaque_scale(CLAUDE) == 1.375
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
        if "mac" not in damage and "model" not in damage:
            pass  # the mac no longer matches the samples
    cal = Calibration(db)
    assert cal.opaque_scale(CLAUDE) == 1.0
    assert cal.opaque_scale("claude-opus-4-1") == 1.0


def test_a_calibrated_estimate_scales_every_item_sent_masked_copies_too() -> None:
    """Under ``claude_estimate`` the factor scales each item's whole cost, and a masked copy's
    too: what the plan counts is each sent item's estimate, scaled and rounded up."""
    history: list[dict[str, Any]] = []
    for i in range(6):
        history += [
            {"role": "user", "content": f"question {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "lookup", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "figures " * 1000},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    new = [{"role": "user", "content": "and now?"}]
    for scale in (1.0, 0.75, 1.5):
        plan = pp.pack(history, new, 6_000, model=CLAUDE, opaque_scale=scale, masking=pp.Masking())
        assert plan.masked, "older outputs were masked"
        want = sum(
            pp._core.scale_opaque(item_tokens(i, model=CLAUDE).total, scale) for i in plan.items
        )
        assert plan.request_tokens == want, scale
    with pytest.raises(ValueError, match="at least 0.5"):
        pp.pack(history, new, 3_000, model=CLAUDE, opaque_scale=0.25)
