"""A cache-stable prefix: consecutive requests that extend each other, so the provider's
prompt cache bills the repeated part at a fraction of the input price.

:func:`plan_prefix` decides one request of a session from the previous decision
(:class:`PrefixState`): while the request fits the budget, the cut (the first kept history
item) and the masked set stay where they were and the request is the previous one plus what
was appended, item for item and byte for byte. When it no longer fits, the cut moves once,
far enough that the request falls to ``low_water`` times the budget, and tool outputs older
than the newest ``keep_recent`` turns are masked in that same step before any turn is
dropped. The decision is the Rust core's (``protoprompt_core::prefix``).

A session's per-call filter takes a :class:`CachePolicy` as ``cache=``
(``session.run_config(..., cache=pp.CachePolicy())``, see ``docs/prompt-cache.md``); a
:class:`PrefixState` is valid in the process that made it only (its digests are keyed per
process).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import _core
from ._packing._run import max_tokens_of
from ._packing._types import MAX_TOKENS, MIN_EXCERPT_TOKENS

Item = Mapping[str, Any]

RECENT_ROOM = 0.35
"""With ``CachePolicy(head=None)`` (the default), the share of the budget a move leaves to
the newest items: the head is ``low_water - RECENT_ROOM``. Measured in
``docs/prompt-cache.md`` ("Choosing the policy")."""

__all__ = ["CachePolicy", "PrefixPlan", "PrefixState", "plan_prefix"]


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if value > MAX_TOKENS:
        raise ValueError(f"{name} must be at most 2**64 - 1, got {value}")


@dataclass(frozen=True)
class CachePolicy:
    """How a session's request prefix moves (see :func:`plan_prefix`).

    Args:
        low_water: the fraction of the budget a request falls to when the cut moves, in
            ``(0, 1]``: lower moves less often and shows less history.
        keep_recent: how many newest turns of the history keep their tool outputs whole
            once masking starts (older ones are masked before any turn is dropped).
        excerpt_tokens: tokens a masked text output keeps, marker included (at least 16;
            as :class:`~protoprompt.Masking`).
        omit_reasoning: a move also leaves earlier turns' OpenAI reasoning out of the units
            it masks (``Masking(omit_reasoning=True)``; the current turn's tool loop and
            Claude's thinking keep theirs). Applied by the session callback and per-call
            filter; :func:`plan_prefix` masks tool outputs only.
        head: a fraction of the budget, in ``[0, low_water)``: when the cut must move, the
            session callback and per-call filter keep the start of the previous request's
            history -- whole units, as sent (masked copies included), up to this many
            tokens -- and drop the oldest items after it instead, so a move repeats the
            instructions, tools, context message and that head. The head then stays the
            same from move to move. ``0``: a move drops from the start. ``None`` (the
            default): ``low_water - RECENT_ROOM`` (0.4 with the default mark), so a move
            leaves :data:`RECENT_ROOM` of the budget to the newest items whatever the mark;
            none when the mark is that low (see :attr:`head_share`). :func:`plan_prefix`
            ignores it.

    The defaults (``low_water=0.75``, ``keep_recent=1``, a head of 0.4) are measured in
    ``docs/prompt-cache.md`` ("Choosing the policy").

    Raises:
        TypeError / ValueError: an argument is not a number of the right kind, or out of
            range.
    """

    low_water: float = 0.75
    keep_recent: int = 1
    excerpt_tokens: int = 64
    omit_reasoning: bool = True
    head: float | None = None

    def __post_init__(self) -> None:
        lw = self.low_water
        if isinstance(lw, bool) or not isinstance(lw, (int, float)):
            raise TypeError(f"low_water must be a float, got {type(lw).__name__}")
        if not (math.isfinite(lw) and 0 < lw <= 1):
            raise ValueError(f"low_water must be a fraction of the budget in (0, 1], got {lw}")
        _check_int("keep_recent", self.keep_recent, 0)
        _check_int("excerpt_tokens", self.excerpt_tokens, MIN_EXCERPT_TOKENS)
        if not isinstance(self.omit_reasoning, bool):
            raise TypeError(
                f"omit_reasoning must be a bool, got {type(self.omit_reasoning).__name__}"
            )
        head = self.head
        if head is None:
            return
        if isinstance(head, bool) or not isinstance(head, (int, float)):
            raise TypeError(f"head must be a float, got {type(head).__name__}")
        if not (math.isfinite(head) and 0 <= head < lw):
            raise ValueError(
                f"head must be a fraction of the budget in [0, low_water={lw}), got {head}"
            )

    @property
    def head_share(self) -> float:
        """The head a move keeps, as a fraction of the budget: :attr:`head`, or with
        ``head=None`` ``low_water - RECENT_ROOM`` (never below 0)."""
        if self.head is not None:
            return float(self.head)
        return max(0.0, round(self.low_water - RECENT_ROOM, 9))


@dataclass(frozen=True)
class PrefixState:
    """The decision :func:`plan_prefix` hands to the next call of the same session.

    Opaque to callers: unit indices and digests of the history it covered. Valid in the
    process that made it only; a state that does not match the next history (rewritten,
    popped, compacted) is ignored and the plan says so.
    """

    cut: int
    end: int
    masked: tuple[int, ...]
    pinned: tuple[int, ...]
    before_cut: bytes
    kept: bytes


@dataclass(frozen=True)
class PrefixPlan:
    """One request planned by :func:`plan_prefix`.

    Attributes:
        request: the items to send: the kept history in order, masked copies in place of
            the items sent masked (the history's items are never changed), then the new
            input.
        kept_history: history positions sent, in order.
        masked_positions: history positions sent as masked copies.
        cut_position: the history position the request's optional history starts at
            (``None``: no optional history is sent).
        tokens: the request's tokens plus ``output_reserve`` and ``context_tokens``: what
            the budget is checked against.
        shared_tokens: tokens of the items the previous request sent in the same order from
            its start (0 on the first call, after a move or a reset).
        reason_code: ``"fresh_fits"``, ``"fresh_cut"``, ``"stayed"``, ``"moved"`` or
            ``"reset"`` (the previous state did not match the history).
        reason: the same in words, e.g. ``"did not fit: cut moved from history[12] to
            history[40], request 127400 -> 88900"``.
        state: hand it to the next :func:`plan_prefix` call of this session.
    """

    request: list[Item]
    kept_history: tuple[int, ...]
    masked_positions: tuple[int, ...]
    cut_position: int | None
    tokens: int
    shared_tokens: int
    reason_code: str
    reason: str
    state: PrefixState

    @property
    def moved(self) -> bool:
        """Whether the cut was set or moved by this call rather than kept."""
        return self.reason_code != "stayed"


def plan_prefix(
    history: Sequence[Item],
    new_input: Sequence[Item],
    *,
    max_tokens: int | None = None,
    budget: int | None = None,
    output_reserve: int = 0,
    context_tokens: int = 0,
    cache: CachePolicy | None = None,
    previous: PrefixState | None = None,
    model: str | None = None,
    encoding: str | None = None,
) -> PrefixPlan:
    """Plan one request of a session so that it extends the previous one while it fits.

    ``history`` is the session's stored history, ``new_input`` what this call adds (always
    sent whole, with the history it depends on); ``previous`` is the :attr:`PrefixPlan.state`
    of the session's last call (``None`` on the first). Items are kept, masked or dropped
    with their atomic units (``docs/item-graph.md``); invalid history units are never sent.
    A :class:`~protoprompt.integrations.ProtoPromptSession`'s per-call filter applies the
    same policy to the SDK's requests itself (``cache=``; ``docs/prompt-cache.md``).
    ``max_tokens`` is the budget (the request plus ``output_reserve``); ``budget``, its old
    name, is accepted until 1.1 with a ``DeprecationWarning``.

    Raises:
        TokenBudgetExceededError: the new input, the history it depends on and the
            reservations alone exceed ``max_tokens``.
        ConflictingArgumentsError: both ``max_tokens`` and ``budget`` are given.
        InvalidNewInputError: the new input cannot be sent (names the item and the rule).
        InvalidItemError: an item cannot be read (names the item and the field).
        TypeError / ValueError: an argument of the wrong kind or out of range.
    """
    policy = CachePolicy() if cache is None else cache
    if not isinstance(policy, CachePolicy):
        raise TypeError(f"cache must be a CachePolicy or None, got {type(policy).__name__}")
    if previous is not None and not isinstance(previous, PrefixState):
        raise TypeError(f"previous must be a PrefixState or None, got {type(previous).__name__}")
    limit = max_tokens_of("plan_prefix", max_tokens, budget)
    if limit is None:
        raise TypeError("plan_prefix() missing required keyword argument: 'max_tokens'")
    for name, value in (
        ("max_tokens" if budget is None else "budget", limit),
        ("output_reserve", output_reserve),
        ("context_tokens", context_tokens),
    ):
        _check_int(name, value, 0)
    history = list(history)
    new_input = list(new_input)
    prev = None
    if previous is not None:
        p = previous
        prev = (p.cut, p.end, list(p.masked), list(p.pinned), p.before_cut, p.kept)
    kept, copies, tokens, shared, code, reason, cut_position, state = _core.plan_prefix(
        history,
        new_input,
        budget=limit,
        output_reserve=output_reserve,
        context_tokens=context_tokens,
        low_water=float(policy.low_water),
        keep_recent=policy.keep_recent,
        excerpt_tokens=policy.excerpt_tokens,
        previous=prev,
        model=model,
        encoding=encoding,
    )
    masked = dict(copies)
    request: list[Item] = [masked.get(p, history[p]) for p in kept]
    request.extend(new_input)
    cut, end, masked_units, pinned, before_cut, kept_digest = state
    return PrefixPlan(
        request=request,
        kept_history=tuple(kept),
        masked_positions=tuple(sorted(masked)),
        cut_position=cut_position,
        tokens=tokens,
        shared_tokens=shared,
        reason_code=code,
        reason=reason,
        state=PrefixState(
            cut=cut,
            end=end,
            masked=tuple(masked_units),
            pinned=tuple(pinned),
            before_cut=bytes(before_cut),
            kept=bytes(kept_digest),
        ),
    )
