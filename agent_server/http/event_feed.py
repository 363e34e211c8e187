"""An execution's live events for a protocol front (A2A, MCP): the reading path of the SSE
stream (`sse.source_of`, the store's `events_since` through it), taken in batches a front
translates to its own messages (docs/protocols.md).

A feed starts at a cursor (0: every event kept, the replay a new subscriber gets, as SSE's
`Last-Event-ID` gives) and moves past what it hands out. Events of one execution are all
written before its end (and before an ask), so a front that has seen the end (or the ask)
takes once more and has every event before it. An execution that leaves this replica (a
hand-off) is read on from the shared store, where its next owner writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent_server.http.sse import REMOTE_REREAD, EventSource, RemoteEvents, source_of
from agent_server.model.events import Event
from agent_server.model.execution import Execution
from agent_server.model.waiting import Wakeup
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import ExecutionStore

#: Events a feed hands out in one batch at most (a replay of `--max-events` comes in pieces).
BATCH = 500


class EventFeed:
    """One reader's cursor on one execution's events, wherever they are kept."""

    __slots__ = ("cursor", "execution", "missed", "source", "store")

    def __init__(
        self,
        registry: InFlightRegistry,
        store: ExecutionStore,
        execution: Execution,
        cursor: int = 0,
    ) -> None:
        self.store = store
        self.execution = execution
        self.source: EventSource = source_of(registry, store, execution)
        #: The number of the last event handed out.
        self.cursor = cursor
        #: Events no longer kept when this feed came to them (past `--max-events`).
        self.missed = 0

    async def take(self) -> list[Event]:
        """The events kept after the cursor, up to BATCH (empty: none now); the cursor moves
        past them. A source this replica no longer writes to (a hand-off) gives way to the
        shared store, once what it holds is read."""
        taken: list[Event] = []
        while len(taken) < BATCH:
            missed, events = await self.source.read(self.cursor)
            self.missed += missed
            if events:
                taken.extend(events)
                self.cursor = events[-1].id
                continue
            if self.source.moved:
                self.source = RemoteEvents(self.store, self.execution)
                continue
            break
        return taken

    def listen(self, waiter: asyncio.Future[None]) -> None:
        """`waiter` is done at the next event or end (or may be: a notice on a shared store
        can be missed, so a waiter looks again within `reread`)."""
        self.source.listen(waiter)

    def unlisten(self, waiter: asyncio.Future[None]) -> None:
        self.source.unlisten(waiter)

    @property
    def reread(self) -> float:
        """The longest a reader waits for a notice before it looks again."""
        return self.source.reread or REMOTE_REREAD


async def relay(
    feed: EventFeed,
    deliver: Callable[[list[Event]], Awaitable[None]],
    until: asyncio.Future[Any],
) -> None:
    """Hand each batch of events to `deliver` as they come, in order, until `until` is done;
    then the rest (every event written before the end `until` stands for)."""
    loop = asyncio.get_running_loop()
    while True:
        events = await feed.take()
        if events:
            await deliver(events)
            continue
        if until.done():
            return
        waiter = Wakeup(loop=loop)
        feed.listen(waiter)
        until.add_done_callback(waiter)
        try:
            await asyncio.wait({waiter}, timeout=feed.reread)
        finally:
            until.remove_done_callback(waiter)
            feed.unlisten(waiter)
