"""Earlier turns' reasoning left out of masked units (``Masking(omit_reasoning=True)``,
``CachePolicy(omit_reasoning=True)``, the session's default): the request stays valid for
the item graph and the SDK's orphan pass, the units' calls and messages lose their ``id``
(no "provided without its required 'reasoning' item" 400), the current turn's tool loop and
Claude's thinking keep theirs, and the caller's items never change."""

from __future__ import annotations

import copy

import pytest

import protoprompt as pp

items_mod = pytest.importorskip("agents.run_internal.items")
drop_orphan_function_calls = items_mod.drop_orphan_function_calls

BLOB = "gAAAA" + "x" * 4_000


def turn(t: int, *, claude: bool = False, computer: bool = False) -> list[dict]:
    reasoning: dict = {
        "type": "reasoning",
        "id": f"rs_{t}",
        "summary": [],
        "encrypted_content": BLOB,
    }
    if claude:
        reasoning = {
            "type": "reasoning",
            "id": "__fake_id__",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "think " * 400}],
            "encrypted_content": "sig",
            "provider_data": {
                "thinking_blocks": [
                    {"type": "thinking", "thinking": "think " * 400, "signature": "sig"}
                ]
            },
        }
    call: dict = {
        "type": "function_call",
        "id": f"fc_{t}",
        "call_id": f"c{t}",
        "name": "f",
        "arguments": "{}",
    }
    output: dict = {"type": "function_call_output", "call_id": f"c{t}", "output": "row " * 500}
    if computer:
        call = {
            "type": "computer_call",
            "id": f"cu_{t}",
            "call_id": f"c{t}",
            "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
            "pending_safety_checks": [],
            "status": "completed",
        }
        output = {
            "type": "computer_call_output",
            "call_id": f"c{t}",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AAAA"},
        }
    return [
        {"role": "user", "content": f"question {t}"},
        reasoning,
        call,
        output,
        {"type": "reasoning", "id": f"rs_{t}b", "summary": [], "encrypted_content": BLOB},
        {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{t}",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"answer {t}", "annotations": []}],
        },
    ]


FOLLOWERS = (
    "function_call",
    "custom_tool_call",
    "shell_call",
    "apply_patch_call",
    "tool_search_call",
)


def check_valid(r: pp.PackResult, new_input: list[dict], history: list[dict]) -> None:
    """The request is what the SDK would send: its orphan pass removes nothing, every unit
    of it is valid for protoprompt's graph, and no item of a unit whose reasoning was left
    out keeps its server id."""
    sent = list(r.items)
    n = len(r.kept_history)
    assert drop_orphan_function_calls(list(sent), pruning_indexes=set(range(n))) == sent
    assert drop_orphan_function_calls(list(sent)) == sent
    assert all(u.valid for u in pp.analyze(sent[:n], new_input).units)
    # Counted exactly as sent: left-out reasoning at 0, id-less copies without their id.
    assert sum(pp.item_tokens(i).total for i in sent) == r.request_tokens
    omitted = set(r.omitted_reasoning)
    for d in r.decisions:
        if not omitted & set(d.positions):
            continue
        assert d.decision == "masked"
        for p in d.positions:
            if p in omitted:
                continue
            item = sent[r.kept_history.index(p)]
            kind = history[p].get("type")
            if kind in FOLLOWERS or (kind == "message" and history[p].get("role") == "assistant"):
                assert "id" not in item, item


def test_earlier_reasoning_is_left_out_and_ids_stripped() -> None:
    history = [i for t in range(5) for i in turn(t)]
    before = copy.deepcopy(history)
    new_input = [{"role": "user", "content": "next"}]
    plain = pp.pack(history, new_input, 6_000, model="gpt-5", masking=pp.Masking(after_turns=1))
    r = pp.pack(
        history,
        new_input,
        6_000,
        model="gpt-5",
        masking=pp.Masking(after_turns=1, omit_reasoning=True),
    )
    assert history == before  # the caller's items never change
    reasoning = [p for p, i in enumerate(history) if i.get("type") == "reasoning"]
    newest = reasoning[-2:]  # the newest turn stays whole (after_turns=1)
    assert r.omitted_reasoning == reasoning[:-2]
    assert not set(r.omitted_reasoning) & set(r.kept_history)
    assert set(newest) <= set(r.kept_history)
    by_position = dict(zip(r.kept_history, r.items, strict=False))
    for p in r.kept_history:
        item, original = by_position[p], history[p]
        if p < len(history) - 6 and original.get("type") in ("function_call", "message"):
            assert p in r.masked
            assert item == {k: v for k, v in original.items() if k != "id"}
        if p >= len(history) - 6:
            assert item is original

    # Omitting reasoning keeps more turns in the same budget.
    def users(res: pp.PackResult) -> int:
        return sum(1 for p in res.kept_history if history[p].get("role") == "user")

    assert users(r) == 5 > users(plain)
    assert r.used <= 6_000
    check_valid(r, new_input, history)
    assert "earlier reasoning items left out" in r.explain()
    assert f"{len(r.omitted_reasoning)} earlier reasoning items left out" in r.explain()


def test_the_current_turns_tool_loop_keeps_its_reasoning() -> None:
    history = [i for t in range(3) for i in turn(t)]
    # The current turn: user, reasoning, call, output, reasoning, call; its new input the
    # second call's output (a model call inside a run).
    current = turn(9)[:4] + [
        {"type": "reasoning", "id": "rs_9c", "summary": [], "encrypted_content": BLOB},
        {"type": "function_call", "id": "fc_9c", "call_id": "c9c", "name": "f", "arguments": "{}"},
    ]
    new_input = [{"type": "function_call_output", "call_id": "c9c", "output": "done"}]
    r = pp.pack(
        history + current,
        new_input,
        4_000,
        model="gpt-5",
        masking=pp.Masking(after_turns=0, omit_reasoning=True),
    )
    start = len(history)
    history = history + current
    assert all(p < start for p in r.omitted_reasoning)
    for p in range(start, start + len(current)):
        if p in r.kept_history:
            item = r.items[r.kept_history.index(p)]
            assert item.get("id") == current[p - start].get("id")
    check_valid(r, new_input, history)


def test_claude_thinking_and_units_needing_ids_keep_their_reasoning() -> None:
    history = turn(0, claude=True) + turn(1, computer=True) + turn(2) + turn(3)
    new_input = [{"role": "user", "content": "next"}]
    r = pp.pack(
        history,
        new_input,
        100_000,
        model="gpt-5",
        masking=pp.Masking(after_turns=0, omit_reasoning=True),
    )
    omitted = set(r.omitted_reasoning)
    assert 1 not in omitted  # Claude's thinking (provider_data) is always sent
    assert 7 not in omitted  # its unit has a computer call, whose id is required
    # Plain OpenAI reasoning of earlier turns, the answers' included.
    assert omitted == {4, 10, 13, 16, 19, 22}
    computer = r.items[r.kept_history.index(8)]
    assert computer["id"] == "cu_1"
    check_valid(r, new_input, history)


def test_off_by_default_for_masking_and_on_for_the_cache_policy() -> None:
    assert pp.Masking().omit_reasoning is False
    assert pp.CachePolicy().omit_reasoning is True
    with pytest.raises(TypeError, match="omit_reasoning"):
        pp.Masking(omit_reasoning=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="omit_reasoning"):
        pp.CachePolicy(omit_reasoning="yes")  # type: ignore[arg-type]
    history = [i for t in range(4) for i in turn(t)]
    r = pp.pack(
        history,
        [{"role": "user", "content": "x"}],
        3_000,
        model="gpt-5",
        masking=pp.Masking(after_turns=1),
    )
    assert r.omitted_reasoning == []
    assert all(i.get("id") == history[p].get("id") for p, i in zip(r.kept_history, r.items))


def test_session_callback_omits_on_a_move_and_never_stores_copies() -> None:
    import asyncio

    from protoprompt.integrations import ProtoPromptSession

    async def main() -> None:
        history = [i for t in range(8) for i in turn(t)]
        store = ProtoPromptSession("omit-reasoning")
        await store.add_items(copy.deepcopy(history))
        builder = pp.TokenBudgetedContextBuilder(None, max_tokens=8_000, model="gpt-5")
        plans: list = []
        callback = store.input_callback(builder, cache=pp.CachePolicy(), on_plan=plans.append)
        stored = await store.get_items()
        request = await callback(stored, [{"role": "user", "content": "next"}])
        assert plans[-1].pack.omitted_reasoning
        kept_ids = {i.get("id") for i in request}
        assert not {f"rs_{t}" for t in range(6)} & kept_ids
        assert not {f"fc_{t}" for t in range(6)} & kept_ids
        assert await store.get_items() == history  # nothing rewritten
        store.close()

    asyncio.run(main())


@pytest.mark.parametrize("mix", ["chat", "tools", "agentic"])
@pytest.mark.parametrize("share", [0.05, 0.2])
@pytest.mark.parametrize("seed", [3, 11])
def test_generated_histories_stay_valid_with_reasoning_left_out(
    mix: str, share: float, seed: int
) -> None:
    """Every generated item shape: the request with earlier reasoning left out passes the
    SDK's orphan pass unchanged, every unit is valid, the budget holds, nothing after the
    last user message loses its reasoning, and no sent item keeps a server id whose
    reasoning was left out."""
    from history_gen import generate

    items = generate(1_200, mix, seed)
    last_user = max(p for p, i in enumerate(items) if i.get("role") == "user")
    history, new_input = items[:last_user], items[last_user : last_user + 1]
    before = copy.deepcopy(history)
    budget = max(int(sum(pp.item_tokens(i).total for i in history) * share), 4_000)
    r = pp.pack(
        history,
        new_input,
        budget,
        encoding="o200k_base",
        masking=pp.Masking(after_turns=1, omit_reasoning=True),
    )
    assert history == before
    assert r.used <= budget
    assert r.omitted_reasoning or mix == "chat"
    omitted = set(r.omitted_reasoning)
    assert all(history[p]["type"] == "reasoning" for p in omitted)
    assert all("provider_data" not in history[p] for p in omitted)
    check_valid(r, new_input, history)


def test_stays_resend_the_same_request_with_reasoning_left_out() -> None:
    """Under the stable prefix the reasoning left out moves only with the cut: the turns
    after a move send the moved request item for item (the same id-less copies, the same
    reasoning left out), then what was stored since."""
    import asyncio

    from protoprompt.integrations import ProtoPromptSession

    async def main() -> None:
        history = [i for t in range(8) for i in turn(t)]
        store = ProtoPromptSession("omit-stays")
        await store.add_items(copy.deepcopy(history))
        builder = pp.TokenBudgetedContextBuilder(None, max_tokens=12_000, model="gpt-5")
        plans: list = []
        callback = store.input_callback(builder, cache=pp.CachePolicy(), on_plan=plans.append)
        previous: list | None = None
        extended = 0
        for t in range(8, 11):
            stored = await store.get_items()
            request = await callback(stored, [{"role": "user", "content": f"question {t}"}])
            plan = plans[-1]
            if previous is not None and plan.prefix == "stayed":
                assert request[: len(previous)] == previous
                extended += 1
            previous = request
            answer = turn(t)[1:]
            answer = [{k: v for k, v in i.items() if k != "encrypted_content"} for i in answer]
            await store.add_items([{"role": "user", "content": f"question {t}"}, *answer])
        assert plans[0].prefix in ("set", "moved") and extended >= 1
        assert plans[0].pack.omitted_reasoning
        assert (await store.get_items())[: len(history)] == history
        store.close()

    asyncio.run(main())


def test_the_per_call_filter_never_leaves_out_the_runs_reasoning() -> None:
    """A tool loop through the per-call filter with ``cache=CachePolicy()``: every call that
    moves leaves earlier turns' reasoning out, and never the run's own (its steps follow the
    run's user message): each step's reasoning and call are sent with their ids."""
    import asyncio

    from agents import Agent
    from agents.run_config import CallModelData, ModelInputData
    from agents.tracing import agent_span

    from protoprompt.integrations import ProtoPromptSession

    history = [i for t in range(8) for i in turn(t)]
    run = [{"role": "user", "content": "question 9"}]
    inputs = []
    for s in range(4):
        run += [
            {"type": "reasoning", "id": f"rs_9_{s}", "summary": [], "encrypted_content": BLOB},
            {
                "type": "function_call",
                "id": f"fc_9_{s}",
                "call_id": f"c9_{s}",
                "name": "f",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": f"c9_{s}", "output": "row " * 300},
        ]
        inputs.append(history + list(run))
    plans: list = []
    builder = pp.TokenBudgetedContextBuilder(None, max_tokens=14_000, model="gpt-5")
    session = ProtoPromptSession("omit-filter")
    flt = session.model_input_filter(builder, on_call=plans.append, cache=pp.CachePolicy())
    agent = Agent(name="a", instructions="x")
    loop = asyncio.new_event_loop()
    span = agent_span(name="a")
    span.start(mark_as_current=True)
    sent = []
    try:
        for items in inputs:
            data = CallModelData(
                model_data=ModelInputData(input=copy.deepcopy(items), instructions="x"),
                agent=agent,
                context=None,
            )
            sent.append(loop.run_until_complete(flt(data)).input)
    finally:
        span.finish(reset_current=True)
        loop.close()
        session.close()
    assert any(p.pack.omitted_reasoning for p in plans)
    for request in sent:
        run_ids = {f"rs_9_{s}" for s in range(4)} | {f"fc_9_{s}" for s in range(4)}
        user = max(i for i, x in enumerate(request) if x.get("content") == "question 9")
        after = [
            i.get("id") for i in request[user + 1 :] if i.get("type") != "function_call_output"
        ]
        # Every reasoning and call of the run that is sent keeps its id, in pairs.
        assert set(after) <= run_ids
        assert len(after) % 2 == 0
        for a, b in zip(after[::2], after[1::2], strict=True):
            assert a.startswith("rs_9_") and b == "fc" + a[2:]
