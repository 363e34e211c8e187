"""What the server waits on without a task of its own: flags, latches and futures shared.

An idle event stream, a held connection and a waiting client are what a server holds by the
thousand, so each waits on a future that is completed for it, never on a task or a timer of
its own.
"""

from __future__ import annotations

import asyncio
from typing import Literal


class Flag:
    """`asyncio.Event`'s interface in a fraction of its memory: uvicorn gives every
    connection two events, each with a deque of waiters made up front; this one keeps its
    waiters in a list made on first wait (bench/RESULTS.md, "Where the 5.5 KB went")."""

    __slots__ = ("_set", "_waiters")

    def __init__(self, value: bool = False) -> None:
        self._set = value
        self._waiters: list[asyncio.Future[None]] | None = None

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            if not waiter.done():
                waiter.set_result(None)

    def clear(self) -> None:
        self._set = False

    async def wait(self) -> Literal[True]:
        if self._set:
            return True
        waiter = asyncio.get_running_loop().create_future()
        if self._waiters is None:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
        return True


class Latch:
    """Set once, and awaited through one future made on first use: many waiters (every open
    event stream, a sync run watching its client) wait without a task each, and one that
    never waits costs no future."""

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        return self._set

    def future(self) -> asyncio.Future[None]:
        """Done once set (at once if it already is)."""
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self._set:
                self._future.set_result(None)
        return self._future


class Waiters(set["asyncio.Future[None]"]):
    """Futures completed together: every stream waiting on one thing (an execution's next
    event, the listener's close, a tick). A set, so a stream woken by something else leaves
    the others in O(1), where a future's callback list is copied at every removal."""

    __slots__ = ()

    def wake(self) -> None:
        for waiter in self:
            if not waiter.done():
                waiter.set_result(None)
        self.clear()


class Closing:
    """Set once, when the listener closes: every open stream then ends with a retry hint."""

    __slots__ = ("_set", "waiters")

    def __init__(self) -> None:
        self._set = False
        self.waiters = Waiters()

    def set(self) -> None:
        self._set = True
        self.waiters.wake()

    def is_set(self) -> bool:
        return self._set


class Wakeup(asyncio.Future[None]):
    """A future that is also the callback completing it: one object where a stream waits
    on several things, not a future and a closure."""

    __slots__ = ()

    def __call__(self, _: object) -> None:
        if not self.done():
            self.set_result(None)


async def recorded_within(
    future: asyncio.Future[bool] | None, timeout: float, closing: Closing | None = None
) -> bool:
    """Whether `future` (an execution's `recorded`: its end written, or refused) came true
    within `timeout` seconds and before `closing` was set. One future woken by the end, the
    timer or the close: no task, no asyncio.wait. The shared stores' `recorded`."""
    if future is None:
        return False
    if not future.done() and not (closing is not None and closing.is_set()):
        waiter = Wakeup(loop=asyncio.get_running_loop())
        timer = waiter.get_loop().call_later(timeout, waiter, None)
        future.add_done_callback(waiter)
        if closing is not None:
            closing.waiters.add(waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            future.remove_done_callback(waiter)
            if closing is not None:
                closing.waiters.discard(waiter)
    return future.done() and bool(future.result())
