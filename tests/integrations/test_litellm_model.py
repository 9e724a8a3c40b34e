"""A run through the SDK's ``LitellmModel``, scripted and offline: the plan names the counter.

LiteLLM answers with its own ``mock_response`` (no network: ``LITELLM_LOCAL_MODEL_COST_MAP``
keeps its model table local). The agent's model is written as users write it for the SDK
(``LitellmModel(model="deepseek/deepseek-chat")``, or ``"litellm/deepseek/deepseek-chat"``
through the SDK's provider); every model call's plan counts with DeepSeek's tokenizer, and
a Claude model's plan says it is an estimate.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
pytest.importorskip("agents")
pytest.importorskip("litellm")
litellm_model = pytest.importorskip("agents.extensions.models.litellm_model")

from agents import Agent, ModelSettings, Runner  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402

LONG_ANSWER = "Пекин — столица Китая. 北京是中国的首都。 def f(x): return {'k': [1, 2, 3]}\n" * 40


def _agent(model: str) -> Agent:
    return Agent(
        name="assistant",
        instructions="Answer briefly.",
        model=litellm_model.LitellmModel(model=model, api_key="offline"),
        model_settings=ModelSettings(extra_args={"mock_response": LONG_ANSWER}),
    )


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("deepseek/deepseek-chat", "deepseek_v3"),
        ("openrouter/qwen/qwen3-32b", "qwen2"),
        ("anthropic/claude-sonnet-4-5", "claude_estimate"),
    ],
)
def test_a_litellm_run_is_budgeted_with_the_models_own_counter(
    tmp_path: Path, model: str, encoding: str
) -> None:
    agent = _agent(model)
    session = ProtoPromptSession("litellm", str(tmp_path / "a.db"))
    plans: list = []
    config = session.run_config(agent=agent, max_tokens=3_000, on_call=plans.append)

    async def main() -> None:
        for question in ("What is the capital of China?", "And of Russia?", "And of Japan?"):
            result = await Runner.run(agent, question, session=session, run_config=config)
            assert result.final_output == LONG_ANSWER

    asyncio.run(main())
    assert len(plans) == 3
    for plan in plans:
        assert plan.pack.encoding == encoding
        header = plan.pack.explain().splitlines()[0]
        assert f"({encoding}" in header
        assert ("an estimate" in header) == (encoding == "claude_estimate")
    # The last call's history was counted with that tokenizer: each earlier answer at its
    # own count, not o200k_base's.
    answer = {"role": "assistant", "content": LONG_ANSWER}
    ours = pp.item_tokens(answer, encoding=encoding).total
    assert ours != pp.item_tokens(answer, encoding="o200k_base").total
    last = plans[-1]
    assert last.pack.budget == 3_000
    assert last.pack.used <= 3_000


@pytest.mark.parametrize(
    ("model", "rule"),
    [
        ("anthropic/claude-sonnet-4-5-20250929", "earlier-turns-free"),
        ("anthropic/claude-opus-4-5", "whole"),
    ],
)
def test_a_litellm_claude_run_costs_earlier_thinking_by_the_models_rule(
    tmp_path: Path, model: str, rule: str
) -> None:
    # A history of Claude tool turns with thinking, as the SDK stores them through
    # LitellmModel (docs/item-graph.md §1.2), then one more question.
    turns = []
    for i in range(3):
        sig = f"EqQBCkgIARABGAIiQL{i:04d}" * 8
        turns += [
            {"role": "user", "content": f"question {i}"},
            {
                "type": "reasoning",
                "id": "__fake_id__",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": LONG_ANSWER}],
                "encrypted_content": sig,
                "provider_data": {
                    "thinking_blocks": [
                        {"type": "thinking", "thinking": LONG_ANSWER, "signature": sig}
                    ]
                },
            },
            {
                "type": "message",
                "role": "assistant",
                # LiteLLM gives the final text the placeholder id too: it follows its
                # thinking (docs/item-graph.md §6.3), which stays in the request.
                "id": "__fake_id__",
                "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}],
            },
        ]
    agent = _agent(model)
    session = ProtoPromptSession("litellm", str(tmp_path / "a.db"))
    plans: list = []
    config = session.run_config(agent=agent, max_tokens=200_000, on_call=plans.append)

    async def main() -> None:
        await session.add_items(turns)
        await Runner.run(agent, "And of Japan?", session=session, run_config=config)

    asyncio.run(main())
    [plan] = plans
    # Every earlier turn's thinking is sent with the final text it belongs to.
    assert sum(1 for x in plan.items if x.get("type") == "reasoning") == 3
    assert plan.pack.thinking_rule == rule
    assert plan.pack.earlier_thinking_free == (3 if rule != "whole" else 0)
    assert ("earlier turns' thinking not counted" in plan.pack.explain()) == (rule != "whole")
