"""Persistent token counts (SQLiteCountStore, HistoryIndex(count_store=...)): a pack that
reads counts from a store is exactly a pack that counts everything; keys follow content and
encoding; the store is bounded; a bad store is refused by name, a broken database is a miss.
"""

from __future__ import annotations

import copy
import os
import random
import sqlite3
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

import protoprompt as pp
from protoprompt import _core, _process, count_store


def _long_history(seed: int, turns: int = 12) -> tuple[list[dict], list[dict]]:
    """A history whose items are long enough (>= 256 bytes of text) to be stored, with text
    unique to this call (never in the process cache of an earlier test)."""
    r = random.Random(seed)
    tag = uuid.uuid4().hex
    words = "alpha beta gamma delta договор сторона {json} fn() 42 \n".split(" ")

    def text(n: int) -> str:
        return f"{tag} " + " ".join(r.choice(words) for _ in range(n))

    h: list[dict] = []
    for i in range(turns):
        h.append({"role": "user", "content": text(r.randint(5, 80))})
        if r.random() < 0.6:
            h.append(
                {
                    "type": "function_call",
                    "call_id": f"c{i}",
                    "name": "lookup",
                    "arguments": '{"q": "%s"}' % text(3),
                }
            )
            h.append(
                {
                    "type": "function_call_output",
                    "call_id": f"c{i}",
                    "output": text(r.randint(50, 400)),
                }
            )
        h.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{i}",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": text(r.randint(10, 300)), "annotations": []}
                ],
            }
        )
    return h, [{"role": "user", "content": text(60)}]


def _fields(r: pp.PackResult) -> tuple[Any, ...]:
    return (
        r.kept_history,
        r.dependency,
        r.new_input_tokens,
        r.dependency_tokens,
        r.history_tokens,
        r.used,
        r.remaining,
        list(r.decisions),
    )


class RecordingStore:
    """A dict-backed CountStore that records what the core asked for."""

    def __init__(self) -> None:
        self.secret = os.urandom(16)
        self.data: dict[bytes, int] = {}
        self.asked: list[bytes] = []

    def get_many(self, keys):
        self.asked += keys
        return [self.data.get(k) for k in keys]

    def put_many(self, pairs):
        self.data.update(pairs)


@pytest.mark.parametrize("seed", range(6))
def test_packs_with_a_store_equal_packs_that_count_everything(tmp_path, seed) -> None:
    history, new_input = _long_history(seed)
    store = pp.SQLiteCountStore(tmp_path / "counts.db")
    r = random.Random(seed)
    for budget in [r.randint(600, 9000) for _ in range(3)] + [10**6]:
        policy = r.choice(["contiguous", "greedy"])
        _core._clear_count_cache()
        expected = pp.pack(history, new_input, budget, output_reserve=50, policy=policy)
        for _ in range(2):  # a store without the counts, then one with them
            _core._clear_count_cache()  # as in a new process
            index = pp.HistoryIndex(count_store=store)
            got = index.pack(
                copy.deepcopy(history), new_input, budget, output_reserve=50, policy=policy
            )
            assert _fields(got) == _fields(expected)
            assert store.flush(timeout=10)
    assert store.entry_count() > 0
    store.close()


def test_counts_come_from_the_store_and_follow_content_and_encoding() -> None:
    history, new_input = _long_history(99, turns=4)
    history.append(
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_long",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": uuid.uuid4().hex + " long" * 200, "annotations": []}
            ],
        }
    )
    store = RecordingStore()
    index = pp.HistoryIndex(count_store=store)
    _core._clear_count_cache()
    plain = index.pack(history, new_input, 10**6)
    first_keys = set(store.asked)
    assert first_keys and set(store.data) == first_keys  # every miss was stored
    # A store that lies (within what a text of that length can count) is believed: it is
    # the store being read, not the tokenizer ...
    _core._clear_count_cache()
    store.data = {k: v + 1 for k, v in store.data.items()}
    lied = pp.HistoryIndex(count_store=store).pack(history, new_input, 10**6)
    assert lied.used == plain.used + len(first_keys)
    # ... so a changed item must get a new key, and another encoding never shares one.
    j = len(history) - 1  # the long assistant message appended above
    changed = copy.deepcopy(history)
    changed[j]["content"][0]["text"] += "!"
    _core._clear_count_cache()
    store.asked.clear()
    edited = pp.HistoryIndex(count_store=store).pack(changed, new_input, 10**6)
    assert len(set(store.asked) - first_keys) == 1
    _core._clear_count_cache()
    assert edited.used == lied.used - 1 + (
        pp.item_tokens(changed[j]).total - pp.item_tokens(history[j]).total
    )
    _core._clear_count_cache()
    store.asked.clear()
    cl = pp.HistoryIndex(count_store=store).pack(history, new_input, 10**6, encoding="cl100k_base")
    assert store.asked and not set(store.asked) & first_keys
    _core._clear_count_cache()
    assert cl.used == pp.pack(history, new_input, 10**6, encoding="cl100k_base").used


def test_the_store_is_bounded_and_keeps_the_newest(tmp_path) -> None:
    store = pp.SQLiteCountStore(tmp_path / "c.db", max_entries=10)
    for start in range(0, 50, 7):
        store.put_many([(i.to_bytes(16, "big"), i) for i in range(start, min(start + 7, 50))])
        assert store.flush(timeout=10)
        assert store.entry_count() <= 10
    keys = [i.to_bytes(16, "big") for i in range(50)]
    assert store.get_many(keys) == [None] * 40 + list(range(40, 50))
    # Re-writing an evicted count makes it the newest again.
    store.put_many([(keys[0], 0)])
    store.flush(timeout=10)
    assert store.get_many(keys[:1]) == [0] and store.entry_count() <= 10
    store.close()


def test_a_second_process_reads_the_counts_and_queued_counts_survive_exit(tmp_path) -> None:
    """Process 1 packs (its counts are written at exit without an explicit flush); process
    2 finds every long text in the store and packs exactly what process 1 packed."""
    db = tmp_path / "counts.db"
    code = textwrap.dedent("""
        import json, pickle, sys, protoprompt as pp
        history, new_input = pickle.load(open(sys.argv[1], "rb"))
        store = pp.SQLiteCountStore(sys.argv[2])
        seen = []
        get_many = store.get_many
        store.get_many = lambda keys: (seen.append(len(keys)), get_many(keys))[1]
        r = pp.HistoryIndex(count_store=store).pack(history, new_input, 10**6)
        print(json.dumps([r.kept_history, r.used, sum(seen)]))
    """)
    import pickle

    data = tmp_path / "h.pkl"
    history, new_input = _long_history(7)
    data.write_bytes(pickle.dumps((history, new_input)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(Path(pp.__file__).resolve().parents[1]), env.get("PYTHONPATH")])
    )

    def run() -> list[Any]:
        out = subprocess.run(
            [sys.executable, "-c", code, str(data), str(db)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        import json

        return json.loads(out.stdout)

    kept1, used1, asked1 = run()
    n = pp.SQLiteCountStore(db).entry_count()
    assert asked1 == n > 0  # every long text was looked up and stored at exit
    kept2, used2, _ = run()
    assert (kept2, used2) == (kept1, used1)
    _core._clear_count_cache()
    assert used1 == pp.pack(history, new_input, 10**6).used
    # Process 2 found them all: it stored nothing new.
    assert pp.SQLiteCountStore(db).entry_count() == n


def test_bad_stores_are_refused_by_name() -> None:
    history, new_input = _long_history(3, turns=3)

    class NoSecret:
        def get_many(self, keys):
            return [None] * len(keys)

        def put_many(self, pairs):
            pass

    with pytest.raises(TypeError, match="count_store"):
        pp.HistoryIndex(count_store=NoSecret())  # type: ignore[arg-type]
    short = RecordingStore()
    short.secret = b"short"
    with pytest.raises(TypeError, match="count_store.secret must be 16 bytes"):
        pp.HistoryIndex(count_store=short).pack(history, new_input, 10**6)
    for answer in ([], [-1], ["12"], [True], None, (None,)):
        bad = RecordingStore()
        bad.get_many = lambda keys, a=answer: (  # type: ignore[method-assign]
            a if not isinstance(a, list) or len(a) != 1 else a * len(keys)
        )
        index = pp.HistoryIndex(count_store=bad)
        _core._clear_count_cache()
        with pytest.raises(ValueError, match="count_store.get_many must return"):
            index.pack(history, new_input, 10**6)
        # The failed call changed nothing: the same index packs correctly afterwards.
        index.count_store = None
        assert index.pack(history, new_input, 10**6).used == pp.pack(history, new_input, 10**6).used

    class Boom(RuntimeError):
        pass

    raising = RecordingStore()

    def fail(keys):
        raise Boom("store down")

    raising.get_many = fail  # type: ignore[method-assign]
    _core._clear_count_cache()
    with pytest.raises(Boom, match="store down"):
        pp.HistoryIndex(count_store=raising).pack(history, new_input, 10**6)


def test_a_damaged_database_is_a_miss_not_a_wrong_count(tmp_path) -> None:
    db = tmp_path / "c.db"
    store = pp.SQLiteCountStore(db)
    key = bytes(range(16))
    store.put_many([(key, 7)])
    store.flush(timeout=10)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE protoprompt_token_counts SET tokens = 'seven'")
    assert store.get_many([key]) == [None]
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE protoprompt_token_counts")
    assert store.get_many([key]) == [None]  # read error: a miss
    store.put_many([(key, 5)])  # a write error drops the entry ...
    assert store.flush(timeout=10)
    with sqlite3.connect(db) as conn:
        conn.execute(count_store._CREATE_TABLE)
    store.put_many([(key, 5)])  # ... and the next report of it is written
    assert store.flush(timeout=10) and store.get_many([key]) == [5]
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE protoprompt_token_counts")
    history, new_input = _long_history(5, turns=3)
    _core._clear_count_cache()
    expected = pp.pack(history, new_input, 10**6).used
    _core._clear_count_cache()
    assert pp.HistoryIndex(count_store=store).pack(history, new_input, 10**6).used == expected
    assert store.flush(timeout=10)  # the failed write is dropped, not raised
    store.close()


def test_store_arguments_are_checked(tmp_path) -> None:
    with pytest.raises(ValueError, match="memory"):
        pp.SQLiteCountStore(":memory:")
    with pytest.raises(ValueError, match="max_entries"):
        pp.SQLiteCountStore(tmp_path / "c.db", max_entries=0)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="max_open_readers must be a positive int"):
            pp.SQLiteCountStore(tmp_path / "c.db", max_open_readers=bad)
    store = pp.SQLiteCountStore(tmp_path / "c.db")
    assert len(store.secret) == 16
    assert pp.SQLiteCountStore(tmp_path / "c.db").secret == store.secret  # one per database
    assert pp.SQLiteCountStore(tmp_path / "d.db").secret != store.secret
    with pytest.raises(ValueError, match="16-byte key"):
        store.put_many([(b"short", 1)])
    with pytest.raises(ValueError, match="16-byte key"):
        store.put_many([(bytes(16), -1)])
    assert isinstance(store, pp.CountStore)
    store.close()


def test_pack_takes_a_store_too(tmp_path) -> None:
    history, new_input = _long_history(11, turns=5)
    store = pp.SQLiteCountStore(tmp_path / "c.db")
    _core._clear_count_cache()
    expected = pp.pack(history, new_input, 3000, output_reserve=100)
    for _ in range(2):
        _core._clear_count_cache()
        got = pp.pack(history, new_input, 3000, output_reserve=100, count_store=store)
        assert _fields(got) == _fields(expected)
        store.flush(timeout=10)
    assert store.entry_count() > 0
    with pytest.raises(TypeError, match="count_store"):
        pp.pack(history, new_input, 3000, count_store=object())  # type: ignore[arg-type]
    store.clear()
    assert store.entry_count() == 0
    store.close()


def test_counts_written_lately_are_not_written_again(tmp_path) -> None:
    """The core reports counts it had in memory (last turn's new input, now history) so a
    store attached late still gets them; a store skips the ones it has just written, so a
    warm turn starts no write."""
    store = pp.SQLiteCountStore(tmp_path / "c.db")
    pairs = [(i.to_bytes(16, "big"), i) for i in range(5)]
    store.put_many(pairs)
    assert store.flush(timeout=10)
    written = sqlite3.connect(tmp_path / "c.db")
    rowids = written.execute(f"SELECT rowid, key FROM {count_store._TABLE}").fetchall()
    store.put_many(pairs)
    # Nothing queued: flush returns at once, and no row was rewritten (a rewrite would give
    # the rows new rowids).
    assert store.flush(timeout=0)
    assert written.execute(f"SELECT rowid, key FROM {count_store._TABLE}").fetchall() == rowids
    written.close()
    store.put_many([(pairs[0][0], 99)])  # a changed count is written
    assert store.flush(timeout=10) and store.get_many([pairs[0][0]]) == [99]
    store.close()


def _in_forked_child(fn: Any) -> Any:
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
def test_a_forked_child_gets_its_own_connection_and_writer(tmp_path) -> None:
    """multiprocessing's default start method on Linux forks: the child opens its own
    connection and writer thread, and never waits for the parent's writer, which does not
    exist in the child (it may have been busy at the fork)."""
    db = tmp_path / "c.db"
    store = pp.SQLiteCountStore(db)
    key, other = bytes(range(16)), (7).to_bytes(16, "big")
    store.put_many([(key, 3)])
    assert store.flush(timeout=10) and store.get_many([key]) == [3]  # reader opened

    def child() -> Any:
        store.put_many([(other, 7)])
        return store.flush(timeout=20), store.get_many([key, other])

    assert _in_forked_child(child) == (True, [3, 7])

    # A write in flight at the fork: another process holds the database's write lock, so
    # this process's writer waits inside SQLite (busy timeout) until it lets go. A fork in
    # that time waits for the writer to leave SQLite (a child must not inherit SQLite
    # mid-call: its first open could hang); then the child writes with its own writer.
    # Whatever the timing, both writes land and both flushes return True.
    blocker = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent("""
            import sqlite3, sys
            conn = sqlite3.connect(sys.argv[1], isolation_level=None)
            conn.execute("BEGIN EXCLUSIVE")
            print("locked", flush=True)
            sys.stdin.readline()
            conn.execute("COMMIT")
        """),
            str(db),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert blocker.stdout is not None and blocker.stdout.readline() == "locked\n"
        in_flight = bytes(16)
        store.put_many([(in_flight, 1)])

        def child_busy() -> Any:
            mine = (8).to_bytes(16, "big")
            store.put_many([(mine, 8)])
            return store.flush(timeout=20), store.get_many([mine])

        import threading

        def release() -> None:  # the lock goes after a moment (a pipe write, not SQLite)
            assert blocker.stdin is not None
            blocker.stdin.write("\n")
            blocker.stdin.flush()

        threading.Timer(0.3, release).start()
        assert _in_forked_child(child_busy) == (True, [8])
        assert store.flush(timeout=20) and store.get_many([in_flight]) == [1]
    finally:
        if blocker.stdin is not None:
            blocker.stdin.close()  # lets go of the lock if the test failed before release()
        blocker.wait(timeout=60)
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_waits_for_sqlite_work_on_other_threads(tmp_path) -> None:
    """A thread inside SQLite through a store holds a fork until it leaves (the child would
    otherwise inherit SQLite's mutexes and lock bookkeeping mid-call); stores go on working
    in the parent and the child."""
    import threading

    store = pp.SQLiteCountStore(tmp_path / "c.db")
    key = (5).to_bytes(16, "big")
    inside, leave, order = threading.Event(), threading.Event(), []

    def hold() -> None:  # stands for a long SQLite call: inside the store's fork gate
        with _process.sqlite_gate():
            inside.set()
            assert leave.wait(timeout=60)
            order.append("left SQLite")

    # Runs first when the fork begins (handlers registered later run earlier): the holder
    # is told to leave only then, so the fork has to wait for it. The forking thread holds
    # the GIL from these handlers to the parent's, so without the wait the holder could
    # only leave after "forked in the parent". One-shot.
    armed = [lambda: (order.append("fork began"), leave.set())]
    done = [lambda: order.append("forked in the parent")]
    os.register_at_fork(
        before=lambda: armed and armed.pop()(), after_in_parent=lambda: done and done.pop()()
    )

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(timeout=60)

    def child() -> Any:
        store.put_many([(key, 5)])
        return store.flush(timeout=20), store.get_many([key])

    assert _in_forked_child(child) == (True, [5])
    holder.join(timeout=60)
    assert order == ["fork began", "left SQLite", "forked in the parent"]
    assert store.get_many([key]) == [5]
    store.close()


def test_many_databases_keep_few_connections_open(tmp_path, monkeypatch) -> None:
    """A server with a database per tenant: at most max_open_readers stores keep their
    connection (a file descriptor) open; the others reopen when asked, with the same
    answers."""
    stores = [pp.SQLiteCountStore(tmp_path / f"t{i}.db", max_open_readers=4) for i in range(10)]
    for i, store in enumerate(stores):
        store.put_many([(i.to_bytes(16, "big"), i)])
        assert store.flush(timeout=10)
        assert store.get_many([i.to_bytes(16, "big")]) == [i]
    if os.path.isdir("/proc/self/fd"):  # the file descriptors this process has on them

        def open_files() -> set[str]:
            out = set()
            for fd in os.listdir("/proc/self/fd"):
                try:
                    out.add(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass  # closed meanwhile (the listing's own descriptor)
            return out

        names = {os.path.realpath(tmp_path / f"t{i}.db") for i in range(10)}
        assert len(open_files() & names) <= 4
        assert os.path.realpath(tmp_path / "t9.db") in open_files()  # the most recent stay open
    assert [s.get_many([i.to_bytes(16, "big")]) for i, s in enumerate(stores)] == [
        [i] for i in range(10)
    ]
    for store in stores:
        store.close()


def test_count_tables_keep_their_layout() -> None:
    """Counts and calibration are written over ``protoprompt._storage``: the tables it makes
    are the ones earlier versions made, so their stores keep working (a SQLite ``tokens``
    with no type; PostgreSQL's ``seq`` the rows age by)."""
    from protoprompt import calibration
    from protoprompt._storage import POSTGRESQL, SQLITE
    from protoprompt._storage.counts import COUNTS

    assert COUNTS.create(SQLITE) == (
        "CREATE TABLE IF NOT EXISTS protoprompt_token_counts "
        "(key BLOB NOT NULL UNIQUE, tokens NOT NULL, mac BLOB NOT NULL)",
    )
    assert COUNTS.create(POSTGRESQL) == (
        "CREATE TABLE IF NOT EXISTS protoprompt_token_counts (seq BIGINT GENERATED BY DEFAULT "
        "AS IDENTITY, key BYTEA PRIMARY KEY, tokens BIGINT NOT NULL, mac BYTEA NOT NULL)",
        "CREATE INDEX IF NOT EXISTS protoprompt_token_counts_seq ON protoprompt_token_counts (seq)",
    )
    assert calibration._CREATE == (
        "CREATE TABLE IF NOT EXISTS protoprompt_calibration "
        "(model TEXT PRIMARY KEY, samples TEXT NOT NULL, mac BLOB NOT NULL)"
    )
    # SQLite: a rewritten count becomes the newest (INSERT OR REPLACE gives it a new rowid),
    # so the oldest written are the first out.
    assert COUNTS.put(SQLITE).startswith("INSERT OR REPLACE INTO protoprompt_token_counts")
    assert "ON CONFLICT (key) DO UPDATE" in COUNTS.put(POSTGRESQL)


def test_a_rewritten_count_is_the_newest(tmp_path) -> None:
    """The oldest written count is the first out; a count written again is new."""
    store = pp.SQLiteCountStore(tmp_path / "c.db", max_entries=2)
    a, b, c = (bytes([i]) * 16 for i in range(3))
    store.put_many([(a, 1), (b, 2)])
    assert store.flush(timeout=10)
    store.put_many([(a, 3)])
    assert store.flush(timeout=10)
    store.put_many([(c, 4)])
    assert store.flush(timeout=10)
    assert store.get_many([a, b, c]) == [3, None, 4]
    store.close()
