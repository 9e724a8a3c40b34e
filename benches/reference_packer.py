"""A straightforward pure-Python packer: the yardstick for protoprompt's Rust core.

Same job as ``protoprompt.pack(..., policy="contiguous")``, written the obvious way:

1. classify each item and group ``history ++ new_input`` into atomic units with a union-find
   (call/output pairs by ``call_id``, MCP approval request/response/``mcp_call``, programs
   with their ``caller`` children, anonymous server tool search matched right to left,
   reasoning with the model items that follow it, items sharing an SDK de-duplication key);
2. cost every item as ``4 + len(tiktoken.encode_ordinary(canonical_text(item)))`` with the
   real ``tiktoken`` (``benches/reference_tokenizer.py``) on protoprompt's canonical text;
3. reserve ``new_input``, the history units it depends on, ``output_reserve`` and
   ``context_tokens`` (all or nothing), then add valid history units newest first and stop
   at the first one that does not fit, dropping what was taken of that unit's turn unless
   the turn's user message is mandatory (the kept history starts at a user message).

It implements only the rules that the generated histories exercise plus the common invalid
cases (call without output, output without/before its call, unmatched anonymous search,
dangling reasoning, orphan program, controls and foreign shapes); it is not a second source of
truth for the item rules (that is the Rust core, docs/item-graph.md). Media parts (images,
files, audio) are not tokenised here; their cost is borrowed from ``protoprompt.item_tokens``.

``ReferencePacker`` keeps a memo ``canonical text -> token count`` across calls (what a
reasonable Python implementation would do for the next turn); ``warm=False`` disables it.
"""

from __future__ import annotations

import json
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


def kind_of(item: Mapping[str, Any]) -> str:
    """One of: user, message, assistant_out, reasoning, call, output, anon_call, anon_out,
    hosted, standalone, control, foreign."""
    t = item.get("type")
    role = item.get("role")
    if t is None or t == "message":
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


def units_of(history: list[Mapping[str, Any]], new_input: list[Mapping[str, Any]]) -> list[RefUnit]:
    """Atomic units of ``history ++ new_input``, ordered by their first member."""
    items = list(history) + list(new_input)
    nh = len(history)
    n = len(items)
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    kinds = [kind_of(it) for it in items]
    problems: list[tuple[int, str]] = []

    for p, k in enumerate(kinds):
        if k == "foreign":
            problems.append((p, "foreign item"))
        elif k == "control" and p < nh:
            problems.append((p, "input-only control in history"))

    # Pairing: calls by (type, identity); outputs join the first call.
    calls: dict[tuple[str, str], int] = {}
    for p, k in enumerate(kinds):
        if k != "call":
            continue
        ident = identity(items[p], k)
        if ident is None:
            problems.append((p, "call without identity"))
            continue
        key = (items[p]["type"], ident)
        if key in calls:
            union(calls[key], p)
        else:
            calls[key] = p
    answered: set[tuple[str, str]] = set()
    streams: dict[tuple[str, str], str] = {}
    program_done: dict[str, int] = {}
    for p, k in enumerate(kinds):
        if k != "output":
            continue
        ident = identity(items[p], k)
        if ident is None:
            problems.append((p, "output without identity"))
            continue
        key = (OUTPUT_TO_CALL[items[p]["type"]], ident)
        first = calls.get(key)
        if first is None:
            problems.append((p, "output without its call"))
            continue
        union(first, p)
        answered.add(key)
        if key[0] in STREAMED:
            state = _stream_step(streams.get(key, "open"), items[p].get("status"))
            if state == "bad":
                problems.append((p, "invalid streamed output sequence"))
                state = "reported"
            streams[key] = state
        if p < first:
            problems.append((p, "output before its call"))
        if key[0] == "program" and items[p].get("status") == "completed":
            program_done.setdefault(ident, p)
    for key, p in calls.items():
        if key in answered:
            continue
        t = key[0]
        owned = program_caller(items[p]) is not None
        exempt = (
            t == "program"
            or (
                t == "shell_call"
                and (owned or p >= nh)
                and items[p].get("status") in (None, "in_progress")
            )
            or (t == "mcp_approval_request" and owned)
        )
        if not exempt:
            problems.append((p, "call without output"))

    # Programs: children (by caller) join the program; orphan programs are invalid.
    named_by_new = {program_caller(items[p]) for p in range(nh, n)} - {None}
    for p in range(n):
        pid = program_caller(items[p])
        if pid is None or kinds[p] == "foreign":
            continue
        root = calls.get(("program", pid))
        if root is None:
            problems.append((p, "program child without its program"))
            continue
        union(root, p)
        if p < root:
            problems.append((p, "program child before its program"))
        done = program_done.get(pid)
        if done is not None and p > done and items[p].get("type") != "program_output":
            problems.append((p, "program child after completed program_output"))
    for (t, ident), p in calls.items():
        if (
            t == "program"
            and p < nh
            and ("program", ident) not in answered
            and ident not in named_by_new
        ):
            problems.append((p, "orphan program"))

    # Anonymous tool search: right to left, each call takes the nearest output to its right.
    stack: list[int] = []
    anon_calls: list[int] = []
    pairs: list[tuple[int, int]] = []
    for p in range(n - 1, -1, -1):
        if kinds[p] == "anon_out":
            stack.append(p)
        elif kinds[p] == "anon_call":
            anon_calls.append(p)
            if stack:
                pairs.append((p, stack.pop()))
            else:
                problems.append((p, "anonymous call without output"))
    anon_calls.reverse()
    for o in stack:  # leftover outputs: more chunks of the nearest call to their left
        left = [c for c in anon_calls if c < o]
        if left:
            pairs.append((left[-1], o))
        else:
            problems.append((o, "anonymous output without call"))
    pairs.sort()
    sweep: tuple[int, int] | None = None  # (representative call, max end of merged spans)
    for c, group in groupby(pairs, key=lambda pair: pair[0]):
        end = c
        state = "open"
        for _, o in group:
            union(c, o)
            end = max(end, o)
            state = _stream_step(state, items[o].get("status"))
            if state == "bad":
                problems.append((o, "invalid streamed output sequence"))
                state = "reported"
        if sweep is not None and c < sweep[1]:  # overlapping spans merge
            union(sweep[0], c)
            sweep = (sweep[0], max(sweep[1], end))
        else:
            sweep = (c, end)

    # MCP: mcp_call joins the approval request it names.
    for p in range(n):
        if items[p].get("type") == "mcp_call":
            ar = items[p].get("approval_request_id")
            if isinstance(ar, str) and ar and ("mcp_approval_request", ar) in calls:
                union(calls[("mcp_approval_request", ar)], p)

    # Reasoning blocks: a run of reasoning / model-emitted / server-emitted items; the first
    # reasoning of the run and everything after it in the run form one unit.
    model_emitted = {"assistant_out", "call", "anon_call", "hosted"}

    def continues(p: int) -> bool:
        k = kinds[p]
        if k in model_emitted or k == "reasoning" or k == "anon_out":
            return True
        t = items[p].get("type")
        server_search = t == "tool_search_output" and items[p].get("execution") != "client"
        return k == "output" and (t == "program_output" or server_search)

    p = 0
    while p < n:
        if not continues(p):
            p += 1
            continue
        start = end = p
        while end + 1 < n and continues(end + 1):
            end += 1
        r0 = next((i for i in range(start, end + 1) if kinds[i] == "reasoning"), None)
        if r0 is not None:
            last_model = max(
                (i for i in range(start, end + 1) if kinds[i] in model_emitted), default=-1
            )
            for i in range(r0 + 1, end + 1):
                union(r0, i)
            for i in range(r0, end + 1):
                if kinds[i] == "reasoning" and last_model < i:
                    problems.append((i, "dangling reasoning"))
        p = end + 1
    seen_rs: set[str] = set()
    for p in range(n):
        if kinds[p] != "reasoning":
            continue
        rid = items[p].get("id")  # id-less reasoning is valid (V9, docs/item-graph.md §12.3)
        if isinstance(rid, str) and rid:
            if rid in seen_rs:
                problems.append((p, "duplicate reasoning id"))
            seen_rs.add(rid)

    # Items sharing an SDK de-duplication key.
    keys: dict[tuple[Any, str], int] = {}
    for p in range(n):
        k = dedup_key(items[p])
        if k is not None:
            if k in keys:
                union(keys[k], p)
            else:
                keys[k] = p

    by_root: dict[int, RefUnit] = {}
    units: list[RefUnit] = []
    unit_at: list[RefUnit] = []
    for p in range(n):
        r = find(p)
        u = by_root.get(r)
        if u is None:
            u = by_root[r] = RefUnit(members=[], input_only=True)
            units.append(u)
        u.members.append(p)
        u.contains_new |= p >= nh
        u.input_only &= kinds[p] == "control"
        unit_at.append(u)
    for p, why in problems:
        if why not in unit_at[p].problems:
            unit_at[p].problems.append(why)
    return units


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


class ReferencePacker:
    """Pure-Python packer with an optional ``canonical text -> tokens`` memo."""

    def __init__(self, encoding: str = "o200k_base", *, warm: bool = True) -> None:
        self.encoding_name = encoding
        self.encoding = reference_tokenizer.get_encoding(encoding)
        self.memo: dict[str, int] | None = {} if warm else None

    def item_cost(self, item: Mapping[str, Any]) -> int:
        text = _core.canonical_text(item)
        memo = self.memo
        if memo is not None:
            tokens = memo.get(text)
            if tokens is None:
                tokens = memo[text] = len(self.encoding.encode_ordinary(text))
        else:
            tokens = len(self.encoding.encode_ordinary(text))
        cost = ITEM_OVERHEAD + tokens
        if _has_media(item):
            import protoprompt

            cost += protoprompt.item_tokens(item, encoding=self.encoding_name).media
        return cost

    def pack(
        self,
        history: Iterable[Mapping[str, Any]],
        new_input: Iterable[Mapping[str, Any]],
        budget: int,
        *,
        output_reserve: int = 0,
        context_tokens: int = 0,
    ) -> ReferenceResult:
        history = list(history)
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
            if u.contains_new:
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
        remaining = budget - used
        candidates.sort(key=lambda hist: hist[-1], reverse=True)  # newest member first
        # Turn label of a position: the user messages after it (equal labels = one turn).
        is_user = [kind_of(it) == "user" for it in history]
        users_after = [0] * nh
        seen = 0
        for p in range(nh - 1, -1, -1):
            users_after[p] = seen
            seen += is_user[p]
        kept = list(dependency)
        taken: list[tuple[list[int], int]] = []
        history_tokens = 0
        for hist in candidates:
            c = cost(hist)
            if c > remaining:
                # Coherent start: the turn the fill stopped in loses the units it had taken,
                # unless its opening user message is mandatory.
                opener = next((q for q in range(hist[-1], -1, -1) if is_user[q]), None)
                if opener is None or opener not in dependency:
                    label = users_after[hist[-1]]
                    while taken and users_after[taken[-1][0][-1]] == label:
                        dropped, dc = taken.pop()
                        history_tokens -= dc
                break
            remaining -= c
            history_tokens += c
            taken.append((hist, c))
        for hist, _ in taken:
            kept += hist
        return ReferenceResult(
            sorted(kept),
            sorted(dependency),
            new_input_tokens,
            dependency_tokens,
            history_tokens,
            context_tokens,
            output_reserve,
            budget,
            units,
            counted,
        )


def _has_media(item: Mapping[str, Any]) -> bool:
    content = item.get("content") if "content" in item else item.get("output")
    if not isinstance(content, (list, dict)):  # a list of parts, or one (a screenshot)
        return False
    text = json.dumps(content, ensure_ascii=False)
    return any(m in text for m in MEDIA_TYPES)


def reference_pack(
    history, new_input, budget, *, output_reserve=0, context_tokens=0, encoding="o200k_base"
) -> ReferenceResult:
    """One-shot convenience wrapper (no memo)."""
    return ReferencePacker(encoding, warm=False).pack(
        history, new_input, budget, output_reserve=output_reserve, context_tokens=context_tokens
    )
