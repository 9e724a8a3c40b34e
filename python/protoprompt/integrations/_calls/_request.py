"""What a model call sends besides its input items, and what it costs.

The SDK's model sends, with every call, the agent's instructions, the definitions of its
tools of every kind (function, hosted, MCP, handoffs) and, for an agent with an
``output_type``, the structured-output schema (Responses ``text.format``). All of it is read
by the model and all of it is in the per-call budget. Definitions are rendered by the SDK's
own Responses converter (``Converter.convert_tools`` and ``Converter.get_response_format``,
as ``OpenAIResponsesModel`` builds its request in 0.22.3, 0.23.1 and 0.24.0), on every call:
a schema edited in place is seen. Their costs are cached by a digest of what was rendered,
so an unchanged 30-tool agent is counted once.

What cannot be counted on the client is named instead: a stored ``prompt`` template is
expanded by the server (its text, tools and variables' rendering are unknown here).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from ... import _core
from ...packing import item_tokens
from ...plan import TOOLS_OVERHEAD, RequestCost
from .._sdk._names import (
    RESPONSES_CONVERTER,
    Agent,
    FunctionTool,
    Handoff,
    RunContextWrapper,
    handoff,
    output_schema_of,
)

__all__ = [
    "TOOLS_OVERHEAD",
    "RequestCosts",
    "RequestExtras",
    "output_format",
    "stable_digest",
    "tool_definitions",
]


def _json_like(value: Any, depth: int = 0) -> Any:
    """A JSON-shaped copy of a tool's configuration value (callables and objects dropped)."""
    if depth > 32:
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_like(v, depth + 1) for k, v in value.items() if not callable(v)}
    if isinstance(value, (list, tuple)):
        return [_json_like(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _json_like(dump(exclude_none=True), depth + 1)
        except Exception:  # noqa: BLE001 - not a model we can dump: leave it out
            return None
    return None


def _fallback_definition(tool: Any) -> dict[str, Any]:
    """A conservative definition when the SDK's converter cannot render ``tool``."""
    if isinstance(tool, FunctionTool):
        return {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
            "strict": tool.strict_json_schema,
        }
    if isinstance(tool, Handoff):
        return {
            "type": "function",
            "name": tool.tool_name,
            "description": tool.tool_description,
            "parameters": tool.input_json_schema,
        }
    out: dict[str, Any] = {"type": str(getattr(tool, "name", type(tool).__name__))}
    if dataclasses.is_dataclass(tool):
        for f in dataclasses.fields(tool):
            v = getattr(tool, f.name, None)
            if not callable(v) and not f.name.startswith("_"):
                out[f.name] = _json_like(v)
    return out


def tool_definitions(tools: Sequence[Any], handoffs: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The definitions the SDK sends for ``tools`` and ``handoffs``, as dicts.

    Rendered by the SDK's own Responses converter (function tools: name, description, JSON
    schema; hosted tools: their configuration; handoffs as function tools); a tool the
    converter refuses is rendered from its public fields instead. Each definition costs what
    :func:`~protoprompt.item_tokens` says for the dict — every field name and value counted
    as text, a conservative estimate of how the API renders tools — and a request with
    tools adds :data:`TOOLS_OVERHEAD`.
    """
    handoff_objs = [h if isinstance(h, Handoff) else handoff(h) for h in handoffs]
    try:
        if RESPONSES_CONVERTER is None:  # pragma: no cover - another SDK layout
            raise LookupError("the SDK has no Responses converter")
        converted = RESPONSES_CONVERTER.convert_tools(list(tools), handoff_objs)
        return [dict(t) for t in converted.tools if isinstance(t, Mapping)]
    except Exception:  # noqa: BLE001 - e.g. a computer tool not yet initialised
        return [_fallback_definition(t) for t in [*tools, *handoff_objs]]


def output_format(agent: Agent[Any]) -> dict[str, Any] | None:
    """The Responses ``text`` parameter the SDK sends for ``agent``'s ``output_type`` (the
    structured-output JSON schema), or ``None`` for plain-text output."""
    schema = output_schema_of(agent)
    if schema is None or RESPONSES_CONVERTER is None:
        return None
    rendered = RESPONSES_CONVERTER.get_response_format(schema)
    return dict(rendered) if isinstance(rendered, Mapping) else None


def _prompt_note(agent: Agent[Any]) -> str | None:
    prompt = getattr(agent, "prompt", None)
    if prompt is None:
        return None
    ident = prompt.get("id") if isinstance(prompt, Mapping) else None
    name = f" {ident!r}" if isinstance(ident, str) else " (chosen per call)"
    return (
        f"the stored prompt template{name}: the server expands it, so its text is not in the "
        "per-call budget"
    )


def _enabled_handoffs(agent: Agent[Any]) -> list[Any]:
    """The agent's handoffs; a handoff enabled by a callable counts (conservative)."""
    out = []
    for h in getattr(agent, "handoffs", ()) or ():
        obj = h if isinstance(h, Handoff) else handoff(h)
        if obj.is_enabled is False:
            continue
        out.append(obj)
    return out


async def _agent_tools(agent: Agent[Any], context: Any) -> list[Any]:
    """The tools the SDK sends for ``agent``: its own (a tool disabled by ``is_enabled=False``
    is left out, one with a callable counts) and its MCP servers' tools."""
    tools = [
        t
        for t in (getattr(agent, "tools", ()) or ())
        if not (isinstance(t, FunctionTool) and t.is_enabled is False)
    ]
    if getattr(agent, "mcp_servers", None):
        tools = [*await agent.get_mcp_tools(RunContextWrapper(context=context)), *tools]
    return tools


RequestExtras = RequestCost
"""The costs of what a call sends besides its input items (:class:`~protoprompt.plan.\
RequestCost`)."""


class RequestCosts:
    """Costs of rendered definitions, cached by a digest of what was rendered (bounded LRU):
    equal content is counted once, changed content (a schema edited in place) is counted
    again."""

    def __init__(self, capacity: int = 256) -> None:
        self._cache: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._capacity = capacity
        self.counted = 0
        """How many renderings were counted (not found in the cache)."""
        self._stable: OrderedDict[bytes, bytes] = OrderedDict()
        self.digested = 0
        """How many requests' stable digests were computed (not found by their content)."""

    def _cost(self, definitions: list[dict[str, Any]], encoding: str, overhead: int) -> int:
        if not definitions:
            return 0
        digest, _ = _core.digests(definitions)
        key = (encoding, digest)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        self.counted += 1
        tokens = overhead + sum(item_tokens(d, encoding=encoding).total for d in definitions)
        self._cache[key] = tokens
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return tokens

    async def extras(
        self, agent: Agent[Any], context: Any, instructions: str | None, encoding: str
    ) -> RequestExtras:
        """What the call costs besides its items: instructions, tools, output schema."""
        instructions_tokens = (
            item_tokens({"role": "system", "content": instructions}, encoding=encoding).total
            if instructions
            else 0
        )
        tools = await _agent_tools(agent, context)
        definitions = tool_definitions(tools, _enabled_handoffs(agent))
        tools_tokens = self._cost(definitions, encoding, TOOLS_OVERHEAD)
        text = output_format(agent)
        schema_tokens = self._cost([text], encoding, 0) if text is not None else 0
        note = _prompt_note(agent)
        return RequestExtras(
            instructions=instructions_tokens,
            tools=tools_tokens,
            output_schema=schema_tokens,
            not_counted=(note,) if note else (),
            digest=self._digest([instructions or "", definitions, text]),
        )

    def _digest(self, request: list[Any]) -> bytes:
        """The digest of what the call sends besides its items, stable across processes
        (the stored prefix compares it after a restart): computed once per content, found
        again by the process's content digest of the same values (key order included, so
        equal digests render to equal JSON)."""
        key, _ = _core.digests([request])
        found = self._stable.get(key)
        if found is not None:
            self._stable.move_to_end(key)
            return found
        self.digested += 1
        digest = stable_digest(request)
        self._stable[key] = digest
        while len(self._stable) > self._capacity:
            self._stable.popitem(last=False)
        return digest


def stable_digest(request: list[Any]) -> bytes:
    """The digest :meth:`RequestCosts.extras` reports for ``[instructions, tool definitions,
    output format]`` (of their JSON form: the same in every process)."""
    return hashlib.blake2b(
        json.dumps(request, sort_keys=True, default=str).encode(), digest_size=16
    ).digest()
