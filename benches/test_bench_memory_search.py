"""pytest-benchmark: memory search on PostgreSQL against SQLite, the same data in both.

The data and queries of ``benches/memory_search.py`` at a CI size (20,000 records over 200
scopes); the 1M-record, 10k-scope run is that script (opt-in, minutes of loading; its table
is in benches/README.md). Asserted: both engines match the same records for every query.
Reported: p50/p95 per engine and PostgreSQL's p50 over SQLite's, no wall-clock target.
Needs the PostgreSQL server of scripts/services.sh (PROTOPROMPT_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import harness  # noqa: I001

harness.ensure_paths()

import os  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

import memory_search as ms  # noqa: E402
from protoprompt import MemoryStore  # noqa: E402

RECORDS, SCOPES, QUERIES = 20_000, 200, 200


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    url = os.environ.get("PROTOPROMPT_TEST_POSTGRES_URL", "")
    if not url:
        if os.environ.get("PROTOPROMPT_REQUIRE_SERVICES") == "1":
            pytest.fail("PROTOPROMPT_TEST_POSTGRES_URL is not set (scripts/test.sh sets it)")
        pytest.skip(
            "needs a PostgreSQL server: PROTOPROMPT_TEST_POSTGRES_URL is not set "
            '(scripts/services.sh start && eval "$(scripts/services.sh env)")'
        )
    pytest.importorskip("psycopg")
    corpus = ms.Corpus.make(RECORDS, SCOPES)
    queries = corpus.queries(QUERIES)
    path = Path(tmp_path_factory.mktemp("memory-search")) / "memory.db"
    with ms.postgres_schema(url, keep=False) as pg_url:
        stores = {
            "sqlite": MemoryStore(path, chunk_words=ms.CHUNK_WORDS, chunk_overlap=0),
            "postgresql": MemoryStore(pg_url, chunk_words=ms.CHUNK_WORDS, chunk_overlap=0),
        }
        try:
            for store in stores.values():
                ms.load(store, corpus, lambda _: None)
            yield {"stores": stores, "queries": queries}
        finally:
            for store in stores.values():
                store.close()


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_memory_search(benchmark, loaded: dict[str, Any], engine: str, results: dict) -> None:
    stores, queries = loaded["stores"], loaded["queries"]
    store = stores[engine]
    times, found = ms.measure(store, queries)
    other = "postgresql" if engine == "sqlite" else "sqlite"
    _, other_found = ms.measure(stores[other], queries[:50])
    assert found[:50] == other_found, "the engines matched different records"
    assert sum(bool(f) for f in found) > QUERIES // 2  # the queries do find things

    def search_all() -> None:
        for i, text in queries:
            store.search(text, scope=ms.scope_of(i), limit=8)

    benchmark.pedantic(search_all, rounds=3, iterations=1)
    row = results.setdefault(("memory_search", (RECORDS, SCOPES)), {})
    row[engine] = {"p50": ms.percentile(times, 50), "p95": ms.percentile(times, 95)}
    benchmark.extra_info.update(row[engine])
