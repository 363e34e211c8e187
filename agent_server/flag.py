"""A flag: `asyncio.Event`'s interface in a fraction of its memory.

uvicorn gives every connection two events (its flow control's "writable" and its request
cycle's "message"), each with a deque of waiters made up front: about 1.2 KiB of a held
connection's 9, for waiters that are at most one task. This one keeps its waiters in a list
made on first wait.
"""

from __future__ import annotations

import asyncio
from typing import Literal


class Flag:
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
