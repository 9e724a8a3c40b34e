"""The optional hooks the SDK probes on a session, decided for the session (spec §11.3):
implemented with the index reset around each history rewrite, forwarded from the inner
session, or hidden."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..._seams import atomic_replace_items, compaction_snapshot_reader, ignores_ids_for_matching
from .._sdk._shims import FORWARDED_HOOKS, NOT_FORWARDED, accepts_keyword, call
from ..compaction import REWRITING

if TYPE_CHECKING:
    from .._stores._snapshots import IndexState
    from .._stores._store import HistoryStore
    from ._evicted import SessionMemory

Item = Any


class InnerHooks:
    """The optional SDK hooks of :class:`~protoprompt.integrations.ProtoPromptSession` (a
    base class of it)."""

    if TYPE_CHECKING:
        _inner: Any
        _index_state: IndexState
        _store: HistoryStore | None
        _memories: list[SessionMemory]

        async def _attach(self) -> None: ...

    # The SDK finds optional session capabilities by attribute (getattr/hasattr, once on the
    # type). Each one the 0.22.3 and 0.24.0 code probes is decided here (spec §11.3):
    #   implemented  session_settings, close, _ignore_ids_for_matching (the inner's value),
    #                _get_compaction_snapshot and _atomic_replace_items (the inner's, with the
    #                index reset around the rewrite; None / False when the inner has none)
    #   forwarded    the inner's own run_compaction, _defer_compaction,
    #                _get_deferred_compaction_response_id, _clear_deferred_compaction,
    #                _get_items_with_generation, _add_items_with_generation,
    #                _read_compaction_items (see __getattr__; a compaction rewrite resets the
    #                index), absent when the inner lacks them
    #   read through other public attributes of the inner session (db_path, engine...)
    #   hidden       every other private attribute of the inner session

    @property
    def _ignore_ids_for_matching(self) -> bool:
        """The inner session's item-matching policy (an id-stripping store sets it), so the
        runner's rollback before a retry matches stored items the way the store keeps them."""
        return ignores_ids_for_matching(self._inner)

    def __getattr__(self, name: str) -> Any:
        """The inner session's optional hooks (``FORWARDED_HOOKS``) and public attributes
        (``db_path``, ``engine``, AdvancedSQLiteSession's branch methods...), read through."""
        if name in FORWARDED_HOOKS or (not name.startswith("_") and name not in NOT_FORWARDED):
            inner = self.__dict__.get("_inner")
            if inner is not None:
                value = getattr(inner, name)  # AttributeError when the inner has none
                if name == "run_compaction":
                    return self._rewrites(value)
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _rewrites(self, method: Any) -> Any:
        """``method`` (which rewrites the stored history) with the index reset around it,
        under ``method``'s own signature: the SDK passes ``wrapper`` (its run context: what
        makes a compaction automatic, matched to the request) only to a method whose
        signature names it, so a forwarded hook must show the inner's parameters exactly."""

        @functools.wraps(method)
        async def rewriting(*args: Any, **kwargs: Any) -> Any:
            await self._attach()
            state, store = self._index_state, self._store
            running = REWRITING.set((state, state.epoch))  # for compaction_trigger
            state.bump()
            if store is not None:
                await store.before_rewrite()
            try:
                return await call(method, *args, **kwargs)
            finally:
                state.bump()
                if store is not None:
                    await store.after_rewrite()
                REWRITING.reset(running)
                for memory in self._memories:
                    memory.rewritten()

        return rewriting

    def _overrides_storage(self) -> bool:
        """Whether a subclass changes how the history is read or written: the inner
        session's compaction shortcuts would then bypass it (the SDK's own sessions refuse
        them for their subclasses alike)."""
        cls = type(self)
        # The session class itself: the first class (from the root) with these hooks that
        # reads and writes the history.
        base = next(
            c for c in reversed(cls.__mro__) if issubclass(c, InnerHooks) and "get_items" in vars(c)
        )
        return any(
            getattr(cls, name) is not getattr(base, name)
            for name in ("get_items", "add_items", "clear_session")
        )

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Item], bool] | None = None
    ) -> Any:
        """The inner session's bounded compaction snapshot (``OpenAIResponsesCompactionSession``
        replaces its suffix atomically), or ``None`` when the inner has none. The replacement
        resets this session's index: a ``:memory:`` database has no row check to notice it."""
        reader = compaction_snapshot_reader(self._inner)
        if reader is None or self._overrides_storage():
            return None
        if prune_prefix is not None and accepts_keyword(reader, "prune_prefix"):
            raw = await reader(limit, prune_prefix=prune_prefix)
        else:
            raw = await reader(limit)
        if raw is None or not dataclasses.is_dataclass(raw) or isinstance(raw, type):
            return None  # not the SDK's snapshot: without one the SDK needs full coverage
        snapshot: Any = raw  # the SDK's CompactionSnapshot (not imported: 0.24 only)
        return dataclasses.replace(snapshot, replace_suffix=self._rewrites(snapshot.replace_suffix))

    async def _atomic_replace_items(self, items: list[Item]) -> bool:
        """Replace the whole history atomically if the inner session can (``RedisSession``);
        ``False`` (nothing changed, the SDK falls back to clear and add) otherwise."""
        replace = atomic_replace_items(type(self._inner))
        if replace is None or self._overrides_storage():
            return False
        return bool(await self._rewrites(replace)(self._inner, items))
