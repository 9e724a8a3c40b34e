"""The packing options travel as one checked value from the public keywords to the core."""

from __future__ import annotations

import inspect

import pytest

import protoprompt as pp
from protoprompt import _core
from protoprompt._packing._run import PackOptions as _PackOptions

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
    fields = set(_PackOptions.FIELDS)
    # ``options`` is the value itself, ``budget`` the old name of ``max_tokens``.
    aliases = {"options", "budget"}
    free = set(inspect.signature(pp.pack).parameters) - {"history", "new_input", "count_store"}
    free -= aliases
    method = set(inspect.signature(pp.HistoryIndex.pack).parameters) - {
        "self",
        "history",
        "new_input",
    }
    method -= aliases
    assert free == fields - {"history_offset"}
    assert method == fields


def test_options_are_checked_once_and_frozen() -> None:
    pins = (p for p in [2, 0])  # a generator is read once, when the options are made
    options = _PackOptions(100, pinned=pins)
    assert options.pinned == (2, 0)
    with pytest.raises(AttributeError):
        options.max_tokens = 5  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_tokens must be >= 0"):
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


def test_max_tokens_is_the_budget_and_budget_its_deprecated_alias() -> None:
    """One name for the budget: ``max_tokens`` everywhere; ``budget`` is accepted with a
    ``DeprecationWarning`` and gives the same result; both at once is a clear error."""
    new = pp.pack(HISTORY, NEW, max_tokens=60)
    with pytest.warns(DeprecationWarning, match="budget= is now called max_tokens="):
        old = pp.pack(HISTORY, NEW, budget=60)
    assert (old.used, old.kept_history, old.max_tokens) == (new.used, new.kept_history, 60)
    with pytest.raises(pp.errors.ConflictingArgumentsError, match="max_tokens or its old name"):
        pp.pack(HISTORY, NEW, 60, budget=60)
    with pytest.raises(ValueError, match="not both"):  # a ValueError (and a TypeError)
        pp.HistoryIndex().pack(HISTORY, NEW, max_tokens=60, budget=60)
    with pytest.raises(TypeError, match="missing required argument: 'max_tokens'"):
        pp.pack(HISTORY, NEW)
    index = pp.HistoryIndex()
    index.extend(HISTORY)
    with pytest.warns(DeprecationWarning):
        assert index.window_start([], budget=20) == index.window_start([], 20)
    with pytest.warns(DeprecationWarning):
        assert index.count_window(HISTORY, budget=20) == index.count_window(HISTORY, 20)
    with pytest.warns(DeprecationWarning, match="plan_prefix"):
        old_plan = pp.plan_prefix(HISTORY, NEW, budget=100)
    assert old_plan.request == pp.plan_prefix(HISTORY, NEW, max_tokens=100).request
    with pytest.raises(pp.errors.ConflictingArgumentsError):
        pp.plan_prefix(HISTORY, NEW, max_tokens=100, budget=100)


def test_result_attributes_keep_budget_as_an_alias() -> None:
    result = pp.pack(HISTORY, NEW, 10**6)
    with pytest.warns(DeprecationWarning, match=r"PackResult.budget is now called"):
        assert result.budget == result.max_tokens == 10**6
    with pytest.warns(DeprecationWarning):
        assert result.totals.budget == result.totals.max_tokens == 10**6
    with pytest.warns(DeprecationWarning):
        assert result.sections.budget == result.sections.max_tokens == 10**6
    with pytest.raises(pp.TokenBudgetExceededError) as info:
        pp.pack([], NEW, 3)
    with pytest.warns(DeprecationWarning):
        assert info.value.budget == info.value.max_tokens == 3


def test_one_options_value_replaces_the_keywords() -> None:
    """Every pack and index method takes the one options value instead of its keywords,
    with the same result; it is checked when made, and ``replace`` checks what changes."""
    options = _PackOptions(10**6, output_reserve=7, encoding="cl100k_base", pinned=[0])
    by_keywords = pp.pack(HISTORY, NEW, 10**6, output_reserve=7, encoding="cl100k_base", pinned=[0])
    by_value = pp.pack(HISTORY, NEW, options=options)
    assert (by_value.used, by_value.kept_history) == (by_keywords.used, by_keywords.kept_history)
    index = pp.HistoryIndex()
    got = index.pack(HISTORY, NEW, options=options)
    assert (got.used, got.kept_history) == (by_keywords.used, by_keywords.kept_history)
    assert index.window([], options=options.replace(max_tokens=20)) == index.window(
        [], 20, encoding="cl100k_base"
    )
    assert index.cost_over(HISTORY, 5, options=options) == index.cost_over(
        HISTORY, 5, encoding="cl100k_base"
    )
    assert index.count_window(HISTORY, 20, options=options) == index.count_window(
        HISTORY, 20, encoding="cl100k_base"
    )
    with pytest.raises(pp.errors.ConflictingArgumentsError, match="got max_tokens, model"):
        pp.pack(HISTORY, NEW, 5, options=options, model="gpt-5")
    with pytest.raises(TypeError, match="options must be a PackOptions"):
        pp.pack(HISTORY, NEW, options={"max_tokens": 5})  # type: ignore[arg-type]
    # replace: a new frozen value; the old one is unchanged; a bad field is refused.
    smaller = options.replace(max_tokens=50, masking=pp.Masking())
    assert (smaller.max_tokens, options.max_tokens) == (50, 10**6)
    assert smaller.masking == pp.Masking() and options.masking is None
    assert smaller.pinned == (0,) and smaller.resolved_encoding == "cl100k_base"
    with pytest.raises(ValueError, match="opaque_scale must be between"):
        options.replace(opaque_scale=9.0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'budget'"):
        options.replace(budget=5)  # type: ignore[call-arg]
    with pytest.raises(pp.UnknownModelError):
        options.replace(model="no-such-model", encoding=None)


def test_the_builder_holds_one_options_value() -> None:
    builder = pp.TokenBudgetedContextBuilder(
        None, max_tokens=5_000, model="gpt-5", output_reserve=100, policy="greedy"
    )
    options = builder.pack_options
    assert isinstance(options, _PackOptions)
    assert (options.max_tokens, options.output_reserve, options.policy) == (5_000, 100, "greedy")
    assert (builder.max_tokens, builder.encoding, builder.masking) == (
        5_000,
        "o200k_base",
        pp.Masking(),
    )
    plan = builder.build(HISTORY, NEW)
    assert plan.max_tokens == 5_000 and plan.pack.policy == "greedy"
    assert builder.pack_options is options  # each build packs with a copy of its own


def test_the_core_borrows_the_value_and_reads_no_attributes_by_name() -> None:
    """The binding takes the compiled value itself: an object that merely has the same
    attributes (what the core used to read by name on every call) is refused."""
    from types import SimpleNamespace

    options = _PackOptions(100)
    look_alike = SimpleNamespace(**{name: getattr(options, name) for name in options.FIELDS})
    with pytest.raises(TypeError):
        _core.HistoryIndex().pack(list(HISTORY), list(NEW), look_alike)  # type: ignore[arg-type]
    index = _core.HistoryIndex()
    with pytest.raises(TypeError):
        index.window([], 10, look_alike)  # type: ignore[arg-type]
    assert index.window([], 10, options)[0] == 0
