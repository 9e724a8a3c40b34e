"""Opaque payloads cost their decoded size (cost rule 2), and nothing counted under the old
rule (their base64 read as text) is reused: not an index snapshot's costs, not a count
store's counts. ``tests/data/old_rule.db`` was written by protoprompt at commit 1d25e97
(``tests/data/make_old_rule_db.py``)."""

from __future__ import annotations

import asyncio
import base64
import math
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protoprompt as pp
from protoprompt import _core
from snapshot_stamp import restamp

DATA = Path(__file__).resolve().parents[1] / "data"


def fernet(decoded_bytes: int, seed: int = 0) -> str:
    """A payload shaped like the encrypted content OpenAI returns: URL-safe base64 of a
    version byte, a timestamp and random bytes."""
    rng = random.Random(seed)
    raw = b"\x80\x00\x00\x00\x00" + rng.randbytes(decoded_bytes - 5)
    return base64.urlsafe_b64encode(raw).decode()


def rule(decoded_bytes: int) -> int:
    return math.ceil(max(decoded_bytes - 650, 0) * 125 / 400)


ANSWER = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "ok"}],
}


def reasoning(decoded_bytes: int, seed: int = 0, **extra: Any) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{seed}",
        "summary": [{"type": "summary_text", "text": "Checking the totals."}],
        "encrypted_content": fernet(decoded_bytes, seed),
        **extra,
    }


# ------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("decoded", [0, 650, 651, 2000, 4650, 60_000])
def test_reasoning_and_compaction_cost_their_decoded_size(decoded: int) -> None:
    for item in (
        reasoning(max(decoded, 5)),
        {"type": "compaction", "id": "cmp_1", "encrypted_content": fernet(max(decoded, 5))},
    ):
        cost = pp.item_tokens(item)
        assert cost.opaque == rule(max(decoded, 5))
        assert cost.fallback is None and cost.note is None
        text = pp.canonical_text(item)
        assert item["encrypted_content"] not in text
        assert "encrypted_content: \n" in text
        assert cost.text == pp.count_tokens(text)
        assert cost.total == cost.text + cost.media + cost.overhead + cost.opaque


def test_the_rule_is_far_below_reading_the_base64_as_text() -> None:
    item = reasoning(4650)
    as_text = pp.count_tokens(item["encrypted_content"])
    cost = pp.item_tokens(item)
    assert cost.opaque == 1250
    assert as_text > 3 * cost.opaque, (as_text, cost.opaque)


@pytest.mark.parametrize(
    "payload",
    [
        "enc!",
        "gAAAAAB=gAAAA",
        "Zm9v YmFy",
        "a",
        fernet(3000)[:-1] + "*",
        # standard and URL-safe alphabets mixed
        base64.b64encode(b"\xfb\xff" * 300).decode()
        + base64.urlsafe_b64encode(b"\xfb\xff").decode(),
    ],
)
def test_a_payload_that_is_not_base64_is_counted_as_text_and_says_so(payload: str) -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": payload}
    cost = pp.item_tokens(item)
    assert (cost.opaque, cost.fallback) == (0, "encrypted_content")
    assert cost.note == "encrypted_content is not valid base64: counted as text"
    assert payload in pp.canonical_text(item)
    assert cost.text == pp.count_tokens(pp.canonical_text(item))
    # A pack never fails on it: the item is counted conservatively.
    history = [{"role": "user", "content": "q"}, item, ANSWER]
    result = pp.pack(history, [], 10_000)
    assert result.kept_history == [0, 1, 2]
    assert result.history_tokens == sum(pp.item_tokens(i).total for i in history)


def test_several_signatures_joined_by_newlines_are_decoded_one_by_one() -> None:
    # The SDK's Chat Completions converter stores thinking-block signatures that way.
    sigs = [base64.b64encode(random.Random(i).randbytes(1000)).decode() for i in range(3)]
    item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "\n".join(sigs)}
    assert pp.item_tokens(item).opaque == rule(3000)


def test_only_the_providers_opaque_fields_are_decoded() -> None:
    payload = fernet(3000)
    for item in (
        {"role": "user", "content": "x", "encrypted_content": payload},
        {"type": "function_call_output", "call_id": "c", "output": payload},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": payload}]},
    ):
        cost = pp.item_tokens(item)
        assert (cost.opaque, cost.fallback) == (0, None), item
        assert payload in pp.canonical_text(item)


def test_an_image_generation_result_costs_as_an_image() -> None:
    png = (
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
        "rkJggg=="
    )
    item = {"type": "image_generation_call", "id": "ig_1", "status": "completed", "result": png}
    cost = pp.item_tokens(item)
    assert (cost.media, cost.opaque, cost.fallback) == (255, 0, None)
    assert png not in pp.canonical_text(item)
    broken = dict(item, result="!!!!")
    assert pp.item_tokens(broken).fallback == "result"


def test_opaque_scale_scales_the_opaque_part_only() -> None:
    history = [{"role": "user", "content": "q"}, reasoning(4650), ANSWER]
    full = pp.pack(history, [], 100_000)
    half = pp.pack(history, [], 100_000, opaque_scale=0.5)
    assert full.history_tokens - half.history_tokens == 625
    assert (full.opaque_scale, half.opaque_scale) == (1.0, 0.5)
    assert "opaque payloads at x0.5" in half.explain()
    assert "opaque payloads" not in full.explain()
    assert _core.scale_opaque(1250, 0.5) == 625
    for bad in (0.1, 2.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="opaque_scale"):
            pp.pack(history, [], 100_000, opaque_scale=bad)
    with pytest.raises(TypeError, match="opaque_scale"):
        pp.pack(history, [], 100_000, opaque_scale="1")  # type: ignore[arg-type]


def test_an_index_under_another_calibration_counts_again() -> None:
    history = [{"role": "user", "content": "q"}, reasoning(4650), ANSWER]
    index = pp.HistoryIndex()
    a = index.pack(history, [], 100_000, opaque_scale=0.5)
    assert index._index._costs_counted() == 3
    b = index.pack(history, [], 100_000)
    assert b.history_tokens == a.history_tokens + 625
    assert b.history_tokens == pp.pack(history, [], 100_000).history_tokens
    # The window walks only costs of the calibration it is asked for.
    assert index.window_start([], 10, opaque_scale=1.0) >= 0


def test_a_window_is_found_under_the_packs_calibration() -> None:
    """Costs counted under a larger calibration are no lower bound under a smaller one: a
    window found from them would be too short for the pack."""
    history: list[dict[str, Any]] = []
    for t in range(12):
        history += [
            {"role": "user", "content": f"q{t}"},
            reasoning(8000, t),
            dict(ANSWER, id=f"m{t}"),
        ]
    new = [{"role": "user", "content": "next"}]
    budget = 12_000
    index = pp.HistoryIndex()
    index.pack(history, [], 10**9, opaque_scale=2.0)  # every cost counted at x2
    for scale in (0.25, 1.0, 2.0):
        expected = pp.pack(history, new, budget, opaque_scale=scale)
        w = index.window_start(new, budget, opaque_scale=scale)
        got = index.pack(history[w:], new, budget, history_offset=w, opaque_scale=scale)
        assert got.kept_history == expected.kept_history, scale
        assert got.used == expected.used
    assert expected.kept_history != pp.pack(history, new, budget, opaque_scale=0.25).kept_history


# ------------------------------------------------------------------------- an old database


@pytest.fixture
def old_db(tmp_path: Path, new_process: Callable[[], None]) -> str:
    """A copy of the session database protoprompt wrote under cost rule 1, in a process
    that has counted nothing."""
    path = tmp_path / "old_rule.db"
    shutil.copy(DATA / "old_rule.db", path)
    # Written by 0.2.0; the core loads only its own version's snapshots, so the cost rule
    # under test is restamped with this version (tests/snapshot_stamp.py).
    assert restamp(path, pp.__version__) == ["0.2.0"]
    new_process()
    return str(path)


def _old_rows(db: str) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        counts = conn.execute("SELECT COUNT(*) FROM protoprompt_token_counts").fetchone()[0]
        snaps = conn.execute("SELECT COUNT(*) FROM protoprompt_index_snapshots").fetchone()[0]
    return int(counts), int(snaps)


def test_the_old_database_holds_old_rule_state(old_db: str) -> None:
    # What the test below must not reuse: counts of the reasoning items' texts (with their
    # base64) and a snapshot whose costs read the base64 as text.
    assert _old_rows(old_db) == (25, 1)
    with sqlite3.connect(old_db) as conn:
        ((data,),) = conn.execute("SELECT data FROM protoprompt_index_snapshots").fetchall()
    with pytest.raises(pp.SnapshotError):  # never loadable without its binding
        pp.HistoryIndex.from_snapshot(data)


def test_an_old_rule_database_is_never_trusted_for_opaque_payloads(old_db: str) -> None:
    from protoprompt.integrations import ProtoPromptSession

    async def turn() -> tuple[Any, list[Any]]:
        session = ProtoPromptSession("old-rule", old_db, snapshot_min_items=8)
        builder = pp.TokenBudgetedContextBuilder(
            pp.MemoryStore(), max_tokens=200_000, output_reserve=1000
        )
        callback = session.input_callback(builder)
        items = await session.get_items()
        # The old snapshot was loaded: its items and graph are reused, its costs are not.
        index = session._index_state.index
        assert index.snapshot_costs_dropped == (
            "counted under cost rule 1 (opaque payloads as text): counted again"
        )
        assert index._index._costs_counted() == 0
        new = [{"role": "user", "content": "And the fourth?"}]
        await callback(items, new)
        plan = builder.last_plan
        assert plan is not None and plan.turn is not None
        assert len(items) == 39
        assert (plan.turn.snapshot, plan.turn.snapshot_detail) == ("loaded", "39 items")
        session.close()
        return plan, items

    plan, items = asyncio.run(turn())
    # The request is exactly a fresh pack of the same history, counted by the new rule:
    # an old count of a reasoning item's text (base64 included) would cost it ~3x more.
    fresh = pp.pack(
        items,
        [{"role": "user", "content": "And the fourth?"}],
        200_000,
        output_reserve=1000,
        context_tokens=plan.pack.context_tokens,
    )
    assert plan.pack.history_tokens == fresh.history_tokens
    assert plan.pack.used == fresh.used
    opaque = sum(pp.item_tokens(i).opaque for i in items)
    as_text = sum(
        pp.count_tokens(i["encrypted_content"]) for i in items if "encrypted_content" in i
    )
    assert opaque > 0 and as_text > 2 * opaque
    assert plan.pack.history_tokens == sum(pp.item_tokens(i).total for i in items)


# ------------------------------------------------------------------------- properties

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5E"
    "rkJggg=="
)


@st.composite
def payloads(draw: st.DrawFn) -> Any:
    """An ``encrypted_content`` in every form it is stored: a Fernet-shaped token of any size,
    padded or not, standard alphabet, several joined by newlines, not base64, null."""
    kind = draw(st.sampled_from(["fernet", "fernet", "bare", "standard", "joined", "bad", "null"]))
    size = draw(st.integers(5, 12_000))
    seed = draw(st.integers(0, 2**16))
    token = fernet(size, seed)
    if kind == "bare":
        return token.rstrip("=")
    if kind == "standard":
        return base64.b64encode(base64.urlsafe_b64decode(token)).decode()
    if kind == "joined":
        return token + "\n" + fernet(draw(st.integers(5, 3000)), seed + 1)
    if kind == "bad":
        return token[: draw(st.integers(0, len(token)))] + draw(st.sampled_from(["!", " x", "=="]))
    if kind == "null":
        return None
    return token


@st.composite
def opaque_histories(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Turns of a user message, reasoning and calls with outputs, compaction items and image
    generation results anywhere, reasoning without an id (``"omit"``) too."""
    history: list[dict[str, Any]] = []
    n = draw(st.integers(1, 10))
    for t in range(n):
        history.append({"role": "user", "content": f"question {t} " * draw(st.integers(1, 30))})
        for s in range(draw(st.integers(0, 3))):
            rs: dict[str, Any] = {
                "type": "reasoning",
                "summary": [],
                "encrypted_content": draw(payloads()),
            }
            if draw(st.booleans()):
                rs["id"] = f"rs_{t}_{s}"
            history.append(rs)
            cid = f"c{t}_{s}"
            history.append(
                {"type": "function_call", "call_id": cid, "name": "f", "arguments": "{}"}
            )
            history.append(
                {
                    "type": "function_call_output",
                    "call_id": cid,
                    "output": "ok " * draw(st.integers(1, 200)),
                }
            )
        if draw(st.integers(0, 4)) == 0:
            history.append(
                {"type": "compaction", "id": f"cmp_{t}", "encrypted_content": draw(payloads())}
            )
        if draw(st.integers(0, 5)) == 0:
            result = draw(st.sampled_from([PNG, "!!!!", None]))
            history.append(
                {
                    "type": "image_generation_call",
                    "id": f"ig_{t}",
                    "status": "completed",
                    "result": result,
                }
            )
        history.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{t}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"answer {t}"}],
            }
        )
    return history, [{"role": "user", "content": "next"}]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    opaque_histories(),
    st.integers(200, 60_000),
    st.sampled_from([1.0, 1.0, 0.25, 0.5, 0.8125, 2.0]),
    st.sampled_from([1.0, 0.5, 2.0]),
    st.one_of(st.integers(0, 40), st.just(10**6)),
)
def test_opaque_histories_pack_exactly_through_every_path(
    case: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    budget: int,
    scale: float,
    earlier_scale: float,
    seen: int,
) -> None:
    """Whatever the payloads: the pack equals the reference packer's (which decodes them on
    its own, with the standard library) at the rule; an index that packed a prefix under
    another calibration packs like a fresh pack; a token window found under the pack's
    calibration packs like the whole history."""
    from reference_packer import ReferencePacker

    history, new_input = case
    reserve = 50
    try:
        expected = pp.pack(history, new_input, budget, output_reserve=reserve, opaque_scale=scale)
    except pp.TokenBudgetExceededError:
        return
    assert expected.history_tokens + expected.new_input_tokens + reserve == expected.used <= budget
    if scale == 1.0:
        ref = ReferencePacker(warm=False).pack(history, new_input, budget, output_reserve=reserve)
        assert ref.kept_history == expected.kept_history
        assert (ref.history_tokens, ref.used) == (expected.history_tokens, expected.used)
    else:
        # The opaque part only is scaled: never below the rule for the rest.
        for p in expected.kept_history:
            cost = pp.item_tokens(history[p])
            assert cost.total - cost.opaque + _core.scale_opaque(cost.opaque, scale) > 0
    seen = min(seen, len(history))
    index = pp.HistoryIndex()
    index.pack(history[:seen], [], 10**9, opaque_scale=earlier_scale)
    room = budget - reserve
    w = min(index.window_start(history[seen:] + new_input, room, opaque_scale=scale), seen)
    got = index.pack(
        history[w:], new_input, budget, output_reserve=reserve, history_offset=w, opaque_scale=scale
    )
    assert [id(x) for x in got.items] == [id(x) for x in expected.items]
    assert (got.history_tokens, got.used, got.opaque_scale) == (
        expected.history_tokens,
        expected.used,
        expected.opaque_scale,
    )
