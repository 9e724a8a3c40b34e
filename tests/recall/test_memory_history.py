"""The ``history`` layer of the memory store (passages of the turns sessions evicted), on
SQLite and on PostgreSQL: idempotent by row, scoped, per session, searchable by passage."""

from __future__ import annotations

import re
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
    # nothing falls back to the common ones. Stop words are left out while there are
    # others ("the" is in every passage), and matched when there are not.
    assert len(store.search_history("the answer", scope=SCOPE, limit=50)) == 40
    assert len(store.search_history("the answer to everything", scope=SCOPE, limit=50)) == 40
    assert len(store.search_history("the", scope=SCOPE, limit=50)) == 41


# --------------------------------------------------------------------------- ranking

_STEM_WORDS = (
    "caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated "
    "troubled sized hopping tanned falling hissing fizzed failing filing happy sky relational "
    "conditional rational valenci hesitanci digitizer conformabli radicalli differentli vileli "
    "analogousli vietnamization predication operator feudalism decisiveness hopefulness "
    "callousness formaliti sensitiviti sensibiliti triplicate formative formalize electriciti "
    "electrical hopeful goodness revival allowance inference airliner gyroscopic adjustable "
    "defensible irritant replacement adjustment dependent adoption homologou communism "
    "activate angulariti homologous effective bowdlerize probate rate cease controll roll "
    "researching research agencies generalizations oscillators flying dying ying aing eing "
    "naive cafe strasse resume uber 2023 x1y covid19 abcdefghijklmnopqrstuvwxyzabcdefghijklmnop"
    "qrstuvwxyzabcdefghijklmnopqrstuvwxyz"
)


def test_history_terms_are_stemmed_as_sqlite_fts5_porter_stems_them() -> None:
    """The PostgreSQL engine stores the stems SQLite's porter tokenizer makes (the same
    terms on both engines), checked word by word against SQLite itself."""
    from protoprompt.memory._ranking import words
    from protoprompt.memory._stem import stem

    vocabulary = set(_STEM_WORDS.split())
    for doc in Path(__file__).resolve().parents[2].glob("docs/*.md"):
        vocabulary.update(words(doc.read_text(encoding="utf-8")))
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE t USING fts5(x, tokenize = 'porter unicode61')")
    conn.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'row')")
    wrong = []
    for word in sorted(vocabulary):
        conn.execute("DELETE FROM t")
        conn.execute("INSERT INTO t (x) VALUES (?)", (word,))
        (term,) = conn.execute("SELECT term FROM v").fetchone()
        if stem(word) != term:
            wrong.append((word, term, stem(word)))
    assert len(vocabulary) > 1000
    assert wrong == []


def test_a_paraphrase_finds_its_turn_and_question_words_do_not(store: MemoryStore) -> None:
    rows = [
        HistoryRecord(0, "user: What did it look like?"),
        HistoryRecord(1, "assistant: What did you do then?"),
        HistoryRecord(2, "user: I've been researching adoption agencies lately."),
        HistoryRecord(3, "user: What did the painting show?"),
    ]
    store.index_history("s1", rows, scope=SCOPE)
    hits = store.search_history("What did Caroline research?", scope=SCOPE, session_id="s1")
    assert [h.metadata["row"] for h in hits] == [2]  # stemmed; "what did" left out
    hits = store.search_history("which agency did she contact", scope=SCOPE, session_id="s1")
    assert [h.metadata["row"] for h in hits][:1] == [2]


def test_the_fact_with_the_rare_term_wins_among_confusers(new_db: NewDb) -> None:
    """24 facts share a template ("the access code for project X is N"): half of them in
    short user messages, half inside long tool outputs. Each project's question finds its
    own fact first, on every engine: the short facts of other projects, which hold the
    template's words in fewer words, do not outrank it."""
    store = MemoryStore(new_db())  # default passages: 200 words
    names = (
        "Zephyr Quokka Marzipan Obsidian Tamarind Halcyon Juniper Kumquat Labradorite Nimbus "
        "Orrery Pangolin Quasar Rhubarb Sassafras Tundra Umbra Verbena Wombat Xylophone "
        "Yarrow Zircon Azalea Bergamot"
    ).split()
    rows = []
    for k, name in enumerate(names):
        fact = f"The access code for project {name} is {10_000 + 37 * k}."
        if k % 2:
            rows.append(HistoryRecord(k, f"user: {fact}"))
        else:
            text = f"tool output of lookup: {filler(120, k)} {fact} {filler(150, k + 1)}"
            rows.append(HistoryRecord(k, text))
    store.index_history("s1", rows, scope=SCOPE)
    for k, name in enumerate(names):
        hits = store.search_history(
            f"What was the access code for project {name}?", scope=SCOPE, session_id="s1", limit=3
        )
        assert str(10_000 + 37 * k) in hits[0].text, (name, [h.text[:60] for h in hits])
    store.close()


def test_neighbouring_turns_follow_their_hit_once(store: MemoryStore) -> None:
    rows = [
        HistoryRecord(10, "user: Where should I go hiking this weekend?"),
        HistoryRecord(11, "assistant: Try the Dipsea trail, it ends at Stinson Beach."),
        HistoryRecord(12, "user: Thanks! Also, my sister lives in Lisbon."),
        HistoryRecord(14, "assistant: Lisbon is lovely in spring."),
    ]
    store.index_history("s1", rows, scope=SCOPE)
    plain = store.search_history("hiking weekend", scope=SCOPE, session_id="s1")
    assert [h.metadata["row"] for h in plain] == [10]
    hits = store.search_history("hiking weekend", scope=SCOPE, session_id="s1", neighbours=True)
    assert [h.metadata["row"] for h in hits] == [10, 11]
    assert hits[1].metadata["neighbour_of"] == "history:s1/10#0"
    hits = store.search_history("Lisbon", scope=SCOPE, session_id="s1", neighbours=True)
    rows_found = [h.metadata["row"] for h in hits]
    assert sorted(rows_found) == [11, 12, 14] and len(set(rows_found)) == len(rows_found)


def test_the_neighbours_of_a_hit_are_the_passages_next_to_it(store: MemoryStore) -> None:
    """The neighbours of a hit in a row of many passages are the last passage of the row
    before and the first of the row after; each engine reads only those two (one step
    along the scope's index each: PostgreSQL read every passage of both rows, and its
    ``max(row_key)`` read every row before the anchor while the table's statistics were
    stale: 86 ms a search at 20k passages)."""
    rows = [
        HistoryRecord(1, f"tool: {filler(140, 1)}"),
        HistoryRecord(3, "user: where is the zephyr build log?"),
        HistoryRecord(6, f"tool: {filler(140, 2)}"),
    ]
    store.index_history("s1", rows, scope=SCOPE)
    backend = store._backend  # noqa: SLF001 - what the engine reads
    found = backend.history_adjacent(("acme", "alice", "", ""), "s1", [3])
    last_before = max(r[7] for _, side, r in found if side == 0)
    assert {(side, r[6]) for _, side, r in found} == {(0, 1), (1, 6)}
    assert sorted((side, r[6], r[7]) for _, side, r in found) == [(0, 1, last_before), (1, 6, 0)]
    assert last_before > 0  # the row before has several passages: its last one
    hits = store.search_history("zephyr build log", scope=SCOPE, session_id="s1", neighbours=True)
    assert [(h.metadata["row"], h.chunk_index) for h in hits] == [(3, 0), (1, last_before), (6, 0)]


def test_few_matches_are_read_unordered_and_ranked_the_same(
    store: MemoryStore, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the passages holding each term prove a search matches at most its pool of
    passages, SQLite reads them without its relevance or order (the fast path, asserted
    by the counter): the hits are the same, in the same order, with the same scores, as
    ranked from the engine's ordered matches; a search that may match more is read
    ordered."""
    from protoprompt.memory import _sqlite
    from protoprompt.memory import store as store_module

    rows = [
        HistoryRecord(r, f"user: turn {r} says zephyr {filler(6 + r % 9, r)} quokka{r % 5}")
        for r in range(300)
    ]
    rows += [
        HistoryRecord(1000 + r, f"tool: access code for project P{r} is {r}") for r in range(30)
    ]
    store.index_history("s1", rows, scope=SCOPE)
    queries = [
        ("What was the access code for project P7?", 4),
        ("quokka3 alpha1", 8),
        ("zephyr", 8),  # in every passage of the turns: more than a pool
        ("Which turn says gamma4 and theta5?", 30),
        ("nothing matches this", 8),
    ]

    def search() -> list[list[tuple[object, ...]]]:
        return [
            [
                (h.text, h.score, h.chunk_index, sorted(h.metadata.items()))
                for h in store.search_history(
                    query, scope=SCOPE, session_id="s1", limit=limit, neighbours=True
                )
            ]
            for query, limit in queries
        ]

    before = _sqlite.stats["unordered_matches"]
    fast = search()
    used = _sqlite.stats["unordered_matches"] - before
    if engine == "sqlite":
        assert 3 <= used < len(queries)
    monkeypatch.setattr(store_module, "_match_bound", lambda *args: None)
    assert search() == fast
    assert all(fast[:2]) and fast[-1] == []


def test_a_search_with_neighbours_is_four_statements_whatever_its_size(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recall search reads the engine in four statements (the common words, the matches,
    the passages holding each term, the neighbours of every hit), however many words the
    question has and however many hits it brings neighbours for."""
    rows = [
        HistoryRecord(r, f"user: turn {r} mentions zephyr quokka marzipan {filler(8, r)}")
        for r in range(0, 80, 2)
    ]
    store.index_history("s1", rows, scope=SCOPE)
    reads = _reads(store, monkeypatch)  # its round trips
    for query, limit in (("zephyr", 4), ("zephyr quokka marzipan alpha0 theta1 kappa2", 24)):
        reads.clear()
        hits = store.search_history(
            query, scope=SCOPE, session_id="s1", limit=limit, neighbours=True
        )
        assert len([h for h in hits if "neighbour_of" not in h.metadata]) >= min(limit, 8)
        assert any("neighbour_of" in h.metadata for h in hits)
        assert len(reads) <= 4, reads


def _reads(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements ``store``'s engine reads from now on, in order (spied on)."""
    backend = store._backend  # noqa: SLF001 - reading its statements
    reads: list[str] = []
    real = backend._read  # noqa: SLF001

    def recording(sql: str, *args: object, **kwargs: object) -> object:
        reads.append(sql)
        return real(sql, *args, **kwargs)

    monkeypatch.setattr(backend, "_read", recording)
    return reads


def test_questions_of_a_few_sizes_share_the_sqlite_statements(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The statements whose text grows with the question's words or with its hits (the
    term counts, the neighbours) are padded to a power of two: questions of 5 to 8 words
    and 5 to 8 hits run the same texts, so the connection's cached statements serve them
    (compiling one took longer than running it). The counts and hits are those of the
    unpadded statements (the ranking tests), and padding adds no statement."""
    from protoprompt.memory import _sqlite

    assert [len(_sqlite._padded(list(range(n)))) for n in (0, 1, 2, 3, 5, 8, 9)] == [
        1,
        1,
        2,
        4,
        8,
        8,
        16,
    ]
    assert _sqlite._padded(["a", "b", "c"]) == ["a", "b", "c", None]
    with MemoryStore(str(tmp_path / "m.db"), chunk_words=50, chunk_overlap=0) as store:
        words = ["zephyr", "quokka", "marzipan", "walrus", "lantern", "harbor", "cobalt", "fennel"]
        rows = [
            HistoryRecord(r, f"user: turn {r} mentions {words[r % 8]} and {words[(r + 3) % 8]}")
            for r in range(40)
        ]
        store.index_history("s1", rows, scope=SCOPE)
        reads = _reads(store, monkeypatch)
        texts: list[set[str]] = []
        for n in (5, 6, 8):
            reads.clear()
            hits = store.search_history(
                " ".join(words[:n]), scope=SCOPE, session_id="s1", limit=n, neighbours=True
            )
            texts.append(set(reads))
            assert len([h for h in hits if "neighbour_of" not in h.metadata]) == n
            assert len(texts[-1]) <= 4
        assert texts[0] == texts[1] == texts[2]


def test_indexing_works_out_the_term_counts_its_searches_rank_by(store: MemoryStore) -> None:
    """The passages' term counts are worked out when they are indexed (in the background
    for evicted turns), so a turn's search ranks them without tokenising and stemming them."""
    from protoprompt.memory import _ranking

    _ranking._bag.cache_clear()  # noqa: SLF001 - the kept term counts
    rows = [
        HistoryRecord(r, f"user: note {r} on the zephyr rollout {filler(30, r)}") for r in range(6)
    ]
    store.index_history("s1", rows, scope=SCOPE)
    before = _ranking._bag.cache_info()  # noqa: SLF001
    assert before.currsize >= len(rows)
    hits = store.search_history("zephyr rollout", scope=SCOPE, session_id="s1")
    assert len(hits) == len(rows)
    after = _ranking._bag.cache_info()  # noqa: SLF001
    assert after.misses == before.misses and after.hits >= before.hits + len(rows)


def test_the_same_text_is_recalled_once(store: MemoryStore) -> None:
    rows = [HistoryRecord(r, "user: my locker pin is 4471") for r in range(3)]
    rows.append(HistoryRecord(3, "user: the locker by the gym"))
    store.index_history("s1", rows, scope=SCOPE)
    hits = store.search_history("locker pin", scope=SCOPE, session_id="s1")
    assert [h.text for h in hits] == ["user: my locker pin is 4471", "user: the locker by the gym"]


def test_a_sqlite_history_index_without_stems_is_made_again(tmp_path: Path) -> None:
    """A database whose history full-text table was made by an older store (no porter
    stemming), or that holds something else under its name, has it made again from the
    passages on first use; a read-only store reads it as it is."""
    path = str(tmp_path / "old.db")
    with MemoryStore(path) as store:
        store.index_history("s", [HistoryRecord(1, "user: researching agencies")], scope=SCOPE)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE pp_mem_history_vocab; DROP TABLE pp_mem_history_fts;"
        "CREATE VIRTUAL TABLE pp_mem_history_fts USING fts5(text, content = 'pp_mem_history',"
        " content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2');"
        "INSERT INTO pp_mem_history_fts (pp_mem_history_fts) VALUES ('rebuild');"
    )
    conn.close()
    with MemoryStore(path, read_only=True) as ro:  # the old index, read as it is
        assert [h.metadata["row"] for h in ro.search_history("researching", scope=SCOPE)] == [1]
        assert ro.search_history("research", scope=SCOPE) == []
    with MemoryStore(path) as store:
        assert [h.metadata["row"] for h in store.search_history("research", scope=SCOPE)] == [1]
    conn = sqlite3.connect(path)  # foreign state under the names: never trusted
    conn.executescript(
        "DROP TABLE pp_mem_history_vocab; DROP TRIGGER pp_mem_history_ai;"
        "DROP TABLE pp_mem_history_fts; CREATE TABLE pp_mem_history_fts (x);"
        "CREATE VIEW pp_mem_history_vocab AS SELECT 1;"
    )
    conn.close()
    with MemoryStore(path) as store:
        store.index_history("s", [HistoryRecord(2, "user: an agency called Bright")], scope=SCOPE)
        found = store.search_history("Bright research", scope=SCOPE)
        assert sorted(h.metadata["row"] for h in found) == [1, 2]


def test_a_postgres_history_of_plain_words_is_stemmed_on_first_use(
    postgres_schema: NewDb,
) -> None:
    psycopg = pytest.importorskip("psycopg")
    url = postgres_schema()
    with MemoryStore(url) as store:
        store.index_history("s", [HistoryRecord(1, "user: researching agencies")], scope=SCOPE)
    with psycopg.connect(url, autocommit=True) as conn:  # as an older store wrote it
        conn.execute("UPDATE pp_mem_history SET tsv = to_tsvector('simple', text)")
        conn.execute("DELETE FROM pp_mem_meta WHERE key = 'history_terms'")
    with MemoryStore(url, read_only=True) as ro:
        assert [h.metadata["row"] for h in ro.search_history("researching", scope=SCOPE)] == [1]
    stores = [MemoryStore(url) for _ in range(2)]
    for s in stores:
        assert [h.metadata["row"] for h in s.search_history("research", scope=SCOPE)] == [1]
        s.close()


def test_sqlite_and_postgres_rank_the_history_alike(postgres_schema: NewDb) -> None:
    """The same passages and questions give the same hits in the same order on both
    engines (the engines only find the matches; the ranking is the store's)."""
    import random

    rng = random.Random(35)
    topics = "hiking trail cooking pasta garden tomatoes research agencies concert tickets".split()
    rows = [
        HistoryRecord(
            r,
            ("user: " if r % 2 else "assistant: ")
            + " ".join(rng.choice(topics) for _ in range(rng.randrange(4, 40)))
            + f" note {r}",
        )
        for r in range(80)
    ]
    questions = [
        "What did I research?",
        "Which trail did you recommend for hiking?",
        "How do I cook pasta with tomatoes?",
        "When were the concert tickets bought?",
        "tell me about the garden",
    ]
    found = {}
    for engine, target in (("sqlite", ":memory:"), ("postgresql", postgres_schema())):
        with MemoryStore(target, chunk_words=25, chunk_overlap=5) as store:
            store.index_history("s1", rows, scope=SCOPE)
            found[engine] = [
                [
                    (h.metadata["row"], h.chunk_index)
                    for h in store.search_history(q, scope=SCOPE, limit=12)
                ]
                for q in questions
            ]
    assert all(found["sqlite"]), found["sqlite"]
    assert found["sqlite"] == found["postgresql"]


def _opened_at_once(path: str, workers: int) -> list[MemoryStore]:
    """``workers`` stores of ``path``, opened by as many threads at the same moment."""
    opened: list[MemoryStore] = []
    errors: list[BaseException] = []
    start = threading.Barrier(workers)

    def open_store() -> None:
        try:
            start.wait()
            opened.append(MemoryStore(path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(opened) == workers, errors
    return opened


def test_workers_opening_an_old_sqlite_history_index_at_once_make_it_again_once(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "old.db")
    with MemoryStore(path) as store:
        rows = [HistoryRecord(r, f"user: researching topic {r}") for r in range(50)]
        store.index_history("s", rows, scope=SCOPE)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TABLE pp_mem_history_vocab; DROP TABLE pp_mem_history_fts;"
        "CREATE VIRTUAL TABLE pp_mem_history_fts USING fts5(text, content = 'pp_mem_history',"
        " content_rowid = 'id', tokenize = 'unicode61 remove_diacritics 2');"
        "INSERT INTO pp_mem_history_fts (pp_mem_history_fts) VALUES ('rebuild');"
    )
    conn.close()
    opened = _opened_at_once(path, 4)
    for s in opened:
        assert len(s.search_history("research", scope=SCOPE, limit=100)) == 50
        s.close()
    conn = sqlite3.connect(path)
    (sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'pp_mem_history_fts'"
    ).fetchone()
    conn.close()
    assert "porter" in sql


def _kept_counts(path: str) -> dict[tuple[str, ...], int]:
    conn = sqlite3.connect(path)
    try:
        kept = conn.execute("SELECT * FROM pp_mem_history_counts").fetchall()
        counted = conn.execute(
            "SELECT s_tenant, s_user, s_thread, s_kind, session_id, count(*)"
            " FROM pp_mem_history GROUP BY 1, 2, 3, 4, 5"
        ).fetchall()
    finally:
        conn.close()
    assert sorted(kept) == sorted(counted)
    return {tuple(row[:5]): int(row[5]) for row in kept}


def test_sqlite_keeps_the_history_passages_of_each_session_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn's search reads how many passages it searches from counts the database's
    triggers keep per scope and session (a ``count(*)`` of the passages took time in
    proportion to them: 6 ms a turn at 100k passages), right through indexing again,
    forgetting a session, rows or a scope; the statement that ranks reads them."""
    path = str(tmp_path / "m.db")
    with MemoryStore(path, chunk_words=50, chunk_overlap=0) as store:
        for sid, scope, n in (("s1", SCOPE, 30), ("s2", SCOPE, 12), ("s1", OTHER, 7)):
            rows = [HistoryRecord(r, f"user: the otter swam {r} {filler(80, r)}") for r in range(n)]
            store.index_history(sid, rows, scope=scope)
        first = _kept_counts(path)
        assert sum(first.values()) > 49 and len(first) == 3
        store.index_history("s1", [HistoryRecord(3, "user: the otter, briefly")], scope=SCOPE)
        store.forget_history("s2", scope=SCOPE, from_row=6)
        store.forget_history("s1", scope=OTHER)
        after = _kept_counts(path)
        assert len(after) == 2 and after != first
        reads = _reads(store, monkeypatch)
        hits = store.search_history("where did the otter swim?", scope=SCOPE, session_id="s1")
        assert hits
        (statistics,) = [r for r in reads if "AS searched" in r]
        assert "FROM pp_mem_history_counts" in statistics
        assert "count(*) FROM pp_mem_history AS h WHERE ((" not in statistics  # the totals
        store.forget(scope=SCOPE)
        assert _kept_counts(path) == {}


def test_sqlite_history_counts_are_made_once_and_not_trusted_when_wrong(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database without the counts (an older store's) or with other ones (changed by
    hand) has them made again from its passages when a store opens it, by one of the
    workers opening it at once; counts that cannot be right when read (more passages
    searched than the table holds) are not used: the passages are counted, and the
    ranking is the same. A read-only store of a database without them counts."""
    path = str(tmp_path / "old.db")
    query = "which otter swam?"
    with MemoryStore(path, chunk_words=50, chunk_overlap=0) as store:
        for sid in ("s1", "s2"):
            rows = [HistoryRecord(r, f"user: otter {r} swam {filler(20, r)}") for r in range(40)]
            store.index_history(sid, rows, scope=SCOPE)
        expected = [h.source for h in store.search_history(query, scope=SCOPE, session_id="s1")]
    right = _kept_counts(path)
    conn = sqlite3.connect(path)
    conn.executescript(
        "DROP TRIGGER pp_mem_history_count_ai; DROP TRIGGER pp_mem_history_count_ad;"
        "DROP TRIGGER pp_mem_history_count_au; DROP TABLE pp_mem_history_counts;"
    )
    conn.close()
    with MemoryStore(path, read_only=True) as ro:
        assert ro._backend._counted is False  # noqa: SLF001
        assert [h.source for h in ro.search_history(query, scope=SCOPE, session_id="s1")] == (
            expected
        )
    opened = _opened_at_once(path, 4)
    assert _kept_counts(path) == right
    for s in opened:
        s.close()
    conn = sqlite3.connect(path)  # more passages in s1 than in the table
    conn.execute("UPDATE pp_mem_history_counts SET n = 1000 WHERE session_id = 's1'")
    conn.execute("UPDATE pp_mem_history_counts SET n = -960 WHERE session_id = 's2'")
    conn.commit()
    conn.close()
    with MemoryStore(path) as store:
        reads = _reads(store, monkeypatch)
        found = store.search_history(query, scope=SCOPE, session_id="s1")
        assert [h.source for h in found] == expected
        statistics = [r for r in reads if "AS searched" in r]
        assert ["pp_mem_history_counts" in r for r in statistics] == [True, False]


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
            from protoprompt.memory import _sqlite

            on_writer = _sqlite.stats["writer_reads"]
            started = time.monotonic()
            hits = store.search_history("walrus", scope=SCOPE, session_id="s")
            waited = time.monotonic() - started
            assert [h.metadata["row"] for h in hits] == [0] and waited < 0.5, waited
            # The write holds the writer connection: the reader served the search.
            assert _sqlite.stats["writer_reads"] == on_writer
        finally:
            release()
            writer.join(timeout=30)
            blocker.close()
        assert not writer.is_alive()
        assert [h.metadata["row"] for h in store.search_history("narwhal", scope=SCOPE)] == [1]


def test_a_turn_reads_only_the_layers_that_hold_something(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn with recall finds in one read which of the profile, facts and documents of
    its scope hold something, and reads only those: no search of an empty layer (the fast
    path, asserted by the calls); what is written afterwards is read by the next turn."""
    from protoprompt import TokenBudgetedContextBuilder

    rows = [
        HistoryRecord(r, f"user: the zephyr build {r} said " + filler(30, r), {"turn": 1})
        for r in range(6)
    ]
    store.index_history("s1", rows, scope=SCOPE)
    calls: list[str] = []

    def counting(name: str) -> Callable[..., object]:
        real = getattr(store, name)

        def counted(*args: object, **kwargs: object) -> object:
            calls.append(name)
            return real(*args, **kwargs)

        return counted

    for name in ("get_profile", "facts", "search"):
        monkeypatch.setattr(store, name, counting(name))
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=SCOPE, recall_evicted=True)
    query = [{"role": "user", "content": "What did the zephyr build say?"}]
    plan = builder.build([], query, session_id="s1", turn=3)
    assert any(b.layer == "history" and b.kept for b in plan.blocks)
    assert calls == []  # the empty layers were not read
    store.remember("The zephyr build runs every night.", scope=SCOPE)
    store.set_profile("name: Alice", scope=SCOPE)
    store.index_document("runbook", "How to restart the zephyr build server.", scope=SCOPE)
    plan = builder.build([], query, session_id="s1", turn=4)
    assert sorted(set(calls)) == ["facts", "get_profile", "search"]
    layers = {b.layer for b in plan.blocks if b.kept}
    assert {"profile", "facts", "rag", "history"} <= layers
    calls.clear()
    store.forget(scope=SCOPE)  # everything of the scope: the history layer too
    other = MemoryScope("acme", user="carol")
    store.remember("Carol's fact.", scope=other)  # another scope's records are not this one's
    builder.build([], query, session_id="s1", turn=5)
    assert calls == []


def test_the_term_counts_of_a_one_session_table_come_from_the_full_text_index(
    tmp_path: Path,
) -> None:
    """SQLite: while every passage of the table is one of those searched, the ranking's
    term counts come from the full-text index alone (the shortcut, asserted by its
    counter); with other passages in the table they are counted within the scope and
    session, and both ways agree."""
    from protoprompt.memory import _sqlite
    from protoprompt.memory._checks import scope_params

    terms = [("zephyr", "zephyr"), ("quokka", "quokka")]
    scopes = [scope_params(SCOPE)]
    with MemoryStore(str(tmp_path / "m.db")) as store:
        rows = [HistoryRecord(r, f"user: zephyr {r} " + filler(20, r)) for r in range(5)]
        store.index_history("s1", rows, scope=SCOPE)
        backend = store._backend
        taken = _sqlite.stats["counts_by_index"]
        assert backend.history_counts(terms, scopes, "s1") == (5, {"zephyr": 5, "quokka": 0})
        assert _sqlite.stats["counts_by_index"] == taken + 1
        store.index_history("s2", [HistoryRecord(1, "user: zephyr quokka")], scope=SCOPE)
        store.index_history("s1", [HistoryRecord(9, "user: quokka")], scope=OTHER)
        assert backend.history_counts(terms, scopes, "s1") == (5, {"zephyr": 5, "quokka": 0})
        assert backend.history_counts(terms, scopes, None) == (6, {"zephyr": 6, "quokka": 1})
        assert _sqlite.stats["counts_by_index"] == taken + 1  # other passages: not taken
        common, total, counts = backend.history_statistics(["zephyr"], terms, scopes, "s1")
        assert (common, total, counts) == ({"zephyr"}, 5, {"zephyr": 5, "quokka": 0})


def test_the_sqlite_history_index_merges_its_segments_early(tmp_path: Path) -> None:
    """SQLite: each indexing call adds a segment to the full-text index, and a search looks
    each term up in every segment; the history table merges them as soon as two are on one
    level (``crisismerge``), so many small indexing calls leave a few segments at any time
    (with FTS5's default, up to 15), and a database made before has it set when a store
    opens it."""
    from protoprompt.memory import _sqlite

    path = str(tmp_path / "m.db")

    def segments() -> int:
        conn = sqlite3.connect(path)
        try:
            found = conn.execute("SELECT count(DISTINCT segid) FROM pp_mem_history_fts_idx")
            return int(found.fetchone()[0])
        finally:
            conn.close()

    def setting() -> object:
        conn = sqlite3.connect(path)
        try:
            found = conn.execute(
                "SELECT v FROM pp_mem_history_fts_config WHERE k = 'crisismerge'"
            ).fetchone()
            return None if found is None else found[0]
        finally:
            conn.close()

    with MemoryStore(path) as store:
        assert setting() == _sqlite.HISTORY_FTS_CRISISMERGE == 2
        most = 0
        for r in range(64):
            text = f"user: zephyr {r} " + filler(8, r)
            store.index_history("s1", [HistoryRecord(r, text)], scope=SCOPE)
            most = max(most, segments())
        assert most <= 4  # FTS5's default: up to 15 after as many calls
        found = store.search_history("zephyr 17", scope=SCOPE, session_id="s1")
        assert found and found[0].metadata["row"] == 17
    conn = sqlite3.connect(path)  # as an earlier version left it
    conn.execute("DELETE FROM pp_mem_history_fts_config WHERE k = 'crisismerge'")
    conn.commit()
    conn.close()
    assert setting() is None
    with MemoryStore(path, read_only=True) as ro:  # never written
        assert ro.search_history("zephyr 17", scope=SCOPE, session_id="s1")
    assert setting() is None
    with MemoryStore(path):
        assert setting() == 2


def test_hits_of_rows_the_caller_sends_do_not_count_in_the_limit(store: MemoryStore) -> None:
    """``uncounted``: the hits of rows whose digest the caller names (rows its request
    sends) come back in their place, and ``limit`` counts the others: a recall that leaves
    them out still gets as many passages as it asked for. On every engine."""
    records = [
        HistoryRecord(p, f"user: the invoice {p} of the project was paid in cash", {"turn": p})
        for p in range(10)
    ]
    store.index_history("s1", records, scope=SCOPE)
    query = "which invoice of the project was paid in cash?"
    plain = store.search_history(query, scope=SCOPE, session_id="s1", limit=3)
    assert len(plain) == 3
    sent = {str(h.metadata["digest"]) for h in plain[:2]}
    hits = store.search_history(query, scope=SCOPE, session_id="s1", limit=3, uncounted=sent)
    assert [h.metadata["row"] for h in hits[:3]] == [h.metadata["row"] for h in plain]
    assert len(hits) == 5
    assert sum(str(h.metadata["digest"]) not in sent for h in hits) == 3
    with pytest.raises(TypeError, match="uncounted"):
        store.search_history(query, scope=SCOPE, uncounted="abc")


def test_a_search_given_tokens_counts_hits_until_their_texts_hold_them(
    new_db: NewDb,
) -> None:
    """``tokens``: counting stops once the counted hits' texts hold about that many tokens
    (``CHARS_PER_TOKEN`` characters each), after at least ``TOKENS_MIN_HITS``, or at
    ``limit``; a text longer than the whole room and the hits of ``uncounted`` rows are not
    counted there. On every engine."""
    from protoprompt.memory import store as store_mod

    with MemoryStore(new_db(), chunk_words=5_000, chunk_overlap=0) as store:
        pad = " ".join(f"word{i}" for i in range(60))  # about 450 characters a passage
        records = [
            HistoryRecord(p, f"user: the invoice {p:02d} was paid in cash {pad}", {"turn": p})
            for p in range(30)
        ]
        long = "user: " + "the invoice was paid in cash. " * 500
        records.append(HistoryRecord(99, long, {"turn": 99}))
        store.index_history("s1", records, scope=SCOPE)
        query = "which invoice was paid in cash?"

        def search(**kwargs: object) -> list[Any]:
            return store.search_history(query, scope=SCOPE, session_id="s1", **kwargs)

        plain = search(limit=30)
        assert len(plain) == 30 and plain[0].metadata["row"] == 99  # the long one first
        size = len(plain[1].text)
        assert {len(h.text) for h in plain[1:]} == {size}
        per_token = store_mod.CHARS_PER_TOKEN
        # The long passage is not counted in the room: five short ones fill 5 * size.
        hits = search(limit=30, tokens=5 * size // per_token)
        assert [h.source for h in hits] == [h.source for h in plain[:6]]
        # At least TOKENS_MIN_HITS counted, however small the room; at most ``limit``.
        one = size // per_token + 1
        assert len(search(limit=30, tokens=one)) == store_mod.TOKENS_MIN_HITS
        assert len(search(limit=3, tokens=one)) == 3
        assert len(search(limit=30, tokens=10**9)) == 30
        # The hits of rows the caller sends come back and count in neither.
        sent = {str(h.metadata["digest"]) for h in plain[1:3]}
        hits = search(limit=30, tokens=5 * size // per_token, uncounted=sent)
        assert [h.source for h in hits] == [h.source for h in plain[:8]]
        for bad, exc in ((0, ValueError), (True, TypeError), ("9", TypeError)):
            with pytest.raises(exc, match="tokens"):
                search(limit=3, tokens=bad)


def test_sqlite_reads_use_the_writer_connection_when_no_write_holds_it(tmp_path: Path) -> None:
    """SQLite: a read with no write in progress runs on the writer connection (whose page
    cache its own commits keep, where the reader's is dropped at each commit: the fast path,
    asserted by its counter); a read inside a write of the same thread reads what was
    committed, as on the reader, never the write's own rows."""
    from protoprompt.memory import _sqlite

    with MemoryStore(str(tmp_path / "m.db")) as store:
        store.index_history("s", [HistoryRecord(0, "user: the walrus is 48213")], scope=SCOPE)
        backend = store._backend
        before = _sqlite.stats["writer_reads"]
        hits = store.search_history("walrus", scope=SCOPE, session_id="s")
        assert [h.metadata["row"] for h in hits] == [0]
        assert _sqlite.stats["writer_reads"] > before
        with backend._transaction() as conn:  # type: ignore[attr-defined]
            conn.execute("DELETE FROM pp_mem_history")
            inside = _sqlite.stats["writer_reads"]
            rows = backend._read("SELECT count(*) FROM pp_mem_history", ())  # type: ignore[attr-defined]
            assert rows == [(1,)] and _sqlite.stats["writer_reads"] == inside
            conn.execute("ROLLBACK")
            conn.execute("BEGIN")
        hits = store.search_history("walrus", scope=SCOPE, session_id="s")
        assert [h.metadata["row"] for h in hits] == [0]


# Scopes and sessions whose values read alike: prefixes of each other, the separator of the
# SQLite owner token (``x``), quotes, FTS5 syntax, and text whose token a stemmer would cut
# ("...ed", "...s", a final "e" after "3e").
_OWNERS = [
    (MemoryScope("acme", user="alice"), "s"),
    (MemoryScope("acme", user="alice"), "s1"),
    (MemoryScope("acme", user="alice"), 'x"s OR *'),
    (MemoryScope("acme", user="alicex"), "s"),
    (MemoryScope("acmex", user="alice"), "s"),
    (MemoryScope("acme", user="ali", thread="ce"), "s"),
    (MemoryScope("acme>", user="used"), "séance ✓"),
    (MemoryScope("acme3e", user="uses"), "séance"),
    (MemoryScope("acme"), "s"),
]


def test_a_search_finds_the_passages_of_its_session_or_scope_only(store: MemoryStore) -> None:
    """However alike their values, each session (and scope) finds its own passages only,
    and the counts its ranking reads are its own (on SQLite the full-text index matches
    each owner's token: :data:`protoprompt.memory._sqlite.HISTORY_FTS`)."""
    from protoprompt.memory import _sqlite

    for k, (scope, session) in enumerate(_OWNERS):
        rows = [HistoryRecord(r, f"user: the walrus ledger {k} line {r}") for r in range(k + 1)]
        store.index_history(session, rows, scope=scope)
    before = _sqlite.stats["owner_matches"]
    for k, (scope, session) in enumerate(_OWNERS):
        hits = store.search_history("walrus ledger", scope=scope, session_id=session, limit=50)
        assert sorted(h.metadata["row"] for h in hits) == list(range(k + 1)), (scope, session)
        assert {h.text.split()[4] for h in hits} == {str(k)}
        backend: Any = store._backend
        total, counts = backend.history_counts(
            [("walru", "walrus")], [tuple(scope_params_of(scope))], session
        )
        assert (total, counts) == (k + 1, {"walru": k + 1})
        in_scope = [j for j, (s, _) in enumerate(_OWNERS) if s == scope]
        hits = store.search_history("walrus ledger", scope=scope, limit=50)
        assert {int(h.text.split()[4]) for h in hits} == set(in_scope), scope
    if store._backend.dialect.name == "sqlite":
        assert _sqlite.stats["owner_matches"] > before


def scope_params_of(scope: MemoryScope) -> tuple[str, ...]:
    from protoprompt.memory._checks import scope_params

    return scope_params(scope)


def test_a_sqlite_passage_moved_by_hand_is_found_under_its_new_session(tmp_path: Path) -> None:
    path = str(tmp_path / "m.db")
    with MemoryStore(path) as store:
        store.index_history("s1", [HistoryRecord(1, "user: the walrus ledger")], scope=SCOPE)
        store.index_history("s3", [HistoryRecord(1, "user: a harbor")], scope=SCOPE)
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE pp_mem_history SET session_id = 's2' WHERE session_id = 's1'")
    conn.close()
    with MemoryStore(path) as store:
        assert store.search_history("walrus", scope=SCOPE, session_id="s1") == []
        hits = store.search_history("walrus", scope=SCOPE, session_id="s2")
        assert [h.metadata["session_id"] for h in hits] == ["s2"]


def test_a_sqlite_search_guessed_on_stale_counts_finds_its_session_only(tmp_path: Path) -> None:
    """A search whose counts found its session's passages to be all the table's matches
    the text alone; when another session is written before it matches (the guess went
    stale), it still returns its own session's passages only."""
    path = str(tmp_path / "m.db")
    with MemoryStore(path) as store, MemoryStore(path) as other:
        store.index_history("s", [HistoryRecord(1, "user: the walrus ledger")], scope=SCOPE)
        assert len(store.search_history("walrus", scope=SCOPE, session_id="s")) == 1
        backend: Any = store._backend
        assert backend._whole[1] is True  # one session: its passages were all the table's
        rows = [HistoryRecord(r, f"user: walrus {r}") for r in range(5)]
        other.index_history("t", rows, scope=SCOPE)
        found = backend.history_matches(["walrus"], [scope_params_of(SCOPE)], "s", 100)
        assert [row[5] for row, _ in found] == ["s"]
        found = backend.history_search(["walrus"], [scope_params_of(SCOPE)], "s", 100)
        assert [row[5] for row, _ in found] == ["s"]
        assert len(store.search_history("walrus", scope=SCOPE, session_id="s")) == 1
        assert backend._whole[1] is False


def test_sqlite_common_words_are_those_of_the_session_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A word held by more than half of the searched session's passages is common (left
    out of the match while the question has rarer ones), however rare it is in the rest of
    the database, and a stop word always is; the counts come from the session's passages
    alone, never from the full-text vocabulary (which reads every passage of the database
    holding the word)."""
    with MemoryStore(str(tmp_path / "m.db")) as store:
        rows = [
            HistoryRecord(r, f"user: the kettle {r}" + (" and a walrus" if r % 2 else ""))
            for r in range(8)
        ]
        rows.append(HistoryRecord(20, "user: nothing else"))
        store.index_history("s1", rows, scope=SCOPE)  # kettle in 8 of 9, walrus in 4
        others = [HistoryRecord(r, f"user: a harbor {r}") for r in range(50)]
        store.index_history("s2", others, scope=SCOPE)
        backend: Any = store._backend
        terms = [("kettl", "kettle"), ("walru", "walrus")]
        scopes = [scope_params_of(SCOPE)]
        words = ["kettl", "the", "walru"]
        common, total, counts = backend.history_statistics(words, terms, scopes, "s1")
        assert (total, counts) == (9, {"kettl": 8, "walru": 4})
        assert common == {"kettl", "the"}  # 8 of 9 (8 of 59 in the database): common
        reads = _reads(store, monkeypatch)
        hits = store.search_history("the kettle and the walrus", scope=SCOPE, session_id="s1")
        assert hits and all("walrus" in h.text for h in hits)  # the rare word's passages
        assert reads and not any("pp_mem_history_vocab" in r for r in reads)
