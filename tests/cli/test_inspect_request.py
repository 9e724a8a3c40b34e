"""``protoprompt inspect`` tells the truth: which unit stopped the fill and why, the tokens
left, and with the agent's instructions and tools (or a ``--request`` file) the whole request
-- the same request, section by section, as the run's first model call."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

agents = pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402
from pydantic import BaseModel  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt.cli import main  # noqa: E402
from protoprompt.integrations import ModelCallPlan, ProtoPromptSession  # noqa: E402
from protoprompt.integrations._calls._request import output_format  # noqa: E402
from protoprompt.integrations.model_filter import tool_definitions  # noqa: E402

INSTRUCTIONS = "You answer questions about the contract, briefly."


@function_tool
def lookup(name: str) -> str:
    """Look up a clause of the contract by its title."""
    return f"clause {name}: " + "the parties agree to many things. " * 20


class Answer(BaseModel):
    text: str
    clause: str


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_names_the_unit_that_stopped_the_fill(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The issue's case: the older user message of a turn does not fit, the newer unit of
    that turn would have. inspect blames the user message, says what was left when it was
    tried, and never says the budget was full while tokens remain."""
    db = tmp_path / "agents.db"
    big = "Please read all of this. " + "word " * 300
    steps = [
        [function_call("lookup", {"name": "a"}, call_id="c1")],
        [assistant_message("done", item_id="m1")],
        [assistant_message("fine", item_id="m2")],
    ]
    agent = Agent(name="a", model=ScriptedModel(steps), tools=[lookup])

    async def write() -> None:
        session = SQLiteSession("chat", db)
        await Runner.run(agent, big, session=session)
        await Runner.run(agent, "small", session=session)
        session.close()

    asyncio.run(write())
    history = asyncio.run(SQLiteSession("chat", db).get_items())
    cost = [pp.item_tokens(i).total for i in history]
    # the second turn and the first turn's call, output and answer fit; its question not
    budget = sum(cost[1:]) + 14
    code, out, err = run_cli(
        capsys,
        "inspect",
        str(db),
        "--session",
        "chat",
        "--budget",
        str(budget),
        "--json",
        "--no-masking",
    )
    assert code == 0, err
    report = json.loads(out)
    stop = report["stop"]
    assert stop["positions"] == [0] and stop["left"] == 14 and stop["cause"] == "whole"
    assert stop["reason"].startswith(f"the fill stopped here: needs {cost[0]} tokens, 14 left")
    by_unit = {u["positions"][0]: u for u in report["units"]}
    assert by_unit[1]["decision"] == "turn_incomplete"
    assert "history[0] did not fit" in by_unit[1]["reason"]
    assert report["remaining"] == budget - report["used"]
    assert report["remaining"] == 14 + sum(cost[1:4])  # what the dropped units gave back
    code, out, _ = run_cli(
        capsys, "inspect", str(db), "--session", "chat", "--budget", str(budget), "--no-masking"
    )
    assert "budget was full" not in out
    assert f"the fill stopped at unit 0 (row {stop['rows'][0]}): needs {cost[0]} tokens" in out


async def first_call(
    db: Path, agent: Agent[Any], question: str, budget: int, reserve: int
) -> ModelCallPlan:
    """The plan of the first model call of a run on the stored session."""
    calls: list[ModelCallPlan] = []
    session = ProtoPromptSession("chat", str(db))
    config = session.run_config(
        agent=agent,
        model="gpt-5",
        max_tokens=budget,
        output_reserve=reserve,
        on_call=calls.append,
        tracing_disabled=True,
        cache=None,  # inspect shows the newest-first pack (no prefix state to extend)
    )
    await Runner.run(agent, question, session=session, run_config=config)
    session.close()
    return calls[0]


def stored(db: Path, agent: Agent[Any], turns: int) -> None:
    async def write() -> None:
        session = SQLiteSession("chat", db)
        for t in range(turns):
            await Runner.run(agent, f"question {t}: what does clause {t} say?", session=session)
        session.close()

    asyncio.run(write())


@pytest.mark.parametrize("how", ["options", "request"])
def test_inspect_shows_the_whole_request_of_the_next_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    """inspect with the agent's instructions, tools and output schema reports the sections of
    the next turn's first model call exactly (tokens and items)."""
    db = tmp_path / "agents.db"
    steps: list[list[Any]] = []
    for t in range(5):
        answer = Answer(text=f"answer {t} " + "words " * 40, clause=f"c{t}").model_dump_json()
        steps += [
            [function_call("lookup", {"name": f"c{t}"}, call_id=f"call_{t}")],
            [assistant_message(answer, item_id=f"m{t}")],
        ]
    agent = Agent(
        name="a",
        instructions=INSTRUCTIONS,
        model=ScriptedModel(steps),
        tools=[lookup],
        output_type=Answer,
    )
    stored(db, agent, 4)
    question, budget, reserve = "and clause 9?", 1500, 100
    args = [
        "inspect", str(db), "--session", "chat", "--budget", str(budget), "--model", "gpt-5",
        "--output-reserve", str(reserve), "--masking", "--json",
    ]  # fmt: skip
    tools = tool_definitions([lookup])
    text = output_format(agent)
    if how == "options":
        assert text is not None
        (tmp_path / "tools.json").write_text(json.dumps(tools))
        (tmp_path / "request.json").write_text(json.dumps({"text": text}))
        args += ["--instructions", INSTRUCTIONS, "--tools", str(tmp_path / "tools.json")]
        args += ["--request", str(tmp_path / "request.json"), "--input", question]
    else:
        body = {"instructions": INSTRUCTIONS, "tools": tools, "text": text, "input": question}
        (tmp_path / "request.json").write_text(json.dumps(body))
        args += ["--request", str(tmp_path / "request.json")]
    code, out, err = run_cli(capsys, *args)
    assert code == 0, err
    report = json.loads(out)
    call = asyncio.run(first_call(db, agent, question, budget, reserve))
    got = [(s["name"], s["tokens"], s["items"]) for s in report["sections"]]
    assert got == [(s.name, s.tokens, s.items) for s in call.sections]
    assert report["used"] == call.used
    assert report["request"] == {
        "instructions": call.instructions_tokens,
        "tools": call.tools_tokens,
        "output_schema": call.output_schema_tokens,
    }
    assert call.output_schema_tokens > 0 and call.tools_tokens > 0


def test_what_inspect_was_not_given_it_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "agents.db"
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("ok", item_id="m")]]))
    stored(db, agent, 1)
    code, out, err = run_cli(
        capsys, "inspect", str(db), "--session", "chat", "--instructions", "Be brief."
    )
    assert code == 0, err
    lines = {line[:18].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert "not given" in lines["tools"] and "not given" in lines["output schema"]
    assert "not given" not in lines["instructions"]
    code, out, err = run_cli(capsys, "inspect", str(db), "--session", "chat")
    assert "not given: pass --instructions, --tools or --request" in out


@pytest.mark.parametrize(
    ("files", "extra", "status", "message"),
    [
        ({"r.json": "not json"}, ["--request", "r.json"], 1, "--request 'r.json' is not JSON"),
        ({"r.json": "[1]"}, ["--request", "r.json"], 1, "must hold a JSON object"),
        ({"t.json": '{"a": 1}'}, ["--tools", "t.json"], 1, "JSON array of tool definitions"),
        (
            {"r.json": '{"instructions": "x"}'},
            ["--request", "r.json", "--instructions", "y"],
            1,
            "give the instructions once",
        ),
        (
            {"r.json": '{"input": "x"}'},
            ["--request", "r.json", "--input", "y"],
            2,
            "give the next turn's input once",
        ),
        ({"r.json": '{"input": 5}'}, ["--request", "r.json"], 1, "input must be a string"),
        (
            {"r.json": '{"text": {"format": "json"}}'},
            ["--request", "r.json"],
            1,
            "text.format must be an object",
        ),
        ({}, ["--tools", "missing.json"], 1, "cannot read --tools"),
    ],
)
def test_bad_request_files_are_named(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    files: dict[str, str],
    extra: list[str],
    status: int,
    message: str,
) -> None:
    db = tmp_path / "agents.db"
    agent = Agent(name="a", model=ScriptedModel([[assistant_message("ok", item_id="m")]]))
    stored(db, agent, 1)
    monkeypatch.chdir(tmp_path)
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    code, out, err = run_cli(capsys, "inspect", str(db), "--session", "chat", *extra)
    assert code == status, err
    assert message in err and "Traceback" not in err
