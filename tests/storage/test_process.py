"""Process-wide state (``protoprompt._process``): every piece of protoprompt's SQLite work is
fork-safe. A fork while a thread is inside one waits until it leaves, and the same object
works in the parent and in the forked child."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import protoprompt as pp
from protoprompt import _process

pytest.importorskip("agents")

from protoprompt.integrations._turns import _evicted  # noqa: E402
from protoprompt.integrations._stores import _snapshots, _sync  # noqa: E402
from protoprompt.integrations import pool  # noqa: E402

TABLE = "agent_messages"
SESSION = "s"


def _history_db(path: Path) -> str:
    """A database with a stored session's messages, as ``SQLiteSession`` keeps them."""
    db = str(path / "h.db")
    with sqlite3.connect(db) as conn:
        conn.execute(
            f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT, "
            "message_data TEXT, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP)"
        )
        conn.executemany(
            f"INSERT INTO {TABLE} (session_id, message_data) VALUES (?, ?)",
            [(SESSION, json.dumps({"role": "user", "content": f"m{i}"})) for i in range(5)],
        )
    conn.close()
    return db


def _reader(db: str) -> Callable[[], Any]:
    reader = _sync.RowReader(db, TABLE, SESSION)
    return lambda: reader.read(lambda rows: list(rows.ids_from(0)))


def _snapshot_saver(db: str) -> Callable[[], Any]:
    where = _snapshots.SQLiteSnapshots(db, "db-id", TABLE, SESSION)
    return lambda: (where.save(b"\x01" + bytes(7), b"data", None), where.load())


def _count_store(db: str) -> Callable[[], Any]:
    store = pp.SQLiteCountStore(db)
    key = (9).to_bytes(16, "big")
    store.put_many([(key, 9)])
    assert store.flush(timeout=20)
    return lambda: store.get_many([key])


def _memory_store(db: str) -> Callable[[], Any]:
    """A memory store's history layer: a write (as recall indexing does), then a search."""
    store = pp.MemoryStore(db)
    scope = pp.MemoryScope("acme")
    record = pp.memory.HistoryRecord(0, "tool output of lookup: the walrus is 48213")

    def use() -> Any:
        store.index_history(SESSION, [record], scope=scope)
        return [h.text for h in store.search_history("walrus", scope=scope, session_id=SESSION)]

    return use


SQLITE_USERS: dict[str, Callable[[str], Callable[[], Any]]] = {
    "memory store": _memory_store,
    "row reader": _reader,
    "snapshot saver": _snapshot_saver,
    "count store": _count_store,
    "database id": lambda db: lambda: pool.database_id(db),
    "evicted rows": lambda db: lambda: _evicted.read_rows(db, TABLE, SESSION, [1, 2, 5]),
}


def _in_forked_child(fn: Callable[[], Any]) -> Any:
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=lambda: q.put(fn()))
    proc.start()
    out = q.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    return out


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("user", sorted(SQLITE_USERS))
def test_a_fork_waits_for_every_sqlite_user(
    user: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread inside a statement of each SQLite user holds a fork until it leaves (a child
    forked mid-call would inherit SQLite's mutexes and lock bookkeeping); the same object
    then works in the parent and in the child, with the same answers."""
    db = _history_db(tmp_path)
    use = SQLITE_USERS[user](db)
    expected = use()
    inside, leave, order = threading.Event(), threading.Event(), []
    holder: list[threading.Thread] = []

    class Slow(sqlite3.Connection):
        """Stands for a long SQLite statement, in the holder thread only."""

        def execute(self, *args: Any, **kwargs: Any) -> sqlite3.Cursor:
            if holder and threading.current_thread() is holder[0] and not inside.is_set():
                inside.set()
                assert leave.wait(timeout=60)
                order.append("left SQLite")
            return super().execute(*args, **kwargs)

    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        return real_connect(*args, factory=Slow, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", connect)
    if user in ("count store", "row reader", "memory store"):
        use = SQLITE_USERS[user](db)  # new connections, through the slow factory
    got: list[Any] = []
    holder.append(threading.Thread(target=lambda: got.append(use())))
    # Runs first when the fork begins (handlers registered later run earlier): the holder
    # is told to leave only then, so the fork has to wait for it. The forking thread holds
    # the GIL from these handlers to the parent's, so without the wait the holder could
    # only leave after "forked in the parent". One-shot.
    armed = [lambda: (order.append("fork began"), leave.set())]
    done = [lambda: order.append("forked in the parent")]
    os.register_at_fork(
        before=lambda: armed and armed.pop()(), after_in_parent=lambda: done and done.pop()()
    )
    holder[0].start()
    assert inside.wait(timeout=60)
    assert _in_forked_child(use) == expected
    holder[0].join(timeout=60)
    assert order == ["fork began", "left SQLite", "forked in the parent"]
    assert got == [expected]
    assert use() == expected


def test_one_fork_hook_and_one_exit_hook_serve_every_registry() -> None:
    """The process-wide registries live in ``_process``; no other module of the package
    registers a fork or exit hook of its own."""
    root = Path(pp.__file__).parent
    for path in root.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        if path.relative_to(root) == Path("_process.py"):
            continue
        assert "register_at_fork" not in text, path
        assert "atexit" not in text, path
    assert _process.SHARED_INDEXES is pool._SHARED
