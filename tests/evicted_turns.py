"""What the tests of evicted turns share (``test_recall.py``, ``test_summaries.py``): the
scope, a ``lookup`` tool whose outputs a test may plant, a turn of one tool call and an
answer through ``Runner.run``, a recording summarizer and a session with its builder."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call

from protoprompt import MemoryScope, TokenBudgetedContextBuilder
from protoprompt.integrations import ProtoPromptSession

SCOPE = MemoryScope("acme", user="alice")

OUTPUTS: dict[int, str] = {}
"""Outputs of ``lookup`` by the number it is asked for, planted by a test (else the
default text of the tool)."""


def lookup_tool(default: Callable[[str], str]) -> Any:
    """A ``lookup`` tool answering :data:`OUTPUTS` when planted, else ``default(name)``."""

    @function_tool
    def lookup(name: str) -> str:
        """Look something up."""
        planted = OUTPUTS.get(int(name)) if name.isdigit() else None
        return planted if planted is not None else default(name)

    return lookup


def tool_turn_model(i: int) -> ScriptedModel:
    """The model of turn ``i``: one call of ``lookup`` (``call_id`` ``c{i}``), then an answer."""
    return ScriptedModel(
        [
            [function_call("lookup", {"name": str(i)}, call_id=f"c{i}")],
            [assistant_message(f"answer {i}")],
        ]
    )


async def tool_turn(
    builder: TokenBudgetedContextBuilder,
    session: Any,
    config: RunConfig,
    tool: Any,
    i: int,
    question: str,
) -> Any:
    """Turn ``i`` of one tool call through ``Runner.run``, its background work waited for;
    the builder's plan of it."""
    agent = Agent(name="a", model=tool_turn_model(i), tools=[tool])
    await Runner.run(agent, question, session=session, run_config=config)
    assert await builder.wait_for_background(30)
    return builder.last_plan


class Recorder:
    """A Summarizer that records its calls; fails the first ``fail`` calls."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[list[Any], str | None, int]] = []
        self.fail = fail

    async def __call__(self, items: Sequence[Any], previous: str | None, max_tokens: int) -> str:
        self.calls.append((list(items), previous, max_tokens))
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the summarizing model is unreachable")
        return f"summary {len(self.calls)} of {len(items)} items"


class Held:
    """A Summarizer whose calls wait until released."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, items: Sequence[Any], previous: str | None, max_tokens: int) -> str:
        self.calls += 1
        self.started.set()
        await self.release.wait()
        return f"the old chat's summary of {len(items)} items"


class Chat:
    """A ``ProtoPromptSession`` (``db``, ``session_id``, session options) whose callback
    uses ``builder`` with the system prompt ``"Hi."``; turns of one ``tool`` call each."""

    def __init__(
        self,
        db: str,
        builder: TokenBudgetedContextBuilder,
        tool: Any,
        *,
        question: str = "question {i}, please look it up",
        session_id: str = "chat",
        **session: Any,
    ) -> None:
        self.builder = builder
        self.store = builder.store
        self.tool = tool
        self.question = question
        self.session = ProtoPromptSession(session_id, db, **session)
        self.config = RunConfig(
            session_input_callback=self.session.input_callback(builder, system_prompt="Hi."),
            tracing_disabled=True,
        )

    async def turn(self, i: int, question: str | None = None) -> Any:
        """Turn ``i`` (``question``, else the chat's question for ``i``); its plan."""
        text = question or self.question.format(i=i)
        return await tool_turn(self.builder, self.session, self.config, self.tool, i, text)
