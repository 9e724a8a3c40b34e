"""The context message's blocks: recall candidates, their rendering, and how they are
accepted, cut or dropped within the room a turn leaves (the assembly)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._context_plan import ContextBlock
from .errors import TokenBudgetExceededError
from .memory import MemoryHit
from .memory._ranking import WORD

TRUNCATION_MARK = " …"
"""Appended to a block that was cut at a word boundary, so the model can tell."""

SECTION_TAGS = {
    "profile": "user_profile",
    "summary": "summary_of_earlier_turns",
    "session": "session_facts",
    "rag": "recalled_documents",
    "history": "recalled_turns",
}
CAP_NAMES = {"history": "recall_tokens", "summary": "summary_tokens"}
TEXT_CAPS = frozenset({"summary"})
"""Layers of one block whose limit counts its text (as stored), not the tags and escapes
around it: the summary, stored cut to ``summary_tokens``, is sent whole within it."""


@dataclass(frozen=True)
class Assembly:
    """The context message chosen by the hook, with its exact cost and block decisions."""

    cost: int
    message: dict[str, Any] | None
    blocks: list[ContextBlock]
    limit: int


@dataclass
class Candidate:
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


def render_block(cand: Candidate, text: str) -> str:
    """A block as the context message carries it: its text escaped (:func:`data`) inside
    the layer's frame, whose attributes are escaped too (:func:`attr`)."""
    if cand.layer == "session":
        return f"- {data(text)}"
    if cand.layer == "rag":
        return f'<chunk source="{attr(cand.source)}">\n{data(text)}\n</chunk>'
    if cand.layer == "history":
        return f"<turn {cand.header}>\n{data(text)}\n</turn>"
    return data(text)


def data(text: str) -> str:
    """Text from a tool, a user, a model or a memory writer as data inside the context
    message's tags: ``&`` and ``<`` escaped as in XML, so no text can close a frame, open
    one or forge a tag or header (``</turn>`` reads ``&lt;/turn>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;")


def when(hit: MemoryHit, session_id: str, turn: int | None) -> str:
    """Where a recalled passage came from, as the attributes of its ``<turn>`` tag."""
    meta = hit.metadata
    label = meta.get("label")
    what = f' what="{attr(label)}"' if isinstance(label, str) and label else ""
    if meta.get("session_id") != session_id:
        return f'when="earlier, in session {attr(str(meta.get("session_id")))}"{what}'
    then = meta.get("turn")
    if turn is None or isinstance(then, bool) or not isinstance(then, int) or then >= turn:
        return f'when="earlier in this session"{what}'
    ago = turn - then
    return f'when="earlier in this session, {ago} turn{"s" if ago != 1 else ""} ago"{what}'


def attr(text: str) -> str:
    """Text as the value of a double-quoted tag attribute: on one line, ``&``, ``"``, ``<``
    and ``>`` escaped (so the tag cannot read as closed early)."""
    one_line = " ".join(text.split())
    return (
        one_line.replace("&", "&amp;")
        .replace('"', "&quot;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
    )


@dataclass
class _Fill:
    """The state of one assembly while it walks the pool."""

    cost: int
    accepted: list[tuple[Candidate, str]] = field(default_factory=list)
    used: dict[str, int] = field(default_factory=dict)
    exhausted: str | None = None
    layer_full: dict[str, str] = field(default_factory=dict)
    """Layers whose own limit is used up, and why."""
    untried: list[tuple[int, Candidate, str]] = field(default_factory=list)
    slots: list[ContextBlock | None] = field(default_factory=list)

    def accept(self, cand: Candidate, text: str, new_cost: int) -> None:
        self.accepted.append((cand, text))
        self.used[cand.layer] = self.used.get(cand.layer, 0) + new_cost - self.cost
        self.cost = new_cost


def _dropped(cand: Candidate, reason: str, tokens: int | None) -> ContextBlock:
    return ContextBlock(cand.layer, cand.source, "dropped", reason, tokens, cand.text, cand.score)


@dataclass(frozen=True)
class Assembler:
    """Fills a context message from a pool of candidates: the builder's settings that
    matter for it, read when a turn is built."""

    priorities: tuple[str, ...]
    role: str
    model: str | None
    encoding: str
    max_tokens: int
    max_context_tokens: int | None
    caps: dict[str, int]
    """The layers with a limit of their own (``history``, ``summary``), and the limit."""
    cost: Callable[[str], int]
    """Tokens of the context message for a text (0 for no text)."""
    count_batch: Callable[[list[str]], list[int]]
    """Token counts of texts."""

    def message(self, text: str) -> dict[str, Any]:
        """The context message for ``text``."""
        return {"role": self.role, "content": text}

    def render(self, system_prompt: str, accepted: Sequence[tuple[Candidate, str]]) -> str:
        """The context text: the system prompt, then one tagged section per layer."""
        parts = [system_prompt] if system_prompt else []
        for layer in self.priorities[1:]:
            rendered = [render_block(cand, text) for cand, text in accepted if cand.layer == layer]
            if not rendered:
                continue
            tag = SECTION_TAGS[layer]
            body = "\n".join(rendered)
            parts.append(f"<{tag}>\n{body}\n</{tag}>")
        return "\n\n".join(parts)

    def assemble(
        self, system_prompt: str, pool: list[Candidate], remaining: int, *, reserved: int
    ) -> Assembly:
        """Fill the context message within ``remaining`` (and the cap); see
        :mod:`protoprompt.context`."""
        cap = self.max_context_tokens
        limit = remaining if cap is None else min(remaining, cap)
        blocks: list[ContextBlock] = []
        fill = _Fill(self.cost(system_prompt))
        if system_prompt:
            if fill.cost > limit:
                if fill.cost > remaining:
                    raise TokenBudgetExceededError(
                        reserved + fill.cost, self.max_tokens, "system_prompt"
                    )
                raise TokenBudgetExceededError(fill.cost, limit, "system_prompt")
            blocks.append(
                ContextBlock(
                    "system", "system_prompt", "kept", "mandatory", fill.cost, system_prompt
                )
            )
        for cand in pool:
            self._try(system_prompt, fill, cand, limit)
        if fill.untried:
            counts = self.count_batch([render_block(c, c.text) for _, c, _ in fill.untried])
            for (slot, cand, why), tokens in zip(fill.untried, counts, strict=True):
                fill.slots[slot] = _dropped(cand, why, tokens)
        blocks.extend(b for b in fill.slots if b is not None)
        text = self.render(system_prompt, fill.accepted)
        message = self.message(text) if text else None
        final = self.cost(text)
        if final != fill.cost or final > limit:  # pragma: no cover - counting is deterministic
            raise RuntimeError(f"context cost drifted: {final} vs {fill.cost} (limit {limit})")
        return Assembly(final, message, blocks, limit)

    def _try(self, system_prompt: str, fill: _Fill, cand: Candidate, limit: int) -> None:
        """Accept ``cand`` whole, cut, or drop it (one slot of the fill)."""
        full = fill.exhausted or fill.layer_full.get(cand.layer)
        if full is not None:
            fill.untried.append((len(fill.slots), cand, full))
            fill.slots.append(None)
            return
        trial = self.cost(self.render(system_prompt, [*fill.accepted, (cand, cand.text)]))
        need = trial - fill.cost
        # A layer with a limit of its own fits within it and within the message's.
        layer_cap = self.caps.get(cand.layer)
        room = limit
        note = ""
        text_room: int | None = None
        if layer_cap is not None and cand.layer in TEXT_CAPS:
            # The limit is the text's (one block): its frame and escapes come on top.
            if self.count_batch([cand.text])[0] > layer_cap:
                text_room = layer_cap
                note = f" ({CAP_NAMES[cand.layer]} {layer_cap} of text)"
        elif layer_cap is not None:
            own = layer_cap - fill.used.get(cand.layer, 0)
            if fill.cost + own < limit:
                room = fill.cost + own
                note = f" ({CAP_NAMES[cand.layer]} {layer_cap})"
        if trial <= room and text_room is None:
            fill.slots.append(
                ContextBlock(cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score)
            )
            fill.accept(cand, cand.text, trial)
            return
        left = room - fill.cost if text_room is None else min(room - fill.cost, text_room)
        if not cand.truncatable:
            reason = f"does not fit whole: needs {need}, {left} left{note}"
            fill.slots.append(_dropped(cand, reason, need))
            return
        cut = self.truncate(system_prompt, fill.accepted, cand, room, text_room)
        if cut is None:
            reason = f"not even one word fits: {left} tokens left{note}"
            fill.slots.append(_dropped(cand, reason, need))
            if note:
                fill.layer_full[cand.layer] = f"no room left in the layer{note}"
            else:
                fill.exhausted = "no room left after higher-ranked blocks"
            return
        text, words, total_words, new_cost = cut
        fill.slots.append(
            ContextBlock(
                cand.layer,
                cand.source,
                "truncated",
                f"cut at a word boundary: {words} of {total_words} words fit in "
                f"{left} tokens{note}",
                new_cost - fill.cost,
                text,
                cand.score,
            )
        )
        fill.accept(cand, text, new_cost)
        if note:
            fill.layer_full[cand.layer] = (
                f"no room left in the layer after the truncated block{note}"
            )
        else:
            fill.exhausted = "no room left after the truncated block"

    def truncate(
        self,
        system_prompt: str,
        accepted: list[tuple[Candidate, str]],
        cand: Candidate,
        limit: int,
        text_limit: int | None = None,
    ) -> tuple[str, int, int, int] | None:
        """Longest word-boundary prefix of ``cand`` that fits (and whose text, cut mark
        included, has at most ``text_limit`` tokens): (text, words, of, cost)."""
        spans = [m.span() for m in WORD.finditer(cand.text)]
        best: tuple[str, int, int, int] | None = None
        lo, hi = 1, len(spans) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            text = cand.text[: spans[mid - 1][1]] + TRUNCATION_MARK
            trial = self.cost(self.render(system_prompt, [*accepted, (cand, text)]))
            if trial <= limit and (text_limit is None or self.count_batch([text])[0] <= text_limit):
                best = (text, mid, len(spans), trial)
                lo = mid + 1
            else:
                hi = mid - 1
        return best
