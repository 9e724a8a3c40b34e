"""Why a unit was kept or dropped, as a phrase for a person: one vocabulary for every
plan (see :mod:`protoprompt.plan`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class StopLike(Protocol):
    """Where the fill stopped (:class:`~protoprompt.plans.FillStop`)."""

    @property
    def unit(self) -> int: ...
    @property
    def positions(self) -> list[int]: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def masked_tokens(self) -> int | None: ...
    @property
    def left(self) -> int: ...
    @property
    def cause(self) -> str: ...


class DecisionLike(Protocol):
    """One unit's decision (:class:`~protoprompt.plans.UnitDecision`)."""

    @property
    def unit(self) -> int: ...
    @property
    def positions(self) -> list[int]: ...
    @property
    def decision(self) -> str: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def masked_tokens(self) -> int | None: ...
    @property
    def problems(self) -> Sequence[object]: ...


def _tokens(n: int | None) -> str:
    return "uncounted" if n is None else f"{n:,} tokens"


def unit_reason(
    d: DecisionLike,
    *,
    stop: StopLike | None,
    policy: str,
    where: Callable[[Sequence[int]], str],
    mandatory: str = "the run input depends on it",
) -> str:
    """Why a unit was kept or dropped, as a phrase for a person.

    ``stop``: where the fill stopped (``PackResult.stop``); ``where`` names positions
    (``history[3..5]``); ``mandatory``: why a mandatory unit is (its section says it).
    The unit the fill stopped at is named, with what it needed and what was left then;
    units dropped because of it say so (never "the budget was full" while tokens remain).
    """
    decided = _decided_reason(d, mandatory)
    if decided is not None:
        return decided
    if stop is None:  # pragma: no cover - a dropped unit always has a stop
        return d.decision.replace("_", " ")
    return _dropped_reason(d, stop, policy, where(stop.positions))


_FIXED_REASONS = {
    "kept": "fits",
    "input_only": "an input-only control item: never sent from history",
}


def _decided_reason(d: DecisionLike, mandatory: str) -> str | None:
    """Why a unit was kept, or never sent; ``None`` for a unit the fill dropped."""
    code = d.decision
    if code == "mandatory":
        return f"mandatory: {mandatory}"
    if code == "masked":
        return (
            f"fits with its tool outputs masked ({_tokens(d.tokens)} whole, "
            f"{_tokens(d.masked_tokens)} sent)"
        )
    if code == "invalid_unit":
        rules = sorted({str(getattr(p, "message", p)) for p in d.problems})
        return "breaks an item rule, never sent: " + ("; ".join(rules) if rules else "invalid")
    return _FIXED_REASONS.get(code)


def _dropped_reason(d: DecisionLike, stop: StopLike, policy: str, at: str) -> str:
    """Why the fill dropped a unit (``at``: where it stopped)."""
    code = d.decision
    if code == "over_budget" and d.unit == stop.unit:
        return _stop_reason(stop, policy)
    if code == "turn_incomplete":
        if d.unit > stop.unit:
            return (
                f"its turn's older unit {at} did not fit: a turn is sent from its user "
                "message on, or not at all"
            )
        return f"dropped with its turn: {at} of the same turn did not fit"
    if policy == "contiguous" or d.unit > stop.unit:
        return (
            f"not tried: the fill stopped at {at} (policy contiguous sends an unbroken newest part)"
        )
    if d.tokens is None:
        return "its turn cannot fit whole in what was left (policy greedy: not counted)"
    return "its turn did not fit whole in what was left (policy greedy)"


def _stop_reason(stop: StopLike, policy: str) -> str:
    after = (
        "nothing older is sent (policy contiguous)"
        if policy == "contiguous"
        else "the rest of its turn is dropped; older turns are sent whole if they fit"
    )
    left = f"{stop.left:,} left"
    if stop.cause == "whole":
        need = f"needs {_tokens(stop.tokens)}"
    elif stop.cause == "masked":
        masked = stop.masked_tokens
        need = (
            f"needs {_tokens(masked)} even with its tool outputs masked"
            if masked is not None
            else "cannot fit even with its tool outputs masked"
        )
    elif stop.tokens is not None:
        return (
            f"the fill stopped here: needs {_tokens(stop.tokens)}, {left}, and masking tool "
            f"outputs cannot make its turn fit; {after}"
        )
    else:
        need = "masking tool outputs cannot make its turn fit"
    return f"the fill stopped here: {need}, {left}; {after}"
