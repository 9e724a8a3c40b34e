"""Index snapshots kept beside a session's history (in SQLite: table
``protoprompt_index_snapshots``; PostgreSQL and Redis: see ``_sqlalchemy_store`` and
``_redis_store``, which implement :class:`SnapshotStore` the same way).

A restarted process would otherwise read and classify the whole history on its first turn
(100k items: ~75 ms of the callback). :class:`~protoprompt.HistoryIndex` snapshots hold the
classified items (graph fields only: ids, call ids, types, statuses — no text), the item graph
and the token costs counted so far; loading one costs a fraction of that.

A snapshot is stored with the keys of the rows its items came from, and *bound* to them, to
the database (its random id in ``protoprompt_meta``), to the session and, for a
``RedisSession``, to the session's generation tag (:func:`binding`): loaded anywhere else —
another session's row, another database, rows edited in the table — the core refuses it.
The caller then compares those row keys with the rows a read returns, exactly as for a
live index, and keeps the prefix that still holds.
Every value is checked for its type when read; any error makes a snapshot absent, never a
failed turn.
"""

from __future__ import annotations

import itertools
import logging
import sys
import threading
from array import array
from typing import Protocol

from ... import _process
from ..._storage import Kind, Record, sqlite_record
from ..._storage.records import Field
from ...errors import SnapshotError
from ...packing import HistoryIndex
from . import _sync

_log = logging.getLogger("protoprompt")

KIND = Kind(
    "protoprompt_index_snapshots",
    "snapshot",
    (Field("row_ids", "blob", redis="ids"), Field("data", "blob"), Field("tag", "text", sql=False)),
)
"""Where snapshots are kept: table ``protoprompt_index_snapshots`` (``messages_table``,
``session_id``, ``row_ids``, ``data``); in Redis the hash ``{session}:protoprompt:snapshot``
(``ids``, ``data`` and the generation tag ``tag``)."""


def binding(
    database_id: str, table: str, session_id: str, row_ids: bytes, tag: str | None = None
) -> bytes:
    """What a snapshot of a session's index is bound to (see the module note)."""
    out = bytearray()
    parts = ["protoprompt index snapshot 1", database_id, table, session_id]
    if tag is not None:
        parts.append(tag)
    for part in parts:
        raw = part.encode("utf-8", "surrogatepass")
        out += len(raw).to_bytes(8, "little") + raw  # length-prefixed: never ambiguous
    return bytes(out) + row_ids


def ids_to_bytes(ids: array[int]) -> bytes:
    """Row ids as stored: 8-byte little-endian integers."""
    if sys.byteorder == "little":
        return ids.tobytes()
    swapped = array("q", ids)
    swapped.byteswap()
    return swapped.tobytes()


def ids_from_bytes(data: bytes) -> array[int] | None:
    """The row ids :func:`ids_to_bytes` wrote, or ``None`` if ``data`` cannot be them."""
    if len(data) % 8:
        return None
    ids = array("q")
    ids.frombytes(data)
    if sys.byteorder != "little":
        ids.byteswap()
    return ids


def text_of(value: object) -> str | None:
    """A text value as an engine returns it (Redis: bytes), or ``None``."""
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


class SnapshotStore(Protocol):
    """Where a stored session's index snapshot is kept. Nothing raises: a snapshot that
    cannot be read is absent, a failed write says why."""

    def load(self) -> tuple[bytes, bytes, str | None] | None:
        """``(row keys, data, tag)`` of the session's snapshot, or ``None``."""
        ...

    def save(self, row_ids: bytes, data: bytes, tag: str | None) -> str | None:
        """Replace the session's snapshot; why it could not be written, or ``None``."""
        ...

    def delete(self) -> None:
        """Remove the session's snapshot, if there is one."""
        ...

    def binding(self, row_ids: bytes, tag: str | None) -> bytes:
        """What a snapshot of these rows is bound to (:func:`binding`)."""
        ...


class Snapshots:
    """The snapshot of one stored session, in its record (any engine). ``tagged``: the
    session's rows carry a generation tag (Redis), without which nothing is saved."""

    def __init__(self, record: Record, database_id: str, *, tagged: bool = False) -> None:
        self.record = record
        self.database_id = database_id
        self.tagged = tagged

    def load(self) -> tuple[bytes, bytes, str | None] | None:
        found = self.record.load()
        if found is None:
            return None
        ids, data, tag = found["row_ids"], found.get("data"), text_of(found.get("tag"))
        if type(ids) is not bytes or type(data) is not bytes or (self.tagged and tag is None):
            return None
        return ids, data, tag if self.tagged else None

    def save(self, row_ids: bytes, data: bytes, tag: str | None) -> str | None:
        if self.tagged and tag is None:
            return "the session has no generation tag yet"
        return self.record.save({"row_ids": row_ids, "data": data, "tag": tag or ""})

    def delete(self) -> None:
        self.record.delete()

    def binding(self, row_ids: bytes, tag: str | None) -> bytes:
        table, session_id = self.record.where
        return binding(self.database_id, table, session_id, row_ids, tag)


def SQLiteSnapshots(  # noqa: N802 - the class it was
    db_path: str, database_id: str, table: str, session_id: str
) -> Snapshots:
    """The snapshots of one session of a SQLite database file."""
    return Snapshots(sqlite_record(db_path, KIND, table, session_id), database_id)


# ------------------------------------------------------------------ a session's index state

DEFAULT_SNAPSHOT_MIN_ITEMS = 512
"""Default of ``ProtoPromptSession(snapshot_min_items=...)``: histories shorter than this are
not snapshotted (reading them again takes a few ms)."""

_SERIALS = itertools.count(1)  # IndexState.serial: never reused in a process


class IndexState:
    """A stored session's HistoryIndex, what it describes, and the session's epoch (bumped
    around every pop and clear made through any object sharing this state).

    ``row_ids`` are the keys of the rows behind the index's items when the rows are compared
    before every use (see ``_sync``), ``tag`` the generation tag of a ``RedisSession`` they
    were read at; ``version`` changes with every change of the index or of ``row_ids``.
    ``snapshot_at``: where the index is saved to and restored from (``None``: nowhere)."""

    def __init__(self, snapshot_at: SnapshotStore | None = None) -> None:
        self.index = HistoryIndex()
        self.synced_epoch = -1  # the epoch the index was synced at
        self.row_ids: _sync.RowIds | None = None
        self.tag: str | None = None
        self.version = 0
        self.nbytes = 0  # index.nbytes after the last build (read without the index)
        self.lock = threading.Lock()
        self._epoch = itertools.count(1)
        self.epoch = 0
        self.snapshot_at = snapshot_at
        self.restore_tried = snapshot_at is None
        self.saved_len = 0  # items in the snapshot last written or loaded
        self.saver: threading.Thread | None = None
        self.serial = next(_SERIALS)  # tells states apart (ProtoPromptSession._debug_state)
        self.logged: set[str] = set()  # fallbacks logged for this stored session (turn reports)
        self.save_failure: str | None = None  # why the last snapshot write failed (reports)
        _process.INDEX_STATES.add(self)

    def bump(self) -> None:
        self.epoch = next(self._epoch)  # atomic under the GIL; never returns to an old value

    def reset(self, synced_epoch: int) -> None:
        self.keep(0)
        self.synced_epoch = synced_epoch

    def keep(self, length: int) -> None:
        """Keep the first ``length`` items of the index (and of ``row_ids``). Below the
        stored snapshot's items, the snapshot no longer describes the index (its rows were
        popped or rewritten): the next turn that finds the index due replaces it."""
        if length < self.saved_len:
            self.saved_len = 0
        if length < len(self.index):
            if length:
                self.index.truncate(length)
            else:
                self.index.clear()
        if self.row_ids is not None and len(self.row_ids) > length:
            del self.row_ids[length:]
        if not length:
            self.row_ids = None
            self.tag = None
        self.version += 1

    def begin_build(self, keep: int, epoch: int) -> None:
        """Before a turn builds through the index: keep its first ``keep`` items, the ones
        that hold for the turn's history (synced at ``epoch``; caller holds the lock)."""
        if keep < len(self.index) or keep == 0:
            self.keep(keep)
            self.synced_epoch = epoch

    def measure(self) -> None:
        """Note the index's size after a build (also a failed one; caller holds the lock)."""
        self.nbytes = self.index.nbytes

    def end_build(
        self, epoch: int, added: _sync.RowIds | None, tag: str | None, length: int
    ) -> bool:
        """After a turn built through the index: the rows ``added`` to it (``None``: rows
        not compared) read at ``tag``, synced at ``epoch``. ``False`` when the index does
        not hold ``length`` items with their row ids: it is then dropped (never reached;
        caller holds the lock)."""
        if added is not None:
            if self.row_ids is None:
                self.row_ids = array("q")
            self.row_ids.extend(added)
            self.tag = tag  # the rows were read at this generation (Redis)
            self.nbytes += self.row_ids.itemsize * len(self.row_ids)
        self.synced_epoch = epoch
        self.version += 1
        if len(self.index) != length or (
            self.row_ids is not None and len(self.row_ids) != len(self.index)
        ):
            self.reset(epoch)
            return False
        return True

    def log_once(self, key: str) -> bool:
        """Whether the fallback ``key`` is logged now: once per stored session."""
        with self.lock:
            if key in self.logged:
                return False
            self.logged.add(key)
            return True

    def synced(self) -> _sync.Synced:
        return _sync.Synced(len(self.index), self.version, self.synced_epoch)

    def compare(
        self,
        rows: _sync.Rows,
        after: threading.Thread | None = None,
        *,
        monotone: bool = True,
    ) -> _sync.Seen:
        """What ``rows`` (a read's rows) keep of the index, once ``after`` (the snapshot's
        restore) has finished (caller: no lock). ``monotone``: see ``_sync.kept_prefix``."""
        if after is not None:
            after.join()
        with self.lock:
            keep = _sync.kept_prefix(self.row_ids, rows, monotone=monotone)
            return _sync.Seen(self.version, keep, rows.ids_from(keep), rows.tag)

    # -------------------------------------------------------------- snapshots (caller: no lock)

    def restore(self) -> tuple[str, str | None] | None:
        """Load the stored snapshot into a state that has never synced (once per state).
        Whatever is stored, this never raises: a snapshot that cannot be used is ignored.

        Returns what it did when it looked for a snapshot now (``None`` otherwise): a state
        of ``protoprompt.turn_report.SNAPSHOT_STATES`` (``loaded``, ``none_stored``,
        ``ignored``) with detail (the items loaded, or why the snapshot was ignored)."""
        with self.lock:
            if self.restore_tried or self.snapshot_at is None:
                return None
            self.restore_tried = True
            if len(self.index) or self.row_ids is not None:
                return None
            where = self.snapshot_at
            try:
                found = where.load()
                if found is None:
                    return ("none_stored", None)
                ids_blob, data, tag = found
                row_ids = ids_from_bytes(ids_blob)
                index = HistoryIndex.from_snapshot(
                    data,
                    count_store=self.index.count_store,
                    bound_to=where.binding(ids_blob, tag),
                )
                if row_ids is None or len(row_ids) != len(index):
                    raise SnapshotError("its row ids do not match its items")
            except Exception as exc:  # noqa: BLE001 - stored state never fails a turn
                # Another version, damaged, or taken for other rows: read the history.
                _log.debug("protoprompt: index snapshot not used: %s", exc)
                return ("ignored", str(exc) or type(exc).__name__)
            self.index = index
            self.row_ids = row_ids
            self.tag = tag
            self.version += 1
            self.synced_epoch = self.epoch
            self.saved_len = len(index)
            self.nbytes = index.nbytes + row_ids.itemsize * len(row_ids)
            return ("loaded", f"{len(index):,} items")

    def due(self, min_items: int) -> bool:
        """Whether the index has grown enough since its last snapshot: it holds ``min_items``
        items and has grown by an eighth, at least ``min_items`` (caller holds lock)."""
        n = len(self.index)
        return (
            self.snapshot_at is not None
            and self.row_ids is not None
            and n >= min_items
            and n - self.saved_len >= max(min_items, self.saved_len // 8)
        )

    def save_in_background(self) -> None:
        """Start writing a snapshot unless one is being written (caller holds the lock)."""
        if self.saver is not None and self.saver.is_alive():
            return
        self.saver = threading.Thread(target=self.save, name="protoprompt-snapshot", daemon=True)
        self.saver.start()

    def save(self) -> None:
        """Write a snapshot of the index as it is now, if it holds anything unsaved."""
        with self.lock:
            n = len(self.index)
            if (
                self.snapshot_at is None
                or self.row_ids is None
                or n == 0
                or n == self.saved_len
                or len(self.row_ids) != n
            ):
                return
            ids_blob = ids_to_bytes(self.row_ids)
            tag = self.tag
            where = self.snapshot_at
            data = self.index.snapshot(bound_to=where.binding(ids_blob, tag))
            self.saved_len = n  # also when the write fails: retried after more growth
        self.save_failure = where.save(ids_blob, data, tag)

    def wait_for_save(self, timeout: float | None = None) -> None:
        saver = self.saver
        if saver is not None and saver is not threading.current_thread():
            saver.join(timeout)

    def forget_snapshot(self) -> None:
        """Delete the stored snapshot (``clear_session``), after any write in flight."""
        self.wait_for_save()
        with self.lock:
            self.reset(self.epoch)  # describes the cleared rows: never to be saved again
            self.saved_len = 0
        if self.snapshot_at is not None:
            self.snapshot_at.delete()

    def after_fork(self) -> None:
        """In a forked child: a lock held at the fork belonged to a thread that is gone, and
        the index it guarded may be half changed. Start that index again."""
        if self.lock.locked():
            self.index = HistoryIndex(count_store=self.index.count_store)
            self.row_ids = None
            self.tag = None
            self.version += 1
            self.synced_epoch = -1
        self.lock = threading.Lock()
        self.saver = None


_process.INDEX_STATES.handle(
    after_fork=IndexState.after_fork,
    # Snapshot writers are daemon threads: let one in flight finish (at most 5 s each).
    at_exit=lambda state: state.wait_for_save(timeout=5.0),
)
