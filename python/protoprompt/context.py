"""A token-budgeted system context built from scoped long-term memory.

:class:`TokenBudgetedContextBuilder` turns one turn ``(history, new_input)`` into the
model-facing request::

    [one system (or developer) context message] + kept history + new_input

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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal

from . import _core
from .calibration import Calibration, CalibrationState
from .errors import TokenBudgetExceededError
from .memory import MemoryHit, MemoryScope
from .memory._ranking import WORD, cosine, rrf_weight
from .packing import (
    HistoryIndex,
    Masking,
    PackResult,
    Policy,
    count_tokens_batch,
    encoding_for_model,
    item_tokens,
    pack,
)
from .plan import CallLayout, RequestCost, RequestSections, input_at, request_sections
from .turn_report import TurnReport

if TYPE_CHECKING:
    from .recall import Evictions
    from .summaries import Summarizer

__all__ = [
    "DEFAULT_MASKING",
    "LAYERS",
    "ContextBlock",
    "ContextPlan",
    "TokenBudgetedContextBuilder",
    "latest_user_text",
]

Layer = Literal["system", "profile", "summary", "session", "rag", "history"]
LAYERS: tuple[str, ...] = ("system", "profile", "summary", "session", "rag", "history")
"""The context layers, in their default priority order."""

Embedder = Callable[[list[str]], list[list[float]]]

DEFAULT_MASKING = Masking()
"""The builder's default :class:`~protoprompt.Masking` (see ``docs/masking.md``)."""

TRUNCATION_MARK = " …"
"""Appended to a block that was cut at a word boundary, so the model can tell."""

_SECTION_TAGS = {
    "profile": "user_profile",
    "summary": "summary_of_earlier_turns",
    "session": "session_facts",
    "rag": "recalled_documents",
    "history": "recalled_turns",
}
_CAP_NAMES = {"history": "recall_tokens", "summary": "summary_tokens"}
_EXCLUSION_ROUNDS = 4
"""Builds at most of one turn that leave out recalled passages found in the request."""


@dataclass(frozen=True)
class ContextBlock:
    """What the builder did with one block of one layer."""

    layer: str
    """``"system"``, ``"profile"``, ``"summary"``, ``"session"``, ``"rag"`` or
    ``"history"``."""
    source: str
    """Where the block comes from: ``"system_prompt"``, ``"profile"``, ``"summary"``,
    ``"fact:<fact_id>"``, ``"<doc_id>#<chunk_index>"``, or for a recalled passage
    ``"history:<row>#<passage>"`` (``"history:<session_id>/<row>#<passage>"`` from another
    session of the scope)."""
    status: str
    """``"kept"``, ``"truncated"`` (kept, cut at a word boundary) or ``"dropped"``."""
    reason: str
    """Why, as a sentence fragment for a person."""
    tokens: int | None
    """Kept or truncated: the exact tokens the block adds to the context message (the
    system block also carries the message's fixed cost). Dropped: the tokens it would have
    added when it was tried, else the count of its rendered text; ``None`` if unknown."""
    text: str
    """The text as sent (the cut text when truncated; the full text when dropped)."""
    score: float | None = None
    """The relevance score from the memory store (higher is better), if any."""

    @property
    def kept(self) -> bool:
        """Whether the block is in the context message (whole or truncated)."""
        return self.status != "dropped"


@dataclass(frozen=True)
class ContextPlan:
    """The outcome of :meth:`TokenBudgetedContextBuilder.build`."""

    items: list[Any]
    """What to send: the context message (if any), then the pack result's items — the
    original history objects that were kept (masked copies for the tool outputs of units
    kept masked) and every ``new_input`` object."""
    context_message: dict[str, Any] | None
    """The one system/developer context message, or ``None`` when there is nothing to say
    (no system prompt and nothing recalled)."""
    blocks: list[ContextBlock]
    """Every context block that was considered, in the order it was considered."""
    pack: PackResult
    """The Rust core's packing of history and new input around the context."""
    query: str
    """The recall query (text of the latest user input)."""
    scope: MemoryScope | None
    """The memory scope that was read, or ``None`` (no recall)."""
    context_limit: int
    """Tokens the context message was allowed to take: what was left after the reserved
    part, capped by ``max_context_tokens``."""
    calibration: CalibrationState | None = None
    """The builder's calibration of opaque payloads for its model when the plan was made
    (``None``: the builder has none)."""
    turn: TurnReport | None = None
    """For a turn of a :class:`~protoprompt.integrations.ProtoPromptSession`: how its
    history was read and packed (window or full read and why, index, snapshot, count
    store); ``None`` for a plain :meth:`TokenBudgetedContextBuilder.build`."""
    reserved_tokens: int = 0
    """Tokens reserved besides the items (the ``context_tokens`` and ``request`` of
    :meth:`TokenBudgetedContextBuilder.build`: the agent's instructions, tools and output
    schema)."""
    request: RequestCost | None = None
    """What ``reserved_tokens`` is made of, when the builder was told (a session callback
    made by ``run_config(agent=...)``, the per-call filter); ``None`` otherwise."""

    @property
    def context_tokens(self) -> int:
        """Tokens of the context message (equal to ``item_tokens(context_message).total``;
        0 without one)."""
        return self.pack.context_tokens - self.reserved_tokens

    layout: CallLayout | None = None
    """For the plan of a model call made by the standalone per-call filter: where the run
    input and the newest step are in the items packed (``None``: a turn planned before its
    first model call, whose new input is the run input)."""

    @property
    def sections(self) -> RequestSections:
        """The request by section (see :mod:`protoprompt.plan`), adding up to :attr:`used`.

        A turn plan is made before the run's first model call: its newest step and earlier
        steps are empty. The agent's instructions, tools and output schema are counted
        when the builder was told them (``request``), else they are reserved as a lump
        (``context_tokens``) or not known here (the per-call filter counts them on every
        call)."""
        return request_sections(
            self.pack,
            request=self.request,
            reserved=self.reserved_tokens,
            context=(self.context_tokens, 1 if self.context_message is not None else 0),
            call=self.layout,
        )

    @property
    def budget(self) -> int:
        return self.pack.budget

    @property
    def used(self) -> int:
        """Tokens used by the request plus the output reserve."""
        return self.pack.used

    @property
    def remaining(self) -> int:
        return self.pack.remaining

    @property
    def request_tokens(self) -> int:
        """Tokens of the request itself (context, history, new input)."""
        return self.pack.request_tokens

    @property
    def masked_items(self) -> list[Any]:
        """The masked copies in :attr:`items` (new objects, never to be stored), in order."""
        offset = 1 if self.context_message is not None else 0
        kept = self.pack.kept_history
        masked = set(self.pack.masked)
        return [self.items[offset + i] for i, p in enumerate(kept) if p in masked]

    @property
    def recalled(self) -> list[ContextBlock]:
        """Memory blocks (profile, summary, facts, chunks, recalled passages) that made it
        into the context message."""
        return [b for b in self.blocks if b.kept and b.layer != "system"]

    @property
    def dropped_blocks(self) -> list[ContextBlock]:
        return [b for b in self.blocks if not b.kept]

    def to_html(self) -> str:
        """The plan as one self-contained HTML page: a bar of the budget by section, the
        units along the history as kept / masked / dropped with their reasons on hover, and
        the context message's blocks (:mod:`protoprompt.plan_html`)."""
        from .plan_html import plans_to_html

        return plans_to_html(self)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account: for a session turn how the history was read and packed (see
        :class:`~protoprompt.TurnReport`), the request by section (:attr:`sections`), the
        context message's blocks, then the masked and dropped history units with their
        reasons (at most ``max_units`` of each; ``None`` lists all)."""
        kept = sum(1 for b in self.blocks if b.kept)
        lines = [] if self.turn is None else self.turn.lines()
        lines += self.sections.lines()
        role = self.context_message["role"] if self.context_message else None
        lines.append(
            f"context message: {self.context_tokens:,} tokens"
            + (f" in one {role} message" if role else " (none)")
            + f", room {self.context_limit:,}; {kept} blocks kept, "
            f"{len(self.blocks) - kept} dropped"
        )
        if self.scope is not None:
            lines.append(
                f"  scope {'/'.join(p for p in self.scope.key() if p)}"
                f", query {_shorten(self.query, 60)!r}"
            )
        for b in self.blocks:
            tokens = "uncounted" if b.tokens is None else f"{b.tokens} tokens"
            lines.append(
                f"  {b.layer:<8}{b.status:<10}{tokens:>11}  {_shorten(b.source, 24)}: {b.reason}"
            )
            if b.layer != "system":
                lines.append(f"{'':<12}{_shorten(b.text, 66)!r}")
        if self.calibration is not None:
            lines.append(self.calibration.explain())
        where = input_at if self.layout is not None else None
        lines.extend(self.pack.explain_units(max_units, where=where))
        return "\n".join(lines)


def _shorten(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- query


def _field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def _message_text(item: Any) -> str | None:
    """Text of a user message item (plain or structured content), else ``None``."""
    if _field(item, "role") != "user" or _field(item, "type") not in (None, "message"):
        return None
    content = _field(item, "content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [
            _field(part, "text")
            for part in content
            if _field(part, "type") in ("input_text", "text")
            and isinstance(_field(part, "text"), str)
        ]
        return "\n".join(parts)
    return None


def latest_user_text(new_input: Sequence[Any], history: Sequence[Any] = ()) -> str:
    """The text of the latest user message of ``new_input``, else of ``history``.

    Structured content counts: the ``input_text`` parts of a message are joined with
    newlines (images and files carry no query text). Returns ``""`` when neither list holds
    a user message.
    """
    for items in (new_input, history):
        for item in reversed(items):
            text = _message_text(item)
            if text is not None:
                return text
    return ""


# --------------------------------------------------------------------------- builder


@dataclass(frozen=True)
class _Assembly:
    """The context message chosen by the hook, with its exact cost and block decisions."""

    cost: int
    message: dict[str, Any] | None
    blocks: list[ContextBlock]
    limit: int


@dataclass
class _Candidate:
    layer: str
    source: str
    text: str
    score: float | None
    truncatable: bool
    header: str = ""
    """For a recalled passage: where it came from (rendered before its text)."""
    digest: str | None = None
    """For a recalled passage: the digest of its row's rendered text."""
    row: tuple[str, int] | None = field(default=None, compare=False)
    """For a recalled passage: (session id, row)."""


def _check_int(name: str, value: object, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


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
            at the conservative rule. Needs ``model``.
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
        recall_limit: most passages recalled per turn.
        recall_tokens: the ``history`` layer's own limit in the context message (the
            passages also fit in the room the layers before them leave).
        recall_other_sessions: also recall evicted turns of the scope's other sessions.
        summarizer: a :class:`~protoprompt.summaries.Summarizer` (e.g.
            :class:`~protoprompt.summaries.ModelSummarizer`): a session keeps a rolling
            summary of the turns it evicted, updated in the background once
            ``summarize_every`` new tokens were evicted, and each turn's context message
            carries it (layer ``summary``).
        summary_tokens: the summary's token limit (asked of the summarizer, and the
            ``summary`` layer's limit in the context message).
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
        recall_limit: int = 6,
        recall_tokens: int = 2_000,
        recall_other_sessions: bool = False,
        summarizer: Summarizer | None = None,
        summary_tokens: int = 500,
        summarize_every: int = 4_000,
    ) -> None:
        if store is not None:
            missing = [
                m
                for m in ("search", "facts", "get_profile")
                if not callable(getattr(store, m, None))
            ]
            if missing:
                raise TypeError(
                    f"store must be a MemoryStore (or have {', '.join(missing)}), "
                    f"got {type(store).__name__}"
                )
        self.store = store
        self.max_tokens = _check_int("max_tokens", max_tokens, minimum=1)
        self.output_reserve = _check_int("output_reserve", output_reserve, minimum=0)
        if self.output_reserve >= self.max_tokens:
            raise ValueError(
                f"output_reserve ({output_reserve}) must be smaller than max_tokens ({max_tokens})"
            )
        if model is not None and not isinstance(model, str):
            raise TypeError(f"model must be a str or None, got {type(model).__name__}")
        if encoding is not None and not isinstance(encoding, str):
            raise TypeError(f"encoding must be a str or None, got {type(encoding).__name__}")
        if encoding is not None:
            # Raises UnknownEncodingError without building the tokenizer: a session's
            # callback builds it in the background while the SDK reads the history.
            _core.is_preloaded(encoding=encoding)
            self.encoding: str = encoding
        elif model is not None:
            self.encoding = encoding_for_model(model)  # raises UnknownModelError
        else:
            self.encoding = "o200k_base"
        self.model = model
        if scope is not None and not isinstance(scope, MemoryScope):
            raise TypeError(f"scope must be a MemoryScope or None, got {type(scope).__name__}")
        self.scope = scope
        self.priorities = self._check_priorities(priorities)
        if embedder is not None and not callable(embedder):
            raise TypeError("embedder must be callable or None")
        self.embedder = embedder
        self.rag_limit = _check_int("rag_limit", rag_limit, minimum=0)
        self.fact_limit = _check_int("fact_limit", fact_limit, minimum=0)
        if max_context_tokens is not None:
            _check_int("max_context_tokens", max_context_tokens, minimum=1)
        self.max_context_tokens = max_context_tokens
        if policy not in ("contiguous", "greedy"):
            raise ValueError(f"policy must be 'contiguous' or 'greedy', got {policy!r}")
        self.policy: Policy = policy
        if context_role not in ("system", "developer"):
            raise ValueError(f"context_role must be 'system' or 'developer', got {context_role!r}")
        self.context_role = context_role
        if not isinstance(include_parents, bool):
            raise TypeError("include_parents must be a bool")
        self.include_parents = include_parents
        if calibration is not None:
            if not isinstance(calibration, Calibration):
                raise TypeError(
                    f"calibration must be a Calibration or None, got {type(calibration).__name__}"
                )
            if model is None:
                raise ValueError("calibration is per model: pass model= too")
        self.calibration = calibration
        if masking is not None and not isinstance(masking, Masking):
            raise TypeError(f"masking must be a Masking or None, got {type(masking).__name__}")
        self.masking: Masking | None = masking
        for name, flag in (
            ("recall_evicted", recall_evicted),
            ("recall_other_sessions", recall_other_sessions),
        ):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        if recall_evicted:
            for method in ("search_history", "index_history", "history_rows", "forget_history"):
                if not callable(getattr(store, method, None)):
                    raise TypeError(
                        f"recall_evicted needs a MemoryStore (with {method}), "
                        f"got {type(store).__name__}"
                    )
            if "history" not in self.priorities:
                raise ValueError("recall_evicted needs the 'history' layer in priorities")
        self.recall_evicted = recall_evicted
        self.recall_limit = _check_int("recall_limit", recall_limit, minimum=1)
        self.recall_tokens = _check_int("recall_tokens", recall_tokens, minimum=1)
        self.recall_other_sessions = recall_other_sessions
        if summarizer is not None:
            if not callable(summarizer):
                raise TypeError(
                    "summarizer must be an async callable (items, previous summary, token "
                    f"limit) -> str, got {type(summarizer).__name__}"
                )
            if "summary" not in self.priorities:
                raise ValueError("a summarizer needs the 'summary' layer in priorities")
        self.summarizer = summarizer
        self.summary_tokens = _check_int("summary_tokens", summary_tokens, minimum=1)
        self.summarize_every = _check_int("summarize_every", summarize_every, minimum=1)
        self._evictions: Evictions | None = None
        if recall_evicted or summarizer is not None:
            from .recall import Evictions

            self._evictions = Evictions(self)
        self.last_plan: ContextPlan | None = None
        """The plan of the latest :meth:`build` (``None`` while a build runs and after one
        that raised)."""

    async def wait_for_background(self, timeout: float | None = None) -> bool:
        """Wait until the background work on evicted turns started so far is done:
        indexing for recall (``recall_evicted``) and summary updates (``summarizer``).
        Returns ``False`` when ``timeout`` seconds passed first. Turns never wait for it;
        call it before a process or an event loop ends to keep what is in flight (index
        jobs left over are done by a later turn; a summary update, by a later one)."""
        if self._evictions is None:
            return True
        return await self._evictions.wait(timeout)

    @staticmethod
    def _check_priorities(priorities: Iterable[str]) -> tuple[str, ...]:
        if isinstance(priorities, str) or not isinstance(priorities, Iterable):
            raise TypeError("priorities must be a sequence of layer names, not a single str")
        result = tuple(priorities)
        unknown = [p for p in result if p not in LAYERS]
        if unknown:
            raise ValueError(f"unknown layer(s) {unknown!r} in priorities; known: {LAYERS!r}")
        if len(set(result)) != len(result):
            raise ValueError(f"priorities must not repeat a layer, got {result!r}")
        if not result or result[0] != "system":
            raise ValueError(
                "priorities must start with 'system': the system prompt is mandatory, "
                f"got {result!r}"
            )
        return result

    def calibration_state(self) -> CalibrationState | None:
        """What the builder's calibration knows of its model now (``None``: no
        calibration)."""
        if self.calibration is None or self.model is None:
            return None
        return self.calibration.state(self.model)

    def opaque_scale(self) -> float:
        """The factor of the opaque part of item costs a build uses now (1.0 without a
        calibration, or before it has learned anything)."""
        state = self.calibration_state()
        return 1.0 if state is None else state.opaque_scale

    # ------------------------------------------------------------------ message

    def context_message(self, text: str) -> dict[str, Any]:
        """The context message for ``text``, in the shape :meth:`build` returns it."""
        return {"role": self.context_role, "content": text}

    def _cost(self, text: str) -> int:
        if not text:
            return 0
        message = self.context_message(text)
        return item_tokens(message, model=self.model, encoding=self.encoding).total

    def _render(self, system_prompt: str, accepted: Sequence[tuple[_Candidate, str]]) -> str:
        """The context text: the system prompt, then one tagged section per layer."""
        parts = [system_prompt] if system_prompt else []
        for layer in self.priorities[1:]:
            rendered = [_render_block(cand, text) for cand, text in accepted if cand.layer == layer]
            if not rendered:
                continue
            tag = _SECTION_TAGS[layer]
            body = "\n".join(rendered)
            parts.append(f"<{tag}>\n{body}\n</{tag}>")
        return "\n\n".join(parts)

    # ------------------------------------------------------------------ recall

    def _candidates(
        self,
        query: str,
        scope: MemoryScope | None,
        *,
        session_id: str | None = None,
        turn: int | None = None,
        summary: str | None = None,
    ) -> list[_Candidate]:
        """Recall candidates from the store, in pool order (priority, then relevance); with
        ``session_id``, the summary and the evicted turns of that session too."""
        by_layer: dict[str, list[_Candidate]] = {}
        if summary and summary.strip() and "summary" in self.priorities:
            by_layer["summary"] = [_Candidate("summary", "summary", summary, None, True)]
        if self.store is None or scope is None:
            return by_layer.get("summary", [])
        has_terms = any(ch.isalnum() for ch in query)
        if self.recall_evicted and session_id is not None and has_terms:
            by_layer["history"] = self._rerank(
                query, self._recalled(query, scope, session_id, turn)
            )
        if "profile" in self.priorities:
            profile = self.store.get_profile(scope=scope, include_parents=self.include_parents)
            if profile and profile.strip():
                by_layer["profile"] = [_Candidate("profile", "profile", profile, None, False)]
        if "session" in self.priorities and self.fact_limit:
            hits: list[MemoryHit] = []
            if has_terms:
                hits = self.store.search(
                    query,
                    scope=scope,
                    limit=self.fact_limit,
                    kinds=("fact",),
                    include_parents=self.include_parents,
                )
            seen = {h.fact_id for h in hits}
            for h in self.store.facts(
                scope=scope, limit=self.fact_limit, include_parents=self.include_parents
            ):
                if len(hits) >= self.fact_limit:
                    break
                if h.fact_id not in seen:
                    hits.append(h)
                    seen.add(h.fact_id)
            facts = [
                _Candidate("session", f"fact:{h.fact_id}", h.text, h.score, True) for h in hits
            ]
            by_layer["session"] = self._rerank(query, facts)
        if "rag" in self.priorities and self.rag_limit and has_terms:
            hits = self.store.search(
                query,
                scope=scope,
                limit=self.rag_limit,
                kinds=("document",),
                include_parents=self.include_parents,
            )
            chunks = [
                _Candidate("rag", f"{h.doc_id}#{h.chunk_index}", h.text, h.score, True)
                for h in hits
            ]
            by_layer["rag"] = self._rerank(query, chunks)
        return [c for layer in self.priorities[1:] for c in by_layer.get(layer, [])]

    def _recalled(
        self, query: str, scope: MemoryScope, session_id: str, turn: int | None
    ) -> list[_Candidate]:
        """Passages of the evicted turns (of ``session_id``, or of every session of the
        scope with ``recall_other_sessions``) most relevant to ``query``."""
        hits = self.store.search_history(
            query,
            scope=scope,
            session_id=None if self.recall_other_sessions else session_id,
            limit=self.recall_limit,
            include_parents=self.include_parents,
        )
        found = []
        for h in hits:
            sid, row = str(h.metadata.get("session_id")), h.metadata.get("row")
            where = f"{row}" if sid == session_id else f"{sid}/{row}"
            found.append(
                _Candidate(
                    "history",
                    f"history:{where}#{h.chunk_index}",
                    h.text,
                    h.score,
                    True,
                    header=_when(h, session_id, turn),
                    digest=h.metadata.get("digest"),
                    row=(sid, row) if isinstance(row, int) else None,
                )
            )
        return found

    def _rerank(self, query: str, candidates: list[_Candidate]) -> list[_Candidate]:
        """Fuse the store's order with cosine similarity to the query (when an embedder is set)."""
        if self.embedder is None or len(candidates) < 2 or not query.strip():
            return candidates
        vectors = self.embedder([query] + [c.text for c in candidates])
        if not isinstance(vectors, Sequence) or len(vectors) != len(candidates) + 1:
            raise ValueError("embedder must return exactly one vector per input text")
        q = [float(x) for x in vectors[0]]
        sims = [cosine(q, [float(x) for x in v]) for v in vectors[1:]]
        by_sim = sorted(range(len(candidates)), key=lambda i: (-sims[i], i))
        fused = [rrf_weight(i + 1) for i in range(len(candidates))]
        for rank, i in enumerate(by_sim):
            fused[i] += rrf_weight(rank + 1)
        order = sorted(range(len(candidates)), key=lambda i: (-fused[i], i))
        return [candidates[i] for i in order]

    # ------------------------------------------------------------------ build

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
        if scope is not None and not isinstance(scope, MemoryScope):
            raise TypeError(f"scope must be a MemoryScope or None, got {type(scope).__name__}")
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise TypeError("session_id must be a non-empty str or None")
        if turn is not None:
            _check_int("turn", turn, minimum=1)
        if summary is not None and not isinstance(summary, str):
            raise TypeError(f"summary must be a str or None, got {type(summary).__name__}")
        if request is not None and not isinstance(request, RequestCost):
            raise TypeError(f"request must be a RequestCost or None, got {type(request).__name__}")
        reserve = (
            self.output_reserve
            if output_reserve is None
            else _check_int("output_reserve", output_reserve, minimum=0)
        )
        self.last_plan = None
        history_list = history if isinstance(history, list) else list(history)
        new_list = new_input if isinstance(new_input, list) else list(new_input)
        scope = scope if scope is not None else self.scope
        if query is None:
            query = latest_user_text(new_list, history_list)
        pool = self._candidates(query, scope, session_id=session_id, turn=turn, summary=summary)

        def build_with(pool: list[_Candidate]) -> ContextPlan:
            return self._build(
                history_list,
                new_list,
                system_prompt=system_prompt,
                query=query,
                scope=scope,
                reserve=reserve,
                index=index,
                pinned=pinned,
                context_tokens=context_tokens,
                pool=pool,
                history_offset=history_offset,
                opaque_scale=opaque_scale,
                masking=self.masking,
                request=request,
            )

        plan = build_with(pool)
        if any(c.layer == "history" for c in pool):
            plan = self._without_repeats(plan, pool, build_with, history_list, history_offset)
            self.last_plan = plan
        return plan

    def _without_repeats(
        self,
        plan: ContextPlan,
        pool: list[_Candidate],
        build_with: Callable[[list[_Candidate]], ContextPlan],
        history: list[Any],
        offset: int,
    ) -> ContextPlan:
        """``plan`` built again without the recalled passages whose row is in the request
        (kept history or new input: compared by the digest of the item's canonical text),
        until none is; they are reported as dropped blocks."""
        from .recall import item_digest

        present: dict[int, str | None] = {}  # digest by position
        new_input = plan.pack.items[len(plan.pack.kept_history) :]
        new_digests = {item_digest(item) for item in new_input}
        left_out: dict[str, tuple[_Candidate, str]] = {}
        rounds = 0
        while True:
            recalled = {b.source for b in plan.blocks if b.layer == "history" and b.kept}
            if not recalled:
                break
            digests = set(new_digests)
            for p in plan.pack.kept_history:
                if p not in present:
                    present[p] = item_digest(history[p - offset])
                digests.add(present[p])
            repeats = [
                (c, "its turn is in the request")
                for c in pool
                if c.layer == "history" and c.source in recalled and c.digest in digests
            ]
            if not repeats:
                break
            rounds += 1
            if rounds > _EXCLUSION_ROUNDS:  # never reached in practice: give the layer up
                named = {c.source for c, _ in repeats}
                repeats += [
                    (c, "left out: recalled turns kept coming back into the request")
                    for c in pool
                    if c.layer == "history" and c.source not in named
                ]
            for c, why in repeats:
                left_out[c.source] = (c, why)
            pool = [c for c in pool if c.source not in left_out]
            plan = build_with(pool)
        if not left_out:
            return plan
        counts = count_tokens_batch(
            [_render_block(c, c.text) for c, _ in left_out.values()],
            model=self.model,
            encoding=self.encoding,
        )
        extra = [
            ContextBlock(c.layer, c.source, "dropped", why, tokens, c.text, c.score)
            for (c, why), tokens in zip(left_out.values(), counts, strict=True)
        ]
        return replace(plan, blocks=[*plan.blocks, *extra])

    def _build(
        self,
        history_list: list[Any],
        new_list: list[Any],
        *,
        system_prompt: str,
        query: str,
        scope: MemoryScope | None,
        reserve: int,
        index: HistoryIndex | None,
        pinned: Iterable[int],
        context_tokens: int,
        pool: list[_Candidate],
        history_len: int | None = None,
        history_offset: int = 0,
        opaque_scale: float | None = None,
        masking: Masking | None = None,
        request: RequestCost | None = None,
    ) -> ContextPlan:
        """:meth:`build` with the recall candidates already fetched (a model filter reuses
        them for every call of a run). ``masking`` is what the pack masks with (``build``
        passes the builder's; a model filter passes its own)."""
        self.last_plan = None
        outcome: list[_Assembly] = []

        def hook(remaining: int) -> int:
            assembly = self._assemble(
                system_prompt, pool, remaining, reserved=self.max_tokens - remaining
            )
            outcome.append(assembly)
            return assembly.cost

        if history_offset and index is None:
            raise ValueError("history_offset needs an index that holds the earlier positions")
        if request is not None:
            context_tokens += request.total
        extra: dict[str, Any] = {"history_offset": history_offset} if history_offset else {}
        calibration = self.calibration_state()
        if opaque_scale is not None:
            extra["opaque_scale"] = opaque_scale
        elif calibration is not None:
            extra["opaque_scale"] = calibration.opaque_scale
        if masking is not None:
            extra["masking"] = masking
        result = (index.pack if index is not None else pack)(
            history_list,
            new_list,
            self.max_tokens,
            output_reserve=reserve,
            context_tokens=context_tokens,
            model=self.model,
            encoding=self.encoding,
            policy=self.policy,
            context=hook,
            pinned=pinned,
            history_len=history_len,
            **extra,
        )
        if len(outcome) != 1:  # pragma: no cover - the core calls the hook exactly once
            raise RuntimeError("protoprompt core did not call the context hook exactly once")
        assembly = outcome[0]
        message = assembly.message
        plan = ContextPlan(
            items=([message] if message is not None else []) + result.items,
            context_message=message,
            blocks=assembly.blocks,
            pack=result,
            query=query,
            scope=scope,
            context_limit=assembly.limit,
            calibration=calibration,
            reserved_tokens=context_tokens,
            request=request,
        )
        self.last_plan = plan
        return plan

    def _assemble(
        self, system_prompt: str, pool: list[_Candidate], remaining: int, *, reserved: int
    ) -> _Assembly:
        """Fill the context message within ``remaining`` (and the cap); see the module doc."""
        cap = self.max_context_tokens
        limit = remaining if cap is None else min(remaining, cap)
        blocks: list[ContextBlock] = []
        accepted: list[tuple[_Candidate, str]] = []
        cost = self._cost(system_prompt)
        if system_prompt:
            if cost > limit:
                if cost > remaining:
                    raise TokenBudgetExceededError(
                        reserved + cost, self.max_tokens, "system_prompt"
                    )
                raise TokenBudgetExceededError(cost, limit, "system_prompt")
            blocks.append(
                ContextBlock("system", "system_prompt", "kept", "mandatory", cost, system_prompt)
            )
        caps = {"history": self.recall_tokens, "summary": self.summary_tokens}
        used: dict[str, int] = {}
        exhausted: str | None = None
        layer_full: dict[str, str] = {}  # layers whose own limit is used up, and why
        untried: list[tuple[int, _Candidate, str]] = []
        slots: list[ContextBlock | None] = []
        for cand in pool:
            full = exhausted or layer_full.get(cand.layer)
            if full is not None:
                untried.append((len(slots), cand, full))
                slots.append(None)
                continue
            # A layer with a limit of its own fits within it and within the message's.
            layer_cap = caps.get(cand.layer)
            room = limit
            note = ""
            if layer_cap is not None and cost + layer_cap - used.get(cand.layer, 0) < limit:
                room = cost + layer_cap - used.get(cand.layer, 0)
                note = f" ({_CAP_NAMES[cand.layer]} {layer_cap})"
            trial = self._cost(self._render(system_prompt, [*accepted, (cand, cand.text)]))
            need = trial - cost
            if trial <= room:
                accepted.append((cand, cand.text))
                slots.append(
                    ContextBlock(
                        cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score
                    )
                )
                used[cand.layer] = used.get(cand.layer, 0) + need
                cost = trial
                continue
            left = room - cost
            if not cand.truncatable:
                slots.append(
                    ContextBlock(
                        cand.layer,
                        cand.source,
                        "dropped",
                        f"does not fit whole: needs {need}, {left} left{note}",
                        need,
                        cand.text,
                        cand.score,
                    )
                )
                continue
            cut = self._truncate(system_prompt, accepted, cand, room)
            if cut is None:
                slots.append(
                    ContextBlock(
                        cand.layer,
                        cand.source,
                        "dropped",
                        f"not even one word fits: {left} tokens left{note}",
                        need,
                        cand.text,
                        cand.score,
                    )
                )
                if note:
                    layer_full[cand.layer] = f"no room left in the layer{note}"
                else:
                    exhausted = "no room left after higher-ranked blocks"
                continue
            text, words, total_words, new_cost = cut
            accepted.append((cand, text))
            slots.append(
                ContextBlock(
                    cand.layer,
                    cand.source,
                    "truncated",
                    f"cut at a word boundary: {words} of {total_words} words fit in "
                    f"{left} tokens{note}",
                    new_cost - cost,
                    text,
                    cand.score,
                )
            )
            used[cand.layer] = used.get(cand.layer, 0) + new_cost - cost
            cost = new_cost
            if note:
                layer_full[cand.layer] = (
                    f"no room left in the layer after the truncated block{note}"
                )
            else:
                exhausted = "no room left after the truncated block"
        if untried:
            rendered = [_render_block(c, c.text) for _, c, _ in untried]
            counts = count_tokens_batch(rendered, model=self.model, encoding=self.encoding)
            for (slot, cand, why), tokens in zip(untried, counts, strict=True):
                slots[slot] = ContextBlock(
                    cand.layer, cand.source, "dropped", why, tokens, cand.text, cand.score
                )
        blocks.extend(b for b in slots if b is not None)
        text = self._render(system_prompt, accepted)
        message = self.context_message(text) if text else None
        final = self._cost(text)
        if final != cost or final > limit:  # pragma: no cover - counting is deterministic
            raise RuntimeError(f"context cost drifted: {final} vs {cost} (limit {limit})")
        return _Assembly(final, message, blocks, limit)

    def _truncate(
        self,
        system_prompt: str,
        accepted: list[tuple[_Candidate, str]],
        cand: _Candidate,
        limit: int,
    ) -> tuple[str, int, int, int] | None:
        """Longest word-boundary prefix of ``cand`` that fits: (text, words, of, cost)."""
        spans = [m.span() for m in WORD.finditer(cand.text)]
        best: tuple[str, int, int, int] | None = None
        lo, hi = 1, len(spans) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            text = cand.text[: spans[mid - 1][1]] + TRUNCATION_MARK
            trial = self._cost(self._render(system_prompt, [*accepted, (cand, text)]))
            if trial <= limit:
                best = (text, mid, len(spans), trial)
                lo = mid + 1
            else:
                hi = mid - 1
        return best


def _render_block(cand: _Candidate, text: str) -> str:
    if cand.layer == "session":
        return f"- {text}"
    if cand.layer == "rag":
        return f'<chunk source="{cand.source}">\n{text}\n</chunk>'
    if cand.layer == "history":
        return f"<turn {cand.header}>\n{text}\n</turn>"
    return text


def _when(hit: MemoryHit, session_id: str, turn: int | None) -> str:
    """Where a recalled passage came from, as the attributes of its ``<turn>`` tag."""
    meta = hit.metadata
    label = meta.get("label")
    what = f' what="{_attr(label)}"' if isinstance(label, str) and label else ""
    if meta.get("session_id") != session_id:
        return f'when="earlier, in session {_attr(str(meta.get("session_id")))}"{what}'
    then = meta.get("turn")
    if turn is None or isinstance(then, bool) or not isinstance(then, int) or then >= turn:
        return f'when="earlier in this session"{what}'
    ago = turn - then
    return f'when="earlier in this session, {ago} turn{"s" if ago != 1 else ""} ago"{what}'


def _attr(text: str) -> str:
    return " ".join(text.split()).replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
