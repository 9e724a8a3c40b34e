"""One pack's options (the core's ``PackOptions``, checked once), the ``budget`` alias of
``max_tokens``, and the call of the core that runs it."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .. import _core
from .._tokens import as_list
from ..count_store import CountStore
from ..errors import ConflictingArgumentsError
from ._result import PackResult
from ._types import (
    MAX_TOKENS,
    Decisions,
    FillStop,
    IndexUse,
    Item,
)


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


PackOptions = _core.PackOptions
"""The options of one pack as one frozen value, checked when made (the Rust core's own
options: the encoding resolved, the masking read once); see ``protoprompt.packing``."""

OPTION_DEFAULTS: dict[str, Any] = {
    "output_reserve": 0,
    "context_tokens": 0,
    "model": None,
    "encoding": None,
    "policy": "contiguous",
    "context": None,
    "pinned": (),
    "history_len": None,
    "history_offset": 0,
    "opaque_scale": 1.0,
    "masking": None,
}
"""The keywords an options value replaces, with their defaults."""


def max_tokens_of(where: str, max_tokens: int | None, budget: int | None) -> int | None:
    """``max_tokens``, or its old name ``budget`` (a ``DeprecationWarning``; both: a
    :class:`~protoprompt.errors.ConflictingArgumentsError`)."""
    if budget is None:
        return max_tokens
    if max_tokens is not None:
        raise ConflictingArgumentsError(
            f"{where}: pass max_tokens or its old name budget, not both "
            f"(max_tokens={max_tokens!r}, budget={budget!r})"
        )
    warnings.warn(
        f"{where}: budget= is now called max_tokens= (the old name is accepted until 1.1)",
        DeprecationWarning,
        stacklevel=3,
    )
    check_sizes(budget, 0, 0)  # a bad value is named as it was passed
    return budget


def options_of(
    where: str,
    options: PackOptions | None,
    max_tokens: int | None,
    fields: dict[str, Any],
) -> PackOptions:
    """The options of a call: ``options`` as given (then no other keyword of ``fields`` may
    differ from its default, and ``max_tokens`` must be ``None``), else a new value of
    ``max_tokens`` and ``fields``."""
    if options is None:
        if max_tokens is None:
            raise TypeError(f"{where}() missing required argument: 'max_tokens'")
        return PackOptions(max_tokens, **fields)
    if not isinstance(options, PackOptions):
        raise TypeError(f"options must be a PackOptions or None, got {type(options).__name__}")
    given = [k for k, v in fields.items() if not _is_default(k, v)]
    if max_tokens is not None:
        given.insert(0, "max_tokens")
    if given:
        raise ConflictingArgumentsError(
            f"{where}: pass options or the keywords it holds, not both (got {', '.join(given)})"
        )
    return options


def _is_default(name: str, value: Any) -> bool:
    default = OPTION_DEFAULTS[name]
    if default is None or callable(value):
        return value is None
    if name == "pinned":
        return isinstance(value, (tuple, list)) and not value
    return type(value) is type(default) and value == default


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
        max_tokens=raw["budget"],
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
