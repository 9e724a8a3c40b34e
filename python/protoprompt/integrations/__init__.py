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

__all__ = ["ProtoPromptSession"]

_AGENTS_EXPORTS = frozenset(__all__)


def __getattr__(name: str) -> Any:
    if name in _AGENTS_EXPORTS:
        from . import agents as _agents  # raises the ImportError that names the extra

        value = getattr(_agents, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
