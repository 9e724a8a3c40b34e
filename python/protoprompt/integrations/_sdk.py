"""The OpenAI Agents SDK names the integration uses, imported once: without the SDK this
raises the ImportError that names the extra to install."""

from __future__ import annotations

from typing import Any

try:
    from agents import RunConfig
    from agents.items import ItemHelpers
    from agents.memory import OpenAIConversationsSession, Session, SessionSettings
    from agents.memory.session_settings import coerce_session_settings
    from agents.memory.sqlite_session import SQLiteSession
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "protoprompt.integrations.agents needs the OpenAI Agents SDK: "
        "pip install 'protoprompt[agents]'"
    ) from exc

try:
    from agents.run_internal import session_persistence as _session_persistence

    PREPARE_CODE: Any = _session_persistence.prepare_input_with_session.__code__
    """The code of the runner's ``prepare_input_with_session`` (0.22.3 and 0.24.0)."""
except (ImportError, AttributeError):  # pragma: no cover - another SDK layout: full reads
    PREPARE_CODE = None

__all__ = [
    "PREPARE_CODE",
    "ItemHelpers",
    "OpenAIConversationsSession",
    "RunConfig",
    "SQLiteSession",
    "Session",
    "SessionSettings",
    "coerce_session_settings",
]
