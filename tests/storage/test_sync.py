"""Which part of a session's index still holds: the decision table (``_sync.plan``), the
prefix search over row ids (``_sync.kept_prefix``) against a naive one through random
appends, pops, clears, compactions, pruned prefixes and undecodable rows, the row read
against ``SQLiteSession.get_items`` itself, and the races that used to give stale requests:
another process popping and appending between the read and the callback, and rows the SDK
skips.
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import sqlite3
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("agents")

from agents.memory import SQLiteSession  # noqa: E402

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder  # noqa: E402
from protoprompt import _core  # noqa: E402
from protoprompt.integrations import ProtoPromptSession  # noqa: E402
from protoprompt.integrations._stores import _sync  # noqa: E402

# --------------------------------------------------------------------------------- the table

ReadFacts, Seen, Synced, plan = _sync.ReadFacts, _sync.Seen, _sync.Synced, _sync.plan
IDS = array("q", [7, 9])


def _read(
    count: int = 10,
    *,
    windowed: bool = False,
    epoch: int = 3,
    checked: bool = True,
    seen: Seen | None = Seen(5, 8, IDS),
) -> ReadFacts:
    return ReadFacts(count, windowed, epoch, checked, seen)


@pytest.mark.parametrize(
    ("read", "synced", "history_len", "epoch", "expected"),
    [
        # Not the read this history came from: the index is left alone.
        (None, Synced(8, 5, 3), 10, 3, (False, 8, "not_the_read")),
        (_read(windowed=True), Synced(8, 5, 3), 10, 3, (False, 8, "not_the_read")),
        (_read(count=9), Synced(8, 5, 3), 10, 3, (False, 8, "not_the_read")),
        # Rows compared: what they keep, whatever the epoch says.
        (_read(), Synced(8, 5, 3), 10, 3, (True, 8, "compared")),
        (_read(seen=Seen(5, 2, IDS)), Synced(8, 5, 3), 10, 3, (True, 2, "compared")),
        (_read(seen=Seen(5, 0, IDS)), Synced(8, 5, 3), 10, 9, (True, 0, "compared")),
        (_read(epoch=1), Synced(8, 5, 0), 10, 7, (True, 8, "compared")),
        # ... unless the index changed after the rows were compared with it,
        (_read(), Synced(8, 6, 3), 10, 3, (False, 8, "changed")),
        # ... or the rows could not be read.
        (_read(seen=None), Synced(8, 5, 3), 10, 3, (False, 8, "read_failed")),
        # No rows to compare (a memory database, another inner session): the epoch decides.
        (_read(checked=False, seen=None), Synced(8, 5, 3), 10, 3, (True, 8, "trusted")),
        (
            _read(checked=False, seen=None, epoch=2),
            Synced(8, 5, 3),
            10,
            3,
            (True, 0, "pop_or_clear"),
        ),
        (_read(checked=False, seen=None), Synced(8, 5, 2), 10, 3, (True, 0, "pop_or_clear")),
        (_read(checked=False, seen=None), Synced(12, 5, 3), 10, 3, (True, 0, "longer")),
    ],
)
def test_the_decision_table(read, synced, history_len, epoch, expected) -> None:
    got = plan(read, synced, history_len, epoch)
    assert (got.use_index, got.keep, got.code) == expected, got.reason


# ----------------------------------------------------------------------- the prefix search


def _naive_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Table:
    """A session's rows as SQLiteSession keeps them: (id, decodes?), ids only ever grow."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, bool]] = []
        self.next_id = 1

    def append(self, k: int, bad: bool = False) -> None:
        for i in range(k):
            self.rows.append((self.next_id, not (bad and i == 0)))
            self.next_id += 1

    def item_ids(self) -> list[int]:
        return [i for i, ok in self.rows if ok]

    def read(self) -> _sync.Rows:
        rows = [(i, "x") for i, _ in self.rows]
        return _sync.Rows(rows, [p for p, (_, ok) in enumerate(self.rows) if not ok])


@settings(max_examples=300, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["append", "append bad", "pop", "clear", "compact", "prune", "sync"]),
            st.integers(1, 6),
        ),
        max_size=40,
    )
)
def test_the_prefix_search_finds_what_a_naive_comparison_finds(ops) -> None:
    table = Table()
    synced: list[int] = []
    for op, k in ops:
        if op == "append":
            table.append(k)
        elif op == "append bad":
            table.append(k, bad=True)
        elif op == "pop":
            del table.rows[max(0, len(table.rows) - k) :]
        elif op == "clear":
            table.rows.clear()
        elif op == "compact":  # the newest k rows replaced by new ones
            del table.rows[max(0, len(table.rows) - k) :]
            table.append(max(1, k - 1))
        elif op == "prune":  # the oldest rows deleted (an expired prefix)
            del table.rows[:k]
        else:
            synced = table.item_ids()
        rows = table.read()
        assert len(rows) == len(table.item_ids())
        assert [rows.id_at(p) for p in range(len(rows))] == table.item_ids()
        keep = _sync.kept_prefix(array("q", synced), rows)
        assert keep == _naive_prefix(synced, table.item_ids()), (synced, table.rows)
        assert list(rows.ids_from(keep)) == table.item_ids()[keep:]


# ------------------------------------------------------------- the read is the SDK's read


async def test_rows_are_read_exactly_like_the_sdk_reads_them(tmp_path) -> None:
    db = str(tmp_path / "r.db")
    sdk = SQLiteSession("chat", db)
    await sdk.add_items([{"role": "user", "content": "a"}])
    with sqlite3.connect(db) as conn:
        for data in [
            '{"role": "user", "content": "b"}',
            "not json{",
            "5",
            "null",
            "[1, 2]",
            '"text"',
            b'{"role": "user", "content": "bytes"}',
            12,
            3.5,
            "",
            '{"role": "assistant", "content": "NaN", "x": NaN}',
            "{}",
        ]:
            conn.execute(
                "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
                ("chat", data),
            )
        conn.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
            ("other", '{"role": "user", "content": "not this session"}'),
        )
    await sdk.add_items([{"role": "user", "content": "z"}])
    reader = _sync.RowReader(db, "agent_messages", "chat")
    items, rows = reader.read(lambda rows: rows)
    expected = await sdk.get_items()
    assert json.dumps(items) == json.dumps(expected)
    with sqlite3.connect(db) as conn:
        ids = [
            r[0]
            for r in conn.execute(
                "SELECT id, message_data FROM agent_messages WHERE session_id = 'chat' ORDER BY id"
            )
            if _decodes(r[1])
        ]
    assert [rows.id_at(p) for p in range(len(items))] == ids
    session = ProtoPromptSession("chat", db)
    assert json.dumps(await session.get_items()) == json.dumps(expected)
    session.close()
    reader.close()
    sdk.close()


def _decodes(data: Any) -> bool:
    try:
        json.loads(data)
    except (json.JSONDecodeError, TypeError):
        return False
    return True


# ------------------------------------------------------------------ the races, end to end

SCOPE = MemoryScope("acme", user="alice")
SYSTEM = "Be brief."


def _builder(store: MemoryStore) -> TokenBudgetedContextBuilder:
    return TokenBudgetedContextBuilder(store, max_tokens=2000, scope=SCOPE, output_reserve=100)


class Turns:
    """Turns through a session's ``get_items`` and callback, as the SDK makes them, each
    checked against a builder that packs the same history without any index."""

    def __init__(self, db: str, session_id: str = "chat", words: int = 20, **options: Any) -> None:
        self.db = db
        self.words = words
        self.store = MemoryStore()
        self.session = ProtoPromptSession(session_id, db, **options)
        self.builder = _builder(self.store)
        self.callback = self.session.input_callback(self.builder, system_prompt=SYSTEM)
        self.fresh = _builder(self.store)
        self.n = 0

    async def read(self) -> list[Any]:
        return copy.deepcopy(await self.session.get_items())

    async def send(self, history: list[Any], answer: list[Any] | None = None) -> None:
        """The callback on ``history`` (what the read returned) must send what a fresh pack
        sends; the turn's items are then stored."""
        new = [{"role": "user", "content": f"question {self.n}"}]
        self.n += 1
        _core._clear_count_cache()
        expected = self.fresh.build(
            copy.deepcopy(history), copy.deepcopy(new), system_prompt=SYSTEM
        )
        _core._clear_count_cache()  # counts come from the index, the store or the tokenizer
        sent = await self.callback(history, new)
        assert json.dumps(sent) == json.dumps(expected.items)
        got = self.builder.last_plan
        assert got is not None
        assert (got.pack.used, got.pack.history_tokens, got.pack.kept_history) == (
            expected.pack.used,
            expected.pack.history_tokens,
            expected.pack.kept_history,
        )
        assert list(got.pack.decisions) == list(expected.pack.decisions)
        await self.session.add_items(
            new
            + (
                answer
                or [
                    {
                        "type": "message",
                        "role": "assistant",
                        "id": f"msg_{self.n}",
                        "status": "completed",
                        "content": [
                            {
                                "type": "output_text",
                                "text": f"{self.n} " + "fine " * (self.words + 9 * self.n),
                                "annotations": [],
                            }
                        ],
                    }
                ]
            )
        )

    async def turn(self) -> None:
        await self.send(await self.read())

    def close(self) -> None:
        self.session.close()
        self.store.close()


async def _other_writer(db: str, pops: int, items: list[Any]) -> None:
    other = SQLiteSession("chat", db)
    for _ in range(pops):
        await other.pop_item()
    await other.add_items(items)
    other.close()


BIG_ORPHAN = {
    "type": "function_call_output",
    "call_id": "call_elsewhere",
    "output": "result " * 6000,
}
BIG_USER = {"role": "user", "content": "pasted " * 6000}


async def test_a_pop_and_append_between_the_read_and_the_callback(tmp_path) -> None:
    """Another process pops the newest row and appends a long one after this turn's read:
    this turn sends its read, the next one the new rows, both as a fresh pack would (the
    old sync point was taken after the read, and the next turn reused the popped row's
    entry for the new row: 6x the budget, an orphan output)."""
    db = str(tmp_path / "s.db")
    turns = Turns(db)
    for _ in range(4):
        await turns.turn()
    for new_rows in ([BIG_USER], [BIG_ORPHAN], [{"role": "user", "content": "short"}]):
        history = await turns.read()
        await _other_writer(db, 1, new_rows)
        await turns.send(history)
        await turns.turn()
    turns.close()


def _pop_and_append_sql(db: str, item: Any) -> None:
    """What another process's pop_item + add_items do to the table, synchronously."""
    with sqlite3.connect(db, timeout=5) as conn:
        conn.execute(
            "DELETE FROM agent_messages WHERE id = (SELECT MAX(id) FROM "
            "agent_messages WHERE session_id = 'chat')"
        )
        conn.execute(
            "INSERT INTO agent_messages (session_id, message_data) VALUES (?, ?)",
            ("chat", json.dumps(item)),
        )


async def test_a_pop_and_append_while_the_history_is_read(tmp_path, monkeypatch) -> None:
    """Another process pops the newest row and appends a long one while this process
    decodes the rows it just selected (the window in which the old row check, taken after
    the SDK's read, described rows other than those read): both this turn and the next
    send what a fresh pack of their history sends."""
    db = str(tmp_path / "s.db")
    turns = Turns(db)
    for _ in range(4):
        await turns.turn()
    real_loads = json.loads
    for new_row in (BIG_USER, BIG_ORPHAN, {"role": "user", "content": "short"}):
        fired: list[bool] = []

        def loads(data: Any, *args: Any, _row: Any = new_row, **kw: Any) -> Any:
            if not fired:
                fired.append(True)
                _pop_and_append_sql(db, _row)
            return real_loads(data, *args, **kw)

        monkeypatch.setattr(json, "loads", loads)
        history = await turns.read()
        monkeypatch.setattr(json, "loads", real_loads)
        assert fired
        await turns.send(history)
        await turns.turn()
    turns.close()


async def test_rows_the_sdk_skips_while_others_pop_and_append(tmp_path) -> None:
    db = str(tmp_path / "s.db")
    turns = Turns(db)
    await turns.turn()
    with sqlite3.connect(db) as conn:  # a damaged row in the middle of the history
        conn.execute(
            "INSERT INTO agent_messages (session_id, message_data) "
            "VALUES ('chat', '{\"role\": \"user\", ')"
        )
    for _ in range(3):
        await turns.turn()
    rng = random.Random(3)
    for i in range(8):
        await _other_writer(
            db,
            rng.randrange(0, 4),
            [rng.choice([BIG_USER, BIG_ORPHAN, {"role": "user", "content": f"elsewhere {i}"}])],
        )
        if rng.randrange(3) == 0:
            with sqlite3.connect(db) as conn:
                conn.execute(
                    "INSERT INTO agent_messages (session_id, message_data) "
                    "VALUES ('chat', 'garbage')"
                )
        await turns.turn()
    turns.close()


async def test_a_copy_of_the_database_file_keeps_its_own_index(tmp_path) -> None:
    """Two copies of one file share their database id and go on with the same row ids but
    other rows: each must be compared with its own rows."""
    import shutil

    a = str(tmp_path / "a.db")
    first = Turns(a)
    for _ in range(3):
        await first.turn()
    first.close()
    b = str(tmp_path / "b.db")
    shutil.copyfile(a, b)
    ta, tb = Turns(a), Turns(b)
    await _other_writer(b, 2, [BIG_USER])  # b diverges: other rows with the next ids
    await ta.turn()
    await tb.turn()
    await ta.turn()
    assert ta.session._debug_state().index_id != tb.session._debug_state().index_id
    ta.close()
    tb.close()


async def test_concurrent_turns_of_one_session_in_one_process(tmp_path) -> None:
    """Two tasks read and pack the same stored session at once (objects made per request
    share one index): each sends what a fresh pack of its own read sends."""
    db = str(tmp_path / "s.db")
    a, b = Turns(db), Turns(db)
    await a.turn()
    assert a.session._debug_state().index_id == b.session._debug_state().index_id
    for _ in range(3):
        ha, hb = await a.read(), await b.read()
        await _other_writer(db, 1, [{"role": "user", "content": "in between"}])
        await asyncio.gather(a.send(ha), b.send(hb))
    a.close()
    b.close()


def test_the_shared_pool_keys_include_the_file(tmp_path) -> None:
    """Objects share the pool's index when they name the same file (by any path), table and
    session id; a copy of the file (same database id) or another table or session id has
    an index of its own."""
    import shutil

    db = tmp_path / "k.db"
    session = ProtoPromptSession("chat", str(db))
    state = session._debug_state()
    assert state.shared and state.reads_rows
    (tmp_path / "sub").mkdir()
    link = tmp_path / "link.db"
    link.symlink_to(db)
    same = [
        ProtoPromptSession("chat", str(tmp_path / "sub" / ".." / "k.db")),
        ProtoPromptSession("chat", str(link)),
    ]
    assert all(s._debug_state().index_id == state.index_id for s in same)
    shutil.copyfile(db, tmp_path / "copy.db")
    others = [
        ProtoPromptSession("chat", str(tmp_path / "copy.db")),
        ProtoPromptSession("chat", str(db), messages_table="other_messages"),
        ProtoPromptSession("other", str(db)),
    ]
    ids = {s._debug_state().index_id for s in others}
    assert len(ids) == 3 and state.index_id not in ids
    assert all(s._debug_state().shared for s in others)
    for s in [session, *same, *others]:
        s.close()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_reads_rows_on_a_connection_of_its_own(tmp_path) -> None:
    from test_count_store import _in_forked_child

    db = str(tmp_path / "f.db")
    sdk = SQLiteSession("chat", db)
    asyncio.run(sdk.add_items([{"role": "user", "content": "before the fork"}]))
    reader = _sync.RowReader(db, "agent_messages", "chat")
    items, _ = reader.read(len)
    parent_conn = reader._conn
    assert parent_conn is not None and items

    def child() -> Any:
        assert reader._conn is None  # the parent's connection is left alone
        got, n = reader.read(len)
        return [i["content"] for i in got], n, reader._conn is not parent_conn

    assert _in_forked_child(child) == (["before the fork"], 1, True)
    assert reader.read(len)[1] == 1 and reader._conn is parent_conn
    reader.close()
    sdk.close()
