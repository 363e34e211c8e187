"""Live execution events and their Server-Sent Events stream.

A reasoner with a context calls `await ctx.emit(data, event="progress")`. Events of one
execution are numbered 1, 2, 3...; the last `--max-events` are kept in its `EventLog` for
replay. Emitting appends to that log and wakes the readers through one shared future: it
never waits for a reader, and a reader costs the log nothing but its own cursor. A reader
that falls behind by more than the log keeps is told, with a `missed` event, how many it
lost. With a shared store the owner also writes each event to Redis (a capped stream per
execution, through the same ordered outbox as its end), so a reader on any replica can
replay and follow it.

`GET /executions/{id}/events` replays what was kept after `Last-Event-ID` (or `?after=N`),
then streams live, sends a comment heartbeat every `--sse-heartbeat` seconds, and ends with
`event: end` whose data is the execution JSON. When the listener closes at shutdown, open
streams end with a `retry:` hint, so EventSource clients reconnect (to another replica)
with their `Last-Event-ID`.

The response is written here rather than with sse-starlette: that library patches uvicorn's
`Server.handle_exit` for the whole process at import and polls for shutdown from a task of
its own, where this server ends its streams from its shutdown sequence.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from agent_server import jsoncodec
from agent_server.http_limits import client_gone
from agent_server.latch import Latch

if TYPE_CHECKING:
    from agent_server.execution import Execution
    from agent_server.store.base import ExecutionStore

logger = logging.getLogger("agent_server.events")

#: The hint sent to EventSource clients as streams end at shutdown (milliseconds).
RETRY_MS = 1000
#: Events read from the store per round trip by a reader on another replica.
REMOTE_BATCH = 500
#: A reader of an execution run elsewhere re-reads at least this often (a missed notice).
REMOTE_REREAD = 1.0


class Event:
    """One event: its number in the execution, its name, and its data as JSON text.

    A plain slotted class: a frozen dataclass's constructor is twice the cost, paid for
    every event a reasoner emits."""

    __slots__ = ("data", "event", "id")

    def __init__(self, id: int, event: str, data: str) -> None:
        self.id = id
        self.event = event
        self.data = data

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and (self.id, self.event, self.data) == (
            other.id,
            other.event,
            other.data,
        )

    def __hash__(self) -> int:
        return hash((self.id, self.event, self.data))

    def __repr__(self) -> str:
        return f"Event(id={self.id!r}, event={self.event!r}, data={self.data!r})"

    def encode(self) -> bytes:
        return b"id: %d\nevent: %s\ndata: %s\n\n" % (
            self.id,
            self.event.encode(),
            self.data.encode("utf-8", "surrogatepass"),
        )


class EventLog:
    """The events of one execution: the last `keep` of them, and who waits for more."""

    __slots__ = ("_changed", "_events", "last_id")

    def __init__(self, keep: int) -> None:
        self._events: deque[Event] = deque(maxlen=keep)
        self.last_id = 0
        self._changed: asyncio.Future[None] | None = None

    def append(self, event: str, data: str) -> Event:
        self.last_id += 1
        emitted = Event(self.last_id, event, data)
        self._events.append(emitted)
        self.wake()
        return emitted

    def wake(self) -> None:
        """Every reader waiting on `changed` looks again (an event, or the end)."""
        changed, self._changed = self._changed, None
        if changed is not None and not changed.done():
            changed.set_result(None)

    def changed(self) -> asyncio.Future[None]:
        """Done at the next append or wake; shared by every reader."""
        if self._changed is None:
            self._changed = asyncio.get_running_loop().create_future()
        return self._changed

    def since(self, cursor: int) -> tuple[int, list[Event]]:
        """The kept events after `cursor`, and how many after it are no longer kept."""
        if not self._events or cursor >= self.last_id:
            return 0, []
        first = self._events[0].id
        missed = max(0, first - cursor - 1)
        start = max(0, cursor + 1 - first)
        return missed, [self._events[i] for i in range(start, len(self._events))]


def encode_data(data: Any) -> str:
    """An event's data as JSON text; ValueError for what is not JSON data."""
    try:
        return jsoncodec.dumps(data).decode("utf-8", "surrogatepass")
    except TypeError as exc:
        raise ValueError(f"event data is not JSON: {exc}") from None


def comment(text: str) -> bytes:
    return b": %s\n\n" % text.encode()


def named(event: str, data: Any) -> bytes:
    """An event outside the numbering (start, missed, end): no `id:`, so a client's
    Last-Event-ID stays the number of the last real event."""
    return b"event: %s\ndata: %s\n\n" % (event.encode(), jsoncodec.dumps(data))


class Closing(Latch):
    """Set once, when the listener closes: every open stream then ends with a retry hint.
    Streams wait on its one future, not on a task each."""

    __slots__ = ()


class EventSource:
    """Where a stream reads one execution's events: its live log when this process runs
    it (or, with the memory store, ran it), else the shared store."""

    #: The longest a stream waits between two looks at the source, notice or not.
    reread: float | None = None

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        raise NotImplementedError

    async def latest(self) -> Execution:
        """The execution as it is now."""
        raise NotImplementedError

    def notice(self) -> asyncio.Future[None]:
        """Done at the next event or end (a future, so a waiting stream holds no task)."""
        raise NotImplementedError

    def done_with(self, notice: asyncio.Future[None]) -> None:
        """The stream no longer waits on `notice`."""


class LocalEvents(EventSource):
    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        self.log = execution.event_log()

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        return self.log.since(cursor)

    async def latest(self) -> Execution:
        return self.execution

    def notice(self) -> asyncio.Future[None]:
        return self.log.changed()


class RemoteEvents(EventSource):
    """An execution run on another replica (or ended there): its events from the store."""

    reread = REMOTE_REREAD

    def __init__(self, store: ExecutionStore, execution: Execution) -> None:
        self.store = store
        self.execution = execution

    async def read(self, cursor: int) -> tuple[int, list[Event]]:
        return await self.store.events_since(self.execution.execution_id, cursor, REMOTE_BATCH)

    async def latest(self) -> Execution:
        found = await self.store.get(self.execution.execution_id)
        if found is not None:  # None: forgotten meanwhile; the last copy read ends it
            self.execution = found
        return self.execution

    def notice(self) -> asyncio.Future[None]:
        return self.store.event_notice(self.execution.execution_id)

    def done_with(self, notice: asyncio.Future[None]) -> None:
        self.store.drop_notice(self.execution.execution_id, notice)


async def event_stream(
    source: EventSource,
    cursor: int,
    *,
    heartbeat: float,
    closing: Closing,
    gone: asyncio.Future[None],
    first: bytes | None = None,
) -> AsyncIterator[bytes]:
    """The bytes of one SSE stream: `first` (a start event), replay after `cursor`, live
    events, a heartbeat after `heartbeat` quiet seconds, and `end`; or a retry hint when
    `closing` is set. Ends quietly once `gone` (the client left) is done.

    The execution's state is read only when no event is left to send: its events are all
    written before its end, so one more read after seeing the end sends the last of them.
    """
    loop = asyncio.get_running_loop()
    if first is not None:
        yield first
    sent = loop.time()
    ended: Execution | None = None
    while not gone.done():
        missed, events = await source.read(cursor)
        if missed:
            yield named("missed", {"missed": missed, "after": cursor})
        for event in events:
            yield event.encode()
            cursor = event.id
        if events:
            sent = loop.time()
            continue  # a batch may have been capped: read again before waiting
        if ended is not None:
            yield named("end", ended.to_json())
            return
        execution = await source.latest()
        if execution.is_terminal:
            ended = execution  # one more read: events written before the end
            continue
        if closing.is_set():
            yield b"retry: %d\n\n" % RETRY_MS
            return
        quiet = loop.time() - sent
        if quiet >= heartbeat:
            yield comment("heartbeat")
            sent = loop.time()
            continue
        timeout = heartbeat - quiet
        if source.reread is not None:
            timeout = min(timeout, source.reread)
        notice = source.notice()
        try:
            await _first(loop, (notice, closing.future(), gone), timeout)
        finally:
            source.done_with(notice)


async def _first(
    loop: asyncio.AbstractEventLoop, futures: tuple[asyncio.Future[None], ...], timeout: float
) -> None:
    """Until one of `futures` is done or `timeout` passes: `asyncio.wait`'s
    FIRST_COMPLETED for an idle stream, in one future, one callback and one timer instead
    of a set, a counter, a closure and a timer per call."""
    if any(future.done() for future in futures):
        return
    waiter: asyncio.Future[None] = loop.create_future()
    wake = functools.partial(_wake, waiter)
    timer = loop.call_later(timeout, wake, None)
    for future in futures:
        future.add_done_callback(wake)
    try:
        await waiter
    finally:
        timer.cancel()
        for future in futures:
            future.remove_done_callback(wake)


def _wake(waiter: asyncio.Future[None], _: object) -> None:
    if not waiter.done():
        waiter.set_result(None)


#: Makes a response's stream, given the future that is done when its client leaves.
StreamFactory = Callable[[asyncio.Future[None]], AsyncIterator[bytes]]


class SseResponse:
    """A `text/event-stream` response that ends when its stream ends or the client goes.
    Under this server's protocol a stream runs no task of its own (it waits on futures);
    under another ASGI server, one task reads the client's disconnect."""

    def __init__(self, stream: StreamFactory, on_open: Callable[[int], None] | None = None) -> None:
        self.stream = stream
        self.on_open = on_open

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
        if self.on_open is not None:
            self.on_open(1)
        gone, reader = client_gone(scope, receive)
        stream = self.stream(gone)
        try:
            async for chunk in stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not gone.done():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-send: nobody to answer
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            if self.on_open is not None:
                self.on_open(-1)
