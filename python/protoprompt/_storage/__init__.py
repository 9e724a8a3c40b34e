"""protoprompt's own state kept beside a session's history, written once for every engine.

- :mod:`.dialect`: what differs between the SQL engines (column types) and what does not
  (``:name`` placeholders and ``INSERT ... ON CONFLICT`` upserts, which SQLite and
  PostgreSQL both read);
- :mod:`.engines`: a SQLite database file, a PostgreSQL database (through SQLAlchemy, the
  driver of the session's own engine) and a Redis database, each running a few statements
  on its own connection and saying what failed;
- :mod:`.records`: one *session record* of a kind (:class:`~.records.Kind`: an index
  snapshot, a cache-stable prefix, a rolling summary): a row keyed by
  ``(messages_table, session_id)`` in SQL, a hash that expires with the session's list in
  Redis; load, replace, delete, compare-and-set and read-then-write in one transaction,
  never raising;
- :mod:`.tables`: a table keyed by one column (get many, put many, delete, trim to the
  newest, size) on a ``sqlite3`` or SQLAlchemy connection;
- :mod:`.counts`: the token counts of a database (``protoprompt_token_counts``, or a Redis
  hash) for :mod:`protoprompt.count_store`; calibration (:mod:`protoprompt.calibration`) is
  a :class:`~.tables.Table` too.

The stores of ``protoprompt.integrations`` (``_snapshots``, ``_prefix_state``,
``_turn_state``) and the summaries (``protoprompt.summaries``) are written once over a
:class:`~.records.Record`; only the engines know SQL from Redis.
"""

from __future__ import annotations

from .dialect import POSTGRESQL, SQLITE, Dialect
from .engines import redis_record, sql_record, sqlite_record
from .records import Kind, Record, RecordStore

__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "Dialect",
    "Kind",
    "Record",
    "RecordStore",
    "redis_record",
    "sql_record",
    "sqlite_record",
]
