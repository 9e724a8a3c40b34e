"""Damaged, retyped, swapped, implausible or foreign values in every table protoprompt keeps
in a session's database: a restarted process ignores what it cannot trust, and its turn
succeeds and sends exactly what a fresh pack of the history sends.

Tables: ``protoprompt_index_snapshots`` (index snapshots), ``protoprompt_token_counts``
(token counts), ``protoprompt_meta`` (the database id and the count store's secret), and
the SDK's own ``agent_messages`` rows as far as protoprompt reads them.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("agents")

import protoprompt as pp  # noqa: E402

from test_sync import Turns  # noqa: E402

SNAPSHOTS = "protoprompt_index_snapshots"
OPTIONS: dict[str, Any] = {"snapshot_min_items": 4}  # every session here writes snapshots
COUNTS = "protoprompt_token_counts"
META = "protoprompt_meta"


async def _stored(
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    name: str = "t.db",
    session_id: str = "chat",
    words: int = 120,
    turns: int = 6,
) -> str:
    """A database whose session has a snapshot and stored counts (long answers)."""
    db = str(tmp_path / name)
    t = Turns(db, session_id, words=words, **OPTIONS)
    for _ in range(turns):
        await t.turn()
    t.session._debug_state(wait_for_save=True)
    t.close()
    return db


def _sql(db: str, *statements: tuple[str, tuple[Any, ...]]) -> None:
    with sqlite3.connect(db) as conn:
        for sql, args in statements:
            conn.execute(sql, args)


def _one(db: str, sql: str, args: tuple[Any, ...] = ()) -> Any:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchone()


class Spy:
    """Counts what a restarted session took from its stored state."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked = 0
        real = pp.SQLiteCountStore.get_many

        def get_many(store: Any, keys: Any) -> Any:
            self.asked += len(keys)
            return real(store, keys)

        monkeypatch.setattr(pp.SQLiteCountStore, "get_many", get_many)


async def _turn_after_restart(
    db: str,
    new_process: Callable[[], None],
    *,
    restored: bool | None,
    session_id: str = "chat",
) -> Turns:
    """A restarted process's next two turns (after ``new_process()``, conftest.py): each must
    equal a fresh pack (``Turns``). ``restored``: whether the first read must have started
    from the stored snapshot."""
    new_process()
    t = Turns(db, session_id, words=120, **OPTIONS)
    t.n = 100
    history = await t.read()
    await t.send(history)
    if restored is not None:
        report = t.builder.last_plan.turn
        assert (report.snapshot == "loaded") is restored, report.snapshot_line()
    await t.turn()
    return t


# ------------------------------------------------------------------- index snapshots


def _flip(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


SNAPSHOT_DAMAGE: dict[str, Callable[[str], None]] = {
    "flipped payload byte": lambda db: _sql(
        db,
        (
            f"UPDATE {SNAPSHOTS} SET data = ?",
            (_flip(_one(db, f"SELECT data FROM {SNAPSHOTS}")[0], -5),),
        ),
    ),
    "flipped header byte": lambda db: _sql(
        db,
        (
            f"UPDATE {SNAPSHOTS} SET data = ?",
            (_flip(_one(db, f"SELECT data FROM {SNAPSHOTS}")[0], 20),),
        ),
    ),
    "flipped row id": lambda db: _sql(
        db,
        (
            f"UPDATE {SNAPSHOTS} SET row_ids = ?",
            (_flip(_one(db, f"SELECT row_ids FROM {SNAPSHOTS}")[0], 8),),
        ),
    ),
    "row ids cut short": lambda db: _sql(
        db, (f"UPDATE {SNAPSHOTS} SET row_ids = substr(row_ids, 1, length(row_ids) - 8)", ())
    ),
    "row ids of odd length": lambda db: _sql(
        db, (f"UPDATE {SNAPSHOTS} SET row_ids = row_ids || x'00'", ())
    ),
    "data as text": lambda db: _sql(db, (f"UPDATE {SNAPSHOTS} SET data = 'snapshot'", ())),
    "data as a number": lambda db: _sql(db, (f"UPDATE {SNAPSHOTS} SET data = 12", ())),
    "row ids as a number": lambda db: _sql(db, (f"UPDATE {SNAPSHOTS} SET row_ids = -1", ())),
    "row ids as text": lambda db: _sql(db, (f"UPDATE {SNAPSHOTS} SET row_ids = 'abc'", ())),
    "cut payload": lambda db: _sql(
        db, (f"UPDATE {SNAPSHOTS} SET data = substr(data, 1, length(data) / 2)", ())
    ),
    "empty blobs": lambda db: _sql(db, (f"UPDATE {SNAPSHOTS} SET data = x'', row_ids = x''", ())),
    "other messages table": lambda db: _sql(
        db, (f"UPDATE {SNAPSHOTS} SET messages_table = 'elsewhere'", ())
    ),
}


@pytest.mark.parametrize("damage", sorted(SNAPSHOT_DAMAGE))
async def test_a_damaged_snapshot_is_ignored(tmp_path, monkeypatch, damage, new_process) -> None:
    db = await _stored(tmp_path, monkeypatch)
    assert _one(db, f"SELECT COUNT(*) FROM {SNAPSHOTS}")[0] == 1
    SNAPSHOT_DAMAGE[damage](db)
    t = await _turn_after_restart(db, new_process, restored=False)
    t.close()


async def test_a_snapshot_of_another_session_under_this_one_is_refused(
    tmp_path, monkeypatch, new_process
) -> None:
    """Session B's snapshot placed under session A (same database, same shape of rows, other
    texts): refused, A's turns equal fresh packs."""
    db = await _stored(tmp_path, monkeypatch, session_id="A", words=5)
    t = Turns(db, "B", words=300, **OPTIONS)
    for _ in range(6):
        await t.turn()
    t.session._debug_state(wait_for_save=True)
    t.close()
    _sql(
        db,
        (f"DELETE FROM {SNAPSHOTS} WHERE session_id = 'A'", ()),
        (f"UPDATE {SNAPSHOTS} SET session_id = 'A' WHERE session_id = 'B'", ()),
    )
    t = await _turn_after_restart(db, new_process, restored=False, session_id="A")
    t.close()


async def test_a_snapshot_from_another_database_is_refused(
    tmp_path, monkeypatch, new_process
) -> None:
    """A same-shaped history with short texts in another database (same session id, same row
    ids): its snapshot copied into this database is refused (it was bound to the other
    database's id), though every row id matches."""
    db = await _stored(tmp_path, monkeypatch, "long.db", words=300)
    other = await _stored(tmp_path, monkeypatch, "short.db", words=1)
    ids_here = _one(db, f"SELECT row_ids FROM {SNAPSHOTS}")[0]
    row_ids, data = _one(other, f"SELECT row_ids, data FROM {SNAPSHOTS}")
    assert row_ids == ids_here  # the same rows, as far as ids tell
    _sql(db, (f"UPDATE {SNAPSHOTS} SET row_ids = ?, data = ?", (row_ids, data)))
    t = await _turn_after_restart(db, new_process, restored=False)
    t.close()


async def test_a_copied_database_uses_the_snapshot_of_its_rows(
    tmp_path, monkeypatch, new_process
) -> None:
    """A copy of the database file (same id) is a database of its own: its snapshot is
    still its rows' (it was copied with them), and it goes on from there."""
    db = await _stored(tmp_path, monkeypatch)
    copy_db = str(tmp_path / "copy.db")
    with sqlite3.connect(db) as src, sqlite3.connect(copy_db) as dst:
        src.backup(dst)  # what a backup tool does (the file alone may lack the WAL's pages)
    t = await _turn_after_restart(copy_db, new_process, restored=True)
    t.close()


async def test_a_stale_snapshot_keeps_only_the_rows_that_still_hold(
    tmp_path, monkeypatch, new_process
) -> None:
    """Rows popped and others appended since the snapshot (ids never come back): the
    restarted process keeps the prefix that still holds."""
    db = await _stored(tmp_path, monkeypatch)
    _sql(
        db,
        (
            "DELETE FROM agent_messages WHERE id IN (SELECT id FROM agent_messages "
            "ORDER BY id DESC LIMIT 5)",
            (),
        ),
        (
            "INSERT INTO agent_messages (session_id, message_data) VALUES ('chat', ?)",
            (json.dumps({"role": "user", "content": "appended " * 300}),),
        ),
    )
    t = await _turn_after_restart(db, new_process, restored=True)
    t.close()


# ------------------------------------------------------------------------ token counts


def _rotate(db: str, columns: str) -> None:
    """Give every counts row the ``columns`` of the next row (the last gets the first's)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(f"SELECT key, tokens, mac FROM {COUNTS} ORDER BY key").fetchall()
        keys, rest = [r[0] for r in rows], [r[1:] for r in rows]
        if columns == "key":
            keys = keys[1:] + keys[:1]
        else:
            rest = rest[1:] + rest[:1]
        conn.execute(f"DELETE FROM {COUNTS}")
        conn.executemany(
            f"INSERT INTO {COUNTS} VALUES (?, ?, ?)", [(k, *r) for k, r in zip(keys, rest)]
        )


COUNT_DAMAGE: dict[str, Callable[[str], None]] = {
    name: (lambda db, _sql_text=sql: _sql(db, (_sql_text.format(t=COUNTS), ())))
    for name, sql in {
        "count of one": "UPDATE {t} SET tokens = 1",
        "count of zero": "UPDATE {t} SET tokens = 0",
        "count of 2**63-1": "UPDATE {t} SET tokens = 9223372036854775807",
        "negative count": "UPDATE {t} SET tokens = -5",
        "count as text": "UPDATE {t} SET tokens = CAST(tokens AS TEXT)",
        "count as text, smaller": "UPDATE {t} SET tokens = CAST(tokens / 2 + 1 AS TEXT)",
        "count as real": "UPDATE {t} SET tokens = tokens * 1.0",
        "count as blob": "UPDATE {t} SET tokens = CAST(tokens AS BLOB)",
        "plausible but smaller": "UPDATE {t} SET tokens = tokens / 2 + 1",
        "check zeroed": "UPDATE {t} SET mac = zeroblob(8)",
        "check as text": "UPDATE {t} SET mac = 'mac'",
    }.items()
}
COUNT_DAMAGE["counts swapped between rows"] = lambda db: _rotate(db, "counts")
COUNT_DAMAGE["keys swapped between rows"] = lambda db: _rotate(db, "key")


@pytest.mark.parametrize("damage", sorted(COUNT_DAMAGE))
async def test_damaged_counts_are_counted_again(tmp_path, monkeypatch, damage, new_process) -> None:
    """Without a snapshot, the restarted process takes every long item's count from the
    store: a damaged, retyped, implausible or swapped count is a miss."""
    db = await _stored(tmp_path, monkeypatch)
    n = _one(db, f"SELECT COUNT(*) FROM {COUNTS}")[0]
    assert n >= 4  # the long answers counted so far
    _sql(db, (f"DELETE FROM {SNAPSHOTS}", ()))
    COUNT_DAMAGE[damage](db)
    spy = Spy(monkeypatch)
    t = await _turn_after_restart(db, new_process, restored=False)
    assert spy.asked > 0, "the store was not read"
    t.close()


async def test_an_old_counts_table_is_replaced(tmp_path, monkeypatch, new_process) -> None:
    db = await _stored(tmp_path, monkeypatch)
    _sql(
        db,
        (f"DROP TABLE {COUNTS}", ()),
        (f"CREATE TABLE {COUNTS} (key BLOB NOT NULL UNIQUE, tokens INTEGER NOT NULL)", ()),
        (f"INSERT INTO {COUNTS} VALUES (zeroblob(16), '12')", ()),
        (f"DELETE FROM {SNAPSHOTS}", ()),
    )
    t = await _turn_after_restart(db, new_process, restored=False)
    t.close()
    columns = [r[1] for r in sqlite3.connect(db).execute(f"PRAGMA table_info({COUNTS})")]
    assert columns == ["key", "tokens", "mac"]


# ------------------------------------------------------------------------- meta values

META_DAMAGE: dict[str, list[str]] = {
    "database id changed": [f"UPDATE {META} SET value = 'f' || value WHERE key = 'database_id'"],
    "database id deleted": [f"DELETE FROM {META} WHERE key = 'database_id'"],
    "database id as a number": [f"UPDATE {META} SET value = 42 WHERE key = 'database_id'"],
    "secret changed": [
        f"UPDATE {META} SET value = replace(value, substr(value, 1, 1), "
        "CASE substr(value, 1, 1) WHEN 'a' THEN 'b' ELSE 'a' END) "
        "WHERE key = 'count_secret'"
    ],
    "secret not hex": [f"UPDATE {META} SET value = 'not hex at all' WHERE key = 'count_secret'"],
    "secret too short": [f"UPDATE {META} SET value = 'abcd' WHERE key = 'count_secret'"],
    "secret as a blob": [f"UPDATE {META} SET value = zeroblob(16) WHERE key = 'count_secret'"],
    "secret deleted": [f"DELETE FROM {META} WHERE key = 'count_secret'"],
    "rows swapped": [
        f"UPDATE {META} SET key = 'tmp' WHERE key = 'database_id'",
        f"UPDATE {META} SET key = 'database_id' WHERE key = 'count_secret'",
        f"UPDATE {META} SET key = 'count_secret' WHERE key = 'tmp'",
    ],
    "table dropped": [f"DROP TABLE {META}"],
}


@pytest.mark.parametrize("damage", sorted(META_DAMAGE))
async def test_damaged_meta_values_are_ignored(tmp_path, monkeypatch, damage, new_process) -> None:
    db = await _stored(tmp_path, monkeypatch)
    _sql(db, *[(sql, ()) for sql in META_DAMAGE[damage]])
    # A snapshot is bound to the database id: one that changed makes it foreign.
    restored = None if "secret" in damage else False
    t = await _turn_after_restart(db, new_process, restored=restored)
    t.close()


# ---------------------------------------------------------------- the SDK's own rows


async def test_rows_the_sdk_cannot_decode_are_skipped_like_the_sdk_skips_them(
    tmp_path, monkeypatch, new_process
) -> None:
    db = await _stored(tmp_path, monkeypatch)
    _sql(
        db,
        *[
            ("INSERT INTO agent_messages (session_id, message_data) VALUES ('chat', ?)", (value,))
            for value in ("{broken", "", b"{broken", "[1, ")
        ],
    )
    t = await _turn_after_restart(db, new_process, restored=True)
    t.close()


async def test_an_old_snapshots_table_is_replaced(tmp_path, monkeypatch, new_process) -> None:
    """The layout before snapshots were bound (max_id, row_count): its rows are never read,
    and the next save replaces the table."""
    db = await _stored(tmp_path, monkeypatch)
    _sql(
        db,
        (f"DROP TABLE {SNAPSHOTS}", ()),
        (
            f"CREATE TABLE {SNAPSHOTS} (messages_table TEXT NOT NULL, session_id TEXT NOT NULL, "
            "max_id INTEGER NOT NULL, row_count INTEGER NOT NULL, items INTEGER NOT NULL, "
            "data BLOB NOT NULL, PRIMARY KEY (messages_table, session_id))",
            (),
        ),
        (f"INSERT INTO {SNAPSHOTS} VALUES ('agent_messages', 'chat', -1, 'abc', 3, x'00')", ()),
    )
    t = await _turn_after_restart(db, new_process, restored=False)
    t.session._debug_state(wait_for_save=True)
    t.close()  # saves the index it built
    columns = [r[1] for r in sqlite3.connect(db).execute(f"PRAGMA table_info({SNAPSHOTS})")]
    assert columns == ["messages_table", "session_id", "row_ids", "data"]
    assert _one(db, f"SELECT COUNT(*) FROM {SNAPSHOTS}")[0] == 1
