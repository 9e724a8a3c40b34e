"""The process's background event loop for protoprompt's own state on async engines.

A session over ``SQLAlchemySession`` (PostgreSQL) or ``RedisSession`` keeps its index
snapshots, token counts and database id beside the history, in the same engine. Those are
read and written from threads that must block for the answer -- the core asks the count
store while it packs (in a worker thread), a snapshot is written in the background and on
``close()`` -- and an async driver's connections belong to one event loop. So protoprompt
runs that I/O on an event loop of its own, in one daemon thread per process, with its own
connections (cloned from the inner session's engine or client, see the stores). The user's
loop is never blocked by it, nor needed by it: a snapshot is written also after the user's
loop has ended, and ``close()`` may wait for it from inside a coroutine.

The history itself is always read through the inner session's own engine or client, on the
caller's loop (see the stores): the rows a turn packs are the rows the SDK would read.

A forked child gets a new loop (threads do not survive a fork); the parent's connections,
made on the parent's loop, are left alone (the stores open their own again in the child).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ... import _process

__all__ = ["IOLoop", "io_loop"]

T = TypeVar("T")


class IOLoop:
    """One event loop in a daemon thread, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.generation = 0
        """Bumped when a forked child starts over: objects made on an earlier loop (engines,
        clients) are not used on this one."""

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._thread is None or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                thread = threading.Thread(target=run, name="protoprompt-io", daemon=True)
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
            return self._loop

    def in_loop_thread(self) -> bool:
        return self._thread is threading.current_thread()

    def run(self, make: Callable[[], Awaitable[T]], timeout: float) -> T:
        """Run ``make()`` on the loop and wait for it (at most ``timeout`` seconds: then it
        is cancelled and ``TimeoutError`` raised). Not from the loop's own thread."""
        if self.in_loop_thread():
            raise RuntimeError("protoprompt's I/O loop cannot wait for itself")
        future = self.submit(make)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def submit(self, make: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Start ``make()`` on the loop; its future."""

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop())

    async def run_async(self, make: Callable[[], Awaitable[T]], timeout: float) -> T:
        """``run`` for a coroutine on another loop: awaits the answer without blocking."""
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self.submit(make)), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"no answer within {timeout:g} s") from None

    def after_fork_in_child(self) -> None:
        """The parent's loop thread is not in this process: a new one starts when needed."""
        self._lock = threading.Lock()
        self._loop = None  # the parent's: its thread is not in this process
        self._thread = None
        self.generation += 1


_IO = IOLoop()
_process.IO_LOOPS.add(_IO)
_process.IO_LOOPS.handle(after_fork=IOLoop.after_fork_in_child)


def io_loop() -> IOLoop:
    """The process's I/O loop."""
    return _IO
