"""The run-time import graph of python/protoprompt, and its cycles (a `make lint` gate).

Every ``import`` and ``from ... import`` counts, at module level and inside functions
(an import inside a function runs when it is called: a cycle it closes is still a cycle);
only the imports under ``if TYPE_CHECKING:`` are left out (they never run). An edge goes
from the importing module to each protoprompt module it names: ``from .a import b`` is an
edge to ``a``, and to ``a.b`` too when that is a module. A package's ``__init__`` run
before its submodules is not an edge (every tool that draws import graphs leaves it out).

    python scripts/import_cycles.py            # prints the cycles; exit status 1 if any
    python scripts/import_cycles.py --rust     # the Rust core's modules only
    python scripts/import_cycles.py --stats    # and the graph's numbers
    python scripts/import_cycles.py --check-private   # also list private cross-module names

The Rust core (rust/core/src) is checked the same way: a module's ``use crate::...`` and
``crate::x::`` paths in code (not in comments: a doc link is no dependency) are its edges.

A cycle is reported as a strongly connected component of the graph (every module of it
reaches every other), with one closed path through it and the imports inside functions
among its edges.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "protoprompt"
SOURCE = ROOT / "python" / PACKAGE
RUST_CORE = ROOT / "rust" / "core" / "src"


@dataclass
class Edge:
    """One import of one module by another: where, and whether it runs inside a function."""

    target: str
    line: int
    in_function: bool


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    edges: list[Edge] = field(default_factory=list)
    private_uses: list[tuple[str, str, int]] = field(default_factory=list)
    foreign_private: list[tuple[str, int]] = field(default_factory=list)
    """``x._name`` on a name other than ``self``/``cls``/a module (another object's private
    attribute: its class may be of another module or library)."""


def module_name(path: Path, source: Path = SOURCE) -> tuple[str, bool]:
    rel = path.relative_to(source.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    if isinstance(test, ast.Attribute):
        return test.attr == "TYPE_CHECKING"
    return False


class _Imports(ast.NodeVisitor):
    """The imports of one module that run, each with whether it sits inside a function."""

    def __init__(self, typing_too: bool = False) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self._depth = 0
        self._typing_too = typing_too

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test) and not self._typing_too:
            for child in node.orelse:  # the else branch runs
                self.visit(child)
            return
        self.generic_visit(node)

    def _function(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self._depth > 0))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self.found.append((node, self._depth > 0))


def _resolve_from(mod: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base = base[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def load(source: Path = SOURCE, typing_too: bool = False) -> dict[str, Module]:
    """Every module of the package at ``source`` with the imports of it that run (and with
    ``typing_too``, those under ``if TYPE_CHECKING:`` as well)."""
    package = source.name
    modules: dict[str, Module] = {}
    for path in sorted(source.rglob("*.py")):
        name, is_package = module_name(path, source)
        modules[name] = Module(name, path, is_package)
    # compiled modules (the Rust binding): named by their stub, no imports of their own
    native = {module_name(p, source)[0] for p in source.rglob("*.pyi")} - set(modules)
    for mod in modules.values():
        tree = ast.parse(mod.path.read_text(encoding="utf-8"), str(mod.path))
        visitor = _Imports(typing_too)
        visitor.visit(tree)
        bound: dict[str, str] = {}  # a name in this module -> the package module it is
        for node, in_function in visitor.found:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    _add(mod, modules, alias.name, node.lineno, in_function)
                    if alias.asname and alias.name in modules:
                        bound[alias.asname] = alias.name
                continue
            target = _resolve_from(mod, node)
            if target != package and not target.startswith(package + "."):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in modules or sub in native:
                    # a submodule: the package itself is not what runs for it
                    _add(mod, modules, sub, node.lineno, in_function)
                    bound[alias.asname or alias.name] = sub
                    continue
                _add(mod, modules, target, node.lineno, in_function)
                if _private(alias.name) and target in modules and target != mod.name:
                    mod.private_uses.append((target, alias.name, node.lineno))
        _private_attributes(mod, tree, bound)
    return modules


def _private_attributes(mod: Module, tree: ast.AST, bound: dict[str, str]) -> None:
    """``other._name``: a private name of another package module used through it (the
    compiled binding ``_core`` is the package's own private layer, not counted)."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id not in bound
            and node.value.id not in ("self", "cls")
            and _private(node.attr)
        ):
            mod.foreign_private.append((f"{node.value.id}.{node.attr}", node.lineno))
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in bound
            and _private(node.attr)
            and bound[node.value.id] != mod.name
        ):
            mod.private_uses.append((bound[node.value.id], node.attr, node.lineno))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _add(mod: Module, modules: dict[str, Module], target: str, line: int, inner: bool) -> None:
    known = any(e.target == target and e.line == line for e in mod.edges)
    if target in modules and target != mod.name and not known:
        mod.edges.append(Edge(target, line, inner))


def components(modules: dict[str, Module]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def strong(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for e in modules[v].edges:
            w = e.target
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for name in sorted(modules):
        if name not in index:
            strong(name)
    return sorted(found, key=lambda c: (-len(c), c))


def _closed_path(modules: dict[str, Module], comp: list[str]) -> list[str]:
    """One shortest cycle through the component's first module (breadth first)."""
    members = set(comp)
    start = comp[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for e in modules[v].edges:
                if e.target not in members:
                    continue
                if e.target == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if e.target not in parents:
                    parents[e.target] = v
                    nxt.append(e.target)
        frontier = nxt
    return comp


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def report(modules: dict[str, Module], stats: bool, private: bool) -> int:
    cycles = components(modules)
    edges = [(m, e) for m in modules.values() for e in m.edges]
    inner = [(m, e) for m, e in edges if e.in_function]
    if stats:
        pairs = {(m.name, e.target) for m, e in edges}
        statements = {(m.name, e.line) for m, e in inner}
        print(f"modules: {len(modules)}, import edges (module pairs): {len(pairs)}")
        if any(m.path.suffix == ".py" for m in modules.values()):
            print(f"import statements inside functions (of package modules): {len(statements)}")
        print(f"cycles: {len(cycles)}, sizes: {[len(c) for c in cycles]}")
    for comp in cycles:
        members = set(comp)
        print(f"cycle of {len(comp)} modules: {', '.join(comp)}")
        print("  e.g. " + " -> ".join(_closed_path(modules, comp)))
        for m, e in inner:
            if m.name in members and e.target in members:
                rel = _shown(m.path)
                print(f"  inside a function: {rel}:{e.line} imports {e.target}")
    if private:
        uses = [(m, u) for m in modules.values() for u in m.private_uses]
        print(f"private names imported from another module: {len(uses)}")
        for m, (target, name, line) in uses:
            print(f"  {_shown(m.path)}:{line} {target}.{name}")
        foreign = [(m, u) for m in modules.values() for u in m.foreign_private]
        print(f"private attributes of other objects (x._name, x not self/cls): {len(foreign)}")
        for m, (name, line) in foreign:
            print(f"  {_shown(m.path)}:{line} {name}")
    if cycles:
        print(f"{len(cycles)} import cycle(s) (imports inside functions count)")
        return 1
    return 0


# ------------------------------------------------------------------ the Rust core's modules

_RUST_COMMENT = re.compile(r"//[^\n]*")
_RUST_USE = re.compile(r"\buse\s+crate::(\{.*?\}|[\w:]+)\s*;", re.DOTALL)
_RUST_PATH = re.compile(r"\bcrate::(\w+)::")


def _top_names(group: str) -> set[str]:
    """The first path segment of each item of a ``use crate::{...}`` group."""
    names, depth, current = set(), 0, ""
    for ch in group[1:-1] + ",":
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            if current.strip():
                names.add(current.strip().split("::")[0])
            current = ""
        else:
            current += ch
    return names


def load_rust(source: Path = RUST_CORE) -> dict[str, Module]:
    """The modules of a crate's ``src`` and the ``crate::`` modules each uses in code (``use``
    statements and paths; comments, so doc links, left out), as :func:`load`'s graph."""
    modules: dict[str, Module] = {}
    for path in sorted(source.rglob("*.rs")):
        parts = list(path.relative_to(source).with_suffix("").parts)
        if parts[-1] == "mod":
            parts = parts[:-1]
        modules["::".join(parts)] = Module("::".join(parts), path, parts[-1] == "mod")
    tops = {name.split("::")[0] for name in modules}
    for mod in modules.values():
        code = _RUST_COMMENT.sub("", mod.path.read_text(encoding="utf-8"))
        used: set[str] = set()
        for match in _RUST_USE.finditer(code):
            body = match.group(1)
            used |= _top_names(body) if body.startswith("{") else {body.split("::")[0]}
        used |= set(_RUST_PATH.findall(code))
        own = mod.name.split("::")[0]
        for name in sorted(used & tops - {own, "self"}):
            _add(mod, modules, name, 0, False)
    return modules


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stats", action="store_true", help="print the graph's numbers")
    parser.add_argument(
        "--check-private", action="store_true", help="list private names imported across modules"
    )
    parser.add_argument(
        "--source", type=Path, default=SOURCE, help="the package's folder (python/protoprompt)"
    )
    parser.add_argument(
        "--typing",
        action="store_true",
        help="count the imports under `if TYPE_CHECKING:` too (a measure, not the gate)",
    )
    parser.add_argument(
        "--rust",
        action="store_true",
        help="the Rust core's modules (rust/core/src, `use crate::...`) instead",
    )
    args = parser.parse_args()
    if args.rust:
        source = RUST_CORE if args.source == SOURCE else args.source.resolve()
        return report(load_rust(source), args.stats, private=False)
    status = report(load(args.source.resolve(), args.typing), args.stats, args.check_private)
    return status or report(load_rust(), args.stats, private=False)


if __name__ == "__main__":
    sys.exit(main())
