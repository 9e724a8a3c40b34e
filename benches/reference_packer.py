"""A straightforward pure-Python packer: the yardstick for protoprompt's Rust core.

Same job as ``protoprompt.pack``, written the obvious way:

1. classify each item and group ``history ++ new_input`` into atomic units with a union-find
   (call/output pairs by ``call_id``, MCP approval request/response/``mcp_call``, programs
   with their ``caller`` children, anonymous server tool search matched right to left,
   reasoning with the model items that follow it, items sharing an SDK de-duplication key);
2. cost every item as ``4 + len(tiktoken.encode_ordinary(canonical_text(item)))`` with the
   real ``tiktoken`` (``benches/reference_tokenizer.py``) on protoprompt's canonical text,
   plus the decoded-size cost of its opaque payload (the base64 ``encrypted_content`` of
   reasoning and compaction items, decoded here with the standard library);
3. reserve ``new_input``, the history units it depends on and those holding a ``pinned``
   position, ``output_reserve`` and ``context_tokens`` (all or nothing), then add valid
   history units newest first and stop at the first one that does not fit, dropping what
   was taken of that unit's turn unless the turn's user message is mandatory (the kept
   history starts at a user message);
   ``policy="greedy"`` then drops the rest of that turn and takes older turns whole or not
   at all;
4. with ``masking`` (``protoprompt.Masking``), the same masking rule as the core, written
   again from its description (``docs/masking.md``): the masked copy of every tool output
   (a token-exact excerpt around a marker, computed here with the real ``tiktoken``), the
   switch from whole to masked units, the masking of the taken units of the turn that did
   not fit whole, ``after_turns``, and a turn whose user message is mandatory (``pinned``,
   as the per-call model filter pins a run's input) masked before any of its units is
   dropped: the most of its units that fit masked, the newest of them whole as far as the
   room allows.

It implements only the rules that the generated histories exercise plus the common invalid
cases (call without output, output without/before its call, unmatched anonymous search,
dangling reasoning, orphan program, controls and foreign shapes); it is not a second source of
truth for the item rules (that is the Rust core, docs/item-graph.md). Media parts (images,
files, audio) are not tokenised here; their cost is borrowed from ``protoprompt.item_tokens``.

``ReferencePacker`` keeps a memo ``canonical text -> token count`` across calls (what a
reasonable Python implementation would do for the next turn); ``warm=False`` disables it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Iterable, Mapping

from protoprompt import _core

import reference_tokenizer

__all__ = [
    "ITEM_OVERHEAD",
    "ReferencePacker",
    "ReferenceResult",
    "BudgetExceeded",
    "InvalidNewInput",
    "units_of",
    "reference_pack",
]

ITEM_OVERHEAD = 4

CALL_TO_OUTPUT = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
    "mcp_approval_request": "mcp_approval_response",
}
OUTPUT_TO_CALL = {v: k for k, v in CALL_TO_OUTPUT.items()}
SDK_MAPPED = set(CALL_TO_OUTPUT) - {"mcp_approval_request"}
SDK_MAPPED_OUT = {CALL_TO_OUTPUT[c] for c in SDK_MAPPED}
HOSTED = {
    "web_search_call",
    "file_search_call",
    "code_interpreter_call",
    "image_generation_call",
    "mcp_call",
    "mcp_list_tools",
}
STANDALONE = {"compaction", "additional_tools", "configuration_update"}
CONTROLS = {"compaction_trigger", "item_reference"}
STREAMED = {"shell_call", "tool_search_call"}
MODEL_STATUSES = {"in_progress", "completed", "incomplete"}
MEDIA_TYPES = (
    '"input_image"',
    '"input_file"',
    '"input_audio"',
    '"computer_screenshot"',
    '"image_url"',
)


class BudgetExceeded(Exception):
    def __init__(self, used: int, budget: int, section: str) -> None:
        super().__init__(f"mandatory input needs {used} tokens, over {budget} ({section})")
        self.used, self.budget, self.section = used, budget, section


class InvalidNewInput(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Classification


def _message_kind(item: Mapping[str, Any], t: Any, role: Any) -> str:
    """kind_of for an item of type "message" or without a type."""
    if t is None and role is None:
        return "control" if "id" in item else "foreign"
    if role == "user":
        return "user"
    if role in ("system", "developer"):
        return "message"
    if role == "assistant":
        if "tool_calls" in item:
            return "foreign"
        ident = item.get("id")
        if (
            t == "message"
            and isinstance(ident, str)
            and ident
            and ident != "__fake_id__"
            and item.get("status") in MODEL_STATUSES
        ):
            return "assistant_out"
        return "message"
    return "foreign"


def kind_of(item: Mapping[str, Any]) -> str:
    """One of: user, message, assistant_out, reasoning, call, output, anon_call, anon_out,
    hosted, standalone, control, foreign."""
    t = item.get("type")
    role = item.get("role")
    if t is None or t == "message":
        return _message_kind(item, t, role)
    if t in ("tool_search_call", "tool_search_output") and not isinstance(item.get("call_id"), str):
        if item.get("execution") == "client":
            return "foreign"
        return "anon_call" if t == "tool_search_call" else "anon_out"
    if t in CALL_TO_OUTPUT:
        return "call"
    if t in OUTPUT_TO_CALL:
        return "output"
    if t == "reasoning":
        return "reasoning"
    if t in HOSTED:
        return "hosted"
    if t in STANDALONE:
        return "standalone"
    if t in CONTROLS:
        return "control"
    return "foreign"


def identity(item: Mapping[str, Any], kind: str) -> str | None:
    t = item.get("type")
    if kind == "call":
        v = item.get("id") if t == "mcp_approval_request" else item.get("call_id")
    elif kind == "output":
        if t == "mcp_approval_response":
            v = item.get("approval_request_id")
        elif t == "local_shell_call_output":
            v = item.get("call_id", item.get("id"))
        else:
            v = item.get("call_id")
    else:
        return None
    return v if isinstance(v, str) and v else None


def program_caller(item: Mapping[str, Any]) -> str | None:
    c = item.get("caller")
    if isinstance(c, Mapping) and c.get("type") == "program":
        cid = c.get("caller_id")
        return cid if isinstance(cid, str) else ""
    return None


def dedup_key(item: Mapping[str, Any]) -> tuple[Any, str] | None:
    """The SDK's de-duplication key (docs/item-graph.md §9.5)."""
    t = item.get("type")
    if "role" in item or t == "message":
        return None
    call_id = item.get("call_id")
    if (t in SDK_MAPPED or t in SDK_MAPPED_OUT) and isinstance(call_id, str):
        return (t, call_id)
    ident = item.get("id")
    if isinstance(ident, str) and ident != "__fake_id__":
        return (t, ident)
    if isinstance(call_id, str):
        return (t, call_id)
    ar = item.get("approval_request_id")
    if isinstance(ar, str):
        return (t, ar)
    return None


def _stream_step(state: str, status: Any) -> str:
    """docs/item-graph.md §3: status-less / ``in_progress`` chunks, then one terminal status."""
    if state == "open":
        if status is None or status == "in_progress":
            return "open"
        if status in ("completed", "incomplete"):
            return "closed"
        return "bad"
    if state == "reported":
        return "reported"
    return "bad"


# --------------------------------------------------------------------------------------------
# Units


@dataclass
class RefUnit:
    members: list[int]
    problems: list[str] = field(default_factory=list)
    contains_new: bool = False
    input_only: bool = False

    @property
    def valid(self) -> bool:
        return not self.problems


class _Grouping:
    """The union-find over ``history ++ new_input`` that :func:`units_of` builds, one method
    per rule of docs/item-graph.md, each adding its unions and problems."""

    def __init__(self, history: list[Mapping[str, Any]], new_input: list[Mapping[str, Any]]):
        self.items = list(history) + list(new_input)
        self.nh = len(history)
        self.n = len(self.items)
        self.parent = list(range(self.n))
        self.kinds = [kind_of(it) for it in self.items]
        self.problems: list[tuple[int, str]] = []
        # calls by (type, identity): the first one's position
        self.calls: dict[tuple[str, str], int] = {}
        self.answered: set[tuple[str, str]] = set()
        self.program_done: dict[str, int] = {}

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def misplaced(self) -> None:
        for p, k in enumerate(self.kinds):
            if k == "foreign":
                self.problems.append((p, "foreign item"))
            elif k == "control" and p < self.nh:
                self.problems.append((p, "input-only control in history"))

    def pair_calls(self) -> None:
        """Pairing: calls by (type, identity); outputs join the first call."""
        items, problems, calls = self.items, self.problems, self.calls
        for p, k in enumerate(self.kinds):
            if k != "call":
                continue
            ident = identity(items[p], k)
            if ident is None:
                problems.append((p, "call without identity"))
                continue
            key = (items[p]["type"], ident)
            if key in calls:
                self.union(calls[key], p)
            else:
                calls[key] = p

    def pair_outputs(self) -> None:
        items, problems = self.items, self.problems
        streams: dict[tuple[str, str], str] = {}
        for p, k in enumerate(self.kinds):
            if k != "output":
                continue
            ident = identity(items[p], k)
            if ident is None:
                problems.append((p, "output without identity"))
                continue
            key = (OUTPUT_TO_CALL[items[p]["type"]], ident)
            first = self.calls.get(key)
            if first is None:
                problems.append((p, "output without its call"))
                continue
            self.union(first, p)
            self.answered.add(key)
            if key[0] in STREAMED:
                state = _stream_step(streams.get(key, "open"), items[p].get("status"))
                if state == "bad":
                    problems.append((p, "invalid streamed output sequence"))
                    state = "reported"
                streams[key] = state
            if p < first:
                problems.append((p, "output before its call"))
            if key[0] == "program" and items[p].get("status") == "completed":
                self.program_done.setdefault(ident, p)

    def unanswered(self) -> None:
        items = self.items
        for key, p in self.calls.items():
            if key in self.answered:
                continue
            t = key[0]
            owned = program_caller(items[p]) is not None
            exempt = (
                t == "program"
                or (
                    t == "shell_call"
                    and (owned or p >= self.nh)
                    and items[p].get("status") in (None, "in_progress")
                )
                or (t == "mcp_approval_request" and owned)
            )
            if not exempt:
                self.problems.append((p, "call without output"))

    def programs(self) -> None:
        """Programs: children (by caller) join the program; orphan programs are invalid."""
        items, problems, nh, n = self.items, self.problems, self.nh, self.n
        named_by_new = {program_caller(items[p]) for p in range(nh, n)} - {None}
        for p in range(n):
            pid = program_caller(items[p])
            if pid is None or self.kinds[p] == "foreign":
                continue
            root = self.calls.get(("program", pid))
            if root is None:
                problems.append((p, "program child without its program"))
                continue
            self.union(root, p)
            if p < root:
                problems.append((p, "program child before its program"))
            done = self.program_done.get(pid)
            if done is not None and p > done and items[p].get("type") != "program_output":
                problems.append((p, "program child after completed program_output"))
        for (t, ident), p in self.calls.items():
            if (
                t == "program"
                and p < nh
                and ("program", ident) not in self.answered
                and ident not in named_by_new
            ):
                problems.append((p, "orphan program"))

    def anonymous_search_pairs(self) -> list[tuple[int, int]]:
        """Anonymous tool search: right to left, each call takes the nearest output to its
        right; leftover outputs are more chunks of the nearest call to their left."""
        kinds, problems = self.kinds, self.problems
        stack: list[int] = []
        anon_calls: list[int] = []
        pairs: list[tuple[int, int]] = []
        for p in range(self.n - 1, -1, -1):
            if kinds[p] == "anon_out":
                stack.append(p)
            elif kinds[p] == "anon_call":
                anon_calls.append(p)
                if stack:
                    pairs.append((p, stack.pop()))
                else:
                    problems.append((p, "anonymous call without output"))
        anon_calls.reverse()
        for o in stack:
            left = [c for c in anon_calls if c < o]
            if left:
                pairs.append((left[-1], o))
            else:
                problems.append((o, "anonymous output without call"))
        pairs.sort()
        return pairs

    def anonymous_search(self) -> None:
        sweep: tuple[int, int] | None = None  # (representative call, max end of merged spans)
        for c, group in groupby(self.anonymous_search_pairs(), key=lambda pair: pair[0]):
            end = c
            state = "open"
            for _, o in group:
                self.union(c, o)
                end = max(end, o)
                state = _stream_step(state, self.items[o].get("status"))
                if state == "bad":
                    self.problems.append((o, "invalid streamed output sequence"))
                    state = "reported"
            if sweep is not None and c < sweep[1]:  # overlapping spans merge
                self.union(sweep[0], c)
                sweep = (sweep[0], max(sweep[1], end))
            else:
                sweep = (c, end)

    def mcp(self) -> None:
        """MCP: mcp_call joins the approval request it names."""
        for p in range(self.n):
            if self.items[p].get("type") == "mcp_call":
                ar = self.items[p].get("approval_request_id")
                if isinstance(ar, str) and ar and ("mcp_approval_request", ar) in self.calls:
                    self.union(self.calls[("mcp_approval_request", ar)], p)

    def continues(self, p: int) -> bool:
        """Whether item ``p`` belongs to a run of reasoning / model- / server-emitted items."""
        k = self.kinds[p]
        if k in _MODEL_EMITTED or k == "reasoning" or k == "anon_out":
            return True
        t = self.items[p].get("type")
        server_search = t == "tool_search_output" and self.items[p].get("execution") != "client"
        return k == "output" and (t == "program_output" or server_search)

    def reasoning_blocks(self) -> None:
        """Reasoning blocks: a run of reasoning / model-emitted / server-emitted items; the
        first reasoning of the run and everything after it in the run form one unit."""
        kinds, n = self.kinds, self.n
        p = 0
        while p < n:
            if not self.continues(p):
                p += 1
                continue
            start = end = p
            while end + 1 < n and self.continues(end + 1):
                end += 1
            r0 = next((i for i in range(start, end + 1) if kinds[i] == "reasoning"), None)
            if r0 is not None:
                last_model = max(
                    (i for i in range(start, end + 1) if kinds[i] in _MODEL_EMITTED), default=-1
                )
                for i in range(r0 + 1, end + 1):
                    self.union(r0, i)
                for i in range(r0, end + 1):
                    if kinds[i] == "reasoning" and last_model < i:
                        self.problems.append((i, "dangling reasoning"))
            p = end + 1

    def reasoning_ids(self) -> None:
        seen_rs: set[str] = set()
        for p in range(self.n):
            if self.kinds[p] != "reasoning":
                continue
            rid = self.items[p].get("id")  # id-less reasoning is valid (V9, §12.3)
            # The SDK's de-duplication ignores the placeholder id Chat Completions models give
            # every item: such reasoning items never collapse (as the core's graph).
            if isinstance(rid, str) and rid and rid != "__fake_id__":
                if rid in seen_rs:
                    self.problems.append((p, "duplicate reasoning id"))
                seen_rs.add(rid)

    def dedup_keys(self) -> None:
        """Items sharing an SDK de-duplication key."""
        keys: dict[tuple[Any, str], int] = {}
        for p in range(self.n):
            k = dedup_key(self.items[p])
            if k is not None:
                if k in keys:
                    self.union(keys[k], p)
                else:
                    keys[k] = p

    def units(self) -> list[RefUnit]:
        by_root: dict[int, RefUnit] = {}
        units: list[RefUnit] = []
        unit_at: list[RefUnit] = []
        for p in range(self.n):
            r = self.find(p)
            u = by_root.get(r)
            if u is None:
                u = by_root[r] = RefUnit(members=[], input_only=True)
                units.append(u)
            u.members.append(p)
            u.contains_new |= p >= self.nh
            u.input_only &= self.kinds[p] == "control"
            unit_at.append(u)
        for p, why in self.problems:
            if why not in unit_at[p].problems:
                unit_at[p].problems.append(why)
        return units


_MODEL_EMITTED = {"assistant_out", "call", "anon_call", "hosted"}


def units_of(history: list[Mapping[str, Any]], new_input: list[Mapping[str, Any]]) -> list[RefUnit]:
    """Atomic units of ``history ++ new_input``, ordered by their first member."""
    g = _Grouping(history, new_input)
    g.misplaced()
    g.pair_calls()
    g.pair_outputs()
    g.unanswered()
    g.programs()
    g.anonymous_search()
    g.mcp()
    g.reasoning_blocks()
    g.reasoning_ids()
    g.dedup_keys()
    return g.units()


# --------------------------------------------------------------------------------------------
# Packing


@dataclass
class ReferenceResult:
    kept_history: list[int]
    dependency: list[int]
    new_input_tokens: int
    dependency_tokens: int
    history_tokens: int
    context_tokens: int
    output_reserve: int
    budget: int
    units: list[RefUnit]
    counted_items: int
    items: list[Any] = field(default_factory=list)
    """The request: kept history (masked copies where masked), then new input."""
    masked: list[int] = field(default_factory=list)
    masking_saved: int = 0

    @property
    def used(self) -> int:
        return (
            self.new_input_tokens
            + self.dependency_tokens
            + self.history_tokens
            + self.context_tokens
            + self.output_reserve
        )

    @property
    def remaining(self) -> int:
        return max(0, self.budget - self.used)


# --------------------------------------------------------------------------------------------
# Masking (docs/masking.md): the masked copy of a tool output

PLACEHOLDER_SCREENSHOT = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAAAAAA6fptVAAAACklEQVR4nGNoAAAAggCBd8"
    "1ytgAAAABJRU5ErkJggg=="
)
_PROSE = {"description", "title", "$comment", "examples"}
_SCHEMA_VALUE = {
    "additionalItems",
    "additionalProperties",
    "contains",
    "contentSchema",
    "else",
    "if",
    "items",
    "not",
    "propertyNames",
    "then",
    "unevaluatedItems",
    "unevaluatedProperties",
}
_SCHEMA_LIST = {"allOf", "anyOf", "oneOf", "prefixItems"}
_SCHEMA_MAP = {
    "$defs",
    "definitions",
    "dependentSchemas",
    "patternProperties",
    "properties",
    "dependencies",
}


def _continuation(b: bytes, i: int) -> bool:
    return i < len(b) and (b[i] & 0xC0) == 0x80


class Excerpts:
    """Token-exact excerpts with the real tokenizer (the rule of ``truncate::excerpt``)."""

    def __init__(self, encoding: Any, name: str) -> None:
        self.enc = encoding
        self.name = name

    def count(self, text: str) -> int:
        return len(self.enc.encode_ordinary(text))

    def head(self, text: str, n: int) -> bytes:
        if n == 0:
            return b""
        tokens = self.enc.encode_ordinary(text)
        b = text.encode()
        end = min(len(self.enc.decode_bytes(tokens[:n])), len(b))
        while _continuation(b, end):
            end -= 1
        return b[:end]

    def tail(self, text: str, n: int) -> bytes:
        if n == 0:
            return b""
        tokens = self.enc.encode_ordinary(text)
        b = text.encode()
        take = min(n, len(tokens))
        start = len(b) - min(len(self.enc.decode_bytes(tokens[len(tokens) - take :])), len(b))
        while _continuation(b, start):
            start += 1
        return b[start:]

    def fixed_point(self, head: str, tail: str, short: bool, upper: int, marker: Any, removed: Any):
        """``head + marker(n) + tail`` with ``n = removed(candidate)``, from ``n = upper``
        (at most 5 rounds)."""

        def build(n: int) -> str:
            return head + marker(n, short) + tail

        n = upper
        for _ in range(5):
            nxt = removed(build(n))
            if nxt == n:
                break
            n = nxt
        return build(n), n

    def excerpt(
        self, text: str, limit: int, force: bool, upper: int, marker: Any, removed: Any
    ) -> str | None:
        total = self.count(text)
        short = total <= limit
        if short and not force:
            return None
        marker_tokens = self.count(marker(upper, False))
        keep = total if short else max(0, limit - marker_tokens)
        b = text.encode()
        while keep >= 0:
            if short and keep >= total:
                head, tail = b, b""
            else:
                t = keep // 4
                head, tail = self.head(text, keep - t), self.tail(text, t)
                if len(head) + len(tail) > len(b):
                    tail = b[len(head) :]
            candidate, _ = self.fixed_point(
                head.decode(), tail.decode(), False, upper, marker, removed
            )
            n = self.count(candidate)
            if n <= limit:
                return candidate
            keep -= n - limit
        for short_form in (False, True):
            alone, _ = self.fixed_point("", "", short_form, upper, marker, removed)
            if self.count(alone) <= limit:
                return alone
        return None


def mask_marker(tool: str, call_id: str, parts: int) -> Any:
    def marker(removed: int, short: bool) -> str:
        if short:
            return f"[… {removed} tokens masked …]"
        media = {0: "", 1: ", 1 image or file"}.get(parts, f", {parts} images or files")
        return (
            f"\n[… {removed} tokens{media} of this {tool} output (call {call_id}) masked by "
            "protoprompt …]\n"
        )

    return marker


def _strip_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    def sub(v: Any) -> Any:
        return _strip_schema(v) if isinstance(v, Mapping) else v

    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _PROSE:
            continue
        if isinstance(value, Mapping) and key in _SCHEMA_VALUE:
            out[key] = _strip_schema(value)
        elif isinstance(value, list) and (key == "items" or key in _SCHEMA_LIST):
            out[key] = [sub(v) for v in value]
        elif isinstance(value, Mapping) and key in _SCHEMA_MAP:
            out[key] = {name: sub(v) for name, v in value.items()}
        else:
            out[key] = value
    return out


def _strip_tool(tool: Any) -> Any:
    if not isinstance(tool, Mapping):
        return tool
    out = dict(tool)
    if isinstance(tool.get("description"), str):
        out["description"] = ""
    if tool.get("type") == "function" and isinstance(tool.get("parameters"), Mapping):
        out["parameters"] = _strip_schema(tool["parameters"])
    elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
        out["tools"] = [_strip_tool(t) for t in tool["tools"]]
    return out


def masked_copies(
    items: list[Mapping[str, Any]], whole: list[int], packer: Any, limit: int
) -> list[Any]:
    """The masked copy of each of a unit's items (``None``: sent as it is), before the
    cheaper-than-whole check. ``whole``: the items' costs (markers state the tokens saved)."""
    names: dict[str, str] = {}
    for it in items:
        if it.get("type") in ("function_call", "custom_tool_call"):
            cid, name = it.get("call_id"), it.get("name")
            if isinstance(cid, str) and isinstance(name, str):
                names.setdefault(cid, name)
    return [_mask_item(it, w, names, packer, limit) for it, w in zip(items, whole)]


_TOOL_BY_TYPE = {
    "local_shell_call_output": "local_shell",
    "apply_patch_call_output": "apply_patch",
    "shell_call_output": "shell",
    "computer_call_output": "computer",
}


def _mask_item(item: Mapping[str, Any], whole: int, names: dict, packer: Any, limit: int) -> Any:
    t = item.get("type")
    if t == "tool_search_output":
        tools = item.get("tools")
        if isinstance(tools, list):
            stripped = [_strip_tool(x) for x in tools]
            if stripped != tools:
                return dict(item, tools=stripped)
        return None
    cid = item.get("call_id") if isinstance(item.get("call_id"), str) else item.get("id")
    cid = cid if isinstance(cid, str) else "?"
    own = item.get("name") if isinstance(item.get("name"), str) else None
    if t in ("function_call_output", "custom_tool_call_output"):
        default = "function" if t == "function_call_output" else "custom tool"
        tool = names.get(cid, own or default)
    elif t == "mcp_call":
        tool = own or "mcp"
    elif t in _TOOL_BY_TYPE:
        tool = _TOOL_BY_TYPE[t]
    else:
        return None
    template = {k: v for k, v in item.items() if k != "output"}
    output = item.get("output")
    ex = packer.excerpts

    def cut(text: str, parts: int, place: Any) -> Any:
        def removed(candidate: str) -> int:
            return max(0, whole - packer.item_cost(dict(template, output=place(candidate))))

        marker = mask_marker(tool, cid, parts)
        masked = ex.excerpt(text, limit, parts > 0, whole, marker, removed)
        return None if masked is None else place(masked)

    value: Any = None
    if t == "computer_call_output":
        if isinstance(output, Mapping) and output.get("type") == "computer_screenshot":
            placeholder = {"type": "computer_screenshot", "image_url": PLACEHOLDER_SCREENSHOT}
            value = placeholder if placeholder != output else None
    elif t == "shell_call_output":
        value = _shell_output(output, cut)
    elif isinstance(output, list) and t in ("function_call_output", "custom_tool_call_output"):
        value = _parts_output(output, cut)
    elif isinstance(output, str):
        value = cut(output, 0, lambda c: c)
    return None if value is None else dict(item, output=value)


def _parts_output(output: list[Any], cut: Any) -> Any:
    texts: list[str] = []
    parts = 0
    for part in output:
        if not isinstance(part, Mapping):
            return None
        if part.get("type") == "input_text":
            if not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        elif part.get("type") in ("input_image", "input_file"):
            parts += 1
        else:
            return None
    return cut("\n".join(texts), parts, lambda c: c)


def _shell_output(output: Any, cut: Any) -> Any:
    if not isinstance(output, list):
        return None
    texts: list[str] = []
    last = None
    for chunk in output:
        if not isinstance(chunk, Mapping):
            return None
        for key in ("stdout", "stderr"):
            v = chunk.get(key)
            if isinstance(v, str):
                if v:
                    texts.append(v)
            elif v is not None:
                return None
        last = chunk
    if last is None:
        return None
    return cut("\n".join(texts), 0, lambda c: [dict(last, stdout=c, stderr="")])


class ReferencePacker:
    """Pure-Python packer with an optional ``canonical text -> tokens`` memo."""

    def __init__(self, encoding: str = "o200k_base", *, warm: bool = True) -> None:
        self.encoding_name = encoding
        self.encoding = reference_tokenizer.get_encoding(encoding)
        self.memo: dict[str, int] | None = {} if warm else None
        self.excerpts = Excerpts(self.encoding, encoding)

    def item_cost(self, item: Mapping[str, Any]) -> int:
        text = _core.canonical_text(item)
        memo = self.memo
        if memo is not None:
            tokens = memo.get(text)
            if tokens is None:
                tokens = memo[text] = len(self.encoding.encode_ordinary(text))
        else:
            tokens = len(self.encoding.encode_ordinary(text))
        cost = ITEM_OVERHEAD + tokens + opaque_tokens(item)
        if _has_media(item) or item.get("type") == "image_generation_call":
            import protoprompt

            cost += protoprompt.item_tokens(item, encoding=self.encoding_name).media
        return cost

    def masked_cost(
        self, items: list[Mapping[str, Any]], hist: list[int], excerpt_tokens: int
    ) -> tuple[int, dict[int, Any]]:
        """A unit's cost with its tool outputs masked, and the copies that are cheaper."""
        wholes = [self.item_cost(items[p]) for p in hist]
        copies = masked_copies([items[p] for p in hist], wholes, self, excerpt_tokens)
        total, out = 0, {}
        for p, c, whole in zip(hist, copies, wholes):
            if c is not None and self.item_cost(c) < whole:
                out[p] = c
                total += self.item_cost(c)
            else:
                total += whole
        return total, out

    def pack(
        self,
        history: Iterable[Mapping[str, Any]],
        new_input: Iterable[Mapping[str, Any]],
        budget: int,
        *,
        output_reserve: int = 0,
        context_tokens: int = 0,
        policy: str = "contiguous",
        masking: Any = None,
        pinned: Iterable[int] = (),
    ) -> ReferenceResult:
        history = list(history)
        pins = set(pinned)
        new_input = list(new_input)
        nh = len(history)
        items = history + new_input
        units = units_of(history, new_input)
        bad_new = [u for u in units if u.contains_new and not u.valid]
        if bad_new:
            raise InvalidNewInput("; ".join(bad_new[0].problems))
        counted = 0

        def cost(positions: list[int]) -> int:
            nonlocal counted
            counted += len(positions)
            return sum(self.item_cost(items[p]) for p in positions)

        new_input_tokens = cost(list(range(nh, len(items))))
        dependency: list[int] = []
        dependency_tokens = 0
        candidates: list[list[int]] = []
        for u in units:
            hist = [p for p in u.members if p < nh]
            if not hist:
                continue
            if u.contains_new or pins & set(hist):
                dependency += hist
                dependency_tokens += cost(hist)
            elif u.valid and not u.input_only:
                candidates.append(hist)
        used = 0
        for section, tokens in (
            ("new_input", new_input_tokens),
            ("dependency", dependency_tokens),
            ("output_reserve", output_reserve),
            ("context", context_tokens),
        ):
            used += tokens
            if used > budget:
                total = new_input_tokens + dependency_tokens + output_reserve + context_tokens
                raise BudgetExceeded(total, budget, section)
        fill = _Fill(self, items, history, dependency, budget - used, masking, cost)
        fill.run(sorted(candidates, key=lambda hist: hist[-1], reverse=True), policy)
        kept = sorted(dependency + [p for t in fill.taken for p in t.hist])
        copies = {p: c for t in fill.taken for p, c in t.copies.items()}
        return ReferenceResult(
            kept,
            sorted(dependency),
            new_input_tokens,
            dependency_tokens,
            fill.history_tokens,
            context_tokens,
            output_reserve,
            budget,
            units,
            counted,
            items=[copies.get(p, history[p]) for p in kept] + new_input,
            masked=sorted(copies),
            masking_saved=sum(t.whole - t.cost for t in fill.taken if t.copies),
        )


OPAQUE_ENVELOPE_BYTES = 650
OPAQUE_BYTES_PER_TOKEN = 4
OPAQUE_MARGIN_PERCENT = 25
_STANDARD = re.compile(r"[A-Za-z0-9+/]*={0,2}")
_URL_SAFE = re.compile(r"[A-Za-z0-9_-]*={0,2}")


def decoded_len(payload: str) -> int | None:
    """Decoded size of a base64 payload (standard or URL-safe, padded or not; lines
    decoded one by one), ``None`` if it is not base64."""
    total = 0
    for line in payload.split("\n"):
        line = line.removesuffix("\r")
        if not line:
            continue
        if _URL_SAFE.fullmatch(line):
            line = line.translate(str.maketrans("-_", "+/"))
        elif not _STANDARD.fullmatch(line):
            return None
        bare = line.rstrip("=")
        if len(bare) % 4 == 1 or len(line) - len(bare) > -len(bare) % 4:
            return None  # a lone last symbol, or more padding than canonical
        try:
            raw = base64.b64decode(bare + "=" * (-len(bare) % 4), validate=True)
        except binascii.Error:
            return None
        if base64.b64encode(raw).decode().rstrip("=") != bare:
            return None  # non-zero trailing bits: not a canonical encoding (Rust refuses it)
        total += len(raw)
    return total


def opaque_tokens(item: Mapping[str, Any]) -> int:
    """The decoded-size cost of a reasoning or compaction item's ``encrypted_content``
    (0 when it is absent or not base64: then the canonical text holds it)."""
    payload = item.get("encrypted_content")
    if item.get("type") not in ("reasoning", "compaction") or not isinstance(payload, str):
        return 0
    provider_data = item.get("provider_data")
    if isinstance(provider_data, dict) and isinstance(provider_data.get("thinking_blocks"), list):
        return 0  # Claude's signatures: never decoded, counted in the canonical text
    size = decoded_len(payload)
    if size is None:
        return 0
    content = max(size - OPAQUE_ENVELOPE_BYTES, 0)
    return -(-content * (100 + OPAQUE_MARGIN_PERCENT) // (100 * OPAQUE_BYTES_PER_TOKEN))


@dataclass
class _Taken:
    hist: list[int]
    label: int
    cost: int
    whole: int
    copies: dict[int, Any] = field(default_factory=dict)


class _Fill:
    """The newest-first fill of the reference (see the module docstring)."""

    def __init__(self, packer, items, history, dependency, remaining, masking, cost) -> None:
        self.packer, self.items, self.masking, self.cost = packer, items, masking, cost
        self.dependency = set(dependency)
        self.remaining = remaining
        self.history_tokens = 0
        self.taken: list[_Taken] = []
        self.masked_phase = False
        # Turn label of a position: the user messages after it (equal labels = one turn).
        nh = len(history)
        self.is_user = [kind_of(it) == "user" for it in history]
        self.users_after = [0] * nh
        seen = 0
        for p in range(nh - 1, -1, -1):
            self.users_after[p] = seen
            seen += self.is_user[p]

    def label(self, hist: list[int]) -> int:
        return self.users_after[hist[-1]]

    def anchored(self, hist: list[int]) -> bool:
        """Whether the user message opening the turn of ``hist`` is mandatory."""
        opener = next((q for q in range(hist[-1], -1, -1) if self.is_user[q]), None)
        return opener is not None and opener in self.dependency

    def masked(self, hist: list[int]) -> tuple[int, dict[int, Any]]:
        return self.packer.masked_cost(self.items, hist, self.masking.excerpt_tokens)

    def take(self, t: _Taken) -> None:
        self.remaining -= t.cost
        self.history_tokens += t.cost
        self.taken.append(t)

    def mask(self, t: _Taken) -> None:
        """Mask a unit taken whole."""
        t_cost, t.copies = self.masked(t.hist)
        self.remaining += t.cost - t_cost
        self.history_tokens -= t.cost - t_cost
        t.cost = t_cost

    def make_room_in_anchored_turn(self, turn: list[_Taken], rest: list[list[int]]) -> None:
        """An anchored turn is masked before any of its units is dropped: ``t`` = the most
        units of the turn (``turn`` taken whole, newest first, then ``rest``: the unit that
        did not fit whole and the turn's older ones) that fit with every one masked; the
        newest ``k`` stay whole, ``k`` the most for which they and the next ``t - k`` masked
        fit."""
        room = self.remaining + sum(t.cost for t in turn)
        units = [t.hist for t in turn] + rest
        wholes = [self.cost(h) for h in units]
        masked = [self.masked(h)[0] for h in units]
        t = 0
        while t < len(units) and sum(masked[: t + 1]) <= room:
            t += 1
        k = max(
            (k for k in range(min(t, len(turn)) + 1) if sum(wholes[:k]) + sum(masked[k:t]) <= room),
            default=0,
        )
        for taken in turn[k:]:
            self.mask(taken)

    def try_take(self, hist: list[int], rest: list[list[int]]) -> _Taken | None:
        label, m = self.label(hist), self.masking
        whole = self.cost(hist)
        young = m is None or m.after_turns is None or label < m.after_turns
        if not self.masked_phase and young:
            if whole <= self.remaining:
                return _Taken(hist, label, whole, whole)
            if m is None:
                return None
            turn = [t for t in self.taken if t.label == label]
            if self.anchored(hist):
                self.make_room_in_anchored_turn(turn, rest)
            else:  # the turn's units taken whole are masked too
                for t in turn:
                    self.mask(t)
        self.masked_phase = True
        cost, copies = self.masked(hist)
        return _Taken(hist, label, cost, whole, copies) if cost <= self.remaining else None

    def run(self, candidates: list[list[int]], policy: str) -> None:
        for i, hist in enumerate(candidates):
            label = self.label(hist)
            t = self.try_take(hist, [h for h in candidates[i:] if self.label(h) == label])
            if t is not None:
                self.take(t)
                continue
            # Coherent start: the turn the fill stopped in loses the units it had taken,
            # unless its opening user message is mandatory.
            label = self.label(hist)
            if not self.anchored(hist):
                while self.taken and self.taken[-1].label == label:
                    dropped = self.taken.pop()
                    self.remaining += dropped.cost
                    self.history_tokens -= dropped.cost
            if policy == "greedy":
                self.older_turns([h for h in candidates[i + 1 :] if self.label(h) != label])
            return

    def older_turns(self, rest: list[list[int]]) -> None:
        """Greedy: older turns whole or not at all (masked with masking)."""
        for _, group in groupby(rest, key=self.label):
            turn = []
            for hist in group:
                whole = self.cost(hist)
                cost, copies = self.masked(hist) if self.masking else (whole, {})
                turn.append(_Taken(hist, self.label(hist), cost, whole, copies))
            if sum(t.cost for t in turn) <= self.remaining:
                for t in turn:
                    self.take(t)


def _has_media(item: Mapping[str, Any]) -> bool:
    text = json.dumps(item, ensure_ascii=False)
    return any(m in text for m in MEDIA_TYPES)


def reference_pack(
    history,
    new_input,
    budget,
    *,
    output_reserve=0,
    context_tokens=0,
    encoding="o200k_base",
    policy="contiguous",
    masking=None,
    pinned=(),
) -> ReferenceResult:
    """One-shot convenience wrapper (no memo)."""
    return ReferencePacker(encoding, warm=False).pack(
        history,
        new_input,
        budget,
        output_reserve=output_reserve,
        context_tokens=context_tokens,
        policy=policy,
        masking=masking,
        pinned=pinned,
    )
