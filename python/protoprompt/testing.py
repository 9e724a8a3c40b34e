"""An offline model for the OpenAI Agents SDK: try protoprompt, and test your agents, without
an API key or a network.

:func:`offline_model` is an Agents SDK ``Model`` that answers at once and deterministically:
it calls the first function tool it is given once per run (arguments made from the tool's
JSON schema), answers with the structured output's schema when the agent has one, and
otherwise says ``(offline <model> model) You asked: <the last user message>``. Use it as an
agent's ``model=``; or, inside ``with offline_models():``, every agent whose model is a name
(``model="gpt-5"``, or the SDK's default) gets one, as the documentation's snippets and the
package's own tests do::

    from agents import Agent, Runner
    from protoprompt.testing import offline_models

    with offline_models():
        result = Runner.run_sync(Agent(name="a", model="gpt-5"), "Hi")
    print(result.final_output)   # (offline gpt-5 model) You asked: Hi

Token counting is unaffected: the model's *name* still picks the tokenizer of every plan.
Needs the agents extra (``pip install 'protoprompt[agents]'``); importing this module does
not import the SDK.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from typing import Any

from ._seams import tracing_disabled

__all__ = ["offline_model", "offline_models", "schema_value"]

_lock = threading.Lock()
_calls = [0]
"""Model calls since :func:`offline_models` began: ids of the items it makes stay unique."""


def _next_call() -> int:
    with _lock:
        _calls[0] += 1
        return _calls[0]


def _value(schema: dict[str, Any], defs: dict[str, Any], text: str, depth: int = 0) -> Any:
    """A value that satisfies a JSON schema (the SDK's strict schemas)."""
    if depth > 8:
        return None
    if "$ref" in schema:
        return _value(defs[schema["$ref"].rsplit("/", 1)[-1]], defs, text, depth + 1)
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return _value(schema[key][0], defs, text, depth + 1)
    if "enum" in schema:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    simple: dict[Any, Any] = {"number": 1.0, "boolean": True, "null": None}
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _value(v, defs, text, depth + 1) for k, v in props.items()}
    if kind == "array":
        return []
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), 1)
    if kind in simple:
        return simple[kind]
    return text


def schema_value(schema: dict[str, Any], text: str) -> Any:
    """A value satisfying the JSON ``schema``, with ``text`` for every string in it."""
    return _value(schema, schema.get("$defs", {}), text)


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


def _asked(items: list[Any]) -> tuple[str, bool]:
    """The last user message's text (or ``"question"``) and whether a function was called
    after it."""
    last_user = max((i for i, x in enumerate(items) if _field(x, "role") == "user"), default=-1)
    asked = _field(items[last_user], "content") if last_user >= 0 else ""
    question = asked if isinstance(asked, str) else "question"
    called = any(_field(x, "type") == "function_call" for x in items[last_user + 1 :])
    return question, called


def _require_agents() -> None:
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "protoprompt.testing needs the OpenAI Agents SDK: pip install 'protoprompt[agents]'"
        ) from exc


def offline_model(name: str | None = None) -> Any:
    """An Agents SDK ``Model`` that answers offline (see the module doc); ``name`` is the
    model it stands in for, shown in its answers.

    Raises:
        ImportError: the Agents SDK is not installed (the message names the extra).
    """
    _require_agents()
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.testing import assistant_message, function_call
    from agents.tool import FunctionTool
    from agents.usage import Usage

    class OfflineModel(Model):
        """An offline stand-in for a named model (see :mod:`protoprompt.testing`)."""

        async def get_response(
            self,
            system_instructions: Any,
            input: Any,  # noqa: A002 - the SDK's parameter name
            model_settings: Any,
            tools: Any,
            output_schema: Any,
            handoffs: Any,
            tracing: Any,
            **_: Any,
        ) -> Any:
            n = _next_call()
            items = [{"role": "user", "content": input}] if isinstance(input, str) else input
            question, called = _asked(list(items))
            functions = [t for t in tools if isinstance(t, FunctionTool)]
            if functions and not called:
                tool = functions[0]
                arguments = schema_value(tool.params_json_schema, question[:200])
                output = [function_call(tool.name, arguments, call_id=f"call_offline_{n}")]
            elif output_schema is not None and not output_schema.is_plain_text():
                value = schema_value(output_schema.json_schema(), "offline")
                if not output_schema.is_strict_json_schema() and isinstance(value, dict):
                    value = value.get("response", value)
                output = [assistant_message(json.dumps(value), item_id=f"msg_offline_{n}")]
            else:
                text = f"(offline {name or 'default'} model) You asked: {question[:80]}"
                output = [assistant_message(text, item_id=f"msg_offline_{n}")]
            return ModelResponse(output=output, usage=Usage(), response_id=f"resp_offline_{n}")

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the offline model does not stream: use Runner.run")

    return OfflineModel()


@contextlib.contextmanager
def offline_models() -> Iterator[None]:
    """Meanwhile every agent whose model is a name (or the SDK's default) gets
    :func:`offline_model` through the SDK's default ``MultiProvider``, and tracing is off
    (there is no key to export traces with). Both are restored on exit, also when nested.

    Raises:
        ImportError: the Agents SDK is not installed (the message names the extra).
    """
    _require_agents()
    from agents import set_tracing_disabled
    from agents.models.multi_provider import MultiProvider
    from agents.tracing import get_trace_provider

    original = MultiProvider.get_model
    # Whether tracing was off before (nested uses restore the outer one's state).
    was_disabled = tracing_disabled(get_trace_provider())
    with _lock:
        _calls[0] = 0
    MultiProvider.get_model = lambda self, name: offline_model(name)  # type: ignore[method-assign,assignment]
    set_tracing_disabled(True)
    try:
        yield
    finally:
        MultiProvider.get_model = original  # type: ignore[method-assign]
        set_tracing_disabled(was_disabled)
