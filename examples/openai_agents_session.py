"""Replay a long Agents SDK session through a token budget with recalled contract memory.

Runs offline (no API key): the model is the SDK's scripted test double.

    pip install '.[agents]'
    python examples/openai_agents_session.py

Each turn, the budgeted callback sends the model one system message with the recalled
profile, session facts and contract clauses, then as much recent history as fits, then the
new input. Every model call of the turn's tool loop goes through the per-call filter, which
keeps the whole request — items, the agent's instructions and its tool definitions — within
the same budget. The session itself stores only what was said — compare the two views below.

What no longer fits stays reachable: the turns a request drops are indexed for recall
(``recall_evicted``) and folded into a rolling summary by a summarizing model (here another
scripted model), both in the background; later context messages carry the summary and the
dropped turns that match the new question.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from agents import Agent, RunConfig, Runner, function_tool
from agents.testing import ScriptedModel, assistant_message, function_call
from openai.types.responses import ResponseReasoningItem
from openai.types.responses.response_reasoning_item import Summary

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder, item_tokens
from protoprompt.integrations import ModelCallPlan, ProtoPromptSession
from protoprompt.summaries import ModelSummarizer

CONTRACT = """\
1. Term. This services agreement starts on 1 March 2024 and runs for one year.

2. Renewal. The agreement renews automatically for successive one-year terms unless a
party gives written notice of non-renewal at least ninety days before the renewal date.

3. Fees. The customer pays 12,000 EUR per year, invoiced quarterly in advance. Fees rise
by at most three percent on each renewal.

4. Payment. Invoices are payable within thirty days. Late payments accrue interest of one
percent per month.

5. Termination for cause. Either party may terminate immediately if the other party
materially breaches the agreement and does not cure the breach within thirty days.

6. Liability. Each party's total liability is capped at the fees paid in the twelve months
before the claim.
"""

CLAUSES = {m.split(". ", 2)[1].lower(): m for m in CONTRACT.split("\n\n")}


@function_tool
def lookup_clause(name: str) -> str:
    """Return the full text of a contract clause by its title (e.g. "renewal")."""
    return " ".join(CLAUSES.get(name.lower(), "no such clause").split())


def think(n: int, text: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=f"rs_{n}", type="reasoning", summary=[Summary(text=text, type="summary_text")]
    )


TURNS: list[tuple[str, list[list[Any]]]] = [
    (
        "When does the contract renew?",
        [
            [
                think(1, "Look up the renewal clause."),
                function_call("lookup_clause", {"name": "renewal"}, call_id="call_1"),
            ],
            [
                assistant_message(
                    "It renews every 1 March unless notice is given 90 days before.",
                    item_id="msg_1",
                )
            ],
        ],
    ),
    (
        "How much do we pay per year?",
        [
            [function_call("lookup_clause", {"name": "fees"}, call_id="call_2")],
            [
                assistant_message(
                    "12,000 EUR per year, invoiced quarterly; at most +3% per renewal.",
                    item_id="msg_2",
                )
            ],
        ],
    ),
    (
        "What happens if we pay late?",
        [
            [
                think(3, "Payment clause has the interest rate."),
                function_call("lookup_clause", {"name": "payment"}, call_id="call_3"),
            ],
            [
                assistant_message(
                    "Invoices are due in 30 days; late payments accrue 1% per month.",
                    item_id="msg_3",
                )
            ],
        ],
    ),
    (
        "Can they terminate right away if we breach?",
        [
            [function_call("lookup_clause", {"name": "termination for cause"}, call_id="call_4")],
            [
                assistant_message(
                    "Only for a material breach not cured within 30 days.", item_id="msg_4"
                )
            ],
        ],
    ),
    (
        "What is the latest date to stop the renewal next year?",
        [
            [
                assistant_message(
                    "Send written notice by 1 December (90 days before 1 March).", item_id="msg_5"
                )
            ]
        ],
    ),
    (
        "Remind me: how much do we pay per year?",
        [[assistant_message("12,000 EUR a year, invoiced quarterly.", item_id="msg_6")]],
    ),
]

SUMMARY = (
    "Alice reviewed the contract: it renews every 1 March unless notice is given 90 days "
    "before; it costs 12,000 EUR a year, invoiced quarterly, at most +3% per renewal."
)


def short(item: dict[str, Any]) -> str:
    """One readable line for an input item."""
    kind = item.get("type") or "message"
    if kind == "message":
        content = item["content"]
        text = content if isinstance(content, str) else " ".join(p.get("text", "") for p in content)
        return f"{item['role']}: {' '.join(text.split())}"
    if kind == "function_call":
        return f"call {item['name']}({item['arguments']})"
    if kind == "function_call_output":
        return f"output: {item['output']}"
    if kind == "reasoning":
        return "reasoning: " + " ".join(s["text"] for s in item.get("summary", []))
    return kind


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


async def main(db: str) -> None:
    scope = MemoryScope(tenant="acme", user="alice", thread="legal-chat")
    store = MemoryStore(db, chunk_words=40, chunk_overlap=0)
    store.index_document("contract", CONTRACT, scope=scope)
    store.remember(
        "Alice is preparing the renewal decision for the March board meeting.", scope=scope
    )
    store.set_profile(
        {"name": "Alice", "role": "procurement lead", "style": "short answers"}, scope=scope
    )

    builder = TokenBudgetedContextBuilder(
        store,
        max_tokens=900,
        model="gpt-5",
        scope=scope,
        output_reserve=150,
        max_context_tokens=420,
        recall_evicted=True,  # dropped turns are indexed and recalled when relevant
        summarizer=ModelSummarizer(model=ScriptedModel([[assistant_message(SUMMARY)]] * 8)),
        summarize_every=150,  # tokens of dropped turns that start a summary update
        summary_tokens=80,
    )
    session = ProtoPromptSession("legal-chat", db, windowed_reads=True)
    model = ScriptedModel([step for _, steps in TURNS for step in steps])
    agent = Agent(
        name="Contract assistant",
        model=model,
        tools=[lookup_clause],
        instructions="You answer questions about the customer's contract.",
    )
    calls: list[ModelCallPlan] = []
    # Both budget hooks: the session callback (recall + history, once per run) and the
    # per-call filter (every model call of the run, instructions and tools counted).
    config: RunConfig = session.run_config(
        builder,
        agent=agent,  # its instructions and tools are counted in each turn's plan too
        system_prompt="Answer from the recalled contract.",
        on_call=calls.append,
        tracing_disabled=True,
    )

    print(
        f"contract indexed for {scope.tenant}/{scope.user}/{scope.thread}; "
        f"budget {builder.max_tokens} tokens, output reserve {builder.output_reserve}\n"
    )
    for n, (question, _) in enumerate(TURNS, 1):
        calls.clear()
        result = await Runner.run(agent, question, session=session, run_config=config)
        await builder.wait_for_background()  # indexing and summary: done off the request
        plan = builder.last_plan
        assert plan is not None
        print(
            f"turn {n}: {len(plan.recalled)} recalled, "
            f"{sum(len(d.positions) for d in plan.pack.dropped):>2} history items dropped"
            f" -> {clip(result.final_output, 44)}"
        )
        for call in calls:
            assert call.used <= call.max_tokens
            print(
                f"   model call {call.call}: items {call.items_tokens:>3} + instructions "
                f"{call.instructions_tokens} + tools {call.tools_tokens} = "
                f"{call.request_tokens:>3} tokens (+{call.output_reserve} reserved) "
                f"of {call.max_tokens}"
            )

    stored = await session.get_items()
    plan = builder.last_plan
    assert plan is not None and plan.context_message is not None
    n_history = sum(len(d.positions) for d in plan.pack.decisions)  # history the callback got
    n_new = len(plan.pack.items) - len(plan.pack.kept_history)
    why = {p: d.decision for d in plan.pack.decisions for p in d.positions}
    print(
        f"\nSESSION (stored: {len(stored)} items, no context)"
        "       LAST REQUEST (what the model got)"
    )
    print(f"{'':<52}[system] context message, {plan.context_tokens} tokens")
    for i, item in enumerate(stored):
        if i < n_history:
            status = "sent" if i in plan.pack.kept_history else f"dropped ({why.get(i, '?')})"
        elif i < n_history + n_new:
            status = "sent (new input)"
        else:
            status = "(this turn's answer)"
        print(f"{i:>2} {clip(short(item), 44):<46}{item_tokens(item).total:>3}  {status}")

    print("\nRECALLED into the context message:")
    for blk in plan.recalled:
        print(
            f"  {blk.layer:<8}{clip(blk.source, 14):<16}{blk.status:<10}{blk.tokens:>4} tokens  "
            f"{clip(' '.join(blk.text.split()), 34)}"
        )
    print("\nPLAN (builder.last_plan.explain()):")
    print(plan.explain())
    assert not any(i.get("role") == "system" for i in stored), "recall never enters the session"
    assert json.dumps(plan.context_message) not in json.dumps(stored)
    session.close()
    store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:  # memory and session share one SQLite file
        asyncio.run(main(str(Path(tmp) / "agents.db")))
