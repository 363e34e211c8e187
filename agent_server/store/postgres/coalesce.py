"""Calls of one kind answered together: while `in_flight` statements of that kind run, the
calls that arrive wait and the next statement answers all of them.

Alone, a call is its own statement at once (no added wait); under load, one statement (one
send, one plan, one round trip) serves many callers. A replica on Postgres is bound by its
own CPU per statement (bench/RESULTS.md, "PG7"), most of it psycopg's and the kernel's work
for each send, so the reads of `GET ?wait` and the plain creates of `POST .../async` go
through one of these.

A call that finds a statement free runs its own, in its own task, as it would with no
batcher. Calls that wait each wait on a future of their own, answered by a statement in a
task the batcher owns (`close` awaits it): a caller cancelled (a client gone) leaves that
statement and the other callers alone. A statement's failure is each of its callers'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")

#: Statements of one kind running at once before calls wait for the next.
IN_FLIGHT = 2
#: Calls one statement answers at most.
MOST = 500


class Coalesced(Generic[K, V]):
    """`await batch(key)`: the value `run` gives for `key`, in a statement shared with the
    calls that arrived while earlier ones ran. `run(keys)` answers each key, in order."""

    def __init__(
        self,
        run: Callable[[list[K]], Awaitable[Sequence[V]]],
        *,
        in_flight: int = IN_FLIGHT,
        most: int = MOST,
    ) -> None:
        self._run = run
        self._in_flight = in_flight
        self._most = most
        self._busy = 0
        self._waiting: list[tuple[K, asyncio.Future[V]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, key: K) -> V:
        if self._busy < self._in_flight and not self._waiting:
            # Alone: its own statement, in its own task, at once (as with no batcher).
            self._busy += 1
            try:
                (value,) = await self._run([key])
                return value
            finally:
                self._busy -= 1
                self._next()
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._waiting.append((key, future))
        return await future

    def _next(self) -> None:
        """Send the calls waiting (up to `most`) as one statement, in a task of its own, if
        a statement may start."""
        while self._waiting and self._busy < self._in_flight:
            batch = [(key, future) for key, future in self._waiting[: self._most]]
            del self._waiting[: self._most]
            batch = [(key, future) for key, future in batch if not future.done()]
            if not batch:
                continue
            self._busy += 1
            task = asyncio.get_running_loop().create_task(self._answer(batch))
            self._tasks.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._busy -= 1
        self._next()

    async def _answer(self, batch: list[tuple[K, asyncio.Future[V]]]) -> None:
        try:
            values = await self._run([key for key, _ in batch])
        except BaseException as exc:  # each caller's: it raises in every one of them
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        for (_, future), value in zip(batch, values, strict=True):
            if not future.done():
                future.set_result(value)

    async def close(self) -> None:
        """Wait for the statements its tasks run (each bounded by the link's command
        timeout); a call run alone is its caller's."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
