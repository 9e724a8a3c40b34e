"""``protoprompt demo [FOLDER]``: a budgeted Agents SDK session run offline, on a scripted
model, in a folder the user names.

One SQLite file (``FOLDER/demo.db``) holds both the session's history and the long-term
memory (a contract, a fact, a profile). Six turns of a contract assistant run through
``ProtoPromptSession.run_config`` with a small budget: a tool loop per question, old tool
outputs masked to excerpts when they no longer fit whole, turns dropped when even that is
not enough, and the dropped turns indexed and recalled when a later question matches them.
Each turn's plan is printed, then the command that inspects the stored session.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path
from typing import Any, TextIO

SESSION = "demo"
BUDGET = 1_050
OUTPUT_RESERVE = 150
MODEL = "gpt-5"

CLAUSES = {
    "renewal": (
        "2. Renewal. The agreement renews automatically on 1 March of each year for a further "
        "term of one year unless a party gives written notice of non-renewal at least ninety "
        "days before the renewal date. Notice must be sent by registered mail to the address "
        "in the schedule and is effective on receipt. A notice sent late takes effect at the "
        "following renewal date; the agreement then runs for one more year on the same terms. "
        "Renewal does not change the fees except as clause 3 allows."
    ),
    "fees": (
        "3. Fees. The customer pays 12,000 EUR per year, invoiced quarterly in advance on the "
        "first business day of each quarter. On each renewal the supplier may raise the fees "
        "by at most three percent, by written notice given at least sixty days before the "
        "renewal date; a larger rise needs the customer's written consent. Fees exclude VAT, "
        "which is added at the rate in force on the invoice date."
    ),
    "payment": (
        "4. Payment. Invoices are payable within thirty days of receipt by bank transfer to "
        "the account on the invoice. Late payments accrue interest of one percent per month "
        "from the due date until paid. If an invoice is more than sixty days overdue the "
        "supplier may suspend the services after a further written reminder giving fourteen "
        "days to pay; suspension does not end the customer's obligation to pay the fees."
    ),
    "termination": (
        "5. Termination for cause. Either party may terminate the agreement with immediate "
        "effect by written notice if the other party materially breaches it and does not cure "
        "the breach within thirty days after a written notice describing the breach. Fees "
        "paid in advance for a period after termination are refunded pro rata unless the "
        "customer's breach caused the termination."
    ),
}
NOTES = (
    "Drafting notes: this clause follows the supplier's standard terms of 2023, as amended "
    "in the negotiation of January 2024. The customer's counsel asked for notice periods in "
    "business days and for email notice; the supplier kept calendar days and registered "
    "mail. Each party initialled every page of the signed copy, which is kept in the "
    "contracts register under reference ACME-2024-017 with the schedule of addresses, the "
    "price list and the service description. Amendments need writing and both signatures; "
    "no amendment was made so far. Read together with the definitions in clause 1."
)
"""Text every clause lookup returns after the clause: long tool outputs, as real tools give,
which masking cuts to excerpts once they are old."""
CONTRACT = "1. Term. The services agreement starts on 1 March 2024.\n\n" + "\n\n".join(
    CLAUSES.values()
)

QUESTIONS: list[tuple[str, str | None, str]] = [
    (
        "When does the contract renew?",
        "renewal",
        "Every 1 March, unless notice is given 90 days before.",
    ),
    (
        "How much do we pay per year?",
        "fees",
        "12,000 EUR a year, invoiced quarterly; at most +3% per renewal.",
    ),
    (
        "What happens if we pay late?",
        "payment",
        "1% interest per month; suspension after 60 days overdue.",
    ),
    (
        "Can they terminate right away if we breach?",
        "termination",
        "Only after 30 days to cure a material breach.",
    ),
    ("And what do we pay after the fee rise?", "fees", "At most 12,360 EUR (+3%)."),
    (
        "Remind me: when must the renewal notice arrive?",
        None,
        "By 1 December, 90 days before 1 March.",
    ),
]


def _script() -> list[list[Any]]:
    """The scripted model's outputs, in order: per question a tool call (when it looks a
    clause up) and then the answer."""
    from agents.testing import assistant_message, function_call

    steps: list[list[Any]] = []
    for n, (_, clause, answer) in enumerate(QUESTIONS, 1):
        if clause is not None:
            steps.append([function_call("lookup_clause", {"name": clause}, call_id=f"call_{n}")])
        steps.append([assistant_message(answer, item_id=f"msg_{n}")])
    return steps


def inspect_command(db: Path) -> str:
    """The ``protoprompt inspect`` command for the demo's stored session."""
    return shlex.join(
        [
            "protoprompt",
            "inspect",
            str(db),
            "--session",
            SESSION,
            "--max-tokens",
            str(BUDGET),
            "--model",
            MODEL,
            "--output-reserve",
            str(OUTPUT_RESERVE),
            "--html",
            str(db.with_name("plan.html")),
        ]
    )


_QUIET = ("index:", "snapshot:", "count store:", "  scope ")
"""Lines of a turn plan the demo leaves out (the index's bookkeeping and recalled text
previews): ``protoprompt inspect`` and ``plan.explain()`` show them."""


def _plan_lines(explained: str) -> str:
    return "\n".join(
        "    " + line
        for line in explained.splitlines()
        if not line.startswith(_QUIET) and not line.lstrip().startswith(("'", '"'))
    )


async def _run(folder: Path, out: TextIO) -> None:
    from agents import Agent, Runner, function_tool
    from agents.testing import ScriptedModel

    from .context import TokenBudgetedContextBuilder
    from .integrations import ProtoPromptSession
    from .memory import MemoryScope, MemoryStore

    @function_tool
    def lookup_clause(name: str) -> str:
        """The full text of a contract clause by its title (e.g. "renewal")."""
        clause = CLAUSES.get(name.lower())
        return "no such clause" if clause is None else f"{clause}\n\n{NOTES}"

    db = folder / "demo.db"
    scope = MemoryScope("acme", user="alice", thread=SESSION)
    store = MemoryStore(str(db), chunk_words=60, chunk_overlap=0)
    store.index_document("contract", CONTRACT, scope=scope)
    store.remember("Alice prepares the renewal decision for the March board.", scope=scope)
    store.set_profile({"name": "Alice", "role": "procurement lead"}, scope=scope)
    builder = TokenBudgetedContextBuilder(
        store,
        max_tokens=BUDGET,
        model=MODEL,
        scope=scope,
        output_reserve=OUTPUT_RESERVE,
        max_context_tokens=300,
        rag_limit=1,
        recall_evicted=True,  # dropped turns are indexed, and recalled when they match
    )
    session = ProtoPromptSession(SESSION, str(db))
    agent = Agent(
        name="contract assistant",
        model=ScriptedModel(_script()),
        tools=[lookup_clause],
        instructions="Answer from the contract; look clauses up.",
    )
    calls: list[Any] = []
    config = session.run_config(
        builder,
        agent=agent,
        system_prompt="Use the recalled facts.",
        on_call=calls.append,
        tracing_disabled=True,
    )
    print(
        f"protoprompt demo: 6 turns of a contract assistant on a scripted model (no key, no "
        f"network), budget {BUDGET:,} tokens ({MODEL}), output reserve {OUTPUT_RESERVE}.\n"
        f"Session and memory: {db}\n",
        file=out,
    )
    try:
        for n, (question, _, _) in enumerate(QUESTIONS, 1):
            calls.clear()
            result = await Runner.run(agent, question, session=session, run_config=config)
            await builder.wait_for_background()  # recall indexing: done off the request
            plan = builder.last_plan
            assert plan is not None
            print(f"=== turn {n}: {question}\n    answer: {result.final_output}", file=out)
            sizes = " and ".join(f"{c.request_tokens:,}" for c in calls)
            loop = " (a tool loop)" if len(calls) > 1 else ""
            print(f"    model calls: {len(calls)}{loop}, requests of {sizes} tokens", file=out)
            print(_plan_lines(plan.explain(max_units=3)), file=out)
            print(file=out)
    finally:
        session.close()
        store.close()
    print(
        f"Inspect the stored session (and draw its next request as HTML):\n  {inspect_command(db)}",
        file=out,
    )


def run_demo(folder: str | Path, out: TextIO | None = None) -> int:
    """Run the demo in ``folder`` (created if missing; an earlier demo there is replaced)
    and print to ``out`` (default stdout). Returns 0.

    Raises:
        ImportError: the Agents SDK is not installed (the message names the extra).
    """
    try:
        import agents  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "protoprompt demo needs the OpenAI Agents SDK: pip install 'protoprompt[agents]'"
        ) from exc
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    for name in ("demo.db", "demo.db-wal", "demo.db-shm", "plan.html"):
        (path / name).unlink(missing_ok=True)
    asyncio.run(_run(path, out or sys.stdout))
    return 0
