"""Index snapshots: a HistoryIndex saved to bytes and loaded back packs exactly like the index
that wrote it, and ProtoPromptSession keeps one in its database so that a restarted process
starts from it (checked against the rows like a live index, through pops, other writers and
clears), never from a damaged or foreign one.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sqlite3
from typing import Any

import pytest

import protoprompt as pp
from protoprompt import _core

from test_count_store import RecordingStore, _in_forked_child

agents = pytest.importorskip("agents")

from agents.memory import SQLiteSession  # noqa: E402

from protoprompt.integrations._stores import _snapshots  # noqa: E402
from test_incremental_session import fast_and_plain, sides  # noqa: E402

TABLE = "protoprompt_index_snapshots"


def _history(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    items: list[dict[str, Any]] = []
    for i in range(n):
        kind = rng.randrange(4)
        if kind == 0:
            items.append(
                {"role": "user", "content": f"question {i} " + "words " * rng.randrange(80)}
            )
        elif kind == 1:
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{i}",
                    "summary": [],
                    "encrypted_content": "x" * rng.randrange(300),
                }
            )
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{i}",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "answer " * 40}],
                }
            )
        else:
            items.append(
                {
                    "type": "function_call",
                    "call_id": f"c{i}",
                    "name": "f",
                    "arguments": json.dumps({"q": i}),
                }
            )
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": f"c{i}",
                    "output": "result " * rng.randrange(200),
                }
            )
    return items


def _fresh(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return json.loads(json.dumps(items))


def _same(a: pp.PackResult, b: pp.PackResult) -> None:
    assert (a.kept_history, a.dependency, a.used, a.history_tokens) == (
        b.kept_history,
        b.dependency,
        b.used,
        b.history_tokens,
    )
    assert list(a.decisions) == list(b.decisions)


@pytest.mark.parametrize("seed", range(4))
def test_a_loaded_index_packs_like_the_one_that_wrote_it(seed: int) -> None:
    hist = _history(400, seed)
    new = [{"role": "user", "content": "next"}]
    index = pp.HistoryIndex()
    for budget in (3000, 20000):
        index.pack(_fresh(hist), new, budget, encoding="o200k_base")
    data = index.snapshot()
    loaded = pp.HistoryIndex.from_snapshot(data)
    assert len(loaded) == len(index) and loaded.snapshot() == data
    _core._clear_count_cache()
    more = hist + _history(30, seed + 100)
    for budget, items in ((3000, hist), (20000, more), (9000, more[:-7])):
        if len(loaded) > len(items):
            loaded.truncate(len(items))
        _same(
            loaded.pack(_fresh(items), new, budget, encoding="o200k_base"),
            pp.pack(_fresh(items), new, budget, encoding="o200k_base"),
        )


def test_a_loaded_index_keeps_its_token_costs_per_encoding() -> None:
    """The costs counted before the snapshot come with it: with the process count cache
    emptied, packing again looks up no count (a fresh index looks up every long text)."""
    hist = _history(200, 9)
    new = [{"role": "user", "content": "next"}]
    index = pp.HistoryIndex()
    first = index.pack(_fresh(hist), new, 50_000, encoding="o200k_base")
    data = index.snapshot()
    for loaded, looked_up in (
        (pp.HistoryIndex.from_snapshot(data), False),
        (pp.HistoryIndex(), True),
    ):
        _core._clear_count_cache()
        store = RecordingStore()
        loaded.count_store = store
        _same(loaded.pack(_fresh(hist), new, 50_000, encoding="o200k_base"), first)
        assert bool(store.asked) is looked_up
    # Another encoding's costs are not taken for these.
    loaded = pp.HistoryIndex.from_snapshot(data)
    other = loaded.pack(_fresh(hist), new, 50_000, encoding="cl100k_base")
    _same(other, pp.pack(_fresh(hist), new, 50_000, encoding="cl100k_base"))


def test_damaged_foreign_and_wrong_snapshots_raise_snapshot_error() -> None:
    index = pp.HistoryIndex()
    index.extend(_history(50, 1))
    data = index.snapshot()
    for bad in (b"", b"not a snapshot", data[:-1], data[:40] + bytes([data[40] ^ 1]) + data[41:]):
        with pytest.raises(pp.SnapshotError):
            pp.HistoryIndex.from_snapshot(bad)
    with pytest.raises(pp.SnapshotError, match="layout"):
        pp.HistoryIndex.from_snapshot(data[:8] + b"\x09" + data[9:])
    with pytest.raises(TypeError, match="data must be bytes"):
        pp.HistoryIndex.from_snapshot(bytearray(data))  # type: ignore[arg-type]
    assert issubclass(pp.SnapshotError, ValueError)


# ---------------------------------------------------------------------------------- sessions


@pytest.fixture
def make_side(session_sides: Any) -> Any:
    """Sessions in turns as in test_incremental_session (see its ``sides``)."""
    return sides(session_sides)


def _snapshot_rows(db: str) -> list[tuple[Any, ...]]:
    """``(session id, its row ids)`` of every stored snapshot."""
    with sqlite3.connect(db) as conn:
        try:
            rows = conn.execute(f"SELECT session_id, row_ids FROM {TABLE}").fetchall()
        except sqlite3.OperationalError:
            return []
    return [(sid, _snapshots.ids_from_bytes(ids).tolist()) for sid, ids in rows]


def _row_ids(db: str) -> list[int]:
    with sqlite3.connect(db) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT id FROM agent_messages WHERE session_id = 'chat' ORDER BY id"
            )
        ]


def _spy(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    for cls, name in (
        (pp.HistoryIndex, "truncate"),
        (_snapshots.IndexState, "reset"),
        (pp.HistoryIndex, "extend"),
    ):
        real = getattr(cls, name)
        monkeypatch.setattr(
            cls, name, lambda self, *a, _r=real, _n=name: (calls.append(_n), _r(self, *a))[1]
        )


async def test_a_restarted_session_starts_from_its_snapshot_and_sends_the_same_requests(
    tmp_path, monkeypatch, make_side, new_process
) -> None:
    fast_db, fast, plain = await fast_and_plain(make_side, tmp_path, 6, snapshot_min_items=4)
    fast.session._debug_state(wait_for_save=True)
    # Written in the background once the index held enough items, before any close.
    assert _snapshot_rows(fast_db), "no snapshot written during the turns"
    fast.close()
    stored = len(await plain.session.get_items())
    [(sid, ids)] = _snapshot_rows(fast_db)
    items = len(ids)
    # Saved at close with the index of the last turn's history (its own items come after).
    assert sid == "chat" and ids == _row_ids(fast_db)[:items] and items <= stored

    new_process()
    calls: list[str] = []
    _spy(monkeypatch, calls)
    asked: list[Any] = []
    real_get_many = pp.SQLiteCountStore.get_many
    monkeypatch.setattr(
        pp.SQLiteCountStore,
        "get_many",
        lambda self, keys: (asked.extend(keys), real_get_many(self, keys))[1],
    )
    restarted = make_side(fast_db, incremental=None, snapshot_min_items=4)
    await restarted.turn(6)
    await plain.turn(6)
    assert restarted.plans == plain.plans[-1:]
    # The turn's read loaded the snapshot into the index and returned the whole history.
    [report] = restarted.reports
    assert (report.snapshot, report.snapshot_detail) == ("loaded", f"{items:,} items")
    assert report.index == "incremental" and report.index_held == items
    assert report.read_items == report.history_items == stored
    # Nothing reset, only the rows stored after the snapshot were classified, and the kept
    # history's costs came with the snapshot (no count was looked up or tokenised again).
    assert "reset" not in calls and "truncate" not in calls
    assert stored - items <= 6  # the last turn's items (the snapshot was of the turn before)
    assert len(asked) <= stored - items
    restarted.close()

    # Another writer pops into the snapshot's rows and appends: the restarted process keeps
    # the prefix that still holds and sends what a session without index sends.
    for db in (fast_db, str(tmp_path / "plain.db")):
        other = SQLiteSession("chat", db)
        for _ in range(5):
            await other.pop_item()
        await other.add_items([{"role": "user", "content": "written elsewhere " * 8}])
        other.close()
    new_process()
    calls.clear()
    again = make_side(fast_db, incremental=None, snapshot_min_items=4)
    await again.turn(7)
    await plain.turn(7)
    assert again.plans == plain.plans[-1:]
    assert "truncate" in calls and "reset" not in calls
    again.close()
    plain.close()


async def test_clear_session_deletes_the_snapshot(tmp_path, monkeypatch, make_side) -> None:
    db = str(tmp_path / "s.db")
    side = make_side(db, incremental=None, snapshot_min_items=2)
    for i in range(3):
        await side.turn(i)
    side.session._debug_state(wait_for_save=True)
    assert _snapshot_rows(db)
    await side.session.clear_session()
    assert _snapshot_rows(db) == []  # no ids of the cleared history stay behind
    side.close()  # an empty index writes nothing
    assert _snapshot_rows(db) == []


@pytest.mark.parametrize("damage", ["flip", "foreign", "not bytes"])
async def test_a_damaged_or_foreign_snapshot_is_ignored(
    tmp_path, monkeypatch, caplog, damage: str, make_side, new_process
) -> None:
    fast_db, fast, plain = await fast_and_plain(make_side, tmp_path, 3, snapshot_min_items=2)
    fast.close()
    with sqlite3.connect(fast_db) as conn:
        (data,) = conn.execute(f"SELECT data FROM {TABLE}").fetchone()
        if damage == "flip":
            data = data[:-3] + bytes([data[-3] ^ 0x10]) + data[-2:]
        elif damage == "foreign":
            data = data[:8] + b"\x7f" + data[9:]
        else:
            data = "text"
        conn.execute(f"UPDATE {TABLE} SET data = ?", (data,))
    new_process()
    caplog.set_level(logging.DEBUG, logger="protoprompt")
    restarted = make_side(fast_db, incremental=None, snapshot_min_items=2)
    await restarted.turn(3)
    await plain.turn(3)
    assert restarted.plans == plain.plans[-1:]
    # Looked for ("not bytes" reads as no snapshot at all), not used.
    assert restarted.reports[-1].snapshot in ("ignored", "none_stored")
    if damage != "not bytes":
        assert any(
            "snapshot" in r.getMessage() and "not used" in r.getMessage() for r in caplog.records
        )
    restarted.close()
    plain.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_an_index_is_busy_gives_the_child_a_fresh_one() -> None:
    """A thread of the parent held the index's lock at the fork (mid-append, say): that
    thread does not exist in the child, so the child must neither wait for the lock forever
    nor trust the index it guarded."""
    state = _snapshots.IndexState()
    state.index.extend(_history(20, 3))
    idle = _snapshots.IndexState()
    idle.index.extend(_history(5, 4))
    with state.lock:
        child = _in_forked_child(
            lambda: (
                state.lock.acquire(timeout=5),
                len(state.index),
                idle.lock.acquire(timeout=5),
                len(idle.index),
            )
        )
    assert child == (True, 0, True, len(idle.index))


async def test_snapshot_min_items_is_a_validated_option_of_the_session(tmp_path, make_side) -> None:
    """``snapshot_min_items`` and ``shared_index_bytes`` are keyword-only options with the
    documented defaults; a bad value is refused before anything is opened, and a huge
    ``snapshot_min_items`` turns snapshots off for that session."""
    import inspect

    from protoprompt.integrations import ProtoPromptSession

    params = inspect.signature(ProtoPromptSession.__init__).parameters
    assert params["snapshot_min_items"].default == 512
    assert params["shared_index_bytes"].default == 256 * 2**20
    assert params["max_open_readers"].default == 32
    assert {
        params[n].kind for n in ("snapshot_min_items", "shared_index_bytes", "max_open_readers")
    } == {inspect.Parameter.KEYWORD_ONLY}
    db = str(tmp_path / "o.db")
    for name, value, error, message in [
        ("snapshot_min_items", 0, ValueError, "snapshot_min_items must be at least 1, got 0"),
        ("snapshot_min_items", True, TypeError, "snapshot_min_items must be an int, got bool"),
        ("snapshot_min_items", 2.0, TypeError, "snapshot_min_items must be an int, got float"),
        ("shared_index_bytes", -1, ValueError, "shared_index_bytes must be at least 0, got -1"),
        ("shared_index_bytes", "1", TypeError, "shared_index_bytes must be an int, got str"),
        ("max_open_readers", 0, ValueError, "max_open_readers must be at least 1, got 0"),
        ("max_open_readers", None, TypeError, "max_open_readers must be an int, got NoneType"),
    ]:
        with pytest.raises(error, match=f"^{message}$"):
            ProtoPromptSession("chat", db, **{name: value})
    assert not os.path.exists(db)  # refused before the database was created

    side = make_side(db, incremental=None, snapshot_min_items=10**9)
    for i in range(3):
        await side.turn(i)
    store = side.session._debug_state(wait_for_save=True).count_store
    assert isinstance(store, pp.SQLiteCountStore) and store.max_open_readers == 32
    side.close()
    assert _snapshot_rows(db) == []
    # The count store of the file is shared by its sessions: the one made last sets its limit.
    other = ProtoPromptSession("other", db, max_open_readers=3)
    assert other._debug_state().count_store is store and store.max_open_readers == 3
    other.close()


async def test_a_rewritten_history_replaces_the_stale_snapshot(tmp_path, new_process) -> None:
    """The stored history is cleared and refilled (another writer, a compaction): the next
    turn reads it whole ("the index's last row is gone") and its rebuilt index replaces the
    snapshot, so the restarts after it read a token window again -- also when the new
    history is exactly as long as the snapshot (it was replaced only once the index outgrew
    it)."""
    from agents.run_internal.session_persistence import prepare_input_with_session

    from protoprompt.integrations import ProtoPromptSession

    db = str(tmp_path / "s.db")
    seed = SQLiteSession("chat", db)
    items = _history(80, seed=1)
    await seed.add_items(items)

    async def turn() -> tuple[str, str | None]:
        session = ProtoPromptSession("chat", db, windowed_reads=True, snapshot_min_items=8)
        builder = pp.TokenBudgetedContextBuilder(None, max_tokens=1_500)
        new = [{"role": "user", "content": "and now?"}]
        await prepare_input_with_session(new, session, session.input_callback(builder))
        session._debug_state(wait_for_save=True)
        session.close()
        assert builder.last_plan is not None and builder.last_plan.turn is not None
        return builder.last_plan.turn.read, builder.last_plan.turn.read_reason

    assert (await turn())[0] == "full"  # no snapshot yet: it is written after this turn
    new_process()
    assert (await turn())[0] == "window"
    await seed.clear_session()
    await seed.add_items(items)  # new rows, as many as before
    seed.close()
    new_process()
    read, reason = await turn()
    assert (read, reason) == ("full", "popped")  # the index's last row is gone
    [(_, ids)] = _snapshot_rows(db)
    assert ids == _row_ids(db)  # the snapshot of the rebuilt index, not the stale one
    new_process()
    assert (await turn())[0] == "window"
