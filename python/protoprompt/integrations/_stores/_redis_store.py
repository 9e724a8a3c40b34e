"""The history store of a ``RedisSession``.

A ``RedisSession`` keeps a session's items in a list (``{prefix}:{id}:messages``, one JSON
text per item, appended with ``RPUSH``, popped with ``RPOP``), beside a hash of metadata
(``{prefix}:{id}``) -- the same in openai-agents 0.22.3, 0.23.1 and 0.24.0. Appends, clears
and (0.24) compaction's replacement are ``MULTI`` transactions over both keys; a clear or a
replacement deletes the hash.

**Keys of items.** A list has no row ids. An item's key is a 64-bit digest of its stored
bytes, keyed with a secret of the database (BLAKE2b), so equal keys mean equal items -- and
an index whose items' keys equal the read's items' keys describes them, wherever the bytes
came from. A full read compares every key (``_sync.kept_prefix(monotone=False)``).

**Why a window can be trusted.** A window reads only the items from its first one on
(``LRANGE`` from the end), and checks their keys against the index; the items before it
change only when the list is cut below them and written again. protoprompt keeps a
*generation tag* of the session (key ``{prefix}:{id}:protoprompt:generation``, with the
``created_at`` of the SDK's hash): a new random value before and after every pop, clear or
compaction rewrite through a :class:`ProtoPromptSession`, and a new ``created_at`` when the
SDK clears or replaces the history (or the session expires) and writes it again. A read takes the
tag *before* the items (so its items are never older than its tag) and a window checks it
again *after* its items; a pop that set a new tag before the read and popped after it is
the only one the tag does not cover, and it removed the newest item -- which the window's
check of the index's last item finds. So the reads need no transaction, and they are the
commands the SDK's ``get_items`` uses (``HGET``, ``LRANGE``). An index is
bound to the tag of the read it was synced with (and a snapshot to it too); a window is
read only while the tag is the same. A pop by a process that does not use protoprompt (a
plain ``RedisSession.pop_item`` or ``RPOP``) does not change the tag: it is noticed when it
changed any item the window reads, not when it only changed items before the window that
were then written again -- pop through ``ProtoPromptSession`` (or use windows only where
every worker does). A clear or replacement by such a process deletes the session's hash,
whose ``created_at`` (seconds) is part of the tag: noticed unless the history was written
again within the same second.

**protoprompt's own keys**, under the session's key prefix, used through a client cloned
from the inner session's (same connection class and arguments, on protoprompt's I/O loop):
``{prefix}:protoprompt:meta`` (a hash: the database id and the secret of counts and keys),
``{prefix}:protoprompt:counts`` (a hash of token counts, at most ``max_entries``, random
ones evicted beyond), and per session ``{prefix}:{id}:protoprompt:generation`` (the tag)
and ``{prefix}:{id}:protoprompt:snapshot`` (the index snapshot), both expiring with the
session's list as it was when they were written (a session whose ``ttl`` keeps extending
it gets a new tag, and reads its history once, after each such period). The SDK's own keys
are never written.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import uuid
from array import array
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ... import _process
from ..._seams import redis_client, redis_keys, redis_readable
from ..._storage import redis_record
from ..._storage.counts import RedisCounts
from ...count_store import CountStore
from . import _sync
from ._prefix_state import KIND as PREFIX
from ._prefix_state import PrefixState
from ._servers import Server, shared
from ._snapshots import KIND as SNAPSHOTS
from ._snapshots import Snapshots
from ._snapshots import text_of as _text
from ._store_base import StoreBase, server_errors, unreadable
from ._store_types import StoreReadError, Unsupported, WindowRows
from ._turn_state import KIND as TURN
from ._turn_state import TurnState

T = TypeVar("T")

_log = logging.getLogger("protoprompt")

SKIP = (json.JSONDecodeError, UnicodeDecodeError)
"""What ``RedisSession.get_items`` skips when it decodes an item."""


def _errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import RedisError

    return server_errors(RedisError, UnicodeDecodeError)


def open_store(inner: Any, base: type[Any], session_id: str) -> RedisStore | Unsupported:
    """The store of a ``RedisSession``, or why it has none."""
    why = unreadable(inner, base, redis_readable(inner))
    if why is not None:
        return why
    try:
        from redis.asyncio.cluster import RedisCluster
    except ImportError:  # pragma: no cover - redis without cluster support
        RedisCluster = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(redis_client(inner), RedisCluster):
        return Unsupported("inner_session", "RedisSession over a RedisCluster client")
    client = redis_client(inner)
    if not hasattr(client, "pipeline") or not hasattr(client, "connection_pool"):
        return Unsupported("inner_session", "RedisSession over a client protoprompt cannot read")
    return RedisStore(inner, session_id)


class RedisStore(StoreBase):
    """See the module note."""

    kind = "redis"
    monotone = False

    def __init__(self, inner: Any, session_id: str) -> None:
        super().__init__("not opened yet")
        self._inner = inner
        self._session_id = session_id
        self._client = redis_client(inner)
        self._hash, self._list, self._prefix = redis_keys(inner)
        self._tag_key = f"{self._hash}:protoprompt:generation"
        self._count_store: CountStore | None = None
        # Until the database's secret is known: this process's own (keys then do not match
        # another process's, and nothing is shared).
        self._digest_key = secrets.token_bytes(16)

    # -------------------------------------------------------------- protoprompt's keys

    async def open(self) -> None:
        await self.open_once()

    def _open(self) -> None:
        try:
            server = _server(self._client, self._prefix)
            server.ready()
        except Exception as exc:  # noqa: BLE001 - without our keys the list still works
            _log.debug("protoprompt: no protoprompt keys under %r: %s", self._prefix, exc)
            self.no_store = f"protoprompt's keys could not be used: {exc}"
            return
        assert server.database_id is not None and server.secret is not None
        self._digest_key = hashlib.blake2b(
            b"protoprompt item key", key=server.secret, digest_size=16
        ).digest()
        self.key = (server.database_id, server.location, self._list, self._session_id)
        self.snapshots = Snapshots(
            redis_record(server, SNAPSHOTS, self._list, self._session_id),
            server.database_id,
            tagged=True,
        )
        self.prefixes = PrefixState(
            redis_record(server, PREFIX, self._list, self._session_id), server.database_id
        )
        self.turns = TurnState(
            redis_record(server, TURN, self._list, self._session_id), server.database_id
        )
        self._count_store = server.count_store
        self.no_store = "its database could not be opened for counts"

    def count_store(self, max_open_readers: int) -> CountStore | None:
        return self._count_store

    # -------------------------------------------------------------- the history

    def _rows(self, raw: Sequence[Any], tag: str | None) -> tuple[list[Any], _sync.Rows]:
        """Items as ``RedisSession.get_items`` decodes them, keyed by their digests."""
        key = self._digest_key
        blake2b = hashlib.blake2b
        keyed = []
        for value in raw:
            data = value if isinstance(value, bytes) else str(value).encode("utf-8")
            digest = blake2b(data, digest_size=8, key=key).digest()
            keyed.append((int.from_bytes(digest, "little", signed=True), value))
        items: list[Any] = []
        skipped: list[int] = []
        for p, (_, value) in enumerate(keyed):
            try:
                text = value.decode("utf-8") if isinstance(value, bytes) else value
                items.append(json.loads(text))
            except SKIP:
                skipped.append(p)
        # A list with items that do not decode is compared item by item, never windowed:
        # its positions are not the items' (no tag, so no window is read on its index).
        return items, _sync.Rows(keyed, skipped, tag if not skipped else None)

    async def _command(self, name: str, *args: Any) -> Any:
        """One command on the inner session's client (the commands its ``get_items`` uses,
        so whatever stands in for the client sees the same calls)."""
        try:
            return await getattr(self._client, name)(*args)
        except _errors() as exc:
            raise StoreReadError(str(exc) or type(exc).__name__) from exc

    async def _tag(self) -> str | None:
        """The session's generation tag: protoprompt's random value and the SDK hash's
        ``created_at`` (``None`` without the first)."""
        value = await self._command("get", self._tag_key)
        if value is None:
            return None
        born = _text(await self._command("hget", self._hash, "created_at"))
        return f"{_text(value)}/{born}"

    async def read(self, look: Callable[[_sync.Rows], T]) -> tuple[list[Any], T]:
        # The tag first: a pop through a ProtoPromptSession changes it before it pops, so
        # rows read after the tag are never older than the tag says (see the module note).
        tag = await self._tag()
        if tag is None and await self._command("exists", self._list):
            try:
                await self._new_tag(replace=False)
            except _errors() as exc:  # no tag: the history is read whole, never windowed
                _log.debug("protoprompt: session %r not tagged: %s", self._session_id, exc)
            tag = await self._tag()
        raw = await self._command("lrange", self._list, 0, -1)

        def decode() -> tuple[list[Any], T]:
            items, rows = self._rows(raw, tag)
            return items, look(rows)

        try:
            return await asyncio.to_thread(decode)
        except UnicodeDecodeError as exc:  # pragma: no cover - str clients decode on read
            raise StoreReadError(str(exc)) from exc

    async def _new_tag(self, *, replace: bool) -> None:
        """A new generation tag (``replace=False``: only if there is none) expiring with the
        session's list; none while the list does not exist."""
        client = self._client
        ttl = int(await client.pttl(self._list))
        if ttl == -2:
            await client.delete(self._tag_key)
            return
        if _text(await client.type(self._tag_key)) not in ("none", "string"):
            return  # another session's key (ids that collide): never overwritten
        expires: dict[str, int] = {}
        if ttl > 0:  # the list's own expiry time, as it is now
            expires["pxat"] = int(await client.pexpiretime(self._list))
        await client.set(self._tag_key, uuid.uuid4().hex, nx=not replace, **expires)

    async def read_window(
        self, view: _sync.WindowView, choose: _sync.Chooser
    ) -> WindowRows | _sync.Gone:
        n = view.length
        if view.tag is None or await self._tag() != view.tag:
            return _sync.Gone(
                "rewritten", "the history was popped, cleared or rewritten since the index"
            )
        tail_raw = await self._command("lrange", self._list, n - 1, -1)
        tail_items, tail = await asyncio.to_thread(self._rows, tail_raw, view.tag)
        if not tail_items or tail.rows[0][0] != view.last_id:
            return _sync.Gone("popped", "the index's last item is gone")
        if tail.skipped:
            return _sync.Gone("rewritten", "an item after the index does not decode")
        chosen = await asyncio.to_thread(choose, tail_items[1:], tail)
        if chosen is None:
            return _sync.Gone("", None)
        w = chosen[0]
        window_raw = await self._command("lrange", self._list, w, -1)
        # The tag last: no pop through a ProtoPromptSession began since the index's read.
        if await self._tag() != view.tag:
            return _sync.Gone("changed", "the history was popped while the window was read")
        if len(window_raw) != n - 1 - w + len(tail_raw):
            return _sync.Gone("changed", "items were added or popped while the window was read")
        head_items, head = await asyncio.to_thread(self._rows, window_raw[: n - 1 - w], view.tag)
        rest = [self._key_of(v) for v in window_raw[n - 1 - w :]]
        if head.skipped or rest != [k for k, _ in tail.rows]:
            return _sync.Gone("changed", "the newest items changed while the window was read")
        return head_items, tail_items, tail, array("q", (k for k, _ in head.rows))

    def _key_of(self, value: Any) -> int:
        data = value if isinstance(value, bytes) else str(value).encode("utf-8")
        digest = hashlib.blake2b(data, digest_size=8, key=self._digest_key).digest()
        return int.from_bytes(digest, "little", signed=True)

    async def before_rewrite(self) -> None:
        await self._new_tag(replace=True)

    async def after_rewrite(self) -> None:
        try:
            await self._new_tag(replace=True)
        except _errors() as exc:  # the tag set before the pop already protects the index
            _log.debug("protoprompt: %r not re-tagged after a rewrite: %s", self._session_id, exc)


# ------------------------------------------------------------------ protoprompt's keys


def _clone(client: Any) -> Any:
    """A client of the same server with a pool of its own (for protoprompt's I/O loop),
    answering bytes."""
    from redis.asyncio import Redis

    pool_ = client.connection_pool
    kwargs = dict(pool_.connection_kwargs)
    kwargs["decode_responses"] = False
    new_pool = type(pool_)(connection_class=pool_.connection_class, max_connections=4, **kwargs)
    return Redis(connection_pool=new_pool)


def _location(client: Any) -> str:
    kw = client.connection_pool.connection_kwargs
    if kw.get("path"):
        return f"redis+unix://{kw['path']}/{kw.get('db', 0)}"
    return f"redis://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


class _Server(Server):
    """protoprompt's keys under one key prefix of one Redis database, through a client of
    the I/O loop (see :func:`_clone`)."""

    def __init__(self, client: Any, prefix: str) -> None:
        super().__init__(client, _location(client) + f" {prefix}")
        self.prefix = prefix
        self.meta_key = self.meta_where = f"{prefix}:protoprompt:meta"
        self.counts_key = f"{prefix}:protoprompt:counts"

    client = Server.connection

    def _make(self) -> Any:
        return _clone(self._source)

    def _counts(self) -> Any:
        return RedisCounts(self)

    async def _meta(self) -> tuple[str | None, str | None]:
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.hsetnx(self.meta_key, "database_id", uuid.uuid4().hex)
            pipe.hsetnx(self.meta_key, "count_secret", secrets.token_hex(16))
            pipe.hmget(self.meta_key, ["database_id", "count_secret"])
            found = list(await pipe.execute())[-1]
        return _text(found[0]), _text(found[1])


def _server(client: Any, prefix: str) -> _Server:
    pool_ = client.connection_pool
    kwargs = sorted(pool_.connection_kwargs.items(), key=lambda kv: kv[0])
    key = (type(pool_).__qualname__, pool_.connection_class.__qualname__, repr(kwargs), prefix)
    return shared(_process.REDIS_SERVERS, key, _Server, client, prefix)
