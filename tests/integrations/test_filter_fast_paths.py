"""Issue 33: the per-call filter's fast paths (work a call skips because its inputs did not
change) are taken, and give what the slow path gives."""

from __future__ import annotations

import random
from typing import Any

from protoprompt.integrations._calls._runs import common_prefix


def _reference_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b)) // 16
    return next((i for i in range(n) if a[16 * i : 16 * i + 16] != b[16 * i : 16 * i + 16]), n)


def test_common_prefix_of_digests_is_the_digest_by_digest_count() -> None:
    rng = random.Random(33)
    for _ in range(400):
        n = rng.randrange(0, 40)
        a = bytes(rng.randrange(256) for _ in range(16 * n))
        b = bytearray(a[: 16 * rng.randrange(0, n + 1)])
        b += bytes(rng.randrange(256) for _ in range(16 * rng.randrange(0, 5)))
        if b and rng.random() < 0.5:  # one byte changed somewhere
            b[rng.randrange(len(b))] ^= 1 + rng.randrange(255)
        for x, y in ((a, bytes(b)), (bytes(b), a)):
            assert common_prefix(x, y) == _reference_prefix(x, y)


def test_the_request_digest_is_computed_once_per_content() -> None:
    """``RequestCosts.extras``' stable digest (the request key's) is found again by the
    content of what it digests: an unchanged agent is digested once; a schema edited in
    place, or other instructions, are digested again; every digest equals the slow path's."""
    import asyncio

    from agents import Agent, function_tool

    from protoprompt.integrations._calls._request import (
        RequestCosts,
        output_format,
        stable_digest,
        tool_definitions,
    )

    @function_tool
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    agent = Agent(name="a", tools=[lookup], instructions="Use the tool.")
    costs = RequestCosts()

    def extras(instructions: str) -> bytes:
        got = asyncio.run(costs.extras(agent, None, instructions, "o200k_base"))
        slow = stable_digest([instructions, tool_definitions([lookup]), output_format(agent)])
        assert got.digest == slow
        return got.digest

    first = extras("Use the tool.")
    assert costs.digested == 1
    for _ in range(3):
        assert extras("Use the tool.") == first
    assert costs.digested == 1, "an unchanged request is not digested again"
    lookup.params_json_schema["properties"]["q"]["description"] = "what to look up"
    edited = extras("Use the tool.")
    assert costs.digested == 2 and edited != first, "a schema edited in place is seen"
    assert extras("Use the tools.") not in (first, edited)
    assert costs.digested == 3


def _request(n: int, *, out: str = "result") -> Any:
    from protoprompt.integrations._calls._planner import RunPrefix

    items: list[Any] = [{"role": "user", "content": "look it up"}]
    for k in range(n):
        items.append({"type": "function_call", "call_id": f"c{k}", "name": "f", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{k}", "output": f"{k} {out}"})
    key = (10, 20, 0, ("note",), bytes(range(16)))
    copies = {2: bytes(16)} if len(items) > 2 else {}
    return RunPrefix(items, len(items), 1234 + n, key, 1, [0], copies)


def test_the_stored_request_continues_the_previous_compression() -> None:
    """A state's writer encodes a request that extends the one it stored last by the JSON
    of what was appended only, continuing its compression (``Encoded.continued``); the stored
    form reads back as the one-shot encode's, byte for byte once decompressed."""
    import zlib

    from protoprompt.integrations._stores._prefix_state import Encoded, decode, encode

    bound = ["db", "messages", 'a "quoted", session']
    kept = Encoded()

    def both(prefix: Any) -> bytes:
        fast = encode(prefix, bound, kept)
        slow = encode(prefix, bound)
        assert fast is not None and slow is not None
        assert zlib.decompress(fast) == zlib.decompress(slow)
        back = decode(fast, bound)
        assert back is not None and back.items == prefix.items
        assert (back.key, back.pins, back.copies) == (prefix.key, prefix.pins, prefix.copies)
        return fast

    both(_request(3))
    assert kept.continued == 0 and kept.dumped == 7
    both(_request(5))  # two steps appended
    assert kept.continued == 7 and kept.dumped == 11, "only what was appended is encoded"
    both(_request(5))  # the same request again
    assert kept.continued == 11 and kept.dumped == 11
    edited = _request(6)
    edited.items[3]["output"] = "edited in place"  # an item the last encode had: afresh
    both(edited)
    assert kept.continued == 0 and kept.dumped == 11 + 13
    both(_request(0))  # shorter: afresh
    assert kept.continued == 0
    both(_request(2))
    assert kept.continued == 1
    assert encode(_request(0, out="x"), ["other", "bound", "s"], kept) is not None
    assert kept.continued == 0, "another binding starts afresh"
    bad = _request(2)
    bad.items.append({"type": "message", "content": object()})
    assert encode(bad, bound, kept) is None and encode(bad, bound) is None
