"""One vocabulary for a request: the sections every plan reports, and why a unit was kept.

Every plan protoprompt makes -- :class:`~protoprompt.PackResult` (``pp.pack``),
:class:`~protoprompt.ContextPlan` (a turn of the session callback, ``builder.last_plan``),
:class:`~protoprompt.integrations.ModelCallPlan` (one model call of a run, the per-call
filter) -- and ``protoprompt inspect`` describe a request in the same sections, in the order
the budget is spent:

========================  ===============================================================
``instructions``          the agent's instructions (sent as a system message by the SDK)
``tools``                 the definitions of the agent's tools, handoffs and MCP tools
``output_schema``         the structured-output schema of an agent with an ``output_type``
``context_message``       protoprompt's one system message: system prompt and recalled memory
``run_input``             the input of the run (``Runner.run``'s input; ``pp.pack``'s
                          ``new_input``)
``newest_step``           the model output that ended the previous model call of the run and
                          the tool outputs answering it (only model calls after the first
                          have one)
``earlier_steps``         the run's steps before the newest one (optional, newest first)
``kept_history``          the history from before the run that was kept (optional, newest
                          first; the calls a run input answers are mandatory here)
``output_reserve``        tokens kept free for the model's answer
========================  ===============================================================

The sections add up to the plan's ``used`` tokens; a section with nothing in it says why
(:attr:`Section.note`). See ``docs/reading-a-plan.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._reasons import StopLike, unit_reason
from ._tokens import ESTIMATED_ENCODINGS, item_tokens
from .errors import renamed

if TYPE_CHECKING:
    from .packing import PackResult

__all__ = [
    "SECTIONS",
    "SECTION_LABELS",
    "TOOLS_OVERHEAD",
    "CallLayout",
    "RequestCost",
    "RequestSections",
    "Section",
    "StopLike",
    "count_request",
    "history_at",
    "input_at",
    "request_sections",
    "unit_reason",
]

SECTION_LABELS: dict[str, str] = {
    "instructions": "instructions",
    "tools": "tools",
    "output_schema": "output schema",
    "context_message": "context message",
    "run_input": "run input",
    "newest_step": "newest step",
    "earlier_steps": "earlier steps",
    "kept_history": "kept history",
    "output_reserve": "output reserve",
}
"""Each section's name and its label for a person, in the order the budget is spent."""

SECTIONS: tuple[str, ...] = tuple(SECTION_LABELS)
"""The section names, in order."""


NO_CONTEXT = "empty: no system prompt and nothing recalled"
NO_RUN_INPUT = "empty: the run has no input"
NO_STEP = "empty: a run's first model call has no newest step"
NO_EARLIER_STEPS = "empty: no earlier steps"
NO_HISTORY = "empty: no history before the run"
_KEPT = ("mandatory", "kept", "masked")


@dataclass(frozen=True)
class RequestCost:
    """What a model call sends besides its input items, in tokens: the agent's instructions,
    its tool definitions and its output schema (as :class:`ModelInputFilter` counts them on
    every call)."""

    instructions: int
    tools: int
    output_schema: int
    not_counted: tuple[str, ...] = ()
    """What the call sends that cannot be counted here (a stored prompt template)."""
    unknown: tuple[str, ...] = ()
    """Parts this cost does not know (``"instructions"``, ``"tools"``, ``"output_schema"``;
    their tokens are 0 here): a plan shows them as not counted."""
    digest: bytes = b""
    """A digest of what was counted (the per-call filter's: instructions, tool definitions,
    output schema), so a change of equal cost is told apart; empty when not known."""

    @property
    def total(self) -> int:
        return self.instructions + self.tools + self.output_schema


TOOLS_OVERHEAD = 12
"""Tokens added once per request that carries tool definitions (the tools section's
framing), besides each definition's own cost."""


def count_request(
    *,
    instructions: str | None = None,
    tools: Sequence[Mapping[str, object]] = (),
    output_format: Mapping[str, object] | None = None,
    model: str | None = None,
    encoding: str | None = None,
) -> RequestCost:
    """What a request sends besides its input items, in tokens, by the rules the per-call
    filter counts with: ``instructions`` as a system message, each tool definition (as the
    Responses API takes it, e.g. ``{"type": "function", "name": ..., "parameters": ...}``)
    like an item plus :data:`TOOLS_OVERHEAD` once, and the ``text`` parameter of a
    structured output (``{"format": {"type": "json_schema", ...}}``) like an item."""

    def cost(item: Mapping[str, object]) -> int:
        return item_tokens(item, model=model, encoding=encoding).total

    return RequestCost(
        instructions=cost({"role": "system", "content": instructions}) if instructions else 0,
        tools=TOOLS_OVERHEAD + sum(cost(t) for t in tools) if tools else 0,
        output_schema=cost(output_format) if output_format else 0,
    )


@dataclass(frozen=True)
class Section:
    """One section of a request (see the module doc for the names)."""

    name: str
    """One of :data:`SECTIONS`."""
    tokens: int
    """Tokens the section takes of the budget (0 when empty or not counted here)."""
    items: int | None = None
    """Input items sent in the section; ``None`` for a section that is not made of items
    (instructions, tools, output schema, output reserve)."""
    note: str | None = None
    """What is in the section or, for an empty one, why it is empty (e.g. ``"empty: the
    first model call of a run has no newest step"``)."""
    counted: bool = True
    """``False``: the plan could not count this section (its tokens are 0 here and the note
    says where it is counted)."""

    @property
    def label(self) -> str:
        """The section's name for a person (``"context message"``)."""
        return SECTION_LABELS.get(self.name, self.name.replace("_", " "))

    @property
    def empty(self) -> bool:
        return self.tokens == 0


@dataclass(frozen=True)
class RequestSections:
    """A request by section, as every plan reports it (``plan.sections``)."""

    max_tokens: int
    """The token budget: the request plus the output reserve."""
    sections: tuple[Section, ...]
    encoding: str

    def __iter__(self) -> Iterator[Section]:
        return iter(self.sections)

    def __len__(self) -> int:
        return len(self.sections)

    def __getitem__(self, name: str) -> Section:
        for s in self.sections:
            if s.name == name:
                return s
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return any(s.name == name for s in self.sections)

    @property
    def used(self) -> int:
        """Tokens of the request plus the output reserve: the sum of the sections."""
        return sum(s.tokens for s in self.sections)

    @property
    def remaining(self) -> int:
        """Budget left unused."""
        return max(self.max_tokens - self.used, 0)

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed("RequestSections", "budget", "max_tokens")
        return self.max_tokens

    @property
    def request_tokens(self) -> int:
        """Tokens of the request itself (every section but the output reserve)."""
        return sum(s.tokens for s in self.sections if s.name != "output_reserve")

    def lines(self) -> list[str]:
        """The header and one line per section, as ``explain()`` prints them."""
        reserve = self.used - self.request_tokens
        counter = self.encoding
        if self.encoding in ESTIMATED_ENCODINGS:
            counter += ": an estimate, the model's tokenizer is not public"
        out = [
            f"used: {self.used:,} of {self.max_tokens:,} tokens ({counter}; request "
            f"{self.request_tokens:,} + output reserve {reserve:,}), {self.remaining:,} left"
        ]
        for s in self.sections:
            tokens = f"{s.tokens:,}" if s.counted else "-"
            detail = []
            if s.items is not None and s.items:
                detail.append(f"{s.items:,} item{'s' if s.items != 1 else ''}")
            if s.note:
                detail.append(s.note)
            out.append(
                f"  {s.label:<16}{tokens:>9}" + (f"  ({'; '.join(detail)})" if detail else "")
            )
        return out


@dataclass(frozen=True)
class CallLayout:
    """Where the parts of one model call are in the list the per-call filter packed (the
    SDK's input list, after its de-duplication)."""

    step: tuple[int, int]
    """``[start, end)`` of the newest step (empty on a run's first model call)."""
    run_input: tuple[int, int] | None
    """``[start, end)`` of the run's input (``None``: none found)."""
    context_position: int | None = None
    """Position of the session callback's context message, if it is in the list."""
    truncated: int = 0
    """Tool outputs of the newest step that were cut to fit."""


def request_sections(
    pack: PackResult,
    *,
    request: RequestCost | None,
    reserved: int,
    context: tuple[int, int] | None,
    call: CallLayout | None,
    unknown: str = "not known to a turn's plan: each model call's plan counts it",
) -> RequestSections:
    """The sections of a request packed as ``pack``, adding up to ``pack.used``.

    ``request``: the agent's instructions, tools and output schema (``None``: not known to
    this plan), of the ``reserved`` tokens the pack reserved besides its items. ``context``:
    tokens and items of a context message in front of the packed items (``None``: none, or
    it is in the list at ``call.context_position``). ``call``: the layout of a model call
    (``None``: a turn planned before its first model call, whose ``new_input`` is the run
    input). ``unknown``: the note of instructions, tools and output schema when neither
    ``request`` nor ``reserved`` tells them.
    """
    sections = list(_fixed_sections(request, reserved, unknown))
    if call is None:
        tokens, items = context or (0, 0)
        sections += [
            Section("context_message", tokens, items, None if items else NO_CONTEXT),
            Section(
                "run_input",
                pack.new_input_tokens,
                pack.run_input_items,
                None if pack.run_input_items else NO_RUN_INPUT,
            ),
            Section("newest_step", 0, 0, NO_STEP),
            Section("earlier_steps", 0, 0, NO_EARLIER_STEPS),
            pack.history_section(),
        ]
    else:
        sections += _call_sections(pack, context, call)
    sections.append(Section("output_reserve", pack.output_reserve))
    return RequestSections(pack.max_tokens, tuple(sections), pack.encoding)


def _fixed_sections(
    request: RequestCost | None, reserved: int, unknown: str
) -> tuple[Section, ...]:
    """The instructions, tools and output schema sections of a plan that reserved
    ``reserved`` tokens besides its items, of which ``request`` (if known) is the part."""
    if request is not None:
        other = reserved - request.total
        notes = list(request.not_counted)
        if other > 0:
            notes.append(f"with {other:,} more reserved by context_tokens")
        parts = (
            ("instructions", request.instructions + max(other, 0), "empty: none"),
            ("tools", request.tools, "empty: no tools"),
            ("output_schema", request.output_schema, "empty: plain-text output"),
        )
        out = []
        for name, tokens, empty in parts:
            note = "; ".join(notes) if name == "instructions" and notes else None
            if name in request.unknown:
                out.append(Section(name, tokens, note=note or unknown, counted=tokens > 0))
            else:
                out.append(Section(name, tokens, note=note or (None if tokens else empty)))
        return tuple(out)
    if reserved:
        return (
            Section(
                "instructions",
                reserved,
                note=f"context_tokens={reserved:,} reserved for instructions, tools and "
                "output schema together",
            ),
            Section("tools", 0, note="in the instructions' reserve", counted=False),
            Section("output_schema", 0, note="in the instructions' reserve", counted=False),
        )
    return (
        Section("instructions", 0, note=unknown, counted=False),
        Section("tools", 0, note=unknown, counted=False),
        Section("output_schema", 0, note=unknown, counted=False),
    )


def _call_sections(
    pack: PackResult, context: tuple[int, int] | None, call: CallLayout
) -> list[Section]:
    """Context message, run input, newest step, earlier steps and kept history of a model
    call: each unit counts in the part that holds its newest item."""
    step_start = call.step[0]
    a, b = call.run_input if call.run_input is not None else (step_start, step_start)
    # tokens, items, dropped items, masked items
    regions = {"run_input": [0, 0, 0, 0], "earlier_steps": [0, 0, 0, 0]}
    masked = set(pack.masked)
    decisions = pack.decisions
    for d in reversed(decisions):
        if not d.positions or d.positions[-1] < a:
            break
        region = regions["earlier_steps" if d.positions[-1] >= b else "run_input"]
        if d.kept:
            region[0] += d.sent_tokens or 0
            region[1] += len(d.positions)
            if d.decision == "masked":
                region[3] += sum(1 for p in d.positions if p in masked)
        elif d.decision not in _KEPT:
            region[2] += len(d.positions)
    dropped_in_run = regions["run_input"][2] + regions["earlier_steps"][2]
    masked_in_run = regions["run_input"][3] + regions["earlier_steps"][3]
    history_tokens = pack.history_tokens + pack.dependency_tokens
    history_items = len(pack.kept_history)
    context_tokens, context_items = context or (0, 0)
    if call.context_position is not None and len(decisions):
        first = decisions[0]
        if call.context_position in first.positions:
            context_tokens, context_items = first.tokens or 0, len(first.positions)
            history_tokens -= context_tokens
            history_items -= context_items
    for tokens, items, _, _ in regions.values():
        history_tokens -= tokens
        history_items -= items
    run_tokens, run_items, _, _ = regions["run_input"]
    earlier_tokens, earlier_items, earlier_dropped, earlier_masked = regions["earlier_steps"]
    step_note = None
    if not pack.run_input_items:
        step_note = NO_STEP
    elif call.truncated:
        step_note = f"{call.truncated} tool outputs cut to fit"
    dropped_items = sum(n for k, n in pack.decision_counts().items() if k not in _KEPT)
    return [
        Section(
            "context_message", context_tokens, context_items, None if context_items else NO_CONTEXT
        ),
        Section("run_input", run_tokens, run_items, None if run_items else NO_RUN_INPUT),
        Section("newest_step", pack.new_input_tokens, pack.run_input_items, step_note),
        Section(
            "earlier_steps",
            earlier_tokens,
            earlier_items,
            _joined(
                masked_note(earlier_masked),
                dropped_note(earlier_items, earlier_dropped, NO_EARLIER_STEPS),
            ),
        ),
        Section(
            "kept_history",
            history_tokens,
            history_items,
            _joined(
                masked_note(len(masked) - masked_in_run, len(pack.omitted_reasoning)),
                dropped_note(history_items, dropped_items - dropped_in_run, NO_HISTORY),
            ),
        ),
    ]


def masked_note(n: int, omitted: int = 0) -> str | None:
    """How many tool outputs of a section are sent masked (``None``: none); with
    ``omitted`` earlier reasoning items left out, how many items are sent as copies (masked
    outputs and id-less calls and messages) and how many reasoning items were left out."""
    if omitted:
        return (
            f"{n:,} item{'s' if n != 1 else ''} sent masked, {omitted:,} earlier reasoning "
            f"item{'s' if omitted != 1 else ''} left out"
        )
    return f"{n:,} tool output{'s' if n != 1 else ''} masked" if n else None


def _joined(*notes: str | None) -> str | None:
    return "; ".join(n for n in notes if n) or None


def dropped_note(items: int, dropped: int, none: str) -> str | None:
    """The note of an optional section: how many of its items were dropped, or why it is
    empty (``none``: nothing was there)."""
    if dropped and not items:
        return f"empty: {dropped:,} items dropped"
    if dropped:
        return f"{dropped:,} items dropped"
    return None if items else none


def _positions(prefix: str) -> Callable[[Sequence[int]], str]:
    def name(positions: Sequence[int]) -> str:
        if not positions:
            return f"{prefix}[]"
        if len(positions) == 1:
            return f"{prefix}[{positions[0]}]"
        return f"{prefix}[{positions[0]}..{positions[-1]}]"

    return name


history_at = _positions("history")
"""Names history positions: ``history[3..5]`` (a turn plan, ``pp.pack``)."""
input_at = _positions("input")
"""Names positions of a model call's input list: ``input[3..5]`` (a model call's plan)."""
