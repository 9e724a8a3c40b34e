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
:mod:`protoprompt.integrations._calls._request`). A stored ``prompt`` template is expanded by the
server and cannot be counted here: the plan says so (:attr:`ModelCallPlan.not_counted`).

With ``cache=pp.CachePolicy()`` (a session's filter), each call's request is the previous
call's plus what was appended while that fits, and a move to the policy's low-water mark when
it does not, so the provider's prompt cache repeats the prefix (see
:mod:`protoprompt.integrations._calls._planner` and ``docs/prompt-cache.md``); the plan says how
(``ModelCallPlan.prefix``, ``prefix_reason``, ``shared_tokens``).

Speed, and what is never trusted: within a run (the SDK's agent span identifies it; see
:mod:`protoprompt.integrations._calls._runs`) the filter keeps a :class:`~protoprompt.HistoryIndex`
of the input it has packed, so a call classifies and counts only what is new. A call reads
what the SDK appended since the run's previous call and a rotating sample of the rest (a
keyed content digest, far cheaper than counting; ``ModelCallPlan.checked`` says how many
items); when a sampled item changed, or the list got shorter, it reads the whole input and
reuses an earlier classification or cost only for items whose content is unchanged (why a
sample suffices for the lists the SDK builds: :class:`._calls._planner.InputLedger`). A call that
cannot be attributed to a run is packed from scratch. The list packed is the list the SDK
will send: its de-duplication of reused ids is applied first. When that changes the list, a
later call reads the collapsed copy only from a margin before where its previous call's pack
reached (``history_offset``: the core packs from there exactly as from the whole list, or
names the first earlier item it needs, and then the whole list is read).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from ..context import ContextPlan, TokenBudgetedContextBuilder, latest_user_text
from ..errors import InvalidItemError, TokenBudgetExceededError
from ..packing import HistoryIndex, Masking, PackResult
from ..plan import CallLayout
from ..prefix import CachePolicy
from ._calls import _planner
from ._calls._call_plan import ModelCallPlan, TruncatedOutput
from ._calls._oversized import cut_outputs, explained, step_costs, tool_outputs
from ._calls._request import TOOLS_OVERHEAD, RequestCosts, RequestExtras, tool_definitions
from ._calls._runs import Collapsed, Run, run_span
from ._calls._steps import last_user_message, newest_step_start, water_level
from ._sdk._names import CallModelData, ModelInputData
from ._stores import _prefix_state
from ._turns._context import context_key

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

MAX_RUNS = 64
"""Runs whose state a filter keeps between their model calls (most recent first)."""
MAX_RUN_STATE_BYTES = 64 * 2**20
"""Bytes of run state (indexes, digests) a filter keeps between calls; older runs start
afresh."""

_FIT_ATTEMPTS = 4
"""Cuts tried for an oversized newest step (each retries with the room the last one missed)."""

WINDOW_MARGIN = 64
"""Items before the previous call's reach where a call's read of a collapsed list starts
(what a call may keep beyond its previous call's reach without reading the whole list)."""


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
        cache: CachePolicy | None = None,
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
        if cache is not None and not isinstance(cache, CachePolicy):
            raise TypeError(f"cache must be a CachePolicy or None, got {type(cache).__name__}")
        self.builder = builder
        self.oversized_output: OversizedOutput = oversized_output
        self.output_reserve = builder.output_reserve if output_reserve is None else output_reserve
        self.session = session
        # The session callback's record of each run: its context message and new input.
        self._ledger = session.run_ledger if session is not None else None
        self.system_prompt = system_prompt
        self.on_call = on_call
        self.last_plan: ModelCallPlan | None = None
        """The plan of the latest model call (any run); ``None`` before the first and while
        a call is being packed. Plans you keep yourself (``on_call``) share the run index's
        item graph, so the next call of that run copies it: keep what you need from them."""
        self._runs: OrderedDict[int, Run] = OrderedDict()  # runs between two calls
        self._lock = threading.Lock()
        self._request = RequestCosts()
        self._own_last: _planner.RunPrefix | None = None
        self.cache = cache
        """The run's cache-stable prefix (``None``: every call packed newest first); used
        by a session's filter (see :mod:`protoprompt.integrations._calls._planner`)."""

    @property
    def _last(self) -> _planner.RunPrefix | None:
        """The session's latest request through the prefix (the next run resumes it): kept
        by the session's run ledger, where its callback reads it too (a turn whose own
        request no longer fits continues this one: ``_planner.adopt``), else by the filter."""
        ledger = self._ledger
        return ledger.latest if ledger is not None else self._own_last

    @_last.setter
    def _last(self, value: _planner.RunPrefix | None) -> None:
        if self._ledger is not None:
            self._ledger.latest = value
        else:
            self._own_last = value

    def reset(self) -> None:
        """Forget every run's state (the next call classifies its input afresh)."""
        with self._lock:
            self._runs.clear()

    def _claim(self, span: Any, agent: Any, token: Any) -> Run:
        """The state of the run whose next call this is, or a new one.

        A run is the SDK's agent span of the call (see :mod:`._calls._runs`), the same agent and,
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
        token = self._ledger.current() if self._ledger is not None else None
        run = self._claim(run_span(), data.agent, token)  # a failed call puts no state back

        # The session callback's plan of this run (set before the run's first call).
        turn = token.turn if token is not None else None

        def work() -> ModelCallPlan:
            return self._plan(items, run, extras, turn)

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
            located = self._ledger.locate(items) if self._ledger is not None else None
            if located is None:
                u = last_user_message(items, lo)
                located = (u, u + 1) if u is not None else None
            run.run_input = located
        if located is not None:
            a, b = located
            pinned.extend(p for p in range(a, b) if p not in pinned)
            lo = max(lo, b)
        recall = self._ledger.recall_at(items) if self._ledger is not None else None
        if recall is not None and recall not in pinned:
            pinned = sorted([*pinned, recall])  # the callback's recall message
        if extends:
            start = run.n_prev if len(items) > run.n_prev else run.step_start
            return pinned, max(start, lo)
        return pinned, newest_step_start(items, lo)

    def _is_context(self, items: list[Any]) -> bool:
        return bool(items) and self._ledger is not None and self._ledger.is_context(items[0])

    def _plan(
        self,
        items: list[Any],
        run: Run,
        extras: RequestExtras,
        turn_plan: ContextPlan | None = None,
    ) -> ModelCallPlan:
        observed, extends = run.observe(items)
        digests = observed.digests
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
            collapsed = run.collapse(items, digests)
            packed_digests = collapsed.digests
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
        offset = self._window(run, collapsed, pinned, step_start)
        if collapsed is not None:
            packed = collapsed.tail(offset)  # the collapsed list from the window on
        step = list(packed[step_start - offset :])
        truncated: list[TruncatedOutput] = []
        stable = None
        if self._stable_prefix(run, collapsed):
            stable = self._cached(packed, step_start, pinned, extras, run, extends)
        packed_len = len(collapsed) if collapsed is not None else len(items)
        layout_len = packed_len
        if stable is not None:
            result, context = stable.result, None
            step_start, layout_len = stable.step_start, len(stable.items)
            pinned = [p for p in stable.pinned if p < step_start]
        else:
            result, context, truncated = self._pack_call(
                items, (packed, offset, collapsed), step_start, step, pinned, extras, run
            )
            if self.cache is not None:
                run.prefix = None  # a call packed without the prefix: the next one moves
        run.reach = self._reach(result, pinned, step_start) if stable is None else None
        run.calls += 1
        run.n_prev = len(items)
        run.step_start = layout_start
        run.index_digests = packed_digests[: 16 * len(run.index)]
        sent = (
            [context.context_message] if context and context.context_message else []
        ) + result.items
        if stable is not None and stable.items is not packed:
            run_input = self._run_input_at(stable, context_at)
        layout = CallLayout((step_start, layout_len), run_input, context_at, len(truncated))
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
            max_tokens=self.builder.max_tokens,
            output_reserve=self.output_reserve,
            input_items=len(items),
            pinned=pinned,
            step=(step_start, layout_len),
            reused=reused,
            reuse=reason,
            pack=result,
            truncated=truncated,
            context=context,
            deduplicated=len(items) - packed_len,
            not_counted=extras.not_counted,
            context_position=context_at,
            run_input=run_input,
            prefix=stable.code if stable is not None else None,
            prefix_reason=stable.reason if stable is not None else "",
            shared_tokens=stable.shared_tokens if stable is not None else 0,
            request_changed=stable.request_changed if stable is not None else False,
            checked=observed.checked,
            turn_plan=turn_plan,
        )

    def _run_input_at(
        self, stable: _planner.Stable, context_at: int | None
    ) -> tuple[int, int] | None:
        """Where the run input is in a candidate, from its pinned positions (the callback's
        recall message pinned before it is not run input)."""
        run_input = _planner.run_input_at(stable.pinned, context_at)
        if run_input is not None and self._ledger is not None:
            a, b = run_input
            if a + 1 < b and self._ledger.is_context(stable.items[a]):
                return a + 1, b
        return run_input

    def _stable_prefix(self, run: Run, collapsed: Collapsed | None) -> bool:
        """Whether this call plans through the run's cache-stable prefix: a session's
        filter with a cache policy, in a run, on a list the SDK's de-duplication leaves as
        it is (otherwise packed newest first, and the next call moves)."""
        return (
            self.cache is not None
            and self.session is not None
            and run.span is not None
            and collapsed is None
        )

    def _cached(
        self,
        packed: list[Any],
        step_start: int,
        pinned: list[int],
        extras: RequestExtras,
        run: Run,
        extends: bool,
    ) -> _planner.Stable | None:
        """:meth:`_through_prefix`, with the session's previous request read from beside
        its history at a run's first call and the new one stored after each call (another
        process or worker continues it: see :mod:`._stores._prefix_state`)."""
        stored = _prefix_state.of(self.session)
        if stored is not None and not run.calls:
            self._last = stored.load() or self._last
        stable = self._through_prefix(packed, step_start, pinned, extras, run, extends)
        if stored is not None and stable is not None and self._last is not None:
            stored.save(self._last)
        return stable

    def _through_prefix(
        self,
        packed: list[Any],
        step_start: int,
        pinned: list[int],
        extras: RequestExtras,
        run: Run,
        extends: bool,
    ) -> _planner.Stable | None:
        """The call through the run's prefix (see :mod:`._calls._planner`): the previous request
        plus what was appended when it all fits, else a move to the low-water mark;
        ``None`` when neither applies (the mandatory part needs more than the low-water
        mark: packed newest first at the whole budget)."""
        assert self.cache is not None
        b = self.builder
        key = _planner.request_key(extras)
        known = run.token.copies if run.token is not None else None
        prefix = run.prefix if extends else None
        if prefix is None and not run.calls:
            # A run's first call: the session's previous request, when this input holds
            # it (the stored history grew by that run and this run's input since).
            prefix = _planner.resume(self._last, packed, self._is_context(packed))
            run.prefix = prefix
        if prefix is not None:
            cand, cstart = _planner.candidate(prefix, packed)
            # The newest step where the SDK's list has it (none on a resumed first call).
            cstart = max(cstart, cstart + step_start - prefix.source_len)
            placed = _planner.placed_pins(prefix, pinned)
            cpinned = [p for p in placed if p < cstart]
            prefix.sync(cand)
            result = self._fits_at(
                prefix.index, cand, cstart, cpinned, b.max_tokens, None, extras.total
            )
            if result is not None and _planner.kept_whole(result, cand):
                stayed = _planner.stay(prefix, result, placed, len(packed), key, run.calls + 1)
                self._last = prefix
                return _planner.Stable(result, cand, placed, cstart, *stayed)
        if prefix is None:
            # No request to extend: the whole input as it is, when it fits (the callback
            # packed it for this budget), else the move below.
            result = self._fits_at(
                run.index, packed, step_start, pinned, b.max_tokens, None, extras.total
            )
            if result is not None and _planner.kept_whole(result, packed):
                moved = _planner.move(None, result, pinned, packed, key, run.calls + 1, known)
                run.prefix = self._last = moved[0]
                return _planner.Stable(result, packed, pinned, step_start, *moved[1:])
        policy = self.cache
        low = max(int(b.max_tokens * policy.low_water), 1)
        masking = Masking(
            excerpt_tokens=policy.excerpt_tokens,
            after_turns=policy.keep_recent,
            omit_reasoning=policy.omit_reasoning,
        )
        if prefix is not None and policy.head_share > 0:
            headed = self._head_move(
                prefix, packed, step_start, pinned, low, masking, extras, run, key, known
            )
            if headed is not None:
                return headed
        result = self._fits_at(run.index, packed, step_start, pinned, low, masking, extras.total)
        if result is None:
            return None
        moved = _planner.move(run.prefix, result, pinned, packed, key, run.calls + 1, known)
        run.prefix = self._last = moved[0]
        return _planner.Stable(result, packed, pinned, step_start, *moved[1:])

    def _head_move(
        self,
        prefix: _planner.RunPrefix,
        packed: list[Any],
        step_start: int,
        pinned: list[int],
        low: int,
        masking: Masking,
        extras: RequestExtras,
        run: Run,
        key: tuple[Any, ...],
        known: Mapping[bytes, bytes] | None,
    ) -> _planner.Stable | None:
        """A move that keeps the previous request's head (``CachePolicy.head``): its
        items from its start, whole units as sent, pinned ahead of the SDK's items after the
        last one the head stands for, which are packed newest first to ``low`` (the middle
        is dropped: :func:`._calls._planner.head_candidate`); the attempts over heads and
        marks are :func:`._calls._planner.head_move`'s. ``None``: no head to keep, or none
        fits."""
        assert self.cache is not None
        b = self.builder
        lo = 1 if self._is_context(packed) else 0
        had_context = self._is_context(prefix.items)
        changed = key != prefix.key

        def attempt(
            limit: int, mark: int
        ) -> _planner.HeadPacked[tuple[PackResult, _planner.HeadCandidate]] | int | None:
            got = _planner.head_candidate(
                prefix, packed, pinned, step_start, lo, limit, b.encoding, known or {},
                context_key, had_context,
            )  # fmt: skip
            if got is None:
                return None
            cand, n = got.items, got.head
            pins = sorted({*got.pinned, *range(lo, n)})
            try:
                result = self._pack_at(
                    HistoryIndex(), cand, got.start, pins, mark, masking, extras.total
                )
            except TokenBudgetExceededError as exc:
                return max(exc.used - exc.max_tokens, 1)
            if not all(a is c for a, c in zip(result.items[:n], cand[:n], strict=False)):
                return 0
            return _planner.HeadPacked((result, got), result, n, None if changed else extras.total)

        moved = _planner.head_move(b.max_tokens, self.cache.head_share, [low], attempt)
        if moved is None:
            return None
        result, got = moved.value
        call = run.calls + 1
        new = _planner.move(prefix, result, got.pinned, got.items, key, call, known)[0]
        _planner.after_head_move(new, prefix, result, got, len(packed))
        reason = _planner.move_reason(
            call, prefix.cut, new.cut, prefix.request_tokens, result.request_tokens,
            len(result.masked),
        )  # fmt: skip
        reason += (
            f"; kept the head ({got.head - lo:,} items as sent, {moved.shared:,} tokens repeated)"
        )
        run.prefix = self._last = new
        stable = (moved.shared, "moved", reason, changed)
        return _planner.Stable(result, got.items, got.pinned, got.start, *stable)

    def _pack_at(
        self,
        index: HistoryIndex,
        items: list[Any],
        start: int,
        pinned: list[int],
        budget: int,
        masking: Masking | None,
        fixed: int,
        step: list[Any] | None = None,
        offset: int = 0,
    ) -> PackResult:
        """``items`` packed through ``index`` into ``budget``: ``step`` (default
        ``items[start:]``, the newest step) mandatory, ``pinned`` too, the rest newest
        first. ``offset``: ``items`` holds the list from that position on (``start`` and
        ``pinned`` are positions of the whole list)."""
        b = self.builder
        options = b.pack_options.replace(
            max_tokens=budget,
            output_reserve=self.output_reserve,
            context_tokens=fixed,
            pinned=pinned,
            history_len=start - offset,
            history_offset=offset,
            opaque_scale=b.opaque_scale(),
            masking=masking,
        )
        step = items[start - offset :] if step is None else step
        return index.pack(items, step, options=options)

    def _fits_at(
        self,
        index: HistoryIndex,
        items: list[Any],
        start: int,
        pinned: list[int],
        budget: int,
        masking: Masking | None,
        fixed: int,
    ) -> PackResult | None:
        """:meth:`_pack_at`, or ``None`` when its mandatory part does not fit."""
        try:
            return self._pack_at(index, items, start, pinned, budget, masking, fixed)
        except TokenBudgetExceededError:
            return None

    def _window(
        self, run: Run, collapsed: Collapsed | None, pinned: list[int], step_start: int
    ) -> int:
        """Where a call's read of a collapsed list starts (``history_offset``): a margin
        before where the previous call's pack reached, and never after a pinned item or the
        end of the index. The core packs from there exactly as from the whole list or
        raises :class:`~protoprompt.errors.InvalidItemError` for the first earlier item it
        needs (then the whole list is read: :meth:`_plan`). ``0`` (the whole list) without
        a collapsed list (the SDK's own list needs no copy), under the greedy policy, or
        when the previous pack's reach is unknown."""
        if collapsed is None or run.reach is None or self.builder.policy != "contiguous":
            return 0
        start = min(run.reach - WINDOW_MARGIN, step_start, len(run.index), *pinned)
        return max(start, 0)

    def _pack_call(
        self,
        items: list[Any],
        read: tuple[list[Any], int, Collapsed | None],
        step_start: int,
        step: list[Any],
        pinned: list[int],
        extras: RequestExtras,
        run: Run,
    ) -> tuple[PackResult, ContextPlan | None, list[TruncatedOutput]]:
        """:meth:`_pack` of the call's list (``read``: the list packed, the position it
        starts at and the collapsed list it is read from, if any; the whole collapsed list
        when the pack needs an item before that), with the newest step cut to fit
        (``oversized_output="truncate"``) or the overflow explained when the mandatory part
        does not fit (both over the whole list). ``items``: the SDK's list."""
        fixed = extras.total
        packed, offset, collapsed = read
        try:
            try:
                result, context = self._pack(
                    packed, step_start, step, pinned, fixed, run, offset, items
                )
            except InvalidItemError:
                if not offset or collapsed is None:
                    raise
                # The pack needs an item before the window: the whole list.
                result, context = self._pack(
                    collapsed.items, step_start, step, pinned, fixed, run, 0, items
                )
        except TokenBudgetExceededError as exc:
            whole = items if collapsed is None else collapsed.items
            if self.oversized_output != "truncate":
                raise self._explained(exc, whole, step_start, fixed) from None
            return self._fit_step(exc, whole, step_start, pinned, extras, run)
        return result, context, []

    @staticmethod
    def _reach(result: PackResult, pinned: list[int], step_start: int) -> int:
        """The oldest history position ``result`` kept or stopped its fill at."""
        reach = min([step_start, *pinned, *result.kept_history, *result.dependency])
        if result.stop is not None and result.stop.positions:
            reach = min(reach, *result.stop.positions)
        return reach

    def _pack(
        self,
        items: list[Any],
        step_start: int,
        step: list[Any],
        pinned: list[int],
        fixed: int,
        run: Run,
        offset: int = 0,
        sdk_items: list[Any] | None = None,
    ) -> tuple[PackResult, ContextPlan | None]:
        """Pack ``step`` after the history ``items`` holds from position ``offset`` on (up
        to ``step_start``); ``sdk_items``: the SDK's list (whose messages the collapsed
        ``items`` keep as they are) for the query of the standalone filter's recall."""
        b = self.builder
        if self.session is not None:
            result = self._pack_at(
                run.index, items, step_start, pinned, b.max_tokens, b.masking, fixed, step,
                offset,
            )  # fmt: skip
            return result, None
        # The step holds no user message; de-duplication never removes a message, so the
        # SDK's list has the collapsed list's messages in the same order.
        query = latest_user_text(step, items if sdk_items is None else sdk_items)
        key = (query, b.scope)
        if run.candidates is None or run.candidates[0] != key:
            run.candidates = (key, b._candidates(query, b.scope))
        plan = b._build(
            items,
            step,
            system_prompt=self.system_prompt,
            query=query,
            scope=b.scope,
            index=run.index,
            pool=run.candidates[1],
            options=b._call_options(
                output_reserve=self.output_reserve,
                pinned=pinned,
                context_tokens=fixed,
                history_len=step_start - offset,
                history_offset=offset,
            ),
        )
        return plan.pack, plan

    # ------------------------------------------------------------------ oversized outputs

    def _explained(
        self, exc: TokenBudgetExceededError, items: list[Any], step_start: int, fixed: int
    ) -> TokenBudgetExceededError:
        """The core's error with the part of the request that overflowed named (see
        ``_oversized.explained``)."""
        return explained(
            exc,
            items,
            step_start,
            fixed,
            self.output_reserve,
            self.builder.encoding,
            self.oversized_output != "error",
        )

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
        outs = tool_outputs(step)
        costs = step_costs(step, self.builder.encoding)
        out_costs = [costs[i] for i in outs]
        used = exc.used + (self._context_floor() if exc.section != "system_prompt" else 0)
        room = exc.max_tokens - (used - sum(out_costs))
        for _ in range(_FIT_ATTEMPTS):
            cap = water_level(out_costs, room) if outs else None
            if cap is None:
                break
            cut = cut_outputs(items, step_start, step, outs, costs, cap, self.builder.encoding)
            if cut is None:
                break
            new_step, truncated = cut
            try:
                result, context = self._pack(items, step_start, new_step, pinned, fixed, run)
            except TokenBudgetExceededError as again:
                over = again.used - again.max_tokens
                if again.section != "system_prompt":
                    over += self._context_floor()
                room -= max(over, 1)
                continue
            return result, context, truncated
        raise self._explained(exc, items, step_start, fixed) from None


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
