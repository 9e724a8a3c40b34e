"""What a session callback knows of the agent a ``run_config(agent=...)`` was made for: its
model's name (the tokenizer) and what each of its model calls sends besides the input items
(instructions, tool definitions, output schema), counted as the per-call filter counts them,
so a turn's plan reserves them and reports the same totals as the run's first model call."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...plan import RequestCost
from .._sdk._names import Agent, RunContextWrapper
from ._request import RequestCosts

__all__ = ["agent_request", "model_name"]

_DYNAMIC = (
    "the agent's instructions are made per run (a function of the run's context): each model "
    "call's plan counts them"
)


def model_name(agent: Agent[Any]) -> str | None:
    """The name of the model ``agent`` runs on: ``agent.model`` when it is a name, the name a
    model object carries (``OpenAIResponsesModel.model``), the SDK's default model when the
    agent names none; ``None`` when it cannot be told (a custom model object)."""
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    if model is None:
        from agents.models.default_models import get_default_model

        return get_default_model()
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


async def agent_request(agent: Agent[Any], encoding: str, costs: RequestCosts) -> RequestCost:
    """What each model call of ``agent`` sends besides its input items, in tokens of
    ``encoding``, as the per-call filter counts it (:meth:`RequestCosts.extras`). Instructions
    made per run from its context (a function that fails without it) are not counted here:
    the plan says so, and every model call's plan counts them."""
    try:
        instructions = await agent.get_system_prompt(RunContextWrapper(context=None))
        dynamic: tuple[str, ...] = ()
    except Exception:  # noqa: BLE001 - the user's function needs the run's context
        instructions, dynamic = None, (_DYNAMIC,)
    extras = await costs.extras(agent, None, instructions, encoding)
    if dynamic:
        extras = dataclasses.replace(
            extras, not_counted=dynamic + extras.not_counted, unknown=("instructions",)
        )
    return extras
