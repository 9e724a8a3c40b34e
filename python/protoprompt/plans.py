"""Every value protoprompt hands back, in one place: the plans and results of a pack, a turn,
a prefix and a graph analysis, and the parts they are made of.

A program rarely names these (it reads what :func:`protoprompt.pack`, a builder's
:meth:`~protoprompt.TokenBudgetedContextBuilder.build` or :func:`protoprompt.plan_prefix`
return), so they are here rather than in ``protoprompt.__all__``; each also stays in the
module that makes it, and importable from ``protoprompt`` for compatibility. A model call's
plan, :class:`protoprompt.integrations.ModelCallPlan`, is in :mod:`protoprompt.integrations`
(it needs the Agents SDK).

=====================  ==============================================================
:class:`PackResult`    what :func:`~protoprompt.pack` (and an index's pack) decided
:class:`ContextPlan`   a builder's plan of one turn or model call, with its blocks
:class:`PrefixPlan`    the cache-stable prefix of :func:`~protoprompt.plan_prefix`
:class:`GraphReport`   :func:`~protoprompt.analyze`'s units and problems
:class:`TurnReport`    how a session turn read and packed its history
=====================  ==============================================================
"""

from __future__ import annotations

from ._context._plan import ContextBlock, ContextPlan
from .calibration import CalibrationState
from .packing import (
    Decisions,
    FillStop,
    GraphReport,
    HistoryWindow,
    IndexUse,
    ItemCost,
    PackResult,
    PackTotals,
    Problem,
    Unit,
    UnitDecision,
)
from .plan import RequestCost, RequestSections, Section
from .prefix import PrefixPlan, PrefixState
from .turn_report import TurnReport

__all__ = [
    "CalibrationState",
    "ContextBlock",
    "ContextPlan",
    "Decisions",
    "FillStop",
    "GraphReport",
    "HistoryWindow",
    "IndexUse",
    "ItemCost",
    "PackResult",
    "PackTotals",
    "PrefixPlan",
    "PrefixState",
    "Problem",
    "RequestCost",
    "RequestSections",
    "Section",
    "TurnReport",
    "Unit",
    "UnitDecision",
]
