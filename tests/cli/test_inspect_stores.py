"""``protoprompt inspect`` on the stores of SQLAlchemySession (SQLite through aiosqlite,
PostgreSQL by URL) and RedisSession (by URL): the same report as for a SQLiteSession file,
of the history the SDK's own session reads, read-only, with no password on the terminal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.testing import ScriptedModel, assistant_message  # noqa: E402

import protoprompt as pp  # noqa: E402
from protoprompt import TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.cli import main  # noqa: E402

STORES = ["sqlalchemy-sqlite", "postgres-psycopg", "redis"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(params=STORES)
async def stored(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """``(engine, target, extra argv)``: a store written by the SDK through a
    ProtoPromptSession (which also saved its index snapshot there)."""
    from conftest import SessionEngine

    kind = str(request.param)
    if kind == "sqlalchemy-sqlite":
        pytest.importorskip("aiosqlite")
        url = f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"
        target, extra = url, []
    elif kind == "redis":
        pytest.importorskip("redis")
        url = target = request.getfixturevalue("redis_url")
    else:
        pytest.importorskip("psycopg")
        target = request.getfixturevalue("postgres_url")
        url = target.replace("postgresql://", "postgresql+psycopg://", 1)
    engine = SessionEngine(kind, tmp_path, url)
    extra = ["--key-prefix", engine.prefix] if kind == "redis" else []
    sid = engine.sid()
    session = engine.proto(sid, snapshot_min_items=8)
    builder = TokenBudgetedContextBuilder(None, max_tokens=100_000)
    callback = session.input_callback(builder)
    for i in range(6):
        model = ScriptedModel([[assistant_message(f"answer {i} " + "words " * 20)]])
        await Runner.run(
            Agent(name="a", model=model),
            f"question {i}",
            session=session,
            run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
        )
    session.close()
    try:
        yield engine, sid, target, extra
    finally:
        await engine.close()


async def test_inspect_reports_a_fresh_pack_of_what_the_sdk_reads(
    stored: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, sid, target, extra = stored
    history = await engine.plain(sid).get_items()
    code, out, err = run_cli(
        capsys, "inspect", target, *extra, "--session", sid, "--budget", "300", "--json"
    )
    assert code == 0, err
    report = json.loads(out)
    expected = pp.pack(history, [], 300)
    assert report["items"] == len(history) == 12
    assert report["used"] == expected.used
    assert [u["decision"] for u in report["units"]] == [d.decision for d in expected.decisions]
    assert report["next_turn"]["snapshot_items"] == 10  # the history of the last turn's read
    code, out, err = run_cli(capsys, "inspect", target, *extra, "--session", sid, "--limit", "4")
    assert code == 0, err
    assert "4 items" in out.splitlines()[0]
    code, out, err = run_cli(capsys, "inspect", target, *extra, "--json")
    assert code == 0, err
    listed = {s["session"]: s for s in json.loads(out)["sessions"]}
    assert listed[sid]["items"] == 12 and listed[sid]["last"]


async def test_inspect_never_shows_a_password(
    stored: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, sid, target, extra = stored
    if "@" not in target:
        pytest.skip("no password in this URL")
    password = target.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]
    code, out, err = run_cli(capsys, "inspect", target, *extra, "--session", sid)
    assert code == 0 and password not in out + err
    code, out, err = run_cli(capsys, "inspect", target, *extra, "--session", "nobody-here")
    assert code == 1 and "no session 'nobody-here'" in err and password not in out + err


def test_inspect_of_an_unreachable_server_is_a_clean_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("psycopg")
    pytest.importorskip("redis")
    for url in (
        "postgresql://someone:sekrit@127.0.0.1:9/nothing",
        "redis://:sekrit@127.0.0.1:9/0",
    ):
        code, out, err = run_cli(capsys, "inspect", url)
        assert code == 1, err
        assert err.startswith("protoprompt inspect: error: cannot connect to "), err
        assert "sekrit" not in err and "Traceback" not in err
    code, out, err = run_cli(capsys, "inspect", "mysql://x@y/z")
    assert code == 1 and "cannot read mysql:// URLs" in err


async def test_inspect_lists_rows_the_sdk_skips_on_postgres(
    postgres_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("psycopg")
    from conftest import SessionEngine
    from sqlalchemy import text

    engine = SessionEngine(
        "postgres-psycopg",
        tmp_path,
        postgres_url.replace("postgresql://", "postgresql+psycopg://", 1),
    )
    sid = engine.sid()
    inner = engine.plain(sid)
    try:
        await inner.add_items([{"role": "user", "content": "hello"}])
        async with inner.engine.begin() as conn:
            await conn.execute(
                text("INSERT INTO agent_messages (session_id, message_data) VALUES (:s, 'nope{')"),
                {"s": sid},
            )
        await inner.add_items([{"role": "user", "content": "again"}])
        code, out, err = run_cli(capsys, "inspect", postgres_url, "--session", sid, "--json")
        assert code == 0, err
        report = json.loads(out)
        assert report["items"] == 2 and len(report["skipped_rows"]) == 1
        assert [i.get("content") for i in await inner.get_items()] == ["hello", "again"]
    finally:
        await engine.close()
