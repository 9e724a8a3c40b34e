"""The session's run hooks: :meth:`~ProtoPromptSession.input_callback` (once per run),
:meth:`~ProtoPromptSession.model_input_filter` (every model call) and
:meth:`~ProtoPromptSession.run_config` (both), and the hand-over of a turn's plan to the SDK."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from ...errors import TokenBudgetExceededError
from ...packing import preload
from ...prefix import CachePolicy
from .._calls import _planner
from .._calls._agent import agent_request, model_name
from .._calls._oversized import turn_budget_error
from .._calls._request import RequestCosts
from .._sdk import _names
from .._sdk._names import RunConfig
from .._sdk._probes import called_by_runner
from .._stores import _prefix_state
from ._context import LAST_READ
from ._turn import TurnCall, plan_turn
from ._window import TURN_ATTR, Turn

if TYPE_CHECKING:
    from ...context import ContextPlan, TokenBudgetedContextBuilder
    from ...memory import MemoryScope
    from .._sdk._names import Agent
    from ..audit import BudgetAudit
    from ..model_filter import ModelCallPlan, ModelInputFilter, OversizedOutput
    from ..session import ProtoPromptSession
    from ._context import ContextBook, RunLedger
    from ._evicted import SessionMemory
    from ._turn import TurnSetup

Item = Any
"""An input item as the SDK hands it over (a dict in practice)."""
SessionInputCallback = Callable[[list[Item], list[Item]], Awaitable[list[Item]]]

DEFAULT_CACHE = CachePolicy()
"""``run_config``'s default cache policy (see ``docs/prompt-cache.md``)."""


def _check_callback_args(builder: object, system_prompt: object, on_plan: object) -> None:
    """``input_callback``'s argument checks (``TypeError`` naming the argument)."""
    if not callable(getattr(builder, "build", None)):
        raise TypeError(
            f"builder must be a TokenBudgetedContextBuilder, got {type(builder).__name__}"
        )
    if not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a str, got {type(system_prompt).__name__}")
    if on_plan is not None and not callable(on_plan):
        raise TypeError("on_plan must be callable or None")


def _default_builder(
    agent: Any,
    max_tokens: int | None,
    model: str | None,
    output_reserve: int | None,
    encoding: str | None = None,
) -> TokenBudgetedContextBuilder:
    """``run_config``'s builder without memory, from ``max_tokens`` and the tokenizer:
    ``encoding``, else the model's name (``model``, else ``agent``'s)."""
    from ...context import TokenBudgetedContextBuilder

    if max_tokens is None:
        raise TypeError("run_config() needs a builder, or max_tokens (the budget) to make one")
    if model is None and agent is not None:
        if not isinstance(agent, _names.Agent):
            raise TypeError(f"agent must be an agents.Agent or None, got {type(agent).__name__}")
        model = model_name(agent)
        if model is None and encoding is None:
            raise TypeError(
                f"the model of agent {agent.name!r} has no name to choose a tokenizer by: "
                "pass model= (e.g. model='gpt-5') or encoding= (e.g. encoding='o200k_base')"
            )
    if model is None and encoding is None:
        raise TypeError(
            "run_config() needs model= (or agent=) or encoding= to choose the tokenizer"
        )
    return TokenBudgetedContextBuilder(
        None,
        max_tokens=max_tokens,
        model=model,
        encoding=encoding,
        output_reserve=0 if output_reserve is None else output_reserve,
    )


class RunHooks:
    """The run hooks of :class:`~protoprompt.integrations.ProtoPromptSession` (a base class
    of it): what it hands to the SDK's ``RunConfig``."""

    if TYPE_CHECKING:
        _book: ContextBook
        _ledger: RunLedger

        def _session_memory(
            self, builder: TokenBudgetedContextBuilder, scope: MemoryScope | None
        ) -> SessionMemory | None: ...

        def _turn_setup(self) -> TurnSetup: ...

    def _hand_over(
        self,
        plan: ContextPlan,
        history: list[Item] | None,
        new_input: list[Item],
        on_plan: Callable[[ContextPlan], None] | None,
        copies: Mapping[bytes, bytes] | None = None,
    ) -> list[Item]:
        """What the callback returns for ``plan``: its items, with the context message made
        known and the run recorded for the model filter (``copies``: the copies the plan
        sends in place of stored items, see ``RunInput.copies``).

        ``history``: the history list the runner handed over. The context message object and
        the masked copies are added to it, so the SDK takes them for history and never asks
        any session to store them — also when a wrapper such as ``EncryptedSession`` sits in
        front of this one and would hand them over encrypted, past recognition. Without it
        (a direct call), they are registered so :meth:`add_items` keeps them out of the
        history."""
        key = None
        message = plan.context_message
        if message is not None:
            if history is not None:
                history.append(message)
                key = self._book.produced(message)
            else:
                key = self._book.expect(message)
        recall = getattr(plan, "recall_message", None)
        at = getattr(plan, "recall_at", None)
        recalled = None
        if recall is not None and at is not None:
            # What the question found, after the history: never stored either.
            if history is not None:
                history.append(recall)
                recalled = (at, self._book.produced(recall))
            else:
                recalled = (at, self._book.expect(recall))
        masked = plan.masked_items
        if masked and history is not None:
            history.extend(masked)
        elif masked:
            self._book.expect_masked(masked)
        self._ledger.record(key, new_input, len(plan.items), plan, recalled, copies)
        if on_plan is not None:
            on_plan(plan)
        return list(plan.items)

    def input_callback(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
        agent: Agent[Any] | None = None,
        cache: CachePolicy | None = None,
    ) -> SessionInputCallback:
        """A ``session_input_callback`` for ``RunConfig`` that budgets every request.

        The callback builds the turn with ``builder`` (see
        :meth:`TokenBudgetedContextBuilder.build`) and returns ``plan.items``: the context
        message, the kept history objects and every new-input object — the SDK's own
        objects, never copies. The context message is never stored: in a run it is also
        added to the history list the runner handed over, so the SDK takes it for history
        (whatever wraps this session); called directly, it is registered with this session
        so :meth:`add_items` keeps it out of the history. Use it only with this session.
        The builder's tokenizer starts building in the background now (see
        :func:`protoprompt.preload`), so the first request does not wait for it.

        Args:
            builder: the budget, tokenizer and memory to use.
            system_prompt: mandatory text at the top of the context message.
            output_reserve: overrides ``builder.output_reserve``.
            scope: overrides ``builder.scope`` (e.g. one scope per user).
            on_plan: called with each plan (besides ``builder.last_plan``).
            agent: the agent the runs use: its instructions, tool definitions and output
                schema are counted (as the per-call filter counts them) and reserved, so the
                turn's plan is that of the run's first model call (``plan.request``;
                instructions made per run from its context are left to the filter, and the
                plan says so). Without it the turn's plan does not know them.
            cache: the :class:`~protoprompt.CachePolicy` of the session's per-call filter
                (``run_config`` passes its own): the turn is built with
                ``stable_prefix=True``, so what the question recalls goes after the history
                and the context message stays the same from turn to turn.

        Raises (from the callback, before the model is called):
            TokenBudgetExceededError: the mandatory part of the request does not fit.
        """
        _check_callback_args(builder, system_prompt, on_plan)
        if cache is not None and not isinstance(cache, CachePolicy):
            raise TypeError(f"cache must be a CachePolicy or None, got {type(cache).__name__}")
        planner = None if cache is None else self._turn_planner(cache, builder)
        memory = self._session_memory(builder, scope)
        if agent is not None and not isinstance(agent, _names.Agent):
            raise TypeError(f"agent must be an agents.Agent or None, got {type(agent).__name__}")
        encoding = getattr(builder, "encoding", None)
        if isinstance(encoding, str):
            # Build the tokenizer while the SDK reads the history, not in the first callback.
            preload(encoding=encoding, wait=False)
        kwargs: dict[str, Any] = {
            "system_prompt": system_prompt,
            "scope": scope,
            "output_reserve": output_reserve,
        }
        if cache is not None:
            kwargs["stable_prefix"] = True
        costs = RequestCosts()

        async def protoprompt_session_input(
            history: list[Item], new_input: list[Item]
        ) -> list[Item]:
            by_runner = called_by_runner()  # before the first await: the caller's frame
            read = LAST_READ.get()
            call_kwargs = kwargs
            if agent is not None:
                request = await agent_request(agent, builder.encoding, costs)
                call_kwargs = {**kwargs, "request": request}
            facts = read.facts if read is not None and read.session is self else None
            call = TurnCall(
                self._turn_setup(),
                builder,
                history,
                new_input,
                facts,
                call_kwargs,
                memory,
                self._latest_request,
            )
            try:
                plan, evicted = await asyncio.to_thread(plan_turn, planner, call)
            except TokenBudgetExceededError as exc:
                # One line naming the part, raised here: not from the packer's frames.
                raise turn_budget_error(exc, call_kwargs.get("request")) from None
            if evicted is not None:
                evicted()  # background work on what the turn evicted; never raises
            copies = None
            if planner is not None and planner.last is not None:
                copies = planner.last.copy_digests()
            return self._hand_over(plan, history if by_runner else None, new_input, on_plan, copies)

        setattr(
            protoprompt_session_input, TURN_ATTR, Turn(self._as_session(), builder, output_reserve)
        )
        return protoprompt_session_input

    def _latest_request(self) -> _planner.RunPrefix | None:
        """The latest request a model filter of this session sent through its prefix: one
        another process or worker stored since this process last read or wrote it first
        (the model filter's next run then resumes it too)."""
        stored = _prefix_state.of(self)
        if stored is not None:
            found = stored.load()
            if found is not None:
                self._ledger.latest = found
        return self._ledger.latest

    def _turn_planner(
        self, policy: CachePolicy, builder: TokenBudgetedContextBuilder
    ) -> _planner.TurnPlanner:
        """The callback's cache-stable prefix, kept by this session object per policy and
        budget: a callback made for each run (``session.run_config(...)`` inside the run
        call) extends the request the previous run's callback sent, as one callback does.
        (``dict.setdefault`` is atomic: two callbacks made at once get the same planner.)"""
        planners: dict[tuple[CachePolicy, int], _planner.TurnPlanner]
        planners = self.__dict__.setdefault("_turn_planners", {})
        key = (policy, int(builder.max_tokens))
        found = planners.get(key)
        if found is None:
            found = planners.setdefault(key, _planner.TurnPlanner(policy))
        return found

    # ------------------------------------------------------------------ every model call

    def model_input_filter(
        self,
        builder: TokenBudgetedContextBuilder,
        *,
        oversized_output: OversizedOutput = "error",
        output_reserve: int | None = None,
        on_call: Callable[[ModelCallPlan], None] | None = None,
        cache: CachePolicy | None = None,
    ) -> ModelInputFilter:
        """A ``call_model_input_filter`` that holds ``builder``'s budget on every model call.

        The SDK calls :meth:`input_callback` once per run; the filter runs before each model
        call of the run, tool loops included, and keeps the whole request — input items, the
        agent's instructions and its tool definitions — within ``builder.max_tokens`` minus
        the output reserve. The context message of this session's callback, the run's new
        input and the newest step (the model output that ended the previous call and the
        tool outputs answering it) are mandatory; older items are filled newest first as
        atomic units (see :mod:`protoprompt.integrations.model_filter`). What it returns is
        sent, never stored.

        Args:
            builder: the budget and tokenizer (use the callback's builder).
            oversized_output: when the mandatory part does not fit: ``"error"`` raises
                :class:`~protoprompt.errors.TokenBudgetExceededError` (``section=
                "tool_output"``, ``detail`` names the output and its call) before the call;
                ``"truncate"`` sends cut copies of the newest tool outputs (head and tail
                around a marker saying how many tokens were removed).
            output_reserve: overrides ``builder.output_reserve``.
            on_call: called with each call's :class:`ModelCallPlan` (also in
                ``filter.last_plan``).
            cache: a :class:`~protoprompt.CachePolicy`: each model call of a run sends the
                previous call's request plus what was appended while that fits, and when
                it does not, packs to the policy's low-water mark once (see
                ``docs/prompt-cache.md``); ``None`` (default): every call newest first.
        """
        from ..model_filter import ModelInputFilter

        return ModelInputFilter(
            builder,
            oversized_output=oversized_output,
            output_reserve=output_reserve,
            session=self._as_session(),
            on_call=on_call,
            cache=cache,
        )

    def run_config(
        self,
        builder: TokenBudgetedContextBuilder | None = None,
        *,
        agent: Agent[Any] | None = None,
        max_tokens: int | None = None,
        model: str | None = None,
        encoding: str | None = None,
        system_prompt: str = "",
        output_reserve: int | None = None,
        scope: MemoryScope | None = None,
        on_plan: Callable[[ContextPlan], None] | None = None,
        oversized_output: OversizedOutput = "error",
        on_call: Callable[[ModelCallPlan], None] | None = None,
        audit: BudgetAudit | None = None,
        cache: CachePolicy | None = DEFAULT_CACHE,
        **run_config_fields: Any,
    ) -> RunConfig:
        """A ``RunConfig`` with both budget hooks set: the one-liner for a budgeted agent.

        ``session_input_callback`` is :meth:`input_callback` (recalled memory, packed
        history, once per run) and ``call_model_input_filter`` is :meth:`model_input_filter`
        (every model call of the run fits, instructions and tools included). Other
        ``RunConfig`` fields pass through. Without long-term memory, the budget alone::

            config = session.run_config(agent=agent, max_tokens=128_000, output_reserve=8_000)
            result = await Runner.run(agent, question, session=session, run_config=config)
            print(config.call_model_input_filter.last_plan.explain())

        With a :class:`~protoprompt.TokenBudgetedContextBuilder` (memory, masking, policy)::

            config = session.run_config(builder, system_prompt="Answer from the contract.")

        Args:
            builder: the budget, tokenizer and memory; or leave it out and give
                ``max_tokens`` (and ``model``, or an ``agent`` whose model is named): a
                builder without memory is made, with the builder's defaults.
            agent: the agent the runs use: the model's name is read from it when ``model``
                is not given, and its instructions, tools and output schema are counted into
                each turn's plan (see :meth:`input_callback`).
            max_tokens, model: the budget and the model's name (its tokenizer) of the builder
                made when ``builder`` is not given.
            encoding: the tokenizer by name (``"o200k_base"``, ``"cl100k_base"``...) of that
                builder, for a model whose name protoprompt does not know (it overrides the
                model's).
            output_reserve: tokens kept free for the answer (overrides the builder's).
            system_prompt, scope, on_plan: see :meth:`input_callback`.
            oversized_output, on_call: see :meth:`model_input_filter`.
            audit: a :class:`~protoprompt.integrations.BudgetAudit` that gets every model
                call's plan (pass it as ``hooks=`` of ``Runner.run`` too, or call
                ``audit.add_result(result)``, to pair each with the provider's count); with
                ``builder.calibration`` set, the audit also teaches it.
            cache: the :class:`~protoprompt.CachePolicy` of both hooks (see
                :meth:`input_callback` and :meth:`model_input_filter`): each turn's and each
                model call's request extends the previous one while it fits, and moves once
                to the low-water mark (older tool outputs masked) when it does not. Default
                ``CachePolicy()`` (why: ``docs/prompt-cache.md``); ``None``: newest first.

        Raises:
            TypeError: ``run_config_fields`` set one of the two hooks, or an unknown field;
                both ``builder`` and ``max_tokens`` / ``model`` are given, or neither a
                builder nor ``max_tokens``; no model name is given or readable from
                ``agent``; ``audit`` is not a ``BudgetAudit``.
            UnknownModelError: ``model`` has no known tokenizer (pass ``encoding=``).
            UnknownEncodingError: ``encoding`` is not one protoprompt ships.
        """
        if builder is None:
            builder = _default_builder(agent, max_tokens, model, output_reserve, encoding)
            output_reserve = None
        elif max_tokens is not None or model is not None or encoding is not None:
            raise TypeError(
                "pass either a builder or max_tokens and model / encoding (which make one), "
                "not both"
            )
        for name in ("session_input_callback", "call_model_input_filter"):
            if name in run_config_fields:
                raise TypeError(
                    f"run_config() sets {name} itself; build a RunConfig directly to use your own"
                )
        callback = self.input_callback(
            builder,
            system_prompt=system_prompt,
            output_reserve=output_reserve,
            scope=scope,
            on_plan=on_plan,
            agent=agent,
            cache=cache,
        )
        if audit is not None:
            from ..audit import BudgetAudit

            if not isinstance(audit, BudgetAudit):
                raise TypeError(f"audit must be a BudgetAudit or None, got {type(audit).__name__}")
            observe = audit.observer(builder)
            if on_call is not None:
                user_call = on_call

                def both(plan: ModelCallPlan) -> None:
                    observe(plan)
                    user_call(plan)

                on_call = both
            else:
                on_call = observe
        model_filter = self.model_input_filter(
            builder,
            oversized_output=oversized_output,
            output_reserve=output_reserve,
            on_call=on_call,
            cache=cache,
        )
        return RunConfig(
            session_input_callback=callback,
            call_model_input_filter=model_filter,
            **run_config_fields,
        )

    def _as_session(self) -> ProtoPromptSession:
        """This object as the session it is a base class of."""
        return cast("ProtoPromptSession", self)
