"""OpenAI Agents SDK integration: :class:`ProtoPromptSession` and its budgeted input callback.

The session stores history exactly like the SDK's own sessions (it delegates to
``SQLiteSession`` or to any session you pass). Its :meth:`ProtoPromptSession.input_callback`
makes every request fit the token budget and puts recalled memory in front of it::

    session = ProtoPromptSession("legal-chat", "agents.db")
    callback = session.input_callback(builder, system_prompt="Use recalled contract facts.")
    await Runner.run(agent, "When does it renew?", session=session,
                     run_config=RunConfig(session_input_callback=callback))

Why the session and the callback are a pair: the SDK persists every item the callback
returns that it cannot match to the history or the new input (spec §9.3), so the recalled
context message would be written to the session on every turn. The session remembers each
context message its callback produced and keeps it out of storage in :meth:`add_items`
(matched by identity, else by role and text, each produced message consumed once), while
the model still receives it. Everything else is stored unchanged.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import dataclasses
import inspect
import itertools
import logging
import os
import sqlite3
import sys
import threading
import uuid
import warnings
import weakref
from array import array
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

try:
    from agents import RunConfig
    from agents.memory import OpenAIConversationsSession, Session, SessionSettings
    from agents.memory.session_settings import coerce_session_settings
    from agents.memory.sqlite_session import SQLiteSession
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "protoprompt.integrations.agents needs the OpenAI Agents SDK: "
        "pip install 'protoprompt[agents]'"
    ) from exc

try:
    from agents.items import ItemHelpers
    from agents.run_internal import session_persistence as _session_persistence

    _PREPARE_CODE: Any = _session_persistence.prepare_input_with_session.__code__
except (ImportError, AttributeError):  # pragma: no cover - another SDK layout: full reads
    _PREPARE_CODE = None

from .._meta import meta_value
from ..context import _message_text
from ..count_store import SQLiteCountStore
from ..errors import ProtoPromptError, SnapshotError
from ..packing import HistoryIndex, preload
from . import _snapshots, _sync

if TYPE_CHECKING:
    from ..context import ContextPlan, TokenBudgetedContextBuilder
    from ..memory import MemoryScope
    from .model_filter import ModelCallPlan, ModelInputFilter, OversizedOutput

__all__ = ["ProtoPromptSession", "SessionInputCallback"]

Item = Any
"""An input item as the SDK hands it over (a dict in practice)."""
SessionInputCallback = Callable[[list[Item], list[Item]], Awaitable[list[Item]]]

_MAX_PENDING_CONTEXTS = 64
"""Context messages remembered until the SDK writes them; older ones are forgotten."""
_CONTEXT_ROLES = ("system", "developer")


def _plain(item: Any) -> Any:
    """A dict view of an item (pydantic models are dumped), else the item itself."""
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        try:
            return dump(exclude_unset=True)
        except Exception:  # noqa: BLE001 - not a model we understand; it is not ours
            return None
    return None


def _context_key(item: Any) -> tuple[str, str] | None:
    """``(role, text)`` when ``item`` has the shape of a context message, else ``None``.

    Accepts the forms the SDK may turn ``{"role": r, "content": text}`` into before
    ``add_items``: an added ``type: "message"``, content as a list of ``input_text`` parts.
    Any other field makes the item not a context message.
    """
    data = _plain(item)
    if not isinstance(data, Mapping):
        return None
    role = data.get("role")
    if role not in _CONTEXT_ROLES or data.get("type") not in (None, "message"):
        return None
    if set(data) - {"role", "content", "type"}:
        return None
    content = data.get("content")
    if isinstance(content, str):
        return (role, content)
    if isinstance(content, Sequence) and content:
        texts = []
        for part in content:
            part = _plain(part)
            if not isinstance(part, Mapping) or set(part) - {"type", "text"}:
                return None
            if part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return (role, "".join(texts))
    return None


def _is_encrypted_envelope(item: Any) -> bool:
    """The shape ``EncryptedSession`` stores (``{"__enc__": 1, "v", "kid", "payload"}``)."""
    return (isinstance(item, Mapping) and item.get("__enc__") == 1
            and {"v", "kid", "payload"} <= item.keys())


class _Read:
    """What one ``get_items`` call returned, for the callback that follows it in the task."""

    __slots__ = ("session", "facts")

    def __init__(self, session: ProtoPromptSession, facts: _sync.Read) -> None:
        self.session = session
        self.facts = facts


class _RunInput:
    """What the session callback returned for the run now starting in this task: the model
    filter pins its context message and new input on every model call of the run."""

    __slots__ = ("session", "context_key", "new_input", "n_items")

    def __init__(self, session: ProtoPromptSession, context_key: tuple[str, str] | None,
                 new_input: list[Any], n_items: int) -> None:
        self.session = session
        self.context_key = context_key
        self.new_input = new_input
        self.n_items = n_items


_RUN_INPUT: contextvars.ContextVar[_RunInput | None] = contextvars.ContextVar(
    "protoprompt_run_input", default=None)
"""Set by the session callback; read by the session's model filter in the same task."""

_LAST_READ: contextvars.ContextVar[_Read | None] = contextvars.ContextVar(
    "protoprompt_last_read", default=None)
"""Set by ``ProtoPromptSession.get_items``; the SDK calls the input callback next, in the
same task, with (copies of) exactly those items."""


_log = logging.getLogger("protoprompt")

SNAPSHOT_MIN_ITEMS = 512
"""Histories shorter than this are not snapshotted (reading them again takes a few ms).

A stored session's index is saved to its database (see ``_snapshots``) once it holds this
many items, again each time it has grown by an eighth (at least this many items), and on
:meth:`ProtoPromptSession.close`; a restarted process loads it instead of classifying the
whole history. Set the module attribute to change it (a huge value turns snapshots off)."""

_STATES: weakref.WeakSet[_IndexState] = weakref.WeakSet()  # for fork and exit handling


class _IndexState:
    """A stored session's HistoryIndex, what it describes, and the session's epoch (bumped
    around every pop and clear made through any object sharing this state).

    ``row_ids`` are the ids of the rows behind the index's items when the rows are compared
    before every use (see ``_sync``); ``version`` changes with every change of the index or
    of ``row_ids``. ``snapshot_at`` = ``(db path, database id, messages table, session id)``
    when the index is saved to and restored from the database."""

    def __init__(self, snapshot_at: tuple[str, str, str, str] | None = None) -> None:
        self.index = HistoryIndex()
        self.generation = -1  # the epoch the index was synced at
        self.row_ids: _sync.RowIds | None = None
        self.version = 0
        self.nbytes = 0  # index.nbytes after the last build (read without the index)
        self.lock = threading.Lock()
        self._epoch = itertools.count(1)
        self.epoch = 0
        self.snapshot_at = snapshot_at
        self.restore_tried = snapshot_at is None
        self.saved_len = 0  # items in the snapshot last written or loaded
        self.saver: threading.Thread | None = None
        _STATES.add(self)

    def bump(self) -> None:
        self.epoch = next(self._epoch)  # atomic under the GIL; never returns to an old value

    def reset(self, generation: int) -> None:
        self.keep(0)
        self.generation = generation

    def keep(self, length: int) -> None:
        """Keep the first ``length`` items of the index (and of ``row_ids``)."""
        if length < len(self.index):
            if length:
                self.index.truncate(length)
            else:
                self.index.clear()
        if self.row_ids is not None and len(self.row_ids) > length:
            del self.row_ids[length:]
        if not length:
            self.row_ids = None
        self.version += 1

    def synced(self) -> _sync.Synced:
        return _sync.Synced(len(self.index), self.version, self.generation)

    def compare(self, rows: _sync.Rows, after: threading.Thread | None = None) -> _sync.Seen:
        """What ``rows`` (a read's rows) keep of the index, once ``after`` (the snapshot's
        restore) has finished (caller: no lock)."""
        if after is not None:
            after.join()
        with self.lock:
            keep = _sync.kept_prefix(self.row_ids, rows)
            return _sync.Seen(self.version, keep, rows.ids_from(keep))

    # -------------------------------------------------------------- snapshots (caller: no lock)

    def _binding(self, row_ids: bytes) -> bytes:
        assert self.snapshot_at is not None
        _, database_id, table, session_id = self.snapshot_at
        return _snapshots.binding(database_id, table, session_id, row_ids)

    def restore(self) -> None:
        """Load the stored snapshot into a state that has never synced (once per state).
        Whatever is stored, this never raises: a snapshot that cannot be used is ignored."""
        with self.lock:
            if self.restore_tried or self.snapshot_at is None:
                return
            self.restore_tried = True
            if len(self.index) or self.row_ids is not None:
                return
            db_path, _, table, session_id = self.snapshot_at
            try:
                found = _snapshots.load(db_path, table, session_id)
                if found is None:
                    return
                ids_blob, data = found
                row_ids = _snapshots.ids_from_bytes(ids_blob)
                index = HistoryIndex.from_snapshot(data, count_store=self.index.count_store,
                                                   bound_to=self._binding(ids_blob))
                if row_ids is None or len(row_ids) != len(index):
                    raise SnapshotError("its row ids do not match its items")
            except Exception as exc:  # noqa: BLE001 - stored state never fails a turn
                # Another version, damaged, or taken for other rows: read the history.
                _log.debug("protoprompt: index snapshot of %r not used: %s", session_id, exc)
                return
            self.index = index
            self.row_ids = row_ids
            self.version += 1
            self.generation = self.epoch
            self.saved_len = len(index)
            self.nbytes = index.nbytes + row_ids.itemsize * len(row_ids)

    def due(self) -> bool:
        """Whether the index has grown enough since its last snapshot (caller holds lock)."""
        n = len(self.index)
        return (self.snapshot_at is not None and self.row_ids is not None
                and n >= SNAPSHOT_MIN_ITEMS
                and n - self.saved_len >= max(SNAPSHOT_MIN_ITEMS, self.saved_len // 8))

    def save_in_background(self) -> None:
        """Start writing a snapshot unless one is being written (caller holds the lock)."""
        if self.saver is not None and self.saver.is_alive():
            return
        self.saver = threading.Thread(target=self.save, name="protoprompt-snapshot",
                                      daemon=True)
        self.saver.start()

    def save(self) -> None:
        """Write a snapshot of the index as it is now, if it holds anything unsaved."""
        with self.lock:
            n = len(self.index)
            if (self.snapshot_at is None or self.row_ids is None or n == 0
                    or n == self.saved_len or len(self.row_ids) != n):
                return
            ids_blob = _snapshots.ids_to_bytes(self.row_ids)
            data = self.index.snapshot(bound_to=self._binding(ids_blob))
            self.saved_len = n  # also when the write fails: retried after more growth
        db_path, _, table, session_id = self.snapshot_at
        _snapshots.save(db_path, table, session_id, ids_blob, data)

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
            db_path, _, table, session_id = self.snapshot_at
            _snapshots.delete(db_path, table, session_id)

    def after_fork(self) -> None:
        """In a forked child: a lock held at the fork belonged to a thread that is gone, and
        the index it guarded may be half changed. Start that index again."""
        if self.lock.locked():
            self.index = HistoryIndex(count_store=self.index.count_store)
            self.row_ids = None
            self.version += 1
            self.generation = -1
        self.lock = threading.Lock()
        self.saver = None


def _states_after_fork() -> None:
    for state in list(_STATES):
        state.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_states_after_fork)


@atexit.register
def _finish_saves_at_exit() -> None:
    """Snapshot writers are daemon threads: let one in flight finish (at most 5 s each)."""
    for state in list(_STATES):
        state.wait_for_save(timeout=5.0)


SHARED_INDEX_BYTES = 256 * 2**20
"""Bytes of session indexes this process keeps for session objects created later.

A server that builds a ``ProtoPromptSession`` per request still gets warm turns: objects for
the same stored session (same database file, table and session id) share one index, and the
most recently used ones are kept up to this many bytes (about 0.23 KB per history item).
An index dropped from the pool stays with the objects that hold it and is rebuilt by new
ones. Set the module attribute to change it."""

_Key = tuple[str, str, str, str]
"""A stored session: (database id, resolved file path, messages table, session id). The id
tells a database deleted and created again at one path (its row ids start over) from the
first; the path tells apart copies of one database file (they share the id, and their row
ids go on from the same point with different rows)."""

_SHARED: OrderedDict[_Key, _IndexState] = OrderedDict()
_SHARED_LOCK = threading.Lock()


def _database_id(db_path: str) -> str | None:
    """A random id stored once in the database (table ``protoprompt_meta``), or ``None`` if
    it cannot be read or written (then the session keeps an index of its own)."""
    try:
        conn = sqlite3.connect(db_path, timeout=5.0)
        try:
            return meta_value(conn, "database_id", lambda: uuid.uuid4().hex)
        finally:
            conn.close()
    except sqlite3.Error:
        return None


_STORES: weakref.WeakValueDictionary[tuple[str, str], SQLiteCountStore] = (
    weakref.WeakValueDictionary())


def _count_store(key: _Key) -> SQLiteCountStore | None:
    """The count store of a database file, one for all its sessions (one connection however
    many sessions are pooled), or ``None`` if it cannot be opened."""
    database_id, db_path = key[0], key[1]
    with _SHARED_LOCK:
        store = _STORES.get((database_id, db_path))
        if store is None:
            try:
                store = _STORES[(database_id, db_path)] = SQLiteCountStore(db_path)
            except (sqlite3.Error, OSError):
                return None  # read-only or odd database: counts stay in memory
        return store


def _shared_state(key: _Key, snapshot_at: tuple[str, str, str, str] | None) -> _IndexState:
    with _SHARED_LOCK:
        state = _SHARED.get(key)
        if state is None:
            state = _SHARED[key] = _IndexState(snapshot_at)
        _SHARED.move_to_end(key)
        return state


def _account(key: _Key, state: _IndexState) -> None:
    """Record ``state``'s size after a build and trim the pool to ``SHARED_INDEX_BYTES``."""
    with _SHARED_LOCK:
        if _SHARED.get(key) is not state:
            return  # dropped from the pool earlier: it belongs to its objects only
        _SHARED.move_to_end(key)
        total = sum(s.nbytes for s in _SHARED.values())
        while total > SHARED_INDEX_BYTES and len(_SHARED) > 1:
            _, old = _SHARED.popitem(last=False)
            total -= old.nbytes


def _accepts_wrapper(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.name == "wrapper"
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        for p in params
    )


async def _call(method: Any, *args: Any, wrapper: Any = None, **kwargs: Any) -> Any:
    """Call an inner-session method (sync or async), passing ``wrapper`` only if it takes one."""
    if wrapper is not None and _accepts_wrapper(method):
        kwargs["wrapper"] = wrapper
    result = method(*args, **kwargs)
    if inspect.isawaitable(result):
        return await result
    return result


def _coerce_settings(value: SessionSettings | Mapping[str, Any] | None) -> SessionSettings | None:
    """``value`` as ``SessionSettings``, validated exactly as ``SQLiteSession`` validates it
    (the SDK's own ``coerce_session_settings``: an unknown key raises
    ``TypeError: Unknown session settings: ...``, a bad value pydantic's error)."""
    if value is None or isinstance(value, SessionSettings):
        return value
    if isinstance(value, Mapping):
        return coerce_session_settings(dict(value))
    raise TypeError(
        f"session_settings must be a SessionSettings, a dict or None, got {type(value).__name__}"
    )


_FORWARDED_HOOKS = frozenset({
    "run_compaction", "_defer_compaction", "_get_deferred_compaction_response_id",
    "_clear_deferred_compaction", "_get_items_with_generation", "_add_items_with_generation",
    "_read_compaction_items",
})
"""Optional hooks a ProtoPromptSession exposes exactly when its inner session has them."""

_NOT_FORWARDED = frozenset({"underlying_session"})
"""Public names of wrapper sessions that describe the wrapper itself, not ours."""


def _accepts_keyword(method: Any, name: str) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


_SQLITE_VALIDATED_POP = (
    callable(getattr(SQLiteSession, "_pop_item_with_validation", None))
    and "_pop_item_with_validation" in SQLiteSession.pop_item.__code__.co_names
)
"""openai-agents >= 0.24: ``SQLiteSession.pop_item`` is ``_pop_item_with_validation()``, which
``EncryptedSession`` calls with its key check so a wrong key raises inside the SQLite
transaction and no row is lost. 0.22 has no such path (EncryptedSession pops blindly there)."""

_SQLITE_BACKED: dict[type, type] = {}


def _sqlite_backed(cls: type) -> type:
    """``cls`` made an ``SQLiteSession`` subclass, for sessions stored in a native one.

    Code that treats a native ``SQLiteSession`` specially — ``EncryptedSession`` authenticates
    a pop inside the SQLite transaction when ``type(s).pop_item is SQLiteSession.pop_item`` —
    then treats a ProtoPromptSession over one the same way. Every method is still
    ProtoPromptSession's (it comes first in the MRO); ``pop_item`` is SQLiteSession's own,
    which only calls ``_pop_item_with_validation`` (below), unless ``cls`` overrides it."""
    variant = _SQLITE_BACKED.get(cls)
    if variant is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__, "_pop_item_with_validation": _pop_item_with_validation,
        }
        if cls.pop_item is ProtoPromptSession.pop_item:  # type: ignore[attr-defined]
            namespace["pop_item"] = SQLiteSession.pop_item
        variant = _SQLITE_BACKED[cls] = type(cls.__name__, (cls, SQLiteSession), namespace)
    return variant


async def _pop_item_with_validation(self: ProtoPromptSession,
                                    validate: Callable[[Item], None] | None = None) -> Item | None:
    """``SQLiteSession._pop_item_with_validation`` of the inner session: ``validate`` runs on
    the claimed row inside the transaction, and an exception rolls the removal back."""
    state = self._index_state
    state.bump()
    try:
        return await self._inner._pop_item_with_validation(validate)
    finally:
        state.bump()


class _Turn:
    """What a session callback needs to know to window the read before it: its budget."""

    __slots__ = ("session", "builder", "output_reserve")

    def __init__(self, session: ProtoPromptSession, builder: Any,
                 output_reserve: int | None) -> None:
        self.session = session
        self.builder = builder
        self.output_reserve = output_reserve


_TURN_ATTR = "_protoprompt_turn"
"""Attribute of a callback made by ``input_callback``: its ``_Turn``."""

_FRAMES_UP = 8
"""How far up the stack ``get_items`` looks for the runner's ``prepare_input_with_session``
(through ``_session_get_items``, its ``read_items`` and ``_call_session_method``)."""


def _runner_turn(session: ProtoPromptSession) -> tuple[_Turn, list[Any]] | None:
    """When this ``get_items`` is the read of the runner's ``prepare_input_with_session``
    (0.22.3 and 0.24.0) for ``session`` whose result goes to a callback of this session that
    includes the history: that callback's ``_Turn`` and the turn's new input, as the SDK
    makes it. Any other read (the user's, ``pop_item`` corrections, compaction, resuming a
    run, the retry clean-up) returns ``None``: it must see the whole history."""
    if _PREPARE_CODE is None:
        return None
    frame = sys._getframe(1).f_back  # get_items' caller (None when a task drives it)
    for _ in range(_FRAMES_UP):
        if frame is None:
            return None
        if frame.f_code is _PREPARE_CODE:
            break
        frame = frame.f_back
    else:
        return None
    scope = frame.f_locals
    if scope.get("session") is not session or not scope.get(
            "include_history_in_prepared_input", False):
        return None
    turn = getattr(scope.get("session_input_callback"), _TURN_ATTR, None)
    if not isinstance(turn, _Turn) or turn.session is not session:
        return None
    raw = scope.get("input")
    if not isinstance(raw, (str, list)):
        return None
    try:
        new_items = list(ItemHelpers.input_to_new_input_list(raw))
    except Exception:  # noqa: BLE001 - the SDK will say what is wrong with it
        return None
    return turn, new_items


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

    With a database file, token counts of long items are also kept in it (table
    ``protoprompt_token_counts``, see :class:`~protoprompt.SQLiteCountStore`), so the first
    turn after a restart does not tokenise the kept history again. The table holds keyed
    hashes and counts only, never text; ``clear_session`` leaves it (it is a cache shared
    by the database's sessions, bounded in size).

    Raises:
        TypeError: ``session_id`` is not a str, ``inner_session`` is not a ``Session``, or
            ``session_settings`` has an unknown key (``Unknown session settings: ...``).
        ValueError: ``session_id`` is empty, ``inner_session`` conflicts with the other
            arguments or is an ``OpenAIConversationsSession`` (server-managed history).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> ProtoPromptSession:
        inner = kwargs.get("inner_session")
        if (_SQLITE_VALIDATED_POP and (inner is None or type(inner) is SQLiteSession)
                and not issubclass(cls, SQLiteSession)):
            cls = _sqlite_backed(cls)
        return cast("ProtoPromptSession", super().__new__(cls))

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
    ) -> None:
        if not isinstance(windowed_reads, bool):
            raise TypeError(
                f"windowed_reads must be a bool, got {type(windowed_reads).__name__}")
        if not isinstance(session_id, str):
            raise TypeError(f"session_id must be a str, got {type(session_id).__name__}")
        if not session_id.strip():
            raise ValueError("session_id must be a non-empty string")
        settings = _coerce_settings(session_settings)
        self.session_id = session_id
        if inner_session is None:
            self._inner: Any = SQLiteSession(
                session_id, os.fspath(db_path), sessions_table=sessions_table,
                messages_table=messages_table, session_settings=settings)
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
                raise ValueError("sessions_table and messages_table name the tables of the "
                                 "default SQLiteSession; pass them to your inner_session")
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
        sqlite_inner = (isinstance(self._inner, SQLiteSession)
                        and type(self._inner).get_items is SQLiteSession.get_items)
        self._incremental = sqlite_inner if incremental is None else incremental
        self._reader: _sync.RowReader | None = None
        self._shared_key: _Key | None = None
        snapshot_at: tuple[str, str, str, str] | None = None
        if self._incremental and sqlite_inner:
            db = os.fspath(self._inner.db_path)
            if db != ":memory:":  # a memory database has no other writer
                table = self._inner.messages_table
                # get_items reads the rows itself, with their ids, so the index is compared
                # with exactly the rows the SDK hands over (see `_sync`).
                self._reader = _sync.RowReader(db, table, session_id)
                # That comparison makes sharing the index between objects safe, keyed by
                # the database's own identity and its file (see `_Key`).
                db_id = _database_id(db)
                if db_id is not None:
                    self._shared_key = (db_id, os.path.realpath(db), table, session_id)
                    snapshot_at = (db, db_id, table, session_id)
        self._index_state = (_shared_state(self._shared_key, snapshot_at) if self._shared_key
                             else _IndexState())
        if self._shared_key is not None and self._index_state.index.count_store is None:
            # Token counts outlive the process in the same database (SQLiteCountStore).
            self._index_state.index.count_store = _count_store(self._shared_key)
        # Token windows need the rows with their ids (a database file) and the index.
        self._windowed_reads = windowed_reads and self._reader is not None
        self._pending: deque[tuple[Any, tuple[str, str]]] = deque(maxlen=_MAX_PENDING_CONTEXTS)
        self._warned_wrapped = False
        self._pending_lock = threading.Lock()
        # Context messages produced lately (stored or not), for the model filter to pin.
        self._produced: deque[tuple[str, str]] = deque(maxlen=_MAX_PENDING_CONTEXTS)

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
        self._settings = _coerce_settings(value)

    async def get_items(self, limit: int | None = None, wrapper: Any = None) -> list[Item]:
        """The history, or its latest ``limit`` items in chronological order."""
        if limit is None and self._settings is not None:
            limit = self._settings.limit
        state = self._index_state
        epoch = state.epoch
        windowed = (limit is not None
                    or getattr(self.session_settings, "limit", None) is not None)
        if (self._windowed_reads and not windowed
                and not getattr(self._inner, "_closed", False)):
            # Not told apart by `wrapper`: the SDK passes it only when every method takes it,
            # and a pop_item inherited from SQLiteSession (0.24) does not, so it is None here.
            turn = _runner_turn(self)
            if turn is not None:
                try:
                    found = await asyncio.to_thread(self._read_window, *turn)
                except sqlite3.Error as exc:
                    _log.debug("protoprompt: window of %r not read: %s", self.session_id, exc)
                    found = None
                if found is not None:
                    items, facts = found
                    _LAST_READ.set(_Read(self, dataclasses.replace(facts, epoch=epoch)))
                    return cast("list[Item]", items)
        restorer: threading.Thread | None = None
        if not state.restore_tried and not windowed:
            # A stored index snapshot loads while the history is read (another thread).
            restorer = threading.Thread(target=state.restore, name="protoprompt-restore",
                                        daemon=True)
            restorer.start()
        seen: _sync.Seen | None = None
        try:
            if (self._reader is not None and not windowed
                    and not getattr(self._inner, "_closed", False)):
                # SQLiteSession.get_items' own read, with the ids of the rows (see _sync),
                # compared with the index while the rows are at hand.
                def look(rows: _sync.Rows) -> _sync.Seen | None:
                    return state.compare(rows, restorer) if self._incremental else None

                try:
                    items, seen = await asyncio.to_thread(self._reader.read, look)
                except sqlite3.Error as exc:
                    _log.debug("protoprompt: rows of %r not read: %s", self.session_id, exc)
                    items = await _call(self._inner.get_items, wrapper=wrapper)
            elif limit is None:
                items = await _call(self._inner.get_items, wrapper=wrapper)
            else:
                items = await _call(self._inner.get_items, limit, wrapper=wrapper)
        finally:
            if restorer is not None and restorer.is_alive():
                await asyncio.to_thread(restorer.join)
        if self._incremental:
            _LAST_READ.set(_Read(self, _sync.Read(
                len(items), windowed, epoch, self._reader is not None, seen)))
        return cast("list[Item]", items)

    def _read_window(
        self, turn: _Turn, new_items: list[Any]
    ) -> tuple[list[Any], _sync.Read] | None:
        """The newest items the turn's budget can reach and what the callback needs to pack
        them as the whole history, or ``None`` (read everything): no index synced with the
        rows, the greedy policy, a gone row, or no window smaller than the history.

        The window comes from the index (in memory or its snapshot) and the rows appended
        after its last row, classified before anything is trusted (``window_start``); see
        ``_sync.RowReader.read_window`` for the reads."""
        builder = turn.builder
        if getattr(builder, "policy", None) != "contiguous":
            return None
        reserve = builder.output_reserve if turn.output_reserve is None else turn.output_reserve
        budget = max(int(builder.max_tokens) - int(reserve), 0)
        model, encoding = builder.model, builder.encoding
        state = self._index_state
        state.restore()
        with state.lock:
            row_ids = state.row_ids
            n = len(state.index)
            if n < 2 or row_ids is None or len(row_ids) != n:
                return None
            version = state.version
            last_id = row_ids[-1]
        chosen: list[Any] = []

        def choose(appended: list[Any], rows: _sync.Rows) -> int | None:
            with state.lock:
                if state.version != version:
                    return None
                try:
                    w = state.index.window_start([*appended, *new_items], budget,
                                                 model=model, encoding=encoding)
                except Exception as exc:  # noqa: BLE001 - the full read's pack reports it
                    _log.debug("protoprompt: no window for %r: %s", self.session_id, exc)
                    return None
                if w <= 0:
                    return None
                w = min(w, n - 1)  # any earlier start packs the same; keep last_id's row
                chosen.append(w)
                chosen.append(array("q", row_ids[w:n - 1]))
                return int(row_ids[w])

        assert self._reader is not None
        got = self._reader.read_window(last_id, choose)
        if got is None:
            return None
        head_items, tail_items, tail_rows, head_ids = got
        w, expected = chosen
        if head_ids != expected:  # a row of the window is gone: the index does not hold
            return None
        window = head_items + tail_items
        if not any(_message_text(i) is not None for i in new_items) and not any(
                _message_text(i) is not None for i in window):
            return None  # the recall query would come from before the window
        window_ids = array("q", expected)
        window_ids.append(last_id)
        seen = _sync.Seen(version, n, tail_rows.ids_from(1))
        facts = _sync.Read(len(window), False, 0, True, seen, offset=w, window_ids=window_ids)
        return window, facts

    async def add_items(self, items: list[Item], wrapper: Any = None) -> None:
        """Append ``items``, except the context messages this session's callback produced."""
        pending = self.pending_context_count
        kept = self._without_own_context(items)
        if pending and len(kept) == len(items) and not self._warned_wrapped:
            if any(_is_encrypted_envelope(i) for i in kept):
                self._warned_wrapped = True
                warnings.warn(
                    "ProtoPromptSession is wrapped by an EncryptedSession, which encrypts items "
                    "before they reach it: the callback's context message cannot be told apart "
                    "and is stored. Wrap the other way round: "
                    "ProtoPromptSession(session_id, inner_session=EncryptedSession(...))",
                    RuntimeWarning, stacklevel=2)
        if items and not kept:
            return
        await _call(self._inner.add_items, kept, wrapper=wrapper)

    async def pop_item(self, wrapper: Any = None) -> Item | None:
        """Remove and return the newest item (``None`` when the session is empty)."""
        self._index_state.bump()
        try:
            return await _call(self._inner.pop_item, wrapper=wrapper)
        finally:
            self._index_state.bump()

    async def clear_session(self, wrapper: Any = None) -> None:
        """Remove this session's history. Long-term memory (the MemoryStore) is untouched."""
        with self._pending_lock:
            self._pending.clear()
        self._index_state.bump()
        try:
            await _call(self._inner.clear_session, wrapper=wrapper)
        finally:
            self._index_state.bump()
        if self._index_state.snapshot_at is not None:
            await asyncio.to_thread(self._index_state.forget_snapshot)

    def close(self) -> None:
        """Close the default ``SQLiteSession`` (an ``inner_session`` is left to its owner).

        Token counts still queued for the database are written first (up to 5 s), and the
        index snapshot if the index has grown since it was saved (see
        ``SNAPSHOT_MIN_ITEMS``)."""
        state = self._index_state
        state.wait_for_save()
        if len(state.index) >= SNAPSHOT_MIN_ITEMS:
            state.save()
        store = state.index.count_store
        if isinstance(store, SQLiteCountStore):
            store.flush(timeout=5.0)
        if self._reader is not None:
            self._reader.close()
        if self._owns_inner:
            self._inner.close()

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
        """The inner session's optional hooks (``_FORWARDED_HOOKS``) and public attributes
        (``db_path``, ``engine``, AdvancedSQLiteSession's branch methods...), read through."""
        if name in _FORWARDED_HOOKS or (not name.startswith("_") and name not in _NOT_FORWARDED):
            inner = self.__dict__.get("_inner")
            if inner is not None:
                value = getattr(inner, name)  # AttributeError when the inner has none
                if name == "run_compaction":
                    return self._rewrites(value)
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _rewrites(self, method: Any) -> Any:
        """``method`` (which rewrites the stored history) with the index reset around it."""
        state = self._index_state

        async def rewriting(*args: Any, **kwargs: Any) -> Any:
            state.bump()
            try:
                return await _call(method, *args, **kwargs)
            finally:
                state.bump()

        return rewriting

    async def _get_compaction_snapshot(self, limit: int, *,
                                       prune_prefix: Callable[[Item], bool] | None = None) -> Any:
        """The inner session's bounded compaction snapshot (``OpenAIResponsesCompactionSession``
        replaces its suffix atomically), or ``None`` when the inner has none. The replacement
        resets this session's index: a ``:memory:`` database has no row check to notice it."""
        reader = getattr(self._inner, "_get_compaction_snapshot", None)
        if reader is None:
            return None
        if prune_prefix is not None and _accepts_keyword(reader, "prune_prefix"):
            raw = await reader(limit, prune_prefix=prune_prefix)
        else:
            raw = await reader(limit)
        if raw is None or not dataclasses.is_dataclass(raw) or isinstance(raw, type):
            return None  # not the SDK's snapshot: without one the SDK needs full coverage
        return dataclasses.replace(raw, replace_suffix=self._rewrites(raw.replace_suffix))

    async def _atomic_replace_items(self, items: list[Item]) -> bool:
        """Replace the whole history atomically if the inner session can (``RedisSession``);
        ``False`` (nothing changed, the SDK falls back to clear and add) otherwise."""
        replace = getattr(type(self._inner), "_atomic_replace_items", None)
        if replace is None:
            return False
        return bool(await self._rewrites(replace)(self._inner, items))


    # ------------------------------------------------------------------ context bookkeeping

    def _expect_context(self, message: Mapping[str, Any]) -> tuple[str, str]:
        """Remember a context message the SDK is about to ask us to store."""
        key = _context_key(message)
        if key is None:  # pragma: no cover - the builder always produces this shape
            raise ValueError("not a context message")
        with self._pending_lock:
            self._pending.append((message, key))
            if key not in self._produced:
                self._produced.append(key)
        return key

    def _is_own_context(self, item: Any) -> bool:
        """Whether ``item`` is (a copy of) a context message this session's callback made."""
        key = _context_key(item)
        if key is None:
            return False
        with self._pending_lock:
            return key in self._produced

    def _current_run(self) -> _RunInput | None:
        """The callback's record of the run in this task, if it was this session's."""
        run = _RUN_INPUT.get()
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
        """``items`` minus the produced context messages (each one consumed once)."""
        with self._pending_lock:
            if not self._pending:
                return list(items)
            kept: list[Item] = []
            for item in items:
                index = next((i for i, (obj, _) in enumerate(self._pending) if obj is item), None)
                if index is None:
                    key = _context_key(item)
                    if key is not None:
                        index = next(
                            (i for i, (_, k) in enumerate(self._pending) if k == key), None
                        )
                if index is None:
                    kept.append(item)
                else:
                    del self._pending[index]
            return kept

    @property
    def pending_context_count(self) -> int:
        """Context messages produced by the callback and not yet seen in ``add_items``."""
        with self._pending_lock:
            return len(self._pending)

    # ------------------------------------------------------------------ the callback

    def _window_keep(self, facts: _sync.Read) -> tuple[int, _sync.RowIds] | None:
        """For a token window whose index changed after the read (another turn on a shared
        index ran in between): how many index items still hold for the window's history and
        the ids of the window's rows after them, or ``None`` when the rows before the window
        are no longer known to hold (caller holds the state's lock)."""
        state, w, ids = self._index_state, facts.offset, facts.window_ids
        row_ids = state.row_ids
        if (ids is None or facts.seen is None or row_ids is None
                or len(row_ids) != len(state.index) or len(row_ids) <= w
                or row_ids[w] != ids[0]):
            return None
        lo, hi = w + 1, min(len(row_ids), w + len(ids))  # the prefix of lo holds (_sync)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if row_ids[mid - 1] == ids[mid - 1 - w]:
                lo = mid
            else:
                hi = mid - 1
        rest = array("q", ids[lo - w:])
        rest.extend(facts.seen.new_ids)
        return lo, rest

    def _count_window(self, builder: Any, history: list[Item], offset: int,
                      output_reserve: int | None) -> None:
        """After a turn, count the costs the next token window is found from (caller holds
        the state's lock). A cost that cannot be counted keeps its lower bound: the next
        window is then larger, never wrong."""
        if not self._windowed_reads or getattr(builder, "policy", None) != "contiguous":
            return
        reserve = builder.output_reserve if output_reserve is None else output_reserve
        try:
            self._index_state.index.count_window(
                history, max(int(builder.max_tokens) - int(reserve), 0), model=builder.model,
                encoding=builder.encoding, history_offset=offset)
        except Exception as exc:  # noqa: BLE001 - an item the request did not need
            _log.debug("protoprompt: window costs of %r not counted: %s", self.session_id, exc)

    def _build_indexed(self, builder: TokenBudgetedContextBuilder, history: list[Item],
                       new_input: list[Item], facts: _sync.Read, keep: int,
                       kwargs: dict[str, Any], new_ids: _sync.RowIds | None = None
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
            plan = builder.build(history, new_input, index=state.index, history_offset=offset,
                                 **kwargs)
            self._count_window(builder, history, offset, kwargs.get("output_reserve"))
        finally:
            state.nbytes = state.index.nbytes
        if facts.seen is not None:
            if state.row_ids is None:
                state.row_ids = array("q")
            state.row_ids.extend(facts.seen.new_ids if new_ids is None else new_ids)
            state.nbytes += state.row_ids.itemsize * len(state.row_ids)
        state.generation = facts.epoch
        state.version += 1
        if len(state.index) != offset + len(history) or (
                state.row_ids is not None and len(state.row_ids) != len(state.index)):
            state.reset(facts.epoch)  # never reached: an index that does not add up is dropped
        elif state.due():
            state.save_in_background()
        if self._shared_key is not None:
            _account(self._shared_key, state)
        return plan

    def input_callback(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
    ) -> SessionInputCallback:
        """A ``session_input_callback`` for ``RunConfig`` that budgets every request.

        The callback builds the turn with ``builder`` (see
        :meth:`TokenBudgetedContextBuilder.build`) and returns ``plan.items``: the context
        message, the kept history objects and every new-input object — the SDK's own
        objects, never copies. The context message is registered with this session so
        :meth:`add_items` keeps it out of the history. Use it only with this session.
        The builder's tokenizer starts building in the background now (see
        :func:`protoprompt.preload`), so the first request does not wait for it.

        Args:
            builder: the budget, tokenizer and memory to use.
            system_prompt: mandatory text at the top of the context message.
            output_reserve: overrides ``builder.output_reserve``.
            scope: overrides ``builder.scope`` (e.g. one scope per user).
            on_plan: called with each plan (besides ``builder.last_plan``).

        Raises (from the callback, before the model is called):
            TokenBudgetExceededError: the mandatory part of the request does not fit.
        """
        if not callable(getattr(builder, "build", None)):
            raise TypeError(
                f"builder must be a TokenBudgetedContextBuilder, got {type(builder).__name__}"
            )
        if not isinstance(system_prompt, str):
            raise TypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
        if on_plan is not None and not callable(on_plan):
            raise TypeError("on_plan must be callable or None")
        encoding = getattr(builder, "encoding", None)
        if isinstance(encoding, str):
            # Build the tokenizer while the SDK reads the history, not in the first callback.
            preload(encoding=encoding, wait=False)

        def build(history: list[Item], new_input: list[Item], read: _Read | None) -> ContextPlan:
            kwargs: dict[str, Any] = dict(
                system_prompt=system_prompt, scope=scope, output_reserve=output_reserve)
            state = self._index_state
            facts = read.facts if read is not None and read.session is self else None
            with state.lock:
                decision = _sync.plan(facts, state.synced(), len(history), state.epoch)
                if decision.use_index and facts is not None:
                    return self._build_indexed(builder, history, new_input, facts,
                                               decision.keep, kwargs)
                if facts is not None and facts.offset and facts.count == len(history):
                    # A token window holds only the newest items: the index must hold the
                    # rest, also when another turn changed it since the read.
                    kept = self._window_keep(facts)
                    if kept is None:
                        raise ProtoPromptError(
                            "the session's history changed between the read of its newest "
                            "items and this turn's request (a pop or clear through another "
                            "session object): run the turn again")
                    return self._build_indexed(builder, history, new_input, facts, kept[0],
                                               kwargs, new_ids=kept[1])
            # Not the history our last read returned (a limit, a direct call, or the rows
            # could not be compared): packed without the index, which is left as it is.
            return builder.build(history, new_input, **kwargs)

        async def protoprompt_session_input(
            history: list[Item], new_input: list[Item]
        ) -> list[Item]:
            read = _LAST_READ.get() if self._incremental else None
            plan = await asyncio.to_thread(build, history, new_input, read)
            key = None
            if plan.context_message is not None:
                key = self._expect_context(plan.context_message)
            _RUN_INPUT.set(_RunInput(self, key, list(new_input), len(plan.items)))
            if on_plan is not None:
                on_plan(plan)
            return list(plan.items)

        setattr(protoprompt_session_input, _TURN_ATTR, _Turn(self, builder, output_reserve))
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

        return ModelInputFilter(builder, oversized_output=oversized_output,
                                output_reserve=output_reserve, session=self, on_call=on_call)

    def run_config(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
        oversized_output: OversizedOutput = "error",
        on_call: Callable[[ModelCallPlan], None] | None = None,
        **run_config_fields: Any,
    ) -> RunConfig:
        """A ``RunConfig`` with both budget hooks set: the one-liner for a budgeted agent.

        ``session_input_callback`` is :meth:`input_callback` (recalled memory, packed
        history, once per run) and ``call_model_input_filter`` is :meth:`model_input_filter`
        (every model call of the run fits, instructions and tools included). Other
        ``RunConfig`` fields pass through::

            config = session.run_config(builder, system_prompt="Answer from the contract.",
                                        tracing_disabled=True)
            result = await Runner.run(agent, question, session=session, run_config=config)
            config.call_model_input_filter.last_plan.explain()

        Raises:
            TypeError: ``run_config_fields`` set one of the two hooks, or an unknown field.
        """
        for name in ("session_input_callback", "call_model_input_filter"):
            if name in run_config_fields:
                raise TypeError(f"run_config() sets {name} itself; build a RunConfig "
                                "directly to use your own")
        callback = self.input_callback(builder, system_prompt=system_prompt,
                                       output_reserve=output_reserve, scope=scope,
                                       on_plan=on_plan)
        model_filter = self.model_input_filter(builder, oversized_output=oversized_output,
                                               output_reserve=output_reserve, on_call=on_call)
        return RunConfig(session_input_callback=callback, call_model_input_filter=model_filter,
                         **run_config_fields)
