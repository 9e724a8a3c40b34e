"""Process-wide state in one place: the registries protoprompt keeps for the whole process,
the gate around its SQLite work, and what happens in a forked child and at exit.

A forked child inherits the parent's memory but none of its threads: a lock held at the
fork belonged to a thread that is gone, a background writer is not running, and SQLite
connections must not cross a fork (using or closing them in the child would corrupt or
unlock what the parent holds). So:

- every piece of protoprompt's SQLite work runs inside :func:`sqlite_gate` (any number of
  threads at once); ``os.fork`` closes the gate, waits until no thread is inside, forks, and
  the parent opens it again — a child never starts in the middle of SQLite work;
- in the child, every registry gets a new lock, and every tracked object (:class:`Tracked`)
  what its module says: new locks, no writer thread, no connection (the parent's are kept
  in :data:`INHERITED`, never used or closed);
- at exit, tracked objects with queued work finish it (bounded waits).

This module registers the only ``os.register_at_fork`` and ``atexit`` hooks of the package
(checked by ``tests/storage/test_process.py``); each registry below says who fills it.
"""

from __future__ import annotations

import atexit
import os
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = [
    "COUNT_STORE_READERS",
    "FILE_COUNT_STORES",
    "INDEX_STATES",
    "INHERITED",
    "IO_LOOPS",
    "POSTGRES_MEMORY_STORES",
    "PREFIX_STATES",
    "RECALL_LEDGERS",
    "RECALL_WORKERS",
    "REDIS_SERVERS",
    "REMOTE_COUNT_STORES",
    "ROW_READERS",
    "SERVED_BUILDERS",
    "SHARED_INDEXES",
    "SQLITE_BACKED",
    "SQLITE_COUNT_STORES",
    "SQLITE_MEMORY_STORES",
    "SQL_SERVERS",
    "ForkGate",
    "Registry",
    "Tracked",
    "WeakRegistry",
    "sqlite_gate",
]

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class ForkGate:
    """Threads inside SQLite (any number at once) and a fork (alone): ``with gate:`` around
    each piece of SQLite work; ``os.fork`` closes the gate, waits until no thread is inside,
    forks, and the parent opens it again (the child gets a new gate)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._cond:
            while self._forking:
                self._cond.wait()
            self._inside += 1

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._inside -= 1
            if not self._inside:
                self._cond.notify_all()

    @property
    def inside(self) -> int:
        """Threads inside the gate now."""
        with self._cond:
            return self._inside

    def close_for_fork(self) -> None:
        with self._cond:
            self._forking = True
            while self._inside:
                self._cond.wait()

    def open_after_fork(self) -> None:
        with self._cond:
            self._forking = False
            self._cond.notify_all()


_GATE = ForkGate()


def sqlite_gate() -> ForkGate:
    """The process-wide gate every piece of protoprompt's SQLite work runs inside (``with
    sqlite_gate():``), so that ``os.fork`` never happens in the middle of one."""
    return _GATE


class Tracked(Generic[T]):
    """The live objects of one kind (weakly held). The module that makes them says what a
    forked child does with each (:meth:`handle`) and what is finished at exit; trackers run
    in the order they are made in a child, in the reverse order at exit."""

    def __init__(self) -> None:
        self._objects: weakref.WeakSet[T] = weakref.WeakSet()
        self._after_fork: Callable[[T], None] | None = None
        self._at_exit: Callable[[T], None] | None = None
        _TRACKERS.append(self)

    def handle(
        self,
        *,
        after_fork: Callable[[T], None] | None = None,
        at_exit: Callable[[T], None] | None = None,
    ) -> None:
        """What a forked child does with each object (new locks, no thread, no connection)
        and what is finished at exit (bounded waits)."""
        self._after_fork = after_fork
        self._at_exit = at_exit

    def add(self, obj: T) -> None:
        self._objects.add(obj)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._objects))

    def _after_fork_in_child(self) -> None:
        if self._after_fork is not None:
            for obj in list(self._objects):
                self._after_fork(obj)

    def _finish_at_exit(self) -> None:
        if self._at_exit is not None:
            for obj in list(self._objects):
                self._at_exit(obj)


class Registry(Generic[K, V]):
    """A process-wide map (in insertion order) with its lock; the child of a fork gets a new
    lock, and each value what :meth:`handle` says."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: OrderedDict[K, V] = OrderedDict()
        self._after_fork: Callable[[V], None] | None = None
        _REGISTRIES.append(self)

    def handle(self, *, after_fork: Callable[[V], None] | None = None) -> None:
        """What a forked child does with each value."""
        self._after_fork = after_fork

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        if self._after_fork is not None:
            for value in list(self.items.values()):
                self._after_fork(value)


class WeakRegistry(Generic[K, V]):
    """A process-wide map whose values go when nothing else holds them, with its lock (new
    in the child of a fork)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: weakref.WeakValueDictionary[K, Any] = weakref.WeakValueDictionary()
        _REGISTRIES.append(self)

    def _after_fork_in_child(self) -> None:
        self.lock = threading.Lock()


_TRACKERS: list[Tracked[Any]] = []
_REGISTRIES: list[Registry[Any, Any] | WeakRegistry[Any, Any]] = []

INHERITED: list[sqlite3.Connection] = []
"""A fork parent's SQLite connections, kept alive in the child and never used or closed."""

# ------------------------------------------------------------------ the registries

SQLITE_COUNT_STORES: Tracked[Any] = Tracked()
"""Every ``SQLiteCountStore``: queued counts written at exit (``count_store``)."""
COUNT_STORE_READERS: Registry[int, weakref.ref[Any]] = Registry()
"""Count stores with an open reader connection, least recently used first (``count_store``)."""
REMOTE_COUNT_STORES: Tracked[Any] = Tracked()
"""Every ``RemoteCountStore`` (SQLAlchemy, Redis): queued counts written at exit."""
ROW_READERS: Tracked[Any] = Tracked()
"""Every SQLite ``RowReader`` of the session's history store (``integrations._stores._sync``)."""
INDEX_STATES: Tracked[Any] = Tracked()
"""Every session ``IndexState``: a snapshot write in flight finishes at exit
(``integrations._stores._snapshots``)."""
PREFIX_STATES: Tracked[Any] = Tracked()
"""Every stored session's prefix record (the per-call filter's and the session callback's):
a write in flight finishes at exit (``integrations._stores._prefix_state``, ``_turn_state``)."""
SHARED_INDEXES: Registry[Any, Any] = Registry()
"""The index pool: one ``IndexState`` per stored session, most recently used last
(``integrations.pool``)."""
FILE_COUNT_STORES: WeakRegistry[tuple[str, str], Any] = WeakRegistry()
"""One ``SQLiteCountStore`` per database file (``integrations.pool``)."""
SQL_SERVERS: Registry[str, Any] = Registry()
"""Per SQLAlchemy engine URL: its database's id, count secret and count store
(``integrations._stores._sqlalchemy_store``)."""
REDIS_SERVERS: Registry[tuple[str, ...], Any] = Registry()
"""Per Redis server and key prefix: the same (``integrations._stores._redis_store``)."""
SQLITE_BACKED: Registry[type[Any], type[Any]] = Registry()
"""Session classes made ``SQLiteSession`` subclasses (``integrations._sdk._posing``)."""
SERVED_BUILDERS: Registry[Any, list[tuple[weakref.ref[Any], Any]]] = Registry()
"""Per stored session (its pool key), the builders with recall or a summary that served it
and the scopes they were given, most recently served last; under ``None`` every such
builder (``integrations._turns._evicted``: what any session object's clear or pop forgets)."""
SQLITE_MEMORY_STORES: Tracked[Any] = Tracked()
"""Every SQLite engine of a ``MemoryStore``: new locks and connections in a forked child
(``memory._sqlite``)."""
POSTGRES_MEMORY_STORES: Tracked[Any] = Tracked()
"""Every PostgreSQL engine of a ``MemoryStore``: new locks in a forked child, which opens a
connection pool of its own on first use (``memory._postgres``)."""
RECALL_WORKERS: Tracked[Any] = Tracked()
"""The background threads that index evicted rows (``recall``): a new lock and queue, no
thread, in a forked child; queued jobs finish at exit (bounded)."""
RECALL_LEDGERS: Tracked[Any] = Tracked()
"""Every ``recall.Evictions``: new locks for its ledgers in a forked child."""
IO_LOOPS: Tracked[Any] = Tracked()
"""The I/O loop of the session's stores (``integrations._stores._io``)."""


# ------------------------------------------------------------------ fork and exit


def _before_fork() -> None:
    _GATE.close_for_fork()


def _after_fork_in_parent() -> None:
    _GATE.open_after_fork()


def _after_fork_in_child() -> None:
    global _GATE
    _GATE = ForkGate()
    for registry in _REGISTRIES:
        registry._after_fork_in_child()
    for tracker in _TRACKERS:
        tracker._after_fork_in_child()


def _at_exit() -> None:
    # Last made, first finished: snapshot writes before the counts they queued.
    for tracker in reversed(_TRACKERS):
        tracker._finish_at_exit()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_parent=_after_fork_in_parent,
        after_in_child=_after_fork_in_child,
    )
atexit.register(_at_exit)
