"""What a session turn evicted, kept reachable: its rows indexed for recall and folded into a
rolling summary, off the request's path.

A :class:`~protoprompt.TokenBudgetedContextBuilder` with ``recall_evicted`` or a
``summarizer`` has one :class:`Evictions`. Each turn of a
:class:`~protoprompt.integrations.ProtoPromptSession` built with it:

1. before the build, :meth:`Evictions.prepare` says which turn this is (for "N turns ago")
   and reads the session's summary (for the ``summary`` layer);
2. after the build, :meth:`Evictions.observe` works out, in time proportional to what the
   turn kept and what was added since the last turn, which rows the turn evicted that no
   earlier turn handed over (:func:`eviction_step`, a pure function);
3. :meth:`Evictions.schedule` hands them to a background thread that renders and indexes
   them in the store's ``history`` layer, and (with a summarizer) starts a summary update as
   a task on the running event loop. The request was returned before either runs.

**What "evicted" means.** A row is evicted by a turn when the turn's pack did not send it
(dropped units; masked units are sent and are not evicted). Under windowed reads the rows
before the window are not even read: they were evicted by earlier turns, which indexed
them -- or, when that did not happen (a restarted process, a turn that kept them, a failed
or dropped background job), the background job reads them from the session's database by
row id. The store is the truth of what is indexed: a job indexes only rows the store does
not hold with the same content (a row's digest is that of its canonical text), so several
workers, restarts and repeated hand-overs never store a row twice and never lose one.

**Ledger.** Per stored session, what its turns handed over: the positions below
``frontier`` were looked at, and ``held`` lists those of them the turn kept (to look at
again). A pop, clear or rewrite of the history (the session's epoch), or rows that are not
the ones seen before (another process), start it again from position 0; a background job
that failed for good does too, so its rows are looked at again.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import os
import queue
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from . import _process
from ._context._blocks import UNSPLIT_ENCODINGS, age_piece
from ._context._query import message_text
from ._recall._index import BATCH, IndexJob
from ._recall._ledger import (
    EvictionStep,
    Ledger,
    TurnMemory,
    TurnRows,
    eviction_step,
    item_digest,
)
from .memory import HistoryRecord, MemoryScope
from .packing import count_tokens_batch, truncate_text
from .transcript import render_item, tool_names

if TYPE_CHECKING:
    from .context import TokenBudgetedContextBuilder
    from .summaries import SummaryState, SummaryStore

__all__ = [
    "EvictionStep",
    "Evictions",
    "Ledger",
    "TurnMemory",
    "TurnRows",
    "eviction_step",
    "item_digest",
]

_log = logging.getLogger("protoprompt")

RETRY_DELAYS: tuple[float, ...] = (0.2, 1.0)
"""Seconds before the second and third attempt of a background job (then it is given up,
logged, and its rows are looked at again by a later turn)."""
SUMMARY_TIMEOUT = 300.0
"""Seconds one summarizer call may take: a call still running then is cancelled and counts
as a failed attempt (retried, then the previous summary stays), so a call that never
returns cannot stop the session's later summary updates."""
INDEX_DELAY = 0.05
"""Seconds an index job waits after its turn queued it, unless someone waits for the jobs
(:meth:`_Worker.wait_idle`: ``wait_for_background``, ``forget``, exit). The turn goes on to
its model call, which takes longer: the job then runs while the process waits for the model,
not beside the turn's own work (threads of one interpreter take turns at running Python)."""
MAX_QUEUED_JOBS = 64
AGES_AHEAD = 16
"""How many turns past the session's current one the index job counts the openings'
first pieces ahead for (:meth:`Evictions._warm`)."""
"""Index jobs waiting at most; a turn whose job does not fit leaves its rows to a later one."""
SUMMARY_BATCH_FACTOR = 8
"""One summary update folds in at most this many times ``summarize_every`` tokens (the rest
waits for the next update), so a long evicted prefix is summarised in bounded steps."""


# --------------------------------------------------------------------------- the worker


class _Worker:
    """One daemon thread running index jobs in order, with retries; bounded queue."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.Queue[tuple[float, Callable[[], None]] | None] = queue.Queue(
            MAX_QUEUED_JOBS
        )
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._busy = 0
        self._hurry = threading.Event()
        self.delayed = 0
        """Jobs that waited out :data:`INDEX_DELAY` (read by tests)."""
        _process.RECALL_WORKERS.add(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent's thread is not here and its lock may have been
        held at the fork; the jobs queued in the parent are the parent's (their rows are
        looked at again by a later turn of whichever process serves the session)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue = queue.Queue(MAX_QUEUED_JOBS)
        self._thread, self._busy = None, 0
        self._hurry = threading.Event()

    def submit(self, job: Callable[[], None]) -> bool:
        """Queue ``job`` (``False``: the queue is full)."""
        with self._lock:
            if self._pid != os.getpid():  # a forked child: the parent's thread is not here
                self._pid = os.getpid()
                self._queue = queue.Queue(MAX_QUEUED_JOBS)
                self._thread, self._busy = None, 0
                self._hurry = threading.Event()
            try:
                self._queue.put_nowait((time.monotonic() + INDEX_DELAY, job))
            except queue.Full:
                return False
            self._busy += 1
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="protoprompt-evictions", daemon=True
                )
                self._thread.start()
        return True

    def _run(self) -> None:
        q = self._queue
        while True:
            try:
                job = q.get(timeout=30.0)
            except queue.Empty:
                with self._lock:
                    if q.empty() and self._queue is q:
                        self._thread = None
                        return
                continue
            try:
                if job is not None:
                    due, work = job
                    wait = due - time.monotonic()
                    if wait > 0 and not self._hurry.wait(wait):
                        self.delayed += 1
                    work()
            finally:
                with self._lock:
                    self._busy -= 1
                    if not self._busy:
                        self._hurry.clear()
                    self._idle.notify_all()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until every queued job ran (``False``: ``timeout`` seconds passed first)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if self._busy:
                self._hurry.set()  # the jobs run now: someone waits for them
            while self._busy > 0 and self._pid == os.getpid():
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(left)
        return True


_process.RECALL_WORKERS.handle(
    after_fork=_Worker.after_fork_in_child,
    at_exit=lambda worker: worker.wait_idle(5.0),  # queued index jobs finish (bounded)
)
_process.RECALL_LEDGERS.handle(after_fork=lambda evictions: evictions.after_fork_in_child())


def _retried(what: str, attempt: Callable[[], None]) -> bool:
    """Run ``attempt`` up to ``1 + len(RETRY_DELAYS)`` times; log each failure."""
    for n in range(len(RETRY_DELAYS) + 1):
        try:
            attempt()
            return True
        except Exception as exc:  # noqa: BLE001 - logged; the rows are looked at again
            last = n == len(RETRY_DELAYS)
            _log.log(
                logging.WARNING if last else logging.INFO,
                "protoprompt: %s failed (attempt %d of %d): %s",
                what,
                n + 1,
                len(RETRY_DELAYS) + 1,
                exc,
            )
            if not last:
                time.sleep(RETRY_DELAYS[n])
    return False


# --------------------------------------------------------------------------- evictions


def _is_user(item: Any) -> bool:
    return message_text(item) is not None


class Evictions:
    """The evicted rows of the sessions a builder serves (see the module note)."""

    def __init__(self, builder: TokenBudgetedContextBuilder) -> None:
        self._builder = weakref.ref(builder)
        self._ledgers: weakref.WeakKeyDictionary[Any, Ledger] = weakref.WeakKeyDictionary()
        self._ledgers_lock = threading.Lock()
        self._worker = _Worker()
        self._tasks: set[asyncio.Task[None]] = set()
        self._ages: dict[tuple[str | None, str | None], int] = {}
        """By (model, encoding): the ages whose opening pieces :meth:`_warm` counted, 1 to this."""
        _process.RECALL_LEDGERS.add(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: new locks (one may have been held at the fork by a thread
        that is not here), and no summary update running (the parent's tasks are the
        parent's)."""
        self._ledgers_lock = threading.Lock()
        for ledger in list(self._ledgers.values()):
            ledger.lock = threading.Lock()
            ledger.summarizing = False
        self._tasks = set()

    @property
    def builder(self) -> TokenBudgetedContextBuilder:
        builder = self._builder()
        if builder is None:  # pragma: no cover - the builder owns this object
            raise RuntimeError("the builder of these evictions is gone")
        return builder

    def ledger(self, key: Any) -> Ledger:
        """The ledger of the stored session ``key`` stands for (weakly referenced)."""
        with self._ledgers_lock:
            found = self._ledgers.get(key)
            if found is None:
                found = self._ledgers[key] = Ledger()
            return found

    # ------------------------------------------------------------------ before the build

    def prepare(
        self,
        ledger: Ledger,
        items: Sequence[Any],
        offset: int,
        epoch: int,
        user_positions: Callable[[int, int], list[int]] | None,
        summaries: SummaryStore | None,
    ) -> TurnMemory:
        """This turn's number and the session's summary. ``items`` hold the history from
        ``offset`` on; ``user_positions(a, b)`` lists the user messages among the earlier
        positions (from the session's index)."""
        n = offset + len(items)
        with ledger.lock:
            if ledger.epoch is not None and ledger.epoch != epoch:
                ledger.reset()  # a pop, clear or rewrite: positions mean other rows now
            ledger.epoch = epoch
            if ledger.users_upto > n:
                ledger.users, ledger.users_upto = array("q"), 0
            start = ledger.users_upto
            turn: int | None = None
            try:
                if start < offset:
                    if user_positions is None:
                        raise LookupError("no index for the rows before the window")
                    ledger.users.extend(user_positions(start, offset))
                    start = offset
                ledger.users.extend(p for p in range(start, n) if _is_user(items[p - offset]))
                ledger.users_upto = n
                turn = len(ledger.users) + 1
            except Exception as exc:  # noqa: BLE001 - the turn number is cosmetic
                _log.debug("protoprompt: turn number unknown: %s", exc)
                ledger.users, ledger.users_upto = array("q"), 0
        summary: str | None = None
        if summaries is not None and self.builder.summarizer is not None:
            state = summaries.load()
            summary = state.text or None if state is not None else None  # "": cleared
        return TurnMemory(turn, summary)

    # ------------------------------------------------------------------ after the build

    def observe(self, ledger: Ledger, rows: TurnRows) -> Callable[[], None] | None:
        """What this turn evicted, as a callable that schedules its background work
        (``None``: nothing to do). Costs ``O(kept + held + rows added since)``."""
        n, offset = rows.n_history, rows.offset
        ids = rows.row_ids
        if ids is not None and len(ids) != n:
            return None  # the rows are not known for every position: a later turn
        with ledger.lock:
            if ledger.epoch != rows.epoch:
                ledger.reset()
                ledger.epoch = rows.epoch
            if ledger.frontier and not self._anchored(ledger, rows):
                ledger.reset()  # not the rows handed over before (another process)
            step = eviction_step(ledger.frontier, ledger.held, n, rows.kept)
            ledger.frontier, ledger.held = n, step.held
            ledger.anchor = self._anchor(rows, n - 1) if n else None
            users = tuple(ledger.users) if ledger.users_upto >= n else None
        index_job = None
        scope = rows.scope
        if self.builder.recall_evicted and scope is not None and (step.evicted or step.start < n):
            # Copies: the history list is the SDK's, and the session's row ids grow.
            job_ids = None
            if ids is not None:  # the held ones by position, the rest as one slice
                job_ids = ({p: int(ids[p]) for p in step.evicted}, array("q", ids[step.start : n]))
            kept = set(rows.kept)
            index_job = self._indexed(
                IndexJob(
                    self.builder.store,
                    ledger,
                    rows.session_id,
                    scope,
                    step.evicted,
                    (step.start, n, kept),
                    offset,
                    list(rows.items),
                    job_ids,
                    rows.fetch,
                    users,
                    self._warm,
                )
            )
        summary_job = None
        if self.builder.summarizer is not None and rows.summaries is not None:
            summary_job = self._summary_job(ledger, rows)
        if index_job is None and summary_job is None:
            return None

        def schedule() -> None:
            if index_job is not None and not self._worker.submit(index_job):
                _log.info(
                    "protoprompt: %d index jobs are waiting: the rows evicted by this turn "
                    "of session %r are left to a later turn",
                    MAX_QUEUED_JOBS,
                    rows.session_id,
                )
                with ledger.lock:
                    ledger.reset()
            if summary_job is not None:
                self._start(summary_job, ledger)

        return schedule

    def _warm(self, pieces: list[str], turn: int | None) -> None:
        """Count ``pieces`` of passages just indexed (in the index job), as the builder's
        turns count them when they recall them, and the first pieces of the openings of
        the ages up to ``turn`` not counted before (kept in the count memo: the turn that
        first recalls a passage finds its counts)."""
        builder = self._builder()
        if builder is None:
            return
        if turn is not None and builder.encoding not in UNSPLIT_ENCODINGS:
            key, upto = (builder.model, builder.encoding), turn + AGES_AHEAD
            done = self._ages.get(key, 0)
            pieces = pieces + [age_piece(ago) for ago in range(done + 1, upto + 1)]
            self._ages[key] = max(done, upto)
        builder._count_batch(pieces)

    @staticmethod
    def _indexed(job: IndexJob) -> Callable[[], None]:
        """``job`` with retries; a job that failed for good has its rows looked at again by
        the next turn."""

        def run() -> None:
            if not _retried(f"indexing the evicted rows of session {job.session_id!r}", job.run):
                with job.ledger.lock:
                    job.ledger.reset()

        return run

    @staticmethod
    def _anchor(rows: TurnRows, p: int) -> int | str | None:
        if rows.row_ids is not None:
            return int(rows.row_ids[p])
        if p >= rows.offset:
            return item_digest(rows.items[p - rows.offset])
        return None

    def _anchored(self, ledger: Ledger, rows: TurnRows) -> bool:
        p = ledger.frontier - 1
        return p < rows.n_history and self._anchor(rows, p) == ledger.anchor

    # ------------------------------------------------------------------ summaries

    def _summary_job(self, ledger: Ledger, rows: TurnRows) -> _SummaryJob | None:
        kept = set(rows.kept) - set(rows.dependency)
        end = min(kept) if kept else rows.n_history  # the evicted prefix is [0, end)
        if end <= 0:
            return None
        # Copies: the history list is the SDK's, and the session's row ids change.
        ids = None if rows.row_ids is None else array("q", rows.row_ids)
        return _SummaryJob(self, ledger, replace(rows, items=list(rows.items), row_ids=ids), end)

    def _start(self, job: _SummaryJob, ledger: Ledger) -> None:
        """Start ``job`` as a task on the running loop, unless one of the session runs."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        with ledger.lock:
            if ledger.summarizing:
                return
            ledger.summarizing = True
        task = loop.create_task(job.run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ forgetting

    def forget(self, scope: MemoryScope, session_id: str, from_row: int | None = None) -> int:
        """Delete the session's recall records (from ``from_row`` on), waiting first for
        index jobs already queued (so none writes them back)."""
        if not self.builder.recall_evicted:
            return 0
        self._worker.wait_idle(30.0)
        store = self.builder.store
        return int(store.forget_history(session_id, scope=scope, from_row=from_row))

    def forget_rows(self, scope: MemoryScope, session_id: str, rows: list[int]) -> None:
        """Delete the records of ``rows`` of the session only, waiting first for index jobs
        already queued (so none writes them back)."""
        if not self.builder.recall_evicted or not rows:
            return
        self._worker.wait_idle(30.0)
        records = [HistoryRecord(row, "") for row in rows]  # blank: the row goes
        self.builder.store.index_history(session_id, records, scope=scope)

    async def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._tasks:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            done, _ = await asyncio.wait(set(self._tasks), timeout=left)
            if not done:
                return False
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        return await asyncio.to_thread(self._worker.wait_idle, left)


# --------------------------------------------------------------------------- jobs


class _SummaryJob:
    """Fold the newly evicted prefix into the session's summary (a task on the loop)."""

    def __init__(self, owner: Evictions, ledger: Ledger, rows: TurnRows, end: int) -> None:
        self.owner = owner
        self.ledger = ledger
        self.rows = rows
        self.end = end

    async def run(self) -> None:
        try:
            await self._run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the previous summary stays
            _log.warning(
                "protoprompt: the summary of session %r was not updated: %s",
                self.rows.session_id,
                exc,
            )
        finally:
            with self.ledger.lock:
                self.ledger.summarizing = False

    def _key(self, p: int) -> int:
        ids = self.rows.row_ids
        return p if ids is None else int(ids[p])

    def _first(self, state: SummaryState | None) -> int:
        """The first position the summary does not cover."""
        if state is None:
            return 0
        ids = self.rows.row_ids
        if ids is None:
            return min(state.upto, self.rows.n_history)
        return bisect.bisect_left(ids, state.upto)

    async def _run(self) -> None:
        builder = self.owner.builder
        rows = self.rows
        store = rows.summaries
        summarizer = builder.summarizer
        assert store is not None and summarizer is not None
        state = await asyncio.to_thread(store.load)
        first = self._first(state)
        if first >= self.end:
            return
        if first < rows.offset and rows.fetch is None and rows.read_all is not None:
            await self._read_before_window()
        items, tokens = await asyncio.to_thread(self._gather, first)
        if tokens < builder.summarize_every:
            return
        previous = state.text or None if state is not None else None  # "": cleared
        limit = builder.summary_tokens
        text: str | None = None
        for n in range(len(RETRY_DELAYS) + 1):
            try:
                try:
                    out = await asyncio.wait_for(
                        summarizer(list(items), previous, limit), SUMMARY_TIMEOUT
                    )
                except asyncio.TimeoutError:
                    raise TimeoutError(
                        f"the summarizer did not answer within {SUMMARY_TIMEOUT:g} s"
                    ) from None
                if not isinstance(out, str):
                    raise TypeError(f"the summarizer returned {type(out).__name__}, not a str")
                text = out
                break
            except Exception as exc:  # noqa: BLE001 - retried, then the summary stays
                last = n == len(RETRY_DELAYS)
                _log.log(
                    logging.WARNING if last else logging.INFO,
                    "protoprompt: summarizing session %r failed (attempt %d of %d): %s",
                    rows.session_id,
                    n + 1,
                    len(RETRY_DELAYS) + 1,
                    exc,
                )
                if last:
                    return
                await asyncio.sleep(RETRY_DELAYS[n])
        if text is None or not text.strip():
            return
        text = truncate_text(text, limit, model=builder.model, encoding=builder.encoding)
        upto = self._key(first + len(items) - 1) + 1
        await asyncio.to_thread(store.save, state, text, upto)
        with self.ledger.lock:
            self.ledger.pending = None

    async def _read_before_window(self) -> None:
        """The whole history through the inner session (rows keyed by position, before the
        turn's window: SQLAlchemy, Redis), checked to be the turn's history still."""
        rows = self.rows
        assert rows.read_all is not None
        items = await rows.read_all()
        if len(items) < rows.n_history or list(items[rows.offset : rows.n_history]) != list(
            rows.items
        ):
            raise RuntimeError("the history changed since the turn: a later turn summarises")
        self.rows = replace(rows, items=list(items[: rows.n_history]), offset=0)

    def _gather(self, first: int) -> tuple[list[Any], int]:
        """The evicted prefix from ``first`` on, oldest first, up to a batch's tokens
        (``SUMMARY_BATCH_FACTOR``), and their tokens as rendered text."""
        builder = self.owner.builder
        cap = builder.summarize_every * SUMMARY_BATCH_FACTOR
        end = self.end
        with self.ledger.lock:
            pending = self.ledger.pending
        if (
            pending is not None
            and pending[:2] == (first, end)
            and pending[2] < builder.summarize_every
        ):
            return [], pending[2]  # counted before, nothing new since
        items: list[Any] = []
        total = 0
        p = first
        while p < end:
            q = min(end, p + BATCH)
            chunk = self._items(p, q)
            names = tool_names(chunk)
            texts = [r.text if (r := render_item(i, names)) is not None else "" for i in chunk]
            counts = count_tokens_batch(texts, model=builder.model, encoding=builder.encoding)
            for item, c in zip(chunk, counts, strict=True):
                items.append(item)
                total += c
                if total >= cap:
                    return items, total
            p = q
        with self.ledger.lock:
            self.ledger.pending = (first, end, total)
        return items, total

    def _items(self, first: int, end: int) -> list[Any]:
        rows = self.rows
        before = list(range(first, min(end, rows.offset)))
        found: dict[int, Any] = {}
        if before:
            if rows.fetch is None or rows.row_ids is None:
                raise RuntimeError("rows before the window cannot be read")
            found = rows.fetch([int(rows.row_ids[p]) for p in before])
        items = [found[int(rows.row_ids[p])] for p in before if rows.row_ids is not None]
        if len(items) != len(before):
            raise RuntimeError("rows of the evicted prefix are gone")
        start = max(first, rows.offset)
        items.extend(rows.items[p - rows.offset] for p in range(start, end))
        return items
