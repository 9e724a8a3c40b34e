"""The session's cache-stable prefix, stored beside its history (issue 34 #4).

A session's filter keeps the request it sent last (a :class:`~.._calls._planner.RunPrefix`) so that
the next run's first call resumes it. That state is also stored with the index snapshot, in
the session's own engine (table ``protoprompt_prefix_state``; in Redis the hash
``{session}:protoprompt:prefix``, expiring with the session's list), so that a restarted
process or another worker continues the same prefix.

What is stored: a versioned JSON form of the request (its items as sent, masked copies
included -- the history changes under a stored row id, so a request is only repeated byte
for byte from its items), the SDK input length it was made from, its tokens, the request
key, the cut and the pinned positions, bound to the database's id, the messages table and
the session id, zlib-compressed and at most :data:`MAX_BYTES` (a larger request is not
stored: the next process starts a new prefix). Writes are compare-and-set on a random
version, so two workers never overwrite each other's newer request: the loser reads the
winner's at its next run. Loading never raises: a record of another format, another
session, damaged or not matching the history (``_planner.resume`` compares the request's
last items with the callback's request) is ignored.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import zlib
from typing import Any, Generic, TypeVar

from ... import _core, _process
from ..._storage import Kind, Record
from ..._storage.records import Field
from .._calls._planner import RunPrefix

__all__ = [
    "FORMAT",
    "KIND",
    "MAX_BYTES",
    "Encoded",
    "PrefixState",
    "StoredState",
    "decode",
    "encode",
    "of",
]

T = TypeVar("T")

_log = logging.getLogger("protoprompt")

KIND = Kind(
    "protoprompt_prefix_state",
    "prefix",
    (Field("version", "int"), Field("data", "blob")),
    version="version",
)
FORMAT = "protoprompt prefix state 3"
"""2: the request key carries its content digest; 3: the copies' original digests."""
MAX_BYTES = 4 << 20
"""The largest stored form (compressed): a larger request is not stored."""
WRITE_DELAY = 0.02
"""Seconds a write waits before it encodes and stores the latest state: the call that saved
it returns and its request goes out first (encoding a request is Python work that holds
the interpreter lock about as long as serialising the request; a writer that ran at once
took it from the call). Saves within the delay are written once (the latest wins); a wait
for the write (``close``, exit, a test) ends the delay at once."""
LINGER = 1.0
"""Seconds a writer waits for the next save after its last write before it leaves: the
calls of a run save one after another, and a thread started for each save kept the call
that saved it waiting until the new thread ran (milliseconds on a busy machine)."""


def _binding(record: Record, database_id: str) -> list[str]:
    return [database_id, *record.where]


_JSON = json.JSONEncoder(separators=(",", ":"))


class Encoded:
    """Where a state's writer left the stored form it compressed last, so that the next one
    (the same request plus what a call appended, most of the time) costs what was appended:
    the compressor's state after the request's items, their compressed form and their
    content digests (``_core.digests``: equal digests are equal content in the same key
    order, so the same JSON). A request whose items start with those items, by content,
    continues that compression with the JSON of its other items only; any other starts
    afresh. Used by one writer thread at a time."""

    __slots__ = ("_compressed", "_compressor", "_digests", "_head", "continued", "dumped")

    def __init__(self) -> None:
        self._head = b""
        self._digests = b""
        self._compressor: Any = None
        self._compressed = b""
        self.dumped = 0
        """Items whose JSON form was made, over every encode."""
        self.continued = 0
        """Items of the latest encode whose compressed form was continued, not redone."""

    def encode(self, head: bytes, items: list[Any], rest: bytes) -> bytes:
        """``head + "[" + items' JSON + "]," + rest``, compressed (level 1)."""
        digests, _ = _core.digests(items)
        done = self._digests
        if self._compressor is not None and head == self._head and digests.startswith(done):
            k = len(done) // 16
            compressor, out = self._compressor.copy(), self._compressed
        else:
            k, compressor, out = 0, zlib.compressobj(1), b""
            out += compressor.compress(head + b"[")
        self.continued = k
        added = b",".join(_JSON.encode(item).encode() for item in items[k:])
        self.dumped += len(items) - k
        out += compressor.compress(b"," + added if k and added else added)
        self._head, self._digests = head, bytes(digests)
        self._compressor, self._compressed = compressor.copy(), out
        end: bytes = compressor.compress(b"]," + rest) + compressor.flush()
        return b"".join([out, end])


def encode(prefix: RunPrefix, bound: list[str], kept: Encoded | None = None) -> bytes | None:
    """The stored form of ``prefix`` (``None``: not JSON, or larger than :data:`MAX_BYTES`);
    ``kept``: where the same writer's previous encode left off (see :class:`Encoded`)."""
    record = {
        "format": FORMAT,
        "bound": bound,
        "items": prefix.items,
        "source_len": prefix.source_len,
        "request_tokens": prefix.request_tokens,
        "key": [*prefix.key[:3], list(prefix.key[3]), bytes(prefix.key[4]).hex()],
        "cut": prefix.cut,
        "pins": prefix.pins,
        "copies": {str(i): d.hex() for i, d in prefix.copies.items()},
    }
    try:
        if kept is None:
            data = zlib.compress(_JSON.encode(record).encode(), 1)
        else:
            # The same bytes as the whole record's JSON: its fields before the items, the
            # items, its fields after them.
            del record["items"]
            whole = _JSON.encode(record).encode()
            cut = whole.index(b',"source_len":')
            data = kept.encode(whole[:cut] + b',"items":', prefix.items, whole[cut + 1 :])
    except (TypeError, ValueError):
        return None  # an item that is not JSON: nothing stored
    return data if len(data) <= MAX_BYTES else None


def _ints(value: Any, n: int | None = None) -> bool:
    return (
        isinstance(value, list)
        and all(type(x) is int and x >= 0 for x in value)
        and (n is None or len(value) == n)
    )


def _hex(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        bytes.fromhex(value)
    except ValueError:
        return False
    return True


def decode(data: object, bound: list[str]) -> RunPrefix | None:
    """The request :func:`encode` stored, or ``None`` (another format or binding, damaged)."""
    if type(data) is not bytes:
        return None
    try:
        raw = zlib.decompressobj().decompress(data, MAX_BYTES * 64)
        found = json.loads(raw)
    except (zlib.error, ValueError):
        return None
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        return None
    items, key, cut, pins = (found.get(k) for k in ("items", "key", "cut", "pins"))
    copies = _copies(found.get("copies"), len(items) if isinstance(items, list) else 0)
    source_len, tokens = found.get("source_len"), found.get("request_tokens")
    if (
        found.get("bound") != bound
        or not isinstance(items, list)
        or not all(isinstance(i, dict) for i in items)
        or type(source_len) is not int
        or type(tokens) is not int
        or not _ints([source_len, tokens])
        or not isinstance(key, list)
        or len(key) != 5
        or not _ints(key[:3])
        or not isinstance(key[3], list)
        or not all(isinstance(x, str) for x in key[3])
        or not _hex(key[4])
        or not (cut is None or _ints([cut]))
        or not isinstance(pins, list)
        or not _ints(pins)
        or any(p >= len(items) for p in pins)
        or copies is None
    ):
        return None
    request_key = (key[0], key[1], key[2], tuple(key[3]), bytes.fromhex(key[4]))
    return RunPrefix(items, source_len, tokens, request_key, cut, list(pins), copies)


def _copies(value: Any, n: int) -> dict[int, bytes] | None:
    """The stored copies' positions and digests (``None``: damaged)."""
    if not isinstance(value, dict):
        return None
    found: dict[int, bytes] = {}
    for at, digest in value.items():
        if not (isinstance(at, str) and at.isascii() and at.isdigit() and _hex(digest)):
            return None
        if int(at) >= n:
            return None
        raw = bytes.fromhex(digest)
        if len(raw) != 16:
            return None
        found[int(at)] = raw
    return found


class StoredState(Generic[T]):
    """One stored session's record of a state, and the version this process last read or
    wrote. Writes run in a background thread after :data:`WRITE_DELAY` (the latest state
    wins); nothing raises. Subclasses say how a state is stored (:meth:`_encode`,
    :meth:`_decode`) and copied."""

    def __init__(self, record: Record, database_id: str) -> None:
        self.record = record
        self.bound = _binding(record, database_id)
        self.version: int | None = None
        self.lock = threading.Lock()
        self.pending: T | None = None
        self.writer: threading.Thread | None = None
        self.hurry = threading.Event()
        """Set to end the current writer's delay (a wait for its write)."""
        self.delayed = 0
        """Writers whose delay ran out, not ended by a wait (read by tests)."""
        self.wake = threading.Event()
        """Set by a save for a writer that waits for one (:data:`LINGER`)."""
        self.started = 0
        """Writer threads started (read by tests)."""
        _process.PREFIX_STATES.add(self)

    def _encode(self, value: T) -> bytes | None:
        raise NotImplementedError

    def _decode(self, data: object) -> T | None:
        raise NotImplementedError

    def _copy(self, value: T) -> T:
        return value

    def load(self) -> T | None:
        """The stored state when it is not the one this process last read or wrote (and
        no write of this process is pending), else ``None``."""
        with self.lock:
            if self.pending is not None:
                return None
        found = self.record.load()
        if found is None:
            return None
        version = found.get("version")
        if isinstance(version, bytes):  # Redis
            version = int(version) if version.isdigit() else None
        if type(version) is not int:
            return None  # damaged: overwritten by this process's next state
        with self.lock:
            if version == self.version:
                return None
            self.version = version
        value = self._decode(found.get("data"))
        if value is None:
            _log.debug(
                "protoprompt: stored %s of %r ignored",
                self.record.kind.suffix,
                self.record.where[1],
            )
        return value

    def save(self, value: T) -> None:
        """Store ``value`` (a copy of it as it is now) in the background."""
        copy = self._copy(value)
        with self.lock:
            self.pending = copy
            if self.writer is not None:
                self.wake.set()
                return  # the writer writes it (it leaves only when nothing is pending)
            self.hurry = threading.Event()
            writer = threading.Thread(
                target=self._write, args=(self.hurry,), name="protoprompt-prefix", daemon=True
            )
            try:
                writer.start()
            except RuntimeError:  # no thread to be had: the next save tries again
                _log.debug("protoprompt: no writer for the stored %s", self.record.kind.suffix)
                return
            self.writer = writer
            self.started += 1

    def _write(self, hurry: threading.Event) -> None:
        try:
            self._drain(hurry)
        finally:
            with self.lock:
                if self.writer is threading.current_thread():
                    self.writer = None

    def _drain(self, hurry: threading.Event) -> None:
        if not hurry.wait(WRITE_DELAY):
            self.delayed += 1
        while True:
            with self.lock:
                value, self.pending = self.pending, None
                expected = self.version
                if value is None and hurry.is_set():
                    self.writer = None
                    return
                if value is None:
                    self.wake.clear()
            if value is None:
                # Wait for the next save (a wait for the writer ends this too), then for
                # its delay; leave when none came.
                self.wake.wait(LINGER)
                if self._leave_unless_pending():
                    return
                if not hurry.wait(WRITE_DELAY):
                    self.delayed += 1
                continue
            try:
                self._store(value, expected)
            except Exception:  # noqa: BLE001 - a write is best effort: this state is lost
                _log.debug(
                    "protoprompt: the stored %s was not written", self.record.kind.suffix,
                    exc_info=True,
                )  # fmt: skip

    def _leave_unless_pending(self) -> bool:
        """Whether the writer leaves (nothing to write): then it is no longer the writer."""
        with self.lock:
            if self.pending is None:
                self.writer = None
                return True
            return False

    def _store(self, value: T, expected: int | None) -> None:
        data = self._encode(value)
        if data is None:
            return
        version = secrets.randbits(62)
        values = {"version": version, "data": data}
        done = self.record.swap(expected, values)
        if done is False and expected is None:
            done = self.record.swap(self._stored_damaged(), values)
        if done is True:
            with self.lock:
                self.version = version

    def _stored_damaged(self) -> int | None:
        """The version of a stored record this process never read when it cannot be used
        (another format, session or damaged: replaced); ``None`` for another worker's
        state, which is kept (read at this process's next turn or run)."""
        found = self.record.load()
        version = None if found is None else found.get("version")
        if isinstance(version, bytes):
            version = int(version) if version.isdigit() else None
        if type(version) is not int or self._decode(found and found.get("data")) is not None:
            return None
        return version

    def delete(self) -> None:
        self.wait(5.0)
        self.record.delete()
        with self.lock:
            self.version = None

    def wait(self, timeout: float | None = None) -> None:
        with self.lock:
            writer, hurry = self.writer, self.hurry
        if writer is not None and writer is not threading.current_thread():
            hurry.set()
            self.wake.set()
            writer.join(timeout)

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.writer = None
        self.hurry = threading.Event()
        self.wake = threading.Event()
        self.pending = None


def wait_all(*states: StoredState[Any] | None) -> None:
    """A store's ``close``: wait (up to 5 s each) for its states' writes, the latest
    request stored first."""
    for state in states:
        if state is not None:
            state.wait(timeout=5.0)


class PrefixState(StoredState[RunPrefix]):
    """The per-call filter's request, stored (see the module's docstring)."""

    def __init__(self, record: Record, database_id: str) -> None:
        super().__init__(record, database_id)
        self.encoded = Encoded()
        """What the writer's previous encode left (read by tests)."""

    def _encode(self, value: RunPrefix) -> bytes | None:
        return encode(value, self.bound, self.encoded)

    def _decode(self, data: object) -> RunPrefix | None:
        return decode(data, self.bound)

    def _copy(self, value: RunPrefix) -> RunPrefix:
        return RunPrefix(
            list(value.items), value.source_len, value.request_tokens, value.key,
            value.cut, list(value.pins), dict(value.copies),
        )  # fmt: skip


_process.PREFIX_STATES.handle(
    after_fork=StoredState.after_fork,
    at_exit=lambda state: state.wait(timeout=5.0),
)


def of(session: Any) -> PrefixState | None:
    """The prefix record of a ``ProtoPromptSession`` (``None``: its engine keeps none)."""
    store = getattr(session, "_store", None)
    found = getattr(store, "prefixes", None)
    return found if isinstance(found, PrefixState) else None
