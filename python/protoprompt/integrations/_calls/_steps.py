"""The shapes of a model call's input the filter reads: which items the model side emits,
where the newest step starts, the run's last user message, and the water level that
shares the room left among the newest step's tool outputs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

_MODEL_SIDE_TYPES = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "tool_search_call",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
        "program",
        "program_output",
        "compaction",
        "hosted_tool_call",
    }
)
"""Item types the model (or the server for it) emits; tool outputs and messages from the
client are the other side. Used to find the newest step when the filter has no record of the
previous call (its first call in a run, after a handoff)."""


def item_field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def is_user_message(item: Any) -> bool:
    return item_field(item, "role") == "user" and item_field(item, "type") in (None, "message")


def is_model_side(item: Any) -> bool:
    kind = item_field(item, "type")
    if kind == "tool_search_output":
        return bool(item_field(item, "execution") == "server")
    if kind in _MODEL_SIDE_TYPES:
        return True
    return bool(item_field(item, "role") == "assistant")


def newest_step_start(items: Sequence[Any], lo: int) -> int:
    """Start of the newest step at or after ``lo``: the trailing client items (tool outputs)
    and the model output run before them. ``len(items)`` when nothing follows ``lo``."""
    j = len(items)
    while j > lo and not is_model_side(items[j - 1]):
        j -= 1
    while j > lo and is_model_side(items[j - 1]):
        j -= 1
    return j


def last_user_message(items: Sequence[Any], lo: int) -> int | None:
    for i in range(len(items) - 1, lo - 1, -1):
        if is_user_message(items[i]):
            return i
    return None


def water_level(costs: list[int], room: int) -> int | None:
    """Largest cap with ``sum(min(c, cap)) <= room`` (``None`` if even 0 is too much)."""
    if room < 0:
        return None
    if sum(costs) <= room:
        return max(costs, default=0)
    ordered = sorted(costs)
    spent = 0
    for i, c in enumerate(ordered):
        rest = len(ordered) - i
        if spent + c * rest > room:
            return (room - spent) // rest
        spent += c
    return ordered[-1]
