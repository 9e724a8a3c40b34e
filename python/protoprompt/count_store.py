"""Token counts kept on disk, so that a restarted process does not tokenise its history again.

A :class:`HistoryIndex` keeps every position's cost while the process lives. After a restart
(a deploy, a worker recycled, another worker serving the session) the first turn would count
every kept item again: at a 400k-token budget that is ~0.1 s of tokenising. A
:class:`SQLiteCountStore` keeps the counts of long texts (at least 256 bytes of an item's
canonical text) in a table of a SQLite database, content-addressed, so any process that
packs the same text under the same encoding reads the count back instead.

* **Key.** SipHash-1-3 (128 bits) of the encoding name and the text, keyed with a random
  secret stored once in the database (table ``protoprompt_meta``): texts never leave the
  core, and nobody who only chooses texts can craft two with one key.
* **Bounded.** At most ``max_entries`` counts (oldest written first out); a count dropped
  and needed again is counted and written again.
* **Off the request path.** Reads are one indexed query per batch of items; new counts are
  written by a short-lived background thread with its own connection. Write errors (a
  locked or read-only database) only lose cache entries, never a request; read errors count
  as misses.
* **Fork-safe.** SQLite must not be inside a call on any thread when the process forks (the
  child would inherit its mutexes and lock bookkeeping half-changed, and its first open
  could hang). Every store's SQLite work (a read, a write transaction, an open or close)
  runs inside one process-wide gate, and ``os.fork`` waits for the threads inside to leave
  (at most one statement or transaction, bounded by the 5 s busy timeout).
* **Checked.** Each row holds the count as written (no column affinity: SQLite never turns
  ``'12'`` or ``3.0`` into a count) and a keyed check of key and count (BLAKE2b under the
  secret), so a damaged, retyped or swapped row is a miss. The core also refuses counts no
  text of that length can have. These find accidents, not forgeries: whoever can write the
  database can write the history itself.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sqlite3
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol, TypeGuard, TypeVar, runtime_checkable

from . import _process
from ._meta import meta_value
from ._process import sqlite_gate
from ._storage.counts import COUNTS, SQLITE_COUNTS
from ._storage.dialect import SQLITE

__all__ = ["CountStore", "RemoteCountStore", "SQLiteCountStore"]

_log = logging.getLogger("protoprompt")

_TABLE = COUNTS.name
_COLUMNS = COUNTS.names
# `tokens` has no declared type, so no affinity: a value is stored exactly as written.
_CREATE_TABLE = COUNTS.create(SQLITE)[0]
_SECRET_ROW = "count_secret"
_REMEMBER_WRITTEN = 16_384  # recently written counts a store does not queue again


def _is_count(value: object) -> TypeGuard[int]:
    return type(value) is int and 0 <= value < 2**63


def _mac(secret: bytes, key: bytes, tokens: int) -> bytes:
    """The check stored beside a count: a keyed hash of the key and the count."""
    return hashlib.blake2b(key + tokens.to_bytes(8, "little"), digest_size=8, key=secret).digest()


@runtime_checkable
class CountStore(Protocol):
    """What :class:`~protoprompt.HistoryIndex` needs from a persistent count store.

    Keys are 16 bytes computed by the core from ``secret``, the encoding and an item's
    canonical text; values are that text's token count.
    """

    @property
    def secret(self) -> bytes:
        """16 random bytes, fixed for the store's lifetime."""
        ...

    def get_many(self, keys: Sequence[bytes]) -> list[int | None]:
        """The stored count of each key, ``None`` where there is none."""
        ...

    def put_many(self, pairs: Iterable[tuple[bytes, int]]) -> None:
        """Store ``(key, tokens)`` pairs (may return before they are written)."""
        ...


def _replace_old_table(conn: sqlite3.Connection) -> None:
    """Replace a counts table of an earlier layout (an INTEGER column, no check): its
    values could have been coerced and cannot be checked. Best effort: a read-only
    database keeps it, and its rows are then misses."""
    try:
        columns = [(row[1], row[2]) for row in conn.execute(f"PRAGMA table_info({_TABLE})")]
        if [name for name, _ in columns] == list(_COLUMNS) and columns[1][1] == "":
            return
        with conn:
            conn.execute(f"DROP TABLE IF EXISTS {_TABLE}")
            conn.execute(_CREATE_TABLE)
    except sqlite3.Error as e:
        _log.debug("protoprompt count store: old table kept: %s", e)


def _valid(pairs: Iterable[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
    batch = [(bytes(k), int(n)) for k, n in pairs]
    for k, n in batch:
        if len(k) != 16 or not _is_count(n):
            raise ValueError(f"count store entries are (16-byte key, int >= 0), got ({k!r}, {n!r})")
    return batch


class _Counts:
    """What every count store does alike: the checks of stored counts, the queue of counts
    to write, the record of what failed."""

    max_entries: int
    _secret: bytes

    def _start_counts(self) -> None:
        self._pending: list[tuple[bytes, int]] = []
        # The last counts written, insertion-ordered; at most half the table, so a count
        # remembered here is still stored unless others wrote max_entries / 2 since.
        self._written: dict[bytes, int] = {}
        self._writing = threading.Condition()
        self.read_failures = 0
        """Reads that failed (their counts were then all made in the process)."""
        self.write_failures = 0
        """Writes that failed (those counts are queued again by a later turn)."""
        self.ignored_counts = 0
        """Stored counts ignored as damaged, retyped or moved (counted again, rewritten)."""
        self.last_failure: str | None = None
        """What went wrong last (a failed read or write, or ignored counts)."""

    def _where(self) -> str:
        raise NotImplementedError

    @property
    def secret(self) -> bytes:
        """The database's 16-byte hashing key (read by the core; keep it private)."""
        return self._secret

    def _read_failed(self, e: BaseException, misses: int) -> list[int | None]:
        _log.debug("protoprompt count store %s: read failed: %s", self._where(), e)
        self.read_failures += 1
        self.last_failure = f"read failed: {e or type(e).__name__}"
        return [None] * misses

    def _checked(
        self, keys: Sequence[bytes], found: dict[bytes, tuple[object, object]]
    ) -> list[int | None]:
        """The counts of ``keys`` among the stored ``found`` ones whose check holds."""
        out: list[int | None] = []
        bad = 0
        for k in keys:
            n, mac = found.get(bytes(k), (None, None))
            if n is None:
                out.append(None)
            elif _is_count(n) and type(mac) is bytes and mac == _mac(self._secret, k, n):
                out.append(n)
            else:
                out.append(None)  # damaged, retyped or moved: counted again and rewritten
                bad += 1
        if bad:
            _log.debug("protoprompt count store %s: %d damaged entries ignored", self._where(), bad)
            self.ignored_counts += bad
            self.last_failure = f"{bad} damaged counts ignored"
        return out

    def _queue(self, batch: list[tuple[bytes, int]]) -> bool:
        """Queue the counts of ``batch`` not written lately (the caller holds
        ``_writing``); whether any was."""
        # Counts this object wrote lately are not written again (the core reports counts it
        # had in memory, e.g. last turn's new input, which is usually one of them).
        batch = [(k, n) for k, n in batch if self._written.get(k) != n]
        for k, n in batch:
            self._written[k] = n
        while len(self._written) > min(_REMEMBER_WRITTEN, self.max_entries // 2):
            del self._written[next(iter(self._written))]
        self._pending.extend(batch)
        return bool(batch)

    def _rows(self, batch: list[tuple[bytes, int]]) -> list[tuple[bytes, int, bytes]]:
        """The rows to store: the counts with their checks."""
        return [(k, n, _mac(self._secret, k, n)) for k, n in batch]

    def _write_failed(self, e: BaseException, rows: list[tuple[bytes, int, bytes]]) -> None:
        _log.debug("protoprompt count store %s: write failed: %s", self._where(), e)
        self.write_failures += 1
        self.last_failure = f"write failed: {e or type(e).__name__}"
        with self._writing:  # not written: let a later turn queue them again
            for k, n, _ in rows:
                if self._written.get(k) == n:
                    del self._written[k]


class SQLiteCountStore(_Counts):
    """Content-addressed token counts in a SQLite database file, shared across processes.

    Pass it to :class:`~protoprompt.HistoryIndex` (``count_store=``);
    :class:`~protoprompt.integrations.agents.ProtoPromptSession` uses one in the session's
    own database automatically.

    Args:
        path: the database file (created if missing). Not ``":memory:"``: a memory
            database lives and dies with one connection, which defeats the purpose.
        max_entries: most counts kept (about 60 bytes each on disk).
        max_open_readers: when this store opens its reader connection (one file descriptor),
            the stores of this process that keep one open are cut to this many, least
            recently used closed first (they reopen when asked), so a server with a database
            per tenant never runs out of file descriptors. Default 32.

    Raises:
        ValueError: ``path`` is ``":memory:"``, or ``max_entries`` or ``max_open_readers``
            is not a positive int.
        sqlite3.Error: the database cannot be opened or its tables created.
    """

    DEFAULT_MAX_ENTRIES = 200_000
    DEFAULT_MAX_OPEN_READERS = 32

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_open_readers: int = DEFAULT_MAX_OPEN_READERS,
    ) -> None:
        path = os.fspath(path)
        if path == ":memory:" or path.startswith("file::memory:"):
            raise ValueError("SQLiteCountStore needs a database file, not ':memory:'")
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ValueError(f"max_entries must be a positive int, got {max_entries!r}")
        if (
            isinstance(max_open_readers, bool)
            or not isinstance(max_open_readers, int)
            or max_open_readers < 1
        ):
            raise ValueError(f"max_open_readers must be a positive int, got {max_open_readers!r}")
        self.path = path
        self.max_entries = max_entries
        self.max_open_readers = max_open_readers
        self._lock = threading.Lock()  # the reader connection
        self._reader: sqlite3.Connection | None = None
        self._start_counts()
        self._writer: threading.Thread | None = None
        self._secret = self._open()
        _process.SQLITE_COUNT_STORES.add(self)  # queued counts are written at interpreter exit

    def _reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        if self._reader is not None:
            # The parent's connection: neither used nor closed here (closing it would reset
            # SQLite's per-process lock bookkeeping the child's own connection relies on).
            _process.INHERITED.append(self._reader)
        self._reader = None
        self._pending = []  # the parent writes what it queued
        self._writing = threading.Condition()
        self._writer = None

    def _open_reader(self) -> sqlite3.Connection:
        """The reader connection (caller holds ``self._lock``), opened if needed; at most
        ``self.max_open_readers`` stores keep one open (least recently used closed first), so a
        server with many databases never runs out of file descriptors."""
        if self._reader is None:
            with sqlite_gate():
                self._reader = self._connect()
        victims: list[SQLiteCountStore] = []
        readers = _process.COUNT_STORE_READERS
        with readers.lock:
            readers.items[id(self)] = weakref.ref(self)
            readers.items.move_to_end(id(self))
            while len(readers.items) > self.max_open_readers:
                _, ref = readers.items.popitem(last=False)
                store = ref()
                if store is not None and store is not self:
                    victims.append(store)
        for store in victims:
            store._close_reader_if_idle()
        return self._reader

    def _close_reader_if_idle(self) -> None:
        if self._lock.acquire(blocking=False):  # never wait: the owner may be reading
            try:
                if self._reader is not None:
                    with sqlite_gate():
                        self._reader.close()
                    self._reader = None
            finally:
                self._lock.release()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=5.0, check_same_thread=False)
        conn.execute("PRAGMA synchronous=NORMAL")  # a cache: no fsync per write
        return conn

    def _open(self) -> bytes:
        with sqlite_gate():
            conn = self._connect()
            try:
                value = meta_value(
                    conn, _SECRET_ROW, lambda: secrets.token_hex(16), [(_TABLE, _CREATE_TABLE)]
                )
                _replace_old_table(conn)
            finally:
                conn.close()
        try:
            secret = bytes.fromhex(value or "")
        except ValueError:
            secret = b""
        if len(secret) != 16:
            raise sqlite3.DatabaseError(
                f"protoprompt_meta.{_SECRET_ROW} in {self.path} is not 16 hex-encoded bytes"
            )
        return secret

    def _where(self) -> str:
        return self.path

    def get_many(self, keys: Sequence[bytes]) -> list[int | None]:
        """Stored counts of ``keys``, ``None`` where there is none (or the read failed)."""
        with self._lock:
            try:
                reader = self._open_reader()
                with sqlite_gate():
                    found = SQLITE_COUNTS.fetch(reader, keys)
            except sqlite3.Error as e:
                return self._read_failed(e, len(keys))
        return self._checked(keys, found)

    def put_many(self, pairs: Iterable[tuple[bytes, int]]) -> None:
        """Queue ``(key, tokens)`` pairs; a background thread writes them soon."""
        batch = _valid(pairs)
        with self._writing:
            if not self._queue(batch):
                return
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._drain, name="protoprompt-count-store", daemon=True
                )
                self._writer.start()

    def _drain(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._writing:
                    batch, self._pending = self._pending, []
                    if not batch:
                        self._writer = None
                        self._writing.notify_all()
                        return
                rows = self._rows(batch)
                try:
                    with sqlite_gate():  # the whole transaction: no fork inside it
                        if conn is None:
                            conn = self._connect()
                        with conn:
                            SQLITE_COUNTS.write(conn, rows, self.max_entries)
                except sqlite3.Error as e:
                    self._write_failed(e, rows)
        finally:
            if conn is not None:
                with sqlite_gate():
                    conn.close()
            with self._writing:
                if self._writer is threading.current_thread():
                    self._writer = None
                    self._writing.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued counts are written; ``False`` if ``timeout`` passed first."""
        with self._writing:
            return self._writing.wait_for(lambda: self._writer is None, timeout)

    def clear(self) -> None:
        """Delete every stored count of this database (e.g. after deleting sessions whose
        texts must leave no trace: a key lets whoever holds the database confirm a guessed
        text). Queued counts are written first, then deleted too."""
        self.flush(timeout=5.0)
        with self._lock:
            reader = self._open_reader()
            with sqlite_gate(), reader:
                SQLITE_COUNTS.delete_all(reader)
        with self._writing:
            self._written.clear()

    def entry_count(self) -> int:
        """Number of stored counts (after :meth:`flush`, including this process's)."""
        with self._lock:
            reader = self._open_reader()
            with sqlite_gate():
                return SQLITE_COUNTS.size(reader)

    def close(self) -> None:
        """Write what is queued (up to 5 s) and close the connection."""
        self.flush(timeout=5.0)
        with self._lock:
            if self._reader is not None:
                with sqlite_gate():
                    self._reader.close()
                self._reader = None

    def __repr__(self) -> str:
        return f"<SQLiteCountStore {self.path!r} max_entries={self.max_entries}>"


# ------------------------------------------------------------------ counts on a server

_T = TypeVar("_T")


class CountIO(Protocol):
    """Where a :class:`RemoteCountStore` runs its I/O: an event loop of its own (see
    ``protoprompt.integrations._stores._io``) that threads can wait on."""

    def run(self, make: Callable[[], Awaitable[_T]], timeout: float) -> _T: ...

    def submit(self, make: Callable[[], Awaitable[_T]]) -> Any: ...


class CountBackend(Protocol):
    """A server's table or hash of counts, for :class:`RemoteCountStore` (coroutines run on
    the store's I/O loop; a failure raises)."""

    async def fetch(self, keys: Sequence[bytes]) -> dict[bytes, tuple[object, object]]:
        """The stored ``(tokens, mac)`` of those of ``keys`` that are stored."""
        ...

    async def write(self, rows: Sequence[tuple[bytes, int, bytes]], max_entries: int) -> None:
        """Store ``(key, tokens, mac)`` rows, then keep at most ``max_entries``."""
        ...

    async def delete_all(self) -> None: ...

    async def size(self) -> int: ...


class RemoteCountStore(_Counts):
    """Token counts kept on a database server (PostgreSQL, Redis) beside a session's history:
    the :class:`SQLiteCountStore` of a deployment with many hosts, made by
    :class:`~protoprompt.integrations.ProtoPromptSession` for its inner session's engine.

    The same keys, checks and bounds as :class:`SQLiteCountStore` (keyed hashes and counts
    only, never text; each count stored with a keyed check, a damaged one is a miss; at most
    ``max_entries``). Reads wait for the server at most ``timeout`` seconds (a failed or slow
    read counts as misses: the turn counts those items itself); writes are queued and done in
    the background.
    """

    DEFAULT_MAX_ENTRIES = SQLiteCountStore.DEFAULT_MAX_ENTRIES

    def __init__(
        self,
        backend: CountBackend,
        secret: bytes,
        io: CountIO,
        description: str,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        timeout: float = 5.0,
    ) -> None:
        if len(secret) != 16:
            raise ValueError("a count store's secret is 16 bytes")
        self._backend = backend
        self._secret = bytes(secret)
        self._io = io
        self.description = description
        self.max_entries = max_entries
        self.timeout = timeout
        self._start_counts()
        self._busy = False
        _process.REMOTE_COUNT_STORES.add(self)

    def _where(self) -> str:
        return self.description

    def get_many(self, keys: Sequence[bytes]) -> list[int | None]:
        """Stored counts of ``keys``, ``None`` where there is none (or the read failed)."""
        if not keys:
            return []
        wanted = list(dict.fromkeys(bytes(k) for k in keys))
        try:
            found = self._io.run(lambda: self._backend.fetch(wanted), self.timeout)
        except Exception as e:  # noqa: BLE001 - any failure of the server is a miss
            return self._read_failed(e, len(keys))
        return self._checked(keys, found)

    def put_many(self, pairs: Iterable[tuple[bytes, int]]) -> None:
        """Queue ``(key, tokens)`` pairs; they are written soon, in the background."""
        batch = _valid(pairs)
        with self._writing:
            if not self._queue(batch):
                return
            if self._busy:
                return
            self._busy = True
        try:
            self._io.submit(self._drain)
        except Exception:  # noqa: BLE001 - no loop (interpreter exiting): nothing written
            with self._writing:
                self._busy = False
                self._pending.clear()
                self._writing.notify_all()

    async def _drain(self) -> None:
        try:
            while True:
                with self._writing:
                    batch, self._pending = self._pending, []
                    if not batch:
                        return
                rows = self._rows(batch)
                try:
                    await self._backend.write(rows, self.max_entries)
                except Exception as e:  # noqa: BLE001 - a lost write only costs a recount
                    self._write_failed(e, rows)
        finally:
            with self._writing:
                self._busy = False
                self._writing.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until queued counts are written; ``False`` if ``timeout`` passed first."""
        with self._writing:
            return self._writing.wait_for(lambda: not self._busy, timeout)

    def clear(self) -> None:
        """Delete every stored count of this database (queued ones first written)."""
        self.flush(timeout=self.timeout)
        self._io.run(self._backend.delete_all, self.timeout)
        with self._writing:
            self._written.clear()

    def entry_count(self) -> int:
        """Number of stored counts (after :meth:`flush`, including this process's)."""
        return int(self._io.run(self._backend.size, self.timeout))

    def close(self) -> None:
        """Write what is queued (up to 5 s)."""
        self.flush(timeout=5.0)

    def _reset_after_fork(self) -> None:
        self._writing = threading.Condition()
        self._pending = []  # the parent writes what it queued
        self._busy = False

    def __repr__(self) -> str:
        return f"<RemoteCountStore {self.description} max_entries={self.max_entries}>"


_process.SQLITE_COUNT_STORES.handle(
    after_fork=SQLiteCountStore._reset_after_fork,
    at_exit=lambda store: store.flush(timeout=2.0),  # writer threads die with the interpreter
)
_process.REMOTE_COUNT_STORES.handle(
    after_fork=RemoteCountStore._reset_after_fork,
    at_exit=lambda store: store.flush(timeout=2.0),
)
