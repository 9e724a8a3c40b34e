"""Per-call budgets: a ``call_model_input_filter`` that fits every model call of a run.

The SDK calls ``session_input_callback`` once per run. Inside the run it appends each model
output and each tool output to the input and calls the model again; only
``RunConfig.call_model_input_filter`` sees those later requests. :class:`ModelInputFilter`
keeps every one of them within the builder's budget, for the *whole* request::

    input items + instructions + tool definitions + output schema + output_reserve
        <= max_tokens

What is mandatory on a call (reserved all or nothing, in this order): the instructions,
tool definitions and output schema, the output reserve, the context message the session
callback produced, the run's own new input, and the *newest step* — the model output that
ended the previous call and the tool outputs answering it (with the reasoning and calls they
complete).
Everything else is optional and filled newest first as atomic units by the Rust core under
the same item-graph rules as the session callback: first the run's earlier steps (newest
first), then the history the callback kept. Under ``policy="contiguous"`` the kept part is
an unbroken newest suffix, so once an earlier step does not fit, nothing older is sent;
``policy="greedy"`` skips it and keeps older whole turns that fit. A long run therefore
loses its *middle* steps first, never its input or its newest step.

With the builder's ``masking`` (``Masking()`` by default; see ``docs/masking.md``) the middle
steps are masked before any is dropped: the run's steps are kept, as far back as they fit
with their tool outputs cut to short excerpts, and the newest of them whole as far as the
room left allows. So a long tool loop keeps every call and its arguments in every request
while its masked steps fit, and drops the oldest only when they no longer do. The context
message, the run's input and the newest step are mandatory, never masked; the masked copies
are new objects, sent and never stored. Masked copies the session
callback already put in the input are too short to be masked again and are sent as they are.
The run's index keeps each step's masked cost and excerpt between calls, so each step is
masked at most once per run. ``ModelCallPlan.pack`` reports what was masked
(``pack.masked``, ``pack.masking_saved``, decisions ``"masked"``), and ``explain()`` lists it.

When the mandatory part does not fit, ``oversized_output="error"`` raises
:class:`~protoprompt.errors.TokenBudgetExceededError` (``section="tool_output"``, the
``detail`` names the output and its call) before anything is sent;
``oversized_output="truncate"`` cuts the model-facing copies of the newest step's tool
outputs to the room left (by the core's ``fit_output``: media parts become markers when even
cut text cannot make room, an output of many parts loses its middle parts to one marker
part, texts are cut token-exact, head and tail kept around a marker that says how many
tokens were removed). The stored items are never changed: nothing a filter returns is
persisted by the SDK.

What the request costs besides its items: the agent's instructions, the definitions of its
tools of every kind (function, hosted, MCP, handoffs) and its structured-output schema
(Responses ``text.format``), rendered on every call by the SDK's own converters (see
:mod:`protoprompt.integrations._request`). A stored ``prompt`` template is expanded by the
server and cannot be counted here: the plan says so (:attr:`ModelCallPlan.not_counted`).

Speed, and what is never trusted: within a run (the SDK's agent span identifies it; see
:mod:`protoprompt.integrations._runs`) the filter keeps a :class:`~protoprompt.HistoryIndex`
of the input it has packed, so a call classifies and counts only what is new. Every call
digests its whole input first (a keyed hash of the content, far cheaper than counting) and
reuses an earlier classification or cost only for items whose content is unchanged. A call
that cannot be attributed to a run is packed from scratch. The list packed is the list the SDK
will send: its de-duplication of reused ids is applied first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from .. import _core
from ..context import ContextPlan, TokenBudgetedContextBuilder, latest_user_text
from ..errors import TokenBudgetExceededError
from ..packing import PackResult, UnitDecision, item_tokens
from ..plan import CallLayout, RequestCost, RequestSections, input_at, request_sections
from ._request import TOOLS_OVERHEAD, RequestCosts, RequestExtras, tool_definitions
from ._runs import Collapsed, Run, collapse_groups, run_span
from ._sdk import CallModelData, ModelInputData

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

MAX_RUNS = 64
"""Runs whose state a filter keeps between their model calls (most recent first)."""
MAX_RUN_STATE_BYTES = 64 * 2**20
"""Bytes of run state (indexes, digests) a filter keeps between calls; older runs start
afresh."""

_FIT_ATTEMPTS = 4
"""Cuts tried for an oversized newest step (each retries with the room the last one missed)."""


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
    parts_removed: int = 0
    """Parts of a many-part output replaced by one marker part."""
    media_removed: int = 0
    """Images, files or audio replaced by a text marker."""


@dataclass(frozen=True)
class ModelCallPlan:
    """What :class:`ModelInputFilter` did for one model call."""

    call: int
    """1 for the first model call of a run (as seen by this filter), 2 for the next…"""
    items: list[Any]
    """The input items sent (the SDK's objects; truncated copies where cut, masked copies of
    the tool outputs of steps kept masked)."""
    instructions_tokens: int
    """Cost of the agent's instructions (counted like a system message)."""
    tools_tokens: int
    """Cost of the tool definitions sent with the call (:func:`tool_definitions`)."""
    output_schema_tokens: int
    """Cost of the structured-output schema sent with the call (Responses ``text.format``,
    for an agent with an ``output_type``; 0 for plain text)."""
    budget: int
    output_reserve: int
    input_items: int
    """Length of the input list the SDK handed over."""
    pinned: list[int]
    """Positions of the mandatory context message and run input (in the list packed: the
    SDK's list, after its de-duplication when :attr:`deduplicated` is non-zero)."""
    step: tuple[int, int]
    """``[start, end)`` positions of the newest step (mandatory); empty on a first call."""
    reused: int
    """Items whose classification and cost came from the run's index (content verified);
    the rest were read and counted for this call."""
    reuse: str
    """Why the run's index was or was not (fully) reused."""
    pack: PackResult
    """The core's packing: decisions for every unit of the optional part (``"masked"`` for a
    step sent with its tool outputs masked; ``pack.masked``, ``pack.masking_saved``)."""
    truncated: list[TruncatedOutput] = field(default_factory=list)
    context: ContextPlan | None = None
    """Standalone filter: the builder's plan, with the recalled context message."""
    deduplicated: int = 0
    """Items the SDK's de-duplication collapses (ids reused across responses): the list was
    packed as the SDK sends it, without them."""
    not_counted: tuple[str, ...] = ()
    """What the call sends that cannot be counted here (a stored prompt template)."""
    context_position: int | None = None
    """Position of the session callback's context message in the list packed (``None``:
    none there; the standalone filter's context message is :attr:`context`'s, in front)."""
    run_input: tuple[int, int] | None = None
    """``[start, end)`` positions of the run's input in the list packed (``None``: no run
    input was found, e.g. a run whose input holds no user message)."""

    @property
    def sections(self) -> RequestSections:
        """The request by section (see :mod:`protoprompt.plan`), adding up to :attr:`used`:
        the agent's instructions, tools and output schema, the context message, the run
        input, the newest step, the run's earlier steps, the history kept from before the
        run, and the output reserve."""
        context = None
        if self.context is not None:  # the standalone filter's message, in front
            message = self.context.context_message
            context = (self.context.context_tokens, 1 if message is not None else 0)
        return request_sections(
            self.pack,
            request=RequestCost(
                self.instructions_tokens,
                self.tools_tokens,
                self.output_schema_tokens,
                self.not_counted,
            ),
            reserved=self.instructions_tokens + self.tools_tokens + self.output_schema_tokens,
            context=context,
            call=self.layout,
        )

    @property
    def layout(self) -> CallLayout:
        """Where the call's parts are in the list packed (:class:`~protoprompt.plan.\
CallLayout`)."""
        return CallLayout(self.step, self.run_input, self.context_position, len(self.truncated))

    @property
    def items_tokens(self) -> int:
        """Tokens of the input items sent (context message included)."""
        return (
            self.pack.request_tokens
            - self.instructions_tokens
            - self.tools_tokens
            - self.output_schema_tokens
        )

    @property
    def request_tokens(self) -> int:
        """Items + instructions + tools + output schema: the whole request."""
        return self.pack.request_tokens

    @property
    def used(self) -> int:
        """The whole request plus the output reserve (``<= budget``)."""
        return self.pack.used

    @property
    def dropped(self) -> list[UnitDecision]:
        """Units of the input that were not sent."""
        return self.pack.dropped

    def to_html(self) -> str:
        """The call as one self-contained HTML page: a bar of the budget by section and the
        units of its input as kept / masked / dropped with their reasons on hover. A run's
        calls on one page: :func:`protoprompt.plans_to_html` (``on_call``'s plans)."""
        from ..plan_html import plans_to_html

        return plans_to_html(self)

    def explain(self, max_units: int | None = 20) -> str:
        """A readable account of the call: the request by section (:attr:`sections`), what
        the run's index reused, the cut tool outputs, then the masked and dropped units
        (positions ``input[i]`` in the SDK's input list) with their reasons."""
        sent = len(self.items) - (
            1 if self.context is not None and self.context.context_message is not None else 0
        )
        lines = [
            f"model call {self.call} of the run: {sent} of {self.input_items} input items sent"
            + (
                ", plus the context message"
                if self.context is not None and self.context.context_message is not None
                else ""
            )
        ]
        lines += self.sections.lines()
        lines.extend(f"not counted: {note}" for note in self.not_counted)
        lines.append(f"index: {self.reused} of {self.input_items} items reused ({self.reuse})")
        if self.deduplicated:
            lines.append(
                f"{self.deduplicated} items collapsed by the SDK's de-duplication (reused "
                "ids): packed as sent"
            )
        lines.extend(
            f"truncated {t.item_type} at input[{t.position}] (call {t.call_id}"
            f"{', ' + t.tool if t.tool else ''}): {t.original_tokens:,} -> "
            f"{t.sent_tokens:,} tokens"
            + (f", {t.parts_removed} parts removed" if t.parts_removed else "")
            + (f", {t.media_removed} media parts removed" if t.media_removed else "")
            for t in self.truncated
        )
        lines.extend(self.pack.explain_units(max_units, where=input_at))
        return "\n".join(lines)


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
        self._runs: OrderedDict[int, Run] = OrderedDict()  # runs between two calls
        self._lock = threading.Lock()
        self._request = RequestCosts()

    def reset(self) -> None:
        """Forget every run's state (the next call classifies its input afresh)."""
        with self._lock:
            self._runs.clear()

    def _claim(self, span: Any, agent: Any, token: Any) -> Run:
        """The state of the run whose next call this is, or a new one.

        A run is the SDK's agent span of the call (see :mod:`._runs`), the same agent and,
        with a session, the same callback record. A call without a span in scope gets a state
        of its own, never kept: it is packed from scratch."""
        if span is not None:
            with self._lock:
                run = self._runs.pop(id(span), None)
            if run is not None and run.span is span and run.agent is agent and run.token is token:
                return run
        return Run(agent, token, span)

    def _release(self, run: Run) -> None:
        if run.span is None:
            return
        with self._lock:
            self._runs[id(run.span)] = run
            total = 0
            for key in reversed(list(self._runs)):
                total += self._runs[key].nbytes
                if total > MAX_RUN_STATE_BYTES or len(self._runs) > MAX_RUNS:
                    del self._runs[key]

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        model_data = data.model_data
        items = model_data.input
        if not isinstance(items, list):
            raise TypeError(f"model input must be a list, got {type(items).__name__}")
        instructions = model_data.instructions
        extras = await self._request.extras(
            data.agent, data.context, instructions, self.builder.encoding
        )
        token = self.session._current_run() if self.session is not None else None
        run = self._claim(run_span(), data.agent, token)  # a failed call puts no state back

        def work() -> ModelCallPlan:
            return self._plan(items, run, extras)

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

    def _layout(self, items: list[Any], run: Run, extends: bool) -> tuple[list[int], int]:
        """Pinned positions (context message, run input) and the newest step's start, in
        ``items`` (the SDK's list). ``extends``: the previous call's input is an unchanged
        prefix of ``items`` (its layout holds); otherwise it is found afresh."""
        pinned: list[int] = []
        lo = 0
        if self._is_context(items):
            pinned.append(0)
            lo = 1
        if extends:
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
        if extends:
            start = run.n_prev if len(items) > run.n_prev else run.step_start
            return pinned, max(start, lo)
        return pinned, _newest_step_start(items, lo)

    def _is_context(self, items: list[Any]) -> bool:
        return bool(items) and self.session is not None and self.session._is_own_context(items[0])

    def _plan(self, items: list[Any], run: Run, extras: RequestExtras) -> ModelCallPlan:
        digests, extends = run.observe(items)
        pinned, step_start = self._layout(items, run, extends)
        if not run.calls:
            reason = "first call of the run" if run.span is not None else "no run in scope"
        elif not extends:
            reason = "the input is not the previous call's input plus new steps"
        else:
            reason = "the run's earlier calls"
        layout_start = step_start
        packed, packed_digests = items, digests
        collapsed: Collapsed | None = None
        context_at = 0 if self._is_context(items) else None
        run_input = run.run_input
        if run.groups:
            collapsed = collapse_groups(items, run.groups, digests)
            packed, packed_digests = collapsed.items, collapsed.digests
            step_start = collapsed.start(layout_start)
            moved = {collapsed.position(p) for p in pinned}
            pinned = sorted(p for p in moved if p < step_start)
            if run_input is not None:
                run_input = (collapsed.start(run_input[0]), collapsed.start(run_input[1]))
        indexed = len(run.index)
        run.sync_index(packed_digests)
        reused = len(run.index)
        if reused < indexed:
            reason = f"item {reused} changed since the previous call: the index was cut back to it"
        step = list(packed[step_start:])
        truncated: list[TruncatedOutput] = []
        try:
            result, context = self._pack(packed, step_start, step, pinned, extras.total, run)
        except TokenBudgetExceededError as exc:
            if self.oversized_output != "truncate":
                raise self._explained(exc, packed, step_start, extras.total) from None
            result, context, truncated = self._fit_step(
                exc, packed, step_start, pinned, extras, run
            )
        run.calls += 1
        run.n_prev = len(items)
        run.step_start = layout_start
        run.digests = digests
        run.index_digests = packed_digests[: 16 * len(run.index)]
        sent = (
            [context.context_message] if context and context.context_message else []
        ) + result.items
        layout = CallLayout((step_start, len(packed)), run_input, context_at, len(truncated))
        if context is not None:
            # The builder's plan of this call, with where its parts are (same sections).
            framed = dataclasses.replace(context, layout=layout, request=extras)
            if self.builder.last_plan is context:
                self.builder.last_plan = framed
            context = framed
        return ModelCallPlan(
            call=run.calls,
            items=sent,
            instructions_tokens=extras.instructions,
            tools_tokens=extras.tools,
            output_schema_tokens=extras.output_schema,
            budget=self.builder.max_tokens,
            output_reserve=self.output_reserve,
            input_items=len(items),
            pinned=pinned,
            step=(step_start, len(packed)),
            reused=reused,
            reuse=reason,
            pack=result,
            truncated=truncated,
            context=context,
            deduplicated=len(items) - len(packed),
            not_counted=extras.not_counted,
            context_position=context_at,
            run_input=run_input,
        )

    def _pack(
        self,
        items: list[Any],
        step_start: int,
        step: list[Any],
        pinned: list[int],
        fixed: int,
        run: Run,
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
                masking=b.masking,
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
            masking=b.masking,
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
                f"the agent's instructions, tool definitions and output schema alone need "
                f"{fixed} tokens",
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

    def _context_floor(self) -> int:
        """What the standalone filter's context message costs at least: its system prompt
        (mandatory; the core reserves it after the items, so an overflow of the items does
        not include it)."""
        if self.session is not None or not self.system_prompt:
            return 0
        return self.builder._cost(self.system_prompt)

    def _fit_step(
        self,
        exc: TokenBudgetExceededError,
        items: list[Any],
        step_start: int,
        pinned: list[int],
        extras: RequestExtras,
        run: Run,
    ) -> tuple[PackResult, ContextPlan | None, list[TruncatedOutput]]:
        """Pack with the newest step's outputs cut to the room the rest of the mandatory part
        leaves them (shared by a water level); retried with less room if a cut copy's cost
        still overflows. Raises the explained error when they cannot be cut to fit."""
        fixed = extras.total
        step = items[step_start:]
        outs = self._outputs(step)
        costs = self._costs(step)
        out_costs = [costs[i] for i in outs]
        used = exc.used + (self._context_floor() if exc.section != "system_prompt" else 0)
        room = exc.budget - (used - sum(out_costs))
        for _ in range(_FIT_ATTEMPTS):
            cap = _water_level(out_costs, room) if outs else None
            if cap is None:
                break
            cut = self._cut_outputs(items, step_start, step, outs, costs, cap)
            if cut is None:
                break
            new_step, truncated = cut
            try:
                result, context = self._pack(items, step_start, new_step, pinned, fixed, run)
            except TokenBudgetExceededError as again:
                over = again.used - again.budget
                if again.section != "system_prompt":
                    over += self._context_floor()
                room -= max(over, 1)
                continue
            return result, context, truncated
        raise self._explained(exc, items, step_start, fixed) from None

    def _cut_outputs(
        self,
        items: list[Any],
        step_start: int,
        step: list[Any],
        outs: list[int],
        costs: list[int],
        cap: int,
    ) -> tuple[list[Any], list[TruncatedOutput]] | None:
        """The step with every output over ``cap`` tokens cut to it (``None``: one cannot
        be)."""
        new_step = list(step)
        cuts: list[TruncatedOutput] = []
        for i in outs:
            if costs[i] <= cap:
                continue
            fit = _core.fit_output(step[i], cap, encoding=self.builder.encoding)
            if fit is None:
                return None
            copy, tokens, parts_removed, media_removed = fit
            new_step[i] = copy
            cid = _field(step[i], "call_id")
            cuts.append(
                TruncatedOutput(
                    position=step_start + i,
                    item_type=str(_field(step[i], "type")),
                    call_id=cid if isinstance(cid, str) else None,
                    tool=self._tool_name(items, cid),
                    original_tokens=costs[i],
                    sent_tokens=tokens,
                    parts_removed=parts_removed,
                    media_removed=media_removed,
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
    run's input) and the newest step; older history and earlier steps are filled newest first
    (with ``builder.masking``, the default, earlier steps are masked before any is dropped).
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
