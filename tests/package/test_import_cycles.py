"""The package's run-time import graph has no cycle (``scripts/import_cycles.py``, a lint
gate): imports inside functions count, those under ``if TYPE_CHECKING:`` do not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "import_cycles.py"
PACKAGE = ROOT / "python" / "protoprompt"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_cycles"] = module
    spec.loader.exec_module(module)
    return module


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_package_has_no_import_cycle() -> None:
    checker = _checker()
    modules = checker.load(PACKAGE)
    assert "protoprompt.plan_html" in modules and "protoprompt.memory._open" in modules
    assert checker.components(modules) == []


def test_the_page_renders_views_and_never_imports_a_plan() -> None:
    # The plans import the view; the page imports the view and no plan; no plan imports the
    # page (to_html asks the view's page(), which the page registers when the package's
    # __init__ imports it).
    checker = _checker()
    modules = checker.load(PACKAGE)
    page = {e.target for e in modules["protoprompt.plan_html"].edges}
    view = {e.target for e in modules["protoprompt._plan_view"].edges}
    for plan in ("protoprompt.context", "protoprompt._context._plan", "protoprompt.packing"):
        assert plan not in page | view
    assert "protoprompt._packing._result" not in page | view
    assert "protoprompt._plan_view" in page
    for plan in (
        "protoprompt._packing._result",
        "protoprompt._context._plan",
        "protoprompt.integrations._calls._call_plan",
    ):
        targets = {e.target for e in modules[plan].edges}
        assert "protoprompt._plan_view" in targets and "protoprompt.plan_html" not in targets
    assert "protoprompt.plan_html" in {e.target for e in modules["protoprompt"].edges}


INTEGRATION_ROOMS = ("_turns", "_stores", "_calls", "_sdk")
"""The private rooms of ``protoprompt.integrations``, each importing only the rooms after it."""


def _integration_room(name: str) -> str | None:
    parts = name.split(".")[2:]
    return parts[0] if len(parts) > 1 and parts[0] in INTEGRATION_ROOMS else None


def test_the_integration_rooms_import_only_the_rooms_after_them() -> None:
    # Imports under TYPE_CHECKING count too: a room that names another room's types is
    # built on it. The public modules at the top of the package may import any room.
    checker = _checker()
    modules = checker.load(PACKAGE, typing_too=True)
    prefix = "protoprompt.integrations."
    # every private module at the top of the package is a room
    top = {name for name in modules if name.startswith(prefix) and name.count(".") == 2}
    assert {name for name in top if name.split(".")[2].startswith("_")} == {
        prefix + room for room in INTEGRATION_ROOMS
    }
    imported: set[str] = set()
    for mod in modules.values():
        if not mod.name.startswith(prefix):
            continue
        here = _integration_room(mod.name)
        for edge in mod.edges:
            there = _integration_room(edge.target)
            if there is None or there == here:
                continue
            imported.add(there)
            if here is not None:
                order = INTEGRATION_ROOMS.index
                assert order(there) > order(here), f"{mod.name} imports {edge.target}"
    assert imported == set(INTEGRATION_ROOMS)


PACKAGE_ROOMS = ("_recall", "_context", "_packing", "_storage")
"""The private rooms at the top of ``protoprompt``, each importing only the rooms after it:
what a turn recalls, the builder's context message, packing a history, storage."""

TOP_PRIVATE = {"_core", "_demo", "_meta", "_plan_view", "_process", "_reasons", "_seams", "_tokens"}
"""The private modules that stay at the top of ``protoprompt``: the core, process-wide state,
the seams of third-party classes, and the small shared vocabularies (tokens, reasons, views)."""


def test_the_package_rooms_import_only_the_rooms_after_them() -> None:
    checker = _checker()
    modules = checker.load(PACKAGE, typing_too=True)

    def room(name: str) -> str | None:
        parts = name.split(".")
        return parts[1] if len(parts) > 2 and parts[1] in PACKAGE_ROOMS else None

    top = {name.split(".")[1] for name in modules if name.count(".") >= 1}
    private = {name for name in top if name.startswith("_") and not name.startswith("__")}
    assert private == set(PACKAGE_ROOMS) | (TOP_PRIVATE - {"_core"}), private
    imported: set[str] = set()
    for mod in modules.values():
        here = room(mod.name)
        for edge in mod.edges:
            there = room(edge.target)
            if there is None or there == here:
                continue
            imported.add(there)
            if here is not None:
                order = PACKAGE_ROOMS.index
                assert order(there) > order(here), f"{mod.name} imports {edge.target}"
    assert imported == set(PACKAGE_ROOMS)


def test_an_import_inside_a_function_closes_a_cycle(tmp_path: Path) -> None:
    checker = _checker()
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from .b import B\nA = 1\n",
            "b.py": "B = 2\n\ndef late():\n    from .a import A\n    return A\n",
            "c.py": "from . import a\n",
        },
    )
    modules = checker.load(root)
    assert checker.components(modules) == [["pkg.a", "pkg.b"]]
    assert checker.report(modules, stats=False, private=False) == 1


def test_type_checking_imports_are_not_a_cycle(tmp_path: Path) -> None:
    checker = _checker()
    files = {
        "__init__.py": "",
        "a.py": "from .b import B\n",
        "b.py": (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import A\nB = 1\n"
        ),
    }
    modules = checker.load(_package(tmp_path, files))
    assert checker.components(modules) == []
    assert checker.report(modules, stats=False, private=False) == 0
    typed = checker.load(_package(tmp_path, files), typing_too=True)
    assert checker.components(typed) == [["pkg.a", "pkg.b"]]


@pytest.mark.parametrize(
    ("line", "target"),
    [
        ("from . import b", "pkg.b"),
        ("from .sub import c", "pkg.sub.c"),
        ("import pkg.sub.c", "pkg.sub.c"),
        ("from .sub.c import C", "pkg.sub.c"),
    ],
)
def test_each_form_of_import_is_an_edge(tmp_path: Path, line: str, target: str) -> None:
    checker = _checker()
    root = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": f"def f():\n    {line}\n",
            "b.py": "",
            "sub/__init__.py": "",
            "sub/c.py": "C = 1\n",
        },
    )
    edges = checker.load(root)["pkg.a"].edges
    assert [(e.target, e.in_function) for e in edges] == [(target, True)]


def test_the_rust_core_has_no_module_cycle() -> None:
    checker = _checker()
    modules = checker.load_rust(ROOT / "rust" / "core" / "src")
    assert {"pack", "mask", "mask_cache", "costs", "masked_field", "tokens::count"} <= set(modules)
    assert checker.components(modules) == []
    # the masking's values sit beneath both the masking and its cache
    assert {e.target for e in modules["masked_field"].edges} == set()
    assert "mask" not in {e.target for e in modules["mask_cache"].edges}
    assert "pack" not in {e.target for e in modules["costs"].edges}


def test_a_use_in_rust_code_is_an_edge_and_a_doc_link_is_not(tmp_path: Path) -> None:
    checker = _checker()
    src = tmp_path / "src"
    (src / "tokens").mkdir(parents=True)
    (src / "lib.rs").write_text("pub mod a;\npub mod b;\npub mod tokens;\n")
    (src / "a.rs").write_text("use crate::{b::B, tokens::{self, X}};\npub struct A;\n")
    (src / "b.rs").write_text("//! See [`crate::a::A`].\npub fn f() -> u8 { crate::a::g() }\n")
    (src / "tokens" / "mod.rs").write_text("pub struct X;\n")
    modules = checker.load_rust(src)
    assert {e.target for e in modules["a"].edges} == {"b", "tokens"}
    assert checker.components(modules) == [["a", "b"]]
    (src / "b.rs").write_text("//! See [`crate::a::A`].\npub struct B;\n")
    assert checker.components(checker.load_rust(src)) == []
