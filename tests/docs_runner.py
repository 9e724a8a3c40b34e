"""Run the code blocks of the project's Markdown pages as written (tests/package/test_docs.py).

Every fenced block carries a language. ``python`` blocks run, in the order of their page, in
one namespace per page (as a reader pastes them into one file), in a fresh directory;
``bash`` / ``sh`` blocks run there with ``bash -euo pipefail`` and this environment's
``bin`` first on ``PATH``; ``json`` blocks must parse; ``text`` (program output, formulas)
and ``toml`` are not run. A comment right before a block says more:

* ``<!-- doc: skip REASON -->``: the block is not run (it installs packages, starts a server
  that runs until stopped, builds the project...); the reason is required.
* ``<!-- doc: output -->``: the block (``text``) is what the previous block printed; a line
  ``...`` stands for any number of lines.
* ``json`` blocks hold one JSON document, or one per line (JSONL).
* ``<!-- doc: needs postgres -->``: runs with ``DATABASE_URL`` set to the test PostgreSQL
  server (skipped without one, failed under ``PROTOPROMPT_REQUIRE_SERVICES=1``).

The model is offline: every ``Agent`` whose model is a name (or the default) gets
``protoprompt.testing.offline_model`` through the SDK's default ``MultiProvider``
(``protoprompt.testing.offline_models``). It calls the first function tool it is given once
per run (arguments made from the tool's JSON schema), answers with the structured output's
schema when the agent has one, and otherwise in text.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    "README.md",
    "DEVELOPING.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]
"""The pages whose blocks run (paths relative to the repository)."""

RUN = {"python", "bash", "sh"}
SHOWN = {"text", "json", "toml"}

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,})(?P<info>[^`]*)$")
_DIRECTIVE = re.compile(r"^<!--\s*doc:\s*(?P<what>[a-z-]+)(?:\s+(?P<arg>.*?))?\s*-->$")


@dataclass
class Block:
    page: str
    line: int
    language: str
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str | Path) -> list[Block]:
    """The fenced blocks of ``page`` (a path relative to the repository, or absolute), with
    the directives of the comments right before each."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    page = str(page)
    out: list[Block] = []
    pending: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = _DIRECTIVE.match(line.strip())
        if directive:
            pending[directive["what"]] = directive["arg"] or ""
            i += 1
            continue
        fence = _FENCE.match(line)
        if fence is None:
            if line.strip():
                pending = {}
            i += 1
            continue
        start = i
        indent = len(fence["indent"])
        body: list[str] = []
        i += 1
        while i < len(lines) and lines[i].strip() != fence["fence"]:
            body.append(lines[i][indent:])
            i += 1
        out.append(Block(page, start + 1, fence["info"].strip(), "\n".join(body) + "\n", pending))
        pending = {}
        i += 1
    return out


# --------------------------------------------------------------------------- the model
# The documentation's offline model is the package's public one (protoprompt.testing), so a
# reader can run the same snippets offline.

from protoprompt.testing import offline_models as offline_models  # noqa: E402


# --------------------------------------------------------------------------- running


def run_python(block: Block, namespace: dict[str, Any]) -> str:
    """Run a Python block in ``namespace`` and return what it printed. A top-level
    ``await`` is a SyntaxError, as in a script."""
    code = compile(block.code, block.where, "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, namespace)
    return out.getvalue()


def run_shell(block: Block, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{block.where}: exit {done.returncode}\n{block.code}\n--- stdout\n{done.stdout}"
            f"\n--- stderr\n{done.stderr}"
        )
    return done.stdout


def shell_env(extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def check_json(block: Block) -> None:
    """A ``json`` block holds one JSON document, or one per line."""
    try:
        json.loads(block.code)
    except json.JSONDecodeError:
        for n, line in enumerate(block.code.splitlines()):
            if line.strip():
                try:
                    json.loads(line)
                except json.JSONDecodeError as exc:
                    raise AssertionError(
                        f"{block.where}: line {n + 1} is not JSON: {exc}"
                    ) from None


def matches(expected: str, got: str) -> bool:
    """``got`` equals ``expected`` line by line (trailing spaces ignored), where an
    expected line ``...`` stands for any number of lines."""
    want = [line.rstrip() for line in expected.rstrip("\n").splitlines()]
    have = [line.rstrip() for line in got.rstrip("\n").splitlines()]

    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(have)
        if want[i] == "...":
            return any(match(i + 1, k) for k in range(j, len(have) + 1))
        return j < len(have) and want[i] == have[j] and match(i + 1, j + 1)

    return match(0, 0)
