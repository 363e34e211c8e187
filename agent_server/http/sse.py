"""The Server-Sent Events stream of one execution's events (`GET /executions/{id}/events`).

It replays what was kept after `Last-Event-ID` (or `?after=N`), then streams live, sends a
comment heartbeat every `--sse-heartbeat` seconds, and ends with `event: end` whose data is
the execution JSON. A reader that falls behind by more than the log keeps is told, with a
`missed` event, how many it lost. When the listener closes at shutdown, open streams end
with a `retry:` hint, so EventSource clients reconnect (to another replica) with their
`Last-Event-ID`.

The response is written here rather than with sse-starlette: that library patches uvicorn's
`Server.handle_exit` for the whole process at import and polls for shutdown from a task of
its own, where this server ends its streams from its shutdown sequence.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, Protocol

from starlette.types import Message, Receive, Scope, Send

from agent_server.http.http_limits import client_gone
from agent_server.model import jsoncodec
from agent_server.model.events import Event
from agent_server.model.execution import Execution
from agent_server.model.waiting import Closing, Waiters, Wakeup
from agent_server.runtime.registry import InFlightRegistry
from agent_server.service.waits import recorded_before_close
from agent_server.store.base import ExecutionStore
from agent_server.store.roles import Events, Reads

#: Bytes of encoded events a stream writes at once (a replay leaves in writes this size).
REPLAY_CHUNK = 256 * 1024
#: The hint sent to EventSource clients as streams end at shutdown (milliseconds).
RETRY_MS = 1000
#: Events read from the store per round trip by a reader on another replica.
REMOTE_BATCH = 500
#: A reader of an execution run elsewhere re-reads at least this often (a missed notice).
REMOTE_REREAD = 1.0
#: The spacing of the ticks waiting streams share (at most: a quarter of the heartbeat).
TICK = 0.1


def comment(text: str) -> bytes:
    return b": %s\n\n" % text.encode()


def named(event: str, data: Any) -> bytes:
    """An event outside the numbering (start, missed, end): no `id:`, so a client's
    Last-Event-ID stays the number of the last real event."""
    return b"event: %s\ndata: %s\n\n" % (event.encode(), jsoncodec.dumps(data))


class Ticks:
    """The timers of waiting streams, shared: a stream that waits until `deadline` joins
    the waiters of the first tick at or after it. One timer a tick (at most one every
    `resolution` seconds) instead of one a stream (bench/RESULTS.md), so a
    heartbeat may come up to `resolution` late."""

    __slots__ = ("_loop", "_ticks", "resolution")

    def __init__(self, resolution: float) -> None:
        self.resolution = resolution
        self._ticks: dict[int, Waiters] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def at(self, loop: asyncio.AbstractEventLoop, deadline: float) -> Waiters:
        """The tick for `deadline` on `loop` (given: looking the running loop up costs a
        system call, getpid, in every wait)."""
        if loop is not self._loop:  # a tick of another loop would never fire here
            self._loop, self._ticks = loop, {}
        slot = math.ceil(deadline / self.resolution)
        tick = self._ticks.get(slot)
        if tick is None:
            tick = self._ticks[slot] = Waiters()
            loop.call_at(slot * self.resolution, self._fire, slot)
        return tick

    def _fire(self, slot: int) -> None:
        tick = self._ticks.pop(slot, None)
        if tick is not None:
            tick.wake()


class Streams:
    """What every event stream of one app shares: the heartbeat period, the listener's
    close, the ticks they wait on, and the open-streams gauge."""

    __slots__ = ("closing", "heartbeat", "opened", "ticks")

    def __init__(self, heartbeat: float, closing: Closing, opened: Callable[[int], None]) -> None:
        self.heartbeat = heartbeat
        self.closing = closing
        self.ticks = Ticks(min(TICK, heartbeat / 4))
        self.opened = opened


class EventSource:
    """Where a stream reads one execution's events: its live log when this process runs
    it (or, with the memory store, ran it), else the shared store."""

    __slots__ = ()

    #: The longest a stream waits between two looks at the source, notice or not.
    reread: float | None = None

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        raise NotImplementedError

    async def latest(self) -> Execution | None:
        """The execution as it is now; None once it is gone (forgotten, released or expired
        on another replica): the stream then ends."""
        raise NotImplementedError

    def listen(self, waiter: asyncio.Future[None]) -> None:
        """`waiter` is done at the next event or end (a future the stream awaits: no task)."""
        raise NotImplementedError

    def unlisten(self, waiter: asyncio.Future[None]) -> None:
        """The stream no longer waits on `waiter`."""
        raise NotImplementedError

    async def recorded(self, execution: Execution, closing: Closing) -> bool:
        """Whether its end may be told: it is in the store every replica reads (False
        once the listener closes first)."""
        return True

    @property
    def moved(self) -> bool:
        """Whether the execution's next events will be written somewhere this source does
        not read (it left this replica): the stream ends with a retry hint, and the
        client's reconnection (with its `Last-Event-ID`) reads them from the store."""
        return False


class LocalEvents(EventSource):
    __slots__ = ("execution", "log", "store")

    def __init__(self, execution: Execution, store: ExecutionStore | None = None) -> None:
        self.execution = execution
        self.log = execution.event_log()
        #: The shared store this process writes the execution's end to, if any.
        self.store = store

    async def recorded(self, execution: Execution, closing: Closing) -> bool:
        if self.store is None:
            return True
        return await recorded_before_close(self.store, execution, closing)

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        return self.log.since(cursor)

    async def latest(self) -> Execution | None:
        return self.execution

    def listen(self, waiter: asyncio.Future[None]) -> None:
        self.log.listen(waiter)

    def unlisten(self, waiter: asyncio.Future[None]) -> None:
        self.log.unlisten(waiter)

    @property
    def moved(self) -> bool:
        """Handed off or parked: its next attempt runs on whichever replica takes it."""
        return self.store is not None and self.execution.owned_by_nobody


class EventStore(Events, Reads, Protocol):
    """What a remote execution's events are read through: the events the store keeps and
    their notices, and the record (`get`)."""


class RemoteEvents(EventSource):
    """An execution run on another replica (or ended there): its events from the store."""

    __slots__ = ("execution", "store")

    reread = REMOTE_REREAD

    def __init__(self, store: EventStore, execution: Execution) -> None:
        self.store = store
        self.execution = execution

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        return await self.store.events_since(self.execution.execution_id, cursor, REMOTE_BATCH)

    async def latest(self) -> Execution | None:
        found = await self.store.get(self.execution.execution_id)
        if found is not None:
            self.execution = found
        return found

    def listen(self, waiter: asyncio.Future[None]) -> None:
        self.store.event_notice(self.execution.execution_id, waiter)

    def unlisten(self, waiter: asyncio.Future[None]) -> None:
        self.store.drop_notice(self.execution.execution_id, waiter)


def source_of(
    registry: InFlightRegistry, store: ExecutionStore, execution: Execution
) -> EventSource:
    """Where an execution's events are read, for every front that carries them (SSE, A2A,
    MCP): this process's log when it runs the execution (or, with the memory store, ran
    it); else the shared store."""
    live = registry.running(execution.execution_id)
    if live is not None:
        return LocalEvents(live, store if store.shared else None)
    if not store.shared:
        return LocalEvents(execution)
    return RemoteEvents(store, execution)


async def _send_events(send: Send, events: list[Event]) -> None:
    """Events in writes of about REPLAY_CHUNK bytes: each `send` waits while the client's
    connection is paused (uvicorn's flow control), so a reader that replays a thousand big
    events, or never reads, holds a chunk, not the whole replay encoded at once."""
    chunk: list[bytes] = []
    size = 0
    for event in events:
        encoded = event.encode()
        chunk.append(encoded)
        size += len(encoded)
        if size >= REPLAY_CHUNK:
            await send(_body(b"".join(chunk)))
            chunk, size = [], 0
    if chunk:
        await send(_body(b"".join(chunk)))


def _body(chunk: bytes) -> Message:
    return {"type": "http.response.body", "body": chunk, "more_body": True}


class EventStream:
    """A `text/event-stream` response: `first` (a start event), replay after `cursor`, live
    events, a heartbeat after `heartbeat` quiet seconds, and `end`; or a retry hint when
    the listener closes. Ends quietly once the client has gone.

    An idle stream is what a server holds by the thousand, so it is lean: it runs in its
    request's task as one frame (no generator under it), and waits on one future that its
    source, the listener's close, a shared tick and the client's departure complete, with
    no task or timer of its own (under another ASGI server, one task reads the client's
    disconnect). The execution's state is read only when no event is left to send: its
    events are all written before its end, so one more read after seeing the end sends
    the last of them.
    """

    __slots__ = ("cursor", "first", "source", "streams")

    def __init__(
        self, streams: Streams, source: EventSource, cursor: int, first: bytes | None = None
    ) -> None:
        self.streams = streams
        self.source = source
        self.cursor = cursor
        self.first = first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                ],
            }
        )
        streams, source, cursor = self.streams, self.source, self.cursor
        streams.opened(1)
        gone, reader = client_gone(scope, receive)
        loop = asyncio.get_running_loop()
        ended: Execution | None = None
        try:
            if self.first is not None:
                await send(_body(self.first))
            sent = loop.time()
            while not gone.done():
                missed, events = await source.read(cursor)
                if missed:
                    await send(_body(named("missed", {"missed": missed, "after": cursor})))
                if events:  # few writes for a batch (a batch may be capped: read again)
                    await _send_events(send, events)
                    cursor = events[-1].id
                    sent = loop.time()
                    continue
                if ended is not None:
                    if await source.recorded(ended, streams.closing):
                        await send(_body(named("end", ended.to_json())))
                    else:  # not a verdict the store may contradict: read it there
                        await send(_body(b"retry: %d\n\n" % RETRY_MS))
                    break
                execution = await source.latest()
                if execution is None:  # gone: nothing more will ever come
                    break
                if execution.is_terminal:
                    ended = execution  # one more read: events written before the end
                    continue
                if streams.closing.is_set() or source.moved:
                    await send(_body(b"retry: %d\n\n" % RETRY_MS))
                    break
                now = loop.time()
                if now - sent >= streams.heartbeat:
                    await send(_body(comment("heartbeat")))
                    sent = now
                    continue
                deadline = sent + streams.heartbeat
                if source.reread is not None:
                    deadline = min(deadline, now + source.reread)
                wakeup = Wakeup(loop=loop)
                tick = streams.ticks.at(loop, deadline)
                tick.add(wakeup)
                streams.closing.waiters.add(wakeup)
                source.listen(wakeup)
                gone.add_done_callback(wakeup)
                try:
                    await wakeup
                finally:
                    gone.remove_done_callback(wakeup)
                    source.unlisten(wakeup)
                    streams.closing.waiters.discard(wakeup)
                    tick.discard(wakeup)
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-send: nobody to answer
        finally:
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            streams.opened(-1)
