"""Every private name of a third-party library protoprompt uses goes through
``protoprompt._seams``, and each still resolves on the SDK line installed (CI runs this file
on 0.22.3, 0.23.1 and 0.24.0, mcp 1.x and 2.x)."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import re
from pathlib import Path

import pytest

import protoprompt as pp
from protoprompt import _seams

pytest.importorskip("agents")

SDK = tuple(int(p) for p in importlib.metadata.version("openai-agents").split(".")[:2])
MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
PACKAGE = Path(pp.__file__).parent


def _applies(seam: _seams.Seam) -> bool:
    if seam.library == "mcp":
        return MCP_MAJOR < 2
    return seam.since is None or SDK >= seam.since


@pytest.mark.parametrize("seam", _seams.SEAMS, ids=lambda s: f"{s.owner or s.module}.{s.name}")
def test_each_seam_resolves_on_this_sdk_line(seam: _seams.Seam) -> None:
    try:
        module = importlib.import_module(seam.module)
    except ImportError as exc:  # the optional dependency of an extension (redis, sqlalchemy)
        pytest.skip(f"{seam.module}: {exc}")
    owner = module if seam.where == "module" else getattr(module, seam.owner)
    if seam.where in ("class", "module"):
        found = hasattr(owner, seam.name)
    else:
        # set on each object by the library's own code: `x.<name> = ...`
        source = inspect.getsource(importlib.import_module(owner.__module__))
        found = re.search(rf"\.{re.escape(seam.name)}\s*(:[^=\n]*)?=[^=]", source) is not None
    assert found is _applies(seam), (seam, "openai-agents", SDK)


def test_the_sessions_read_their_seams_on_this_line() -> None:
    """The accessors give what the library's own objects hold."""
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

    redis_session = pytest.importorskip("agents.extensions.memory.redis_session")
    from redis.asyncio import Redis

    inner = redis_session.RedisSession("s1", redis_client=Redis(), key_prefix="pfx")
    assert _seams.redis_readable(inner)
    session_key, messages_key, prefix = _seams.redis_keys(inner)
    assert prefix == "pfx" and session_key.startswith("pfx") and messages_key.startswith("pfx")
    assert isinstance(_seams.redis_client(inner), Redis)
    assert (_seams.atomic_replace_items(type(inner)) is not None) is (SDK >= (0, 24))
    sa = SQLAlchemySession.from_url("s1", url="sqlite+aiosqlite:///:memory:")
    assert _seams.sqlalchemy_table(sa).name == "agent_messages"
    assert not _seams.sqlalchemy_shares_a_connection(sa) or SDK >= (0, 23)


def _private_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``x._name`` and ``getattr(x, "_name")`` on something other than self/cls, a module
    of the package, or ``sys``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if node.attr.startswith("__"):
                continue
            base = node.value
            if isinstance(base, ast.Name) and base.id in {"self", "cls", "sys"}:
                continue
            if isinstance(base, ast.Attribute) and base.attr in {"_inner"}:
                found.append((node.lineno, node.attr))
                continue
            if isinstance(base, ast.Name) and base.id in {"inner", "server", "span", "provider"}:
                found.append((node.lineno, node.attr))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
        ):
            found.append((node.lineno, node.args[1].value))
    return found


SEAM_NAMES = {s.name for s in _seams.SEAMS}


def test_every_private_name_of_a_library_is_read_through_the_seam_module() -> None:
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "_seams.py":
            continue
        for line, name in _private_reads(ast.parse(path.read_text(encoding="utf-8"))):
            if name in SEAM_NAMES:
                stray.append(f"{rel}:{line} {name}")
    assert stray == []


def _string_constants(tree: ast.AST) -> list[tuple[int, str]]:
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_every_seam_name_is_spelled_only_in_the_seam_module() -> None:
    """A library's private name as a string (a hook forwarded, a name a probe looks for, a
    method a session poses as) is the seam module's constant, not a copy."""
    names = SEAM_NAMES | {_seams.READ_COMPACTION_ITEMS, _seams.SESSION_GET_ITEMS}
    stray = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel == "_seams.py":
            continue
        for line, value in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if value in names:
                stray.append(f"{rel}:{line} {value}")
    assert stray == []


def test_a_closed_session_is_told_by_the_seam() -> None:
    class Closed:
        _closed = True

    assert _seams.session_closed(Closed()) and not _seams.session_closed(object())
    from agents.memory import session as sdk_session

    assert _seams.compacts_to_a_snapshot(sdk_session) is (SDK >= (0, 23))
