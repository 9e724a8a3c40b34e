"""What a build decided: the context blocks (:class:`ContextBlock`) and the plan
(:class:`ContextPlan`) of one turn or model call."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._plan_view import PlanView, context_view, page
from ..calibration import CalibrationState
from ..errors import renamed
from ..memory import MemoryScope
from ..packing import PackResult
from ..plan import CallLayout, RequestCost, RequestSections, input_at, request_sections
from ..turn_report import TurnReport


@dataclass(frozen=True)
class ContextBlock:
    """What the builder did with one block of one layer."""

    layer: str
    """``"system"``, ``"profile"``, ``"summary"``, ``"facts"``, ``"rag"`` or
    ``"history"``."""
    source: str
    """Where the block comes from: ``"system_prompt"``, ``"profile"``, ``"summary"``,
    ``"fact:<fact_id>"``, ``"<doc_id>#<chunk_index>"``, or for a recalled passage
    ``"history:<row>#<passage>"`` (``"history:<session_id>/<row>#<passage>"`` from another
    session of the scope)."""
    status: str
    """``"kept"``, ``"truncated"`` (kept, cut at a word boundary) or ``"dropped"``."""
    reason: str
    """Why, as a sentence fragment for a person."""
    tokens: int | None
    """Kept or truncated: the exact tokens the block adds to the context message (the
    system block also carries the message's fixed cost). Dropped: the tokens it would have
    added when it was tried, else the count of its rendered text; ``None`` if unknown."""
    text: str
    """The text as sent (the cut text when truncated; the full text when dropped)."""
    score: float | None = None
    """The relevance score from the memory store (higher is better), if any."""

    @property
    def kept(self) -> bool:
        """Whether the block is in the context message (whole or truncated)."""
        return self.status != "dropped"


@dataclass(frozen=True)
class ContextPlan:
    """The outcome of :meth:`TokenBudgetedContextBuilder.build`."""

    items: list[Any]
    """What to send: the context message (if any), then the pack result's items — the
    original history objects that were kept (masked copies for the tool outputs of units
    kept masked) and every ``new_input`` object — with the recall message (if any) at
    :attr:`recall_at`, after the kept history."""
    context_message: dict[str, Any] | None
    """The one system/developer context message, or ``None`` when there is nothing to say
    (no system prompt and nothing recalled)."""
    blocks: list[ContextBlock]
    """Every context block that was considered, in the order it was considered."""
    pack: PackResult
    """The Rust core's packing of history and new input around the context."""
    query: str
    """The recall query (text of the latest user input)."""
    scope: MemoryScope | None
    """The memory scope that was read, or ``None`` (no recall)."""
    context_limit: int
    """Tokens the context message was allowed to take: what was left after the reserved
    part, capped by ``max_context_tokens``."""
    calibration: CalibrationState | None = None
    """The builder's calibration of opaque payloads for its model when the plan was made
    (``None``: the builder has none)."""
    turn: TurnReport | None = None
    """For a turn of a :class:`~protoprompt.integrations.ProtoPromptSession`: how its
    history was read and packed (window or full read and why, index, snapshot, count
    store); ``None`` for a plain :meth:`TokenBudgetedContextBuilder.build`."""
    reserved_tokens: int = 0
    """Tokens reserved besides the items (the ``context_tokens`` and ``request`` of
    :meth:`TokenBudgetedContextBuilder.build`: the agent's instructions, tools and output
    schema)."""
    request: RequestCost | None = None
    """What ``reserved_tokens`` is made of, when the builder was told (a session callback
    made by ``run_config(agent=...)``, the per-call filter); ``None`` otherwise."""

    @property
    def context_tokens(self) -> int:
        """Tokens of the context message (equal to ``item_tokens(context_message).total``;
        0 without one)."""
        return self.pack.context_tokens - self.reserved_tokens

    layout: CallLayout | None = None
    """For the plan of a model call made by the standalone per-call filter: where the run
    input and the newest step are in the items packed (``None``: a turn planned before its
    first model call, whose new input is the run input)."""
    prefix: str | None = None
    """For a session turn with a :class:`~protoprompt.CachePolicy` (``run_config``'s
    default): ``"stayed"`` (the previous turn's request, its history byte for byte, then
    what was stored since and the new input), ``"moved"`` (that did not fit: packed to the
    low-water mark with older tool outputs masked) or ``"set"`` (no previous request to
    extend); ``None``: packed newest first."""
    prefix_reason: str = ""
    """:attr:`prefix` in words (e.g. ``"the turn did not fit: cut moved from history[12]
    to history[40], request 29,800 -> 22,100 (9 tool outputs masked)"``)."""
    shared_tokens: int = 0
    """Tokens this request repeats from the start of the previous turn's request (0 unless
    it stayed behind an unchanged context message)."""
    recall_message: dict[str, Any] | None = None
    """With ``build(stable_prefix=True)``: the message of what this turn's question found
    (recalled turns, document chunks, facts the search found), sent after the kept history
    at :attr:`recall_at`; ``None`` otherwise or when it found nothing."""
    recall_at: int | None = None
    """The position of :attr:`recall_message` in :attr:`items`."""

    @property
    def sections(self) -> RequestSections:
        """The request by section (see :mod:`protoprompt.plan`), adding up to :attr:`used`.

        A turn plan is made before the run's first model call: its newest step and earlier
        steps are empty. The agent's instructions, tools and output schema are counted
        when the builder was told them (``request``), else they are reserved as a lump
        (``context_tokens``) or not known here (the per-call filter counts them on every
        call)."""
        return request_sections(
            self.pack,
            request=self.request,
            reserved=self.reserved_tokens,
            context=(self.context_tokens, self.context_messages),
            call=self.layout,
        )

    @property
    def context_messages(self) -> int:
        """How many messages the context takes (the context message, the recall message)."""
        return (self.context_message is not None) + (self.recall_message is not None)

    @property
    def max_tokens(self) -> int:
        """The token budget: the request plus the output reserve."""
        return self.pack.max_tokens

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed("ContextPlan", "budget", "max_tokens")
        return self.pack.max_tokens

    @property
    def used(self) -> int:
        """Tokens used by the request plus the output reserve."""
        return self.pack.used

    @property
    def remaining(self) -> int:
        return self.pack.remaining

    @property
    def request_tokens(self) -> int:
        """Tokens of the request itself (context, history, new input)."""
        return self.pack.request_tokens

    @property
    def masked_items(self) -> list[Any]:
        """The masked copies in :attr:`items` (new objects, never to be stored), in order."""
        offset = 1 if self.context_message is not None else 0
        kept = self.pack.kept_history
        masked = set(self.pack.masked)
        at = len(self.items) if self.recall_at is None else self.recall_at
        return [
            self.items[offset + i + (offset + i >= at)] for i, p in enumerate(kept) if p in masked
        ]

    @property
    def recalled(self) -> list[ContextBlock]:
        """Memory blocks (profile, summary, facts, chunks, recalled passages) that made it
        into the context message."""
        return [b for b in self.blocks if b.kept and b.layer != "system"]

    @property
    def dropped_blocks(self) -> list[ContextBlock]:
        return [b for b in self.blocks if not b.kept]

    def to_html(self) -> str:
        """The plan as one self-contained HTML page: a bar of the budget by section, the
        units along the history as kept / masked / dropped with their reasons on hover, and
        the context message's blocks (:mod:`protoprompt.plan_html`, which renders
        :meth:`view`)."""
        return page(self)

    def view(self, title: str | None = None) -> PlanView:
        """The plain view the HTML page renders (:class:`protoprompt.plan_html.PlanView`):
        the sections, the units along the history and the context message's blocks."""
        return context_view(self, title)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account: for a session turn how the history was read and packed (see
        :class:`~protoprompt.plans.TurnReport`), the request by section (:attr:`sections`), the
        context message's blocks, then the masked and dropped history units with their
        reasons (at most ``max_units`` of each; ``None`` lists all)."""
        kept = sum(1 for b in self.blocks if b.kept)
        lines = [] if self.turn is None else self.turn.lines()
        lines += self.sections.lines()
        role = self.context_message["role"] if self.context_message else None
        if self.recall_message is not None:
            role = self.recall_message["role"]
            first = "" if self.context_message is None else "one first and "
            lines.append(
                f"context message: {self.context_tokens:,} tokens in {first}one {role} message "
                f"after the history (item {self.recall_at}: what this turn's question found)"
                f", room {self.context_limit:,}; {kept} blocks kept, "
                f"{len(self.blocks) - kept} dropped"
            )
        else:
            lines.append(
                f"context message: {self.context_tokens:,} tokens"
                + (f" in one {role} message" if role else " (none)")
                + f", room {self.context_limit:,}; {kept} blocks kept, "
                f"{len(self.blocks) - kept} dropped"
            )
        if self.scope is not None:
            lines.append(
                f"  scope {'/'.join(p for p in self.scope.key() if p)}"
                f", query {shorten(self.query, 60)!r}"
            )
        for b in self.blocks:
            tokens = "uncounted" if b.tokens is None else f"{b.tokens} tokens"
            lines.append(
                f"  {b.layer:<8}{b.status:<10}{tokens:>11}  {shorten(b.source, 24)}: {b.reason}"
            )
            if b.layer != "system":
                lines.append(f"{'':<12}{shorten(b.text, 66)!r}")
        if self.calibration is not None:
            lines.append(self.calibration.explain())
        where = input_at if self.layout is not None else None
        lines.extend(self.pack.explain_units(max_units, where=where))
        return "\n".join(lines)


def shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def recall_position(result: PackResult) -> int:
    """Where a recall message goes in ``result.items``: after the kept history, before the
    history the new input depends on (its unit starts there), and never inside a unit: when
    a kept unit straddles that place (units may interleave), before that unit."""
    kept = result.kept_history
    if not result.dependency:
        return len(kept)
    at = kept.index(min(result.dependency))
    moved = True
    while moved and at:
        moved = False
        boundary = kept[at]
        for decision in result.decisions:
            if not decision.kept or not decision.positions:
                continue
            first = decision.positions[0]
            if first < boundary and any(p >= boundary for p in decision.positions):
                at = kept.index(first)
                moved = True
                break
    return at
