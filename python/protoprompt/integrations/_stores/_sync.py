"""Which part of a session's :class:`~protoprompt.HistoryIndex` still describes the history
that the SDK hands to the input callback.

The index may only be used for a history it describes item for item. Several processes and
session objects may write one session's rows, so before every turn the index is compared
with the rows *that the read returned*, never with rows looked at in another transaction.
Each item of the index keeps the *key* of the row it came from; how a read gets the keys
depends on the engine (the stores of ``_store``, ``_sqlalchemy_store``, ``_redis_store``):

* ``SQLiteSession`` in a database file: :meth:`RowReader.read` reads the rows itself,
  exactly as ``SQLiteSession.get_items`` does (one ``SELECT`` in id order, rows that are not
  JSON skipped), but with their ids. Its rows are never changed in place and ids only grow
  (``AUTOINCREMENT``, one writer at a time): rows are appended, popped newest first,
  cleared, or a suffix is replaced by new rows (compaction, which may also delete a prefix).
  So if the index's item ``p - 1`` and the read's item ``p - 1`` come from the same row, the
  first ``p`` items are the same rows on both sides, and that is monotone in ``p``:
  :func:`kept_prefix` finds the longest prefix that still holds with one comparison when
  only rows were appended, and a binary search otherwise.
* ``SQLAlchemySession`` orders its rows by ``(created_at, id)``; ids are never reused but a
  row written by a transaction that started earlier can appear *before* rows already read
  (PostgreSQL stamps ``created_at`` at the start of a transaction). So the keys (ids) are
  compared one by one (:func:`kept_prefix` with ``monotone=False``; a C-speed comparison of
  two arrays).
* ``RedisSession`` keeps a list without ids: an item's key is a keyed 64-bit digest of its
  stored bytes, so equal keys mean equal items, and the prefix that still holds is compared
  item by item as well.
* Other sessions (a memory database, an ``inner_session`` with ``incremental=True``) have no
  rows to compare: their index is trusted while no pop or clear ran through a session object
  sharing it (the epoch).

:func:`plan` turns what the index was synced with and what the read saw into a decision: a
pure function, tested as a table.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from ... import _process
from ..._process import sqlite_gate

T = TypeVar("T")

if TYPE_CHECKING:
    RowIds = array[int]
else:  # array is subscriptable at run time from Python 3.12 on
    RowIds = array
"""Row ids, ``array('q')``."""


class Rows:
    """The rows one read saw, in the session's order (``(key, data)``), the positions among
    them of the rows that did not decode (the SDK's ``get_items`` skips those), and for a
    ``RedisSession`` the session's generation tag the read saw with them (see
    ``_redis_store``)."""

    __slots__ = ("rows", "skipped", "tag")

    def __init__(
        self, rows: list[tuple[Any, ...]], skipped: list[int], tag: str | None = None
    ) -> None:
        self.rows = rows
        self.skipped = skipped
        self.tag = tag

    def __len__(self) -> int:
        return len(self.rows) - len(self.skipped)

    def _row(self, p: int) -> int:
        r = p
        for s in self.skipped:  # sorted, and almost always empty
            if s <= r:
                r += 1
            else:
                break
        return r

    def id_at(self, p: int) -> int:
        """The id of the row behind item ``p``."""
        return int(self.rows[self._row(p)][0])

    def ids_from(self, p: int) -> RowIds:
        """The ids of the rows behind items ``p`` and later."""
        if p >= len(self):
            return array("q")
        skipped = set(self.skipped)
        rows = self.rows
        return array(
            "q", (int(rows[r][0]) for r in range(self._row(p), len(rows)) if r not in skipped)
        )


def read_rows(
    conn: sqlite3.Connection, table: str, session_id: str, look: Callable[[Rows], T]
) -> tuple[list[Any], T]:
    """A session's items exactly as ``SQLiteSession.get_items()`` returns them (no limit),
    from one statement (one read snapshot), and what ``look`` makes of the rows behind them.
    The rows (with their texts) live only during the call, as in the SDK's own read."""
    with sqlite_gate():
        rows = conn.execute(
            f'SELECT id, message_data FROM "{table}" WHERE session_id = ? ORDER BY id ASC',
            (session_id,),
        ).fetchall()
    items, seen = _decoded(rows)
    return items, look(seen)


def _decoded(
    rows: list[tuple[Any, ...]],
    skip: tuple[type[Exception], ...] = (json.JSONDecodeError, TypeError),
    tag: str | None = None,
) -> tuple[list[Any], Rows]:
    """The items of ``(key, message_data)`` rows as the SDK's ``get_items`` decodes them
    (rows whose decoding raises one of ``skip`` skipped: ``SQLiteSession``'s by default),
    and the rows behind them."""
    items: list[Any] = []
    skipped: list[int] = []
    loads = json.loads
    for _, data in rows:
        try:
            items.append(loads(data))
        except skip:  # what the SDK skips, and nothing else
            skipped.append(len(items) + len(skipped))
    return items, Rows(rows, skipped, tag)


decoded = _decoded


def _fetch(conn: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> list[Any]:
    """The rows of one statement, run inside the process's SQLite gate (no fork inside it)."""
    with sqlite_gate():
        return conn.execute(sql, args).fetchall()


class RowReader:
    """Reads one stored session's rows (see :func:`read_rows`) on a connection of its own."""

    def __init__(self, db_path: str, table: str, session_id: str) -> None:
        self._db_path = db_path
        self._table = table
        self._session_id = session_id
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        _process.ROW_READERS.add(self)

    def after_fork_in_child(self) -> None:
        """A forked child must not use its parent's SQLite connection (nor close it, which
        would drop locks SQLite tracks per process): the reader opens its own."""
        if self._conn is not None:
            _process.INHERITED.append(self._conn)
        self._conn = None
        self._lock = threading.Lock()

    def read(self, look: Callable[[Rows], T]) -> tuple[list[Any], T]:
        """See :func:`read_rows`. Raises ``sqlite3.Error`` if the database cannot be read."""
        with self._lock:
            return read_rows(self._connection(), self._table, self._session_id, look)

    def read_window(
        self, view: WindowView, choose: Chooser
    ) -> tuple[list[Any], list[Any], Rows, RowIds] | Gone:
        """The newest rows of a session whose index ends at row ``view.last_id``, in one read
        transaction, by indexed range queries on ``(session_id, id)`` (never a full scan):

        1. the rows from ``last_id`` on (the rows appended since, after the index's last
           one); :class:`Gone` when ``last_id`` is not the first of them (the row is gone:
           popped or replaced), or when the session's first row is not the index's (a
           compaction pruned it);
        2. ``choose(appended items, their rows)`` returns the position and id of the window's
           first row (``None``: read no window), and the rows from there up to ``last_id``
           are read.

        Returns ``(window items before last_id's, items from last_id's on, rows from
        last_id on, ids of the earlier window rows)``. Raises ``sqlite3.Error`` if the
        database cannot be read."""
        table, sid, last_id = self._table, self._session_id, view.last_id
        with self._lock:
            conn = self._connection()
            _fetch(conn, "BEGIN")
            try:
                tail_items, tail = _decoded(
                    _fetch(
                        conn,
                        f'SELECT id, message_data FROM "{table}" WHERE session_id = ? AND id >= ? '
                        "ORDER BY id ASC",
                        (sid, last_id),
                    )
                )
                if not tail_items or tail.id_at(0) != last_id:
                    return Gone("popped", "the index's last row is gone")
                first = _fetch(conn, f'SELECT MIN(id) FROM "{table}" WHERE session_id = ?', (sid,))
                if not first or first[0][0] != view.first_id:
                    return Gone("rewritten", "the session's first row is not the index's")
                chosen = choose(tail_items[1:], tail)
                if chosen is None:
                    return Gone("", None)
                head_items, head = _decoded(
                    _fetch(
                        conn,
                        f'SELECT id, message_data FROM "{table}" WHERE session_id = ? AND id >= ? '
                        "AND id < ? ORDER BY id ASC",
                        (sid, chosen[1], last_id),
                    )
                )
            finally:
                try:
                    _fetch(conn, "COMMIT")
                except sqlite3.Error:
                    # Never leave a read transaction open: later reads would see its snapshot.
                    self._conn = None
                    with sqlite_gate():
                        conn.close()
                    raise
        return head_items, tail_items, tail, head.ids_from(0)

    def _connection(self) -> sqlite3.Connection:
        """The reader's connection, opened if needed (caller holds ``self._lock``)."""
        if self._conn is None:
            with sqlite_gate():
                self._conn = sqlite3.connect(
                    self._db_path, check_same_thread=False, timeout=5.0, isolation_level=None
                )
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                with sqlite_gate():
                    self._conn.close()
                self._conn = None


def kept_prefix(synced: Sequence[int] | None, rows: Rows, *, monotone: bool = True) -> int:
    """How many of the index's first items (whose rows are ``synced``) are the first items
    of the read (``rows``): see the module note for why one comparison per probe suffices
    when keys are ``monotone`` (SQLite), and why they are compared one by one otherwise."""
    if not synced:
        return 0
    n = min(len(synced), len(rows))
    if n == 0:
        return 0
    if not monotone:
        return common_prefix(synced, rows.ids_from(0), n)
    if synced[n - 1] == rows.id_at(n - 1):
        return n
    lo, hi = 0, n - 1  # the prefix of lo holds, the one of hi + 1 does not
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if synced[mid - 1] == rows.id_at(mid - 1):
            lo = mid
        else:
            hi = mid - 1
    return lo


def common_prefix(a: Sequence[int], b: Sequence[int], n: int) -> int:
    """The length of the longest common prefix of ``a[:n]`` and ``b[:n]``: slices of
    ``array('q')`` compared in C, a block at a time, then one by one inside the block that
    differs."""
    block = 4096
    start = 0
    while start < n:
        end = min(start + block, n)
        if a[start:end] != b[start:end]:
            for p in range(start, end):
                if a[p] != b[p]:
                    return p
        start = end
    return n


class WindowView(NamedTuple):
    """What a store needs to know of an index to read a token window after it."""

    first_id: int
    """The key of the index's first item."""
    last_id: int
    """The key of the index's last item."""
    length: int
    """Items the index holds."""
    tag: str | None
    """The generation tag the index was synced at (``RedisSession``)."""


class Gone(NamedTuple):
    """Why a store read no window: a code of ``protoprompt.turn_report.READ_REASONS`` and
    detail (an empty code: ``choose`` declined, it says why itself)."""

    code: str
    detail: str | None


Chooser = Callable[[list[Any], Rows], "tuple[int, int] | None"]
"""``choose(appended items, their rows)``: the position and key of a window's first item,
or ``None``."""


@dataclass(frozen=True)
class Seen:
    """What a read of rows found, compared with the index as it was then."""

    version: int
    """The index's version it was compared with (see :class:`Synced`)."""
    keep: int
    """Items of the index that are the read's first items."""
    new_ids: RowIds
    """Row ids of the read's items after those."""
    tag: str | None = None
    """The generation tag the read saw (``RedisSession``; ``None`` for other engines)."""


@dataclass(frozen=True)
class ReadFacts:
    """What one ``get_items`` returned."""

    count: int
    """Items returned."""
    limited: bool
    """Only the latest items (a ``limit``, ours or the inner session's)."""
    epoch: int
    """The session's epoch when the read began (pops and clears through session objects)."""
    checked: bool
    """The session's rows are compared with the index (a database file)."""
    seen: Seen | None
    """For a checked session, what its rows showed (``None``: they could not be read)."""
    offset: int = 0
    """A token window: the items returned are the history from this position on (the index
    holds the positions before it, see ``ProtoPromptSession(windowed_reads=True)``)."""
    window_ids: RowIds | None = None
    """For a token window, the ids of the index's rows from ``offset`` on that the read saw."""
    opaque_scale: float = 1.0
    """For a token window, the calibration of opaque payloads it was found under: the
    turn is packed with the same one (a smaller one could need items before the window)."""
    no_window: tuple[str, str | None] | None = None
    """Why this read is not a token window: a code of ``protoprompt.turn_report.READ_REASONS``
    and more detail (``None`` for a window)."""
    snapshot: tuple[str, str | None] | None = None
    """What the read did with the stored index snapshot, when it looked for one: a state of
    ``protoprompt.turn_report.SNAPSHOT_STATES`` and detail (``None``: it did not look)."""
    reached: int | None = None
    """For a token window: the items the budget alone reaches (the window may hold more)."""
    widened: str | None = None
    """For a token window that relations made far larger than the budget's reach
    (``turn_report.window_widened``): the relation."""


@dataclass(frozen=True)
class Synced:
    """What the index is now."""

    length: int
    version: int
    """Changes whenever the index or the rows it describes change."""
    epoch: int
    """The epoch at its last sync (-1: never synced)."""


@dataclass(frozen=True)
class Plan:
    use_index: bool
    """Pack through the index; otherwise pack the history without it and leave the index."""
    keep: int
    """Truncate the index to this many items first (0: start it again)."""
    reason: str
    code: str
    """``reason`` as a code: ``compared``, ``trusted`` (index used), ``pop_or_clear``,
    ``longer`` (index started again), ``changed``, ``not_the_read``, ``read_failed`` (index
    not used)."""


def plan(read: ReadFacts | None, synced: Synced, history_len: int, epoch: int) -> Plan:
    """How the callback packs ``history`` (``history_len`` items) after ``read``, with the
    index ``synced`` and the session's current ``epoch``."""
    leave = synced.length
    if read is not None and read.offset and read.count == history_len:
        if read.seen is None:  # pragma: no cover - a token window is always compared
            return Plan(False, leave, "a token window without its rows", "read_failed")
        if read.seen.version != synced.version:
            return Plan(False, leave, "the index changed after the read", "changed")
        return Plan(True, read.seen.keep, "token window, rows compared", "compared")
    if read is None or read.limited or read.count != history_len:
        return Plan(
            False, leave, "not the whole history that the last read returned", "not_the_read"
        )
    if read.checked:
        if read.seen is None:
            return Plan(False, leave, "the rows could not be read", "read_failed")
        if read.seen.version != synced.version:
            return Plan(False, leave, "the index changed after the read", "changed")
        return Plan(True, read.seen.keep, "rows compared", "compared")
    if read.epoch != epoch or synced.epoch != read.epoch:
        return Plan(True, 0, "a pop or clear ran since the index was synced", "pop_or_clear")
    if synced.length > history_len:
        return Plan(True, 0, "the index is longer than the history", "longer")
    return Plan(True, synced.length, "no pop or clear since the index was synced", "trusted")


_process.ROW_READERS.handle(after_fork=RowReader.after_fork_in_child)
