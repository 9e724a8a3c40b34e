"""The background job that indexes the rows one turn evicted in the memory store's
``history`` layer (run in the evictions' worker thread)."""

from __future__ import annotations

import bisect
import logging
from array import array
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from .._context._blocks import passage_pieces
from ..memory import HistoryRecord, MemoryScope
from ..transcript import render_item, tool_names
from ._ledger import POSITION_SHIFT, Ledger, item_digest, position_key

BATCH = 256
"""Rows indexed per store call."""
WARM_ROWS = 1024
"""Rows of one job whose passages' pieces are counted ahead (at most; the first ones)."""

_log = logging.getLogger("protoprompt")


DATE_FIELDS = ("created_at", "timestamp", "date")
"""Fields of a history item read as the time it was said (the first one that is a time):
seconds since the epoch, or an ISO 8601 date or date and time."""


def date_of(item: Any) -> str | None:
    """When ``item`` was said, as ``YYYY-MM-DD`` or ``YYYY-MM-DD HH:MM`` (UTC for epoch
    seconds and for times with an offset), when the item carries it (:data:`DATE_FIELDS`)."""
    if not isinstance(item, dict):
        return None
    for name in DATE_FIELDS:
        value = item.get(name)
        when: datetime | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                when = datetime.fromtimestamp(float(value), tz=timezone.utc)
            except (OverflowError, OSError, ValueError):
                continue
        elif isinstance(value, str) and 8 <= len(value) <= 40:
            try:
                when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
            except ValueError:
                continue
            if len(value.strip()) <= 10:
                return when.strftime("%Y-%m-%d")
        if when is not None:
            if when.tzinfo is not None:
                when = when.astimezone(timezone.utc)
            return when.strftime("%Y-%m-%d %H:%M")
    return None


def turn_of(users: Sequence[int] | None, p: int) -> int | None:
    return None if users is None else bisect.bisect_right(users, p)


class IndexJob:
    """Render and index the rows one turn evicted (in the worker thread)."""

    def __init__(
        self,
        store: Any,
        ledger: Ledger,
        session_id: str,
        scope: MemoryScope,
        evicted: list[int],
        span: tuple[int, int, set[int]],
        offset: int,
        items: list[Any],
        ids: tuple[dict[int, int], array[int]] | None,
        fetch: Callable[[list[int]], dict[int, Any]] | None,
        users: Sequence[int] | None,
        warm: Callable[[list[str], int | None], None] | None = None,
    ) -> None:
        self.store = store
        self.ledger = ledger
        self.session_id = session_id
        self.scope = scope
        self.evicted = evicted
        self.span = span
        self.offset = offset
        self.items = items
        self.ids = ids
        self.fetch = fetch
        self.users = users
        self.warm = warm
        """Told the passages indexed (see :meth:`warm_up`)."""

    def positions(self) -> list[int]:
        start, end, kept = self.span
        return sorted({*self.evicted, *(p for p in range(start, end) if p not in kept)})

    def run(self) -> None:
        store = self.store
        positions = self.positions()
        if not positions:
            return
        names = tool_names(self.items)
        todo, missing = (
            self._by_position(positions) if self.ids is None else self._by_row_id(positions)
        )
        if missing:
            if self.fetch is None:
                raise RuntimeError("rows before the window cannot be read")
            found = self.fetch([key for _, key in missing])
            names.update(tool_names(found.values()))
            todo.extend(
                (p, key, found[key], item_digest(found[key])) for p, key in missing if key in found
            )
            todo.sort(key=lambda t: t[0])
        records = self._records(todo, names)
        for i in range(0, len(records), BATCH):
            store.index_history(self.session_id, records[i : i + BATCH], scope=self.scope)
        self.warm_up(records)

    def warm_up(self, records: Sequence[HistoryRecord]) -> None:
        """Hand the pieces of the passages just indexed (:func:`passage_pieces`) and the
        session's turn number to :attr:`warm`: the builder counts them now, off the
        request's path, as a turn that recalls them would, and the pieces of the ages a
        passage can have by then; the turn then finds the counts in the count memo. A
        failure there only loses the head start."""
        passages = getattr(self.store, "_passages", None)
        if self.warm is None or passages is None or not records:
            return
        try:
            texts: list[str] = []
            for r in records[:WARM_ROWS]:
                label, date = r.metadata.get("label"), r.metadata.get("date")
                label = label if isinstance(label, str) else ""
                date = date if isinstance(date, str) else ""
                for p in passages(r.text):
                    texts.extend(passage_pieces(p, label, date))
            self.warm(texts, None if self.users is None else len(self.users) + 1)
        except Exception as exc:  # noqa: BLE001 - the turn counts them instead
            _log.debug("protoprompt: recalled passages not counted ahead: %s", exc)

    def _by_row_id(
        self, positions: list[int]
    ) -> tuple[list[tuple[int, int, Any, str | None]], list[tuple[int, int]]]:
        """The rows to index (position, key, item, digest), and those before the window
        the store does not hold (position, row id), for rows keyed by their row ids."""
        keys = self._keys(positions)
        stored = self.store.history_rows(
            self.session_id, scope=self.scope, start=min(keys), end=max(keys) + 1
        )
        todo: list[tuple[int, int, Any, str | None]] = []
        missing: list[tuple[int, int]] = []
        for p, key in zip(positions, keys, strict=True):
            if p >= self.offset:
                item = self.items[p - self.offset]
                digest = item_digest(item)
                if stored.get(key) != digest:
                    todo.append((p, key, item, digest))
            elif key not in stored:  # a row id's content never changes
                missing.append((p, key))
        return todo, missing

    def _by_position(
        self, positions: list[int]
    ) -> tuple[list[tuple[int, int, Any, str | None]], list[tuple[int, int]]]:
        """The same for rows keyed by position (:func:`position_key`): a row is held when
        the store has its position with its content; one before the window, when the store
        has any record at its position."""
        stored = self.store.history_rows(
            self.session_id,
            scope=self.scope,
            start=position_key(positions[0], None),
            end=position_key(positions[-1] + 1, None),
        )
        at = {key >> POSITION_SHIFT for key in stored}
        todo: list[tuple[int, int, Any, str | None]] = []
        missing: list[tuple[int, int]] = []
        for p in positions:
            if p >= self.offset:
                item = self.items[p - self.offset]
                digest = item_digest(item)
                key = position_key(p, digest)
                if stored.get(key) != digest:
                    todo.append((p, key, item, digest))
            elif p not in at:
                missing.append((p, p))
        return todo, missing

    def _keys(self, positions: list[int]) -> list[int]:
        """The row ids of ``positions``."""
        assert self.ids is not None
        held, span = self.ids
        start = self.span[0]
        return [held[p] if p in held else int(span[p - start]) for p in positions]

    def _records(
        self, todo: list[tuple[int, int, Any, str | None]], names: dict[str, str]
    ) -> list[HistoryRecord]:
        """The rendered rows to index (rows with no text are left out)."""
        records = []
        for p, key, item, digest in todo:
            rendered = render_item(item, names)
            if rendered is None or not rendered.text.strip():
                continue
            meta: dict[str, Any] = {"label": rendered.label, "position": p}
            turn = turn_of(self.users, p)
            if turn is not None:
                meta["turn"] = turn
            date = date_of(item)
            if date is not None:
                meta["date"] = date
            records.append(HistoryRecord(key, rendered.text, meta, digest))
        return records
