"""protoprompt: every OpenAI Agents SDK request fits the model's token budget, with a valid
item graph and scoped long-term memory recalled into it.

The heavy lifting (item graph, token counting, packing) happens in the Rust core
``protoprompt._core``; this package is its typed Python API. Importing it never needs
``openai-agents``; the SDK integration lives in :mod:`protoprompt.integrations`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version

from .calibration import Calibration, CalibrationState
from .context import ContextBlock, ContextPlan, TokenBudgetedContextBuilder
from .count_store import CountStore, SQLiteCountStore
from .errors import (
    BudgetUnderestimateWarning,
    HistoryMismatchError,
    InvalidItemError,
    InvalidNewInputError,
    MemoryStoreError,
    ProtoPromptError,
    ProtoPromptWarning,
    SnapshotError,
    TokenBudgetExceededError,
    TokenizerError,
    UnbudgetedSessionWarning,
    UnknownEncodingError,
    UnknownModelError,
)
from .memory import MemoryHit, MemoryScope, MemoryStore
from .packing import (
    Decisions,
    FillStop,
    GraphReport,
    HistoryIndex,
    HistoryWindow,
    IndexUse,
    ItemCost,
    Masking,
    PackResult,
    PackTotals,
    Problem,
    Unit,
    UnitDecision,
    analyze,
    available_encodings,
    canonical_text,
    count_tokens,
    count_tokens_batch,
    encoding_for_model,
    item_tokens,
    pack,
    preload,
    truncate_text,
)
from .plan import RequestCost, RequestSections, Section
from .plan_html import plans_to_html
from .prefix import CachePolicy, PrefixPlan, PrefixState, plan_prefix
from .turn_report import TurnReport

try:
    # One version source: the Cargo workspace version, which maturin writes into the
    # package metadata of every wheel and sdist.
    __version__: str = _dist_version("protoprompt")
except _PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "BudgetUnderestimateWarning",
    "CachePolicy",
    "Calibration",
    "CalibrationState",
    "ContextBlock",
    "ContextPlan",
    "CountStore",
    "Decisions",
    "FillStop",
    "GraphReport",
    "HistoryIndex",
    "HistoryMismatchError",
    "HistoryWindow",
    "IndexUse",
    "InvalidItemError",
    "InvalidNewInputError",
    "ItemCost",
    "Masking",
    "MemoryHit",
    "MemoryScope",
    "MemoryStore",
    "MemoryStoreError",
    "PackResult",
    "PackTotals",
    "PrefixPlan",
    "PrefixState",
    "Problem",
    "ProtoPromptError",
    "ProtoPromptWarning",
    "RequestCost",
    "RequestSections",
    "SQLiteCountStore",
    "Section",
    "SnapshotError",
    "TokenBudgetExceededError",
    "TokenBudgetedContextBuilder",
    "TokenizerError",
    "TurnReport",
    "UnbudgetedSessionWarning",
    "Unit",
    "UnitDecision",
    "UnknownEncodingError",
    "UnknownModelError",
    "analyze",
    "available_encodings",
    "canonical_text",
    "count_tokens",
    "count_tokens_batch",
    "encoding_for_model",
    "item_tokens",
    "pack",
    "plan_prefix",
    "plans_to_html",
    "preload",
    "truncate_text",
]
