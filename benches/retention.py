"""What a long session said early, still reachable late: retention of planted facts.

A generated session of the agentic mix (2,400 items, ``history_gen``) gets facts planted in
its first quarter -- half in user messages, half in the middle of tool outputs -- each a
sentence with a unique five-digit code ("The gate code for project Zephyr is 48213."). Late
questions share words with them ("What was the gate code for project Zephyr?"). For each
question, asked as the next turn's new input over the whole history, a fact *reaches the
request* when its code is in what is sent: the kept items (masked copies as sent) or the
context message.

Budgets are a share (5%, 10%) of the history's cost (its valid units' tokens, as in
``benches/masking.py``) plus the longest question, no output reserve. Modes:

* **drop-only** -- ``TokenBudgetedContextBuilder(masking=None)``: newest whole units;
* **masking** -- the builder's default ``Masking()``: older tool outputs cut to excerpts
  before whole units are dropped;
* **masking + recall** -- the default masking and ``recall_evicted=True``, through a
  ``ProtoPromptSession`` (in-memory SQLite, rows keyed by position): a first turn evicts
  and indexes (in the background, waited for), then each question recalls into the context
  message within the history layer's default limit (2,000 tokens).

Offline and deterministic: seeded history, seeded codes, BM25 ranking, no timing.
Used by ``benches/report.py --retention-only`` (and the full report).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass
from typing import Any

import harness

SHARES = (0.05, 0.10)
MODES = ("drop-only", "masking", "masking + recall")
N_ITEMS = 2_400
N_FACTS = 20
TARGET = 0.90
"""Share of facts that must reach the request with recall at a 10% budget."""

_NAMES = (
    "Zephyr Quokka Marzipan Obsidian Tamarind Halcyon Juniper Kumquat Labradorite Nimbus "
    "Orrery Pangolin Quasar Rhubarb Sassafras Tundra Umbra Verbena Wombat Xylophone Yarrow "
    "Zircon Azalea Bergamot"
).split()
_WHAT = ("gate code", "badge number", "locker pin", "vault code", "booking reference")


@dataclass(frozen=True)
class Fact:
    where: str
    """``"user message"`` or ``"tool output"``."""
    position: int
    code: str
    sentence: str
    question: str


def _insert_middle(text: str, sentence: str) -> str:
    """``sentence`` inserted at the whitespace nearest the middle of ``text``."""
    middle = len(text) // 2
    cut = text.find(" ", middle)
    if cut < 0:
        cut = len(text)
    return f"{text[:cut]} {sentence} {text[cut:]}"


def planted(n_items: int = N_ITEMS, seed: int = 7, n_facts: int = N_FACTS):
    """The session (a list of items) and its facts."""
    import history_gen

    history = history_gen.generate(n_items, "agentic", seed)
    rng = random.Random(seed)
    early = n_items // 4
    users = [
        p
        for p, i in enumerate(history[:early])
        if i.get("role") == "user" and isinstance(i.get("content"), str)
    ]
    outputs = [
        p
        for p, i in enumerate(history[:early])
        if i.get("type") == "function_call_output"
        and isinstance(i.get("output"), str)
        and len(i["output"]) > 2_000
    ]
    half = n_facts // 2
    chosen = [("user message", users[k * len(users) // half]) for k in range(half)] + [
        ("tool output", outputs[k * len(outputs) // (n_facts - half)])
        for k in range(n_facts - half)
    ]
    text = json.dumps(history)
    facts = []
    for k, (where, p) in enumerate(chosen):
        while True:
            code = f"{rng.randrange(10_000, 100_000)}"
            if code not in text:
                break
        name, what = _NAMES[k % len(_NAMES)], _WHAT[k % len(_WHAT)]
        sentence = f"The {what} for project {name} is {code}."
        item = dict(history[p])
        field = "content" if where == "user message" else "output"
        item[field] = _insert_middle(item[field], sentence)
        history[p] = item
        facts.append(Fact(where, p, code, sentence, f"What was the {what} for project {name}?"))
    return history, facts


def _question(fact: Fact) -> dict[str, Any]:
    return {"role": "user", "content": fact.question}


def _sent(plan: Any) -> str:
    return json.dumps(plan.items, ensure_ascii=False, default=str)


def measure(n_items: int = N_ITEMS, seed: int = 7) -> list[dict[str, Any]]:
    """One row per (share, mode): facts reaching the request, overall and by where."""
    import masking

    import protoprompt as pp

    history, facts = planted(n_items, seed)
    cost = masking.history_cost(history, [])
    longest = max(pp.item_tokens(_question(f), encoding=harness.ENCODING).total for f in facts)
    rows = []
    for share in SHARES:
        budget = int(share * cost) + longest
        for mode in MODES:
            reached = asyncio.run(_reached(history, facts, budget, mode))
            rows.append(
                {
                    "items": len(history),
                    "history_tokens": cost,
                    "share": share,
                    "budget": budget,
                    "mode": mode,
                    "facts": len(facts),
                    "reached": sum(reached.values()),
                    "user": sum(v for f, v in reached.items() if f.where == "user message"),
                    "output": sum(v for f, v in reached.items() if f.where == "tool output"),
                }
            )
    return rows


async def _reached(
    history: list[Any], facts: list[Fact], budget: int, mode: str
) -> dict[Fact, bool]:
    import protoprompt as pp

    masking = None if mode == "drop-only" else pp.Masking()
    if mode != "masking + recall":
        builder = pp.TokenBudgetedContextBuilder(
            None, max_tokens=budget, encoding=harness.ENCODING, masking=masking
        )
        return {f: f.code in _sent(builder.build(history, [_question(f)])) for f in facts}
    from protoprompt.integrations import ProtoPromptSession

    scope = pp.MemoryScope("bench", user="retention")
    store = pp.MemoryStore()
    builder = pp.TokenBudgetedContextBuilder(
        store,
        max_tokens=budget,
        encoding=harness.ENCODING,
        scope=scope,
        masking=masking,
        recall_evicted=True,
    )
    session = ProtoPromptSession("retention")
    await session.add_items(history)
    callback = session.input_callback(builder)
    # The turn before the questions evicts what does not fit and indexes it (background).
    await callback(list(history), [{"role": "user", "content": "Thanks, go on."}])
    if not await builder.wait_for_background(600):
        raise RuntimeError("the evicted rows were not indexed in 10 minutes")
    found = {}
    for f in facts:
        await callback(list(history), [_question(f)])
        plan = builder.last_plan
        found[f] = plan is not None and f.code in _sent(plan)
    session.close()
    store.close()
    return found


def print_rows(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    first = rows[0]
    print(
        f"retention: {first['items']:,} items ({first['history_tokens']:,} tokens), "
        f"{first['facts']} facts planted early (half in user messages, half mid tool output)"
    )
    print(f"{'budget':>14} {'mode':<18} {'reached':>9} {'user msgs':>10} {'tool outs':>10}")
    for r in rows:
        half = r["facts"] // 2
        print(
            f"{r['share']:>5.0%} {r['budget']:>8,} {r['mode']:<18} "
            f"{r['reached'] / r['facts']:>9.0%} {r['user']:>5}/{half:<4} "
            f"{r['output']:>5}/{r['facts'] - half:<4}"
        )


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| budget | tokens | mode | facts reaching the request | in user messages | "
        "mid tool output |",
        "|---:|---:|:---|---:|---:|---:|",
    ]
    for r in rows:
        half = r["facts"] // 2
        lines.append(
            f"| {r['share']:.0%} | {r['budget']:,} | {r['mode']} | "
            f"{r['reached'] / r['facts']:.0%} ({r['reached']}/{r['facts']}) | "
            f"{r['user']}/{half} | {r['output']}/{r['facts'] - half} |"
        )
    return "\n".join(lines) + "\n"


def target_met(rows: list[dict[str, Any]]) -> bool:
    """Recall at 10%: at least :data:`TARGET` of the facts reach the request."""
    return all(
        r["reached"] >= TARGET * r["facts"]
        for r in rows
        if r["mode"] == "masking + recall" and r["share"] == 0.10
    )
