"""The session: :class:`ProtoPromptSession`, its budgeted input callback and its model filter.

See :mod:`protoprompt.integrations.agents` for the overview; the jobs it relies on live in
``_context`` (context messages, the hand-off to the callback), ``_sync`` (the row reads and
the index-sync decision), ``_snapshots`` (the index state and its snapshots), ``pool`` (the
process-wide index pool), ``_window`` (token windows) and ``_shims`` (inner-session calls).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import sqlite3
import threading
import warnings
from array import array
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ..calibration import Calibration
from ..count_store import CountStore, RemoteCountStore, SQLiteCountStore
from ..errors import ProtoPromptError
from ..packing import canonical_text, preload
from ..turn_report import (
    IndexMode,
    ReadMode,
    SnapshotState,
    StoreState,
    TurnReport,
    fallback_cost,
    index_outcome,
)
from . import _sdk, _sync, pool
from ._agent import agent_request, model_name
from ._context import (
    LAST_READ,
    MAX_PENDING_CONTEXTS,
    MAX_PENDING_MASKED,
    RUN_INPUT,
    Read,
    RunInput,
    context_key,
    is_encrypted_envelope,
)
from ._evicted import SessionMemory, called_by_compaction_rewrite
from ._request import RequestCosts
from ._sdk import (
    OpenAIConversationsSession,
    RunConfig,
    Session,
    SessionSettings,
    SQLiteSession,
)
from ._shims import (
    FORWARDED_HOOKS,
    NOT_FORWARDED,
    SQLITE_VALIDATED_POP,
    accepts_keyword,
    call,
    coerce_settings,
)
from ._snapshots import DEFAULT_SNAPSHOT_MIN_ITEMS, IndexState
from ._store import HistoryStore, StoreReadError, Unsupported, open_store
from ._window import (
    TURN_ATTR,
    Refused,
    Turn,
    called_by_runner,
    read_window,
    runner_turn,
    window_keep,
)
from .compaction import REWRITING

if TYPE_CHECKING:
    from typing_extensions import Self

    from ..context import ContextPlan, TokenBudgetedContextBuilder
    from ..memory import MemoryScope
    from ._sdk import Agent
    from .audit import BudgetAudit
    from .model_filter import ModelCallPlan, ModelInputFilter, OversizedOutput

__all__ = ["ProtoPromptSession", "SessionInputCallback"]

Item = Any
"""An input item as the SDK hands it over (a dict in practice)."""
SessionInputCallback = Callable[[list[Item], list[Item]], Awaitable[list[Item]]]

_log = logging.getLogger("protoprompt")


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1, got {value}")
    return value


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be at least 0, got {value}")
    return value


@dataclasses.dataclass(frozen=True)
class DebugState:
    """What a :class:`ProtoPromptSession` object holds behind its requests, at one moment
    (``session._debug_state()``): for tests and debugging of the index's mechanisms. A
    request never depends on it — every request equals a fresh ``pp.pack`` of the history
    the SDK handed over, whatever it says."""

    incremental: bool
    """The session keeps a :class:`~protoprompt.HistoryIndex` of the stored history."""
    reads_rows: bool
    """``get_items`` reads the rows itself, with their ids, and compares them with the
    index (a database file); else the index is trusted between this object's own pops
    and clears."""
    windowed_reads: bool
    """Token windows are in effect (``windowed_reads=True`` with a database file)."""
    index_id: int
    """Identifies the index state: equal for the objects that share one index, new when an
    object gets a fresh one (never reused in a process)."""
    shared: bool
    """The index is the process pool's for this stored session (objects made for it now
    get this one); ``False`` without a database file, or once dropped from the pool."""
    index_items: int
    """Items the index holds (the stored history it was last synced with)."""
    epoch: int
    """Bumped around every pop, clear and history rewrite through any object sharing the
    index: an index synced at another epoch is not trusted without comparing rows."""
    restore_tried: bool
    """A stored snapshot of the index was looked for (``True`` without a database file)."""
    snapshot_items: int
    """Items in the snapshot this index last wrote or loaded (0: none)."""
    count_store: CountStore | None
    """Where token counts outlive the process (one ``SQLiteCountStore`` per database file)."""
    window_reads: int
    """Reads of this object answered with a token window (only the newest items)."""
    last_window_offset: int | None
    """Stored items before the newest such window (``None`` before the first one)."""


_S = TypeVar("_S", bound="ProtoPromptSession")

_SQLITE_BACKED: dict[type[Any], type[Any]] = {}


def _sqlite_backed(cls: type[_S]) -> type[_S]:
    """``cls`` made an ``SQLiteSession`` subclass, for sessions stored in a native one.

    Code that treats a native ``SQLiteSession`` specially — ``EncryptedSession`` authenticates
    a pop inside the SQLite transaction when ``type(s).pop_item is SQLiteSession.pop_item`` —
    then treats a ProtoPromptSession over one the same way. Every method is still
    ProtoPromptSession's (it comes first in the MRO); ``pop_item`` is SQLiteSession's own,
    which only calls ``_pop_item_with_validation`` (below), unless ``cls`` overrides it."""
    variant: type[_S] | None = _SQLITE_BACKED.get(cls)
    if variant is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            "_pop_item_with_validation": _pop_item_with_validation,
        }
        if cls.pop_item is ProtoPromptSession.pop_item:
            namespace["pop_item"] = SQLiteSession.pop_item
        variant = _SQLITE_BACKED[cls] = cast(
            "type[_S]", type(cls.__name__, (cls, SQLiteSession), namespace)
        )
    return variant


async def _pop_item_with_validation(
    self: ProtoPromptSession, validate: Callable[[Item], None] | None = None
) -> Item | None:
    """``SQLiteSession._pop_item_with_validation`` of the inner session: ``validate`` runs on
    the claimed row inside the transaction, and an exception rolls the removal back."""
    state = self._index_state
    state.bump()
    try:
        item = await self._inner._pop_item_with_validation(validate)
    finally:
        state.bump()
    if item is not None:
        await self._popped(item)
    return item


def _check_callback_args(builder: object, system_prompt: object, on_plan: object) -> None:
    """``input_callback``'s argument checks (``TypeError`` naming the argument)."""
    if not callable(getattr(builder, "build", None)):
        raise TypeError(
            f"builder must be a TokenBudgetedContextBuilder, got {type(builder).__name__}"
        )
    if not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
    if on_plan is not None and not callable(on_plan):
        raise TypeError("on_plan must be callable or None")


def _remembered(
    memory: SessionMemory | None, kwargs: dict[str, Any], history: list[Item], offset: int
) -> dict[str, Any]:
    """``kwargs`` of a turn's ``build`` with what ``memory`` adds (the session, the turn's
    number, the summary); a failure there only loses the addition."""
    if memory is None:
        return kwargs
    try:
        return {**kwargs, **memory.prepare(history, offset)}
    except Exception as exc:  # noqa: BLE001 - recall is never worth a failed turn
        _log.warning("protoprompt: evicted turns not recalled this turn: %s", exc)
        return {**kwargs, "session_id": memory.session.session_id}


def _observed(
    memory: SessionMemory,
    plan: ContextPlan,
    history: list[Item],
    offset: int,
    row_ids: Sequence[int] | None,
) -> Callable[[], None] | None:
    """What starts the background work on what the turn evicted (never raises)."""
    try:
        return memory.observe(plan, history, offset, row_ids)
    except Exception as exc:  # noqa: BLE001 - a later turn hands the rows over
        _log.warning("protoprompt: the rows this turn evicted are left to a later turn: %s", exc)
        return None


async def _quietly(what: str, work: Awaitable[Any]) -> None:
    """Await ``work``; a failure is logged (the session's own change already happened)."""
    try:
        await work
    except Exception as exc:  # noqa: BLE001 - memory upkeep never fails a session call
        _log.warning("protoprompt: %s failed: %s", what, exc)


def _default_builder(
    agent: Any, max_tokens: int | None, model: str | None, output_reserve: int | None
) -> TokenBudgetedContextBuilder:
    """``run_config``'s builder without memory, from ``max_tokens`` and the model's name
    (``model``, else ``agent``'s)."""
    from ..context import TokenBudgetedContextBuilder

    if max_tokens is None:
        raise TypeError("run_config() needs a builder, or max_tokens (the budget) to make one")
    if model is None and agent is not None:
        if not isinstance(agent, _sdk.Agent):
            raise TypeError(f"agent must be an agents.Agent or None, got {type(agent).__name__}")
        model = model_name(agent)
        if model is None:
            raise TypeError(
                f"the model of agent {agent.name!r} has no name to choose a tokenizer by: "
                "pass model= (e.g. model='gpt-5')"
            )
    if model is None:
        raise TypeError("run_config() needs model= (or agent=) to choose the tokenizer")
    return TokenBudgetedContextBuilder(
        None,
        max_tokens=max_tokens,
        model=model,
        output_reserve=0 if output_reserve is None else output_reserve,
    )


class ProtoPromptSession:
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
            Needs a database file (``db_path``) and the ``"contiguous"`` policy; every other
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
            cls = _sqlite_backed(cls)
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
        windowed_reads: bool = False,
        snapshot_min_items: int = DEFAULT_SNAPSHOT_MIN_ITEMS,
        shared_index_bytes: int = pool.DEFAULT_SHARED_INDEX_BYTES,
        max_open_readers: int = SQLiteCountStore.DEFAULT_MAX_OPEN_READERS,
    ) -> None:
        if not isinstance(windowed_reads, bool):
            raise TypeError(f"windowed_reads must be a bool, got {type(windowed_reads).__name__}")
        self._snapshot_min_items = _positive_int("snapshot_min_items", snapshot_min_items)
        self._shared_index_bytes = _non_negative_int("shared_index_bytes", shared_index_bytes)
        max_open_readers = _positive_int("max_open_readers", max_open_readers)
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
            if not isinstance(inner_session, Session):
                raise TypeError(
                    "inner_session must implement agents.memory.Session, "
                    f"got {type(inner_session).__name__}"
                )
            if isinstance(inner_session, OpenAIConversationsSession):
                raise ValueError(
                    "inner_session cannot be an OpenAIConversationsSession: its history lives "
                    "on the server and the SDK treats that session specially (it would not "
                    "recognise it behind a wrapper)"
                )
            if os.fspath(db_path) != ":memory:":
                raise ValueError("pass either db_path or inner_session, not both")
            if (sessions_table, messages_table) != ("agent_sessions", "agent_messages"):
                raise ValueError(
                    "sessions_table and messages_table name the tables of the "
                    "default SQLiteSession; pass them to your inner_session"
                )
            inner_id = getattr(inner_session, "session_id", None)
            if inner_id != session_id:
                raise ValueError(
                    f"inner_session.session_id is {inner_id!r} but session_id is {session_id!r}"
                )
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
        self._no_window_detail: str | None = None
        if not windowed_reads:
            self._no_window = "windowed_reads_off"
        elif isinstance(opened, Unsupported):
            self._no_window, self._no_window_detail = opened
        else:
            self._no_window = "no_index"
        if isinstance(opened, Unsupported):
            self._no_store = (
                "memory database"
                if opened.code == "memory_database"
                else f"the history lives in an inner session ({opened.detail})"
            )
        else:
            self._no_store = "the history is not indexed (incremental=False)"
        self._pending: deque[tuple[Any, tuple[str, str]]] = deque(maxlen=MAX_PENDING_CONTEXTS)
        # Masked copies handed out by direct calls of the callback, with their canonical
        # text: add_items keeps them out of the history like the context message.
        self._pending_masked: deque[tuple[Any, str]] = deque(maxlen=MAX_PENDING_MASKED)
        self._warned_wrapped = False
        self._pending_lock = threading.Lock()
        # Context messages produced lately (stored or not), for the model filter to pin.
        self._produced: deque[tuple[str, str]] = deque(maxlen=MAX_PENDING_CONTEXTS)
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
        windowed = limit is not None or getattr(self.session_settings, "limit", None) is not None
        closed = getattr(self._inner, "_closed", False)
        # Before the first await: the runner's frame is found on the stack.
        turn = runner_turn(self) if self._windowed_reads and not windowed and not closed else None
        await self._attach()
        state = self._index_state
        epoch = state.epoch
        store = self._store
        refused = Refused("session_limit") if windowed else self._refused_window()
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
                    LAST_READ.set(Read(self, dataclasses.replace(facts, epoch=epoch)))
                    return items
                refused = found
        restorer: threading.Thread | None = None
        restored: list[tuple[str, str | None] | None] = []
        if not state.restore_tried and not windowed:
            # A stored index snapshot loads while the history is read (another thread).
            restorer = threading.Thread(
                target=lambda: restored.append(state.restore()),
                name="protoprompt-restore",
                daemon=True,
            )
            restorer.start()
        seen: _sync.Seen | None = None
        try:
            if store is not None and not windowed and not closed:
                # The inner session's own read, with the keys of the rows (see _sync),
                # compared with the index while the rows are at hand (in a worker thread).
                monotone = store.monotone

                def look(rows: _sync.Rows) -> _sync.Seen | None:
                    return state.compare(rows, restorer, monotone=monotone)

                try:
                    items, seen = await store.read(look)
                except StoreReadError as exc:
                    _log.debug("protoprompt: rows of %r not read: %s", self.session_id, exc)
                    refused = Refused("read_failed", str(exc), refused.snapshot)
                    items = await call(self._inner.get_items, wrapper=wrapper)
            elif limit is None:
                items = await call(self._inner.get_items, wrapper=wrapper)
            else:
                items = await call(self._inner.get_items, limit, wrapper=wrapper)
        finally:
            if restorer is not None and restorer.is_alive():
                await asyncio.to_thread(restorer.join)
        snapshot = refused.snapshot or next((r for r in restored if r is not None), None)
        facts = _sync.Read(
            len(items),
            windowed,
            epoch,
            store is not None,
            seen,
            not_windowed=(refused.code, refused.detail),
            snapshot=snapshot,
        )
        LAST_READ.set(Read(self, facts))
        return items

    def _refused_window(self) -> Refused:
        """Why a read is not a window when nothing else says so: windows are off for this
        session, or (with a store) the index does not know the rows yet."""
        return Refused(self._no_window, self._no_window_detail)

    async def _read_window(
        self, turn: Turn, new_items: list[Any]
    ) -> tuple[list[Any], _sync.Read] | Refused:
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
        kept = self._without_own_context(items)
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

        for memory in self._memories:
            await _quietly(
                "forgetting a popped row", asyncio.to_thread(memory.popped, item, length)
            )

    def _session_memory(
        self, builder: TokenBudgetedContextBuilder, scope: MemoryScope | None
    ) -> SessionMemory | None:
        """The seam to ``builder``'s evictions for this session (``None``: it has none)."""
        evictions = getattr(builder, "_evictions", None)
        if evictions is None:
            return None
        for memory in self._memories:
            if memory.builder is builder and memory._scope == scope:
                return memory
        memory = SessionMemory(self, builder, evictions, scope)
        self._memories.append(memory)
        return memory

    async def clear_session(self, wrapper: Any = None) -> None:
        """Remove this session's history. Long-term memory (the MemoryStore) is untouched,
        except the recall records and summary of what this session evicted (builders with
        ``recall_evicted`` or a ``summarizer`` it served), which go with it; a compaction
        session's clear-and-add rewrite keeps them."""
        rewrite = called_by_compaction_rewrite()  # before the first await: the caller's frame
        await self._attach()
        with self._pending_lock:
            self._pending.clear()
            self._pending_masked.clear()
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
        for memory in self._memories:  # the session's recall records and summary go too
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

    # ------------------------------------------------------------------ optional SDK hooks
    #
    # The SDK finds optional session capabilities by attribute (getattr/hasattr, once on the
    # type). Each one the 0.22.3 and 0.24.0 code probes is decided here (spec §11.3):
    #   implemented  session_settings, close, _ignore_ids_for_matching (the inner's value),
    #                _get_compaction_snapshot and _atomic_replace_items (the inner's, with the
    #                index reset around the rewrite; None / False when the inner has none)
    #   forwarded    the inner's own run_compaction, _defer_compaction,
    #                _get_deferred_compaction_response_id, _clear_deferred_compaction,
    #                _get_items_with_generation, _add_items_with_generation,
    #                _read_compaction_items (see __getattr__; a compaction rewrite resets the
    #                index), absent when the inner lacks them
    #   read through other public attributes of the inner session (db_path, engine...)
    #   hidden       every other private attribute of the inner session

    @property
    def _ignore_ids_for_matching(self) -> bool:
        """The inner session's item-matching policy (an id-stripping store sets it), so the
        runner's rollback before a retry matches stored items the way the store keeps them."""
        return bool(getattr(self._inner, "_ignore_ids_for_matching", False))

    def __getattr__(self, name: str) -> Any:
        """The inner session's optional hooks (``FORWARDED_HOOKS``) and public attributes
        (``db_path``, ``engine``, AdvancedSQLiteSession's branch methods...), read through."""
        if name in FORWARDED_HOOKS or (not name.startswith("_") and name not in NOT_FORWARDED):
            inner = self.__dict__.get("_inner")
            if inner is not None:
                value = getattr(inner, name)  # AttributeError when the inner has none
                if name == "run_compaction":
                    return self._rewrites(value)
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _rewrites(self, method: Any) -> Any:
        """``method`` (which rewrites the stored history) with the index reset around it."""

        async def rewriting(*args: Any, **kwargs: Any) -> Any:
            await self._attach()
            state, store = self._index_state, self._store
            running = REWRITING.set((state, state.epoch))  # for compaction_trigger
            state.bump()
            if store is not None:
                await store.before_rewrite()
            try:
                return await call(method, *args, **kwargs)
            finally:
                state.bump()
                if store is not None:
                    await store.after_rewrite()
                REWRITING.reset(running)
                for memory in self._memories:
                    memory.rewritten()

        return rewriting

    def _overrides_storage(self) -> bool:
        """Whether a subclass changes how the history is read or written: the inner
        session's compaction shortcuts would then bypass it (the SDK's own sessions refuse
        them for their subclasses alike)."""
        cls = type(self)
        return any(
            getattr(cls, name) is not getattr(ProtoPromptSession, name)
            for name in ("get_items", "add_items", "clear_session")
        )

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Item], bool] | None = None
    ) -> Any:
        """The inner session's bounded compaction snapshot (``OpenAIResponsesCompactionSession``
        replaces its suffix atomically), or ``None`` when the inner has none. The replacement
        resets this session's index: a ``:memory:`` database has no row check to notice it."""
        reader = getattr(self._inner, "_get_compaction_snapshot", None)
        if reader is None or self._overrides_storage():
            return None
        if prune_prefix is not None and accepts_keyword(reader, "prune_prefix"):
            raw = await reader(limit, prune_prefix=prune_prefix)
        else:
            raw = await reader(limit)
        if raw is None or not dataclasses.is_dataclass(raw) or isinstance(raw, type):
            return None  # not the SDK's snapshot: without one the SDK needs full coverage
        snapshot: Any = raw  # the SDK's CompactionSnapshot (not imported: 0.24 only)
        return dataclasses.replace(snapshot, replace_suffix=self._rewrites(snapshot.replace_suffix))

    async def _atomic_replace_items(self, items: list[Item]) -> bool:
        """Replace the whole history atomically if the inner session can (``RedisSession``);
        ``False`` (nothing changed, the SDK falls back to clear and add) otherwise."""
        replace = getattr(type(self._inner), "_atomic_replace_items", None)
        if replace is None or self._overrides_storage():
            return False
        return bool(await self._rewrites(replace)(self._inner, items))

    # ------------------------------------------------------------------ context bookkeeping

    def _expect_context(self, message: Mapping[str, Any]) -> tuple[str, str]:
        """Remember a context message the SDK is about to ask us to store."""
        key = self._produced_context(message)
        with self._pending_lock:
            self._pending.append((message, key))
        return key

    def _produced_context(self, message: Mapping[str, Any]) -> tuple[str, str]:
        """Remember a context message the callback produced (for the model filter to pin)."""
        key = context_key(message)
        if key is None:  # pragma: no cover - the builder always produces this shape
            raise ValueError("not a context message")
        with self._pending_lock:
            if key not in self._produced:
                self._produced.append(key)
        return key

    def _is_own_context(self, item: Any) -> bool:
        """Whether ``item`` is (a copy of) a context message this session's callback made."""
        key = context_key(item)
        if key is None:
            return False
        with self._pending_lock:
            return key in self._produced

    def _current_run(self) -> RunInput | None:
        """The callback's record of the run in this task, if it was this session's."""
        run = RUN_INPUT.get()
        return run if run is not None and run.session is self else None

    def _locate_run_input(self, items: Sequence[Any]) -> tuple[int, int] | None:
        """``[start, end)`` of the run's new input inside a model call's input, when the
        callback's record of this run matches it (the SDK sends the callback's result first,
        then what the run generates)."""
        run = self._current_run()
        if run is None or not run.new_input:
            return None
        a, b = run.n_items - len(run.new_input), run.n_items
        if a < 0 or b > len(items) or list(items[a:b]) != run.new_input:
            return None
        return a, b

    def _without_own_context(self, items: Sequence[Item]) -> list[Item]:
        """``items`` minus the produced context messages and masked copies (each one
        consumed once)."""
        with self._pending_lock:
            if not self._pending and not self._pending_masked:
                return list(items)
            kept: list[Item] = []
            for item in items:
                index = next((i for i, (obj, _) in enumerate(self._pending) if obj is item), None)
                if index is None:
                    key = context_key(item)
                    if key is not None:
                        index = next(
                            (i for i, (_, k) in enumerate(self._pending) if k == key), None
                        )
                if index is not None:
                    del self._pending[index]
                elif not self._consume_masked(item):
                    kept.append(item)
            return kept

    def _consume_masked(self, item: Item) -> bool:
        """Whether ``item`` is (a copy of) a masked copy a direct call handed out; it is then
        forgotten (caller holds the pending lock)."""
        if not self._pending_masked or not isinstance(item, Mapping):
            return False
        index = next((i for i, (obj, _) in enumerate(self._pending_masked) if obj is item), None)
        if index is None:
            try:
                key = canonical_text(item)
            except ProtoPromptError:
                return False
            index = next((i for i, (_, k) in enumerate(self._pending_masked) if k == key), None)
        if index is None:
            return False
        del self._pending_masked[index]
        return True

    @property
    def pending_masked_count(self) -> int:
        """Masked copies handed out by direct calls of the callback and not yet seen in
        ``add_items`` (in a run the SDK never hands them over to store)."""
        with self._pending_lock:
            return len(self._pending_masked)

    @property
    def pending_context_count(self) -> int:
        """Context messages produced by the callback and not yet seen in ``add_items``
        (those of direct calls: in a run the SDK never hands the message over to store)."""
        with self._pending_lock:
            return len(self._pending)

    # ------------------------------------------------------------------ the callback

    def _window_keep(self, facts: _sync.Read) -> tuple[int, _sync.RowIds] | None:
        """What of the index still holds for a token window read before the index changed
        (see ``_window.window_keep``; caller holds the state's lock)."""
        return window_keep(self._index_state, facts)

    def _count_window(
        self,
        builder: Any,
        history: list[Item],
        offset: int,
        output_reserve: int | None,
        opaque_scale: float,
    ) -> None:
        """After a turn, count the costs the next token window is found from (caller holds
        the state's lock). A cost that cannot be counted keeps its lower bound: the next
        window is then larger, never wrong."""
        if not self._windowed_reads or getattr(builder, "policy", None) != "contiguous":
            return
        reserve = builder.output_reserve if output_reserve is None else output_reserve
        try:
            self._index_state.index.count_window(
                history,
                max(int(builder.max_tokens) - int(reserve), 0),
                model=builder.model,
                encoding=builder.encoding,
                history_offset=offset,
                opaque_scale=opaque_scale,
                masking=getattr(builder, "masking", None),
            )
        except Exception as exc:  # noqa: BLE001 - an item the request did not need
            _log.debug("protoprompt: window costs of %r not counted: %s", self.session_id, exc)

    def _build_indexed(
        self,
        builder: TokenBudgetedContextBuilder,
        history: list[Item],
        new_input: list[Item],
        facts: _sync.Read,
        keep: int,
        kwargs: dict[str, Any],
        new_ids: _sync.RowIds | None = None,
    ) -> ContextPlan:
        """Build through the index, of which the first ``keep`` items hold for ``history``
        (which holds the history from ``facts.offset`` on; caller holds the state's lock).
        ``new_ids``: the rows after those ``keep`` items (default: the read's new rows). A
        failed build leaves the index as it was after dropping what no longer holds."""
        state = self._index_state
        offset = facts.offset
        if keep < len(state.index) or keep == 0:
            state.keep(keep)
            state.generation = facts.epoch
        try:
            if offset and getattr(builder, "calibration", None) is not None:
                # A token window is packed under the calibration it was found under.
                kwargs = {**kwargs, "opaque_scale": facts.opaque_scale}
            plan = builder.build(
                history, new_input, index=state.index, history_offset=offset, **kwargs
            )
            self._count_window(
                builder, history, offset, kwargs.get("output_reserve"), plan.pack.opaque_scale
            )
        finally:
            state.nbytes = state.index.nbytes
        if facts.seen is not None:
            if state.row_ids is None:
                state.row_ids = array("q")
            state.row_ids.extend(facts.seen.new_ids if new_ids is None else new_ids)
            state.tag = facts.seen.tag  # the rows were read at this generation (Redis)
            state.nbytes += state.row_ids.itemsize * len(state.row_ids)
        state.generation = facts.epoch
        state.version += 1
        if len(state.index) != offset + len(history) or (
            state.row_ids is not None and len(state.row_ids) != len(state.index)
        ):
            # Never reached: an index that does not add up is dropped (the next turn rebuilds).
            _log.warning(
                "protoprompt: the index of session %r did not add up after a turn and was "
                "dropped; the next turn reads and classifies the whole history",
                self.session_id,
            )
            state.reset(facts.epoch)
        elif state.due(self._snapshot_min_items):
            state.save_in_background()
        if self._shared_key is not None:
            pool.account(self._shared_key, state, self._shared_index_bytes)
        return plan

    def _build_turn(
        self,
        builder: TokenBudgetedContextBuilder,
        history: list[Item],
        new_input: list[Item],
        read: Read | None,
        kwargs: dict[str, Any],
        memory: SessionMemory | None = None,
    ) -> tuple[ContextPlan, Callable[[], None] | None]:
        """The plan of one turn (in a worker thread), with its report (``plan.turn``): through
        the index when ``read`` — the last read of this task — returned ``history`` and the
        index holds for it (see ``_sync.plan``), else packed without the index, which is then
        left as it is. With ``memory`` (the builder recalls evicted turns or summarises
        them), also what starts the background work on what the turn evicted."""
        state = self._index_state
        facts = read.facts if read is not None and read.session is self else None
        store = state.index.count_store
        failures = (getattr(store, "read_failures", 0), getattr(store, "ignored_counts", 0))
        held = 0
        plan: ContextPlan | None = None
        evicted: Callable[[], None] | None = None
        index: tuple[IndexMode, str | None] = ("unused", "no_index")
        kept = 0
        if self._incremental:
            with state.lock:
                held = len(state.index)
                decision = _sync.plan(facts, state.synced(), len(history), state.epoch)
                index = ("unused", decision.code)
                if decision.use_index and facts is not None:
                    kept = min(decision.keep, held)
                    plan = self._build_indexed(
                        builder,
                        history,
                        new_input,
                        facts,
                        decision.keep,
                        _remembered(memory, kwargs, history, facts.offset),
                    )
                    index = index_outcome(decision.code, True, held, kept)
                elif facts is not None and facts.offset and facts.count == len(history):
                    kept, rest = self._window_kept(facts)
                    plan = self._build_indexed(
                        builder,
                        history,
                        new_input,
                        facts,
                        kept,
                        _remembered(memory, kwargs, history, facts.offset),
                        new_ids=rest,
                    )
                    index = index_outcome("compared", True, held, min(kept, held))
                if plan is not None and memory is not None and facts is not None:
                    evicted = _observed(memory, plan, history, facts.offset, state.row_ids)
        if plan is None:
            # Not the history our last read returned (a limit, a direct call, or the rows
            # could not be compared): packed without the index, which is left as it is.
            plan = builder.build(history, new_input, **_remembered(memory, kwargs, history, 0))
            if memory is not None:
                evicted = _observed(memory, plan, history, 0, None)
        report = self._turn_report(
            plan,
            facts if facts is not None and facts.count == len(history) else None,
            len(history),
            index,
            (held, kept),
            failures,
        )
        self._log_fallback(report, plan, len(new_input))
        turned = dataclasses.replace(plan, turn=report)
        if builder.last_plan is plan:
            builder.last_plan = turned
        return turned, evicted

    def _window_kept(self, facts: _sync.Read) -> tuple[int, _sync.RowIds]:
        """For a token window whose index changed after the read (caller holds the state's
        lock): how much of the index still holds and the ids of the window's rows after it.
        The window holds only the newest items: the index must hold the rest, also when
        another turn changed it since the read."""
        kept = self._window_keep(facts)
        if kept is None:
            raise ProtoPromptError(
                "the session's history changed between the read of its newest "
                "items and this turn's request (a pop or clear through another "
                "session object): run the turn again"
            )
        return kept

    def _turn_report(
        self,
        plan: ContextPlan,
        facts: _sync.Read | None,
        history_len: int,
        index: tuple[IndexMode, str | None],
        held_kept: tuple[int, int],
        failures: tuple[int, int],
    ) -> TurnReport:
        """How this turn read and packed its history (see ``protoprompt.turn_report``):
        ``facts`` of the read that returned the ``history_len`` items (``None``: they were
        handed over otherwise), how the index was used, the items it held before the turn
        and how many of them still held, and the count store's failed reads and ignored
        counts before it."""
        state = self._index_state
        held, kept = held_kept
        read: ReadMode = "none"
        reason: str | None = None
        detail: str | None = None
        n_items = read_items = history_len
        row: int | None = None
        snapshot = facts.snapshot if facts is not None else None
        if facts is not None:
            read_items = facts.count
            n_items = facts.offset + facts.count
            if facts.offset and facts.window_ids is not None:
                read = "window"
                # A list has no row ids: its window starts at a position (Redis).
                keyed = self._store is not None and self._store.kind == "redis"
                row = facts.offset if keyed else int(facts.window_ids[0])
                detail = facts.widened
            else:
                read = "limit" if facts.windowed else "full"
                reason, detail = facts.not_windowed or (None, None)
        if snapshot is None and state.save_failure is not None:
            snapshot = ("in_memory", f"the last snapshot write failed: {state.save_failure}")
        if snapshot is None:
            if state.snapshot_at is None:
                snapshot = ("off", self._no_store if self._store is None else self._store.no_store)
            elif held or plan.pack.index is not None:
                snapshot = ("in_memory", None)
            else:
                snapshot = ("none_stored", None)
        store = state.index.count_store
        store_state: StoreState = "on"
        store_detail: str | None = None
        if store is None:
            store_state = "off"
            store_detail = self._no_store if self._store is None else self._store.no_store
        elif getattr(store, "read_failures", 0) > failures[0]:
            store_state = "failing"
            store_detail = getattr(store, "last_failure", None) or "its reads failed"
        elif getattr(store, "ignored_counts", 0) > failures[1]:
            ignored = getattr(store, "ignored_counts", 0) - failures[1]
            store_detail = f"{ignored:,} damaged counts ignored (counted again, rewritten)"
        return TurnReport(
            read=read,
            read_reason=reason,
            read_detail=detail,
            history_items=n_items,
            read_items=read_items,
            window_row=row,
            window_reach=facts.reached if facts is not None else None,
            index=index[0],
            index_reason=index[1],
            index_kept=kept if index[0] == "incremental" and 0 < kept < held else None,
            index_held=held,
            snapshot=cast("SnapshotState", snapshot[0]),
            snapshot_detail=snapshot[1],
            count_store=store_state,
            count_store_detail=store_detail,
            pack_index=plan.pack.index,
            count_store_hits=plan.pack.count_store_hits,
            count_store_writes=plan.pack.count_store_writes,
        )

    def _log_fallback(self, report: TurnReport, plan: ContextPlan, new_items: int) -> None:
        """Log, once per stored session and cause, a fallback that cost more than ten times
        the fast path (see ``turn_report.fallback_cost``)."""
        kept = plan.pack.kept_history
        cost = fallback_cost(
            indexed=report.index_held > 0 or report.snapshot == "loaded",
            read=report.read,
            read_reason=report.read_reason,
            history_items=report.history_items,
            first_kept=kept[0] if kept else None,
            index_use=report.pack_index,
            new_items=new_items,
            read_items=report.read_items,
            reached_items=report.window_reach,
        )
        if cost is None:
            return
        what, items, fast = cost
        line = report.read_line() if what == "read" else report.index_line()
        key = f"{what}:{report.read_reason if what == 'read' else 'regroup'}"
        state = self._index_state
        with state.lock:
            if key in state.logged:
                return
            state.logged.add(key)
        _log.info(
            "protoprompt: session %r: this turn's %s took %d items where its fast path "
            "takes about %d (%s); logged once per session",
            self.session_id,
            what,
            items,
            fast,
            line,
        )

    def _hand_over(
        self,
        plan: ContextPlan,
        history: list[Item] | None,
        new_input: list[Item],
        on_plan: Callable[[ContextPlan], None] | None,
    ) -> list[Item]:
        """What the callback returns for ``plan``: its items, with the context message made
        known and the run recorded for the model filter.

        ``history``: the history list the runner handed over. The context message object and
        the masked copies are added to it, so the SDK takes them for history and never asks
        any session to store them — also when a wrapper such as ``EncryptedSession`` sits in
        front of this one and would hand them over encrypted, past recognition. Without it
        (a direct call), they are registered so :meth:`add_items` keeps them out of the
        history."""
        key = None
        message = plan.context_message
        if message is not None:
            if history is not None:
                history.append(message)
                key = self._produced_context(message)
            else:
                key = self._expect_context(message)
        masked = plan.masked_items
        if masked and history is not None:
            history.extend(masked)
        elif masked:
            keys = [canonical_text(m) for m in masked]
            with self._pending_lock:
                self._pending_masked.extend(zip(masked, keys, strict=True))
        RUN_INPUT.set(RunInput(self, key, list(new_input), len(plan.items)))
        if on_plan is not None:
            on_plan(plan)
        return list(plan.items)

    def input_callback(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
        agent: Agent[Any] | None = None,
    ) -> SessionInputCallback:
        """A ``session_input_callback`` for ``RunConfig`` that budgets every request.

        The callback builds the turn with ``builder`` (see
        :meth:`TokenBudgetedContextBuilder.build`) and returns ``plan.items``: the context
        message, the kept history objects and every new-input object — the SDK's own
        objects, never copies. The context message is never stored: in a run it is also
        added to the history list the runner handed over, so the SDK takes it for history
        (whatever wraps this session); called directly, it is registered with this session
        so :meth:`add_items` keeps it out of the history. Use it only with this session.
        The builder's tokenizer starts building in the background now (see
        :func:`protoprompt.preload`), so the first request does not wait for it.

        Args:
            builder: the budget, tokenizer and memory to use.
            system_prompt: mandatory text at the top of the context message.
            output_reserve: overrides ``builder.output_reserve``.
            scope: overrides ``builder.scope`` (e.g. one scope per user).
            on_plan: called with each plan (besides ``builder.last_plan``).
            agent: the agent the runs use: its instructions, tool definitions and output
                schema are counted (as the per-call filter counts them) and reserved, so the
                turn's plan is that of the run's first model call (``plan.request``;
                instructions made per run from its context are left to the filter, and the
                plan says so). Without it the turn's plan does not know them.

        Raises (from the callback, before the model is called):
            TokenBudgetExceededError: the mandatory part of the request does not fit.
        """
        _check_callback_args(builder, system_prompt, on_plan)
        memory = self._session_memory(builder, scope)
        if agent is not None and not isinstance(agent, _sdk.Agent):
            raise TypeError(f"agent must be an agents.Agent or None, got {type(agent).__name__}")
        encoding = getattr(builder, "encoding", None)
        if isinstance(encoding, str):
            # Build the tokenizer while the SDK reads the history, not in the first callback.
            preload(encoding=encoding, wait=False)
        kwargs: dict[str, Any] = {
            "system_prompt": system_prompt,
            "scope": scope,
            "output_reserve": output_reserve,
        }
        costs = RequestCosts()

        async def protoprompt_session_input(
            history: list[Item], new_input: list[Item]
        ) -> list[Item]:
            by_runner = called_by_runner()  # before the first await: the caller's frame
            read = LAST_READ.get()
            call_kwargs = kwargs
            if agent is not None:
                request = await agent_request(agent, builder.encoding, costs)
                call_kwargs = {**kwargs, "request": request}
            plan, evicted = await asyncio.to_thread(
                self._build_turn, builder, history, new_input, read, call_kwargs, memory
            )
            if evicted is not None:
                evicted()  # background work on what the turn evicted; never raises
            return self._hand_over(plan, history if by_runner else None, new_input, on_plan)

        setattr(protoprompt_session_input, TURN_ATTR, Turn(self, builder, output_reserve))
        return protoprompt_session_input

    # ------------------------------------------------------------------ every model call

    def model_input_filter(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        oversized_output: OversizedOutput = "error",
        output_reserve: int | None = None,
        on_call: Callable[[ModelCallPlan], None] | None = None,
    ) -> ModelInputFilter:
        """A ``call_model_input_filter`` that holds ``builder``'s budget on every model call.

        The SDK calls :meth:`input_callback` once per run; the filter runs before each model
        call of the run, tool loops included, and keeps the whole request — input items, the
        agent's instructions and its tool definitions — within ``builder.max_tokens`` minus
        the output reserve. The context message of this session's callback, the run's new
        input and the newest step (the model output that ended the previous call and the
        tool outputs answering it) are mandatory; older items are filled newest first as
        atomic units (see :mod:`protoprompt.integrations.model_filter`). What it returns is
        sent, never stored.

        Args:
            builder: the budget and tokenizer (use the callback's builder).
            oversized_output: when the mandatory part does not fit: ``"error"`` raises
                :class:`~protoprompt.errors.TokenBudgetExceededError` (``section=
                "tool_output"``, ``detail`` names the output and its call) before the call;
                ``"truncate"`` sends cut copies of the newest tool outputs (head and tail
                around a marker saying how many tokens were removed).
            output_reserve: overrides ``builder.output_reserve``.
            on_call: called with each call's :class:`ModelCallPlan` (also in
                ``filter.last_plan``).
        """
        from .model_filter import ModelInputFilter

        return ModelInputFilter(
            builder,
            oversized_output=oversized_output,
            output_reserve=output_reserve,
            session=self,
            on_call=on_call,
        )

    def run_config(
        self,
        builder: TokenBudgetedContextBuilder | None = None,
        *,
        agent: Agent[Any] | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
        oversized_output: OversizedOutput = "error",
        on_call: Callable[[ModelCallPlan], None] | None = None,
        audit: BudgetAudit | None = None,
        **run_config_fields: Any,
    ) -> RunConfig:
        """A ``RunConfig`` with both budget hooks set: the one-liner for a budgeted agent.

        ``session_input_callback`` is :meth:`input_callback` (recalled memory, packed
        history, once per run) and ``call_model_input_filter`` is :meth:`model_input_filter`
        (every model call of the run fits, instructions and tools included). Other
        ``RunConfig`` fields pass through. Without long-term memory, the budget alone::

            config = session.run_config(agent=agent, max_tokens=128_000, output_reserve=8_000)
            result = await Runner.run(agent, question, session=session, run_config=config)
            print(config.call_model_input_filter.last_plan.explain())

        With a :class:`~protoprompt.TokenBudgetedContextBuilder` (memory, masking, policy)::

            config = session.run_config(builder, system_prompt="Answer from the contract.")

        Args:
            builder: the budget, tokenizer and memory; or leave it out and give
                ``max_tokens`` (and ``model``, or an ``agent`` whose model is named): a
                builder without memory is made, with the builder's defaults.
            agent: the agent the runs use: the model's name is read from it when ``model``
                is not given, and its instructions, tools and output schema are counted into
                each turn's plan (see :meth:`input_callback`).
            max_tokens, model: the budget and the model's name (its tokenizer) of the builder
                made when ``builder`` is not given.
            output_reserve: tokens kept free for the answer (overrides the builder's).
            system_prompt, scope, on_plan: see :meth:`input_callback`.
            oversized_output, on_call: see :meth:`model_input_filter`.
            audit: a :class:`~protoprompt.integrations.BudgetAudit` that gets every model
                call's plan (pass it as ``hooks=`` of ``Runner.run`` too, or call
                ``audit.add_result(result)``, to pair each with the provider's count); with
                ``builder.calibration`` set, the audit also teaches it.

        Raises:
            TypeError: ``run_config_fields`` set one of the two hooks, or an unknown field;
                both ``builder`` and ``max_tokens`` / ``model`` are given, or neither a
                builder nor ``max_tokens``; no model name is given or readable from
                ``agent``; ``audit`` is not a ``BudgetAudit``.
            UnknownModelError: ``model`` has no known tokenizer (pass a builder with
                ``encoding=``).
        """
        if builder is None:
            builder = _default_builder(agent, max_tokens, model, output_reserve)
            output_reserve = None
        elif max_tokens is not None or model is not None:
            raise TypeError(
                "pass either a builder or max_tokens and model (which make one), not both"
            )
        for name in ("session_input_callback", "call_model_input_filter"):
            if name in run_config_fields:
                raise TypeError(
                    f"run_config() sets {name} itself; build a RunConfig directly to use your own"
                )
        callback = self.input_callback(
            builder,
            system_prompt=system_prompt,
            output_reserve=output_reserve,
            scope=scope,
            on_plan=on_plan,
            agent=agent,
        )
        if audit is not None:
            from .audit import BudgetAudit

            if not isinstance(audit, BudgetAudit):
                raise TypeError(f"audit must be a BudgetAudit or None, got {type(audit).__name__}")
            observe = audit.observer(builder)
            if on_call is not None:
                user_call = on_call

                def both(plan: ModelCallPlan) -> None:
                    observe(plan)
                    user_call(plan)

                on_call = both
            else:
                on_call = observe
        model_filter = self.model_input_filter(
            builder,
            oversized_output=oversized_output,
            output_reserve=output_reserve,
            on_call=on_call,
        )
        return RunConfig(
            session_input_callback=callback,
            call_model_input_filter=model_filter,
            **run_config_fields,
        )
