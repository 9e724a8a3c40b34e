"""Chaos: several processes write one session's history while others run turns through
``ProtoPromptSession`` and its callback, and any of them is killed with SIGKILL at any moment
(and started again) -- on each engine the history can live in: a SQLite file
(``SQLiteSession``), PostgreSQL (``SQLAlchemySession`` through psycopg) and Redis
(``RedisSession``), the last two on the test servers of scripts/services.sh. Afterwards the
store is intact (SQLite's integrity check; every PostgreSQL row has its session row; the
Redis key is a list), no stored item was lost or duplicated, and every turn sent exactly what
a fresh pack of the history it was given sends.

Roles (each a forked process, restarted after every kill): two writers appending items with
the SDK's own session (sometimes long ones, calls with outputs, outputs whose call is
elsewhere), a popper removing the newest item through ``ProtoPromptSession.pop_item``, and
two turners (two workers of one session: one index pool each, sharing snapshots and counts)
that pack the history through the session's callback (index, snapshots, count store) and
check the request against a fresh pack without any of them -- every other turn the history
they read themselves, every other turn a whole ``Runner.run`` with windowed reads (while the
writers and the popper wait on a file lock, so that the history the runner reads is known:
a kill releases the lock). Every process writes what it did to a log of its own, line by
line, after the store's call returned.

Runs for ``PROTOPROMPT_CHAOS_SECONDS`` (default 20) per engine in a child interpreter.
"""

from __future__ import annotations

import asyncio
import copy
import fcntl
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SESSION = "chat"
ROLES = ("writer-0", "writer-1", "popper", "turner-0", "turner-1")
ENGINES = ("sqlite", "postgres", "redis")


class Store:
    """Where the chaos happens: ``{"engine": ..., "db" | "url", "session", "prefix"}``."""

    def __init__(self, config: dict[str, str]) -> None:
        self.engine = config["engine"]
        self.config = config
        self.session = config.get("session", SESSION)
        self._made: list[Any] = []

    def plain(self) -> Any:
        """The SDK's own session (a new engine or client)."""
        if self.engine == "sqlite":
            from agents.memory import SQLiteSession

            inner: Any = SQLiteSession(self.session, self.config["db"])
        elif self.engine == "postgres":
            from agents.extensions.memory import SQLAlchemySession

            inner = SQLAlchemySession.from_url(
                self.session, url=self.config["url"], create_tables=True
            )
        else:
            from agents.extensions.memory import RedisSession

            inner = RedisSession.from_url(
                self.session, url=self.config["url"], key_prefix=self.config["prefix"]
            )
        self._made.append(inner)
        return inner

    def proto(self, **options: Any) -> Any:
        from protoprompt.integrations import ProtoPromptSession

        if self.engine == "sqlite":
            return ProtoPromptSession(self.session, self.config["db"], **options)
        return ProtoPromptSession(self.session, inner_session=self.plain(), **options)

    async def close(self) -> None:
        for inner in self._made:
            if self.engine == "sqlite":
                inner.close()
            elif self.engine == "postgres":
                await inner.engine.dispose()
            else:
                await inner.close()

    async def stored(self) -> tuple[list[Any], list[Any]]:
        """The stored items' raw texts in the session's order, and the integrity check."""
        if self.engine == "sqlite":
            with sqlite3.connect(self.config["db"]) as conn:
                integrity = conn.execute("PRAGMA integrity_check").fetchall()
                rows = conn.execute(
                    "SELECT message_data FROM agent_messages WHERE session_id = ? ORDER BY id",
                    (self.session,),
                ).fetchall()
            return [r[0] for r in rows], [list(r) for r in integrity]
        if self.engine == "postgres":
            from sqlalchemy import text
            from sqlalchemy.ext.asyncio import create_async_engine

            db = create_async_engine(self.config["url"])
            try:
                async with db.connect() as conn:
                    rows = (
                        await conn.execute(
                            text(
                                "SELECT message_data FROM agent_messages WHERE session_id = :s "
                                "ORDER BY created_at, id"
                            ),
                            {"s": self.session},
                        )
                    ).all()
                    orphans = (
                        await conn.execute(
                            text(
                                "SELECT count(*) FROM agent_messages m LEFT JOIN agent_sessions "
                                "s ON s.session_id = m.session_id WHERE s.session_id IS NULL"
                            )
                        )
                    ).scalar_one()
            finally:
                await db.dispose()
            return [r[0] for r in rows], [["ok"]] if orphans == 0 else [["orphans", orphans]]
        import redis.asyncio as redis

        client = redis.from_url(self.config["url"])
        try:
            key = f"{self.config['prefix']}:{self.session}:messages"
            kind = (await client.type(key)).decode()
            rows = [r.decode() for r in await client.lrange(key, 0, -1)]
        finally:
            await client.aclose()
        return rows, [["ok"]] if kind in ("list", "none") else [["type", kind]]


def _item(marker: str, rng: random.Random) -> list[dict[str, Any]]:
    kind = rng.randrange(10)
    if kind < 4:
        return [{"role": "user", "content": f"{marker} " + "words " * rng.randrange(1, 200)}]
    if kind < 6:
        return [
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{marker}",
                "status": "completed",
                "content": [
                    {
                        "type": "output_text",
                        "text": f"{marker} " + "answer " * rng.randrange(1, 300),
                        "annotations": [],
                    }
                ],
            }
        ]
    if kind < 8:
        return [
            {
                "type": "function_call",
                "call_id": f"call_{marker}",
                "name": "f",
                "arguments": json.dumps({"marker": f"{marker}c"}),
            },
            {
                "type": "function_call_output",
                "call_id": f"call_{marker}",
                "output": f"{marker}o " + "result " * rng.randrange(1, 2000),
            },
        ]
    if kind < 9:  # an output whose call is elsewhere: an invalid unit
        return [
            {
                "type": "function_call_output",
                "call_id": f"call_nowhere_{marker}",
                "output": f"{marker} " + "orphan " * rng.randrange(1, 3000),
            }
        ]
    return [{"role": "user", "content": f"{marker} " + "pasted " * 6000}]


def marker_of(item: Any) -> str | None:
    """The unique word every item of this test starts its text with."""
    if not isinstance(item, dict):
        return None
    if item.get("type") == "function_call":
        return str(json.loads(item["arguments"])["marker"])
    text = item.get("output", item.get("content"))
    if isinstance(text, list) and text:
        text = text[0].get("text")
    return text.split()[0] if isinstance(text, str) and text else None


async def _writer(store: Store, name: str, log: Any, rng: random.Random) -> None:
    session = store.plain()
    n = 0
    while True:
        items = []
        for _ in range(rng.randrange(1, 3)):
            items += _item(f"M{os.getpid()}.{n}", rng)
            n += 1
        with _turn_lock(shared=True):
            await session.add_items(items)
        log.write(json.dumps(["add", [marker_of(i) for i in items]]) + "\n")
        log.flush()
        await asyncio.sleep(rng.random() * 0.05)


async def _popper(store: Store, log: Any, rng: random.Random) -> None:
    session = store.proto()
    while True:
        await asyncio.sleep(0.05 + rng.random() * 0.15)
        with _turn_lock(shared=True):
            log.write(json.dumps(["popping"]) + "\n")
            log.flush()
            item = await session.pop_item()
        log.write(json.dumps(["pop", marker_of(item) if item is not None else None]) + "\n")
        log.flush()


_LOCK_PATH: list[str] = []


class _turn_lock:  # noqa: N801 - a context manager, named like one
    """The turners' file lock: every process holds it shared while it writes, a turner
    exclusively around a whole ``Runner.run`` (a kill releases it)."""

    def __init__(self, *, shared: bool) -> None:
        self.mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        self.fd = -1

    def __enter__(self) -> None:
        self.fd = os.open(_LOCK_PATH[0], os.O_RDWR | os.O_CREAT)
        fcntl.flock(self.fd, self.mode)

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        os.close(self.fd)


async def _turner(store: Store, log: Any, rng: random.Random) -> None:
    from agents import Agent, RunConfig, Runner
    from agents.testing import ScriptedModel

    from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder, _core

    memory = MemoryStore()
    scope = MemoryScope("acme", user="alice")

    def builder() -> TokenBudgetedContextBuilder:
        return TokenBudgetedContextBuilder(memory, max_tokens=3000, scope=scope, output_reserve=200)

    # snapshots written (and killed mid-write) often; windows read by the runner's turns
    session = store.proto(snapshot_min_items=16, windowed_reads=True)
    reference = store.plain()
    sent_by = builder()
    callback = session.input_callback(sent_by, system_prompt="Be brief.")
    fresh = builder()
    n = 0
    while True:
        marker = f"M{os.getpid()}.{n}"
        new_input = [{"role": "user", "content": f"{marker}q question"}]
        answer = {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{marker}a",
            "status": "completed",
            "content": [
                {"type": "output_text", "text": f"{marker}a " + "ok " * 50, "annotations": []}
            ],
        }
        runner = n % 2 == 1
        if runner:  # the whole turn as the runner runs it, with a token window
            with _turn_lock(shared=False):
                history = copy.deepcopy(await reference.get_items())
                model = ScriptedModel([[answer]])
                await Runner.run(
                    Agent(name="a", model=model),
                    new_input[0]["content"],
                    session=session,
                    run_config=RunConfig(session_input_callback=callback, tracing_disabled=True),
                )
            sent = [dict(i) for i in model.calls[0].input]
        else:
            history = copy.deepcopy(await session.get_items())
            sent = await callback(copy.deepcopy(history), copy.deepcopy(new_input))
        got = sent_by.last_plan
        report = got.turn if got is not None else None
        windowed = report is not None and report.read == "window"
        # Items this process's first turn found indexed: loaded from the snapshot.
        restored = 0
        if n == 0 and report is not None and report.snapshot == "loaded":
            restored = report.index_held
        n += 1
        _core._clear_count_cache()  # the fresh pack counts everything itself
        expected = fresh.build(
            copy.deepcopy(history), copy.deepcopy(new_input), system_prompt="Be brief."
        )
        same = (
            json.dumps(sent, sort_keys=True)
            == json.dumps([dict(i) for i in expected.items], sort_keys=True)
            and got is not None
            and got.pack.used == expected.pack.used
            and got.pack.kept_history == expected.pack.kept_history
        )
        log.write(
            json.dumps(
                [
                    "turn",
                    len(history),
                    restored,
                    same,
                    None if same else [got.pack.used if got else None, expected.pack.used],
                    windowed,
                ]
            )
            + "\n"
        )
        log.flush()
        if not runner:
            with _turn_lock(shared=True):
                await session.add_items(new_input + [answer])
        log.write(json.dumps(["add", [f"{marker}q", f"{marker}a"]]) + "\n")
        log.flush()


def _run_role(role: str, store: Store, logs: Path, incarnation: int) -> None:
    rng = random.Random(hash((role, incarnation, os.getpid())))
    with open(logs / f"{role}.{incarnation}.log", "w", buffering=1) as log:
        if role.startswith("writer"):
            asyncio.run(_writer(store, role, log, rng))
        elif role == "popper":
            asyncio.run(_popper(store, log, rng))
        else:
            asyncio.run(_turner(store, log, rng))


def chaos(config: dict[str, str], logs: Path, seconds: float) -> dict[str, Any]:
    """The parent: seed the session, start the roles, kill and restart them for ``seconds``,
    then kill them all."""
    import protoprompt.integrations.agents  # noqa: F401 - imported once, before the forks

    _LOCK_PATH.append(str(logs / "turn.lock"))
    rng = random.Random(12)
    items = [i for k in range(20) for i in _item(f"M0.{k}", rng)]

    async def seed() -> None:
        store = Store(config)
        await store.plain().add_items(items)
        await store.close()  # no connection of the parent's crosses the forks

    asyncio.run(seed())
    (logs / "seed.log").write_text(json.dumps(["add", [marker_of(i) for i in items]]) + "\n")
    running: dict[str, int] = {}
    incarnations = {role: 0 for role in ROLES}
    kills = {role: 0 for role in ROLES}

    def start(role: str) -> None:
        incarnations[role] += 1
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                _run_role(role, Store(config), logs, incarnations[role])
            except BaseException:  # noqa: BLE001 - reported through the exit status
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        running[role] = pid

    for role in ROLES:
        start(role)
    deadline = time.monotonic() + seconds
    failures: list[str] = []
    while time.monotonic() < deadline:
        time.sleep(0.2 + rng.random() * 0.6)
        for role, pid in list(running.items()):  # a role that died by itself is a failure
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                failures.append(f"{role} exited by itself with status {status}")
                start(role)
        role = rng.choice(ROLES)
        os.kill(running[role], signal.SIGKILL)
        os.waitpid(running[role], 0)
        kills[role] += 1
        start(role)
    for role, pid in running.items():
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        kills[role] += 1
    return {"kills": kills, "failures": failures}


def check(config: dict[str, str], logs: Path, kills: dict[str, int]) -> dict[str, Any]:
    """What the logs and the store must agree on."""
    rows, integrity = asyncio.run(Store(config).stored())
    stored = [marker_of(json.loads(r)) for r in rows]
    added: set[str] = set()
    popped: list[str | None] = []
    pops_started = 0
    turns: list[list[Any]] = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the kill
                continue
            if entry[0] == "add":
                added.update(m for m in entry[1] if m)
            elif entry[0] == "pop":
                popped.append(entry[1])
            elif entry[0] == "popping":
                pops_started += 1
            elif entry[0] == "turn":
                turns.append(entry)
    present = [m for m in stored if m is not None]
    duplicated = sorted({m for m in present if present.count(m) > 1})
    # A logged add is stored, or was popped; a pop whose log line the kill cut away can hide
    # at most one item per kill of the popper.
    missing = sorted(added - set(present) - {m for m in popped if m})
    return {
        "integrity": integrity,
        "stored": len(stored),
        "duplicated": duplicated,
        "missing": missing,
        "unlogged_pops_allowed": kills["popper"],
        "turns": len(turns),
        "mismatches": [t for t in turns if not t[3]],
        "restored_turns": sum(1 for t in turns if t[2] > 0),
        "window_turns": sum(1 for t in turns if t[5]),
        "pops": len(popped),
        "pops_started": pops_started,
    }


def main(config: str, logs: str, seconds: float) -> None:
    settings = json.loads(config)
    log_dir = Path(logs)
    outcome = chaos(settings, log_dir, seconds)
    outcome.update(check(settings, log_dir, outcome["kills"]))
    print(json.dumps(outcome))


@pytest.fixture(params=ENGINES)
def chaos_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    engine = str(request.param)
    session = f"chat-{os.getpid()}-{int(time.time() * 1000)}"
    if engine == "sqlite":
        return {"engine": engine, "db": str(tmp_path / "chaos.db"), "session": session}
    if engine == "postgres":
        pytest.importorskip("psycopg")
        url = request.getfixturevalue("postgres_url")
        url = url.replace("postgresql://", "postgresql+psycopg://", 1)
        return {"engine": engine, "url": url, "session": session}
    pytest.importorskip("redis")
    url = request.getfixturevalue("redis_url")
    return {"engine": engine, "url": url, "session": session, "prefix": f"chaos-{session}"}


# Its processes must do enough work in their seconds: run alone, after the parallel suite.
@pytest.mark.serial
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_chaos_with_sigkills(tmp_path: Path, chaos_store: dict[str, str]) -> None:
    pytest.importorskip("agents")
    seconds = float(os.environ.get("PROTOPROMPT_CHAOS_SECONDS", "20"))
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = subprocess.run(
        [sys.executable, __file__, json.dumps(chaos_store), str(logs), str(seconds)],
        capture_output=True,
        text=True,
        timeout=seconds + 120,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    keys = ("kills", "stored", "turns", "restored_turns", "window_turns", "pops")
    summary = {k: out[k] for k in keys}
    print("chaos:", chaos_store["engine"], json.dumps(summary))
    assert out["failures"] == [], out["failures"]
    assert out["integrity"] == [["ok"]]
    assert out["duplicated"] == [], out["duplicated"]
    assert len(out["missing"]) <= out["unlogged_pops_allowed"], out["missing"]
    assert out["mismatches"] == [], out["mismatches"][:5]
    # The run did what it is for: turns, restarts from snapshots, windows, pops, kills of
    # everyone.
    assert out["turns"] >= 20, summary
    assert out["restored_turns"] > 0, summary
    assert out["window_turns"] > 0, summary
    assert out["pops"] > 5, summary
    assert all(n > 0 for n in out["kills"].values()), summary


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))
