"""Type stubs for the native module ``protoprompt._core`` (Rust, PyO3).

Use the typed wrappers in :mod:`protoprompt` instead of calling this module directly.
"""

from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias, TypedDict, final

from typing_extensions import NotRequired

from protoprompt.packing import _PackOptions

__all__ = [
    "DEFAULT_ENCODING",
    "ITEM_OVERHEAD",
    "DecisionTable",
    "HistoryIndex",
    "_build_is_held",
    "_clear_count_cache",
    "_fail_next_counts",
    "_hold_next_build_until_fork",
    "_lazy_commit_allocator",
    "analyze",
    "available_encodings",
    "canonical_text",
    "count_tokens",
    "count_tokens_batch",
    "encoding_for_model",
    "is_preloaded",
    "item_tokens",
    "preload",
    "split_tokens",
]

DEFAULT_ENCODING: str
ITEM_OVERHEAD: int

_Problem: TypeAlias = tuple[str, str, str]

class _UnitDict(TypedDict):
    members: list[str]
    positions: list[int]
    kinds: list[str]
    valid: bool
    input_only: bool
    contains_new: bool
    problems: list[_Problem]

class _GraphDict(TypedDict):
    units: list[_UnitDict]
    n_history: int
    mandatory_history: list[int]

@final
class DecisionTable:
    """Per-unit decisions of one pack, kept in Rust."""

    def __len__(self) -> int: ...
    def row(self, i: int) -> tuple[int, list[int], list[str], str, int | None, list[_Problem]]: ...
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
    policy: str
    decisions: DecisionTable
    items: list[Any]
    new_counts: NotRequired[list[tuple[bytes, int]]]  # only with count_store
    store_hits: NotRequired[int]  # only with count_store
    index: tuple[int, int, int, str | None]  # held, appended, regrouped from, why

def count_tokens(text: str, *, model: str | None = None, encoding: str | None = None) -> int: ...
def count_tokens_batch(
    texts: list[str], *, model: str | None = None, encoding: str | None = None
) -> list[int]: ...
def split_tokens(
    text: str, head: int, tail: int, *, model: str | None = None, encoding: str | None = None
) -> tuple[str, str, int, bool]: ...
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
) -> tuple[int, int, int]: ...
def canonical_text(item: Mapping[str, Any]) -> str: ...
def analyze(
    history: Iterable[Mapping[str, Any]], new_input: Iterable[Mapping[str, Any]]
) -> _GraphDict: ...

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
    def snapshot(self, *, bound_to: bytes | None = None) -> bytes: ...
    @staticmethod
    def from_snapshot(data: bytes, *, bound_to: bytes | None = None) -> HistoryIndex: ...
    def pack(
        self,
        history: list[Any],
        new_input: Iterable[Mapping[str, Any]],
        options: _PackOptions,
        count_store: Any = None,
    ) -> _PackDict: ...
    def window(
        self,
        new_items: Iterable[Mapping[str, Any]],
        budget: int,
        *,
        model: str | None = None,
        encoding: str | None = None,
        new_input: int = 0,
    ) -> tuple[int, bool, str | None, str | None, int]: ...
    def count_window(
        self,
        history: list[Any],
        budget: int,
        *,
        model: str | None = None,
        encoding: str | None = None,
        history_offset: int = 0,
        count_store: Any = None,
    ) -> dict[str, Any]: ...
