"""Waiting for an execution on a caller's behalf: until it ends, waits for input or is handed
off, the caller leaves, or the listener closes (the shutdown's point for answering). One
implementation of what a waiter gets at shutdown, for every front.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.waiting import Closing
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import ExecutionStore

T = TypeVar("T")

#: Seconds an end this replica reached may take to be written to a shared store before a
#: caller is told it (else it is sent to read the record).
RECORD_WAIT = 5.0


class Until(enum.Enum):
    """How a wait ended."""

    #: The execution ended, waits for input, or was handed off (`Waited.execution`).
    REACHED = "reached"
    #: The listener closed first (shutdown): the caller is sent to read it elsewhere.
    CLOSED = "closed"
    #: The caller left first.
    GONE = "gone"


class Waited:
    """What a wait ended with: how, and the execution as it was reached (else None)."""

    __slots__ = ("execution", "until")

    def __init__(self, until: Until, execution: Execution | None = None) -> None:
        self.until = until
        self.execution = execution


def retried(execution: Execution) -> bool:
    """Queued for its next attempt through a shared store: whichever replica takes it runs
    it, so a caller follows the record there."""
    return execution.status is ExecutionStatus.QUEUED and execution.scheduled_at is not None


class Waits:
    """Waits on executions for callers, given the registry, the store and the close."""

    def __init__(self, registry: InFlightRegistry, store: ExecutionStore, closing: Closing) -> None:
        self.registry = registry
        self.store = store
        #: Set when the listener closes (shutdown): every wait ends then.
        self.closing = closing

    async def until_reached(
        self,
        execution: Execution,
        leaving: Callable[[], asyncio.Future[Any]] | None = None,
    ) -> Waited:
        """The execution once it ends, waits for input or is handed off; else how the wait
        ended first: the listener's close, or the caller leaving (the future `leaving` makes,
        asked only when there is something to wait for). Work this replica runs is waited
        for here; other work (a repeat of an idempotent request, a retry) through the
        store."""
        await asyncio.sleep(0)  # a reasoner that never suspends ends in its task's first step
        if execution.reached(asked=True) and not retried(execution):  # no watcher tasks
            return Waited(Until.REACHED, execution)
        gone = None if leaving is None else leaving()
        also = () if gone is None else (gone,)
        ended = await self.before_close(self.until_end(execution), *also)
        if ended.done() and not ended.cancelled() and ended.exception() is None:
            return Waited(Until.REACHED, ended.result())
        if gone is not None and gone.done():
            return Waited(Until.GONE)
        return Waited(Until.CLOSED)

    async def before_close(
        self, work: Coroutine[Any, Any, T], *also: asyncio.Future[Any]
    ) -> asyncio.Future[T]:
        """`work` run until it is done, the listener closes (the shutdown's point for
        answering), or one of `also` is done (the caller gone, an event come); then
        cancelled if it was not done, and awaited. Its future: done with its result, or
        cancelled (cut short). Every front's wait at shutdown is this one."""
        step = asyncio.ensure_future(work)
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closing.waiters.add(closed)
        if self.closing.is_set():
            closed.set_result(None)
        watched: set[asyncio.Future[Any]] = {step, closed, *also}
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.closing.waiters.discard(closed)
            if not step.done():
                step.cancel()
            await asyncio.gather(step, return_exceptions=True)
        return step

    async def until_end(self, execution: Execution) -> Execution:
        """The live execution this replica runs, until it ends (or waits for input, or is
        handed off); one retried through a shared store is followed there (whichever
        replica takes its next attempt)."""
        if self.registry.running(execution.execution_id) is execution:
            await execution.wait(None, asked=True)
            if not retried(execution):
                return execution
        return await self.store.wait(execution, None, asked=True)

    async def recorded(self, execution: Execution) -> bool:
        """Whether this replica's end of `execution` is in the store, waited for within
        RECORD_WAIT and no later than the listener's close: the shutdown's point for
        answering every open response, before uvicorn's graceful-shutdown timeout cancels
        it. Past it, an end still owed (a paused Redis) is not told: the caller is sent to
        read it. A copy read from the store, or an end the memory store holds, is."""
        return await recorded_before_close(self.store, execution, self.closing)

    async def as_told(self, execution: Execution) -> Execution:
        """An end this replica reached is told once the store holds it; until then the
        execution as the store says (the caller reads it again)."""
        if execution.is_terminal and not await self.recorded(execution):
            return await self.store.get(execution.execution_id) or execution
        return execution


async def recorded_before_close(
    store: ExecutionStore, execution: Execution, closing: Closing
) -> bool:
    """`Waits.recorded`, for a part that holds no `Waits` (an event stream's end)."""
    future = execution.recorded
    if future is None or future.done():
        return future is None or await store.recorded(execution, 0.0)
    if closing.is_set():
        return False
    # The store's wait ends at the close too: no task of its own to race against it.
    return await store.recorded(execution, RECORD_WAIT, closing)
