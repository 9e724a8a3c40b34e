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
    from agents.tracing import AgentSpanData, get_current_span
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "protoprompt.integrations needs the OpenAI Agents SDK: pip install 'protoprompt[agents]'"
    ) from exc

try:
    from agents.models.openai_responses import Converter

    RESPONSES_CONVERTER: Any = Converter
    """The SDK's Responses converter: renders tool definitions as the API receives them."""
except ImportError:  # pragma: no cover - another SDK layout: tools rendered from their fields
    RESPONSES_CONVERTER = None

try:
    from agents.run_internal.turn_preparation import get_output_schema

    output_schema_of: Any = get_output_schema
    """The SDK's own ``output_type`` -> output schema resolution (``None``: plain text)."""
except ImportError:  # pragma: no cover - another SDK layout

    def output_schema_of(agent: Any) -> Any:
        from agents.agent_output import AgentOutputSchema, AgentOutputSchemaBase

        output_type = getattr(agent, "output_type", None)
        if output_type is None or output_type is str:
            return None
        if isinstance(output_type, AgentOutputSchemaBase):
            return output_type
        return AgentOutputSchema(output_type)


try:
    from agents.run_internal.items import _DEDUPE_EARLIEST_ANCHOR_ITEM_TYPES, _dedupe_key

    DEDUPE_KEY: Any = _dedupe_key
    """The SDK's de-duplication key of an input item (what ``deduplicate_input_items_
    preferring_latest`` collapses after the model filter)."""
    DEDUPE_ANCHOR_TYPES: frozenset[str] = frozenset(_DEDUPE_EARLIEST_ANCHOR_ITEM_TYPES)
    """Item types whose first occurrence keeps its position in that collapse."""
except ImportError:  # pragma: no cover - another SDK layout: no de-dup simulation
    DEDUPE_KEY = None
    DEDUPE_ANCHOR_TYPES = frozenset()

__all__ = [
    "DEDUPE_ANCHOR_TYPES",
    "DEDUPE_KEY",
    "RESPONSES_CONVERTER",
    "Agent",
    "AgentSpanData",
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
    "get_current_span",
    "handoff",
    "output_schema_of",
]
