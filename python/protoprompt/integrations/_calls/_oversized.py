"""Oversized newest steps: the tool outputs of a step that may be cut, their costs, the copies
cut to a cap, and the budget error that names the part of a request that overflowed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ... import _core
from ...errors import TokenBudgetExceededError
from ...packing import item_tokens
from ._call_plan import TruncatedOutput
from ._steps import is_model_side, item_field


def step_costs(items: Sequence[Any], encoding: str) -> list[int]:
    """The tokens of each item."""
    return [item_tokens(x, encoding=encoding).total for x in items]


def tool_outputs(step: list[Any]) -> list[int]:
    """Indexes (in ``step``) of the tool outputs that may be cut."""
    return [
        i
        for i, x in enumerate(step)
        if isinstance(x, Mapping)
        and not is_model_side(x)
        and "output" in x
        and str(x.get("type", "")).endswith("_output")
    ]


def tool_name(items: Sequence[Any], call_id: Any) -> str | None:
    """The name of the tool whose call ``call_id`` is, when the call is in ``items``."""
    if call_id is None:
        return None
    for x in reversed(items):
        if is_model_side(x) and item_field(x, "call_id") == call_id:
            name = item_field(x, "name")
            return name if isinstance(name, str) else item_field(x, "type")
    return None


def explained(
    exc: TokenBudgetExceededError,
    items: list[Any],
    step_start: int,
    fixed: int,
    output_reserve: int,
    encoding: str,
    can_truncate: bool,
) -> TokenBudgetExceededError:
    """The core's error with the part of the request that overflowed named, in
    allocation order: instructions and tools, output reserve, context message and run
    input (``new_input``), then the newest step (``tool_output`` names its largest
    output and the call it answers). ``can_truncate``: the filter would cut outputs
    (``oversized_output='error'`` then suggests it)."""
    if exc.section == "system_prompt":
        return exc
    step = items[step_start:]
    costs = step_costs(step, encoding)
    pinned_part = exc.used - sum(costs) - fixed - output_reserve
    budget = exc.max_tokens
    if fixed > budget:
        return TokenBudgetExceededError(
            exc.used,
            budget,
            "instructions_and_tools",
            f"the agent's instructions, tool definitions and output schema alone need "
            f"{fixed} tokens",
        )
    if fixed + output_reserve > budget:
        return TokenBudgetExceededError(exc.used, budget, "output_reserve")
    if fixed + output_reserve + pinned_part > budget:
        return TokenBudgetExceededError(
            exc.used,
            budget,
            "new_input",
            f"the context message and the run's input need {pinned_part} tokens",
        )
    outs = tool_outputs(step)
    if not outs:
        return TokenBudgetExceededError(
            exc.used, budget, "step", f"the newest model output needs {sum(costs)} tokens"
        )
    big = max(outs, key=lambda i: costs[i])
    item = step[big]
    cid = item_field(item, "call_id")
    name = tool_name(items, cid)
    detail = (
        f"{item_field(item, 'type')} at input[{step_start + big}] for call {cid}"
        f"{' (' + name + ')' if name else ''} needs {costs[big]} tokens"
        + (
            "; oversized_output='truncate' sends a cut copy"
            if not can_truncate
            else " and cannot be cut to fit"
        )
    )
    return TokenBudgetExceededError(exc.used, budget, "tool_output", detail)


def cut_outputs(
    items: list[Any],
    step_start: int,
    step: list[Any],
    outs: list[int],
    costs: list[int],
    cap: int,
    encoding: str,
) -> tuple[list[Any], list[TruncatedOutput]] | None:
    """The step with every output over ``cap`` tokens cut to it (``None``: one cannot
    be)."""
    new_step = list(step)
    cuts: list[TruncatedOutput] = []
    for i in outs:
        if costs[i] <= cap:
            continue
        fit = _core.fit_output(step[i], cap, encoding=encoding)
        if fit is None:
            return None
        copy, tokens, parts_removed, media_removed = fit
        new_step[i] = copy
        cid = item_field(step[i], "call_id")
        cuts.append(
            TruncatedOutput(
                position=step_start + i,
                item_type=str(item_field(step[i], "type")),
                call_id=cid if isinstance(cid, str) else None,
                tool=tool_name(items, cid),
                original_tokens=costs[i],
                sent_tokens=tokens,
                parts_removed=parts_removed,
                media_removed=media_removed,
            )
        )
    return new_step, cuts


def turn_budget_error(exc: TokenBudgetExceededError, request: Any) -> TokenBudgetExceededError:
    """A session turn's budget error, naming the agent's instructions, tools and output
    schema with their sizes when they are what overflowed: the builder counts them (the
    turn's ``request``, a :class:`~protoprompt.plan.RequestCost`) into the fixed context,
    so the core names that section ``"context"``; the per-call filter names the same
    overflow ``"instructions_and_tools"``, and so does this. Other errors come back as they
    are (a new object, raised without the builder's frames)."""
    total = getattr(request, "total", 0)
    if exc.section != "context" or not total:
        return TokenBudgetExceededError(exc.used, exc.max_tokens, exc.section, exc.detail)
    parts = (
        f"the agent's instructions ({request.instructions:,} tokens), tool definitions "
        f"({request.tools:,}) and output schema ({request.output_schema:,})"
    )
    detail = (
        f"{parts} alone need {total:,} tokens"
        if total > exc.max_tokens
        else f"{parts} need {total:,} tokens, more than the run input and output reserve leave"
    )
    return TokenBudgetExceededError(exc.used, exc.max_tokens, "instructions_and_tools", detail)
