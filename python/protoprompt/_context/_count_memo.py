"""Token counts of texts a turn counts again and again (the blocks of recalled passages, the
context message as it grows), kept in memory for the process, keyed by the content.

A turn with recall counts each recalled passage's block, the context message at each step
of its assembly, and the passages it leaves out; the next turn finds many of the same
passages. The counts are kept by a digest of the counted text (BLAKE2b, 128 bits) with the
model, the encoding and what was counted (a text, or a message of a role): a count is only
reused for the same content, never for an object that may have changed since. Bounded:
at most :data:`MAX_ENTRIES` counts; when full, the older half is dropped. The short texts
counted last are kept by the text itself too (at most :data:`MAX_TEXTS`, of at most
:data:`MAX_TEXT_CHARS` characters: a string cannot change, and its hash is worked out once
per string), so a turn finds the frames and passages counted before without working out
their digests. No lock: each dictionary operation is atomic, and a count lost in a race is
only counted again; a forked child keeps the parent's counts (they are facts about texts).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import TypeVar

MAX_ENTRIES = 32768
"""Counts kept at most (about 5 MB)."""

MAX_TEXTS = 4096
MAX_TEXT_CHARS = 2048
"""Texts kept by the text itself at most, and their length at most (so at most about
8 M characters: the digests' memo holds the others)."""

_Key = tuple[str, str | None, str | None, bytes]
K = TypeVar("K")
_TextKey = tuple[str, str | None, str | None, str]

_counts: dict[_Key, int] = {}
_by_text: dict[_TextKey, int] = {}
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
    found = [_by_text.get((kind, model, encoding, t)) for t in texts]
    rest = [i for i, n in enumerate(found) if n is None]
    if not rest:
        stats["hits"] += len(texts)
        return [int(n) for n in found if n is not None]
    keys = {i: (kind, model, encoding, _digest(texts[i])) for i in rest}
    for i in rest:
        found[i] = _counts.get(keys[i])
    todo = [i for i in rest if found[i] is None]
    stats["hits"] += len(texts) - len(todo)
    if todo:
        stats["misses"] += len(todo)
        new = count([texts[i] for i in todo])
        if len(new) != len(todo):  # pragma: no cover - the counters return one per text
            raise RuntimeError("token counter returned the wrong number of counts")
        if len(_counts) + len(todo) > MAX_ENTRIES:
            _shrink(_counts, len(_counts) + len(todo) - MAX_ENTRIES)
        for i, n in zip(todo, new, strict=True):
            found[i] = n
            _counts[keys[i]] = n
    short = [i for i in rest if len(texts[i]) <= MAX_TEXT_CHARS][-MAX_TEXTS:]
    if len(_by_text) + len(short) > MAX_TEXTS:
        _shrink(_by_text, len(_by_text) + len(short) - MAX_TEXTS)
    for i in short:
        kept = found[i]
        if kept is not None:
            _by_text[(kind, model, encoding, texts[i])] = kept
    return [int(n) for n in found if n is not None]


def find(kind: str, text: str, model: str | None, encoding: str | None) -> int | None:
    """The kept count of ``text`` (counted as ``kind``), if any."""
    found = _by_text.get((kind, model, encoding, text)) if len(text) <= MAX_TEXT_CHARS else None
    if found is None:
        found = _counts.get((kind, model, encoding, _digest(text)))
    if found is not None:
        stats["hits"] += 1
    return found


def keep(kind: str, text: str, model: str | None, encoding: str | None, count: int) -> None:
    """Keep ``count`` as the count of ``text`` (counted as ``kind``, by the caller: a sum of
    kept counts of its parts that is its count)."""
    stats["misses"] += 1
    if len(_counts) + 1 > MAX_ENTRIES:
        _shrink(_counts, len(_counts) + 1 - MAX_ENTRIES)
    _counts[(kind, model, encoding, _digest(text))] = count
    if len(text) <= MAX_TEXT_CHARS:
        if len(_by_text) + 1 > MAX_TEXTS:
            _shrink(_by_text, len(_by_text) + 1 - MAX_TEXTS)
        _by_text[(kind, model, encoding, text)] = count


def _shrink(kept: dict[K, int], at_least: int) -> None:
    """Drop the older half of ``kept`` (or its ``at_least`` oldest, if more)."""
    old = list(kept)[: max(len(kept) // 2 + 1, at_least)]
    for key in old:
        kept.pop(key, None)


def clear() -> None:
    """Forget every kept count and zero :data:`stats`."""
    _counts.clear()
    _by_text.clear()
    stats["hits"] = stats["misses"] = 0
