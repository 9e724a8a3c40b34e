"""Which run a model call belongs to, what the filter may reuse from its earlier calls, and
the SDK's de-duplication of what the filter returns.

**Run identity.** The SDK gives every run its own agent span before the run's first model
call (``Runner.run`` and ``Runner.run_streamed`` in 0.22.3, 0.23.1 and 0.24.0, with tracing
on or off: a disabled trace still makes a no-op span object per run) and keeps it current,
under that turn's span, while the model filter runs; a handoff starts a new one. Concurrent
runs, runs one after another in one task, runs inside one user ``trace()`` and nested runs
(an agent used as a tool) each have their own. :func:`run_span` finds it by walking the
tracing scope from the current span; a call made outside a run (no agent span in scope)
cannot be attributed and is packed from scratch. The span, not the items, identifies the run.

**What is reused.** Within a run the filter keeps a :class:`~protoprompt.HistoryIndex` of the
input it has packed and the content digests of what it saw. Nothing is trusted because it
was seen: every call digests its whole input (``protoprompt._core.digests``: a keyed hash
of the content, no conversion), and the index is cut back to the first item whose digest
changed (an item edited in place, a list rearranged by another filter). The layout of the
previous call (where the run's input is, where the newest step starts) is reused only when
the previous input is an unchanged prefix of this one and nothing appended is a user
message.

**De-duplication.** After the filter the SDK collapses items that share an identity
(``deduplicate_input_items_preferring_latest``: the same ``call_id`` reused by a later
response, a repeated reasoning id): the last occurrence's content survives, at the first
position for calls and reasoning, at the last for outputs. The filter packs the list as the
SDK will send it (:func:`collapse`), so a ``call_0`` reused in every response neither ties an
old run's output to this run's step nor is counted twice.
"""

from __future__ import annotations

import bisect
import contextvars
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _core
from ..packing import HistoryIndex
from ._sdk import DEDUPE_ANCHOR_TYPES, DEDUPE_KEY, AgentSpanData, get_current_span

__all__ = ["Collapsed", "Run", "collapse", "common_prefix", "dedupe_keys", "run_span"]

_SCOPE_DEPTH = 8
"""Spans walked down the tracing scope to the run's agent span (it is the current span, or
the one under the current turn span)."""


def run_span() -> Any | None:
    """The agent span of the run making the current model call, or ``None`` when there is
    none in scope (the call cannot be attributed to a run)."""
    span = get_current_span()
    for _ in range(_SCOPE_DEPTH):
        if span is None:
            return None
        if isinstance(getattr(span, "span_data", None), AgentSpanData):
            return span
        token = getattr(span, "_prev_span_token", None)
        if not isinstance(token, contextvars.Token):
            return None
        previous = token.old_value
        span = None if previous is contextvars.Token.MISSING else previous
    return None


def _field(item: Any, name: str) -> Any:
    return item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)


def dedupe_keys(items: Sequence[Any]) -> list[str | None]:
    """The SDK's de-duplication key of each item (``None``: never collapsed)."""
    if DEDUPE_KEY is None:  # pragma: no cover - another SDK layout
        return [None] * len(items)
    return [DEDUPE_KEY(item) for item in items]


class Collapsed:
    """``items`` as the SDK's de-duplication leaves them, with where each item went."""

    __slots__ = ("items", "origins", "sources", "where")

    def __init__(
        self, items: list[Any], sources: list[int], origins: list[int], where: list[int]
    ) -> None:
        self.items = items
        """The collapsed list (the SDK's objects, the surviving content of each key)."""
        self.sources = sources
        """``sources[d]``: the original position whose content is at ``d``."""
        self.origins = origins
        """``origins[d]``: the original position ``d`` stands at (increasing)."""
        self.where = where
        """``where[i]``: the collapsed position of original item ``i`` (of its key)."""

    def start(self, original: int) -> int:
        """The first collapsed position standing at or after original position ``original``."""
        return bisect.bisect_left(self.origins, original)


def collapse(items: Sequence[Any], keys: Sequence[str | None]) -> Collapsed:
    """What ``deduplicate_input_items_preferring_latest`` makes of ``items`` (the same list,
    tested against the SDK's function), with the positions mapped."""
    latest: dict[str, int] = {}
    anchor: dict[str, int] = {}
    for i, key in enumerate(keys):
        if key is None:
            continue
        latest[key] = i
        if key not in anchor or _field(items[i], "type") not in DEDUPE_ANCHOR_TYPES:
            anchor[key] = i
    out: list[Any] = []
    sources: list[int] = []
    origins: list[int] = []
    placed: dict[str, int] = {}
    where = [0] * len(items)
    for i, key in enumerate(keys):
        if key is None:
            where[i] = len(out)
        elif anchor[key] == i:
            placed[key] = len(out)
        else:
            continue
        origins.append(i)
        source = i if key is None else latest[key]
        sources.append(source)
        out.append(items[source])
    for i, key in enumerate(keys):
        if key is not None:
            where[i] = placed[key]
    return Collapsed(out, sources, origins, where)


class Run:
    """What the filter knows of one run between its model calls."""

    __slots__ = (
        "agent",
        "calls",
        "digests",
        "dups",
        "index",
        "index_digests",
        "keys",
        "n_prev",
        "pool",
        "run_input",
        "span",
        "step_start",
        "token",
    )

    def __init__(self, agent: Any, token: Any, span: Any) -> None:
        self.agent = agent
        self.token = token
        self.span = span
        """The run's agent span (held: its id cannot be reused while this state lives)."""
        self.index = HistoryIndex()
        self.index_digests = b""
        """Digests of the packed list's first ``len(index)`` items, as the index saw them."""
        self.calls = 0
        self.digests = b""
        """Digests of the previous call's input (as the SDK handed it over)."""
        self.n_prev = 0
        self.step_start = 0
        self.run_input: tuple[int, int] | None = None
        self.pool: tuple[tuple[Any, ...], list[Any]] | None = None
        self.keys: list[str | None] = []
        """De-duplication keys of the previous input's leading items."""
        self.dups = 0
        """How many of those keys repeat an earlier one."""

    @property
    def nbytes(self) -> int:
        return self.index.nbytes + len(self.digests) + len(self.index_digests) + 8 * len(self.keys)

    def observe(self, items: list[Any]) -> tuple[bytes, bool]:
        """Digest ``items``; ``(digests, extends)``: whether the previous call's input is an
        unchanged prefix of ``items`` with nothing but model output and tool results (no
        user message) appended: the same run continuing."""
        digests, same = _core.digests(items, self.digests)
        n = self.n_prev
        extends = (
            bool(self.calls)
            and same >= n
            and len(items) >= n
            and not any(_is_user_message(items[p]) for p in range(n, len(items)))
        )
        self._update_keys(items, same)
        return digests, extends

    def _update_keys(self, items: list[Any], same: int) -> None:
        keep = min(same, len(self.keys))
        if keep < len(self.keys):
            del self.keys[keep:]
            seen: set[str] = set()
            self.dups = 0
            for key in self.keys:
                if key is not None:
                    self.dups += key in seen
                    seen.add(key)
        new = dedupe_keys(items[keep:])
        if any(k is not None for k in new):
            seen = {k for k in self.keys if k is not None}
            for key in new:
                if key is not None:
                    self.dups += key in seen
                    seen.add(key)
        self.keys.extend(new)

    def sync_index(self, digests: bytes) -> None:
        """Cut the index back to the first item whose content it has not seen (``digests``:
        those of the list about to be packed)."""
        n = len(self.index)
        if n and common_prefix(digests, self.index_digests) < n:
            self.index.truncate(common_prefix(digests, self.index_digests))


def common_prefix(a: bytes, b: bytes) -> int:
    """How many leading 16-byte digests ``a`` and ``b`` share (a few slice compares)."""
    n = min(len(a), len(b)) // 16
    if a[: n * 16] == b[: n * 16]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi], in digests
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[: mid * 16] == b[: mid * 16]:
            lo = mid
        else:
            hi = mid
    return lo


def _is_user_message(item: Any) -> bool:
    return _field(item, "role") == "user" and _field(item, "type") in (None, "message")
