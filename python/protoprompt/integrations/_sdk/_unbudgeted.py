"""The warning for a session the runner uses without a budget (no ``session_input_callback``):
the whole stored history then goes to the model, however long, and nothing else would say so."""

from __future__ import annotations

import warnings
from typing import Any

from ...errors import UnbudgetedSessionWarning
from ._probes import runner_locals


def unbudgeted_run(session: Any) -> bool:
    """Whether this ``get_items`` (the caller of the function calling this) is the runner's
    read before a turn of ``session`` in a run without a session input callback, whose
    prepared input includes the history."""
    scope = runner_locals(3)  # from get_items' caller on
    if scope is None or scope.get("session") is not session:
        return False
    if not scope.get("include_history_in_prepared_input", False):
        return False
    return scope.get("session_input_callback") is None


def warn_unbudgeted(session_id: str) -> None:
    """Warn (:class:`~protoprompt.errors.UnbudgetedSessionWarning`) that ``session_id`` runs without
    a budget, naming what to pass instead."""
    warnings.warn(
        UnbudgetedSessionWarning(
            f"ProtoPromptSession {session_id!r} is run without a token budget: the run has no "
            "session_input_callback, so the whole stored history is sent, however long. Pass "
            "run_config=session.run_config(agent=agent, max_tokens=...) to Runner.run "
            "(docs/agents-sdk.md); this warning is given once per session object",
            session_id,
        ),
        stacklevel=2,
    )
