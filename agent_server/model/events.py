"""Live execution events: what a reasoner emits, numbered, and the log kept for replay.

A reasoner with a context calls `await ctx.emit(data, event="progress")`. Events of one
execution are numbered 1, 2, 3...; the last `--max-events` are kept in its `EventLog` for
replay. Emitting appends to that log and wakes the readers through one shared future: it
never waits for a reader, and a reader costs the log nothing but its own cursor. With a
shared store the owner also writes each event to Redis (a capped stream per execution,
through the same ordered outbox as its end), so a reader on any replica can replay and
follow it. The stream a client reads is `agent_server/http/sse.py`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.waiting import Waiters


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

    __slots__ = ("_events", "_listeners", "last_id")

    def __init__(self, keep: int) -> None:
        self._events: deque[Event] = deque(maxlen=keep)
        self.last_id = 0
        self._listeners: Waiters | None = None

    @property
    def keep(self) -> int:
        """How many events it keeps at most."""
        return self._events.maxlen or 0

    def widen(self, keep: int) -> None:
        """Keep up to `keep` events from now on (those kept stay)."""
        self._events = deque(self._events, maxlen=keep)

    def append(self, event: str, data: str) -> Event:
        self.last_id += 1
        emitted = Event(self.last_id, event, data)
        self._events.append(emitted)
        self.wake()
        return emitted

    def wake(self) -> None:
        """Every reader waiting looks again (an event, or the end), on the loop's next
        turn: what a reasoner emits in one turn then leaves in one write per reader, not
        one write (and system call) per event."""
        listeners, self._listeners = self._listeners, None
        if listeners:
            asyncio.get_running_loop().call_soon(listeners.wake)

    def listen(self, waiter: asyncio.Future[None]) -> None:
        """`waiter` is done at the next append or wake."""
        if self._listeners is None:
            self._listeners = Waiters()
        self._listeners.add(waiter)

    def unlisten(self, waiter: asyncio.Future[None]) -> None:
        if self._listeners is not None:
            self._listeners.discard(waiter)

    def since(self, cursor: int) -> tuple[int, list[Event]]:
        """The kept events after `cursor`, and how many after it are no longer kept."""
        if not self._events or cursor >= self.last_id:
            return 0, []
        first = self._events[0].id
        missed = max(0, first - cursor - 1)
        start = max(0, cursor + 1 - first)
        return missed, [self._events[i] for i in range(start, len(self._events))]


def encode_data(data: Any) -> str:
    """An event's data as JSON text; ValueError (`jsoncodec.Unrecordable`) for what cannot
    be written and read back the same (NaN included, which would become null)."""
    return jsoncodec.dumps_recordable(data, "event data").decode("utf-8", "surrogatepass")
