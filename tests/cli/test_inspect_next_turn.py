"""``protoprompt inspect`` says whether the next turn of a stored session can read a token
window, from which row, and if not why not (the reasons of a turn's plan) -- and what it
says is what a ``ProtoPromptSession(windowed_reads=True)`` then does."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents.memory import SQLiteSession  # noqa: E402
from agents.run_internal.session_persistence import prepare_input_with_session  # noqa: E402
from history_gen import generate  # noqa: E402

from protoprompt import TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.cli import main  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402


def seed(db: Path, items: list[dict[str, Any]]) -> None:
    async def go() -> None:
        plain = SQLiteSession("s", str(db))
        await plain.add_items(items)
        plain.close()

    asyncio.run(go())


def inspect(capsys: pytest.CaptureFixture[str], db: Path, *args: str) -> dict[str, Any]:
    assert main(["inspect", str(db), "--session", "s", "--json", *args]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report["next_turn"]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_inspect_predicts_the_window_a_session_reads(tmp_path, capsys) -> None:
    db = tmp_path / "rich.db"
    seed(db, generate(3000, "agentic", 6))
    before = digest(db)
    # --masking: the session's builder masks (its default), and a masked pack's window may
    # reach further back.
    predicted = inspect(capsys, db, "--budget", "20000", "--output-reserve", "1000", "--masking")
    assert digest(db) == before  # read-only
    assert predicted["windowed"] and predicted["reason"] is None
    assert 0 < predicted["items"] < 300 and predicted["snapshot_items"] is None
    assert main(["inspect", str(db), "--session", "s", "--budget", "20000"]) == 0
    text = capsys.readouterr().out
    assert "next turn windowed: yes, from row" in text
    assert "no index snapshot stored" in text
    # A session serving the database: its first turn reads everything (nothing indexed),
    # the next one reads exactly the window inspect predicted.
    session = ProtoPromptSession("s", str(db), windowed_reads=True)
    builder = TokenBudgetedContextBuilder(None, max_tokens=20_000, output_reserve=1000)
    plans: list[Any] = []
    callback = session.input_callback(builder, on_plan=plans.append)
    question = [{"role": "user", "content": "and now?"}]
    asyncio.run(prepare_input_with_session(question, session, callback))
    session._debug_state(wait_for_save=True)
    stored = [
        *question,
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_x",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        },
    ]
    asyncio.run(session.add_items(stored))
    session._debug_state(wait_for_save=True)
    predicted = inspect(
        capsys,
        db,
        *("--budget", "20000", "--output-reserve", "1000", "--input", "what next?", "--masking"),
    )
    asyncio.run(
        prepare_input_with_session([{"role": "user", "content": "what next?"}], session, callback)
    )
    report = plans[-1].turn
    assert report.windowed, report.lines()
    assert (report.window_row, report.read_items) == (predicted["row"], predicted["items"])
    assert predicted["snapshot_items"] == 3000
    session.close()


def test_inspect_says_why_a_window_cannot_be_read(tmp_path, capsys) -> None:
    db = tmp_path / "chat.db"
    chat = [
        item
        for i in range(120)
        for item in (
            {"role": "user", "content": f"q{i} " + "word " * 30},
            {
                "type": "message",
                "role": "assistant",
                "id": f"m{i}",
                "status": "completed",
                "content": [{"type": "output_text", "text": "w " * 40, "annotations": []}],
            },
        )
    ]
    seed(db, chat)
    assert inspect(capsys, db, "--budget", "3000")["windowed"]
    greedy = inspect(capsys, db, "--budget", "3000", "--policy", "greedy")
    assert (greedy["windowed"], greedy["reason"]) == (False, "greedy_policy")
    limited = inspect(capsys, db, "--budget", "3000", "--limit", "40")
    assert limited["reason"] == "session_limit"
    fits = inspect(capsys, db, "--budget", "1000000")
    assert (fits["reason"], fits["why"]) == ("fits", "the budget reaches every stored item")
    # A hosted call id repeated at the start and at the end ties the history together.
    ws = {"type": "web_search_call", "id": "ws_same", "status": "completed", "action": {}}
    db2 = tmp_path / "tied.db"
    seed(db2, [ws, *chat, {"role": "user", "content": "again"}, ws])
    tied = inspect(capsys, db2, "--budget", "3000")
    assert tied["reason"] == "no_window"
    assert tied["why"] == (
        f"no window provable: history[0] and history[{len(chat) + 2}] are one unit"
    )
    assert main(["inspect", str(db2), "--session", "s", "--budget", "3000"]) == 0
    assert "next turn windowed: no (no window provable: history[0] and" in capsys.readouterr().out
    # A window the tie widens to (almost) the whole history says so.
    long_chat = chat * 5
    db3 = tmp_path / "wide.db"
    seed(db3, [chat[0], ws, *long_chat, {"role": "user", "content": "again"}, ws])
    wide = inspect(capsys, db3, "--budget", "3000")
    assert wide["windowed"] and wide["start"] == 1
    tie = f"widened: history[1] and history[{len(long_chat) + 3}] are one unit"
    assert wide["why"].endswith(tie), wide
    # The database is never written.
    assert sqlite3.connect(db3).execute("SELECT COUNT(*) FROM agent_messages").fetchone()[0] > 0


def _tool_heavy(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items += [
            {"role": "user", "content": f"check batch {i}"},
            {"type": "function_call", "call_id": f"c{i}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": "line item " * 300},
            {
                "type": "message",
                "role": "assistant",
                "id": f"m{i}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"batch {i} ok", "annotations": []}],
            },
        ]
    return items


def test_inspect_masks_as_a_session_does_and_predicts_its_window(tmp_path, capsys) -> None:
    db = tmp_path / "tools.db"
    seed(db, _tool_heavy(40))
    args = ("--budget", "6000", "--output-reserve", "500", "--input", "and now?")
    masked = inspect(capsys, db, *args)
    whole = inspect(capsys, db, *args, "--no-masking")
    assert masked["windowed"] and whole["windowed"]
    # Masked old outputs cost an excerpt: the budget reaches further back.
    assert masked["items"] > whole["items"], (masked, whole)
    assert main(["inspect", str(db), "--session", "s", *args]) == 0
    table = capsys.readouterr().out
    assert " masked " in table and "fits with its tool outputs masked" in table

    # A session with the builder's default masking reads the window inspect predicted.
    session = ProtoPromptSession("s", str(db))
    builder = TokenBudgetedContextBuilder(None, max_tokens=6_000, output_reserve=500)
    plans: list[Any] = []
    callback = session.input_callback(builder, on_plan=plans.append)
    first = [{"role": "user", "content": "first"}]
    asyncio.run(prepare_input_with_session(first, session, callback))
    session._debug_state(wait_for_save=True)
    question = [{"role": "user", "content": "and now?"}]
    asyncio.run(prepare_input_with_session(question, session, callback))
    report = plans[-1].turn
    assert report.windowed, report.lines()
    assert (report.window_row, report.read_items) == (masked["row"], masked["items"])
    session.close()


def test_no_masking_refuses_masking_options(tmp_path, capsys) -> None:
    db = tmp_path / "tools.db"
    seed(db, _tool_heavy(2))
    status = main(["inspect", str(db), "--session", "s", "--no-masking", "--excerpt-tokens", "32"])
    assert status == 1
    assert "need masking (not --no-masking)" in capsys.readouterr().err
