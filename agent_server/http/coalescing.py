"""One send per response: a response head waits for its body, at most one loop turn.

uvicorn writes a response's status line and headers when the app sends
`http.response.start` and its body on `http.response.body`: two `send()` calls and, with
TCP_NODELAY, two segments that wake the client twice. For the small JSON answers this API
gives, those two system calls cost more than everything the app does (measured in
bench/RESULTS.md). `CoalescingWriter` stands in for the transport of uvicorn's request
cycles: a write is held until the next write (then both go out in one `writelines`) or until
the loop's next turn, whichever comes first; `close()` sends what is held first. Nothing is
held across an await of the app longer than one loop iteration, so a streaming response
still leaves chunk by chunk.
"""

from __future__ import annotations

import asyncio


class CoalescingWriter:
    """The write side of one connection's transport, for uvicorn's `RequestResponseCycle`
    (which only calls `write`, `close` and `is_closing`)."""

    __slots__ = ("_held", "_loop", "transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self.transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes) -> None:
        held = self._held
        if held is None:
            self._held = data
            self._loop.call_soon(self.flush)
        else:
            self._held = None
            if not self.transport.is_closing():  # the client reset it: nobody to send to
                self.transport.writelines((held, data))

    def flush(self) -> None:
        """Send what is held now (the loop's next turn, or before anything else is sent).
        A transport the client reset meanwhile takes nothing: under uvloop a write to it
        raises, from a callback nobody observes."""
        held = self._held
        if held is not None:
            self._held = None
            if not self.transport.is_closing():
                self.transport.write(held)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return self.transport.is_closing()
