"""What opaque payloads cost, per item kind, under the old and the new rule (cost rule 1 and 2,
``docs/cost-model.md``), and how many more turns a budget keeps under the new one.

For a generated history (``history_gen``) whose encrypted payloads are made realistic
(``realistic``: URL-safe base64 of a Fernet-shaped token of the same decoded size — the
generator's own payloads are ``"gAAAAAB"`` glued to base64, which mostly does not decode),
per item kind of the core's classification:

* **as text (rule 1)**: protoprompt's count up to 0.2.0 — the canonical text with the base64
  payload in it, tokenised;
* **decoded size (rule 2)**: protoprompt's count now (``item_tokens(item).total``);
* **Codex**: OpenAI Codex's own estimate of the item (``estimate_reasoning_length`` for
  encrypted items: ``(len * 3/4 - 650) / 4`` bytes per token; the JSON's bytes / 4 for the
  rest), for reference;
* **tiktoken JSON**: the plain tiktoken count of the item's JSON.

Then the turns (user messages) a pack keeps within ``budget`` under each rule: rule 2 by
``protoprompt.pack``, rule 1 by the reference packer with rule-1 item costs.
"""

from __future__ import annotations

import base64
import json
import math
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import protoprompt as pp
from reference_packer import ITEM_OVERHEAD, ReferencePacker, decoded_len

__all__ = [
    "KindCost",
    "TurnsKept",
    "codex_estimate",
    "kind_costs",
    "realistic",
    "rule1_cost",
    "turns_kept",
]

_OPAQUE = ("reasoning", "compaction")


def _claude_thinking(item: Mapping[str, Any]) -> bool:
    """Claude's thinking through LiteLLM: its signatures are counted as text under every rule."""
    provider_data = item.get("provider_data")
    return isinstance(provider_data, dict) and isinstance(
        provider_data.get("thinking_blocks"), list
    )


def _fernet(decoded: int, rng: random.Random) -> str:
    raw = b"\x80\x00\x00\x00\x00" + rng.randbytes(max(decoded - 5, 0))
    return base64.urlsafe_b64encode(raw).decode("ascii")


def realistic(items: Iterable[Mapping[str, Any]], seed: int = 0) -> list[dict[str, Any]]:
    """``items`` with every encrypted payload that does not decode replaced by a valid,
    Fernet-shaped one of the size it stands for (its length x 3/4 decoded bytes)."""
    rng = random.Random(seed)
    out = []
    for item in items:
        item = dict(item)
        payload = item.get("encrypted_content")
        if item.get("type") in _OPAQUE and isinstance(payload, str) and not _claude_thinking(item):
            if decoded_len(payload) is None:
                item["encrypted_content"] = _fernet(len(payload) * 3 // 4, rng)
        out.append(item)
    return out


def _rule1_text(item: Mapping[str, Any]) -> str:
    """The canonical text rule 1 counted: the payload inside (the text is rule 2's plus the
    payload at its field, which is where rule 2 leaves the value out)."""
    text = pp.canonical_text(item)
    payload = item.get("encrypted_content")
    if (
        item.get("type") in _OPAQUE
        and isinstance(payload, str)
        and decoded_len(payload) is not None
        and not _claude_thinking(item)
    ):
        marker = "encrypted_content: \n"
        assert marker in text
        text = text.replace(marker, f"encrypted_content: {payload}\n", 1)
    return text


def rule1_cost(item: Mapping[str, Any], encoding: str = "o200k_base") -> int:
    """An item's cost under cost rule 1 (base64 payloads counted as text)."""
    cost = pp.item_tokens(item, encoding=encoding)
    return ITEM_OVERHEAD + pp.count_tokens(_rule1_text(item), encoding=encoding) + cost.media


def codex_estimate(item: Mapping[str, Any]) -> int:
    """OpenAI Codex's estimate of an item (``estimate_item_token_count``): encrypted items by
    ``estimate_reasoning_length``, everything else by its JSON bytes, at 4 bytes per token."""
    payload = item.get("encrypted_content")
    if item.get("type") in _OPAQUE and isinstance(payload, str):
        size = max(len(payload) * 3 // 4 - 650, 0)
    else:
        size = len(json.dumps(item, ensure_ascii=False).encode())
    return math.ceil(size / 4)


@dataclass(frozen=True)
class KindCost:
    """The tokens of every item of one kind, by each rule."""

    kind: str
    items: int
    rule1: int
    rule2: int
    codex: int
    json: int

    @property
    def shrink(self) -> float:
        """rule 1 / rule 2."""
        return self.rule1 / self.rule2 if self.rule2 else 1.0


def kind_costs(items: list[dict[str, Any]], encoding: str = "o200k_base") -> list[KindCost]:
    """Per item kind (the core's names), most expensive under rule 1 first, then the total."""
    report = pp.analyze(items, [])
    kind_of: dict[int, str] = {}
    for unit in report.units:
        for p, k in zip(unit.positions, unit.kinds):
            kind_of[p] = k
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for p, item in enumerate(items):
        row = sums[kind_of[p]]
        row[0] += 1
        row[1] += rule1_cost(item, encoding)
        row[2] += pp.item_tokens(item, encoding=encoding).total
        row[3] += codex_estimate(item)
        row[4] += pp.count_tokens(json.dumps(item, ensure_ascii=False), encoding=encoding)
    rows = [KindCost(k, *v) for k, v in sums.items()]
    rows.sort(key=lambda r: -r.rule1)
    total = KindCost(
        "all",
        *(sum(getattr(r, f) for r in rows) for f in ("items", "rule1", "rule2", "codex", "json")),
    )
    return [*rows, total]


class _Rule1Packer(ReferencePacker):
    """The reference packer with rule-1 item costs."""

    def item_cost(self, item: Mapping[str, Any]) -> int:
        return rule1_cost(item, self.encoding_name)


@dataclass(frozen=True)
class TurnsKept:
    budget: int
    turns: int
    """User messages in the history."""
    rule1: int
    """User messages kept under rule 1 (and items kept)."""
    rule1_items: int
    rule2: int
    rule2_items: int


def _user_messages(items: list[dict[str, Any]], kept: Iterable[int]) -> int:
    return sum(1 for p in kept if items[p].get("role") == "user")


def turns_kept(
    items: list[dict[str, Any]], new_input: list[dict[str, Any]], budget: int, reserve: int
) -> TurnsKept:
    """The turns a contiguous pack of ``items`` keeps within ``budget`` under each rule (the
    rule-2 pack is checked against the reference packer with rule-2 costs)."""
    new = pp.pack(items, new_input, budget, output_reserve=reserve)
    ref = ReferencePacker().pack(items, new_input, budget, output_reserve=reserve)
    if ref.kept_history != new.kept_history:
        raise AssertionError("protoprompt and the reference packer disagree under rule 2")
    old = _Rule1Packer().pack(items, new_input, budget, output_reserve=reserve)
    return TurnsKept(
        budget=budget,
        turns=_user_messages(items, range(len(items))),
        rule1=_user_messages(items, old.kept_history),
        rule1_items=len(old.kept_history),
        rule2=_user_messages(items, new.kept_history),
        rule2_items=len(new.kept_history),
    )
