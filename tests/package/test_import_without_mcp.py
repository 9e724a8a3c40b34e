"""The base install needs no ``mcp``: the library and the ``inspect`` / ``count`` commands work
without it, and the server names the extra that brings it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import protoprompt

PYTHON_DIR = Path(protoprompt.__file__).resolve().parents[1]

BLOCKER = """
import importlib.abc, sys

class _NoMcp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "mcp" or name.startswith("mcp."):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked for this test)",
                                      name="mcp")
        return None

sys.meta_path.insert(0, _NoMcp())
"""


def run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_library_and_cli_import_without_mcp() -> None:
    proc = run(
        """
        import protoprompt, protoprompt.cli, protoprompt.integrations
        assert "mcp" not in sys.modules
        assert protoprompt.cli.main(["count", "--as", "text", sys.argv[1]]) == 0
        assert "mcp" not in sys.modules
    """,
        __file__,
    )
    assert proc.returncode == 0, proc.stderr
    assert "tokens (o200k_base)" in proc.stdout


def test_server_without_mcp_names_the_extra(tmp_path: Path) -> None:
    proc = run("""
        try:
            import protoprompt.mcp
        except ImportError as exc:
            print(exc)
        else:
            raise SystemExit("imported without mcp")
    """)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'protoprompt[mcp]'" in proc.stdout

    proc = run(
        """
        import protoprompt.cli
        sys.exit(protoprompt.cli.main(["mcp", "--db", sys.argv[1], "--tenant", "acme",
                                       "--user", "alice"]))
    """,
        str(tmp_path / "m.db"),
    )
    assert proc.returncode == 1
    assert "protoprompt mcp: error:" in proc.stderr
    assert "pip install 'protoprompt[mcp]'" in proc.stderr
    assert "Traceback" not in proc.stderr
