"""Opaque payloads under cost rule 2 (decoded size) against rule 1 (base64 read as text).

* ``test_opaque_costs_per_kind``: on a 2,000-item agentic history with realistic encrypted
  payloads (``benches/opaque_costs.py``): reasoning items cost several times less, every
  other kind exactly the same, the rule stays above OpenAI Codex's own estimate (the
  margin), and a 128k budget keeps more turns (the rule-2 pack checked against the
  reference packer). The numbers go to the summary; ``benches/report.py`` writes them to
  benches/README.md.
* ``test_costing_reasoning_items``: costing those reasoning items from a cold count cache
  (decode and count the rest of the item) beside counting their rule-1 texts with the
  same tokenizer, in the same run: rule 2 is also faster (no BPE over base64).
"""

from __future__ import annotations

import harness  # noqa: I001

harness.ensure_paths()

import time  # noqa: E402

import pytest  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import _core  # noqa: E402
from history_gen import generate, new_user_message  # noqa: E402
from opaque_costs import _rule1_text, kind_costs, realistic, turns_kept  # noqa: E402

ITEMS = 2_000
BUDGET = 128_000
RESERVE = 8_000


@pytest.fixture(scope="module")
def history() -> list[dict]:
    return realistic(generate(ITEMS, "agentic", seed=0))


def test_opaque_costs_per_kind(history: list[dict], results: dict) -> None:
    kinds = {k.kind: k for k in kind_costs(history)}
    reasoning = kinds["reasoning"]
    assert reasoning.shrink > 3, reasoning
    assert reasoning.rule2 > reasoning.codex, "the margin keeps the rule above Codex's estimate"
    for k in kinds.values():
        if k.kind not in ("reasoning", "compaction", "all"):
            assert k.rule1 == k.rule2, k
    turns = turns_kept(history, [new_user_message(0)], BUDGET, RESERVE)
    assert turns.rule2 > turns.rule1, turns
    results[("opaque_costs", (ITEMS,))] = {
        "reasoning_shrink": reasoning.shrink,
        "total_shrink": kinds["all"].shrink,
        "turns_rule1": turns.rule1,
        "turns_rule2": turns.rule2,
    }
    print(
        f"\nopaque payloads, {ITEMS} agentic items: reasoning {reasoning.rule1:,} -> "
        f"{reasoning.rule2:,} tokens ({reasoning.shrink:.2f}x less), history "
        f"{kinds['all'].rule1:,} -> {kinds['all'].rule2:,}; turns kept at {BUDGET:,}: "
        f"{turns.rule1} -> {turns.rule2} of {turns.turns}"
    )


def test_costing_reasoning_items(benchmark, history: list[dict], results: dict) -> None:
    reasoning = [i for i in history if i.get("type") == "reasoning"]
    old_texts = [_rule1_text(i) for i in reasoning]

    def rule2() -> int:
        _core._clear_count_cache()  # every text counted, as a new process would
        return sum(pp.item_tokens(i).total for i in reasoning)

    total = benchmark(rule2)
    rule2_s = benchmark.stats.stats.median
    timings = []
    for _ in range(3):
        t0 = time.perf_counter()
        old_total = sum(pp.count_tokens(t) for t in old_texts)
        timings.append(time.perf_counter() - t0)
    rule1_s = sorted(timings)[1]
    assert total < old_total
    benchmark.extra_info.update(rule1_s=rule1_s, rule2_s=rule2_s, speedup=rule1_s / rule2_s)
    results[("opaque_costing", (len(reasoning),))] = {"rule1": rule1_s, "rule2": rule2_s}
    print(
        f"\ncosting {len(reasoning)} reasoning items cold: rule 2 {rule2_s * 1e3:.1f} ms, "
        f"counting their rule-1 texts {rule1_s * 1e3:.1f} ms ({rule1_s / rule2_s:.1f}x)"
    )
