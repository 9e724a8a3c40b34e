"""The background writer of a session's stored states (``_prefix_state.StoredState``: the
filter's request and the callback's turn prefix): it waits out ``WRITE_DELAY`` before it
encodes, so the call that saved returns first; saves in the meantime are written once (the
latest wins); a wait for it ends the delay; a save never finds a writer that is leaving."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from protoprompt.integrations._stores import _prefix_state
from protoprompt.integrations._stores._prefix_state import KIND, StoredState


class FakeRecord:
    """A stored record in memory: what each ``swap`` wrote, and an optional gate a write
    waits at."""

    kind = KIND
    where = ("messages", "chat")

    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.gate: threading.Event | None = None
        self.entered = threading.Event()

    def load(self) -> dict[str, Any] | None:
        return self.written[-1] if self.written else None

    def swap(self, expected: int | None, values: dict[str, Any]) -> bool:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5.0)
        self.written.append(values)
        return True


class TextState(StoredState[str]):
    def __init__(self, record: FakeRecord) -> None:
        super().__init__(record, "db")  # type: ignore[arg-type]
        self.encoded = 0

    def _encode(self, value: str) -> bytes | None:
        self.encoded += 1
        return value.encode()

    def _decode(self, data: object) -> str | None:
        return data.decode() if isinstance(data, bytes) else None


def _written(record: FakeRecord, n: int) -> None:
    deadline = time.monotonic() + 10.0
    while len(record.written) < n and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_save_is_written_after_the_delay() -> None:
    record = FakeRecord()
    state = TextState(record)
    state.save("one")
    assert state.encoded == 0  # nothing encoded while the call that saved goes on
    _written(record, 1)
    assert [w["data"] for w in record.written] == [b"one"]
    assert state.delayed == 1  # the writer waited out its delay
    state.wait(5.0)
    assert state.writer is None


def test_saves_within_the_delay_are_written_once_the_latest_winning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_prefix_state, "WRITE_DELAY", 30.0)
    record = FakeRecord()
    state = TextState(record)
    for value in ("a", "b", "c"):
        state.save(value)
    state.wait(5.0)  # ends the delay at once
    assert [w["data"] for w in record.written] == [b"c"]
    assert state.encoded == 1 and state.delayed == 0


def test_a_save_while_the_writer_writes_is_written_by_it() -> None:
    record = FakeRecord()
    record.gate = threading.Event()
    state = TextState(record)
    state.save("first")
    state.hurry.set()
    assert record.entered.wait(5.0)
    writer = state.writer
    state.save("second")  # the writer is busy: it takes this one next
    assert state.writer is writer
    record.gate.set()
    state.wait(5.0)
    assert [w["data"] for w in record.written] == [b"first", b"second"]
    assert state.writer is None


def test_a_save_after_the_writer_left_starts_another() -> None:
    record = FakeRecord()
    state = TextState(record)
    for k in range(3):
        state.save(f"v{k}")
        state.wait(5.0)
        assert state.writer is None
    assert [w["data"] for w in record.written] == [b"v0", b"v1", b"v2"]


def test_a_write_that_fails_is_logged_and_the_next_one_goes_through() -> None:
    record = FakeRecord()
    state = TextState(record)

    def broken(value: str) -> bytes | None:
        raise RuntimeError("encoder broke")

    state._encode = broken  # type: ignore[method-assign]
    state.save("lost")
    state.wait(5.0)
    assert state.writer is None and record.written == []
    del state._encode
    state.save("kept")
    state.wait(5.0)
    assert [w["data"] for w in record.written] == [b"kept"]


def test_a_writer_takes_the_next_save_while_it_lingers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 33: a writer waits up to ``LINGER`` for the next save after its write, so the
    saves of a run's calls start no thread each; each save still waits out its delay, and
    the writer leaves when none came."""
    monkeypatch.setattr(_prefix_state, "WRITE_DELAY", 0.01)
    monkeypatch.setattr(_prefix_state, "LINGER", 30.0)
    record = FakeRecord()
    state = TextState(record)
    for k in range(3):
        state.save(f"v{k}")
        _written(record, k + 1)
    assert [w["data"] for w in record.written] == [b"v0", b"v1", b"v2"]
    assert state.started == 1, "one writer took every save"
    assert state.delayed == 3, "each save waited out its delay"
    writer = state.writer
    assert writer is not None and writer.is_alive()
    state.wait(5.0)  # ends the wait for the next save
    assert state.writer is None and not writer.is_alive()
    monkeypatch.setattr(_prefix_state, "LINGER", 0.01)
    state.save("v3")
    _written(record, 4)
    deadline = time.monotonic() + 10.0
    while state.writer is not None and time.monotonic() < deadline:
        time.sleep(0.005)
    assert state.writer is None, "a writer that found no save leaves"
    state.save("v4")
    state.wait(5.0)
    assert [w["data"] for w in record.written][-2:] == [b"v3", b"v4"]
    assert state.started == 3
