"""The provider's own input-token count next to protoprompt's estimate, per model call.

protoprompt's budget is an estimate (``docs/cost-model.md``): conservative for text, by
decoded size for opaque payloads. The provider reports what it counted for each model call
(``usage.input_tokens``), which the SDK hands to ``RunHooks.on_llm_end`` and keeps on
``RunResult.raw_responses``. :class:`BudgetAudit` pairs each call's plan from the per-call
model filter (:class:`~protoprompt.integrations.ModelCallPlan`, via the filter's ``on_call``)
with that number::

    audit = BudgetAudit()
    config = session.run_config(builder, audit=audit)   # the filter reports every call's plan
    result = await Runner.run(agent, question, session=session, run_config=config,
                              hooks=audit)              # the SDK reports every call's usage
    print(audit.summary().explain())

``hooks=audit`` pairs each call as it ends (also for concurrent runs sharing the audit);
a :class:`RunHooks` of your own goes in as ``BudgetAudit(hooks=yours)`` and sees every event
as before. Without hooks, ``audit.add_result(result)`` right after a run pairs that run's
responses with its calls. A call for which the provider counted more than the estimate emits a
:class:`~protoprompt.errors.BudgetUnderestimateWarning` (the budget was not conservative).
When the filter's builder has a :class:`~protoprompt.Calibration`, every paired call also
teaches it: the factor of opaque payloads, or under an estimate encoding (Claude's
``claude_estimate``) the factor of every item's cost, so that the next call's plan is made
with what the provider counted.

Pairing: the filter's ``on_call`` runs in the model call's own task, right before the SDK's
``on_llm_start`` for that call; the plan is found again there (by that task's context, else
by the identity of the items sent) and the call is paired with the ``on_llm_end`` of the same
run context.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import itertools
import logging
import threading
import warnings
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import _core
from .._tokens import ESTIMATED_ENCODINGS
from ..calibration import Calibration
from ..errors import BudgetUnderestimateWarning
from ..packing import item_tokens
from ._sdk._names import RunHooksBase

if TYPE_CHECKING:
    from ..context import TokenBudgetedContextBuilder
    from .model_filter import ModelCallPlan

__all__ = ["AuditSummary", "AuditedCall", "BudgetAudit"]

_log = logging.getLogger("protoprompt")

_OPAQUE_TYPES = frozenset({"reasoning", "compaction"})
_MAX_WAITING = 256
"""Plans kept while their model call has not started (older ones are forgotten)."""


@dataclass(frozen=True)
class AuditedCall:
    """One model call: protoprompt's estimate and, once known, the provider's count."""

    serial: int
    """Order in which the audit saw the call's plan (1, 2, …)."""
    call: int
    """The call's number within its run, as the model filter counts (1 for the first)."""
    model: str | None
    """The model: the builder's ``model`` (the calibration key), else the agent's."""
    estimate: int
    """Tokens of the request by protoprompt's cost model: items, instructions, tools (what
    the filter's plan counts as ``request_tokens``; the output reserve is not in it)."""
    opaque: int
    """Tokens of the opaque payloads sent, by the decoded-size rule (unscaled)."""
    opaque_scale: float
    """The calibration of the opaque part the estimate was made with (1.0: none)."""
    reported: int | None = None
    """``usage.input_tokens`` the provider reported for the call (``None``: not paired yet,
    or the provider reported none)."""
    agent: str | None = None
    expected_cached: int = 0
    """Tokens the plan says repeat the start of the session's previous request
    (:attr:`ModelCallPlan.shared_tokens`, with a cache policy): what the provider's prompt
    cache can bill as cached (it bills from 1,024 tokens, in 128-token steps)."""
    cached: int | None = None
    """``usage.input_tokens_details.cached_tokens`` the provider reported (``None``: not
    paired yet, or not reported)."""
    items: int = 0
    """Under an estimate encoding (``claude_estimate``): tokens of the items sent by the
    estimate before the calibration, which scales them (0 under any other encoding)."""
    scaled_items: int = 0
    """The same items as the plan counted them (calibration applied; part of
    :attr:`estimate`)."""

    @property
    def ratio(self) -> float | None:
        """``reported / estimate`` (below 1: the budget was conservative)."""
        if self.reported is None or self.estimate <= 0:
            return None
        return self.reported / self.estimate

    @property
    def underestimated(self) -> bool:
        """The provider counted more than the estimate."""
        return self.reported is not None and self.reported > self.estimate

    def explain(self) -> str:
        reported = "not reported" if self.reported is None else f"reported {self.reported}"
        ratio = "" if self.ratio is None else f" (x{self.ratio:.3f})"
        scale = "" if self.opaque_scale == 1.0 else f" at x{self.opaque_scale:g}"
        cache = ""
        if self.expected_cached or self.cached:
            got = "not reported" if self.cached is None else f"{self.cached}"
            cache = f"; cached {got} of {self.expected_cached} expected"
        part = (
            f"items {self.items}{scale} of the estimate"
            if self.items
            else f"opaque {self.opaque}{scale}"
        )
        return (
            f"call {self.serial} ({self.model or 'unknown model'}, run call {self.call}): "
            f"estimate {self.estimate} ({part}), {reported}{ratio}"
            + cache
            + ("  <- provider counted more" if self.underestimated else "")
        )


@dataclass(frozen=True)
class AuditSummary:
    """Totals over the calls an audit paired with a provider count."""

    calls: int
    """Calls whose plan the audit saw."""
    reported_calls: int
    """Of those, calls with a provider count."""
    estimate_tokens: int
    """Sum of the estimates of the reported calls."""
    reported_tokens: int
    """Sum of the provider's counts of those calls."""
    min_ratio: float | None
    max_ratio: float | None
    underestimated_calls: int
    """Calls where the provider counted more than the estimate."""
    expected_cached_tokens: int = 0
    """Sum over the reported calls of the tokens their plans expect the prompt cache to
    repeat (:attr:`AuditedCall.expected_cached`)."""
    cached_tokens: int = 0
    """Sum over the reported calls of the provider's ``cached_tokens``."""

    @property
    def ratio(self) -> float | None:
        """Reported over estimated tokens, over all reported calls."""
        if not self.estimate_tokens:
            return None
        return self.reported_tokens / self.estimate_tokens

    def explain(self) -> str:
        if not self.reported_calls:
            return f"budget audit: {self.calls} calls, none reported by the provider yet"
        line = (
            f"budget audit: {self.reported_calls} of {self.calls} calls reported; provider "
            f"counted {self.reported_tokens} of {self.estimate_tokens} estimated tokens "
            f"(x{self.ratio:.3f}, per call x{self.min_ratio:.3f}..x{self.max_ratio:.3f})"
        )
        if self.expected_cached_tokens or self.cached_tokens:
            line += (
                f"; prompt cache: {self.cached_tokens} tokens cached by the provider, "
                f"{self.expected_cached_tokens} expected"
            )
        if self.underestimated_calls:
            line += (
                f"; {self.underestimated_calls} calls counted MORE than estimated "
                "(the budget was not conservative for them)"
            )
        return line


class _Waiting:
    """A plan whose model call has not ended yet."""

    __slots__ = ("builder", "call", "ids", "serial")

    def __init__(
        self, call: AuditedCall, ids: frozenset[int], builder: TokenBudgetedContextBuilder | None
    ) -> None:
        self.call = call
        self.ids = ids
        self.builder = builder
        self.serial = call.serial


def _estimated_items(items: Sequence[Any], encoding: str, scale: float) -> tuple[int, int]:
    """Under an estimate encoding: the tokens of ``items`` by the estimate, and as the pack
    counted them (each item's whole cost scaled by ``scale``, rounded up)."""
    raw = scaled = 0
    for item in items:
        try:
            n = item_tokens(item, encoding=encoding).total
        except Exception:  # noqa: BLE001 - the pack counted it; an audit never fails a call
            continue
        raw += n
        scaled += _core.scale_opaque(n, scale)
    return raw, scaled


def _opaque_tokens(items: Sequence[Any], encoding: str) -> int:
    total = 0
    for item in items:
        if isinstance(item, Mapping) and item.get("type") in _OPAQUE_TYPES:
            try:
                total += item_tokens(item, encoding=encoding).opaque
            except Exception:  # noqa: BLE001 - the pack counted it; an audit never fails a call
                continue
    return total


def _reported_input(response: Any) -> int | None:
    """The input tokens the provider reported for one model response, if it did."""
    usage = getattr(response, "usage", None)
    if usage is None:
        return None
    entries: list[int] = []
    for entry in getattr(usage, "request_usage_entries", None) or ():
        n = getattr(entry, "input_tokens", None)
        if isinstance(n, int) and n > 0:
            entries.append(n)
    if entries:
        return max(entries)  # retries add zero entries; a folded response: its largest
    total = getattr(usage, "input_tokens", None)
    return total if isinstance(total, int) and total > 0 else None


def _reported_cached(response: Any) -> int | None:
    """``usage.input_tokens_details.cached_tokens`` of one model response, if reported."""
    details = getattr(getattr(response, "usage", None), "input_tokens_details", None)
    n = getattr(details, "cached_tokens", None)
    return n if isinstance(n, int) and n >= 0 else None


def _run_block(waiting: list[_Waiting], n: int) -> list[_Waiting]:
    """The newest ``n`` consecutive waiting calls that form whole runs (see
    :meth:`BudgetAudit.add_result`), or none."""
    if n <= 0:
        return []
    for start in reversed(range(len(waiting) - n + 1)):
        block = waiting[start : start + n]
        numbers = [w.call.call for w in block]
        if numbers[0] != 1 or any(b not in (1, a + 1) for a, b in itertools.pairwise(numbers)):
            continue
        end = start + n
        if end < len(waiting) and waiting[end].call.call != 1:
            continue
        return block
    return []


def _model_name(agent: Any) -> str | None:
    model = getattr(agent, "model", None)
    if isinstance(model, str):
        return model
    name = getattr(model, "model", None)
    return name if isinstance(name, str) else None


class BudgetAudit(RunHooksBase[Any, Any]):
    """Pairs each model call's estimate with the provider's ``usage.input_tokens``.

    Use it as ``hooks=`` of ``Runner.run`` / ``run_streamed`` with a model filter that
    reports to it (``session.run_config(builder, audit=audit)``, or
    ``on_call=audit.observer(builder)`` on any :class:`ModelInputFilter`), or pair a finished
    run afterwards with :meth:`add_result`. See the module notes.

    Args:
        hooks: your own ``RunHooks``; every hook is called on it as if it were passed itself
            (its ``on_llm_start`` / ``on_llm_end`` first, then the audit's).
        warn: emit :class:`~protoprompt.errors.BudgetUnderestimateWarning` (and log a
            warning) for a call the provider counted more than the estimate.
        max_calls: most calls kept (the oldest are forgotten; the summary covers those
            kept).
    """

    def __init__(
        self,
        *,
        hooks: RunHooksBase[Any, Any] | None = None,
        warn: bool = True,
        max_calls: int = 10_000,
    ) -> None:
        if hooks is not None and not isinstance(hooks, RunHooksBase):
            raise TypeError(f"hooks must be a RunHooks or None, got {type(hooks).__name__}")
        if isinstance(max_calls, bool) or not isinstance(max_calls, int) or max_calls < 1:
            raise ValueError(f"max_calls must be a positive int, got {max_calls!r}")
        self.hooks = hooks
        self.warn = bool(warn)
        self.max_calls = max_calls
        self._lock = threading.Lock()
        self._serials = itertools.count(1)
        self._calls: OrderedDict[int, AuditedCall] = OrderedDict()
        self._waiting: deque[_Waiting] = deque(maxlen=_MAX_WAITING)
        self._started: dict[int, _Waiting] = {}  # by id(run context): started, not ended
        self._current: contextvars.ContextVar[_Waiting | None] = contextvars.ContextVar(
            f"protoprompt_audit_{id(self)}", default=None
        )
        # Responses already paired, by identity (ModelResponse is unhashable): id -> weakref.
        self._paired: dict[int, weakref.ref[Any]] = {}
        if hooks is not None:
            # Every other hook of the user's object runs as if it were passed itself (also
            # hooks a later SDK adds): instance attributes shadow the base class's no-ops.
            for name, _ in inspect.getmembers(RunHooksBase, inspect.iscoroutinefunction):
                if name.startswith("on_") and name not in ("on_llm_start", "on_llm_end"):
                    setattr(self, name, getattr(hooks, name))

    # ------------------------------------------------------------------ plans

    def observer(self, builder: TokenBudgetedContextBuilder) -> Callable[[ModelCallPlan], None]:
        """An ``on_call`` for a model filter built on ``builder``: its calls are recorded
        under ``builder.model``, and paired calls teach ``builder.calibration`` if it has
        one."""
        return lambda plan: self._record(plan, builder)

    def on_call(self, plan: ModelCallPlan) -> None:
        """An ``on_call`` for any model filter (the model is then taken from the agent)."""
        self._record(plan, None)

    def _record(self, plan: ModelCallPlan, builder: TokenBudgetedContextBuilder | None) -> None:
        encoding = builder.encoding if builder is not None else plan.pack.encoding
        items = scaled = 0
        if encoding in ESTIMATED_ENCODINGS:
            items, scaled = _estimated_items(plan.pack.items, encoding, plan.pack.opaque_scale)
        call = AuditedCall(
            serial=next(self._serials),
            call=plan.call,
            model=builder.model if builder is not None else None,
            estimate=plan.request_tokens,
            opaque=_opaque_tokens(plan.items, encoding),
            opaque_scale=plan.pack.opaque_scale,
            expected_cached=plan.shared_tokens,
            items=items,
            scaled_items=scaled,
        )
        waiting = _Waiting(call, frozenset(id(x) for x in plan.items), builder)
        with self._lock:
            self._keep(call)
            self._waiting.append(waiting)
        self._current.set(waiting)

    def _keep(self, call: AuditedCall) -> None:
        self._calls[call.serial] = call
        while len(self._calls) > self.max_calls:
            self._calls.popitem(last=False)

    def _claim(self, items: Sequence[Any]) -> _Waiting | None:
        """The waiting plan of the call that sends ``items`` (caller holds the lock)."""
        ids = {id(x) for x in items}
        current = self._current.get()
        candidates = [current] if current is not None else []
        candidates += reversed(self._waiting)
        for waiting in candidates:
            if waiting in self._waiting and ids <= waiting.ids:
                self._waiting.remove(waiting)
                return waiting
        return None

    # ------------------------------------------------------------------ hooks

    async def on_llm_start(
        self, context: Any, agent: Any, system_prompt: str | None, input_items: list[Any]
    ) -> None:
        if self.hooks is not None:
            await self.hooks.on_llm_start(context, agent, system_prompt, input_items)
        with self._lock:
            waiting = self._claim(input_items)
            if waiting is not None:
                self._started[id(context)] = waiting
                while len(self._started) > _MAX_WAITING:
                    del self._started[next(iter(self._started))]

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        if self.hooks is not None:
            await self.hooks.on_llm_end(context, agent, response)
        with self._lock:
            waiting = self._started.pop(id(context), None)
        if waiting is None:
            return
        paired = self._pair(waiting, response, agent)
        if paired is not None and getattr(waiting.builder, "calibration", None) is not None:
            await asyncio.to_thread(self._learn, paired, waiting.builder)  # a database write

    # ------------------------------------------------------------------ pairing

    def _pair(self, waiting: _Waiting, response: Any, agent: Any) -> AuditedCall | None:
        reported = _reported_input(response)
        call = waiting.call
        updated = AuditedCall(
            serial=call.serial,
            call=call.call,
            model=call.model or _model_name(agent),
            estimate=call.estimate,
            opaque=call.opaque,
            opaque_scale=call.opaque_scale,
            reported=reported,
            agent=getattr(agent, "name", None) if agent is not None else None,
            expected_cached=call.expected_cached,
            cached=_reported_cached(response),
            items=call.items,
            scaled_items=call.scaled_items,
        )
        with self._lock:
            if call.serial in self._calls:
                self._calls[call.serial] = updated
            self._remember_paired(response)
        if updated.underestimated:
            message = (
                f"the provider counted {updated.reported} input tokens for a model call "
                f"protoprompt estimated at {updated.estimate} "
                f"({updated.model or 'unknown model'}): the budget was not conservative"
            )
            _log.warning("protoprompt: %s", message)
            if self.warn:
                warnings.warn(
                    BudgetUnderestimateWarning(
                        message, updated.estimate, updated.reported or 0, updated.model or ""
                    ),
                    stacklevel=2,
                )
        return updated if reported is not None else None

    def _remember_paired(self, response: Any) -> None:
        """Remember that ``response`` was paired, for as long as it lives (caller holds the
        lock)."""
        key = id(response)
        paired = self._paired

        def forget(_: Any) -> None:
            paired.pop(key, None)

        # A response that is not weak-referenceable: add_result cannot tell it was paired.
        with contextlib.suppress(TypeError):
            paired[key] = weakref.ref(response, forget)

    def _was_paired(self, response: Any) -> bool:
        ref = self._paired.get(id(response))
        return ref is not None and ref() is response

    @staticmethod
    def _learn(call: AuditedCall, builder: TokenBudgetedContextBuilder | None) -> None:
        calibration = getattr(builder, "calibration", None)
        model = getattr(builder, "model", None)
        if not isinstance(calibration, Calibration) or not model or call.reported is None:
            return
        encoding = getattr(builder, "encoding", None)
        estimate, scaled = call.estimate, call.opaque
        if encoding in ESTIMATED_ENCODINGS:
            # Everything but the items (instructions, tools, the context message) as the plan
            # counted it, and the items as one, as the core's rule scales them.
            rest = max(call.estimate - call.scaled_items, 0)
            estimate = rest + _core.scale_opaque(call.items, call.opaque_scale)
            scaled = call.items
        try:
            calibration.observe(
                model,
                estimate=estimate,
                opaque=scaled,
                opaque_scale=call.opaque_scale,
                reported=call.reported,
                encoding=encoding,
            )
        except Exception as exc:  # noqa: BLE001 - learning never fails a run
            _log.debug("protoprompt: calibration of %r not updated: %s", model, exc)

    def add_result(self, result: Any) -> list[AuditedCall]:
        """Pair a run's model responses (``result.raw_responses``) that no hook paired with
        the run's calls, in order; call it right after the run. The run's calls are the
        newest unpaired calls that form a whole run of as many calls (numbered from 1, again
        after a handoff, and followed by nothing or by the first call of another run), so a
        run that failed before has no effect. Nothing is paired when no such calls are found
        (e.g. the filter did not see every call). With concurrent runs sharing the audit use
        ``hooks=audit`` instead, which pairs every call as it ends. Returns the calls paired.
        """
        with self._lock:
            responses = [
                r for r in getattr(result, "raw_responses", None) or () if not self._was_paired(r)
            ]
            block = _run_block(list(self._waiting), len(responses))
            for w in block:
                self._waiting.remove(w)
        agent = getattr(result, "last_agent", None)
        paired: list[AuditedCall] = []
        for waiting, response in zip(block, responses, strict=False):
            done = self._pair(waiting, response, agent)
            with self._lock:
                paired.append(self._calls.get(waiting.serial, waiting.call))
            if done is not None:
                self._learn(done, waiting.builder)
        return paired

    # ------------------------------------------------------------------ reports

    @property
    def calls(self) -> list[AuditedCall]:
        """Every call kept, in the order their plans were made."""
        with self._lock:
            return list(self._calls.values())

    def summary(self) -> AuditSummary:
        """Totals over the calls kept (see :class:`AuditSummary`)."""
        calls = self.calls
        reported = [c for c in calls if c.reported is not None]
        ratios = [r for c in reported if (r := c.ratio) is not None]
        return AuditSummary(
            calls=len(calls),
            reported_calls=len(reported),
            estimate_tokens=sum(c.estimate for c in reported),
            reported_tokens=sum(c.reported or 0 for c in reported),
            min_ratio=min(ratios, default=None),
            max_ratio=max(ratios, default=None),
            underestimated_calls=sum(1 for c in reported if c.underestimated),
            expected_cached_tokens=sum(c.expected_cached for c in reported),
            cached_tokens=sum(c.cached or 0 for c in reported),
        )

    def explain(self, max_calls: int | None = 20) -> str:
        """The summary, then the latest calls (at most ``max_calls``; ``None``: all)."""
        calls = self.calls
        shown = calls if max_calls is None else calls[-max_calls:] if max_calls else []
        lines = [self.summary().explain()]
        lines.extend("  " + c.explain() for c in shown)
        if len(shown) < len(calls):
            lines.insert(1, f"  ... {len(calls) - len(shown)} earlier calls")
        return "\n".join(lines)

    def clear(self) -> None:
        """Forget every call."""
        with self._lock:
            self._calls.clear()
            self._waiting.clear()
            self._started.clear()
