"""Context messages: recognising the session callback's own context message in what the SDK
asks the session to store, and the hand-off (context variables) from ``get_items`` to the
callback and from the callback to the model filter, within one task."""

from __future__ import annotations

import contextvars
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import ProtoPromptError
from ...packing import canonical_text

if TYPE_CHECKING:
    from .._calls._planner import RunPrefix
    from .._stores import _sync
    from .._stores._snapshots import IndexState
    from ..session import ProtoPromptSession

MAX_PENDING_CONTEXTS = 64
"""Context messages remembered until the SDK writes them; older ones are forgotten."""
MAX_PENDING_MASKED = 4096
"""Masked copies remembered until the SDK writes them (direct calls of the callback); older
ones are forgotten."""
_CONTEXT_ROLES = ("system", "developer")


def _plain(item: Any) -> Any:
    """A dict view of an item (pydantic models are dumped), else the item itself."""
    if isinstance(item, Mapping):
        return item
    dump = getattr(item, "model_dump", None)
    if callable(dump):
        try:
            return dump(exclude_unset=True)
        except Exception:  # noqa: BLE001 - not a model we understand; it is not ours
            return None
    return None


def context_key(item: Any) -> tuple[str, str] | None:
    """``(role, text)`` when ``item`` has the shape of a context message, else ``None``.

    Accepts the forms the SDK may turn ``{"role": r, "content": text}`` into before
    ``add_items``: an added ``type: "message"``, content as a list of ``input_text`` parts.
    Any other field makes the item not a context message.
    """
    data = _plain(item)
    if not isinstance(data, Mapping):
        return None
    role = data.get("role")
    if role not in _CONTEXT_ROLES or data.get("type") not in (None, "message"):
        return None
    if set(data) - {"role", "content", "type"}:
        return None
    content = data.get("content")
    if isinstance(content, str):
        return (role, content)
    if isinstance(content, Sequence) and content:
        texts = []
        for part in content:
            part = _plain(part)
            if not isinstance(part, Mapping) or set(part) - {"type", "text"}:
                return None
            if part.get("type") != "input_text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return (role, "".join(texts))
    return None


def is_encrypted_envelope(item: Any) -> bool:
    """The shape ``EncryptedSession`` stores (``{"__enc__": 1, "v", "kid", "payload"}``)."""
    return (
        isinstance(item, Mapping)
        and item.get("__enc__") == 1
        and {"v", "kid", "payload"} <= item.keys()
    )


class ContextBook:
    """A session's bookkeeping of what its callback produced and the SDK must not store:
    context messages (also those produced lately, for the model filter to pin) and the
    masked copies handed out by direct calls of the callback, each with its key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: deque[tuple[Any, tuple[str, str]]] = deque(maxlen=MAX_PENDING_CONTEXTS)
        # Masked copies handed out by direct calls of the callback, with their canonical
        # text: add_items keeps them out of the history like the context message.
        self._pending_masked: deque[tuple[Any, str]] = deque(maxlen=MAX_PENDING_MASKED)
        # Context messages produced lately (stored or not), for the model filter to pin.
        self._produced: deque[tuple[str, str]] = deque(maxlen=MAX_PENDING_CONTEXTS)

    def expect(self, message: Mapping[str, Any]) -> tuple[str, str]:
        """Remember a context message the SDK is about to ask the session to store."""
        key = self.produced(message)
        with self._lock:
            self._pending.append((message, key))
        return key

    def produced(self, message: Mapping[str, Any]) -> tuple[str, str]:
        """Remember a context message the callback produced (for the model filter to pin)."""
        key = context_key(message)
        if key is None:  # pragma: no cover - the builder always produces this shape
            raise ValueError("not a context message")
        with self._lock:
            if key not in self._produced:
                self._produced.append(key)
        return key

    def expect_masked(self, masked: Sequence[Any]) -> None:
        """Remember masked copies a direct call of the callback handed out."""
        keys = [canonical_text(m) for m in masked]
        with self._lock:
            self._pending_masked.extend(zip(masked, keys, strict=True))

    def is_own(self, item: Any) -> bool:
        """Whether ``item`` is (a copy of) a context message the callback made."""
        key = context_key(item)
        if key is None:
            return False
        with self._lock:
            return key in self._produced

    def clear(self) -> None:
        """Forget what the SDK was expected to store (the history is cleared)."""
        with self._lock:
            self._pending.clear()
            self._pending_masked.clear()

    def without_own(self, items: Sequence[Any]) -> list[Any]:
        """``items`` minus the produced context messages and masked copies (each one
        consumed once)."""
        with self._lock:
            if not self._pending and not self._pending_masked:
                return list(items)
            kept: list[Any] = []
            for item in items:
                index = next((i for i, (obj, _) in enumerate(self._pending) if obj is item), None)
                if index is None:
                    key = context_key(item)
                    if key is not None:
                        index = next(
                            (i for i, (_, k) in enumerate(self._pending) if k == key), None
                        )
                if index is not None:
                    del self._pending[index]
                elif not self._consume_masked(item):
                    kept.append(item)
            return kept

    def _consume_masked(self, item: Any) -> bool:
        """Whether ``item`` is (a copy of) a masked copy a direct call handed out; it is then
        forgotten (caller holds the lock)."""
        if not self._pending_masked or not isinstance(item, Mapping):
            return False
        index = next((i for i, (obj, _) in enumerate(self._pending_masked) if obj is item), None)
        if index is None:
            try:
                key = canonical_text(item)
            except ProtoPromptError:
                return False
            index = next((i for i, (_, k) in enumerate(self._pending_masked) if k == key), None)
        if index is None:
            return False
        del self._pending_masked[index]
        return True

    @property
    def pending_masked(self) -> int:
        """Masked copies expected and not yet seen."""
        with self._lock:
            return len(self._pending_masked)

    @property
    def pending_contexts(self) -> int:
        """Context messages expected and not yet seen."""
        with self._lock:
            return len(self._pending)


class SessionRead:
    """What one ``get_items`` call returned, for the callback that follows it in the task."""

    __slots__ = ("facts", "session")

    def __init__(self, session: ProtoPromptSession, facts: _sync.ReadFacts) -> None:
        self.session = session
        self.facts = facts


class RunInput:
    """What the session callback returned for the run now starting in this task: the model
    filter pins its context message and new input on every model call of the run."""

    __slots__ = ("context_key", "copies", "ledger", "n_items", "new_input", "recall", "turn")

    def __init__(
        self,
        ledger: RunLedger,
        context_key: tuple[str, str] | None,
        new_input: list[Any],
        n_items: int,
        turn: Any = None,
        recall: tuple[int, tuple[str, str]] | None = None,
        copies: Mapping[bytes, bytes] | None = None,
    ) -> None:
        self.ledger = ledger
        self.context_key = context_key
        self.new_input = new_input
        self.n_items = n_items
        self.turn = turn
        """The callback's plan of the run (a ``ContextPlan``): what it masked and dropped."""
        self.recall = recall
        """The callback's recall message after the history: its position and key."""
        self.copies: Mapping[bytes, bytes] = {} if copies is None else copies
        """The copies the callback sent in place of stored items (masked tool outputs,
        id-less calls): the content digest of each, to that of the item it stands for."""


class RunLedger:
    """A session's record of its runs, which its callback writes and its model filter reads:
    the run now starting in this task (its context message and new input) and the context
    messages the callback produced lately."""

    __slots__ = ("_book", "_index", "latest", "session")

    def __init__(
        self,
        session: ProtoPromptSession,
        book: ContextBook,
        index: Callable[[], tuple[IndexState, bool]],
    ) -> None:
        self.session = session
        self._book = book
        self._index = index
        self.latest: RunPrefix | None = None
        """The latest request a model filter of the session sent through its cache-stable
        prefix (``_planner.RunPrefix``): the next run's first call resumes it, and a turn
        whose own request no longer fits continues it."""

    def index(self) -> tuple[IndexState, bool]:
        """The session's index state now, and whether it keeps one (``incremental``)."""
        return self._index()

    def record(
        self,
        key: tuple[str, str] | None,
        new_input: list[Any],
        n_items: int,
        turn: Any = None,
        recall: tuple[int, tuple[str, str]] | None = None,
        copies: Mapping[bytes, bytes] | None = None,
    ) -> None:
        """The callback returned ``n_items`` items for the run starting in this task, ending
        with ``new_input``, and first the context message ``key`` (if any); ``turn``: its
        plan; ``recall``: the position and key of its recall message (after the history);
        ``copies``: see :attr:`RunInput.copies`."""
        RUN_INPUT.set(RunInput(self, key, list(new_input), n_items, turn, recall, copies))

    def recall_at(self, items: Sequence[Any]) -> int | None:
        """The position of the run's recall message in a model call's input (the callback
        put it there; the SDK appends after it), when it is there."""
        run = self.current()
        if run is None or run.recall is None:
            return None
        at, key = run.recall
        if at >= len(items) or context_key(items[at]) != key:
            return None
        return at

    def current(self) -> RunInput | None:
        """The callback's record of the run in this task, if it was this ledger's."""
        run = RUN_INPUT.get()
        return run if run is not None and run.ledger is self else None

    def locate(self, items: Sequence[Any]) -> tuple[int, int] | None:
        """``[start, end)`` of the run's new input inside a model call's input, when the
        callback's record of this run matches it (the SDK sends the callback's result first,
        then what the run generates)."""
        run = self.current()
        if run is None or not run.new_input:
            return None
        a, b = run.n_items - len(run.new_input), run.n_items
        if a < 0 or b > len(items) or list(items[a:b]) != run.new_input:
            return None
        return a, b

    def is_context(self, item: Any) -> bool:
        """Whether ``item`` is (a copy of) a context message the callback produced."""
        return self._book.is_own(item)


RUN_INPUT: contextvars.ContextVar[RunInput | None] = contextvars.ContextVar(
    "protoprompt_run_input", default=None
)
"""Set by the session callback; read by the session's model filter in the same task."""

LAST_READ: contextvars.ContextVar[SessionRead | None] = contextvars.ContextVar(
    "protoprompt_last_read", default=None
)
"""Set by ``ProtoPromptSession.get_items``; the SDK calls the input callback next, in the
same task, with (copies of) exactly those items."""
