"""Posing as an ``SQLiteSession``: a session class made a subclass of it, for sessions stored
in a native one, so code that treats ``SQLiteSession`` specially treats them the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ... import _process
from ..._seams import POP_ITEM_WITH_VALIDATION, pop_item_with_validation
from ._names import SQLiteSession

if TYPE_CHECKING:
    from ..session import ProtoPromptSession

_S = TypeVar("_S")

_SQLITE_BACKED: dict[type[Any], type[Any]] = _process.SQLITE_BACKED.items


def sqlite_backed(cls: type[_S], base: type[Any]) -> type[_S]:
    """``cls`` (a subclass of the session class ``base``) made an ``SQLiteSession`` subclass,
    for sessions stored in a native one.

    Code that treats a native ``SQLiteSession`` specially — ``EncryptedSession`` authenticates
    a pop inside the SQLite transaction when ``type(s).pop_item is SQLiteSession.pop_item`` —
    then treats a ProtoPromptSession over one the same way. Every method is still
    ProtoPromptSession's (it comes first in the MRO); ``pop_item`` is SQLiteSession's own,
    which only calls ``_pop_item_with_validation`` (below), unless ``cls`` overrides it."""
    variant: type[_S] | None = _SQLITE_BACKED.get(cls)
    if variant is None:
        namespace: dict[str, Any] = {
            "__module__": cls.__module__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
            POP_ITEM_WITH_VALIDATION: _pop_item_with_validation,
        }
        if getattr(cls, "pop_item") is getattr(base, "pop_item"):  # noqa: B009
            namespace["pop_item"] = SQLiteSession.pop_item
        variant = _SQLITE_BACKED[cls] = cast(
            "type[_S]", type(cls.__name__, (cls, SQLiteSession), namespace)
        )
    return variant


async def _pop_item_with_validation(
    self: ProtoPromptSession, validate: Callable[[Any], None] | None = None
) -> Any:
    """``SQLiteSession._pop_item_with_validation`` of the inner session: ``validate`` runs on
    the claimed row inside the transaction, and an exception rolls the removal back."""
    state = self._index_state
    state.bump()
    try:
        item = await pop_item_with_validation(self._inner)(validate)
    finally:
        state.bump()
    if item is not None:
        await self._popped(item)
    return item
