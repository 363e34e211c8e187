"""Who waits on what on this replica: waiters on an execution's end (or its request for
input), readers of its events, and the queue taker; a part of `PostgresStore`, which the
notices (`LISTEN`), the bounded poll and the outbox's writes wake (store.py, owner.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from agent_server.model.execution import Execution
from agent_server.store.base import StoreUnavailable
from agent_server.store.postgres import codec

#: The bound of the poll that stands in for a lost (or absent) notice.
POLL_SECONDS = 1.0
#: Executions that moved lately, remembered for a waiter that registers just after.
RECENT_MOVES = 10_000


class Notices:
    """The waiters of this replica, and what wakes them."""

    def __init__(self) -> None:
        #: Waiters on this replica: execution id -> futures woken by its notices.
        #: Each waiter is given the record when this process wrote its end (its own copy,
        #: as written: no read needed), else None (a notice or the poll: read it).
        self.waiters: dict[str, set[asyncio.Future[Execution | None]]] = {}
        #: The last RECENT_MOVES executions that moved, each with its record's document
        #: when this process wrote its end (`moved`).
        self._recent_moves: OrderedDict[str, str | None] = OrderedDict()
        self._event_waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: Set when work may be queued: the queue taker looks.
        self.queued = asyncio.Event()

    def wake(self, execution_id: str, written: Execution | None = None) -> None:
        for waiter in self.waiters.get(execution_id, ()):
            if not waiter.done():
                waiter.set_result(written)

    def moved(self, execution_id: str, doc: str | None = None) -> None:
        """The execution moved (a notice, or an end this process wrote, its `doc` given):
        its waiters are woken (with the record as written, decoded once for them all), and
        one that registers just after (its read was before the move) finds it among the
        last RECENT_MOVES."""
        recent = self._recent_moves
        recent[execution_id] = doc
        recent.move_to_end(execution_id)
        if len(recent) > RECENT_MOVES:
            recent.popitem(last=False)
        if execution_id in self.waiters:
            self.wake(execution_id, None if doc is None else codec.decode(doc))

    def wake_events(self, execution_id: str) -> None:
        for waiter in self._event_waiters.pop(execution_id, ()):
            if not waiter.done():
                waiter.set_result(None)

    def poll(self) -> None:
        """The bounded poll: every waiter reads again (a lost notice costs one interval)."""
        for execution_id in list(self.waiters):
            self.wake(execution_id)
        for execution_id in list(self._event_waiters):
            self.wake_events(execution_id)

    def wake_all(self) -> None:
        """The store closes: every waiter reads (and finds it closed)."""
        for execution_id in list(self.waiters):
            self.wake(execution_id)
        for event_waiters in self._event_waiters.values():
            for waiter in event_waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait(
        self,
        execution: Execution,
        timeout: float | None,
        asked: bool,
        get: Callable[[str], Awaitable[Execution | None]],
    ) -> Execution:
        """Read (`get`), then wait for a notice (or the poll) and read again, until it
        reached its end (with `asked`, or waits for input) or `timeout` passed. An end this
        process wrote wakes its waiters with the record as written: no read."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        current, first = execution, True
        while True:
            # Registered before the read: a notice that comes while it reads is not lost.
            waiter: asyncio.Future[Execution | None] = loop.create_future()
            waiters = self.waiters.setdefault(execution.execution_id, set())
            waiters.add(waiter)
            try:
                if first and execution.execution_id in self._recent_moves:
                    # It moved since the caller's read, perhaps: the end as this process
                    # wrote it, else a read.
                    doc = self._recent_moves[execution.execution_id]
                    written = None if doc is None else codec.decode(doc)
                    if written is not None and written.reached_end(asked):
                        return written
                    first = False
                if not first:
                    with contextlib.suppress(StoreUnavailable):
                        found = await get(execution.execution_id)
                        if found is None:
                            return current
                        current = found
                first = False
                if current.reached_end(asked):
                    return current
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return current
                bound = POLL_SECONDS if remaining is None else min(POLL_SECONDS, remaining)
                with contextlib.suppress(TimeoutError):
                    written = await asyncio.wait_for(asyncio.shield(waiter), bound)
                    if written is not None and written.reached_end(asked):
                        return written
            finally:
                waiters.discard(waiter)
                if not waiters:
                    self.waiters.pop(execution.execution_id, None)

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._event_waiters.setdefault(execution_id, set()).add(waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._event_waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._event_waiters[execution_id]
