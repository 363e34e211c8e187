"""CoalescingWriter: a response head and its body leave in one send, nothing waits longer than
one loop turn, and a close sends what is held first. Driven on a real event loop over a real
socket pair; the recording transport below only counts the calls the writer makes."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from agent_server.http.coalescing import CoalescingWriter

TIMEOUT = 5.0


class Recording(asyncio.Transport):
    """Passes every call to a real transport and notes which sends were made."""

    def __init__(self, real: asyncio.Transport) -> None:
        super().__init__()
        self.real = real
        self.sends: list[bytes] = []

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))
        self.real.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.sends.append(b"".join(list_of_data))
        self.real.writelines(list_of_data)

    def close(self) -> None:
        self.real.close()

    def is_closing(self) -> bool:
        return self.real.is_closing()


async def _pair() -> tuple[Recording, socket.socket]:
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    theirs.setblocking(False)
    return Recording(transport), theirs


async def _read_until(sock: socket.socket, expected: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    received = b""
    async with asyncio.timeout(TIMEOUT):
        while len(received) < len(expected):
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                break
            received += chunk
    return received


async def test_head_and_body_leave_in_one_send() -> None:
    transport, peer = await _pair()
    writer = CoalescingWriter(transport, asyncio.get_running_loop())
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    writer.write(b"{}")
    assert transport.sends == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    assert await _read_until(peer, transport.sends[0]) == transport.sends[0]
    writer.close()
    peer.close()


async def test_a_lone_write_goes_out_on_the_next_loop_turn() -> None:
    transport, peer = await _pair()
    writer = CoalescingWriter(transport, asyncio.get_running_loop())
    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")  # a head with no body to follow
    assert transport.sends == []
    await asyncio.sleep(0)
    assert transport.sends == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    assert await _read_until(peer, transport.sends[0]) == transport.sends[0]
    writer.write(b"chunk 1")  # a streamed body: each chunk leaves within a loop turn
    await asyncio.sleep(0)
    writer.write(b"chunk 2")
    await asyncio.sleep(0)
    assert transport.sends[1:] == [b"chunk 1", b"chunk 2"]
    writer.close()
    peer.close()


async def test_close_sends_what_is_held_first() -> None:
    transport, peer = await _pair()
    writer = CoalescingWriter(transport, asyncio.get_running_loop())
    writer.write(b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n")
    writer.close()
    assert writer.is_closing()
    expected = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\n\r\n"
    assert transport.sends == [expected]
    assert await _read_until(peer, expected + b"!") == expected  # then end of stream
    await asyncio.sleep(0)  # the scheduled flush finds nothing held and sends nothing
    assert transport.sends == [expected]
    peer.close()


async def test_a_write_held_for_a_transport_the_client_reset_is_dropped() -> None:
    """A client that resets its connection between a write and the next loop turn: the held
    write is dropped, not written to a closed transport (under uvloop that raises, in a
    callback nobody observes, and was logged as an error)."""
    transport, peer = await _pair()
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    try:
        writer = CoalescingWriter(transport, loop)
        writer.write(b"data: held\n\n")
        transport.real.abort()  # the reset, before the held write leaves
        await asyncio.sleep(0)
        writer.write(b"data: one\n\n")
        writer.write(b"data: two\n\n")  # a pair would go out together: also dropped
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
        peer.close()
    assert transport.sends == []
    assert errors == []
