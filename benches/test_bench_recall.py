"""Recall of evicted turns (``recall_evicted=True``): a whole SDK turn with it against the
same turn without, on a generated multi-session conversation (``benches/recall_quality.py``
with 14 sessions of 8 exchanges: about 230 items, where its table has 24 sessions of 12).
Each question is one ``Runner.run`` over a ``ProtoPromptSession`` in a SQLite file, the two
modes back to back (which goes first alternates); the ratio is the median, over every
question of three runs, of its turn with lexical recall over its turn without
(:func:`recall_quality.paired_ratio`): a wave of a shared machine's load mostly slows both
turns of a pair, where the medians of each mode taken apart drift apart. Five runs of this
file on one machine beside a clean-clone CI (load 4-6): per question 1.09x-1.16x at 10%
and 1.09x-1.20x at 25%, against 1.06x-1.17x and 1.06x-1.28x for the ratio of the modes'
medians (the estimator before); the process's CPU per question 1.15x-1.18x and
1.17x-1.18x. The tail is steady from run to run: 9 in 10 questions' CPU ratios are under
1.27x-1.30x, the first question after the set-up (a cold search) at 1.3x-1.6x and a few
others at about 1.25x in every run. Issue 35's target is at most ``TARGET_TURN_RATIO`` (1.2x), so a ratio between
the target and ``REGRESSION_RATIO`` is an expected failure that names the ratio, and above it a
failure. The evidence-reaches-the-request targets are asserted by ``tests/recall/test_recall.py``.

What recall adds to a turn, in CPU time (wall times on 2 shared cores at a load of 5-10
varied by a third), release build, both trees taking turns, three runs each: the process's
CPU during a whole SDK turn, median of the 62 turns, +2.0-2.3 ms at 10% and +2.1-2.6 ms at
25% before the counting and reading changes of issue 35's speed-up (the context message
counted as the sum of its lines, a passage's opening in two pieces, passages' blocks
counted by the index job, a hit's two neighbouring passages read alone, few matches read
unordered), +1.7-1.9 ms and +2.0-2.2 ms after; the builder's own work for recall
(``build`` with recall less without, 124 builds over a fixed store, one turn later each)
1.9-2.1 ms and 2.3-2.7 ms before, 1.6 ms and 2.0-2.1 ms after. This bench's ratio in the
same runs: 1.11x-1.30x at 10% and 0.95x-1.39x at 25% before, 1.02x-1.24x and 0.99x-1.24x
after. Then the index job counted every piece a turn counts (a passage's line in the
context message, its opening but for the age, the ages ahead) and the passages left out
as repeats were reported with those pieces: on the table's conversation (24 sessions of
12 exchanges), the recall work of a turn's callback thread (``plan_turn`` with recall less
without, thread CPU, mean of 62 turns) went from 2.7 to 2.3 ms; its whole-turn CPU ratio,
both trees interleaved six times at a load of 4-5, from 1.22-1.26x (median 1.23x) to
1.13-1.25x (median 1.20x) at 10% and from 1.17-1.23x to 1.13-1.21x at 25%. Left (thread
CPU per turn): the search's SQL (statistics 0.31 ms, neighbours 0.28 ms, matches 0.20 ms),
the hits' and neighbours' assembly in Python (about 0.5 ms), the context message's
assembly (0.5 ms). Then a MemoryStore's recalled passages were made from the rows its hits
are made of (no hit, no copy of its metadata per passage) and a later passage reused its
turn's room: the same conversation, both trees interleaved nine times at a load of 6-9,
recall thread CPU (median) 2.62 to 2.23 ms at 10% and 2.65 to 2.49 ms at 25%; whole-turn
CPU ratio (median) 1.20x to 1.18x at 10% (new 1.14-1.22x) and 1.19x to 1.15x at 25% (new
1.11-1.18x). Left: the four statements (presence, statistics, matches, neighbours: about
0.75 ms), the ranking's Python (0.2 ms), the candidates (0.2 ms), the assembly (0.45 ms).
Then the store was asked for hits until their texts fill the layer's room (``tokens=``: 31
candidates a turn became 15, the same 9.4 kept), the SQLite statements' lists were padded
to a power of two (13 statement texts instead of 20 over the 62 questions, 9 compiled in a
turn instead of 16), and each mode has an untimed turn before the questions (the first one
after the set-up ran 1.2-1.9x its mode's others, the SDK's own work included, and it was
always the lexical mode's). This file's harness with each tree's library, interleaved
five times on an idle machine: per question 1.15x-1.16x to 1.10x-1.13x at 10% and
1.15x-1.18x to 1.12x-1.13x at 25%; CPU 1.17x to 1.12x-1.14x and 1.18x-1.19x to 1.14x;
9 in 10 questions' CPU ratios under 1.24x-1.26x before, 1.20x-1.23x after.
"""

from __future__ import annotations

import harness  # noqa: I001  (first: puts the benches' helper modules first)

harness.ensure_paths()

import asyncio  # noqa: E402
import statistics  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

import recall_quality as rq  # noqa: E402

RUNS = 3
REGRESSION_RATIO = 2.0
"""Fails above this: recall got slower than it was (before issue 35's speed-ups 1.3x-1.7x,
and wall times on a shared machine vary by a third). Between the target (1.2x) and this,
the test is an expected failure (the target is open) that names the ratio."""


OTHERS = 9
"""Other sessions the recall store holds in the shared-store case of the turn bench."""


@pytest.mark.parametrize(
    ("share", "others"), [*((s, 0) for s in rq.SHARES), (rq.SHARES[0], OTHERS)]
)
def test_a_turn_with_recall_against_the_turn_without(benchmark, results, share, others) -> None:
    """The whole SDK turn with recall against the turn without, at each budget share; and
    at the first with the recall store shared by :data:`OTHERS` other sessions of the same
    scope (their passages are in the full-text index the turn searches)."""
    pytest.importorskip("agents")
    import protoprompt as pp

    conv = rq.conversation(sessions=14, exchanges=8)
    longest = max(
        pp.item_tokens({"role": "user", "content": q.text}, encoding=rq.ENCODING).total
        for q in conv.questions
    )
    budget = int(share * rq._cost(conv.items)) + longest
    runs: list[dict[str, list[float]]] = []

    def run() -> None:
        runs.append(asyncio.run(rq._whole_turns(conv, budget, others)))

    benchmark.pedantic(run, rounds=RUNS, iterations=1)
    stats = getattr(benchmark, "stats", None)
    if stats is None:  # --benchmark-disable: the turns ran, no timing
        return
    off = min(statistics.median(r["drop-only"]) for r in runs)
    on = min(statistics.median(r["lexical"]) for r in runs)
    ratio = rq.paired_ratio(runs)
    cpu_ratio = rq.paired_ratio(runs, cpu=True)
    # 9 in 10 questions' CPU ratios are below it (wall times of single turns on a shared
    # machine take the load's spikes).
    tail = statistics.quantiles(rq.paired_ratios(runs, cpu=True), n=10)[-1]
    benchmark.extra_info.update(
        budget=budget,
        off_ms=off * 1e3,
        on_ms=on * 1e3,
        ratio=ratio,
        cpu_ratio=cpu_ratio,
        cpu_ratio_p90=tail,
        ratio_of_medians=on / off,
    )
    results[("recall", (share, others))] = {"off": off, "on": on, "ratio": ratio}
    shared = f", {others} other sessions in the store" if others else ""
    print(
        f"\nrecall {share:.0%}{shared} (budget {budget:,}): whole SDK turn {off * 1e3:.1f} ms without,"
        f" {on * 1e3:.1f} ms with lexical recall; per question {ratio:.2f}x (CPU"
        f" {cpu_ratio:.2f}x, 9 in 10 under {tail:.2f}x; the medians' ratio {on / off:.2f}x)"
    )
    assert ratio <= REGRESSION_RATIO, (
        f"a turn with recall took {ratio:.2f}x the turn without (before issue 35's speed-ups"
        f" about 1.3-1.7x; target <= {rq.TARGET_TURN_RATIO}x)"
    )
    if ratio > rq.TARGET_TURN_RATIO:
        pytest.xfail(
            f"issue 35's target is not met yet: a turn with recall took {ratio:.2f}x the turn"
            f" without (target <= {rq.TARGET_TURN_RATIO}x)"
        )


SMALL, LARGE = 2_000, 40_000
"""Passages of the two history layers of the scaling bench (one scope and session each)."""
SCALING_RATIO = 2.5
"""Fails above this: a search of the larger layer took that many times the smaller's though
it matches the same passages (while the passages searched were counted one by one, about
6x at these sizes)."""


def _history_store(path: str, passages: int, sessions: int = 1) -> object:
    """A store whose history layer holds ``passages`` of filler words in ``sessions``
    sessions (``s``, then ``s1``, ``s2``, ...), each of them with 12 passages about a walrus
    invoice (all the bench's questions match them); session ``s``'s are the same in every
    store of as many passages a session."""
    import random

    from protoprompt import MemoryStore
    from protoprompt.memory import HistoryRecord

    store = MemoryStore(path)
    each = passages // sessions
    for k in range(sessions):
        rng = random.Random(35 + k)
        vocab = [f"w{i}" for i in range(5_000)]
        rows = []
        for r in range(each):
            words = " ".join(rng.choice(vocab) for _ in range(40))
            if r % (each // 12) == 0:
                words = f"the walrus invoice {r} was paid at the harbor; {words}"
            rows.append(HistoryRecord(r, f"user: {words}", {"turn": r}))
        for start in range(0, len(rows), 2_000):
            store.index_history(f"s{k or ''}", rows[start : start + 2_000], scope=SCALE_SCOPE)
    return store


def _scale_scope() -> object:
    from protoprompt import MemoryScope

    return MemoryScope("bench", user="scale")


SCALE_SCOPE = _scale_scope()
SCALE_QUERIES = (
    "when was the walrus invoice paid?",
    "what did we pay at the harbor?",
    "which invoice mentioned a walrus?",
)


def _scaling(benchmark: Any, results: dict[Any, Any], stores: dict[int, Any], name: str) -> float:
    """The median time of a history search of session ``s`` (``MemoryStore.search_history``
    with neighbours, as recall asks) in each of ``stores`` (by passages), the two taking
    turns; recorded under ``name``; the larger's against the smaller's."""
    import time

    def search(store: Any) -> float:
        t0 = time.perf_counter()
        for q in SCALE_QUERIES:
            hits = store.search_history(
                q, scope=SCALE_SCOPE, session_id="s", limit=16, neighbours=True, tokens=1_500
            )
            assert any("walrus" in h.text for h in hits)
            assert all(h.metadata["session_id"] == "s" for h in hits)
        return time.perf_counter() - t0

    small_n, large_n = sorted(stores)
    times: dict[int, list[float]] = {small_n: [], large_n: []}

    def run() -> None:
        for n in (small_n, large_n) if len(times[small_n]) % 2 else (large_n, small_n):
            times[n].append(search(stores[n]))

    for n in (small_n, large_n):
        search(stores[n])  # compiled statements, warm pages
    benchmark.pedantic(run, rounds=15, iterations=1)
    small, large = (statistics.median(times[n]) / len(SCALE_QUERIES) for n in (small_n, large_n))
    ratio = large / small
    results[(name, (large_n, small_n))] = {"small": small, "large": large, "ratio": ratio}
    print(
        f"{name}, {large_n:,} passages {large * 1e3:.2f} ms, {small_n:,} passages"
        f" {small * 1e3:.2f} ms: {ratio:.2f}x"
    )
    for store in stores.values():
        store.close()
    return ratio


def test_a_history_search_costs_what_it_matches_not_what_the_layer_holds(
    benchmark, results, tmp_path
) -> None:
    """A layer of 40k passages against one of 2k, both holding the same 12 that match: how
    many passages are searched is read from the counts the database keeps, so the larger
    layer costs about what the smaller does."""
    stores = {n: _history_store(str(tmp_path / f"h{n}.db"), n) for n in (SMALL, LARGE)}
    ratio = _scaling(benchmark, results, stores, "history search")
    assert ratio <= SCALING_RATIO, (
        f"a search of {LARGE:,} passages took {ratio:.2f}x one of {SMALL:,} that matches the"
        f" same passages (at most {SCALING_RATIO}x)"
    )


def test_a_session_search_costs_what_its_session_holds_not_what_the_store_holds(
    benchmark, results, tmp_path
) -> None:
    """One session of 2k passages, alone in its database or among 19 others like it (40k
    passages, 240 matching the questions): the full-text index finds the session's passages
    by their owner token (``memory._sqlite.HISTORY_FTS``), so the session costs about what
    it does alone (without the token: 5-7x, every matching passage of the database looked
    up for its session)."""
    from protoprompt.memory import _sqlite

    before = _sqlite.stats["owner_matches"]
    stores = {
        SMALL: _history_store(str(tmp_path / "alone.db"), SMALL),
        LARGE: _history_store(str(tmp_path / "shared.db"), LARGE, sessions=LARGE // SMALL),
    }
    ratio = _scaling(benchmark, results, stores, "session search")
    assert _sqlite.stats["owner_matches"] > before  # the searches matched the owner tokens
    assert ratio <= SCALING_RATIO, (
        f"a search of one session among {LARGE // SMALL} ({LARGE:,} passages) took {ratio:.2f}x"
        f" the same session alone ({SMALL:,}) (at most {SCALING_RATIO}x)"
    )
