"""Scoped long-term memory for protoprompt: documents, facts and profiles in SQLite.

See :mod:`protoprompt.memory.scope` for the isolation rule.
"""

from .scope import MemoryScope
from .store import HistoryRecord, MemoryHit, MemoryStore

__all__ = ["HistoryRecord", "MemoryHit", "MemoryScope", "MemoryStore"]
