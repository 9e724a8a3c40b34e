"""A picture of the budget: one self-contained HTML page for one plan or a run's plans.

:func:`plans_to_html` (and ``plan.to_html()`` on a :class:`~protoprompt.PackResult`, a
:class:`~protoprompt.ContextPlan` or a :class:`~protoprompt.integrations.ModelCallPlan`; and
``protoprompt inspect --html FILE``) writes, per plan:

* a bar of the budget by section (:mod:`protoprompt.plan`), each section in its own colour,
  with the tokens left at the end; hovering a segment names it with its tokens and items;
* the units along the session, oldest first, as small boxes coloured kept / mandatory /
  masked / dropped / invalid, each with its items, kinds, tokens and the reason on hover,
  the same as a table in the same order (the newest :data:`MAX_UNITS` units; older ones
  are counted), and the totals: kept, masked (tokens saved), dropped (their tokens);
* for a turn's plan, the blocks of its context message.

The page renders the plain view :mod:`protoprompt._plan_view` makes of a plan and imports
no plan; importing it registers :func:`plans_to_html` as the renderer a plan's ``to_html()``
asks for (:func:`protoprompt._plan_view.page`).

The page needs nothing else: the style is inline, there is no script and no link, so it
opens offline and from a file. Everything that comes from items, memory or a database
(previews, tool names, sources, ids) is untrusted: it is HTML-escaped wherever it goes (text
and attributes).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from ._plan_view import MAX_UNITS, BlockView, PlanView, UnitView, plan_view, register_page
from .plan import SECTION_LABELS, RequestSections

__all__ = [
    "FREE_COLOUR",
    "MAX_UNITS",
    "OPEN_TABLE",
    "SECTION_COLOURS",
    "STATUS_COLOURS",
    "BlockView",
    "PlanView",
    "UnitView",
    "plan_view",
    "plans_to_html",
    "render",
]

SECTION_COLOURS: dict[str, str] = {
    "instructions": "#4e79a7",
    "tools": "#f28e2b",
    "output_schema": "#e15759",
    "context_message": "#76b7b2",
    "run_input": "#59a14f",
    "newest_step": "#edc948",
    "earlier_steps": "#b07aa1",
    "kept_history": "#ff9da7",
    "output_reserve": "#9c755f",
}
"""The colour of each section in the budget bar."""
FREE_COLOUR = "#e8e8e8"
"""The colour of the tokens left."""
STATUS_COLOURS: dict[str, str] = {
    "mandatory": "#1f5fa8",
    "kept": "#3f9b47",
    "masked": "#f0a202",
    "dropped": "#1b1b1b",
    "invalid": "#9a9a9a",
}
"""The colour of a unit by what happened to it (none is a section's colour: a dropped unit
is never mistaken for the output schema's part of the bar)."""
BAR_WIDTH = 960
"""The budget bar's width in CSS pixels."""
OPEN_TABLE = 60
"""Up to this many units, the table of units is shown open."""


# --------------------------------------------------------------------------- the page

_STYLE = f"""
body {{ margin: 0; padding: 16px 24px; font: 14px/1.4 system-ui, sans-serif; color: #222;
       background: #fff; }}
h1 {{ font-size: 20px; margin: 0 0 12px; }}
h2 {{ font-size: 16px; margin: 20px 0 6px; }}
section.plan {{ margin-bottom: 28px; }}
.bar {{ display: flex; width: {BAR_WIDTH}px; height: 36px; border: 0; margin: 0;
        overflow: hidden; }}
.bar span {{ display: block; height: 36px; flex: none; }}
.legend {{ display: flex; flex-wrap: wrap; gap: 4px 16px; margin: 8px 0;
           max-width: {BAR_WIDTH}px; }}
.legend span {{ white-space: nowrap; }}
.sw {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px;
       vertical-align: -1px; }}
.units {{ display: flex; flex-wrap: wrap; gap: 2px; max-width: {BAR_WIDTH}px; }}
.units span {{ display: block; width: 10px; height: 16px; }}
.units span.region {{ width: 2px; background: #222; }}
table {{ border-collapse: collapse; margin: 6px 0; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left;
          vertical-align: top; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
pre {{ margin: 4px 0; color: #555; }}
.note {{ color: #666; }}
"""


def _e(value: object) -> str:
    """Text made safe for HTML content and attribute values."""
    return html.escape(str(value), quote=True)


def _n(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def _bar(sections: RequestSections) -> str:
    budget = max(sections.max_tokens, 1)
    parts = []
    for s in sections:
        if s.tokens <= 0:
            continue
        width = BAR_WIDTH * s.tokens / budget
        items = f", {_plural(s.items, 'item')}" if s.items else ""
        parts.append(
            f'<span class="seg" data-section="{_e(s.name)}" '
            f'style="width:{width:.3f}px;background:{SECTION_COLOURS[s.name]}" '
            f'title="{_e(s.label)}: {s.tokens:,} tokens{_e(items)}"></span>'
        )
    left = sections.remaining
    if left > 0:
        parts.append(
            f'<span class="seg" data-section="left" '
            f'style="width:{BAR_WIDTH * left / budget:.3f}px;background:{FREE_COLOUR}" '
            f'title="left: {left:,} tokens"></span>'
        )
    return f'<div class="bar">{"".join(parts)}</div>'


def _legend(sections: RequestSections) -> str:
    entries = []
    for s in sections:
        tokens = f"{s.tokens:,}" if s.counted else "-"
        note = f" ({s.note})" if s.note else ""
        entries.append(
            f'<span title="{_e(s.label + note)}"><i class="sw" '
            f'style="background:{SECTION_COLOURS[s.name]}"></i>{_e(s.label)} {tokens}</span>'
        )
    entries.append(
        f'<span><i class="sw" style="background:{FREE_COLOUR}"></i>left {sections.remaining:,}'
        "</span>"
    )
    return f'<div class="legend">{"".join(entries)}</div>'


def _unit_title(u: UnitView) -> str:
    tokens = "uncounted" if u.tokens is None else f"{u.tokens:,} tokens"
    if u.decision == "masked" and u.sent_tokens is not None:
        tokens += f", {u.sent_tokens:,} sent"
    text = f"{u.label} {u.kinds} ({tokens}): {u.decision}: {u.reason}"
    if u.preview:
        text += f"\n{u.preview}"
    return text


def _units(view: PlanView) -> str:
    boxes = []
    if view.hidden:
        counts = ", ".join(f"{n:,} {k}" for k, n in sorted(view.hidden.items()))
        older = f"{sum(view.hidden.values()):,} older units: {counts}"
        boxes.append(f'<span class="region" title="{_e(older)}"></span>')
    region = None
    for u in view.units:
        if region is not None and u.region != region:
            boxes.append(f'<span class="region" title="{_e(SECTION_LABELS[u.region])}"></span>')
        region = u.region
        boxes.append(
            f'<span class="u {u.status}" style="background:{STATUS_COLOURS[u.status]}" '
            f'title="{_e(_unit_title(u))}"></span>'
        )
    legend = "".join(
        f'<span><i class="sw" style="background:{c}"></i>{s}</span>'
        for s, c in STATUS_COLOURS.items()
    )
    return f'<div class="units">{"".join(boxes)}</div><div class="legend">{legend}</div>'


def _tokens_cell(u: UnitView) -> str:
    if u.tokens is not None:
        return f'<td class="n">{u.tokens:,}</td>'
    return '<td class="n" title="not tried: not counted (a turn counts what it sends)">-</td>'


def _totals(view: PlanView) -> str:
    """Kept, masked (tokens saved) and dropped (their tokens) of the units shown, and the
    older ones counted."""
    by: dict[str, list[UnitView]] = {}
    for u in view.units:
        by.setdefault(u.status, []).append(u)
    masked = by.get("masked", [])
    saved = sum((u.tokens or 0) - (u.sent_tokens or 0) for u in masked)
    dropped = by.get("dropped", []) + by.get("invalid", [])
    dropped_tokens = sum(u.tokens or 0 for u in dropped)
    uncounted = sum(1 for u in dropped if u.tokens is None)
    parts = [
        f"{_plural(len(by.get('mandatory', [])), 'unit')} mandatory",
        f"{len(by.get('kept', [])):,} kept",
        f"{len(masked):,} masked ({saved:,} tokens saved)",
        f"{len(dropped):,} dropped or invalid ({dropped_tokens:,} tokens"
        + (f"; {uncounted:,} not counted" if uncounted else "")
        + ")",
    ]
    if view.hidden:
        parts.append(f"{_plural(sum(view.hidden.values()), 'older unit')} counted above")
    return f'<div class="totals">totals: {_e(", ".join(parts))}</div>'


def _unit_table(view: PlanView) -> str:
    rows = "".join(
        "<tr>"
        f"<td>{_e(u.label)}</td><td>{_e(u.where_sent)}</td><td>{_e(u.kinds)}</td>"
        f'{_tokens_cell(u)}<td class="n">{_n(u.sent_tokens)}</td>'
        f"<td>{_e(u.decision)}</td><td>{_e(u.reason)}</td><td>{_e(u.preview)}</td>"
        "</tr>"
        for u in view.units
    )
    shown = " open" if len(view.units) <= OPEN_TABLE else ""
    return (
        f"{_totals(view)}<details{shown}><summary>{_plural(len(view.units), 'unit')}, "
        "oldest first (as the boxes above)</summary><table>"
        "<tr><th>where</th><th>section</th><th>kinds</th><th>tokens</th><th>sent</th>"
        "<th>decision</th><th>reason</th><th>content</th></tr>"
        f"{rows}</table></details>"
    )


def _blocks_table(blocks: list[BlockView]) -> str:
    if not blocks:
        return ""
    rows = "".join(
        "<tr>"
        f"<td>{_e(b.layer)}</td><td>{_e(b.source)}</td><td>{_e(b.status)}</td>"
        f'<td class="n">{_n(b.tokens)}</td><td>{_e(b.reason)}</td>'
        f"<td>{_e(b.text[:200])}</td></tr>"
        for b in blocks
    )
    return (
        "<h2>context message</h2><table><tr><th>layer</th><th>source</th><th>status</th>"
        f"<th>tokens</th><th>reason</th><th>text</th></tr>{rows}</table>"
    )


def _section(view: PlanView) -> str:
    s = view.sections
    notes = "".join(f"<pre>{_e(line)}</pre>" for line in view.notes)
    return (
        '<section class="plan">'
        f"<h2>{_e(view.title)}: {s.used:,} of {s.max_tokens:,} tokens ({_e(s.encoding)}), "
        f"{s.remaining:,} left</h2>"
        f"{_bar(s)}{_legend(s)}"
        f"<h2>units along the session</h2>{_units(view)}{_unit_table(view)}"
        f"{_blocks_table(view.blocks)}{notes}"
        "</section>"
    )


def render(views: Sequence[PlanView], *, title: str = "protoprompt plan") -> str:
    """The page for ``views`` (one section each, in order)."""
    body = "".join(_section(v) for v in views)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'\">"
        f"<title>{_e(title)}</title><style>{_STYLE}</style></head>"
        f"<body><h1>{_e(title)}</h1>{body}</body></html>\n"
    )


def plans_to_html(plans: Sequence[Any] | Any, *, title: str | None = None) -> str:
    """One self-contained HTML page for a plan or a run's plans (e.g. every
    :class:`~protoprompt.integrations.ModelCallPlan` an ``on_call`` collected): per plan a
    bar of the budget by section and its units as kept / masked / dropped with their
    reasons (see the module doc)."""
    items = plans if isinstance(plans, Sequence) else [plans]
    views = [plan_view(p) for p in items]
    if title is None:
        title = "protoprompt: " + (views[0].title if len(views) == 1 else f"{len(views)} plans")
    return render(views, title=title)


register_page(plans_to_html)
