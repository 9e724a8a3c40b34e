"""Calls into the inner session: sync or async methods, ``wrapper`` passed only where it is
taken, ``session_settings`` validated as the SDK does, and the hooks passed on from it."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from ..._seams import COMPACTION_HOOKS, READ_COMPACTION_ITEMS
from ._names import SessionSettings, coerce_session_settings


def accepts_wrapper(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "wrapper"
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        for p in params
    )


async def call(method: Any, *args: Any, wrapper: Any = None, **kwargs: Any) -> Any:
    """Call an inner-session method (sync or async), passing ``wrapper`` only if it takes one."""
    if wrapper is not None and accepts_wrapper(method):
        kwargs["wrapper"] = wrapper
    result = method(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


def coerce_settings(value: SessionSettings | Mapping[str, Any] | None) -> SessionSettings | None:
    """``value`` as ``SessionSettings``, validated exactly as ``SQLiteSession`` validates it
    (the SDK's own ``coerce_session_settings``: an unknown key raises
    ``TypeError: Unknown session settings: ...``, a bad value pydantic's error)."""
    if value is None or isinstance(value, SessionSettings):
        return value
    if isinstance(value, Mapping):
        return coerce_session_settings(dict(value))
    raise TypeError(
        f"session_settings must be a SessionSettings, a dict or None, got {type(value).__name__}"
    )


FORWARDED_HOOKS = frozenset({"run_compaction", *COMPACTION_HOOKS, READ_COMPACTION_ITEMS})
"""Optional hooks a ProtoPromptSession exposes exactly when its inner session has them."""

NOT_FORWARDED = frozenset({"underlying_session"})
"""Public names of wrapper sessions that describe the wrapper itself, not ours."""


def accepts_keyword(method: Any, name: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
