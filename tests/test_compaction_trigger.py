"""compaction_trigger: OpenAIResponsesCompactionSession compacts when the history costs more
than ``at`` x (max_tokens - output_reserve), by protoprompt's exact counts from the
session's index; wrapped around a ProtoPromptSession and inside one."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest.mock import AsyncMock, MagicMock

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner, SQLiteSession  # noqa: E402
from agents.memory import OpenAIResponsesCompactionSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message  # noqa: E402

from protoprompt import HistoryIndex, TokenBudgetedContextBuilder, item_tokens  # noqa: E402
from protoprompt.integrations import (  # noqa: E402
    CompactionTrigger,
    ProtoPromptSession,
    compaction_trigger,
)

SUMMARY = [{"role": "assistant", "content": "compacted: we talked about invoices"}]


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
    if wrapping == "compaction_outside":
        store = ProtoPromptSession("s", db)
        session: Any = OpenAIResponsesCompactionSession(
            "s", store, client=fake, should_trigger_compaction=hook
        )
    else:
        inner = OpenAIResponsesCompactionSession(
            "s", SQLiteSession("s", db), client=fake, should_trigger_compaction=hook
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
