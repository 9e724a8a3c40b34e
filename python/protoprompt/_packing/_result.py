"""The outcome of a pack (:class:`PackResult`): what to send, where the tokens went, and why."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._plan_view import PlanView, pack_view, page
from .._tokens import ESTIMATED_ENCODINGS
from ..errors import renamed
from ..plan import (
    NO_HISTORY,
    RequestSections,
    Section,
    dropped_note,
    history_at,
    masked_note,
    unit_reason,
)
from ._types import KEPT, Decisions, FillStop, IndexUse, PackTotals, UnitDecision


@dataclass(frozen=True)
class PackResult:
    """The outcome of :func:`pack`."""

    items: list[Any]
    """What to send: the kept history objects (original order, same objects; with masking,
    a masked unit's tool outputs are new copies instead) then every ``new_input`` object,
    unchanged."""
    kept_history: list[int]
    dependency: list[int]
    new_input_tokens: int
    dependency_tokens: int
    history_tokens: int
    context_tokens: int
    output_reserve: int
    max_tokens: int
    """The token budget: the request plus the output reserve."""
    used: int
    remaining: int
    encoding: str
    policy: str
    decisions: Sequence[UnitDecision]
    """One decision per history unit, oldest first (built lazily on access)."""
    opaque_scale: float = 1.0
    """The calibration opaque payloads were costed with (1.0: the decoded-size rule)."""
    masked: list[int] = field(default_factory=list)
    """History positions sent as masked copies (sorted; a subset of ``kept_history``)."""
    masking_saved: int = 0
    """Tokens the units kept masked would have cost more whole."""

    index: IndexUse | None = None
    """How a :meth:`HistoryIndex.pack` used its index (``None`` for :func:`pack`)."""
    count_store_hits: int | None = None
    """Token counts read from the count store (``None`` without a store)."""
    count_store_writes: int | None = None
    """Token counts handed to the count store to keep (``None`` without a store)."""
    stop: FillStop | None = None
    """The unit the fill first missed at, with the tokens it had left then (``None``: every
    unit that could be sent fit)."""
    thinking_rule: str = "whole"
    """How Claude's earlier turns' thinking was costed: ``"whole"`` (every reasoning item
    counted whole) or ``"earlier-turns-free"`` (the model, Claude 3.7, Sonnet 4 / 4.5, Haiku
    4.5 or Opus 4 / 4.1, strips the thinking before the last user message: it cost 0; see
    ``docs/item-graph.md`` §1.2)."""
    earlier_thinking_free: int = 0
    """Reasoning items costed 0 as earlier turns' thinking (``"earlier-turns-free"`` only)."""
    omitted_reasoning: list[int] = field(default_factory=list)
    """History positions of reasoning items left out of units sent masked
    (``Masking(omit_reasoning=True)``; sorted; not in ``kept_history``). The assistant
    messages and calls of those units are sent as copies without their ``id`` (listed in
    ``masked``)."""

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed("PackResult", "budget", "max_tokens")
        return self.max_tokens

    @property
    def totals(self) -> PackTotals:
        """The token totals, masking included (what was masked and the tokens it saved)."""
        masked_units = 0
        if self.masked:
            counts = (
                self.decisions.unit_counts()
                if isinstance(self.decisions, Decisions)
                else {"masked": sum(1 for d in self.decisions if d.decision == "masked")}
            )
            masked_units = counts.get("masked", 0)
        return PackTotals(
            max_tokens=self.max_tokens,
            used=self.used,
            remaining=self.remaining,
            new_input=self.new_input_tokens,
            dependency=self.dependency_tokens,
            history=self.history_tokens,
            context=self.context_tokens,
            output_reserve=self.output_reserve,
            masked_units=masked_units,
            masked_items=len(self.masked),
            masking_saved=self.masking_saved,
        )

    @property
    def dropped(self) -> list[UnitDecision]:
        """Decisions of the history units that are not sent."""
        return [d for d in self.decisions if not d.kept]

    def decision_counts(self) -> dict[str, int]:
        """Number of history *items* per decision code, without building decision objects."""
        decisions = self.decisions
        if isinstance(decisions, Decisions):
            return decisions.item_counts()
        counts: dict[str, int] = {}
        for d in decisions:
            counts[d.decision] = counts.get(d.decision, 0) + len(d.positions)
        return counts

    @property
    def request_tokens(self) -> int:
        """Tokens of the request itself (without the output reserve)."""
        return self.used - self.output_reserve

    @property
    def run_input_items(self) -> int:
        """Items of ``new_input`` (the run input), all sent."""
        return len(self.items) - len(self.kept_history)

    @property
    def sections(self) -> RequestSections:
        """The request by section (:mod:`protoprompt.plan`): the context (``context_tokens``
        and what a ``context`` hook took), the run input (``new_input``), the kept history
        and the output reserve. They add up to :attr:`used`."""
        return RequestSections(
            self.max_tokens,
            (
                Section(
                    "context_message",
                    self.context_tokens,
                    note=None if self.context_tokens else "empty: no context was reserved",
                ),
                Section("run_input", self.new_input_tokens, self.run_input_items),
                self.history_section(),
                Section("output_reserve", self.output_reserve),
            ),
            self.encoding,
        )

    def history_section(self) -> Section:
        """The history this pack sends (mandatory and optional units) as one section."""
        items = len(self.kept_history)
        dropped = sum(n for k, n in self.decision_counts().items() if k not in KEPT)
        notes = []
        if self.dependency:
            notes.append(
                f"{len(self.dependency):,} mandatory, {self.dependency_tokens:,} tokens: "
                "what the run input answers"
            )
        note = masked_note(len(self.masked), len(self.omitted_reasoning))
        if note:
            notes.append(note)
        note = dropped_note(items, dropped, NO_HISTORY)
        if note:
            notes.append(note)
        return Section(
            "kept_history",
            self.history_tokens + self.dependency_tokens,
            items,
            "; ".join(notes) or None,
        )

    def reason(
        self,
        decision: UnitDecision,
        *,
        where: Callable[[Sequence[int]], str] | None = None,
        mandatory: str = "the run input depends on it",
    ) -> str:
        """Why ``decision``'s unit was kept or dropped, as a phrase for a person: the unit
        the fill stopped at says what it needed and what was left then; units dropped
        because of it name it (see :func:`protoprompt.plan.unit_reason`). ``where`` names
        positions (default ``history[a..b]``)."""
        return unit_reason(
            decision,
            stop=self.stop,
            policy=self.policy,
            where=where or history_at,
            mandatory=mandatory,
        )

    def view(self, title: str | None = None) -> PlanView:
        """The plain view the HTML page renders (:class:`protoprompt.plan_html.PlanView`):
        the sections and the units along the history, each with its decision and reason."""
        return pack_view(self, title)

    def to_html(self) -> str:
        """The plan as one self-contained HTML page: a bar of the budget by section and the
        units along the history as kept / masked / dropped, with their reasons on hover
        (:mod:`protoprompt.plan_html`, which renders :meth:`view`)."""
        return page(self)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account of the packing: the request by section (:attr:`sections`),
        then the masked and dropped units, newest first, with their reasons (at most
        ``max_units`` of each; ``None`` lists all)."""
        lines = self.sections.lines()
        lines.extend(self.explain_units(max_units))
        return "\n".join(lines)

    def explain_units(
        self,
        max_units: int | None = 20,
        *,
        where: Callable[[Sequence[int]], str] | None = None,
    ) -> list[str]:
        """The lines of :meth:`explain` after the sections: the policy and calibration, the
        masked units and the dropped units (newest first, at most ``max_units`` each) with
        their reasons. ``where`` names positions (default ``history[a..b]``)."""
        name = where or history_at
        lines = [f"policy {self.policy}"]
        if self.opaque_scale != 1.0 and self.encoding in ESTIMATED_ENCODINGS:
            lines[0] += (
                f"; every item at x{self.opaque_scale:g} of the {self.encoding} estimate "
                "(calibrated from the provider's counts)"
            )
        elif self.opaque_scale != 1.0:
            lines[0] += (
                f"; opaque payloads at x{self.opaque_scale:g} of the decoded-size rule "
                "(calibrated; text, media and overhead at the rule)"
            )
        if self.thinking_rule == "earlier-turns-free":
            lines[0] += (
                f"; earlier turns' thinking not counted ({self.earlier_thinking_free:,} "
                "reasoning items: the model strips it)"
            )
        if self.masked:
            lines.extend(self._explain_masked(max_units, name))
        counts = {k: n for k, n in self.decision_counts().items() if k not in KEPT}
        if not counts:
            lines.append("dropped: nothing")
            return lines
        summary = ", ".join(f"{n:,} {k}" for k, n in sorted(counts.items()))
        lines.append(f"dropped items: {summary}")
        decisions = self.decisions
        shown: list[UnitDecision] = []
        if isinstance(decisions, Decisions):
            # Counted in the core; only the shown units become objects (newest first).
            n_dropped = sum(n for k, n in decisions.unit_counts().items() if k not in KEPT)
            for d in reversed(decisions):
                if max_units is not None and len(shown) >= max_units:
                    break
                if not d.kept:
                    shown.append(d)
        else:
            dropped = [d for d in reversed(decisions) if not d.kept]
            n_dropped = len(dropped)
            shown = dropped if max_units is None else dropped[:max_units]
        for d in shown:
            tokens = "uncounted" if d.tokens is None else f"{d.tokens:,} tokens"
            lines.append(
                f"  {name(d.positions)} {'+'.join(d.kinds)} ({tokens}): "
                f"{self.reason(d, where=name)}"
            )
        if len(shown) < n_dropped:
            lines.append(f"  ... and {n_dropped - len(shown):,} older dropped units")
        return lines

    def _explain_masked(
        self, max_units: int | None, name: Callable[[Sequence[int]], str]
    ) -> list[str]:
        """The masked units, newest first (at most ``max_units``)."""
        masked = [d for d in reversed(self.decisions) if d.decision == "masked"]
        units, outputs = len(masked), len(self.masked)
        omitted = len(self.omitted_reasoning)
        what = (
            f"{outputs:,} item{'s' if outputs != 1 else ''} sent as copies, {omitted:,} "
            f"earlier reasoning item{'s' if omitted != 1 else ''} left out"
            if omitted
            else f"{outputs:,} tool output{'s' if outputs != 1 else ''}"
        )
        lines = [
            f"masked: {units:,} unit{'s' if units != 1 else ''} ({what}), "
            f"{self.masking_saved:,} tokens saved"
        ]
        shown = masked if max_units is None else masked[:max_units]
        lines.extend(
            f"  {name(d.positions)} {'+'.join(d.kinds)} "
            f"({d.tokens:,} -> {d.masked_tokens:,} tokens): masked"
            for d in shown
            if d.tokens is not None and d.masked_tokens is not None
        )
        if len(shown) < len(masked):
            lines.append(f"  ... and {len(masked) - len(shown):,} older masked units")
        return lines
