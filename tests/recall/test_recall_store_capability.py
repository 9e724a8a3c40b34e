"""The recall passes ``uncounted=`` (the rows the request sends) to a store's
``search_history`` only when the store declares it takes it (``search_history_uncounted``):
a store of another kind is asked as before, whatever its class."""

from __future__ import annotations

from typing import Any

from protoprompt import MemoryScope, MemoryStore, TokenBudgetedContextBuilder
from protoprompt._recall._turn import Sent
from protoprompt.memory import HistoryRecord
from protoprompt.recall import item_digest

SCOPE = MemoryScope("capability", user="u")


def _history(n_turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(n_turns):
        items += [
            {"role": "user", "content": f"question {i} about the weather"},
            {"role": "assistant", "content": f"answer {i}: " + "sunny " * 30},
        ]
    return items


class _Delegating:
    """A store that is no ``MemoryStore``: it hands every call to one, and records what its
    ``search_history`` was asked (its own signature: no ``uncounted`` keyword)."""

    def __init__(self, inner: MemoryStore) -> None:
        self._inner = inner
        self.asked: list[dict[str, Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def search_history(
        self,
        query: str,
        *,
        scope: MemoryScope,
        session_id: str | None = None,
        limit: int = 8,
        include_parents: bool = False,
        neighbours: bool = False,
    ) -> Any:
        self.asked.append({"limit": limit})
        return self._inner.search_history(
            query,
            scope=scope,
            session_id=session_id,
            limit=limit,
            include_parents=include_parents,
            neighbours=neighbours,
        )


class _Capable(_Delegating):
    """The same store declaring the capability: its search takes ``uncounted``."""

    search_history_uncounted = True

    def search_history(self, query: str, **kwargs: Any) -> Any:  # type: ignore[override]
        self.asked.append(dict(kwargs))
        return self._inner.search_history(query, **kwargs)


def _store(kind: type[_Delegating], history: list[dict[str, Any]]) -> _Delegating:
    inner = MemoryStore(chunk_words=40, chunk_overlap=0)
    records = [
        HistoryRecord(
            p, f"{item['role']}: {item['content']}", {"turn": p // 2 + 1}, item_digest(item)
        )
        for p, item in enumerate(history)
    ]
    inner.index_history("s1", records, scope=SCOPE)
    return kind(inner)


def _turn(store: Any, history: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    builder = TokenBudgetedContextBuilder(
        store, max_tokens=1_000, scope=SCOPE, recall_evicted=True, masking=None
    )
    question = {"role": "user", "content": "what about the weather?"}
    plan = builder.build(history, [question], session_id="s1", turn=13)
    return plan, question


def test_memory_store_declares_the_capability() -> None:
    assert MemoryStore.search_history_uncounted is True
    with MemoryStore() as store:
        assert store.search_history_uncounted is True


def test_a_store_without_the_capability_is_searched_without_uncounted() -> None:
    history = _history(12)
    store = _store(_Delegating, history)
    assert not hasattr(type(store), "search_history_uncounted")
    plan, _ = _turn(store, history)
    assert store.asked, "the turn recalled nothing"
    assert plan.pack.items


def test_a_store_with_the_capability_is_given_the_rows_the_request_sends() -> None:
    history = _history(12)
    store = _store(_Capable, history)
    _, question = _turn(store, history)
    assert store.asked, "the turn recalled nothing"
    sent = Sent.of(history, [question])
    assert store.asked[-1].get("uncounted") == sent.either and sent.either


def test_a_false_capability_is_not_one() -> None:
    class Declined(_Capable):
        search_history_uncounted = False

    history = _history(12)
    store = _store(Declined, history)
    _turn(store, history)
    assert store.asked and all("uncounted" not in a for a in store.asked)


def test_a_store_declaring_tokens_is_given_the_room_and_one_without_is_not() -> None:
    """``search_history_tokens``: the recall passes the room its passages can fill
    (``tokens=``) only to a store whose class declares it; MemoryStore does."""

    class Filling(_Capable):
        search_history_tokens = True

    assert MemoryStore.search_history_tokens is True
    history = _history(12)
    for kind, given in ((_Capable, False), (Filling, True)):
        store = _store(kind, history)
        _turn(store, history)
        assert store.asked, "the turn recalled nothing"
        assert ("tokens" in store.asked[-1]) is given
    builder = TokenBudgetedContextBuilder(
        store, max_tokens=1_000, scope=SCOPE, recall_evicted=True, masking=None
    )
    assert store.asked[-1]["tokens"] == builder._recall_room()
