"""``protoprompt count``: tokens of a text, or of input items (JSONL or a JSON array)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import ProtoPromptError
from ..packing import count_tokens, encoding_for_model, item_tokens
from ._text import JsonReadError, read_json, terminal_safe

__all__ = ["CountError", "ParsedInput", "count_input", "parse_input", "render_count"]

Mode = Literal["auto", "text", "items"]


class CountError(Exception):
    """The input cannot be counted as asked (the message names the line or item)."""


@dataclass(frozen=True)
class ParsedInput:
    kind: Literal["text", "items"]
    text: str
    items: list[Any]
    lines: list[int]
    """For items: the 1-based line each item starts on."""


def _json_lines(text: str, name: str) -> tuple[list[Any], list[int]] | None:
    """Items of a JSONL text (blank lines skipped), or ``None`` if a line is not a JSON object."""
    items: list[Any] = []
    lines: list[int] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = read_json(line)
        except json.JSONDecodeError:
            return None
        except JsonReadError as exc:
            raise CountError(f"{name}:{number}: {exc}") from None
        if not isinstance(value, dict):
            return None
        items.append(value)
        lines.append(number)
    return (items, lines) if items else None


def _json_array(text: str, name: str) -> list[Any] | None:
    try:
        value = read_json(text)
    except json.JSONDecodeError:
        return None
    except JsonReadError as exc:
        raise CountError(f"{name}: {exc}") from None
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return value
    return None


def parse_input(text: str, mode: Mode = "auto", name: str = "-") -> ParsedInput:
    """Decide what ``text`` is: items (a JSON array of objects, or one JSON object per line)
    or plain text. ``mode="items"`` insists on items and says which line is wrong."""
    if mode == "text":
        return ParsedInput("text", text, [], [])
    array = _json_array(text, name)
    if array is not None:
        return ParsedInput("items", text, array, [])
    jsonl = _json_lines(text, name)
    if jsonl is not None:
        return ParsedInput("items", text, jsonl[0], jsonl[1])
    if mode == "auto":
        return ParsedInput("text", text, [], [])
    # mode == "items": find the first line that is not an item, to say so.
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = read_json(line)
        except json.JSONDecodeError as exc:
            raise CountError(
                f"{name}:{number}: not JSON ({exc.msg}); expected one input "
                "item (a JSON object) per line, or a JSON array of items"
            ) from None
        if not isinstance(value, dict):
            raise CountError(
                f"{name}:{number}: a JSON {type(value).__name__}, not an item (a JSON object)"
            )
    raise CountError(f"{name}: no input items (empty input)")


def count_input(
    parsed: ParsedInput, *, model: str | None, encoding: str | None, name: str = "-"
) -> dict[str, Any]:
    """Token counts of parsed input, as JSON-able data."""
    enc = (
        encoding
        if encoding is not None
        else (encoding_for_model(model) if model is not None else "o200k_base")
    )
    if parsed.kind == "text":
        return {
            "kind": "text",
            "encoding": enc,
            "tokens": count_tokens(parsed.text, encoding=enc),
            "characters": len(parsed.text),
        }
    rows = []
    for index, item in enumerate(parsed.items):
        where = f"{name}:{parsed.lines[index]}" if parsed.lines else f"{name}: item {index}"
        try:
            cost = item_tokens(item, encoding=enc)
        except ProtoPromptError as exc:
            raise CountError(f"{where}: {exc}") from None
        rows.append(
            {
                "index": index,
                "line": parsed.lines[index] if parsed.lines else None,
                "type": item.get("type")
                if isinstance(item.get("type"), str)
                else ("message" if "role" in item else None),
                "role": item.get("role") if isinstance(item.get("role"), str) else None,
                "text": cost.text,
                "media": cost.media,
                "overhead": cost.overhead,
                "tokens": cost.total,
            }
        )
    return {
        "kind": "items",
        "encoding": enc,
        "tokens": sum(r["tokens"] for r in rows),
        "items": rows,
    }


def render_count(result: dict[str, Any]) -> str:
    """The counts for a terminal."""
    if result["kind"] == "text":
        return (
            f"{result['tokens']} tokens ({result['encoding']}), {result['characters']} characters"
        )
    header = ("item", "line", "type", "role", "text", "media", "overhead", "tokens")
    table = [header]
    table.extend(
        (
            str(r["index"]),
            "-" if r["line"] is None else str(r["line"]),
            terminal_safe(r["type"] or "-"),
            terminal_safe(r["role"] or "-"),
            str(r["text"]),
            str(r["media"]),
            str(r["overhead"]),
            str(r["tokens"]),
        )
        for r in result["items"]
    )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    left = {2, 3}
    lines = [
        "  ".join(
            row[i].ljust(widths[i]) if i in left else row[i].rjust(widths[i])
            for i in range(len(header))
        ).rstrip()
        for row in table
    ]
    n = len(result["items"])
    lines.append(
        f"{result['tokens']} tokens in {n} item{'s' if n != 1 else ''} ({result['encoding']})"
    )
    return "\n".join(lines)
