"""``protoprompt mcp --db postgresql://...``: the MCP memory server as a real process over a
MemoryStore on PostgreSQL (the test server of scripts/services.sh), shared with other stores."""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable

import pytest

pytest.importorskip("mcp")
pytest.importorskip("agents")
psycopg = pytest.importorskip("psycopg")

from agents.mcp import MCPServerStdio  # noqa: E402

from protoprompt import MemoryScope, MemoryStore  # noqa: E402

from test_mcp_transports import (  # noqa: E402
    SESSION_TIMEOUT,
    child_env,
    protoprompt_command,
    tool_text,
)

SCOPE = MemoryScope("acme", user="alice")
FACT = "Alice's contract renews on the first of March."


def stdio_server(url: str, *extra: str) -> MCPServerStdio:
    cmd = protoprompt_command()
    return MCPServerStdio(
        params={
            "command": cmd[0],
            "args": cmd[1:] + ["mcp", "--db", url, "--tenant", "acme", "--user", "alice", *extra],
            "env": child_env(),
        },
        client_session_timeout_seconds=SESSION_TIMEOUT,
        cache_tools_list=True,
    )


async def test_the_server_serves_a_postgres_store_shared_with_other_workers(
    postgres_schema: Callable[[], str],
) -> None:
    url = postgres_schema()
    async with stdio_server(url) as server:
        is_error, text = tool_text(await server.call_tool("memory_remember", {"text": FACT}))
        assert not is_error, text
        fact_id = json.loads(text)["memory_id"]
    # Another worker (a store of its own on the same server) sees what the MCP client wrote,
    # and writes a document the next server finds.
    with MemoryStore(url) as other:
        assert [f.fact_id for f in other.facts(scope=SCOPE)] == [fact_id]
        other.index_document("contract", "The contract renews every March.", scope=SCOPE)
    async with stdio_server(url, "--read-only") as server:
        assert "memory_remember" not in {t.name for t in await server.list_tools()}
        is_error, text = tool_text(
            await server.call_tool("memory_search", {"query": "contract renews", "top_k": 5})
        )
        assert not is_error, text
        hits = json.loads(text)["hits"]
        assert {h["text"] for h in hits} == {FACT, "The contract renews every March."}


async def test_a_database_failure_is_a_tool_error_and_the_server_keeps_serving(
    postgres_schema: Callable[[], str],
) -> None:
    url = postgres_schema()
    async with stdio_server(url) as server:
        assert not tool_text(await server.call_tool("memory_remember", {"text": FACT}))[0]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE pp_mem_records RENAME TO pp_mem_gone")
        is_error, text = tool_text(await server.call_tool("memory_search", {"query": "contract"}))
        assert is_error and "memory store error" in text and "pp_mem_records" in text
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("ALTER TABLE pp_mem_gone RENAME TO pp_mem_records")
        is_error, text = tool_text(await server.call_tool("memory_search", {"query": "contract"}))
        assert not is_error and FACT in text


def test_an_unreachable_database_is_a_clear_error_without_the_password() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://me:s3cret-pw@127.0.0.1:{port}/memory?connect_timeout=5"
    proc = subprocess.run(
        [*protoprompt_command(), "mcp", "--db", url, "--tenant", "acme", "--user", "alice"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode != 0
    assert "cannot open the memory database 'postgresql://me:***@127.0.0.1" in proc.stderr
    assert "s3cret-pw" not in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr
