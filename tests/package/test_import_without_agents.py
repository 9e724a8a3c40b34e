"""Importing protoprompt never needs openai-agents; the integration names the extra."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import protoprompt

# The directory the protoprompt under test was imported from (the source tree in development,
# site-packages when the installed wheel is tested).
PYTHON_DIR = Path(protoprompt.__file__).resolve().parents[1]

BLOCKER = """
import importlib.abc, sys

class _NoAgents(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "agents" or name.startswith("agents."):
            raise ImportError(f"No module named {name!r} (blocked for this test)")
        return None

sys.meta_path.insert(0, _NoAgents())
for name in [m for m in sys.modules if m == "agents" or m.startswith("agents.")]:
    del sys.modules[name]
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_import_protoprompt_without_agents() -> None:
    proc = run("""
        import protoprompt, protoprompt.integrations
        from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder
        builder = TokenBudgetedContextBuilder(MemoryStore(), max_tokens=100,
                                              scope=MemoryScope("acme"))
        plan = builder.build([], [{"role": "user", "content": "hi"}], system_prompt="Be brief.")
        assert plan.context_message["content"] == "Be brief."
        assert "agents" not in sys.modules
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_integration_without_agents_names_the_extra() -> None:
    proc = run("""
        try:
            from protoprompt.integrations import ProtoPromptSession
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("imported without agents")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'protoprompt[agents]'" in proc.stdout


def test_importing_protoprompt_does_not_import_agents() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, protoprompt, protoprompt.integrations; print('agents' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(PYTHON_DIR)},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_the_offline_model_without_agents_names_the_extra() -> None:
    proc = run("""
        import protoprompt.testing
        try:
            protoprompt.testing.offline_model("gpt-5")
        except ImportError as exc:
            print(exc)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'protoprompt[agents]'" in proc.stdout
