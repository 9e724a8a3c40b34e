"""protoprompt: every OpenAI Agents SDK request fits the model's token budget, with a valid
item graph and scoped long-term memory recalled into it.

The heavy lifting (item graph, token counting, packing) happens in the Rust core
``protoprompt._core``; this package is its typed Python API. Importing it never needs
``openai-agents``; the SDK integration lives in :mod:`protoprompt.integrations`.

``__all__`` holds what a program calls; the values it gets back are in
:mod:`protoprompt.plans` (every plan and result type), the errors and warnings in
:mod:`protoprompt.errors`, the memory types in :mod:`protoprompt.memory`.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _dist_version
from typing import TYPE_CHECKING, Any

from . import errors as errors
from . import memory as memory
from . import packing as packing
from . import plans as plans
from .calibration import Calibration
from .context import TokenBudgetedContextBuilder
from .count_store import CountStore, SQLiteCountStore
from .errors import ProtoPromptError, TokenBudgetExceededError
from .memory import MemoryScope, MemoryStore
from .packing import (
    HistoryIndex,
    Masking,
    analyze,
    available_encodings,
    count_tokens,
    count_tokens_batch,
    encoding_for_model,
    item_tokens,
    pack,
    preload,
    truncate_text,
)
from .plan_html import plans_to_html
from .plans import ContextPlan, PackResult
from .prefix import CachePolicy, plan_prefix

if TYPE_CHECKING:  # the names kept for compatibility (below), typed for type checkers
    from .errors import BudgetUnderestimateWarning as BudgetUnderestimateWarning
    from .errors import HistoryMismatchError as HistoryMismatchError
    from .errors import InvalidItemError as InvalidItemError
    from .errors import InvalidNewInputError as InvalidNewInputError
    from .errors import MemoryStoreError as MemoryStoreError
    from .errors import ProtoPromptWarning as ProtoPromptWarning
    from .errors import SnapshotError as SnapshotError
    from .errors import TokenizerError as TokenizerError
    from .errors import UnbudgetedSessionWarning as UnbudgetedSessionWarning
    from .errors import UnknownEncodingError as UnknownEncodingError
    from .errors import UnknownModelError as UnknownModelError
    from .memory import MemoryHit as MemoryHit
    from .packing import canonical_text as canonical_text
    from .plans import CalibrationState as CalibrationState
    from .plans import ContextBlock as ContextBlock
    from .plans import Decisions as Decisions
    from .plans import FillStop as FillStop
    from .plans import GraphReport as GraphReport
    from .plans import HistoryWindow as HistoryWindow
    from .plans import IndexUse as IndexUse
    from .plans import ItemCost as ItemCost
    from .plans import PackTotals as PackTotals
    from .plans import PrefixPlan as PrefixPlan
    from .plans import PrefixState as PrefixState
    from .plans import Problem as Problem
    from .plans import RequestCost as RequestCost
    from .plans import RequestSections as RequestSections
    from .plans import Section as Section
    from .plans import TurnReport as TurnReport
    from .plans import Unit as Unit
    from .plans import UnitDecision as UnitDecision

_IN_ALL = {"ContextPlan", "PackResult", "ProtoPromptError", "TokenBudgetExceededError"}
_COMPATIBLE: dict[str, Any] = {
    **{name: errors for name in errors.__all__ if name not in _IN_ALL},
    "MemoryHit": memory,
    "canonical_text": packing,
    **{name: plans for name in plans.__all__ if name not in _IN_ALL},
}


def __getattr__(name: str) -> Any:
    """Kept for compatibility: the names that left ``__all__`` in 1.1 (the result types,
    now in :mod:`protoprompt.plans`; the other errors and warnings, in
    :mod:`protoprompt.errors`; ``MemoryHit``, in :mod:`protoprompt.memory`;
    ``canonical_text``, in :mod:`protoprompt.packing`) stay importable from ``protoprompt``
    (``from protoprompt import Decisions``, ``pp.InvalidItemError``), the same objects."""
    module = _COMPATIBLE.get(name)
    if module is None:
        raise AttributeError(f"module 'protoprompt' has no attribute {name!r}")
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted({*globals(), *_COMPATIBLE})


try:
    # One version source: the Cargo workspace version, which maturin writes into the
    # package metadata of every wheel and sdist.
    __version__: str = _dist_version("protoprompt")
except _PackageNotFoundError:  # imported from a tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CachePolicy",
    "Calibration",
    "ContextPlan",
    "CountStore",
    "HistoryIndex",
    "Masking",
    "MemoryScope",
    "MemoryStore",
    "PackResult",
    "ProtoPromptError",
    "SQLiteCountStore",
    "TokenBudgetExceededError",
    "TokenBudgetedContextBuilder",
    "analyze",
    "available_encodings",
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
