"""One pack's options, checked once, and the call of the core that runs it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _core
from ._pack_result import PackResult
from ._pack_types import (
    MAX_TOKENS,
    Decisions,
    FillStop,
    IndexUse,
    Item,
    Masking,
    Policy,
    check_masking,
)
from ._tokens import as_list
from .count_store import CountStore


def checked_store(count_store: CountStore | None) -> CountStore | None:
    if count_store is not None and not isinstance(count_store, CountStore):
        raise TypeError(
            f"count_store must have secret, get_many and put_many, got {type(count_store).__name__}"
        )
    return count_store


def check_sizes(budget: int, output_reserve: int, context_tokens: int) -> None:
    for name, value in (
        ("budget", budget),
        ("output_reserve", output_reserve),
        ("context_tokens", context_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        if value > MAX_TOKENS:
            raise ValueError(f"{name} must be at most 2**64 - 1 tokens, got {value}")


OPAQUE_SCALE_MIN: float = _core.OPAQUE_SCALE_MIN
"""Smallest calibration of opaque payloads (a quarter of the decoded-size rule)."""
OPAQUE_SCALE_MAX: float = _core.OPAQUE_SCALE_MAX
"""Largest calibration of opaque payloads (twice the decoded-size rule)."""


def check_opaque_scale(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"opaque_scale must be a number, got {type(value).__name__}")
    if not OPAQUE_SCALE_MIN <= value <= OPAQUE_SCALE_MAX:
        raise ValueError(
            f"opaque_scale must be between {OPAQUE_SCALE_MIN} and {OPAQUE_SCALE_MAX}, got {value!r}"
        )
    return float(value)


def _check_pinned(pinned: Iterable[int]) -> list[int]:
    if isinstance(pinned, (str, bytes)) or not isinstance(pinned, Iterable):
        raise TypeError(
            f"pinned must be an iterable of history positions, got {type(pinned).__name__}"
        )
    pins = list(pinned)
    for i, p in enumerate(pins):
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"pinned[{i}] must be an int, got {type(p).__name__}")
        if p < 0:
            raise ValueError(f"pinned[{i}] is {p}, not a history position")
    return pins


@dataclass(frozen=True)
class PackOptions:
    """The options of one pack, checked once: what :func:`pack` and
    :meth:`HistoryIndex.pack` take as keywords, handed to the core as one value (the core
    reads these attributes)."""

    budget: int
    output_reserve: int = 0
    context_tokens: int = 0
    model: str | None = None
    encoding: str | None = None
    policy: Policy = "contiguous"
    context: Callable[[int], int] | None = None
    pinned: Iterable[int] = ()
    history_len: int | None = None
    history_offset: int = 0
    opaque_scale: float = 1.0
    masking: Masking | None = None

    def __post_init__(self) -> None:
        check_sizes(self.budget, self.output_reserve, self.context_tokens)
        object.__setattr__(self, "opaque_scale", check_opaque_scale(self.opaque_scale))
        check_masking(self.masking)
        # A tuple of checked positions (a list or generator given is read once, here).
        object.__setattr__(self, "pinned", tuple(_check_pinned(self.pinned)))
        history_len = self.history_len
        if history_len is not None and (
            isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 0
        ):
            raise ValueError(f"history_len must be a non-negative int or None, got {history_len!r}")
        offset = self.history_offset
        if offset and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
            raise ValueError(f"history_offset must be a non-negative int, got {offset!r}")


def run_pack(
    core_pack: Callable[..., Mapping[str, Any]],
    history: Iterable[Item],
    new_input: Iterable[Item],
    options: PackOptions,
    count_store: CountStore | None = None,
    *,
    indexed: bool = True,
) -> PackResult:
    """Call the core's ``HistoryIndex.pack`` with the checked options, wrap its dict
    (``indexed``: the pack went through a caller's index, whose use it reports)."""
    raw = core_pack(
        as_list(history, "history"), as_list(new_input, "new_input"), options, count_store
    )
    if count_store is not None and raw["new_counts"]:
        count_store.put_many(raw["new_counts"])
    held, appended, regrouped_from, why = raw["index"]
    decisions = Decisions(raw["decisions"])
    return PackResult(
        # The objects the core read, classified and counted (not positions looked up again
        # in a list another thread may have changed meanwhile).
        items=raw["items"],
        kept_history=raw["kept_history"],
        dependency=raw["dependency"],
        new_input_tokens=raw["new_input_tokens"],
        dependency_tokens=raw["dependency_tokens"],
        history_tokens=raw["history_tokens"],
        context_tokens=raw["context_tokens"],
        output_reserve=raw["output_reserve"],
        budget=raw["budget"],
        used=raw["used"],
        remaining=raw["remaining"],
        encoding=raw["encoding"],
        policy=raw["policy"],
        decisions=decisions,
        opaque_scale=raw["opaque_scale"],
        masked=raw["masked"],
        masking_saved=raw["masking_saved"],
        index=IndexUse(held, appended, regrouped_from, why) if indexed else None,
        count_store_hits=raw.get("store_hits") if count_store is not None else None,
        count_store_writes=len(raw["new_counts"]) if count_store is not None else None,
        stop=_stop(decisions, raw["stop"]),
        thinking_rule=raw["thinking_rule"],
        earlier_thinking_free=raw["earlier_thinking_free"],
        omitted_reasoning=raw.get("omitted_reasoning", []),
    )


def _stop(decisions: Decisions, raw: tuple[int, int, str] | None) -> FillStop | None:
    if raw is None:
        return None
    unit, left, cause = raw
    d = decisions[unit]
    return FillStop(unit, d.positions, d.tokens, d.masked_tokens, left, cause)
