"""A memory hit has the same names and the same score scale in Python (``MemoryHit``), in the
builder's context blocks and over MCP (``memory_search``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from protoprompt import MemoryHit, MemoryScope, MemoryStore, TokenBudgetedContextBuilder

ALICE = MemoryScope("acme", user="alice")
FACTS = [
    "Alice prefers short answers.",
    "Alice works in procurement.",
    "The renewal notice goes to the legal team.",
]
CONTRACT = (
    "Renewal. The contract renews every March unless notice is given ninety days before. "
    "Payment. Invoices are payable within thirty days. Alice signed it."
)
QUERIES = ["What does Alice prefer?", "renewal notice", "Alice", "payment invoices March"]


def embed(texts: list[str]) -> list[list[float]]:
    """A small deterministic embedder: letter counts."""
    return [[float(t.lower().count(c)) + 0.1 for c in "aeinorst"] for t in texts]


@pytest.fixture(params=["text", "hybrid"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    embedder = embed if request.param == "hybrid" else None
    with MemoryStore(tmp_path / "m.db", chunk_words=12, chunk_overlap=0, embedder=embedder) as s:
        for fact in FACTS:
            s.remember(fact, scope=ALICE)
        s.index_document("contract", CONTRACT, scope=ALICE)
        yield s


def test_scores_are_relative_to_the_best_hit(store: MemoryStore) -> None:
    for query in QUERIES:
        hits = store.search(query, scope=ALICE, limit=10)
        assert hits, query
        scores = [h.score for h in hits]
        assert scores[0] == 1.0, query
        assert all(0.0 < s <= 1.0 for s in scores), (query, scores)
        assert scores == sorted(scores, reverse=True)


def test_a_hit_has_the_mcp_names(store: MemoryStore) -> None:
    hits = store.search("Alice renewal", scope=ALICE, limit=10)
    facts = [h for h in hits if h.kind == "fact"]
    chunks = [h for h in hits if h.kind == "document"]
    assert facts and chunks
    for h in facts:
        assert (h.layer, h.memory_id, h.source) == ("facts", h.fact_id, f"fact:{h.fact_id}")
        assert store.forget(scope=ALICE, fact_id=h.memory_id) == 1
    for h in chunks:
        assert (h.layer, h.memory_id) == ("rag", "doc:contract")
        assert h.source == f"contract#{h.chunk_index}"


def test_the_builders_blocks_carry_the_hits_names_and_scores(store: MemoryStore) -> None:
    query = "Alice renewal"
    builder = TokenBudgetedContextBuilder(store, max_tokens=4000, scope=ALICE)
    plan = builder.build([], [], query=query)
    facts = {h.source: h for h in store.search(query, scope=ALICE, kinds=("fact",))}
    chunks = {h.source: h for h in store.search(query, scope=ALICE, kinds=("document",))}
    recalled = [b for b in plan.blocks if b.layer in ("facts", "rag")]
    assert recalled
    for block in recalled:
        hit = (facts if block.layer == "facts" else chunks).get(block.source)
        if hit is not None:  # (facts beyond the matches are listed by recency, unscored)
            assert block.score == hit.score
            assert block.layer == hit.layer


def test_a_constructed_hit_keeps_its_earlier_names() -> None:
    """Stores of your own build hits with the earlier names; the new ones derive from them."""
    hit = MemoryHit(
        kind="document",
        text="t",
        score=0.5,
        doc_id="d",
        chunk_index=2,
        fact_id=None,
        scope=ALICE,
    )
    assert (hit.layer, hit.source, hit.memory_id) == ("rag", "d#2", "doc:d")


async def test_python_and_mcp_report_the_same_hits(store: MemoryStore) -> None:
    pytest.importorskip("mcp")
    from mcp_client import connect

    from protoprompt.mcp import create_server

    async with connect(create_server(store, ALICE)) as client:
        for query in QUERIES:
            over_mcp = (await client.call("memory_search", {"query": query, "top_k": 10})).data
            in_python = store.search(query, scope=ALICE, limit=10)
            assert [
                (h["layer"], h["source"], h["memory_id"], h["score"], h["text"])
                for h in over_mcp["hits"]
            ] == [(h.layer, h.source, h.memory_id, h.score, h.text) for h in in_python]
