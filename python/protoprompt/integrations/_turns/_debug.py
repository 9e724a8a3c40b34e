"""What a session object holds behind its requests, for tests and debugging."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...count_store import CountStore


@dataclasses.dataclass(frozen=True)
class DebugState:
    """What a :class:`ProtoPromptSession` object holds behind its requests, at one moment
    (``session._debug_state()``): for tests and debugging of the index's mechanisms. A
    request never depends on it — every request equals a fresh ``pp.pack`` of the history
    the SDK handed over, whatever it says."""

    incremental: bool
    """The session keeps a :class:`~protoprompt.HistoryIndex` of the stored history."""
    reads_rows: bool
    """``get_items`` reads the rows itself, with their ids, and compares them with the
    index (a database file); else the index is trusted between this object's own pops
    and clears."""
    windowed_reads: bool
    """Token windows are in effect (``windowed_reads=True`` with a database file)."""
    index_id: int
    """Identifies the index state: equal for the objects that share one index, new when an
    object gets a fresh one (never reused in a process)."""
    shared: bool
    """The index is the process pool's for this stored session (objects made for it now
    get this one); ``False`` without a database file, or once dropped from the pool."""
    index_items: int
    """Items the index holds (the stored history it was last synced with)."""
    epoch: int
    """Bumped around every pop, clear and history rewrite through any object sharing the
    index: an index synced at another epoch is not trusted without comparing rows."""
    restore_tried: bool
    """A stored snapshot of the index was looked for (``True`` without a database file)."""
    snapshot_items: int
    """Items in the snapshot this index last wrote or loaded (0: none)."""
    count_store: CountStore | None
    """Where token counts outlive the process (one ``SQLiteCountStore`` per database file)."""
    window_reads: int
    """Reads of this object answered with a token window (only the newest items)."""
    last_window_offset: int | None
    """Stored items before the newest such window (``None`` before the first one)."""
