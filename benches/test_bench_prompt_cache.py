"""The prompt cache (issue 34): consecutive requests of a session under budget pressure,
newest-first (``pp.HistoryIndex`` with ``pp.Masking()``) against the stable prefix
(``pp.plan_prefix``), on every generated mix at 128k and 32k (``benches/prompt_cache.py``).

Asserted on every mix and budget: each stable request fits the budget, and every call that
kept the prefix sends the previous request plus what was appended, byte for byte. The
issue's targets are asserted where the decision meets them (see ``TARGETS``); the table in
``benches/README.md`` has every number. The timed part is one warm call of each strategy on
the session's last history (reported as a ratio, not bound).
"""

from __future__ import annotations

import harness  # noqa: I001  (first: puts the benches' helper modules first)

harness.ensure_paths()

import prompt_cache as pc  # noqa: E402
import pytest  # noqa: E402
from history_gen import MIXES  # noqa: E402

TARGETS: dict[tuple[str, int], tuple[float, float, float]] = {
    # (mix, budget): (repeated prefix >=, cost vs uncached <=, user turns vs newest-first >=)
    **{(mix, 128_000): (0.80, 0.35, 0.8) for mix in MIXES},
    # At 32k the 30% headroom holds only a few of the agentic and tools mixes' steps: the
    # cut moves every 5-8 calls and the repeated prefix measured 74-79%, under the issue's
    # 80%; cost and visible turns meet their targets.
    **{(mix, 32_000): (0.70, 0.35, 0.8) for mix in MIXES},
}
"""The issue's targets where the decision meets them (measured: ``benches/README.md``)."""

_SIMULATED: dict[tuple[str, int], dict] = {}


def _simulated(mix: str, budget: int) -> dict:
    key = (mix, budget)
    if key not in _SIMULATED:
        _SIMULATED[key] = pc.simulate(pc.make_session(mix, budget))
    return _SIMULATED[key]


@pytest.mark.parametrize("budget", pc.BUDGETS, ids=[f"{b // 1000}k" for b in pc.BUDGETS])
@pytest.mark.parametrize("mix", MIXES)
def test_stable_prefix_repeats_what_newest_first_does_not(benchmark, results, mix, budget):
    import protoprompt

    row = _simulated(mix, budget)
    newest, stable = row["newest"], row["stable"]
    assert stable.calls == newest.calls > 0
    assert stable.max_tokens <= budget
    assert stable.broken == 0, "a call that kept the prefix did not extend the last request"
    assert stable.share >= newest.share
    want = TARGETS.get((mix, budget))
    if want is not None:
        share, cost, users = want
        assert stable.share >= share
        assert stable.cost_ratio <= cost
        assert stable.user_turns >= users * newest.user_turns

    session = pc.make_session(mix, budget, turns=1)
    history = session.history + session.turns[0][:-1]
    new_input = session.turns[0][-1:]
    if not pc.is_client(new_input[0]):
        new_input = [{"type": "message", "role": "user", "content": "and then?"}]
    first = protoprompt.plan_prefix(history, [], max_tokens=budget, encoding=harness.ENCODING)
    got = benchmark.pedantic(
        lambda: protoprompt.plan_prefix(
            history, new_input, max_tokens=budget, previous=first.state, encoding=harness.ENCODING
        ),
        rounds=3,
        iterations=1,
    )
    assert got.tokens <= budget
    results[("prompt_cache", (mix, budget))] = {
        "calls": stable.calls,
        "prefix_newest": round(newest.share, 3),
        "prefix_stable": round(stable.share, 3),
        "cost_newest": round(newest.cost_ratio, 3),
        "cost_stable": round(stable.cost_ratio, 3),
        "users_ratio": round(stable.user_turns / max(newest.user_turns, 1), 3),
        "moves": stable.moves,
    }


def test_whole_sdk_runs_through_the_session_meet_the_targets():
    """Issue 34 #7: whole ``Runner.run`` runs through ``session.run_config`` with the
    offline scripted model, at 128k and 32k: with ``pp.CachePolicy()`` every call that kept
    the prefix extends the previous request byte for byte, every request fits, and the
    issue's targets hold (measured: ``benches/README.md``)."""
    rows = pc.sdk_runs()
    for row in rows:
        newest, stable = row["newest"], row["stable"]
        assert stable.calls == newest.calls == pc.SDK_TURNS * (pc.SDK_STEPS + 1)
        assert stable.broken == 0, "a call that kept the prefix did not extend the last one"
        assert stable.max_tokens <= row["budget"]
        assert stable.share >= 0.80 > newest.share
        assert stable.cost_ratio <= 0.35
        assert stable.user_turns >= 0.8 * newest.user_turns


def test_default_masking_pays_against_drop_only():
    """Issue 34 item 6 on a long agentic session at 10% of its cost (66% of it reasoning),
    through the session callback, as ratios against drop-only measured in the same run
    (``benches/README.md``, "Masking against drop-only"). The default (``CachePolicy()``,
    ``keep_recent=1``: a move masks tool outputs older than the newest turn and leaves those
    units' reasoning out) shows the issue's 1.25x the user turns and 1.5x the tool calls
    (measured 1.77x / 1.72x with the default head); ``keep_recent=0`` shows a little more
    (1.82x / 1.77x) at the same repeated prefix, ``keep_recent=2`` less (1.59x / 1.57x).
    Without leaving reasoning out, masking pays nothing here (1.03x / 0.99x)."""
    rows = pc.masking_pays()
    base = rows["drop only"]
    default = rows["CachePolicy() (default)"]
    before = rows["CachePolicy(omit_reasoning=False)"]
    every = rows["CachePolicy(keep_recent=0)"]
    assert default.calls == base.calls == every.calls > 0
    assert default.user_turns >= 1.25 * base.user_turns
    assert default.tool_calls >= 1.5 * base.tool_calls
    assert every.user_turns >= default.user_turns
    assert every.tool_calls >= default.tool_calls
    # The newest turns kept whole cost visible turns: more of them show fewer.
    two, three = rows["CachePolicy(keep_recent=2)"], rows["CachePolicy(keep_recent=3)"]
    assert default.tool_calls > two.tool_calls >= three.tool_calls
    # Leaving reasoning out is what pays: the same policy without it shows no more.
    assert default.user_turns >= 1.25 * before.user_turns
    assert before.user_turns <= 1.05 * base.user_turns
    # The stable prefix still repeats and pays: cheaper than drop-only.
    assert default.share >= 0.75
    assert default.cost_ratio <= base.cost_ratio


CALLBACK_TARGETS = {
    ("chat", 128_000, False),
    ("chat", 128_000, True),
    ("tools", 128_000, False),
    ("tools", 128_000, True),
    ("chat", 32_000, False),
    ("chat", 32_000, True),
}
"""The callback rows (one request per turn; ``(mix, budget, memory)``) that meet the issue's
targets. The others do not by this measure (``benches/README.md``): every turn's request
holds the whole previous turn, which this table's previous request never sent (the run's
model calls did), so before any move the repeated prefix is at most 56% (32k agentic) to
93% (128k tools, 32k chat), and each move re-sends all but the head (with the default head:
32k agentic 73.5%, 32k tools 76.0%, 128k agentic 76.6%; 27.4%, 46.3% and 62.2% without
one)."""


@pytest.mark.parametrize("memory", [False, True], ids=["plain", "memory+recall"])
def test_turns_through_the_session_callback(memory):
    """Issue 34 #1 through ``ProtoPromptSession.input_callback``, every mix at 128k and
    32k, with and without a memory store and ``recall_evicted=True``: every turn that kept
    the prefix sends the previous turn's request plus what was stored since, byte for byte;
    every request fits; the stable prefix repeats at least what newest first does; the
    rows in ``CALLBACK_TARGETS`` meet the issue's targets."""
    for row in pc.callback_runs(memory=memory):
        newest, stable = row["newest"], row["stable"]
        mix = row["mix"].split(" ")[0]
        assert stable.calls == newest.calls == pc.SESSION_TURNS
        assert stable.broken == 0, f"{row['mix']}: a stay did not extend the last request"
        assert stable.max_tokens <= row["budget"]
        assert stable.share >= newest.share, row["mix"]
        if (mix, row["budget"], memory) in CALLBACK_TARGETS:
            assert stable.share >= 0.80
            assert stable.cost_ratio <= 0.35
            assert stable.user_turns >= 0.8 * newest.user_turns


MIX_SDK_TARGETS = {
    (mix, budget, memory)
    for mix in ("chat", "tools", "agentic")
    for budget in (128_000, 32_000)
    for memory in (False, True)
}
"""The whole-SDK-run rows (``(mix, budget, memory)``) that meet every one of the issue's
targets with the default policy: all of them. The two 32k agentic rows need the default head
(``CachePolicy(head=None)``: 0.4 of the budget at ``low_water=0.75``): 81.2% / 81.1% with
memory + recall, against 73.0% / 73.2% without a head (a call there appends 12% of the
budget, so every move re-sends most of the request; see
``test_the_default_head_is_what_brings_32k_agentic_to_80``)."""


@pytest.mark.parametrize("mix", MIXES)
def test_the_replay_script_runs_every_generated_call(mix):
    """Each turn of the replay is runnable: every function call it scripts has the generated
    output, a call that runs none is merged into the next, and each turn ends with an answer
    that runs nothing; every generated tool call is scripted (as itself or a function call)."""
    session = pc.make_session(mix, 32_000, turns=pc.MIX_TURNS)
    rep = pc.replay_script(session.turns)
    assert len(rep.inputs) == len(rep.steps) == pc.MIX_TURNS
    scripted = 0
    for steps in rep.steps:
        for k, step in enumerate(steps):
            calls = [o for o in step if o.type == "function_call"]
            scripted += len(calls)
            assert all(c.call_id in rep.outputs for c in calls)
            if k < len(steps) - 1:
                assert calls, "a step that runs no function would end the run"
            else:
                assert not calls and any(o.type == "message" for o in step)
    generated = sum(
        1
        for turn in session.turns
        for i in turn
        if i.get("type") in ("function_call", *pc._AS_FUNCTION)
        and (i.get("call_id") or i.get("type") == "mcp_approval_request")
    )
    assert scripted == generated > (0 if mix != "chat" else -1)


@pytest.mark.parametrize("memory", [False, True], ids=["plain", "memory+recall"])
def test_whole_sdk_runs_on_every_mix(memory):
    """Issue 34 #7: every generated mix at 128k and 32k, its next ``pc.MIX_TURNS`` turns
    through whole ``Runner.run`` runs (``session.run_config``, the offline scripted model
    answering with the turn's generated model items, function tools returning the generated
    outputs), with and without a memory store and ``recall_evicted=True``: every call that
    kept the prefix extends the previous request byte for byte, every request fits, the
    stable prefix repeats at least what newest first does, and every row meets the issue's
    targets (``MIX_SDK_TARGETS``)."""
    for row in pc.mix_sdk_runs(memory=memory):
        newest, stable = row["newest"], row["stable"]
        mix = row["mix"].split(" ")[0]
        assert stable.calls == newest.calls >= pc.MIX_TURNS, row["mix"]
        assert stable.broken == 0, f"{row['mix']}: a stay did not extend the last request"
        assert stable.max_tokens <= row["budget"]
        assert newest.max_tokens <= row["budget"]
        assert stable.share >= newest.share, row["mix"]
        assert (mix, row["budget"], memory) in MIX_SDK_TARGETS, row
        assert stable.share >= 0.80, row["mix"]
        assert stable.cost_ratio <= 0.35, row["mix"]
        assert stable.user_turns >= 0.8 * newest.user_turns, row["mix"]


@pytest.mark.parametrize("memory", [False, True], ids=["plain", "memory+recall"])
def test_the_default_head_is_what_brings_32k_agentic_to_80(memory):
    """The 32k agentic rows with the same policy but no head (``head=0.0``: a move drops
    from the start): every request still fits and every stay extends the previous request,
    but the moves re-send the whole request, so the rows repeat less than 80% (measured
    73.0% / 73.2%) and less than with the default head -- the measurement behind the
    default (``docs/prompt-cache.md``, "Choosing the policy")."""
    import protoprompt as pp

    (row,) = pc.mix_sdk_runs(
        ("agentic",), (32_000,), memory=memory, policy=pp.CachePolicy(head=0.0)
    )
    (default,) = pc.mix_sdk_runs(("agentic",), (32_000,), memory=memory)
    stable = row["stable"]
    assert stable.calls == default["stable"].calls >= pc.MIX_TURNS
    assert stable.broken == 0 and stable.max_tokens <= row["budget"]
    assert stable.share < 0.80 <= default["stable"].share
    assert stable.cost_ratio > default["stable"].cost_ratio
