"""Masking of old tool outputs (``pp.Masking``): the pack keeps the newest units whole, then
older units with their tool outputs cut to excerpts, then drops; copies are new objects,
nothing the caller holds or the session stores changes, and every request stays within the
budget and a fixed point of the SDK's sanitizer.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

import protoprompt as pp

MARK = "masked by protoprompt"


def turn(t: int, words: int = 300, tool: str = "query_db") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"question {t}"},
        {"type": "reasoning", "id": f"rs_{t}", "summary": [], "encrypted_content": "gAAAA" * 10},
        {"type": "function_call", "call_id": f"c{t}", "name": tool, "arguments": f'{{"p": {t}}}'},
        {"type": "function_call_output", "call_id": f"c{t}", "output": "row of data 17\n" * words},
        {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{t}",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"answer {t}", "annotations": []}],
        },
    ]


def history(turns: int = 6, words: int = 300) -> list[dict[str, Any]]:
    return [item for t in range(turns) for item in turn(t, words)]


NEW = [{"role": "user", "content": "next"}]


def test_masking_keeps_more_turns_within_the_budget_and_explains_it() -> None:
    h = history()
    before = copy.deepcopy(h)
    plain = pp.pack(h, NEW, 3000)
    r = pp.pack(h, NEW, 3000, masking=pp.Masking())
    assert len(plain.kept_history) < len(r.kept_history) == len(h)
    assert r.used <= 3000 and h == before
    assert r.masked == [3, 8, 13, 18, 23]
    masked = [d for d in r.decisions if d.decision == "masked"]
    assert len(masked) == 5 and all(d.kept for d in masked)
    assert all(d.masked_tokens is not None and d.tokens is not None for d in masked)
    assert r.masking_saved == sum(d.tokens - d.masked_tokens for d in masked)  # type: ignore[operator]
    assert sum(d.sent_tokens or 0 for d in r.decisions) == r.history_tokens
    totals = r.totals
    assert (totals.masked_units, totals.masked_items, totals.masking_saved) == (
        5,
        5,
        r.masking_saved,
    )
    assert totals.history == r.history_tokens and totals.used == r.used
    assert plain.totals.masked_units == 0 and plain.totals.masking_saved == 0
    text = r.explain()
    assert f"masked: 5 units (5 tool outputs), {r.masking_saved:,} tokens saved" in text
    newest = masked[-1]
    assert f"({newest.tokens:,} -> {newest.masked_tokens:,} tokens): masked" in text
    # The request: the same objects where not masked, new copies of the masked outputs.
    for k, p in enumerate(r.kept_history):
        if p in r.masked:
            copy_ = r.items[k]
            assert copy_ is not h[p] and copy_ != h[p]
            assert (
                MARK in copy_["output"]
                and f"query_db output (call {h[p]['call_id']})" in copy_["output"]
            )
            assert pp.count_tokens(copy_["output"]) <= 64
            assert {k: v for k, v in copy_.items() if k != "output"} == {
                k: v for k, v in h[p].items() if k != "output"
            }
        else:
            assert r.items[k] is h[p]
    assert r.items[-1] is NEW[0]


def test_sdk_sanitizer_leaves_a_masked_request_as_it_is() -> None:
    from agents.run_internal.items import drop_orphan_function_calls

    r = pp.pack(history(), NEW, 2500, masking=pp.Masking(excerpt_tokens=32))
    assert r.masked
    n = len(r.kept_history)
    assert drop_orphan_function_calls(list(r.items), pruning_indexes=set(range(n))) == r.items
    assert drop_orphan_function_calls(list(r.items)) == r.items


def test_after_turns_and_excerpt_size() -> None:
    h = history(4, 100)
    r = pp.pack(h, NEW, 10**6, masking=pp.Masking(after_turns=1))
    assert r.masked == [3, 8, 13] and len(r.kept_history) == len(h)
    r0 = pp.pack(h, NEW, 10**6, masking=pp.Masking(after_turns=0))
    assert r0.masked == [3, 8, 13, 18]
    small = pp.pack(h, NEW, 10**6, masking=pp.Masking(excerpt_tokens=16, after_turns=0))
    assert small.history_tokens < r0.history_tokens
    assert pp.pack(h, NEW, 10**6, masking=pp.Masking()).masked == []  # everything fits whole


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"excerpt_tokens": 15}, ValueError),
        ({"excerpt_tokens": -1}, ValueError),
        ({"excerpt_tokens": 2**64}, ValueError),
        ({"excerpt_tokens": 64.0}, TypeError),
        ({"excerpt_tokens": True}, TypeError),
        ({"after_turns": -1}, ValueError),
        ({"after_turns": "2"}, TypeError),
    ],
)
def test_bad_masking_arguments_name_the_argument(kwargs: dict[str, Any], error: type) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        pp.Masking(**kwargs)


def test_masking_must_be_a_masking() -> None:
    with pytest.raises(TypeError, match="masking must be a Masking"):
        pp.pack(history(1), NEW, 100, masking={"excerpt_tokens": 64})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="masking must be a Masking"):
        pp.TokenBudgetedContextBuilder(None, max_tokens=100, masking=64)  # type: ignore[arg-type]


def test_a_history_index_masks_exactly_like_pack_and_keeps_masked_costs() -> None:
    h = history(10)
    index = pp.HistoryIndex()
    m = pp.Masking()
    for end in (20, 35, 50):
        seen = copy.deepcopy(h[:end])  # fresh copies every turn, as the SDK hands them over
        got = index.pack(seen, NEW, 4000, masking=m)
        want = pp.pack(h[:end], NEW, 4000, masking=m)
        assert got.items == want.items and got.masked == want.masked
        assert list(got.decisions) == list(want.decisions)
        assert (got.used, got.masking_saved) == (want.used, want.masking_saved)
    # Another excerpt size or no masking: the index packs those exactly too.
    for other in (pp.Masking(excerpt_tokens=20), None):
        got = index.pack(copy.deepcopy(h), NEW, 4000, masking=other)
        want = pp.pack(h, NEW, 4000, masking=other)
        assert got.items == want.items and list(got.decisions) == list(want.decisions)


def test_a_changed_item_behind_the_index_is_refused_not_sent() -> None:
    h = history(6)
    index = pp.HistoryIndex()
    index.pack(h, NEW, 3000, masking=pp.Masking())
    changed = copy.deepcopy(h)
    changed[3]["output"] = "entirely different output\n" * 500
    with pytest.raises(pp.InvalidItemError, match=r"history\[3\]: field output: changed since"):
        index.pack(changed, NEW, 3000, masking=pp.Masking())


def test_every_tool_output_kind_is_masked_with_its_graph_intact() -> None:
    from agents.run_internal.items import drop_orphan_function_calls

    text = "line of output 42\n" * 200
    h: list[dict[str, Any]] = [
        {"role": "user", "content": "do everything"},
        {"type": "custom_tool_call", "call_id": "k1", "name": "grep", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "k1", "output": text},
        {
            "type": "function_call",
            "call_id": "f1",
            "name": "chart",
            "arguments": "{}",
        },
        {
            "type": "function_call_output",
            "call_id": "f1",
            "output": [
                {"type": "input_text", "text": text},
                {"type": "input_image", "image_url": "https://example.com/c.png"},
            ],
        },
        {
            "type": "shell_call",
            "call_id": "s1",
            "status": "completed",
            "action": {"commands": ["ls"]},
        },
        {
            "type": "shell_call_output",
            "call_id": "s1",
            "output": [{"stdout": text, "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
        },
        {
            "type": "local_shell_call",
            "id": "lsh_1",
            "call_id": "l1",
            "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}},
        },
        {"type": "local_shell_call_output", "call_id": "l1", "output": text},
        {
            "type": "apply_patch_call",
            "call_id": "a1",
            "status": "completed",
            "operation": {"type": "delete_file", "path": "x"},
        },
        {"type": "apply_patch_call_output", "call_id": "a1", "status": "completed", "output": text},
        {
            "type": "computer_call",
            "id": "cu_1",
            "call_id": "u1",
            "status": "completed",
            "action": {"type": "screenshot"},
            "pending_safety_checks": [],
        },
        {
            "type": "computer_call_output",
            "call_id": "u1",
            "output": {"type": "computer_screenshot", "file_id": "file_1"},
        },
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "name": "crm",
            "server_label": "s",
            "arguments": "{}",
            "status": "completed",
            "output": text,
        },
        {
            "type": "tool_search_call",
            "call_id": "t1",
            "execution": "client",
            "arguments": {"query": "crm"},
            "status": "completed",
        },
        {
            "type": "tool_search_output",
            "call_id": "t1",
            "execution": "client",
            "status": "completed",
            "tools": [
                {
                    "type": "function",
                    "name": "crm_find",
                    "description": text,
                    "strict": True,
                    "parameters": {
                        "type": "object",
                        "properties": {"q": {"type": "string", "description": "query"}},
                    },
                }
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "done", "annotations": []}],
        },
    ]
    before = copy.deepcopy(h)
    r = pp.pack(h, NEW, 10**6, masking=pp.Masking(after_turns=0))
    assert r.masked == [2, 4, 6, 8, 10, 12, 13, 15]
    assert h == before
    sent = {p: r.items[k] for k, p in enumerate(r.kept_history)}
    assert "grep output (call k1)" in sent[2]["output"]
    assert "1 image or file of this chart output (call f1)" in sent[4]["output"]
    assert isinstance(sent[4]["output"], str)
    assert (
        MARK in sent[6]["output"][0]["stdout"] and sent[6]["output"][0]["outcome"]["exit_code"] == 0
    )
    assert "local_shell output (call l1)" in sent[8]["output"]
    assert "apply_patch output (call a1)" in sent[10]["output"]
    assert sent[12]["output"]["image_url"].startswith("data:image/png;base64,")
    assert "crm output (call mcp_1)" in sent[13]["output"]
    tool = sent[15]["tools"][0]
    assert tool["name"] == "crm_find" and tool["description"] == ""
    assert tool["parameters"] == {"type": "object", "properties": {"q": {"type": "string"}}}
    n = len(r.kept_history)
    assert drop_orphan_function_calls(list(r.items), pruning_indexes=set(range(n))) == r.items
    for p in r.masked:
        assert pp.item_tokens(sent[p]).total < pp.item_tokens(h[p]).total
    report = pp.analyze(list(sent.values()), NEW)
    assert not report.invalid_units


def test_builder_masks_by_default_and_can_be_turned_off() -> None:
    h = history()
    on = pp.TokenBudgetedContextBuilder(None, max_tokens=3000)
    assert on.masking == pp.Masking()
    plan = on.build(h, NEW)
    assert plan.pack.masked and plan.masked_items
    assert all(MARK in m["output"] for m in plan.masked_items)
    assert "masked:" in plan.explain()
    off = pp.TokenBudgetedContextBuilder(None, max_tokens=3000, masking=None)
    plain = off.build(h, NEW)
    assert not plain.pack.masked and not plain.masked_items
    assert plain.items == pp.pack(h, NEW, 3000).items
    small = pp.TokenBudgetedContextBuilder(None, max_tokens=10**6)
    assert small.build(h, NEW).items == h + NEW, "a history that fits is sent as it is"


# ------------------------------------------------------------------ the session, end to end


def _agents() -> Any:
    return pytest.importorskip("agents")


_BIG: list[Any] = []


def big_lookup() -> Any:
    """A tool whose outputs are long (~600 tokens)."""
    if not _BIG:
        from agents import function_tool

        @function_tool
        def lookup(name: str) -> str:
            """Look something up."""
            return f"{name}: " + "row of details 42\n" * 120

        _BIG.append(lookup)
    return _BIG[0]


def script(i: int) -> list[Any]:
    from agents.testing import assistant_message, function_call

    return [
        [function_call("lookup", {"name": f"q{i}"}, call_id=f"call_{i}_a")],
        [function_call("lookup", {"name": f"r{i}"}, call_id=f"call_{i}_b")],
        [assistant_message(f"answer {i}", item_id=f"msg_{i}")],
    ]


class Side:
    """One session with a budgeted callback and a scripted model per turn; records what the
    model was sent."""

    def __init__(self, db: str, masking: pp.Masking | None, **options: Any) -> None:
        from protoprompt.integrations import ProtoPromptSession

        self.session = ProtoPromptSession("chat", db, **options)
        self.builder = pp.TokenBudgetedContextBuilder(
            None, max_tokens=2500, output_reserve=100, masking=masking
        )
        self.callback = self.session.input_callback(self.builder, system_prompt="Be brief.")
        self.sent: list[list[Any]] = []
        self.plans: list[Any] = []

    def config(self) -> Any:
        from agents import RunConfig

        return RunConfig(session_input_callback=self.callback, tracing_disabled=True)

    def agent(self, i: int) -> Any:
        from agents import Agent
        from agents.testing import ScriptedModel

        model = ScriptedModel(script(i))
        self.models = getattr(self, "models", []) + [model]
        return Agent(name="a", model=model, tools=[big_lookup()])

    async def turn(self, i: int, mode: str) -> None:
        from agents import Runner

        agent, question = self.agent(i), f"question {i}"
        if mode == "run":
            await Runner.run(agent, question, session=self.session, run_config=self.config())
        elif mode == "streamed":
            result = Runner.run_streamed(
                agent, question, session=self.session, run_config=self.config()
            )
            async for _ in result.stream_events():
                pass
        else:
            await asyncio.to_thread(
                Runner.run_sync, agent, question, session=self.session, run_config=self.config()
            )
        self.sent.append([c.input for c in self.models[-1].calls][0])
        self.plans.append(self.builder.last_plan)

    def close(self) -> None:
        self.session.close()


@pytest.mark.parametrize("mode", ["run", "streamed", "sync"])
async def test_sessions_store_exactly_what_they_store_without_masking(tmp_path, mode) -> None:
    _agents()
    masked = Side(str(tmp_path / "m.db"), pp.Masking())
    plain = Side(str(tmp_path / "p.db"), None)
    for i in range(6):
        await masked.turn(i, mode)
        await plain.turn(i, mode)
    stored = await masked.session.get_items()
    assert stored == await plain.session.get_items()
    assert not any(MARK in json.dumps(i) for i in stored), "no masked copy is ever stored"
    assert not any(i.get("role") == "system" for i in stored)
    assert masked.session.pending_masked_count == 0
    # The model was sent masked copies once the history no longer fit whole.
    assert any(MARK in json.dumps(s) for s in masked.sent[3:])
    assert not any(MARK in json.dumps(s) for s in plain.sent)
    for sent, plan in zip(masked.sent, masked.plans):
        assert sent == plan.items
        assert sum(pp.item_tokens(i).total for i in sent) == plan.request_tokens <= 2400
    last = masked.plans[-1]
    kept_turns = sum(1 for i in masked.sent[-1] if i.get("role") == "user")
    assert kept_turns > sum(1 for i in plain.sent[-1] if i.get("role") == "user")
    assert last.pack.masking_saved > 0
    masked.close()
    plain.close()


@pytest.mark.parametrize("masking", [pp.Masking(), None])
async def test_an_interrupted_run_resumed_from_its_state_stores_the_same(tmp_path, masking) -> None:
    _agents()
    from agents import Agent, RunConfig, Runner, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    @function_tool(needs_approval=True)
    def cancel(reason: str) -> str:
        """Cancel (a human must approve)."""
        return "cancelled " + "log line\n" * 80

    results: dict[str, Any] = {}
    for name, m in (("masked", masking), ("plain", None)):
        side = Side(str(tmp_path / f"{name}.db"), m)
        for i in range(4):
            await side.turn(i, "run")
        model = ScriptedModel(
            [
                [function_call("cancel", {"reason": "r"}, call_id="c_cancel")],
                [assistant_message("Cancelled.", item_id="m_done")],
            ]
        )
        agent = Agent(name="a", model=model, tools=[cancel, big_lookup()])
        config = RunConfig(session_input_callback=side.callback, tracing_disabled=True)
        first = await Runner.run(agent, "cancel it", session=side.session, run_config=config)
        assert len(first.interruptions) == 1
        state = first.to_state()
        state.approve(first.interruptions[0])
        resumed = await Runner.run(agent, state, session=side.session, run_config=config)
        assert resumed.final_output == "Cancelled."
        results[name] = (await side.session.get_items(), [c.input for c in model.calls])
        side.close()
    stored, calls = results["masked"]
    assert stored == results["plain"][0]
    assert not any(MARK in json.dumps(i) for i in stored)
    if masking is not None:
        assert all(MARK in json.dumps(c) for c in calls), "masked on the resumed calls too"


async def test_a_direct_call_of_the_callback_keeps_its_copies_out_of_the_store(tmp_path) -> None:
    _agents()
    from protoprompt.integrations import ProtoPromptSession

    session = ProtoPromptSession("chat")
    h = history()
    await session.add_items(h)
    callback = session.input_callback(pp.TokenBudgetedContextBuilder(None, max_tokens=3000))
    items = await callback(await session.get_items(), list(NEW))
    copies = [i for i in items if MARK in json.dumps(i)]
    assert copies and session.pending_masked_count == len(copies)
    # A caller that stores what the callback returned (as a wrapped callback's run would):
    # the copies (and fresh JSON copies of them) are kept out, the new input is stored.
    await session.add_items([json.loads(json.dumps(i)) for i in items if i not in h])
    assert await session.get_items() == h + NEW
    assert session.pending_masked_count == 0 and session.pending_context_count == 0


async def test_windowed_reads_with_masking_send_and_store_what_full_reads_do(tmp_path) -> None:
    _agents()
    win = Side(str(tmp_path / "w.db"), pp.Masking(), windowed_reads=True)
    full = Side(str(tmp_path / "f.db"), pp.Masking(), incremental=False)
    for i in range(20):
        await win.turn(i, "run")
        await full.turn(i, "run")
    assert win.sent == full.sent
    assert await win.session.get_items() == await full.session.get_items()
    windows = [p.turn for p in win.plans if p.turn is not None and p.turn.windowed]
    assert len(windows) >= 8, "the fast path is taken"
    assert windows[-1].read_items < windows[-1].history_items  # items before the window
    assert all(MARK in json.dumps(s) for s in win.sent[6:]), "masked units in the windows"
    # The masked window reaches further back than an unmasked one would.
    index = win.session._index_state.index
    budget = 2400
    assert index.window_start([], budget, masking=pp.Masking()) < index.window_start([], budget)
    win.close()
    full.close()


# ------------------------------------------------------------------ protoprompt inspect


def test_inspect_masking_shows_masked_units_and_tokens_saved(tmp_path, capsys) -> None:
    _agents()
    from agents.memory import SQLiteSession

    from protoprompt.cli import main

    db = tmp_path / "agents.db"
    h = history()
    plain = SQLiteSession("chat", str(db))
    asyncio.run(plain.add_items(h))
    plain.close()
    args = ["inspect", str(db), "--session", "chat", "--budget", "3000"]
    assert main([*args, "--json", "--no-masking"]) == 0
    without = json.loads(capsys.readouterr().out)
    assert without["masked_units"] == 0 and without["kept_items"] < len(h)
    assert main([*args, "--json", "--masking"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert main([*args, "--json"]) == 0  # masking by default, as a session's builder
    assert json.loads(capsys.readouterr().out) == report
    want = pp.pack(h, [], 3000, masking=pp.Masking())
    assert report["kept_items"] == len(want.kept_history) == len(h)
    assert report["masking_saved"] == want.masking_saved > 0
    assert report["masked_items"] == len(want.masked) == 5
    masked = [u for u in report["units"] if u["decision"] == "masked"]
    assert [u["masked_tokens"] for u in masked] == [
        d.masked_tokens for d in want.decisions if d.decision == "masked"
    ]
    assert all("masked" in u["reason"] for u in masked)
    assert main([*args, "--masking"]) == 0
    table = capsys.readouterr().out
    first = masked[0]
    assert f"{first['tokens']}->{first['masked_tokens']}" in table
    assert f"saving {want.masking_saved} tokens" in table
    assert main([*args, "--masking", "--mask-after-turns", "0", "--excerpt-tokens", "20"]) == 0
    assert "masked 6 tool outputs" in capsys.readouterr().out
    assert main([*args, "--no-masking", "--excerpt-tokens", "20"]) == 1
    assert "need masking (not --no-masking)" in capsys.readouterr().err
    assert main([*args, "--masking", "--excerpt-tokens", "8"]) == 2
    assert "must be at least 16" in capsys.readouterr().err
