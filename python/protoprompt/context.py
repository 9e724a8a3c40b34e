"""A token-budgeted system context built from scoped long-term memory.

:class:`TokenBudgetedContextBuilder` turns one turn ``(history, new_input)`` into the
model-facing request::

    [one system (or developer) context message] + kept history + new_input

(with ``build(stable_prefix=True)``, for a cache-stable prefix: what the question found goes
into a second message after the kept history, ``... + kept history + [recall message] +
new_input``; see :meth:`TokenBudgetedContextBuilder.build`)

The order of allocation is fixed (see ``DESIGN.md``):

1. ``new_input`` whole, the history graph it depends on (the tail dependency) and the
   output reserve — reserved by the Rust core, all or nothing;
2. the context message, assembled here from layers within what is left:

   * ``system`` — the system prompt, mandatory: if it alone does not fit,
     :class:`~protoprompt.errors.TokenBudgetExceededError` with ``section="system_prompt"``;
   * ``profile`` — the user profile of the scope, kept whole or dropped whole;
   * ``summary`` — for a session turn with a ``summarizer``, the rolling summary of the
     turns the session evicted, within ``summary_tokens``;
   * ``session`` — session facts (``MemoryStore.remember``), relevant ones first;
   * ``rag`` — document chunks ranked against the query;
   * ``history`` — for a session turn with ``recall_evicted``, passages of the turns the
     session evicted earlier, ranked against the query, within ``recall_tokens`` and never
     a row that is in the request (see ``docs/recall.md``);

   blocks are pooled by layer priority, then by relevance, and accepted while they fit
   (and while their layer's own limit allows); the last accepted fact, chunk, summary or
   passage may be cut at a word boundary;
3. the newest history units, by the Rust core, in the room that is still left: whole while
   they fit, then (with the builder's ``masking``, on by default) older units with their tool
   outputs cut to short excerpts, then nothing.

Every decision is recorded in a :class:`ContextPlan` (``builder.last_plan``), whose
:meth:`ContextPlan.explain` renders it for a person.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from ._context import _count_memo
from ._context._blocks import RECALL_SHARE, Assembler, Assembly, Candidate, message_pieces
from ._context._blocks import TRUNCATION_MARK as TRUNCATION_MARK
from ._context._options import (
    LAYERS,
    check_calibration,
    check_choices,
    check_evictions,
    check_int,
    check_priorities,
    check_scope,
    check_store,
    resolve_encoding,
)
from ._context._plan import ContextBlock, ContextPlan, recall_position
from ._context._query import latest_user_text
from ._packing._types import check_masking
from ._recall._turn import Recall, Sent, without_repeats
from .calibration import Calibration, CalibrationState
from .memory import MemoryScope
from .packing import (
    HistoryIndex,
    Masking,
    PackOptions,
    Policy,
    count_tokens_batch,
    item_tokens,
    pack,
)
from .plan import RequestCost

if TYPE_CHECKING:
    from .recall import Evictions
    from .summaries import Summarizer

message_stats = {"by_lines": 0}
"""Context messages counted as the sum of their lines (:func:`._context._blocks.message_pieces`)
since the process started: what the tests read to see the fast path taken."""

__all__ = [
    "DEFAULT_MASKING",
    "LAYERS",
    "ContextBlock",
    "ContextPlan",
    "TokenBudgetedContextBuilder",
    "latest_user_text",
]

Layer = Literal["system", "profile", "summary", "facts", "rag", "history"]

Embedder = Callable[[list[str]], list[list[float]]]


DEFAULT_MASKING = Masking()
"""The builder's default :class:`~protoprompt.Masking` (see ``docs/masking.md``)."""


class TokenBudgetedContextBuilder:
    """Builds budgeted requests: system context from scoped memory, then packed history.

    Args:
        store: a :class:`~protoprompt.memory.MemoryStore` (or an object with the same
            ``search`` / ``facts`` / ``get_profile`` methods), or ``None`` for no recall.
        max_tokens: the model's token budget for the whole request plus ``output_reserve``.
        model: model name that selects the tokenizer (``"gpt-5"`` -> ``o200k_base``);
            an unknown name raises :class:`~protoprompt.errors.UnknownModelError`.
        encoding: tokenizer name; wins over ``model``. Default ``o200k_base``.
        scope: the memory scope read for recall; ``None`` recalls nothing.
        output_reserve: tokens kept free for the model's answer.
        priorities: layer order; must start with ``"system"`` (mandatory); a layer that is
            not listed is not recalled.
        embedder: optional ``list[str] -> list[list[float]]``; when given, the candidates of
            each layer are re-ranked by reciprocal-rank fusion of the store's ranking and
            their cosine similarity to the query.
        rag_limit: most document chunks to recall (0 disables the layer).
        fact_limit: most session facts to recall (0 disables the layer).
        max_context_tokens: cap on the whole context message (system prompt included).
        policy: the Rust core's history policy, ``"contiguous"`` or ``"greedy"``.
        context_role: role of the context message, ``"system"`` or ``"developer"``.
        include_parents: also recall from the scope's ancestors (see
            :meth:`MemoryScope.ancestors`); never from siblings or other tenants.
        calibration: a :class:`~protoprompt.Calibration` (opt-in; e.g. a
            ``ProtoPromptSession``'s ``session.calibration``): the opaque part of item costs
            (reasoning and compaction payloads, by decoded size) is scaled by what it
            learned for ``model`` from the provider's counts (see
            :class:`~protoprompt.integrations.BudgetAudit`); text, media and overhead stay
            at the conservative rule — except under an estimate (Claude's
            ``claude_estimate``), whose whole cost it scales. Needs ``model``.
        masking: how older tool outputs are masked before whole turns are dropped (see
            :class:`~protoprompt.Masking`). Default ``Masking()``: the history is packed
            exactly as without masking while it fits whole; once it does not, older units
            keep their calls, arguments, reasoning and messages with each tool output cut to
            a 64-token excerpt, and only what does not fit even so is dropped. ``None`` drops
            whole units as :func:`protoprompt.pack` does by default. Masked outputs are
            copies in the request only: ``ProtoPromptSession`` never stores them (why this
            default: ``docs/masking.md``).
        recall_evicted: when a :class:`~protoprompt.integrations.ProtoPromptSession` turn
            drops history units, index their text in ``store``'s ``history`` layer under the
            scope (in the background, once per row), and recall the evicted turns of the
            same session most relevant to each new input into the context message (layer
            ``history``; see ``docs/recall.md``). Needs a
            :class:`~protoprompt.memory.MemoryStore` and a scope.
        recall_limit: most passages recalled per turn; ``None`` (the default): as many as
            fit in ``recall_tokens``.
        recall_tokens: the ``history`` layer's own limit in the context message, in tokens
            (the passages also fit in the room the layers before them leave): the best
            passages are taken whole while they fit, each followed by its neighbouring
            turns, and a passage that does not fit whole is left out (the plan says so)
            while smaller ones after it may still fit.
        recall_other_sessions: also recall evicted turns of the scope's other sessions.
        summarizer: a :class:`~protoprompt.summaries.Summarizer` (e.g.
            :class:`~protoprompt.summaries.ModelSummarizer`): a session keeps a rolling
            summary of the turns it evicted, updated in the background once
            ``summarize_every`` new tokens were evicted, and each turn's context message
            carries it (layer ``summary``).
        summary_tokens: the summary's token limit (asked of the summarizer, and the limit
            of its text in the context message: its tags come on top).
        summarize_every: tokens of newly evicted text (as rendered for the summarizer)
            that start a summary update.

    Example::

        builder = TokenBudgetedContextBuilder(store, max_tokens=128_000, model="gpt-5",
                                              scope=scope, output_reserve=8_000)
        plan = builder.build(history, new_input, system_prompt="Answer from the contract.")
        send(plan.items)
        print(plan.explain())
    """

    def __init__(
        self,
        store: Any,
        *,
        max_tokens: int,
        model: str | None = None,
        encoding: str | None = None,
        scope: MemoryScope | None = None,
        output_reserve: int = 0,
        priorities: Iterable[str] = LAYERS,
        embedder: Embedder | None = None,
        rag_limit: int = 8,
        fact_limit: int = 8,
        max_context_tokens: int | None = None,
        policy: Policy = "contiguous",
        context_role: Literal["system", "developer"] = "system",
        include_parents: bool = False,
        calibration: Calibration | None = None,
        masking: Masking | None = DEFAULT_MASKING,
        recall_evicted: bool = False,
        recall_limit: int | None = None,
        recall_tokens: int = 2_000,
        recall_other_sessions: bool = False,
        summarizer: Summarizer | None = None,
        summary_tokens: int = 500,
        summarize_every: int = 4_000,
    ) -> None:
        self.store = check_store(store)
        check_int("max_tokens", max_tokens, minimum=1)
        check_int("output_reserve", output_reserve, minimum=0)
        if output_reserve >= max_tokens:
            raise ValueError(
                f"output_reserve ({output_reserve}) must be smaller than max_tokens ({max_tokens})"
            )
        resolved = resolve_encoding(model, encoding)
        self.scope = check_scope(scope)
        self.priorities = check_priorities(priorities)
        if embedder is not None and not callable(embedder):
            raise TypeError("embedder must be callable or None")
        self.embedder = embedder
        self.rag_limit = check_int("rag_limit", rag_limit, minimum=0)
        self.fact_limit = check_int("fact_limit", fact_limit, minimum=0)
        if max_context_tokens is not None:
            check_int("max_context_tokens", max_context_tokens, minimum=1)
        self.max_context_tokens = max_context_tokens
        check_choices(policy, context_role, include_parents)
        self.context_role = context_role
        self.include_parents = include_parents
        check_calibration(calibration, model, masking)
        self.calibration = calibration
        self.pack_options: PackOptions = PackOptions(
            max_tokens,
            output_reserve=output_reserve,
            model=model,
            encoding=resolved,
            policy=policy,
            masking=check_masking(masking),
        )
        """The builder's pack options as one frozen value, checked once: ``max_tokens``,
        ``output_reserve``, ``model``, ``encoding``, ``policy`` and ``masking`` (each build
        passes a copy with its own fields; see :class:`~protoprompt.packing.PackOptions`)."""
        check_evictions(
            store,
            self.priorities,
            recall_evicted=recall_evicted,
            recall_other_sessions=recall_other_sessions,
            summarizer=None,
        )
        self.recall_evicted = recall_evicted
        self.recall_limit = (
            None if recall_limit is None else check_int("recall_limit", recall_limit, minimum=1)
        )
        self.recall_tokens = check_int("recall_tokens", recall_tokens, minimum=1)
        self.recall_other_sessions = recall_other_sessions
        check_evictions(
            store,
            self.priorities,
            recall_evicted=False,
            recall_other_sessions=False,
            summarizer=summarizer,
        )
        self.summarizer = summarizer
        self.summary_tokens = check_int("summary_tokens", summary_tokens, minimum=1)
        self.summarize_every = check_int("summarize_every", summarize_every, minimum=1)
        self._evictions: Evictions | None = None
        if recall_evicted or summarizer is not None:
            from .recall import Evictions

            self._evictions = Evictions(self)
        self.last_plan: ContextPlan | None = None
        """The plan of the latest :meth:`build` (``None`` while a build runs and after one
        that raised)."""

    @property
    def max_tokens(self) -> int:
        """The model's token budget for the whole request plus ``output_reserve``."""
        return self.pack_options.max_tokens

    @property
    def output_reserve(self) -> int:
        """Tokens kept free for the model's answer."""
        return self.pack_options.output_reserve

    @property
    def model(self) -> str | None:
        """The model name that selects the tokenizer (``None``: by ``encoding``)."""
        return self.pack_options.model

    @property
    def encoding(self) -> str:
        """The tokenizer's name (resolved from ``model`` when not given)."""
        return self.pack_options.resolved_encoding

    @property
    def policy(self) -> Policy:
        """The Rust core's history policy."""
        return self.pack_options.policy

    @property
    def masking(self) -> Masking | None:
        """How older tool outputs are masked (``None``: not at all)."""
        return self.pack_options.masking

    async def wait_for_background(self, timeout: float | None = None) -> bool:
        """Wait until the background work on evicted turns started so far is done:
        indexing for recall (``recall_evicted``) and summary updates (``summarizer``).
        Returns ``False`` when ``timeout`` seconds passed first. Turns never wait for it;
        call it before a process or an event loop ends to keep what is in flight (index
        jobs left over are done by a later turn; a summary update, by a later one)."""
        if self._evictions is None:
            return True
        return await self._evictions.wait(timeout)

    def calibration_state(self) -> CalibrationState | None:
        """What the builder's calibration knows of its model now (``None``: no
        calibration)."""
        if self.calibration is None or self.model is None:
            return None
        return self.calibration.state(self.model, encoding=self.encoding)

    def opaque_scale(self) -> float:
        """The factor of the opaque part of item costs a build uses now (1.0 without a
        calibration, or before it has learned anything); under an estimate encoding, of the
        whole cost of every item."""
        state = self.calibration_state()
        return 1.0 if state is None else state.opaque_scale

    # ------------------------------------------------------------------ message

    def context_message(self, text: str) -> dict[str, Any]:
        """The context message for ``text``, in the shape :meth:`build` returns it."""
        return {"role": self.context_role, "content": text}

    def _cost(self, text: str) -> int:
        if not text:
            return 0
        model, encoding = self.model, self.encoding

        def costs(texts: list[str]) -> list[int]:
            return [
                item_tokens(self.context_message(t), model=model, encoding=encoding).total
                for t in texts
            ]

        if type(self).context_message is not TokenBudgetedContextBuilder.context_message:
            return costs([text])[0]  # a message of another shape: not the memo's
        kind = f"message:{self.context_role}"
        # Counted at each step of a turn's assembly, and again by the next turn: kept.
        found = _count_memo.find(kind, text, model, encoding)
        if found is not None:
            return found
        split = message_pieces(text, encoding)
        if split is None:
            (cost,) = _count_memo.counts(kind, [text], model, encoding, costs)
            return cost
        # Its frame as a message of its own, and its lines: each kept, so a turn counts only
        # the lines that are new (the sum is the message's count: see message_pieces).
        ends, pieces = split
        (frame,) = _count_memo.counts(kind, [ends], model, encoding, costs)
        cost = frame + sum(self._count_batch(pieces))
        _count_memo.keep(kind, text, model, encoding, cost)
        message_stats["by_lines"] += 1
        return cost

    def _candidates(
        self,
        query: str,
        scope: MemoryScope | None,
        *,
        session_id: str | None = None,
        turn: int | None = None,
        summary: str | None = None,
        split: bool = False,
        sent: Sent | None = None,
    ) -> list[Candidate]:
        """Recall candidates from the store, in pool order (priority, then relevance); with
        ``session_id``, the summary and the evicted turns of that session too; ``split``
        and ``sent``: see :meth:`Recall.candidates`."""
        recall = Recall(
            self.store,
            self.priorities,
            self.include_parents,
            self.fact_limit,
            self.rag_limit,
            self.recall_evicted,
            self.recall_limit,
            self._recall_room(),
            self.recall_other_sessions,
            self.embedder,
        )
        return recall.candidates(
            query,
            scope,
            session_id=session_id,
            turn=turn,
            summary=summary,
            split=split,
            sent=sent.either if sent is not None else (),
        )

    def _recall_room(self) -> int:
        """Tokens recalled passages can take at most: ``recall_tokens``, or
        :data:`RECALL_SHARE` of the budget (of the context cap) when that is less -- the
        most of its room the layer is ever given -- so a turn asks the store for no more
        passages than can fit."""
        whole = self.max_tokens
        if self.max_context_tokens is not None:
            whole = min(whole, self.max_context_tokens)
        return max(min(self.recall_tokens, int(whole * RECALL_SHARE)), 1)

    def _count_batch(self, texts: list[str]) -> list[int]:
        model, encoding = self.model, self.encoding
        return _count_memo.counts(
            "text",
            texts,
            model,
            encoding,
            lambda todo: count_tokens_batch(todo, model=model, encoding=encoding),
        )

    def _assembler(self, split: bool = False) -> Assembler:
        """The assembly of context messages with the builder's settings as they are now
        (``split``: a recall message after the history for what the question found)."""
        return Assembler(
            self.priorities,
            self.context_role,
            self.model,
            self.encoding,
            self.max_tokens,
            self.max_context_tokens,
            {"history": self.recall_tokens, "summary": self.summary_tokens},
            self._cost,
            self._count_batch,
            split,
        )

    def build(
        self,
        history: Sequence[Any],
        new_input: Sequence[Any],
        *,
        system_prompt: str = "",
        query: str | None = None,
        scope: MemoryScope | None = None,
        output_reserve: int | None = None,
        index: HistoryIndex | None = None,
        pinned: Iterable[int] = (),
        context_tokens: int = 0,
        history_offset: int = 0,
        opaque_scale: float | None = None,
        session_id: str | None = None,
        turn: int | None = None,
        summary: str | None = None,
        request: RequestCost | None = None,
        masking: Masking | Literal["builder"] | None = "builder",
        stable_prefix: bool = False,
    ) -> ContextPlan:
        """Build the request for one turn and record it in :attr:`last_plan`.

        Args:
            history: the session history (the SDK's objects; never copied or changed).
            new_input: this turn's input, sent whole.
            system_prompt: mandatory text placed first in the context message.
            query: recall query; default: the text of the latest user input
                (see :func:`latest_user_text`).
            scope: overrides the builder's scope for this call.
            output_reserve: overrides the builder's output reserve for this call.
            index: a :class:`~protoprompt.HistoryIndex` that has seen the start of
                ``history`` (see its contract): the pack then costs what is new and what is
                kept instead of the whole history. Same result as without it.
            pinned: history positions that are mandatory like ``new_input`` (see
                :func:`protoprompt.pack`); a per-call model filter pins the run's own input.
            context_tokens: tokens reserved besides the request's items, e.g. the agent's
                instructions and tool definitions, which every model call sends too.
            history_offset: with ``index``, ``history`` holds the history from this
                position on (see :meth:`HistoryIndex.window_start`); the plan is that of
                the whole history. The recall query then comes from ``new_input`` or the
                items passed.
            opaque_scale: the factor of the opaque part of item costs for this build
                (default: what the builder's calibration says now, 1.0 without one); a
                token window must be packed with the one it was found under.
            session_id: the session this turn belongs to: with ``recall_evicted``, its
                evicted turns are recalled (layer ``history``), never one whose row is in
                the request (a passage found there is left out and the turn built again).
                :class:`~protoprompt.integrations.ProtoPromptSession` passes its own.
            turn: this turn's number in the session (its user messages so far plus one),
                for "N turns ago" in recalled passages.
            summary: the session's rolling summary of what it evicted (layer
                ``summary``, within ``summary_tokens``).
            request: the agent's instructions, tools and output schema in tokens (a
                :class:`~protoprompt.plan.RequestCost`): reserved like ``context_tokens``
                (in addition to it) and reported by section in the plan.
            masking: overrides the builder's :attr:`masking` for this call (``"builder"``,
                the default: the builder's).
            stable_prefix: for a cache-stable prefix (``docs/prompt-cache.md``): the context
                message keeps what stays the same from turn to turn (the system prompt, the
                profile, the summary, the session facts the store lists) and what this
                turn's question finds (recalled turns, document chunks, facts the search
                found besides) goes into a second message of the same role, framed the same
                way, sent after the kept history and before the new input
                (:attr:`ContextPlan.recall_message`; before the history the new input
                depends on, never inside a unit). Both fit in the room the context message
                has without it. So consecutive requests repeat the context message and the
                history. ``ProtoPromptSession`` passes it when the session's requests use a
                :class:`~protoprompt.CachePolicy`.

        Raises:
            TokenBudgetExceededError: new input, its tail dependency and the output reserve
                do not fit (``section`` says where), or the system prompt does not fit in
                what is left (``section="system_prompt"``). Nothing is returned to send.
            InvalidNewInputError, InvalidItemError: see :func:`protoprompt.pack`.
        """
        if not isinstance(system_prompt, str):
            raise TypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
        if query is not None and not isinstance(query, str):
            raise TypeError(f"query must be a str or None, got {type(query).__name__}")
        check_scope(scope)
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise TypeError("session_id must be a non-empty str or None")
        if turn is not None:
            check_int("turn", turn, minimum=1)
        if summary is not None and not isinstance(summary, str):
            raise TypeError(f"summary must be a str or None, got {type(summary).__name__}")
        if request is not None and not isinstance(request, RequestCost):
            raise TypeError(f"request must be a RequestCost or None, got {type(request).__name__}")
        options = self._call_options(
            output_reserve=output_reserve,
            masking=masking,
            pinned=pinned,
            context_tokens=context_tokens,
            history_offset=history_offset,
        )
        self.last_plan = None
        history_list = history if isinstance(history, list) else list(history)
        new_list = new_input if isinstance(new_input, list) else list(new_input)
        scope = scope if scope is not None else self.scope
        if query is None:
            query = latest_user_text(new_list, history_list)
        if not isinstance(stable_prefix, bool):
            raise TypeError(f"stable_prefix must be a bool, got {type(stable_prefix).__name__}")
        sent = None
        if self.recall_evicted and session_id is not None and self.store is not None:
            sent = Sent.of(history_list, new_list)
        pool = self._candidates(
            query,
            scope,
            session_id=session_id,
            turn=turn,
            summary=summary,
            split=stable_prefix,
            sent=sent,
        )

        def build_with(pool: list[Candidate]) -> ContextPlan:
            return self._build(
                history_list,
                new_list,
                system_prompt=system_prompt,
                query=query,
                scope=scope,
                index=index,
                pool=pool,
                options=options,
                opaque_scale=opaque_scale,
                request=request,
                split=stable_prefix,
            )

        if not any(c.layer == "history" for c in pool):
            return build_with(pool)
        if sent is None:
            sent = Sent.of(history_list, new_list)
        plan = self._without_repeats(pool, build_with, history_list, history_offset, sent)
        self.last_plan = plan
        return plan

    def _without_repeats(
        self,
        pool: list[Candidate],
        build_with: Callable[[list[Candidate]], ContextPlan],
        history: list[Any],
        offset: int,
        sent: Sent,
    ) -> ContextPlan:
        return without_repeats(
            pool, build_with, history, offset, sent, self._assembler().block_sizes
        )

    def _call_options(
        self,
        *,
        output_reserve: int | None = None,
        masking: Masking | Literal["builder"] | None = "builder",
        **fields: Any,
    ) -> PackOptions:
        """:attr:`pack_options` with one call's fields (``output_reserve`` ``None`` and
        ``masking`` ``"builder"``: the builder's)."""
        if output_reserve is not None:
            fields["output_reserve"] = check_int("output_reserve", output_reserve, minimum=0)
        if masking != "builder":
            fields["masking"] = check_masking(masking)
        return self.pack_options.replace(**fields)

    def _build(
        self,
        history_list: list[Any],
        new_list: list[Any],
        *,
        system_prompt: str,
        query: str,
        scope: MemoryScope | None,
        index: HistoryIndex | None,
        pool: list[Candidate],
        options: PackOptions,
        opaque_scale: float | None = None,
        request: RequestCost | None = None,
        split: bool = False,
    ) -> ContextPlan:
        """:meth:`build` with the recall candidates already fetched (a model filter reuses
        them for every call of a run). ``options`` are the call's (:meth:`_call_options`:
        the reserve, the pinned positions, the reserved tokens, the history's length and
        offset, and what the pack masks with); the context hook and the calibration's
        ``opaque_scale`` (unless ``opaque_scale`` is given) are added here."""
        self.last_plan = None
        outcome: list[Assembly] = []

        def hook(remaining: int) -> int:
            assembly = self._assemble(
                system_prompt, pool, remaining, reserved=self.max_tokens - remaining, split=split
            )
            outcome.append(assembly)
            return assembly.cost

        if options.history_offset and index is None:
            raise ValueError("history_offset needs an index that holds the earlier positions")
        changes: dict[str, Any] = {"context": hook}
        if request is not None:
            changes["context_tokens"] = options.context_tokens + request.total
        calibration = self.calibration_state()
        if opaque_scale is not None:
            changes["opaque_scale"] = opaque_scale
        elif calibration is not None:
            changes["opaque_scale"] = calibration.opaque_scale
        options = options.replace(**changes)
        if index is not None:
            result = index.pack(history_list, new_list, options=options)
        else:
            result = pack(history_list, new_list, options=options)
        if len(outcome) != 1:  # pragma: no cover - the core calls the hook exactly once
            raise RuntimeError("protoprompt core did not call the context hook exactly once")
        assembly = outcome[0]
        message = assembly.message
        items = ([message] if message is not None else []) + result.items
        recall_at = None
        if assembly.recall_message is not None:
            recall_at = recall_position(result) + (1 if message is not None else 0)
            items.insert(recall_at, assembly.recall_message)
        plan = ContextPlan(
            items=items,
            context_message=message,
            blocks=assembly.blocks,
            pack=result,
            query=query,
            scope=scope,
            context_limit=assembly.limit,
            calibration=calibration,
            reserved_tokens=options.context_tokens,
            request=request,
            recall_message=assembly.recall_message,
            recall_at=recall_at,
        )
        self.last_plan = plan
        return plan

    def _assemble(
        self,
        system_prompt: str,
        pool: list[Candidate],
        remaining: int,
        *,
        reserved: int,
        split: bool = False,
    ) -> Assembly:
        """Fill the context message within ``remaining`` (and the cap); see the module doc."""
        return self._assembler(split).assemble(system_prompt, pool, remaining, reserved=reserved)
