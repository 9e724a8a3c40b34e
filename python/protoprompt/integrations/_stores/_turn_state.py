"""The session callback's cache-stable prefix, stored beside the history (issue 34 #4).

The callback's previous request (``_planner.TurnPrefix``: the history positions it sent, the
copies it sent in place of stored items, the masked set) is stored with the per-call
filter's request and the index snapshot, in the session's own engine (table
``protoprompt_turn_prefix``; in Redis the hash ``{session}:protoprompt:turn``, expiring
with the session's list), so a restarted process or another worker continues the same
prefix from the next turn on.

What is stored: a versioned JSON form, bound to the database's id, the messages table and
the session id, and to the callback's budget and policy, of the positions the request sent
(the cut and every kept position), the history's length then, the copies it sent in place of
stored items (masked tool outputs, id-less calls whose reasoning was left out) with their
positions in the request, the request's tokens, its context message's text, the masked
units' whole costs, the move sizing's counters, and a content digest (BLAKE2b of the
canonical JSON, item by item) of the stored items at the kept positions; zlib-compressed, at most
``_prefix_state.MAX_BYTES``. Never the stored items themselves: they are read from the
history.

Nothing stored is trusted: a record of another format, session, budget or policy, or
damaged, is ignored; one whose positions the history does not hold, whose digest does not
match the items the history holds there now, or whose copies are not of the kind and call
of the item they stand for, is ignored too (the turn then starts a new prefix). Writes are
compare-and-set on a random version, so two workers never overwrite each other's newer
request (``_prefix_state.StoredState``).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

from ... import _core
from ..._storage import Kind, Record
from ..._storage.records import Field
from .._calls._planner import TurnPlanner, TurnPrefix
from ._prefix_state import MAX_BYTES, StoredState

__all__ = ["FORMAT", "KIND", "DigestMemo", "StoredTurn", "TurnState", "of", "restore"]

KIND = Kind(
    "protoprompt_turn_prefix",
    "turn",
    (Field("version", "int"), Field("data", "blob")),
    version="version",
)
FORMAT = "protoprompt turn prefix 1"
"""The stored form's version (the digest: BLAKE2b of the items' BLAKE2b digests)."""


def _item_digest(item: Any) -> bytes:
    """BLAKE2b of ``item``'s canonical JSON (raises ``TypeError`` / ``ValueError`` when it
    is not JSON)."""
    text = json.dumps(item, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


class DigestMemo:
    """:meth:`digest` of a session's kept items, which every process computes alike, with
    the per-item digests of the last call remembered by the items' process digests
    (``_core.digests``: keyed per process, so never stored): a turn that appended to the
    request digests only what it appended."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.known: dict[bytes, bytes] = {}

    def digest(self, items: list[Any], keyed: bytes | None = None) -> str | None:
        """The digest of ``items`` (``keyed``: their process digests, 16 bytes each, when
        known); ``None`` when one is not JSON."""
        if keyed is None or len(keyed) != 16 * len(items):
            keyed, _ = _core.digests(items, None)
        with self.lock:
            known = self.known
        fresh: dict[bytes, bytes] = {}
        out = hashlib.blake2b(digest_size=16)
        for i, item in enumerate(items):
            key = bytes(keyed[16 * i : 16 * i + 16])
            found = known.get(key) or fresh.get(key)
            if found is None:
                try:
                    found = _item_digest(item)
                except (TypeError, ValueError):
                    return None
            fresh[key] = found
            out.update(found)
        with self.lock:
            self.known = fresh
        return out.hexdigest()


@dataclass
class StoredTurn:
    """The callback's prefix as stored (positions are of the whole stored history)."""

    key: list[Any]
    """The callback's budget and policy (:func:`planner_key`)."""
    kept: list[int]
    end: int
    copies: list[tuple[int, bool, dict[str, Any]]]
    """``(position in the request's history part, masked, the copy sent)``."""
    request_tokens: int
    context: str | None
    whole: dict[int, int]
    turns_since_move: int
    moved_tokens: int | None
    digest: str | None = None
    """:meth:`DigestMemo.digest` of the stored items at :attr:`kept` (made by the writer
    from :attr:`originals`)."""
    originals: list[Any] = field(default_factory=list)
    """The stored items at :attr:`kept` (writer side only, never stored)."""
    keyed: bytes = b""
    """Their process digests (writer side only, never stored)."""


def planner_key(planner: TurnPlanner, budget: int) -> list[Any]:
    """What a stored prefix is bound to besides the session: the budget and the policy."""
    p = planner.policy
    return [budget, float(p.low_water), p.keep_recent, p.excerpt_tokens, p.omit_reasoning]


def of_planner(
    planner: TurnPlanner, budget: int, history: list[Any], offset: int
) -> StoredTurn | None:
    """The planner's prefix as it is now, to store (``None``: none, or not held by
    ``history``, which starts at position ``offset``)."""
    last = planner.last
    if last is None or (last.kept and last.kept[0] < offset):
        return None
    originals = [history[p - offset] for p in last.kept]
    masked = {id(x) for x in last.masked}
    copies = [
        (i, id(x) in masked, x)
        for i, (x, o) in enumerate(zip(last.sent, originals, strict=True))
        if x is not o
    ]
    return StoredTurn(
        planner_key(planner, budget),
        list(last.kept),
        last.end,
        copies,
        last.request_tokens,
        last.context,
        dict(last.whole),
        planner.turns_since_move,
        planner.moved_tokens,
        originals=originals,
        keyed=last.originals,
    )


def _same_kind(copy: Any, original: Any) -> bool:
    """A copy stands for ``original``: a dict of its type, role and call."""
    return (
        isinstance(copy, dict)
        and isinstance(original, dict)
        and all(copy.get(k) == original.get(k) for k in ("type", "role", "call_id"))
    )


def restore(
    stored: StoredTurn, history: list[Any], offset: int, memo: DigestMemo
) -> TurnPrefix | None:
    """The callback's prefix from ``stored``, when ``history`` (which starts at position
    ``offset``) holds it unchanged; else ``None``."""
    kept, end = stored.kept, stored.end
    total = offset + len(history)
    if end > total or any(not offset <= p < end for p in kept):
        return None
    if any(a >= b for a, b in itertools.pairwise(kept)):
        return None
    originals = [history[p - offset] for p in kept]
    digests, _ = _core.digests(originals, None)
    if stored.digest is None or memo.digest(originals, digests) != stored.digest:
        return None
    sent = list(originals)
    masked: list[Any] = []
    for i, is_masked, copy in stored.copies:
        if not 0 <= i < len(sent) or sent[i] is not originals[i]:
            return None  # out of range, or two copies for one item
        if not _same_kind(copy, originals[i]):
            return None
        sent[i] = copy
        if is_masked:
            masked.append(copy)
    return TurnPrefix(
        sent=sent,
        kept=list(kept),
        end=end,
        originals=bytes(digests[: 16 * len(kept)]),
        masked=masked,
        request_tokens=stored.request_tokens,
        context=stored.context,
        whole=dict(stored.whole),
    )


def encode(value: StoredTurn, bound: list[str], memo: DigestMemo) -> bytes | None:
    """The stored form of ``value`` (``None``: not JSON, or larger than ``MAX_BYTES``)."""
    digest = value.digest or memo.digest(value.originals, value.keyed)
    if digest is None:
        return None
    try:
        raw = json.dumps(
            {
                "format": FORMAT,
                "bound": bound,
                "key": value.key,
                "kept": value.kept,
                "end": value.end,
                "copies": [[i, m, c] for i, m, c in value.copies],
                "request_tokens": value.request_tokens,
                "context": value.context,
                "whole": [[p, t] for p, t in value.whole.items()],
                "moves": [value.turns_since_move, value.moved_tokens],
                "digest": digest,
            },
            separators=(",", ":"),
        ).encode()
    except (TypeError, ValueError):
        return None
    data = zlib.compress(raw, 1)
    return data if len(data) <= MAX_BYTES else None


def _nat(value: Any) -> bool:
    return type(value) is int and value >= 0


def _pairs(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, list) and len(x) == 2 and _nat(x[0]) and _nat(x[1]) for x in value
    )


def _copies(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(x, list)
        and len(x) == 3
        and _nat(x[0])
        and isinstance(x[1], bool)
        and isinstance(x[2], dict)
        for x in value
    )


def _valid(found: dict[str, Any]) -> bool:
    kept, moves = found.get("kept"), found.get("moves")
    return (
        isinstance(found.get("key"), list)
        and isinstance(kept, list)
        and all(_nat(p) for p in kept)
        and _nat(found.get("end"))
        and _copies(found.get("copies"))
        and _nat(found.get("request_tokens"))
        and (found.get("context") is None or isinstance(found.get("context"), str))
        and _pairs(found.get("whole"))
        and isinstance(moves, list)
        and len(moves) == 2
        and _nat(moves[0])
        and (moves[1] is None or _nat(moves[1]))
        and isinstance(found.get("digest"), str)
    )


def decode(data: object, bound: list[str]) -> StoredTurn | None:
    """What :func:`encode` stored, or ``None`` (another format or binding, damaged)."""
    if type(data) is not bytes:
        return None
    try:
        found = json.loads(zlib.decompressobj().decompress(data, MAX_BYTES * 64))
    except (zlib.error, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    if found.get("bound") != bound or not _valid(found):
        return None
    return StoredTurn(
        key=found["key"],
        kept=found["kept"],
        end=found["end"],
        copies=[(i, m, c) for i, m, c in found["copies"]],
        request_tokens=found["request_tokens"],
        context=found["context"],
        whole=dict(found["whole"]),
        turns_since_move=found["moves"][0],
        moved_tokens=found["moves"][1],
        digest=found["digest"],
    )


class TurnState(StoredState[StoredTurn]):
    """The session callback's prefix, stored (see the module's docstring)."""

    def __init__(self, record: Record, database_id: str) -> None:
        super().__init__(record, database_id)
        self.memo = DigestMemo()

    def _encode(self, value: StoredTurn) -> bytes | None:
        return encode(value, self.bound, self.memo)

    def _decode(self, data: object) -> StoredTurn | None:
        return decode(data, self.bound)


def of(store: object) -> TurnState | None:
    """The turn record of a session's history store (``None``: its engine keeps none)."""
    found = getattr(store, "turns", None)
    return found if isinstance(found, TurnState) else None


def resume(
    planner: TurnPlanner, state: TurnState, budget: int, history: list[Any], offset: int
) -> bool:
    """Take the stored prefix when another process or worker stored a newer one that
    ``history`` holds (caller holds the planner's lock); whether it was taken."""
    stored = state.load()
    if stored is None or stored.key != planner_key(planner, budget):
        return False
    prefix = restore(stored, history, offset, state.memo)
    if prefix is None:
        return False
    planner.last = prefix
    planner.turns_since_move = stored.turns_since_move
    planner.moved_tokens = stored.moved_tokens
    return True
