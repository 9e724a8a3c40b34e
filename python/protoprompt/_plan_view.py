"""The plain view of a plan that the HTML page (:mod:`protoprompt.plan_html`) renders.

A plan (:class:`~protoprompt.PackResult`, :class:`~protoprompt.ContextPlan`,
:class:`~protoprompt.integrations.ModelCallPlan`) makes its :class:`PlanView` here (its
``view()``); the page renders views and never imports the plans, so a plan and its picture
depend on this module only, one way. A plan's ``to_html()`` asks :func:`page`, which hands
it to the renderer the page registered when it was imported (:func:`register_page`;
``import protoprompt`` imports the page): a plan never imports its renderer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .plan import SECTION_LABELS, RequestSections, history_at, input_at

if TYPE_CHECKING:
    from ._context._plan import ContextPlan
    from ._packing._result import PackResult

__all__ = [
    "MAX_UNITS",
    "BlockView",
    "PlanView",
    "UnitView",
    "call_view",
    "context_view",
    "pack_view",
    "page",
    "plan_view",
    "register_page",
]

MAX_UNITS = 5000
"""Units shown one by one (the newest); older ones are counted by decision."""


@dataclass(frozen=True)
class UnitView:
    """One unit along the session, as the page shows it."""

    label: str
    """Where it is, e.g. ``history[3..5]`` or ``rows 12-14``."""
    kinds: str
    tokens: int | None
    decision: str
    reason: str
    sent_tokens: int | None = None
    preview: str = ""
    """A glimpse of its content (untrusted: escaped when shown)."""
    region: str = "kept_history"
    """The section it belongs to (:data:`~protoprompt.plan.SECTIONS`)."""

    @property
    def status(self) -> str:
        """``"mandatory"``, ``"kept"``, ``"masked"``, ``"dropped"`` or ``"invalid"``."""
        if self.decision in ("mandatory", "kept", "masked"):
            return self.decision
        if self.decision in ("invalid_unit", "input_only"):
            return "invalid"
        return "dropped"

    @property
    def where_sent(self) -> str:
        """The section a sent unit is in; for one not sent, that it was not."""
        if self.status == "dropped":
            return "dropped (not sent)"
        if self.status == "invalid":
            return "invalid (not sent)"
        return SECTION_LABELS[self.region]


@dataclass(frozen=True)
class BlockView:
    """One block of a context message (profile, fact, chunk)."""

    layer: str
    source: str
    status: str
    tokens: int | None
    reason: str
    text: str


@dataclass(frozen=True)
class PlanView:
    """What one plan's part of the page shows."""

    title: str
    sections: RequestSections
    units: list[UnitView]
    hidden: dict[str, int] = field(default_factory=dict)
    """Older units not shown one by one: their number per decision."""
    notes: list[str] = field(default_factory=list)
    """Lines of the plan's own account (how the history was read, the index...)."""
    blocks: list[BlockView] = field(default_factory=list)


def pack_units(
    pack: PackResult, *, where: Any, regions: Any = None, max_units: int = MAX_UNITS
) -> tuple[list[UnitView], dict[str, int]]:
    """The newest ``max_units`` units of ``pack`` (oldest first) and the count of the older
    ones by decision."""
    decisions = pack.decisions
    n = len(decisions)
    start = max(n - max_units, 0)
    hidden: dict[str, int] = {}
    if start:
        for d in decisions[:start]:
            hidden[d.decision] = hidden.get(d.decision, 0) + 1
    units = [
        UnitView(
            label=where(d.positions),
            kinds="+".join(d.kinds),
            tokens=d.tokens,
            decision=d.decision,
            reason=pack.reason(d, where=where),
            sent_tokens=d.sent_tokens,
            region=regions(d.positions) if regions is not None else "kept_history",
        )
        for d in decisions[start:]
    ]
    return units, hidden


def tail_unit(name: str, tokens: int, items: int, label: str) -> UnitView:
    """The run input (or newest step) as one mandatory box at the end of the session."""
    return UnitView(
        label=label,
        kinds=f"{items} item{'s' if items != 1 else ''}",
        tokens=tokens,
        decision="mandatory",
        reason=f"mandatory: the {SECTION_LABELS[name]}",
        sent_tokens=tokens,
        region=name,
    )


def blocks_view(plan: ContextPlan | None) -> list[BlockView]:
    if plan is None:
        return []
    return [BlockView(b.layer, b.source, b.status, b.tokens, b.reason, b.text) for b in plan.blocks]


def call_regions(run_input: tuple[int, int] | None, step_start: int) -> Any:
    """A model call's region of a unit, by its newest position."""
    a, b = run_input if run_input is not None else (step_start, step_start)

    def region(positions: Sequence[int]) -> str:
        newest = positions[-1] if positions else 0
        if newest >= b:
            return "earlier_steps"
        if newest >= a:
            return "run_input"
        return "kept_history"

    return region


def pack_view(plan: PackResult, title: str | None = None) -> PlanView:
    """The view of a :class:`~protoprompt.PackResult`."""
    units, hidden = pack_units(plan, where=history_at)
    if plan.run_input_items:
        units.append(
            tail_unit("run_input", plan.new_input_tokens, plan.run_input_items, "new_input")
        )
    return PlanView(title or "pack", plan.sections, units, hidden)


def context_view(plan: ContextPlan, title: str | None = None) -> PlanView:
    """The view of a :class:`~protoprompt.ContextPlan` (a turn's plan)."""
    layout = plan.layout
    if layout is None:
        units, hidden = pack_units(plan.pack, where=history_at)
        tail = ("run_input", "new_input")
        notes = plan.turn.lines() if plan.turn is not None else []
    else:
        units, hidden = pack_units(
            plan.pack, where=input_at, regions=call_regions(layout.run_input, layout.step[0])
        )
        tail = ("newest_step", "newest step")
        notes = []
    s = plan.sections
    if s[tail[0]].items:
        units.append(tail_unit(tail[0], s[tail[0]].tokens, s[tail[0]].items or 0, tail[1]))
    return PlanView(title or "turn plan", s, units, hidden, notes, blocks_view(plan))


def call_view(plan: Any, title: str | None = None) -> PlanView:
    """The view of a :class:`~protoprompt.integrations.ModelCallPlan` (one model call)."""
    units, hidden = pack_units(
        plan.pack, where=input_at, regions=call_regions(plan.run_input, plan.step[0])
    )
    s = plan.sections
    if s["newest_step"].items:
        units.append(
            tail_unit(
                "newest_step",
                s["newest_step"].tokens,
                s["newest_step"].items or 0,
                "newest step",
            )
        )
    notes = [f"index: {plan.reused} of {plan.input_items} items reused ({plan.reuse})"]
    notes += [
        f"truncated {t.item_type} at input[{t.position}] (call {t.call_id}): "
        f"{t.original_tokens:,} -> {t.sent_tokens:,} tokens"
        for t in plan.truncated
    ]
    return PlanView(
        title or f"model call {plan.call}", s, units, hidden, notes, blocks_view(plan.context)
    )


def plan_view(plan: Any, *, title: str | None = None) -> PlanView:
    """The view of a :class:`~protoprompt.PackResult`, a :class:`~protoprompt.ContextPlan`
    or a :class:`~protoprompt.integrations.ModelCallPlan`: the plan's own ``view()``."""
    view = getattr(plan, "view", None)
    if callable(view):
        result = view(title=title)
        if isinstance(result, PlanView):
            return result
    call = getattr(plan, "call", None)
    if isinstance(call, int) and callable(getattr(getattr(plan, "pack", None), "view", None)):
        return call_view(plan, title)  # a ModelCallPlan
    raise TypeError(
        "expected a PackResult, a ContextPlan or a ModelCallPlan, got " + type(plan).__name__
    )


PageRenderer = Callable[[Any], str]
"""What renders one plan or a sequence of plans as an HTML page
(:func:`protoprompt.plan_html.plans_to_html`)."""

_page: list[PageRenderer] = []


def register_page(render: PageRenderer) -> None:
    """Make ``render`` the renderer :func:`page` hands plans to (the page does, on import)."""
    _page[:] = [render]


def page(plans: Any) -> str:
    """The HTML page of a plan or a sequence of plans, by the registered renderer (a plan's
    ``to_html()``)."""
    if not _page:
        raise RuntimeError(
            "no HTML renderer registered: import protoprompt.plan_html (import protoprompt does)"
        )
    return _page[0](plans)
