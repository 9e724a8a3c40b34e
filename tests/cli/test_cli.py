"""The ``protoprompt`` command: ``inspect`` on a database the Agents SDK wrote, ``count``
against the library's own counts, help and errors. Mostly in process (``main(argv)``); the
installed console script is run once per command as a user would."""

from __future__ import annotations

import asyncio
import hashlib
import importlib.metadata
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import protoprompt as pp
from protoprompt.cli import main

agents = pytest.importorskip("agents")

from agents import Agent, Runner, function_tool  # noqa: E402
from agents.memory import SQLiteSession  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def protoprompt_command() -> list[str]:
    script = Path(sys.executable).with_name("protoprompt")
    return [str(script)] if script.exists() else [sys.executable, "-m", "protoprompt"]


@function_tool
def lookup_clause(name: str) -> str:
    """Return the text of a contract clause."""
    return f"clause {name}: " + "the agreement renews every March unless cancelled. " * 8


async def write_session(db: Path, session_id: str, turns: int) -> None:
    steps: list[Any] = []
    for t in range(turns):
        steps += [
            [function_call("lookup_clause", {"name": f"c{t}"}, call_id=f"call_{t}")],
            [assistant_message(f"Answer {t}: it renews in March.", item_id=f"msg_{t}")],
        ]
    agent = Agent(name="assistant", model=ScriptedModel(steps), tools=[lookup_clause])
    session = SQLiteSession(session_id, db)
    try:
        for t in range(turns):
            await Runner.run(agent, f"Question {t}: when does the contract renew?", session=session)
    finally:
        session.close()


@pytest.fixture(scope="module")
def sdk_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("cli") / "agents.db"
    asyncio.run(write_session(db, "legal-chat", 4))
    asyncio.run(write_session(db, "other", 1))
    # As in production, the memory store shares the file (and switches it to WAL mode).
    with pp.MemoryStore(db) as store:
        store.remember("Alice negotiates the renewal.", scope=pp.MemoryScope("acme", "alice"))
    return db


def sdk_items(db: Path, session_id: str, limit: int | None = None) -> list[Any]:
    session = SQLiteSession(session_id, db)
    try:
        return asyncio.run(session.get_items(limit))
    finally:
        session.close()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- inspect


def test_inspect_json_is_a_fresh_pack_of_the_sdk_history(
    sdk_db: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    history = sdk_items(sdk_db, "legal-chat")
    assert len(history) == 16  # 4 turns: user, call, output, answer
    total = sum(pp.item_tokens(i).total for i in history)
    before = digest(sdk_db)
    for budget, reserve, policy in (
        (10**6, 0, "contiguous"),
        (total // 2, 50, "contiguous"),
        (total // 2, 50, "greedy"),
    ):
        code, out, err = run_cli(
            capsys,
            "inspect",
            str(sdk_db),
            "--session",
            "legal-chat",
            "--budget",
            str(budget),
            "--output-reserve",
            str(reserve),
            "--policy",
            policy,
            "--model",
            "gpt-5",
            "--json",
        )
        assert code == 0, err
        report = json.loads(out)
        expected = pp.pack(
            history, [], budget, output_reserve=reserve, model="gpt-5", policy=policy
        )
        assert report["items"] == len(history)
        assert (
            report["budget"],
            report["used"],
            report["remaining"],
            report["encoding"],
            report["policy"],
            report["output_reserve"],
            report["history_tokens"],
        ) == (
            expected.budget,
            expected.used,
            expected.remaining,
            expected.encoding,
            expected.policy,
            expected.output_reserve,
            expected.history_tokens,
        )
        assert [
            (u["unit"], u["positions"], u["kinds"], u["tokens"], u["decision"])
            for u in report["units"]
        ] == [(d.unit, d.positions, d.kinds, d.tokens, d.decision) for d in expected.decisions]
        kept_positions = sorted(p for u in report["units"] if u["kept"] for p in u["positions"])
        assert kept_positions == expected.kept_history
        assert report["kept_items"] == len(expected.kept_history)
        assert report["decision_counts"] == expected.decision_counts()
        # Row ids are the SDK's own, in order; every unit has a reason and a preview.
        ids = [
            r
            for (r,) in sqlite3.connect(sdk_db).execute(
                "SELECT id FROM agent_messages WHERE session_id = 'legal-chat' ORDER BY id"
            )
        ]
        assert all(u["rows"] == [ids[p] for p in u["positions"]] for u in report["units"])
        assert sorted(r for u in report["units"] for r in u["rows"]) == ids
        assert all(u["reason"] for u in report["units"])
        if budget < total:
            assert report["dropped_items"] > 0
            assert any(u["decision"] == "over_budget" for u in report["units"])
    assert digest(sdk_db) == before  # read-only: the database is unchanged
    assert sqlite3.connect(sdk_db).execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_inspect_table_for_a_person(sdk_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = sdk_items(sdk_db, "legal-chat")
    budget = sum(pp.item_tokens(i).total for i in history) // 2
    code, out, err = run_cli(
        capsys, "inspect", str(sdk_db), "--session", "legal-chat", "--budget", str(budget)
    )
    assert code == 0, err
    expected = pp.pack(history, [], budget)
    lines = out.splitlines()
    header = next(
        i for i, line in enumerate(lines) if line.split()[:3] == ["unit", "items", "kinds"]
    )
    rows = lines[header + 1 : header + 1 + len(expected.decisions)]
    assert len(rows) == len(expected.decisions) and rows[-1].strip()
    assert lines[header + 1 + len(expected.decisions)] == ""
    for row, d in zip(rows, expected.decisions):
        cells = row.split()
        assert cells[0] == str(d.unit)
        assert d.decision in cells
        assert ("-" if d.tokens is None else str(d.tokens)) in cells
    assert any("user: Question 3" in row for row in rows)
    assert any("lookup_clause(" in row for row in rows)
    assert f"used: {expected.used:,} of {budget:,} tokens (o200k_base; request " in out
    kept = len(expected.kept_history)
    assert (
        f"policy contiguous: kept {kept} of {len(history)} history items; "
        f"dropped {len(history) - kept}"
    ) in out

    code, out, _ = run_cli(
        capsys,
        "inspect",
        str(sdk_db),
        "--session",
        "legal-chat",
        "--budget",
        str(budget),
        "--dropped",
    )
    assert code == 0
    assert " kept " not in out.split("used: ")[0]
    assert "over_budget" in out


def test_inspect_with_new_input_context_and_limit(
    sdk_db: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    new = [{"role": "user", "content": "And the notice period?"}]
    history = sdk_items(sdk_db, "legal-chat", limit=6)
    code, out, err = run_cli(
        capsys,
        "inspect",
        str(sdk_db),
        "--session",
        "legal-chat",
        "--limit",
        "6",
        "--input",
        new[0]["content"],
        "--context-tokens",
        "120",
        "--budget",
        "900",
        "--encoding",
        "cl100k_base",
        "--json",
    )
    assert code == 0, err
    report = json.loads(out)
    expected = pp.pack(history, new, 900, context_tokens=120, encoding="cl100k_base")
    assert report["items"] == 6
    assert (report["new_input_tokens"], report["context_tokens"], report["used"]) == (
        expected.new_input_tokens,
        120,
        expected.used,
    )
    assert [u["decision"] for u in report["units"]] == [d.decision for d in expected.decisions]


def test_inspect_lists_sessions_and_explains_errors(
    sdk_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(sdk_db), "--json")
    assert code == 0
    sessions = {s["session"]: s["items"] for s in json.loads(out)["sessions"]}
    assert sessions == {"legal-chat": 16, "other": 4}
    code, out, _ = run_cli(capsys, "inspect", str(sdk_db))
    assert code == 0 and "legal-chat" in out and "2 sessions;" in out

    code, _, err = run_cli(capsys, "inspect", str(sdk_db), "--session", "nope")
    assert code == 1 and "no session 'nope'" in err and "'legal-chat'" in err
    code, _, err = run_cli(capsys, "inspect", str(tmp_path / "missing.db"), "--session", "x")
    assert code == 1 and "no database file" in err
    assert not (tmp_path / "missing.db").exists()
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    code, _, err = run_cli(capsys, "inspect", str(junk), "--session", "x")
    assert code == 1 and "SQLite" in err
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).execute("CREATE TABLE t (x)").connection.commit()
    code, _, err = run_cli(capsys, "inspect", str(empty), "--session", "x")
    assert code == 1 and "no table 'agent_messages'" in err
    code, _, err = run_cli(capsys, "inspect", str(sdk_db), "--budget", "0")
    assert code == 2 and "at least 1" in err
    # A budget too small for the mandatory part is the library's own error, not a crash.
    code, _, err = run_cli(
        capsys,
        "inspect",
        str(sdk_db),
        "--session",
        "legal-chat",
        "--budget",
        "10",
        "--output-reserve",
        "20",
    )
    assert code == 1 and "nothing was sent" in err and "Traceback" not in err


def test_inspect_skips_rows_the_sdk_skips_and_names_bad_rows(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    db = tmp_path / "damaged.db"
    asyncio.run(write_session(db, "s", 1))
    conn = sqlite3.connect(db)
    conn.execute("INSERT INTO agent_messages (session_id, message_data) VALUES ('s', '{oops')")
    conn.commit()
    history = sdk_items(db, "s")  # the SDK skips the row that is not JSON
    code, out, err = run_cli(capsys, "inspect", str(db), "--session", "s", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["items"] == len(history) and len(report["skipped_rows"]) == 1
    assert report["used"] == pp.pack(history, [], 128_000).used
    # A JSON row that is not an item is the library's InvalidItemError, with its row id.
    row = conn.execute(
        "INSERT INTO agent_messages (session_id, message_data) VALUES ('s', '[1, 2]')"
    ).lastrowid
    conn.commit()
    conn.close()
    code, _, err = run_cli(capsys, "inspect", str(db), "--session", "s")
    assert code == 1 and f"history[{len(history)}]" in err and f"row id {row}" in err


# --------------------------------------------------------------------------- count


TEXT = "Renewal. This agreement renews automatically on the first of March each year.\n" * 7


def test_count_text_equals_count_tokens(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text(TEXT, encoding="utf-8")
    for option in ([], ["--model", "gpt-4"], ["--encoding", "o200k_base"], ["--model", "gpt-5"]):
        code, out, err = run_cli(capsys, "count", str(path), *option, "--json")
        assert code == 0, err
        result = json.loads(out)
        kwargs = (
            {"model": option[1]}
            if option[:1] == ["--model"]
            else {"encoding": option[1]}
            if option
            else {}
        )
        assert result == {
            "kind": "text",
            "encoding": result["encoding"],
            "tokens": pp.count_tokens(TEXT, **kwargs),
            "characters": len(TEXT),
        }
    code, out, _ = run_cli(capsys, "count", str(path), "--model", "gpt-4")
    assert (
        out.strip() == f"{pp.count_tokens(TEXT, model='gpt-4')} tokens (cl100k_base), "
        f"{len(TEXT)} characters"
    )


ITEMS = [
    {"role": "user", "content": "When does the contract renew?"},
    {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "renew"}'},
    {"type": "function_call_output", "call_id": "c1", "output": "It renews in March."},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "And this?"},
            {"type": "input_image", "image_url": "https://x/y.png"},
        ],
    },
]


def test_count_items_jsonl_and_array_equal_item_tokens(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    expected = [pp.item_tokens(i, model="gpt-4o") for i in ITEMS]
    jsonl = tmp_path / "items.jsonl"
    jsonl.write_text(
        "\n".join(json.dumps(i) for i in ITEMS[:2])
        + "\n\n"
        + "\n".join(json.dumps(i) for i in ITEMS[2:])
        + "\n",
        encoding="utf-8",
    )
    array = tmp_path / "items.json"
    array.write_text(json.dumps(ITEMS, indent=2), encoding="utf-8")
    for path, lines in ((jsonl, [1, 2, 4, 5]), (array, [None] * 4)):
        code, out, err = run_cli(capsys, "count", str(path), "--model", "gpt-4o", "--json")
        assert code == 0, err
        result = json.loads(out)
        assert result["kind"] == "items"
        assert [(r["text"], r["media"], r["overhead"], r["tokens"]) for r in result["items"]] == [
            (c.text, c.media, c.overhead, c.total) for c in expected
        ]
        assert [r["line"] for r in result["items"]] == lines
        assert result["tokens"] == sum(c.total for c in expected)
        assert result["items"][3]["media"] == 1445  # an image by URL: the maximum
    code, out, _ = run_cli(capsys, "count", str(jsonl), "--model", "gpt-4o")
    assert (
        out.splitlines()[-1] == f"{sum(c.total for c in expected)} tokens in 4 items (o200k_base)"
    )
    # Forced to text, the same file is counted as text.
    code, out, _ = run_cli(capsys, "count", str(jsonl), "--as", "text", "--json")
    assert json.loads(out)["tokens"] == pp.count_tokens(jsonl.read_text(encoding="utf-8"))


def test_count_errors_name_the_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ITEMS[0]) + "\nnot json\n", encoding="utf-8")
    code, _, err = run_cli(capsys, "count", str(bad), "--as", "items")
    assert code == 1 and f"{bad}:2: not JSON" in err
    # Auto mode counts a file that is not all items as text.
    code, out, _ = run_cli(capsys, "count", str(bad), "--json")
    assert code == 0 and json.loads(out)["kind"] == "text"
    nan = tmp_path / "nan.jsonl"
    nan.write_text(json.dumps(ITEMS[0]) + '\n{"role": "user", "content": NaN}\n', encoding="utf-8")
    code, _, err = run_cli(capsys, "count", str(nan))
    assert code == 1 and f"{nan}:2:" in err and "content" in err
    code, _, err = run_cli(capsys, "count", str(tmp_path / "nope.txt"))
    assert code == 1 and "cannot read" in err
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"ok\xff\xfe")
    code, _, err = run_cli(capsys, "count", str(binary))
    assert code == 1 and "not UTF-8" in err and "byte 2" in err
    code, _, err = run_cli(capsys, "count", str(bad), "--model", "no-such-model")
    assert code == 1 and "no-such-model" in err
    code, _, err = run_cli(capsys, "count", str(bad), "--model", "gpt-4", "--encoding", "x")
    assert code == 2 and "not allowed with" in err


# --------------------------------------------------------------------------- the command


def test_console_script_is_declared() -> None:
    try:
        dist = importlib.metadata.distribution("protoprompt")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("protoprompt is not installed as a distribution (source tree on the path)")
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == {"protoprompt": "protoprompt.cli:main"}


def test_installed_command_help_inspect_and_count_from_stdin(sdk_db: Path) -> None:
    cmd = protoprompt_command()
    top = subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120)
    assert top.returncode == 0
    for command in ("mcp", "inspect", "count"):
        assert command in top.stdout
        sub = subprocess.run(cmd + [command, "--help"], capture_output=True, text=True, timeout=120)
        assert sub.returncode == 0 and f"usage: protoprompt {command}" in sub.stdout
    version = subprocess.run(cmd + ["--version"], capture_output=True, text=True, timeout=120)
    assert version.stdout.strip() == f"protoprompt {pp.__version__}"
    counted = subprocess.run(
        cmd + ["count", "--json", "-"], input=TEXT, capture_output=True, text=True, timeout=120
    )
    assert counted.returncode == 0, counted.stderr
    assert json.loads(counted.stdout)["tokens"] == pp.count_tokens(TEXT)
    inspected = subprocess.run(
        cmd + ["inspect", str(sdk_db), "--session", "other", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert inspected.returncode == 0, inspected.stderr
    assert json.loads(inspected.stdout)["items"] == 4
    missing = subprocess.run(
        cmd + ["mcp", "--db", "x.db"], capture_output=True, text=True, timeout=120
    )
    assert missing.returncode == 2 and "--tenant" in missing.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "x.db", "--budget", "0"], "--budget: must be at least 1, got 0"),
        (["inspect", "x.db", "--budget", "lots"], "--budget: expected a whole number, got 'lots'"),
        (["inspect", "x.db", "--output-reserve", "-1"], "--output-reserve: must be 0 or more"),
        (["inspect", "x.db", "--limit", "0"], "--limit: must be at least 1, got 0"),
        (["mcp", "--db", "m.db", "--port", "70000"], "--port: a TCP port is at most 65535"),
        (["mcp", "--db", "m.db", "--port", "-2"], "--port: must be 0 or more, got -2"),
    ],
)
def test_bad_numbers_are_usage_errors_naming_the_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err


# --------------------------------------------------------------------------- issue 22

HUGE = str(2**64)
DIGITS_5000 = "9" * 5000


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["inspect", "x.db", "--budget", HUGE],
            "--budget: a token count is at most 18446744073709551615",
        ),
        (["inspect", "x.db", "--output-reserve", HUGE], "--output-reserve: a token count"),
        (["inspect", "x.db", "--context-tokens", HUGE], "--context-tokens: a token count"),
        (["inspect", "x.db", "--budget", DIGITS_5000], "got 5000 digits"),
        (["inspect", "x.db", "--limit", str(2**63)], "--limit: a row count is at most"),
        (["inspect", "x.db", "--limit", DIGITS_5000], "--limit: a row count is at most"),
        (["mcp", "--db", "m.db", "--tenant", "a", "--user", "b", "--port", DIGITS_5000], "--port"),
        (["inspect", "x.db", "--budget", "\x1b[2J"], "got '\\x1b[2J'"),
        (["count", "--as", "nonsense"], "--as: invalid choice"),
        # Bytes that are not UTF-8 reach Python as lone surrogates.
        (["inspect", "x.db", "--session", "\udcff"], "--session: not valid UTF-8 text"),
        (["mcp", "--db", "m.db", "--tenant", "\udcff", "--user", "b"], "--tenant: not valid"),
        (["mcp", "--db", "m.db", "--tenant", "a", "--user", "b", "--path", "mcp"], "--path"),
        (
            ["mcp", "--db", "m.db", "--tenant", "a", "--user", "b", "--allow-host", "a\x1bb"],
            "--allow-host",
        ),
    ],
)
def test_every_bad_argument_is_one_line_naming_it(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """Issue 22 #12: no traceback, one line, the option named, exit 2."""
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and out == ""
    assert message in err and err.count("\n") == 1, err
    assert "\x1b" not in err


def _db_with_rows(path: Path, rows: dict[str, list[str]]) -> Path:
    asyncio.run(write_session(path, "ok", 1))
    conn = sqlite3.connect(path)
    for session, datas in rows.items():
        for data in datas:
            conn.execute(
                "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
                (session, data),
            )
    conn.commit()
    conn.close()
    return path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested deeper than can be read"),
        ('{"role": "user", "content": "x", "n": ' + DIGITS_5000 + "}", "more than 4300 digits"),
    ],
)
def test_inspect_names_a_row_nobody_can_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], data: str, message: str
) -> None:
    """Issue 22 #12: a row the SDK's own reader raises on is one line naming the row."""
    db = _db_with_rows(tmp_path / "bad.db", {"bad": ['{"role": "user", "content": "hi"}', data]})
    code, out, err = run_cli(capsys, "inspect", str(db), "--session", "bad")
    assert code == 1 and out == ""
    assert message in err and "row id" in err and err.count("\n") == 1, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested deeper than can be read"),
        ('[{"role": "user", "content": "x", "n": ' + DIGITS_5000 + "}]", "more than 4300 digits"),
        ('{"role": "user", "content": "x"}\n{"n": ' + DIGITS_5000 + "}\n", ":2: a JSON number"),
        ('[{"role": "user", "content": "x", "f": 1e999}]', "not a JSON number"),
        ('[{"role": "user", "content": ' + "[" * 300 + "]" * 300 + "}]", "nesting deeper than"),
    ],
)
def test_count_names_json_it_cannot_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    """Issue 22 #12: ``count`` on deep JSON and long numbers: one line, exit 1."""
    path = tmp_path / "in.json"
    path.write_text(text)
    code, out, err = run_cli(capsys, "count", str(path))
    assert code == 1 and out == ""
    assert message in err and err.count("\n") == 1, err


def test_inspect_escapes_what_the_database_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 22 #13: session ids, previews and kinds from the database reach the terminal
    escaped; ``--json`` keeps the exact text."""
    evil = "chat\x1b[31mRED\x07\u202e"
    db = _db_with_rows(
        tmp_path / "evil.db",
        {
            evil: [
                json.dumps({"role": "user", "content": "hi \x1b]0;pwned\x07 there\x9b"}),
                json.dumps({"type": "weird\x1bkind", "id": "x"}),
            ]
        },
    )
    code, out, err = run_cli(capsys, "inspect", str(db))
    assert code == 0 and "chat\\x1b[31mRED\\x07\\u202e" in out
    code, out, err = run_cli(capsys, "inspect", str(db), "--session", evil)
    assert code == 0, err
    assert "hi \\x1b]0;pwned\\x07 there\\x9b" in out and "weird\\x1bkind" in out
    for text in (out, err):
        assert not any(ord(c) < 0x20 and c != "\n" or 0x7F <= ord(c) <= 0x9F for c in text)
        assert "\u202e" not in text
    code, out, _ = run_cli(capsys, "inspect", str(db), "--session", evil, "--json")
    report = json.loads(out)
    assert report["session"] == evil and "\x1b]0;pwned\x07" in report["units"][0]["preview"]
    code, _, err = run_cli(capsys, "inspect", str(db), "--session", "nope\x1b[2J")
    assert code == 1 and "\x1b" not in err and "nope\\x1b[2J" in err


def test_count_escapes_item_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps({"type": "message", "role": "user\x1b[2J", "content": "x"}) + "\n")
    code, out, _ = run_cli(capsys, "count", str(path))
    assert code == 0 and "user\\x1b[2J" in out and "\x1b" not in out


def test_terminal_safe_escapes_controls_and_keeps_text() -> None:
    from protoprompt.cli._text import terminal_safe

    assert terminal_safe("plain text, ünïcödé, 日本語, emoji 🙂‍↔️") == (
        "plain text, ünïcödé, 日本語, emoji 🙂‍↔️"
    )
    assert terminal_safe("a\x1bb\x07c\x7fd\x9be\nf\tg") == "a\\x1bb\\x07c\\x7fd\\x9be\\nf\\tg"
    assert terminal_safe("\u202eevil\u2066\ud800") == "\\u202eevil\\u2066\\ud800"


def test_inspect_takes_max_tokens_and_the_old_budget_name(
    sdk_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    new = run_cli(capsys, "inspect", str(sdk_db), "--session", "legal-chat", "--max-tokens", "300")
    old = run_cli(capsys, "inspect", str(sdk_db), "--session", "legal-chat", "--budget", "300")
    assert new[0] == 0 and new == old
    assert "of 300 tokens" in new[1]
