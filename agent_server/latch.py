"""A latch: set once, and awaited through one future made on first use.

Many waiters (every open event stream, a sync run watching its client) wait on it without
a task each, and one that never waits costs no future.
"""

from __future__ import annotations

import asyncio


class Latch:
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
