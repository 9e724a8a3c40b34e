"""What the PostgreSQL and Redis stores share of a server: protoprompt's connection of its
own on the I/O loop (made again in a forked child), the database's id and count secret
read once, its count store, one server per location and process."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ... import _process
from ...count_store import RemoteCountStore
from ._io import io_loop

__all__ = ["TIMEOUT", "Server", "shared"]

S = TypeVar("S", bound="Server")

TIMEOUT = 5.0
"""Seconds protoprompt's own statements and commands may take."""


class Server:
    """protoprompt's state in one database. A subclass makes the connection
    (:meth:`_make`), reads or creates the id and secret (:meth:`_meta`) and gives the count
    store's backend (:meth:`_counts`)."""

    meta_where = "protoprompt_meta"

    def __init__(self, source: Any, location: str) -> None:
        self._source = source
        self._connection: Any = None
        self._generation = -1
        self._inherited: list[Any] = []
        self._make_lock = threading.Lock()
        self.location = location
        self.database_id: str | None = None
        self.secret: bytes | None = None
        self.count_store: RemoteCountStore | None = None
        self._lock = threading.Lock()

    def _make(self) -> Any:
        raise NotImplementedError

    async def _meta(self) -> tuple[str | None, str | None]:
        raise NotImplementedError

    def _counts(self) -> Any:
        raise NotImplementedError

    @property
    def connection(self) -> Any:
        """A connection (engine, client) of protoprompt's I/O loop, made again in a forked
        child (whose parent's connections are left alone)."""
        generation = io_loop().generation
        with self._make_lock:
            if self._connection is None or self._generation != generation:
                if self._connection is not None:
                    self._inherited.append(self._connection)
                self._connection = self._make()
                self._generation = generation
            return self._connection

    def run(self, make: Callable[[], Any]) -> Any:
        return io_loop().run(make, TIMEOUT)

    def ready(self) -> None:
        """Create protoprompt's tables or keys if missing; read the database's id and count
        secret (raises when they cannot be used)."""
        with self._lock:
            if self.database_id is not None:
                return
            db_id, secret_hex = self.run(self._meta)
            try:
                secret = bytes.fromhex(secret_hex or "")
            except ValueError:
                secret = b""
            if not db_id or len(secret) != 16:
                raise ValueError(f"{self.meta_where} holds no database id or count secret")
            self.secret = secret
            self.count_store = RemoteCountStore(self._counts(), secret, io_loop(), self.location)
            self.database_id = db_id

    def after_fork(self) -> None:
        """A lock held at the fork belonged to a thread that is gone: new ones."""
        self._lock = threading.Lock()
        self._make_lock = threading.Lock()


def shared(registry: _process.Registry[Any, Any], key: Any, make: type[S], *args: Any) -> S:
    """The process's one server of ``key`` in ``registry`` (made as ``make(*args)``)."""
    with registry.lock:
        server: S | None = registry.items.get(key)
        if server is None:
            server = registry.items[key] = make(*args)
        return server


for _registry in (_process.SQL_SERVERS, _process.REDIS_SERVERS):
    _registry.handle(after_fork=Server.after_fork)
