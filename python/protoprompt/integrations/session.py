"""The session: :class:`ProtoPromptSession`, the SDK's ``Session`` protocol over an inner
session, with its index of the stored history.

See :mod:`protoprompt.integrations.agents` for the overview. The session's other jobs live in
``_run_hooks`` (its input callback, model filter and ``RunConfig``), ``_turn`` (one turn's
plan and report), ``_context`` (context messages; the run ledger the callback writes and the
model filter reads), ``_reads`` and ``_window`` (whole reads and token windows), ``_sync``
(the row reads and the index-sync decision), ``_snapshots`` (the index state and its
snapshots), ``pool`` (the process-wide index pool), ``_hooks`` (the optional SDK hooks),
``_posing`` (posing as an ``SQLiteSession``), ``_options`` (argument checks) and ``_shims``
(inner-session calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sqlite3
import threading
import warnings
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any

from .._seams import session_closed
from ..calibration import Calibration
from ..count_store import RemoteCountStore, SQLiteCountStore
from . import pool
from ._sdk._names import Session, SessionSettings, SQLiteSession
from ._sdk._posing import sqlite_backed
from ._sdk._probes import SQLITE_VALIDATED_POP, called_by_compaction_rewrite
from ._sdk._shims import call, coerce_settings
from ._sdk._unbudgeted import unbudgeted_run, warn_unbudgeted
from ._stores import _sync
from ._stores._snapshots import DEFAULT_SNAPSHOT_MIN_ITEMS, IndexState
from ._stores._store import HistoryStore, StoreReadError, Unsupported, open_store
from ._turns._context import LAST_READ, ContextBook, RunLedger, SessionRead, is_encrypted_envelope
from ._turns._debug import DebugState
from ._turns._evicted import SessionMemory, served
from ._turns._hooks import InnerHooks
from ._turns._options import check_inner_session, non_negative_int, off_reasons, positive_int
from ._turns._reads import read_history
from ._turns._run_hooks import RunHooks, SessionInputCallback
from ._turns._turn import TurnSetup
from ._turns._window import Refused, Turn, read_window, runner_turn, window_keep

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..context import TokenBudgetedContextBuilder
    from ..memory import MemoryScope

__all__ = ["ProtoPromptSession", "SessionInputCallback"]

Item = Any
"""An input item as the SDK hands it over (a dict in practice)."""

_log = logging.getLogger("protoprompt")


async def _quietly(what: str, work: Awaitable[Any]) -> None:
    """Await ``work``; a failure is logged (the session's own change already happened)."""
    try:
        await work
    except Exception as exc:  # noqa: BLE001 - memory upkeep never fails a session call
        _log.warning("protoprompt: %s failed: %s", what, exc)


class ProtoPromptSession(RunHooks, InnerHooks):
    """An Agents SDK ``Session`` whose input callback fits every request into a token budget.

    It implements the SDK's ``Session`` protocol (``isinstance(s, agents.memory.Session)``)
    and stores history in the SDK's own ``SQLiteSession`` — or in ``inner_session``, any
    SDK session (SQLAlchemy, Redis, your own) — with the upstream meaning of every method:
    ``get_items(limit)`` returns the latest ``limit`` items in order, ``pop_item`` removes
    the newest one (the correction workflow — pop twice, run again — works unchanged) and
    ``clear_session`` empties this session's history. Long-term memory lives in a
    :class:`~protoprompt.memory.MemoryStore` and is never touched by the session.

    A drop-in for ``SQLiteSession``: it takes the same arguments, validates ``session_settings``
    the same way, and when the history lives in a native ``SQLiteSession`` it is an instance of
    ``SQLiteSession`` (a private subclass; every method is ProtoPromptSession's), so
    ``EncryptedSession`` authenticates a pop inside the SQLite transaction as it does over
    ``SQLiteSession``. The optional hooks the SDK probes on a session are passed on from the
    inner session (docs/item-graph.md §11.3); for compaction wrap it as
    ``OpenAIResponsesCompactionSession(session_id, ProtoPromptSession(...))``.

    Args:
        session_id: non-empty id of the conversation.
        db_path: SQLite file for the default ``SQLiteSession`` (``":memory:"`` by default).
        inner_session: store history in this session instead (then ``db_path`` must be
            left at its default and its ``session_id`` must equal ``session_id``).
        session_settings: default read settings (``SessionSettings`` or a dict such as
            ``{"limit": 50}``).
        incremental: keep a :class:`~protoprompt.HistoryIndex` of the stored history so a
            turn costs what is new and what is kept, not the whole history (same requests
            either way). ``None`` (default): on when the history lives in an
            ``SQLiteSession``; in a database file, ``get_items`` then reads the rows itself
            (the same items as ``SQLiteSession.get_items``, with their row ids) and the
            index is compared with exactly those rows, so writes by other processes or
            session objects are noticed. ``True`` for another inner session asserts that
            only this object changes that session's history.
        sessions_table, messages_table: table names of the default ``SQLiteSession`` (as
            in ``SQLiteSession``; with ``inner_session`` leave them at their defaults).
        windowed_reads: let the runner's read before a turn return only the newest stored
            items the budget of this session's :meth:`input_callback` can reach, instead of
            the whole history (the SDK then works on those only; the request is the same).
            On by default; ``False`` turns it off. Needs a database file (``db_path``, or an
            SQLAlchemy / Redis inner session) and the ``"contiguous"`` policy: otherwise every
            read is whole and each turn's plan says why on its ``read:`` line (e.g.
            ``read: full (memory database: windows need a database file; ...)``). Every other
            read — yours, ``pop_item`` corrections, compaction, resuming a run — sees the
            whole history as before, and so does a read the session cannot prove a window
            for (then the turn costs what it costs without windowing).
        snapshot_min_items: with a database file, the index is saved to it (table
            ``protoprompt_index_snapshots``) once it holds this many items, again each time
            it has grown by an eighth (at least this many items), and on :meth:`close`; a
            restarted process loads it instead of classifying the whole history. Shorter
            histories are not snapshotted (reading them again takes a few ms); a huge value
            turns snapshots off. Default 512.
        shared_index_bytes: session objects of one process for the same stored session
            (database file, table, session id) share one index, so a server that builds a
            session per request still gets warm turns. The pool of this process keeps the
            most recently used indexes up to this many bytes (about 0.23 KB per history
            item), trimmed after each turn of this session to this session's value; an
            index dropped from it stays with the objects that hold it. ``0`` keeps only the
            most recent one. Default 256 MiB.
        max_open_readers: with a database file, token counts are kept in it through a
            :class:`~protoprompt.SQLiteCountStore` (one per file, shared by its sessions);
            the count stores of this process keep at most this many reader connections
            (file descriptors) open, least recently used closed first (see the store's
            ``max_open_readers``; the session made last for a file sets its store's).
            Default 32.

    With a database file, token counts of long items are also kept in it (table
    ``protoprompt_token_counts``, see :class:`~protoprompt.SQLiteCountStore`), so the first
    turn after a restart does not tokenise the kept history again. The table holds keyed
    hashes and counts only, never text; ``clear_session`` leaves it (it is a cache shared
    by the database's sessions, bounded in size).

    Raises:
        TypeError: ``session_id`` is not a str, ``inner_session`` is not a ``Session``,
            ``session_settings`` has an unknown key (``Unknown session settings: ...``),
            or ``snapshot_min_items`` / ``shared_index_bytes`` / ``max_open_readers`` is not
            an int.
        ValueError: ``session_id`` is empty, ``inner_session`` conflicts with the other
            arguments or is an ``OpenAIConversationsSession`` (server-managed history),
            ``snapshot_min_items`` or ``max_open_readers`` is below 1, or
            ``shared_index_bytes`` below 0.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        inner = kwargs.get("inner_session")
        if (
            SQLITE_VALIDATED_POP
            and (inner is None or type(inner) is SQLiteSession)
            and not issubclass(cls, SQLiteSession)
        ):
            cls = sqlite_backed(cls, ProtoPromptSession)
        return super().__new__(cls)

    def __init__(
        self,
        session_id: str,
        db_path: str | os.PathLike[str] = ":memory:",
        *,
        inner_session: Session | None = None,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
        incremental: bool | None = None,
        sessions_table: str = "agent_sessions",
        messages_table: str = "agent_messages",
        windowed_reads: bool = True,
        snapshot_min_items: int = DEFAULT_SNAPSHOT_MIN_ITEMS,
        shared_index_bytes: int = pool.DEFAULT_SHARED_INDEX_BYTES,
        max_open_readers: int = SQLiteCountStore.DEFAULT_MAX_OPEN_READERS,
    ) -> None:
        if not isinstance(windowed_reads, bool):
            raise TypeError(f"windowed_reads must be a bool, got {type(windowed_reads).__name__}")
        self._snapshot_min_items = positive_int("snapshot_min_items", snapshot_min_items)
        self._shared_index_bytes = non_negative_int("shared_index_bytes", shared_index_bytes)
        max_open_readers = positive_int("max_open_readers", max_open_readers)
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
        if not session_id.strip():
            raise ValueError("session_id must be a non-empty string")
        settings = coerce_settings(session_settings)
        self.session_id = session_id
        if inner_session is None:
            self._inner: Any = SQLiteSession(
                session_id,
                os.fspath(db_path),
                sessions_table=sessions_table,
                messages_table=messages_table,
                session_settings=settings,
            )
            self._owns_inner = True
            self._settings: SessionSettings | None = None
        else:
            check_inner_session(inner_session, session_id, db_path, sessions_table, messages_table)
            self._inner = inner_session
            self._owns_inner = False
            self._settings = settings
        if incremental is not None and not isinstance(incremental, bool):
            raise TypeError(f"incremental must be a bool or None, got {type(incremental).__name__}")
        sqlite_inner = (
            isinstance(self._inner, SQLiteSession)
            and type(self._inner).get_items is SQLiteSession.get_items
        )
        # The history store: reads the rows the way the inner session does, with their keys,
        # so the index is compared with exactly the rows the SDK hands over (see _store).
        opened = open_store(self._inner, session_id)
        self._store: HistoryStore | None = None if isinstance(opened, Unsupported) else opened
        # A memory SQLiteSession has no other writer: its index is trusted between pops.
        self._incremental = (
            (self._store is not None or sqlite_inner) if incremental is None else incremental
        )
        if not self._incremental and self._store is not None:
            self._store.close()
            self._store = None
        self._shared_key: pool.Key | None = None
        self._max_open_readers = max_open_readers
        self._attached = self._store is None
        self._index_state = IndexState()
        if self._store is not None and self._store.kind == "sqlite":
            self._attach_state()  # no I/O of its own: at once
        # Token windows need the rows with their keys (a store) and the index.
        self._windowed_reads = windowed_reads and self._store is not None
        # Why a fast path is off for good, for the turn reports (turn_report's tables).
        self._no_window, self._no_window_detail, self._no_store = off_reasons(
            windowed_reads, opened
        )
        # What the callback produced and the SDK must not store; the runs it starts.
        self._book = ContextBook()
        self._ledger = RunLedger(self, self._book, lambda: (self._index_state, self._incremental))
        self._warned_wrapped = False
        self._warned_unbudgeted = False
        self._window_reads = 0
        self._last_window_offset: int | None = None
        self._calibration: Calibration | None = None
        self._calibration_lock = threading.Lock()
        # Builders with recall of evicted turns or a summarizer this session served.
        self._memories: list[SessionMemory] = []

    @property
    def calibration(self) -> Calibration:
        """A :class:`~protoprompt.Calibration` kept in this session's database (table
        ``protoprompt_calibration``) when it is a SQLite file, so every process serving it
        learns from and uses the same one; otherwise (a memory database, an inner session
        of another kind, or a file that cannot be written) one kept by this object. Pass it
        to the builder (``TokenBudgetedContextBuilder(..., calibration=...)``) to opt in."""
        with self._calibration_lock:
            if self._calibration is None:
                db = getattr(self._inner, "db_path", None)
                path: str | None = None
                if isinstance(self._inner, SQLiteSession) and isinstance(db, (str, os.PathLike)):
                    path = os.fspath(db)
                try:
                    self._calibration = Calibration(path)
                except (sqlite3.Error, OSError) as exc:
                    _log.debug("protoprompt: calibration of %r kept in memory: %s", path, exc)
                    self._calibration = Calibration()
            return self._calibration

    # ------------------------------------------------------------------ Session protocol

    @property
    def inner_session(self) -> Any:
        """The session that stores the history."""
        return self._inner

    @property
    def session_settings(self) -> SessionSettings | None:
        """Default read settings: our own if set, else the inner session's."""
        if self._settings is not None:
            return self._settings
        return getattr(self._inner, "session_settings", None)

    @session_settings.setter
    def session_settings(self, value: SessionSettings | Mapping[str, Any] | None) -> None:
        self._settings = coerce_settings(value)

    async def get_items(self, limit: int | None = None, wrapper: Any = None) -> list[Item]:
        """The history, or its latest ``limit`` items in chronological order."""
        if limit is None and self._settings is not None:
            limit = self._settings.limit
        limited = limit is not None or getattr(self.session_settings, "limit", None) is not None
        closed = session_closed(self._inner)
        # Before the first await: the runner's frame is found on the stack.
        turn = runner_turn(self) if self._windowed_reads and not limited and not closed else None
        if not self._warned_unbudgeted and unbudgeted_run(self):
            self._warned_unbudgeted = True
            warn_unbudgeted(self.session_id)
        await self._attach()
        state = self._index_state
        epoch = state.epoch
        store = self._store
        refused = Refused("session_limit") if limited else self._refused_window()
        if turn is not None:
            # Not told apart by `wrapper`: the SDK passes it only when every method takes it,
            # and a pop_item inherited from SQLiteSession (0.24) does not, so it is None here.
            if isinstance(turn, Refused):
                refused = turn
            else:
                found = await self._read_window(*turn)
                if not isinstance(found, Refused):
                    items, facts = found
                    self._window_reads += 1
                    self._last_window_offset = facts.offset
                    LAST_READ.set(SessionRead(self, dataclasses.replace(facts, epoch=epoch)))
                    return items
                refused = found
        items, facts = await read_history(
            state,
            store if not limited and not closed else None,
            self._inner,
            self.session_id,
            limit=limit,
            wrapper=wrapper,
            limited=limited,
            refused=refused,
            epoch=epoch,
            has_store=store is not None,
        )
        LAST_READ.set(SessionRead(self, facts))
        return items

    def _refused_window(self) -> Refused:
        """Why a read is not a window when nothing else says so: windows are off for this
        session, or (with a store) the index does not know the rows yet."""
        return Refused(self._no_window, self._no_window_detail)

    async def _read_window(
        self, turn: Turn, new_items: list[Any]
    ) -> tuple[list[Any], _sync.ReadFacts] | Refused:
        """The token window of this read (see ``_window.read_window``), or why not."""
        if self._store is None:  # pragma: no cover - windowed reads need a store
            return self._refused_window()
        try:
            return await read_window(
                self._index_state, self._store, self.session_id, turn, new_items
            )
        except StoreReadError as exc:
            _log.debug("protoprompt: window of %r not read: %s", self.session_id, exc)
            return Refused("read_failed", str(exc))

    def _attach_state(self) -> None:
        """Take this stored session's index from the process's pool, and its database's
        count store (once the store knows the database's id; else an index of its own)."""
        store = self._store
        self._attached = True
        if store is None or store.key is None:
            return
        self._shared_key = store.key
        state = pool.shared_state(store.key, store.snapshots)
        counts = state.index.count_store
        if counts is None:
            # Token counts outlive the process in the same database.
            state.index.count_store = store.count_store(self._max_open_readers)
        elif isinstance(counts, SQLiteCountStore):
            counts.max_open_readers = self._max_open_readers
        self._index_state = state

    async def _attach(self) -> None:
        """On the first call that reaches the database: open the store (the database's id,
        protoprompt's tables) and take the pooled index (see :meth:`_attach_state`)."""
        if self._attached or self._store is None:
            return
        await self._store.open()
        if not self._attached:
            self._attach_state()

    async def add_items(self, items: list[Item], wrapper: Any = None) -> None:
        """Append ``items``, except the context messages this session's callback produced."""
        pending = self.pending_context_count
        kept = self._book.without_own(items)
        if (
            pending
            and len(kept) == len(items)
            and not self._warned_wrapped
            and any(is_encrypted_envelope(i) for i in kept)
        ):
            self._warned_wrapped = True
            warnings.warn(
                "ProtoPromptSession is wrapped by an EncryptedSession, which encrypts items "
                "before they reach it: the callback's context message cannot be told apart "
                "and is stored. Wrap the other way round: "
                "ProtoPromptSession(session_id, inner_session=EncryptedSession(...))",
                RuntimeWarning,
                stacklevel=2,
            )
        if items and not kept:
            return
        await call(self._inner.add_items, kept, wrapper=wrapper)

    async def pop_item(self, wrapper: Any = None) -> Item | None:
        """Remove and return the newest item (``None`` when the session is empty); the
        recall record of its row, if any, goes too."""
        await self._attach()
        state = self._index_state
        state.bump()
        if self._store is not None:
            await self._store.before_rewrite()
        try:
            item = await call(self._inner.pop_item, wrapper=wrapper)
        finally:
            state.bump()
            if self._store is not None:
                await self._store.after_rewrite()
        if item is not None:
            await self._popped(item)
        return item

    async def _popped(self, item: Item) -> None:
        """Forget the recall record of a popped row (every builder this session served)."""
        loop = asyncio.get_running_loop()

        def length() -> int:
            items = asyncio.run_coroutine_threadsafe(call(self._inner.get_items), loop).result()
            return len(items)

        for memory in self._memories_to_forget():
            await _quietly(
                "forgetting a popped row", asyncio.to_thread(memory.popped, item, length)
            )

    def _memories_to_forget(self) -> list[SessionMemory]:
        """The seams of every builder that may hold records or a summary of this stored
        session: those this object served, and those this process's other session objects
        served (a server makes one object per request)."""
        for builder, scope in served(self._shared_key):
            self._session_memory(builder, scope)
        return list(self._memories)

    def _session_memory(
        self, builder: TokenBudgetedContextBuilder, scope: MemoryScope | None
    ) -> SessionMemory | None:
        """The seam to ``builder``'s evictions for this session (``None``: it has none)."""
        evictions = getattr(builder, "_evictions", None)
        if evictions is None:
            return None
        for memory in self._memories:
            if memory.builder is builder and memory.given_scope == scope:
                return memory
        memory = SessionMemory(
            self,
            builder,
            evictions,
            scope,
            index_state=lambda: self._index_state,
            store_kind=None if self._store is None else self._store.kind,
            stored_key=lambda: self._shared_key,
        )
        self._memories.append(memory)
        return memory

    async def clear_session(self, wrapper: Any = None) -> None:
        """Remove this session's history. Long-term memory (the MemoryStore) is untouched,
        except the recall records and summary of what this session evicted (builders with
        ``recall_evicted`` or a ``summarizer`` that served it through any session object of
        this process, in their own scope and the scopes they were given for it; their own
        scope also for other processes' builders), which go with it; a compaction session's
        clear-and-add rewrite keeps them."""
        rewrite = called_by_compaction_rewrite()  # before the first await: the caller's frame
        await self._attach()
        self._book.clear()
        self._index_state.bump()
        if self._store is not None:
            await self._store.before_rewrite()
        try:
            await call(self._inner.clear_session, wrapper=wrapper)
        finally:
            self._index_state.bump()
            if self._store is not None:
                await self._store.after_rewrite()
        if self._index_state.snapshot_at is not None:
            await asyncio.to_thread(self._index_state.forget_snapshot)
        if self._store is not None and not rewrite:
            for state in (self._store.prefixes, self._store.turns):
                if state is not None:
                    await asyncio.to_thread(state.delete)  # the stored requests too
        # The session's recall records and summary go too (whichever object recorded them).
        for memory in self._memories if rewrite else self._memories_to_forget():
            if rewrite:
                memory.rewritten()
            else:
                await _quietly("forgetting the evicted turns", asyncio.to_thread(memory.cleared))

    def close(self) -> None:
        """Close the default ``SQLiteSession`` (an ``inner_session`` is left to its owner).

        Token counts still queued for the database are written first (up to 5 s), and the
        index snapshot if the index has grown since it was saved (see
        ``snapshot_min_items``)."""
        state = self._index_state
        state.wait_for_save()
        if len(state.index) >= self._snapshot_min_items:
            state.save()
        store = state.index.count_store
        if isinstance(store, (SQLiteCountStore, RemoteCountStore)):
            store.flush(timeout=5.0)
        if self._store is not None:
            self._store.close()
        if self._owns_inner:
            self._inner.close()

    def _debug_state(self, *, wait_for_save: bool = False) -> DebugState:
        """What this object holds behind its requests now (see :class:`DebugState`): the one
        view of the index's mechanisms for tests and debugging. ``wait_for_save``: first wait
        for an index snapshot being written in the background."""
        state = self._index_state
        if wait_for_save:
            state.wait_for_save()
        return DebugState(
            incremental=self._incremental,
            reads_rows=self._store is not None,
            windowed_reads=self._windowed_reads,
            index_id=state.serial,
            shared=self._shared_key is not None and pool.is_shared(self._shared_key, state),
            index_items=len(state.index),
            epoch=state.epoch,
            restore_tried=state.restore_tried,
            snapshot_items=state.saved_len,
            count_store=state.index.count_store,
            window_reads=self._window_reads,
            last_window_offset=self._last_window_offset,
        )

    def __repr__(self) -> str:
        return f"ProtoPromptSession({self.session_id!r}, inner={type(self._inner).__name__})"

    # ------------------------------------------------------------------ context bookkeeping

    @property
    def run_ledger(self) -> RunLedger:
        """The record of the runs this session's callback starts (its context message and
        new input), which its :meth:`model_input_filter` reads."""
        return self._ledger

    @property
    def pending_masked_count(self) -> int:
        """Masked copies handed out by direct calls of the callback and not yet seen in
        ``add_items`` (in a run the SDK never hands them over to store)."""
        return self._book.pending_masked

    @property
    def pending_context_count(self) -> int:
        """Context messages produced by the callback and not yet seen in ``add_items``
        (those of direct calls: in a run the SDK never hands the message over to store)."""
        return self._book.pending_contexts

    # ------------------------------------------------------------------ the callback

    def _window_keep(self, facts: _sync.ReadFacts) -> tuple[int, _sync.RowIds] | None:
        """What of the index still holds for a token window read before the index changed
        (see ``_window.window_keep``; caller holds the state's lock)."""
        return window_keep(self._index_state, facts)

    def _turn_setup(self) -> TurnSetup:
        """What this session contributes to a turn (see ``_turn``)."""
        return TurnSetup(
            session_id=self.session_id,
            state=self._index_state,
            incremental=self._incremental,
            windowed_reads=self._windowed_reads,
            snapshot_min_items=self._snapshot_min_items,
            shared_key=self._shared_key,
            shared_index_bytes=self._shared_index_bytes,
            store=self._store,
            no_store=self._no_store,
            window_keep=self._window_keep,
        )
