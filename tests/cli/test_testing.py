"""protoprompt.testing: the public offline model the documentation, the demo and users' own
tests run agents on without a key."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, function_tool  # noqa: E402
from agents.models.multi_provider import MultiProvider  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.testing import offline_model, offline_models, schema_value  # noqa: E402


@function_tool
def lookup(name: str, count: int) -> str:
    """Look something up."""
    return f"{name} x{count}"


class Answer(BaseModel):
    text: str
    score: float


def test_a_named_model_is_offline_inside_offline_models_and_restored_after() -> None:
    original = MultiProvider.get_model
    with offline_models():
        agent = Agent(name="a", model="gpt-5", tools=[lookup])
        result = asyncio.run(Runner.run(agent, "find the renewal clause"))
    assert MultiProvider.get_model is original
    kinds = [type(i).__name__ for i in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"]
    assert result.new_items[1].output == "find the renewal clause x1"
    assert result.final_output == "(offline gpt-5 model) You asked: find the renewal clause"


def test_offline_model_as_an_agents_model_with_an_output_type_and_a_budgeted_session(
    tmp_path,
) -> None:
    agent = Agent(name="a", model=offline_model("gpt-5"), output_type=Answer)
    session = ProtoPromptSession("t", str(tmp_path / "t.db"))
    config = session.run_config(agent=agent, model="gpt-5", max_tokens=2_000)
    result = asyncio.run(Runner.run(agent, "score it", session=session, run_config=config))
    assert result.final_output == Answer(text="offline", score=1.0)
    assert config.call_model_input_filter.last_plan.used <= 2_000


def test_schema_value_satisfies_refs_enums_and_bounds() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["a", "b"]},
            "n": {"type": "integer", "minimum": 3},
            "ref": {"$ref": "#/$defs/R"},
            "maybe": {"type": ["null", "string"]},
        },
        "$defs": {"R": {"type": "object", "properties": {"s": {"type": "string"}}}},
    }
    assert schema_value(schema, "x") == {"kind": "a", "n": 3, "ref": {"s": "x"}, "maybe": "x"}
