"""The MCP memory server in process, through the ``mcp`` SDK's own client (1.x or 2.x).

Every tool and resource, read-only mode, argument errors (the server keeps serving after
each), the scope model (writes in the server's scope only, reads never outside it, whatever
the query), and ``memory_context`` against the builder it reuses.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_client import connect  # noqa: E402

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.mcp import (  # noqa: E402
    MCP_MAJOR,
    READ_TOOLS,
    TOOLS,
    MemoryLimits,
    MemoryToolError,
    MemoryTools,
    create_server,
)

ALICE = MemoryScope("acme", user="alice")
CONTRACT = (
    "Renewal. This agreement renews automatically on the first of March each year. "
    "Termination. Either party may terminate with ninety days written notice before renewal. "
    "Payment. Invoices are payable within thirty days of receipt."
)


@pytest.fixture
def store(tmp_path: Path):
    with MemoryStore(tmp_path / "memory.db", chunk_words=12, chunk_overlap=0) as s:
        yield s


def test_mcp_major_is_the_installed_sdks() -> None:
    import importlib.metadata

    assert MCP_MAJOR == int(importlib.metadata.version("mcp").split(".")[0])
    assert MCP_MAJOR in (1, 2)


async def test_tools_and_resources_are_listed_with_schemas(store: MemoryStore) -> None:
    async with connect(create_server(store, ALICE)) as client:
        tools = await client.tools()
        assert sorted(tools) == sorted(TOOLS)
        schema = (
            getattr(tools["memory_search"], "inputSchema", None)
            or tools["memory_search"].input_schema
        )
        assert schema["required"] == ["query"]
        assert schema["properties"]["top_k"]["default"] == 5
        assert schema["properties"]["top_k"]["maximum"] == MemoryLimits().max_top_k
        # No tool takes a scope: the scope is the server's.
        for tool in tools.values():
            props = (getattr(tool, "inputSchema", None) or tool.input_schema)["properties"]
            assert not {"tenant", "user", "thread", "scope", "kind"} & set(props)
        assert await client.resources() == ["memory://facts", "memory://profile"]


async def test_every_tool_round_trips(store: MemoryStore) -> None:
    async with connect(create_server(store, ALICE)) as client:
        fact = (
            await client.call("memory_remember", {"text": "Alice negotiates the Acme renewal."})
        ).data
        fact_id = fact["memory_id"]
        assert store.facts(scope=ALICE)[0].fact_id == fact_id

        indexed = (
            await client.call("memory_index_document", {"doc_id": "contract", "text": CONTRACT})
        ).data
        assert indexed == {
            "doc_id": "contract",
            "memory_id": "doc:contract",
            "chunks": len(
                store.search(
                    "renewal termination payment", scope=ALICE, kinds=("document",), limit=50
                )
            ),
        }
        assert indexed["chunks"] >= 2

        hits = (await client.call("memory_search", {"query": "renewal", "top_k": 10})).data
        assert hits["query"] == "renewal"
        by_kind = {h["kind"]: h for h in hits["hits"]}
        assert by_kind["fact"]["layer"] == "facts"
        assert by_kind["fact"]["memory_id"] == fact_id
        assert by_kind["fact"]["source"] == f"fact:{fact_id}"
        assert by_kind["document"]["layer"] == "rag"
        # The layers narrow the search by the names the hits carry (as plans name them).
        for layer, kind in (("facts", "fact"), ("rag", "document")):
            narrowed = (
                await client.call("memory_search", {"query": "renewal", "layer": layer})
            ).data
            assert narrowed["layer"] == layer and narrowed["hits"]
            assert {(h["kind"], h["layer"]) for h in narrowed["hits"]} == {(kind, layer)}
        assert by_kind["document"]["memory_id"] == "doc:contract"
        assert by_kind["document"]["source"].startswith("contract#")
        start, end = by_kind["document"]["span"]
        assert CONTRACT[start:end] == by_kind["document"]["text"]
        assert [h["rank"] for h in hits["hits"]] == list(range(1, len(hits["hits"]) + 1))
        scores = [h["score"] for h in hits["hits"]]
        assert scores == sorted(scores, reverse=True)
        # The ranking is the store's own.
        assert [h["text"] for h in hits["hits"]] == [
            h.text for h in store.search("renewal", scope=ALICE, limit=10)
        ]
        assert (
            len((await client.call("memory_search", {"query": "renewal", "top_k": 1})).data["hits"])
            == 1
        )

        assert (await client.call("memory_get_profile")).data == {"profile": None}
        assert await client.read("memory://profile") == ""
        assert (await client.call("memory_set_profile", {"profile": "Name: Alice"})).data == {
            "profile": "Name: Alice"
        }
        assert (await client.call("memory_get_profile")).data == {"profile": "Name: Alice"}
        assert await client.read("memory://profile") == "Name: Alice"
        # An object of strings is stored as key: value lines, in order.
        await client.call("memory_set_profile", {"profile": {"name": "Alice", "tone": "brief"}})
        assert store.get_profile(scope=ALICE) == "name: Alice\ntone: brief"

        listing = json.loads(await client.read("memory://facts"))
        assert listing["truncated"] is False
        assert [f["memory_id"] for f in listing["facts"]] == [fact_id]
        assert listing["facts"][0]["text"] == "Alice negotiates the Acme renewal."

        # Forget a fact (both id forms) and a whole document.
        assert (await client.call("memory_forget", {"memory_id": fact_id})).data == {
            "forgotten": fact_id,
            "deleted": 1,
        }
        assert store.facts(scope=ALICE) == []
        other = (await client.call("memory_remember", {"text": "Second fact."})).data
        assert (
            await client.call("memory_forget", {"memory_id": "fact:" + other["memory_id"]})
        ).data["deleted"] == 1
        gone = (await client.call("memory_forget", {"memory_id": "doc:contract"})).data
        assert gone == {"forgotten": "doc:contract", "deleted": indexed["chunks"]}
        assert (await client.call("memory_search", {"query": "renewal"})).data["hits"] == []

        # Clearing the profile.
        assert (await client.call("memory_set_profile", {"profile": ""})).data == {"profile": None}
        assert (await client.call("memory_get_profile")).data == {"profile": None}


async def test_reindexing_a_document_replaces_it(store: MemoryStore) -> None:
    async with connect(create_server(store, ALICE)) as client:
        await client.call("memory_index_document", {"doc_id": "d", "text": "alpha beta gamma"})
        assert (
            await client.call("memory_index_document", {"doc_id": "d", "text": "delta epsilon"})
        ).data["chunks"] == 1
        assert (await client.call("memory_search", {"query": "alpha"})).data["hits"] == []
        assert len((await client.call("memory_search", {"query": "delta"})).data["hits"]) == 1


async def test_memory_context_is_the_builders_plan(store: MemoryStore) -> None:
    store.set_profile("Alice prefers short answers.", scope=ALICE)
    store.remember("The renewal is negotiated by Alice.", scope=ALICE)
    store.index_document("contract", CONTRACT, scope=ALICE)
    async with connect(create_server(store, ALICE, model="gpt-4")) as client:
        for max_tokens in (1, 40, 80, 10_000):
            got = (
                await client.call(
                    "memory_context",
                    {"query": "When does the contract renew?", "max_tokens": max_tokens},
                )
            ).data
            builder = TokenBudgetedContextBuilder(
                store, max_tokens=max_tokens, model="gpt-4", scope=ALICE
            )
            plan = builder.build([], [], query="When does the contract renew?")
            expected = plan.context_message["content"] if plan.context_message else ""
            assert got["context"] == expected
            assert got["tokens"] == plan.context_tokens <= max_tokens
            assert got["encoding"] == "cl100k_base"
            assert [
                (b["layer"], b["source"], b["status"], b["reason"], b["tokens"])
                for b in got["blocks"]
            ] == [(b.layer, b.source, b.status, b.reason, b.tokens) for b in plan.blocks]
            assert got["kept"] + got["dropped"] == len(got["blocks"])
            # Dropped text is not shipped back: the answer stays within the budget asked for.
            assert all("text" not in b for b in got["blocks"])
        small = (await client.call("memory_context", {"query": "renewal", "max_tokens": 40})).data
        big = (await client.call("memory_context", {"query": "renewal", "max_tokens": 10_000})).data
        assert small["dropped"] > 0 and big["dropped"] == 0
        assert {b["status"] for b in small["blocks"]} == {"kept", "truncated", "dropped"}
        assert {b["layer"] for b in big["blocks"]} == {"profile", "facts", "rag"}
        # An empty query still recalls the profile and the newest facts.
        empty = (await client.call("memory_context", {"query": "", "max_tokens": 10_000})).data
        assert "Alice prefers short answers." in empty["context"]
        assert "The renewal is negotiated by Alice." in empty["context"]


async def test_read_only_server_exposes_only_reading(store: MemoryStore) -> None:
    fact_id = store.remember("Alice likes tea.", scope=ALICE)
    async with connect(create_server(store, ALICE, read_only=True)) as client:
        assert sorted(await client.tools()) == sorted(READ_TOOLS)
        assert await client.resources() == ["memory://facts", "memory://profile"]
        for name, args in (
            ("memory_remember", {"text": "x"}),
            ("memory_forget", {"memory_id": fact_id}),
            ("memory_index_document", {"doc_id": "d", "text": "x"}),
            ("memory_set_profile", {"profile": "x"}),
        ):
            reply = await client.call(name, args)
            assert reply.is_error and name in reply.text
        assert [
            h["memory_id"]
            for h in (await client.call("memory_search", {"query": "tea"})).data["hits"]
        ] == [fact_id]
    assert [h.fact_id for h in store.facts(scope=ALICE)] == [fact_id]


BAD_CALLS = [
    ("memory_search", {}, "query"),
    ("memory_search", {"query": "   "}, "query must not be empty"),
    ("memory_search", {"query": "tea", "top_k": 0}, "top_k"),
    ("memory_search", {"query": "tea", "top_k": 51}, "top_k"),
    ("memory_search", {"query": "tea", "top_k": "many"}, "top_k"),
    ("memory_search", {"query": "q" * 4001}, "query"),
    ("memory_search", {"query": ["tea"]}, "query"),
    ("memory_remember", {"text": ""}, "text must not be empty"),
    ("memory_remember", {"text": "\n\t "}, "text must not be empty"),
    ("memory_remember", {"text": "a\x00b"}, "NUL"),
    ("memory_remember", {"text": "x" * 16_001}, "text"),
    ("memory_remember", {"text": 42}, "text"),
    ("memory_forget", {"memory_id": "0" * 32}, "no fact"),
    ("memory_forget", {"memory_id": "doc:nope"}, "no document 'nope'"),
    ("memory_forget", {"memory_id": "doc:"}, "names no document"),
    ("memory_forget", {"memory_id": ""}, "memory_id must not be empty"),
    ("memory_index_document", {"doc_id": "", "text": "x"}, "doc_id must not be empty"),
    ("memory_index_document", {"doc_id": "d", "text": "  "}, "text must not be empty"),
    ("memory_index_document", {"doc_id": "d" * 257, "text": "x"}, "doc_id"),
    ("memory_index_document", {"doc_id": "d"}, "text"),
    ("memory_set_profile", {"profile": 3}, "profile"),
    ("memory_set_profile", {"profile": {"a": 1}}, "profile"),
    ("memory_set_profile", {"profile": "p" * 16_001}, "profile"),
    ("memory_context", {"query": "tea", "max_tokens": 0}, "max_tokens"),
    ("memory_context", {"query": "tea", "max_tokens": 10**9}, "max_tokens"),
    ("memory_context", {"query": "tea"}, "max_tokens"),
    ("memory_context", {"query": "tea", "max_tokens": True}, "max_tokens"),
    ("no_such_tool", {}, "no_such_tool"),
]


async def test_bad_arguments_are_tool_errors_and_change_nothing(store: MemoryStore) -> None:
    fact_id = store.remember("Alice likes tea.", scope=ALICE)
    store.set_profile("Name: Alice", scope=ALICE)
    before = (store.facts(scope=ALICE), store.get_profile(scope=ALICE))
    async with connect(create_server(store, ALICE)) as client:
        for name, args, needle in BAD_CALLS:
            reply = await client.call(name, args)
            assert reply.is_error, (name, args, reply.text)
            assert needle in reply.text, (name, args, reply.text)
            # ... and the server keeps serving.
            hits = (await client.call("memory_search", {"query": "tea"})).data["hits"]
            assert [h["memory_id"] for h in hits] == [fact_id]
    assert (store.facts(scope=ALICE), store.get_profile(scope=ALICE)) == before


async def test_limits_are_the_servers_option(store: MemoryStore) -> None:
    limits = MemoryLimits(max_fact_chars=10, max_top_k=2, max_listed_facts=2)
    async with connect(create_server(store, ALICE, limits=limits)) as client:
        reply = await client.call("memory_remember", {"text": "x" * 11})
        assert reply.is_error and "10" in reply.text
        for i in range(3):
            await client.call("memory_remember", {"text": f"fact {i}"})
        assert (await client.call("memory_search", {"query": "fact", "top_k": 3})).is_error
        listing = json.loads(await client.read("memory://facts"))
        assert [f["text"] for f in listing["facts"]] == ["fact 2", "fact 1"]
        assert listing["truncated"] is True
    with pytest.raises(ValueError):
        MemoryLimits(max_top_k=0)
    with pytest.raises(TypeError):
        MemoryLimits(max_top_k=True)


def test_create_server_checks_its_arguments(store: MemoryStore) -> None:
    from protoprompt import UnknownEncodingError, UnknownModelError

    with pytest.raises(TypeError, match="scope"):
        create_server(store, ("acme", "alice"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="store"):
        create_server(object(), ALICE)  # type: ignore[arg-type]
    with pytest.raises(UnknownModelError):
        create_server(store, ALICE, model="no-such-model")
    with pytest.raises(UnknownEncodingError):
        create_server(store, ALICE, encoding="no_such_encoding")
    with pytest.raises(TypeError, match="limits"):
        create_server(store, ALICE, limits={"max_top_k": 3})  # type: ignore[arg-type]
    with pytest.raises(MemoryToolError):
        MemoryTools(store, ALICE).remember("")


# --------------------------------------------------------------------------- isolation

HOSTILE_QUERIES = [
    "secret",
    "SECRET",
    "secret*",
    "*",
    "**",
    "s*",
    '"',
    '""',
    "'",
    "\\",
    '"secret"',
    "secret OR globex",
    "acme OR globex OR initech",
    "NOT acme",
    "secret NOT acme",
    "NEAR(secret globex)",
    "NEAR(secret, 5)",
    "text:secret",
    "{text}: secret",
    "s_tenant:globex",
    "pp_mem_fts:secret",
    "^secret",
    "secret AND",
    "(",
    ")",
    "((secret))",
    "-acme",
    "+secret",
    "secret\x00globex",
    "' OR '1'='1",
    '" OR 1=1 --',
    "'; DROP TABLE pp_mem_records; --",
    "%",
    "_",
    "globex%",
    "rowid:1",
    "rank",
    "bm25",
    "*:*",
    "secret ".join(["x"] * 80),
    "ünïcödé sécret",
    "秘密",
    "\u200bsecret",
    "\ud800secret",
]


async def test_two_tenants_on_one_database_never_see_each_other(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    acme_scope = MemoryScope("acme", user="alice")
    globex_scope = MemoryScope("globex", user="alice")  # same user name, other tenant
    with (
        MemoryStore(db, chunk_words=8, chunk_overlap=0) as acme_store,
        MemoryStore(db, chunk_words=8, chunk_overlap=0) as globex_store,
    ):
        acme, globex = (
            create_server(acme_store, acme_scope),
            create_server(globex_store, globex_scope),
        )
        async with connect(acme) as a, connect(globex) as g:
            ids = {}
            for client, name in ((a, "acme"), (g, "globex")):
                marker = f"{name}marker"
                ids[name] = (
                    await client.call(
                        "memory_remember", {"text": f"The secret code of {name} is {marker}."}
                    )
                ).data["memory_id"]
                await client.call(
                    "memory_index_document",
                    {
                        "doc_id": "contract",  # the same id in both tenants
                        "text": f"secret {name} contract {marker} " * 5,
                    },
                )
                await client.call("memory_set_profile", {"profile": f"profile {marker} secret"})

            for client, own, other in ((a, "acme", "globex"), (g, "globex", "acme")):
                for query in HOSTILE_QUERIES:
                    reply = await client.call("memory_search", {"query": query, "top_k": 50})
                    if reply.is_error:  # refused outright is fine; leaking is not
                        assert other not in reply.text
                        continue
                    assert f"{other}marker" not in reply.text, (own, query)
                    for hit in reply.data["hits"]:
                        assert f"{own}marker" in hit["text"], (own, query, hit)
                    ctx = await client.call("memory_context", {"query": query, "max_tokens": 5000})
                    if not ctx.is_error:
                        assert f"{other}marker" not in ctx.text, (own, query)
                # Plain queries do find this tenant's own memories.
                found = (
                    await client.call("memory_search", {"query": f"{own}marker", "top_k": 50})
                ).data["hits"]
                assert {h["kind"] for h in found} == {"fact", "document"}
                assert (await client.call("memory_search", {"query": f"{other}marker"})).data[
                    "hits"
                ] == []
                for uri in ("memory://facts", "memory://profile"):
                    text = await client.read(uri)
                    assert f"{own}marker" in text and f"{other}marker" not in text
                profile = (await client.call("memory_get_profile")).data["profile"]
                assert profile == f"profile {own}marker secret"
                # The other tenant's ids cannot be forgotten from here.
                reply = await client.call("memory_forget", {"memory_id": ids[other]})
                assert reply.is_error and "no fact" in reply.text
                reply = await client.call("memory_forget", {"memory_id": f"fact:{ids[other]}"})
                assert reply.is_error

            # Forgetting the shared doc id in one tenant leaves the other's document.
            assert (await a.call("memory_forget", {"memory_id": "doc:contract"})).data["deleted"]
            assert [
                h["kind"]
                for h in (
                    await g.call("memory_search", {"query": "globexmarker", "top_k": 50})
                ).data["hits"]
            ].count("document") >= 1
        assert [h.fact_id for h in globex_store.facts(scope=globex_scope)] == [ids["globex"]]
        assert [h.fact_id for h in acme_store.facts(scope=acme_scope)] == [ids["acme"]]


async def test_thread_scopes_and_include_parents(store: MemoryStore) -> None:
    user = MemoryScope("acme", user="alice")
    t1, t2 = user.with_thread("t1"), user.with_thread("t2")
    user_fact = store.remember("user level tea fact", scope=user)
    store.remember("thread two tea fact", scope=t2)
    store.set_profile("user profile", scope=user)
    async with connect(create_server(store, t1)) as client:
        assert (await client.call("memory_search", {"query": "tea"})).data["hits"] == []
        assert (await client.call("memory_get_profile")).data == {"profile": None}
        own = (await client.call("memory_remember", {"text": "thread one tea fact"})).data
    assert [h.fact_id for h in store.facts(scope=t1)] == [own["memory_id"]]
    async with connect(create_server(store, t1, include_parents=True)) as client:
        hits = (await client.call("memory_search", {"query": "tea", "top_k": 10})).data["hits"]
        assert sorted((h["text"], h["inherited"]) for h in hits) == [
            ("thread one tea fact", False),
            ("user level tea fact", True),
        ]
        assert (await client.call("memory_get_profile")).data == {"profile": "user profile"}
        context = (await client.call("memory_context", {"query": "tea", "max_tokens": 500})).data
        assert "user level tea fact" in context["context"]
        assert "thread two" not in context["context"]
        # Ancestors are readable, not forgettable, from a thread server.
        reply = await client.call("memory_forget", {"memory_id": user_fact})
        assert reply.is_error and "parent scopes" in reply.text
    assert [h.fact_id for h in store.facts(scope=user)] == [user_fact]


# --------------------------------------------------------------------------- issue 22


async def test_ids_round_trip_exactly(store: MemoryStore) -> None:
    """Issue 22 #8: the id the server returned names exactly that document."""
    async with connect(create_server(store, ALICE)) as client:
        for doc_id in ("notes", "notes ", " notes"):
            reply = await client.call("memory_index_document", {"doc_id": doc_id, "text": CONTRACT})
            assert reply.data["memory_id"] == f"doc:{doc_id}"
        hits = (await client.call("memory_search", {"query": "renewal", "top_k": 50})).data["hits"]
        assert {h["memory_id"] for h in hits} == {"doc:notes", "doc:notes ", "doc: notes"}
        gone = (await client.call("memory_forget", {"memory_id": "doc:notes "})).data
        assert gone["forgotten"] == "doc:notes "
        left = {h.doc_id for h in store.search("renewal", scope=ALICE, limit=50)}
        assert left == {"notes", " notes"}
        missing = await client.call("memory_forget", {"memory_id": "doc:notes  "})
        assert missing.is_error and "no document 'notes  '" in missing.text
        assert {h.doc_id for h in store.search("renewal", scope=ALICE, limit=50)} == left


async def test_clearing_the_profile_leaves_no_own_profile(store: MemoryStore) -> None:
    """Issue 22 #10: an empty profile removes the scope's own profile, so the inherited one
    is what get_profile, memory_context and include_parents builders see."""
    thread = MemoryScope("acme", user="alice", thread="t1")
    store.set_profile("Alice: prefers metric units.", scope=ALICE)
    server = create_server(store, thread, include_parents=True)
    async with connect(server) as client:
        await client.call("memory_set_profile", {"profile": "Thread: be terse."})
        assert (await client.call("memory_get_profile")).data == {"profile": "Thread: be terse."}
        cleared = (await client.call("memory_set_profile", {"profile": ""})).data
        assert cleared == {"profile": None}
        assert (await client.call("memory_get_profile")).data == {
            "profile": "Alice: prefers metric units."
        }
        context = (await client.call("memory_context", {"query": "", "max_tokens": 200})).data
        assert "metric units" in context["context"]
    assert store.get_profile(scope=thread) is None
    assert store.get_profile(scope=thread, include_parents=True) == "Alice: prefers metric units."
    builder = TokenBudgetedContextBuilder(store, max_tokens=500, scope=thread, include_parents=True)
    plan = builder.build([], [], query="units")
    assert plan.context_message is not None and "metric" in plan.context_message["content"]
    # A blank row written before (by an older server) hides nothing either.
    store.set_profile("   ", scope=thread)
    assert store.get_profile(scope=thread, include_parents=True) == "Alice: prefers metric units."


def test_the_document_limit_is_in_the_schema_and_sizes_the_http_body_limit() -> None:
    """Issue 22 #9: one limit for stdio and HTTP: the body limit fits the largest document
    the schema allows, every character escaped."""
    limits = MemoryLimits()
    assert limits.max_request_bytes >= 12 * (limits.max_document_chars + limits.max_doc_id_chars)
    small = MemoryLimits(max_document_chars=1_000, max_fact_chars=20_000)
    assert small.max_request_bytes == 12 * 20_000 + 65_536


async def test_the_document_schema_states_the_limit(store: MemoryStore) -> None:
    limits = MemoryLimits(max_document_chars=5_000)
    async with connect(create_server(store, ALICE, limits=limits)) as client:
        tool = (await client.tools())["memory_index_document"]
        text = (getattr(tool, "inputSchema", None) or tool.input_schema)["properties"]["text"]
        assert text["maxLength"] == 5_000 and "5,000 characters" in text["description"]
        over = await client.call("memory_index_document", {"doc_id": "d", "text": "x" * 5_001})
        assert over.is_error


async def test_the_server_reports_protoprompt_s_version(store: MemoryStore) -> None:
    """Issue 22 #11: serverInfo.version is the package version (over the wire: see the
    transport tests)."""
    import protoprompt

    server = create_server(store, ALICE)
    inner = getattr(server, "_mcp_server", None) or getattr(server, "_lowlevel_server", None)
    assert inner.version == protoprompt.__version__ != ""


def test_a_read_only_store_never_changes_the_database(tmp_path: Path) -> None:
    """Issue 22 #7, the store's side: no schema, no journal-mode change, no write."""
    import hashlib
    import sqlite3

    db = tmp_path / "foreign.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE notes (x TEXT)")
        conn.execute("INSERT INTO notes VALUES ('keep me')")
    conn.close()
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    with MemoryStore(db, read_only=True) as ro:
        assert ro.read_only
        assert ro.search("anything", scope=ALICE) == []
        assert ro.facts(scope=ALICE) == [] and ro.get_profile(scope=ALICE) is None
        with pytest.raises(PermissionError):
            ro.remember("no", scope=ALICE)
        with pytest.raises(PermissionError):
            ro.clear_profile(scope=ALICE)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign.db"]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]
    conn.close()
    # Tables created later by a writer are read.
    with MemoryStore(db) as rw:
        rw.remember("Alice likes tea.", scope=ALICE)
        with MemoryStore(db, read_only=True) as ro:
            assert [h.text for h in ro.facts(scope=ALICE)] == ["Alice likes tea."]
    with pytest.raises(FileNotFoundError):
        MemoryStore(tmp_path / "missing.db", read_only=True)
    with pytest.raises(ValueError):
        MemoryStore(":memory:", read_only=True)


# --------------------------------------------------------------------------- HTTP guard


@pytest.mark.parametrize(
    ("host", "token", "insecure", "outcome"),
    [
        ("127.0.0.1", None, False, "ok"),
        ("::1", None, False, "ok"),
        ("localhost", None, False, "ok"),
        ("127.0.0.2", None, False, "ok"),
        ("0.0.0.0", None, False, "refused"),
        ("::", None, False, "refused"),
        ("192.168.1.5", None, False, "refused"),
        ("myhost.example", None, False, "refused"),
        ("0.0.0.0", "a" * 16, False, "ok"),
        ("0.0.0.0", None, True, "warned"),
    ],
)
def test_a_non_loopback_bind_needs_a_token_or_insecure(
    host: str, token: str | None, insecure: bool, outcome: str
) -> None:
    from protoprompt.mcp._guard import BindError, check_bind

    if outcome == "refused":
        with pytest.raises(BindError, match="without authentication"):
            check_bind(host, token=token, insecure=insecure)
    else:
        warning = check_bind(host, token=token, insecure=insecure)
        assert (warning is not None) == (outcome == "warned")


def test_tokens_must_be_long_printable_ascii() -> None:
    from protoprompt.mcp._guard import BindError, check_token

    assert check_token(None) is None
    assert check_token("x" * 16) == "x" * 16
    for bad in ("short", "x" * 15 + " ", "é" * 20, "x" * 16 + "\n"):
        with pytest.raises(BindError):
            check_token(bad)


@pytest.mark.parametrize(
    ("bind", "extra", "answered", "refused"),
    [
        (
            "127.0.0.1",
            [],
            ["127.0.0.1:8000", "localhost:8000", "[::1]:8000", "LOCALHOST:8000"],
            ["evil.example:8000", "127.0.0.1:8001", "127.0.0.1", "", None],
        ),
        # Issue 22 #6: a wildcard bind keeps the checks: loopback names, nothing else.
        (
            "0.0.0.0",
            [],
            ["127.0.0.1:8000", "localhost:8000"],
            ["evil.example:8000", "0.0.0.0:8000", "10.0.0.7:8000"],
        ),
        (
            "0.0.0.0",
            ["mem.example", "10.0.0.7:9000"],
            ["mem.example:8000", "10.0.0.7:9000"],
            ["mem.example:8001", "10.0.0.7:8000"],
        ),
        ("192.168.1.5", [], ["192.168.1.5:8000"], ["192.168.1.6:8000"]),
        ("::", ["fd00::7"], ["[fd00::7]:8000", "[::1]:8000"], ["[fd00::8]:8000"]),
    ],
)
def test_every_bind_checks_the_host_header(
    bind: str, extra: list[str], answered: list[str], refused: list[str | None]
) -> None:
    from protoprompt.mcp._guard import Guard, allowed_hosts, allowed_origins

    hosts = allowed_hosts(bind, 8000, extra)
    guard = Guard(tuple(hosts), tuple(allowed_origins(hosts)))
    for host in answered:
        assert guard.verdict(host, None, None) is None, host
    for bad in refused:
        verdict = guard.verdict(bad, None, None)
        assert verdict is not None and verdict[0] == 421, bad


def test_origins_and_tokens_are_checked_on_every_request() -> None:
    from protoprompt.mcp._guard import BindError, Guard, allowed_hosts, allowed_origins

    hosts = allowed_hosts("0.0.0.0", 8000)
    origins = allowed_origins(hosts, ["https://App.example/"])
    guard = Guard(tuple(hosts), tuple(origins), "s3cret-token-0123")
    ok = "Bearer s3cret-token-0123"
    host = "127.0.0.1:8000"
    assert guard.verdict(host, None, ok) is None
    assert guard.verdict(host, "https://app.example", ok) is None
    assert guard.verdict(host, "http://localhost:8000", ok) is None
    # A DNS-rebinding page: its Origin is its own, whatever the Host.
    assert guard.verdict(host, "http://evil.example", ok)[0] == 403
    assert guard.verdict(host, "null", ok)[0] == 403
    for auth in (None, "", "Bearer", "Bearer wrong-token-00000", "Basic s3cret-token-0123"):
        assert guard.verdict(host, None, auth)[0] == 401, auth
    assert guard.verdict(host, None, "bearer s3cret-token-0123") is None
    with pytest.raises(BindError):
        allowed_origins(hosts, ["app.example"])


def test_the_cli_reads_the_same_token_variable() -> None:
    from protoprompt.cli import TOKEN_ENV
    from protoprompt.mcp import _guard

    assert TOKEN_ENV == _guard.TOKEN_ENV == "PROTOPROMPT_MCP_TOKEN"


async def test_memory_search_reads_the_history_layer_of_its_scope(store: MemoryStore) -> None:
    from protoprompt.memory import HistoryRecord

    bob = MemoryScope("acme", user="bob")
    store.index_history(
        "chat-1",
        [
            HistoryRecord(
                7,
                "tool output of lookup: the vault code is 48213",
                {"turn": 2, "label": "tool output of lookup"},
            )
        ],
        scope=ALICE,
    )
    store.index_history("chat-2", [HistoryRecord(1, "user: vault code of bob")], scope=bob)
    store.remember("the vault is in Zurich", scope=ALICE)
    async with connect(create_server(store, ALICE, read_only=True)) as client:
        found = (
            await client.call("memory_search", {"query": "vault code", "layer": "history"})
        ).data
        assert found["layer"] == "history"
        (hit,) = found["hits"]  # never bob's: the server's scope only
        assert hit["layer"] == hit["kind"] == "history"
        assert hit["source"] == "history:chat-1/7#0" and hit["memory_id"] is None
        assert (hit["session_id"], hit["row"], hit["turn"]) == ("chat-1", 7, 2)
        assert hit["label"] == "tool output of lookup" and "48213" in hit["text"]
        # The default searches facts and documents only, as before.
        plain = (await client.call("memory_search", {"query": "vault code"})).data["hits"]
        assert [h["kind"] for h in plain] == ["fact"]
        reply = await client.call("memory_search", {"query": "vault", "layer": "diary"})
        assert reply.is_error
