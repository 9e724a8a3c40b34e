"""Scoped long-term memory for protoprompt: documents, facts, profiles and the passages of
evicted session turns (the ``history`` layer), in SQLite or PostgreSQL.

See :mod:`protoprompt.memory.scope` for the isolation rule.
"""

from .scope import MemoryScope
from .store import HistoryRecord, MemoryHit, MemoryStore

__all__ = ["HistoryRecord", "MemoryHit", "MemoryScope", "MemoryStore"]
