"""Property test: random valid and broken item graphs, checked against the SDK's own sanitizer.

Whatever the history, the packed request must be a fixed point of the SDK's
``drop_orphan_function_calls`` (so the SDK never removes items after budgeting), never exceed
the budget, keep the history's order, and end with the caller's new input unchanged.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

import protoprompt as pp

items_mod = pytest.importorskip("agents.run_internal.items")
drop_orphan_function_calls = items_mod.drop_orphan_function_calls

FRAGMENTS = [
    "user",
    "answer",
    "easy_assistant",
    "reasoning_answer",
    "call_pair",
    "parallel_calls",
    "shell_stream",
    "shell_bad_stream",
    "anon_search",
    "anon_two_calls_one_output",
    "mcp_chain",
    "mcp_unanswered",
    "program",
    "program_without_output",
    "web_search",
    "apply_patch",
    "call_without_output",
    "orphan_output",
    "output_before_call",
    "dangling_reasoning",
    "controls",
    "chat_shape",
    "hosted_wrapper",
    "custom_pair",
    "mismatched_output",
    "local_shell_id_only",
    "compaction",
    "chat_completions_turn",
    "user_typed",
    "system_message",
    "developer_message",
    "idless_reasoning",
    "claude_thinking",
    "claude_thinking_answer",
    "gemini_signed_call",
    "computer_pair",
    "local_shell_pair",
    "client_tool_search",
    "client_anon_search",
    "anon_search_streamed",
    "anon_output_alone",
    "program_hosted",
    "program_incomplete",
    "hosted_calls",
    "standalone",
    "duplicate_reasoning_id",
    "unknown_shapes",
]
"""Every shape of docs/item-graph.md, valid and broken (``test_the_generator_draws_every_shape``
checks them against the document)."""

ENDINGS = [
    "user",
    "resume_call",
    "resume_approval",
    "resume_search",
    "resume_stream",
    "pending_shell",
    "program_child_in_new",
]
"""How a session ends across the history/new-input boundary."""


def _fragment(kind: str, ids: itertools.count, text: str) -> list[dict]:
    i = next(ids)
    rs = {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": "gAAA"}
    msg = {
        "type": "message",
        "role": "assistant",
        "id": f"msg_{i}",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }
    fc = {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": '{"q": 1}'}
    fo = {"type": "function_call_output", "call_id": f"c{i}", "output": text}
    if kind == "user":
        return [{"role": "user", "content": text}]
    if kind == "answer":
        return [msg]
    if kind == "easy_assistant":
        return [{"role": "assistant", "content": text}]
    if kind == "reasoning_answer":
        return [rs, msg]
    if kind == "call_pair":
        return [rs, fc, fo]
    if kind == "parallel_calls":
        fc2 = dict(fc, call_id=f"c{i}b")
        fo2 = dict(fo, call_id=f"c{i}b")
        return [rs, fc, fc2, fo, fo2]
    return _tool_fragment(kind, i, text, rs, msg, fc, fo)


def _tool_fragment(
    kind: str, i: int, text: str, rs: dict, msg: dict, fc: dict, fo: dict
) -> list[dict]:
    """The tool-call shapes of ``_fragment``."""
    if kind in ("shell_stream", "shell_bad_stream"):
        sc = {
            "type": "shell_call",
            "call_id": f"s{i}",
            "action": {"commands": ["ls"]},
            "status": "completed",
        }
        chunk = {
            "type": "shell_call_output",
            "call_id": f"s{i}",
            "output": [{"stdout": text, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        }
        if kind == "shell_stream":
            return [sc, dict(chunk), dict(chunk)]
        return [sc, dict(chunk, status="completed"), dict(chunk, status="in_progress")]
    if kind == "anon_search":
        return [
            rs,
            {
                "type": "tool_search_call",
                "id": f"ts_{i}",
                "arguments": {"query": text},
                "status": "completed",
            },
            {"type": "tool_search_output", "id": f"tso_{i}", "tools": [], "status": "completed"},
        ]
    if kind == "anon_two_calls_one_output":
        return [
            {"type": "tool_search_call", "id": f"ts_{i}", "arguments": {}, "status": "completed"},
            {"type": "tool_search_call", "id": f"ts_{i}b", "arguments": {}, "status": "completed"},
            {"type": "tool_search_output", "id": f"tso_{i}", "tools": [], "status": "completed"},
        ]
    if kind in ("mcp_chain", "mcp_unanswered"):
        req = {
            "type": "mcp_approval_request",
            "id": f"mcpr_{i}",
            "name": "t",
            "server_label": "crm",
            "arguments": "{}",
        }
        if kind == "mcp_unanswered":
            return [rs, req]
        return [
            rs,
            req,
            {"type": "mcp_approval_response", "approval_request_id": f"mcpr_{i}", "approve": True},
            {
                "type": "mcp_call",
                "id": f"mcp_{i}",
                "name": "t",
                "server_label": "crm",
                "arguments": "{}",
                "status": "completed",
                "approval_request_id": f"mcpr_{i}",
            },
        ]
    if kind in ("program", "program_without_output"):
        caller = {"type": "program", "caller_id": f"p{i}"}
        out = [
            rs,
            {
                "type": "program",
                "id": f"pg_{i}",
                "call_id": f"p{i}",
                "code": "js",
                "fingerprint": "fp",
            },
            dict(fc, caller=caller),
            dict(fo, caller=caller),
        ]
        if kind == "program":
            out.append(
                {
                    "type": "program_output",
                    "id": f"po_{i}",
                    "call_id": f"p{i}",
                    "result": "done",
                    "status": "completed",
                }
            )
        return out
    if kind == "web_search":
        return [
            rs,
            {
                "type": "web_search_call",
                "id": f"ws_{i}",
                "status": "completed",
                "action": {"type": "search", "query": text},
            },
        ]
    if kind == "apply_patch":
        return [
            {
                "type": "apply_patch_call",
                "call_id": f"ap{i}",
                "status": "completed",
                "operation": {"type": "delete_file", "path": "x"},
            },
            {
                "type": "apply_patch_call_output",
                "call_id": f"ap{i}",
                "status": "completed",
                "output": "done",
            },
        ]
    return _odd_fragment(kind, i, text, rs, msg, fc, fo)


def _odd_fragment(
    kind: str, i: int, text: str, rs: dict, msg: dict, fc: dict, fo: dict
) -> list[dict]:
    """The shapes of ``_fragment`` the item graph rejects or treats specially."""
    broken = {
        "call_without_output": [rs, fc],
        "orphan_output": [fo],
        "output_before_call": [fo, fc],
        "dangling_reasoning": [rs],
    }
    if kind in broken:
        return broken[kind]
    if kind == "controls":
        return [{"type": "compaction_trigger"}, {"type": "item_reference", "id": f"msg_{i}"}]
    if kind == "chat_shape":
        return [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"cc{i}",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"cc{i}", "content": text},
        ]
    if kind == "hosted_wrapper":
        return [
            {
                "type": "hosted_tool_call",
                "name": "t",
                "provider_data": {
                    "type": "mcp_approval_request",
                    "id": f"mcpr_{i}",
                    "name": "t",
                    "server_label": "crm",
                    "arguments": "{}",
                },
            }
        ]
    if kind == "custom_pair":
        return [
            {"type": "custom_tool_call", "call_id": f"cu{i}", "name": "grep", "input": text},
            {"type": "custom_tool_call_output", "call_id": f"cu{i}", "output": text},
        ]
    if kind == "mismatched_output":
        return [
            {"type": "custom_tool_call", "call_id": f"cu{i}", "name": "grep", "input": text},
            {"type": "function_call_output", "call_id": f"cu{i}", "output": text},
        ]
    if kind == "local_shell_id_only":
        return [
            {
                "type": "local_shell_call",
                "id": f"lsh_{i}",
                "call_id": f"l{i}",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
                "status": "completed",
            },
            {"type": "local_shell_call_output", "id": f"l{i}", "output": "{}"},
        ]
    if kind == "chat_completions_turn":
        # Chat Completions models give every item the SDK's placeholder id.
        fake = "__fake_id__"
        return [dict(rs, id=fake), dict(fc, id=fake), fo, dict(msg, id=fake)]
    if kind == "compaction":
        return [{"type": "compaction", "id": f"cmp_{i}", "encrypted_content": "gAAA"}]
    return _more_fragment(kind, i, text, rs, msg, fc, fo)


def _more_fragment(
    kind: str, i: int, text: str, rs: dict, msg: dict, fc: dict, fo: dict
) -> list[dict]:
    """The shapes of ``_fragment`` added with the generator census (docs/item-graph.md §1)."""
    if kind in ("user_typed", "system_message", "developer_message"):
        role = {"user_typed": "user", "system_message": "system"}.get(kind, "developer")
        if kind == "system_message":
            return [{"role": role, "content": text}]
        return [
            {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}
        ]
    if kind == "gemini_signed_call":  # Gemini's thought signature on its call (§1.3)
        signed = dict(fc, provider_data={"thought_signature": f"CiQB{i}"})
        return [signed, fo, msg]
    if kind in ("claude_thinking", "claude_thinking_answer"):  # Claude via LitellmModel (§1.2)
        thinking = {
            "type": "reasoning",
            "id": "__fake_id__",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": text}],
            "encrypted_content": f"sigA{i}\nsigB{i}",
            "provider_data": {
                "thinking_blocks": [
                    {"type": "thinking", "thinking": text, "signature": f"sigA{i}"},
                    {"type": "redacted_thinking", "data": f"cmVk{i}"},
                ]
            },
        }
        if kind == "claude_thinking_answer":  # thinking, then the final text (§6.3)
            return [thinking, dict(msg, id="__fake_id__", status="completed")]
        return [thinking, fc, fo, msg]
    if kind == "idless_reasoning":  # reasoning_item_id_policy="omit" (TV41)
        bare = {"type": "reasoning", "summary": [{"type": "summary_text", "text": text}]}
        return [bare, fc, fo, {"type": "reasoning", "summary": [], "encrypted_content": "e"}, msg]
    if kind == "computer_pair":
        call = {
            "type": "computer_call",
            "id": f"cu_{i}",
            "call_id": f"cu{i}",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
            "status": "completed",
        }
        shot = {"type": "computer_screenshot", "image_url": "https://example.com/s.png"}
        return [rs, call, {"type": "computer_call_output", "call_id": f"cu{i}", "output": shot}]
    if kind == "local_shell_pair":
        call = {
            "type": "local_shell_call",
            "id": f"lsh_{i}",
            "call_id": f"ls{i}",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
            "status": "completed",
        }
        return [call, {"type": "local_shell_call_output", "call_id": f"ls{i}", "output": text}]
    if kind in ("client_tool_search", "client_anon_search"):
        ids = {} if kind == "client_anon_search" else {"call_id": f"t{i}"}
        return [
            {"type": "tool_search_call", "id": f"ts_{i}", "execution": "client", "arguments": {}}
            | ids,
            {"type": "tool_search_output", "id": f"tso_{i}", "execution": "client", "tools": []}
            | ids,
        ]
    return _census_fragment(kind, i, text, rs, msg, fc, fo)


def _census_fragment(
    kind: str, i: int, text: str, rs: dict, msg: dict, fc: dict, fo: dict
) -> list[dict]:
    """More of ``_more_fragment``'s shapes."""
    if kind == "anon_search_streamed":  # one call, its output streamed in chunks (TV25)
        chunks = [
            {"type": "tool_search_output", "id": f"tso_{i}_{k}", "tools": [], "status": status}
            for k, status in enumerate(["in_progress", "in_progress", "completed"])
        ]
        call = {"type": "tool_search_call", "id": f"ts_{i}", "arguments": {}, "status": "completed"}
        return [rs, call, *chunks, msg]
    if kind == "anon_output_alone":
        return [
            {"type": "tool_search_output", "id": f"tso_{i}", "tools": [], "status": "completed"}
        ]
    if kind in ("program_hosted", "program_incomplete"):
        caller = {"type": "program", "caller_id": f"p{i}"}
        status = "completed" if kind == "program_hosted" else "incomplete"
        return [
            rs,
            {
                "type": "program",
                "id": f"pg_{i}",
                "call_id": f"p{i}",
                "code": "js",
                "fingerprint": "f",
            },
            dict(fc, caller=caller),
            dict(fo, caller=caller),
            {"type": "web_search_call", "id": f"ws_{i}", "status": "completed", "caller": caller},
            {"type": "shell_call", "call_id": f"ps{i}", "status": "in_progress", "caller": caller},
            {"type": "mcp_approval_request", "id": f"pr_{i}", "name": "t", "caller": caller},
            {"type": "program_output", "id": f"po_{i}", "call_id": f"p{i}", "status": status},
        ]
    if kind == "hosted_calls":
        return [
            rs,
            {"type": "mcp_list_tools", "id": f"mcpl_{i}", "server_label": "crm", "tools": []},
            {"type": "file_search_call", "id": f"fs_{i}", "queries": [text], "status": "completed"},
            {
                "type": "code_interpreter_call",
                "id": f"ci_{i}",
                "code": text,
                "container_id": "c",
                "outputs": None,
                "status": "completed",
            },
            {
                "type": "image_generation_call",
                "id": f"ig_{i}",
                "result": None,
                "status": "completed",
            },
            msg,
        ]
    if kind == "standalone":
        return [
            {"type": "additional_tools", "role": "developer", "tools": []},
            {"type": "configuration_update", "reasoning": {"effort": "low"}},
        ]
    if kind == "duplicate_reasoning_id":
        dup = dict(rs, id="rs_dup")
        return [dup, msg, {"role": "user", "content": text}, dup, dict(msg, id=f"msg_{i}b")]
    if kind == "unknown_shapes":
        return [{"type": "no_such_item", "id": f"x_{i}"}, {"role": "robot", "content": text}]
    raise AssertionError(kind)


def _ending(name: str, i: int, text: str) -> tuple[list[dict], list[dict]]:
    """The last history items and the new input of a session ending ``name``: shapes that
    lie across the history/new-input boundary (docs/item-graph.md §5, §12.4, TV26, TV42)."""
    if name == "resume_call":
        return [
            {"type": "reasoning", "id": f"rs_{i}", "summary": [], "encrypted_content": "e"},
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"},
        ], [{"type": "function_call_output", "call_id": f"c{i}", "output": "ok"}]
    if name == "resume_approval":
        request = {
            "type": "mcp_approval_request",
            "id": f"mcpr_{i}",
            "name": "t",
            "server_label": "s",
            "arguments": "{}",
        }
        response = {"type": "mcp_approval_response", "approval_request_id": f"mcpr_{i}"}
        return [request], [dict(response, approve=False)]
    search = {"type": "tool_search_call", "id": f"ts_{i}", "arguments": {}, "status": "completed"}
    if name == "resume_search":
        return [search], [
            {"type": "tool_search_output", "id": f"tso_{i}", "tools": [], "status": "completed"}
        ]
    if name == "resume_stream":  # the call in history, its streamed chunks in the new input
        return [search], [
            {"type": "tool_search_output", "id": f"tso_{i}_{k}", "tools": [], "status": status}
            for k, status in enumerate(["in_progress", "completed"])
        ]
    if name == "pending_shell":  # a caller-supplied pending hosted shell call (V5, TV42)
        shell = {"type": "shell_call", "call_id": f"s{i}", "status": "in_progress", "action": {}}
        return [], [shell]
    if name == "program_child_in_new":  # a history program continued by the new input (§4.4)
        caller = {"type": "program", "caller_id": f"p{i}"}
        return [
            {
                "type": "program",
                "id": f"pg_{i}",
                "call_id": f"p{i}",
                "code": "js",
                "fingerprint": "f",
            },
            {
                "type": "function_call",
                "call_id": f"c{i}",
                "name": "f",
                "arguments": "{}",
                "caller": caller,
            },
        ], [{"type": "function_call_output", "call_id": f"c{i}", "output": "ok", "caller": caller}]
    return [], [{"role": "user", "content": text or "next"}]


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[dict], list[dict]]:
    ids = itertools.count()
    words = st.text(alphabet='abc xyzабв\n{}"', min_size=0, max_size=60)
    history: list[dict] = []
    for kind in draw(st.lists(st.sampled_from(FRAGMENTS), max_size=30)):
        history += _fragment(kind, ids, draw(words))
    # Occasionally swap neighbours to create out-of-order graphs.
    for _ in range(draw(st.integers(0, 2))):
        if len(history) > 1:
            j = draw(st.integers(0, len(history) - 2))
            history[j], history[j + 1] = history[j + 1], history[j]
    ending = draw(st.sampled_from(ENDINGS))
    tail, new_input = _ending(ending, next(ids), draw(words))
    history += tail
    return history, new_input


def test_the_generator_draws_every_shape_of_the_item_rules() -> None:
    """The fragments and endings ``sessions()`` draws from hold every kind of
    docs/item-graph.md's examples and every form of ``item_shapes.FORMS`` (a shape they miss,
    or that the document gains, fails here), and the endings put shapes across the
    history/new-input boundary."""
    from item_shapes import FORMS, doc_kinds, forms_of, kinds_of

    ids = itertools.count()
    items = [it for kind in FRAGMENTS for it in _fragment(kind, ids, "t")]
    across = []
    for name in ENDINGS:
        tail, new = _ending(name, next(ids), "t")
        items += tail + new
        if tail and new:
            across.append(name)
    missing = doc_kinds() - set(kinds_of(items))
    assert not missing, sorted(missing)
    assert forms_of(items) == set(FORMS), sorted(set(FORMS) - forms_of(items))
    assert {"resume_stream", "resume_search", "program_child_in_new"} <= set(across)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions(), st.integers(0, 3000), st.integers(0, 200), st.sampled_from(["contiguous", "greedy"])
)
# A typed user message starts a turn as an easy one does (CI found this one).
@example(
    session=(
        [
            {"role": "user", "content": ""},
            {"role": "user", "content": ""},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ""}]},
            {"role": "user", "content": ""},
            {"type": "reasoning", "id": "rs_4", "summary": [], "encrypted_content": "gAAA"},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_4",
                "status": "completed",
                "content": [{"type": "output_text", "text": "", "annotations": []}],
            },
            {"type": "program", "id": "pg_5", "call_id": "p5", "code": "js", "fingerprint": "f"},
            {
                "type": "function_call",
                "call_id": "c5",
                "name": "f",
                "arguments": "{}",
                "caller": {"type": "program", "caller_id": "p5"},
            },
        ],
        [
            {
                "type": "function_call_output",
                "call_id": "c5",
                "output": "ok",
                "caller": {"type": "program", "caller_id": "p5"},
            }
        ],
    ),
    budget=173,
    reserve=0,
    policy="greedy",
)
# Reasoning tied to a caller-supplied pending shell call goes with it in resume mode.
@example(
    session=(
        [
            {"type": "function_call", "call_id": "c0", "name": "f", "arguments": '{"q": 1}'},
            {"type": "function_call_output", "call_id": "c0", "output": ""},
            {"type": "reasoning", "id": "rs_0", "summary": [], "encrypted_content": "gAAA"},
        ],
        [{"type": "shell_call", "call_id": "s1", "status": "in_progress", "action": {}}],
    ),
    budget=44,
    reserve=0,
    policy="contiguous",
)
def test_packed_request_survives_the_sdk_sanitizer(session, budget, reserve, policy) -> None:
    history, new_input = session
    before = copy.deepcopy((history, new_input))
    try:
        result = pp.pack(history, new_input, budget, output_reserve=reserve, policy=policy)
    except pp.TokenBudgetExceededError as err:
        assert err.used > budget and err.budget == budget
        assert (history, new_input) == before
        return
    except pp.InvalidNewInputError:
        # Only possible when a neighbour swap broke the graph new_input depends on.
        assert (history, new_input) == before
        return
    sent = result.items
    n_kept = len(result.kept_history)
    assert result.used <= budget
    assert result.kept_history == sorted(set(result.kept_history))
    assert all(sent[k] is history[i] for k, i in enumerate(result.kept_history))
    assert len(sent) == n_kept + len(new_input)
    assert all(a is b for a, b in zip(sent[n_kept:], new_input))
    assert (history, new_input) == before
    # The SDK's sanitizer removes nothing, in callback mode and in resume mode.
    assert drop_orphan_function_calls(list(sent), pruning_indexes=set(range(n_kept))) == sent
    resumed = drop_orphan_function_calls(list(sent))
    # In resume mode the SDK also prunes the input it was given: a caller-supplied pending
    # shell call goes (V5, TV42), nothing that packing chose.
    removed = [x for x in sent if not any(x is y for y in resumed)]

    def pending_shell(x: dict) -> bool:
        return (
            any(x is n for n in new_input)
            and x.get("type") == "shell_call"
            and x.get("status") in (None, "in_progress")
        )

    def tied_to_pending_shell(k: int) -> bool:
        # The SDK drops a reasoning item with the call it is tied to (the next item that is
        # not reasoning): run_internal/items.py, _drop_reasoning_items_preceding_dropped_calls.
        nxt = next((x for x in sent[k + 1 :] if x.get("type") != "reasoning"), None)
        return sent[k].get("type") == "reasoning" and nxt is not None and pending_shell(nxt)

    assert all(
        pending_shell(x) or tied_to_pending_shell(next(k for k, y in enumerate(sent) if y is x))
        for x in removed
    ), removed
    # Nothing invalid or input-only is ever sent.
    report = pp.analyze(history, new_input)
    bad = {p for u in report.invalid_units for p in u.positions}
    assert not bad & set(result.kept_history)
    # Coherence: a kept user message has its whole (valid) turn after it kept.
    kept = set(result.kept_history)
    valid = {
        p
        for u in report.units
        if u.valid and not u.contains_new
        for p in u.positions
        if p < len(history)
    }

    def starts_turn(item: dict) -> bool:
        # A user message starts a turn in either form (easy or typed), as in the core.
        return item.get("role") == "user" and item.get("type", "message") == "message"

    for pos in kept:
        if starts_turn(history[pos]):
            nxt = next(
                (j for j in range(pos + 1, len(history)) if starts_turn(history[j])),
                len(history),
            )
            assert all(j in kept for j in range(pos + 1, nxt) if j in valid), (pos, nxt)


def _same(a: pp.PackResult, b: pp.PackResult) -> None:
    for name in (
        "kept_history",
        "dependency",
        "new_input_tokens",
        "dependency_tokens",
        "history_tokens",
        "context_tokens",
        "used",
        "remaining",
    ):
        assert getattr(a, name) == getattr(b, name), name
    assert all(x is y for x, y in zip(a.items, b.items)) and len(a.items) == len(b.items)
    assert list(a.decisions) == list(b.decisions)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions(),
    st.lists(st.integers(0, 40), min_size=1, max_size=4),
    st.integers(0, 3000),
    st.sampled_from(["contiguous", "greedy"]),
    st.integers(0, 3),
)
def test_history_index_packs_exactly_like_pack(session, cuts, budget, policy, pops) -> None:
    """The incremental path (an index fed turn by turn, fresh copies each turn, with pops)
    keeps exactly the items, totals and decisions of a plain pack of the same history."""
    history, new_input = session
    index = pp.HistoryIndex()
    turns = sorted({min(c, len(history)) for c in cuts}) + [len(history)]
    for end in turns:
        seen = copy.deepcopy(history[:end])  # the SDK hands over fresh copies every turn
        for _ in range(pops if end == turns[-1] else 0):
            if len(index):
                index.truncate(len(index) - 1)
        try:
            expected = pp.pack(seen, new_input, budget, output_reserve=16, policy=policy)
        except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
            with pytest.raises(type(err)):
                index.pack(seen, new_input, budget, output_reserve=16, policy=policy)
            continue
        got = index.pack(seen, new_input, budget, output_reserve=16, policy=policy)
        _same(got, expected)
        assert len(index) == end


def test_kept_results_stay_correct_and_never_make_the_index_copy_its_graph() -> None:
    """Results kept across appends, pops and a failed pack keep their own decisions (those
    of a plain pack of their history), and keeping them never makes the index copy its
    item graph on a change."""
    ids = itertools.count()
    history = [
        it
        for i in range(6)
        for kind in FRAGMENTS
        for it in _fragment(kind, ids, f"text {i} " * (i % 4 + 1))
    ]
    new_input = [{"role": "user", "content": "next"}]
    index = pp.HistoryIndex()
    kept: list[tuple[pp.PackResult, pp.PackResult]] = []
    end = 0
    for step in range(40):
        end = min(len(history), end + 1 + step % 9)
        if step % 7 == 6:
            index.truncate(len(index) - 2)
            end = len(index)
        seen = copy.deepcopy(history[:end])
        budget = 200 + 97 * step
        kept.append(
            (
                index.pack(seen, new_input, budget, output_reserve=16),
                pp.pack(seen, new_input, budget, output_reserve=16),
            )
        )
        if step % 10 == 5:
            with pytest.raises(pp.InvalidItemError):
                index.pack(seen + [{"role": 5}], new_input, budget)
    for got, expected in kept:
        _same(got, expected)
        assert got.decisions.item_counts() == expected.decisions.item_counts()
        assert got.decisions.unit_counts() == expected.decisions.unit_counts()
    assert index._index._graph_copies() == 0


def test_history_index_refuses_a_shorter_history_and_recovers_after_truncate() -> None:
    history = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    index = pp.HistoryIndex()
    index.pack(history, [{"role": "user", "content": "c"}], 1000)
    assert len(index) == 2
    with pytest.raises(
        pp.HistoryMismatchError, match="history has 1 items but the index already holds 2"
    ) as info:
        index.pack(history[:1], [{"role": "user", "content": "c"}], 1000)
    assert (info.value.history_len, info.value.indexed) == (1, 2)
    assert isinstance(info.value, pp.ProtoPromptError) and isinstance(info.value, ValueError)
    assert len(index) == 2  # unchanged
    index.truncate(1)
    got = index.pack(history[:1], [{"role": "user", "content": "c"}], 1000)
    assert got.kept_history == [0]
    index.clear()
    assert len(index) == 0
    with pytest.raises(pp.InvalidItemError, match=r"history\[1\]"):
        index.pack([history[0], {"role": 5}], [{"role": "user", "content": "c"}], 1000)
    assert len(index) == 0  # nothing was indexed by the failed call


def test_a_bad_item_deep_in_a_long_history_leaves_the_index_as_it_was() -> None:
    """Long histories are classified into the index in chunks; a bad item after several
    chunks names itself, and the index (already holding earlier turns) is unchanged."""

    def turn(i: int) -> list[dict]:
        return [
            {"role": "user", "content": f"q{i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "ok"},
        ]

    history = [it for i in range(5000) for it in turn(i)]
    new_input = [{"role": "user", "content": "next"}]
    index = pp.HistoryIndex()
    index.pack(history[:30], new_input, 100_000)
    before = index.nbytes
    bad = history[:12_001] + [{"type": "function_call", "call_id": 7}] + history[12_001:]
    with pytest.raises(pp.InvalidItemError, match=r"history\[12001\].*call_id"):
        index.pack(bad, new_input, 100_000)
    assert len(index) == 30 and index.nbytes <= before + 1024
    with pytest.raises(pp.InvalidItemError, match=r"history\[12001\]"):
        index.extend(bad[30:])  # positions continue from len(index)
    assert len(index) == 30
    with pytest.raises(pp.InvalidItemError, match=r"new_input\[0\].*call_id"):
        index.pack(history, [{"type": "function_call_output", "call_id": 9}], 100_000)
    assert len(index) == 30  # a bad new item is found before any history is indexed
    _same(index.pack(history, new_input, 100_000), pp.pack(history, new_input, 100_000))
    assert len(index) == len(history)


def test_history_index_reports_its_memory_and_stays_small() -> None:
    """The index keeps items compactly: well under a quarter of the history's JSON."""
    import json

    from history_gen import generate

    history = generate(3000, "agentic", 5)
    index = pp.HistoryIndex()
    empty = index.nbytes
    index.extend(history)
    assert len(index) == 3000
    assert empty < index.nbytes < 0.25 * len(json.dumps(history).encode())
    got = index.pack(history, [{"role": "user", "content": "next"}], 50_000)
    assert (
        got.kept_history
        == pp.pack(history, [{"role": "user", "content": "next"}], 50_000).kept_history
    )


def test_a_long_history_read_in_pipelined_chunks_has_the_whole_graphs_units() -> None:
    """Histories longer than one classification chunk (2048 items) are read on this thread
    while a helper thread indexes the previous chunk: the units must be those of the whole
    graph built at once (analyze), and so must the decisions through a warm index."""
    from history_gen import generate, new_user_message, next_turn

    history = generate(11_000, "agentic", seed=4)
    new_input = [new_user_message(4)]
    units = sorted(u.positions for u in pp.analyze(history, new_input).units if not u.contains_new)
    index = pp.HistoryIndex()
    packed = index.pack(history, new_input, 10**9)
    assert sorted(d.positions for d in packed.decisions) == units
    assert packed.kept_history == sorted(p for u in units for p in u)
    longer = history + next_turn(4, "agentic")
    again = index.pack(copy.deepcopy(longer), new_input, 10**9)
    assert sorted(d.positions for d in again.decisions) == sorted(
        u.positions for u in pp.analyze(longer, new_input).units if not u.contains_new
    )


class _DictStore:
    def __init__(self) -> None:
        import os

        self.secret = os.urandom(16)
        self.data: dict[bytes, int] = {}

    def get_many(self, keys):
        return [self.data.get(k) for k in keys]

    def put_many(self, pairs):
        self.data.update(pairs)


def _lengthen(items: list[dict], factor: int) -> list[dict]:
    """The same graph with every string value that is not a graph field made long enough
    for the count store (>= 256 bytes of canonical text)."""
    keep = {
        "type",
        "role",
        "id",
        "call_id",
        "status",
        "approval_request_id",
        "caller_id",
        "tool_call_id",
        "name",
        "server_label",
    }

    def grow(v: object, key: str | None = None) -> object:
        if isinstance(v, str) and key not in keep and v:
            return (v + " ") * factor
        if isinstance(v, dict):
            return {k: grow(x, k) for k, x in v.items()}
        if isinstance(v, list):
            return [grow(x) for x in v]
        return v

    return [grow(item) for item in items]  # type: ignore[misc]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions(),
    st.integers(1, 40),
    st.integers(0, 60_000),
    st.sampled_from(["contiguous", "greedy"]),
)
def test_packs_through_a_count_store_equal_plain_packs(session, factor, budget, policy) -> None:
    """Every item shape, with long texts: a pack that reads counts from a store (empty, then
    filled by the first pack, each in a 'new process': the count cache emptied) is exactly a
    pack that counts everything."""
    from protoprompt import _core

    history, new_input = _lengthen(session[0], factor), session[1]
    store = _DictStore()
    _core._clear_count_cache()
    try:
        expected = pp.pack(history, new_input, budget, output_reserve=16, policy=policy)
    except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
        _core._clear_count_cache()
        with pytest.raises(type(err)):
            pp.HistoryIndex(count_store=store).pack(
                history, new_input, budget, output_reserve=16, policy=policy
            )
        return
    for _ in range(2):
        _core._clear_count_cache()
        got = pp.HistoryIndex(count_store=store).pack(
            history, new_input, budget, output_reserve=16, policy=policy
        )
        _same(got, expected)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sessions(),
    st.one_of(st.integers(0, 60), st.just(10**6)),
    st.one_of(st.integers(1, 300), st.integers(1, 3000)),
    st.integers(0, 40),
    st.sampled_from(["none", "counted", "popped"]),
    st.sampled_from([1, 1, 4, 12]),
)
def test_a_token_window_packs_exactly_like_the_whole_history(
    session, seen, budget, reserve, before, factor
) -> None:
    """What windowed reads rest on: the index has seen a prefix of the history (packed with
    the same budget, costs counted for the next window or not, some items popped since);
    the rest was appended since (by this or another writer). The pack of the history from
    ``window_start`` on, with the index holding the rest, equals the pack of the whole
    history: the same items (the same objects, in order), totals and decisions."""
    history, new_input = session
    if factor > 1:  # longer texts: more histories that do not fit whole
        history = _lengthen(history, factor)
    index = pp.HistoryIndex()
    seen = min(seen, len(history))
    room = max(budget - reserve, 0)
    try:
        index.pack(history[:seen], [], budget, output_reserve=0)
    except pp.ProtoPromptError:
        try:  # a prefix whose own mandatory tail does not fit: index it with room to spare
            index = pp.HistoryIndex()
            index.pack(history[:seen], [], 10**9, output_reserve=0)
        except pp.ProtoPromptError:
            index = pp.HistoryIndex()
            seen = 0
    if before == "counted" and seen:
        index.count_window(history[:seen], room)
    elif before == "popped" and seen > 2:
        index.truncate(seen - 2)
        seen -= 2
    try:
        w = index.window_start(history[seen:] + new_input, room)
    except pp.InvalidItemError:
        return  # a new item that cannot be read: the session reads everything then
    assert 0 <= w <= len(history)
    w = min(w, seen)  # the session never starts a window after the index's last row
    event("window" if w else "whole history (empty index)" if not seen else "whole history")
    try:
        expected = pp.pack(history, new_input, budget, output_reserve=reserve)
    except (pp.TokenBudgetExceededError, pp.InvalidNewInputError) as err:
        with pytest.raises(type(err)):
            index.pack(history[w:], new_input, budget, output_reserve=reserve, history_offset=w)
        return
    got = index.pack(history[w:], new_input, budget, output_reserve=reserve, history_offset=w)
    _same(got, expected)
    assert len(index) == len(history)
