"""The head move's attempts (``_planner.head_move``), one loop for the session callback and
the per-call filter: each mark in turn, the last one raised once by what it missed, then a
shorter head (by what the last attempt missed, at least an eighth), until the head is below
``HEAD_MIN``; and the tokens the move repeats."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("agents")

from protoprompt._pack_types import UnitDecision  # noqa: E402
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
