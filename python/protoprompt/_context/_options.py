"""The checks of :class:`~protoprompt.TokenBudgetedContextBuilder`'s arguments, each
raising a clear error that names the argument."""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from .. import _core
from ..calibration import Calibration
from ..memory import MemoryScope
from ..packing import Masking, encoding_for_model

LAYERS: tuple[str, ...] = ("system", "profile", "summary", "facts", "rag", "history")
"""The context layers, in their default priority order."""
LAYER_ALIASES = {"session": "facts"}
"""Earlier names of layers, accepted in ``priorities`` (with a ``DeprecationWarning``)
until 1.1: the facts layer was called ``session`` up to 0.2."""

_EVICTION_METHODS = ("search_history", "index_history", "history_rows", "forget_history")


def check_int(name: str, value: object, *, minimum: int) -> int:
    """``value`` as an int of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_store(store: Any) -> Any:
    """``store`` if it is ``None`` or has a memory store's read methods."""
    if store is not None:
        missing = [
            m for m in ("search", "facts", "get_profile") if not callable(getattr(store, m, None))
        ]
        if missing:
            raise TypeError(
                f"store must be a MemoryStore (or have {', '.join(missing)}), "
                f"got {type(store).__name__}"
            )
    return store


def resolve_encoding(model: str | None, encoding: str | None) -> str:
    """The tokenizer a builder uses: ``encoding``, else ``model``'s, else ``o200k_base``."""
    if model is not None and not isinstance(model, str):
        raise TypeError(f"model must be a str or None, got {type(model).__name__}")
    if encoding is not None and not isinstance(encoding, str):
        raise TypeError(f"encoding must be a str or None, got {type(encoding).__name__}")
    if encoding is not None:
        # Raises UnknownEncodingError without building the tokenizer: a session's
        # callback builds it in the background while the SDK reads the history.
        _core.is_preloaded(encoding=encoding)
        return encoding
    if model is not None:
        return encoding_for_model(model)  # raises UnknownModelError
    return "o200k_base"


def check_priorities(priorities: Iterable[str]) -> tuple[str, ...]:
    """The layer order: known layers, each once, starting with ``system``."""
    if isinstance(priorities, str) or not isinstance(priorities, Iterable):
        raise TypeError("priorities must be a sequence of layer names, not a single str")
    result = tuple(priorities)
    old = [p for p in result if p in LAYER_ALIASES]
    if old:
        warnings.warn(
            f"priorities: layer {old[0]!r} is now called {LAYER_ALIASES[old[0]]!r} (the old "
            "name is accepted until 1.1)",
            DeprecationWarning,
            stacklevel=3,
        )
        result = tuple(LAYER_ALIASES.get(p, p) for p in result)
    unknown = [p for p in result if p not in LAYERS]
    if unknown:
        raise ValueError(f"unknown layer(s) {unknown!r} in priorities; known: {LAYERS!r}")
    if len(set(result)) != len(result):
        raise ValueError(f"priorities must not repeat a layer, got {result!r}")
    if not result or result[0] != "system":
        raise ValueError(
            f"priorities must start with 'system': the system prompt is mandatory, got {result!r}"
        )
    return result


def check_scope(scope: object) -> MemoryScope | None:
    """``scope`` if it is a :class:`~protoprompt.memory.MemoryScope` or ``None``."""
    if scope is not None and not isinstance(scope, MemoryScope):
        raise TypeError(f"scope must be a MemoryScope or None, got {type(scope).__name__}")
    return scope


def check_choices(policy: object, context_role: object, include_parents: object) -> None:
    """The builder's history policy, context role and ``include_parents`` flag."""
    if policy not in ("contiguous", "greedy"):
        raise ValueError(f"policy must be 'contiguous' or 'greedy', got {policy!r}")
    if context_role not in ("system", "developer"):
        raise ValueError(f"context_role must be 'system' or 'developer', got {context_role!r}")
    if not isinstance(include_parents, bool):
        raise TypeError("include_parents must be a bool")


def check_calibration(calibration: object, model: str | None, masking: object) -> None:
    """A calibration (needs a model) and a masking."""
    if calibration is not None:
        if not isinstance(calibration, Calibration):
            raise TypeError(
                f"calibration must be a Calibration or None, got {type(calibration).__name__}"
            )
        if model is None:
            raise ValueError("calibration is per model: pass model= too")
    if masking is not None and not isinstance(masking, Masking):
        raise TypeError(f"masking must be a Masking or None, got {type(masking).__name__}")


def check_evictions(
    store: Any,
    priorities: tuple[str, ...],
    *,
    recall_evicted: object,
    recall_other_sessions: object,
    summarizer: object,
) -> None:
    """What recalling evicted turns and summarizing them need: a store with the history
    methods and the ``history`` layer; an async callable and the ``summary`` layer."""
    for name, flag in (
        ("recall_evicted", recall_evicted),
        ("recall_other_sessions", recall_other_sessions),
    ):
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
    if recall_evicted:
        for method in _EVICTION_METHODS:
            if not callable(getattr(store, method, None)):
                raise TypeError(
                    f"recall_evicted needs a MemoryStore (with {method}), "
                    f"got {type(store).__name__}"
                )
        if "history" not in priorities:
            raise ValueError("recall_evicted needs the 'history' layer in priorities")
    if summarizer is not None:
        if not callable(summarizer):
            raise TypeError(
                "summarizer must be an async callable (items, previous summary, token "
                f"limit) -> str, got {type(summarizer).__name__}"
            )
        if "summary" not in priorities:
            raise ValueError("a summarizer needs the 'summary' layer in priorities")
