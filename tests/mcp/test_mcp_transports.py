"""``protoprompt mcp`` as a real process: stdio with the Agents SDK's ``MCPServerStdio`` and
ScriptedModel agent runs, and streamable HTTP on 127.0.0.1 with the SDK's HTTP client.

Every wait is a poll with a deadline; no test assumes how fast a process starts.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("agents")

from agents import Agent, RunConfig, Runner  # noqa: E402
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402

SCOPE = MemoryScope("acme", user="alice")
FACT = "Alice's contract renews on the first of March."
START_TIMEOUT = 120.0  # a loaded CI machine may take long to import; we poll, never sleep
SESSION_TIMEOUT = 60.0


def protoprompt_command() -> list[str]:
    """The installed console script (next to this Python), else ``python -m protoprompt``."""
    script = Path(sys.executable).with_name("protoprompt")
    return [str(script)] if script.exists() else [sys.executable, "-m", "protoprompt"]


def child_env() -> dict[str, str]:
    return dict(os.environ, PYTHONUNBUFFERED="1")


def tool_text(result: Any) -> tuple[bool, str]:
    flag = getattr(result, "is_error", None)
    if flag is None:
        flag = getattr(result, "isError", False)
    return bool(flag), "".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def outputs_of(call: Any) -> list[str]:
    """The function_call_output texts a model call received."""
    found = []
    for item in call.input if isinstance(call.input, list) else []:
        data = item if isinstance(item, dict) else item.model_dump()
        if data.get("type") == "function_call_output":
            output = data["output"]  # a string, or content parts ({"type": "input_text"})
            found.append(
                output
                if isinstance(output, str)
                else "".join(part.get("text", "") for part in output)
            )
    return found


def stdio_server(db: Path, *extra: str) -> MCPServerStdio:
    cmd = protoprompt_command()
    return MCPServerStdio(
        params={
            "command": cmd[0],
            "args": cmd[1:]
            + ["mcp", "--db", str(db), "--tenant", "acme", "--user", "alice", *extra],
            "env": child_env(),
        },
        client_session_timeout_seconds=SESSION_TIMEOUT,
        cache_tools_list=True,
    )


async def test_agent_runs_remember_then_search_over_stdio_and_the_callback_recalls(
    tmp_path: Path,
) -> None:
    db = tmp_path / "agents.db"
    async with stdio_server(db) as server:
        names = {t.name for t in await server.list_tools()}
        assert {"memory_remember", "memory_search", "memory_context"} <= names

        first = ScriptedModel(
            [
                [function_call("memory_remember", {"text": FACT}, call_id="call_1")],
                [assistant_message("Noted.", item_id="msg_1")],
            ]
        )
        agent = Agent(name="assistant", model=first, mcp_servers=[server])
        result = await Runner.run(agent, "Please remember when my contract renews.")
        assert result.final_output == "Noted."
        (remembered,) = outputs_of(first.calls[1])
        fact_id = json.loads(remembered)["memory_id"]

    # A second run, with a new server process on the same database, finds the fact.
    async with stdio_server(db, "--read-only") as server:
        assert "memory_remember" not in {t.name for t in await server.list_tools()}
        second = ScriptedModel(
            [
                [
                    function_call(
                        "memory_search",
                        {"query": "When does the contract renew?"},
                        call_id="call_2",
                    )
                ],
                [assistant_message("On 1 March.", item_id="msg_2")],
            ]
        )
        agent = Agent(name="assistant", model=second, mcp_servers=[server])
        result = await Runner.run(agent, "When does my contract renew?")
        assert result.final_output == "On 1 March."
        (found,) = outputs_of(second.calls[1])
        hits = json.loads(found)["hits"]
        assert [(h["memory_id"], h["text"], h["layer"]) for h in hits] == [(fact_id, FACT, "facts")]

    # The budgeted session callback recalls the same fact from the same database.
    store = MemoryStore(db)
    session = ProtoPromptSession("chat", db)
    try:
        builder = TokenBudgetedContextBuilder(store, max_tokens=4_000, scope=SCOPE)
        callback = session.input_callback(builder, system_prompt="Use the facts.")
        third = ScriptedModel([[assistant_message("March.", item_id="msg_3")]])
        await Runner.run(
            Agent(name="assistant", model=third),
            "When does it renew?",
            session=session,
            run_config=RunConfig(session_input_callback=callback),
        )
        assert builder.last_plan is not None
        assert [b.source for b in builder.last_plan.recalled] == [f"fact:{fact_id}"]
        context = third.calls[0].input[0]
        context = context if isinstance(context, dict) else context.model_dump()
        assert context["role"] == "system" and FACT in str(context["content"])
    finally:
        session.close()
        store.close()


async def test_stdio_tool_errors_reach_the_agent_and_the_server_keeps_serving(
    tmp_path: Path,
) -> None:
    async with stdio_server(tmp_path / "m.db") as server:
        is_error, text = tool_text(await server.call_tool("memory_remember", {"text": " "}))
        assert is_error and "text must not be empty" in text
        is_error, text = tool_text(await server.call_tool("memory_forget", {"memory_id": "0" * 32}))
        assert is_error and "no fact" in text
        is_error, text = tool_text(await server.call_tool("memory_remember", {"text": FACT}))
        assert not is_error and json.loads(text)["memory_id"]


# --------------------------------------------------------------------------- HTTP


class Process:
    """A child process whose stderr lines are collected by a thread (never blocks)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(child_env(), **(env or {})),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for_line(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if needle in line:
                return line
        raise AssertionError(
            f"no {needle!r} on stderr within {timeout}s; "
            f"exit {self.proc.poll()}; stderr: {''.join(self.seen)!r}"
        )

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=timeout)
            raise AssertionError(
                f"the server did not stop within {timeout}s of signal {sig}"
            ) from None


@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[tuple[Process, str]]:
    db = tmp_path / "http.db"
    with MemoryStore(db) as store:
        store.remember(FACT, scope=SCOPE)
    proc = Process(
        protoprompt_command()
        + [
            "mcp",
            "--db",
            str(db),
            "--tenant",
            "acme",
            "--user",
            "alice",
            "--transport",
            "http",
            "--port",
            "0",
        ]
    )
    try:
        line = proc.wait_for_line("serving streamable HTTP on ", START_TIMEOUT)
        url = line.rsplit(" ", 1)[1].strip()
        yield proc, url
    finally:
        if proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)


async def test_streamable_http_on_loopback_with_a_real_client(
    http_server: tuple[Process, str],
) -> None:
    proc, url = http_server
    assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
    server = MCPServerStreamableHttp(
        params={"url": url, "timeout": SESSION_TIMEOUT},
        client_session_timeout_seconds=SESSION_TIMEOUT,
    )
    async with server:
        names = {t.name for t in await server.list_tools()}
        assert {"memory_search", "memory_remember", "memory_context"} <= names
        is_error, text = tool_text(
            await server.call_tool("memory_search", {"query": "contract renews"})
        )
        assert not is_error and [h["text"] for h in json.loads(text)["hits"]] == [FACT]
        is_error, text = tool_text(
            await server.call_tool("memory_remember", {"text": "Alice prefers e-mail."})
        )
        assert not is_error
        is_error, text = tool_text(
            await server.call_tool(
                "memory_context", {"query": "e-mail contract", "max_tokens": 200}
            )
        )
        assert not is_error and "Alice prefers e-mail." in json.loads(text)["context"]
        is_error, text = tool_text(await server.call_tool("memory_remember", {"text": ""}))
        assert is_error and "text must not be empty" in text

    assert proc.stop(signal.SIGINT) == 0
    # Bound to loopback only, on the port it reported.
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    assert host == "127.0.0.1"


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, str]:
    """One raw HTTP POST (http.client sends our Host header as given)."""
    address, path = url.split("//", 1)[1].split("/", 1)
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=SESSION_TIMEOUT)
    try:
        conn.request(
            "POST",
            "/" + path,
            body=json.dumps(body),
            headers={
                "Accept": "application/json, text/event-stream",
                "Content-Type": "application/json",
                **headers,
            },
        )
        response = conn.getresponse()
        return response.status, response.read(4096).decode("utf-8", "replace")
    finally:
        conn.close()


def test_http_refuses_foreign_host_and_origin_headers(http_server: tuple[Process, str]) -> None:
    """DNS-rebinding protection: a web page whose name resolves to 127.0.0.1 gets nothing."""
    proc, url = http_server
    port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-03-26",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    status, text = post(url, body, {"Host": f"evil.example:{port}"})
    assert status in (400, 403, 421), (status, text)
    status, text = post(url, body, {"Origin": "http://evil.example"})
    assert status in (400, 403), (status, text)
    status, text = post(url, body, {"Origin": f"http://localhost:{port}"})
    assert status == 200, (status, text)
    status, text = post(url, body, {})
    assert status == 200 and "protoprompt-memory" in text, (status, text)
    assert proc.stop(signal.SIGTERM) in (0, -signal.SIGTERM)


def test_http_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            protoprompt_command()
            + [
                "mcp",
                "--db",
                str(tmp_path / "m.db"),
                "--tenant",
                "acme",
                "--user",
                "alice",
                "--transport",
                "http",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=START_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    assert proc.returncode == 1
    assert f"cannot serve on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


# --------------------------------------------------------------------------- issue 22


def mcp_args(db: Path, *extra: str) -> list[str]:
    return protoprompt_command() + [
        "mcp",
        "--db",
        str(db),
        "--tenant",
        "acme",
        "--user",
        "alice",
        *extra,
    ]


def start_http(db: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[Process, str]:
    proc = Process(mcp_args(db, "--transport", "http", "--port", "0", *extra), env=env)
    line = proc.wait_for_line("serving streamable HTTP on ", START_TIMEOUT)
    return proc, line.rsplit(" ", 1)[1].strip()


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-03-26",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
TOKEN = "correct-horse-battery-staple-42"


async def test_a_token_guards_every_request_and_the_client_passes_it(tmp_path: Path) -> None:
    """Issue 22 #6: with a bearer token (from the environment here) every request needs it;
    the Host and Origin checks stay on."""
    proc, url = start_http(tmp_path / "t.db", env={"PROTOPROMPT_MCP_TOKEN": TOKEN})
    try:
        port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        assert post(url, INITIALIZE, {})[0] == 401
        assert post(url, INITIALIZE, {"Authorization": "Bearer wrong-token-0000000"})[0] == 401
        assert post(url, INITIALIZE, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
        with_token = {"Authorization": f"Bearer {TOKEN}"}
        assert post(url, INITIALIZE, {**with_token, "Host": f"evil.example:{port}"})[0] == 421
        assert post(url, INITIALIZE, {**with_token, "Origin": "http://evil.example"})[0] == 403
        server = MCPServerStreamableHttp(
            params={"url": url, "timeout": SESSION_TIMEOUT, "headers": with_token},
            client_session_timeout_seconds=SESSION_TIMEOUT,
        )
        async with server:
            is_error, text = tool_text(await server.call_tool("memory_remember", {"text": FACT}))
            assert not is_error, text
    finally:
        proc.stop(signal.SIGKILL)


def test_allowed_hosts_and_origins_are_explicit(tmp_path: Path) -> None:
    proc, url = start_http(
        tmp_path / "o.db", "--allow-origin", "https://app.example", "--allow-host", "mem.example"
    )
    try:
        port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1]
        assert post(url, INITIALIZE, {"Origin": "https://app.example"})[0] == 200
        assert post(url, INITIALIZE, {"Origin": "https://other.example"})[0] == 403
        assert post(url, INITIALIZE, {"Host": f"mem.example:{port}"})[0] == 200
        assert post(url, INITIALIZE, {"Host": f"evil.example:{port}"})[0] == 421
    finally:
        proc.stop(signal.SIGKILL)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--host", "0.0.0.0"], "refusing to serve on 0.0.0.0 without authentication"),
        (["--host", "::"], "refusing to serve on :: without authentication"),
        (["--host", "0.0.0.0", "--auth-token", "short"], "at least 16 characters"),
        (["--allow-origin", "app.example"], "an allowed origin is a URL"),
    ],
)
def test_a_non_loopback_bind_without_a_token_is_refused_before_binding(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    """Issue 22 #6: nothing is opened or bound; exit 2 with one line saying what to add."""
    db = tmp_path / "never.db"
    proc = subprocess.run(
        mcp_args(db, "--transport", "http", "--port", "0", *extra),
        capture_output=True,
        text=True,
        env={k: v for k, v in child_env().items() if k != "PROTOPROMPT_MCP_TOKEN"},
        timeout=START_TIMEOUT,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not db.exists()


async def test_a_document_within_the_limit_is_accepted_over_http(tmp_path: Path) -> None:
    """Issue 22 #9: 2,000,000 characters of CJK text (6 MB of UTF-8, over the SDK's 4 MiB
    default body limit) is accepted over HTTP as over stdio; one more character is a tool
    error on both, never a 413."""
    text = ("契約の更新日は三月一日です。" * 150_000)[:2_000_000]
    proc, url = start_http(tmp_path / "big.db")
    try:
        server = MCPServerStreamableHttp(
            params={"url": url, "timeout": 300},
            client_session_timeout_seconds=300,
        )
        async with server:
            is_error, out = tool_text(
                await server.call_tool("memory_index_document", {"doc_id": "big", "text": text})
            )
            assert not is_error, out[:300]
            assert json.loads(out)["chunks"] > 0
            is_error, out = tool_text(
                await server.call_tool(
                    "memory_index_document", {"doc_id": "big", "text": text + "。"}
                )
            )
            assert is_error and "413" not in out
    finally:
        proc.stop(signal.SIGKILL)
    async with stdio_server(tmp_path / "big.db") as stdio:
        is_error, out = tool_text(
            await stdio.call_tool("memory_index_document", {"doc_id": "big", "text": text + "。"})
        )
        assert is_error


async def test_read_only_never_changes_the_database(tmp_path: Path) -> None:
    """Issue 22 #7: a read-only server opens the database read-only: a database without the
    memory tables serves empty results and stays byte for byte as it was (no WAL, no
    schema), and one with memories is read."""
    import hashlib
    import sqlite3

    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE orders (id INTEGER)")
    conn.commit()
    conn.close()
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    async with stdio_server(db, "--read-only") as server:
        is_error, text = tool_text(await server.call_tool("memory_search", {"query": "contract"}))
        assert not is_error and json.loads(text)["hits"] == []
        is_error, text = tool_text(await server.call_tool("memory_get_profile", {}))
        assert not is_error and json.loads(text) == {"profile": None}
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["orders"]
    conn.close()


async def test_server_info_carries_the_package_version(tmp_path: Path) -> None:
    """Issue 22 #11: the version a client sees in serverInfo."""
    import protoprompt

    async with stdio_server(tmp_path / "v.db") as server:
        # mcp 1.x: the initialize result the Agents SDK keeps; 2.x: the session's own
        # serverInfo (from initialize, or the discover result's stamp on newer protocols).
        session = server.session
        server_info = getattr(session, "server_info", None)
        if server_info is None:
            server_info = server.server_initialize_result.serverInfo
        assert server_info.version == protoprompt.__version__
        assert server_info.name == "protoprompt-memory"
