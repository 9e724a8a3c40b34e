"""Write ``main_format.db``: a session database whose index snapshot was written by protoprompt
at commit d2e9a87, before snapshots carried masked costs (snapshot layout 3, cost rule 2,
no masked section).

It holds one stored session (``"main-format"``) of a tool-heavy agentic history (long
function outputs, so the builder's default masking and token windows matter), the count store
the session filled and the index snapshot it wrote after one windowed turn (with the whole
costs its window walk counted). ``tests/storage/test_masked_snapshots.py`` opens it with the current
code: the snapshot still loads, and a restart from it sends what a full read sends.

Run with a build of that commit (``python tests/data/make_main_format_db.py``); the file is
checked in, so the tests never need the old build.
"""

from __future__ import annotations

import asyncio
import os
import random
import sqlite3
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SESSION = "main-format"
MAX_TOKENS = 4000
OUTPUT_RESERVE = 200
QUESTION = {"role": "user", "content": "And the last invoice?"}


def history(turns: int = 36, seed: int = 25) -> list[dict[str, Any]]:
    """User turns of one or two tool steps each: reasoning, a function call and its long
    output (a few hundred tokens), then the assistant's answer."""
    rng = random.Random(seed)
    words = "total invoice paid due net tax line item amount customer order".split()
    items: list[dict[str, Any]] = []
    call = 0
    for t in range(turns):
        items.append({"role": "user", "content": f"Check invoice batch {t}, please."})
        for _ in range(1 + t % 2):
            call += 1
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{call}",
                    "summary": [{"type": "summary_text", "text": f"Looking up batch {t}."}],
                }
            )
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call}",
                    "call_id": f"call_{call}",
                    "name": "lookup_invoices",
                    "arguments": f'{{"batch": {t}}}',
                }
            )
            lines = [
                f"{rng.choice(words)} {rng.randrange(10, 99999)} {rng.choice(words)}"
                for _ in range(rng.randrange(40, 90))
            ]
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": f"call_{call}",
                    "output": "\n".join(lines),
                }
            )
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{t}",
                "status": "completed",
                "content": [
                    {"type": "output_text", "text": f"Batch {t} adds up.", "annotations": []}
                ],
            }
        )
    return items


def builder() -> Any:
    from protoprompt import MemoryStore, TokenBudgetedContextBuilder

    return TokenBudgetedContextBuilder(
        MemoryStore(), max_tokens=MAX_TOKENS, output_reserve=OUTPUT_RESERVE
    )


async def main(path: Path) -> None:
    from agents.memory import SQLiteSession
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt.integrations import ProtoPromptSession

    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(str(path) + suffix):
            os.remove(str(path) + suffix)
    seed = SQLiteSession(SESSION, str(path))
    await seed.add_items(history())
    seed.close()
    session = ProtoPromptSession(SESSION, str(path), windowed_reads=True, snapshot_min_items=8)
    callback = session.input_callback(builder())
    await prepare_input_with_session([QUESTION], session, callback)
    state = session._debug_state(wait_for_save=True)
    assert state.snapshot_items == len(history()), state
    assert state.count_store is not None
    state.count_store.close()
    session.close()
    with sqlite3.connect(path) as conn:  # one self-contained file: no WAL beside it
        conn.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "main_format.db"
    asyncio.run(main(target))
    print(f"wrote {target} ({os.path.getsize(target)} bytes)")
