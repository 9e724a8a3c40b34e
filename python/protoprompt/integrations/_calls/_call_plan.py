"""What the model filter did for one model call: :class:`ModelCallPlan`, and the tool outputs
whose model-facing copies it cut (:class:`TruncatedOutput`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..._plan_view import page
from ...context import ContextPlan
from ...errors import renamed
from ...packing import PackResult, UnitDecision
from ...plan import CallLayout, RequestCost, RequestSections, input_at, request_sections


@dataclass(frozen=True)
class TruncatedOutput:
    """A tool output of the newest step whose model-facing copy was cut."""

    position: int
    """Position of the output in the SDK's input list."""
    item_type: str
    call_id: str | None
    tool: str | None
    """Name of the tool whose call it answers, when the call is in the input."""
    original_tokens: int
    """Tokens of the stored item."""
    sent_tokens: int
    """Tokens of the copy that was sent."""
    parts_removed: int = 0
    """Parts of a many-part output replaced by one marker part."""
    media_removed: int = 0
    """Images, files or audio replaced by a text marker."""


@dataclass(frozen=True)
class ModelCallPlan:
    """What :class:`ModelInputFilter` did for one model call."""

    call: int
    """1 for the first model call of a run (as seen by this filter), 2 for the next…"""
    items: list[Any]
    """The input items sent (the SDK's objects; truncated copies where cut, masked copies of
    the tool outputs of steps kept masked)."""
    instructions_tokens: int
    """Cost of the agent's instructions (counted like a system message)."""
    tools_tokens: int
    """Cost of the tool definitions sent with the call (:func:`tool_definitions`)."""
    output_schema_tokens: int
    """Cost of the structured-output schema sent with the call (Responses ``text.format``,
    for an agent with an ``output_type``; 0 for plain text)."""
    max_tokens: int
    """The token budget: the request plus the output reserve."""
    output_reserve: int
    input_items: int
    """Length of the input list the SDK handed over."""
    pinned: list[int]
    """Positions of the mandatory context message and run input (in the list packed: the
    SDK's list, after its de-duplication when :attr:`deduplicated` is non-zero)."""
    step: tuple[int, int]
    """``[start, end)`` positions of the newest step (mandatory); empty on a first call."""
    reused: int
    """Items whose classification and cost came from the run's index (content verified);
    the rest were read and counted for this call."""
    reuse: str
    """Why the run's index was or was not (fully) reused."""
    pack: PackResult
    """The core's packing: decisions for every unit of the optional part (``"masked"`` for a
    step sent with its tool outputs masked; ``pack.masked``, ``pack.masking_saved``)."""
    truncated: list[TruncatedOutput] = field(default_factory=list)
    context: ContextPlan | None = None
    """Standalone filter: the builder's plan, with the recalled context message."""
    deduplicated: int = 0
    """Items the SDK's de-duplication collapses (ids reused across responses): the list was
    packed as the SDK sends it, without them."""
    not_counted: tuple[str, ...] = ()
    """What the call sends that cannot be counted here (a stored prompt template)."""
    context_position: int | None = None
    """Position of the session callback's context message in the list packed (``None``:
    none there; the standalone filter's context message is :attr:`context`'s, in front)."""
    run_input: tuple[int, int] | None = None
    """``[start, end)`` positions of the run's input in the list packed (``None``: no run
    input was found, e.g. a run whose input holds no user message)."""
    prefix: str | None = None
    """With a cache policy (``cache=``): how this call's request relates to the run's
    previous one -- ``"stayed"`` (the previous request byte for byte, then what the SDK
    appended), ``"moved"`` (it did not fit: packed newest first to the low-water mark),
    ``"set"`` (the run's first); ``None``: packed newest first without one."""
    prefix_reason: str = ""
    """The same in words, e.g. ``"call 3 did not fit: cut moved from input[812] to
    input[1,090], request 127,400 -> 88,900"``."""
    shared_tokens: int = 0
    """Tokens this request repeats from the start of the run's previous request (what the
    provider's prompt cache can bill at its cached price): 0 on a move, a first call, or
    when the instructions, tools or output schema changed."""
    request_changed: bool = False
    """The instructions, tools or output schema differ from the previous call's (counted
    costs; with a cache policy)."""
    turn_plan: ContextPlan | None = None
    """With a session: its callback's plan of this run (``session.run_config``'s
    ``on_plan``), which packed the stored history before the first call -- the tool outputs
    it masked (the call gets their excerpts) and the history items it dropped, which this
    call's own :attr:`pack` does not see. ``None`` without a session callback."""
    checked: int = 0
    """Input items this call read for changes (content digests): what the SDK appended since
    the run's previous call and a sample of the rest when the rest is unchanged (the fast
    path, ``checked < input_items`` on a long input), every item otherwise (a run's first
    call, a history rewritten or edited); see
    :class:`~protoprompt.integrations._calls._planner.InputLedger`."""

    @property
    def turn_masked(self) -> int:
        """Tool-output items the session's turn plan sent masked (0 without one)."""
        return len(self.turn_plan.pack.masked) if self.turn_plan is not None else 0

    @property
    def turn_masking_saved(self) -> int:
        """Tokens the session's turn plan saved by masking (0 without one)."""
        return self.turn_plan.pack.masking_saved if self.turn_plan is not None else 0

    @property
    def turn_dropped(self) -> int:
        """Stored history items the session's turn plan did not send (0 without one)."""
        if self.turn_plan is None:
            return 0
        return sum(len(d.positions) for d in self.turn_plan.pack.dropped)

    def _turn_lines(self) -> list[str]:
        """What the session's turn plan did to the history before this run's first call."""
        if self.turn_plan is None or not (self.turn_masked or self.turn_dropped):
            return []
        units = sum(1 for d in self.turn_plan.pack.decisions if d.decision == "masked")
        parts = []
        if self.turn_masked:
            parts.append(
                f"masked {self.turn_masked:,} tool output{'s' if self.turn_masked != 1 else ''}"
                f" in {units:,} unit{'s' if units != 1 else ''} "
                f"({self.turn_masking_saved:,} tokens saved; sent as excerpts)"
            )
        if self.turn_dropped:
            parts.append(
                f"dropped {self.turn_dropped:,} stored item{'s' if self.turn_dropped != 1 else ''}"
            )
        return ["before the run, the session's turn plan " + " and ".join(parts)]

    @property
    def sections(self) -> RequestSections:
        """The request by section (see :mod:`protoprompt.plan`), adding up to :attr:`used`:
        the agent's instructions, tools and output schema, the context message, the run
        input, the newest step, the run's earlier steps, the history kept from before the
        run, and the output reserve."""
        context = None
        if self.context is not None:  # the standalone filter's message, in front
            message = self.context.context_message
            context = (self.context.context_tokens, 1 if message is not None else 0)
        return request_sections(
            self.pack,
            request=RequestCost(
                self.instructions_tokens,
                self.tools_tokens,
                self.output_schema_tokens,
                self.not_counted,
            ),
            reserved=self.instructions_tokens + self.tools_tokens + self.output_schema_tokens,
            context=context,
            call=self.layout,
        )

    @property
    def layout(self) -> CallLayout:
        """Where the call's parts are in the list packed (:class:`~protoprompt.plan.\
CallLayout`)."""
        return CallLayout(self.step, self.run_input, self.context_position, len(self.truncated))

    @property
    def items_tokens(self) -> int:
        """Tokens of the input items sent (context message included)."""
        return (
            self.pack.request_tokens
            - self.instructions_tokens
            - self.tools_tokens
            - self.output_schema_tokens
        )

    @property
    def request_tokens(self) -> int:
        """Items + instructions + tools + output schema: the whole request."""
        return self.pack.request_tokens

    @property
    def used(self) -> int:
        """The whole request plus the output reserve (``<= max_tokens``)."""
        return self.pack.used

    @property
    def remaining(self) -> int:
        """Budget left unused: ``max_tokens - used`` (as on every plan)."""
        return max(self.max_tokens - self.used, 0)

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed("ModelCallPlan", "budget", "max_tokens")
        return self.max_tokens

    @property
    def dropped(self) -> list[UnitDecision]:
        """Units of the input that were not sent."""
        return self.pack.dropped

    def to_html(self) -> str:
        """The call as one self-contained HTML page: a bar of the budget by section and the
        units of its input as kept / masked / dropped with their reasons on hover. A run's
        calls on one page: :func:`protoprompt.plans_to_html` (``on_call``'s plans)."""
        return page(self)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account of the call: the request by section (:attr:`sections`), what
        the run's index reused, the cut tool outputs, then the masked and dropped units
        (positions ``input[i]`` in the SDK's input list) with their reasons."""
        sent = len(self.items) - (
            1 if self.context is not None and self.context.context_message is not None else 0
        )
        lines = [
            f"model call {self.call} of the run: {sent} of {self.input_items} input items sent"
            + (
                ", plus the context message"
                if self.context is not None and self.context.context_message is not None
                else ""
            )
        ]
        lines += self.sections.lines()
        lines.extend(f"not counted: {note}" for note in self.not_counted)
        lines.append(f"index: {self.reused} of {self.input_items} items reused ({self.reuse})")
        if self.prefix is not None:
            lines.append(f"prefix: {self.prefix_reason}")
            if self.request_changed:
                lines.append(
                    "request: the instructions, tools or output schema differ from the "
                    "previous call's"
                )
        if self.deduplicated:
            lines.append(
                f"{self.deduplicated} items collapsed by the SDK's de-duplication (reused "
                "ids): packed as sent"
            )
        lines.extend(
            f"truncated {t.item_type} at input[{t.position}] (call {t.call_id}"
            f"{', ' + t.tool if t.tool else ''}): {t.original_tokens:,} -> "
            f"{t.sent_tokens:,} tokens"
            + (f", {t.parts_removed} parts removed" if t.parts_removed else "")
            + (f", {t.media_removed} media parts removed" if t.media_removed else "")
            for t in self.truncated
        )
        lines.extend(self._turn_lines())
        lines.extend(self.pack.explain_units(max_units, where=input_at))
        return "\n".join(lines)
