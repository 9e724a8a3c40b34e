"""The pure-Python reference packer and protoprompt.pack agree on generated histories."""

from __future__ import annotations

import harness  # noqa: I001  (first: puts the benches' helper modules first)

harness.ensure_paths()

import pytest

import protoprompt
from harness import output_reserve_for
from history_gen import MIXES, generate, new_user_message, next_turn
from reference_packer import BudgetExceeded, ReferencePacker, units_of

BUDGETS = [8000, 32000, 128000, 400000]


@pytest.fixture(scope="module")
def packer():
    return ReferencePacker("o200k_base", warm=True)


@pytest.mark.parametrize("seed", [0, 5])
@pytest.mark.parametrize("mix", MIXES)
def test_same_units_as_protoprompt(mix, seed):
    h = generate(1500, mix, seed)
    n = [new_user_message(seed)]
    ours = sorted(u.members for u in units_of(h, n))
    theirs = sorted(u.positions for u in protoprompt.analyze(h, n).units)
    assert ours == theirs


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("mix", MIXES)
def test_same_kept_items_and_totals(packer, mix, budget):
    h = generate(1500, mix, 3) + next_turn(3, mix)
    n = [new_user_message(3)]
    reserve = output_reserve_for(budget)
    pp = protoprompt.pack(h, n, budget, output_reserve=reserve, encoding="o200k_base")
    ref = packer.pack(h, n, budget, output_reserve=reserve)
    assert pp.kept_history == ref.kept_history
    fields = ("new_input_tokens", "dependency_tokens", "history_tokens", "used", "remaining")
    assert [getattr(pp, f) for f in fields] == [getattr(ref, f) for f in fields]
    assert pp.used <= budget
    assert pp.items == [h[i] for i in ref.kept_history] + n
    # Every kept unit is costed exactly like protoprompt's per-item cost model.
    for i in ref.kept_history[-20:]:
        assert packer.item_cost(h[i]) == protoprompt.item_tokens(h[i]).total


def test_without_budget_pressure_everything_is_kept(packer):
    h = generate(300, "agentic", 1)
    n = [new_user_message(1)]
    pp = protoprompt.pack(h, n, 10**9)
    ref = packer.pack(h, n, 10**9)
    assert pp.kept_history == ref.kept_history == list(range(len(h)))
    assert pp.history_tokens == ref.history_tokens


def test_tail_dependency_and_budget_errors(packer):
    h = generate(50, "tools", 2) + [
        {"content": "go on", "role": "user"},
        {
            "type": "reasoning",
            "id": "rs_tail",
            "summary": [],
            "encrypted_content": "gAAAAB" + "x" * 40,
        },
        {
            "arguments": "{}",
            "call_id": "call_tail",
            "name": "f",
            "type": "function_call",
            "id": "fc_tail",
            "status": "completed",
        },
    ]
    n = [{"call_id": "call_tail", "output": "ok", "type": "function_call_output"}]
    pp = protoprompt.pack(h, n, 128000, output_reserve=8000)
    ref = packer.pack(h, n, 128000, output_reserve=8000)
    assert pp.dependency == ref.dependency == [len(h) - 2, len(h) - 1]
    assert pp.kept_history == ref.kept_history
    assert pp.dependency_tokens == ref.dependency_tokens
    with pytest.raises(BudgetExceeded):
        packer.pack(h, n, 8000, output_reserve=8000)
    with pytest.raises(protoprompt.TokenBudgetExceededError):
        protoprompt.pack(h, n, 8000, output_reserve=8000)


def test_common_invalid_units_are_dropped_by_both(packer):
    h = [
        {"content": "q", "role": "user"},
        {"type": "function_call_output", "call_id": "orphan", "output": "x"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "e"},
        {"arguments": "{}", "call_id": "c1", "name": "f", "type": "function_call"},
        {"content": "q2", "role": "user"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "e"},
        {"content": "q3", "role": "user"},
        {"type": "compaction_trigger"},
    ]
    n = [{"content": "next", "role": "user"}]
    pp = protoprompt.pack(h, n, 100000)
    ref = packer.pack(h, n, 100000)
    assert pp.kept_history == ref.kept_history == [0, 4, 6]


MASKINGS = [
    protoprompt.Masking(),
    protoprompt.Masking(excerpt_tokens=24, after_turns=2),
]


@pytest.mark.parametrize("policy", ["contiguous", "greedy"])
@pytest.mark.parametrize("share", [0.05, 0.10, 0.25])
@pytest.mark.parametrize("mix", MIXES)
def test_masked_packs_equal_the_reference(packer, mix, share, policy):
    """The masking rule, written again in Python with the real tiktoken: the same kept
    items, the same masked copies (text for text), the same totals."""
    h = generate(1200, mix, 11) + next_turn(11, mix)
    n = [new_user_message(11)]
    whole = sum(packer.item_cost(i) for i in h)
    budget = max(int(whole * share), 2000)
    for masking in MASKINGS:
        pp = protoprompt.pack(h, n, budget, output_reserve=500, policy=policy, masking=masking)
        ref = packer.pack(h, n, budget, output_reserve=500, policy=policy, masking=masking)
        assert pp.kept_history == ref.kept_history
        assert pp.masked == ref.masked
        assert pp.items == ref.items
        fields = ("history_tokens", "used", "remaining", "masking_saved")
        assert [getattr(pp, f) for f in fields] == [getattr(ref, f) for f in fields]
        assert pp.used <= budget
        if mix != "chat" and masking.after_turns is not None:
            assert pp.masked, "old tool outputs are masked"
