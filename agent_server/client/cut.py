"""A stream's connection shut at the caller's deadline, for both fronts."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx


def _shut(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def cut_at(response: httpx.Response, deadline: float | None) -> Iterator[None]:
    """Shut the stream's connection at the monotonic `deadline`, so that a read waiting on
    a quiet stream ends then: httpx bounds each read, not a whole stream. A shut socket
    ends a blocking and an asyncio read alike; without a socket (another transport) the
    read timeout, cut to the deadline, bounds it."""
    network = response.extensions.get("network_stream")
    sock = None if network is None else network.get_extra_info("socket")
    if deadline is None or sock is None:
        yield
        return
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), _shut, (sock,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # never shut a connection the pool has taken back
