"""A session's read of its whole history (or its latest ``limit`` items) that is not a token
window: the inner session's own read, with the keys of the rows compared with the index
when the history lives in a store, while a stored snapshot of the index loads."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from .._sdk._shims import call
from .._stores import _sync
from .._stores._store import StoreReadError
from ._window import Refused

if TYPE_CHECKING:
    from .._stores._snapshots import IndexState
    from .._stores._store import HistoryStore

_log = logging.getLogger("protoprompt")


async def read_history(
    state: IndexState,
    store: HistoryStore | None,
    inner: Any,
    session_id: str,
    *,
    limit: int | None,
    wrapper: Any,
    limited: bool,
    refused: Refused,
    epoch: int,
    has_store: bool,
) -> tuple[list[Any], _sync.ReadFacts]:
    """The items and the facts of the read (see ``_sync.ReadFacts``). ``store``: read the rows
    through it (``None``: through ``inner.get_items``, with ``limit``); ``has_store``: the
    session has one; ``refused``: why the read is not a token window; ``epoch``: the
    state's epoch before the read."""
    restorer: threading.Thread | None = None
    restored: list[tuple[str, str | None] | None] = []
    if not state.restore_tried and not limited:
        # A stored index snapshot loads while the history is read (another thread).
        restorer = threading.Thread(
            target=lambda: restored.append(state.restore()),
            name="protoprompt-restore",
            daemon=True,
        )
        restorer.start()
    seen: _sync.Seen | None = None
    try:
        if store is not None:
            # The inner session's own read, with the keys of the rows (see _sync),
            # compared with the index while the rows are at hand (in a worker thread).
            monotone = store.monotone

            def look(rows: _sync.Rows) -> _sync.Seen | None:
                return state.compare(rows, restorer, monotone=monotone)

            try:
                items, seen = await store.read(look)
            except StoreReadError as exc:
                _log.debug("protoprompt: rows of %r not read: %s", session_id, exc)
                refused = Refused("read_failed", str(exc), refused.snapshot)
                items = await call(inner.get_items, wrapper=wrapper)
        elif limit is None:
            items = await call(inner.get_items, wrapper=wrapper)
        else:
            items = await call(inner.get_items, limit, wrapper=wrapper)
    finally:
        if restorer is not None and restorer.is_alive():
            await asyncio.to_thread(restorer.join)
    snapshot = refused.snapshot or next((r for r in restored if r is not None), None)
    facts = _sync.ReadFacts(
        len(items),
        limited,
        epoch,
        has_store,
        seen,
        no_window=(refused.code, refused.detail),
        snapshot=snapshot,
    )
    return items, facts
