"""The session's cache-stable prefix (issue 34): each model call's request extends the
previous call's while it fits, so the provider's prompt cache bills the repeated part at its
cached-input price.

The per-call filter of a :class:`~protoprompt.integrations.ProtoPromptSession` given a
:class:`~protoprompt.CachePolicy` keeps the request it sent last (its items as sent: the
same objects, the same masked copies). The next call's candidate is that request plus what
the SDK appended since; when the whole candidate fits the budget it is sent as it is
(``"stayed"``): the previous request byte for byte, then the new items. When it does not
fit, the cut moves once (``"moved"``): the SDK's whole input is packed newest first to
``low_water`` times the budget, with the tool outputs of all but the policy's
``keep_recent`` newest turns masked, and that request becomes the new prefix, leaving room
for the calls that follow. A run's first call resumes the session's previous request when
its input (the callback's request) holds that request's last items and the same context
message (:func:`resume`); otherwise it sends the callback's request as it is when that fits.

Nothing is trusted because it was sent before: the candidate is packed by the core like any
request (classified through the prefix's index, which re-reads any item whose content
changed), and it is sent unchanged only when the core keeps every one of its units.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .. import _core
from ..packing import HistoryIndex

if TYPE_CHECKING:
    from ..packing import PackResult
    from ._request import RequestExtras

__all__ = [
    "RunPrefix",
    "Stable",
    "candidate",
    "kept_whole",
    "move",
    "move_reason",
    "request_key",
    "resume",
    "stay",
]


def request_key(extras: RequestExtras) -> tuple[Any, ...]:
    """What the call sends before its input items (instructions, tools, output schema),
    as far as the filter can tell a change: their costs, what is not counted and the digest
    of their content (an edit of equal cost is a change too)."""
    return (
        extras.instructions,
        extras.tools,
        extras.output_schema,
        tuple(extras.not_counted),
        extras.digest,
    )


@dataclass
class RunPrefix:
    """The request a run sent last, as the next call's prefix."""

    items: list[Any]
    """The previous request's input items, as sent (masked copies included)."""
    source_len: int
    """Length of the SDK's input list that request was made from."""
    request_tokens: int
    """The previous request's tokens (items, instructions, tools, output schema)."""
    key: tuple[Any, ...]
    """:func:`request_key` of the previous call."""
    cut: int | None
    """The SDK input position of the first optional item sent at the last move."""
    pins: list[int]
    """Positions in :attr:`items` of the pinned items (context message, run input)."""
    index: HistoryIndex = field(default_factory=HistoryIndex)
    """The candidates' index: each candidate extends the previous one."""
    digests: bytes = b""
    """Digests of the items the index holds."""

    def sync(self, items: list[Any]) -> None:
        """Cut the index back to the first item of ``items`` whose content it has not seen."""
        digests, same = _core.digests(items, self.digests)
        if same < len(self.index):
            self.index.truncate(same)
        self.digests = digests[: 16 * len(items)]

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + len(self.digests) + 8 * len(self.items)


def _content(item: Any) -> str:
    return json.dumps(item, sort_keys=True, default=str)


def resume(last: RunPrefix | None, items: list[Any], context: bool) -> RunPrefix | None:
    """The session's previous request as the prefix of a new run's first call, when
    ``items`` (the callback's request) holds the last two items that request sent, by
    content, with what followed them after: the previous run's stored output and this
    run's input. ``context``: ``items[0]`` is the callback's context message, which must
    then equal (by content) the one the previous request starts with. ``None`` when it
    does not (a pop, a clear, a cut the callback moved past them, a context message that
    changed): the call then starts afresh."""
    if last is None or not last.items:
        return None
    if context and (0 not in last.pins or _content(last.items[0]) != _content(items[0])):
        return None
    tail = [_content(x) for x in last.items[-2:]]
    for j in range(len(items) - 1, len(tail) - 2, -1):
        if _content(items[j]) != tail[-1]:
            continue
        if len(tail) == 2 and _content(items[j - 1]) != tail[0]:
            continue
        # The new run's input is appended: the old run's other pins are optional history
        # now. An index of its own: runs of one filter may pack at the same time.
        pins = [0] if context else []
        return RunPrefix(list(last.items), j + 1, last.request_tokens, last.key, last.cut, pins)
    return None


def candidate(prefix: RunPrefix, items: list[Any]) -> tuple[list[Any], int]:
    """The previous request plus what the SDK appended since (``items`` extends the list
    that request was made from), and where the appended part starts."""
    return [*prefix.items, *items[prefix.source_len :]], len(prefix.items)


def placed_pins(prefix: RunPrefix, pinned: list[int]) -> list[int]:
    """Every pinned item's position in the candidate: those the previous request sent where
    it sent them, the appended ones (a resumed run's input) after it."""
    n = len(prefix.items)
    appended = [n + p - prefix.source_len for p in pinned if p >= prefix.source_len]
    return sorted({*prefix.pins, *appended})


def run_input_at(pins: list[int], context_at: int | None) -> tuple[int, int] | None:
    """``[start, end)`` of the run input in a candidate, from its pinned positions."""
    ins = [p for p in pins if p != context_at]
    return (ins[0], ins[-1] + 1) if ins else None


def kept_whole(result: PackResult, cand: list[Any]) -> bool:
    """Whether the core sent ``cand`` as it is: every item, the same objects, in order."""
    sent = result.items
    return len(sent) == len(cand) and all(a is b for a, b in zip(sent, cand, strict=True))


def move_reason(
    call: int, old_cut: int | None, new_cut: int | None, before: int, after: int, masked: int
) -> str:
    """Why the cut moved, in words (positions in the SDK's input list)."""

    def at(p: int | None) -> str:
        return "no optional item" if p is None else f"input[{p:,}]"

    return (
        f"call {call} did not fit: cut moved from {at(old_cut)} to {at(new_cut)}, "
        f"request {before:,} -> {after:,}"
        + (f" ({masked:,} tool outputs masked)" if masked else "")
    )


@dataclass(frozen=True)
class Stable:
    """A call planned through the run's prefix."""

    result: PackResult
    items: list[Any]
    """The list packed (the candidate, or the SDK's list on a move)."""
    pinned: list[int]
    """Pinned positions in :attr:`items`, appended ones included."""
    step_start: int
    shared_tokens: int
    """Tokens this request repeats from the start of the run's previous request (0 after
    a move or when the instructions, tools or output schema changed)."""
    code: str
    """``"stayed"``, ``"moved"`` or ``"set"`` (the run's first request through it)."""
    reason: str
    request_changed: bool
    """The instructions, tools or output schema differ from the previous call's."""


def stay(
    prefix: RunPrefix,
    result: PackResult,
    placed: list[int],
    source_len: int,
    key: tuple[Any, ...],
    call: int,
) -> tuple[int, str, str, bool]:
    """Record a call that sent the previous request plus what was appended: ``(shared
    tokens, code, reason, request changed)``."""
    changed = key != prefix.key
    shared = 0 if changed else prefix.request_tokens
    reason = (
        f"call {call} extends the previous request ({shared:,} tokens repeated)"
        if not changed
        else f"call {call} extends the previous input, but the instructions, tools or output "
        "schema changed: nothing is a repeated prefix"
    )
    prefix.pins = placed
    prefix.items = list(result.items)
    prefix.source_len = source_len
    prefix.request_tokens = result.request_tokens
    prefix.key = key
    return shared, "stayed", reason, changed


def _first_cut(result: PackResult, pinned: list[int]) -> int | None:
    pins = set(pinned)
    return next((p for p in result.kept_history if p not in pins), None)


def move(
    previous: RunPrefix | None,
    result: PackResult,
    pinned: list[int],
    source_len: int,
    key: tuple[Any, ...],
    call: int,
) -> tuple[RunPrefix, int, str, str, bool]:
    """The run's new prefix after a move to the low-water mark, with ``(shared tokens,
    code, reason, request changed)``."""
    cut = _first_cut(result, pinned)
    where = {p: i for i, p in enumerate(result.kept_history)}
    pins = [where[p] for p in pinned if p in where]
    prefix = RunPrefix(list(result.items), source_len, result.request_tokens, key, cut, pins)
    if previous is None:
        reason = f"call {call}: the run's prefix set at {result.request_tokens:,} tokens"
        return prefix, 0, "set", reason, False
    reason = move_reason(
        call, previous.cut, cut, previous.request_tokens, result.request_tokens, len(result.masked)
    )
    return prefix, 0, "moved", reason, key != previous.key
