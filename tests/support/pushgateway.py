"""Small real HTTP receivers on loopback standing in for a Pushgateway.

`PushReceiver` answers like a Pushgateway and records what it was sent; `SilentGateway`
accepts connections (the kernel completes the handshake) and never answers, the worst a
gateway can do to an exiting process.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Push:
    method: str
    path: str
    content_type: str
    body: str

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(self.body)
            for s in family.samples
        }

    def value(self, name: str, **labels: str) -> float:
        return self.samples()[(name, frozenset(labels.items()))]


class PushReceiver:
    """A stand-in Pushgateway on loopback: records each request, answers 200."""

    def __init__(self) -> None:
        self.pushes: list[Push] = []
        self.received = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode()
                receiver.pushes.append(
                    Push(self.command, self.path, self.headers.get("Content-Type", ""), body)
                )
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
                receiver.received.set()

            do_PUT = do_POST = do_DELETE = _record

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait(self, timeout: float) -> Push:
        assert self.received.wait(timeout), "nothing was pushed"
        return self.pushes[0]

    def __enter__(self) -> PushReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)


class SilentGateway:
    """Listens and never accepts: connections complete, requests are never answered."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __enter__(self) -> SilentGateway:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.sock.close()
