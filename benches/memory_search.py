"""Memory search on PostgreSQL against SQLite, the same data in both: p50 and p95 latency.

    python benches/memory_search.py --postgres URL [--records 1000000] [--scopes 10000]
                                    [--queries 400] [--markdown benches/README.md]

The data: ``--records`` document chunks spread evenly over ``--scopes`` scopes (tenant
``t<i // 100>``, user ``u<i>``), one document per scope, each chunk a paragraph of 30 words
drawn from a 20,000-word vocabulary with Zipf-like frequencies (a few words are in most
records, most words are rare), loaded through ``MemoryStore.index_document``. The queries:
three words each (one common, two from the long tail), each in a random scope; a search asks
for the best 8 (``limit=8``), full-text only. Both engines answer every query; the set of
records each one matched is compared (the rankings differ by design: bm25 against ts_rank).

PostgreSQL is loaded into a fresh schema of the given server (dropped afterwards, unless
``--keep``); SQLite into a file under ``--dir``. ``scripts/services.sh start`` gives a
server. With ``--markdown`` the table goes into benches/README.md between the
``<!-- memory-search -->`` markers (benches/report.py keeps that block when it rewrites the
file). Loading 1M records takes several minutes per engine.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402,F401  (puts python/ on sys.path when protoprompt is not installed)

from protoprompt import MemoryScope, MemoryStore  # noqa: E402

CHUNK_WORDS = 30
PER_SCOPE_DOCS = 1
BEGIN, END = "<!-- memory-search -->", "<!-- /memory-search -->"


def vocabulary(size: int = 20_000) -> list[str]:
    rng = random.Random(7)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: dict[str, None] = {}
    while len(words) < size:
        words.setdefault("".join(rng.choice(letters) for _ in range(rng.randint(3, 9))), None)
    return list(words)


def scope_of(i: int) -> MemoryScope:
    return MemoryScope(f"t{i // 100}", user=f"u{i}")


@dataclass(frozen=True)
class Corpus:
    records: int
    scopes: int
    words: list[str]
    cum_weights: list[float]

    @classmethod
    def make(cls, records: int, scopes: int) -> Corpus:
        words = vocabulary()
        weights = [1.0 / (rank + 1) ** 1.07 for rank in range(len(words))]
        return cls(records, scopes, words, list(itertools.accumulate(weights)))

    def documents(self) -> Iterator[tuple[int, str]]:
        """(scope number, document text): each paragraph one chunk of CHUNK_WORDS words."""
        rng = random.Random(11)
        per_scope, extra = divmod(self.records, self.scopes)
        for i in range(self.scopes):
            n = per_scope + (1 if i < extra else 0)
            paragraphs = [
                " ".join(rng.choices(self.words, cum_weights=self.cum_weights, k=CHUNK_WORDS)) + "."
                for _ in range(n)
            ]
            yield i, "\n\n".join(paragraphs)

    def queries(self, count: int) -> list[tuple[int, str]]:
        rng = random.Random(13)
        out = []
        for _ in range(count):
            common = rng.choice(self.words[:50])
            rare = [self.words[50 + rng.randrange(2_000)] for _ in range(2)]
            out.append((rng.randrange(self.scopes), " ".join([common, *rare])))
        return out


def load(store: MemoryStore, corpus: Corpus, progress: Callable[[str], None]) -> float:
    t0 = time.perf_counter()
    for i, text in corpus.documents():
        chunks = store.index_document("doc", text, scope=scope_of(i))
        assert chunks == text.count("\n\n") + 1
        if i % 500 == 0:
            progress(f"{store.engine}: {i:,}/{corpus.scopes:,} scopes")
    return time.perf_counter() - t0


def measure(
    store: MemoryStore, queries: list[tuple[int, str]]
) -> tuple[list[float], list[set[int | None]]]:
    """Latencies (ms) of every query (after a warm-up), and the records each one matches
    (chunk indexes; every match, not timed)."""
    for i, text in queries[:20]:
        store.search(text, scope=scope_of(i))
    times = []
    for i, text in queries:
        t0 = time.perf_counter()
        store.search(text, scope=scope_of(i), limit=8)
        times.append((time.perf_counter() - t0) * 1e3)
    found = [
        {h.chunk_index for h in store.search(text, scope=scope_of(i), limit=100_000)}
        for i, text in queries
    ]
    return times, found


def database_mb(store: MemoryStore, target: str) -> float:
    """The size of the memory tables with their indexes (SQLite: the whole file)."""
    if store.engine == "sqlite":
        return (
            sum(
                Path(target + suffix).stat().st_size
                for suffix in ("", "-wal")
                if Path(target + suffix).exists()
            )
            / 1e6
        )
    import psycopg

    with psycopg.connect(target) as conn:
        row = conn.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c"
            " WHERE c.relname LIKE 'pp\\_mem\\_%' AND c.relkind = 'r'"
            " AND c.relnamespace = current_schema()::regnamespace"
        ).fetchone()
    return float(row[0] or 0) / 1e6 if row else 0.0


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


@contextmanager
def postgres_schema(url: str, keep: bool) -> Iterator[str]:
    import psycopg

    name = f"pp_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    glue = "&" if "?" in url else "?"
    try:
        yield f"{url}{glue}options=-csearch_path%3D{name}"
    finally:
        if not keep:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def run(args: argparse.Namespace) -> dict[str, object]:
    corpus = Corpus.make(args.records, args.scopes)
    queries = corpus.queries(args.queries)

    def progress(what: str) -> None:
        print(f"  {what}", file=sys.stderr, flush=True)

    results: dict[str, object] = {}
    found: dict[str, list[set[int | None]]] = {}
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="pp-memory-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    sqlite_path = workdir / f"memory-{args.records}.db"
    sqlite_path.unlink(missing_ok=True)
    with postgres_schema(args.postgres, args.keep) as pg_url:
        for engine, target in (("sqlite", str(sqlite_path)), ("postgresql", pg_url)):
            with MemoryStore(target, chunk_words=CHUNK_WORDS, chunk_overlap=0) as store:
                load_s = load(store, corpus, progress)
                if engine == "postgresql":
                    import psycopg

                    with psycopg.connect(pg_url, autocommit=True) as conn:
                        conn.execute("ANALYZE pp_mem_records")
                size_mb = database_mb(store, target)
                progress(f"{engine}: loaded in {load_s:.0f} s, {size_mb:.0f} MB; searching")
                times, found[engine] = measure(store, queries)
            results[engine] = {
                "load_s": load_s,
                "size_mb": size_mb,
                "p50": percentile(times, 50),
                "p95": percentile(times, 95),
                "mean": statistics.fmean(times),
            }
    if not args.keep:
        sqlite_path.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            Path(str(sqlite_path) + suffix).unlink(missing_ok=True)
    same = sum(a == b for a, b in zip(found["sqlite"], found["postgresql"], strict=True))
    matched = sum(bool(s) for s in found["sqlite"])
    results["agree"] = (same, len(queries), matched)
    return results


def table(args: argparse.Namespace, results: dict[str, object]) -> str:
    same, total, matched = results["agree"]  # type: ignore[misc]
    lines = [
        f"{args.records:,} records (30-word chunks) over {args.scopes:,} scopes, "
        f"{total} three-word queries, one scope each, best 8, full-text only; "
        f"{datetime.date.today()}, Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}.",
        "",
        "| engine | search p50 ms | search p95 ms | mean ms | load s | database MB |",
        "|---|---|---|---|---|---|",
    ]
    for engine in ("sqlite", "postgresql"):
        r = results[engine]
        assert isinstance(r, dict)
        lines.append(
            f"| {engine} | {r['p50']:.2f} | {r['p95']:.2f} | {r['mean']:.2f} | {r['load_s']:.0f}"
            f" | {r['size_mb']:,.0f} |"
        )
    lines += [
        "",
        f"Both engines matched the same records for {same} of {total} queries ({matched} "
        "with hits); they order them by different relevance functions (bm25, ts_rank). "
        "SQLite's FTS5 matches the query's words in every record of the table before the "
        "scope filter applies, so its search time grows with the whole table; PostgreSQL "
        "filters by scope first (B-tree) and ranks only that scope's records.",
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, body: str) -> None:
    text = path.read_text() if path.exists() else ""
    block = (
        f"{BEGIN}\n## Memory search: PostgreSQL against SQLite\n\n"
        "Generated by `python benches/memory_search.py --postgres URL --markdown "
        "benches/README.md` (the same data in both engines; see that script).\n\n"
        f"{body}{END}"
    )
    start, end = text.find(BEGIN), text.find(END)
    if 0 <= start < end:
        text = text[:start] + block + text[end + len(END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--postgres",
        default=os.environ.get("PROTOPROMPT_TEST_POSTGRES_URL"),
        help="server URL (default: $PROTOPROMPT_TEST_POSTGRES_URL)",
    )
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--scopes", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=400)
    parser.add_argument("--dir", help="where the SQLite file goes (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep both databases")
    parser.add_argument("--markdown", metavar="PATH", help="write the table there")
    args = parser.parse_args(argv)
    if not args.postgres:
        parser.error("--postgres URL (or PROTOPROMPT_TEST_POSTGRES_URL) is required")
    results = run(args)
    body = table(args, results)
    print(body)
    if args.markdown:
        write_section(Path(args.markdown), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
