"""Integrations with agent frameworks.

``from protoprompt.integrations import ProtoPromptSession`` loads the OpenAI Agents SDK
integration on first use. Importing :mod:`protoprompt` (or this package) never imports the
SDK; using the integration without it raises an :class:`ImportError` that names the extra
to install: ``pip install 'protoprompt[agents]'``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agents import ProtoPromptSession
    from .audit import AuditedCall, AuditSummary, BudgetAudit
    from .compaction import CompactionCheck, CompactionTrigger, compaction_trigger
    from .model_filter import ModelCallPlan, ModelInputFilter, TruncatedOutput, model_input_filter

__all__ = [
    "AuditSummary",
    "AuditedCall",
    "BudgetAudit",
    "CompactionCheck",
    "CompactionTrigger",
    "ModelCallPlan",
    "ModelInputFilter",
    "ProtoPromptSession",
    "TruncatedOutput",
    "compaction_trigger",
    "model_input_filter",
]

_MODULES = {
    "AuditSummary": "audit",
    "AuditedCall": "audit",
    "BudgetAudit": "audit",
    "CompactionCheck": "compaction",
    "CompactionTrigger": "compaction",
    "compaction_trigger": "compaction",
    "ProtoPromptSession": "agents",
    "ModelCallPlan": "model_filter",
    "ModelInputFilter": "model_filter",
    "TruncatedOutput": "model_filter",
    "model_input_filter": "model_filter",
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        import importlib

        # raises the ImportError that names the extra when the SDK is missing
        module = importlib.import_module(f".{_MODULES[name]}", __name__)
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
