"""The public names: ``protoprompt.__all__`` is short (what a program calls), the values it
gets back are in :mod:`protoprompt.plans`, the errors in :mod:`protoprompt.errors`, and
every name the documentation uses can be imported where it says."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import protoprompt as pp
from protoprompt import errors, memory, packing, plans

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "DEVELOPING.md", *sorted((ROOT / "docs").glob("*.md"))]

FROM_IMPORT = re.compile(r"^\s*from (protoprompt[\w.]*) import \(?([\w, \n]+?)\)?\s*$", re.M)
DOTTED = re.compile(r"\b(?:pp|protoprompt)((?:\.\w+)+)")


def test_all_is_at_most_25_names_each_importable() -> None:
    assert len(pp.__all__) <= 25
    assert len(set(pp.__all__)) == len(pp.__all__)
    for name in pp.__all__:
        assert getattr(pp, name) is not None, name


# The names ``protoprompt.__all__`` held up to 1.0, and the module each now belongs to.
FORMER = {
    "BudgetUnderestimateWarning": errors,
    "CalibrationState": plans,
    "ContextBlock": plans,
    "Decisions": plans,
    "FillStop": plans,
    "GraphReport": plans,
    "HistoryMismatchError": errors,
    "HistoryWindow": plans,
    "IndexUse": plans,
    "InvalidItemError": errors,
    "InvalidNewInputError": errors,
    "ItemCost": plans,
    "MemoryHit": memory,
    "MemoryStoreError": errors,
    "PackTotals": plans,
    "PrefixPlan": plans,
    "PrefixState": plans,
    "Problem": plans,
    "ProtoPromptWarning": errors,
    "RequestCost": plans,
    "RequestSections": plans,
    "Section": plans,
    "SnapshotError": errors,
    "TokenizerError": errors,
    "TurnReport": plans,
    "UnbudgetedSessionWarning": errors,
    "Unit": plans,
    "UnitDecision": plans,
    "UnknownEncodingError": errors,
    "UnknownModelError": errors,
    "canonical_text": packing,
}


@pytest.mark.parametrize("name", sorted(FORMER))
def test_a_name_that_left_all_is_still_importable_from_protoprompt(name: str) -> None:
    module = FORMER[name]
    assert name in module.__all__
    namespace: dict[str, Any] = {}
    exec(f"from protoprompt import {name}", namespace)  # noqa: S102 - the import a user writes
    assert namespace[name] is getattr(module, name) is getattr(pp, name)
    assert name in dir(pp)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = pp.Nope  # type: ignore[attr-defined]
    assert not hasattr(pp, "Nope")


def test_the_star_import_brings_all_and_nothing_else() -> None:
    namespace: dict[str, Any] = {}
    exec("from protoprompt import *", namespace)  # noqa: S102
    assert set(namespace) - {"__builtins__"} == set(pp.__all__)


def test_every_value_a_call_returns_is_in_plans() -> None:
    history = [{"role": "user", "content": "hello"}]
    new_input = [{"role": "user", "content": "next"}]
    result = pp.pack(history, new_input, 1_000)
    assert type(result) is plans.PackResult
    assert {type(d) for d in result.decisions} <= {plans.UnitDecision}
    assert type(result.sections) is plans.RequestSections
    report = pp.analyze(history, new_input)
    assert type(report) is plans.GraphReport
    assert {type(u) for u in report.units} == {plans.Unit}
    prefix = pp.plan_prefix(history, new_input, budget=1_000)
    assert type(prefix) is plans.PrefixPlan
    assert type(prefix.state) is plans.PrefixState


SKIPPED_BLOCK = re.compile(r"<!-- doc: skip the 0\.20 API[^>]*-->\s*```\w*\n.*?```", re.S)


def _documented() -> set[str]:
    names: set[str] = set()
    for page in PAGES:
        # the code of the unrelated 0.20 package a migration page shows is not this API
        text = SKIPPED_BLOCK.sub("", page.read_text(encoding="utf-8"))
        for module, imported in FROM_IMPORT.findall(text):
            for name in re.split(r"[\s,]+", imported):
                if name and name != "as":
                    names.add(f"{module}:{name}")
        for dotted in DOTTED.findall(text):
            names.add("protoprompt" + dotted)
    return names


def _resolve(path: str) -> object:
    """``module:name`` or a dotted path from ``protoprompt`` (a module, then attributes)."""
    if ":" in path:
        module, name = path.split(":")
        return getattr(importlib.import_module(module), name)
    parts = path.split(".")
    obj: object = importlib.import_module(parts[0])
    done = [parts[0]]
    for part in parts[1:]:
        done.append(part)
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        if not isinstance(obj, ModuleType):
            # an attribute of an instance (``plan.sections``): the names up to the first
            # value were checked, the rest is the page's text about it
            return obj
        obj = importlib.import_module(".".join(done))  # a submodule, or AttributeError
    return obj


# Modules of the unrelated 0.20 package the migration pages and the specification's history
# name (never this package's).
FORMER_PACKAGE = {
    "protoprompt.injector_budgeted",
    "protoprompt.integrations.agents_sdk",
    "protoprompt.integrations.mcp_server",
}


def test_every_name_the_documentation_uses_can_be_imported() -> None:
    pytest.importorskip("agents")
    documented = _documented()
    assert "protoprompt:TokenBudgetedContextBuilder" in documented  # the scan finds them
    missing = []
    for path in sorted(documented):
        if path.split(":")[0] in FORMER_PACKAGE:
            continue
        if path.rsplit(".", 1)[-1] in {"md", "py", "toml"} or "_core" in path:
            continue  # file names (``protoprompt.md``), the compiled module's own names
        try:
            _resolve(path)
        except (AttributeError, ImportError) as exc:
            missing.append(f"{path}: {exc}")
    assert missing == []
