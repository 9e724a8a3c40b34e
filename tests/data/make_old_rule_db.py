"""Write ``old_rule.db``: a session database written by protoprompt 0.2.0 before opaque
payloads were costed by their decoded size (commit 1d25e97, cost rule 1).

It holds one stored session (``"old-rule"``) of a reasoning-heavy agentic history, the
count store the session filled while packing it (counts of canonical texts that hold the
base64 ``encrypted_content`` of reasoning and compaction items) and the index snapshot
the session wrote (costs counted under rule 1). ``tests/packing/test_cost_rule.py`` opens it with
the current code and checks that none of that is reused for those items.

Run with a build of that commit (``python tests/data/make_old_rule_db.py``); the file is
checked in, so the tests never need the old build.
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def history(seed: int = 23) -> list[dict]:
    """A reasoning-heavy tool loop: every step is reasoning (with an encrypted payload the
    size gpt-5 writes), a function call and its output; a compaction item in the middle."""
    rng = random.Random(seed)

    def payload(n: int) -> str:
        # Fernet-like: URL-safe base64 of a version byte, a timestamp, an IV and ciphertext.
        raw = bytes([0x80]) + bytes(rng.randrange(256) for _ in range(n - 1))
        return base64.urlsafe_b64encode(raw).decode()

    items: list[dict] = [{"role": "user", "content": "Audit the three invoices, please."}]
    for step in range(12):
        items.append(
            {
                "type": "reasoning",
                "id": f"rs_{step}",
                "summary": [{"type": "summary_text", "text": f"Step {step}: check invoice."}],
                "encrypted_content": payload(rng.randrange(1500, 6000)),
            }
        )
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{step}",
                "call_id": f"call_{step}",
                "name": "lookup",
                "arguments": f'{{"invoice": {step}}}',
            }
        )
        items.append(
            {
                "type": "function_call_output",
                "call_id": f"call_{step}",
                "output": f"invoice {step}: total {rng.randrange(100, 9999)} EUR " * 20,
            }
        )
        if step == 5:
            items.append({"type": "compaction", "id": "cmp_1", "encrypted_content": payload(4000)})
    items.append(
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": "All three invoices add up.", "annotations": []}
            ],
        }
    )
    return items


async def main(path: Path) -> None:
    from protoprompt import MemoryStore, TokenBudgetedContextBuilder
    from protoprompt.integrations import ProtoPromptSession

    if path.exists():
        path.unlink()
    session = ProtoPromptSession("old-rule", str(path), snapshot_min_items=8)
    await session.add_items(history())
    builder = TokenBudgetedContextBuilder(MemoryStore(), max_tokens=200_000, output_reserve=1000)
    callback = session.input_callback(builder)
    items = await session.get_items()
    await callback(items, [{"role": "user", "content": "And the fourth?"}])
    state = session._debug_state(wait_for_save=True)
    assert state.snapshot_items == len(items), state
    assert state.count_store is not None
    state.count_store.close()
    session.close()
    import sqlite3

    with sqlite3.connect(path) as conn:  # one self-contained file: no WAL beside it
        conn.execute("PRAGMA journal_mode=DELETE")
    with sqlite3.connect(path) as conn:
        conn.execute("VACUUM")


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "old_rule.db"
    asyncio.run(main(target))
    print(f"wrote {target} ({os.path.getsize(target)} bytes)")
