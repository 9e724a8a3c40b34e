from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# The offline reference tokenizer (openai/tiktoken on the vocabulary files tiktoken-rs ships)
# lives with the benchmarks; the tests use the same module.
sys.path.insert(0, str(HERE.parent / "benches"))


@pytest.fixture(scope="session")
def vectors() -> list[dict]:
    """The 42 item-graph test vectors of docs/item-graph.md §15 (shared with the Rust tests)."""
    path = HERE.parent / "rust" / "core" / "tests" / "data" / "item-graph-vectors.json"
    return json.loads(path.read_text())["vectors"]
