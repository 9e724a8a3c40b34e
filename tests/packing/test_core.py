"""The native core through its Python API: item graph vectors, counting, packing, errors."""

from __future__ import annotations

import copy
import math
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import protoprompt as pp
from protoprompt import (
    InvalidItemError,
    InvalidNewInputError,
    ProtoPromptError,
    TokenBudgetExceededError,
    UnknownEncodingError,
    UnknownModelError,
)
from reference_tokenizer import get_encoding as reference_encoding


def _short(label: str) -> str:
    """``history[3]`` -> ``h3``, ``new_input[0]`` -> ``n0`` (the vectors' notation)."""
    return label[0] + label[label.index("[") + 1 : -1]


def _labels(report: pp.GraphReport) -> set[frozenset[str]]:
    return {frozenset(map(_short, u.members)) for u in report.units}


# --------------------------------------------------------------------------- item graph


def test_every_spec_vector_gives_the_expected_units(vectors: list[dict]) -> None:
    assert len(vectors) == 42
    for v in vectors:
        report = pp.analyze(v["history"], v["new_input"])
        exp = v["expected"]
        assert _labels(report) == {frozenset(u) for u in exp["units"]}, v["id"]
        invalid = {
            frozenset(map(_short, u.members)): {p.message for p in u.problems}
            for u in report.invalid_units
        }
        expected_invalid = {frozenset(u["unit"]): set(u["reasons"]) for u in exp["invalid_units"]}
        assert invalid == expected_invalid, v["id"]
        assert [f"h{i}" for i in report.mandatory_history] == exp["mandatory_history"], v["id"]


def test_vectors_with_a_broken_new_input_raise_naming_the_item(vectors: list[dict]) -> None:
    for v in vectors:
        if v["expected"]["error"]:
            with pytest.raises(InvalidNewInputError) as info:
                pp.pack(v["history"], v["new_input"], 100_000)
            assert info.value.location.startswith("new_input["), v["id"]
            assert info.value.reasons, v["id"]
            assert isinstance(info.value, ValueError)
        else:
            result = pp.pack(v["history"], v["new_input"], 100_000)
            invalid_positions = {
                p
                for u in pp.analyze(v["history"], v["new_input"]).invalid_units
                for p in u.positions
            }
            assert not invalid_positions & set(result.kept_history), v["id"]


def test_tail_dependency_is_reserved_even_when_nothing_else_fits(vectors: list[dict]) -> None:
    tv04 = next(v for v in vectors if v["id"] == "TV04")
    full = pp.pack(tv04["history"], tv04["new_input"], 100_000)
    need = full.new_input_tokens + full.dependency_tokens
    tight = pp.pack(tv04["history"], tv04["new_input"], need)
    assert tight.kept_history == [1, 2]
    assert tight.dependency == [1, 2]
    assert tight.remaining == 0
    with pytest.raises(TokenBudgetExceededError) as info:
        pp.pack(tv04["history"], tv04["new_input"], need - 1)
    assert info.value.section == "dependency"
    assert info.value.used == need


# --------------------------------------------------------------------------- counting

CORPUS = [
    "",
    "hello world",
    "Привет, мир! Как у тебя дела сегодня?",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "emoji 🙂👍🏽🇺🇦 and CJK 你好世界",
    "   \n\n\t  mixed    whitespace  \r\n",
    "<|endoftext|> special-token text is ordinary text <|im_start|>",
    '{"json": [1, 2.5, null, true], "nested": {"k": "v"}}',
    "x" * 5000,
    ("lorem ipsum dolor sit amet, " * 4000) + "\n" + ("строка текста\n" * 3000),
]


@pytest.mark.parametrize("encoding", ["o200k_base", "cl100k_base"])
def test_counts_equal_the_reference_tokenizer(encoding: str) -> None:
    ref = reference_encoding(encoding)
    for text in CORPUS:
        assert pp.count_tokens(text, encoding=encoding) == len(ref.encode_ordinary(text)), text[:40]
    assert pp.count_tokens_batch(CORPUS, encoding=encoding) == [
        len(ref.encode_ordinary(t)) for t in CORPUS
    ]


def test_model_names_resolve_to_encodings() -> None:
    assert pp.encoding_for_model("gpt-5") == "o200k_base"
    assert pp.encoding_for_model("gpt-4.1-mini") == "o200k_base"
    assert pp.encoding_for_model("gpt-4o") == "o200k_base"
    assert pp.encoding_for_model("o3") == "o200k_base"
    assert pp.encoding_for_model("gpt-4") == "cl100k_base"
    assert pp.encoding_for_model("gpt-3.5-turbo") == "cl100k_base"
    assert "o200k_base" in pp.available_encodings()
    with pytest.raises(UnknownModelError) as info:
        pp.count_tokens("x", model="my-local-llama")
    assert "my-local-llama" in str(info.value) and "encoding=" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(UnknownEncodingError):
        pp.count_tokens("x", encoding="o999k")
    # An explicit encoding wins over an unknown model name.
    assert pp.count_tokens("hello world", model="my-local-llama", encoding="cl100k_base") == 2


def test_item_cost_counts_every_provider_bound_field() -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": '{"a": 1}'}
    longer = dict(call, arguments='{"a": 1, "b": "a much longer argument string"}')
    assert pp.item_tokens(longer).total > pp.item_tokens(call).total
    assert pp.item_tokens(call).overhead == pp._core.ITEM_OVERHEAD
    # Fields the SDK strips before sending are not counted.
    assert pp.item_tokens(dict(call, provider_data={"x": "y" * 500})) == pp.item_tokens(call)
    # Key order does not change the cost.
    assert pp.item_tokens(dict(reversed(list(call.items())))) == pp.item_tokens(call)


def test_images_are_costed_by_the_published_rules_not_by_base64_length() -> None:
    png_1x1 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

    def msg(detail: str, url: str) -> dict:
        return {
            "role": "user",
            "content": [{"type": "input_image", "detail": detail, "image_url": url}],
        }

    assert pp.item_tokens(msg("low", "https://example.com/a.png")).media == 85
    assert pp.item_tokens(msg("high", "https://example.com/a.png")).media == 1445
    assert pp.item_tokens(msg("high", f"data:image/png;base64,{png_1x1}")).media == 255
    padded = f"data:image/png;base64,{png_1x1}"
    assert pp.item_tokens(msg("auto", padded)).text == pp.item_tokens(msg("auto", "u")).text


# --------------------------------------------------------------------------- packing


def _turns(n: int, out_size: int = 20) -> list[dict]:
    h: list[dict] = []
    for t in range(n):
        h += [
            {"role": "user", "content": f"question {t}"},
            {"type": "reasoning", "id": f"rs_{t}", "summary": [], "encrypted_content": "gAAA"},
            {"type": "function_call", "call_id": f"c{t}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{t}", "output": "x " * out_size},
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{t}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"answer {t}", "annotations": []}],
            },
        ]
    return h


def test_pack_returns_the_callers_objects_with_new_input_last_and_unchanged() -> None:
    history = _turns(30)
    new_input = [{"role": "user", "content": [{"type": "input_text", "text": "next?"}]}]
    snapshot = copy.deepcopy((history, new_input))
    result = pp.pack(history, new_input, 600, output_reserve=100)
    assert result.used <= 600
    assert 0 < len(result.kept_history) < len(history)
    assert result.kept_history == sorted(result.kept_history)
    assert all(a is history[i] for a, i in zip(result.items, result.kept_history))
    assert result.items[-1] is new_input[0]
    assert (history, new_input) == snapshot
    # The kept history is the newest, unbroken suffix of whole turns' units.
    assert result.kept_history == list(range(result.kept_history[0], len(history)))
    assert "over_budget" in result.explain()


def test_greedy_policy_keeps_older_turns_past_one_huge_output() -> None:
    history = _turns(6)
    history[3 * 5 + 3]["output"] = "y " * 5000  # turn 3 has a huge tool output
    new_input = [{"role": "user", "content": "next"}]
    contiguous = pp.pack(history, new_input, 900)
    greedy = pp.pack(history, new_input, 900, policy="greedy")
    assert min(greedy.kept_history) < min(contiguous.kept_history)
    assert set(contiguous.kept_history) <= set(greedy.kept_history)
    assert greedy.used <= 900
    # Never the question of the broken turn without the rest of it.
    assert 15 not in greedy.kept_history
    decisions = {d.positions[0]: d.decision for d in greedy.decisions}
    assert decisions[15] == "turn_incomplete"


def test_budget_overflow_raises_with_attributes_and_pickles() -> None:
    with pytest.raises(TokenBudgetExceededError) as info:
        pp.pack(_turns(2), [{"role": "user", "content": "hi " * 100}], 50)
    err = info.value
    assert (err.budget, err.section) == (50, "new_input") and err.used > 50
    assert isinstance(err, ProtoPromptError) and isinstance(err, ValueError)
    again = pickle.loads(pickle.dumps(err))
    assert (again.used, again.budget, again.section) == (err.used, err.budget, err.section)
    with pytest.raises(TokenBudgetExceededError) as info:
        pp.pack([], [{"role": "user", "content": "hi"}], 100, output_reserve=100)
    assert info.value.section == "output_reserve"


def test_every_error_class_is_a_protoprompt_and_value_error_and_pickles() -> None:
    """The classes the core raises are protoprompt.errors' own (imported by the core, not
    look-alikes), each a ProtoPromptError and a ValueError, with attributes through pickle."""
    from protoprompt import errors

    samples = [
        errors.TokenBudgetExceededError(10, 5, "new_input", "why"),
        errors.InvalidItemError("history[1]: field id: bad", "history[1]", "id"),
        errors.InvalidNewInputError("new_input[0]: no call", "new_input[0]", ["no call"]),
        errors.UnknownModelError("no tokenizer for x", "x"),
        errors.UnknownEncodingError("unknown encoding y", "y"),
        errors.SnapshotError("damaged index snapshot"),
        errors.HistoryMismatchError("history has 1 items ...", 1, 2),
        errors.TokenizerError("tokenizer failed: internal error"),
        errors.ConflictingArgumentsError("pack: pass max_tokens or its old name budget"),
    ]
    # MemoryStoreError (a database failure, a RuntimeError) is tested in test_memory.py.
    warnings_ = {"ProtoPromptWarning", "BudgetUnderestimateWarning", "UnbudgetedSessionWarning"}
    assert {type(e).__name__ for e in samples} == set(errors.__all__) - {
        "ProtoPromptError",
        "MemoryStoreError",
        *warnings_,
    }
    for err in samples:
        assert isinstance(err, ProtoPromptError) and isinstance(err, ValueError)
        assert getattr(pp, type(err).__name__) is type(err)
        again = pickle.loads(pickle.dumps(err))
        assert type(again) is type(err) and str(again) == str(err)
        assert vars(again) == vars(err)
    with pytest.raises(errors.UnknownModelError) as info:
        pp.count_tokens("x", model="no-such-model")
    assert type(info.value) is errors.UnknownModelError and info.value.model == "no-such-model"
    with pytest.raises(errors.UnknownEncodingError) as enc_info:
        pp.count_tokens("x", encoding="no-such-encoding")
    assert enc_info.value.encoding == "no-such-encoding"


def test_the_warning_classes_are_protoprompt_warnings_and_pickle() -> None:
    from protoprompt import errors

    unbudgeted = errors.UnbudgetedSessionWarning("no budget", "chat-1")
    assert isinstance(unbudgeted, errors.ProtoPromptWarning)
    assert pp.UnbudgetedSessionWarning is errors.UnbudgetedSessionWarning
    again_u = pickle.loads(pickle.dumps(unbudgeted))
    assert (again_u.session_id, str(again_u)) == ("chat-1", "no budget")

    warning = errors.BudgetUnderestimateWarning("counted more", 10, 12, "gpt-5")
    assert isinstance(warning, errors.ProtoPromptWarning)
    assert isinstance(warning, UserWarning) and isinstance(warning, RuntimeWarning)
    assert not isinstance(warning, ProtoPromptError)
    assert pp.BudgetUnderestimateWarning is errors.BudgetUnderestimateWarning
    again = pickle.loads(pickle.dumps(warning))
    assert (again.estimate, again.reported, again.model, str(again)) == (
        10,
        12,
        "gpt-5",
        "counted more",
    )


def test_a_tokenizer_failure_inside_a_pack_is_a_tokenizer_error_naming_the_item() -> None:
    """A failure of the tokenizer itself is not the item's fault: it is reported as a
    ``TokenizerError`` (not an ``InvalidItemError``), naming the item whose text it was, and
    the failed call changes nothing (the next pack is the pack of a fresh index)."""
    from protoprompt import _core, errors

    history = _turns(3)
    new = [{"role": "user", "content": "the newest question, counted first"}]
    index = pp.HistoryIndex()
    expected = pp.pack(history, new, 10**6)
    _core._clear_count_cache()
    _core._fail_next_counts(1)  # this thread's next count fails (test hook)
    try:
        with pytest.raises(errors.TokenizerError, match=r"^new_input\[0\]: tokenizer failed"):
            index.pack(history, new, 10**6)
    finally:
        _core._fail_next_counts(0)
    assert len(index) == 0, "a failed pack leaves the index as it was"
    again = index.pack(history, new, 10**6)
    assert (again.items, again.used) == (expected.items, expected.used)
    _core._clear_count_cache()
    _core._fail_next_counts(1)
    try:
        with pytest.raises(errors.TokenizerError) as info:
            pp.pack(history, new, 10**6)
    finally:
        _core._fail_next_counts(0)
    assert not isinstance(info.value, InvalidItemError)
    # count_window reports it the same way.
    index = pp.HistoryIndex()
    index.extend(history)
    _core._clear_count_cache()
    _core._fail_next_counts(1)
    try:
        with pytest.raises(errors.TokenizerError, match=r"^history\[\d+\]: tokenizer failed"):
            index.count_window(history, 10**6)
    finally:
        _core._fail_next_counts(0)


def test_canonical_text_is_public_and_is_what_is_counted() -> None:
    item = {
        "type": "function_call",
        "call_id": "c1",
        "name": "lookup",
        "arguments": '{"q": "weather"}',
        "provider_data": {"x": 1},
    }
    text = pp.canonical_text(item)
    assert "lookup" in text and "weather" in text and "provider_data" not in text
    cost = pp.item_tokens(item, encoding="o200k_base")
    assert cost.text == pp.count_tokens(text, encoding="o200k_base")
    with pytest.raises(pp.InvalidItemError, match=r"content\[0\]\.text") as info:
        pp.canonical_text({"role": "user", "content": [{"type": "input_text", "text": math.nan}]})
    assert info.value.field == "content[0].text"


# --------------------------------------------------------------------------- bad input


def _deep(levels: int) -> dict:
    v: object = "leaf"
    for _ in range(levels):
        v = {"k": v}
    return {"role": "user", "content": v}


class _Opaque:
    pass


@pytest.mark.parametrize(
    ("item", "field", "words"),
    [
        (7, "(item)", "mapping"),
        ("a string", "(item)", "mapping"),
        ({"type": "function_call", "call_id": 12, "name": "f"}, "call_id", "string"),
        ({"type": 3}, "type", "string"),
        ({"role": "user", "content": "x", "id": ["a"]}, "id", "string"),
        ({"type": "function_call", "call_id": "c", "caller": "p1"}, "caller", "mapping"),
        (
            {
                "type": "function_call",
                "call_id": "c",
                "caller": {"type": "program", "caller_id": 4},
            },
            "caller.caller_id",
            "string",
        ),
        (
            {"role": "user", "content": [{"type": "input_text", "text": math.nan}]},
            "content[0].text",
            "NaN",
        ),
        (
            {"role": "user", "content": [{"type": "input_text", "text": math.inf}]},
            "content[0].text",
            "infinity",
        ),
        ({"role": "user", "content": {1: "x"}}, "content", "non-string key"),
        ({"role": "user", "content": [b"bytes"]}, "content[0]", "not a JSON value"),
        ({"role": "user", "content": [{"x": _Opaque()}]}, "content[0].x", "not a JSON value"),
        ({"role": "user", "content": "\ud800 lone surrogate"}, "content", "UTF-8"),
        (_deep(500), "content", "nesting"),
    ],
)
def test_bad_items_raise_a_clear_error_naming_item_and_field(item, field, words) -> None:
    history = [{"role": "user", "content": "ok"}, {"role": "user", "content": "fine"}]
    bad_history = history + [item]
    snapshot = copy.deepcopy(history)
    with pytest.raises(InvalidItemError) as info:
        # Bad new_input is always read whole; bad history is read when it is costed.
        pp.pack([], [item], 10_000)
    assert info.value.location == "new_input[0]"
    assert info.value.field.startswith(field), (info.value.field, field)
    assert words.lower() in str(info.value).lower()
    assert isinstance(info.value, ValueError)
    if field in ("(item)", "call_id", "type", "id", "caller", "caller.caller_id"):
        with pytest.raises(InvalidItemError) as info:
            pp.pack(bad_history, [{"role": "user", "content": "q"}], 10_000)
        assert info.value.location == "history[2]"
    assert history == snapshot


def test_bad_arguments() -> None:
    with pytest.raises(TypeError):
        pp.pack("not a list", [], 10)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pp.pack([], {"role": "user"}, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        pp.pack([], [], -1)
    with pytest.raises(ValueError, match="policy"):
        pp.pack([], [], 10, policy="fastest")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        pp.pack([], [], 10.5)  # type: ignore[arg-type]


def test_packing_from_several_threads_gives_the_same_result() -> None:
    history = _turns(200)
    new_input = [{"role": "user", "content": "next"}]
    expected = pp.pack(history, new_input, 4000).kept_history
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                results.append(pp.pack(history, new_input, 4000).kept_history)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == [expected] * 20


def test_context_callable_must_return_a_token_count() -> None:
    seen: list[int] = []

    def context(remaining: int) -> int:
        seen.append(remaining)
        return 20

    new_input = [{"role": "user", "content": "q"}]
    result = pp.pack(
        [{"role": "user", "content": "old"}], new_input, 100, output_reserve=10, context=context
    )
    assert seen == [100 - 10 - result.new_input_tokens]
    assert result.context_tokens == 20 and result.used <= 100
    for bad in (-1, "x", 2.5, None):
        with pytest.raises(ValueError, match="non-negative int"):
            pp.pack([], new_input, 100, context=lambda remaining, bad=bad: bad)
    with pytest.raises(ZeroDivisionError):
        pp.pack([], new_input, 100, context=lambda remaining: 1 // 0)
    with pytest.raises(TokenBudgetExceededError) as info:
        pp.pack([], new_input, 100, context=lambda remaining: remaining + 1)
    assert info.value.section == "context"


def test_decisions_are_a_lazy_sequence_matching_the_explanation() -> None:
    history = _turns(40)
    history.insert(3, {"type": "compaction_trigger"})  # an input-only control in history
    result = pp.pack(history, [{"role": "user", "content": "next"}], 700)
    decisions = result.decisions
    assert isinstance(decisions, pp.Decisions)
    every = list(decisions)
    assert len(every) == len(decisions) > 40
    assert list(reversed(decisions)) == every[::-1]
    assert decisions[-1] == every[-1] and decisions[2:5] == every[2:5]
    with pytest.raises(IndexError):
        decisions[len(decisions)]
    # Every history item is accounted for exactly once.
    positions = sorted(p for d in every for p in d.positions)
    assert positions == list(range(len(history)))
    counts: dict[str, int] = {}
    for d in every:
        counts[d.decision] = counts.get(d.decision, 0) + len(d.positions)
    assert result.decision_counts() == counts
    assert counts["input_only"] == 1
    control = next(d for d in every if d.decision == "input_only")
    assert control.positions == [3] and control.problems[0].location == "history[3]"
    assert [p for d in every if d.kept for p in d.positions] == result.kept_history
    assert f"{counts['over_budget']} over_budget" in result.explain()
    units: dict[str, int] = {}
    for d in every:
        units[d.decision] = units.get(d.decision, 0) + 1
    assert decisions.unit_counts() == units
    # explain() lists the newest dropped units and counts the rest without building them.
    dropped = [d for d in reversed(every) if not d.kept]
    text = result.explain(max_units=3)
    listed = [line for line in text.splitlines() if line.startswith("  history[")]
    assert len(listed) == 3 and listed[0].startswith(f"  history[{dropped[0].positions[0]}")
    assert f"... and {len(dropped) - 3} older dropped units" in text
    assert len(
        [ln for ln in result.explain(max_units=None).splitlines() if ln.startswith("  history[")]
    ) == len(dropped)


def _run_python_ok(code: str) -> None:
    """Run ``code`` in a fresh interpreter importing this protoprompt; it must print "ok"."""
    env = dict(os.environ)
    package_dir = str(Path(pp.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_dir, env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_first_call_builds_the_tokenizer_alongside_and_leaves_no_thread() -> None:
    """The first pack of a process builds its encoding on a helper thread while the items
    are read; the helper is joined before the call returns, also when the call fails."""
    code = textwrap.dedent("""
        import os, time, protoprompt as pp
        from protoprompt import _core
        tasks = lambda: len(os.listdir("/proc/self/task"))

        def settled(before):
            # A joined thread can stay listed for a moment while the kernel reaps it, however
            # long a loaded machine takes; a thread left running (a pool, a parked helper)
            # stays for good. The build itself is over when the call returns (asserted
            # below), so no waiting here can mistake a build for a finished thread.
            deadline = time.monotonic() + 30
            while tasks() != before and time.monotonic() < deadline:
                time.sleep(0.001)
            return tasks() == before

        before = tasks()
        try:
            pp.pack([{"role": 5}], [{"role": "user", "content": "x"}], 100, encoding="cl100k_base")
        except pp.InvalidItemError:
            pass
        # The failed call waited for its helper: the tokenizer is complete when it returns.
        assert _core.is_preloaded(encoding="cl100k_base")
        assert settled(before), (before, tasks())
        r = pp.pack([{"role": "user", "content": "hello there"}],
                    [{"role": "user", "content": "x"}], 1000, encoding="r50k_base")
        assert _core.is_preloaded(encoding="r50k_base")
        assert settled(before), (before, tasks())
        item = {"role": "user", "content": "hello there"}
        assert r.history_tokens == pp.item_tokens(item, encoding="r50k_base").total
        print("ok")
    """)
    _run_python_ok(code)


def test_the_allocator_commits_memory_as_it_is_used() -> None:
    """The extension's allocator is switched to lazy commit at import (fails if a mimalloc
    upgrade renumbers its options, which would leave the tuning silently off)."""
    from protoprompt import _core

    assert _core._lazy_commit_allocator() is True


def test_preload_names_the_encoding_and_rejects_unknown_models() -> None:
    assert pp.preload(model="gpt-4") == "cl100k_base"
    assert pp.preload() == "o200k_base"
    with pytest.raises(pp.UnknownModelError):
        pp.preload(model="no-such-model")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_during_a_background_tokenizer_build_gives_a_working_child() -> None:
    """A fork while a tokenizer is being built on another thread (multiprocessing's default
    on Linux) must not hand the child a half-built tokenizer: its first count would wait
    forever. The fork waits for the build instead."""
    code = textwrap.dedent("""
        import os, sys, time
        import protoprompt as pp
        from protoprompt import _core
        assert not _core.is_preloaded(encoding="cl100k_base")
        # The build holds the build lock and then waits for the fork to begin: the fork
        # starts during the build, whatever the machine's speed.
        _core._hold_next_build_until_fork()
        assert pp.preload(encoding="cl100k_base", wait=False) == "cl100k_base"
        while not _core._build_is_held():
            time.sleep(0.001)
        pid = os.fork()
        if pid:
            # The fork waited for the build: the parent has the whole tokenizer at once.
            assert _core.is_preloaded(encoding="cl100k_base")
        if pid == 0:
            ok = pp.count_tokens("hello world", encoding="cl100k_base") == 2
            os._exit(0 if ok else 3)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.02)
        else:
            os.kill(pid, 9)
            sys.exit("the child hung")
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert _core.is_preloaded(encoding="cl100k_base")
        print("ok")
    """)
    _run_python_ok(code)


def test_items_may_be_any_mapping_and_read_the_same_as_dicts() -> None:
    """Dict subclasses and other Mappings (read through their own methods) classify and cost
    exactly like plain dicts, mixed in one history."""
    import collections
    import types

    def turn(i: int) -> list[dict]:
        return [
            {"role": "user", "content": f"question {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": f"out {i}"},
        ]

    plain = [it for i in range(40) for it in turn(i)]
    wrappers = [dict, collections.OrderedDict, types.MappingProxyType, collections.UserDict]
    mixed = [wrappers[j % len(wrappers)](dict(it)) for j, it in enumerate(plain)]
    new_input = [{"role": "user", "content": "next"}]
    for budget in (60, 400, 5000):
        a = pp.pack(plain, new_input, budget)
        b = pp.pack(mixed, new_input, budget)
        assert (a.kept_history, a.history_tokens, a.used) == (
            b.kept_history,
            b.history_tokens,
            b.used,
        )
        index = pp.HistoryIndex()
        c = index.pack(mixed, new_input, budget)
        assert (c.kept_history, c.used) == (a.kept_history, a.used)
    # A broken call inside a non-dict Mapping is still named by position and field.
    bad = list(mixed)
    bad[5] = types.MappingProxyType({"type": "function_call", "call_id": 3})
    with pytest.raises(pp.InvalidItemError, match=r"history\[5\].*call_id"):
        pp.pack(bad, new_input, 5000)


def test_nested_fields_may_be_any_mapping_and_read_the_same_as_dicts() -> None:
    """A ``caller`` or ``provider_data`` given as a non-dict Mapping is read like a dict: the
    program's calls stay in its unit and the hosted wrapper is recognised, in the analysis,
    in a pack and in an index; a broken caller inside one is named by position and field."""
    import collections
    import types

    def turn(i: int, wrap) -> list[dict]:
        caller = wrap({"type": "program", "caller_id": f"p{i}"})
        return [
            {"role": "user", "content": f"question {i}"},
            {"type": "program", "id": f"pg_{i}", "call_id": f"p{i}", "code": "js"},
            {
                "type": "function_call",
                "call_id": f"c{i}",
                "name": "f",
                "arguments": "{}",
                "caller": caller,
            },
            {
                "type": "function_call_output",
                "call_id": f"c{i}",
                "output": f"out {i}",
                "caller": caller,
            },
            {"type": "program_output", "id": f"po_{i}", "call_id": f"p{i}", "result": "ok"},
            {
                "type": "hosted_tool_call",
                "name": "t",
                "provider_data": wrap(
                    {
                        "type": "mcp_approval_request",
                        "id": f"mcpr_{i}",
                        "name": "t",
                        "server_label": "crm",
                        "arguments": "{}",
                    }
                ),
            },
        ]

    new_input = [{"role": "user", "content": "next"}]
    plain = [it for i in range(12) for it in turn(i, dict)]
    want = pp.analyze(plain, new_input)
    for wrap in (types.MappingProxyType, collections.UserDict, collections.OrderedDict):
        mixed = [it for i in range(12) for it in turn(i, wrap)]
        assert pp.analyze(mixed, new_input) == want, wrap
        for budget in (80, 600, 50_000):
            a = pp.pack(plain, new_input, budget)
            b = pp.pack(mixed, new_input, budget)
            assert (a.kept_history, a.used) == (b.kept_history, b.used), (wrap, budget)
            c = pp.HistoryIndex().pack(mixed, new_input, budget)
            assert (c.kept_history, c.used) == (a.kept_history, a.used), (wrap, budget)
        bad = list(mixed)
        bad[2] = dict(bad[2], caller=wrap({"type": "program", "caller_id": 4}))
        with pytest.raises(pp.InvalidItemError) as info:
            pp.pack(bad, new_input, 50_000)
        assert (info.value.location, info.value.field) == ("history[2]", "caller.caller_id")
        assert "string" in str(info.value)


# --------------------------------------------------------------------------- content digests


def test_digests_see_every_change_of_content_and_nothing_else() -> None:
    """``_core.digests``: what a cache keyed on content compares (the model filter's run
    index). Equal content digests equally, in any new object; any edit, in place or not,
    at any depth, changes the digest; values without a JSON form equal nothing."""
    from collections import OrderedDict

    from protoprompt import _core

    def one(value: object) -> bytes:
        return _core.digests([value])[0]

    item = {
        "role": "user",
        "content": [{"type": "input_text", "text": "héllo " * 1000}, {"n": 1, "f": 1.5, "b": True}],
    }
    assert one(item) == one(copy.deepcopy(item)) == one(OrderedDict(item))
    edits = [
        lambda i: i["content"][0].update(text=i["content"][0]["text"] + "!"),
        lambda i: i["content"][1].update(n=2),
        lambda i: i["content"][1].update(f=1.25),
        lambda i: i["content"][1].update(b=1),
        lambda i: i["content"].append({}),
        lambda i: i["content"].insert(0, i["content"].pop()),
        lambda i: i.update(extra=None),
        lambda i: i.update(content=tuple(i["content"]) + ("x",)),
    ]
    for edit in edits:
        changed = copy.deepcopy(item)
        edit(changed)
        assert one(changed) != one(item)

    class Text(str):
        pass

    assert one({"t": Text("abc")}) == one({"t": Text("abc")}) != one({"t": Text("abd")})
    huge = 10**5000  # no JSON number: never equal, not even to itself
    assert one({"n": huge}) != one({"n": huge})
    assert one({"o": object()}) != one({"o": object()})
    deep: object = "leaf"
    for _ in range(200):
        deep = [deep]
    assert one(deep) != one(deep)
    digests, same = _core.digests([item, {"a": 1}, {"b": 2}])
    assert len(digests) == 48 and same == 0
    assert _core.digests([item, {"a": 1}, {"b": 3}], digests)[1] == 2
    assert _core.digests([item], digests)[1] == 1
    with pytest.raises(TypeError):
        _core.digests("not a list")
