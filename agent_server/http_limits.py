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
    """uvicorn's httptools protocol with a size and a time bound on every request head."""

    max_head_size = MAX_HEAD_SIZE

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._in_head = True
        self._head_bytes = 0
        self._head_tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._arm_head_timer()
            self._head_bytes += self._head_part(data)
            if self._head_bytes > self.max_head_size:
                self._refuse(HEAD_TOO_LARGE)
                return
        super().data_received(data)

    def _head_part(self, data: bytes) -> int:
        """Bytes of `data` up to the blank line that ends the head (the body may share the
        read); the last three bytes are kept to find a blank line split across reads."""
        tail = self._head_tail
        across = (tail + data[:3]).find(b"\r\n\r\n") if tail else -1
        self._head_tail = data[-3:] if len(data) >= 3 else (tail + data)[-3:]
        if across >= 0:
            return max(0, across + 4 - len(tail))
        end = data.find(b"\r\n\r\n")
        return len(data) if end < 0 else end + 4

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
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
        if self.transport.is_closing():
            return
        if self._head_bytes and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(response)
        self.transport.close()
