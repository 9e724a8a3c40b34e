"""The session callback's cache-stable prefix (issue 34 #1, #6, #8): each turn's request is
the previous turn's (its history as sent, masked copies included) plus what was stored since
while that fits; when it does not, the history is packed once to the policy's low-water mark
with the older tool outputs masked, and the turns after it extend that request again.
``run_config`` does this by default. Whole SDK runs with the SDK's ``ScriptedModel``, which
records what each model call received."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

agents = pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from test_model_filter import assert_sendable, request_tokens  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.context import ContextPlan  # noqa: E402
from protoprompt.integrations import ModelCallPlan, ProtoPromptSession  # noqa: E402

RESERVE = 300


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _extends(prev: list[Any], cur: list[Any]) -> bool:
    """``cur`` starts with every item of ``prev``, byte for byte (as JSON)."""
    return len(cur) >= len(prev) and all(_same(a, b) for a, b in zip(prev, cur, strict=False))


def _sizes_tool(sizes: dict[str, int]) -> Any:
    @function_tool
    def fetch(q: str) -> str:
        """Fetch something of a given size."""
        return f"{q}: " + "data " * sizes[q]

    return fetch


def _script(runs: list[list[int]], sizes: dict[str, int], answer_words: int) -> list[Any]:
    script: list[Any] = []
    for r, steps in enumerate(runs):
        for s, size in enumerate(steps):
            sizes[f"{r}.{s}"] = size
            script.append([function_call("fetch", {"q": f"{r}.{s}"}, call_id=f"c{r}_{s}")])
        script.append([assistant_message(f"answer {r} " + "word " * answer_words, item_id=f"m{r}")])
    return script


async def _plain_history(runs: list[list[int]], answer_words: int) -> list[Any]:
    """What a session without any hook stores for the same runs."""
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, answer_words))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    plain = ProtoPromptSession("plain")
    for r in range(len(runs)):
        await Runner.run(
            agent, f"question {r}", session=plain, run_config=RunConfig(tracing_disabled=True)
        )
    return await plain.get_items()


async def _callback_runs(
    runs: list[list[int]], budget: int, cache: pp.CachePolicy | None, answer_words: int = 120
) -> tuple[list[ContextPlan], ScriptedModel, list[Any]]:
    """Runs through the session callback alone (one pack per run); its turn plans, the
    model (what each call received) and the stored history."""
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, answer_words))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=RESERVE)
    session = ProtoPromptSession("turns")
    turns: list[ContextPlan] = []
    callback = session.input_callback(builder, on_plan=turns.append, cache=cache)
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    for r in range(len(runs)):
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
    return turns, model, await session.get_items()


async def test_the_callback_keeps_its_cut_while_the_request_fits() -> None:
    """Turn after turn, the callback's request is the previous turn's plus what the run
    stored and the new input, byte for byte, until it does not fit; then it moves once to
    the low-water mark and the next turns extend that request. Newest first moves the cut
    at every turn once the history overflows."""
    runs = [[]] * 18
    budget = 3_000
    policy = pp.CachePolicy(low_water=0.6, head=0.0)  # a move drops from the start
    turns, model, stored = await _callback_runs(runs, budget, policy, answer_words=250)
    requests = [list(c.input) for c in model.calls]
    codes = [t.prefix for t in turns]
    assert codes[0] == "set" and "moved" in codes and codes.count("stayed") >= 9, codes
    for n in range(1, len(requests)):
        assert request_tokens(model.calls[n]) + RESERVE <= budget, f"turn {n + 1}"
        assert_sendable(requests[n])
        if codes[n] == "stayed":
            assert _extends(requests[n - 1], requests[n]), f"turn {n + 1}"
            assert turns[n].shared_tokens == turns[n - 1].request_tokens > 0
            assert "extends the previous request" in turns[n].prefix_reason
        else:
            assert codes[n] == "moved" and turns[n].shared_tokens == 0
            assert "did not fit: cut moved from history[" in turns[n].prefix_reason
            assert turns[n].used <= int(budget * 0.6)
    # A stay's plan reads as a pack of the stored history.
    stay = turns[codes.index("stayed", codes.index("moved"))]
    assert stay.pack.dropped and all(p >= stay.pack.kept_history[0] for p in stay.pack.kept_history)
    assert stay.turn is not None and stay.turn.index_reason in (None, "prefix")
    assert stored == await _plain_history(runs, 250)
    # Newest first: once the history overflows, no turn extends the previous request.
    base_turns, base_model, _ = await _callback_runs(runs, budget, None, answer_words=250)
    assert all(t.prefix is None for t in base_turns)
    base = [list(c.input) for c in base_model.calls]
    extended = sum(_extends(base[n - 1], base[n]) for n in range(1, len(base)))
    cached = sum(_extends(requests[n - 1], requests[n]) for n in range(1, len(requests)))
    assert cached >= extended + 5, (cached, extended)


async def test_a_move_masks_older_tool_outputs_and_the_stays_resend_the_same_copies() -> None:
    """Issue 34 #6: a move masks the tool outputs older than the newest ``keep_recent``
    turns before it drops a turn; the turns after it send the same masked copies again,
    byte for byte, and none of them is stored. Without masking (drop only) the same budget
    shows fewer turns and calls."""
    runs = [[300, 300]] * 10
    budget = 4_000
    # Without a head: the default's head would keep the first turns' outputs as sent.
    policy = pp.CachePolicy(head=0.0)
    turns, model, stored = await _callback_runs(runs, budget, policy, answer_words=10)
    codes = [t.prefix for t in turns]
    moved = codes.index("moved")
    assert turns[moved].pack.masked and "tool outputs masked" in turns[moved].prefix_reason
    copies = [x["output"] for x in turns[moved].masked_items]
    assert all("masked by protoprompt" in c for c in copies)
    after = moved + 1
    assert codes[after] == "stayed"
    resent = [x["output"] for x in turns[after].masked_items]
    assert resent[: len(copies)] == copies and turns[after].pack.masked
    assert _extends(list(model.calls[moved].input), list(model.calls[after].input))
    assert not any("masked by protoprompt" in json.dumps(i) for i in stored)
    assert stored == await _plain_history(runs, 10)


def _visible(request: list[Any]) -> tuple[int, int]:
    users = sum(1 for i in request if i.get("role") == "user")
    calls = sum(1 for i in request if i.get("type") == "function_call")
    return users, calls


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.integers(20, 700), min_size=0, max_size=4), min_size=2, max_size=7),
    st.integers(2_500, 7_000),
    st.integers(5, 200),
)
def test_consecutive_turns_share_their_prefix(
    runs: list[list[int]], budget: int, answer_words: int
) -> None:
    """Issue 34 #8 over generated sessions and tool loops, whole SDK runs through
    ``run_config``'s default (both hooks, ``CachePolicy()``): every request fits and is
    sendable; a turn that kept its prefix sends the previous turn's request plus what was
    stored since, byte for byte; a model call that kept it, the previous call's plus what
    was appended; the stored history is what a session without hooks stores."""
    asyncio.run(_default_runs(runs, budget, answer_words))


async def _config_runs(
    name: str,
    runs: list[list[int]],
    budget: int,
    answer_words: int,
    pass_agent: bool = False,
    **options: Any,
) -> tuple[ScriptedModel, list[ContextPlan], list[ModelCallPlan], ProtoPromptSession]:
    """Runs through ``run_config`` (both hooks; ``options`` and, with ``pass_agent``, the
    agent passed to it) on a new session ``name``: the model (what each call received),
    the turn plans, the call plans and the session."""
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, answer_words))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=RESERVE)
    session = ProtoPromptSession(name)
    turns: list[ContextPlan] = []
    calls: list[ModelCallPlan] = []
    if pass_agent:
        options["agent"] = agent
    config = session.run_config(
        builder, on_plan=turns.append, on_call=calls.append, tracing_disabled=True, **options
    )
    for r in range(len(runs)):
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
    return model, turns, calls, session


async def _default_runs(runs: list[list[int]], budget: int, answer_words: int) -> None:
    model, turns, calls, session = await _config_runs(
        "prop", runs, budget, answer_words, oversized_output="truncate"
    )
    received = [list(c.input) for c in model.calls]
    assert len(calls) == len(received)
    for n, call in enumerate(model.calls):
        assert request_tokens(call) + RESERVE <= budget, f"call {n + 1}"
        assert_sendable(received[n])
        if n and calls[n].prefix == "stayed":
            assert _extends(received[n - 1], received[n]), f"call {n + 1}"
            event("call stayed")
    assert all(t.prefix is not None for t in turns), "run_config's default policy"
    for n in range(1, len(turns)):
        assert turns[n].used <= budget
        if turns[n].prefix == "stayed" and "the model's last request" in turns[n].prefix_reason:
            # The previous run's filter moved: the turn extends what the model last got.
            last = max(k for k, c in enumerate(calls) if c.turn_plan is turns[n - 1])
            assert _extends(received[last], turns[n].items), f"turn {n + 1}"
            event("turn continued the model's last request")
        elif turns[n].prefix == "stayed":
            assert _extends(turns[n - 1].items, turns[n].items), f"turn {n + 1}"
            event("turn stayed")
        elif turns[n].prefix == "moved":
            event("turn moved")
    assert await session.get_items() == await _plain_history(runs, answer_words)


def test_a_move_packs_lower_when_the_session_grew_fast_since_the_last_one() -> None:
    """Move sizing: a move packs to the policy's ``low_water`` unless the session grew so
    fast since the previous move that the headroom would not hold ``HEADROOM_TURNS`` more
    turns like those; then the mark is lowered in proportion, down to ``low_water -
    MARK_DROP`` (0.1; never below half of ``low_water``)."""
    from protoprompt.integrations._calls import _planner

    budget = 10_000
    planner = _planner.TurnPlanner(pp.CachePolicy(low_water=0.7))
    assert planner.mark(budget) == 0.7  # no move yet: the policy's mark
    planner.moved(7_000)
    for _ in range(5):
        planner.stayed()  # 3,000 tokens over 6 turns: 500 a turn, five of them fit in 30%
    assert planner.mark(budget) == pytest.approx(0.7)
    planner.moved(7_000)
    planner.stayed()  # 3,000 tokens over 2 turns: the headroom held one turn
    assert planner.mark(budget) == pytest.approx(0.6)  # 1 - 5 * 0.15, floored at 0.7 - 0.1
    planner.moved(7_000)
    for _ in range(3):
        planner.stayed()  # 750 a turn: 1 - 5 * 0.075
    assert planner.mark(budget) == pytest.approx(0.625)
    planner.moved(6_500)
    for _ in range(4):
        planner.stayed()  # 700 a turn: 1 - 5 * 0.07, between the floor and 0.7
    assert planner.mark(budget) == pytest.approx(0.65)
    planner.moved(None)  # packed newest first (no mark): as if no move yet
    assert planner.mark(budget) == 0.7
    low = _planner.TurnPlanner(pp.CachePolicy(low_water=0.15))
    low.moved(1_500)
    assert low.mark(budget) == pytest.approx(0.075)  # half of low_water, not 0.05


async def _callback_turns(
    runs: list[list[int]], budget: int, policy: pp.CachePolicy, answer_words: int
) -> tuple[list[ContextPlan], list[list[Any]], list[list[Any]], list[Any]]:
    """Runs through the session callback alone; its plans, what each run's first model
    call received, what each run stored, and the whole stored history."""
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, answer_words))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=RESERVE)
    session = ProtoPromptSession("cb-prop")
    turns: list[ContextPlan] = []
    callback = session.input_callback(builder, on_plan=turns.append, cache=policy)
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    stored: list[list[Any]] = []
    firsts: list[list[Any]] = []
    for r in range(len(runs)):
        n_calls, n_stored = len(model.calls), len(await session.get_items())
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
        firsts.append(list(model.calls[n_calls].input))
        stored.append((await session.get_items())[n_stored:])
    return turns, firsts, stored, await session.get_items()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.integers(50, 900), min_size=0, max_size=3), min_size=4, max_size=10),
    st.integers(2_500, 6_000),
    st.integers(5, 150),
    st.sampled_from([0.5, 0.7, 0.9]),
    st.sampled_from([0.0, None]),
)
def test_callback_requests_share_their_prefix_between_moves(
    runs: list[list[int]], budget: int, answer_words: int, low_water: float, head: float | None
) -> None:
    """Issue 34 #1, #8 through the session callback over generated tool loops: between
    moves each turn's request is the previous turn's, byte for byte, its masked copies
    included (the masked set stays with the cut: what was sent whole stays whole), then
    what the runs stored since and the new input; the cut moves only when that would not
    fit, and a move packs to at most the policy's mark; every request fits and is
    sendable, and the stored history is what a session without hooks stores. With the
    default head (``head=None``), a move that kept one repeats it byte for byte
    (``shared_tokens``) and may pack above the mark, within the budget."""
    asyncio.run(_callback_prefix_property(runs, budget, answer_words, low_water, head))


async def _callback_prefix_property(
    runs: list[list[int]], budget: int, answer_words: int, low_water: float, head: float | None
) -> None:
    policy = pp.CachePolicy(low_water=low_water, head=head)
    turns, firsts, stored, history = await _callback_turns(runs, budget, policy, answer_words)
    assert len(turns) == len(runs)
    for n, turn in enumerate(turns):
        assert turn.used <= budget, f"turn {n + 1}"
        assert firsts[n] == turn.items, f"turn {n + 1}: the run sent the callback's request"
        assert_sendable(firsts[n])
        if n == 0:
            assert turn.prefix == "set"
            continue
        prev = turns[n - 1]
        # The previous request, then what the previous run stored after its input, then
        # this run's input: the candidate a stay sends.
        appended = stored[n - 1][1:]
        wanted = prev.request_tokens + sum(pp.item_tokens(i).total for i in appended)
        if turn.prefix == "stayed":
            event("turn stayed")
            assert _extends(prev.items, turn.items), f"turn {n + 1}"
            assert [json.dumps(x) for x in turn.masked_items[: len(prev.masked_items)]] == [
                json.dumps(x) for x in prev.masked_items
            ], f"turn {n + 1}: the masked copies changed between moves"
            if prev.masked_items:
                event("masked copies resent")
            assert turn.items[len(prev.items) : len(prev.items) + len(appended)] == appended
            assert turn.shared_tokens == prev.request_tokens
        else:
            assert turn.prefix == "moved", (n, turn.prefix, turn.prefix_reason)
            event("turn moved")
            # It moved because the candidate (with this run's input) did not fit.
            new_input = pp.item_tokens(turn.items[-1]).total
            assert wanted + new_input + RESERVE > budget, (n, wanted, turn.prefix_reason)
            kept = _head_of(turn.prefix_reason)
            if kept is not None:
                event("turn kept the head")
                assert head is None and turn.shared_tokens == kept[1] > 0, turn.prefix_reason
                assert _common(prev.items, turn.items) >= kept[0], turn.prefix_reason
            else:
                assert turn.used <= int(budget * low_water) + 1, turn.prefix_reason
                assert turn.shared_tokens == 0
    assert history == await _plain_history(runs, answer_words)


async def test_a_session_whose_turns_outgrow_the_headroom_moves_to_the_lowered_mark() -> None:
    """Through the callback: each run adds a fifth of the budget, so the 30% headroom of
    the first move holds one turn; the next moves pack to 60% of the budget and say so,
    and the turns between them extend the request byte for byte."""
    budget = 3_000
    policy = pp.CachePolicy(low_water=0.7, head=0.0)
    turns, _, stored = await _callback_runs([[600]] * 12, budget, policy, answer_words=20)
    codes = [t.prefix for t in turns]
    moves = [n for n, c in enumerate(codes) if c == "moved"]
    assert len(moves) >= 3, codes
    assert "packed to" not in turns[moves[0]].prefix_reason  # nothing measured yet
    assert turns[moves[0]].used <= int(budget * 0.7)
    for n in moves[1:]:
        reason = turns[n].prefix_reason
        assert "packed to 60% of the budget: the session grew fast" in reason, reason
        assert turns[n].used <= int(budget * 0.6)
    for n, code in enumerate(codes):
        assert turns[n].used <= budget
        if code == "stayed":
            assert _extends(turns[n - 1].items, turns[n].items), f"turn {n + 1}"
    assert stored == await _plain_history([[600]] * 12, 20)


async def test_a_callback_made_for_each_run_continues_the_previous_runs_prefix() -> None:
    """``session.run_config(...)`` (or ``input_callback``) called inside each run, as a
    request handler does: the session object keeps the callback's prefix per policy and
    budget, so the next run's callback extends the request the previous one sent instead
    of packing afresh; another budget keeps its own."""
    runs = [[300]] * 10
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, 50))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    session = ProtoPromptSession("per-run")
    turns: list[ContextPlan] = []
    for r in range(len(runs)):
        builder = TokenBudgetedContextBuilder(None, max_tokens=3_000, output_reserve=RESERVE)
        callback = session.input_callback(builder, on_plan=turns.append, cache=pp.CachePolicy())
        config = RunConfig(session_input_callback=callback, tracing_disabled=True)
        await Runner.run(agent, f"question {r}", session=session, run_config=config)
    codes = [t.prefix for t in turns]
    assert codes[0] == "set" and codes.count("stayed") >= 6 and "moved" in codes, codes
    for n in range(1, len(turns)):
        if codes[n] == "stayed":
            assert _extends(turns[n - 1].items, turns[n].items), f"turn {n + 1}"
    other = TokenBudgetedContextBuilder(None, max_tokens=2_500, output_reserve=RESERVE)
    plans: list[ContextPlan] = []
    callback = session.input_callback(other, on_plan=plans.append, cache=pp.CachePolicy())
    await callback(await session.get_items(), [{"role": "user", "content": "and now?"}])
    assert plans[-1].prefix == "set"  # another budget: a prefix of its own


async def test_a_lowered_mark_that_would_send_no_history_packs_to_the_policys() -> None:
    """Turns so large against the budget that the cut moves at every turn: the lowered
    mark (60%) would leave no room for the newest turn even masked, so the move packs to
    the policy's ``low_water`` instead and still sends history (without the guard, these
    moves sent none)."""
    budget = 1_200
    policy = pp.CachePolicy(low_water=0.7, head=0.0)
    turns, _, _ = await _callback_runs([[100, 50]] * 8, budget, policy, answer_words=150)
    codes = [t.prefix for t in turns]
    assert ["moved", "moved"] in [codes[n : n + 2] for n in range(len(codes))], codes
    for turn in turns[1:]:
        if turn.prefix == "moved":
            assert turn.pack.kept_history, turn.prefix_reason
            assert "packed to" not in turn.prefix_reason
            assert turn.used <= int(budget * 0.7)


async def test_a_turn_after_a_run_whose_filter_moved_continues_the_models_last_request() -> None:
    """Issue 34 #1/#2: a run whose tool loop outgrows the budget moves the filter's cut (and
    masks older outputs) within the run; the next turn's callback would not fit its own
    previous request plus that run, so it continues the request the model received last
    (its masked copies as sent) instead of moving a second time, and the next run's first
    model call extends that request byte for byte. Newest first never does."""
    runs = [[20, 20], [57, 190, 700, 700], [60], [60]]
    budget = 2_500
    model, turns, calls, session = await _config_runs("adopt", runs, budget, 20)
    received = [list(c.input) for c in model.calls]
    run_of = [next(n for n, t in enumerate(turns) if t is c.turn_plan) for c in calls]
    assert any(c.prefix == "moved" for c, r in zip(calls, run_of, strict=True) if r == 1)
    turn = turns[2]
    assert turn.prefix == "stayed", turn.prefix_reason
    assert "extends the model's last request" in turn.prefix_reason
    last = max(k for k, r in enumerate(run_of) if r == 1)
    assert _extends(received[last], turn.items)
    assert 0 < turn.shared_tokens <= calls[last].request_tokens
    masked = [x for x in received[last] if "masked by protoprompt" in json.dumps(x)]
    assert masked and all(any(_same(m, x) for x in turn.items) for m in masked)
    first = run_of.index(2)
    assert calls[first].prefix == "stayed", calls[first].prefix_reason
    assert _extends(received[last], received[first])
    for n, call in enumerate(model.calls):
        assert request_tokens(call) + RESERVE <= budget, f"call {n + 1}"
        assert_sendable(received[n])
    assert await session.get_items() == await _plain_history(runs, 20)


async def test_the_callbacks_copies_are_digested_only_when_the_filter_packs_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The callback hands the filter its masked copies' digests unread: a run whose calls
    all extend a request the filter already holds never digests them (the fast path,
    asserted taken); a run whose filter sets or moves its prefix does, and records them."""
    from protoprompt.integrations._calls import _planner

    made: list[_planner.CopyDigests] = []
    original = _planner.TurnPrefix.copy_digests

    def spy(self: _planner.TurnPrefix) -> _planner.CopyDigests:
        found = original(self)
        made.append(found)
        return found

    monkeypatch.setattr(_planner.TurnPrefix, "copy_digests", spy)
    runs = [[20, 20], [57, 190, 700, 700], [60], [60], [40]]
    _, turns, calls, _ = await _config_runs("lazy", runs, 2_500, 20)
    run_of = [next(n for n, t in enumerate(turns) if t is c.turn_plan) for c in calls]
    packed = [
        any(c.prefix in ("set", "moved") for c, r in zip(calls, run_of, strict=True) if r == n)
        for n in range(len(runs))
    ]
    assert len(made) == len(runs)
    assert [d.computed for d in made] == packed
    assert not all(packed) and any(packed[1:]), [c.prefix for c in calls]


def _digest(item: Any) -> bytes:
    from protoprompt import _core

    found, _ = _core.digests([item], None)
    return bytes(found[:16])


def _adopt_case() -> tuple[list[Any], Any, dict[str, Any], dict[str, Any]]:
    """A stored history and the request a filter sent last: its context message, the
    history from position 2 on with position 4 left out and position 6's output masked, a
    recall message, then the run's input and steps."""
    from protoprompt.integrations._calls import _planner

    history: list[Any] = [{"role": "user", "content": f"q{n}"} for n in range(3)]
    history += [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c2", "output": "long " * 50},
        {"role": "user", "content": "now"},
        {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c3", "output": "x"},
        {"type": "message", "role": "assistant", "content": "done"},
    ]
    context = {"role": "developer", "content": "profile"}
    recall = {"role": "developer", "content": "recalled"}
    copy = {"type": "function_call_output", "call_id": "c2", "output": "[masked by protoprompt]"}
    items = [context, history[2], history[3], history[5], copy, recall, *history[7:10]]
    request = _planner.RunPrefix(
        items, 9, 500, (0, 0, 0, (), b""), 2, [0, 5, 6], {4: _digest(history[6])}
    )
    return history, request, copy, context


def test_adopt_finds_the_models_last_request_in_the_stored_history() -> None:
    """``_planner.adopt``: each item of the request that stands for a stored one is found
    by content (a copy by the digest of the item it stands for), in order, the ones left
    out skipped; the callback's own messages are not history; the prefix ends after the
    last one found, so what follows (the answer) is appended."""
    from protoprompt.integrations._calls import _planner
    from protoprompt.integrations._turns._context import context_key

    def own(item: Any) -> bool:
        return context_key(item) is not None

    history, request, copy, _ = _adopt_case()
    found = _planner.adopt(request, history, 10, own)
    assert found is not None
    assert found.kept == [12, 13, 15, 16, 17, 18, 19]
    assert found.end == 20 and found.cut == 12
    assert found.sent[3] is copy and found.masked == [copy]
    assert found.context == "profile"
    assert found.leading == 4  # the recall message breaks the repeated part
    assert found.originals == b"".join(_digest(history[p - 10]) for p in found.kept)
    cand = _planner.turn_candidate(found, history, 10)
    assert cand is not None and cand[0][-1] is history[-1] and cand[1] == 1


def test_adopt_refuses_a_request_the_history_does_not_hold() -> None:
    """A stored item changed since it was sent (its copy's original, or an item sent
    whole), an item the history never held, or an empty history: no prefix to continue."""
    from protoprompt.integrations._calls import _planner
    from protoprompt.integrations._turns._context import context_key

    def own(item: Any) -> bool:
        return context_key(item) is not None

    history, request, _, _ = _adopt_case()
    edited = [*history]
    edited[6] = {**history[6], "output": "other"}
    assert _planner.adopt(request, edited, 0, own) is None
    edited = [*history]
    edited[5] = {**history[5], "arguments": '{"a": 1}'}
    assert _planner.adopt(request, edited, 0, own) is None
    # A copy that claims a stored item's digest but is not of its kind and call (a
    # damaged or foreign stored request) is not sent in its place.
    forged = dict(request.items[4], call_id="c3")
    items = [*request.items[:4], forged, *request.items[5:]]
    assert _planner.adopt(dataclasses.replace(request, items=items), history, 0, own) is None
    forged = {"role": "user", "content": "injected"}
    items = [*request.items[:4], forged, *request.items[5:]]
    assert _planner.adopt(dataclasses.replace(request, items=items), history, 0, own) is None
    foreign = dataclasses.replace(request, items=[*request.items, {"role": "user", "content": "?"}])
    assert _planner.adopt(foreign, history, 0, own) is None
    assert _planner.adopt(request, [], 0, own) is None
    # The search stops after ADOPT_SCAN positions beyond four per item.
    padded = [*history[:7], *([{"role": "user", "content": "pad"}] * 5000), *history[7:]]
    assert _planner.adopt(request, padded, 0, own) is None
    near = [*history[:7], *([{"role": "user", "content": "pad"}] * 50), *history[7:]]
    assert _planner.adopt(request, near, 0, own) is not None


def test_the_stored_request_keeps_its_copies_and_refuses_damaged_ones() -> None:
    """The filter's stored request (``_prefix_state``) keeps which items are copies and the
    digest of the item each stands for; a damaged copies field makes the record ignored."""
    from protoprompt.integrations._stores import _prefix_state

    _, request, _, _ = _adopt_case()
    bound = ["db", "messages", "s"]
    data = _prefix_state.encode(request, bound)
    assert data is not None
    back = _prefix_state.decode(data, bound)
    assert back is not None and back.copies == request.copies and back.items == request.items
    raw = json.loads(zlib.decompress(data))
    for bad in ({"4": "zz"}, {"99": "00" * 16}, {"4": "00" * 8}, {"x": "00" * 16}, [], None):
        raw["copies"] = bad
        damaged = zlib.compress(json.dumps(raw).encode())
        assert _prefix_state.decode(damaged, bound) is None, bad


async def test_another_worker_continues_the_models_last_request(tmp_path: Any) -> None:
    """Issue 34 #4: the request the model last received is stored beside the history, so a
    second session object on the same database (another worker, a restarted process)
    continues it at its next turn rather than moving the cut a second time."""
    runs = [[20, 20], [57, 190, 700, 700], [60]]
    budget = 2_500
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, 20))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    db = str(tmp_path / "s.db")

    def config(session: ProtoPromptSession, turns: list[Any], calls: list[Any]) -> Any:
        builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=RESERVE)
        return session.run_config(
            builder, on_plan=turns.append, on_call=calls.append, tracing_disabled=True
        )

    first = ProtoPromptSession("w", db)
    turns: list[ContextPlan] = []
    calls: list[ModelCallPlan] = []
    cfg = config(first, turns, calls)
    for r in range(2):
        await Runner.run(agent, f"question {r}", session=first, run_config=cfg)
    assert calls[-1].prefix == "moved", calls[-1].prefix_reason
    first.close()  # waits for the stored request
    second = ProtoPromptSession("w", db)
    turns2: list[ContextPlan] = []
    calls2: list[ModelCallPlan] = []
    await Runner.run(agent, "question 2", session=second, run_config=config(second, turns2, calls2))
    assert turns2[0].prefix == "stayed", turns2[0].prefix_reason
    assert "extends the model's last request" in turns2[0].prefix_reason
    assert calls2[0].prefix == "stayed", calls2[0].prefix_reason
    received = [list(c.input) for c in model.calls]
    assert _extends(received[len(calls) - 1], received[len(calls)])
    second.close()


# ---------------------------------------------------------------- a move that keeps the head

_HEAD = re.compile(r"kept the head \(([\d,]+) (?:history )?items as sent, ([\d,]+) tokens")


def _head_of(reason: str) -> tuple[int, int] | None:
    """``(items, tokens repeated)`` a move's reason says it kept as its head."""
    found = _HEAD.search(reason)
    if found is None:
        return None
    return int(found[1].replace(",", "")), int(found[2].replace(",", ""))


def _common(prev: list[Any], cur: list[Any]) -> int:
    """Leading items ``cur`` repeats from ``prev``, byte for byte (as JSON)."""
    n = 0
    for a, b in zip(prev, cur, strict=False):
        if not _same(a, b):
            break
        n += 1
    return n


def test_head_end_keeps_whole_units_within_the_limit() -> None:
    """A head is whole atomic units from its start, as many as cost at most the limit: a
    call is never kept without its output."""
    from protoprompt.integrations._calls import _planner

    items = [
        {"role": "user", "content": "question " + "word " * 40},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "data " * 200},
        {"role": "assistant", "content": "answer"},
    ]
    cost = [pp.item_tokens(i).total for i in items]
    assert _planner.head_end(items, 0, 4, sum(cost), None) == 4
    assert _planner.head_end(items, 0, 4, cost[0] + cost[1], None) == 1  # not the call alone
    assert _planner.head_end(items, 0, 4, sum(cost[:3]), None) == 3
    assert _planner.head_end(items, 0, 2, sum(cost), None) == 1  # stop inside the unit
    assert _planner.head_end(items, 0, 4, cost[0] - 1, None) == 0
    assert _planner.head_end(items, 1, 4, sum(cost), None) == 4
    assert _planner.head_end(items, 0, 4, 0, None) == 0


async def test_a_first_runs_move_keeps_a_head_that_starts_at_its_input() -> None:
    """A session's first run (no history, no context message: the request starts with the
    run's pinned input) that outgrows the budget: with the default policy the move keeps
    the head from the run's input on -- the question and the first steps, as sent -- and
    repeats it (``shared_tokens``); without a head it repeats nothing."""
    runs = [[500] * 8]  # within the SDK's 10 model calls a run
    budget = 4_000
    received, calls, _turns, stored = await _head_runs(runs, budget, pp.CachePolicy())
    moves = [n for n, c in enumerate(calls) if c.prefix == "moved"]
    assert moves, [c.prefix_reason for c in calls]
    n = moves[0]
    k, shared = _head_of(calls[n].prefix_reason) or (0, 0)
    assert k > 1 and calls[n].shared_tokens == shared > 0, calls[n].prefix_reason
    assert _common(received[n - 1], received[n]) >= k
    assert received[n][0] == {"content": "question 0", "role": "user"}
    assert stored == await _plain_history(runs, 20)
    _, base_calls, _, _ = await _head_runs(runs, budget, pp.CachePolicy(head=0.0))
    assert all(c.shared_tokens == 0 for c in base_calls if c.prefix == "moved")


async def test_a_filter_move_that_keeps_the_head_repeats_it_byte_for_byte() -> None:
    """``CachePolicy(head=...)`` on a tool loop that outgrows the budget several times
    within runs: a move keeps the previous request's head (its first items as sent) and
    drops the oldest steps after it, so the moved request repeats that head byte for byte
    (``shared_tokens`` says how much) and the next moves keep the same head; every request
    fits and is sendable, every stay extends the previous request, and nothing the filter
    made is stored. Without ``head`` the same moves repeat nothing."""
    runs = [[150] * 3] + [[250] * 8] * 3
    budget = 4_000
    received, calls, _turns, stored = await _head_runs(runs, budget, pp.CachePolicy(head=0.35))
    heads = []
    for n, call in enumerate(calls):
        assert_sendable(received[n])  # and it fits: _head_runs
        if n and call.prefix == "stayed":
            assert _extends(received[n - 1], received[n]), f"call {n + 1}"
        head = _head_of(call.prefix_reason) if call.prefix == "moved" else None
        if head is not None:
            k, shared = head
            assert _common(received[n - 1], received[n]) >= k, f"call {n + 1}"
            assert call.shared_tokens == shared > 0
            heads.append([json.dumps(x, sort_keys=True) for x in received[n][:k]])
    assert len(heads) >= 3, [c.prefix_reason for c in calls]
    # The head stays: each later move's head starts with the first one's.
    first = min(len(h) for h in heads)
    assert all(h[:first] == heads[0][:first] for h in heads)
    assert stored == await _plain_history(runs, 20)
    base, base_calls, _, _ = await _head_runs(runs, budget, pp.CachePolicy(head=0.0))
    for n, call in enumerate(base_calls):
        if call.prefix == "moved":
            assert call.shared_tokens == 0 and _head_of(call.prefix_reason) is None


async def _head_runs(
    runs: list[list[int]], budget: int, policy: pp.CachePolicy
) -> tuple[list[list[Any]], list[ModelCallPlan], list[ContextPlan], list[Any]]:
    """Whole SDK runs through ``run_config`` with ``policy``: what each model call received,
    the filter's and the callback's plans, and the stored history."""
    model, turns, calls, session = await _config_runs(
        "head", runs, budget, 20, pass_agent=True, cache=policy
    )
    received = [list(c.input) for c in model.calls]
    assert len(calls) == len(received)
    for n, c in enumerate(model.calls):
        assert request_tokens(c) + RESERVE <= budget, f"call {n + 1}"
    return received, calls, turns, await session.get_items()


async def test_a_callback_move_that_keeps_the_head_resends_its_masked_copies() -> None:
    """Through the session callback alone: a session whose history already overflows
    starts the policy with a pack to the mark that masks the older tool outputs; a later
    turn that does not fit keeps that request's head -- its masked copies included, byte
    for byte -- and drops the oldest turns after it. The plan reads as a pack of the
    stored history (the head's copies ``"masked"``, the dropped middle not kept), every
    request fits and is sendable, and the stored history is what a session without hooks
    stores."""
    runs = [[300, 300]] * 16
    budget = 4_000
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, 10))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    builder = TokenBudgetedContextBuilder(None, max_tokens=budget, output_reserve=RESERVE)
    session = ProtoPromptSession("head-cb")
    turns: list[ContextPlan] = []
    plain = RunConfig(tracing_disabled=True)
    policy = pp.CachePolicy(head=0.3)
    callback = session.input_callback(builder, on_plan=turns.append, cache=policy)
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    first = 6  # stored without a budget: the policy starts on an overflowing history
    for r in range(len(runs)):
        run_config = plain if r < first else config
        await Runner.run(agent, f"question {r}", session=session, run_config=run_config)
    stored = await session.get_items()
    requests = [list(c.input) for c in model.calls[first * 3 :]][::3]
    assert turns[0].prefix == "set" and turns[0].masked_items
    headed = [n for n, t in enumerate(turns) if n and _head_of(t.prefix_reason) is not None]
    assert len(headed) >= 2, [t.prefix_reason for t in turns]
    masked_head = 0
    for n in headed:
        k, shared = _head_of(turns[n].prefix_reason)  # type: ignore[misc]
        prev, cur = turns[n - 1], turns[n]
        assert cur.prefix == "moved" and _common(prev.items, cur.items) >= k, f"turn {n + 1}"
        assert cur.shared_tokens == shared > 0
        copies = {json.dumps(x, sort_keys=True) for x in prev.masked_items}
        in_head = [json.dumps(x, sort_keys=True) in copies for x in cur.items[:k]]
        masked_head += sum(in_head)
        kept = cur.pack.kept_history
        assert kept[:k] == prev.pack.kept_history[:k]
        masked = set(cur.pack.masked)
        assert {kept[i] for i in range(k) if in_head[i]} <= masked
        gap = [p for p in range(kept[k - 1] + 1, kept[-1]) if p not in set(kept)]
        dropped = {p for d in cur.pack.decisions if not d.kept for p in d.positions}
        assert gap and set(gap) <= dropped | set(cur.pack.omitted_reasoning), f"turn {n + 1}"
    assert masked_head, "a head that holds masked copies resends them as they were"
    for n, turn in enumerate(turns):
        assert turn.used <= budget and turn.items == requests[n], f"turn {n + 1}"
        assert_sendable(requests[n])
        if n and turn.prefix == "stayed":
            assert _extends(turns[n - 1].items, turn.items), f"turn {n + 1}"
    assert not any("masked by protoprompt" in json.dumps(i) for i in stored)
    assert stored == await _plain_history(runs, 10)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(st.integers(20, 700), min_size=0, max_size=5), min_size=2, max_size=7),
    st.integers(2_500, 7_000),
    st.integers(5, 200),
    st.sampled_from([0.15, 0.3, 0.5]),
)
def test_requests_that_keep_a_head_fit_and_repeat_it(
    runs: list[list[int]], budget: int, answer_words: int, head: float
) -> None:
    """``CachePolicy(head=...)`` over generated sessions and tool loops, whole SDK runs
    through ``run_config`` (both hooks): every request fits and is sendable; a call that
    kept its prefix extends the previous one; a move that kept a head repeats the previous
    request's first items byte for byte; the stored history is what a session without
    hooks stores."""
    asyncio.run(_head_property(runs, budget, answer_words, head))


async def _head_property(
    runs: list[list[int]], budget: int, answer_words: int, head: float
) -> None:
    model, turns, calls, session = await _config_runs(
        "head-prop",
        runs,
        budget,
        answer_words,
        cache=pp.CachePolicy(head=head),
        oversized_output="truncate",
    )
    received = [list(c.input) for c in model.calls]
    for n, call in enumerate(model.calls):
        assert request_tokens(call) + RESERVE <= budget, f"call {n + 1}"
        assert_sendable(received[n])
        if n and calls[n].prefix == "stayed":
            assert _extends(received[n - 1], received[n]), f"call {n + 1}"
        found = _head_of(calls[n].prefix_reason) if calls[n].prefix == "moved" else None
        if found is not None:
            event("a call kept the head")
            assert _common(received[n - 1], received[n]) >= found[0], f"call {n + 1}"
    for n in range(1, len(turns)):
        assert turns[n].used <= budget
        found = _head_of(turns[n].prefix_reason) if turns[n].prefix == "moved" else None
        if found is not None:
            event("a turn kept the head")
            assert _common(turns[n - 1].items, turns[n].items) >= found[0], f"turn {n + 1}"
    assert await session.get_items() == await _plain_history(runs, answer_words)
