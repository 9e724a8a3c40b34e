"""The suite's layout: the tests live in folders named after the package's rooms, each folder
collects on its own (no test module imports one of another folder), and DEVELOPING.md's
layout lists every folder."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"

ROOMS = {
    "packing": "packing.py, _packing/, plans.py, prefix.py, _tokens.py: packs, plans, masking",
    "context": "context.py, _context/: the context message",
    "recall": "recall.py, _recall/, memory/, summaries.py, embed: what a turn recalls",
    "storage": "_storage/, integrations/_stores/: counts, engines, snapshots, stored state",
    "integrations": "integrations/: the session, the per-call filter, the SDK end to end",
    "cli": "cli/: the protoprompt command",
    "mcp": "mcp/: the MCP server",
    "package": "the public API, the documentation, the import rules",
}
"""The rooms of the package a test folder may be named after."""

SUPPORT = {"data": "databases of earlier formats", "sdk_conformance": "the SDK's own tests' plugin"}
"""The folders of tests/ that hold no tests of a room."""


def _folders() -> set[str]:
    return {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}


def _test_modules() -> dict[str, Path]:
    return {p.stem: p for p in TESTS.glob("*/test_*.py")}


def test_every_test_folder_is_a_room_or_a_support_folder() -> None:
    folders = _folders()
    assert folders - ROOMS.keys() - SUPPORT.keys() == set(), "a test folder that is no room"
    assert ROOMS.keys() - folders == set(), "a room with no test folder"
    for room in ROOMS:
        assert list((TESTS / room).glob("test_*.py")), f"tests/{room}/ has no test module"
    for folder in SUPPORT:
        assert not list((TESTS / folder).glob("test_*.py")), f"tests/{folder}/ holds tests"


def test_test_module_names_are_unique_across_folders() -> None:
    # pytest imports each test module by its file name (no __init__.py: rootdir mode).
    seen: dict[str, Path] = {}
    for path in sorted(TESTS.glob("*/test_*.py")):
        assert path.stem not in seen, f"{path} and {seen[path.stem]}"
        seen[path.stem] = path


def test_no_test_module_imports_a_test_module_of_another_folder() -> None:
    # Each folder runs alone (pytest puts only the folder of the file it collects on
    # sys.path): a helper that two folders share goes to the top of tests/.
    modules = _test_modules()
    crossing = []
    for path in modules.values():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            else:
                continue
            for name in names:
                other = modules.get(name.split(".")[0])
                if other is not None and other.parent != path.parent:
                    crossing.append(f"{path.relative_to(ROOT)} imports {other.relative_to(ROOT)}")
    assert crossing == []


def test_developing_lists_every_test_folder() -> None:
    text = (ROOT / "DEVELOPING.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `tests/` |"))
    listed = set(re.findall(r"`([a-z_]+)/`", row.removeprefix("| `tests/` |")))
    assert listed == _folders(), "DEVELOPING.md's `tests/` row and the folders of tests/ differ"
