"""The classified history of one conversation, kept between turns (:class:`HistoryIndex`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .. import _core
from .._tokens import as_list
from ..count_store import CountStore
from ._result import PackResult
from ._run import PackOptions, checked_store, max_tokens_of, options_of, run_pack
from ._types import MAX_TOKENS, HistoryWindow, Item, Masking, Policy


class HistoryIndex:
    """The classified history of one conversation, kept between turns.

    :func:`pack` reads every history item on every call. A ``HistoryIndex`` remembers the
    items it has seen (their graph fields and the item graph), so the next turn's pack costs
    the items that are new plus the ones that are kept, not the whole history: at 100k items
    a warm turn takes milliseconds instead of hundreds of milliseconds. The result is exactly
    that of :func:`pack` (tested).

    The contract: the first ``len(index)`` items of every ``history`` passed to :meth:`pack`
    are the items the index has already seen, unchanged and in order (items appended since
    are picked up automatically). After removing or rewriting history, call
    :meth:`truncate` or :meth:`clear`. :class:`~protoprompt.integrations.agents.\
ProtoPromptSession` keeps its index in step with the session store for you.

    One index serves one conversation and is not meant to be used from two threads at once.
    Results may be kept: a result's ``decisions`` read the index's item graph until the index
    next changes, and then keep a compact copy of their own rows.

    Args:
        count_store: where token counts outlive the process (e.g. a
            :class:`~protoprompt.SQLiteCountStore`): counts of long texts the process has not
            seen are read from it before tokenising, and new ones are written to it, so a
            restarted process does not tokenise its history again. Results are identical
            with and without a store (tested).

    Raises:
        TypeError: ``count_store`` does not implement :class:`~protoprompt.CountStore`.
    """

    __slots__ = ("_index", "count_store")

    def __init__(self, *, count_store: CountStore | None = None) -> None:
        self._index = _core.HistoryIndex()
        self.count_store = checked_store(count_store)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"<HistoryIndex: {len(self)} items>"

    @property
    def snapshot_costs_dropped(self) -> str | None:
        """Why the token costs of the snapshot this index was loaded from were not reused
        (they were counted under an earlier cost rule, e.g. before opaque payloads were
        costed by their decoded size), or its masked costs (counted under another masking
        or cost rule): ``None`` when they were, or when the index was not loaded from a
        snapshot. The items and graph of such a snapshot are reused."""
        return self._index.snapshot_costs_dropped

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the index, in bytes (about 0.23 KB per item; measured
        sizes are in benches/README.md)."""
        return self._index.nbytes

    def extend(self, items: Iterable[Item]) -> None:
        """Append history items (classified now; their tokens are counted when needed)."""
        self._index.extend(as_list(items, "items"))

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` items (after ``pop_item`` or a rewrite)."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        self._index.truncate(min(length, len(self._index)))

    def clear(self) -> None:
        """Forget every item."""
        self._index.clear()

    def snapshot(self, *, bound_to: bytes = b"") -> bytes:
        """The index as bytes, for :meth:`from_snapshot` in this or a later process.

        It holds the items' graph fields (ids, call ids, types, statuses — no message text,
        arguments or outputs), the item graph and the token costs counted so far (masked
        costs of tool outputs included, so a token window found after a restart is the
        warm index's), behind a checksum. Loading it costs a fraction of reading the history
        again (about 0.14 KB per item: 14 MB at 100k items; measured sizes are in
        benches/README.md).
        ``bound_to`` names what the items are (e.g. the database, the session and the rows
        they were read from): :meth:`from_snapshot` loads the snapshot
        only for the same bytes, so a snapshot put in the wrong place is refused instead of
        describing the wrong history.

        The checksum finds accidents (a cut or damaged blob, a snapshot of something else),
        not forgeries: whoever can write where snapshots are kept can also write the
        history they describe.
        """
        if not isinstance(bound_to, bytes):
            raise TypeError(f"bound_to must be bytes, got {type(bound_to).__name__}")
        return self._index.snapshot(bound_to=bound_to)

    @classmethod
    def from_snapshot(
        cls, data: bytes, *, count_store: CountStore | None = None, bound_to: bytes = b""
    ) -> HistoryIndex:
        """An index loaded from :meth:`snapshot`'s bytes, written with the same ``bound_to``.

        The same contract holds as for the index that wrote it: the history passed to
        :meth:`pack` must start with the items it had seen, unchanged (:meth:`truncate` it
        first if the history has lost items since).

        Raises:
            TypeError: ``data`` or ``bound_to`` is not bytes.
            SnapshotError: ``data`` is damaged, not a snapshot, written by another
                version of protoprompt, or taken for another ``bound_to``; build the index
                from the history instead.
        """
        if not isinstance(data, bytes):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        if not isinstance(bound_to, bytes):
            raise TypeError(f"bound_to must be bytes, got {type(bound_to).__name__}")
        index = cls(count_store=count_store)
        index._index = _core.HistoryIndex.from_snapshot(data, bound_to=bound_to)
        return index

    def pack(
        self,
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
        pinned: Iterable[int] = (),
        history_len: int | None = None,
        history_offset: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> PackResult:
        """:func:`pack` for a ``history`` that extends what this index has seen.

        Items after the first ``len(self)`` are classified and added to the index first.
        Raises :class:`~protoprompt.errors.HistoryMismatchError` (a ``ValueError``) when
        ``history`` is shorter than the index (call :meth:`truncate` or :meth:`clear` after
        removing items), and the errors of
        :func:`pack`. A failed call changes nothing: the index holds what it held before
        (only token counts it made stay cached).

        ``options``: a :class:`~protoprompt.packing.PackOptions` instead of ``max_tokens`` and
        the keywords (as in :func:`pack`); ``budget``: the old name of ``max_tokens``.

        ``history_len``: only the first ``history_len`` items of the ``history`` list are the
        history (the rest is ignored), so a caller holding one long list — a model filter
        whose input is history plus the newest step — need not copy its prefix.

        ``history_offset``: the ``history`` list holds the history from that position on
        (a windowed read from :meth:`window_start`); the positions before it must be
        indexed. The result is the pack of the whole history; an
        :class:`~protoprompt.errors.InvalidItemError` names the first earlier item the pack
        would need, if any.

        ``masking``: as in :func:`pack`; the masked costs of tool outputs are kept between
        turns too (for one encoding and ``excerpt_tokens``), and in :meth:`snapshot`.
        """
        where = "HistoryIndex.pack"
        options = options_of(
            where,
            options,
            max_tokens_of(where, max_tokens, budget),
            {
                "output_reserve": output_reserve,
                "context_tokens": context_tokens,
                "model": model,
                "encoding": encoding,
                "policy": policy,
                "context": context,
                "pinned": pinned,
                "history_len": history_len,
                "history_offset": history_offset,
                "opaque_scale": opaque_scale,
                "masking": masking,
            },
        )
        return run_pack(self._index.pack, history, new_input, options, self.count_store)

    def window_start(
        self,
        new_items: Iterable[Item],
        max_tokens: int | None = None,
        *,
        options: PackOptions | None = None,
        budget: int | None = None,
        model: str | None = None,
        encoding: str | None = None,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> int:
        """The first history position a contiguous :meth:`pack` within ``max_tokens`` tokens
        of history can cost or keep, for the history this index has seen followed by
        ``new_items`` (items appended to the history since, then the new input).

        Passing the history from there on (``history[start:]`` with
        ``history_offset=start``) packs to exactly the request of the whole history. It is
        moved back to where no unit, turn or tool-call relation crosses it. Costs not yet
        counted count as the smallest an item can cost, which only moves it earlier
        (:meth:`count_window` counts them). ``0`` when the whole history may be needed.
        The greedy policy has no such bound: pack the whole history for it. Pass the
        ``opaque_scale`` the pack will use (costs counted under another count as unknown).
        For a pack with ``masking``, pass the same ``masking``: a tool output then counts at
        most its masked cost, so the window reaches the older units a masked pack may keep.

        ``options``: a :class:`~protoprompt.packing.PackOptions` whose ``model``,
        ``encoding``, ``opaque_scale`` and ``masking`` are used instead of those keywords
        (``max_tokens``, when not given, is its ``max_tokens``); ``budget``: the old name of
        ``max_tokens``.
        """
        max_tokens = max_tokens_of("HistoryIndex.window_start", max_tokens, budget)
        return self.window(
            new_items,
            max_tokens,
            options=options,
            model=model,
            encoding=encoding,
            opaque_scale=opaque_scale,
            masking=masking,
        ).start

    def window(
        self,
        new_items: Iterable[Item],
        max_tokens: int | None = None,
        *,
        options: PackOptions | None = None,
        budget: int | None = None,
        model: str | None = None,
        encoding: str | None = None,
        new_input: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> HistoryWindow:
        """:meth:`window_start`, with why the window does not start later: whether the
        budget reaches the oldest unit, and the relation that moved the start back last (the
        reason a window starting at 0 cannot be proved shorter). ``new_input``: how many of
        the last ``new_items`` are the new input (they are named ``new_input[i]`` in
        ``reason``; the others are history appended since the index last saw it).
        ``options`` and ``budget``: as in :meth:`window_start`."""
        where = "HistoryIndex.window"
        limit, options = _cost_options(
            where,
            options,
            max_tokens_of(where, max_tokens, budget),
            model=model,
            encoding=encoding,
            opaque_scale=opaque_scale,
            masking=masking,
        )
        items = as_list(new_items, "new_items")
        if isinstance(new_input, bool) or not isinstance(new_input, int) or new_input < 0:
            raise ValueError(f"new_input must be a non-negative int, got {new_input!r}")
        start, fits, tie, reason, reach = self._index.window(
            items, limit, options, min(new_input, len(items))
        )
        return HistoryWindow(int(start), bool(fits), tie, reason, int(reach))

    def user_positions(self, start: int = 0, end: int | None = None) -> list[int]:
        """Positions of the user messages (where turns start) among the indexed positions
        ``start`` to ``end`` (default: the end of the index)."""
        for name, value in (("start", start), ("end", end)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        return self._index.user_positions(start, len(self) if end is None else end)

    def cost_over(
        self,
        history: Iterable[Item],
        limit: int,
        *,
        appended: Iterable[Item] = (),
        options: PackOptions | None = None,
        model: str | None = None,
        encoding: str | None = None,
        opaque_scale: float = 1.0,
    ) -> tuple[int, bool]:
        """Whether ``history`` -- exactly the items this index holds -- followed by
        ``appended`` (items stored since) costs more than ``limit`` tokens, and what the
        newest items cost up to where that was decided: ``(tokens, exceeded)``.

        Summed newest first under the same rule as :meth:`pack` (``opaque_scale`` as
        there; ``options``: a :class:`~protoprompt.packing.PackOptions` whose ``model``,
        ``encoding`` and ``opaque_scale`` are used instead of those keywords); costs the
        index has counted are reused and the others counted (and kept), and the walk stops
        once past ``limit``: a long history costs what its newest ``limit`` tokens cost, not
        all of it. Raises ``ValueError`` when ``history`` does not have the index's length,
        and :func:`pack`'s item errors."""
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if not 0 <= limit <= MAX_TOKENS:
            raise ValueError(f"limit must be between 0 and 2**64 - 1 tokens, got {limit}")
        _, options = _cost_options(
            "HistoryIndex.cost_over",
            options,
            limit,
            model=model,
            encoding=encoding,
            opaque_scale=opaque_scale,
        )
        return self._index.cost_over(
            as_list(history, "history"), as_list(appended, "appended"), limit, options
        )

    def count_window(
        self,
        history: Iterable[Item],
        max_tokens: int | None = None,
        *,
        options: PackOptions | None = None,
        budget: int | None = None,
        model: str | None = None,
        encoding: str | None = None,
        history_offset: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> int:
        """Count the token costs a later :meth:`window_start` with ``max_tokens`` walks over,
        so that it finds the window from exact costs; returns the window start for the
        history as indexed now. ``history`` holds the indexed history from
        ``history_offset`` on (exactly ``len(self) - history_offset`` items; earlier
        positions keep what they have). Counts go to the count store as in :meth:`pack`.
        With ``masking``, the masked costs are counted too (for a :meth:`window_start` with
        the same masking). ``options`` and ``budget``: as in :meth:`window_start`
        (``history_offset`` is this call's, never the options').
        """
        where = "HistoryIndex.count_window"
        limit, options = _cost_options(
            where,
            options,
            max_tokens_of(where, max_tokens, budget),
            model=model,
            encoding=encoding,
            opaque_scale=opaque_scale,
            masking=masking,
        )
        if options.history_offset != history_offset:
            options = options.replace(history_offset=history_offset)
        store = self.count_store
        start, new_counts = self._index.count_window(
            as_list(history, "history"), limit, options, store
        )
        if store is not None and new_counts:
            store.put_many(new_counts)
        return start


def _cost_options(
    where: str,
    options: PackOptions | None,
    max_tokens: int | None,
    **fields: Any,
) -> tuple[int, PackOptions]:
    """The budget and the options of a window or cost walk: ``options`` (``max_tokens``
    defaults to its own) or a value of the keywords ``fields``."""
    if options is None:
        made = options_of(where, None, max_tokens, fields)
        return made.max_tokens, made
    checked = options_of(where, options, None, fields)
    if max_tokens is None:
        return checked.max_tokens, checked
    return PackOptions(max_tokens).max_tokens, checked
