"""The packing options travel as one checked value from the public keywords to the core."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

import protoprompt as pp
from protoprompt import _core
from protoprompt._pack_run import PackOptions as _PackOptions

HISTORY = [
    {"role": "user", "content": "first question"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "second question"},
    {"role": "assistant", "content": "second answer"},
]
NEW = [{"role": "user", "content": "third question"}]


def test_the_public_keywords_are_the_options_fields() -> None:
    """``pack`` and ``HistoryIndex.pack`` keep their keyword signatures; each keyword is a
    field of the one options value (``count_store`` is the index's or the call's store, not
    an option)."""
    fields = {f.name for f in dataclasses.fields(_PackOptions)}
    free = set(inspect.signature(pp.pack).parameters) - {"history", "new_input", "count_store"}
    method = set(inspect.signature(pp.HistoryIndex.pack).parameters) - {
        "self",
        "history",
        "new_input",
    }
    assert free == fields - {"history_offset"}
    assert method == fields


def test_options_are_checked_once_and_frozen() -> None:
    pins = (p for p in [2, 0])  # a generator is read once, when the options are made
    options = _PackOptions(100, pinned=pins)
    assert options.pinned == (2, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.budget = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="budget must be >= 0"):
        _PackOptions(-1)
    with pytest.raises(TypeError, match=r"pinned\[0\] must be an int"):
        _PackOptions(10, pinned=["0"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="history_len"):
        _PackOptions(10, history_len=-1)
    with pytest.raises(ValueError, match="history_offset"):
        _PackOptions(10, history_offset=-2)


def test_the_core_takes_the_options_value_and_reads_each_field() -> None:
    options = _PackOptions(
        10**6, output_reserve=7, context_tokens=5, encoding="cl100k_base", pinned=[0]
    )
    raw = _core.HistoryIndex().pack(list(HISTORY), list(NEW), options)
    assert (raw["budget"], raw["output_reserve"], raw["context_tokens"]) == (10**6, 7, 5)
    assert raw["encoding"] == "cl100k_base" and raw["policy"] == "contiguous"
    assert raw["kept_history"] == [0, 1, 2, 3]
    # The same through the public keywords.
    got = pp.pack(
        HISTORY, NEW, 10**6, output_reserve=7, context_tokens=5, encoding="cl100k_base", pinned=[0]
    )
    assert (got.used, got.kept_history) == (raw["used"], raw["kept_history"])
    # A context callable and history_len travel in the value too.
    seen: list[int] = []

    def context(remaining: int) -> int:
        seen.append(remaining)
        return 3

    got = pp.pack(HISTORY, NEW, 10**6, context=context, history_len=2)
    assert len(seen) == 1 and got.context_tokens == 3 and got.kept_history == [0, 1]
    with pytest.raises(pp.UnknownModelError):
        _core.HistoryIndex().pack([], list(NEW), _PackOptions(100, model="no-such-model"))
    with pytest.raises(ValueError, match="policy"):
        _core.HistoryIndex().pack([], list(NEW), _PackOptions(100, policy="fastest"))  # type: ignore[arg-type]
