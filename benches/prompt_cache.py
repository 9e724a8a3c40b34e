"""Prompt-cache economics of a session under budget pressure: newest-first packing against
the cache-stable prefix (``pp.plan_prefix``, issue 34).

A simulated session: a generated history (``history_gen``) sized to ``PRESSURE`` times the
budget is the session so far; the next ``TURNS`` turns of the same generated session are
then replayed call by call, as the Agents SDK calls the model: the first call of a turn
sends the user message as new input, every later call the tool outputs the previous call's
tool calls produced (a *step*), with everything before them as history. Each call's request
is computed twice:

* **newest-first**: a ``pp.HistoryIndex`` per session packing with the builder's default
  ``pp.Masking()`` (today's per-call behaviour);
* **stable prefix**: ``pp.plan_prefix`` with ``pp.CachePolicy()`` and the previous call's
  state.

Per call: the request's tokens (``pp.item_tokens`` of each item, as sent: masked copies
included), the tokens of the longest run of leading items that equal the previous request's
(serialised JSON), and what OpenAI bills as cached of it: nothing below 1,024 tokens, else
that prefix rounded down to a multiple of 128. Cost: input tokens at gpt-5's published
$1.25/M and cached input at $0.125/M, against the same requests uncached. Visible: user
messages and tool calls in each request, summed over the calls. Pack time: the sum of the
calls' wall times (each strategy's own calls).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import harness
from history_gen import generate
from masking import CALL_TYPES, is_user

BUDGETS = (128_000, 32_000)
TURNS = 40
PRESSURE = 1.3
"""The session so far costs this many budgets (whole), so every call is under pressure."""
INPUT_PRICE = 1.25e-6
CACHED_PRICE = 0.125e-6
CACHE_MIN = 1_024
CACHE_STEP = 128

_CLIENT_OUTPUTS = frozenset(
    {
        "function_call_output",
        "custom_tool_call_output",
        "computer_call_output",
        "local_shell_call_output",
        "shell_call_output",
        "apply_patch_call_output",
        "mcp_approval_response",
        "tool_search_output",
    }
)


def is_client(item: dict[str, Any]) -> bool:
    """An item the client adds to a run: the user's message or a tool's output."""
    return is_user(item) or item.get("type") in _CLIENT_OUTPUTS


def split_turns(items: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The items as turns, each opening with a user message (leading items: a turn)."""
    turns: list[list[dict[str, Any]]] = []
    for item in items:
        if is_user(item) or not turns:
            turns.append([])
        turns[-1].append(item)
    return turns


def calls_of(turn: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The model calls of a turn as ``(start, end)``: items ``start:end`` are the call's new
    input (client items), everything before ``start`` its history."""
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(turn):
        if is_client(turn[i]) and (i == 0 or not is_client(turn[i - 1])):
            j = i
            while j < len(turn) and is_client(turn[j]):
                j += 1
            out.append((i, j))
            i = j
        else:
            i += 1
    return out


def item_tokens(item: dict[str, Any]) -> int:
    import protoprompt

    return protoprompt.item_tokens(item, encoding=harness.ENCODING).total


def _key(item: Any) -> str:
    return json.dumps(item, sort_keys=False, separators=(",", ":"), ensure_ascii=False)


def cached_tokens(prev: list[str] | None, keys: list[str], tokens: list[int]) -> tuple[int, int]:
    """The previous request's repeated prefix in this one: ``(prefix tokens, billed cached
    tokens)`` (whole items only; billed from 1,024 tokens in 128-token steps)."""
    if prev is None:
        return 0, 0
    common = 0
    for a, b, t in zip(prev, keys, tokens):
        if a != b:
            break
        common += t
    billed = 0 if common < CACHE_MIN else common - common % CACHE_STEP
    return common, billed


@dataclass
class Tally:
    """One strategy's sums over a session's calls."""

    calls: int = 0
    tokens: int = 0
    prefix: int = 0
    cached: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    seconds: float = 0.0
    moves: int = 0
    resets: int = 0
    broken: int = 0
    """Calls that kept the prefix but whose request does not extend the previous one."""
    max_tokens: int = 0
    _prev: list[str] | None = field(default=None, repr=False)
    _kept: list[str] | None = field(default=None, repr=False)

    def add(
        self,
        request: list[dict[str, Any]],
        seconds: float,
        stayed: bool = False,
        volatile: int | None = None,
    ) -> None:
        """Tally one request; ``volatile``: the position of an item the next request does
        not repeat by design (the session callback's recall message, placed after the
        stable history): a stay must extend the request without it."""
        keys = [_key(i) for i in request]
        if stayed and (self._kept is None or keys[: len(self._kept)] != self._kept):
            self.broken += 1
        toks = [item_tokens(i) for i in request]
        common, billed = cached_tokens(self._prev, keys, toks)
        total = sum(toks)
        self._prev = keys
        self._kept = keys if volatile is None else keys[:volatile] + keys[volatile + 1 :]
        self.calls += 1
        self.tokens += total
        self.max_tokens = max(self.max_tokens, total)
        self.prefix += common
        self.cached += billed
        self.user_turns += sum(1 for i in request if is_user(i))
        self.tool_calls += sum(1 for i in request if i.get("type") in CALL_TYPES)
        self.seconds += seconds

    @property
    def share(self) -> float:
        """Share of the input tokens billed as cached."""
        return self.cached / self.tokens if self.tokens else 0.0

    @property
    def cost_ratio(self) -> float:
        """Cost of the input against the same requests uncached."""
        if not self.tokens:
            return 1.0
        paid = (self.tokens - self.cached) * INPUT_PRICE + self.cached * CACHED_PRICE
        return paid / (self.tokens * INPUT_PRICE)

    @property
    def dollars(self) -> float:
        return (self.tokens - self.cached) * INPUT_PRICE + self.cached * CACHED_PRICE


@dataclass
class Session:
    """The session so far and the turns to replay."""

    mix: str
    budget: int
    history: list[dict[str, Any]]
    turns: list[list[dict[str, Any]]]


def make_session(mix: str, budget: int, turns: int = TURNS, seed: int = 0) -> Session:
    """A generated session whose first turns cost ``PRESSURE`` budgets, then ``turns`` more."""
    items = generate(max(4_000, budget // 20), mix, seed)
    all_turns = split_turns(items)
    history: list[dict[str, Any]] = []
    cost = 0
    k = 0
    while k < len(all_turns) - turns and cost < PRESSURE * budget:
        history += all_turns[k]
        cost += sum(item_tokens(i) for i in all_turns[k])
        k += 1
    if cost < PRESSURE * budget:
        raise ValueError(f"{mix}: the generated session is too short for {budget}")
    return Session(mix, budget, history, all_turns[k : k + turns])


def simulate(session: Session, policy: Any = None) -> dict[str, Any]:
    """Replay the session's turns call by call with both strategies."""
    import protoprompt

    policy = policy or protoprompt.CachePolicy()
    masking = protoprompt.Masking(excerpt_tokens=policy.excerpt_tokens)
    index = protoprompt.HistoryIndex()
    newest, stable = Tally(), Tally()
    history = list(session.history)
    state = None
    skipped = 0
    for turn in session.turns:
        for start, end in calls_of(turn):
            h = history + turn[:start]
            new_input = turn[start:end]
            t0 = time.perf_counter()
            try:
                packed = index.pack(
                    h, new_input, session.budget, encoding=harness.ENCODING, masking=masking
                )
            except protoprompt.InvalidNewInputError:
                skipped += 1  # a generated shape the SDK would not send as input
                continue
            t1 = time.perf_counter()
            plan = protoprompt.plan_prefix(
                h,
                new_input,
                max_tokens=session.budget,
                cache=policy,
                previous=state,
                encoding=harness.ENCODING,
            )
            t2 = time.perf_counter()
            state = plan.state
            newest.add(list(packed.items), t1 - t0)
            stable.add(plan.request, t2 - t1, stayed=not plan.moved)
            stable.moves += plan.reason_code in ("moved", "fresh_cut")
            stable.resets += plan.reason_code == "reset"
        history += turn
    return {
        "mix": session.mix,
        "budget": session.budget,
        "history_items": len(session.history),
        "turns": len(session.turns),
        "skipped": skipped,
        "newest": newest,
        "stable": stable,
    }


def measure(mixes: tuple[str, ...] | None = None, budgets=BUDGETS) -> list[dict[str, Any]]:
    from history_gen import MIXES

    return [simulate(make_session(mix, budget)) for budget in budgets for mix in (mixes or MIXES)]


def _k(n: int) -> str:
    return f"{n // 1000}k"


def markdown(rows: list[dict[str, Any]]) -> str:
    header = [
        "budget",
        "mix",
        "calls",
        "repeated prefix newest-first",
        "repeated prefix stable",
        "cost vs uncached newest-first",
        "cost vs uncached stable",
        "user turns stable / newest-first",
        "tool calls stable / newest-first",
        "moves / resets",
        "pack ms/call newest-first",
        "pack ms/call stable",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        n, s = r["newest"], r["stable"]
        lines.append(
            "| "
            + " | ".join(
                [
                    _k(r["budget"]),
                    r["mix"],
                    str(s.calls),
                    f"{n.share:.1%}",
                    f"{s.share:.1%}",
                    f"{n.cost_ratio:.2f}",
                    f"{s.cost_ratio:.2f}",
                    f"{s.user_turns / max(n.user_turns, 1):.2f}x",
                    f"{s.tool_calls / max(n.tool_calls, 1):.2f}x",
                    f"{s.moves} / {s.resets}",
                    f"{n.seconds / max(n.calls, 1) * 1e3:.1f}",
                    f"{s.seconds / max(s.calls, 1) * 1e3:.1f}",
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def print_rows(rows: list[dict[str, Any]]) -> None:
    print(markdown(rows))


INTRO = """## Prompt cache: a stable prefix against newest-first

`benches/prompt_cache.py` (`report.py --prompt-cache-only`; asserted by
`benches/test_bench_prompt_cache.py`): a generated session of each mix whose history so far
costs 1.3 budgets, then its next 40 turns replayed call by call as the Agents SDK calls the
model (the user message, then each step's tool outputs as new input). Per call the request
is packed by *newest-first* (`pp.HistoryIndex` with `pp.Masking()`, today's per-call pack)
and by the *stable* prefix (`pp.plan_prefix` with `pp.CachePolicy()`: low water 0.7, the
newest turn's tool outputs whole). *Repeated prefix*: the tokens of the leading items
equal to the previous request's (serialised JSON) as OpenAI bills them cached (from 1,024
tokens, in 128-token steps), over all input tokens. *Cost*: input at gpt-5's $1.25/M,
cached input at $0.125/M, against the same requests uncached. *User turns* and *tool calls*:
those in the requests, summed over the calls, stable over newest-first. *Moves*: calls that
moved the cut (or set it on the first call) / calls whose previous state no longer matched.
*Pack ms*: the mean wall time of one call (debug builds are far slower; `plan_prefix`
converts and digests the whole history on every call: the session integration will keep an
index). No system prompt or context message: they would add the same prefix to both.
Targets (issue 34): repeated prefix >= 80%, cost <= 0.35 of uncached, user turns >= 0.8x.
"""

SDK_INTRO = """### Whole SDK runs through `session.run_config`

`prompt_cache.sdk_runs()`: a `ProtoPromptSession` whose stored history (turns of a question,
4 tool calls with outputs of 1/40 of the budget each, an answer) costs 1.3 budgets, then 8
runs of `Runner.run` (the SDK's offline `ScriptedModel`, 4 tool steps and an answer each: 40
model calls) through `session.run_config(builder, cache=...)`: *newest-first* is
`cache=None`, *stable* is `cache=pp.CachePolicy()`. The numbers are those of the requests
the model received (as above); *moves*: calls whose plan says `moved`; *pack ms*: the
filter's own time per call. No memory store: the callback's context message is not yet
placed after the stable history (a run whose recall changed starts the prefix afresh).
"""


MIX_SDK_INTRO = """#### Every generated mix through `Runner.run`

`prompt_cache.mix_sdk_runs(memory=...)` (asserted by `benches/test_bench_prompt_cache.py::
test_whole_sdk_runs_on_every_mix`): every generated mix, its session so far costing 1.3
budgets stored in a `ProtoPromptSession`, then its next 12 turns replayed as whole
`Runner.run` runs through `session.run_config(builder, agent=agent, cache=...)`: the turn's
user message is the run input; the SDK's offline `ScriptedModel` answers each model call with
the turn's generated model items in order (reasoning, function calls, hosted web search and
MCP calls, messages); the agent's function tools return the generated outputs by call id.
Shapes the runner cannot run without their tool are replayed as the nearest shape it runs:
custom, computer, local shell, hosted shell and apply_patch calls, MCP approval requests and
client tool searches as a `function_call` with the same call id whose output is the generated
output (a hosted shell call's streamed outputs joined); programs, their outputs, items a program
calls (`caller`; its function calls run as plain calls) and server tool searches as an
assistant message holding the item's JSON (`mix_sdk_runs` rows' `reshaped` counts them: none
for chat, 5 apply_patch pairs for tools at 128k, 98 items for agentic at 128k). A call whose
items run no function is merged into the next; a turn that ends without an answer gets a
short one. Measured per model call, on the requests the model received, as above; *moves*:
the session callback's and the filter's plans that say `moved`; *pack ms*: the filter's own
time per call. *memory + recall*: a `MemoryStore`, a scope and `recall_evicted=True`.
Measured on a debug build (`scripts/dev.sh`), 2026-12-06.
"""


def sdk_section(rows: list[dict[str, Any]], mix: list[dict[str, Any]] | None = None) -> str:
    """The whole-SDK-runs part of the README section (and the generated mixes' table)."""
    return (
        SDK_INTRO
        + "\n"
        + markdown(rows)
        + ("\n" + MIX_SDK_INTRO + "\n" + markdown(mix) if mix else "")
    )


def section(
    rows: list[dict[str, Any]],
    when: str,
    sdk: list[dict[str, Any]] | None = None,
    mix: list[dict[str, Any]] | None = None,
) -> str:
    """The README section (between its markers)."""
    return (
        "<!-- prompt-cache -->\n"
        + INTRO
        + "\n"
        + when
        + "\n\n"
        + markdown(rows)
        + ("\n" + sdk_section(sdk, mix) if sdk else "")
        + "<!-- /prompt-cache -->\n"
    )


# ----------------------------------------------------------------- whole SDK runs (issue 34 #7)

SDK_TURNS = 8
SDK_STEPS = 4
"""Tool steps per run: each run makes ``SDK_STEPS + 1`` model calls (the issue's 8 x 5)."""


def _tool_text(budget: int, k: int) -> str:
    """A tool output of about 1/40 of the budget (3.2k tokens at 128k, 800 at 32k)."""
    words = max(budget // 40 - 20, 10)
    return f"result {k}: " + " ".join(f"w{k}_{j % 97}" for j in range(words))


def _sdk_history(budget: int) -> list[dict[str, Any]]:
    """Stored turns of the same shape costing ``PRESSURE`` budgets: the session so far."""
    items: list[dict[str, Any]] = []
    cost = 0
    t = 0
    while cost < PRESSURE * budget:
        turn: list[dict[str, Any]] = [{"role": "user", "content": f"question {t}: look it up"}]
        for s in range(SDK_STEPS):
            cid = f"h{t}_{s}"
            turn.append(
                {
                    "type": "function_call",
                    "call_id": cid,
                    "name": "lookup",
                    "arguments": json.dumps({"q": cid}),
                }
            )
            turn.append(
                {
                    "type": "function_call_output",
                    "call_id": cid,
                    "output": _tool_text(budget, t * 10 + s),
                }
            )
        turn.append(
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"answer {t}", "annotations": []}],
            }
        )
        cost += sum(item_tokens(i) for i in turn)
        items += turn
        t += 1
    return items


async def _sdk_session_run(budget: int, cache: Any, memory: bool = False) -> tuple[Tally, int]:
    """``SDK_TURNS`` runs through ``Runner.run`` with ``session.run_config`` (the offline
    scripted model); the requests the model received, tallied; and the moves."""
    from agents import Agent, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from protoprompt.integrations import ProtoPromptSession

    @function_tool
    def lookup(q: str) -> str:
        """Look something up."""
        return _tool_text(budget, hash(q) % 1000)

    script = []
    for t in range(SDK_TURNS):
        script += [
            [function_call("lookup", {"q": f"r{t}_{s}"}, call_id=f"r{t}_{s}")]
            for s in range(SDK_STEPS)
        ]
        script.append([assistant_message(f"done {t}", item_id=f"m{t}")])
    model = ScriptedModel(script)
    agent = Agent(name="bench", model=model, tools=[lookup], instructions="Use the tool.")
    session = ProtoPromptSession("bench")
    await session.add_items(_sdk_history(budget))
    builder = _memory_builder(budget, memory)
    plans: list[Any] = []
    plan_seconds: list[float] = []
    config = session.run_config(builder, cache=cache, on_call=plans.append, tracing_disabled=True)
    flt = config.call_model_input_filter
    plan_call = flt._plan

    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        plan = plan_call(*args)
        plan_seconds.append(time.perf_counter() - t0)
        return plan

    flt._plan = timed  # type: ignore[method-assign]
    for t in range(SDK_TURNS):
        await Runner.run(agent, f"run {t}: look it up", session=session, run_config=config)
        if memory:
            await builder.wait_for_background()
    tally = Tally()
    for call, seconds, plan in zip(model.calls, plan_seconds, plans, strict=True):
        # Pack time: the filter's own (the callback's turn plan is the same either way).
        tally.add(list(call.input), seconds, stayed=plan.prefix == "stayed")
    moves = sum(1 for p in plans if p.prefix == "moved")
    session.close()
    return tally, moves


def sdk_runs(budgets: tuple[int, ...] = BUDGETS, memory: bool = False) -> list[dict[str, Any]]:
    """Whole SDK runs at each budget, newest first (``cache=None``) and with
    ``pp.CachePolicy()`` on the session's per-call filter."""
    import asyncio

    import protoprompt as pp

    rows = []
    for budget in budgets:
        newest, _ = asyncio.run(_sdk_session_run(budget, None, memory))
        stable, moves = asyncio.run(_sdk_session_run(budget, pp.CachePolicy(), memory))
        stable.moves = moves
        label = "sdk tool loop" + (" (memory + recall)" if memory else "")
        rows.append({"mix": label, "budget": budget, "newest": newest, "stable": stable})
    return rows


# ----------------------------------------------------- the session callback (issue 34 #1, #6)

SESSION_TURNS = 24
"""Turns replayed through the session callback per mix and budget."""


def _memory_builder(budget: int, memory: bool, **kw: Any) -> Any:
    """The builder of a session run: without memory, or with a memory store, a scope and
    ``recall_evicted=True`` (evicted turns indexed and recalled into the context message)."""
    import protoprompt as pp

    if not memory:
        return pp.TokenBudgetedContextBuilder(
            None, max_tokens=budget, output_reserve=budget // 16, encoding=harness.ENCODING, **kw
        )
    scope = pp.MemoryScope("bench", user="u")
    store = pp.MemoryStore()
    store.remember("The user prefers short answers with the numbers first.", scope=scope)
    return pp.TokenBudgetedContextBuilder(
        store,
        max_tokens=budget,
        output_reserve=budget // 16,
        encoding=harness.ENCODING,
        scope=scope,
        recall_evicted=True,
        **kw,
    )


async def _callback_replay(session: Session, cache: Any, memory: bool, **kw: Any) -> Tally:
    """The session's turns through ``ProtoPromptSession.input_callback`` (called as the
    runner calls it: the stored history and the turn's user message), the turn's items
    stored after it (its user message included, as the runner stores the run's input);
    the requests tallied."""
    from protoprompt.integrations import ProtoPromptSession

    store = ProtoPromptSession(f"cb-{session.mix}")
    await store.add_items(list(session.history))
    builder = _memory_builder(session.budget, memory, **kw)
    plans: list[Any] = []
    callback = store.input_callback(
        builder, system_prompt="You are a careful assistant.", cache=cache, on_plan=plans.append
    )
    tally = Tally()
    for turn in session.turns:
        new_input = turn[:1] if is_user(turn[0]) else []
        history = await store.get_items()
        t0 = time.perf_counter()
        request = await callback(history, new_input)
        seconds = time.perf_counter() - t0
        tally.add(
            request, seconds, stayed=plans[-1].prefix == "stayed", volatile=plans[-1].recall_at
        )
        tally.moves += plans[-1].prefix == "moved"
        # The runner stores the run's input (the user message) and what the run produced.
        await store.add_items(turn)
        if memory:
            await builder.wait_for_background()
    store.close()
    return tally


def callback_runs(
    mixes: tuple[str, ...] | None = None, budgets=BUDGETS, memory: bool = False
) -> list[dict[str, Any]]:
    """Every mix at each budget through the session callback, newest first (``cache=None``)
    and with ``CachePolicy()`` (``run_config``'s default)."""
    import asyncio

    import protoprompt as pp
    from history_gen import MIXES

    rows = []
    for budget in budgets:
        for mix in mixes or MIXES:
            session = make_session(mix, budget, turns=SESSION_TURNS)
            newest = asyncio.run(_callback_replay(session, None, memory))
            stable = asyncio.run(_callback_replay(session, pp.CachePolicy(), memory))
            label = f"{mix} (callback{', memory + recall' if memory else ''})"
            rows.append({"mix": label, "budget": budget, "newest": newest, "stable": stable})
    return rows


def masking_pays(share: float = 0.10, turns: int = 16) -> dict[str, Tally]:
    """A long agentic session at ``share`` of its cost, through the session callback: drop
    only (``masking=None``, newest first), the builder's ``Masking()`` newest first,
    ``run_config``'s default (``CachePolicy()``: a move masks every tool output older than
    the newest turn and leaves those units' reasoning out before any turn is dropped), the
    same without leaving reasoning out (the default before it did), ``keep_recent=0``, ``2``
    and ``3``, and ``Masking(after_turns=3, omit_reasoning=True)`` newest first. User turns and
    tool calls visible per request (summed over the turns)."""
    import asyncio

    import protoprompt as pp

    items = generate(4_000, "agentic", 0)
    all_turns = split_turns(items)
    history = [i for t in all_turns[:-turns] for i in t]
    cost = sum(item_tokens(i) for i in history)
    budget = int(cost * share)
    session = Session("agentic", budget, history, all_turns[-turns:])

    def replay(cache: Any, **kw: Any) -> Tally:
        return asyncio.run(_callback_replay(session, cache, False, **kw))

    return {
        "drop only": replay(None, masking=None),
        "Masking() newest first": replay(None),
        "CachePolicy() (default)": replay(pp.CachePolicy()),
        "CachePolicy(omit_reasoning=False)": replay(pp.CachePolicy(omit_reasoning=False)),
        "CachePolicy(keep_recent=0)": replay(pp.CachePolicy(keep_recent=0)),
        "CachePolicy(keep_recent=2)": replay(pp.CachePolicy(keep_recent=2)),
        "CachePolicy(keep_recent=3)": replay(pp.CachePolicy(keep_recent=3)),
        "Masking(after_turns=3, omit_reasoning=True) newest first": replay(
            None, masking=pp.Masking(after_turns=3, omit_reasoning=True)
        ),
    }


def masking_pays_table(rows: dict[str, Tally]) -> str:
    """:func:`masking_pays` as the markdown table of ``benches/README.md``."""
    base = rows["drop only"]
    lines = [
        "| settings | user turns | vs drop-only | tool calls | vs drop-only "
        "| repeated prefix | cost vs uncached | moves |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, t in rows.items():
        cached = name.startswith("CachePolicy")
        lines.append(
            f"| {name} | {t.user_turns / t.calls:.1f} | {t.user_turns / base.user_turns:.2f}x "
            f"| {t.tool_calls / t.calls:.1f} | {t.tool_calls / base.tool_calls:.2f}x "
            f"| {t.share:.1%} | {t.cost_ratio:.2f} | {t.moves if cached else '-'} |"
        )
    return "\n".join(lines)


# ------------------------------------- whole SDK runs on every generated mix (issue 34 #7)

MIX_TURNS = 12
"""Turns replayed through ``Runner.run`` per mix, budget and memory setting."""

_AS_IS = frozenset(
    {
        "reasoning",
        "function_call",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_list_tools",
        "mcp_call",
    }
)
"""Generated model items the runner takes back as model output unchanged (hosted calls are
recorded, function calls run through the agent's function tools)."""

_AS_FUNCTION = frozenset(
    {
        "custom_tool_call",
        "computer_call",
        "local_shell_call",
        "shell_call",
        "apply_patch_call",
        "mcp_approval_request",
        "tool_search_call",
    }
)
"""Client-executed calls replayed as the nearest shape the runner runs without their tool
(a computer, a shell, an editor, an approval callback): a ``function_call`` with the same
call id whose output is the generated output's."""


@dataclass
class Replay:
    """A session's turns as ``Runner.run`` replays them: per turn the run input and the
    scripted model steps; the function tools' outputs by call id; what was reshaped."""

    inputs: list[list[dict[str, Any]]]
    steps: list[list[list[Any]]]
    outputs: dict[str, str]
    names: set[str]
    reshaped: dict[str, int]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _as_message(text: str, item_id: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


class _Replayer:
    """Generated items as scripted model output (see :func:`replay_script`)."""

    def __init__(self) -> None:
        from openai.types.responses import ResponseOutputItem
        from pydantic import TypeAdapter

        self.adapter: Any = TypeAdapter(ResponseOutputItem)
        self.rep = Replay([], [], {}, set(), {})
        self.n = 0

    def note(self, kind: str) -> None:
        self.rep.reshaped[kind] = self.rep.reshaped.get(kind, 0) + 1

    def message(self, text: str) -> Any:
        self.n += 1
        return self.adapter.validate_python(_as_message(text, f"msg_r{self.n}"))

    def assistant(self, item: dict[str, Any]) -> Any:
        out = {**item, "type": "message"}
        out.setdefault("id", f"msg_r{self.n}")
        out.setdefault("status", "completed")
        content = out.get("content")
        if isinstance(content, str):
            content = [{"type": "output_text", "text": content, "annotations": []}]
        out["content"] = [
            {"annotations": [], **c} if c.get("type") == "output_text" else c for c in content or []
        ]
        try:
            return self.adapter.validate_python(out)
        except Exception:  # noqa: BLE001 - a content part the output form lacks
            self.note("assistant message (other content)")
            return self.message(_text(item))

    def as_function(self, item: dict[str, Any], kind: str, call_id: str) -> Any:
        self.note(f"{kind} -> function_call")
        args = {k: v for k, v in item.items() if k not in ("type", "id", "call_id", "status")}
        self.rep.names.add(kind)
        call = {
            "type": "function_call",
            "id": f"fc_r{self.n}",
            "call_id": call_id,
            "name": kind,
            "arguments": json.dumps(args, ensure_ascii=False),
            "status": "completed",
        }
        return self.adapter.validate_python(call)

    def model_item(self, item: dict[str, Any]) -> tuple[Any, bool]:
        """The output item and whether it is a function call the runner runs."""
        self.n += 1
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") == "assistant":
            return self.assistant(item), False
        if kind in _AS_IS and "caller" not in item:
            out = dict(item)
            out.setdefault("id", f"{kind[:2]}_r{self.n}")
            try:
                valid = self.adapter.validate_python(out)
            except Exception:  # noqa: BLE001 - fall through to the nearest shape
                valid = None
            if valid is not None:
                if kind == "function_call":
                    self.rep.names.add(out["name"])
                return valid, kind == "function_call"
        call_id = item.get("call_id") or (
            item.get("id") if kind == "mcp_approval_request" else None
        )
        if kind in _AS_FUNCTION and call_id:
            return self.as_function(item, kind, call_id), True
        if kind == "function_call":  # a program's child (``caller``): run as a plain call
            self.note("function_call with caller -> function_call")
            self.rep.names.add(item["name"])
            out = {k: v for k, v in item.items() if k != "caller"}
            out.setdefault("id", f"fc_r{self.n}")
            return self.adapter.validate_python(out), True
        self.note(f"{kind}{' (a program child)' if 'caller' in item else ''} -> assistant message")
        return self.message(_text(item)), False

    def client_output(self, item: dict[str, Any]) -> bool:
        """Record a tool's output by call id; ``False``: not one (a server tool search's
        output, with no call id, is the model's: replayed with it)."""
        key = item.get("call_id") or item.get("approval_request_id")
        if not (is_client(item) and key):
            return False
        out = item.get("output", {k: v for k, v in item.items() if k != "type"})
        self.rep.outputs[key] = self.rep.outputs.get(key, "") + _text(out)
        if item.get("type") != "function_call_output":
            self.note(f"{item.get('type')} -> function_call_output")
        return True

    def turn(self, turn: list[dict[str, Any]]) -> None:
        self.rep.inputs.append(turn[:1])
        steps: list[list[Any]] = [[]]
        runs = [False]
        prev_client = True
        for item in turn[1:]:
            if self.client_output(item):
                prev_client = True
                continue
            if prev_client and runs[-1]:
                steps.append([])
                runs.append(False)
            prev_client = False
            out, runs_tool = self.model_item(item)
            steps[-1].append(out)
            runs[-1] = runs[-1] or runs_tool
        if runs[-1] or not any(getattr(o, "type", "") == "message" for o in steps[-1]):
            if runs[-1]:
                steps.append([])
            steps[-1].append(self.message("done"))
        self.rep.steps.append(steps)


def replay_script(turns: list[list[dict[str, Any]]]) -> Replay:
    """The turns as runner input and scripted model output (see :data:`_AS_IS` and
    :data:`_AS_FUNCTION`; any other model item -- programs and their outputs, server tool
    search, non-assistant messages -- is replayed as an assistant message holding its JSON).
    A turn's model items between two groups of client items are one model call; a call with
    no function call to run is merged into the next, and a turn whose last call runs tools
    or says nothing ends with a short answer, so each run makes exactly the scripted calls."""
    replayer = _Replayer()
    for turn in turns:
        replayer.turn(turn)
    return replayer.rep


async def _mix_sdk_run(session: Session, cache: Any, memory: bool) -> tuple[Tally, int]:
    """The session's turns through ``Runner.run`` with ``session.run_config`` (the offline
    scripted model answering with each turn's generated model items); the requests the
    model received, tallied; and the moves."""
    from agents import Agent, FunctionTool, Runner
    from agents.testing import ScriptedModel

    from protoprompt.integrations import ProtoPromptSession

    rep = replay_script(session.turns)

    async def invoke(ctx: Any, _args: str) -> str:
        return rep.outputs.get(ctx.tool_call_id, "")

    tools = [
        FunctionTool(
            name=name,
            description=f"{name} (replayed)",
            params_json_schema={"type": "object", "properties": {}, "additionalProperties": True},
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )
        for name in sorted(rep.names)
    ]
    model = ScriptedModel([step for steps in rep.steps for step in steps])
    agent = Agent(name="bench", model=model, tools=tools, instructions="Use the tools.")
    store = ProtoPromptSession(f"sdk-{session.mix}")
    await store.add_items(list(session.history))
    builder = _memory_builder(session.budget, memory)
    plans: list[Any] = []
    turn_plans: list[Any] = []
    plan_seconds: list[float] = []
    config = store.run_config(
        builder,
        agent=agent,  # the turn reserves the agent's instructions and tools
        cache=cache,
        on_plan=turn_plans.append,
        on_call=plans.append,
        tracing_disabled=True,
    )
    flt = config.call_model_input_filter
    plan_call = flt._plan

    def timed(*args: Any) -> Any:
        t0 = time.perf_counter()
        plan = plan_call(*args)
        plan_seconds.append(time.perf_counter() - t0)
        return plan

    flt._plan = timed  # type: ignore[method-assign]
    for run_input, steps in zip(rep.inputs, rep.steps, strict=True):
        await Runner.run(
            agent, run_input, session=store, run_config=config, max_turns=len(steps) + 1
        )
        if memory:
            await builder.wait_for_background()
    model.assert_complete()
    tally = Tally()
    for call, seconds, plan in zip(model.calls, plan_seconds, plans, strict=True):
        tally.add(list(call.input), seconds, stayed=plan.prefix == "stayed")
    # Moves: the session callback's (a turn's first request) and the filter's (its calls).
    moves = sum(1 for p in turn_plans if p.prefix == "moved")
    moves += sum(1 for p in plans if p.prefix == "moved")
    store.close()
    return tally, moves


def mix_sdk_runs(
    mixes: tuple[str, ...] | None = None,
    budgets: tuple[int, ...] = BUDGETS,
    memory: bool = False,
    turns: int = MIX_TURNS,
    policy: Any = None,
) -> list[dict[str, Any]]:
    """Every generated mix at each budget through whole ``Runner.run`` runs, newest first
    (``cache=None``) and with ``policy`` (default ``pp.CachePolicy()``)."""
    import asyncio

    import protoprompt as pp
    from history_gen import MIXES

    rows = []
    for budget in budgets:
        for mix in mixes or MIXES:
            session = make_session(mix, budget, turns=turns)
            newest, _ = asyncio.run(_mix_sdk_run(session, None, memory))
            cache = pp.CachePolicy() if policy is None else policy
            stable, moves = asyncio.run(_mix_sdk_run(session, cache, memory))
            stable.moves = moves
            label = f"{mix} (sdk{', memory + recall' if memory else ''})"
            rows.append(
                {
                    "mix": label,
                    "budget": budget,
                    "newest": newest,
                    "stable": stable,
                    "reshaped": replay_script(session.turns).reshaped,
                }
            )
    return rows
