"""Token counts of texts a turn counts again and again (the blocks of recalled passages, the
context message as it grows), kept in memory for the process, keyed by the content.

A turn with recall counts each recalled passage's block, the context message at each step
of its assembly, and the passages it leaves out; the next turn finds many of the same
passages. The counts are kept by a digest of the counted text (BLAKE2b, 128 bits) with the
model, the encoding and what was counted (a text, or a message of a role): a count is only
reused for the same content, never for an object that may have changed since. Bounded:
at most :data:`MAX_ENTRIES` counts; when full, the older half is dropped. No lock: each
dictionary operation is atomic, and a count lost in a race is only counted again; a forked
child keeps the parent's counts (they are facts about texts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

MAX_ENTRIES = 32768
"""Counts kept at most (about 5 MB)."""

_Key = tuple[str, str | None, str | None, bytes]

_counts: dict[_Key, int] = {}
stats = {"hits": 0, "misses": 0}
"""Counts found and counted since the process started (or the last :func:`clear`): what
the tests read to see that the memo was used."""


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def counts(
    kind: str,
    texts: Sequence[str],
    model: str | None,
    encoding: str | None,
    count: Callable[[list[str]], list[int]],
) -> list[int]:
    """The counts of ``texts`` (``kind`` names what is counted, e.g. ``"text"`` or a
    message's role): those kept, and the others counted with ``count`` (one call, in order)
    and kept."""
    keys = [(kind, model, encoding, _digest(t)) for t in texts]
    found = [_counts.get(k) for k in keys]
    todo = [i for i, n in enumerate(found) if n is None]
    stats["hits"] += len(texts) - len(todo)
    if todo:
        stats["misses"] += len(todo)
        new = count([texts[i] for i in todo])
        if len(new) != len(todo):  # pragma: no cover - the counters return one per text
            raise RuntimeError("token counter returned the wrong number of counts")
        if len(_counts) + len(todo) > MAX_ENTRIES:
            _shrink()
        for i, n in zip(todo, new, strict=True):
            found[i] = n
            _counts[keys[i]] = n
    return [int(n) for n in found if n is not None]


def _shrink() -> None:
    """Drop the older half of the kept counts."""
    old = list(_counts)[: len(_counts) // 2 + 1]
    for key in old:
        _counts.pop(key, None)


def clear() -> None:
    """Forget every kept count and zero :data:`stats`."""
    _counts.clear()
    stats["hits"] = stats["misses"] = 0
