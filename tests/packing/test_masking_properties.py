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
from shared_histories import early_turns  # noqa: E402
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
    st.sampled_from(["none", "last_user", "a_user"]),
    st.randoms(use_true_random=False),
)
def test_masked_requests_hold_every_rule_and_equal_the_reference(
    reference, session, share, policy, masking, pin, rnd
) -> None:
    """Also with a user message pinned (the per-call model filter pins the run's input;
    ``last_user``: its shape, a run's steps after it), whose turn is masked before any of
    its units is dropped."""
    history, new_input = session
    users = [p for p, it in enumerate(history) if set(it) == {"role", "content"}]
    users = [p for p in users if history[p]["role"] == "user"]
    pinned = (
        []
        if pin == "none" or not users
        else [users[-1] if pin == "last_user" else rnd.choice(users)]
    )
    budget = _budget(history, new_input, share, 50)
    before = copy.deepcopy((history, new_input))
    kw: dict[str, Any] = {"output_reserve": 50, "policy": policy, "pinned": pinned}
    try:
        r = pp.pack(history, new_input, budget, masking=masking, **kw)
    except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
        event(type(err).__name__)
        with pytest.raises(type(err)):
            pp.pack(history, new_input, budget, **kw)
        assert (history, new_input) == before
        return
    assert (history, new_input) == before
    assert r.used <= budget
    event("masked" if r.masked else "nothing masked")
    if pinned:
        event("pinned, masked" if r.masked else "pinned, nothing masked")
        assert set(pinned) <= set(r.kept_history) and not set(pinned) & set(r.masked)
    _check_request(history, new_input, r)
    if policy == "contiguous":
        plain = pp.pack(history, new_input, budget, **kw)
        assert set(plain.kept_history) <= set(r.kept_history)
    ours = sorted((u.members, u.valid) for u in units_of(history, new_input))
    theirs = sorted((u.positions, u.valid) for u in pp.analyze(history, new_input).units)
    if ours != theirs:
        event("reference groups differently: not compared")
        return
    ref = reference.pack(history, new_input, budget, masking=masking, **kw)
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
    # The masked costs come with the snapshot (the excerpts are made again when needed).
    assert (
        pp.HistoryIndex.from_snapshot(data)._index._masked_counted()[::2]
        == (index._index._masked_counted()[::2])
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


@st.composite
def runs(draw: st.DrawFn) -> tuple[list[dict], list[dict], int]:
    """The per-call model filter's shape: older history, the run's input (a user message,
    pinned), the run's steps (tool calls and their outputs of every kind, with reasoning
    and messages between), and the newest step as the new input."""
    history, _ = draw(sessions())
    ids = itertools.count(10_000)
    words = st.text(alphabet="abc xyz\n🙂", min_size=1, max_size=30)
    pin = len(history)
    history.append({"role": "user", "content": draw(words)})
    step_kinds = st.sampled_from(OUTPUT_FRAGMENTS * 3 + ["call_pair", "reasoning_answer"])
    for kind in draw(st.lists(step_kinds, max_size=25)):
        text = draw(words) + " line of output 7\n"
        size = draw(st.integers(1, 40))
        if kind in OUTPUT_FRAGMENTS:
            history += _output_fragment(kind, next(ids), text * size)
        else:
            history += _fragment(kind, ids, text * size)
    newest = _output_fragment(draw(st.sampled_from(OUTPUT_FRAGMENTS)), next(ids), "newest " * 30)
    return history, newest, pin


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(runs(), st.floats(0, 1.1), st.sampled_from(["contiguous", "greedy"]), maskings)
def test_a_pinned_turn_is_masked_before_any_of_its_units_is_dropped(
    reference, run, share, policy, masking
) -> None:
    """A model call inside a run: every rule holds, the request equals the reference's,
    and the run's turn keeps the most of its units that fit masked, then the newest of them
    whole as far as the room allows: a unit of the turn is dropped only when every kept one
    is masked, and a masked one could not be sent whole (checked by the request's own
    costs). The pinned run input and the newest step are never masked."""
    history, new_input, pin = run
    kw: dict[str, Any] = {"output_reserve": 50, "policy": policy, "pinned": [pin]}
    whole = pp.pack(history, new_input, 2**40, pinned=[pin])
    mandatory = whole.new_input_tokens + whole.dependency_tokens
    budget = 50 + mandatory + int(share * whole.history_tokens)
    before = copy.deepcopy((history, new_input))
    try:
        r = pp.pack(history, new_input, budget, masking=masking, **kw)
    except pp.TokenBudgetExceededError:
        event("mandatory part over budget")
        return
    assert (history, new_input) == before
    assert r.used <= budget and pin in r.kept_history and pin not in r.masked
    _check_request(history, new_input, r)
    ours = sorted((u.members, u.valid) for u in units_of(history, new_input))
    theirs = sorted((u.positions, u.valid) for u in pp.analyze(history, new_input).units)
    if ours == theirs:
        ref = reference.pack(history, new_input, budget, masking=masking, **kw)
        assert r.kept_history == ref.kept_history
        assert r.masked == ref.masked
        assert r.items == ref.items
        assert (r.history_tokens, r.masking_saved) == (ref.history_tokens, ref.masking_saved)
    else:
        event("reference groups differently: not compared")
    # The run's turn: its units after the pinned input, newest first.
    turn = sorted(
        (d for d in r.decisions if min(d.positions) > pin and d.decision != "mandatory"),
        key=lambda d: max(d.positions),
        reverse=True,
    )
    turn = [d for d in turn if d.decision in ("kept", "masked", "over_budget")]
    kept = [d for d in turn if d.decision in ("kept", "masked")]
    dropped = [d for d in turn if d.decision == "over_budget"]
    assert turn[: len(kept)] == kept, "the kept units are the newest ones"
    if masking.after_turns == 0:
        return  # every optional unit is masked by age
    # Each unit's masked cost, counted apart: every optional unit masked, room for all.
    every = pp.Masking(excerpt_tokens=masking.excerpt_tokens, after_turns=0)
    apart = pp.pack(history, new_input, 2**40, masking=every, **kw).decisions
    masked_cost = {tuple(d.positions): d.sent_tokens for d in apart}
    older = sum(
        d.sent_tokens
        for d in r.decisions
        if d.decision in ("kept", "masked") and max(d.positions) < pin
    )
    at_miss = r.used - older  # what the request held when the fill left the run's turn
    if dropped:
        event("pinned turn: dropped")
        saving = sum(
            d.tokens - masked_cost[tuple(d.positions)] for d in kept if d.decision == "kept"
        )
        miss = dropped[0]
        assert at_miss - saving + masked_cost[tuple(miss.positions)] > budget, (
            "masked before dropped"
        )
    masked = [d for d in kept if d.decision == "masked"]
    if masked:
        event("pinned turn: masked")
        whole = kept[: kept.index(masked[0])]
        assert all(d.decision == "kept" for d in whole), "the newest units are the whole ones"
        newest = masked[0]
        assert at_miss - newest.masked_tokens + newest.tokens > budget, "could not be whole"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sessions(), maskings)
def test_a_masked_copy_is_not_masked_again(session, masking) -> None:
    """What the session callback sends masked reaches the per-call filter as history, where
    the same masking meets it again: a masked copy of every tool-output shape is too short
    to be masked again (packing the masked request with every unit masked changes nothing)."""
    history, new_input = session
    every = pp.Masking(excerpt_tokens=masking.excerpt_tokens, after_turns=0)
    try:
        r = pp.pack(history, new_input, 2**40, masking=every)
    except pp.InvalidNewInputError:
        return
    sent = r.items[: len(r.kept_history)]
    again = pp.pack(sent, new_input, 2**40, masking=every)
    event("masked" if r.masked else "nothing masked")
    copies = {p for p, q in enumerate(r.kept_history) if q in set(r.masked)}
    assert not copies & set(again.masked), "a masked copy was masked again"
    for p in copies:
        assert again.items[again.kept_history.index(p)] is sent[p]


# Found by CI (hypothesis): a restart from a snapshot taken turns earlier, whose index had not
# counted the items before its window, with a reasoning id repeated after the snapshot. The
# masked fill asks whether a candidate's whole turn could fit even masked, from the turn's
# user message on (`Fill::turn_cannot_fit`), and needs the cost of an item before the window
# `window_start` found: the pack raised instead of packing. The masked window now reaches back
# as far as that check can read (`GraphIndex::window_masked`).
def test_a_masked_window_after_an_early_snapshot_needs_nothing_before_it() -> None:
    history = early_turns()
    new_input = [{"role": "user", "content": "next"}]
    masking = pp.Masking(excerpt_tokens=16)
    budget = _budget(history, new_input, 0.0625, 20)
    index = pp.HistoryIndex()
    index.pack(copy.deepcopy(history[:10]), new_input, budget, output_reserve=20, masking=masking)
    index.count_window(history[:10], budget - 20, masking=masking)
    loaded = pp.HistoryIndex.from_snapshot(index.snapshot())
    start = min(loaded.window_start([*history[10:], *new_input], budget - 20, masking=masking), 10)
    got = loaded.pack(
        history[start:], new_input, budget, output_reserve=20, masking=masking, history_offset=start
    )
    want = pp.pack(history, new_input, budget, output_reserve=20, masking=masking)
    assert got.items == want.items and list(got.decisions) == list(want.decisions)
