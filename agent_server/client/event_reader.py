"""One reader of an execution's events (`GET /executions/{id}/events`): what it decides
between connections (where to resume, how long to wait, when its deadline has passed) and
the messages of one connection, as steps (`steps.py`)."""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from typing import Any

import httpx
from httpx_sse import SSEError

from agent_server.client import retries as policy
from agent_server.client.models import Event, Unavailable, WaitTimeout, error_from_response
from agent_server.client.retries import Retries
from agent_server.client.sse import Message, Parser
from agent_server.client.steps import (
    Chunk,
    Emit,
    Read,
    Reply,
    Send,
    StreamStep,
    as_response,
    as_text,
    segment,
)

#: Seconds an event stream may stay silent (the server sends a heartbeat every 15 s by
#: default) before it is taken for dead and resumed.
STREAM_SILENCE = 60.0
#: Events the stream sends around a reasoner's own: they carry no number.
UNNUMBERED = frozenset({"start", "missed", "end"})


class EventReader:
    """What one reader of an execution's events decides between connections."""

    def __init__(
        self,
        execution_id: str,
        after: int | None,
        timeout: float | None,
        *,
        connect: float,
        retry_for: float,
    ) -> None:
        #: The client's timeout, which bounds each connection's setup.
        self.connect = connect
        self.execution_id = execution_id
        #: The number of the last event received: where a new connection resumes.
        self.last_id = after
        #: The server's `retry:` hint, in seconds.
        self.retry: float | None = None
        self.retries = Retries(retry_for)
        #: The caller's bound on the whole stream, every connection and wait included.
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """Seconds left before the caller's deadline (None without one); `WaitTimeout` once
        it has passed."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"execution {self.execution_id} did not end within {self.timeout:g} s"
            )
        return left

    def send(self) -> Send:
        """The request for the next connection, its timeouts cut to what is left of the
        caller's deadline, when there is one."""
        left = self.left()
        headers = {"Accept": "text/event-stream"}
        if self.last_id is not None:
            headers["Last-Event-ID"] = str(self.last_id)
        connect, silence = self.connect, STREAM_SILENCE
        if left is not None:
            connect, silence = min(connect, left), min(silence, left)
        return Send(
            "GET",
            f"/executions/{segment(self.execution_id)}/events",
            httpx.Timeout(connect, read=silence),
            {},
            headers=headers,
        )

    def take(self, message: Message) -> Event | None:
        """The event a message carries, or None for a bare `retry:` hint. Its data is JSON;
        `start`, `missed` and `end` have no number. An event that comes after the deadline
        comes too late: `WaitTimeout`."""
        self.left()
        if message.retry is not None:
            self.retry = message.retry / 1000
        if not message.data:
            return None
        number = None
        if message.event not in UNNUMBERED and message.id.isdigit():
            number = self.last_id = int(message.id)
        try:
            data: Any = json.loads(message.data)
        except ValueError:
            data = message.data
        return Event(number, message.event, data)

    def connection(
        self, opened: httpx.Response | httpx.TransportError
    ) -> Generator[StreamStep | Emit[Event], Reply, float | None]:
        """One connection's events; then the seconds to wait before the next, None once
        the `end` has come."""
        if isinstance(opened, httpx.TransportError):
            return self.failed(opened, None)
        self.left()
        if opened.status_code != 200:
            read = as_response((yield Read()))
            if isinstance(read, httpx.TransportError):
                return self.failed(read, None)
            if not policy.refusal(opened):
                raise error_from_response(opened)
            return self.failed(opened, policy.retry_after(opened))
        kind = opened.headers.get("content-type", "").partition(";")[0]
        if "text/event-stream" not in kind:
            # As httpx-sse refuses it: a failure to retry, like a broken connection.
            not_a_stream = SSEError(
                "Expected response header Content-Type to contain 'text/event-stream', "
                f"got {kind!r}"
            )
            return self.failed(not_a_stream, None)
        parser = Parser()
        while True:
            chunk = as_text((yield Chunk()))
            if isinstance(chunk, httpx.TransportError):
                return self.failed(chunk, None)
            for message in parser.feed(chunk) if chunk is not None else parser.end():
                event = self.take(message)
                if event is not None:
                    self.received()
                    yield Emit(event)
                    if event.event == "end":
                        return None
            if chunk is None:  # closed before its end: resume
                return self.failed(None, None)

    def received(self) -> None:
        self.retries.received()

    def failed(self, reason: httpx.Response | Exception | None, hint: float | None) -> float:
        """Seconds to wait before resuming (never past the deadline), or the error when
        retries are exhausted; `WaitTimeout` once the deadline has passed (the connection
        cut at it, say)."""
        left = self.left()
        wanted = hint if hint is not None else self.retry
        if wanted is None:
            wanted = policy.backoff(self.retries.failures)
        delay = self.retries.delay(wanted)
        if delay is None:
            if isinstance(reason, httpx.Response):
                raise error_from_response(reason)
            raise Unavailable(
                f"events of {self.execution_id}: stream lost after {self.retries.spent()}: "
                f"{reason!r}"
            )
        return delay if left is None else min(delay, left)
