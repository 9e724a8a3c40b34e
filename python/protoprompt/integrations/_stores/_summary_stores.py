"""Where a session's rolling summary is kept: beside its history, in the same engine, shared
by every worker serving the session (see :mod:`protoprompt.summaries`).

===========================  ==========================================================
inner session                the summary
===========================  ==========================================================
``SQLiteSession`` (a file)   table ``protoprompt_summaries`` of the file
``SQLAlchemySession``        the same table in its database: on a SQLite file as for
                             ``SQLiteSession``; on PostgreSQL bound to the messages
                             table's identity (``name#oid``), like the index snapshots
``RedisSession``             a hash ``{prefix}:{id}:protoprompt:summary``
anything else, or a memory   kept by this process (:class:`MemorySummaryStore`)
database
===========================  ==========================================================

Every engine keeps the same rules, written once (:class:`~protoprompt.summaries.
RecordSummaryStore` over a session record of :mod:`protoprompt._storage`): a stored summary
sits behind a checksum of its fields (a damaged row, a row of another kind of key or of
another table is read as no summary and replaced by the next update); an update is a
compare-and-set against the state it began from, so workers never go back to an older
summary; a clear stores an empty summary of the next version (a *tombstone*), so an update
that began before the clear -- from the old state, or from none -- is not stored. On Redis
the summary expires with the session's list as it was when the summary was written (a
session whose ``ttl`` keeps extending its list may lose its summary: it is then made again
from the rows still stored), a tombstone after a day (far longer than an update may run),
and nothing is written once the list is gone.
"""

from __future__ import annotations

import os
from typing import Any

from ... import _seams
from ..._storage import Record, redis_record, sql_record
from ...summaries import (
    KIND,
    TOMBSTONE_SECONDS,
    RecordSummaryStore,
    SQLiteSummaryStore,
    SummaryStore,
)

__all__ = ["TOMBSTONE_SECONDS", "summary_store_for"]


def summary_store_for(inner: Any, session_id: str, *, keyed: str) -> SummaryStore | None:
    """The store of the summary of ``inner``'s session beside its history (``None``: none,
    the summary is kept by the process). ``keyed``: what the summary's ``upto`` counts
    (``"row"`` ids or ``"position"``)."""
    from .._sdk._names import SQLiteSession
    from ._store import _class_named

    if isinstance(inner, SQLiteSession):
        db = getattr(inner, "db_path", None)
        if not isinstance(db, (str, os.PathLike)) or os.fspath(db) == ":memory:":
            return None
        return SQLiteSummaryStore(os.fspath(db), str(inner.messages_table), session_id, keyed=keyed)
    module = "agents.extensions.memory.sqlalchemy_session"
    if _class_named(inner, module, "SQLAlchemySession") is not None:
        return _sqlalchemy(inner, session_id, keyed)
    module = "agents.extensions.memory.redis_session"
    if _class_named(inner, module, "RedisSession") is not None and _seams.redis_readable(inner):
        return RedisSummaryStore(inner, session_id, keyed)
    return None


def _sqlalchemy(inner: Any, session_id: str, keyed: str) -> SummaryStore | None:
    from ._sqlalchemy_store import _is_memory

    engine = getattr(inner, "engine", None)
    readable = _seams.sqlalchemy_readable(inner)
    table = getattr(_seams.sqlalchemy_table(inner), "name", None) if readable else None
    if engine is None or not isinstance(table, str) or _is_memory(engine):
        return None
    dialect = engine.dialect.name
    if dialect == "sqlite":
        path = os.fspath(engine.url.database)
        return SQLiteSummaryStore(path, table, session_id, keyed=keyed)
    if dialect != "postgresql":
        return None

    def locate() -> Record:
        """A row of ``protoprompt_summaries`` bound to the messages table's identity (found
        on first use; no lock is held while it is looked up, so none is held at a fork)."""
        from ._sqlalchemy_store import _server

        server = _server(engine)
        server.ready()  # creates protoprompt's tables, this one included
        oid = server.table_oid(table)
        if oid is None:
            raise LookupError(f"the session's table {table!r} does not exist")
        return sql_record(server, KIND, f"{table}#{oid}", session_id)

    return RecordSummaryStore(locate, session_id, keyed=keyed)


class RedisSummaryStore(RecordSummaryStore):
    """The summary of a ``RedisSession``: the hash :attr:`key` (fields ``keyed``, ``upto``,
    ``version``, ``summary``, ``checksum``), used on protoprompt's I/O loop (see
    ``_redis_store``)."""

    def __init__(self, inner: Any, session_id: str, keyed: str) -> None:
        session_key, list_key, prefix = _seams.redis_keys(inner)
        self.key = f"{session_key}:protoprompt:{KIND.suffix}"
        """The hash (the record's: ``{list key minus :messages}:protoprompt:summary``)."""

        def locate() -> Record:
            from ._redis_store import _server

            server = _server(_seams.redis_client(inner), prefix)
            server.ready()
            return redis_record(server, KIND, list_key, session_id)

        super().__init__(locate, session_id, keyed=keyed)
