"""compaction_trigger: OpenAIResponsesCompactionSession compacts when the history costs more
than ``at`` x (max_tokens - output_reserve), by protoprompt's exact counts from the
session's index; wrapped around a ProtoPromptSession and inside one."""

from __future__ import annotations

import asyncio
import copy
import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, SQLiteSession, function_tool  # noqa: E402
from agents.memory import OpenAIResponsesCompactionSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from protoprompt import (  # noqa: E402
    HistoryIndex,
    Masking,
    TokenBudgetedContextBuilder,
    item_tokens,
)
from protoprompt.integrations import (  # noqa: E402
    CompactionTrigger,
    ProtoPromptSession,
    compaction_trigger,
)

SUMMARY = [{"role": "assistant", "content": "compacted: we talked about invoices"}]
TAIL_MATCHING = hasattr(importlib.import_module("agents.memory.session"), "_CompactionSnapshot")
"""openai-agents 0.23 and later compact the stored suffix the last request sent unchanged."""


def client() -> MagicMock:
    fake = MagicMock()
    fake.responses.compact = AsyncMock(
        return_value=SimpleNamespace(output=copy.deepcopy(SUMMARY), usage=None)
    )
    return fake


def cost(items: list[Any]) -> int:
    return sum(item_tokens(i).total for i in items)


def history(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * i}
        for i in range(n)
    ]


def test_cost_over_reuses_the_index_and_stops_early() -> None:
    items = history(400)
    index = HistoryIndex()
    index.pack(items, [], 2_000)  # the pack counted the newest items only
    counted = index._index._costs_counted()
    assert 0 < counted < 400
    total = cost(items)
    tokens, over = index.cost_over(items, 1_000)
    assert over and 1_000 < tokens < total
    assert index._index._costs_counted() == counted  # nothing counted again or beyond
    assert index.cost_over(items, total) == (total, False)
    assert index.cost_over(items, total - 1) == (total, True)
    # Items stored since the index last saw the history are counted and added on top.
    more = history(403)[400:]
    assert index.cost_over(items, 10**9, appended=more) == (total + cost(more), False)
    with pytest.raises(ValueError, match="exactly the 400 indexed items"):
        index.cost_over(items[:-1], 10)
    with pytest.raises(ValueError, match="limit"):
        index.cost_over(items, -1)


@pytest.mark.parametrize("at", [0, -0.5, 1.5, float("nan")])
def test_at_is_checked(at: float) -> None:
    with pytest.raises(ValueError, match="at"):
        compaction_trigger(TokenBudgetedContextBuilder(None, max_tokens=100), at=at)


@pytest.mark.parametrize(("at", "limit"), [(0.57, 5_700), (0.29, 2_900), (0.7, 7_000), (1, 10_000)])
def test_the_limit_is_at_as_written_times_the_room(at: float, limit: int) -> None:
    """0.57 x 10,000 is 5,700 (the float 0.57 times 10,000 is 5,699.99...): a history of
    exactly 5,700 tokens does not compact, one of 5,701 does."""
    builder = TokenBudgetedContextBuilder(None, max_tokens=10_500, output_reserve=500)
    trigger = compaction_trigger(builder, at=at)
    assert trigger.limit == limit


def test_the_trigger_needs_a_builder_and_the_sdks_context() -> None:
    with pytest.raises(TypeError, match="builder"):
        compaction_trigger(object())  # type: ignore[arg-type]
    trigger = compaction_trigger(TokenBudgetedContextBuilder(None, max_tokens=100))
    with pytest.raises(TypeError, match="session_items"):
        trigger({})


def test_without_a_session_the_items_are_counted() -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=1_100, output_reserve=100)
    trigger = compaction_trigger(builder, at=0.5)
    assert trigger.limit == 500
    items = history(40)
    assert trigger({"session_items": items}) is (cost(items) > 500)
    assert trigger.last is not None and trigger.last.from_index == 0
    assert trigger.last.why_not_index == "no session of this run"
    assert not trigger({"session_items": history(3)})
    assert "do not compact" in trigger.last.explain()


async def _turns(
    session: Any, store: ProtoPromptSession, builder: TokenBudgetedContextBuilder, n: int
) -> None:
    config = RunConfig(session_input_callback=store.input_callback(builder), tracing_disabled=True)
    for i in range(n):
        model = ScriptedModel([[assistant_message(f"answer {i}: " + "fine " * 40)]])
        await Runner.run(
            Agent(name="a", model=model),
            f"question {i} " + "why " * 30,
            session=session,
            run_config=config,
        )


@pytest.mark.parametrize("wrapping", ["compaction_outside", "compaction_inside"])
def test_compaction_starts_when_the_history_passes_the_share(tmp_path: Path, wrapping: str) -> None:
    builder = TokenBudgetedContextBuilder(None, max_tokens=1_100, output_reserve=100)
    trigger = compaction_trigger(builder, at=0.5)
    decisions: list[tuple[bool, int, CompactionTrigger]] = []

    def hook(context: dict[str, Any]) -> bool:
        verdict = trigger(context)
        decisions.append((verdict, cost(context["session_items"]), copy.copy(trigger)))
        return verdict

    fake = client()
    db = str(tmp_path / "h.db")
    # openai-agents 0.22 compacts whole histories: the trigger refuses the server's copy.
    mode: Any = "auto" if TAIL_MATCHING else "input"
    if wrapping == "compaction_outside":
        store = ProtoPromptSession("s", db)
        session: Any = OpenAIResponsesCompactionSession(
            "s", store, client=fake, compaction_mode=mode, should_trigger_compaction=hook
        )
    else:
        inner = OpenAIResponsesCompactionSession(
            "s",
            SQLiteSession("s", db),
            client=fake,
            compaction_mode=mode,
            should_trigger_compaction=hook,
        )
        store = ProtoPromptSession("s", inner_session=inner, incremental=True)
        session = store
    asyncio.run(_turns(session, store, builder, 8))
    assert decisions, "the SDK asked the trigger"
    # Every decision is the exact count's: more than half of the room for history.
    for verdict, exact, _ in decisions:
        assert verdict is (exact > 500)
    assert [v for v, _, _ in decisions][:2] == [False, False]
    assert any(v for v, _, _ in decisions)
    assert fake.responses.compact.await_count == sum(v for v, _, _ in decisions) >= 1
    # The costs came from the session's index (the turns' counts), not a second read.
    assert trigger.last is not None
    assert any(d.last is not None and d.last.from_index > 0 for _, _, d in decisions), [
        d.last.explain() for _, _, d in decisions if d.last
    ]
    store.close()


# --------------------------------------------------------------------------- no stored item lost


@function_tool
def lookup(q: str) -> str:
    """Look a record up."""
    return f"record {q}: " + "data " * 1_000


def recording_client(raw: Any, calls: list[dict[str, Any]]) -> MagicMock:
    """A stub of ``responses.compact`` that records what it was sent and the stored rows at
    that moment (read by the SDK's own session of the stored session), and answers with one
    compaction item."""
    fake = MagicMock()

    async def compact(**kwargs: Any) -> SimpleNamespace:
        output = [{"type": "compaction", "encrypted_content": f"cmp{len(calls)}"}]
        calls.append({**kwargs, "before": await raw.get_items(), "output": output})
        return SimpleNamespace(output=copy.deepcopy(output), usage=None)

    fake.responses.compact = AsyncMock(side_effect=compact)
    return fake


@pytest.mark.parametrize("masking", [True, False], ids=["masking", "no_masking"])
@pytest.mark.parametrize("mode", ["auto", "input"])
@pytest.mark.parametrize("wrapping", ["compaction_outside", "compaction_inside"])
async def test_every_compaction_replaces_exactly_what_it_was_sent(
    session_engine: Any, wrapping: str, mode: str, masking: bool
) -> None:
    """Turns whose requests the model filter masks or trims, on every store: each
    compaction sends the items it replaces, in full (never the server's copy of a trimmed
    request), and the rows before and after differ by exactly those. Where the SDK can
    replace a suffix (0.23+: SQLite and SQLAlchemy stores) or compacts whole histories in
    input mode (0.22), it compacts every time the history passes the limit."""
    builder = TokenBudgetedContextBuilder(
        None, max_tokens=2_000, output_reserve=200, masking=Masking() if masking else None
    )
    trigger = compaction_trigger(builder, at=0.8)
    calls: list[dict[str, Any]] = []
    sid = session_engine.sid()
    raw = session_engine.plain(sid)
    fake = recording_client(raw, calls)
    if wrapping == "compaction_outside":
        store = session_engine.proto(sid)
        session: Any = OpenAIResponsesCompactionSession(
            sid, store, client=fake, compaction_mode=mode, should_trigger_compaction=trigger
        )
    else:
        inner = OpenAIResponsesCompactionSession(
            sid,
            session_engine.plain(sid),
            client=fake,
            compaction_mode=mode,
            should_trigger_compaction=trigger,
        )
        store = ProtoPromptSession(sid, inner_session=inner, incremental=True)
        session = store
    config = store.run_config(builder)
    config.tracing_disabled = True
    costs = []
    for i in range(8):
        model = ScriptedModel(
            [
                [function_call("lookup", {"q": str(i)}, call_id=f"c{i}")],
                [assistant_message(f"answer {i}")],
            ]
        )
        first = len(calls)
        before_turn = await raw.get_items()
        await Runner.run(
            Agent(name="a", model=model, tools=[lookup]),
            f"question {i}",
            session=session,
            run_config=config,
        )
        after = await raw.get_items()
        assert after[: len(before_turn)] == before_turn or calls[first:]  # appended only
        for call in calls[first:]:
            sent = call.get("input")
            assert sent is not None, "compacted the server's copy of a trimmed request"
            rows = call["before"]
            cut = len(rows) - len(sent)
            assert rows[cut:] == sent  # sent in full: the stored items themselves
            assert after == rows[:cut] + call["output"]  # replaced by exactly the compaction
        costs.append(cost(after))
    if not TAIL_MATCHING and mode == "auto":
        # openai-agents 0.22 would compact the server's copy of the trimmed request: refused.
        assert not calls
        assert trigger.last is not None and trigger.last.refused is not None
        assert "compaction_mode='input'" in trigger.last.refused
        return
    if TAIL_MATCHING and session_engine.kind == "redis":
        # No suffix replacement in RedisSession: the SDK compacts only a history the last
        # request sent whole, and these requests are trimmed from the second turn on.
        assert not calls
        return
    # 0.22 compacts the whole history, which then takes two turns to pass the limit again.
    assert len(calls) >= (5 if TAIL_MATCHING else 3), [c.get("input") for c in calls]
    assert max(costs[1:]) <= trigger.limit, costs  # compacted every time it passed the limit
    assert trigger.last is not None
    if TAIL_MATCHING:  # only the suffix the last request sent unchanged, approved as such
        assert trigger.last.suffix_items is not None
        assert trigger.last.tokens > trigger.limit
        assert "the SDK compacts the newest" in trigger.last.explain()
