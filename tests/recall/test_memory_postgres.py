"""MemoryStore on PostgreSQL: what is particular to that engine (the shared behaviour is in
test_memory.py, run on both engines). Needs the test server of scripts/services.sh."""

from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protoprompt import MemoryStoreError, ProtoPromptError
from protoprompt.memory import MemoryScope, MemoryStore
from protoprompt.memory._backend import is_postgres_url
from protoprompt.memory._postgres import (
    SCHEMA_VERSION,
    redact,
    search_statement,
    tsquery_literal,
    tsvector_literal,
    words,
)
from protoprompt.memory._ranking import query_pieces

psycopg = pytest.importorskip("psycopg")

ALICE = MemoryScope("acme", user="alice")
NewDb = Callable[[], str]


# --------------------------------------------------------------------- pure decisions


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Hello, World!", ["hello", "world"]),
        ("Café crème brûlée", ["cafe", "creme", "brulee"]),
        ("Москва — столица России.", ["москва", "столица", "россии"]),
        ("МОСКВА", ["москва"]),
        ("foo-bar_baz", ["foo", "bar", "baz"]),
        ("w12x3 42 3.14", ["w12x3", "42", "3", "14"]),
        ("ﬁne ＡＢＣ", ["fine", "abc"]),  # compatibility forms fold (ligature, full width)
        ("it's \\ 'quoted'", ["it", "s", "quoted"]),
        ("?!.,;  \n\t", []),
        ("東京タワー", ["東京タワー"]),
    ],
)
def test_words_fold_case_diacritics_and_split_on_non_alphanumerics(
    text: str, expected: list[str]
) -> None:
    assert words(text) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=40) | st.text(max_size=40))
def test_words_of_ascii_text_skip_the_decomposition(text: str) -> None:
    """ASCII text has nothing to decompose or drop: ``words`` finds it without NFKD (the
    common case, asserted taken), and finds what the decomposition would everywhere."""
    import unicodedata

    from protoprompt.memory import _ranking

    folded = "".join(
        ch for ch in unicodedata.normalize("NFKD", text) if not unicodedata.combining(ch)
    )
    assert words(text) == _ranking._LETTERS_DIGITS.findall(folded.lower())
    if text.isascii():
        real = _ranking.unicodedata.normalize
        try:
            _ranking.unicodedata.normalize = None  # type: ignore[assignment]
            assert words(text) == _ranking._LETTERS_DIGITS.findall(text.lower())
        finally:
            _ranking.unicodedata.normalize = real


def test_tsvector_literal_has_positions_and_limits() -> None:
    assert tsvector_literal("reset the VPN, reset it") == "'reset':1,4 'the':2 'vpn':3 'it':5"
    assert tsvector_literal("") == ""
    # positions past 16383 are stored as 16383; at most 256 positions per word
    many = tsvector_literal(" ".join(["x"] * 300 + ["filler"] * 16100 + ["y"] * 3))
    x_positions = many.split("'x':")[1].split(" ")[0].split(",")
    assert len(x_positions) == 256 and x_positions[:2] == ["1", "2"]
    assert "'y':16383" in many
    # a word over PostgreSQL's 2046-byte limit is not indexed
    assert tsvector_literal("a" * 3000 + " b") == "'b':2"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("reset VPN", "('reset') | ('vpn')"),
        ("foo-bar", "('foo' <-> 'bar')"),
        ('"unbalanced', "('unbalanced')"),
        ("NEAR(foo bar)", "('near' <-> 'foo') | ('bar')"),
        ("a:* & !b | c <-> d", "('a') | ('b') | ('c') | ('d')"),
        ("drop table x; --", "('drop') | ('table') | ('x')"),
        ("Foo foo FOO", "('foo')"),
        ("?! ...", None),
        ("a" * 3000, None),
    ],
)
def test_tsquery_literal_matches_pieces_as_phrases_never_as_syntax(
    query: str, expected: str | None
) -> None:
    assert tsquery_literal(query_pieces(query)) == expected


@pytest.mark.parametrize(
    ("target", "postgres"),
    [
        ("postgresql://u@h/db", True),
        ("postgres://h/db", True),
        ("PostgreSQL://h/db", True),
        ("postgresql+psycopg://h/db", True),
        ("postgresql+asyncpg://h/db", True),
        ("agents.db", False),
        (":memory:", False),
        ("sqlite:///x.db", False),
        ("mysql://h/db", False),
        ("./postgresql/data.db", False),
        (Path("postgresql://x"), False),
    ],
)
def test_the_url_selects_the_engine(target: object, postgres: bool) -> None:
    assert is_postgres_url(target) is postgres


def test_redact_hides_passwords() -> None:
    assert redact("postgresql://me:s3cret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redact("postgresql://db/x?password=s3cret&sslmode=require") == (
        "postgresql://db/x?password=***&sslmode=require"
    )
    assert redact("postgresql://db/x") == "postgresql://db/x"


# --------------------------------------------------------------------- the server


def test_the_store_runs_on_postgres_and_redacts_its_url(postgres_schema: NewDb) -> None:
    url = postgres_schema()
    with MemoryStore(url.replace("postgresql://", "postgresql+psycopg://", 1)) as store:
        assert store.engine == "postgresql"
        password = url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
        assert password not in repr(store) and ":***@" in repr(store)
        store.remember("the launch code is pineapple", scope=ALICE)
        assert [h.text for h in store.search("pineapple", scope=ALICE)] == [
            "the launch code is pineapple"
        ]
    with psycopg.connect(url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
        }
        assert tables == {"pp_mem_meta", "pp_mem_records", "pp_mem_profiles", "pp_mem_history"}
        indexes = dict(
            conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = current_schema()"
            ).fetchall()
        )
        assert "USING gin (tsv)" in indexes["pp_mem_records_tsv"]
        assert "USING gin (tsv)" in indexes["pp_mem_history_tsv"]
        assert conn.execute("SELECT value FROM pp_mem_meta WHERE key = 'schema'").fetchone() == (
            SCHEMA_VERSION,
        )


def test_a_huge_fact_is_stored_and_found_by_its_first_megabyte_of_words(
    postgres_schema: NewDb,
) -> None:
    """PostgreSQL keeps at most 1 MiB of words and positions per tsvector: a longer fact is
    stored whole and found by the words that fit (SQLite indexes them all)."""
    text = " ".join(f"w{i:07d}x" for i in range(120_000))  # 1.08 MB of distinct words
    with MemoryStore(postgres_schema()) as store:
        store.remember(text, scope=ALICE)
        [hit] = store.search("w0000001x", scope=ALICE)
        assert hit.text == text
        assert store.search("w0119999x", scope=ALICE) == []  # past the first megabyte


def test_the_database_persists_and_is_shared_with_other_tables(postgres_schema: NewDb) -> None:
    url = postgres_schema()
    with psycopg.connect(url, autocommit=True) as other:
        # another component (e.g. the Agents SDK's SQLAlchemySession) owns tables there too
        other.execute("CREATE TABLE agent_messages (id SERIAL PRIMARY KEY, body TEXT)")
        other.execute("INSERT INTO agent_messages (body) VALUES ('hi')")
        with MemoryStore(url) as store:
            store.index_document("d", "Persistent knowledge.", scope=ALICE, metadata={"k": "v"})
            fact = store.remember("Alice likes tea", scope=ALICE)
            store.set_profile({"name": "Alice"}, scope=ALICE)
        with MemoryStore(url) as store:
            [hit] = store.search("knowledge", scope=ALICE)
            assert (hit.doc_id, hit.metadata, hit.span) == ("d", {"k": "v"}, (0, 21))
            assert [f.fact_id for f in store.facts(scope=ALICE)] == [fact]
            assert store.get_profile(scope=ALICE) == "name: Alice"
        assert other.execute("SELECT body FROM agent_messages").fetchall() == [("hi",)]


def test_an_unreachable_server_is_a_memory_store_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    with pytest.raises(MemoryStoreError, match="PostgreSQL") as info:
        MemoryStore(f"postgresql://nobody:pw@127.0.0.1:{port}/x?connect_timeout=5")
    err = info.value
    assert isinstance(err, ProtoPromptError) and isinstance(err, RuntimeError)
    assert isinstance(err.__cause__, psycopg.OperationalError)
    assert "pw" not in str(err).replace("PostgreSQL", "")
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MemoryStoreError and str(again) == str(err)


def test_a_bad_login_is_a_memory_store_error(postgres_url: str) -> None:
    parts = postgres_url.split("://", 1)[1]
    host = parts.split("@", 1)[1]
    with pytest.raises(MemoryStoreError, match="password authentication failed"):
        MemoryStore(f"postgresql://protoprompt:wrong@{host}")


def test_a_database_of_another_schema_version_is_refused(postgres_schema: NewDb) -> None:
    url = postgres_schema()
    MemoryStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE pp_mem_meta SET value = '999' WHERE key = 'schema'")
    with pytest.raises(MemoryStoreError, match="schema version '999'"):
        MemoryStore(url)


def test_a_failed_statement_changes_nothing(postgres_schema: NewDb) -> None:
    url = postgres_schema()
    with MemoryStore(url) as store:
        store.index_document("d", "first version", scope=ALICE)
        with psycopg.connect(url, autocommit=True) as conn:
            # a constraint the next write breaks in the middle of its transaction
            conn.execute(
                "ALTER TABLE pp_mem_records ADD CONSTRAINT short CHECK (length(text) < 40)"
            )
        with pytest.raises(MemoryStoreError, match="short"):
            store.index_document("d", "new. " + "x" * 50, scope=ALICE, metadata={"v": 2})
        # the old version is still there, whole
        assert [h.text for h in store.search("first", scope=ALICE)] == ["first version"]
        store.remember("still works", scope=ALICE)


def test_connections_the_server_dropped_are_replaced(postgres_schema: NewDb) -> None:
    """A restart, a failover or an idle timeout closes the store's connections under it: the
    next call gets a new one (the pool checks a connection before handing it out)."""
    url = postgres_schema()
    with MemoryStore(url) as store:
        store.remember("before the drop", scope=ALICE)
        pool = store._backend._connections()
        with pool.connection() as conn:
            pid = conn.info.backend_pid
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            while admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone() != (0,):
                time.sleep(0.01)
        store.remember("after the drop", scope=ALICE)
        assert {f.text for f in store.facts(scope=ALICE)} == {"before the drop", "after the drop"}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_uses_connections_of_its_own(postgres_schema: NewDb) -> None:
    with MemoryStore(postgres_schema()) as store:
        store.remember("before the fork", scope=ALICE)
        pid = os.fork()
        if pid == 0:  # the child: its own pool; the parent's connections are not touched
            code = 1
            try:
                store.remember("from the child", scope=ALICE)
                code = 0 if len(store.facts(scope=ALICE)) == 2 else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the parent's pooled connection still works (the child did not close it)
        assert {f.text for f in store.facts(scope=ALICE)} == {"before the fork", "from the child"}


# --------------------------------------------------------------------- many processes

_WORKER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from protoprompt.memory import MemoryScope, MemoryStore

    url, worker, writes, go = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    while not go.exists():
        time.sleep(0.005)
    shared = MemoryScope("acme", user="shared")
    own = MemoryScope("acme", user="alice", thread=f"w{worker}")
    # all start together: the tables are created once
    with MemoryStore(url, chunk_words=5, chunk_overlap=0) as store:
        ids, mixed = [], []
        for i in range(writes):
            # every worker replaces the same shared documents, many times over
            text = "\\n\\n".join(f"shared{i % 2} by w{worker} part {p}." for p in range(4))
            store.index_document(f"shared{i % 2}", text, scope=shared)
            # what any reader sees at any time: one writer's whole version, once
            seen = store.search(f"shared{i % 2}", scope=shared, limit=100)
            authors = {h.text.split(" by ")[1].split(" ")[0] for h in seen}
            if len(authors) != 1 or sorted(h.chunk_index for h in seen) != [0, 1, 2, 3]:
                mixed.append(sorted(h.text for h in seen))
            ids.append(store.remember(f"token w{worker}x{i} fact", scope=own))
            store.index_document(f"doc{i}", f"token w{worker}x{i} document", scope=own)
            store.set_profile(f"profile by w{worker} #{i}", scope=shared)
        store.forget(scope=own, fact_id=ids[0])
    print(json.dumps({"ids": ids, "mixed": mixed}))
    """
)


def test_writers_in_several_processes(postgres_schema: NewDb, tmp_path: Path) -> None:
    """Several processes start on an empty database at the same moment (the tables are
    created once) and write at once: their own facts and documents, the same shared
    documents replaced over and over (never two versions mixed), one shared profile."""
    url = postgres_schema()
    go = tmp_path / "go"
    workers, writes = 4, 15
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, url, str(w), str(writes), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    time.sleep(0.5)  # let every interpreter start and wait for the signal
    go.touch()
    outputs = [p.communicate(timeout=180) for p in procs]
    for proc, (_, err) in zip(procs, outputs):
        assert proc.returncode == 0, err
    reports = [json.loads(out) for out, _ in outputs]
    assert [r["mixed"] for r in reports] == [[]] * workers
    fact_ids = [r["ids"] for r in reports]

    shared = MemoryScope("acme", user="shared")
    with MemoryStore(url) as store:
        for w in range(workers):
            scope = ALICE.with_thread(f"w{w}")
            assert [f.fact_id for f in store.facts(scope=scope)] == fact_ids[w][1:][::-1]
            hits = store.search("token", scope=scope, limit=1000)
            assert len(hits) == 2 * writes - 1
        for n in range(2):
            chunks = store.search(f"shared{n}", scope=shared, limit=100)
            # one version: one writer's whole document (4 chunks), once
            assert {h.doc_id for h in chunks} == {f"shared{n}"}
            authors = {h.text.split(" by ")[1].split(" ")[0] for h in chunks}
            assert len(authors) == 1, authors
            assert sorted(h.chunk_index for h in chunks) == [0, 1, 2, 3]
        profile = store.get_profile(scope=shared)
        assert profile is not None and profile.startswith("profile by w")
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT key, value FROM pp_mem_meta ORDER BY key").fetchall()
        assert rows == [("history_terms", "porter"), ("schema", "1")]


# --------------------------------------------------------------------- one contract

_VOCABULARY = ["alpha", "beta", "Gamma", "café", "cafe", "Москва", "столица", "x1", "42", "über"]


@settings(max_examples=25, deadline=None)
@given(
    records=st.lists(
        st.lists(st.sampled_from(_VOCABULARY), min_size=1, max_size=8).map(" ".join),
        min_size=1,
        max_size=12,
    ),
    queries=st.lists(
        st.lists(st.sampled_from([*_VOCABULARY, "-", "NEAR", '"', "alpha-beta"]), max_size=4).map(
            " ".join
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_both_engines_find_the_same_records(
    postgres_url: str, records: list[str], queries: list[str]
) -> None:
    """The same records and queries: SQLite and PostgreSQL match the same records (their
    relevance functions differ, so only the sets are compared), phrases included."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        schema = f"pp_prop_{os.getpid()}_{time.monotonic_ns()}"
        conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            url = f"{postgres_url}?options=-csearch_path%3D{schema}"
            with MemoryStore() as lite, MemoryStore(url) as pg:
                for text in records:
                    assert lite.remember(text, scope=ALICE)
                    pg.remember(text, scope=ALICE)
                for query in queries:
                    found = [
                        sorted(h.text for h in store.search(query, scope=ALICE, limit=100))
                        for store in (lite, pg)
                    ]
                    assert found[0] == found[1], query
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def test_a_scoped_search_reads_through_an_index_not_the_whole_table(
    postgres_schema: NewDb,
) -> None:
    """The search the store runs, on a table of many scopes: the plan reads the scope's
    rows through an index (the scope B-tree or the GIN index), never the whole table."""
    url = postgres_schema()
    words_ = ["apple", "banana", "cherry", "damson", "elder", "fig", "grape", "hazel"]
    with MemoryStore(url, chunk_words=5, chunk_overlap=0) as store:
        for i in range(50):
            text = "\n\n".join(
                " ".join(words_[(i + p + k) % 8] for k in range(5)) + "." for p in range(100)
            )
            store.index_document("doc", text, scope=MemoryScope("acme", user=f"u{i}"))
        hits = store.search("apple fig", scope=MemoryScope("acme", user="u7"), limit=5)
        assert len(hits) == 5 and {h.scope.user for h in hits} == {"u7"}
    query = tsquery_literal(query_pieces("apple fig"))
    assert query is not None
    sql, params = search_statement(query, ["document", "fact"], [("acme", "u7", "", "")], 32)
    with psycopg.connect(url) as conn:
        conn.execute("ANALYZE pp_mem_records")
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + sql, params))
    assert "Seq Scan" not in plan, plan
    assert "pp_mem_records_scope" in plan or "pp_mem_records_tsv" in plan, plan


# --------------------------------------------------------------------- vectors


def _pgvector() -> bool:
    return os.environ.get("PROTOPROMPT_TEST_PGVECTOR") == "1"


def _need_pgvector() -> None:
    if not _pgvector():
        pytest.skip(
            "the test server has no pgvector (Debian 12 ships no postgresql-15-pgvector): "
            "MemoryStore ranks vectors in the client there, as test_memory.py's hybrid "
            "tests show"
        )


def _embed(batch: list[str]) -> list[list[float]]:
    from test_memory import bow_embedder

    return bow_embedder(batch)


DOCS = {
    "garage": "Our garage repairs cars and replaces car engines.",
    "bakery": "The bakery sells fresh bread every morning.",
    "vet": "The vet treats every kitten and feline patient.",
    "dealer": "The dealer sells a used automobile or a new vehicle.",
}


def test_vectors_are_ranked_where_the_database_can(postgres_schema: NewDb) -> None:
    """With pgvector in the database the server ranks vectors (no vector is sent to the
    client), else the client does; both give the SQLite store's ranking."""
    with (
        MemoryStore(postgres_schema(), embedder=_embed) as pg,
        MemoryStore(embedder=_embed) as lite,
    ):
        assert pg.vector_ranking == ("pgvector" if _pgvector() else "client")
        assert lite.vector_ranking == "client"
        for store in (pg, lite):
            for doc_id, text in DOCS.items():
                store.index_document(doc_id, text, scope=ALICE)
            store.remember("Alice owns a kitten and a car", scope=ALICE)
        if _pgvector():
            # the fast path: every record has its server-side vector, none goes to the client
            assert pg._backend.embedded(["document", "fact"], [("acme", "alice", "", "")]) == []
        for query in ("automobile", "feline", "bread vehicle", "cat car"):
            got = {
                name: [
                    (h.doc_id, h.fact_id is not None, h.score) for h in s.search(query, scope=ALICE)
                ]
                for name, s in (("pg", pg), ("lite", lite))
            }
            assert [g[:2] for g in got["pg"]] == [g[:2] for g in got["lite"]], query
            for (_, _, a), (_, _, b) in zip(got["pg"], got["lite"]):
                assert a == pytest.approx(b, rel=1e-5), query


def test_pgvector_ranks_records_with_and_without_a_server_vector_together(
    postgres_schema: NewDb,
) -> None:
    """Records another store wrote without the ``vec`` column's value (an older protoprompt,
    or written before the extension was created) are ranked in the client and merged; other
    lengths and zero vectors never match."""
    _need_pgvector()
    url = postgres_schema()
    with MemoryStore(url, embedder=_embed) as store, MemoryStore(embedder=_embed) as lite:
        for s in (store, lite):
            for doc_id, text in DOCS.items():
                s.index_document(doc_id, text, scope=ALICE)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE pp_mem_records SET vec = NULL WHERE doc_id IN ('garage', 'vet')")
        assert {
            r[0][6] for r in store._backend.embedded(["document"], [("acme", "alice", "", "")])
        } == {
            "garage",
            "vet",
        }
        for query in ("automobile", "feline", "bread vehicle"):
            assert [h.doc_id for h in store.search(query, scope=ALICE)] == [
                h.doc_id for h in lite.search(query, scope=ALICE)
            ], query
    # another embedder's length, and a zero vector: cosine 0 (no match), on the server too
    with MemoryStore(url, embedder=lambda b: [[0.0, 0.0, 1.0] for _ in b]) as three:
        three.remember("three dimensions", scope=ALICE)
    with MemoryStore(url, embedder=lambda b: [[0.0] * 64 for _ in b]) as zero:
        zero.remember("all zeros", scope=ALICE)
        with MemoryStore(url, embedder=_embed) as store:
            texts = {h.text for h in store.search("automobile three zeros", scope=ALICE, limit=50)}
            assert "three dimensions" in texts and "all zeros" in texts  # by their words only
            assert [h.text for h in store.search("automobile", scope=ALICE)] == [
                DOCS["dealer"],
                DOCS["garage"],
            ]


def test_a_foreign_vec_column_is_ignored(postgres_schema: NewDb) -> None:
    """A ``vec`` column of another type (not pgvector's) is not trusted: vectors are ranked in
    the client, and the store works."""
    url = postgres_schema()
    MemoryStore(url).close()
    with psycopg.connect(url, autocommit=True) as conn:
        if _pgvector():
            conn.execute("ALTER TABLE pp_mem_records DROP COLUMN vec")
        conn.execute("ALTER TABLE pp_mem_records ADD COLUMN vec TEXT")
    with MemoryStore(url, embedder=_embed) as store:
        assert store.vector_ranking == "client"
        store.index_document("garage", DOCS["garage"], scope=ALICE)
        assert [h.doc_id for h in store.search("automobile", scope=ALICE)] == ["garage"]


def test_pgvector_hands_over_the_best_candidates_of_a_large_scope(
    postgres_schema: NewDb,
) -> None:
    """More vectors in the scope than a search's candidate pool: the server's pool is the
    best one, so the result equals the client's ranking over every vector."""
    _need_pgvector()
    import random

    rng = random.Random(5)
    vocabulary = ["car", "cat", "bread", "engine", "kitten", "garage", "lease", "pump", "tyre"]
    facts = [" ".join(rng.choices(vocabulary, k=6)) + f" n{i}" for i in range(150)]
    with (
        MemoryStore(postgres_schema(), embedder=_embed) as pg,
        MemoryStore(embedder=_embed) as lite,
    ):
        for store in (pg, lite):
            for text in facts:
                store.remember(text, scope=ALICE)
        for query in ("automobile feline", "vehicle", "auto"):  # no word of theirs matches
            got = [[h.text for h in s.search(query, scope=ALICE, limit=5)] for s in (pg, lite)]
            assert got[0] == got[1] and len(got[0]) == 5, query


def test_a_read_only_store_never_changes_the_database(
    postgres_schema: Callable[[], str],
) -> None:
    """Issue 22 #7 on PostgreSQL: no schema is created, writes are refused (by the store and
    by the server's read-only sessions), a database without the tables reads as empty, and
    tables a writer creates later are read."""
    url = postgres_schema()
    scope = MemoryScope("acme", user="alice")

    def tables() -> list[str]:
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        return sorted(r[0] for r in rows)

    with MemoryStore(url, read_only=True) as ro:
        assert ro.read_only
        assert ro.search("anything", scope=scope) == []
        assert ro.facts(scope=scope) == [] and ro.get_profile(scope=scope) is None
        with pytest.raises(PermissionError):
            ro.remember("no", scope=scope)
        with pytest.raises(PermissionError):
            ro.clear_profile(scope=scope)
    assert tables() == []
    with MemoryStore(url) as rw:
        rw.remember("Alice likes tea.", scope=scope)
        rw.set_profile("Alice, a lawyer", scope=scope)
    with MemoryStore(url, read_only=True) as ro:
        assert [h.text for h in ro.facts(scope=scope)] == ["Alice likes tea."]
        assert ro.get_profile(scope=scope) == "Alice, a lawyer"
        # The server refuses a write on the store's own sessions too.
        with pytest.raises(MemoryStoreError, match="read-only"):
            ro._backend._read("INSERT INTO pp_mem_meta (key, value) VALUES ('x', 'y')", ())


def test_clear_profile_leaves_the_parent_profile_visible(
    postgres_schema: Callable[[], str],
) -> None:
    """Issue 22 #10 on PostgreSQL: clearing means no own profile."""
    url = postgres_schema()
    parent, child = MemoryScope("acme", user="alice"), MemoryScope("acme", user="alice", thread="t")
    with MemoryStore(url) as store:
        store.set_profile("parent", scope=parent)
        store.set_profile("child", scope=child)
        assert store.clear_profile(scope=child) is True
        assert store.clear_profile(scope=child) is False
        assert store.get_profile(scope=child, include_parents=True) == "parent"
        assert store.get_profile(scope=child) is None


# --------------------------------------------------------------------- writes that wait


def _hold_history_lock(store: MemoryStore, session_id: str) -> psycopg.Connection[Any]:
    """Another connection (another host) holds the lock of ``session_id``'s history rows."""
    from protoprompt.memory._pg_schema import LOCK_CLASS
    from protoprompt.memory._pg_sql import lock_key

    holder = psycopg.connect(store._backend._url, autocommit=True)  # type: ignore[attr-defined]
    key = lock_key(("acme", "alice", "", ""), "\x1fhistory\x1f" + session_id)
    holder.execute("SELECT pg_advisory_lock(%s, %s)", (LOCK_CLASS, key))
    return holder


def test_a_write_gives_up_a_lock_it_cannot_get(
    postgres_schema: NewDb, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A background index write waits for another writer's lock at most ``LOCK_TIMEOUT``
    (it waited for ever: a host that hung holding it stopped recall indexing for good)."""
    import threading

    from protoprompt.memory import HistoryRecord, _postgres

    monkeypatch.setattr(_postgres, "LOCK_TIMEOUT", 0.5)
    with MemoryStore(postgres_schema()) as store:
        holder = _hold_history_lock(store, "s")
        failed: list[BaseException] = []

        def write() -> None:
            try:
                store.index_history("s", [HistoryRecord(0, "user: hi")], scope=ALICE)
            except BaseException as exc:  # noqa: BLE001 - what the test looks at
                failed.append(exc)

        writer = threading.Thread(target=write)
        try:
            writer.start()
            writer.join(timeout=10)
            assert not writer.is_alive(), "the write still waits"
        finally:
            holder.close()
            writer.join(timeout=30)
        assert len(failed) == 1 and isinstance(failed[0], MemoryStoreError)
        assert "lock timeout" in str(failed[0])
        assert store.history_rows("s", scope=ALICE) == {}  # a failed write changes nothing


def test_reads_never_wait_for_writes_that_wait_for_a_lock(postgres_schema: NewDb) -> None:
    """As many writes as the store has connections wait for another writer's lock: a
    search still finds a connection at once (the writes take all but one)."""
    import threading

    from protoprompt.memory import HistoryRecord
    from protoprompt.memory._postgres import MAX_CONNECTIONS

    with MemoryStore(postgres_schema()) as store:
        store.index_history("t", [HistoryRecord(0, "user: the walrus is 48213")], scope=ALICE)
        holder = _hold_history_lock(store, "s")
        writers = [
            threading.Thread(
                target=store.index_history,
                args=("s", [HistoryRecord(k, f"user: row {k}")]),
                kwargs={"scope": ALICE},
            )
            for k in range(MAX_CONNECTIONS)
        ]
        try:
            for w in writers:
                w.start()
            time.sleep(0.5)
            assert all(w.is_alive() for w in writers)
            started = time.monotonic()
            hits = store.search_history("walrus", scope=ALICE)
            assert [h.metadata["row"] for h in hits] == [0]
            assert time.monotonic() - started < 2.0
        finally:
            holder.close()
            for w in writers:
                w.join(timeout=30)
        assert len(store.history_rows("s", scope=ALICE)) == MAX_CONNECTIONS
