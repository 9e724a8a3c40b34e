"""Packing under hostile conditions: the history list changing during a call (another thread,
or an item's own code), calls that fail, values that do not fit, mappings that raise, and
count stores that hand back counts no text could have. Expected every time: a clear error
or exactly the result of a fresh ``pp.pack``, within a second, and a failed call changes
nothing.
"""

from __future__ import annotations

import collections.abc
import math
import random
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import protoprompt as pp
from protoprompt import _core

CHUNK = 2048  # items the core classifies per step (a list shorter than one chunk goes whole)
WATCHDOG = 10.0  # seconds: a call that takes longer is a hang (a hang detector, not a speed test:
# a call takes 0.01-0.15 s; the CI machine runs two suites at once, so the bound is loose)


def _history(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` items of whole turns (user, call, output, answer), texts of varied length."""
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    t = 0
    while len(items) < n:
        items.append({"role": "user", "content": f"question {t} " + "w " * rng.randrange(20)})
        items.append({"type": "function_call", "call_id": f"c{t}", "name": "f", "arguments": "{}"})
        items.append(
            {
                "type": "function_call_output",
                "call_id": f"c{t}",
                "output": "out " * rng.randrange(30),
            }
        )
        items.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"m{t}",
                "status": "completed",
                "content": [{"type": "output_text", "text": "answer " * 5}],
            }
        )
        t += 1
    return items[:n]


NEW = [{"role": "user", "content": "and now?"}]


def _fields(r: pp.PackResult) -> tuple[Any, ...]:
    return (
        r.kept_history,
        r.dependency,
        r.used,
        r.history_tokens,
        r.new_input_tokens,
        [(d.decision, d.tokens) for d in r.decisions],
    )


def _same(got: pp.PackResult, expected: pp.PackResult) -> None:
    assert _fields(got) == _fields(expected)
    assert len(got.items) == len(expected.items)
    assert all(a is b for a, b in zip(got.items, expected.items)), "other objects sent"


def _within(seconds: float, call: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """Run ``call`` on a thread; fail the test if it has not returned after ``seconds``."""
    out: list[Any] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as e:  # noqa: BLE001 - handed to the test
            err.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"the call did not return within {seconds} s (a hang)"
    return (out[0] if out else None), (err[0] if err else None)


# --------------------------------------------------------------------------------------------
# The history list changes while a call reads it


class Trap(collections.abc.Mapping):
    """An item (a read-only mapping) that changes the history list when the core reads it."""

    def __init__(self, data: dict[str, Any], act: Callable[[], None]) -> None:
        self._data = data
        self.act: Callable[[], None] | None = act

    def _fire(self) -> None:
        if self.act is not None:
            self.act()

    def __getitem__(self, key: str) -> Any:
        self._fire()
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        self._fire()
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _mutation(
    kind: str, history: list[Any], rng: random.Random, keep: int = 0
) -> Callable[[], None]:
    """A change to ``history`` that leaves its first ``keep`` items alone (the items an index
    has seen must stay as they are during a call too: that is its contract). Each is one
    list operation, so that another thread sees the list before or after it, never half
    done."""
    extra = _history(8, seed=99)

    def act() -> None:
        if kind == "shrink":
            del history[max(keep, len(history) // 2) :]
        elif kind == "empty":
            del history[keep:]
        elif kind == "grow":
            history.extend(extra)
        elif kind == "shift" and len(history) > keep + 1:
            history[keep:] = history[-1:] + history[keep:-1]
        elif kind == "shuffle":
            rest = history[keep:]
            rng.shuffle(rest)
            history[keep:] = rest

    return act


KINDS = ["shrink", "empty", "grow", "shift", "shuffle"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.sampled_from([3, 40, CHUNK - 1, CHUNK, CHUNK + 1, 2 * CHUNK + 7]),
    kind=st.sampled_from(KINDS),
    at=st.floats(0, 1),
    indexed=st.floats(0, 1),
    seed=st.integers(0, 2**16),
)
def test_an_item_that_changes_the_history_while_it_is_read(n, kind, at, indexed, seed) -> None:
    """Reading an item pops, appends, shifts or shuffles the history list (after the items
    the index has seen): the call returns what a fresh pack of the list as it was when the
    call began returns (the core took those items in one step before any item code ran),
    quickly, and the index ends up holding exactly that history."""
    rng = random.Random(seed)
    history: list[Any] = _history(n, seed)
    index = pp.HistoryIndex()
    done = int(indexed * (n - 1))
    index.extend(history[:done])
    where = done + int(at * (n - 1 - done))  # a position the call reads for the first time
    trap = Trap(history[where], _mutation(kind, history, rng, keep=done))
    history[where] = trap
    before = list(history)
    budget = rng.choice([300, 3000, 10**6])
    got, err = _within(WATCHDOG, lambda: index.pack(history, NEW, budget, output_reserve=10))
    trap.act = None
    assert err is None, repr(err)
    expected = pp.pack(before, NEW, budget, output_reserve=10)
    _same(got, expected)
    assert len(index) == n
    again = index.pack(before, NEW, budget, output_reserve=10)  # the index holds `before`
    _same(again, expected)


@pytest.mark.parametrize("n", [50, CHUNK + 1, 3 * CHUNK])
@pytest.mark.parametrize("kind", KINDS)
def test_another_thread_changes_the_history_during_calls(n, kind) -> None:
    """Another thread keeps changing the list while ``pp.pack`` runs: every call returns
    quickly, and its result is exactly a fresh pack of one of the states the list went
    through (the one it had when the call began)."""
    rng = random.Random(n)
    history: list[Any] = _history(n)
    states: list[list[Any]] = [list(history)]
    stop = threading.Event()
    act = _mutation(kind, history, rng)

    def mutate() -> None:
        for _ in range(300):
            if stop.is_set():
                return
            act()
            states.append(list(history))
            if kind == "grow" and len(history) > 4 * n:
                del history[n:]
                states.append(list(history))
            if kind in ("shrink", "empty") and len(history) < 2:
                history.extend(_history(n))
                states.append(list(history))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        mutator = threading.Thread(target=mutate)
        mutator.start()
        results = []
        for _ in range(5):
            got, err = _within(WATCHDOG, lambda: pp.pack(history, NEW, 2000))
            assert err is None, repr(err)
            results.append(got)
        stop.set()
        mutator.join()
    finally:
        sys.setswitchinterval(old)
    for got in results:
        sent = [id(x) for x in got.items]
        kept = got.kept_history
        matches = [
            s
            for s in states
            if (not kept or kept[-1] < len(s)) and [id(s[p]) for p in kept] == sent[: len(kept)]
        ]
        assert any(_fields(pp.pack(s, NEW, 2000)) == _fields(got) for s in matches), (
            "the result is not the pack of any state the list was in"
        )


def test_a_shorter_history_while_an_index_reads_it_is_an_error_naming_the_item() -> None:
    """The index's contract is broken (its items were removed from the list meanwhile):
    a clear error, quickly, and the index is as before."""
    history = _history(3 * CHUNK)
    index = pp.HistoryIndex()
    index.pack(history, NEW, 10**6)
    history.append(Trap({"role": "user", "content": "x"}, lambda: history.clear()))
    history.append({"role": "user", "content": "y"})
    _, err = _within(WATCHDOG, lambda: index.pack(history, NEW, 10**6))
    assert isinstance(err, pp.InvalidItemError), repr(err)
    assert err.location.startswith("history[") and "changed" in str(err)
    assert len(index) == 3 * CHUNK


# --------------------------------------------------------------------------------------------
# A failed call changes nothing


def _cycle() -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_text", "text": "x"}
    part["again"] = [part]
    return {"role": "user", "content": [part]}


def _deep() -> dict[str, Any]:
    v: Any = "leaf"
    for _ in range(80):
        v = {"k": v}
    return {"role": "user", "content": [{"type": "input_text", "text": "x", "more": v}]}


BAD_VALUES: dict[str, Callable[[], dict[str, Any]]] = {
    "nan": lambda: {
        "role": "user",
        "content": [{"type": "input_text", "text": "x", "score": math.nan}],
    },
    "bytes value": lambda: {"role": "user", "content": b"raw"},
    "lone surrogate": lambda: {"role": "user", "content": "a\ud800b"},
    "cycle": _cycle,
    "too deep": _deep,
    "non-string nested key": lambda: {"role": "user", "content": [{1: "x"}]},
    "bytes key": lambda: {b"role": "user", "content": "x"},
    "not a mapping": lambda: ["role", "user"],  # type: ignore[dict-item]
}


@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
@pytest.mark.parametrize("n", [30, CHUNK + 10])
def test_a_failed_pack_leaves_the_index_as_it_was(bad, n) -> None:
    history = _history(n)
    index = pp.HistoryIndex()
    index.pack(history[:10], NEW, 10**6)
    snapshot = index.snapshot()
    bad_item = BAD_VALUES[bad]()
    broken = history[: n - 5] + [bad_item] + history[n - 5 :]
    with pytest.raises(pp.InvalidItemError) as info:
        index.pack(broken, NEW, 10**6)
    assert info.value.location == f"history[{n - 5}]", str(info.value)
    assert len(index) == 10
    assert index.snapshot() == snapshot, "the index changed"
    # A retry without the item, and one with another item in its place, are fresh packs.
    _same(index.pack(history, NEW, 10**6), pp.pack(history, NEW, 10**6))
    index2 = pp.HistoryIndex()
    index2.pack(history[:10], NEW, 10**6)
    with pytest.raises(pp.InvalidItemError):
        index2.pack(broken, NEW, 10**6)
    other = (
        history[: n - 5]
        + [{"type": "function_call_output", "call_id": "c_new", "output": "an orphan"}]
        + history[n - 5 :]
    )
    _same(index2.pack(other, NEW, 10**6), pp.pack(other, NEW, 10**6))


class FailingStore:
    secret = bytes(16)

    def get_many(self, keys: list[bytes]) -> list[int | None]:
        raise OSError("store offline")

    def put_many(self, pairs: Any) -> None:
        pass


@pytest.mark.parametrize("how", ["budget", "context", "store", "new_input", "encoding"])
def test_every_kind_of_failure_leaves_the_index_as_it_was(how) -> None:
    history = _history(60)
    index = pp.HistoryIndex()
    index.pack(history[:20], NEW, 10**6)
    snapshot = index.snapshot()
    _core._clear_count_cache()  # the store is asked for what the process has not counted
    if how == "store":
        index.count_store = FailingStore()  # type: ignore[assignment]
        history = history + [{"role": "user", "content": "long " * 200}]
    kwargs: dict[str, Any] = {}
    new_input: list[Any] = NEW
    budget = 10**6
    if how == "budget":
        budget = 5
    elif how == "context":
        kwargs["context"] = lambda remaining: 1 // 0
    elif how == "new_input":
        new_input = [{"type": "function_call_output", "call_id": "nowhere", "output": "x"}]
    elif how == "encoding":
        kwargs["encoding"] = "cl100k_base"
        history = history + [{"role": "user", "content": float("inf")}]
    with pytest.raises((pp.ProtoPromptError, ZeroDivisionError, OSError)):
        index.pack(history, new_input, budget, **kwargs)
    assert len(index) == 20
    assert index.snapshot() == snapshot, "the index changed"
    index.count_store = None
    history = _history(60)
    _same(index.pack(history, NEW, 10**6), pp.pack(history, NEW, 10**6))


# --------------------------------------------------------------------------------------------
# Values that do not fit, mappings that raise


def test_sizes_beyond_64_bits_are_value_errors() -> None:
    for name in ("budget", "output_reserve", "context_tokens"):
        kwargs: dict[str, Any] = {"budget": 1000, name: 2**70}
        with pytest.raises(ValueError, match=name):
            pp.pack([], NEW, **kwargs)
    assert pp.pack([], NEW, 2**64 - 1).budget == 2**64 - 1
    index = pp.HistoryIndex()
    index.extend(_history(4))
    index.truncate(2**70)  # longer than the index: nothing to drop
    assert len(index) == 4


def test_memory_search_limits_beyond_sqlite_integers() -> None:
    store = pp.MemoryStore()
    scope = pp.MemoryScope("t", user="u")
    store.index_document("d", "the contract renews in May", scope=scope)
    assert len(store.search("contract renews", scope=scope, limit=2**62)) == 1
    assert len(store.search("contract renews", scope=scope, limit=2**63 - 1)) == 1
    with pytest.raises(ValueError, match="limit"):
        store.search("contract", scope=scope, limit=2**70)
    store.close()


class Raising(collections.abc.Mapping):
    def __init__(self, where: str) -> None:
        self.where = where

    def __getitem__(self, key: str) -> Any:
        if self.where == "getitem":
            raise KeyError("broken getitem")
        return "user"

    def __iter__(self) -> Iterator[str]:
        if self.where == "iter":
            raise RuntimeError("broken keys")
        return iter(["role", "content"])

    def __len__(self) -> int:
        return 2


@pytest.mark.parametrize("where", ["getitem", "iter"])
def test_a_mapping_that_raises_is_named_and_chained(where) -> None:
    history = _history(6) + [Raising(where)]
    with pytest.raises(pp.InvalidItemError) as info:
        pp.pack(history, NEW, 10**6)
    assert info.value.location == "history[6]"
    assert "must be a mapping" not in str(info.value)
    assert isinstance(info.value.__cause__, (KeyError, RuntimeError)), info.value.__cause__
    assert "broken" in str(info.value.__cause__)


def test_a_bytes_key_is_an_invalid_item_even_when_the_item_would_be_dropped() -> None:
    history = _history(8)
    history.insert(2, {b"type": "function_call_output", "call_id": "c0", "output": "x"})
    with pytest.raises(pp.InvalidItemError, match="non-string key") as info:
        pp.pack(history, NEW, 30)  # a budget that drops the old items uncounted
    assert info.value.location == "history[2]"


def test_a_caught_tokenizer_failure_prints_nothing() -> None:
    code = (
        "import protoprompt as pp\n"
        "n = pp.count_tokens(' ' * (1 << 21))\n"
        "n += pp.count_tokens('\\t \\n' * (1 << 19))\n"
        "r = pp.pack([{'role': 'user', 'content': ' ' * (1 << 21)}], "
        "[{'role': 'user', 'content': 'x'}], 10**7)\n"
        "print(n > 0, r.used > 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"
    assert proc.stderr == "", proc.stderr


# --------------------------------------------------------------------------------------------
# Counts a store hands back


class AnswerStore:
    """A count store answering every lookup with ``answer(true count, text bytes)``."""

    secret = bytes(range(16))

    def __init__(self, answer: Callable[[int, int], Any]) -> None:
        self.answer = answer
        self.truth: dict[bytes, tuple[int, int]] = {}
        self.asked = 0

    def get_many(self, keys: list[bytes]) -> list[Any]:
        self.asked += len(keys)
        return [self.answer(*self.truth[k]) if k in self.truth else None for k in keys]

    def put_many(self, pairs: Any) -> None:
        for k, n in pairs:
            self.truth.setdefault(k, (n, 0))


def _long_history(seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "role": "user" if i % 2 == 0 else "assistant",
            "content": f"{seed}-{i} "
            + " ".join(
                rng.choice(["alpha", "beta", "gamma"]) for _ in range(rng.randrange(60, 400))
            ),
        }
        for i in range(12)
    ]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    lie=st.sampled_from(["zero", "one", "below", "above", "max", "huge", "negative"]),
    budget=st.sampled_from([500, 2000, 10**6]),
)
def test_counts_no_text_of_that_length_could_have_are_ignored(seed, lie, budget) -> None:
    """A damaged or foreign store answers with counts outside [bytes / 128, bytes] (128 is
    the longest token of every shipped vocabulary): each is counted again, so the pack equals
    one that counts everything. (Negative and huge values are refused as a wrong answer.)"""
    history = _long_history(seed)
    store = AnswerStore(lambda n, b: n)
    _core._clear_count_cache()
    pp.HistoryIndex(count_store=store).pack(history, NEW, 10**6)  # learn the true counts
    size = {k: n for k, (n, _) in store.truth.items()}
    answers = {
        "zero": lambda n: 0,
        "one": lambda n: 1,
        "below": lambda n: max(0, n // 200),  # fewer than bytes / 128 for these texts
        "above": lambda n: n * 100,  # more tokens than bytes
        "max": lambda n: 2**63 - 1,
        "huge": lambda n: 2**64 + 5,
        "negative": lambda n: -n,
    }
    store.answer = lambda n, b: answers[lie](n)
    assert size
    _core._clear_count_cache()
    expected = pp.pack(history, NEW, budget)
    _core._clear_count_cache()
    if lie in ("huge", "negative"):
        with pytest.raises(ValueError, match="count_store.get_many"):
            pp.HistoryIndex(count_store=store).pack(history, NEW, budget)
        return
    got = pp.HistoryIndex(count_store=store).pack(history, NEW, budget)
    assert store.asked
    _same(got, expected)
