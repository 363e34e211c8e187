"""Raw HTTP/1.1 over loopback sockets, for what httpx refuses to send (malformed heads,
pipelining, bodies sent apart), and the resident memory of a server process."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.support.process import ServerProcess

#: Bound on every single exchange (seconds).
TIMEOUT = 10.0


class Raw:
    """One raw HTTP/1.1 exchange: for what httpx refuses to send."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def response(self) -> tuple[int, dict[str, str], bytes]:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            chunk = self.sock.recv(65_536)
            if not chunk:
                raise AssertionError(f"connection closed before a response: {buffer!r}")
            buffer += chunk
        head, _, body = buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (h.split(":", 1) for h in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            chunk = self.sock.recv(65_536)
            if not chunk:
                break
            body += chunk
        return status, headers, body

    def close(self) -> None:
        self.sock.close()


def exchange(server: ServerProcess, data: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send `data` on a new connection and read the one response."""
    raw = Raw(server.port)
    try:
        raw.send(data)
        return raw.response()
    finally:
        raw.close()


class Responses:
    """Responses read in order from one keep-alive or pipelining connection."""

    def __init__(self, raw: Raw) -> None:
        self.sock = raw.sock
        self.buffer = b""

    def next(self) -> tuple[int, bytes]:
        """The next response's status and body; AssertionError if the connection ends."""
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1])
            for line in lines
            if line.lower().startswith("content-length:")
        )
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return int(lines[0].split()[1]), body

    def closed(self) -> bool:
        """True when the server closes with nothing more to read."""
        if self.buffer:
            return False
        try:
            chunk = self.sock.recv(65_536)
        except ConnectionResetError:
            return True
        self.buffer += chunk  # not closed: what came is the next response's
        return chunk == b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65_536)
        if not chunk:
            raise AssertionError(f"connection closed before a response: {self.buffer!r}")
        self.buffer += chunk


def rss_kib(pid: int) -> int:
    """The resident memory of process `pid`, in KiB (Linux's /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
