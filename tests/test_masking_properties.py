"""Property tests of masked packs: random histories of every item shape (those of
``test_properties``) plus every tool-output shape with long payloads, packed with random
``Masking``. Every masked request is within the budget, a fixed point of the SDK's
sanitizer, an item graph with nothing invalid, leaves the caller's items as they were, and
equals the pure-Python reference (``benches/reference_packer.py``), a ``HistoryIndex`` pack
turn by turn, and a pack of a token window.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import protoprompt as pp

items_mod = pytest.importorskip("agents.run_internal.items")
drop_orphan_function_calls = items_mod.drop_orphan_function_calls

from reference_packer import ReferencePacker, units_of  # noqa: E402
from test_properties import FRAGMENTS, _fragment  # noqa: E402

OUTPUT_FRAGMENTS = [
    "function_long",
    "function_parts",
    "custom_long",
    "shell_long",
    "local_shell_long",
    "apply_patch_long",
    "computer",
    "mcp_call_long",
    "tool_search",
    "anon_tool_search",
]


def _output_fragment(kind: str, i: int, text: str) -> list[dict[str, Any]]:
    rs = {"type": "reasoning", "id": f"rsm_{i}", "summary": [], "encrypted_content": "gAAAA"}
    if kind in ("function_long", "function_parts"):
        output: Any = text
        if kind == "function_parts":
            output = [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": "https://example.com/i.png", "detail": "low"},
            ]
        return [
            rs,
            {"type": "function_call", "call_id": f"mf{i}", "name": "fetch", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"mf{i}", "output": output},
        ]
    if kind == "custom_long":
        return [
            {"type": "custom_tool_call", "call_id": f"mk{i}", "name": "grep", "input": "x"},
            {"type": "custom_tool_call_output", "call_id": f"mk{i}", "output": text},
        ]
    if kind == "shell_long":
        call = {
            "type": "shell_call",
            "call_id": f"ms{i}",
            "action": {"commands": ["ls"]},
            "status": "completed",
        }
        chunk = {"stdout": text, "stderr": "err", "outcome": {"type": "exit", "exit_code": 1}}
        return [
            call,
            {"type": "shell_call_output", "call_id": f"ms{i}", "output": [chunk]},
            {"type": "shell_call_output", "call_id": f"ms{i}", "output": [chunk, chunk]},
        ]
    if kind == "local_shell_long":
        return [
            {
                "type": "local_shell_call",
                "id": f"lshm_{i}",
                "call_id": f"ml{i}",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
                "status": "completed",
            },
            {"type": "local_shell_call_output", "call_id": f"ml{i}", "output": text},
        ]
    if kind == "apply_patch_long":
        return [
            {
                "type": "apply_patch_call",
                "call_id": f"ma{i}",
                "status": "completed",
                "operation": {"type": "delete_file", "path": "x"},
            },
            {
                "type": "apply_patch_call_output",
                "call_id": f"ma{i}",
                "status": "failed",
                "output": text,
            },
        ]
    if kind == "computer":
        return [
            {
                "type": "computer_call",
                "id": f"cum_{i}",
                "call_id": f"mu{i}",
                "action": {"type": "screenshot"},
                "pending_safety_checks": [],
                "status": "completed",
            },
            {
                "type": "computer_call_output",
                "call_id": f"mu{i}",
                "output": {"type": "computer_screenshot", "file_id": f"file_{i}"},
            },
        ]
    if kind == "mcp_call_long":
        return [
            rs,
            {
                "type": "mcp_call",
                "id": f"mcpm_{i}",
                "name": "crm",
                "server_label": "s",
                "arguments": "{}",
                "status": "completed",
                "output": text,
            },
        ]
    tools = [
        {
            "type": "function",
            "name": "crm_find",
            "description": text,
            "strict": True,
            "parameters": {
                "type": "object",
                "title": "args",
                "properties": {"q": {"type": "string", "description": text[:80]}},
            },
        }
    ]
    if kind == "tool_search":
        return [
            {
                "type": "tool_search_call",
                "call_id": f"mt{i}",
                "execution": "client",
                "arguments": {"query": "crm"},
                "status": "completed",
            },
            {
                "type": "tool_search_output",
                "call_id": f"mt{i}",
                "execution": "client",
                "tools": tools,
                "status": "completed",
            },
        ]
    return [
        rs,
        {"type": "tool_search_call", "id": f"tsm_{i}", "arguments": {}, "status": "completed"},
        {"type": "tool_search_output", "id": f"tsom_{i}", "tools": tools, "status": "completed"},
    ]


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[dict], list[dict]]:
    ids = itertools.count()
    words = st.text(alphabet='abc xyzабв\n{}"🙂', min_size=0, max_size=60)
    history: list[dict] = []
    kinds = st.lists(st.sampled_from(FRAGMENTS + OUTPUT_FRAGMENTS * 4), max_size=30)
    for kind in draw(kinds):
        text = draw(words)
        if kind in OUTPUT_FRAGMENTS:
            text = (text or "out") + " line of output 7\n"
            history += _output_fragment(kind, next(ids), text * draw(st.integers(1, 40)))
        else:
            history += _fragment(kind, ids, text)
    ending = draw(st.sampled_from(["user", "resume_call"]))
    if ending == "resume_call":
        history.append({"type": "function_call", "call_id": "tail", "name": "f", "arguments": "{}"})
        new_input = [{"type": "function_call_output", "call_id": "tail", "output": "x " * 200}]
    else:
        new_input = [{"role": "user", "content": draw(words) or "next"}]
    return history, new_input


maskings = st.builds(
    pp.Masking,
    excerpt_tokens=st.integers(16, 120),
    after_turns=st.one_of(st.none(), st.integers(0, 4)),
)


def _budget(history: list[dict], new_input: list[dict], share: float, reserve: int) -> int:
    """A budget that holds the mandatory part and ``share`` of the history's whole cost."""
    try:
        whole = pp.pack(history, new_input, 2**62)
    except pp.ProtoPromptError:
        return reserve
    mandatory = whole.new_input_tokens + whole.dependency_tokens
    return reserve + mandatory + int(share * whole.history_tokens)


@pytest.fixture(scope="module")
def reference() -> ReferencePacker:
    return ReferencePacker("o200k_base", warm=True)


def _check_request(history: list[dict], new_input: list[dict], r: pp.PackResult) -> None:
    n = len(r.kept_history)
    sent = r.items
    assert drop_orphan_function_calls(list(sent), pruning_indexes=set(range(n))) == sent
    assert drop_orphan_function_calls(list(sent)) == sent
    assert sum(pp.item_tokens(i).total for i in sent) == r.request_tokens
    masked = set(r.masked)
    assert masked <= set(r.kept_history)
    for item, p in zip(sent, r.kept_history):
        if p in masked:
            assert item is not history[p] and item != history[p]
            assert pp.item_tokens(item).total < pp.item_tokens(history[p]).total
        else:
            assert item is history[p]
    assert all(a is b for a, b in zip(sent[n:], new_input))
    # The masked request has the same units as the original items it stands for.
    got = sorted(u.positions for u in pp.analyze(sent[:n], new_input).units)
    kept = [history[p] for p in r.kept_history]
    want = sorted(u.positions for u in pp.analyze(kept, new_input).units)
    assert got == want
    assert not pp.analyze(sent[:n], new_input).invalid_units


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    sessions(),
    st.floats(0, 1.2),
    st.sampled_from(["contiguous", "greedy"]),
    maskings,
)
def test_masked_requests_hold_every_rule_and_equal_the_reference(
    reference, session, share, policy, masking
) -> None:
    history, new_input = session
    budget = _budget(history, new_input, share, 50)
    before = copy.deepcopy((history, new_input))
    try:
        r = pp.pack(history, new_input, budget, output_reserve=50, policy=policy, masking=masking)
    except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
        event(type(err).__name__)
        with pytest.raises(type(err)):
            pp.pack(history, new_input, budget, output_reserve=50, policy=policy)
        assert (history, new_input) == before
        return
    assert (history, new_input) == before
    assert r.used <= budget
    event("masked" if r.masked else "nothing masked")
    _check_request(history, new_input, r)
    if policy == "contiguous":
        plain = pp.pack(history, new_input, budget, output_reserve=50)
        assert set(plain.kept_history) <= set(r.kept_history)
    ours = sorted((u.members, u.valid) for u in units_of(history, new_input))
    theirs = sorted((u.positions, u.valid) for u in pp.analyze(history, new_input).units)
    if ours != theirs:
        event("reference groups differently: not compared")
        return
    ref = reference.pack(
        history, new_input, budget, output_reserve=50, policy=policy, masking=masking
    )
    assert r.kept_history == ref.kept_history
    assert r.masked == ref.masked
    assert r.items == ref.items
    assert (r.history_tokens, r.masking_saved) == (ref.history_tokens, ref.masking_saved)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions(),
    st.lists(st.integers(0, 60), min_size=1, max_size=3),
    st.floats(0, 1.2),
    maskings,
    maskings,
)
def test_index_and_window_packs_mask_exactly_like_pack(
    session, cuts, share, masking, other
) -> None:
    """Turn by turn through a ``HistoryIndex`` (fresh copies each turn, masked costs kept
    between turns), then from a token window found with the masked lower bounds: the same
    items, totals and decisions as a plain masked ``pp.pack`` of the whole history. Then
    after a restart: from the index's snapshot (its masked costs came with it: the same
    window), from a snapshot taken turns earlier (the items stored since appended), and
    with another masking (the snapshot's masked costs are not its bounds)."""
    history, new_input = session
    budget = _budget(history, new_input, share, 20)
    index = pp.HistoryIndex()
    turns = sorted({min(c, len(history)) for c in cuts}) + [len(history)]
    early: tuple[int, bytes] | None = None
    for end in turns:
        seen = copy.deepcopy(history[:end])
        try:
            want = pp.pack(seen, new_input, budget, output_reserve=20, masking=masking)
        except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
            with pytest.raises(type(err)):
                index.pack(seen, new_input, budget, output_reserve=20, masking=masking)
            return
        got = index.pack(seen, new_input, budget, output_reserve=20, masking=masking)
        assert got.items == want.items and got.masked == want.masked
        assert list(got.decisions) == list(want.decisions)
        assert (got.used, got.masking_saved) == (want.used, want.masking_saved)
        if early is None and 0 < end < len(history):
            index.count_window(seen, budget - 20, masking=masking)
            early = (end, index.snapshot())
    index.count_window(history, budget - 20, masking=masking)
    w = index.window_start(new_input, budget - 20, masking=masking)
    event("window" if w else "whole history")
    got = index.pack(
        history[w:], new_input, budget, output_reserve=20, masking=masking, history_offset=w
    )
    want = pp.pack(history, new_input, budget, output_reserve=20, masking=masking)
    assert got.items == want.items and got.masked == want.masked
    assert list(got.decisions) == list(want.decisions)
    plain_w = index.window_start(new_input, budget - 20)
    assert w <= plain_w, "a masked window reaches at least as far back"

    def restarted(data: bytes, m: pp.Masking) -> tuple[int, pp.PackResult]:
        loaded = pp.HistoryIndex.from_snapshot(data)
        n = len(loaded)
        start = min(loaded.window_start([*history[n:], *new_input], budget - 20, masking=m), n)
        packed = loaded.pack(
            history[start:], new_input, budget, output_reserve=20, masking=m, history_offset=start
        )
        return start, packed

    data = index.snapshot()
    assert pp.HistoryIndex.from_snapshot(data)._index._masked_counted() == (
        index._index._masked_counted()
    )
    runs = [(data, masking, w), (data, other, None)]
    if early is not None:
        runs.append((early[1], masking, None))
        event("restart from an earlier snapshot")
    for snapshot, m, expected_start in runs:
        start, got = restarted(snapshot, m)
        if expected_start is not None:
            assert start == expected_start, "a restart finds the warm window"
        want = pp.pack(history, new_input, budget, output_reserve=20, masking=m)
        assert got.items == want.items and got.masked == want.masked
        assert list(got.decisions) == list(want.decisions)
        assert (got.used, got.masking_saved) == (want.used, want.masking_saved)
