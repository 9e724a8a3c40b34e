"""The values :func:`protoprompt.pack` reports: decisions, costs, units, stops, windows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from .. import _core
from ..errors import renamed

Policy = Literal["contiguous", "greedy"]
Item = Mapping[str, Any]


MIN_EXCERPT_TOKENS = 16
"""The smallest :attr:`Masking.excerpt_tokens` (the shortest marker always fits in it)."""

MAX_TOKENS = 2**64 - 1
"""Largest token amount the core represents (costs and sums saturate there)."""


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
        omit_reasoning: a unit sent masked that stands before the last user message also
            leaves out its OpenAI reasoning items, and its assistant messages and function /
            custom tool calls are sent as copies without their ``id`` (an item whose id names
            a reasoning item that is not sent is refused by the Responses API). The current
            turn's tool loop, Claude's thinking (and any reasoning carrying
            ``provider_data``) and units with other model items (hosted calls, programs,
            computer / shell / apply_patch / tool-search / approval items) keep their
            reasoning. ``PackResult.omitted_reasoning`` lists what was left out.

    Raises:
        TypeError / ValueError: an argument is not an int, or out of range.
    """

    excerpt_tokens: int = 64
    after_turns: int | None = None
    omit_reasoning: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.omit_reasoning, bool):
            raise TypeError(
                f"omit_reasoning must be a bool, got {type(self.omit_reasoning).__name__}"
            )
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
            if value > MAX_TOKENS:
                raise ValueError(f"{name} must be at most 2**64 - 1, got {value}")


def check_masking(masking: Masking | None) -> Masking | None:
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


def problems_of(raw: Iterable[tuple[str, str, str]]) -> list[Problem]:
    return [Problem(code, message, location) for code, message, location in raw]


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
        return self.decision in KEPT

    @property
    def sent_tokens(self) -> int | None:
        """Tokens the unit adds to the request (``None`` when it is not sent)."""
        if not self.kept:
            return None
        return self.masked_tokens if self.decision == "masked" else self.tokens


KEPT = ("mandatory", "kept", "masked")


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
        return UnitDecision(unit, positions, kinds, code, tokens, problems_of(problems), masked)

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

    max_tokens: int
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

    # The plans' names for the same totals (docs/reading-a-plan.md, the glossary); the
    # fields above keep their names until 1.1.

    @property
    def budget(self) -> int:
        """:attr:`max_tokens` by its old name (an alias until 1.1; a ``DeprecationWarning``)."""
        renamed("PackTotals", "budget", "max_tokens")
        return self.max_tokens

    @property
    def run_input(self) -> int:
        """The run input's tokens (the section ``run_input``; field ``new_input``)."""
        return self.new_input

    @property
    def context_message(self) -> int:
        """The fixed context's tokens (the section ``context_message``, with the
        instructions, tools and schema when they were counted into it; field ``context``)."""
        return self.context

    @property
    def kept_history(self) -> int:
        """The history sent, mandatory part included (the section ``kept_history``:
        fields ``history + dependency``)."""
        return self.history + self.dependency

    @property
    def request_tokens(self) -> int:
        """The request: everything but the output reserve (``used - output_reserve``)."""
        return self.used - self.output_reserve


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
    ``"caller_id"`` (items sharing that field), ``"reasoning_run"``, ``"anonymous_tool_search"``,
    ``"unit"`` (one unit spans the positions) or ``"turn"`` (a masked pack checks the turn of
    the unit the budget stops at back to its user message); ``None`` when nothing did."""
    reason: str | None
    """``tie`` as a sentence naming the items, e.g. ``"history[3] and history[9120] are one
    unit"``."""
    reach: int = 0
    """How far back the budget alone reaches (``start`` is earlier when a unit or relation
    spans further back; 0 when the budget reaches the oldest unit)."""
