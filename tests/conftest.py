from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import sqlite3
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings as hypothesis_settings

# Property tests draw the same examples on every run unless asked otherwise: a CI run is a
# verdict on the code, not on the draw (a failure seen once is kept as a directed test).
# HYPOTHESIS_PROFILE=explore draws new examples each run, to look for more.
hypothesis_settings.register_profile("ci", derandomize=True, print_blob=True)
hypothesis_settings.register_profile("explore", print_blob=True)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from protoprompt import MemoryScope

HERE = Path(__file__).resolve().parent
# The offline reference tokenizer (openai/tiktoken on the vocabulary files tiktoken-rs ships)
# lives with the benchmarks; the tests use the same module.
sys.path.insert(0, str(HERE.parent / "benches"))


@pytest.fixture(scope="session")
def vectors() -> list[dict]:
    """The 42 item-graph test vectors of docs/item-graph.md §15 (shared with the Rust tests)."""
    path = HERE.parent / "rust" / "core" / "tests" / "data" / "item-graph-vectors.json"
    return json.loads(path.read_text())["vectors"]


# ---------------------------------------------------------------------- test hooks

# protoprompt._core has its test hooks (``_clear_count_cache``, ``HistoryIndex._graph_copies``,
# ...) only when built with the cargo feature ``test-hooks`` (scripts/dev.sh and CI's test
# build; release wheels leave it out). A test that uses one, directly, through a helper of its
# module or through the ``new_process`` fixture, skips without them (fails where
# PROTOPROMPT_REQUIRE_TEST_HOOKS=1, as in scripts/test.sh).
TEST_HOOKS = (
    "_clear_count_cache",
    "_fail_next_counts",
    "_hold_next_build_until_fork",
    "_build_is_held",
    "_lazy_commit_allocator",
    "_costs_counted",
    "_masked_counted",
    "_graph_copies",
)
_HOOK_FIXTURES = frozenset({"new_process"})


def _has_test_hooks() -> bool:
    from protoprompt import _core

    return hasattr(_core, "_clear_count_cache")


def _hook_users(module: Any) -> frozenset[str]:
    """Names of the module's top-level functions and classes that use a test hook, directly
    or through one another."""
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return frozenset()
    tree = ast.parse(source)
    defs = {
        node.name: ast.get_source_segment(source, node) or ""
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    users: set[str] = set()
    words: tuple[str, ...] = TEST_HOOKS
    while True:
        found = {name for name, text in defs.items() if any(w in text for w in words)}
        if found <= users:
            return frozenset(users)
        users |= found
        words = TEST_HOOKS + tuple(users)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_test_hooks():
        return
    reason = (
        "needs protoprompt._core's test hooks: build with the cargo feature test-hooks "
        "(scripts/dev.sh does)"
    )
    required = os.environ.get("PROTOPROMPT_REQUIRE_TEST_HOOKS") == "1"
    users: dict[str, tuple[str, ...]] = {}
    for item in items:
        function = getattr(item, "function", None)
        module = getattr(item, "module", None)
        if function is None or module is None:
            continue
        if module.__name__ not in users:
            users[module.__name__] = TEST_HOOKS + tuple(_hook_users(module))
        try:
            source = inspect.getsource(function)
        except (OSError, TypeError):
            source = ""
        uses_fixture = bool(_HOOK_FIXTURES & set(getattr(item, "fixturenames", ())))
        if uses_fixture or any(word in source for word in users[module.__name__]):
            if required:
                raise pytest.UsageError(f"{item.nodeid}: {reason}")
            item.add_marker(pytest.mark.skip(reason=reason))


# ---------------------------------------------------------------------- servers

# scripts/test.sh starts PostgreSQL and redis-server (scripts/services.sh) and exports their
# URLs with PROTOPROMPT_REQUIRE_SERVICES=1: there a missing server fails the tests that need
# it. Elsewhere those tests skip, saying how to start the servers.
_START = 'scripts/services.sh start && eval "$(scripts/services.sh env)"'


def service_url(variable: str, what: str) -> str:
    """The URL of a test server from ``variable``; skip (fail under scripts/test.sh) without."""
    url = os.environ.get(variable, "")
    if url:
        return url
    if os.environ.get("PROTOPROMPT_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{variable} is not set: scripts/test.sh starts {what} for these tests")
    pytest.skip(f"needs {what}: {variable} is not set (run {_START})")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``pytest -n``, scripts/test.sh) every worker gets a PostgreSQL
    database of its own: tests that drop or rewrite the SDK's and protoprompt's tables in the
    default schema (test_session_engines.py) must not pull them from under another worker's
    test. Subprocesses inherit the worker's URL through the environment."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    url = os.environ.get("PROTOPROMPT_TEST_POSTGRES_URL", "")
    if not worker or not url:
        return
    import psycopg
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    name = f"{parts.path.lstrip('/') or 'postgres'}_{worker}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    own = urlunsplit(parts._replace(path=f"/{name}"))
    if os.environ.get("PROTOPROMPT_TEST_PGVECTOR") == "1":
        with psycopg.connect(own, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    os.environ["PROTOPROMPT_TEST_POSTGRES_URL"] = own


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The test PostgreSQL server's URL (a superuser on a throw-away database)."""
    return service_url("PROTOPROMPT_TEST_POSTGRES_URL", "a PostgreSQL server")


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[Callable[[], str]]:
    """``new()`` makes an empty schema on the test server and returns a URL whose
    connections use it (``search_path``), so every call is a fresh, empty database for the
    memory store; the schemas are dropped after the test."""
    psycopg = pytest.importorskip("psycopg")
    made: list[str] = []

    def new() -> str:
        name = f"pp_test_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        made.append(name)
        glue = "&" if "?" in postgres_url else "?"
        return f"{postgres_url}{glue}options=-csearch_path%3D{name}"

    yield new
    if made:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for name in made:
                conn.execute(f'DROP SCHEMA "{name}" CASCADE')


ENGINES = ["sqlite", "postgresql"]


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    """Each memory-store test runs on SQLite and on PostgreSQL."""
    return str(request.param)


@pytest.fixture
def new_db(engine: str, request: pytest.FixtureRequest) -> Callable[[], str]:
    """``new_db()``: a fresh, empty memory database on the test's engine (a private
    in-memory SQLite database, or a new schema on the test PostgreSQL server)."""
    if engine == "sqlite":
        return lambda: ":memory:"
    return request.getfixturevalue("postgres_schema")  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- sessions in turns

SCOPE = MemoryScope("acme", user="alice")
"""The memory scope of every :class:`SessionSide`."""


@pytest.fixture
def new_process(monkeypatch: pytest.MonkeyPatch) -> Callable[[], None]:
    """``new_process()`` makes this process look restarted for the rest of the test: no
    shared session index in the pool, no count store objects, no token counts in memory
    (what a session's database holds stays)."""
    import weakref
    from collections import OrderedDict

    from protoprompt import _core, _process
    from protoprompt._context import _count_memo

    def restart() -> None:
        monkeypatch.setattr(_process.SHARED_INDEXES, "items", OrderedDict())
        monkeypatch.setattr(_process.FILE_COUNT_STORES, "items", weakref.WeakValueDictionary())
        _core._clear_count_cache()
        _count_memo.clear()

    return restart


class SessionSide:
    """One ``ProtoPromptSession("chat", db)`` with a memory store, a budgeted callback and a
    scripted model per turn (``script(i)``: the model outputs of turn ``i``, its tool is
    :func:`lookup`). Every plan the callback built is recorded in ``plans`` (its items as
    JSON, then a line of its token totals and decision count), its turn report
    (``plan.turn``) in ``reports``, and with windowed reads
    each turn's read in ``windows``: the stored items its token window left out, or
    ``None`` for a full read (from the turn's report, ``plan.turn``)."""

    def __init__(
        self,
        db: str,
        script: Callable[[int], list[Any]],
        *,
        max_tokens: int = 900,
        policy: str = "contiguous",
        remember: str | None = None,
        **session_options: Any,
    ) -> None:
        from protoprompt import MemoryStore, TokenBudgetedContextBuilder
        from protoprompt.integrations import ProtoPromptSession

        self.db = db
        self.script = script
        self.store = MemoryStore()
        self.session = ProtoPromptSession("chat", db, **session_options)
        self.plans: list[list[str]] = []
        self.windows: list[int | None] = []
        # Token windows are in effect: asked for (the default), on a database file, indexed.
        self._windowed = (
            session_options.get("windowed_reads", True) is True
            and session_options.get("incremental") is not False
            and db != ":memory:"
        )
        self.reports: list[Any] = []
        builder = TokenBudgetedContextBuilder(
            self.store, max_tokens=max_tokens, scope=SCOPE, output_reserve=100, policy=policy
        )
        if remember is not None:
            self.store.remember(remember, scope=SCOPE)
        self.callback = self.session.input_callback(
            builder,
            system_prompt="Be brief.",
            on_plan=self._record,
        )
        self._closed = False

    def _record(self, plan: Any) -> None:
        self.plans.append(
            [json.dumps(i, sort_keys=True, default=str) for i in plan.items]
            + [
                f"tokens {plan.pack.used} {plan.pack.history_tokens} "
                f"{plan.pack.remaining} {len(plan.pack.decisions)}"
            ]
        )
        self.reports.append(plan.turn)

    def agent(self, i: int) -> Any:
        from agents import Agent
        from agents.testing import ScriptedModel

        return Agent(name="a", model=ScriptedModel(self.script(i)), tools=[lookup()])

    def config(self) -> Any:
        from agents import RunConfig

        return RunConfig(session_input_callback=self.callback, tracing_disabled=True)

    async def turn(self, i: int, mode: str = "run") -> None:
        """Turn ``i`` through ``Runner.run`` (``mode="run"``), ``run_streamed`` or
        ``run_sync``."""
        before = len(self.reports)
        await self._run(i, mode)
        if self._windowed:
            windows = [r for r in self.reports[before:] if r is not None and r.windowed]
            last = windows[-1] if windows else None
            self.windows.append(None if last is None else last.history_items - last.read_items)

    async def _run(self, i: int, mode: str) -> None:
        from agents import Runner

        question = f"question {i} " + "please " * 20
        if mode == "run":
            await Runner.run(
                self.agent(i), question, session=self.session, run_config=self.config()
            )
        elif mode == "streamed":
            result = Runner.run_streamed(
                self.agent(i), question, session=self.session, run_config=self.config()
            )
            async for _ in result.stream_events():
                pass
        else:  # run_sync needs a thread without a running loop
            await asyncio.to_thread(
                Runner.run_sync,
                self.agent(i),
                question,
                session=self.session,
                run_config=self.config(),
            )

    def rows(self) -> list[str]:
        """The stored rows (``message_data``), oldest first."""
        conn = sqlite3.connect(self.db)
        try:
            return [
                r[0] for r in conn.execute("SELECT message_data FROM agent_messages ORDER BY id")
            ]
        finally:
            conn.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.session.close()
            self.store.close()


_LOOKUP: list[Any] = []


def lookup() -> Any:
    """The turns' tool: ``lookup(name)`` answers with ~40 words of details."""
    if not _LOOKUP:
        from agents import function_tool

        @function_tool
        def lookup(name: str) -> str:
            """Look something up."""
            return f"{name}: " + "details " * 40

        _LOOKUP.append(lookup)
    return _LOOKUP[0]


@pytest.fixture
def session_sides() -> Iterator[Callable[..., SessionSide]]:
    """``session_sides(db, script, **options)`` makes a :class:`SessionSide`; every side
    made is closed at the end of the test (closing one earlier is fine)."""
    made: list[SessionSide] = []

    def make(db: str, script: Callable[[int], list[Any]], **options: Any) -> SessionSide:
        side = SessionSide(db, script, **options)
        made.append(side)
        return side

    yield make
    for side in made:
        side.close()


# ---------------------------------------------------------------------- inner-session engines


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The test redis-server's URL."""
    return service_url("PROTOPROMPT_TEST_REDIS_URL", "redis-server")


SESSION_ENGINES = ["sqlite", "sqlalchemy-sqlite", "postgres-asyncpg", "postgres-psycopg", "redis"]
"""Where a ProtoPromptSession's history can live with the whole fast path: a SQLite file
(``SQLiteSession``), ``SQLAlchemySession`` on a SQLite file (aiosqlite) and on PostgreSQL
(psycopg, the one driver protoprompt itself uses, and asyncpg, which a user may give the
SDK's engine), and ``RedisSession``."""


class SessionEngine:
    """Inner sessions of one engine for one test: ``proto(sid)`` a ProtoPromptSession over a
    new inner session (as one worker makes it), ``plain(sid)`` the SDK's own session of the
    same stored session (another worker without protoprompt). Session ids are unique per
    test (``sid(name)``); ``close()`` disposes of every engine and client made."""

    def __init__(self, kind: str, tmp_path: Path, url: str) -> None:
        self.kind = kind
        self.url = url
        self.db = str(tmp_path / "sessions.db")
        self.prefix = f"pp-test-{uuid.uuid4().hex[:12]}"
        self.tag = uuid.uuid4().hex[:8]
        self._inners: list[Any] = []
        self._protos: list[Any] = []

    def sid(self, name: str = "chat") -> str:
        return f"{name}-{self.tag}"

    def plain(self, sid: str) -> Any:
        """The SDK's session for ``sid`` (a new engine or client: another worker)."""
        if self.kind == "sqlite":
            from agents.memory import SQLiteSession

            inner: Any = SQLiteSession(sid, self.db)
        elif self.kind == "redis":
            from agents.extensions.memory import RedisSession

            inner = RedisSession.from_url(sid, url=self.url, key_prefix=self.prefix)
        else:
            from agents.extensions.memory import SQLAlchemySession

            inner = SQLAlchemySession.from_url(sid, url=self.url, create_tables=True)
        self._inners.append(inner)
        return inner

    def proto(self, sid: str, **options: Any) -> Any:
        """A ProtoPromptSession for ``sid`` over a new inner session."""
        from protoprompt.integrations import ProtoPromptSession

        if self.kind == "sqlite":
            session = ProtoPromptSession(sid, self.db, **options)
        else:
            session = ProtoPromptSession(sid, inner_session=self.plain(sid), **options)
        self._protos.append(session)
        return session

    async def close(self) -> None:
        for session in self._protos:
            session.close()
        for inner in self._inners:
            if self.kind == "sqlite":
                inner.close()
            elif self.kind == "redis":
                await inner.close()
            else:
                await inner.engine.dispose()
        if self.kind == "redis":
            import redis.asyncio as redis

            client = redis.from_url(self.url)
            try:
                keys = [k async for k in client.scan_iter(match=f"{self.prefix}:*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()


@pytest.fixture(params=SESSION_ENGINES)
async def session_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """Each session test runs on every engine of :data:`SESSION_ENGINES` (PostgreSQL and
    Redis: the test servers of scripts/services.sh)."""
    pytest.importorskip("agents")
    kind = str(request.param)
    if kind == "sqlite":
        url = ""
    elif kind == "sqlalchemy-sqlite":
        pytest.importorskip("aiosqlite")
        url = f"sqlite+aiosqlite:///{tmp_path / 'sessions.db'}"
    elif kind == "redis":
        pytest.importorskip("redis")
        url = request.getfixturevalue("redis_url")
    else:
        driver = kind.removeprefix("postgres-")
        pytest.importorskip(driver)
        base = request.getfixturevalue("postgres_url")
        url = base.replace("postgresql://", f"postgresql+{driver}://", 1)
    engine = SessionEngine(kind, tmp_path, url)
    try:
        yield engine
    finally:
        await engine.close()
