"""The head move's attempts (``_planner.head_move``), one loop for the session callback and
the per-call filter: each mark in turn, the last one raised once by what it missed, then a
shorter head (by what the last attempt missed, at least an eighth), until the head is below
``HEAD_MIN``; and the tokens the move repeats."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

from protoprompt._packing._types import UnitDecision  # noqa: E402
from protoprompt.integrations._calls import _planner  # noqa: E402


class _Pack:
    """What :func:`_planner.head_move` reads of a pack: its decisions."""

    def __init__(self, decisions: list[UnitDecision]) -> None:
        self.decisions = decisions


def _unit(positions: list[int], code: str, tokens: int, masked: int | None = None) -> UnitDecision:
    return UnitDecision(0, positions, ["item"] * len(positions), code, tokens, [], masked)


PACK = _Pack(
    [
        _unit([0], "mandatory", 100),  # the context message, pinned
        _unit([1, 2], "masked", 900, 300),  # a head unit sent masked: 300 sent
        _unit([3], "kept", 50),  # the head's last unit
        _unit([4], "kept", 70),  # after the head
        _unit([5], "over_budget", 40),
    ]
)


def _attempts(answers: dict[tuple[int, int], Any]) -> tuple[list[tuple[int, int]], Any]:
    tried: list[tuple[int, int]] = []

    def attempt(limit: int, mark: int) -> Any:
        tried.append((limit, mark))
        return answers.get((limit, mark), 0)

    return tried, attempt


def test_the_first_attempt_that_fits_is_the_move_with_what_it_repeats() -> None:
    packed = _planner.HeadPacked("plan", PACK, 4, 20)
    tried, attempt = _attempts({(40_000, 70_000): packed})
    got = _planner.head_move(100_000, 0.4, [70_000, 75_000], attempt)
    assert got is not None and got.value == "plan" and got.mark == 70_000
    assert got.shared == 20 + 100 + 300 + 50  # fixed, then every kept unit before the head's end
    assert tried == [(40_000, 70_000)]


def test_a_changed_request_repeats_nothing() -> None:
    packed = _planner.HeadPacked("plan", PACK, 4, None)
    _, attempt = _attempts({(40_000, 75_000): packed})
    got = _planner.head_move(100_000, 0.4, [75_000], attempt)
    assert got is not None and got.shared == 0


def test_the_last_mark_is_raised_once_by_what_it_missed_then_the_head_shrinks() -> None:
    packed = _planner.HeadPacked("plan", PACK, 4, 0)
    # Every attempt misses by 3,000 tokens until the head is 34,000 tokens or less.
    calls: list[tuple[int, int]] = []

    def attempt(limit: int, mark: int) -> Any:
        calls.append((limit, mark))
        return packed if limit <= 34_000 and mark == 75_000 else 3_000

    got = _planner.head_move(100_000, 0.4, [70_000, 75_000], attempt)
    assert got is not None and got.mark == 75_000
    # Each head: the lowered mark, the policy's, the policy's raised by what it missed;
    # then shorter by at least an eighth (the miss, 3,000, is less).
    assert calls[:3] == [(40_000, 70_000), (40_000, 75_000), (40_000, 78_000)]
    assert calls[3] == (35_000, 70_000)
    assert [c[0] for c in calls[3::3]] == [35_000, 30_625]


def test_a_raise_past_the_budget_is_not_tried() -> None:
    tried, attempt = _attempts({})

    def missing(limit: int, mark: int) -> Any:
        attempt(limit, mark)
        return 30_000

    assert _planner.head_move(100_000, 0.4, [75_000], missing) is None
    assert all(mark == 75_000 for _, mark in tried)
    # Shortened by what it missed (30,000 > an eighth) until below HEAD_MIN.
    assert [limit for limit, _ in tried] == [40_000, 10_000]


def test_no_head_to_keep_stops_at_once() -> None:
    tried, attempt = _attempts({})

    def none(limit: int, mark: int) -> Any:
        attempt(limit, mark)
        return None

    assert _planner.head_move(100_000, 0.4, [70_000, 75_000], none) is None
    assert tried == [(40_000, 70_000)]


def test_a_miss_of_unknown_size_tries_the_next_mark_then_a_shorter_head() -> None:
    tried, attempt = _attempts({})
    assert _planner.head_move(10_000, 0.4, [7_000, 7_500], attempt) is None
    limits = [limit for limit, _ in tried]
    assert tried[:2] == [(4_000, 7_000), (4_000, 7_500)]  # no raise: the miss is unknown
    assert limits[::2] == [
        4_000,
        3_500,
        3_063,
        2_681,
        2_346,
        2_053,
        1_797,
        1_573,
        1_377,
        1_205,
        1_055,
    ]
    assert min(limits) >= _planner.HEAD_MIN


def test_no_head_below_head_min() -> None:
    tried, attempt = _attempts({})
    assert _planner.head_move(2_000, 0.4, [1_500], attempt) is None
    assert tried == []


def test_leading_tokens_counts_kept_units_wholly_before_the_head_end() -> None:
    assert _planner.leading_tokens(PACK.decisions, 3, 7) == 7 + 100 + 300
    assert _planner.leading_tokens(PACK.decisions, 2, 0) == 100  # the unit [1, 2] straddles
    assert _planner.leading_tokens(PACK.decisions, 6, 0) == 100 + 300 + 50 + 70


# ------------------------------------------------- the head's costs, as the pack counted them


def _tool_history(n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(n):
        items += [
            {"role": "user", "content": f"question {i} " + "word " * (10 + 7 * i)},
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "data " * (40 * i)},
            {"role": "assistant", "content": f"answer {i}"},
        ]
    return items


class _Counted:
    """``_planner.item_tokens``, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self._count = _planner.item_tokens

    def __call__(self, item: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._count(item, **kwargs)


def test_head_end_reads_the_costs_the_pack_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the request's recorded costs (``SentCosts`` of the pack that made it) a head is
    found without counting any item again, and it is the head counting finds; an item the
    pack has no decision for (the new input) is counted."""
    import protoprompt as pp

    history = _tool_history(6)
    question = {"role": "user", "content": "and then?"}
    result = pp.pack(history, [question], max_tokens=100_000)
    assert result.items[: len(history)] == history
    costs = _planner.SentCosts(result)
    items = list(result.items)
    counted = _Counted()
    monkeypatch.setattr(_planner, "item_tokens", counted)
    ends = set()
    for limit in range(0, sum(pp.item_tokens(i).total for i in items) + 50, 37):
        counted.calls = 0
        fast = _planner.head_end(items, 0, len(history), limit, None, costs)
        assert counted.calls == 0, limit
        assert fast == _planner.head_end(items, 0, len(history), limit, None), limit
        assert counted.calls > 0 or limit == 0
        ends.add(fast)
    assert len(ends) >= 5  # every unit boundary is reached
    assert costs[len(history)] is None  # the new input: counted when the head reaches it
    counted.calls = 0
    _planner.head_end(items, 0, len(items), 10**9, None, costs)
    assert counted.calls == 1


def test_costs_follow_the_items_a_request_keeps() -> None:
    """``SentCosts.take``: the costs of a request made of some of another's items (what
    ``adopt`` keeps of the model's request), item by item."""
    import protoprompt as pp

    history = _tool_history(3)
    result = pp.pack(history, [{"role": "user", "content": "q"}], max_tokens=100_000)
    costs = _planner.SentCosts(result)
    at = [0, 4, 5, 6, 7]
    view = costs.take(at)
    assert [view[i] for i in range(len(at))] == [costs[p] for p in at]
    assert view[len(at)] is None and view[-1] is None
    assert [view.take([1, 4])[i] for i in range(2)] == [costs[4], costs[7]]


def _head_end_counts(monkeypatch: pytest.MonkeyPatch, recorded: bool) -> dict[str, int]:
    """Counts what ``head_end`` does from now on: its calls, those given recorded costs and
    the items it counted; with ``recorded=False`` it is given none (the counting path)."""
    stats = {"calls": 0, "with_costs": 0, "counted": 0}
    counted = _Counted()
    head_end = _planner.head_end

    def spied(
        items: list[Any], start: int, stop: int, limit: int, encoding: Any, costs: Any = None
    ) -> int:
        stats["calls"] += 1
        stats["with_costs"] += costs is not None
        counted.calls = 0
        monkeypatch.setattr(_planner, "item_tokens", counted)
        try:
            return head_end(items, start, stop, limit, encoding, costs if recorded else None)
        finally:
            monkeypatch.setattr(_planner, "item_tokens", counted._count)
            stats["counted"] += counted.calls

    monkeypatch.setattr(_planner, "head_end", spied)
    return stats


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "counted"])
async def test_a_filter_head_move_reads_the_previous_requests_costs(
    monkeypatch: pytest.MonkeyPatch, recorded: bool
) -> None:
    """The per-call filter's head moves find the head from the costs the previous pack
    recorded: every ``head_end`` call is given them and counts (almost) nothing, where the
    counting path counts the head's items, and the requests are the same."""
    import protoprompt as pp
    from test_session_prefix import _head_runs

    runs = [[150] * 3] + [[250] * 8] * 3
    stats = _head_end_counts(monkeypatch, recorded)
    received, calls, _, _ = await _head_runs(runs, 4_000, pp.CachePolicy(head=0.35))
    monkeypatch.undo()
    assert stats["calls"] >= 3 and stats["with_costs"] == stats["calls"], stats
    again, _, _, _ = await _head_runs(runs, 4_000, pp.CachePolicy(head=0.35))
    assert received == again
    if recorded:
        assert stats["counted"] <= stats["calls"], stats  # at most the new input's last item
    else:
        assert stats["counted"] >= 5 * stats["calls"], stats


async def _callback_head_turns() -> list[list[Any]]:
    """Turns through the session callback alone (``CachePolicy(head=0.3)``) on a history
    that overflows (the setting of ``test_session_prefix``'s callback head test): each
    turn's request."""
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel
    from test_session_prefix import RESERVE, _script, _sizes_tool

    import protoprompt as pp
    from protoprompt.integrations import ProtoPromptSession

    runs = [[300, 300]] * 16
    sizes: dict[str, int] = {}
    model = ScriptedModel(_script(runs, sizes, 10))
    agent = Agent(name="a", model=model, tools=[_sizes_tool(sizes)], instructions="Use the tool.")
    builder = pp.TokenBudgetedContextBuilder(None, max_tokens=4_000, output_reserve=RESERVE)
    session = ProtoPromptSession("head-costs")
    turns: list[Any] = []
    plain = RunConfig(tracing_disabled=True)
    callback = session.input_callback(builder, on_plan=turns.append, cache=pp.CachePolicy(head=0.3))
    config = RunConfig(session_input_callback=callback, tracing_disabled=True)
    for r in range(len(runs)):
        run_config = plain if r < 6 else config
        await Runner.run(agent, f"question {r}", session=session, run_config=run_config)
    assert sum(1 for t in turns if "kept the head" in t.prefix_reason) >= 2
    return [list(t.items) for t in turns]


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "counted"])
async def test_a_callback_head_move_reads_the_previous_requests_costs(
    monkeypatch: pytest.MonkeyPatch, recorded: bool
) -> None:
    """The session callback's head moves find the head from the costs its previous pack
    recorded (its own move's or a stay's): no item counted again, where the counting path
    counts the head's items; the requests are the same either way."""
    stats = _head_end_counts(monkeypatch, recorded)
    requests = await _callback_head_turns()
    monkeypatch.undo()
    assert stats["calls"] >= 2 and stats["with_costs"] == stats["calls"], stats
    assert requests == await _callback_head_turns()
    if recorded:
        assert stats["counted"] == 0, stats
    else:
        assert stats["counted"] >= 5 * stats["calls"], stats


def test_in_history_keeps_what_the_pack_masked_itself_as_sent() -> None:
    """A head move's pack read in the stored history's positions (``in_history``): a unit
    the pack masked itself keeps its masked tokens as sent (below its whole tokens), so the
    kept units' sent tokens add up to the history items sent."""
    import protoprompt as pp

    history = _tool_history(6)
    question = {"role": "user", "content": "and then?"}
    result = pp.pack(
        history, [question], max_tokens=100_000, masking=pp.Masking(after_turns=1), pinned=range(4)
    )
    assert result.masked
    head = _planner.TurnPrefix(
        sent=history[:4], kept=[0, 1, 2, 3], end=4, originals=b"", masked=[],
        request_tokens=0, context=None,
    )  # fmt: skip
    read = _planner.in_history(result, head, history, 0, ("kept", "mandatory"))
    masked = [d for d in read.decisions if d.decision == "masked"]
    assert masked and all(
        d.masked_tokens is not None and d.tokens is not None and d.masked_tokens < d.tokens
        for d in masked
    )
    sent = read.items[: len(read.kept_history)]
    kept = [d for d in read.decisions if d.kept]
    assert sum(d.sent_tokens or 0 for d in kept) == sum(pp.item_tokens(x).total for x in sent)
