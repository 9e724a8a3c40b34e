"""Memory scopes: the isolation boundary of every memory read and write.

A :class:`MemoryScope` names a place in a four-level hierarchy::

    tenant  >  user  >  thread  >  kind

Scope rule
----------
* **Writes** are stored under exactly the scope they were given.
* **Reads** (``search``, ``facts``, ``get_profile``) by default see only records
  whose scope is *equal* to the query scope in all four fields.  A record written
  at ``(acme, alice)`` is *not* visible from ``(acme, alice, thread="t1")`` and
  vice versa.
* A read may opt in with ``include_parents=True`` to additionally see records
  stored at the *ancestors* of the query scope (see :meth:`MemoryScope.ancestors`):
  the scopes obtained by clearing trailing fields, e.g. for
  ``(acme, alice, t1, notes)`` these are ``(acme)``, ``(acme, alice)`` and
  ``(acme, alice, t1)``.  Siblings (``(acme, bob)``, ``(acme, alice, t2)``),
  descendants and other tenants are never visible.
* ``forget`` deletes exactly one scope, never narrower or wider ones.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["MemoryScope", "ScopeKey"]

ScopeKey = tuple[str, str | None, str | None, str | None]
"""The ``(tenant, user, thread, kind)`` tuple returned by :meth:`MemoryScope.key`."""


def _check_part(name: str, value: object, *, required: bool) -> None:
    if value is None:
        if required:
            raise TypeError(f"MemoryScope.{name} is required and must be a non-empty str, got None")
        return
    if not isinstance(value, str):
        expected = "a non-empty str" if required else "None or a non-empty str"
        raise TypeError(f"MemoryScope.{name} must be {expected}, got {type(value).__name__}")
    if not value:
        raise ValueError(f"MemoryScope.{name} must not be an empty string")
    if "\x00" in value:
        raise ValueError(f"MemoryScope.{name} must not contain NUL characters")


@dataclass(frozen=True)
class MemoryScope:
    """An immutable, validated memory scope ``(tenant, user, thread, kind)``.

    ``tenant`` is required; the other levels are optional.  Every field that is
    set must be a non-empty string without NUL characters.  Scopes are hashable
    and compare by value.

    Example::

        scope = MemoryScope("acme", user="alice")
        notes = scope.with_thread("t-42").with_kind("notes")
    """

    tenant: str
    user: str | None = None
    thread: str | None = None
    kind: str | None = None

    def __post_init__(self) -> None:
        _check_part("tenant", self.tenant, required=True)
        _check_part("user", self.user, required=False)
        _check_part("thread", self.thread, required=False)
        _check_part("kind", self.kind, required=False)

    def with_kind(self, kind: str | None) -> MemoryScope:
        """Return a copy of this scope with ``kind`` replaced (``None`` clears it)."""
        return dataclasses.replace(self, kind=kind)

    def with_thread(self, thread: str | None) -> MemoryScope:
        """Return a copy of this scope with ``thread`` replaced (``None`` clears it)."""
        return dataclasses.replace(self, thread=thread)

    def key(self) -> ScopeKey:
        """Return the scope as a ``(tenant, user, thread, kind)`` tuple."""
        return (self.tenant, self.user, self.thread, self.kind)

    def ancestors(self) -> tuple[MemoryScope, ...]:
        """Return the strict ancestor scopes, broadest first.

        Ancestors are formed by clearing trailing fields: ``(t)``, ``(t, user)``,
        ``(t, user, thread)`` -- each included only if it differs from this scope
        and from the previous ancestor.  A tenant-only scope has no ancestors.
        """
        candidates = (
            MemoryScope(self.tenant),
            MemoryScope(self.tenant, self.user),
            MemoryScope(self.tenant, self.user, self.thread),
        )
        result: list[MemoryScope] = []
        for candidate in candidates:
            if candidate != self and (not result or candidate != result[-1]):
                result.append(candidate)
        return tuple(result)
