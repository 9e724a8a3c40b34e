"""The OpenAI Agents SDK names the integration uses, imported once: without the SDK this
raises the ImportError that names the extra to install."""

from __future__ import annotations

from typing import Any

try:
    from agents import Agent, RunConfig, RunContextWrapper
    from agents.handoffs import Handoff, handoff
    from agents.items import ItemHelpers
    from agents.lifecycle import RunHooksBase
    from agents.memory import OpenAIConversationsSession, Session, SessionSettings
    from agents.memory.session_settings import coerce_session_settings
    from agents.memory.sqlite_session import SQLiteSession
    from agents.run_config import CallModelData, ModelInputData
    from agents.tool import FunctionTool
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "protoprompt.integrations needs the OpenAI Agents SDK: pip install 'protoprompt[agents]'"
    ) from exc

try:
    from agents.run_internal import session_persistence as _session_persistence

    PREPARE_CODE: Any = _session_persistence.prepare_input_with_session.__code__
    """The code of the runner's ``prepare_input_with_session`` (0.22.3 and 0.24.0)."""
except (ImportError, AttributeError):  # pragma: no cover - another SDK layout: full reads
    PREPARE_CODE = None


try:
    from agents.models.openai_responses import Converter

    RESPONSES_CONVERTER: Any = Converter
    """The SDK's Responses converter: renders tool definitions as the API receives them."""
except ImportError:  # pragma: no cover - another SDK layout: tools rendered from their fields
    RESPONSES_CONVERTER = None

__all__ = [
    "PREPARE_CODE",
    "RESPONSES_CONVERTER",
    "Agent",
    "CallModelData",
    "FunctionTool",
    "Handoff",
    "ItemHelpers",
    "ModelInputData",
    "OpenAIConversationsSession",
    "RunConfig",
    "RunContextWrapper",
    "RunHooksBase",
    "SQLiteSession",
    "Session",
    "SessionSettings",
    "coerce_session_settings",
    "handoff",
]
