"""The seam between a :class:`ProtoPromptSession` and its builder's evictions (recall of
evicted turns, the rolling summary; see :mod:`protoprompt.recall`).

The session calls, per turn: :meth:`SessionMemory.prepare` before the build (the turn's
number and summary, as ``build`` keywords) and :meth:`SessionMemory.observe` after it
(what the turn evicted, with the rows' ids), then the callable ``observe`` returned, on the
event loop, to start the background work. Its ``clear_session``, ``pop_item`` and history
rewrites call :meth:`cleared`, :meth:`popped` and :meth:`rewritten`.

Rows are keyed by their row id when the session reads its rows with their ids (an
``SQLiteSession`` in a database file): rows before a token window are then read back from
the database by id when they need indexing. Otherwise rows are keyed by their position.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..._process import SERVED_BUILDERS, sqlite_gate
from ..._recall._ledger import position_key
from ...recall import Evictions, Ledger, TurnRows, item_digest
from ...summaries import MemorySummaryStore, SummaryStore
from .._sdk._names import SQLiteSession
from .._stores._summary_stores import summary_store_for

if TYPE_CHECKING:
    from ...context import ContextPlan, TokenBudgetedContextBuilder
    from ...memory import MemoryScope
    from .._stores._snapshots import IndexState
    from ..session import ProtoPromptSession

_log = logging.getLogger("protoprompt")

_FETCH_CHUNK = 500
_SERVED_SESSIONS = 4096
"""Stored sessions whose builders and scopes this process remembers (least recently served
forgotten first); a builder's own scope is always remembered."""


def remember_served(key: Any, builder: Any, scope: MemoryScope | None) -> None:
    """``builder`` (given ``scope``) served the stored session ``key`` (``None``: unknown)."""
    with SERVED_BUILDERS.lock:
        items = SERVED_BUILDERS.items
        for k, s in ((None, None), (key, scope)):
            if k is None and s is not None:
                continue
            entries = items.setdefault(k, [])
            if not any(ref() is builder and given == s for ref, given in entries):
                entries[:] = [(ref, given) for ref, given in entries if ref() is not None]
                entries.append((weakref.ref(builder), s))
            if k is not None:
                items.move_to_end(k)
        while len(items) > _SERVED_SESSIONS + 1:
            oldest = next(k for k in items if k is not None)
            del items[oldest]


def served(key: Any) -> list[tuple[Any, MemoryScope | None]]:
    """The builders (and given scopes) of this process that may hold records or a summary
    of the stored session ``key``: every builder with recall or a summary that served a
    session (with its own scope), and those given another scope for this one."""
    with SERVED_BUILDERS.lock:
        entries = list(SERVED_BUILDERS.items.get(None, []))
        if key is not None:
            entries += SERVED_BUILDERS.items.get(key, [])
    found = []
    for ref, scope in entries:
        builder = ref()
        if builder is not None and (builder, scope) not in found:
            found.append((builder, scope))
    return found


def read_rows(db_path: str, table: str, session_id: str, ids: list[int]) -> dict[int, Any]:
    """Items by row id, as ``SQLiteSession.get_items`` decodes them (rows that are not JSON
    are left out), from one read transaction."""
    found: dict[int, Any] = {}
    with sqlite_gate():  # no fork inside SQLite work (see protoprompt._process)
        conn = sqlite3.connect(db_path, timeout=5.0, isolation_level=None)
        try:
            conn.execute("BEGIN")
            for i in range(0, len(ids), _FETCH_CHUNK):
                chunk = ids[i : i + _FETCH_CHUNK]
                marks = ", ".join("?" for _ in chunk)
                sql = f'SELECT id, message_data FROM "{table}" WHERE session_id = ? AND id IN '
                rows = conn.execute(f"{sql}({marks})", (session_id, *chunk)).fetchall()
                for row_id, data in rows:
                    try:
                        found[int(row_id)] = json.loads(data)
                    except (json.JSONDecodeError, TypeError):
                        continue
            conn.execute("COMMIT")
        finally:
            conn.close()
    return found


def _last_row(db_path: str, table: str, session_id: str) -> int | None:
    with sqlite_gate():
        conn = sqlite3.connect(db_path, timeout=5.0)
        try:
            row = conn.execute(
                f'SELECT max(id) FROM "{table}" WHERE session_id = ?', (session_id,)
            ).fetchone()
        finally:
            conn.close()
    return None if row is None or row[0] is None else int(row[0])


class SessionMemory:
    """What one session hands one builder's :class:`~protoprompt.recall.Evictions`."""

    def __init__(
        self,
        session: ProtoPromptSession,
        builder: TokenBudgetedContextBuilder,
        evictions: Evictions,
        scope: MemoryScope | None,
        *,
        index_state: Callable[[], IndexState],
        store_kind: str | None,
        stored_key: Callable[[], Any] = lambda: None,
    ) -> None:
        """``index_state``: the session's index state now; ``store_kind``: the kind of its
        history store (``None``: it reads through the inner session); ``stored_key``: the
        key of the stored session (its pool key; ``None``: unknown)."""
        self.session = session
        self._index_state = index_state
        self._stored_key = stored_key
        self.builder = builder
        self.evictions = evictions
        self.given_scope = scope
        """The scope the session callback was given (``None``: the builder's)."""
        inner = session.inner_session
        db = getattr(inner, "db_path", None)
        self._file: tuple[str, str] | None = None
        if (
            isinstance(inner, SQLiteSession)
            and isinstance(db, (str, os.PathLike))
            and os.fspath(db) != ":memory:"
        ):
            self._file = (os.fspath(db), str(inner.messages_table))
        # Rows keyed by their SQLite row id when the session reads them from a file (the
        # ids only grow); other stores' rows are keyed by position.
        self.by_row_id = store_kind == "sqlite" and self._file is not None
        # The summary beside the history, shared by every worker (else kept by the process).
        self._summaries: SummaryStore | None = None
        if builder.summarizer is not None:
            self._summaries = summary_store_for(
                inner, session.session_id, keyed="row" if self.by_row_id else "position"
            )

    @property
    def scope(self) -> MemoryScope | None:
        return self.given_scope if self.given_scope is not None else self.builder.scope

    def _ledger(self) -> Ledger:
        return self.evictions.ledger(self._index_state())

    def _summary_store(self, ledger: Ledger) -> SummaryStore | None:
        if self.builder.summarizer is None:
            return None
        if self._summaries is not None:
            return self._summaries
        if ledger.summary_store is None:
            ledger.summary_store = MemorySummaryStore()
        store: SummaryStore = ledger.summary_store
        return store

    # ------------------------------------------------------------------ a turn

    def prepare(self, history: Sequence[Any], offset: int) -> dict[str, Any]:
        """The ``build`` keywords of this turn (caller holds the index state's lock when
        the session has an index)."""
        state = self._index_state()
        ledger = self._ledger()
        index = state.index

        def user_positions(start: int, end: int) -> list[int]:
            if len(index) < end:
                raise LookupError("the index does not hold the rows before the window")
            return index.user_positions(start, end)

        memory = self.evictions.prepare(
            ledger, history, offset, state.epoch, user_positions, self._summary_store(ledger)
        )
        return {
            "session_id": self.session.session_id,
            "turn": memory.turn,
            "summary": memory.summary,
        }

    def observe(
        self,
        plan: ContextPlan,
        history: Sequence[Any],
        offset: int,
        row_ids: Sequence[int] | None,
    ) -> Callable[[], None] | None:
        """Hand the turn's evictions over (see :meth:`Evictions.observe`); ``row_ids``: the
        row id of every history position when the session reads its rows (``None``: not
        known this turn, or the rows are keyed by position)."""
        scope = self.scope
        if scope is None and self.builder.summarizer is None:
            return None
        # Another session object of this stored session (one per request) forgets with it.
        remember_served(self._stored_key(), self.builder, self.given_scope)
        if self.by_row_id and row_ids is None:
            return None  # a turn packed without the rows' ids: a later turn hands them over
        fetch: Callable[[list[int]], dict[int, Any]] | None = None
        if self._file is not None and row_ids is not None:
            db, table = self._file
            sid = self.session.session_id

            def fetch_rows(ids: list[int]) -> dict[int, Any]:
                return read_rows(db, table, sid, ids)

            fetch = fetch_rows

        ledger = self._ledger()
        rows = TurnRows(
            session_id=self.session.session_id,
            scope=scope,
            n_history=offset + len(history),
            offset=offset,
            items=history,
            kept=plan.pack.kept_history,
            dependency=plan.pack.dependency,
            row_ids=row_ids if self.by_row_id else None,
            fetch=fetch,
            summaries=self._summary_store(ledger),
            epoch=self._index_state().epoch,
            read_all=self._read_all if fetch is None and offset else None,
        )
        return self.evictions.observe(ledger, rows)

    async def _read_all(self) -> list[Any]:
        """The whole history as the inner session reads it (a summary of rows before a
        token window that cannot be read by row id)."""
        items: list[Any] = await self.session.inner_session.get_items()
        return items

    # ------------------------------------------------------------------ changes of the history

    def cleared(self) -> None:
        """The session's history was cleared: its recall records and summary go too."""
        self._ledger().reset()
        scope = self.scope
        if scope is not None:
            self.evictions.forget(scope, self.session.session_id)
        store = self._summary_store(self._ledger())
        if store is not None:
            store.clear()

    def popped(self, item: Any, length: Callable[[], int]) -> None:
        """``item`` was popped: the record of its row goes. ``length()`` reads the
        history's length (only for rows keyed by position, and only when a record may be
        the popped row's)."""
        self._ledger().reset()
        scope = self.scope
        if scope is None or not self.builder.recall_evicted:
            return
        sid = self.session.session_id
        if self.by_row_id and self._file is not None:
            last = _last_row(self._file[0], self._file[1], sid)
            self.evictions.forget(scope, sid, from_row=0 if last is None else last + 1)
            return
        digest = item_digest(item)
        if digest is None or not self.builder.store.history_rows(sid, scope=scope, digest=digest):
            return
        # The popped row's record only: records at later positions are those of rows a
        # compaction replaced.
        self.evictions.forget_rows(scope, sid, [position_key(length(), digest)])

    def rewritten(self) -> None:
        """The history was rewritten (compaction): positions mean other rows now. Records
        of rows that are gone stay (what they said was evicted)."""
        self._ledger().reset()
