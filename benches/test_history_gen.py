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


def test_the_agentic_mix_holds_every_shape_of_the_item_rules():
    """Every kind of docs/item-graph.md's examples that a valid history may hold (all but
    controls and foreign shapes), and every form of item_shapes.FORMS, is in the agentic mix:
    a shape the generator misses (or the document gains) fails here, not silently in the
    benchmarks."""
    from item_shapes import NEVER_IN_A_VALID_HISTORY, doc_kinds, forms_of, kinds_of, FORMS

    required = doc_kinds() - NEVER_IN_A_VALID_HISTORY
    assert {"anonymous_tool_search_call", "anonymous_tool_search_output", "program"} <= required
    histories = [generate(4000, "agentic", seed) for seed in (0, 1)]
    kinds = sum((kinds_of(h) for h in histories), Counter())
    assert required <= set(kinds), sorted(required - set(kinds))
    forms = set().union(*(forms_of(h) for h in histories))
    assert forms == set(FORMS), sorted(set(FORMS) - forms)
    h = histories[0]
    # SDK-stored shell outputs have no status; anonymous searches have no call_id.
    assert all("status" not in it for it in h if it.get("type") == "shell_call_output")
    anon = [it for it in h if it.get("type", "").startswith("tool_search")]
    assert any("call_id" not in it for it in anon) and any("call_id" in it for it in anon)
    # multi-KB outputs, long reasoning
    assert max(len(it["output"]) for it in h if it.get("type") == "function_call_output") > 4000
    assert max(len(json.dumps(it)) for it in h if it.get("type") == "reasoning") > 10_000
    # English, Russian and code
    text = json.dumps(h, ensure_ascii=False)
    assert "the" in text and "договор" in text and "```" in text
    chat = Counter(it.get("type", "easy") for it in generate(1000, "chat", 0))
    assert set(chat) <= {"easy", "message", "reasoning", "web_search_call"}


def test_items_have_the_shapes_the_sdk_stores():
    """Model-emitted items round-trip through the openai output models the way
    ``RunItem.to_input_item()`` converts them (reasoning stored under the "omit" id policy
    round-trips with its id, then loses it as the SDK strips it); SDK-made outputs and the
    items an application adds to a turn's input match the input schema."""
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
        "custom_tool_call_output",
        "computer_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
    }
    app_made = {"configuration_update", "additional_tools"}
    seen = set()
    for mix in MIXES:
        for it in generate(3000, mix, 11) + next_turn(11, mix):
            t = it.get("type")
            seen.add(t)
            if t is None:
                assert set(it) == {"content", "role"}
                assert it["role"] in ("user", "developer", "system")
                in_adapter.validate_python(it)
            elif t == "local_shell_call_output":
                # What the SDK's local shell action stores (keyed by call_id, which the SDK
                # pairs on; the API schema's form has only `id`, docs/item-graph.md §2.2).
                assert set(it) == {"type", "call_id", "output"}
            elif t in sdk_made or t in app_made:
                in_adapter.validate_python(it)
                if t == "shell_call_output":
                    for chunk in it["output"]:
                        ResponseFunctionShellCallOutputContent.model_validate(chunk)
            elif t == "message" and it["role"] != "assistant":
                in_adapter.validate_python(it)
            elif t == "tool_search_output" and it.get("execution") == "client":
                in_adapter.validate_python(it)  # the application answers a client search
            elif t == "reasoning" and "id" not in it:
                model = out_adapter.validate_python(dict(it, id="rs_omitted"))
                assert _output_item_to_input_item(model) == dict(it, id="rs_omitted")
            else:
                model = out_adapter.validate_python(it)
                assert _output_item_to_input_item(model) == it, t
    assert {"program", "program_output", "tool_search_output", "mcp_call"} <= seen
    assert sdk_made | app_made | {"local_shell_call_output"} <= seen


def test_corpus_texts_size():
    texts = corpus_texts(50_000, seed=1)
    assert sum(len(t.encode()) for t in texts) >= 50_000
