"""A token-aware trigger for the Agents SDK's ``OpenAIResponsesCompactionSession``.

The SDK's compaction session decides when to compact with a hook,
``should_trigger_compaction(context) -> bool``; its default counts items (10 candidate
items). :func:`compaction_trigger` makes one that counts tokens: it is true when the
session's history costs more than ``at`` times the room a request has for it
(``builder.max_tokens - builder.output_reserve``), counted exactly as the packer counts --
so compaction runs before the packer has to drop anything::

    session = OpenAIResponsesCompactionSession(
        "chat",
        ProtoPromptSession("chat", "agents.db"),
        should_trigger_compaction=compaction_trigger(builder, at=0.8),
    )

It works wrapped either way: around a :class:`~protoprompt.integrations.ProtoPromptSession`
(as above) or inside one (``ProtoPromptSession("chat", inner_session=compaction_session)``).
The costs come from the session's index -- what the last turn counted -- for the items it
holds, and only the items stored since are counted; the rows are never read again, and the
count stops as soon as the answer is known (newest items first). Without an index that
describes the items (no turn of a ``ProtoPromptSession`` ran in this task, or a pop, clear
or rewrite happened since), the items the SDK hands to the hook are counted, with the same
result. :attr:`CompactionTrigger.last` says which way the last decision was counted, and
why.

openai-agents 0.23 and later compact only the stored suffix the last request sent unchanged
and ask the hook again for it: a suffix of a history the trigger has just approved is
approved (the limit is about the history; logged, and ``last.suffix_items`` says how many
items). openai-agents 0.22 replaces the whole history; in ``previous_response_id`` mode by a
compaction of the server's copy of the last request, which holds only what the packer sent:
the trigger refuses that (``last.refused``, a warning) -- use ``compaction_mode="input"``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._seams import compacts_to_a_snapshot
from ..packing import HistoryIndex
from ._turns._context import RUN_INPUT

if TYPE_CHECKING:
    from ..context import TokenBudgetedContextBuilder
    from .session import ProtoPromptSession

__all__ = ["CompactionCheck", "CompactionTrigger", "compaction_trigger"]

_log = logging.getLogger("protoprompt")


def _tail_matching() -> bool:
    """Whether the installed SDK matches the stored history to the request before an
    automatic compaction (openai-agents 0.23 and later: ``_CompactionSnapshot``)."""
    try:
        from agents.memory import session as sdk_session
    except ImportError:  # pragma: no cover - the trigger is only used with the SDK
        return True
    return compacts_to_a_snapshot(sdk_session)


REWRITING: contextvars.ContextVar[tuple[Any, int] | None] = contextvars.ContextVar(
    "protoprompt_rewriting", default=None
)
"""Set by a ``ProtoPromptSession`` while a call that may rewrite its history runs (a
compaction session inside it): ``(its index state, the epoch before the call)``. The
trigger runs inside that call, before any rewrite: the index still holds then."""


@dataclass(frozen=True)
class CompactionCheck:
    """One decision of a :class:`CompactionTrigger`."""

    trigger: bool
    """Whether the history costs more than ``limit``."""
    tokens: int
    """What the history's newest items cost, counted until the decision was known: the
    whole history's cost when it is ``limit`` or less, else more than ``limit``."""
    limit: int
    items: int
    """Items of the history the SDK handed to the hook."""
    from_index: int
    """Items whose costs came from the session's index (0: none)."""
    why_not_index: str | None
    """Why the index was not used (``None`` when it was)."""
    suffix_items: int | None = None
    """When the SDK asked again for the newest items it can compact (openai-agents 0.23
    and later compact only the stored suffix the last request sent unchanged): how many;
    ``tokens`` and ``items`` are still the whole history's. ``None``: a whole-history ask."""
    refused: str | None = None
    """Why compaction was refused although the history is over ``limit`` (``None``: it
    was not)."""

    def explain(self) -> str:
        verdict = "compact" if self.trigger else "do not compact"
        relation = ">" if self.tokens > self.limit else "<="
        where = (
            f"{self.from_index} of {self.items} items costed from the session's index"
            if self.why_not_index is None
            else f"{self.items} items counted ({self.why_not_index})"
        )
        text = f"{verdict}: history {self.tokens} {relation} {self.limit} tokens; {where}"
        if self.suffix_items is not None:
            text += f"; the SDK compacts the newest {self.suffix_items} items"
        if self.refused is not None:
            text += f"; refused: {self.refused}"
        return text


class CompactionTrigger:
    """A ``should_trigger_compaction`` hook (see :func:`compaction_trigger`)."""

    def __init__(
        self,
        builder: TokenBudgetedContextBuilder,
        at: float,
        session: ProtoPromptSession | None,
    ) -> None:
        self.builder = builder
        self.at = at
        self.session = session
        self.last: CompactionCheck | None = None
        """The latest decision, with how it was counted."""
        # The last whole-history approval, for the SDK's second ask (its suffix).
        self._approved: tuple[list[Any], CompactionCheck] | None = None
        self._approved_lock = threading.Lock()
        self._tail_matching = _tail_matching()

    @property
    def limit(self) -> int:
        """Tokens of history above which compaction is triggered."""
        from fractions import Fraction

        room = int(self.builder.max_tokens) - int(self.builder.output_reserve)
        # ``at`` as written (0.57, not the float just below it): 0.57 x 10,000 is 5,700.
        return max(math.floor(Fraction(repr(self.at)) * room), 0)

    def __call__(self, context: dict[str, Any]) -> bool:
        items = context.get("session_items") if isinstance(context, dict) else None
        if not isinstance(items, list):
            raise TypeError(
                "should_trigger_compaction expects the SDK's context with a 'session_items' list"
            )
        second = self._second_ask(items)
        if second is not None:
            return second
        over = self._decide(items)
        check = self.last
        assert check is not None
        if (
            over
            and not self._tail_matching
            and context.get("compaction_mode") == "previous_response_id"
        ):
            # 0.22: the SDK would replace the whole stored history by a compaction of the
            # server's copy of the last request, which holds only what the packer sent.
            why = (
                "openai-agents before 0.23 compacts the server's copy of the last request "
                "(previous_response_id), which holds only the items the packer sent, and "
                "replaces the whole stored history with it; construct the compaction session "
                "with compaction_mode='input'"
            )
            self.last = replace(check, trigger=False, refused=why)
            _log.warning("protoprompt: compaction refused: %s", why)
            over = False
        with self._approved_lock:
            self._approved = (items, check) if over else None
        return over

    def _second_ask(self, items: list[Any]) -> bool | None:
        """The answer to the SDK's second ask of a compaction (``None``: not one).

        After the hook approved the whole history (in ``run_compaction``, or in
        ``_defer_compaction`` before a forced one), openai-agents 0.23 and later match the
        stored history with the last request and ask again for the suffix they can compact
        (the newest items the request sent unchanged, from a user message on): a suffix that
        starts inside the approved history and goes on from there. The limit is about the
        history, which only grew since: the suffix is approved, once."""
        with self._approved_lock:
            found = self._approved
            if found is None or not _continues(found[0], items):
                return None
            self._approved = None
        check = found[1]
        self.last = replace(check, suffix_items=len(items))
        _log.info(
            "protoprompt: compaction: the history costs %d > %d tokens; the SDK compacts its "
            "newest %d items only (those the last request sent unchanged)",
            check.tokens,
            check.limit,
            len(items),
        )
        return True

    def _decide(self, items: list[Any]) -> bool:
        """Whether ``items`` (the whole stored history) cost more than the limit; sets
        :attr:`last`."""
        limit = self.limit
        ledger = self.session.run_ledger if self.session is not None else None
        if ledger is None:
            run = RUN_INPUT.get()
            ledger = run.ledger if run is not None else None
        options = self.builder.pack_options.replace(opaque_scale=self.builder.opaque_scale())
        why: str | None = "no session of this run"
        if ledger is not None:
            state, incremental = ledger.index()
            with state.lock:
                n = len(state.index)
                if not incremental:
                    why = "the session keeps no index"
                elif n == 0:
                    why = "the session's index is empty"
                elif state.synced_epoch != state.epoch and not _rewrite_pending(state):
                    why = "a pop, clear or rewrite since the session's last turn"
                elif n > len(items):
                    why = "the history is shorter than the session's index"
                else:
                    tokens, over = state.index.cost_over(
                        items[:n], limit, appended=items[n:], options=options
                    )
                    self.last = CompactionCheck(over, tokens, limit, len(items), n, None)
                    return over
        tokens, over = HistoryIndex().cost_over([], limit, appended=items, options=options)
        self.last = CompactionCheck(over, tokens, limit, len(items), 0, why)
        return over


def _match_key(item: Any) -> Any:
    """An item as compared with the SDK's snapshot (reasoning ids aside: the SDK may drop
    them by the run's policy)."""
    if isinstance(item, dict) and item.get("type") == "reasoning":
        return {k: v for k, v in item.items() if k != "id"}
    return item


def _continues(history: list[Any], suffix: list[Any]) -> bool:
    """Whether ``suffix`` starts inside ``history`` (not at its first item) and goes on
    from there: ``history[j:]`` is a prefix of ``suffix`` for some ``j >= 1``."""
    if not suffix or len(history) < 2:
        return False
    first = _match_key(suffix[0])
    for j in range(1, len(history)):
        tail = history[j:]
        if (
            _match_key(history[j]) == first
            and len(tail) <= len(suffix)
            and all(_match_key(a) == _match_key(b) for a, b in zip(tail, suffix, strict=False))
        ):
            return True
    return False


def _rewrite_pending(state: Any) -> bool:
    """Whether the only change since the index was synced is the start of the call that
    asks the trigger (the compaction, which has not rewritten anything yet)."""
    running = REWRITING.get()
    return (
        running is not None
        and running[0] is state
        and state.synced_epoch == running[1]
        and state.epoch == running[1] + 1
    )


def compaction_trigger(
    builder: TokenBudgetedContextBuilder,
    *,
    at: float = 0.8,
    session: ProtoPromptSession | None = None,
) -> CompactionTrigger:
    """A ``should_trigger_compaction`` for ``OpenAIResponsesCompactionSession`` that is
    true when the session's history costs more than ``at`` x (``builder.max_tokens`` -
    ``builder.output_reserve``) tokens, by protoprompt's exact counts (see the module note).

    Args:
        builder: the budget and tokenizer of the session's requests.
        at: the share of the room for history at which to compact (``0 < at <= 1``).
        session: the :class:`~protoprompt.integrations.ProtoPromptSession` whose index
            holds the costs; default: the one whose callback ran in this run.

    Raises:
        TypeError, ValueError: ``at`` is not a number in ``(0, 1]``.
    """
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise TypeError(f"at must be a number, got {type(at).__name__}")
    if not (0 < at <= 1):
        raise ValueError(f"at must be in (0, 1], got {at!r}")
    if not callable(getattr(builder, "build", None)):
        raise TypeError(
            f"builder must be a TokenBudgetedContextBuilder, got {type(builder).__name__}"
        )
    return CompactionTrigger(builder, float(at), session)
