"""Items as text: what a person (or a summarising model) reads of a stored history item.

The ``history`` layer of the memory store holds the turns a session evicted as text, never as
raw items (see ``docs/recall.md``), and :class:`~protoprompt.summaries.ModelSummarizer`
summarises that text. :func:`render_item` is the one rendering both use:

* messages as ``"<role>: <text>"`` (images, files and audio as ``[image]``, ``[file ...]``,
  ``[audio]``; refusals as text);
* tool calls with their arguments (``"tool call <name>(<arguments>)"``; shell commands,
  patches, code, searches likewise) and tool outputs with the tool they answer
  (``"tool output of <name>: <text>"``; screenshots and generated images as ``[image]``);
* items that carry nothing a person can read -- reasoning (its text is the model's, often
  encrypted), compaction payloads, configuration and tool listings -- render as ``None``.

Whitespace-free runs longer than :data:`MAX_RUN` characters (minified JSON, base64) are
broken after punctuation, or every :data:`MAX_RUN` characters, so that a long output splits
into passages of bounded size.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_RUN", "RenderedItem", "render_item", "render_items"]

MAX_RUN = 120
"""Longest run of non-whitespace characters kept whole in rendered text."""

_LONG_RUN = re.compile(rf"\S{{{MAX_RUN + 1},}}")
_BREAK_AFTER = re.compile(r"([,;:}\]])(?=\S)")
_DATA_URL = re.compile(r"data:[\w.+-]+/[\w.+-]+;base64,[A-Za-z0-9+/=]+")

_CALLS = {
    "function_call": "arguments",
    "custom_tool_call": "input",
    "mcp_approval_request": "arguments",
    "tool_search_call": "arguments",
}
_OUTPUTS = (
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "shell_call_output",
    "apply_patch_call_output",
    "computer_call_output",
    "program_output",
    "tool_search_output",
)
_SILENT = (
    "reasoning",
    "compaction",
    "configuration_update",
    "additional_tools",
    "mcp_list_tools",
    "item_reference",
    "compaction_trigger",
)


@dataclass(frozen=True)
class RenderedItem:
    """One item as text, with a short label saying what it is."""

    label: str
    """What the item is, e.g. ``"user message"``, ``"tool call lookup"``,
    ``"tool output of lookup"``."""
    text: str
    """The item as text (starts with the label's role or kind)."""


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _unbroken(text: str) -> str:
    """``text`` with long whitespace-free runs broken (see the module note)."""

    def split(match: re.Match[str]) -> str:
        run = _BREAK_AFTER.sub(r"\1 ", match.group(0))
        pieces = []
        for word in run.split(" "):
            while len(word) > MAX_RUN:
                pieces.append(word[:MAX_RUN])
                word = word[MAX_RUN:]
            pieces.append(word)
        return " ".join(pieces)

    text = _DATA_URL.sub("[image]", text)
    return _LONG_RUN.sub(split, text) if _LONG_RUN.search(text) else text


def _json(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


def _content(content: Any) -> str:
    """The text of message content or a tool output (a str or a list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, Sequence):
        return _json(content)
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
            continue
        kind = _field(part, "type")
        text = _field(part, "text")
        if isinstance(text, str):
            parts.append(text)
        elif kind == "refusal" and isinstance(_field(part, "refusal"), str):
            parts.append(_field(part, "refusal"))
        elif kind in ("input_image", "computer_screenshot", "image"):
            parts.append("[image]")
        elif kind == "input_file":
            name = _field(part, "filename")
            parts.append(f"[file {name}]" if isinstance(name, str) else "[file]")
        elif kind == "input_audio":
            parts.append("[audio]")
        else:
            stdout, stderr = _field(part, "stdout"), _field(part, "stderr")
            if isinstance(stdout, str) or isinstance(stderr, str):
                parts.extend(s for s in (stdout, stderr) if isinstance(s, str) and s)
            elif part is not None:
                parts.append(_json(part))
    return "\n".join(p for p in parts if p)


def _call_text(kind: str, item: Any) -> tuple[str, str] | None:
    """``(name, text)`` of a tool call item, else ``None``."""
    if kind in _CALLS:
        name = _field(item, "name")
        if not isinstance(name, str):
            name = kind.removesuffix("_call")
        return name, f"{name}({_json(_field(item, _CALLS[kind]) or '')})"
    action = _field(item, "action")
    if kind == "shell_call":
        commands = _field(action, "commands")
        text = "; ".join(c for c in commands if isinstance(c, str)) if commands else ""
        return "shell", f"shell: {text}"
    if kind == "local_shell_call":
        command = _field(action, "command")
        text = " ".join(c for c in command if isinstance(c, str)) if command else ""
        return "shell", f"shell: {text}"
    if kind == "computer_call":
        return "computer", f"computer: {_json(action)}"
    if kind == "apply_patch_call":
        op = _field(item, "operation")
        path, diff = _field(op, "path"), _field(op, "diff")
        return "apply_patch", f"apply_patch {_field(op, 'type') or ''} {path or ''}\n{diff or ''}"
    if kind == "program":
        return "program", f"program:\n{_field(item, 'code') or ''}"
    if kind == "web_search_call":
        return "web_search", f"web_search: {_json(_field(action, 'query') or action or '')}"
    if kind == "file_search_call":
        found = [_field(r, "text") for r in _field(item, "results") or ()]
        queries = "; ".join(q for q in _field(item, "queries") or () if isinstance(q, str))
        texts = "\n".join(t for t in found if isinstance(t, str))
        return "file_search", f"file_search: {queries}\n{texts}".rstrip()
    if kind == "code_interpreter_call":
        logs = [_field(o, "logs") for o in _field(item, "outputs") or ()]
        text = "\n".join(t for t in logs if isinstance(t, str))
        code = _field(item, "code") or ""
        return "code_interpreter", f"code_interpreter:\n{code}\n{text}".rstrip()
    if kind == "mcp_call":
        name = _field(item, "name")
        output = _field(item, "output") or _field(item, "error") or ""
        return str(name), f"{name}({_json(_field(item, 'arguments') or '')}) -> {_json(output)}"
    if kind == "image_generation_call":
        return "image_generation", "image_generation: [image]"
    return None


def render_item(item: Any, names: Mapping[str, str] | None = None) -> RenderedItem | None:
    """``item`` as text (see the module note), or ``None`` when it has no readable text.

    ``names``: tool names by call id, so an output says which tool it answers (see
    :func:`render_items`); without one an output names its call id."""
    kind = _field(item, "type")
    role = _field(item, "role")
    if kind in _SILENT:
        return None
    if kind in (None, "message") and isinstance(role, str):
        text = _content(_field(item, "content"))
        return RenderedItem(f"{role} message", _unbroken(f"{role}: {text}"))
    if not isinstance(kind, str):
        return None
    if kind in _OUTPUTS or kind == "mcp_approval_response":
        call_id = _field(item, "call_id")
        if kind == "mcp_approval_response":
            call_id = _field(item, "approval_request_id")
            approve = _field(item, "approve")
            body = ("approved" if approve else "denied") + (
                f": {_field(item, 'reason')}" if _field(item, "reason") else ""
            )
        elif kind == "program_output":
            body = _content(_field(item, "result") or _field(item, "output"))
        elif kind == "tool_search_output":
            tools = _field(item, "tools") or ()
            body = ", ".join(str(_field(t, "name")) for t in tools)
        else:
            body = _content(_field(item, "output"))
        name = names.get(call_id) if names is not None and isinstance(call_id, str) else None
        label = f"tool output of {name}" if name else "tool output"
        if not name and isinstance(call_id, str):
            label += f" ({call_id})"
        return RenderedItem(label, _unbroken(f"{label}: {body}"))
    call = _call_text(kind, item)
    if call is None:
        return None
    name, text = call
    return RenderedItem(f"tool call {name}", _unbroken(f"tool call {text}"))


def tool_names(items: Iterable[Any]) -> dict[str, str]:
    """Tool names by call id for the tool calls among ``items``."""
    names: dict[str, str] = {}
    for item in items:
        kind = _field(item, "type")
        call_id = _field(item, "call_id")
        if kind == "mcp_approval_request":
            call_id = _field(item, "id")
        if not isinstance(call_id, str) or not isinstance(kind, str):
            continue
        call = _call_text(kind, item)
        if call is not None:
            names[call_id] = call[0]
    return names


def render_items(items: Sequence[Any]) -> list[RenderedItem | None]:
    """:func:`render_item` of each of ``items``, outputs named by the calls among them."""
    names = tool_names(items)
    return [render_item(item, names) for item in items]
