"""Type stubs for the native module ``protoprompt._core`` (Rust, PyO3).

Use the typed wrappers in :mod:`protoprompt` instead of calling this module directly.
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeAlias, TypedDict, final

from typing_extensions import NotRequired

from protoprompt._packing._types import Masking

__all__ = [
    "CALIBRATION_MAX_SAMPLES",
    "COST_RULE",
    "DEFAULT_ENCODING",
    "ESTIMATE_SAMPLE_CAP",
    "ESTIMATE_SCALE_MIN",
    "ITEM_OVERHEAD",
    "OPAQUE_SCALE_MAX",
    "OPAQUE_SCALE_MIN",
    "DecisionTable",
    "HistoryIndex",
    "PackOptions",
    "_build_is_held",
    "_clear_count_cache",
    "_fail_next_counts",
    "_hold_next_build_until_fork",
    "_lazy_commit_allocator",
    "analyze",
    "available_encodings",
    "calibration_sample",
    "canonical_text",
    "count_tokens",
    "count_tokens_batch",
    "cut_text",
    "digests",
    "encoding_for_model",
    "fit_output",
    "is_preloaded",
    "item_tokens",
    "learned_scale",
    "plan_prefix",
    "preload",
    "scale_opaque",
    "split_tokens",
]

CALIBRATION_MAX_SAMPLES: int
COST_RULE: int
DEFAULT_ENCODING: str
ESTIMATE_SAMPLE_CAP: float
ESTIMATE_SCALE_MIN: float
ITEM_OVERHEAD: int
OPAQUE_SCALE_MAX: float
OPAQUE_SCALE_MIN: float

_Problem: TypeAlias = tuple[str, str, str]

# members, positions, kinds, valid, input_only, contains_new, problems
_UnitTuple: TypeAlias = tuple[list[str], list[int], list[str], bool, bool, bool, list[_Problem]]

@final
class DecisionTable:
    """Per-unit decisions of one pack, kept in Rust."""

    def __len__(self) -> int: ...
    def row(
        self, i: int
    ) -> tuple[int, list[int], list[str], str, int | None, list[_Problem], int | None]: ...
    def item_counts(self) -> dict[str, int]: ...
    def unit_counts(self) -> dict[str, int]: ...

class _PackDict(TypedDict):
    kept_history: list[int]
    dependency: list[int]
    new_input_tokens: int
    dependency_tokens: int
    history_tokens: int
    context_tokens: int
    output_reserve: int
    budget: int
    used: int
    remaining: int
    encoding: str
    opaque_scale: float
    policy: str
    decisions: DecisionTable
    items: list[Any]
    masked: list[int]
    masking_saved: int
    new_counts: NotRequired[list[tuple[bytes, int]]]  # only with count_store
    store_hits: NotRequired[int]  # only with count_store
    index: tuple[int, int, int, str | None]  # held, appended, regrouped from, why
    thinking_rule: str  # "whole" or "earlier-turns-free"
    earlier_thinking_free: int

def count_tokens(text: str, *, model: str | None = None, encoding: str | None = None) -> int: ...
def count_tokens_batch(
    texts: list[str], *, model: str | None = None, encoding: str | None = None
) -> list[int]: ...
def split_tokens(
    text: str, head: int, tail: int, *, model: str | None = None, encoding: str | None = None
) -> tuple[str, str, int, bool]: ...
def cut_text(
    text: str,
    max_tokens: int,
    *,
    tail_share: float,
    marker: str,
    model: str | None = None,
    encoding: str | None = None,
) -> str: ...
def fit_output(
    item: Mapping[str, Any],
    target: int,
    *,
    model: str | None = None,
    encoding: str | None = None,
) -> tuple[dict[str, Any], int, int, int] | None: ...
def digests(values: Iterable[Any], previous: bytes | None = None) -> tuple[bytes, int]: ...

_PrefixStateTuple: TypeAlias = tuple[int, int, list[int], list[int], bytes, bytes]

def plan_prefix(
    history: Iterable[Mapping[str, Any]],
    new_input: Iterable[Mapping[str, Any]],
    *,
    budget: int,
    output_reserve: int,
    context_tokens: int,
    low_water: float,
    keep_recent: int,
    excerpt_tokens: int,
    previous: _PrefixStateTuple | None = None,
    model: str | None = None,
    encoding: str | None = None,
) -> tuple[
    list[int],
    list[tuple[int, dict[str, Any]]],
    int,
    int,
    str,
    str,
    int | None,
    _PrefixStateTuple,
]: ...
def _lazy_commit_allocator() -> bool: ...
def _clear_count_cache() -> None: ...
def _fail_next_counts(n: int) -> None: ...
def _hold_next_build_until_fork() -> None: ...
def _build_is_held() -> bool: ...
def preload(*, model: str | None = None, encoding: str | None = None, wait: bool = True) -> str: ...
def is_preloaded(*, model: str | None = None, encoding: str | None = None) -> bool: ...
def encoding_for_model(model: str) -> str: ...
def available_encodings() -> list[str]: ...
def item_tokens(
    item: Mapping[str, Any], *, model: str | None = None, encoding: str | None = None
) -> tuple[int, int, int, int, str | None]: ...
def scale_opaque(tokens: int, factor: float) -> int: ...
def calibration_sample(
    estimate: int, opaque: int, factor: float, reported: int, *, whole: bool = False
) -> tuple[float | None, float | None]: ...
def learned_scale(samples: list[float], *, whole: bool = False) -> float: ...
def canonical_text(item: Mapping[str, Any]) -> str: ...
def analyze(
    history: Iterable[Mapping[str, Any]], new_input: Iterable[Mapping[str, Any]]
) -> tuple[list[_UnitTuple], int, list[int]]: ...  # units, n_history, mandatory_history

@final
class PackOptions:
    """The options of one pack as one frozen value, checked when made (see
    :class:`protoprompt.packing.PackOptions`)."""

    FIELDS: ClassVar[list[str]]
    def __new__(
        cls,
        max_tokens: int,
        *,
        output_reserve: int = ...,
        context_tokens: int = ...,
        model: str | None = ...,
        encoding: str | None = ...,
        policy: Literal["contiguous", "greedy"] = ...,
        context: Callable[[int], int] | None = ...,
        pinned: Iterable[int] = ...,
        history_len: int | None = ...,
        history_offset: int = ...,
        opaque_scale: float = ...,
        masking: Masking | None = ...,
    ) -> PackOptions: ...
    def replace(
        self,
        *,
        max_tokens: int = ...,
        output_reserve: int = ...,
        context_tokens: int = ...,
        model: str | None = ...,
        encoding: str | None = ...,
        policy: Literal["contiguous", "greedy"] = ...,
        context: Callable[[int], int] | None = ...,
        pinned: Iterable[int] = ...,
        history_len: int | None = ...,
        history_offset: int = ...,
        opaque_scale: float = ...,
        masking: Masking | None = ...,
    ) -> PackOptions: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def output_reserve(self) -> int: ...
    @property
    def context_tokens(self) -> int: ...
    @property
    def model(self) -> str | None: ...
    @property
    def encoding(self) -> str | None: ...
    @property
    def resolved_encoding(self) -> str: ...
    @property
    def policy(self) -> Literal["contiguous", "greedy"]: ...
    @property
    def context(self) -> Callable[[int], int] | None: ...
    @property
    def pinned(self) -> tuple[int, ...]: ...
    @property
    def history_len(self) -> int | None: ...
    @property
    def history_offset(self) -> int: ...
    @property
    def opaque_scale(self) -> float: ...
    @property
    def masking(self) -> Masking | None: ...

@final
class HistoryIndex:
    """Classified history of one conversation, extended between turns."""

    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    def extend(self, items: Iterable[Mapping[str, Any]]) -> None: ...
    def truncate(self, length: int) -> None: ...
    def clear(self) -> None: ...
    def _graph_copies(self) -> int: ...
    def _costs_counted(self) -> int: ...
    def _masked_counted(self) -> tuple[int, int, tuple[str, int] | None]: ...
    @property
    def snapshot_costs_dropped(self) -> str | None: ...
    def snapshot(self, *, bound_to: bytes | None = None) -> bytes: ...
    @staticmethod
    def from_snapshot(data: bytes, *, bound_to: bytes | None = None) -> HistoryIndex: ...
    def pack(
        self,
        history: list[Any],
        new_input: Iterable[Mapping[str, Any]],
        options: PackOptions,
        count_store: Any = None,
    ) -> _PackDict: ...
    def window(
        self,
        new_items: Iterable[Mapping[str, Any]],
        budget: int,
        options: PackOptions,
        new_input: int = 0,
    ) -> tuple[int, bool, str | None, str | None, int]: ...
    def user_positions(self, start: int, end: int) -> list[int]: ...
    def cost_over(
        self,
        history: list[Any],
        appended: Iterable[Mapping[str, Any]],
        limit: int,
        options: PackOptions,
    ) -> tuple[int, bool]: ...
    def count_window(
        self,
        history: list[Any],
        budget: int,
        options: PackOptions,
        count_store: Any = None,
    ) -> tuple[int, list[tuple[bytes, int]] | None]: ...  # start, new_counts (with a store)
