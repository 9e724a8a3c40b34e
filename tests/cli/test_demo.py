"""``protoprompt demo``: an offline budgeted session in a folder the user names, each turn's
plan printed, then the inspect command -- which runs on what the demo stored."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents")

import protoprompt  # noqa: E402

PYTHON_DIR = Path(protoprompt.__file__).resolve().parents[1]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": ""}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "protoprompt", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_demo_runs_offline_in_the_named_folder_and_its_inspect_command_works(
    tmp_path: Path,
) -> None:
    done = _run(["demo", "my demo"], tmp_path)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert (tmp_path / "my demo" / "demo.db").is_file()
    turns = re.findall(r"^=== turn (\d): ", out, re.M)
    assert turns == ["1", "2", "3", "4", "5", "6"]
    # Every turn's plan, each within the budget.
    requests = [
        int(n.replace(",", "")) for n in re.findall(r"^    used: ([\d,]+) of 1,050", out, re.M)
    ]
    assert len(requests) == 6 and all(r <= 1_050 for r in requests)
    assert "model calls: 2 (a tool loop)" in out  # a lookup, then the answer
    assert re.search(r"^    masked: \d+ units? \(\d+ tool outputs?\), \d+ tokens saved", out, re.M)
    assert re.search(r"^    dropped items: \d+ over_budget", out, re.M)
    assert re.search(r"^      profile kept .*\n      facts +kept .*\n      rag     kept", out, re.M)
    # Recalled turns in the context message (with the default cache policy the move at turn
    # 4 evicts to the low-water mark, so turn 5 recalls the fee answer, cut to its room).
    assert re.search(r"^      history (kept|truncated) +\d+ tokens  history:", out, re.M)
    # The last line is the inspect command, for the folder as the user named it.
    command = shlex.split(out.strip().splitlines()[-1])
    assert command[:3] == ["protoprompt", "inspect", "my demo/demo.db"]
    inspected = _run(command[1:], tmp_path)
    assert inspected.returncode == 0, inspected.stderr
    assert "session 'demo' in my demo/demo.db: 22 items" in inspected.stdout
    assert (tmp_path / "my demo" / "plan.html").is_file()

    # Run again in the same folder: the earlier demo is replaced, not added to.
    again = _run(["demo", "my demo"], tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == out.replace(
        *re.findall(r"fact:[0-9a-f]+", out)[:1], *re.findall(r"fact:[0-9a-f]+", again.stdout)[:1]
    )


def test_the_demo_names_a_folder_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")
    done = _run(["demo", "file"], tmp_path)
    assert done.returncode == 1
    assert done.stderr.startswith("protoprompt demo: error: cannot write to file")
