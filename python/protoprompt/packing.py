"""Token counting and budget packing: the typed Python face of the Rust core."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from . import _core
from .count_store import CountStore
from .plan import (
    NO_HISTORY,
    RequestSections,
    Section,
    dropped_note,
    history_at,
    masked_note,
    unit_reason,
)

__all__ = [
    "OPAQUE_SCALE_MAX",
    "OPAQUE_SCALE_MIN",
    "TRUNCATION_MARKER",
    "Decisions",
    "FillStop",
    "GraphReport",
    "HistoryIndex",
    "HistoryWindow",
    "IndexUse",
    "ItemCost",
    "Masking",
    "PackResult",
    "PackTotals",
    "Policy",
    "Problem",
    "Unit",
    "UnitDecision",
    "analyze",
    "available_encodings",
    "count_tokens",
    "count_tokens_batch",
    "encoding_for_model",
    "item_tokens",
    "pack",
    "truncate_text",
]

Policy = Literal["contiguous", "greedy"]
Item = Mapping[str, Any]


MIN_EXCERPT_TOKENS = 16
"""The smallest :attr:`Masking.excerpt_tokens` (the shortest marker always fits in it)."""


@dataclass(frozen=True)
class Masking:
    """Mask old tool outputs before dropping whole turns (observation masking).

    With ``masking=Masking()``, a pack keeps the newest units whole while they fit; older
    units are then considered with every tool output cut, in the model-facing copy only, to
    an excerpt of at most ``excerpt_tokens`` tokens (its head and tail around a marker that
    names the tool, the call id and how many tokens were removed). A masked unit that fits is
    kept masked (decision ``"masked"``); one that does not is dropped as without masking.
    Calls, their arguments, reasoning and messages are never changed; the new input and the
    history it depends on are never masked. See ``docs/masking.md``.

    Args:
        excerpt_tokens: tokens a masked text output keeps, marker included (at least 16).
        after_turns: also mask the outputs of units older than this many newest turns of the
            history even when they would fit whole (saves tokens on every turn); ``None``
            masks only what does not fit whole.

    Raises:
        TypeError / ValueError: an argument is not an int, or out of range.
    """

    excerpt_tokens: int = 64
    after_turns: int | None = None

    def __post_init__(self) -> None:
        for name, value, minimum in (
            ("excerpt_tokens", self.excerpt_tokens, MIN_EXCERPT_TOKENS),
            ("after_turns", self.after_turns, 0),
        ):
            if value is None and name == "after_turns":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {type(value).__name__}")
            if value < minimum:
                raise ValueError(f"{name} must be at least {minimum}, got {value}")
            if value > _MAX_TOKENS:
                raise ValueError(f"{name} must be at most 2**64 - 1, got {value}")


def _check_masking(masking: Masking | None) -> Masking | None:
    if masking is not None and not isinstance(masking, Masking):
        raise TypeError(f"masking must be a Masking or None, got {type(masking).__name__}")
    return masking


@dataclass(frozen=True)
class Problem:
    """One rule violation of a unit."""

    code: str
    """Stable snake_case code, e.g. ``"call_without_output"``."""
    message: str
    """The rule as a sentence, e.g. ``"call without output"``."""
    location: str
    """The offending item, e.g. ``"history[4]"``."""


@dataclass(frozen=True)
class Unit:
    """An atomic unit of items: kept whole or dropped whole."""

    members: list[str]
    positions: list[int]
    """Global positions (history then new_input)."""
    kinds: list[str]
    valid: bool
    input_only: bool
    contains_new: bool
    problems: list[Problem]


@dataclass(frozen=True)
class GraphReport:
    """The item graph of ``history ++ new_input``, as returned by :func:`analyze`."""

    units: list[Unit]
    n_history: int
    mandatory_history: list[int]
    """History positions that ``new_input`` depends on (the tail dependency)."""

    @property
    def invalid_units(self) -> list[Unit]:
        return [u for u in self.units if not u.valid]


@dataclass(frozen=True)
class UnitDecision:
    """What :func:`pack` did with one history unit."""

    unit: int
    positions: list[int]
    """History positions of the unit, sorted."""
    kinds: list[str]
    decision: str
    """``"mandatory"``, ``"kept"``, ``"masked"`` (kept with its tool outputs masked),
    ``"over_budget"``, ``"turn_incomplete"``, ``"invalid_unit"`` or ``"input_only"``."""
    tokens: int | None
    """Tokens of the unit whole; ``None`` when it was dropped without being counted."""
    problems: list[Problem] = field(default_factory=list)
    masked_tokens: int | None = None
    """Tokens of the unit with its tool outputs masked, when that was counted (for a
    ``"masked"`` unit: the tokens sent; ``tokens - masked_tokens`` were saved)."""

    @property
    def kept(self) -> bool:
        return self.decision in _KEPT

    @property
    def sent_tokens(self) -> int | None:
        """Tokens the unit adds to the request (``None`` when it is not sent)."""
        if not self.kept:
            return None
        return self.masked_tokens if self.decision == "masked" else self.tokens


_KEPT = ("mandatory", "kept", "masked")


class Decisions(Sequence[UnitDecision]):
    """The per-unit decisions of a pack, kept by the core in compact columns.

    A long history has tens of thousands of units; a :class:`UnitDecision` is built only when
    it is accessed, so packing costs no Python object per unit.
    """

    __slots__ = ("_table",)

    def __init__(self, table: _core.DecisionTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table)

    def _build(self, i: int) -> UnitDecision:
        unit, positions, kinds, code, tokens, problems, masked = self._table.row(i)
        return UnitDecision(unit, positions, kinds, code, tokens, _problems(problems), masked)

    @overload
    def __getitem__(self, index: int) -> UnitDecision: ...
    @overload
    def __getitem__(self, index: slice) -> list[UnitDecision]: ...
    def __getitem__(self, index: int | slice) -> UnitDecision | list[UnitDecision]:
        if isinstance(index, slice):
            return [self._build(i) for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("decision index out of range")
        return self._build(index)

    def __iter__(self) -> Iterator[UnitDecision]:
        return (self._build(i) for i in range(len(self)))

    def __reversed__(self) -> Iterator[UnitDecision]:
        return (self._build(i) for i in range(len(self) - 1, -1, -1))

    def __repr__(self) -> str:
        return f"<Decisions: {len(self)} units>"

    def item_counts(self) -> dict[str, int]:
        """Number of history items per decision code."""
        return dict(self._table.item_counts())

    def unit_counts(self) -> dict[str, int]:
        """Number of units (with history items) per decision code."""
        return dict(self._table.unit_counts())


@dataclass(frozen=True)
class ItemCost:
    """Cost of one item under the documented cost model (``docs/cost-model.md``)."""

    text: int
    """Tokens of the item's canonical text (:func:`canonical_text`)."""
    media: int
    """Tokens of images, files and audio by the published rules."""
    overhead: int
    """The fixed per-item framing."""
    opaque: int = 0
    """Tokens of opaque payloads (the ``encrypted_content`` of reasoning and compaction
    items) by their decoded size, unscaled by any calibration."""
    fallback: str | None = None
    """The field of an opaque payload that is not valid base64 and was counted as text
    instead (the conservative count), e.g. ``"encrypted_content"``; ``None`` otherwise."""

    @property
    def total(self) -> int:
        return self.text + self.media + self.overhead + self.opaque

    @property
    def note(self) -> str | None:
        """Why part of the item was counted by the conservative text rule, if it was."""
        if self.fallback is None:
            return None
        return f"{self.fallback} is not valid base64: counted as text"


@dataclass(frozen=True)
class FillStop:
    """The unit at which the newest-first fill first missed (:attr:`PackResult.stop`).

    Under ``policy="contiguous"`` nothing older than it is sent (and nothing older is even
    counted); under ``"greedy"`` the rest of its turn is dropped and older turns are sent
    whole when they fit. Newer units of its turn that the fill had taken are dropped after it
    (``turn_incomplete``), which gives their tokens back: :attr:`PackResult.remaining` can be
    larger than :attr:`left`.
    """

    unit: int
    positions: list[int]
    """History positions of the unit."""
    tokens: int | None
    """Tokens of the unit whole (``None``: not counted, e.g. the fill was already masking)."""
    masked_tokens: int | None
    """Tokens of the unit with its tool outputs masked, when that was counted."""
    left: int
    """Tokens the fill had left for history when it tried the unit (after the newer units it
    had taken)."""
    cause: str
    """``"whole"`` (the unit whole did not fit), ``"masked"`` (not even masked) or
    ``"turn_masked"`` (the rest of its turn could not fit even masked, so none of it was
    masked)."""


@dataclass(frozen=True)
class PackTotals:
    """The token totals of a pack (:attr:`PackResult.totals`)."""

    budget: int
    used: int
    """Tokens of the request plus the output reserve."""
    remaining: int
    new_input: int
    dependency: int
    history: int
    """Optional history as sent (masked units at their masked cost)."""
    context: int
    output_reserve: int
    masked_units: int
    """History units sent with their tool outputs masked."""
    masked_items: int
    """History items sent as masked copies."""
    masking_saved: int
    """Tokens the masked units would have cost more whole."""


@dataclass(frozen=True)
class IndexUse:
    """How one :meth:`HistoryIndex.pack` used its index: what it reused and what it redid."""

    held: int
    """Items the index held before the pack (classified and grouped earlier: reused)."""
    appended: int
    """History items the pack classified and added to the index."""
    regrouped_from: int
    """The first history position whose units the pack rebuilt (for the items it appended
    and for the new input); ``held + appended`` when it rebuilt none."""
    reason: str | None
    """Why the rebuilding reached back to ``regrouped_from`` when a relation moved it back
    (e.g. ``"the call_id of new_input[0] is that of history[812]"``), else ``None``."""

    @property
    def regrouped(self) -> int:
        """Items the index held whose units were rebuilt (the work beyond the appended
        ones)."""
        return max(self.held - self.regrouped_from, 0)


@dataclass(frozen=True)
class HistoryWindow:
    """Where a contiguous pack can start reading the history (:meth:`HistoryIndex.window`)."""

    start: int
    """The first history position the pack can cost or keep (0: the whole history)."""
    fits: bool
    """The budget reaches the oldest unit: the whole history may be needed."""
    tie: str | None
    """What moved the start back last: ``"call_id"``, ``"id"``, ``"approval_request_id"``,
    ``"caller_id"`` (items sharing that field), ``"reasoning_run"``, ``"anonymous_tool_search"``
    or ``"unit"`` (one unit spans the positions); ``None`` when nothing did."""
    reason: str | None
    """``tie`` as a sentence naming the items, e.g. ``"history[3] and history[9120] are one
    unit"``."""
    reach: int = 0
    """How far back the budget alone reaches (``start`` is earlier when a unit or relation
    spans further back; 0 when the budget reaches the oldest unit)."""


@dataclass(frozen=True)
class PackResult:
    """The outcome of :func:`pack`."""

    items: list[Any]
    """What to send: the kept history objects (original order, same objects; with masking,
    a masked unit's tool outputs are new copies instead) then every ``new_input`` object,
    unchanged."""
    kept_history: list[int]
    dependency: list[int]
    new_input_tokens: int
    dependency_tokens: int
    history_tokens: int
    context_tokens: int
    output_reserve: int
    budget: int
    used: int
    remaining: int
    encoding: str
    policy: str
    decisions: Sequence[UnitDecision]
    """One decision per history unit, oldest first (built lazily on access)."""
    opaque_scale: float = 1.0
    """The calibration opaque payloads were costed with (1.0: the decoded-size rule)."""
    masked: list[int] = field(default_factory=list)
    """History positions sent as masked copies (sorted; a subset of ``kept_history``)."""
    masking_saved: int = 0
    """Tokens the units kept masked would have cost more whole."""

    index: IndexUse | None = None
    """How a :meth:`HistoryIndex.pack` used its index (``None`` for :func:`pack`)."""
    count_store_hits: int | None = None
    """Token counts read from the count store (``None`` without a store)."""
    count_store_writes: int | None = None
    """Token counts handed to the count store to keep (``None`` without a store)."""
    stop: FillStop | None = None
    """The unit the fill first missed at, with the tokens it had left then (``None``: every
    unit that could be sent fit)."""

    @property
    def totals(self) -> PackTotals:
        """The token totals, masking included (what was masked and the tokens it saved)."""
        masked_units = 0
        if self.masked:
            counts = (
                self.decisions.unit_counts()
                if isinstance(self.decisions, Decisions)
                else {"masked": sum(1 for d in self.decisions if d.decision == "masked")}
            )
            masked_units = counts.get("masked", 0)
        return PackTotals(
            budget=self.budget,
            used=self.used,
            remaining=self.remaining,
            new_input=self.new_input_tokens,
            dependency=self.dependency_tokens,
            history=self.history_tokens,
            context=self.context_tokens,
            output_reserve=self.output_reserve,
            masked_units=masked_units,
            masked_items=len(self.masked),
            masking_saved=self.masking_saved,
        )

    @property
    def dropped(self) -> list[UnitDecision]:
        """Decisions of the history units that are not sent."""
        return [d for d in self.decisions if not d.kept]

    def decision_counts(self) -> dict[str, int]:
        """Number of history *items* per decision code, without building decision objects."""
        decisions = self.decisions
        if isinstance(decisions, Decisions):
            return decisions.item_counts()
        counts: dict[str, int] = {}
        for d in decisions:
            counts[d.decision] = counts.get(d.decision, 0) + len(d.positions)
        return counts

    @property
    def request_tokens(self) -> int:
        """Tokens of the request itself (without the output reserve)."""
        return self.used - self.output_reserve

    @property
    def run_input_items(self) -> int:
        """Items of ``new_input`` (the run input), all sent."""
        return len(self.items) - len(self.kept_history)

    @property
    def sections(self) -> RequestSections:
        """The request by section (:mod:`protoprompt.plan`): the context (``context_tokens``
        and what a ``context`` hook took), the run input (``new_input``), the kept history
        and the output reserve. They add up to :attr:`used`."""
        return RequestSections(
            self.budget,
            (
                Section(
                    "context_message",
                    self.context_tokens,
                    note=None if self.context_tokens else "empty: no context was reserved",
                ),
                Section("run_input", self.new_input_tokens, self.run_input_items),
                self.history_section(),
                Section("output_reserve", self.output_reserve),
            ),
            self.encoding,
        )

    def history_section(self) -> Section:
        """The history this pack sends (mandatory and optional units) as one section."""
        items = len(self.kept_history)
        dropped = sum(n for k, n in self.decision_counts().items() if k not in _KEPT)
        notes = []
        if self.dependency:
            notes.append(
                f"{len(self.dependency):,} mandatory, {self.dependency_tokens:,} tokens: "
                "what the run input answers"
            )
        note = masked_note(len(self.masked))
        if note:
            notes.append(note)
        note = dropped_note(items, dropped, NO_HISTORY)
        if note:
            notes.append(note)
        return Section(
            "kept_history",
            self.history_tokens + self.dependency_tokens,
            items,
            "; ".join(notes) or None,
        )

    def reason(
        self,
        decision: UnitDecision,
        *,
        where: Callable[[Sequence[int]], str] | None = None,
        mandatory: str = "the run input depends on it",
    ) -> str:
        """Why ``decision``'s unit was kept or dropped, as a phrase for a person: the unit
        the fill stopped at says what it needed and what was left then; units dropped
        because of it name it (see :func:`protoprompt.plan.unit_reason`). ``where`` names
        positions (default ``history[a..b]``)."""
        return unit_reason(
            decision,
            stop=self.stop,
            policy=self.policy,
            where=where or history_at,
            mandatory=mandatory,
        )

    def to_html(self) -> str:
        """The plan as one self-contained HTML page: a bar of the budget by section and the
        units along the history as kept / masked / dropped, with their reasons on hover
        (:mod:`protoprompt.plan_html`)."""
        from .plan_html import plans_to_html

        return plans_to_html(self)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account of the packing: the request by section (:attr:`sections`),
        then the masked and dropped units, newest first, with their reasons (at most
        ``max_units`` of each; ``None`` lists all)."""
        lines = self.sections.lines()
        lines.extend(self.explain_units(max_units))
        return "\n".join(lines)

    def explain_units(
        self,
        max_units: int | None = 20,
        *,
        where: Callable[[Sequence[int]], str] | None = None,
    ) -> list[str]:
        """The lines of :meth:`explain` after the sections: the policy and calibration, the
        masked units and the dropped units (newest first, at most ``max_units`` each) with
        their reasons. ``where`` names positions (default ``history[a..b]``)."""
        name = where or history_at
        lines = [f"policy {self.policy}"]
        if self.opaque_scale != 1.0:
            lines[0] += (
                f"; opaque payloads at x{self.opaque_scale:g} of the decoded-size rule "
                "(calibrated; text, media and overhead at the rule)"
            )
        if self.masked:
            lines.extend(self._explain_masked(max_units, name))
        counts = {k: n for k, n in self.decision_counts().items() if k not in _KEPT}
        if not counts:
            lines.append("dropped: nothing")
            return lines
        summary = ", ".join(f"{n:,} {k}" for k, n in sorted(counts.items()))
        lines.append(f"dropped items: {summary}")
        decisions = self.decisions
        shown: list[UnitDecision] = []
        if isinstance(decisions, Decisions):
            # Counted in the core; only the shown units become objects (newest first).
            n_dropped = sum(n for k, n in decisions.unit_counts().items() if k not in _KEPT)
            for d in reversed(decisions):
                if max_units is not None and len(shown) >= max_units:
                    break
                if not d.kept:
                    shown.append(d)
        else:
            dropped = [d for d in reversed(decisions) if not d.kept]
            n_dropped = len(dropped)
            shown = dropped if max_units is None else dropped[:max_units]
        for d in shown:
            tokens = "uncounted" if d.tokens is None else f"{d.tokens:,} tokens"
            lines.append(
                f"  {name(d.positions)} {'+'.join(d.kinds)} ({tokens}): "
                f"{self.reason(d, where=name)}"
            )
        if len(shown) < n_dropped:
            lines.append(f"  ... and {n_dropped - len(shown):,} older dropped units")
        return lines

    def _explain_masked(
        self, max_units: int | None, name: Callable[[Sequence[int]], str]
    ) -> list[str]:
        """The masked units, newest first (at most ``max_units``)."""
        masked = [d for d in reversed(self.decisions) if d.decision == "masked"]
        units, outputs = len(masked), len(self.masked)
        lines = [
            f"masked: {units:,} unit{'s' if units != 1 else ''} ({outputs:,} tool "
            f"output{'s' if outputs != 1 else ''}), {self.masking_saved:,} tokens saved"
        ]
        shown = masked if max_units is None else masked[:max_units]
        lines.extend(
            f"  {name(d.positions)} {'+'.join(d.kinds)} "
            f"({d.tokens:,} -> {d.masked_tokens:,} tokens): masked"
            for d in shown
            if d.tokens is not None and d.masked_tokens is not None
        )
        if len(shown) < len(masked):
            lines.append(f"  ... and {len(masked) - len(shown):,} older masked units")
        return lines


def _as_list(items: Iterable[Item], name: str) -> list[Any]:
    if isinstance(items, list):
        return items
    if isinstance(items, (str, bytes, Mapping)):
        raise TypeError(f"{name} must be a list of items, got {type(items).__name__}")
    return list(items)


def count_tokens(text: str, *, model: str | None = None, encoding: str | None = None) -> int:
    """Number of tokens of ``text`` (special-token text counted as ordinary text).

    ``encoding`` (e.g. ``"o200k_base"``) wins over ``model`` (e.g. ``"gpt-5"``); the default
    is ``o200k_base``. Raises :class:`~protoprompt.errors.UnknownModelError` for a model
    with no known encoding.
    """
    return _core.count_tokens(text, model=model, encoding=encoding)


def preload(*, model: str | None = None, encoding: str | None = None, wait: bool = True) -> str:
    """Build the tokenizer of ``model`` / ``encoding`` now; returns the encoding name.

    A tokenizer is built once per process, on first use, and takes about 0.1 s (o200k_base:
    ~40 MB). Call this at start-up so the first request does not pay for it; with
    ``wait=False`` it is built on a background thread (the GIL is not held, and a ``fork``
    meanwhile waits for the build to finish, so a child never inherits a half-built one).
    ``ProtoPromptSession.input_callback`` starts this in the background for its builder.
    """
    return _core.preload(model=model, encoding=encoding, wait=wait)


def count_tokens_batch(
    texts: Iterable[str], *, model: str | None = None, encoding: str | None = None
) -> list[int]:
    """Token counts of many texts with one release of the GIL."""
    return _core.count_tokens_batch(list(texts), model=model, encoding=encoding)


TRUNCATION_MARKER = "\n[… {removed} tokens removed by protoprompt …]\n"
"""Put between the head and tail of a cut text; ``{removed}`` is the number of tokens cut."""


def truncate_text(
    text: str,
    max_tokens: int,
    *,
    model: str | None = None,
    encoding: str | None = None,
    tail_share: float = 0.2,
    marker: str = TRUNCATION_MARKER,
) -> str:
    """``text`` cut to at most ``max_tokens`` tokens: its first and last tokens around
    ``marker``, which says how many tokens were removed.

    The count is exact for the model's encoding: ``count_tokens(result) <= max_tokens``
    always holds. ``tail_share`` of the kept tokens come from the end of the text (0 keeps
    only the head). A text that fits is returned unchanged; when not even the marker fits,
    the result is the text's first ``max_tokens`` tokens without a marker.

    Raises:
        TypeError / ValueError: bad arguments; UnknownModelError / UnknownEncodingError.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int):
        raise TypeError(f"max_tokens must be an int, got {type(max_tokens).__name__}")
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    if not 0.0 <= tail_share <= 1.0:
        raise ValueError(f"tail_share must be between 0 and 1, got {tail_share!r}")
    if "{removed}" not in marker:
        raise ValueError("marker must contain '{removed}'")
    return _core.cut_text(
        text, max_tokens, tail_share=tail_share, marker=marker, model=model, encoding=encoding
    )


def encoding_for_model(model: str) -> str:
    """The tiktoken encoding name of an OpenAI model (``gpt-5`` -> ``o200k_base``)."""
    return _core.encoding_for_model(model)


def available_encodings() -> list[str]:
    """Names of the encodings bundled with protoprompt (no download needed)."""
    return _core.available_encodings()


def item_tokens(item: Item, *, model: str | None = None, encoding: str | None = None) -> ItemCost:
    """The cost of one Responses input item (see ``docs/cost-model.md``)."""
    text, media, overhead, opaque, fallback = _core.item_tokens(
        item, model=model, encoding=encoding
    )
    return ItemCost(text, media, overhead, opaque, fallback)


def canonical_text(item: Item) -> str:
    """The canonical text of one item: the plain-text rendering of its provider-bound
    fields that its text tokens are counted on (see ``docs/cost-model.md``). Media and
    opaque payloads are not in it (they are costed apart), nor fields the SDK strips before
    sending.

    Raises:
        InvalidItemError: ``item`` is malformed (the message names the field).
    """
    return _core.canonical_text(item)


def _problems(raw: Iterable[tuple[str, str, str]]) -> list[Problem]:
    return [Problem(code, message, location) for code, message, location in raw]


def analyze(history: Iterable[Item], new_input: Iterable[Item]) -> GraphReport:
    """Split ``history ++ new_input`` into atomic units and report their validity."""
    raw = _core.analyze(_as_list(history, "history"), _as_list(new_input, "new_input"))
    units = [
        Unit(
            members=u["members"],
            positions=u["positions"],
            kinds=u["kinds"],
            valid=u["valid"],
            input_only=u["input_only"],
            contains_new=u["contains_new"],
            problems=_problems(u["problems"]),
        )
        for u in raw["units"]
    ]
    return GraphReport(units, raw["n_history"], raw["mandatory_history"])


def pack(
    history: Iterable[Item],
    new_input: Iterable[Item],
    budget: int,
    *,
    output_reserve: int = 0,
    context_tokens: int = 0,
    model: str | None = None,
    encoding: str | None = None,
    policy: Policy = "contiguous",
    context: Callable[[int], int] | None = None,
    count_store: CountStore | None = None,
    pinned: Iterable[int] = (),
    history_len: int | None = None,
    opaque_scale: float = 1.0,
    masking: Masking | None = None,
) -> PackResult:
    """Fit ``history`` into ``budget`` after reserving ``new_input`` whole.

    Reserved first, all or nothing: ``new_input``, the history graph it completes (the tail
    dependency, when it starts with a tool output), ``output_reserve`` and
    ``context_tokens``. ``context``, when given, is then called once with the tokens still
    free and returns how many of them the caller's own context (system prompt, recalled
    memory) takes; history gets the rest. Then the newest history units are added while they
    fit. A unit (a call with its outputs, reasoning with its follower, a program with its
    children…) is kept whole or dropped whole; invalid units and input-only controls are
    never sent. The kept history starts at a user message: when the fill stops inside a turn,
    the newer units of that turn are dropped too (``turn_incomplete``), unless the turn's
    user message is mandatory. ``count_store`` (e.g. a :class:`~protoprompt.SQLiteCountStore`)
    keeps token counts across processes; the result is the same with or without it.
    ``pinned`` lists history positions that are mandatory like ``new_input`` (their units
    are reserved whole and reported as ``mandatory``): a per-call model filter pins the
    context message and the run's own input, and fills the items between them and the
    newest step as optional history. ``history_len`` uses only the first ``history_len``
    items of the ``history`` list (no copy of a long prefix). ``opaque_scale`` calibrates the
    opaque part of item costs (the ``encrypted_content`` of reasoning and compaction items,
    by decoded size): a factor between 0.25 and 2 of the rule, normally learned from the
    provider's own counts (:class:`~protoprompt.Calibration`); text, media and overhead are
    never scaled.

    ``masking`` (a :class:`Masking`; default ``None``, off): units older than those that fit
    whole are kept with their tool outputs cut to short excerpts before anything is dropped
    (decision ``"masked"``). The masked outputs in ``items`` are new copies; the caller's
    items are never changed.

    Raises:
        TokenBudgetExceededError: the reserved part alone exceeds ``budget``.
        InvalidNewInputError: ``new_input`` cannot be sent as given (the message names each
            offending item and rule).
        InvalidItemError: an item is malformed (the message names the item and field).
        TypeError: ``count_store`` does not implement :class:`~protoprompt.CountStore`.
    """
    # A throw-away index: the core classifies a long history chunk by chunk into it.
    options = _PackOptions(
        budget,
        output_reserve=output_reserve,
        context_tokens=context_tokens,
        model=model,
        encoding=encoding,
        policy=policy,
        context=context,
        pinned=pinned,
        history_len=history_len,
        opaque_scale=opaque_scale,
        masking=masking,
    )
    return _run(
        _core.HistoryIndex().pack, history, new_input, options, _checked(count_store), indexed=False
    )


def _checked(count_store: CountStore | None) -> CountStore | None:
    if count_store is not None and not isinstance(count_store, CountStore):
        raise TypeError(
            f"count_store must have secret, get_many and put_many, got {type(count_store).__name__}"
        )
    return count_store


_MAX_TOKENS = 2**64 - 1
"""Largest token amount the core represents (costs and sums saturate there)."""


def _check_sizes(budget: int, output_reserve: int, context_tokens: int) -> None:
    for name, value in (
        ("budget", budget),
        ("output_reserve", output_reserve),
        ("context_tokens", context_tokens),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < 0:
            raise ValueError(f"{name} must be >= 0, got {value}")
        if value > _MAX_TOKENS:
            raise ValueError(f"{name} must be at most 2**64 - 1 tokens, got {value}")


OPAQUE_SCALE_MIN: float = _core.OPAQUE_SCALE_MIN
"""Smallest calibration of opaque payloads (a quarter of the decoded-size rule)."""
OPAQUE_SCALE_MAX: float = _core.OPAQUE_SCALE_MAX
"""Largest calibration of opaque payloads (twice the decoded-size rule)."""


def _check_opaque_scale(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"opaque_scale must be a number, got {type(value).__name__}")
    if not OPAQUE_SCALE_MIN <= value <= OPAQUE_SCALE_MAX:
        raise ValueError(
            f"opaque_scale must be between {OPAQUE_SCALE_MIN} and {OPAQUE_SCALE_MAX}, got {value!r}"
        )
    return float(value)


def _check_pinned(pinned: Iterable[int]) -> list[int]:
    if isinstance(pinned, (str, bytes)) or not isinstance(pinned, Iterable):
        raise TypeError(
            f"pinned must be an iterable of history positions, got {type(pinned).__name__}"
        )
    pins = list(pinned)
    for i, p in enumerate(pins):
        if isinstance(p, bool) or not isinstance(p, int):
            raise TypeError(f"pinned[{i}] must be an int, got {type(p).__name__}")
        if p < 0:
            raise ValueError(f"pinned[{i}] is {p}, not a history position")
    return pins


@dataclass(frozen=True)
class _PackOptions:
    """The options of one pack, checked once: what :func:`pack` and
    :meth:`HistoryIndex.pack` take as keywords, handed to the core as one value (the core
    reads these attributes)."""

    budget: int
    output_reserve: int = 0
    context_tokens: int = 0
    model: str | None = None
    encoding: str | None = None
    policy: Policy = "contiguous"
    context: Callable[[int], int] | None = None
    pinned: Iterable[int] = ()
    history_len: int | None = None
    history_offset: int = 0
    opaque_scale: float = 1.0
    masking: Masking | None = None

    def __post_init__(self) -> None:
        _check_sizes(self.budget, self.output_reserve, self.context_tokens)
        object.__setattr__(self, "opaque_scale", _check_opaque_scale(self.opaque_scale))
        _check_masking(self.masking)
        # A tuple of checked positions (a list or generator given is read once, here).
        object.__setattr__(self, "pinned", tuple(_check_pinned(self.pinned)))
        history_len = self.history_len
        if history_len is not None and (
            isinstance(history_len, bool) or not isinstance(history_len, int) or history_len < 0
        ):
            raise ValueError(f"history_len must be a non-negative int or None, got {history_len!r}")
        offset = self.history_offset
        if offset and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
            raise ValueError(f"history_offset must be a non-negative int, got {offset!r}")


def _run(
    core_pack: Callable[..., Mapping[str, Any]],
    history: Iterable[Item],
    new_input: Iterable[Item],
    options: _PackOptions,
    count_store: CountStore | None = None,
    *,
    indexed: bool = True,
) -> PackResult:
    """Call the core's ``HistoryIndex.pack`` with the checked options, wrap its dict
    (``indexed``: the pack went through a caller's index, whose use it reports)."""
    raw = core_pack(
        _as_list(history, "history"), _as_list(new_input, "new_input"), options, count_store
    )
    if count_store is not None and raw["new_counts"]:
        count_store.put_many(raw["new_counts"])
    held, appended, regrouped_from, why = raw["index"]
    decisions = Decisions(raw["decisions"])
    return PackResult(
        # The objects the core read, classified and counted (not positions looked up again
        # in a list another thread may have changed meanwhile).
        items=raw["items"],
        kept_history=raw["kept_history"],
        dependency=raw["dependency"],
        new_input_tokens=raw["new_input_tokens"],
        dependency_tokens=raw["dependency_tokens"],
        history_tokens=raw["history_tokens"],
        context_tokens=raw["context_tokens"],
        output_reserve=raw["output_reserve"],
        budget=raw["budget"],
        used=raw["used"],
        remaining=raw["remaining"],
        encoding=raw["encoding"],
        policy=raw["policy"],
        decisions=decisions,
        opaque_scale=raw["opaque_scale"],
        masked=raw["masked"],
        masking_saved=raw["masking_saved"],
        index=IndexUse(held, appended, regrouped_from, why) if indexed else None,
        count_store_hits=raw.get("store_hits") if count_store is not None else None,
        count_store_writes=len(raw["new_counts"]) if count_store is not None else None,
        stop=_stop(decisions, raw["stop"]),
    )


def _stop(decisions: Decisions, raw: tuple[int, int, str] | None) -> FillStop | None:
    if raw is None:
        return None
    unit, left, cause = raw
    d = decisions[unit]
    return FillStop(unit, d.positions, d.tokens, d.masked_tokens, left, cause)


class HistoryIndex:
    """The classified history of one conversation, kept between turns.

    :func:`pack` reads every history item on every call. A ``HistoryIndex`` remembers the
    items it has seen (their graph fields and the item graph), so the next turn's pack costs
    the items that are new plus the ones that are kept, not the whole history: at 100k items
    a warm turn takes milliseconds instead of hundreds of milliseconds. The result is exactly
    that of :func:`pack` (tested).

    The contract: the first ``len(index)`` items of every ``history`` passed to :meth:`pack`
    are the items the index has already seen, unchanged and in order (items appended since
    are picked up automatically). After removing or rewriting history, call
    :meth:`truncate` or :meth:`clear`. :class:`~protoprompt.integrations.agents.\
ProtoPromptSession` keeps its index in step with the session store for you.

    One index serves one conversation and is not meant to be used from two threads at once.
    Results may be kept: a result's ``decisions`` read the index's item graph until the index
    next changes, and then keep a compact copy of their own rows.

    Args:
        count_store: where token counts outlive the process (e.g. a
            :class:`~protoprompt.SQLiteCountStore`): counts of long texts the process has not
            seen are read from it before tokenising, and new ones are written to it, so a
            restarted process does not tokenise its history again. Results are identical
            with and without a store (tested).

    Raises:
        TypeError: ``count_store`` does not implement :class:`~protoprompt.CountStore`.
    """

    __slots__ = ("_index", "count_store")

    def __init__(self, *, count_store: CountStore | None = None) -> None:
        self._index = _core.HistoryIndex()
        self.count_store = _checked(count_store)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"<HistoryIndex: {len(self)} items>"

    @property
    def snapshot_costs_dropped(self) -> str | None:
        """Why the token costs of the snapshot this index was loaded from were not reused
        (they were counted under an earlier cost rule, e.g. before opaque payloads were
        costed by their decoded size), or its masked costs (counted under another masking
        or cost rule): ``None`` when they were, or when the index was not loaded from a
        snapshot. The items and graph of such a snapshot are reused."""
        return self._index.snapshot_costs_dropped

    @property
    def nbytes(self) -> int:
        """Approximate memory held by the index, in bytes (about 0.23 KB per item; measured
        sizes are in benches/README.md)."""
        return self._index.nbytes

    def extend(self, items: Iterable[Item]) -> None:
        """Append history items (classified now; their tokens are counted when needed)."""
        self._index.extend(_as_list(items, "items"))

    def truncate(self, length: int) -> None:
        """Keep only the first ``length`` items (after ``pop_item`` or a rewrite)."""
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise ValueError(f"length must be a non-negative int, got {length!r}")
        self._index.truncate(min(length, len(self._index)))

    def clear(self) -> None:
        """Forget every item."""
        self._index.clear()

    def snapshot(self, *, bound_to: bytes = b"") -> bytes:
        """The index as bytes, for :meth:`from_snapshot` in this or a later process.

        It holds the items' graph fields (ids, call ids, types, statuses — no message text,
        arguments or outputs), the item graph and the token costs counted so far (masked
        costs of tool outputs included, so a token window found after a restart is the
        warm index's), behind a checksum. Loading it costs a fraction of reading the history
        again (about 0.14 KB per item: 14 MB at 100k items; measured sizes are in
        benches/README.md).
        ``bound_to`` names what the items are (e.g. the database, the session and the rows
        they were read from): :meth:`from_snapshot` loads the snapshot
        only for the same bytes, so a snapshot put in the wrong place is refused instead of
        describing the wrong history.

        The checksum finds accidents (a cut or damaged blob, a snapshot of something else),
        not forgeries: whoever can write where snapshots are kept can also write the
        history they describe.
        """
        if not isinstance(bound_to, bytes):
            raise TypeError(f"bound_to must be bytes, got {type(bound_to).__name__}")
        return self._index.snapshot(bound_to=bound_to)

    @classmethod
    def from_snapshot(
        cls, data: bytes, *, count_store: CountStore | None = None, bound_to: bytes = b""
    ) -> HistoryIndex:
        """An index loaded from :meth:`snapshot`'s bytes, written with the same ``bound_to``.

        The same contract holds as for the index that wrote it: the history passed to
        :meth:`pack` must start with the items it had seen, unchanged (:meth:`truncate` it
        first if the history has lost items since).

        Raises:
            TypeError: ``data`` or ``bound_to`` is not bytes.
            SnapshotError: ``data`` is damaged, not a snapshot, written by another
                version of protoprompt, or taken for another ``bound_to``; build the index
                from the history instead.
        """
        if not isinstance(data, bytes):
            raise TypeError(f"data must be bytes, got {type(data).__name__}")
        if not isinstance(bound_to, bytes):
            raise TypeError(f"bound_to must be bytes, got {type(bound_to).__name__}")
        index = cls(count_store=count_store)
        index._index = _core.HistoryIndex.from_snapshot(data, bound_to=bound_to)
        return index

    def pack(
        self,
        history: Iterable[Item],
        new_input: Iterable[Item],
        budget: int,
        *,
        output_reserve: int = 0,
        context_tokens: int = 0,
        model: str | None = None,
        encoding: str | None = None,
        policy: Policy = "contiguous",
        context: Callable[[int], int] | None = None,
        pinned: Iterable[int] = (),
        history_len: int | None = None,
        history_offset: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> PackResult:
        """:func:`pack` for a ``history`` that extends what this index has seen.

        Items after the first ``len(self)`` are classified and added to the index first.
        Raises :class:`~protoprompt.HistoryMismatchError` (a ``ValueError``) when
        ``history`` is shorter than the index (call :meth:`truncate` or :meth:`clear` after
        removing items), and the errors of
        :func:`pack`. A failed call changes nothing: the index holds what it held before
        (only token counts it made stay cached).

        ``history_len``: only the first ``history_len`` items of the ``history`` list are the
        history (the rest is ignored), so a caller holding one long list — a model filter
        whose input is history plus the newest step — need not copy its prefix.

        ``history_offset``: the ``history`` list holds the history from that position on
        (a windowed read from :meth:`window_start`); the positions before it must be
        indexed. The result is the pack of the whole history; an
        :class:`~protoprompt.errors.InvalidItemError` names the first earlier item the pack
        would need, if any.

        ``masking``: as in :func:`pack`; the masked costs of tool outputs are kept between
        turns too (for one encoding and ``excerpt_tokens``), and in :meth:`snapshot`.
        """
        options = _PackOptions(
            budget,
            output_reserve=output_reserve,
            context_tokens=context_tokens,
            model=model,
            encoding=encoding,
            policy=policy,
            context=context,
            pinned=pinned,
            history_len=history_len,
            history_offset=history_offset,
            opaque_scale=opaque_scale,
            masking=masking,
        )
        return _run(self._index.pack, history, new_input, options, self.count_store)

    def window_start(
        self,
        new_items: Iterable[Item],
        budget: int,
        *,
        model: str | None = None,
        encoding: str | None = None,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> int:
        """The first history position a contiguous :meth:`pack` within ``budget`` tokens of
        history can cost or keep, for the history this index has seen followed by
        ``new_items`` (items appended to the history since, then the new input).

        Passing the history from there on (``history[start:]`` with
        ``history_offset=start``) packs to exactly the request of the whole history. It is
        moved back to where no unit, turn or tool-call relation crosses it. Costs not yet
        counted count as the smallest an item can cost, which only moves it earlier
        (:meth:`count_window` counts them). ``0`` when the whole history may be needed.
        The greedy policy has no such bound: pack the whole history for it. Pass the
        ``opaque_scale`` the pack will use (costs counted under another count as unknown).
        For a pack with ``masking``, pass the same ``masking``: a tool output then counts at
        most its masked cost, so the window reaches the older units a masked pack may keep.
        """
        return self.window(
            new_items,
            budget,
            model=model,
            encoding=encoding,
            opaque_scale=opaque_scale,
            masking=masking,
        ).start

    def window(
        self,
        new_items: Iterable[Item],
        budget: int,
        *,
        model: str | None = None,
        encoding: str | None = None,
        new_input: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> HistoryWindow:
        """:meth:`window_start`, with why the window does not start later: whether the
        budget reaches the oldest unit, and the relation that moved the start back last (the
        reason a window starting at 0 cannot be proved shorter). ``new_input``: how many of
        the last ``new_items`` are the new input (they are named ``new_input[i]`` in
        ``reason``; the others are history appended since the index last saw it)."""
        _check_sizes(budget, 0, 0)
        items = _as_list(new_items, "new_items")
        if isinstance(new_input, bool) or not isinstance(new_input, int) or new_input < 0:
            raise ValueError(f"new_input must be a non-negative int, got {new_input!r}")
        start, fits, tie, reason, reach = self._index.window(
            items,
            budget,
            model=model,
            encoding=encoding,
            new_input=min(new_input, len(items)),
            opaque_scale=_check_opaque_scale(opaque_scale),
            masking=_check_masking(masking),
        )
        return HistoryWindow(int(start), bool(fits), tie, reason, int(reach))

    def user_positions(self, start: int = 0, end: int | None = None) -> list[int]:
        """Positions of the user messages (where turns start) among the indexed positions
        ``start`` to ``end`` (default: the end of the index)."""
        for name, value in (("start", start), ("end", end)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        return self._index.user_positions(start, len(self) if end is None else end)

    def cost_over(
        self,
        history: Iterable[Item],
        limit: int,
        *,
        appended: Iterable[Item] = (),
        model: str | None = None,
        encoding: str | None = None,
        opaque_scale: float = 1.0,
    ) -> tuple[int, bool]:
        """Whether ``history`` -- exactly the items this index holds -- followed by
        ``appended`` (items stored since) costs more than ``limit`` tokens, and what the
        newest items cost up to where that was decided: ``(tokens, exceeded)``.

        Summed newest first under the same rule as :meth:`pack` (``opaque_scale`` as
        there); costs the index has counted are reused and the others counted (and kept),
        and the walk stops once past ``limit``: a long history costs what its newest
        ``limit`` tokens cost, not all of it. Raises ``ValueError`` when ``history`` does not
        have the index's length, and :func:`pack`'s item errors."""
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if not 0 <= limit <= _MAX_TOKENS:
            raise ValueError(f"limit must be between 0 and 2**64 - 1 tokens, got {limit}")
        return self._index.cost_over(
            _as_list(history, "history"),
            _as_list(appended, "appended"),
            limit,
            model=model,
            encoding=encoding,
            opaque_scale=_check_opaque_scale(opaque_scale),
        )

    def count_window(
        self,
        history: Iterable[Item],
        budget: int,
        *,
        model: str | None = None,
        encoding: str | None = None,
        history_offset: int = 0,
        opaque_scale: float = 1.0,
        masking: Masking | None = None,
    ) -> int:
        """Count the token costs a later :meth:`window_start` with ``budget`` walks over, so
        that it finds the window from exact costs; returns the window start for the history
        as indexed now. ``history`` holds the indexed history from ``history_offset`` on
        (exactly ``len(self) - history_offset`` items; earlier positions keep what they
        have). Counts go to the count store as in :meth:`pack`. With ``masking``, the masked
        costs are counted too (for a :meth:`window_start` with the same masking).
        """
        _check_sizes(budget, 0, 0)
        store = self.count_store
        raw = self._index.count_window(
            _as_list(history, "history"),
            budget,
            model=model,
            encoding=encoding,
            history_offset=history_offset,
            count_store=store,
            opaque_scale=_check_opaque_scale(opaque_scale),
            masking=_check_masking(masking),
        )
        if store is not None and raw.get("new_counts"):
            store.put_many(raw["new_counts"])
        return int(raw["start"])
