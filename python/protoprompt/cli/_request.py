"""``inspect``'s view of the rest of the request: its options (instructions, tools, a
Responses request file), reading them, and the request by section."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

from ..packing import PackResult
from ..plan import RequestCost, RequestSections, count_request, request_sections
from ._args import InspectError
from ._text import JsonReadError, read_json

_NOT_GIVEN = "not given: pass --instructions, --tools or --request"
_REQUEST_KEYS = ("instructions", "tools", "text", "input")
MAX_REQUEST_BYTES = 64 * 2**20
"""The largest ``--request`` / ``--tools`` file read."""


def add_request_arguments(parser: argparse.ArgumentParser) -> None:
    """``inspect``'s options for the rest of the request (instructions, tools, output schema,
    from a Responses request file) and its picture (``--html``)."""
    group = parser.add_argument_group(
        "the rest of the request (what each model call sends besides the items)"
    )
    group.add_argument(
        "--instructions",
        metavar="TEXT",
        help="the agent's instructions (counted as a system message)",
    )
    group.add_argument(
        "--tools",
        metavar="FILE",
        help="a JSON array of the tool definitions the model gets (as the Responses API "
        'takes them: {"type": "function", "name": ..., "parameters": ...})',
    )
    group.add_argument(
        "--request",
        metavar="FILE",
        help="a Responses request as JSON: its instructions, tools, text (the output "
        "schema) and input (the next turn's input) are used",
    )
    parser.add_argument(
        "--html",
        metavar="FILE",
        help="also write the plan as one self-contained HTML page to FILE (the budget by "
        "section, every unit kept, masked or dropped, with its reason on hover)",
    )


def _read_file_json(path: str, what: str) -> Any:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise InspectError(f"cannot read {what} {path!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_REQUEST_BYTES:
        raise InspectError(f"{what} {path!r} is larger than {MAX_REQUEST_BYTES} bytes")
    try:
        return read_json(data)
    except (json.JSONDecodeError, JsonReadError) as exc:
        raise InspectError(f"{what} {path!r} is not JSON: {exc}") from None


def _tool_list(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise InspectError(f"{where} must be a JSON array of tool definitions (objects)")
    return value


def read_request(
    instructions: str | None,
    tools: str | None,
    request: str | None,
    *,
    model: str | None,
    encoding: str | None,
) -> tuple[RequestCost | None, list[Any] | None]:
    """The request's cost besides the items from ``--instructions``, ``--tools`` and a
    ``--request`` file (``None``: none given), and the ``input`` of that file as the next
    turn's input (``None``: it has none)."""
    tool_defs: list[dict[str, Any]] = []
    output_format: dict[str, Any] | None = None
    new_input: list[Any] | None = None
    if request is not None:
        body = _read_file_json(request, "--request")
        found, tool_defs, output_format, new_input = _request_file(body, instructions, tools)
        instructions = found if instructions is None else instructions
    if tools is not None:
        tool_defs = _tool_list(_read_file_json(tools, "--tools"), "--tools")
    if request is None and instructions is None and tools is None:
        return None, new_input
    cost = count_request(
        instructions=instructions,
        tools=tool_defs,
        output_format=output_format,
        model=model,
        encoding=encoding,
    )
    if request is None:  # what the options did not give is not known
        cost = dataclasses.replace(
            cost,
            unknown=tuple(
                part
                for part, given in (
                    ("instructions", instructions),
                    ("tools", tools),
                    ("output_schema", None),
                )
                if given is None
            ),
        )
    return cost, new_input


def sections_of(
    result: PackResult, request: RequestCost | None, context_tokens: int
) -> RequestSections:
    """The request by section for ``inspect``: ``request`` (reserved in the pack besides
    ``context_tokens``, the context message) as its instructions, tools and output schema."""
    sections = request_sections(
        result,
        request=request,
        reserved=request.total if request is not None else 0,
        context=(context_tokens, 1 if context_tokens else 0),
        call=None,
        unknown=_NOT_GIVEN,
    )
    given = {
        "context_message": "empty: none given (--context-tokens)",
        "run_input": "empty: none given (--input, or the input of --request)",
    }
    return RequestSections(
        sections.max_tokens,
        tuple(
            dataclasses.replace(x, note=given[x.name]) if x.name in given and not x.items else x
            for x in sections
        ),
        sections.encoding,
    )


_Parts = tuple[str | None, list[dict[str, Any]], dict[str, Any] | None, list[Any] | None]


def _request_file(body: Any, instructions: str | None, tools: str | None) -> _Parts:
    """The instructions, tools, output format and input of a ``--request`` file's body
    (each given at most once: in the file or by its option)."""
    if not isinstance(body, dict):
        raise InspectError("--request must hold a JSON object (a Responses request)")
    if instructions is not None and body.get("instructions") is not None:
        raise InspectError("give the instructions once: --instructions or in --request")
    if tools is not None and body.get("tools") is not None:
        raise InspectError("give the tools once: --tools or in --request")
    found = body.get("instructions")
    if found is not None and not isinstance(found, str):
        raise InspectError("--request: instructions must be a string")
    tool_defs = []
    if body.get("tools") is not None:
        tool_defs = _tool_list(body["tools"], "--request: tools")
    return found, tool_defs, _output_format(body.get("text")), _input(body.get("input"))


def _output_format(text: Any) -> dict[str, Any] | None:
    """The ``text`` of a request when it asks for structured output, else ``None``."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise InspectError('--request: text must be an object ({"format": ...})')
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise InspectError('--request: text.format must be an object ({"type": ...})')
    return text if fmt.get("type") != "text" else None


def _input(raw: Any) -> list[Any] | None:
    """The ``input`` of a request as items (a string is one user message)."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if isinstance(raw, list):
        return raw
    if raw is not None:
        raise InspectError("--request: input must be a string or an array of items")
    return None
