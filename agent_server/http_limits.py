"""Bounds on a request head that uvicorn's httptools protocol does not set by itself.

httptools keeps a request head in memory however long it grows (one header of 100 MB is
buffered whole), and a connection that never completes its head is kept open forever: a
new connection has no timer at all. Either lets a few clients hold the server's memory or
file descriptors. This protocol ends both: a head over `MAX_HEAD_SIZE` bytes is answered
431, and a head not complete within the keep-alive timeout of its first byte (or of the
connection's start) is answered 408, or closed silently when nothing was sent; either way
the connection is closed. Bodies are bounded by
the API's `--max-body-size` and flow control, so only the head needs this.
"""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from agent_server.coalescing import CoalescingWriter

#: Request line plus headers, in bytes; nginx's default buffers allow 32 KiB.
MAX_HEAD_SIZE = 65_536


def _response(status: bytes, detail: str) -> bytes:
    body = json.dumps({"detail": detail}, separators=(",", ":")).encode()
    return b"".join(
        [
            b"HTTP/1.1 " + status + b"\r\n",
            b"content-type: application/json\r\n",
            b"content-length: " + str(len(body)).encode() + b"\r\n",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


HEAD_TOO_LARGE = _response(b"431 Request Header Fields Too Large", "request head too large")
HEAD_TIMEOUT = _response(b"408 Request Timeout", "request head not received in time")


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
        "_head_bytes",
        "_head_limit",
        "_head_scope",
        "_head_tail",
        "_head_timer",
        "_in_head",
        "_writer",
    )

    max_head_size = MAX_HEAD_SIZE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_head = True  # the next byte read belongs to a head, not to a body
        self._head_limit = self.max_head_size - 4  # where a head's blank line may start
        self._head_bytes = 0  # of the head in progress, counted in earlier reads
        self._head_tail = b""  # its last bytes, to find a blank line split across reads
        self._head_scope: object = None  # the scope of the last head the parser completed
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._writer = CoalescingWriter(transport, self.loop)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
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
        HttpToolsProtocol.data_received(self, data)
        if self._in_head and self.scope is not self._head_scope and self._head_timer is None:
            self._head_begun_in_pipeline(data)

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
        self._in_head = False
        self._head_scope = self.scope
        if self._head_timer is not None:
            self._disarm_head_timer()
        HttpToolsProtocol.on_headers_complete(self)
        if self.cycle is not None:  # its response goes out in one send (agent_server.coalescing)
            self.cycle.transport = self._writer  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        HttpToolsProtocol.on_message_complete(self)
        self._in_head = True
        if self._head_bytes or self._head_tail:
            self._head_bytes = 0
            self._head_tail = b""

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
