"""The recall query of a turn: the text of its latest user message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def field_of(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def message_text(item: Any) -> str | None:
    """Text of a user message item (plain or structured content), else ``None``."""
    if field_of(item, "role") != "user" or field_of(item, "type") not in (None, "message"):
        return None
    content = field_of(item, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [
            field_of(part, "text")
            for part in content
            if field_of(part, "type") in ("input_text", "text")
            and isinstance(field_of(part, "text"), str)
        ]
        return "\n".join(parts)
    return None


def latest_user_text(new_input: Sequence[Any], history: Sequence[Any] = ()) -> str:
    """The text of the latest user message of ``new_input``, else of ``history``.

    Structured content counts: the ``input_text`` parts of a message are joined with
    newlines (images and files carry no query text). Returns ``""`` when neither list holds
    a user message.
    """
    for items in (new_input, history):
        for item in reversed(items):
            text = message_text(item)
            if text is not None:
                return text
    return ""
