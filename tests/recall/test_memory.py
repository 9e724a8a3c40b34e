"""Behavioural tests for protoprompt.memory (scoped long-term memory), each on SQLite and
on PostgreSQL (the ``engine`` fixture of conftest.py; PostgreSQL from scripts/services.sh)."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protoprompt.memory import MemoryHit, MemoryScope, MemoryStore
from protoprompt.memory.store import chunk_spans, fts_query

ACME = MemoryScope("acme")
ALICE = MemoryScope("acme", user="alice")
BOB = MemoryScope("acme", user="bob")
GLOBEX_ALICE = MemoryScope("globex", user="alice")


NewDb = Callable[[], str]


@pytest.fixture
def store(new_db: NewDb) -> Iterator[MemoryStore]:
    with MemoryStore(new_db()) as s:
        yield s


def texts(hits: list[MemoryHit]) -> list[str]:
    return [h.text for h in hits]


# --------------------------------------------------------------------- tiny embedder

_SYNONYMS = {"automobile": "car", "vehicle": "car", "auto": "car", "kitten": "cat", "feline": "cat"}


def bow_embedder(batch: list[str]) -> list[list[float]]:
    """Deterministic bag-of-words hashing embedder (64 dims) with a synonym table."""
    out = []
    for text in batch:
        vec = [0.0] * 64
        for word in re.findall(r"\w+", text.lower()):
            word = word.rstrip("s") if len(word) > 3 else word
            word = _SYNONYMS.get(word, word)
            vec[zlib.crc32(word.encode()) % 64] += 1.0
        out.append(vec)
    return out


# --------------------------------------------------------------------- scope


def test_scope_validation_names_the_field() -> None:
    with pytest.raises(ValueError, match="tenant"):
        MemoryScope("")
    with pytest.raises(TypeError, match="tenant"):
        MemoryScope(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="user"):
        MemoryScope("acme", user=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="thread"):
        MemoryScope("acme", thread="")
    with pytest.raises(ValueError, match="kind"):
        MemoryScope("acme", kind="a\x00b")
    with pytest.raises(ValueError, match="tenant"):
        MemoryScope("ac\x00me")


def test_scope_helpers_and_ancestors() -> None:
    scope = ALICE.with_thread("t1").with_kind("notes")
    assert scope.key() == ("acme", "alice", "t1", "notes")
    assert scope.with_kind(None) == MemoryScope("acme", "alice", "t1")
    assert ALICE.key() == ("acme", "alice", None, None)
    assert scope.ancestors() == (ACME, ALICE, ALICE.with_thread("t1"))
    assert ACME.ancestors() == ()
    assert MemoryScope("acme", thread="t").ancestors() == (ACME,)
    assert hash(ALICE) == hash(MemoryScope("acme", "alice"))
    with pytest.raises(ValueError, match="thread"):
        ALICE.with_thread("")


# --------------------------------------------------------------------- isolation


def test_two_tenants_same_doc_id_are_isolated(store: MemoryStore) -> None:
    store.index_document("handbook", "Acme vacation policy: twenty days.", scope=ALICE)
    store.index_document("handbook", "Globex vacation policy: five days.", scope=GLOBEX_ALICE)

    assert texts(store.search("vacation policy", scope=ALICE)) == [
        "Acme vacation policy: twenty days."
    ]
    assert texts(store.search("vacation policy", scope=GLOBEX_ALICE)) == [
        "Globex vacation policy: five days."
    ]
    assert store.search("Globex", scope=ALICE) == []

    # re-indexing or forgetting in one tenant leaves the other alone
    store.index_document("handbook", "Acme vacation policy: thirty days.", scope=ALICE)
    assert store.forget(scope=GLOBEX_ALICE, doc_id="handbook") == 1
    assert texts(store.search("vacation", scope=ALICE)) == ["Acme vacation policy: thirty days."]
    assert store.search("vacation", scope=GLOBEX_ALICE) == []


def test_sibling_threads_and_users_are_isolated(store: MemoryStore) -> None:
    t1, t2 = ALICE.with_thread("t1"), ALICE.with_thread("t2")
    store.remember("the launch code is pineapple", scope=t1)
    store.remember("the launch code is mango", scope=t2)
    store.remember("bob's launch code is kiwi", scope=BOB)

    assert texts(store.search("launch code", scope=t1)) == ["the launch code is pineapple"]
    assert texts(store.search("launch code", scope=t2)) == ["the launch code is mango"]
    # a parent scope never sees narrower (child) scopes, even with include_parents
    assert store.search("launch code", scope=ALICE) == []
    assert store.search("launch code", scope=ALICE, include_parents=True) == []
    assert store.facts(scope=ACME) == []
    # kind is part of the scope as well
    assert store.search("launch", scope=t1.with_kind("notes")) == []


def test_include_parents_sees_ancestors_but_never_siblings(store: MemoryStore) -> None:
    leaf = ALICE.with_thread("t1").with_kind("notes")
    store.remember("tenant wide: office closes at six", scope=ACME)
    store.remember("alice: office badge number 42", scope=ALICE)
    store.remember("thread: office move planned", scope=ALICE.with_thread("t1"))
    store.remember("leaf: office plants need water", scope=leaf)
    store.remember("sibling thread: office party", scope=ALICE.with_thread("t2"))
    store.remember("sibling kind: office printer", scope=ALICE.with_thread("t1").with_kind("todo"))
    store.remember("sibling user: office keys", scope=BOB)
    store.remember("other tenant: office secrets", scope=MemoryScope("globex"))
    store.remember("other tenant user: office secrets", scope=GLOBEX_ALICE)

    assert texts(store.search("office", scope=leaf)) == ["leaf: office plants need water"]
    visible = set(texts(store.search("office", scope=leaf, include_parents=True, limit=50)))
    assert visible == {
        "tenant wide: office closes at six",
        "alice: office badge number 42",
        "thread: office move planned",
        "leaf: office plants need water",
    }
    facts = store.facts(scope=leaf, include_parents=True)
    assert {f.text for f in facts} == visible
    assert {f.scope for f in facts} == {ACME, ALICE, ALICE.with_thread("t1"), leaf}


def test_search_kinds_filter(store: MemoryStore) -> None:
    store.index_document("d", "Zebras are striped.", scope=ALICE)
    store.remember("Alice saw zebras at the zoo.", scope=ALICE)
    assert {h.kind for h in store.search("zebras", scope=ALICE)} == {"document", "fact"}
    assert [h.kind for h in store.search("zebras", scope=ALICE, kinds=["fact"])] == ["fact"]
    assert [h.kind for h in store.search("zebras", scope=ALICE, kinds=("document",))] == [
        "document"
    ]
    assert store.search("zebras", scope=ALICE, kinds=()) == []


# --------------------------------------------------------------------- indexing


def test_reindex_replaces_previous_version(store: MemoryStore) -> None:
    long_text = " ".join(f"word{i}" for i in range(300)) + " obsolete"
    assert store.index_document("doc", long_text, scope=ALICE) > 1
    assert store.search("obsolete", scope=ALICE)
    assert store.index_document("doc", "Fresh content only.", scope=ALICE, metadata={"v": 2}) == 1
    assert store.search("obsolete", scope=ALICE) == []
    assert store.search("word5", scope=ALICE) == []
    [hit] = store.search("fresh", scope=ALICE)
    assert (hit.doc_id, hit.chunk_index, hit.metadata) == ("doc", 0, {"v": 2})


def test_chunks_keep_order_offsets_and_metadata(new_db: NewDb) -> None:
    text = "\n\n".join(
        " ".join(f"p{p}w{i}" for i in range(25)) + "." for p in range(6)
    )  # 6 paragraphs of 25 words
    with MemoryStore(new_db(), chunk_words=40, chunk_overlap=5) as store:
        n = store.index_document("doc", text, scope=ALICE, metadata={"source": "wiki"})
        hits = store.search(" ".join(f"p{p}w3" for p in range(6)), scope=ALICE, limit=50)
    assert len(hits) == n >= 4
    for hit in hits:
        assert hit.span is not None
        start, end = hit.span
        assert text[start:end] == hit.text
        assert hit.metadata == {"source": "wiki"}
    by_index = sorted(hits, key=lambda h: h.chunk_index or 0)
    assert [h.chunk_index for h in by_index] == list(range(n))
    starts = [h.span[0] for h in by_index if h.span]
    assert starts == sorted(starts)
    # paragraph boundaries are preferred: every chunk ends at the end of a paragraph
    assert all(h.text.endswith(".") for h in by_index)


def test_chunker_prefers_sentence_ends_and_overlaps() -> None:
    text = "One two three. Four five six seven. Eight nine ten eleven twelve."
    spans = chunk_spans(text, 6, 2)
    chunks = [text[s:e] for s, e in spans]
    assert chunks[0] == "One two three."
    assert chunks[-1].endswith("twelve.")
    assert chunk_spans("   \n ", 5, 1) == []


@settings(max_examples=100, deadline=None)
@given(
    words=st.lists(st.sampled_from(["a", "b.", "c!", "d", "\n\ne", "f?", "g"]), max_size=120),
    chunk_words=st.integers(1, 30),
    data=st.data(),
)
def test_chunker_properties(words: list[str], chunk_words: int, data: st.DataObject) -> None:
    overlap = data.draw(st.integers(0, chunk_words - 1))
    text = " ".join(words)
    spans = chunk_spans(text, chunk_words, overlap)
    all_words = [m.span() for m in re.finditer(r"\S+", text)]
    if not all_words:
        assert spans == []
        return
    n = len(all_words)

    def strength(i: int) -> int:
        """The boundary after word ``i``: 2 paragraph break (or the end), 1 sentence end."""
        if i == n - 1 or "\n\n" in text[all_words[i][1] : all_words[i + 1][0]]:
            return 2
        return 1 if text[all_words[i][1] - 1] in ".!?" else 0

    covered: set[tuple[int, int]] = set()
    first = 0
    for number, (start, end) in enumerate(spans):
        inside = [w for w in all_words if start <= w[0] and w[1] <= end]
        assert inside[0][0] == start and inside[-1][1] == end
        covered.update(inside)
        # Each window starts where the rule says and is cut exactly where it says: after
        # chunk_words words, or at the latest strongest boundary in its second half.
        assert all_words.index(inside[0]) == first
        stop = first + len(inside)
        if number == len(spans) - 1:
            assert stop == n and len(inside) <= chunk_words
            break
        cuts = range(first + max(1, chunk_words // 2), first + chunk_words + 1)
        best = max(strength(c - 1) for c in cuts)
        assert stop == (max(c for c in cuts if strength(c - 1) == best) if best else cuts[-1])
        # The next one starts overlap words back, moved on to a sentence start if one is there.
        back = max(stop - overlap, first + 1)
        first = next((c for c in range(back, stop) if strength(c - 1)), back)
    assert covered == set(all_words)
    assert [s for s, _ in spans] == sorted({s for s, _ in spans})  # strictly increasing


# --------------------------------------------------------------------- ranking / queries


def test_relevant_chunk_ranks_first(new_db: NewDb) -> None:
    paragraphs = [
        "The cafeteria serves lunch from noon until two in the afternoon.",
        "Parking permits are issued by the facilities team every January.",
        "To reset your VPN password open the portal and choose reset password.",
        "The library lends books for three weeks and charges small fines.",
    ]
    with MemoryStore(new_db(), chunk_words=12, chunk_overlap=0) as store:
        assert store.index_document("faq", "\n\n".join(paragraphs), scope=ALICE) == 4
        hits = store.search("how do I reset my VPN password?", scope=ALICE)
    assert hits[0].text == paragraphs[2]
    assert hits[0].chunk_index == 2
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))
    assert hits[0].score > 0


def test_russian_text_is_searchable(store: MemoryStore) -> None:
    store.index_document("ru", "Москва — столица России. Погода сегодня солнечная.", scope=ALICE)
    store.index_document("en", "London is the capital of the United Kingdom.", scope=ALICE)
    store.remember("Пользователь предпочитает отвечать по-русски", scope=ALICE)
    assert [h.doc_id for h in store.search("столица", scope=ALICE)] == ["ru"]
    assert [h.doc_id for h in store.search("МОСКВА", scope=ALICE)] == ["ru"]
    assert texts(store.search("предпочитает", scope=ALICE)) == [
        "Пользователь предпочитает отвечать по-русски"
    ]
    # diacritics are folded for Latin scripts
    store.remember("Meet at the café near the gare", scope=BOB)
    assert store.search("cafe", scope=BOB)


@pytest.mark.parametrize(
    "query",
    [
        '"unbalanced',
        'say "hello" world',
        "foo*",
        "*",
        "NEAR(foo bar)",
        "foo NEAR bar",
        "-foo",
        "foo - bar",
        "title:foo",
        ":",
        "AND OR NOT",
        "a AND (b OR",
        "^foo +bar {x y}",
        'col:val* NOT "x" NEAR/2',
        "drop table pp_mem_records; --",
        "\x00nul",
    ],
)
def test_fts_syntax_in_queries_is_safe(store: MemoryStore, query: str) -> None:
    store.index_document("d", "foo bar baz hello world title val nul", scope=ALICE)
    hits = store.search(query, scope=ALICE)
    assert isinstance(hits, list)


def test_fts_operators_are_matched_literally(store: MemoryStore) -> None:
    store.remember("use the NEAR keyword", scope=ALICE)
    store.remember("unrelated fact", scope=ALICE)
    assert texts(store.search("NEAR", scope=ALICE)) == ["use the NEAR keyword"]
    assert texts(store.search("NOT", scope=ALICE)) == []


@pytest.mark.parametrize("query", ["", "   ", "?!.,;", '"" *** -- ::', "\n\t"])
def test_empty_or_punctuation_query_returns_nothing(store: MemoryStore, query: str) -> None:
    store.remember("anything at all", scope=ALICE)
    assert fts_query(query) is None
    assert store.search(query, scope=ALICE) == []


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    query=st.text(
        st.characters(codec="utf-8") | st.sampled_from('"*:-()^+{}\x00\ud800'), max_size=60
    )
)
def test_arbitrary_queries_never_raise(store: MemoryStore, query: str) -> None:
    store.index_document("d", "alpha beta gamma", scope=ALICE)
    hits = store.search(query, scope=ALICE)
    assert all(h.scope == ALICE for h in hits)


# --------------------------------------------------------------------- hybrid


def test_hybrid_finds_semantic_match_without_lexical_overlap(new_db: NewDb) -> None:
    docs = {
        "garage": "Our garage repairs cars and replaces car engines.",
        "bakery": "The bakery sells fresh bread every morning.",
    }
    with MemoryStore(new_db()) as plain, MemoryStore(new_db(), embedder=bow_embedder) as hybrid:
        for store in (plain, hybrid):
            for doc_id, text in docs.items():
                store.index_document(doc_id, text, scope=ALICE)
            store.remember("Alice owns a kitten", scope=ALICE)
        assert plain.search("automobile", scope=ALICE) == []
        hits = hybrid.search("automobile", scope=ALICE)
        assert [h.doc_id for h in hits] == ["garage"]
        assert 0 < hits[0].score <= 1.0  # vector-only: cosine similarity
        assert texts(hybrid.search("feline", scope=ALICE)) == ["Alice owns a kitten"]
        # vectors are scoped too
        assert hybrid.search("automobile", scope=BOB) == []


def test_hybrid_fuses_lexical_and_semantic_rankings(new_db: NewDb) -> None:
    with MemoryStore(new_db(), embedder=bow_embedder) as store:
        store.remember("the bread is baked at dawn", scope=ALICE)
        store.remember("my automobile needs new tyres", scope=ALICE)
        store.remember("the vehicle and the bread van", scope=ALICE)
        hits = store.search("car bread", scope=ALICE)
    # the fact matching both lexically ("bread") and semantically ("vehicle"~"car") wins
    assert hits[0].text == "the vehicle and the bread van"
    assert {h.text for h in hits} == {
        "the bread is baked at dawn",
        "my automobile needs new tyres",
        "the vehicle and the bread van",
    }
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:]))


def test_bad_embedder_output_is_rejected(new_db: NewDb) -> None:
    with MemoryStore(
        new_db(), embedder=lambda batch: [[1.0]], chunk_words=2, chunk_overlap=0
    ) as store:
        with pytest.raises(ValueError, match="embedder"):
            store.index_document("d", "one. two.\n\nthree", scope=ALICE)
    with pytest.raises(TypeError, match="embedder"):
        MemoryStore(embedder="nope")  # type: ignore[arg-type]


# --------------------------------------------------------------------- facts / profile / forget


def test_facts_most_recent_first(store: MemoryStore) -> None:
    ids = [store.remember(f"fact number {i}", scope=ALICE, importance=i) for i in range(5)]
    facts = store.facts(scope=ALICE)
    assert [f.fact_id for f in facts] == ids[::-1]
    assert [f.text for f in store.facts(scope=ALICE, limit=2)] == ["fact number 4", "fact number 3"]
    assert facts[0].kind == "fact" and facts[0].metadata["importance"] == 4.0
    assert facts[0].score == 4.0
    assert len(set(ids)) == 5


def test_profile_roundtrip(store: MemoryStore) -> None:
    assert store.get_profile(scope=ALICE) is None
    store.set_profile({"name": "Alice", "language": "ru", "tz": "Europe/Moscow"}, scope=ALICE)
    assert store.get_profile(scope=ALICE) == "name: Alice\nlanguage: ru\ntz: Europe/Moscow"
    store.set_profile("Prefers short answers.", scope=ALICE)
    assert store.get_profile(scope=ALICE) == "Prefers short answers."
    assert store.get_profile(scope=BOB) is None
    assert store.get_profile(scope=GLOBEX_ALICE) is None

    thread = ALICE.with_thread("t1")
    assert store.get_profile(scope=thread) is None
    assert store.get_profile(scope=thread, include_parents=True) == "Prefers short answers."
    store.set_profile("Thread override", scope=thread)
    assert store.get_profile(scope=thread, include_parents=True) == "Thread override"
    assert store.get_profile(scope=BOB.with_thread("t1"), include_parents=True) is None
    with pytest.raises(TypeError, match="profile"):
        store.set_profile({"a": 1}, scope=ALICE)  # type: ignore[dict-item]


def test_forget_semantics(store: MemoryStore) -> None:
    thread = ALICE.with_thread("t1")
    store.index_document("d1", "one.\n\ntwo.\n\nthree.", scope=ALICE)
    store.index_document("d2", "other document", scope=ALICE)
    keep = store.remember("keep me", scope=ALICE)
    drop = store.remember("drop me", scope=ALICE)
    store.set_profile("profile", scope=ALICE)
    for scope in (ACME, thread, BOB, GLOBEX_ALICE):  # wider, narrower, sibling, other tenant
        store.index_document("d1", "one two three", scope=scope)
        store.remember("drop me", scope=scope)
        store.set_profile("profile", scope=scope)

    assert store.forget(scope=ALICE, fact_id=drop) == 1
    assert store.forget(scope=ALICE, fact_id=drop) == 0
    assert store.forget(scope=BOB, fact_id=keep) == 0  # fact ids are scoped too
    assert [f.fact_id for f in store.facts(scope=ALICE)] == [keep]

    n = store.index_document("d1", "one.\n\ntwo.\n\nthree.", scope=ALICE)
    assert store.forget(scope=ALICE, doc_id="d1") == n
    assert {h.doc_id for h in store.search("one two three other", scope=ALICE)} == {"d2"}

    # everything in exactly ALICE: d2 (1 chunk) + 1 fact + 1 profile
    assert store.forget(scope=ALICE) == 3
    assert store.search("one other keep", scope=ALICE) == []
    assert store.get_profile(scope=ALICE) is None
    assert store.forget(scope=ALICE) == 0
    for scope in (ACME, thread, BOB, GLOBEX_ALICE):
        assert {h.kind for h in store.search("one drop", scope=scope)} == {"document", "fact"}
        assert store.get_profile(scope=scope) == "profile"


# --------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    ("call", "exc", "name"),
    [
        (lambda s: s.index_document("", "text", scope=ALICE), ValueError, "doc_id"),
        (lambda s: s.index_document(5, "text", scope=ALICE), TypeError, "doc_id"),
        (lambda s: s.index_document("d", b"bytes", scope=ALICE), TypeError, "text"),
        (lambda s: s.index_document("d", "t", scope=("acme",)), TypeError, "scope"),
        (lambda s: s.index_document("d", "t", scope=ALICE, metadata=[1]), TypeError, "metadata"),
        (
            lambda s: s.index_document("d", "t", scope=ALICE, metadata={"x": object()}),
            TypeError,
            "metadata",
        ),
        (lambda s: s.remember("", scope=ALICE), ValueError, "text"),
        (lambda s: s.remember(None, scope=ALICE), TypeError, "text"),
        (lambda s: s.remember("x", scope=ALICE, importance=float("nan")), ValueError, "importance"),
        (lambda s: s.remember("x", scope="acme"), TypeError, "scope"),
        (lambda s: s.search("q", scope=ALICE, limit=0), ValueError, "limit"),
        (lambda s: s.search("q", scope=ALICE, limit=-1), ValueError, "limit"),
        (lambda s: s.search("q", scope=ALICE, limit=True), TypeError, "limit"),
        (lambda s: s.search(None, scope=ALICE), TypeError, "query"),
        (lambda s: s.search("q", scope=None), TypeError, "scope"),
        (lambda s: s.search("q", scope=ALICE, kinds="fact"), TypeError, "kinds"),
        (lambda s: s.search("q", scope=ALICE, kinds=["chunk"]), ValueError, "kinds"),
        (lambda s: s.search("q", scope=ALICE, include_parents="yes"), TypeError, "include_parents"),
        (lambda s: s.facts(scope=ALICE, limit=0), ValueError, "limit"),
        (lambda s: s.forget(scope=ALICE, doc_id=""), ValueError, "doc_id"),
        (lambda s: s.get_profile(scope={}), TypeError, "scope"),
    ],
)
def test_bad_input_is_rejected_with_a_named_argument(call, exc, name, store: MemoryStore) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc, match=name):
        call(store)


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s: s.remember("a\x00b", scope=ALICE), "text"),
        (lambda s: s.index_document("d", "a\x00b", scope=ALICE), "text"),
        (lambda s: s.index_document("d\x00", "text", scope=ALICE), "doc_id"),
        (lambda s: s.set_profile("a\x00b", scope=ALICE), "profile"),
        (lambda s: s.set_profile({"k": "a\x00b"}, scope=ALICE), "profile"),
        (lambda s: s.forget(scope=ALICE, fact_id="f\x00"), "fact_id"),
    ],
)
def test_nul_characters_are_rejected_on_every_engine(call, name, store: MemoryStore) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL text cannot hold NUL, so no engine stores it: a clear error naming the
    argument, and nothing written."""
    with pytest.raises(ValueError, match=f"{name} must not contain NUL"):
        call(store)
    assert store.facts(scope=ALICE) == [] and store.get_profile(scope=ALICE) is None
    assert store.search("a b text", scope=ALICE) == []


def test_constructor_validation() -> None:
    with pytest.raises(ValueError, match="chunk_words"):
        MemoryStore(chunk_words=0)
    with pytest.raises(ValueError, match="chunk_overlap"):
        MemoryStore(chunk_words=10, chunk_overlap=10)
    with pytest.raises(TypeError, match="chunk_overlap"):
        MemoryStore(chunk_overlap=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="path"):
        MemoryStore(5)  # type: ignore[arg-type]


def test_closed_store_raises(new_db: NewDb) -> None:
    store = MemoryStore(new_db())
    with store:
        store.remember("x", scope=ALICE)
    store.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        store.search("x", scope=ALICE)


# --------------------------------------------------------------------- persistence / sharing


def test_file_database_persists_and_shares_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    # another component (e.g. the Agents SDK's SQLiteSession) owns tables in the same file
    other = sqlite3.connect(path)
    other.execute("CREATE TABLE agent_messages (id INTEGER PRIMARY KEY, body TEXT)")
    other.execute("INSERT INTO agent_messages (body) VALUES ('hi')")
    other.commit()

    with MemoryStore(path, embedder=bow_embedder) as store:
        store.index_document(
            "d", "Persistent knowledge about cars.", scope=ALICE, metadata={"k": "v"}
        )
        fact = store.remember("Alice likes tea", scope=ALICE)
        store.set_profile({"name": "Alice"}, scope=ALICE)
        assert store.engine == "sqlite"
        assert store._backend._connection().execute("PRAGMA journal_mode").fetchone()[0] == "wal"

    with MemoryStore(str(path), embedder=bow_embedder) as store:
        [hit] = store.search("knowledge", scope=ALICE)
        assert (hit.doc_id, hit.metadata) == ("d", {"k": "v"})
        assert [f.fact_id for f in store.facts(scope=ALICE)] == [fact]
        assert store.get_profile(scope=ALICE) == "name: Alice"
        assert [h.doc_id for h in store.search("automobile", scope=ALICE)] == [
            "d"
        ]  # vectors persisted

    tables = {r[0] for r in other.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "agent_messages" in tables
    assert all(t == "agent_messages" or t.startswith("pp_mem_") for t in tables)
    assert other.execute("SELECT body FROM agent_messages").fetchall() == [("hi",)]
    other.close()


# --------------------------------------------------------------------- concurrency


def _hammer(store: MemoryStore, worker: int, writes: int) -> None:
    scope = ALICE.with_thread(f"w{worker}")
    for i in range(writes):
        if i % 2:
            store.remember(f"token w{worker}x{i} fact", scope=scope)
        else:
            store.index_document(f"doc{i}", f"token w{worker}x{i} document", scope=scope)


def _assert_all_present(store: MemoryStore, workers: int, writes: int) -> None:
    for worker in range(workers):
        scope = ALICE.with_thread(f"w{worker}")
        assert len(store.search("token", scope=scope, limit=1000)) == writes
        for i in range(writes):
            [hit] = store.search(f"w{worker}x{i}", scope=scope)
            assert hit.kind == ("fact" if i % 2 else "document")


@pytest.mark.parametrize("where", ["memory", "file"])
def test_concurrent_thread_writers(tmp_path: Path, where: str, new_db: NewDb, engine: str) -> None:
    if engine == "sqlite":
        path = ":memory:" if where == "memory" else str(tmp_path / "mem.db")
    elif where == "file":
        pytest.skip("a database file is SQLite's (the memory case covers PostgreSQL)")
    else:
        path = new_db()
    workers, writes = 8, 50
    with MemoryStore(path) as store:
        threads = [
            threading.Thread(target=_hammer, args=(store, w, writes)) for w in range(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _assert_all_present(store, workers, writes)


def test_concurrent_stores_on_one_database(tmp_path: Path, new_db: NewDb, engine: str) -> None:
    path = str(tmp_path / "mem.db") if engine == "sqlite" else new_db()
    workers, writes = 4, 25
    MemoryStore(path).close()  # create the schema once

    def run(worker: int) -> None:
        with MemoryStore(path) as own:
            _hammer(own, worker, writes)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with MemoryStore(path) as store:
        _assert_all_present(store, workers, writes)


def test_concurrent_asyncio_tasks(new_db: NewDb) -> None:
    workers, writes = 8, 50

    async def main(store: MemoryStore) -> None:
        await asyncio.gather(
            *(asyncio.to_thread(_hammer, store, w, writes) for w in range(workers)),
            *(asyncio.to_thread(store.search, "token", scope=ALICE) for _ in range(20)),
        )

    with MemoryStore(new_db()) as store:
        asyncio.run(main(store))
        _assert_all_present(store, workers, writes)
