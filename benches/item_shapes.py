"""The item shapes ``docs/item-graph.md`` lists, and which of them a list of items holds.

The generators of histories (``benches/history_gen.py``, the property tests'
``tests/packing/test_properties.py``) must produce every one of them, so that benchmarks and
property tests see what real sessions hold; their tests compare what they generate with:

* :func:`doc_kinds` -- the kind (protoprompt's classification) of every example item in
  the document: the JSON lines of its catalogue and the items of its test vectors. A kind
  the document gains is then required of the generators without anyone listing it here.
* :data:`FORMS` -- the forms in which the SDK stores those items that a single item does not
  show (streamed outputs, program children, approval chains, id-less reasoning, ...), each
  with the section that describes it and a detector.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parent.parent / "docs" / "item-graph.md"

NEVER_IN_A_VALID_HISTORY = frozenset(
    {
        # V3 (§7): input-only controls are invalid in history.
        "compaction_trigger",
        "item_reference",
        # V1 (§1.7, §5, §8): shapes that are never valid Responses input.
        "hosted_tool_call",
        "chat_tool_calls",
        "chat_tool_message",
        "client_tool_search_call_without_call_id",
        "client_tool_search_output_without_call_id",
        "unknown_role",
        "unknown_type",
        "untyped",
    }
)
"""Kinds a valid stored history never holds (a valid-history generator is excused them)."""


def doc_examples(doc: Path = DOC) -> list[dict[str, Any]]:
    """Every example item of the document: the lines of its ```json blocks and the items
    of its test vectors' ``H:`` / ``N:`` lines."""
    items: list[dict[str, Any]] = []
    in_json = False
    for line in doc.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_json = line.strip() == "```json"
            continue
        if in_json and line.startswith("{"):
            items.append(json.loads(line))
        match = re.match(r"^[HN]: (\[.*\])$", line)
        if match:
            items.extend(json.loads(match.group(1)))
    return items


def kinds_of(items: Sequence[Any]) -> Counter[str]:
    """How many items of each kind (protoprompt's classification) ``items`` holds."""
    import protoprompt as pp

    kinds: Counter[str] = Counter()
    for unit in pp.analyze(list(items), []).units:
        kinds.update(unit.kinds)
    return kinds


def doc_kinds(doc: Path = DOC) -> set[str]:
    """The kinds of the document's example items (one analysis per item: each alone)."""
    return {k for item in doc_examples(doc) for k in kinds_of([item])}


def _get(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, dict) else None


def _program_owned(item: Any) -> bool:
    caller = _get(item, "caller")
    return isinstance(caller, dict) and caller.get("type") == "program"


_HOSTED = {
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
}


def _streamed_shell(items: Sequence[Any]) -> bool:
    outputs = Counter(_get(i, "call_id") for i in items if _get(i, "type") == "shell_call_output")
    return any(n > 1 for n in outputs.values())


def _anonymous(item: Any, kind: str) -> bool:
    return _get(item, "type") == kind and not isinstance(_get(item, "call_id"), str)


def _streamed_anonymous_search(items: Sequence[Any]) -> bool:
    """An anonymous search call followed by two or more anonymous outputs (§3, §5)."""
    run = -1  # outputs since the last anonymous call (-1: none yet)
    for item in items:
        if _anonymous(item, "tool_search_call"):
            run = 0
        elif _anonymous(item, "tool_search_output") and run >= 0:
            run += 1
            if run >= 2:
                return True
    return False


def _approval_chain(items: Sequence[Any]) -> bool:
    """A request answered by a response, then the MCP call it approved (§1.5, E5)."""
    requests = {_get(i, "id") for i in items if _get(i, "type") == "mcp_approval_request"}
    answered = {
        _get(i, "approval_request_id") for i in items if _get(i, "type") == "mcp_approval_response"
    }
    called = {_get(i, "approval_request_id") for i in items if _get(i, "type") == "mcp_call"}
    return bool(requests & answered & called)


def _parallel_calls(items: Sequence[Any]) -> bool:
    return any(
        _get(a, "type") == _get(b, "type") == "function_call" for a, b in zip(items, items[1:])
    )


FORMS: dict[str, tuple[str, Callable[[Sequence[Any]], bool]]] = {
    "streamed shell output": ("§3", _streamed_shell),
    "streamed anonymous tool search": ("§3, §5", _streamed_anonymous_search),
    "program child": ("§4.1", lambda items: any(_program_owned(i) for i in items)),
    "program-owned hosted call": (
        "§1.4, §4.1",
        lambda items: any(_program_owned(i) and _get(i, "type") in _HOSTED for i in items),
    ),
    "approval chain": ("§1.5", _approval_chain),
    "id-less reasoning": (
        "§6.4 (V9)",
        lambda items: any(_get(i, "type") == "reasoning" and "id" not in i for i in items),
    ),
    "Claude thinking": (
        "§1.2",
        lambda items: any(
            _get(i, "type") == "reasoning"
            and isinstance(_get(i, "provider_data"), dict)
            and isinstance(_get(i, "provider_data").get("thinking_blocks"), list)
            for i in items
        ),
    ),
    "Gemini thought signature": (
        "§1.3",
        lambda items: any(
            _get(i, "type") == "function_call"
            and isinstance(_get(i, "provider_data"), dict)
            and isinstance(_get(i, "provider_data").get("thought_signature"), str)
            for i in items
        ),
    ),
    "placeholder ids": (
        "§1.1, §1.8",
        lambda items: any(_get(i, "id") == "__fake_id__" for i in items),
    ),
    "parallel calls": ("§1.3", _parallel_calls),
}
"""Forms of docs/item-graph.md that a kind alone does not show: name -> (section, detector)."""


def forms_of(items: Sequence[Any]) -> set[str]:
    """The :data:`FORMS` that ``items`` holds."""
    return {name for name, (_, holds) in FORMS.items() if holds(items)}
