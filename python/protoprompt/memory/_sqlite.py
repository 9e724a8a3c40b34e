"""The SQLite engine of the memory store: FTS5 with bm25.

All tables are prefixed ``pp_mem_`` so a store can share a database file with the OpenAI
Agents SDK's ``SQLiteSession`` tables. A file database is in WAL mode and has two
connections, each guarded by a lock of its own: one for writes, one for reads. Reads never
wait for writes: a write that waits (up to 30 s) for the database's write lock while another
connection holds it (another store, another process, the SDK's session) holds only the write
lock, so a turn that searches for recall meanwhile reads at once. A private ``":memory:"``
database has one connection (there is no other connection to wait for).

Every statement runs inside the process's SQLite gate (``protoprompt._process``), so a fork
never happens in the middle of one; a write waits for the database's write lock outside it
(in short steps), so a fork does not wait for that. A forked child uses none of its parent's
connections of a file database (they are kept, never used or closed) and opens its own, with
new locks; a ``":memory:"`` database is the child's own copy and is used on.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .. import _process
from .._process import sqlite_gate
from .._storage.dialect import SQLITE
from ._backend import Row, ScopeParams
from ._sql import COLUMNS, HISTORY, SQLMemory, scope_eq, scope_filter

__all__ = ["BUSY_TIMEOUT", "SQLiteBackend", "fts5_match"]

BUSY_TIMEOUT = 30.0
"""Seconds a write waits for the database's write lock (and a read for a lock it needs)
while another connection holds it, before it fails."""
_BEGIN_STEP = 0.05
"""Seconds one attempt to begin a write waits inside the SQLite gate (then it leaves the
gate, sleeps a little and tries again, so a fork never waits for another writer)."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pp_mem_records (
    id          INTEGER PRIMARY KEY,
    rtype       TEXT NOT NULL CHECK (rtype IN ('document', 'fact')),
    s_tenant    TEXT NOT NULL,
    s_user      TEXT NOT NULL,
    s_thread    TEXT NOT NULL,
    s_kind      TEXT NOT NULL,
    doc_id      TEXT,
    chunk_index INTEGER,
    char_start  INTEGER,
    char_end    INTEGER,
    fact_id     TEXT UNIQUE,
    importance  REAL,
    text        TEXT NOT NULL,
    metadata    TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    embedding   BLOB
);
CREATE INDEX IF NOT EXISTS pp_mem_records_scope
    ON pp_mem_records (s_tenant, s_user, s_thread, s_kind, rtype, doc_id);
CREATE VIRTUAL TABLE IF NOT EXISTS pp_mem_fts USING fts5(
    text,
    content = 'pp_mem_records',
    content_rowid = 'id',
    tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TRIGGER IF NOT EXISTS pp_mem_records_ai AFTER INSERT ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TRIGGER IF NOT EXISTS pp_mem_records_ad AFTER DELETE ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (pp_mem_fts, rowid, text) VALUES ('delete', old.id, old.text);
END;
CREATE TRIGGER IF NOT EXISTS pp_mem_records_au AFTER UPDATE OF text ON pp_mem_records BEGIN
    INSERT INTO pp_mem_fts (pp_mem_fts, rowid, text) VALUES ('delete', old.id, old.text);
    INSERT INTO pp_mem_fts (rowid, text) VALUES (new.id, new.text);
END;
CREATE TABLE IF NOT EXISTS pp_mem_history (
    id          INTEGER PRIMARY KEY,
    s_tenant    TEXT NOT NULL,
    s_user      TEXT NOT NULL,
    s_thread    TEXT NOT NULL,
    s_kind      TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    row_key     INTEGER NOT NULL,
    passage     INTEGER NOT NULL,
    char_start  INTEGER NOT NULL,
    char_end    INTEGER NOT NULL,
    digest      TEXT NOT NULL,
    text        TEXT NOT NULL,
    metadata    TEXT NOT NULL DEFAULT '{}',
    created_at  REAL NOT NULL,
    embedding   BLOB,
    UNIQUE (s_tenant, s_user, s_thread, s_kind, session_id, row_key, passage)
);
CREATE TABLE IF NOT EXISTS pp_mem_profiles (
    s_tenant   TEXT NOT NULL,
    s_user     TEXT NOT NULL,
    s_thread   TEXT NOT NULL,
    s_kind     TEXT NOT NULL,
    profile    TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (s_tenant, s_user, s_thread, s_kind)
);
"""

_SCOPE_COLUMNS = ("s_tenant", "s_user", "s_thread", "s_kind")
_HISTORY_KEY = (*_SCOPE_COLUMNS, "session_id")


def owner_token(values: Sequence[str], prefix: str) -> str:
    """The SQL expression of the owner token of a passage's scope (prefix ``k``: its four
    parameters) or session (``s``: with its session id) from ``values`` (column names, or
    ``?`` for a bound parameter): one full-text token, the same for the passages of that
    owner and for no other's -- each value in hexadecimal (of its UTF-8 text: the same bound
    or stored), joined by ``x``. It starts with 65 characters: FTS5's porter stemmer
    leaves tokens longer than 64 characters as they are, so no suffix of it is cut off."""
    return f"'{prefix}' || printf('%064d', 0) || " + " || 'x' || ".join(f"hex({v})" for v in values)


def _owner_tokens(alias: str) -> tuple[str, str]:
    """The scope's and the session's owner tokens of a row named ``alias``."""
    return (
        owner_token([f"{alias}{c}" for c in _SCOPE_COLUMNS], "k"),
        owner_token([f"{alias}{c}" for c in _HISTORY_KEY], "s"),
    )


HISTORY_FTS = """CREATE VIRTUAL TABLE pp_mem_history_fts USING fts5(
    text,
    scope,
    session,
    content = 'pp_mem_history_fts_source',
    content_rowid = 'id',
    tokenize = 'porter unicode61 remove_diacritics 2'
)"""
"""The history layer's full-text table: its words stemmed (``porter``), so "researching"
finds "research" (see ``_stem``), and each passage's owners as one token each
(:func:`owner_token`; read from the view ``pp_mem_history_fts_source`` when the table is
built again): a search of one session (or scope) matches the owner's token with its words,
so the full-text index finds only that session's passages. Without it, a search of one
session in a database of many read every passage of the database holding the words, each
looked up for its scope (100 sessions of 1,000 passages: 3.3 ms to find one session's
18, against 0.09 ms with the token). A database whose table was made otherwise (by an
older store, or by anyone else) has it made again from ``pp_mem_history`` on first use."""

_NEW_OWNERS = ", ".join(_owner_tokens("new."))
_OLD_OWNERS = ", ".join(_owner_tokens("old."))
_HISTORY_FTS_PARTS = (
    "CREATE VIRTUAL TABLE pp_mem_history_vocab USING fts5vocab('pp_mem_history_fts', 'row')",
    f"""CREATE TRIGGER pp_mem_history_ai AFTER INSERT ON pp_mem_history BEGIN
    INSERT INTO pp_mem_history_fts (rowid, text, scope, session)
        VALUES (new.id, new.text, {_NEW_OWNERS});
END""",
    f"""CREATE TRIGGER pp_mem_history_ad AFTER DELETE ON pp_mem_history BEGIN
    INSERT INTO pp_mem_history_fts (pp_mem_history_fts, rowid, text, scope, session)
        VALUES ('delete', old.id, old.text, {_OLD_OWNERS});
END""",
    f"""CREATE TRIGGER pp_mem_history_au AFTER UPDATE OF text, {", ".join(_HISTORY_KEY)}
ON pp_mem_history BEGIN
    INSERT INTO pp_mem_history_fts (pp_mem_history_fts, rowid, text, scope, session)
        VALUES ('delete', old.id, old.text, {_OLD_OWNERS});
    INSERT INTO pp_mem_history_fts (rowid, text, scope, session)
        VALUES (new.id, new.text, {_NEW_OWNERS});
END""",
    "CREATE VIEW pp_mem_history_fts_source AS SELECT id, text, {} AS scope, {} AS session"
    " FROM pp_mem_history".format(*_owner_tokens("")),
)
_HISTORY_FTS_NAMES = (
    ("table", "pp_mem_history_vocab"),
    ("trigger", "pp_mem_history_ai"),
    ("trigger", "pp_mem_history_ad"),
    ("trigger", "pp_mem_history_au"),
    ("view", "pp_mem_history_fts_source"),
    ("table", "pp_mem_history_fts"),
)


def _schema_sql(
    conn: sqlite3.Connection, names: Sequence[tuple[str, str]]
) -> dict[tuple[str, str], str]:
    """The statement that made each of ``names`` (kind, name) the database has."""
    marks = ", ".join("?" for _ in names)
    return {
        (str(kind), str(name)): sql
        for kind, name, sql in conn.execute(
            f"SELECT type, name, sql FROM sqlite_master WHERE name IN ({marks})",
            [name for _, name in names],
        )
    }


def _remake(
    conn: sqlite3.Connection,
    current: Callable[[], bool],
    drop: Sequence[str],
    make: Callable[[], None],
) -> None:
    """In one write transaction (``BEGIN IMMEDIATE``: other workers see the old schema or
    the new one; the first to get the write lock does it), unless ``current()`` holds once
    it has the lock: drop whatever the database has under each of the names ``drop``, in
    that order (a foreign object of another kind too), then ``make()``."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not current():
            marks = ", ".join("?" for _ in drop)
            found = dict(
                conn.execute(
                    f"SELECT name, type FROM sqlite_master WHERE name IN ({marks})", list(drop)
                ).fetchall()
            )
            for name in drop:
                kind = found.get(name)
                if kind in ("table", "trigger", "view", "index"):
                    conn.execute(f"DROP {str(kind).upper()} IF EXISTS {name}")
            make()
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def history_fts_current(conn: sqlite3.Connection) -> bool:
    """Whether the history layer's full-text table, its vocabulary and triggers are exactly
    this version's (anything else -- missing, older, damaged or foreign -- is made again)."""
    wanted = {("table", "pp_mem_history_fts"): HISTORY_FTS}
    wanted.update(zip(_HISTORY_FTS_NAMES[:5], _HISTORY_FTS_PARTS, strict=True))
    return _schema_sql(conn, _HISTORY_FTS_NAMES) == wanted


HISTORY_FTS_CRISISMERGE = 2
"""The history layer's full-text table merges its index segments as soon as two are on one
level (FTS5's ``crisismerge``; its default is 16). Each background indexing call adds a
small segment, and a search looks each of its terms up in every segment: with the default,
a session's index holds up to 15 of them; merged at 2, a few (about one per level). In the
recall bench (``benches/test_bench_recall.py``) a turn's statistics and search statements
took 20-30% less time, for about 0.1 ms more of merging per indexing call, which runs in
the background, off the request's path."""


def tune_history_fts(conn: sqlite3.Connection) -> None:
    """Set :data:`HISTORY_FTS_CRISISMERGE` on the history layer's full-text table when it is
    not set (a database made by an earlier version): one read, a write only then."""
    found = conn.execute(
        "SELECT v FROM pp_mem_history_fts_config WHERE k = 'crisismerge'"
    ).fetchone()
    if found is None or found[0] != HISTORY_FTS_CRISISMERGE:
        conn.execute(
            "INSERT INTO pp_mem_history_fts (pp_mem_history_fts, rank) VALUES ('crisismerge', ?)",
            (HISTORY_FTS_CRISISMERGE,),
        )


def migrate_history_fts(conn: sqlite3.Connection) -> None:
    """Make the history layer's full-text table this version's (``porter``), rebuilt from
    the passages in ``pp_mem_history``, when it is not (one transaction: other workers see
    the old table or the new one; the first to get the write lock does it), and see that it
    merges its segments early (:func:`tune_history_fts`)."""
    if history_fts_current(conn):
        tune_history_fts(conn)
        return

    def make() -> None:
        conn.execute(HISTORY_FTS)
        for statement in _HISTORY_FTS_PARTS:
            conn.execute(statement)
        conn.execute("INSERT INTO pp_mem_history_fts (pp_mem_history_fts) VALUES ('rebuild')")
        tune_history_fts(conn)

    def current() -> bool:
        # Merging early is set whether this worker made the table or another did.
        made = history_fts_current(conn)
        if made:
            tune_history_fts(conn)
        return made

    _remake(conn, current, [name for _, name in _HISTORY_FTS_NAMES], make)


_KEY_EQ = " AND ".join(f"{c} = old.{c}" for c in _HISTORY_KEY)
_HISTORY_COUNTS_PARTS = (
    """CREATE TABLE pp_mem_history_counts (
    s_tenant   TEXT NOT NULL,
    s_user     TEXT NOT NULL,
    s_thread   TEXT NOT NULL,
    s_kind     TEXT NOT NULL,
    session_id TEXT NOT NULL,
    n          INTEGER NOT NULL,
    PRIMARY KEY (s_tenant, s_user, s_thread, s_kind, session_id)
) WITHOUT ROWID""",
    """CREATE TRIGGER pp_mem_history_count_ai AFTER INSERT ON pp_mem_history BEGIN
    INSERT INTO pp_mem_history_counts
        VALUES (new.s_tenant, new.s_user, new.s_thread, new.s_kind, new.session_id, 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END""",
    f"""CREATE TRIGGER pp_mem_history_count_ad AFTER DELETE ON pp_mem_history BEGIN
    UPDATE pp_mem_history_counts SET n = n - 1 WHERE {_KEY_EQ};
    DELETE FROM pp_mem_history_counts WHERE {_KEY_EQ} AND n <= 0;
END""",
    f"""CREATE TRIGGER pp_mem_history_count_au AFTER UPDATE OF {", ".join(_HISTORY_KEY)}
ON pp_mem_history BEGIN
    UPDATE pp_mem_history_counts SET n = n - 1 WHERE {_KEY_EQ};
    DELETE FROM pp_mem_history_counts WHERE {_KEY_EQ} AND n <= 0;
    INSERT INTO pp_mem_history_counts
        VALUES (new.s_tenant, new.s_user, new.s_thread, new.s_kind, new.session_id, 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END""",
)
"""The passages of each scope and session of the history layer, kept by triggers: a turn's
search reads how many passages it searches (and the table holds) in a few rows, where a
``count(*)`` of the passages took time in proportion to them (about 6 ms a turn at 100k
passages)."""
_HISTORY_COUNTS_NAMES = (
    ("table", "pp_mem_history_counts"),
    ("trigger", "pp_mem_history_count_ai"),
    ("trigger", "pp_mem_history_count_ad"),
    ("trigger", "pp_mem_history_count_au"),
)


def history_counts_current(conn: sqlite3.Connection) -> bool:
    """Whether the history layer's passage counts and their triggers are exactly this
    version's (anything else -- missing, older, damaged or foreign -- is made again)."""
    wanted = dict(zip(_HISTORY_COUNTS_NAMES, _HISTORY_COUNTS_PARTS, strict=True))
    return _schema_sql(conn, _HISTORY_COUNTS_NAMES) == wanted


def migrate_history_counts(conn: sqlite3.Connection) -> None:
    """Make the history layer's passage counts (:data:`_HISTORY_COUNTS_PARTS`) this
    version's when they are not, counted from ``pp_mem_history`` (in the transaction that
    makes the triggers: no passage is written between the count and them)."""
    if history_counts_current(conn):
        return

    def make() -> None:
        for statement in _HISTORY_COUNTS_PARTS:
            conn.execute(statement)
        key = ", ".join(_HISTORY_KEY)
        conn.execute(
            f"INSERT INTO pp_mem_history_counts SELECT {key}, count(*)"
            f" FROM pp_mem_history GROUP BY {key}"
        )

    # The triggers before their table.
    names = [name for _, name in _HISTORY_COUNTS_NAMES]
    _remake(conn, lambda: history_counts_current(conn), names[::-1], make)


_SCOPE_EQ = scope_eq(SQLITE.mark)


def fts5_match(pieces: Sequence[str]) -> str | None:
    """The FTS5 query of a search's pieces (see ``_ranking.query_pieces``), or ``None``
    without any: each piece double-quoted (embedded quotes doubled), so FTS5 syntax such as
    ``NEAR``, ``*``, ``-``, ``:`` or parentheses is matched literally, OR-combined. A piece
    like ``foo-bar`` becomes the phrase "foo bar"."""
    if not pieces:
        return None
    return " OR ".join('"' + piece.replace('"', '""') + '"' for piece in pieces)


stats = {"counts_by_index": 0, "writer_reads": 0, "unordered_matches": 0, "owner_matches": 0}
"""Since the process started: ``counts_by_index``, history count statements whose passages
were all the table's (their terms counted by the full-text index alone);
``writer_reads``, reads a file database served on its writer connection (no write held it);
``unordered_matches``, history searches read without the engine's relevance or order
(:meth:`SQLiteBackend.history_matches`); ``owner_matches``, history searches that matched
the owners' tokens (see :data:`HISTORY_FTS`). What the tests read to see the fast paths
taken."""


def owner_match(scopes: Sequence[ScopeParams], session_id: str | None) -> tuple[str, list[Any]]:
    """The SQL expression (and its parameters) of the FTS5 query that matches the passages
    of ``scopes`` (of ``session_id`` only, unless ``None``) by their owner tokens
    (:func:`owner_token`): the session's in each scope, or each scope's."""
    if session_id is None:
        column, params = "scope", [v for scope in scopes for v in scope]
        tokens = [owner_token(["?"] * len(_SCOPE_COLUMNS), "k") for _ in scopes]
    else:
        column, params = "session", [v for scope in scopes for v in (*scope, session_id)]
        tokens = [owner_token(["?"] * len(_HISTORY_KEY), "s") for _ in scopes]
    quoted = " || ' OR ' || ".join(f"'\"' || {t} || '\"'" for t in tokens)
    return f"'{{{column}}} : (' || {quoted} || ')'", params


def _text_match(owners: str | None, match: str) -> str:
    """The SQL expression of the FTS5 query that matches the full-text query bound at
    ``match`` (``?``, or an expression) in the passages' text, within the owners of the
    expression ``owners`` when given (see :func:`owner_match`)."""
    words = f"'{{text}} : (' || {match} || ')'"
    return words if owners is None else f"{owners} || ' AND ' || {words}"


def _count_columns(
    terms: Sequence[tuple[str, str]],
    scopes: Sequence[ScopeParams],
    session_id: str | None,
    counted: bool = False,
    owned: bool = True,
) -> tuple[list[tuple[str, str]], list[str], list[Any], str, list[Any]]:
    """The columns of a statement that counts the history passages in ``scopes`` (of
    ``session_id`` only, unless ``None``), all the table's passages, and those of the
    former holding each term, with the terms' full-text queries, the columns' parameters,
    and the statement's ``FROM`` clause with its parameters (after the columns'). A term's
    passages are counted by the full-text index alone: while the former are all the
    table's (one session's store), those holding it; otherwise, with ``owned`` (the table
    has the owner tokens: :data:`HISTORY_FTS`), those holding it and their owner's token
    -- without it (a read-only store of an older database), each passage holding it is
    looked up for its scope. The two totals (and the owners' query) are made once, by the
    ``FROM`` clause's subquery: as scalar subqueries inside each term's column, SQLite
    counted them again for each term (about 4x the statement's time with five terms). With
    ``counted``, the totals are read from the passage counts the triggers keep
    (:data:`_HISTORY_COUNTS_PARTS`), not counted passage by passage."""
    where, params = scope_filter(scopes, alias="h")
    if session_id is not None:
        where += " AND h.session_id = ?"
        params.append(session_id)
    matches = [(term, m) for term, word in terms if (m := fts5_match([word])) is not None]
    # The terms' columns padded to a power of two (a pad's parameter is NULL: it counts
    # nothing and runs no search), so questions of a few sizes share one statement text
    # and its compiled statement (see _padded).
    padded = _padded([m for _, m in matches])
    if counted:
        searched = f"SELECT coalesce(sum(h.n), 0) FROM pp_mem_history_counts AS h WHERE {where}"
        whole = "SELECT coalesce(sum(n), 0) FROM pp_mem_history_counts"
    else:
        searched = f"SELECT count(*) FROM pp_mem_history AS h WHERE {where}"
        whole = "SELECT count(*) FROM pp_mem_history"
    source_args = list(params)
    owners = ""
    if owned:
        owners_sql, owners_args = owner_match(scopes, session_id)
        owners = f", {owners_sql} AS owners"
        source_args += owners_args
    source = f"FROM (SELECT ({searched}) AS searched, ({whole}) AS whole{owners} LIMIT 1) AS n"
    columns = ["n.searched", "n.whole"]
    args: list[Any] = []
    for match in padded:
        if owned:
            within = (
                "(SELECT count(*) FROM pp_mem_history_fts"
                f" WHERE pp_mem_history_fts MATCH {_text_match('n.owners', '?')})"
            )
            args += [match, match, match]
        else:
            within = (
                "(SELECT count(*) FROM pp_mem_history AS h WHERE h.id IN (SELECT rowid"
                f" FROM pp_mem_history_fts WHERE pp_mem_history_fts MATCH ?) AND {where})"
            )
            args += [match, match, match, *params]
        columns.append(
            "CASE WHEN ? IS NULL THEN 0 WHEN n.searched = n.whole"
            " THEN (SELECT count(*) FROM pp_mem_history_fts WHERE pp_mem_history_fts MATCH"
            f" {_text_match(None, '?') if owned else '?'}) ELSE {within} END"
        )
    return matches, columns, args, source, source_args


def _padded(values: Sequence[Any]) -> list[Any]:
    """``values`` and ``None`` up to the next power of two (at least 1). A statement whose
    text depends on how many values it binds is compiled again for each count (about
    100 us for the history layer's: more than running it); padded, one text serves every
    count up to the power, and stays in the connection's statement cache."""
    size = 1 << max(len(values) - 1, 0).bit_length()
    return [*values, *[None] * (size - len(values))]


def _totals_hold(searched: Any, whole: Any) -> bool:
    """Whether the passages searched and the table's, as read, can be right (at most the
    table's, not negative): kept counts that do not (a database changed by hand) are not
    trusted, the passages are counted instead."""
    return isinstance(searched, int) and isinstance(whole, int) and 0 <= searched <= whole


def _counts_of(matches: list[tuple[str, str]], row: Sequence[Any]) -> tuple[int, dict[str, int]]:
    """The passages searched and each term's count, from a row of :func:`_count_columns`."""
    total, table, *found = row
    if matches and total == table:
        stats["counts_by_index"] += 1
    found = found[: len(matches)]  # the rest are the pads' columns
    return int(total), {term: int(n) for (term, _), n in zip(matches, found, strict=True)}


def _connect_read_only(path: str) -> sqlite3.Connection:
    """A connection that cannot change the database file (SQLite ``mode=ro``)."""
    if path in (":memory:", "") or path.startswith("file:"):
        raise ValueError(f"a read-only MemoryStore needs a database file path, got {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no database file {path!r} (a read-only store creates none)")
    uri = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    return sqlite3.connect(
        uri, uri=True, timeout=30.0, check_same_thread=False, isolation_level=None
    )


class SQLiteBackend(SQLMemory):
    """A SQLite database file, or ``":memory:"`` for a private in-memory one."""

    dialect = SQLITE

    def __init__(self, path: str, *, read_only: bool = False) -> None:
        self._path = path
        self._memory = path in (":memory:", "")
        self._read_only = read_only
        self._tables = not read_only  # a read-only store checks (until they exist)
        self._history = not read_only  # the history table (added later than the others)
        self._write_lock = threading.RLock()
        self._read_lock = self._write_lock if self._memory else threading.RLock()
        self._closed = False
        # Whether the passage counts are this version's (a read-only store reads them only
        # when its database has them; else it counts the passages).
        self._counted = not read_only
        # Whether the full-text table has the passages' owner tokens (this version's; a
        # read-only store of an older database searches without them).
        self._owned = not read_only
        # What the last counts of a search found: (its owners, whether their passages were
        # all the table's); see _history_match.
        self._whole: tuple[Any, bool] | None = None
        with sqlite_gate():
            if read_only:
                conn = _connect_read_only(path)
                try:
                    self._counted = history_counts_current(conn)
                    self._owned = history_fts_current(conn)
                except BaseException:
                    conn.close()
                    raise
            else:
                conn = self._open()
                try:
                    if not self._memory:
                        conn.execute("PRAGMA journal_mode=WAL")
                    conn.executescript(_SCHEMA)
                    migrate_history_fts(conn)
                    migrate_history_counts(conn)
                except BaseException:
                    conn.close()
                    raise
        # The writer; also the reader of a memory database or a read-only store.
        self._conn: sqlite3.Connection | None = conn
        self._reader: sqlite3.Connection | None = None  # a file database's reads
        _process.SQLITE_MEMORY_STORES.add(self)

    def _open(self) -> sqlite3.Connection:
        """A new read-write connection to the database (inside the gate)."""
        return sqlite3.connect(
            self._path, timeout=BUSY_TIMEOUT, check_same_thread=False, isolation_level=None
        )

    def after_fork_in_child(self) -> None:
        """In a forked child: new locks; a file database's connections are the parent's
        (kept in ``_process.INHERITED``, never used or closed) and are opened again on first
        use. The gate ensured no statement was running at the fork."""
        self._write_lock = threading.RLock()
        self._read_lock = self._write_lock if self._memory else threading.RLock()
        if self._memory:
            return
        for conn in (self._conn, self._reader):
            if conn is not None:
                _process.INHERITED.append(conn)
        self._conn = self._reader = None

    def describe(self) -> str:
        return self._path

    def close(self) -> None:
        with self._write_lock, self._read_lock, sqlite_gate():
            self._closed = True
            for conn in (self._conn, self._reader):
                if conn is not None:
                    conn.close()
            self._conn = self._reader = None

    def _connection(self) -> sqlite3.Connection:
        """The writer (caller holds the write lock, inside the gate)."""
        if self._closed:
            raise RuntimeError("MemoryStore is closed")
        if self._conn is None:  # a forked child's first write
            self._conn = _connect_read_only(self._path) if self._read_only else self._open()
        return self._conn

    def _read_connection(self) -> sqlite3.Connection:
        """The connection reads use (caller holds the read lock, inside the gate)."""
        if self._memory or self._read_only:
            return self._connection()
        if self._closed:
            raise RuntimeError("MemoryStore is closed")
        if self._reader is None:
            self._reader = self._open()
        return self._reader

    def _has_tables(self) -> bool:
        """Whether the memory tables exist (always, unless opened read-only on a database
        that has none yet: then it reads as empty)."""
        if not self._tables:
            with self._read_lock, sqlite_gate():
                found = (
                    self._read_connection()
                    .execute(
                        "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                        " AND name IN ('pp_mem_records', 'pp_mem_profiles', 'pp_mem_fts')"
                    )
                    .fetchone()
                )
            self._tables = found[0] == 3
        return self._tables

    def _has_history(self) -> bool:
        """Whether the history table exists (always, unless opened read-only on a database
        written by a store that did not have it: then the history layer reads as empty)."""
        if not self._history:
            with self._read_lock, sqlite_gate():
                found = (
                    self._read_connection()
                    .execute(
                        "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                        " AND name IN ('pp_mem_history', 'pp_mem_history_fts')"
                    )
                    .fetchone()
                )
            self._history = found[0] == 2
        return self._history

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``): waits for the write
        lock (the store's, then the database's, up to :data:`BUSY_TIMEOUT`) and runs inside
        the gate once it has it."""
        if self._read_only:
            raise PermissionError(f"MemoryStore({self._path!r}) was opened read_only")
        with self._write_lock:
            gate, conn = self._begin()
            try:
                try:
                    yield conn
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
            finally:
                gate.__exit__(None, None, None)

    def _begin(self) -> tuple[_process.ForkGate, sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` on the writer; returns inside the gate (the caller leaves
        it). While another connection holds the database's write lock, each attempt waits
        :data:`_BEGIN_STEP` inside the gate, then sleeps outside it."""
        deadline = time.monotonic() + BUSY_TIMEOUT
        pause = 0.001
        while True:
            gate = sqlite_gate()
            gate.__enter__()
            try:
                conn = self._connection()
                left = deadline - time.monotonic()
                conn.execute(f"PRAGMA busy_timeout = {int(max(min(_BEGIN_STEP, left), 0) * 1000)}")
                try:
                    conn.execute("BEGIN IMMEDIATE")
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT * 1000)}")
                return gate, conn
            except sqlite3.OperationalError as exc:
                gate.__exit__(None, None, None)
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise
            except BaseException:
                gate.__exit__(None, None, None)
                raise
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(pause * 2, 0.05)

    def _read(self, sql: str, params: Sequence[Any], *, history: bool = False) -> list[Any]:
        if not self._has_tables() or (history and not self._has_history()):
            return []
        # On the writer when no write holds it: its page cache stays valid across its own
        # commits, where the reader's is dropped at each (every turn's index job commits,
        # so the reader read cold pages: 3-5x the statement's time). A write in progress
        # (a background job) is never waited for: the reader serves then.
        if not (self._memory or self._read_only) and self._write_lock.acquire(blocking=False):
            try:
                with sqlite_gate():
                    conn = self._connection()
                    # Not inside this thread's own write (the lock is re-entrant): a read
                    # there sees what was committed, as on the reader.
                    if not conn.in_transaction:
                        stats["writer_reads"] += 1
                        return conn.execute(sql, params).fetchall()
            finally:
                self._write_lock.release()
        with self._read_lock, sqlite_gate():
            return self._read_connection().execute(sql, params).fetchall()

    # ------------------------------------------------------------------ writes

    # ------------------------------------------------------------------ reads

    def text_search(
        self,
        pieces: Sequence[str],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        match = fts5_match(pieces)
        if match is None:
            return []
        where, params = scope_filter(scopes)
        kind_sql = ", ".join("?" for _ in kinds)
        rows = self._read(
            f"SELECT {COLUMNS}, bm25(pp_mem_fts) AS rank FROM pp_mem_fts"
            " JOIN pp_mem_records AS r ON r.id = pp_mem_fts.rowid"
            f" WHERE pp_mem_fts MATCH ? AND r.rtype IN ({kind_sql}) AND {where}"
            " ORDER BY rank, r.id LIMIT ?",
            (match, *kinds, *params, pool),
        )
        # bm25() is lower-is-better (negative): the score is its negation.
        return [(tuple(row[:-1]), -float(row[-1])) for row in rows]

    @property
    def vector_ranking(self) -> str:
        return "client"

    def vector_ranked(
        self,
        query: Sequence[float],
        kinds: Sequence[str],
        scopes: Sequence[ScopeParams],
        pool: int,
    ) -> list[tuple[Row, float]]:
        return []

    # ------------------------------------------------------------------ history layer

    def history_common_words(self, words: Sequence[str]) -> set[str]:
        if not words or not self._has_history():
            return set()
        marks = ", ".join("?" for _ in words)
        try:  # one statement: the words' counts and the passages
            counts = self._read(
                "SELECT term, doc, (SELECT count(*) FROM pp_mem_history)"
                f" FROM pp_mem_history_vocab WHERE term IN ({marks})",
                words,
            )
        except sqlite3.OperationalError:  # a database without the vocabulary table
            return set()
        return {str(term) for term, doc, total in counts if 2 * int(doc) > int(total)}

    def history_search(
        self,
        pieces: Sequence[str],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
        pool: int,
    ) -> list[tuple[Row, float]]:
        match = fts5_match(pieces)
        if match is None or not self._has_history():
            return []
        where, params = self._history_scopes(scopes, session_id)
        query, args = self._history_match(match, scopes, session_id)
        # The text's weight alone (the owner columns weigh nothing).
        rank = (
            "bm25(pp_mem_history_fts, 1.0, 0.0, 0.0)" if self._owned else "bm25(pp_mem_history_fts)"
        )
        rows = self._read(
            f"SELECT {HISTORY}, {rank} AS rank FROM pp_mem_history_fts"
            " JOIN pp_mem_history AS h ON h.id = pp_mem_history_fts.rowid"
            f" WHERE pp_mem_history_fts MATCH {query} AND {where}"
            " ORDER BY rank, h.id LIMIT ?",
            (*args, *params, pool),
        )
        return [(tuple(row[:-1]), -float(row[-1])) for row in rows]

    def _note_whole(
        self, scopes: Sequence[ScopeParams], session_id: str | None, searched: Any, whole: Any
    ) -> None:
        """Keep whether the passages of ``scopes`` (and ``session_id``) were all the table's
        as the counts just read them: the search that follows matches the text alone then
        (see :meth:`_history_match`)."""
        self._whole = ((tuple(scopes), session_id), searched == whole)

    def _history_match(
        self, match: str, scopes: Sequence[ScopeParams], session_id: str | None
    ) -> tuple[str, list[Any]]:
        """The SQL expression of a history search's FTS5 query (the full-text query
        ``match`` within the owners searched: :func:`owner_match`) and its parameters; a
        read-only store of an older database (no owner tokens) matches ``match`` as it is
        (each passage is then filtered by its scope).

        When the counts read last for these owners found that their passages were all the
        table's (one session's store), the text alone is matched: the owners' tokens would
        only slow the match down (their passages are every passage). That is a guess about
        speed, never about the result: every statement that matches also filters each
        passage by its scope and session, so a guess that went stale (another session
        written since) costs time, not a wrong passage."""
        if not self._owned:
            return "?", [match]
        if self._whole == ((tuple(scopes), session_id), True):
            return _text_match(None, "?"), [match]
        owners, args = owner_match(scopes, session_id)
        stats["owner_matches"] += 1
        return _text_match(owners, "?"), [*args, match]

    def history_matches(
        self,
        pieces: Sequence[str],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
        limit: int,
    ) -> list[tuple[Row, float]] | None:
        """Every passage :meth:`history_search` would match, in no order and without the
        engine's relevance (score 0.0), when there are at most ``limit``; else ``None``.
        For a caller that ranks every match itself and knows they are few: no relevance is
        worked out and nothing is sorted (about half the statement's time)."""
        match = fts5_match(pieces)
        if match is None or not self._has_history():
            return []
        where, params = self._history_scopes(scopes, session_id)
        query, args = self._history_match(match, scopes, session_id)
        # CROSS JOIN: the full-text matches first, each passage then by its id.
        rows = self._read(
            f"SELECT {HISTORY} FROM pp_mem_history_fts CROSS JOIN pp_mem_history AS h ON"
            f" h.id = pp_mem_history_fts.rowid WHERE pp_mem_history_fts MATCH {query} AND {where}"
            " LIMIT ?",
            (*args, *params, limit + 1),
        )
        if len(rows) > limit:
            return None
        stats["unordered_matches"] += 1
        return [(tuple(row), 0.0) for row in rows]

    def history_counts(
        self,
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[int, dict[str, int]]:
        if not self._has_history():
            return 0, {}
        for counted in (True, False) if self._counted else (False,):
            parts = _count_columns(terms, scopes, session_id, counted, self._owned)
            matches, columns, args, source, source_args = parts
            rows = self._read(f"SELECT {', '.join(columns)} {source}", [*args, *source_args])
            if not rows:
                return 0, {}
            if _totals_hold(rows[0][0], rows[0][1]):
                break
        self._note_whole(scopes, session_id, rows[0][0], rows[0][1])
        return _counts_of(matches, rows[0])

    def history_statistics(
        self,
        words: Sequence[str],
        terms: Sequence[tuple[str, str]],
        scopes: Sequence[ScopeParams],
        session_id: str | None,
    ) -> tuple[set[str], int, dict[str, int]]:
        """:meth:`history_counts` (one statement), and the common words of ``words`` from
        them: a term held by more than half of the passages searched, and every word that
        is not a term (a stop word: it weighs nothing in the ranking). Not from the
        full-text vocabulary, whose count of a word reads every passage of the database
        holding it (a word of every passage, 100 sessions of 1,000 passages: 2.7 ms a
        question); the searched passages' counts read only those of the session searched
        (:data:`HISTORY_FTS`'s owner tokens)."""
        total, counts = self.history_counts(terms, scopes, session_id)
        counted = {term for term, _ in terms}
        common = {w for w in words if w not in counted or 2 * counts.get(w, 0) > total}
        return common, total, counts

    def history_adjacent(
        self, scope: ScopeParams, session_id: str, row_keys: Sequence[int]
    ) -> list[tuple[int, int, Row]]:
        if not row_keys or not self._has_history():
            return []
        # One statement, the anchors bound once: for each anchor, the passage next to it
        # below (the last of the row before) and above (the first of the row after), each
        # one seek in the scope's index, then that passage by its id: only the passages
        # the caller keeps (not every passage of those rows).
        near = (
            "SELECT a.column1 AS anchor, {side} AS side, (SELECT id FROM pp_mem_history"
            f" WHERE {_SCOPE_EQ} AND session_id = ? AND row_key {{op}} a.column1"
            " ORDER BY row_key {order}, passage {order} LIMIT 1) AS passage_id"
            " FROM anchors AS a"
        )
        # NULL anchors pad the list (see _padded): nothing is next to them.
        row_keys = _padded(row_keys)
        values = ", ".join("(?)" for _ in row_keys)
        rows = self._read(
            f"WITH anchors AS (VALUES {values}), near AS ("
            + near.format(side=0, op="<", order="DESC")
            + " UNION ALL "
            + near.format(side=1, op=">", order="ASC")
            + f") SELECT {HISTORY}, near.anchor, near.side FROM near"
            " JOIN pp_mem_history AS h ON h.id = near.passage_id",
            [*row_keys, *scope, session_id, *scope, session_id],
        )
        return [(int(row[-2]), int(row[-1]), tuple(row[:-2])) for row in rows]


_process.SQLITE_MEMORY_STORES.handle(after_fork=SQLiteBackend.after_fork_in_child)
