"""The SDK-version probes in one place: what the session reads from the SDK's stack frames and
code objects, which no public API tells (0.22.3, 0.23.1 and 0.24.0 are supported).

- ``prepare_input_with_session`` (the runner's read before a turn): a session callback
  called from it hands its context message to the SDK in the history list (``called_by_
  runner``), and a ``get_items`` under it may read a token window, from the frame's
  locals ``session``, ``input``, ``session_input_callback`` and
  ``include_history_in_prepared_input`` (``runner_locals``);
- ``OpenAIResponsesCompactionSession``'s history replacement: a ``clear_session`` under it
  is a rewrite, not the user's clear (``called_by_compaction_rewrite``);
- ``SQLiteSession.pop_item`` calling ``_pop_item_with_validation`` (``SQLITE_VALIDATED_POP``);
- the runner's input de-duplication (``_dedupe_key``, ``_DEDUPE_EARLIEST_ANCHOR_ITEM_TYPES``).

Each probe is also written down as data (:data:`PROBES`), and :func:`runtime_mismatches`
and :func:`source_mismatches` say where the installed SDK, or the source tree of another
SDK line, no longer matches one: the tests run both, so an SDK release that renames what
a probe reads fails a test instead of silently turning a fast path off.
"""

from __future__ import annotations

import ast
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from ..._seams import COMPACTION_REWRITES as REWRITE_METHODS
from ..._seams import DEDUPE_KEY, POP_ITEM_WITH_VALIDATION, SESSION_GET_ITEMS
from ._names import SQLiteSession


@dataclass(frozen=True)
class CodeProbe:
    """A function of the SDK whose frame or code a probe reads."""

    module: str
    """Its module (``agents.run_internal.session_persistence``)."""
    qualname: str
    """Its name in the module (``Class.method`` for a method)."""
    reads: tuple[str, ...] = ()
    """Local names (parameters or variables) read from its frame or code."""
    calls: tuple[str, ...] = ()
    """Names it calls (a function, a method or a parameter), which the probe relies on."""
    why: str = ""


PREPARE = CodeProbe(
    "agents.run_internal.session_persistence",
    "prepare_input_with_session",
    reads=("input", "session", "session_input_callback", "include_history_in_prepared_input"),
    calls=("session_input_callback", SESSION_GET_ITEMS),
    why="the runner's read before a turn: token windows and the callback's hand-over",
)
COMPACTION_FILE = "openai_responses_compaction_session.py"
COMPACTION_REWRITES = tuple(
    CodeProbe(
        "agents.memory.openai_responses_compaction_session",
        f"OpenAIResponsesCompactionSession.{name}",
        calls=("clear_session",),
        why="a compaction's history replacement (clear, then add): not the user's clear",
    )
    for name in REWRITE_METHODS
)
VALIDATED_POP = CodeProbe(
    "agents.memory.sqlite_session",
    "SQLiteSession.pop_item",
    calls=(POP_ITEM_WITH_VALIDATION,),
    why="EncryptedSession's key check inside the SQLite transaction (0.24 and later)",
)
DEDUPE = CodeProbe(
    "agents.run_internal.items",
    DEDUPE_KEY,
    why="the runner's de-duplication of input items after the model filter",
)
PROBES = (PREPARE, *COMPACTION_REWRITES, DEDUPE)
"""The probes every supported SDK line must match (``VALIDATED_POP`` is optional: 0.22 has
no validated pop, and the session then pops as ``SQLiteSession`` does)."""


def _code_of(probe: CodeProbe) -> Any:
    """The code object of ``probe``'s function in the installed SDK, or ``None``."""
    try:
        target: Any = importlib.import_module(probe.module)
    except ImportError:
        return None
    for part in probe.qualname.split("."):
        target = getattr(target, part, None)
        if target is None:
            return None
    return getattr(target, "__code__", None)


PREPARE_CODE: Any = _code_of(PREPARE)
"""The code of the runner's ``prepare_input_with_session`` (``None``: another SDK layout,
then every read is a whole read)."""
_COMPACTION_REWRITE_NAMES = frozenset(p.qualname.rsplit(".", 1)[1] for p in COMPACTION_REWRITES)

SQLITE_VALIDATED_POP = callable(getattr(SQLiteSession, POP_ITEM_WITH_VALIDATION, None)) and (
    POP_ITEM_WITH_VALIDATION in SQLiteSession.pop_item.__code__.co_names
)
"""openai-agents >= 0.24: ``SQLiteSession.pop_item`` is ``_pop_item_with_validation()``, which
``EncryptedSession`` calls with its key check so a wrong key raises inside the SQLite
transaction and no row is lost. 0.22 has no such path (EncryptedSession pops blindly there)."""

FRAMES_UP = 8
"""How far up the stack ``get_items`` looks for the runner's ``prepare_input_with_session``
(through ``_session_get_items``, its ``read_items`` and ``_call_session_method``)."""


def called_by_runner() -> bool:
    """Whether the caller of the function calling this (a session callback's coroutine) runs
    inside the runner's ``prepare_input_with_session``: the SDK then takes the items it finds
    in the history list it handed over for history, never for the turn's new items to store
    (it maps the callback's result to both lists after the call, by identity first)."""
    if PREPARE_CODE is None:
        return False
    frame = sys._getframe(1).f_back
    return frame is not None and frame.f_code is PREPARE_CODE


def runner_locals(depth: int) -> dict[str, Any] | None:
    """The locals ``PREPARE.reads`` of the runner's ``prepare_input_with_session`` when it is
    among the :data:`FRAMES_UP` frames from the one ``depth`` levels above this call (for a
    helper of ``get_items``: 3, its caller), else ``None``."""
    if PREPARE_CODE is None:
        return None
    try:
        frame: FrameType | None = sys._getframe(depth)
    except ValueError:  # a shallower stack
        return None
    for _ in range(FRAMES_UP):
        if frame is None:
            return None
        if frame.f_code is PREPARE_CODE:
            return {name: frame.f_locals.get(name) for name in PREPARE.reads}
        frame = frame.f_back
    return None


def called_by_compaction_rewrite(depth: int = 4) -> bool:
    """Whether the caller of the function calling this (a session's ``clear_session``) runs
    inside ``OpenAIResponsesCompactionSession``'s replacement of the history (clear, then
    add the compacted items): a rewrite, not the user's clear, so what the session evicted
    stays reachable."""
    frame = sys._getframe(1).f_back
    for _ in range(depth):
        if frame is None:
            return False
        code = frame.f_code
        if code.co_name in _COMPACTION_REWRITE_NAMES and code.co_filename.endswith(COMPACTION_FILE):
            return True
        frame = frame.f_back
    return False


# ------------------------------------------------------------------ checks (the tests)


def runtime_mismatches(probes: tuple[CodeProbe, ...] = PROBES) -> list[str]:
    """Where the installed SDK no longer matches ``probes`` (empty: every probe holds)."""
    out: list[str] = []
    for probe in probes:
        code = _code_of(probe)
        if code is None:
            out.append(f"{probe.module}.{probe.qualname}: not found ({probe.why})")
            continue
        names = set(code.co_varnames) | set(code.co_names) | set(code.co_freevars)
        missing = [n for n in (*probe.reads, *probe.calls) if n not in names]
        if missing:
            out.append(f"{probe.module}.{probe.qualname}: no {', '.join(missing)}")
    return out


def _function(tree: ast.Module, qualname: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    body: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for part in qualname.split("."):
        found = next(
            (
                node
                for node in body
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and node.name == part
            ),
            None,
        )
        if found is None:
            return None
        body = found.body
    return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def _names_in(function: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[str], set[str]]:
    """The local names (parameters, assigned names) and the called names of ``function``."""
    args = function.args
    local = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    called: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            local.add(node.id)
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                called.add(func.id)
            elif isinstance(func, ast.Attribute):
                called.add(func.attr)
    return local, called


def source_mismatches(src: Path, probes: tuple[CodeProbe, ...] = PROBES) -> list[str]:
    """Where the SDK source tree ``src`` (the directory holding ``agents/``) no longer
    matches ``probes``: for SDK lines not installed here."""
    out: list[str] = []
    for probe in probes:
        path = src.joinpath(*probe.module.split(".")).with_suffix(".py")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, SyntaxError) as exc:
            out.append(f"{probe.module}: cannot be read ({exc})")
            continue
        function = _function(tree, probe.qualname)
        if function is None:
            out.append(f"{probe.module}.{probe.qualname}: not found ({probe.why})")
            continue
        local, called = _names_in(function)
        missing = [n for n in probe.reads if n not in local]
        missing += [n for n in probe.calls if n not in called]
        if missing:
            out.append(f"{probe.module}.{probe.qualname}: no {', '.join(missing)}")
    return out
