"""The context message's blocks: recall candidates, their rendering, and how they are
accepted, cut or dropped within the room a turn leaves (the assembly)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import pairwise
from typing import Any

from ..errors import TokenBudgetExceededError
from ..memory import MemoryHit
from ..memory._ranking import WORD
from ._plan import ContextBlock

TRUNCATION_MARK = " …"
"""Appended to a block that was cut at a word boundary, so the model can tell."""

SECTION_TAGS = {
    "profile": "user_profile",
    "summary": "summary_of_earlier_turns",
    "facts": "session_facts",
    "rag": "recalled_documents",
    "history": "recalled_turns",
}
CAP_NAMES = {"history": "recall_tokens", "summary": "summary_tokens"}
TEXT_CAPS = frozenset({"summary"})
"""Layers of one block whose limit counts its text (as stored), not the tags and escapes
around it: the summary, stored cut to ``summary_tokens``, is sent whole within it."""
SIZE_SLACK = 8
"""Tokens a recalled passage accepted on its own size (with the pending passages before it:
see :data:`PENDING_SLACK`) may cost more inside the message than alone (merges at its
edges), and the pending passages together may cost less: a passage whose block alone
exceeds the room left is not tried (it could fit only if a block cost less inside the
message than alone, which it does not where its edges are pre-token boundaries)."""
PENDING_SLACK = 1
"""Tokens each pending passage (accepted on its own size) is reckoned to cost more in the
message: the line break that joins it to the next block. A block's count alone is its count
in the message wherever its edges are pre-token boundaries, as they are for the tokenizers
measured; :meth:`Assembler.settle` counts the message to be sure."""
stats = {"first_by_size": 0}
"""Layers' first recalled passages taken on their own size (not counted in the message on
their own) since the process started: what the tests read to see the fast path taken."""
RECALL_SHARE = 0.5
"""The ``history`` layer takes at most this share of the room the layers before it leave
(and at most ``recall_tokens``): recalled turns never crowd out all of the newest ones."""


@dataclass(frozen=True)
class Assembly:
    """The context message chosen by the hook, with its exact cost and block decisions."""

    cost: int
    """Tokens of the context message and the recall message together."""
    message: dict[str, Any] | None
    blocks: list[ContextBlock]
    limit: int
    recall_message: dict[str, Any] | None = None
    """With ``split``: the message of what this turn's question recalled (sent after the
    history), or ``None`` when it recalled nothing."""


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
    volatile: bool = False
    """Found for this turn's question (a recalled passage, a document chunk, a fact found by
    the search): with a split assembly it goes into the recall message, not the context
    message."""


def render_block(cand: Candidate, text: str) -> str:
    """A block as the context message carries it: its text escaped (:func:`data`) inside
    the layer's frame, whose attributes are escaped too (:func:`attr`). Short blocks are
    kept by their values (a turn renders its message at each step of its assembly)."""
    if len(text) <= MAX_KEPT_BLOCK:
        return _rendered(cand.layer, cand.source, cand.header, text)
    return _render(cand.layer, cand.source, cand.header, text)


MAX_KEPT_BLOCK = 2048
"""Characters of a block's text at most for its rendering to be kept (:func:`render_block`)."""


def _render(layer: str, source: str, header: str, text: str) -> str:
    if layer == "facts":
        return f"- {data(text)}"
    if layer == "rag":
        return f'<chunk source="{attr(source)}">\n{data(text)}\n</chunk>'
    if layer == "history":
        return f"<turn {header}>\n{data(text)}\n</turn>"
    return data(text)


_rendered = lru_cache(maxsize=4096)(_render)


UNSPLIT_ENCODINGS = frozenset({"gemma3"})
"""Encodings whose count of a recalled passage's opening is not split
(:func:`open_pieces`): SentencePiece has no pre-tokenizer, so no point of a text is known
to split its count without looking at the vocabulary."""

_AGO = re.compile(r'<turn when="earlier in this session, [0-9]+(?= turns? ago")')


def open_pieces(opening: str, split: bool = True) -> list[str]:
    """A recalled passage's opening (``<turn when="... 12 turns ago" date=... what=...>``
    and the line break) as the pieces its count is the sum of: with ``split``, before the
    space after its number of turns -- the prefix up to that number (one of a few, the
    same for every passage of that age) and the rest (the same for that passage on every
    turn, but for "turn" / "turns"), so both are found in the count memo although the
    number changes on every turn. The count of a text splits exactly there (a digit, then
    a space and a letter: the space starts the next word's pre-token, and no pre-token
    pattern looks across it) for every encoding with a pre-tokenizer (the native
    module's ``is_exact_split``, checked against counting the whole for each encoding)."""
    found = _AGO.match(opening) if split else None
    if found is None:
        return [opening]
    return [opening[: found.end()], opening[found.end() :]]


LINE_SPLIT_ENCODINGS = frozenset({"o200k_base", "o200k_harmony", "cl100k_base", "llama3", "qwen2"})
"""Encodings whose count of a text splits exactly after a line break followed by ``<`` or
an ASCII letter or digit (the native module's ``is_exact_split``: the piece holding the
line break ends there, and the next pre-token looks at nothing before it), so a context
message is counted as the sum of its pieces (:func:`message_pieces`)."""

_TAG_START = re.compile(r"\n(?=<)")


def line_apart(text: str, at: int = 0) -> bool:
    """Whether a recalled passage's text (escaped, starting at ``at`` of ``text``) is a
    piece of the context message of its own (:func:`message_pieces`): when it starts with
    an ASCII letter or digit, the count splits after its opening's line break
    (:data:`LINE_SPLIT_ENCODINGS`); otherwise it is counted with its opening. The one rule
    :func:`message_pieces` splits by and :func:`passage_pieces` counts ahead by."""
    first = text[at : at + 1]
    return first.isascii() and first.isalnum()


def message_pieces(text: str, encoding: str) -> tuple[str, list[str]] | None:
    """A context message's text as the pieces its count is the sum of, under an encoding of
    :data:`LINE_SPLIT_ENCODINGS`: its ends (what comes before its first line starting with
    ``<`` and from its last one on, joined: its frame, the same from turn to turn, to be
    counted as a message of its own) and what lies between, split where a line starts
    with ``<`` (a block's text has none: it is escaped) and after a recalled passage's
    opening line when its text starts with a letter or digit (the opening in the two
    pieces of :func:`open_pieces`), so a turn counts only the pieces no turn counted
    before. ``None``: not such a text (another encoding, or fewer than two lines starting
    with ``<``), to be counted whole."""
    if encoding not in LINE_SPLIT_ENCODINGS:
        return None
    tags = [m.end() for m in _TAG_START.finditer(text)]
    if len(tags) < 2:
        return None
    pieces: list[str] = []
    for a, b in pairwise(tags):
        if not text.startswith("<turn ", a):
            pieces.append(text[a:b])
            continue
        line = text.find("\n", a, b) + 1  # after the opening's line break
        if 0 < line < b and line_apart(text, line):
            pieces.extend(open_pieces(text[a:line]))
            pieces.append(text[line:b])
        else:
            pieces.extend(open_pieces(text[a:b]))
    return text[: tags[0]] + text[tags[-1] :], pieces


def passage_pieces(text: str, label: str, date: str) -> list[str]:
    """The pieces a turn counts for a recalled passage of its own session, whatever the
    passage's age: its opening after the number of turns (:func:`open_pieces`, for an age
    other than 1), its text with the closing tag (:meth:`Assembler.block_sizes`) and, when
    its text starts with an ASCII letter or digit (:func:`line_apart`), its text's line in
    the context message (:func:`message_pieces`). Counted when the passage is indexed, so
    the turn that first recalls it finds them in the count memo (the age's piece:
    :func:`age_piece`)."""
    body = data(text)
    pieces = [f' turns ago"{_what(label, date)}>\n', f"{body}\n</turn>"]
    if line_apart(body):
        pieces.append(f"{body}\n")
    return pieces


def age_piece(ago: int) -> str:
    """The first piece of a recalled passage's opening ``ago`` turns later
    (:func:`open_pieces`): the same for every passage of that age."""
    return f'<turn when="earlier in this session, {ago}'


def passage_rest(text: str) -> str:
    """A recalled passage's block after its opening: its text and the closing tag (the same
    on every turn; counted on its own, see :meth:`Assembler.block_sizes`)."""
    return f"{data(text)}\n</turn>"


def data(text: str) -> str:
    """Text from a tool, a user, a model or a memory writer as data inside the context
    message's tags: ``&`` and ``<`` escaped as in XML, so no text can close a frame, open
    one or forge a tag or header (``</turn>`` reads ``&lt;/turn>``)."""
    return text.replace("&", "&amp;").replace("<", "&lt;")


def when(hit: MemoryHit, session_id: str, turn: int | None) -> str:
    """Where a recalled passage came from, as the attributes of its ``<turn>`` tag."""
    return header_of(hit.metadata, hit.metadata.get("session_id"), session_id, turn)


def header_of(meta: Any, sid: object, session_id: str, turn: int | None) -> str:
    """:func:`when` for a passage of session ``sid`` whose row's metadata is ``meta`` (a
    mapping: its ``label``, ``date`` and ``turn`` are read)."""
    label, date = meta.get("label"), meta.get("date")
    what = _what(label if isinstance(label, str) else "", date if isinstance(date, str) else "")
    if sid != session_id:
        return f'when="earlier, in session {attr(str(sid))}"{what}'
    then = meta.get("turn")
    if turn is None or isinstance(then, bool) or not isinstance(then, int) or then >= turn:
        return f'when="earlier in this session"{what}'
    ago = turn - then
    return f'when="earlier in this session, {ago} turn{"s" if ago != 1 else ""} ago"{what}'


@lru_cache(maxsize=4096)
def _what(label: str, date: str) -> str:
    """The ``date`` and ``what`` attributes of a recalled passage's tag (kept by their
    values: the passages recent turns recalled come back turn after turn)."""
    what = f' what="{attr(label)}"' if label else ""
    return f' date="{attr(date)}"' + what if date else what


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
    sizes: dict[int, int] = field(default_factory=dict)
    """Tokens of each recalled passage's block alone, by the candidate's ``id``."""
    pending: list[tuple[int, Candidate, int]] = field(default_factory=list)
    """Recalled passages accepted on their own size, not yet counted in the message: (slot,
    candidate, size); their estimate is ``size + PENDING_SLACK`` each (see
    ``Assembler.settle``)."""
    recall_room: int | None = None
    """The most the ``history`` layer takes: :data:`RECALL_SHARE` of the room the layers
    before it leave (set when its first passage is tried)."""

    first_pending: bool = False
    """Whether the first pending passage is its layer's first (accepted on its size and
    its section's frame)."""
    estimate: int = 0
    """Tokens the pending passages add (by their own sizes): the sum of their ``size +
    PENDING_SLACK``, kept as they are added."""

    def add_pending(self, slot: int, cand: Candidate, size: int) -> None:
        self.pending.append((slot, cand, size))
        self.estimate += size + PENDING_SLACK

    def take_pending(self) -> list[tuple[int, Candidate, int]]:
        pending, self.pending, self.estimate = self.pending, [], 0
        return pending

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
    split: bool = False
    """Two messages: what stays the same from turn to turn (system prompt, profile, summary,
    the listed facts) in the context message, what this turn's question found
    (:attr:`Candidate.volatile`) in a recall message of its own."""

    def message(self, text: str) -> dict[str, Any]:
        """The context message for ``text``."""
        return {"role": self.role, "content": text}

    def texts(self, system_prompt: str, accepted: Sequence[tuple[Candidate, str]]) -> list[str]:
        """The context text, and with :attr:`split` the recall text after it."""
        if not self.split:
            return [self.render(system_prompt, accepted)]
        stable = [(c, t) for c, t in accepted if not c.volatile]
        found = [(c, t) for c, t in accepted if c.volatile]
        return [self.render(system_prompt, stable), self.render("", found)]

    def measure(self, system_prompt: str, accepted: Sequence[tuple[Candidate, str]]) -> int:
        """Tokens of the message(s) ``accepted`` makes."""
        return sum(self.cost(text) for text in self.texts(system_prompt, accepted))

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
        fill = _Fill(self.measure(system_prompt, []))
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
        recalled = [c for c in pool if c.layer == "history"]
        if len(recalled) > 1:  # their own sizes, to pass over those that cannot fit
            fill.sizes = dict(zip(map(id, recalled), self.block_sizes(recalled), strict=True))
        for cand in pool:
            self._try(system_prompt, fill, cand, limit)
        self.settle(system_prompt, fill, limit)
        if fill.untried:
            counts = self.block_sizes([c for _, c, _ in fill.untried])
            for (slot, cand, why), tokens in zip(fill.untried, counts, strict=True):
                fill.slots[slot] = _dropped(cand, why, tokens)
        blocks.extend(b for b in fill.slots if b is not None)
        texts = self.texts(system_prompt, fill.accepted)
        message = self.message(texts[0]) if texts[0] else None
        recall = self.message(texts[1]) if len(texts) > 1 and texts[1] else None
        final = sum(self.cost(text) for text in texts)
        if final != fill.cost or final > limit:  # pragma: no cover - counting is deterministic
            raise RuntimeError(f"context cost drifted: {final} vs {fill.cost} (limit {limit})")
        return Assembly(final, message, blocks, limit, recall)

    def block_sizes(self, cands: Sequence[Candidate]) -> list[int]:
        """Tokens of each candidate's block alone. A recalled passage's block is counted
        as its frame's opening (``<turn ...>`` and the line break: its header changes from
        turn to turn) plus the rest (its text and the closing tag: the same every turn), so
        both counts are found in the count memo turn after turn; the sum is the block's
        count wherever the opening ends a pre-token (o200k_base: unless the text starts
        with a line break or ``/``), and :meth:`settle` counts the message whole anyway.
        The opening itself is counted in the two pieces :func:`open_pieces` makes (their
        sum is its count), both found in the memo turn after turn although "N turns ago"
        changes on every turn."""
        split = self.encoding not in UNSPLIT_ENCODINGS
        pieces: list[str] = []
        ends: list[int] = []  # where each candidate's pieces end in ``pieces``
        for c in cands:
            if c.layer == "history":
                pieces.extend(open_pieces(f"<turn {c.header}>\n", split))
                pieces.append(passage_rest(c.text))
            else:
                pieces.append(render_block(c, c.text))
            ends.append(len(pieces))
        counts = self.count_batch(pieces)
        sizes, start = [], 0
        for end in ends:
            sizes.append(sum(counts[start:end]))
            start = end
        return sizes

    def frame_size(self, system_prompt: str, fill: _Fill, cand: Candidate) -> int:
        """Tokens at most that the section of ``cand``'s layer adds around its blocks: its
        opening and closing tags and the blank line before it, counted alone (the same
        texts every turn, so found in the count memo), and the message's own cost when the
        message it goes into has no text yet."""
        tag = SECTION_TAGS[cand.layer]
        frame = sum(self.count_batch([f"\n\n<{tag}>\n", f"\n</{tag}>"]))
        texts = self.texts(system_prompt, fill.accepted)
        if not texts[1 if self.split and cand.volatile else 0]:
            frame += self.cost(".") - self.count_batch(["."])[0]
        return frame

    def _room(self, fill: _Fill, cand: Candidate, limit: int) -> tuple[int, str]:
        """The message's cost ``cand`` must fit within, and the note naming the layer's own
        limit when that is what bounds it. A layer with a limit of its own fits within it
        and within the message's."""
        layer_cap = self.caps.get(cand.layer)
        if layer_cap is None or cand.layer in TEXT_CAPS:
            return limit, ""
        name = CAP_NAMES[cand.layer]
        share = fill.recall_room if cand.layer == "history" else None
        if share is not None and share < layer_cap:
            layer_cap, name = share, f"{RECALL_SHARE:.0%} of the room"
        if fill.cost + layer_cap - fill.used.get(cand.layer, 0) < limit:
            return fill.cost + layer_cap - fill.used.get(cand.layer, 0), f" ({name} {layer_cap})"
        return limit, ""

    def _text_room(self, cand: Candidate) -> int | None:
        """For a layer whose limit counts its text (:data:`TEXT_CAPS`): that limit when the
        text is over it (its frame and escapes come on top), else ``None``."""
        layer_cap = self.caps.get(cand.layer)
        if layer_cap is None or cand.layer not in TEXT_CAPS:
            return None
        return layer_cap if self.count_batch([cand.text])[0] > layer_cap else None

    def settle(self, system_prompt: str, fill: _Fill, limit: int) -> None:
        """Count the message with the pending passages (accepted on their own sizes): they
        stay when it fits, as it does unless a count is not additive; otherwise each is
        tried again, counted one by one."""
        if not fill.pending:
            return
        pending = fill.take_pending()
        del fill.accepted[len(fill.accepted) - len(pending) :]
        room, _ = self._room(fill, pending[0][1], limit)
        trial = self.measure(system_prompt, [*fill.accepted, *((c, c.text) for _, c, _ in pending)])
        if trial <= room:
            first = fill.slots[pending[0][0]]
            if fill.first_pending and first is not None:
                # The layer's first passage carries what the section adds (as when it is
                # counted in the message): the pending passages' blocks add up to the count.
                others = sum(size for _, _, size in pending[1:])
                fill.slots[pending[0][0]] = replace(first, tokens=trial - fill.cost - others)
            fill.first_pending = False
            used = fill.used.get("history", 0)
            fill.accepted.extend((c, c.text) for _, c, _ in pending)
            fill.used["history"] = used + trial - fill.cost
            fill.cost = trial
            return
        fill.first_pending = False
        for slot, cand, _ in pending:  # pragma: no cover - token counts are near additive
            room, note = self._room(fill, cand, limit)
            fill.slots[slot] = self._whole(system_prompt, fill, cand, room, note)

    def _whole(
        self, system_prompt: str, fill: _Fill, cand: Candidate, room: int, note: str
    ) -> ContextBlock:
        """``cand`` counted in the message: kept whole when it fits, else dropped."""
        trial = self.measure(system_prompt, [*fill.accepted, (cand, cand.text)])
        need = trial - fill.cost
        if trial <= room:
            fill.accept(cand, cand.text, trial)
            return ContextBlock(
                cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score
            )
        reason = f"does not fit whole: needs {need}, {room - fill.cost} left{note}"
        return _dropped(cand, reason, need)

    @staticmethod
    def _pend(fill: _Fill, cand: Candidate, size: int, frame: int) -> None:
        """Accept a recalled passage on its own size (``frame``: what its section adds,
        when it is the layer's first), pending until :meth:`settle` counts the message."""
        if frame:
            fill.first_pending = True
            stats["first_by_size"] += 1
        fill.add_pending(len(fill.slots), cand, size + frame)
        fill.accepted.append((cand, cand.text))
        fill.slots.append(
            ContextBlock(cand.layer, cand.source, "kept", "fits", size, cand.text, cand.score)
        )

    def _later(
        self,
        system_prompt: str,
        fill: _Fill,
        cand: Candidate,
        size: int,
        limit: int,
        room: int,
        note: str,
    ) -> None:
        """A later recalled passage that does not surely fit on its own size: passed over
        while its block alone is larger than the room left (the pending passages reckoned
        at their sizes less :data:`SIZE_SLACK`: never passed over when the message would
        count less than its parts), else counted in the message with the pending passages
        -- one count: when it fits, they are settled with it. ``room`` and ``note``: what
        :meth:`_room` gives for it now."""
        if fill.pending:
            # Their sizes, from the estimate kept as they were added (see _Fill.estimate).
            sizes = fill.estimate - PENDING_SLACK * len(fill.pending)
            if size > room - fill.cost - sizes + SIZE_SLACK:
                reason = f"does not fit whole: needs {size}, {room - fill.cost - sizes} left{note}"
                fill.slots.append(_dropped(cand, reason, size))
                return
            trial = self.measure(system_prompt, [*fill.accepted, (cand, cand.text)])
            if trial <= room:
                pending = fill.take_pending()
                fill.first_pending = False
                need = trial - fill.cost - sum(n for _, _, n in pending)
                first = fill.slots[pending[0][0]]
                if first is not None and first.tokens != pending[0][2]:  # the layer's first
                    fill.slots[pending[0][0]] = replace(first, tokens=pending[0][2])
                fill.slots.append(
                    ContextBlock(
                        cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score
                    )
                )
                fill.accept(cand, cand.text, trial)
                return
            self.settle(system_prompt, fill, limit)
            room, note = self._room(fill, cand, limit)
        if size > room - fill.cost:
            reason = f"does not fit whole: needs {size}, {room - fill.cost} left{note}"
            fill.slots.append(_dropped(cand, reason, size))
            return
        trial = self.measure(system_prompt, [*fill.accepted, (cand, cand.text)])
        need = trial - fill.cost
        if trial <= room:
            fill.slots.append(
                ContextBlock(cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score)
            )
            fill.accept(cand, cand.text, trial)
            return
        reason = f"does not fit whole: needs {need}, {room - fill.cost} left{note}"
        fill.slots.append(_dropped(cand, reason, need))

    def _try(self, system_prompt: str, fill: _Fill, cand: Candidate, limit: int) -> None:
        """Accept ``cand`` whole, cut, or drop it (one slot of the fill)."""
        size = fill.sizes.get(id(cand))
        # Not the layer's first: recalled passages already counted, or pending.
        later = size is not None and bool(fill.used.get(cand.layer) or fill.pending)
        if not later:
            self.settle(system_prompt, fill, limit)
        full = fill.exhausted or fill.layer_full.get(cand.layer)
        if cand.layer == "history" and fill.recall_room is None:
            fill.recall_room = max(int((limit - fill.cost) * RECALL_SHARE), 1)
        if full is not None:
            fill.untried.append((len(fill.slots), cand, full))
            fill.slots.append(None)
            return
        room, note = self._room(fill, cand, limit)
        if size is not None:
            # A recalled passage: taken on its own size (the layer's first with its
            # section's frame) while that surely fits, so the message is counted once, when
            # the pending passages are settled. Otherwise the layer's first is counted in
            # the message (and cut if need be); a later one is passed over while its block
            # alone is larger than the room left, and counted otherwise.
            frame = 0 if later else self.frame_size(system_prompt, fill, cand)
            if size + frame + SIZE_SLACK <= room - fill.cost - fill.estimate:
                self._pend(fill, cand, size, frame)
                return
        if later and size is not None:
            self._later(system_prompt, fill, cand, size, limit, room, note)
            return
        text_room = self._text_room(cand)
        if text_room is not None:
            note = f" ({CAP_NAMES[cand.layer]} {text_room} of text)"
        trial = self.measure(system_prompt, [*fill.accepted, (cand, cand.text)])
        need = trial - fill.cost
        if trial <= room and text_room is None:
            fill.slots.append(
                ContextBlock(cand.layer, cand.source, "kept", "fits", need, cand.text, cand.score)
            )
            fill.accept(cand, cand.text, trial)
            return
        left = room - fill.cost if text_room is None else min(room - fill.cost, text_room)
        if not cand.truncatable or later:
            # A recalled passage is kept whole, or (the layer's first) cut: a later, smaller
            # one may fit where this one does not.
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
            trial = self.measure(system_prompt, [*accepted, (cand, text)])
            if trial <= limit and (text_limit is None or self.count_batch([text])[0] <= text_limit):
                best = (text, mid, len(spans), trial)
                lo = mid + 1
            else:
                hi = mid - 1
        return best
