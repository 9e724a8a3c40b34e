"""What the history stores (:mod:`._store`, ``_sqlalchemy_store``, ``_redis_store``) share:
their read error, why an inner session has no store, the shape of a token window.

Beneath every store, so that :mod:`._store` (which picks a store) imports the engines and
the engines import this module, one way.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..._seams import DESERIALIZE_ITEM
from . import _sync

__all__ = ["StoreReadError", "Unsupported", "WindowRows", "unsupported_override"]

WindowRows = tuple[list[Any], list[Any], _sync.Rows, _sync.RowIds]
"""A store's token window: ``(window items before the index's last one, items from the
index's last one on, the rows of those, keys of the earlier window rows)``."""


class StoreReadError(Exception):
    """A store could not read the rows (the server or file failed): the session reads the
    history through the inner session instead, and the turn report says why."""


class Unsupported(NamedTuple):
    """Why an inner session has no history store: a code of
    ``protoprompt.turn_report.READ_REASONS`` and detail."""

    code: str
    detail: str | None


def _overrides(inner: Any, base: type[Any], names: tuple[str, ...]) -> str | None:
    for name in names:
        if getattr(type(inner), name, None) is not getattr(base, name, None):
            return name
    return None


def unsupported_override(inner: Any, base: type[Any]) -> Unsupported | None:
    """Why a subclass of an SDK session cannot be read by its store: it changes how the
    history is read or decoded."""
    name = _overrides(inner, base, ("get_items", DESERIALIZE_ITEM))
    if name is None:
        return None
    return Unsupported("inner_session", f"{type(inner).__name__} overrides {name}")
