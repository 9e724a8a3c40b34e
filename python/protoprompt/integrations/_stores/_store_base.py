"""What the three history stores (:class:`._store.SQLiteStore`, ``_sqlalchemy_store`` and
``_redis_store``) share: the state a store keeps beside the history (its key, snapshots,
prefixes, turn state and why they are off), no-op rewrite hooks, closing, the one-time open
of a server-backed store, the checks before a store is opened over an SDK session, and the
errors a server read may raise.

Beneath every store, beside :mod:`._store_types`: :mod:`._store` picks a store and imports
the engines, and the engines import this module, one way.
"""

from __future__ import annotations

import asyncio
import threading

from .. import pool
from ._prefix_state import PrefixState, wait_all
from ._snapshots import SnapshotStore
from ._store_types import Unsupported, unsupported_override
from ._turn_state import TurnState

__all__ = ["StoreBase", "server_errors", "unreadable"]


class StoreBase:
    """The state and hooks every history store has (see ``_store.HistoryStore``): nothing
    kept beside the history until the store finds its database (:attr:`no_store` says
    why), rewrites that need no marking, and a close that waits for the states being
    stored. A store whose database is found on first use opens it once, in a worker
    thread (:meth:`open_once`)."""

    def __init__(self, no_store: str) -> None:
        self.key: pool.Key | None = None
        self.snapshots: SnapshotStore | None = None
        self.prefixes: PrefixState | None = None
        self.turns: TurnState | None = None
        self.no_store = no_store
        self._opened = False
        self._open_lock = threading.Lock()

    async def open(self) -> None:
        return None

    async def open_once(self) -> None:
        """:meth:`_open` once for the store's life, in a worker thread (other callers wait
        for the first; later calls return at once)."""
        if not self._opened:
            await asyncio.to_thread(self._open_locked)

    def _open_locked(self) -> None:
        with self._open_lock:
            if self._opened:
                return
            self._opened = True
            self._open()

    def _open(self) -> None:
        """Find the database and open what the store keeps beside the history (never
        raises: without it :attr:`no_store` says why)."""

    async def before_rewrite(self) -> None:
        return None

    async def after_rewrite(self) -> None:
        return None

    def close(self) -> None:
        wait_all(self.prefixes, self.turns)


def unreadable(inner: object, base: type[object], readable: bool) -> Unsupported | None:
    """Why ``inner`` (an instance of the SDK session class ``base``) has no store before its
    engine is looked at: a subclass that changes how the history is read or decoded, or an
    SDK session whose fields are not those protoprompt reads (``readable``)."""
    override = unsupported_override(inner, base)
    if override is not None:
        return override
    if not readable:
        return Unsupported("inner_session", f"this {base.__name__} is not one protoprompt knows")
    return None


def server_errors(*own: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The errors a read or write on a database server may raise: the client library's
    ``own`` ones, a broken connection and a timeout."""
    return (*own, OSError, asyncio.TimeoutError, TimeoutError)
