"""Context messages: recognising the session callback's own context message in what the SDK
asks the session to store, and the hand-off (context variables) from ``get_items`` to the
callback and from the callback to the model filter, within one task."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import _sync
    from .session import ProtoPromptSession

MAX_PENDING_CONTEXTS = 64
"""Context messages remembered until the SDK writes them; older ones are forgotten."""
MAX_PENDING_MASKED = 4096
"""Masked copies remembered until the SDK writes them (direct calls of the callback); older
ones are forgotten."""
_CONTEXT_ROLES = ("system", "developer")


def _plain(item: Any) -> Any:
    """A dict view of an item (pydantic models are dumped), else the item itself."""
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        try:
            return dump(exclude_unset=True)
        except Exception:  # noqa: BLE001 - not a model we understand; it is not ours
            return None
    return None


def context_key(item: Any) -> tuple[str, str] | None:
    """``(role, text)`` when ``item`` has the shape of a context message, else ``None``.

    Accepts the forms the SDK may turn ``{"role": r, "content": text}`` into before
    ``add_items``: an added ``type: "message"``, content as a list of ``input_text`` parts.
    Any other field makes the item not a context message.
    """
    data = _plain(item)
    if not isinstance(data, Mapping):
        return None
    role = data.get("role")
    if role not in _CONTEXT_ROLES or data.get("type") not in (None, "message"):
        return None
    if set(data) - {"role", "content", "type"}:
        return None
    content = data.get("content")
    if isinstance(content, str):
        return (role, content)
    if isinstance(content, Sequence) and content:
        texts = []
        for part in content:
            part = _plain(part)
            if not isinstance(part, Mapping) or set(part) - {"type", "text"}:
                return None
            if part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return (role, "".join(texts))
    return None


def is_encrypted_envelope(item: Any) -> bool:
    """The shape ``EncryptedSession`` stores (``{"__enc__": 1, "v", "kid", "payload"}``)."""
    return (
        isinstance(item, Mapping)
        and item.get("__enc__") == 1
        and {"v", "kid", "payload"} <= item.keys()
    )


class Read:
    """What one ``get_items`` call returned, for the callback that follows it in the task."""

    __slots__ = ("facts", "session")

    def __init__(self, session: ProtoPromptSession, facts: _sync.Read) -> None:
        self.session = session
        self.facts = facts


class RunInput:
    """What the session callback returned for the run now starting in this task: the model
    filter pins its context message and new input on every model call of the run."""

    __slots__ = ("context_key", "n_items", "new_input", "session")

    def __init__(
        self,
        session: ProtoPromptSession,
        context_key: tuple[str, str] | None,
        new_input: list[Any],
        n_items: int,
    ) -> None:
        self.session = session
        self.context_key = context_key
        self.new_input = new_input
        self.n_items = n_items


RUN_INPUT: contextvars.ContextVar[RunInput | None] = contextvars.ContextVar(
    "protoprompt_run_input", default=None
)
"""Set by the session callback; read by the session's model filter in the same task."""

LAST_READ: contextvars.ContextVar[Read | None] = contextvars.ContextVar(
    "protoprompt_last_read", default=None
)
"""Set by ``ProtoPromptSession.get_items``; the SDK calls the input callback next, in the
same task, with (copies of) exactly those items."""
