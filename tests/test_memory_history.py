"""The ``history`` layer of the memory store (passages of the turns sessions evicted), on
SQLite and on PostgreSQL: idempotent by row, scoped, per session, searchable by passage."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from protoprompt import MemoryScope, MemoryStore
from protoprompt.memory import HistoryRecord
from protoprompt.memory.store import history_digest

NewDb = Callable[[], str]
SCOPE = MemoryScope("acme", user="alice")
OTHER = MemoryScope("acme", user="bob")


def filler(n: int, seed: int = 0) -> str:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    return " ".join(words[(i * 7 + seed) % len(words)] + f"{i % 13}" for i in range(n))


@pytest.fixture
def store(new_db: NewDb) -> Iterator[MemoryStore]:
    with MemoryStore(new_db(), chunk_words=50, chunk_overlap=10) as s:
        yield s


def test_a_fact_in_the_middle_of_a_long_row_is_found_by_its_passage(store: MemoryStore) -> None:
    long_output = filler(3000) + " The vault code of project Zephyr is 48213. " + filler(3000, 3)
    n = store.index_history(
        "s1",
        [
            HistoryRecord(7, "user: hello there", {"turn": 1}),
            HistoryRecord(9, long_output, {"turn": 1, "label": "tool output"}),
        ],
        scope=SCOPE,
    )
    assert n > 100  # the long row is many passages
    hits = store.search_history("what is the Zephyr vault code?", scope=SCOPE, session_id="s1")
    assert hits, "the passage with the fact is found"
    top = hits[0]
    assert "48213" in top.text and len(top.text.split()) <= 50
    assert top.kind == "history" and top.scope == SCOPE
    assert top.metadata["row"] == 9 and top.metadata["session_id"] == "s1"
    assert top.metadata["label"] == "tool output" and top.metadata["turn"] == 1
    assert top.metadata["digest"] == history_digest(long_output)
    assert top.chunk_index == top.metadata["passage"] > 0
    assert top.span is not None and long_output[top.span[0] : top.span[1]] == top.text


def test_indexing_is_idempotent_by_row(store: MemoryStore) -> None:
    rec = HistoryRecord(3, "user: the invoice number is INV-2041 " + filler(120))
    first = store.index_history("s1", [rec], scope=SCOPE)
    again = store.index_history("s1", [rec, rec], scope=SCOPE)
    assert first == again
    hits = store.search_history("invoice INV-2041", scope=SCOPE, session_id="s1", limit=50)
    assert len({(h.metadata["row"], h.chunk_index) for h in hits}) == len(hits)
    assert store.history_rows("s1", scope=SCOPE) == {3: history_digest(rec.text)}
    # Another text for the row replaces it; a blank text removes it.
    store.index_history("s1", [HistoryRecord(3, "user: changed")], scope=SCOPE)
    assert store.search_history("INV-2041", scope=SCOPE) == []
    assert store.history_rows("s1", scope=SCOPE) == {3: history_digest("user: changed")}
    assert store.index_history("s1", [HistoryRecord(3, "  ")], scope=SCOPE) == 0
    assert store.history_rows("s1", scope=SCOPE) == {}


def test_sessions_and_scopes_are_kept_apart(store: MemoryStore) -> None:
    store.index_history("s1", [HistoryRecord(1, "user: the password hint is walrus")], scope=SCOPE)
    store.index_history("s2", [HistoryRecord(1, "user: the walrus likes fish")], scope=SCOPE)
    store.index_history("s1", [HistoryRecord(1, "user: walrus in bob's scope")], scope=OTHER)
    one = store.search_history("walrus", scope=SCOPE, session_id="s1")
    assert [h.metadata["session_id"] for h in one] == ["s1"]
    both = store.search_history("walrus", scope=SCOPE)
    assert sorted(h.metadata["session_id"] for h in both) == ["s1", "s2"]
    assert all(h.scope == SCOPE for h in both)
    # The other layers never see history passages, and history never sees documents.
    store.index_document("doc", "walrus facts", scope=SCOPE)
    assert [h.kind for h in store.search("walrus", scope=SCOPE)] == ["document"]
    assert all(h.kind == "history" for h in store.search_history("walrus", scope=SCOPE))
    assert store.history_rows("s2", scope=SCOPE) == {
        1: history_digest("user: the walrus likes fish")
    }


def test_forget_history_by_session_and_from_a_row(store: MemoryStore) -> None:
    rows = [HistoryRecord(r, f"user: message number {r} about kiwis") for r in range(10)]
    store.index_history("s1", rows, scope=SCOPE)
    store.index_history("s2", rows[:3], scope=SCOPE)
    assert store.forget_history("s1", scope=SCOPE, from_row=7) == 3
    assert sorted(store.history_rows("s1", scope=SCOPE)) == list(range(7))
    assert sorted(store.history_rows("s1", scope=SCOPE, start=2, end=5)) == [2, 3, 4]
    assert store.forget_history("s1", scope=SCOPE) == 7
    assert store.history_rows("s1", scope=SCOPE) == {}
    assert len(store.history_rows("s2", scope=SCOPE)) == 3
    # Forgetting the whole scope takes its history layer too.
    assert store.forget(scope=SCOPE) == 3
    assert store.search_history("kiwis", scope=SCOPE) == []


def test_hybrid_ranking_with_an_embedder(new_db: NewDb) -> None:
    def embed(texts: list[str]) -> list[list[float]]:
        return [[1.0, 0.0] if "feline" in t or "cat" in t else [0.0, 1.0] for t in texts]

    store = MemoryStore(new_db(), embedder=embed)
    store.index_history(
        "s1",
        [HistoryRecord(1, "user: my feline is called Tom"), HistoryRecord(2, "user: dogs bark")],
        scope=SCOPE,
    )
    hits = store.search_history("cat", scope=SCOPE, session_id="s1")
    assert hits and hits[0].metadata["row"] == 1  # found by its vector alone
    store.close()


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda s: s.index_history("", [], scope=SCOPE), ValueError, "session_id"),
        (lambda s: s.index_history("s", [("x", 1)], scope=SCOPE), TypeError, "records[0]"),
        (lambda s: s.index_history("s", "text", scope=SCOPE), TypeError, "records"),
        (lambda s: s.index_history("s", [HistoryRecord(-1, "x")], scope=SCOPE), ValueError, "row"),
        (
            lambda s: s.index_history("s", [HistoryRecord(1, "a\x00")], scope=SCOPE),
            ValueError,
            "text",
        ),
        (
            lambda s: s.index_history("s", [HistoryRecord(1, "x", {"o": object()})], scope=SCOPE),
            TypeError,
            "metadata",
        ),
        (lambda s: s.search_history("q", scope="acme"), TypeError, "scope"),
        (lambda s: s.search_history("q", scope=SCOPE, limit=0), ValueError, "limit"),
        (lambda s: s.forget_history("s", scope=SCOPE, from_row="1"), TypeError, "from_row"),
        (lambda s: s.history_rows("s", scope=SCOPE, start=1.5), TypeError, "start"),
    ],
)
def test_bad_input_names_the_argument(call, exc, name, store: MemoryStore) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=re.escape(name)):
        call(store)
    assert store.history_rows("s", scope=SCOPE) == {}  # nothing was written


def test_concurrent_writers_store_each_row_once(new_db: NewDb, engine: str, tmp_path: Path) -> None:
    target = str(tmp_path / "m.db") if engine == "sqlite" else new_db()
    stores = [MemoryStore(target, chunk_words=20, chunk_overlap=0) for _ in range(4)]
    records = [HistoryRecord(r, f"assistant: reply {r} " + filler(60, r)) for r in range(40)]
    errors: list[BaseException] = []

    def write(store: MemoryStore) -> None:
        try:
            for i in range(0, 40, 5):
                store.index_history("s1", records[i : i + 8], scope=SCOPE)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    passages = stores[0].search_history("reply", scope=SCOPE, session_id="s1", limit=10_000)
    keys = [(h.metadata["row"], h.chunk_index) for h in passages]
    assert len(keys) == len(set(keys))
    assert {r for r, _ in keys} == set(range(40))
    for s in stores:
        s.close()


def test_a_sqlite_database_of_an_older_store_gets_the_history_table(tmp_path: Path) -> None:
    path = str(tmp_path / "old.db")
    MemoryStore(path).index_document("d", "some text", scope=SCOPE)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE pp_mem_history; DROP TABLE pp_mem_history_fts;"
    )  # as written by a store before the history layer
    conn.close()
    ro = MemoryStore(path, read_only=True)
    assert ro.search_history("text", scope=SCOPE) == []  # reads as empty, changes nothing
    assert ro.history_rows("s", scope=SCOPE) == {}
    ro.close()
    store = MemoryStore(path)
    store.index_history("s", [HistoryRecord(1, "user: some text")], scope=SCOPE)
    assert [h.kind for h in store.search("text", scope=SCOPE)] == ["document"]
    assert [h.kind for h in store.search_history("text", scope=SCOPE)] == ["history"]


def test_a_postgres_database_of_an_older_store_gets_the_history_table(
    postgres_schema: NewDb,
) -> None:
    psycopg = pytest.importorskip("psycopg")
    url = postgres_schema()
    MemoryStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE pp_mem_history")  # as written before the history layer
    with MemoryStore(url, read_only=True) as ro:
        assert ro.search_history("text", scope=SCOPE) == []
        assert ro.history_rows("s", scope=SCOPE) == {}
    stores = [MemoryStore(url) for _ in range(3)]  # several workers add it once
    stores[0].index_history("s", [HistoryRecord(1, "user: some text")], scope=SCOPE)
    assert [h.metadata["row"] for h in stores[2].search_history("text", scope=SCOPE)] == [1]
    with psycopg.connect(url, autocommit=True) as conn:
        version = conn.execute("SELECT value FROM pp_mem_meta WHERE key = 'schema'").fetchone()
    assert version == ("1",)  # older stores still open the database
    for s in stores:
        s.close()


def test_words_in_most_passages_do_not_decide_the_ranking(store: MemoryStore, engine: str) -> None:
    """bm25 gives a word found in most passages (almost) no weight: SQLite does not match
    on it when a rarer word of the query matches (it would rank every passage), and still
    does when nothing else matches."""
    rows = [HistoryRecord(r, f"assistant: the answer number {r} is here") for r in range(40)]
    rows.append(HistoryRecord(40, "tool output of lookup: the walrus sleeps"))
    store.index_history("s", rows, scope=SCOPE)
    if engine == "postgresql":  # what autovacuum does in time: the column's statistics
        import psycopg

        with psycopg.connect(store._backend._url, autocommit=True) as conn:  # type: ignore[attr-defined]
            conn.execute("ANALYZE pp_mem_history")
    hits = store.search_history("where is the walrus", scope=SCOPE, limit=50)
    assert [h.metadata["row"] for h in hits] == [40]
    # A query of common words alone still matches them; one whose rarer words match
    # nothing falls back to the common ones.
    assert len(store.search_history("the answer", scope=SCOPE, limit=50)) == 41
    assert len(store.search_history("the answer to everything", scope=SCOPE, limit=50)) == 41


def test_a_search_never_waits_for_a_write_that_waits_for_the_database(
    engine: str, new_db: NewDb, tmp_path: Path
) -> None:
    """Another connection (another process) holds the database's write lock, so the index
    write of a background job waits for it: a search meanwhile answers at once (it waited
    with the write, up to the 30 s busy timeout, on SQLite), and the write lands once the
    lock goes."""
    import time

    target = str(tmp_path / "m.db") if engine == "sqlite" else new_db()
    with MemoryStore(target) as store:
        store.index_history("s", [HistoryRecord(0, "user: the walrus is 48213")], scope=SCOPE)
        if engine == "sqlite":
            blocker = sqlite3.connect(target, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            release: Callable[[], None] = lambda: blocker.execute("COMMIT")  # noqa: E731
        else:
            import psycopg

            from protoprompt.memory._pg_schema import LOCK_CLASS
            from protoprompt.memory._pg_sql import lock_key

            blocker = psycopg.connect(store._backend._url, autocommit=True)  # type: ignore[attr-defined]
            key = lock_key(("acme", "alice", "", ""), "\x1fhistory\x1fs")
            blocker.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, key))
            release = lambda: blocker.execute("SELECT pg_advisory_unlock_all()")  # noqa: E731
        later = [HistoryRecord(1, "user: the narwhal sings")]
        writer = threading.Thread(target=lambda: store.index_history("s", later, scope=SCOPE))
        try:
            writer.start()
            time.sleep(0.5)
            assert writer.is_alive(), "the write waits for the database"
            started = time.monotonic()
            hits = store.search_history("walrus", scope=SCOPE, session_id="s")
            waited = time.monotonic() - started
            assert [h.metadata["row"] for h in hits] == [0] and waited < 0.5, waited
        finally:
            release()
            writer.join(timeout=30)
            blocker.close()
        assert not writer.is_alive()
        assert [h.metadata["row"] for h in store.search_history("narwhal", scope=SCOPE)] == [1]
