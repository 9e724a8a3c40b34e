"""The generated histories are what the Agents SDK stores, and are valid for protoprompt."""

from __future__ import annotations

import harness  # noqa: I001  (first: puts the benches' helper modules first)

harness.ensure_paths()

import json
from collections import Counter

import pytest

from history_gen import MIXES, corpus_texts, generate, new_user_message, next_turn

SEEDS = [0, 1, 2, 7, 42]
SIZES = [1, 2, 5, 37, 300]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mix", MIXES)
def test_sdk_sanitizer_leaves_history_unchanged(mix, seed):
    from agents.run_internal.items import drop_orphan_function_calls

    for n in SIZES:
        h = generate(n, mix, seed)
        assert len(h) == n
        assert drop_orphan_function_calls(h) == h
        assert drop_orphan_function_calls(h, pruning_indexes=set(range(len(h)))) == h
        # ... and with the next turn appended, as the SDK sees it one turn later.
        h2 = h + next_turn(seed, mix)
        assert drop_orphan_function_calls(h2, pruning_indexes=set(range(len(h2)))) == h2


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("mix", MIXES)
def test_protoprompt_graph_has_no_invalid_unit(mix, seed):
    import protoprompt

    for n in SIZES:
        h = generate(n, mix, seed)
        report = protoprompt.analyze(h, [{"role": "user", "content": "next"}])
        assert report.invalid_units == [], [(u.members, u.problems) for u in report.invalid_units]
        assert report.mandatory_history == []


@pytest.mark.parametrize("mix", MIXES)
def test_deterministic_and_json_clean(mix):
    a, b = generate(200, mix, 5), generate(200, mix, 5)
    assert a == b
    assert generate(200, mix, 6) != a
    assert json.loads(json.dumps(a, ensure_ascii=False)) == a
    assert next_turn(3, mix) == next_turn(3, mix)
    assert new_user_message(1)["role"] == "user"


def test_mixes_cover_the_item_kinds():
    h = generate(3000, "agentic", 0)
    kinds = Counter(it.get("type", "easy-" + it.get("role", "?")) for it in h)
    for t in (
        "easy-user",
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
        "shell_call",
        "shell_call_output",
        "tool_search_call",
        "tool_search_output",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "web_search_call",
        "apply_patch_call",
        "apply_patch_call_output",
        "program",
        "program_output",
    ):
        assert kinds[t] > 0, t
    # streamed shell outputs (several per call, SDK-stored: no status)
    per_call = Counter(it["call_id"] for it in h if it.get("type") == "shell_call_output")
    assert max(per_call.values()) > 1
    assert all("status" not in it for it in h if it.get("type") == "shell_call_output")
    # anonymous server tool search
    assert all("call_id" not in it for it in h if it.get("type", "").startswith("tool_search"))
    # parallel function calls, program children with caller, multi-KB outputs
    assert any(a.get("type") == b.get("type") == "function_call" for a, b in zip(h, h[1:]))
    assert any(it.get("caller", {}).get("type") == "program" for it in h)
    assert max(len(it["output"]) for it in h if it.get("type") == "function_call_output") > 4000
    # English, Russian and code
    text = json.dumps(h, ensure_ascii=False)
    assert "the" in text and "договор" in text and "```" in text
    chat = Counter(it.get("type", "easy") for it in generate(1000, "chat", 0))
    assert set(chat) <= {"easy", "message", "reasoning", "web_search_call"}


def test_items_have_the_shapes_the_sdk_stores():
    """Model-emitted items round-trip through the openai output models the way
    ``RunItem.to_input_item()`` converts them; SDK-made outputs match the input schema."""
    from pydantic import TypeAdapter
    from openai.types.responses import ResponseInputItemParam, ResponseOutputItem
    from openai.types.responses.response_function_shell_call_output_content import (
        ResponseFunctionShellCallOutputContent,
    )
    from agents.items import _output_item_to_input_item

    out_adapter = TypeAdapter(ResponseOutputItem)
    in_adapter = TypeAdapter(ResponseInputItemParam)
    sdk_made = {
        "function_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
    }
    seen = set()
    for mix in MIXES:
        for it in generate(400, mix, 11) + next_turn(11, mix):
            t = it.get("type")
            seen.add(t)
            if t is None:
                assert set(it) == {"content", "role"} and it["role"] == "user"
                in_adapter.validate_python(it)
            elif t in sdk_made:
                in_adapter.validate_python(it)
                if t == "shell_call_output":
                    for chunk in it["output"]:
                        ResponseFunctionShellCallOutputContent.model_validate(chunk)
            else:
                model = out_adapter.validate_python(it)
                assert _output_item_to_input_item(model) == it, t
    assert {"program", "program_output", "tool_search_output", "mcp_call"} <= seen


def test_corpus_texts_size():
    texts = corpus_texts(50_000, seed=1)
    assert sum(len(t.encode()) for t in texts) >= 50_000
