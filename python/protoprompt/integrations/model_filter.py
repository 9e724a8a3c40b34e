"""Per-call budgets: a ``call_model_input_filter`` that fits every model call of a run.

The SDK calls ``session_input_callback`` once per run. Inside the run it appends each model
output and each tool output to the input and calls the model again; only
``RunConfig.call_model_input_filter`` sees those later requests. :class:`ModelInputFilter`
keeps every one of them within the builder's budget, for the *whole* request::

    input items + instructions + tool definitions + output_reserve <= max_tokens

What is mandatory on a call (reserved all or nothing, in this order): the instructions and
tool definitions, the output reserve, the context message the session callback produced,
the run's own new input, and the *newest step* — the model output that ended the previous
call and the tool outputs answering it (with the reasoning and calls they complete).
Everything else is optional and filled newest first as atomic units by the Rust core under
the same item-graph rules as the session callback: first the run's earlier steps (newest
first), then the history the callback kept. Under ``policy="contiguous"`` the kept part is
an unbroken newest suffix, so once an earlier step does not fit, nothing older is sent;
``policy="greedy"`` skips it and keeps older whole turns that fit. A long run therefore
loses its *middle* steps first, never its input or its newest step.

When the mandatory part does not fit, ``oversized_output="error"`` raises
:class:`~protoprompt.errors.TokenBudgetExceededError` (``section="tool_output"``, the
``detail`` names the output and its call) before anything is sent;
``oversized_output="truncate"`` cuts the model-facing copies of the newest step's tool
outputs to the room left (token-exact, head and tail kept around a marker that says how
many tokens were removed). The stored items are never changed: nothing a filter returns is
persisted by the SDK.

Speed: the filter keeps, per run (per asyncio task), a :class:`~protoprompt.HistoryIndex`
of the input it has seen, so a call classifies and counts only what the previous call did
not see. Within a run the SDK only appends to the input; the filter checks that cheaply
(same agent, the previous step and sampled items unchanged, no new user message) and
starts a fresh index otherwise (a handoff, a new run, an edited list).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from ..context import ContextPlan, TokenBudgetedContextBuilder, latest_user_text
from ..errors import TokenBudgetExceededError
from ..packing import (
    HistoryIndex,
    PackResult,
    UnitDecision,
    count_tokens,
    item_tokens,
    truncate_text,
)
from ._sdk import (
    RESPONSES_CONVERTER,
    Agent,
    CallModelData,
    FunctionTool,
    Handoff,
    ModelInputData,
    RunContextWrapper,
    handoff,
)

if TYPE_CHECKING:
    from .session import ProtoPromptSession

__all__ = [
    "TOOLS_OVERHEAD",
    "ModelCallPlan",
    "ModelInputFilter",
    "OversizedOutput",
    "TruncatedOutput",
    "model_input_filter",
    "tool_definitions",
]

OversizedOutput = Literal["error", "truncate"]

TOOLS_OVERHEAD = 12
"""Tokens added once per request that carries tool definitions (the tools section's
framing), besides each definition's own cost; see :func:`tool_definitions`."""

_MIN_KEPT_TOKENS = 32
"""A cut text (marker included) keeps at least this many tokens before media parts of the
same output are replaced by a marker."""

_MODEL_SIDE_TYPES = frozenset(
    {
        "reasoning",
        "function_call",
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "tool_search_call",
        "web_search_call",
        "file_search_call",
        "code_interpreter_call",
        "image_generation_call",
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
        "program",
        "program_output",
        "compaction",
        "hosted_tool_call",
    }
)
"""Item types the model (or the server for it) emits; tool outputs and messages from the
client are the other side. Used to find the newest step when the filter has no record of the
previous call (its first call in a run, after a handoff)."""

_TEXT_KEYS = frozenset({"text", "stdout", "stderr", "output", "content", "result"})
"""Keys whose string values a truncation may cut (ids, types and statuses are never cut)."""

_MEDIA_TYPES = frozenset({"input_image", "input_file", "input_audio"})

MAX_RUNS = 64
"""Runs whose state a filter keeps between their model calls (most recent first)."""
MAX_RUN_STATE_BYTES = 64 * 2**20
"""Bytes of run indexes a filter keeps between calls; older runs start afresh."""


# --------------------------------------------------------------------------- plans


@dataclass(frozen=True)
class TruncatedOutput:
    """A tool output of the newest step whose model-facing copy was cut."""

    position: int
    """Position of the output in the SDK's input list."""
    item_type: str
    call_id: str | None
    tool: str | None
    """Name of the tool whose call it answers, when the call is in the input."""
    original_tokens: int
    """Tokens of the stored item."""
    sent_tokens: int
    """Tokens of the copy that was sent."""


@dataclass(frozen=True)
class ModelCallPlan:
    """What :class:`ModelInputFilter` did for one model call."""

    call: int
    """1 for the first model call of a run (as seen by this filter), 2 for the next…"""
    items: list[Any]
    """The input items sent (the SDK's objects, truncated copies where cut)."""
    instructions_tokens: int
    """Cost of the agent's instructions (counted like a system message)."""
    tools_tokens: int
    """Cost of the tool definitions sent with the call (:func:`tool_definitions`)."""
    budget: int
    output_reserve: int
    input_items: int
    """Length of the input list the SDK handed over."""
    pinned: list[int]
    """Positions (in the SDK's list) of the mandatory context message and run input."""
    step: tuple[int, int]
    """``[start, end)`` positions of the newest step (mandatory); empty on a first call."""
    pack: PackResult
    """The core's packing: decisions for every unit of the optional part."""
    truncated: list[TruncatedOutput] = field(default_factory=list)
    context: ContextPlan | None = None
    """Standalone filter: the builder's plan, with the recalled context message."""

    @property
    def items_tokens(self) -> int:
        """Tokens of the input items sent (context message included)."""
        return self.pack.request_tokens - self.instructions_tokens - self.tools_tokens

    @property
    def request_tokens(self) -> int:
        """Items + instructions + tools: the whole request."""
        return self.pack.request_tokens

    @property
    def used(self) -> int:
        """The whole request plus the output reserve (``<= budget``)."""
        return self.pack.used

    @property
    def dropped(self) -> list[UnitDecision]:
        """Units of the input that were not sent."""
        return self.pack.dropped

    def explain(self) -> str:
        """A readable account of the call: totals, cuts, then the core's decisions."""
        lines = [
            f"model call {self.call}: {self.used} of {self.budget} tokens = items "
            f"{self.items_tokens} + instructions {self.instructions_tokens} + tools "
            f"{self.tools_tokens} + output reserve {self.output_reserve}; "
            f"{len(self.items)} of {self.input_items} input items sent"
            + (
                " (plus the recalled context)"
                if self.context and self.context.context_message
                else ""
            ),
            f"  mandatory: context/run input at {self.pinned or 'none'}, newest step "
            f"{self.step[0]}..{self.step[1]}",
        ]
        lines.extend(
            f"  truncated {t.item_type} at {t.position} (call {t.call_id}"
            f"{', ' + t.tool if t.tool else ''}): {t.original_tokens} -> "
            f"{t.sent_tokens} tokens"
            for t in self.truncated
        )
        lines.append(self.pack.explain())
        return "\n".join(lines)


# --------------------------------------------------------------------------- tools


def _json_like(value: Any, depth: int = 0) -> Any:
    """A JSON-shaped copy of a tool's configuration value (callables and objects dropped)."""
    if depth > 32:
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json_like(v, depth + 1) for k, v in value.items() if not callable(v)}
    if isinstance(value, (list, tuple)):
        return [_json_like(v, depth + 1) for v in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return _json_like(dump(exclude_none=True), depth + 1)
        except Exception:  # noqa: BLE001 - not a model we can dump: leave it out
            return None
    return None


def _fallback_definition(tool: Any) -> dict[str, Any]:
    """A conservative definition when the SDK's converter cannot render ``tool``."""
    if isinstance(tool, FunctionTool):
        return {
            "type": "function",
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
            "strict": tool.strict_json_schema,
        }
    if isinstance(tool, Handoff):
        return {
            "type": "function",
            "name": tool.tool_name,
            "description": tool.tool_description,
            "parameters": tool.input_json_schema,
        }
    out: dict[str, Any] = {"type": str(getattr(tool, "name", type(tool).__name__))}
    if dataclasses.is_dataclass(tool):
        for f in dataclasses.fields(tool):
            v = getattr(tool, f.name, None)
            if not callable(v) and not f.name.startswith("_"):
                out[f.name] = _json_like(v)
    return out


def tool_definitions(tools: Sequence[Any], handoffs: Sequence[Any] = ()) -> list[dict[str, Any]]:
    """The definitions the SDK sends for ``tools`` and ``handoffs``, as dicts.

    Rendered by the SDK's own Responses converter (function tools: name, description, JSON
    schema; hosted tools: their configuration; handoffs as function tools); a tool the
    converter refuses is rendered from its public fields instead. Each definition costs what
    :func:`~protoprompt.item_tokens` says for the dict — every field name and value counted
    as text, a conservative estimate of how the API renders tools — and a request with
    tools adds :data:`TOOLS_OVERHEAD`.
    """
    handoff_objs = [h if isinstance(h, Handoff) else handoff(h) for h in handoffs]
    try:
        if RESPONSES_CONVERTER is None:  # pragma: no cover - another SDK layout
            raise LookupError("the SDK has no Responses converter")
        converted = RESPONSES_CONVERTER.convert_tools(list(tools), handoff_objs)
        return [dict(t) for t in converted.tools if isinstance(t, Mapping)]
    except Exception:  # noqa: BLE001 - e.g. a computer tool not yet initialised
        return [_fallback_definition(t) for t in [*tools, *handoff_objs]]


def _tool_key(tool: Any) -> tuple[Any, ...]:
    if isinstance(tool, FunctionTool):
        return (
            id(tool),
            tool.name,
            tool.description,
            id(tool.params_json_schema),
            tool.strict_json_schema,
        )
    return (id(tool),)


class _ToolCosts:
    """Token costs of agents' tool definitions, cached by the tool objects (a 30-tool agent
    does not render and count its schemas on every call). Bounded LRU; entries hold the
    tools they describe, so their ids cannot be reused while cached."""

    def __init__(self, capacity: int = 256) -> None:
        self._cache: OrderedDict[tuple[Any, ...], tuple[int, list[Any]]] = OrderedDict()
        self._capacity = capacity

    def cost(self, tools: Sequence[Any], handoffs: Sequence[Any], encoding: str) -> int:
        if not tools and not handoffs:
            return 0
        key = (encoding, *(_tool_key(t) for t in tools), "|", *(_tool_key(h) for h in handoffs))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit[0]
        definitions = tool_definitions(tools, handoffs)
        tokens = TOOLS_OVERHEAD + sum(item_tokens(d, encoding=encoding).total for d in definitions)
        self._cache[key] = (tokens, [*tools, *handoffs])
        while len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return tokens


def _enabled_handoffs(agent: Agent[Any]) -> list[Any]:
    """The agent's handoffs; a handoff enabled by a callable counts (conservative)."""
    out = []
    for h in getattr(agent, "handoffs", ()) or ():
        obj = h if isinstance(h, Handoff) else handoff(h)
        if obj.is_enabled is False:
            continue
        out.append(obj)
    return out


async def _agent_tools(agent: Agent[Any], context: Any) -> list[Any]:
    """The tools the SDK sends for ``agent``: its own (a tool disabled by ``is_enabled=False``
    is left out, one with a callable counts) and its MCP servers' tools."""
    tools = [
        t
        for t in (getattr(agent, "tools", ()) or ())
        if not (isinstance(t, FunctionTool) and t.is_enabled is False)
    ]
    if getattr(agent, "mcp_servers", None):
        tools = [*await agent.get_mcp_tools(RunContextWrapper(context=context)), *tools]
    return tools


# --------------------------------------------------------------------------- item shapes


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def _is_user_message(item: Any) -> bool:
    return _field(item, "role") == "user" and _field(item, "type") in (None, "message")


def _is_model_side(item: Any) -> bool:
    kind = _field(item, "type")
    if kind == "tool_search_output":
        return bool(_field(item, "execution") == "server")
    if kind in _MODEL_SIDE_TYPES:
        return True
    return bool(_field(item, "role") == "assistant")


def _newest_step_start(items: Sequence[Any], lo: int) -> int:
    """Start of the newest step at or after ``lo``: the trailing client items (tool outputs)
    and the model output run before them. ``len(items)`` when nothing follows ``lo``."""
    j = len(items)
    while j > lo and not _is_model_side(items[j - 1]):
        j -= 1
    while j > lo and _is_model_side(items[j - 1]):
        j -= 1
    return j


def _last_user_message(items: Sequence[Any], lo: int) -> int | None:
    for i in range(len(items) - 1, lo - 1, -1):
        if _is_user_message(items[i]):
            return i
    return None


# --------------------------------------------------------------------------- truncation


def _text_leaves(value: Any, path: tuple[Any, ...], key: Any) -> list[tuple[Any, ...]]:
    """Paths of the cuttable string leaves under ``value``."""
    if isinstance(value, str):
        return [path] if key is None or key in _TEXT_KEYS else []
    if isinstance(value, Mapping):
        if value.get("type") in _MEDIA_TYPES:
            return []
        out: list[tuple[Any, ...]] = []
        for k, v in value.items():
            out.extend(_text_leaves(v, (*path, k), k))
        return out
    if isinstance(value, list):
        out = []
        for i, v in enumerate(value):
            out.extend(_text_leaves(v, (*path, i), None))
        return out
    return []


def _media_parts(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [
        i for i, p in enumerate(value) if isinstance(p, Mapping) and p.get("type") in _MEDIA_TYPES
    ]


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        root = root[k]
    return root


def _set(root: Any, path: tuple[Any, ...], value: Any) -> None:
    for k in path[:-1]:
        root = root[k]
    root[path[-1]] = value


class _Cutter:
    """Cuts one output item's model-facing copy to a token target."""

    def __init__(self, item: Mapping[str, Any], encoding: str) -> None:
        self.original = item
        self.copy: dict[str, Any] = copy.deepcopy(dict(item))
        self.encoding = encoding

    def cost(self) -> int:
        return item_tokens(self.copy, encoding=self.encoding).total

    def shrink_to(self, target: int) -> bool:
        """Cut until the copy costs at most ``target`` tokens; ``False`` if it cannot.

        Media parts are replaced by a text marker only when the output would not fit even
        with every text cut to :data:`_MIN_KEPT_TOKENS`; then the texts are cut, largest
        first, to fill the room exactly (each from its original, so one marker per text)."""
        if "output" not in self.copy:
            return False
        if self.cost() <= target:
            return True
        sizes = {
            p: count_tokens(_get(self.original, p), encoding=self.encoding)
            for p in _text_leaves(self.original["output"], ("output",), "output")
        }
        big = [p for p, n in sizes.items() if n > _MIN_KEPT_TOKENS]
        floor = copy.deepcopy(self.copy)
        for p in big:
            _set(
                floor,
                p,
                truncate_text(_get(self.original, p), _MIN_KEPT_TOKENS, encoding=self.encoding),
            )
        while item_tokens(floor, encoding=self.encoding).total > target:
            media = _media_parts(floor["output"])
            if not media:
                return False
            i = media[-1]
            marker = {
                "type": "input_text",
                "text": f"[{floor['output'][i].get('type')} removed by protoprompt: "
                f"it did not fit the token budget]",
            }
            floor["output"][i] = marker
            self.copy["output"][i] = dict(marker)
        current = dict(sizes)
        for _ in range(16):
            over = self.cost() - target
            if over <= 0:
                return True
            cuttable = [p for p in big if current[p] > _MIN_KEPT_TOKENS]
            if not cuttable:
                break
            leaf = max(cuttable, key=lambda p: current[p])
            current[leaf] = max(_MIN_KEPT_TOKENS, min(current[leaf], sizes[leaf]) - over - 1)
            _set(
                self.copy,
                leaf,
                truncate_text(_get(self.original, leaf), current[leaf], encoding=self.encoding),
            )
        return self.cost() <= target


def _water_level(costs: list[int], room: int) -> int | None:
    """Largest cap with ``sum(min(c, cap)) <= room`` (``None`` if even 0 is too much)."""
    if room < 0:
        return None
    if sum(costs) <= room:
        return max(costs, default=0)
    ordered = sorted(costs)
    spent = 0
    for i, c in enumerate(ordered):
        rest = len(ordered) - i
        if spent + c * rest > room:
            return (room - spent) // rest
        spent += c
    return ordered[-1]


# --------------------------------------------------------------------------- run state


class _Run:
    """What the filter knows of one run between its model calls."""

    __slots__ = (
        "agent",
        "calls",
        "index",
        "n_prev",
        "pool",
        "run_input",
        "samples",
        "step_start",
        "token",
    )

    def __init__(self, agent: Any, token: Any) -> None:
        self.agent = agent
        self.token = token
        self.index = HistoryIndex()
        self.calls = 0
        self.n_prev = 0
        self.step_start = 0
        self.samples: dict[int, int] = {}
        self.run_input: tuple[int, int] | None = None
        self.pool: tuple[tuple[Any, ...], list[Any]] | None = None

    def verdict(self, items: list[Any], agent: Any, token: Any) -> str:
        """``"continue"`` when ``items`` extends the list of this run's previous call,
        ``"new_run"`` when it extends it with a new user message (the next run of the same
        conversation), else ``"other"``.

        The checks are cheap on purpose (the SDK hands over fresh copies of the whole input
        on every call): within a run the SDK only appends, a handoff changes the agent and a
        new session run comes with a new callback token; the previous step, the first item
        and items at doubling distances from both ends must have the same fingerprints."""
        n = self.n_prev
        if agent is not self.agent or token is not self.token or len(items) <= n or not n:
            return "other"
        if any(_fingerprint(items[p]) != f for p, f in self.samples.items()):
            return "other"
        if any(_is_user_message(items[p]) for p in range(n, len(items))):
            return "new_run"
        return "continue"

    def remember(self, items: list[Any], step_start: int) -> None:
        """Fingerprints of what this call saw (no references: holding a few items of a
        discarded list would keep its memory pages alive until the next call frees them)."""
        n = len(items)
        self.n_prev = n
        self.step_start = step_start
        positions = set(range(step_start, n)) | {0}
        k = 1
        while k < n:
            positions.update((k, n - 1 - k))
            k *= 2
        self.samples = {p: _fingerprint(items[p]) for p in positions if 0 <= p < n}


def _fingerprint(item: Any) -> int:
    """A hash of an item's identity fields and payload sizes (an int: it holds nothing of the
    item, whose list the SDK discards after the call)."""
    if not isinstance(item, Mapping):
        return hash(type(item).__name__)
    out: list[Any] = [len(item)]
    for key in ("type", "role", "id", "call_id", "status", "name", "approval_request_id"):
        v = item.get(key)
        out.append(v if isinstance(v, (str, int, type(None))) else type(v).__name__)
    for key in ("content", "output", "arguments", "summary", "encrypted_content", "action"):
        v = item.get(key)
        if isinstance(v, str):  # length and ends: O(1), whatever the payload's size
            out.extend((len(v), v[:24], v[-24:]))
        else:
            out.append(len(v) if isinstance(v, (list, dict)) else None)
    return hash(tuple(out))


# --------------------------------------------------------------------------- the filter


class ModelInputFilter:
    """A ``call_model_input_filter`` that fits every model call of a run into the budget.

    Create it with :meth:`ProtoPromptSession.model_input_filter` (the session's callback
    tells it which items are its context message and the run's input) or, for runs without a
    ``ProtoPromptSession``, with :func:`model_input_filter` (then it also recalls the
    builder's memory layers into a context message in front of every call, and it is the
    only budget). Pass it as ``RunConfig(call_model_input_filter=...)``; the one-liner is
    :meth:`ProtoPromptSession.run_config`.

    One filter may serve many runs at once (it keeps the state of the :data:`MAX_RUNS` most
    recent runs between their calls). :attr:`last_plan` is the plan of the latest call of
    any run that was sent (a call that raises leaves it as it was; a kept plan pins nothing
    the next call needs); ``on_call`` sees each.
    """

    def __init__(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        oversized_output: OversizedOutput = "error",
        output_reserve: int | None = None,
        session: ProtoPromptSession | None = None,
        system_prompt: str = "",
        on_call: Callable[[ModelCallPlan], None] | None = None,
    ) -> None:
        if not isinstance(builder, TokenBudgetedContextBuilder):
            raise TypeError(
                f"builder must be a TokenBudgetedContextBuilder, got {type(builder).__name__}"
            )
        if oversized_output not in ("error", "truncate"):
            raise ValueError(
                f"oversized_output must be 'error' or 'truncate', got {oversized_output!r}"
            )
        if output_reserve is not None and (
            isinstance(output_reserve, bool)
            or not isinstance(output_reserve, int)
            or not 0 <= output_reserve < builder.max_tokens
        ):
            raise ValueError(
                f"output_reserve must be an int in [0, {builder.max_tokens}), "
                f"got {output_reserve!r}"
            )
        if not isinstance(system_prompt, str):
            raise TypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
        if on_call is not None and not callable(on_call):
            raise TypeError("on_call must be callable or None")
        self.builder = builder
        self.oversized_output: OversizedOutput = oversized_output
        self.output_reserve = builder.output_reserve if output_reserve is None else output_reserve
        self.session = session
        self.system_prompt = system_prompt
        self.on_call = on_call
        self.last_plan: ModelCallPlan | None = None
        """The plan of the latest model call (any run); ``None`` before the first and while
        a call is being packed. Plans you keep yourself (``on_call``) share the run index's
        item graph, so the next call of that run copies it: keep what you need from them."""
        self._runs: OrderedDict[int, _Run] = OrderedDict()  # runs between two calls
        self._lock = threading.Lock()
        self._tools = _ToolCosts()

    def reset(self) -> None:
        """Forget every run's state (the next call classifies its input afresh)."""
        with self._lock:
            self._runs.clear()

    def _claim(self, items: list[Any], agent: Any, token: Any) -> _Run:
        """The state of the run whose next call this is, or a new one.

        The SDK may make a run's model calls from different asyncio tasks, so runs are found
        by what they saw: the newest matching state wins. A state found to be the previous
        run of the same conversation is dropped (its list is not this run's prefix)."""
        with self._lock:
            for key, run in reversed(self._runs.items()):
                verdict = run.verdict(items, agent, token)
                if verdict != "other":
                    del self._runs[key]
                    if verdict == "continue":
                        return run
                    break
        return _Run(agent, token)

    def _release(self, run: _Run) -> None:
        with self._lock:
            self._runs[id(run)] = run
            total = 0
            for key in reversed(list(self._runs)):
                total += self._runs[key].index.nbytes
                if total > MAX_RUN_STATE_BYTES or len(self._runs) > MAX_RUNS:
                    del self._runs[key]

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        model_data = data.model_data
        items = model_data.input
        if not isinstance(items, list):
            raise TypeError(f"model input must be a list, got {type(items).__name__}")
        instructions = model_data.instructions
        encoding = self.builder.encoding
        instructions_tokens = (
            item_tokens({"role": "system", "content": instructions}, encoding=encoding).total
            if instructions
            else 0
        )
        tools = await _agent_tools(data.agent, data.context)
        tools_tokens = self._tools.cost(tools, _enabled_handoffs(data.agent), encoding)
        token = self.session._current_run() if self.session is not None else None
        run = self._claim(items, data.agent, token)  # a failed call puts no state back

        def work() -> ModelCallPlan:
            return self._plan(items, run, instructions_tokens, tools_tokens)

        if len(items) - len(run.index) > 4096:  # a long first read: off the event loop
            plan = await asyncio.to_thread(work)
        else:
            plan = work()
        self._release(run)
        self.last_plan = plan
        if self.on_call is not None:
            self.on_call(plan)
        return ModelInputData(input=plan.items, instructions=instructions)

    # ------------------------------------------------------------------ layout and pack

    def _layout(self, items: list[Any], run: _Run) -> tuple[list[int], int]:
        """Pinned positions (context message, run input) and the newest step's start."""
        pinned: list[int] = []
        lo = 0
        if self._is_context(items):
            pinned.append(0)
            lo = 1
        if run.calls:  # the same run as the previous call: its input has not moved
            located = run.run_input
        else:
            located = self.session._locate_run_input(items) if self.session is not None else None
            if located is None:
                u = _last_user_message(items, lo)
                located = (u, u + 1) if u is not None else None
            run.run_input = located
        if located is not None:
            a, b = located
            pinned.extend(p for p in range(a, b) if p not in pinned)
            lo = max(lo, b)
        if run.calls:
            return pinned, max(run.n_prev, lo)
        return pinned, _newest_step_start(items, lo)

    def _is_context(self, items: list[Any]) -> bool:
        return bool(items) and self.session is not None and self.session._is_own_context(items[0])

    def _plan(
        self, items: list[Any], run: _Run, instructions_tokens: int, tools_tokens: int
    ) -> ModelCallPlan:
        pinned, step_start = self._layout(items, run)
        fixed = instructions_tokens + tools_tokens
        step = list(items[step_start:])
        truncated: list[TruncatedOutput] = []
        try:
            result, context = self._pack(items, step_start, step, pinned, fixed, run)
        except TokenBudgetExceededError as exc:
            if self.oversized_output != "truncate":
                raise self._explained(exc, items, step_start, fixed) from None
            step, truncated = self._truncated_step(exc, items, step_start, step, fixed)
            result, context = self._pack(items, step_start, step, pinned, fixed, run)
        run.calls += 1
        run.remember(items, step_start)
        sent = (
            [context.context_message] if context and context.context_message else []
        ) + result.items
        return ModelCallPlan(
            call=run.calls,
            items=sent,
            instructions_tokens=instructions_tokens,
            tools_tokens=tools_tokens,
            budget=self.builder.max_tokens,
            output_reserve=self.output_reserve,
            input_items=len(items),
            pinned=pinned,
            step=(step_start, len(items)),
            pack=result,
            truncated=truncated,
            context=context,
        )

    def _pack(
        self,
        items: list[Any],
        step_start: int,
        step: list[Any],
        pinned: list[int],
        fixed: int,
        run: _Run,
    ) -> tuple[PackResult, ContextPlan | None]:
        b = self.builder
        if self.session is not None:
            result = run.index.pack(
                items,
                step,
                b.max_tokens,
                output_reserve=self.output_reserve,
                context_tokens=fixed,
                model=b.model,
                encoding=b.encoding,
                policy=b.policy,
                pinned=pinned,
                history_len=step_start,
                opaque_scale=b.opaque_scale(),
            )
            return result, None
        query = latest_user_text(step, items)  # the step holds no user message
        key = (query, b.scope)
        if run.pool is None or run.pool[0] != key:
            run.pool = (key, b._candidates(query, b.scope))
        plan = b._build(
            items,
            step,
            system_prompt=self.system_prompt,
            query=query,
            scope=b.scope,
            reserve=self.output_reserve,
            index=run.index,
            pinned=pinned,
            context_tokens=fixed,
            pool=run.pool[1],
            history_len=step_start,
        )
        return plan.pack, plan

    # ------------------------------------------------------------------ oversized outputs

    def _costs(self, items: Sequence[Any]) -> list[int]:
        return [item_tokens(x, encoding=self.builder.encoding).total for x in items]

    def _outputs(self, step: list[Any]) -> list[int]:
        """Indexes (in ``step``) of the tool outputs that may be cut."""
        return [
            i
            for i, x in enumerate(step)
            if isinstance(x, Mapping)
            and not _is_model_side(x)
            and "output" in x
            and str(x.get("type", "")).endswith("_output")
        ]

    @staticmethod
    def _tool_name(items: Sequence[Any], call_id: Any) -> str | None:
        if call_id is None:
            return None
        for x in reversed(items):
            if _is_model_side(x) and _field(x, "call_id") == call_id:
                name = _field(x, "name")
                return name if isinstance(name, str) else _field(x, "type")
        return None

    def _explained(
        self, exc: TokenBudgetExceededError, items: list[Any], step_start: int, fixed: int
    ) -> TokenBudgetExceededError:
        """The core's error with the part of the request that overflowed named, in
        allocation order: instructions and tools, output reserve, context message and run
        input (``new_input``), then the newest step (``tool_output`` names its largest
        output and the call it answers)."""
        if exc.section == "system_prompt":
            return exc
        step = items[step_start:]
        step_costs = self._costs(step)
        pinned_part = exc.used - sum(step_costs) - fixed - self.output_reserve
        budget = exc.budget
        if fixed > budget:
            return TokenBudgetExceededError(
                exc.used,
                budget,
                "instructions_and_tools",
                f"the agent's instructions and tool definitions alone need {fixed} tokens",
            )
        if fixed + self.output_reserve > budget:
            return TokenBudgetExceededError(exc.used, budget, "output_reserve")
        if fixed + self.output_reserve + pinned_part > budget:
            return TokenBudgetExceededError(
                exc.used,
                budget,
                "new_input",
                f"the context message and the run's input need {pinned_part} tokens",
            )
        outs = self._outputs(step)
        if not outs:
            return TokenBudgetExceededError(
                exc.used, budget, "step", f"the newest model output needs {sum(step_costs)} tokens"
            )
        big = max(outs, key=lambda i: step_costs[i])
        item = step[big]
        cid = _field(item, "call_id")
        name = self._tool_name(items, cid)
        detail = (
            f"{_field(item, 'type')} at input[{step_start + big}] for call {cid}"
            f"{' (' + name + ')' if name else ''} needs {step_costs[big]} tokens"
            + (
                "; oversized_output='truncate' sends a cut copy"
                if self.oversized_output == "error"
                else " and cannot be cut to fit"
            )
        )
        return TokenBudgetExceededError(exc.used, budget, "tool_output", detail)

    def _truncated_step(
        self,
        exc: TokenBudgetExceededError,
        items: list[Any],
        step_start: int,
        step: list[Any],
        fixed: int,
    ) -> tuple[list[Any], list[TruncatedOutput]]:
        outs = self._outputs(step)
        costs = self._costs(step)
        out_costs = [costs[i] for i in outs]
        room = exc.budget - (exc.used - sum(out_costs))
        cap = _water_level(out_costs, room) if outs else None
        if cap is None:
            raise self._explained(exc, items, step_start, fixed) from None
        new_step = list(step)
        cuts: list[TruncatedOutput] = []
        for i in outs:
            if costs[i] <= cap:
                continue
            cutter = _Cutter(step[i], self.builder.encoding)
            if not cutter.shrink_to(cap):
                raise self._explained(exc, items, step_start, fixed) from None
            new_step[i] = cutter.copy
            cid = _field(step[i], "call_id")
            cuts.append(
                TruncatedOutput(
                    position=step_start + i,
                    item_type=str(_field(step[i], "type")),
                    call_id=cid if isinstance(cid, str) else None,
                    tool=self._tool_name(items, cid),
                    original_tokens=costs[i],
                    sent_tokens=cutter.cost(),
                )
            )
        return new_step, cuts


def model_input_filter(
    builder: TokenBudgetedContextBuilder,
    *,
    oversized_output: OversizedOutput = "error",
    system_prompt: str = "",
    output_reserve: int | None = None,
    on_call: Callable[[ModelCallPlan], None] | None = None,
) -> ModelInputFilter:
    """A ``call_model_input_filter`` for runs without a :class:`ProtoPromptSession`.

    For users who keep the history themselves (``result.to_input_list()`` plus the next user
    message as the input of each run): every model call is packed into ``builder``'s budget
    — instructions and tool definitions included — with the builder's recalled memory
    (profile, facts, documents for the latest user message) in a context message in front.
    Mandatory on each call: that context's ``system_prompt``, the latest user message (the
    run's input) and the newest step; older history and earlier steps are filled newest first.
    Nothing the filter returns is stored anywhere.

    Example::

        run_config = RunConfig(call_model_input_filter=model_input_filter(builder))
        result = await Runner.run(agent, history + [{"role": "user", "content": q}],
                                  run_config=run_config)
        history = result.to_input_list()
    """
    return ModelInputFilter(
        builder,
        oversized_output=oversized_output,
        session=None,
        system_prompt=system_prompt,
        output_reserve=output_reserve,
        on_call=on_call,
    )
