"""Issue 33: the per-call filter's fast paths (work a call skips because its inputs did not
change) are taken, and give what the slow path gives."""

from __future__ import annotations

import random

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
