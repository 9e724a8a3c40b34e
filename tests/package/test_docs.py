"""Every code block of README.md, DEVELOPING.md and docs/*.md runs as written (see
tests/docs_runner.py for how blocks are marked and how the model is kept offline), so a
snippet cannot rot: a page whose snippet breaks fails here."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from docs_runner import (  # noqa: E402
    PAGES,
    ROOT,
    RUN,
    SHOWN,
    Block,
    blocks,
    check_json,
    matches,
    offline_models,
    run_python,
    run_shell,
    shell_env,
)


def run_page(page: str | Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Block]:
    """Run ``page``'s blocks in order in ``tmp_path``; returns the blocks not run (skipped
    by their directive, or needing a server that is not there)."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    not_run: list[Block] = []
    last: str | None = None
    env: dict[str, str] = {}
    with offline_models():
        for b in blocks(page):
            assert b.language, (
                f"{b.where}: a block without a language: mark it (python, bash, text, json)"
            )
            assert b.language in RUN | SHOWN, f"{b.where}: unknown block language {b.language!r}"
            if "skip" in b.directives:
                assert b.directives["skip"], f"{b.where}: <!-- doc: skip --> needs a reason"
                not_run.append(b)
                last = None
                continue
            if "output" in b.directives:
                assert b.language == "text", f"{b.where}: an output block is marked text"
                assert last is not None, f"{b.where}: no block before this output ran"
                assert matches(b.code, last), f"{b.where}: the output differs:\n{last}"
                last = None
                continue
            if b.directives.get("needs") == "postgres":
                url = os.environ.get("PROTOPROMPT_TEST_POSTGRES_URL")
                if not url:
                    if os.environ.get("PROTOPROMPT_REQUIRE_SERVICES") == "1":
                        pytest.fail(f"{b.where} needs PostgreSQL (scripts/services.sh)")
                    not_run.append(b)
                    last = None
                    continue
                monkeypatch.setenv("DATABASE_URL", url)
                env["DATABASE_URL"] = url
            if b.language == "python":
                last = run_python(b, namespace)
            elif b.language in ("bash", "sh"):
                last = run_shell(b, tmp_path, shell_env(env))
            else:
                if b.language == "json":
                    check_json(b)
                last = None
    return not_run


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(
    page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_run = run_page(page, tmp_path, monkeypatch)
    ran = [b for b in blocks(page) if b.language in RUN and b not in not_run]
    if any(b.language in RUN for b in blocks(page)):
        assert ran, f"{page}: none of its code blocks runs"


def test_a_broken_snippet_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner is not lenient: an undefined name, a top-level await, a failing command, a
    wrong output and an unmarked block each fail the page."""
    cases = {
        "```python\nprint(undefined_name)\n```\n": NameError,
        "```python\nimport asyncio\nawait asyncio.sleep(0)\n```\n": SyntaxError,
        "```bash\nfalse\n```\n": AssertionError,
        "```python\nprint('a')\n```\n<!-- doc: output -->\n```text\nb\n```\n": AssertionError,
        "```\nplain\n```\n": AssertionError,
        "<!-- doc: skip -->\n```python\nx = 1\n```\n": AssertionError,
    }
    for text, error in cases.items():
        page = tmp_path / "page.md"
        page.write_text(text)
        with pytest.raises(error):
            run_page(page, tmp_path, monkeypatch)
    good = tmp_path / "good.md"
    good.write_text(
        "```python\nprint('a')\nprint('b')\nprint('c')\n```\n"
        "<!-- doc: output -->\n```text\na\n...\nc\n```\n"
    )
    assert run_page(good, tmp_path, monkeypatch) == []


def test_the_offline_model_runs_an_agent_with_a_tool_and_an_output_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        """```python
import asyncio
from pydantic import BaseModel
from agents import Agent, Runner, function_tool

@function_tool
def lookup(name: str, count: int) -> str:
    \"\"\"Look something up.\"\"\"
    return f"{name} x{count}"

class Answer(BaseModel):
    text: str
    score: float

agent = Agent(name="a", model="gpt-5", tools=[lookup], output_type=Answer)
result = asyncio.run(Runner.run(agent, "find it"))
print(type(result.final_output).__name__, [type(i).__name__ for i in result.new_items])
```
<!-- doc: output -->
```text
Answer ['ToolCallItem', 'ToolCallOutputItem', 'MessageOutputItem']
```
"""
    )
    run_page(page, tmp_path, monkeypatch)


def test_every_page_is_tested() -> None:
    pages = {"README.md", "DEVELOPING.md"} | {
        f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")
    }
    assert set(PAGES) == pages


_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _prose(path: Path) -> str:
    """The page without its fenced blocks."""
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("page", PAGES)
def test_links_resolve(page: str) -> None:
    """Every relative link of the page points to a file, and an anchor to a heading."""
    path = ROOT / page
    for target in _LINK.findall(_prose(path)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        assert dest.exists(), f"{page}: the link {target} goes nowhere"
        if anchor and dest.suffix == ".md":
            headings = {
                _slug(line.lstrip("#"))
                for line in _prose(dest).splitlines()
                if line.startswith("#")
            }
            assert anchor in headings, f"{page}: no heading #{anchor} in {file or page}"
