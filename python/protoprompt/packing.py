"""Token counting and budget packing: the typed Python face of the Rust core.

The values live in private modules by job (``_packing/``: ``_types``, ``_result``, ``_run``,
``_history_index``; and ``_tokens``); this module is their public face and runs
:func:`pack` and :func:`analyze`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from . import _core
from ._packing._history_index import HistoryIndex
from ._packing._result import PackResult
from ._packing._run import (
    OPAQUE_SCALE_MAX,
    OPAQUE_SCALE_MIN,
    PackOptions,
    checked_store,
    max_tokens_of,
    options_of,
    run_pack,
)
from ._packing._types import MIN_EXCERPT_TOKENS as MIN_EXCERPT_TOKENS
from ._packing._types import (
    Decisions,
    FillStop,
    GraphReport,
    HistoryWindow,
    IndexUse,
    Item,
    ItemCost,
    Masking,
    PackTotals,
    Policy,
    Problem,
    Unit,
    UnitDecision,
    problems_of,
)
from ._tokens import (
    TRUNCATION_MARKER,
    as_list,
    available_encodings,
    count_tokens,
    count_tokens_batch,
    encoding_for_model,
    item_tokens,
    truncate_text,
)
from ._tokens import canonical_text as canonical_text
from ._tokens import preload as preload
from .count_store import CountStore

__all__ = [
    "OPAQUE_SCALE_MAX",
    "OPAQUE_SCALE_MIN",
    "TRUNCATION_MARKER",
    "Decisions",
    "FillStop",
    "GraphReport",
    "HistoryIndex",
    "HistoryWindow",
    "IndexUse",
    "ItemCost",
    "Masking",
    "PackOptions",
    "PackResult",
    "PackTotals",
    "Policy",
    "Problem",
    "Unit",
    "UnitDecision",
    "analyze",
    "available_encodings",
    "canonical_text",
    "count_tokens",
    "count_tokens_batch",
    "encoding_for_model",
    "item_tokens",
    "pack",
    "preload",
    "truncate_text",
]


def analyze(history: Iterable[Item], new_input: Iterable[Item]) -> GraphReport:
    """Split ``history ++ new_input`` into atomic units and report their validity."""
    raw, n_history, mandatory_history = _core.analyze(
        as_list(history, "history"), as_list(new_input, "new_input")
    )
    units = [
        Unit(
            members=members,
            positions=positions,
            kinds=kinds,
            valid=valid,
            input_only=input_only,
            contains_new=contains_new,
            problems=problems_of(problems),
        )
        for members, positions, kinds, valid, input_only, contains_new, problems in raw
    ]
    return GraphReport(units, n_history, mandatory_history)


def pack(
    history: Iterable[Item],
    new_input: Iterable[Item],
    max_tokens: int | None = None,
    *,
    options: PackOptions | None = None,
    budget: int | None = None,
    output_reserve: int = 0,
    context_tokens: int = 0,
    model: str | None = None,
    encoding: str | None = None,
    policy: Policy = "contiguous",
    context: Callable[[int], int] | None = None,
    count_store: CountStore | None = None,
    pinned: Iterable[int] = (),
    history_len: int | None = None,
    opaque_scale: float = 1.0,
    masking: Masking | None = None,
) -> PackResult:
    """Fit ``history`` into ``max_tokens`` after reserving ``new_input`` whole.

    ``options``: a :class:`PackOptions` holding ``max_tokens`` and every keyword below but
    ``count_store`` (made once, e.g. a builder's :attr:`~protoprompt.\
TokenBudgetedContextBuilder.pack_options`), instead of them. ``budget`` is the old name of
    ``max_tokens``, accepted until 1.1 with a ``DeprecationWarning``.

    Reserved first, all or nothing: ``new_input``, the history graph it completes (the tail
    dependency, when it starts with a tool output), ``output_reserve`` and
    ``context_tokens``. ``context``, when given, is then called once with the tokens still
    free and returns how many of them the caller's own context (system prompt, recalled
    memory) takes; history gets the rest. Then the newest history units are added while they
    fit. A unit (a call with its outputs, reasoning with its follower, a program with its
    children…) is kept whole or dropped whole; invalid units and input-only controls are
    never sent. The kept history starts at a user message: when the fill stops inside a turn,
    the newer units of that turn are dropped too (``turn_incomplete``), unless the turn's
    user message is mandatory. ``count_store`` (e.g. a :class:`~protoprompt.SQLiteCountStore`)
    keeps token counts across processes; the result is the same with or without it.
    ``pinned`` lists history positions that are mandatory like ``new_input`` (their units
    are reserved whole and reported as ``mandatory``): a per-call model filter pins the
    context message and the run's own input, and fills the items between them and the
    newest step as optional history. ``history_len`` uses only the first ``history_len``
    items of the ``history`` list (no copy of a long prefix). ``opaque_scale`` calibrates the
    opaque part of item costs (the ``encrypted_content`` of reasoning and compaction items,
    by decoded size): a factor between 0.25 and 2 of the rule, normally learned from the
    provider's own counts (:class:`~protoprompt.Calibration`); text, media and overhead are
    never scaled.

    ``masking`` (a :class:`Masking`; default ``None``, off): units older than those that fit
    whole are kept with their tool outputs cut to short excerpts before anything is dropped
    (decision ``"masked"``). The masked outputs in ``items`` are new copies; the caller's
    items are never changed.

    Raises:
        TokenBudgetExceededError: the reserved part alone exceeds ``max_tokens``.
        InvalidNewInputError: ``new_input`` cannot be sent as given (the message names each
            offending item and rule).
        InvalidItemError: an item is malformed (the message names the item and field).
        TypeError: ``count_store`` does not implement :class:`~protoprompt.CountStore`.
        ConflictingArgumentsError: ``max_tokens`` and ``budget`` are both given, or
            ``options`` and a keyword it holds.
    """
    options = options_of(
        "pack",
        options,
        max_tokens_of("pack", max_tokens, budget),
        {
            "output_reserve": output_reserve,
            "context_tokens": context_tokens,
            "model": model,
            "encoding": encoding,
            "policy": policy,
            "context": context,
            "pinned": pinned,
            "history_len": history_len,
            "opaque_scale": opaque_scale,
            "masking": masking,
        },
    )
    # A throw-away index: the core classifies a long history chunk by chunk into it.
    return run_pack(
        _core.HistoryIndex().pack,
        history,
        new_input,
        options,
        checked_store(count_store),
        indexed=False,
    )
