"""pp.plan_prefix and pp.CachePolicy: a request prefix that stays while it fits."""

from __future__ import annotations

import json
from typing import Any

import pytest

import protoprompt as pp


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": text}


def _turn(t: int, words: int = 300) -> list[dict[str, Any]]:
    out = " ".join(f"w{i}" for i in range(words))
    return [
        _msg("user", f"question {t}"),
        {"type": "function_call", "call_id": f"c{t}", "name": "search", "arguments": "{}"},
        {"type": "function_call_output", "call_id": f"c{t}", "output": out},
        _msg("assistant", f"answer {t}"),
    ]


def _serialised(items: list[Any]) -> list[str]:
    return [json.dumps(i, sort_keys=True) for i in items]


def test_policy_is_checked_once() -> None:
    assert pp.CachePolicy() == pp.CachePolicy(low_water=0.75, keep_recent=1, excerpt_tokens=64)
    with pytest.raises(ValueError, match="low_water"):
        pp.CachePolicy(low_water=0.0)
    with pytest.raises(ValueError, match="low_water"):
        pp.CachePolicy(low_water=float("nan"))
    with pytest.raises(TypeError, match="keep_recent"):
        pp.CachePolicy(keep_recent=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="excerpt_tokens"):
        pp.CachePolicy(excerpt_tokens=3)
    # The default head leaves RECENT_ROOM of the budget to the newest items at a move.
    assert pp.CachePolicy().head is None and pp.CachePolicy().head_share == 0.4
    assert pp.CachePolicy(low_water=0.5).head_share == pytest.approx(0.15)
    assert pp.CachePolicy(low_water=0.3).head_share == 0.0  # no room for a head
    assert pp.CachePolicy(head=0.0).head_share == 0.0
    assert pp.CachePolicy(low_water=0.9, head=0.2).head_share == 0.2
    with pytest.raises(ValueError, match="head"):
        pp.CachePolicy(head=0.75)  # not below low_water: a move could keep nothing else
    with pytest.raises(ValueError, match="head"):
        pp.CachePolicy(head=-0.1)
    with pytest.raises(ValueError, match="head"):
        pp.CachePolicy(low_water=0.5, head=float("nan"))
    with pytest.raises(TypeError, match="head"):
        pp.CachePolicy(head=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="cache must be a CachePolicy"):
        pp.plan_prefix([], [_msg("user", "hi")], budget=100, cache=0.7)  # type: ignore[arg-type]


def test_consecutive_requests_extend_each_other_until_the_cut_moves() -> None:
    history = [item for t in range(12) for item in _turn(t)]
    policy = pp.CachePolicy(low_water=0.6, keep_recent=2)
    budget = 6_000
    new_input = [_msg("user", "go on")]
    plan = pp.plan_prefix(history, new_input, budget=budget, output_reserve=200, cache=policy)
    assert plan.reason_code == "fresh_cut"
    assert plan.tokens <= 0.6 * budget
    assert plan.masked_positions, "older tool outputs are masked before turns are dropped"
    assert plan.cut_position is not None
    assert history[plan.cut_position]["role"] == "user"
    # The history's own items are never changed; masked copies stand in the request.
    for p in plan.masked_positions:
        assert history[p]["output"].startswith("w0 w1")
    states = [plan]
    moves = 0
    for t in range(12, 30):
        history = history + new_input + _turn(t)[1:]
        new_input = [_msg("user", f"next {t}")]
        nxt = pp.plan_prefix(
            history,
            new_input,
            budget=budget,
            output_reserve=200,
            cache=policy,
            previous=states[-1].state,
        )
        prev = states[-1]
        assert nxt.tokens <= budget
        # The request is a valid item graph: every unit whole, nothing orphaned.
        report = pp.analyze(nxt.request[: -len(new_input)], new_input)
        assert all(u.valid for u in report.units)
        if nxt.moved:
            moves += 1
            assert nxt.reason_code == "moved"
            assert "did not fit: cut moved from history[" in nxt.reason
            assert nxt.tokens <= 0.6 * budget
        else:
            # Byte for byte: the previous request is a prefix of this one.
            before, after = _serialised(prev.request), _serialised(nxt.request)
            assert after[: len(before)] == before
            assert nxt.shared_tokens + 200 == prev.tokens
        states.append(nxt)
    assert 1 <= moves <= 6
    stayed = sum(1 for s in states[1:] if not s.moved)
    assert stayed >= 2 * moves


def test_a_rewritten_history_resets() -> None:
    history = [item for t in range(3) for item in _turn(t, 20)]
    plan = pp.plan_prefix(history, [_msg("user", "x")], budget=10_000)
    assert plan.reason_code == "fresh_fits"
    assert plan.request[:-1] == history
    compacted = [_msg("user", "summary")] + history[4:]
    nxt = pp.plan_prefix(compacted, [_msg("user", "y")], budget=10_000, previous=plan.state)
    assert nxt.reason_code == "reset"
    assert "previous decision ignored" in nxt.reason
    assert nxt.shared_tokens == 0


def test_errors_name_item_and_budget() -> None:
    with pytest.raises(pp.TokenBudgetExceededError):
        pp.plan_prefix([], [_msg("user", "word " * 500)], budget=100)
    orphan = {"type": "function_call_output", "call_id": "zz", "output": "x"}
    with pytest.raises(pp.InvalidNewInputError):
        pp.plan_prefix([], [orphan], budget=1_000)
    with pytest.raises(pp.InvalidItemError, match=r"history\[0\]"):
        pp.plan_prefix(["not an item"], [_msg("user", "x")], budget=1_000)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="budget"):
        pp.plan_prefix([], [_msg("user", "x")], budget=-1)
