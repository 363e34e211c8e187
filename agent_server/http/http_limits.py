"""Bounds on a connection that uvicorn's httptools protocol does not set by itself.

httptools keeps a request head in memory however long it grows (one header of 100 MB is
buffered whole), and a connection that never completes its head is kept open forever: a
new connection has no timer at all. Either lets a few clients hold the server's memory or
file descriptors. This protocol ends both: a head over `MAX_HEAD_SIZE` bytes is answered
431, and a head not complete within the keep-alive timeout of its first byte (or of the
connection's start) is answered 408, or closed silently when nothing was sent; either way
the connection is closed.

Past the head: a body not whole `body_timeout` seconds after its head is answered 408 and
closed (size is bounded by the API's `--max-body-size`); a client that does not read its
answer down to the transport's low-water mark within `write_timeout` seconds is cut off,
freeing the bytes it pinned; at most `MAX_PIPELINE` requests wait behind the one being
answered, and reading stops while any wait; uvicorn's text answers (parse errors, a body
cut by shutdown) are JSON here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sized
from typing import Any

import httptools
from starlette.types import Receive, Scope
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from agent_server.http.coalescing import CoalescingWriter
from agent_server.model.waiting import Flag, Latch

#: The scope key of the request's connection (its `closed()` future).
CONNECTION = "agent_server.connection"

#: Request line plus headers, in bytes; nginx's default buffers allow 32 KiB.
MAX_HEAD_SIZE = 65_536


def _response(status: bytes, detail: str, extra_headers: bytes = b"") -> bytes:
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
    return b"".join(
        [
            b"HTTP/1.1 " + status + b"\r\n",
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            extra_headers,
            b"connection: close\r\n\r\n",
            body,
        ]
    )


HEAD_TOO_LARGE = _response(b"431 Request Header Fields Too Large", "request head too large")
HEAD_TIMEOUT = _response(b"408 Request Timeout", "request head not received in time")
BODY_TIMEOUT = _response(b"408 Request Timeout", "request body not received in time")
BAD_REQUEST = _response(b"400 Bad Request", "invalid HTTP request")
SHUTTING_DOWN = _response(
    b"503 Service Unavailable", "server is shutting down", b"retry-after: 1\r\n"
)

#: Seconds a request body may take to arrive in full, from the end of its head.
BODY_TIMEOUT_SECONDS = 30.0
#: Seconds a response may wait for a client that reads none of it (the write buffer over
#: its high-water mark without shrinking) before the connection is aborted.
WRITE_TIMEOUT_SECONDS = 30.0
#: Requests one connection may have queued behind the one being answered (pipelining).
MAX_PIPELINE = 32


class _Halted:
    """The parser of a connection that reads nothing more (a parse error, or a pipeline
    over its bound): whatever still arrives is dropped."""

    def feed_data(self, data: bytes) -> None:
        pass


class PipelineFlowControl(FlowControl):
    """uvicorn's flow control, except that reading stays paused while requests wait in the
    pipeline: uvicorn pauses it when it queues one, but the running request's every
    `receive()` resumes it, and each read then parses and queues whatever it holds."""

    def __init__(self, transport: asyncio.Transport, pipeline: Sized) -> None:
        # FlowControl's own attributes, its event a Flag (agent_server.model.waiting)
        self._transport = transport
        self.read_paused = False
        self.write_paused = False
        self._is_writable_event = Flag(True)  # type: ignore[assignment]
        self._pipeline = pipeline

    def resume_reading(self) -> None:
        if self.read_paused and not self._pipeline:
            self.read_paused = False
            self._transport.resume_reading()


class Pipeline(list[tuple[RequestResponseCycle, ASGI3Application]]):
    """uvicorn's queue of pipelined requests as a list: an empty deque is 600 bytes, held
    by every connection, where pipelining is rare and its queue short."""

    __slots__ = ()

    def appendleft(self, item: tuple[RequestResponseCycle, ASGI3Application]) -> None:
        self.insert(0, item)


class PipelineFull(Exception):
    """Raised in the parser's callback to stop it: the connection queued its bound."""


class ConnectionClosed(Latch):
    """Set when the client's connection is gone.

    A long response (an event stream) waits on its future instead of running a task that
    reads `http.disconnect`. One per connection, in the scope of each of its requests under
    CONNECTION; it refers to neither, so a request's objects stay free of cycles."""

    __slots__ = ()


def client_gone(
    scope: Scope, receive: Receive
) -> tuple[asyncio.Future[None], asyncio.Task[None] | None]:
    """A future done once the client has gone. Under this server's protocol it is the
    connection's own (no task); under another ASGI server, a task that reads
    `http.disconnect`, returned as well for the caller to cancel and await."""
    closed = scope.get(CONNECTION)
    if isinstance(closed, ConnectionClosed):
        return closed.future(), None
    reader = asyncio.ensure_future(_disconnected(receive))
    return reader, reader


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size and a time bound on every request head.

    A head that arrives whole in one read, the keep-alive case under load, costs one `find`
    and no timer: the head timer runs only while a head is incomplete between reads, from
    the read that brought its first byte (or from the connection's start). Slots keep the
    instance dict at uvicorn's own 28 keys: past CPython's 30 shared keys, every attribute
    access in uvicorn's per-request code gets slower. The base methods are called directly,
    not through super(), for the same reason: these run for every request.

    Each request cycle writes through the connection's `CoalescingWriter`, so a response's
    head and body leave in one send.
    """

    __slots__ = (
        "_body_timer",
        "_closed",
        "_head_bytes",
        "_head_limit",
        "_head_scope",
        "_head_tail",
        "_head_timer",
        "_in_head",
        "_write_timer",
        "_writer",
    )

    max_head_size = MAX_HEAD_SIZE
    body_timeout = BODY_TIMEOUT_SECONDS
    write_timeout = WRITE_TIMEOUT_SECONDS
    max_pipeline = MAX_PIPELINE

    @classmethod
    def with_timeouts(
        cls, body_timeout: float, write_timeout: float
    ) -> type[BoundedHttpToolsProtocol]:
        """This protocol with other body and write deadlines (uvicorn takes a class)."""
        attributes = {"__slots__": (), "body_timeout": body_timeout, "write_timeout": write_timeout}
        return type(cls.__name__, (cls,), attributes)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        HttpToolsProtocol.__init__(self, *args, **kwargs)
        self.pipeline = Pipeline()  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_head = True  # the next byte read belongs to a head, not to a body
        self._head_limit = self.max_head_size - 4  # where a head's blank line may start
        self._head_bytes = 0  # of the head in progress, counted in earlier reads
        self._head_tail = b""  # its last bytes, to find a blank line split across reads
        self._head_scope: object = None  # the scope of the last head the parser completed
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._closed = ConnectionClosed()
        super().connection_made(transport)
        self.flow = PipelineFlowControl(transport, self.pipeline)
        self._writer = CoalescingWriter(transport, self.loop)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        for timer in (self._body_timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._closed.set()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head and (
            self._head_timer is not None
            or data[0] in b"\r\n"
            or not -1 < data.find(b"\r\n\r\n") <= self._head_limit
        ):
            # Not a whole head from the read's start: one begun in an earlier read, one not
            # ended in this one, one after blank lines (the parser skips them) or one too
            # large. Measured read by read, timed from its first read.
            self._arm_head_timer()
            self._head_bytes += self._head_part(data)
            if self._head_bytes > self.max_head_size:
                self._refuse(HEAD_TOO_LARGE)
                return
        self._feed(data)
        if self._in_head:
            if self.scope is not self._head_scope and self._head_timer is None:
                self._head_begun_in_pipeline(data)
        elif self._body_timer is None:  # a body not whole in the read that ended its head
            self._arm_body_timer()

    def _feed(self, data: bytes) -> None:
        """uvicorn's `data_received`, with its two refusals made this server's: a parse
        error is answered JSON (uvicorn's is text), and a pipeline over its bound ends the
        connection after the requests it queued, without a warning per request."""
        if self.timeout_keep_alive_task is not None:
            self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, PipelineFull):
                self._halt()
            else:
                self._bad_request()
        except httptools.HttpParserError:
            self._bad_request()
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def send_400_response(self, msg: str) -> None:
        self._bad_request()

    def _bad_request(self) -> None:
        """400 JSON and close, unless it would cut into an answer already under way or
        owed to an earlier request: then the connection closes after that answer."""
        cycle = self.cycle
        if self.pipeline or (
            cycle is not None and not cycle.response_complete and not cycle.more_body
        ):
            self._halt()  # the parse error came after a whole request: answer it first
            return
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.parser = _Halted()  # type: ignore[assignment]
            self.transport.close()  # mid-body, mid-response: nothing can be answered cleanly
            return
        self._disarm_head_timer()
        self._writer.flush()
        if not self.transport.is_closing():
            self.transport.write(BAD_REQUEST)
            self.transport.close()

    def _halt(self) -> None:
        """Read nothing more; close once the requests already whole are answered."""
        self.parser = _Halted()  # type: ignore[assignment]
        self.flow.pause_reading()
        if self.pipeline and self.pipeline[0][0].more_body:  # cut off: it cannot be answered
            self.pipeline.popleft()
        last = self.pipeline[0][0] if self.pipeline else self.cycle
        if last is None or last.response_complete:
            self.transport.close()
        else:
            last.keep_alive = False

    def _head_begun_in_pipeline(self, data: bytes) -> None:
        """This read ended a message and began the next head without ending it. Its bytes
        in this read are not measured (at most one read); it is timed from now unless
        requests wait in the pipeline, which stops reading until they are answered (then
        uvicorn's keep-alive timer bounds the wait)."""
        self._head_tail = data[-3:]
        if not self.pipeline:
            self._arm_head_timer()

    def _head_part(self, data: bytes) -> int:
        """Bytes of `data` up to the blank line that ends the head (the body may share the
        read). Blank lines before the request line do not end it (the parser skips them);
        the last three bytes are kept to find a blank line split across reads."""
        tail = self._head_tail
        self._head_tail = data[-3:] if len(data) >= 3 else (tail + data)[-3:]
        if self.scope is not self._head_scope:  # the request line began in an earlier read
            across = (tail + data[:3]).find(b"\r\n\r\n") if tail else -1
            if across >= 0:
                return across + 4 - len(tail)
            start = 0
        else:
            start = len(data) - len(data.lstrip(b"\r\n"))
        end = data.find(b"\r\n\r\n", start)
        return len(data) if end < 0 else end + 4

    def on_headers_complete(self) -> None:
        if len(self.pipeline) >= self.max_pipeline:
            raise PipelineFull  # stops the parser: this request and the rest go unread
        self._in_head = False
        self._head_scope = self.scope
        if self._head_timer is not None:
            self._disarm_head_timer()
        HttpToolsProtocol.on_headers_complete(self)
        self.scope[CONNECTION] = self._closed  # type: ignore[literal-required]
        cycle = self.cycle
        if cycle is not None:  # its response goes out in one send (agent_server.http.coalescing)
            cycle.transport = self._writer  # type: ignore[assignment]
            cycle.message_event = Flag()  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self._in_head = True
        if self._head_bytes or self._head_tail:
            self._head_bytes = 0
            self._head_tail = b""
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- the body deadline -------------------------------------------------------------------

    def _arm_body_timer(self) -> None:
        if not self.transport.is_closing():
            self._body_timer = self.loop.call_later(self.body_timeout, self._body_late)

    def _body_late(self) -> None:
        """408 JSON and close: the request's handler then reads a disconnect and ends."""
        self._body_timer = None
        cycle = self.cycle
        if self.transport.is_closing() or cycle is None:
            return
        if self.pipeline:  # queued: its body is read once it runs, so its time starts again
            self._arm_body_timer()
            return
        self._writer.flush()
        if not cycle.response_started:
            self.transport.write(BODY_TIMEOUT)
        self.parser = _Halted()  # type: ignore[assignment]
        self.transport.close()

    # -- the write deadline ------------------------------------------------------------------

    def pause_writing(self) -> None:
        HttpToolsProtocol.pause_writing(self)
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_timeout, self._write_late)

    def resume_writing(self) -> None:
        HttpToolsProtocol.resume_writing(self)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        """A client that did not read its answer down to the transport's low-water mark
        within the deadline is cut off: its unsent bytes are freed, and the response's task
        ends (its writes return). A slow reader gets a new deadline at every resume."""
        self._write_timer = None
        self.transport.abort()

    def abort_if_unread(self) -> bool:
        """At the end of the shutdown's http phase: abort a connection whose client is not
        reading its answer, so its task ends instead of being cancelled by uvicorn, and a
        connection closing with unread bytes still buffered, which uvicorn would wait for."""
        if self.flow.write_paused or self.transport.get_write_buffer_size():
            self.transport.abort()
            return True
        return False

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """uvicorn's, except for a request whose body is still arriving: it is answered 503
        + Connection: close now (its handler then reads a disconnect and ends), instead of
        being cancelled at the http deadline with a 500 and a traceback."""
        cycle = self.cycle
        if (
            cycle is not None
            and cycle.more_body
            and not cycle.response_started
            and not self.pipeline
            and not self.transport.is_closing()
        ):
            self._writer.flush()
            self.transport.write(SHUTTING_DOWN)
            self.parser = _Halted()  # type: ignore[assignment]
            self.transport.close()
            return
        HttpToolsProtocol.shutdown(self)

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(
                self.timeout_keep_alive, self._refuse, HEAD_TIMEOUT
            )

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _refuse(self, response: bytes) -> None:
        """Answer and close. A connection that sent nothing is closed silently (an unasked-for
        response could be read as the answer to its next request), and one mid-response
        (pipelining) too, so responses never interleave."""
        self._disarm_head_timer()
        self._writer.flush()  # a response already under way leaves before this one
        if self.transport.is_closing():
            return
        sent = self._head_bytes or self.scope is not self._head_scope
        if sent and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(response)
        self.transport.close()
