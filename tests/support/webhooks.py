"""A real webhook receiver on loopback for the tests: it verifies every signature with the
Standard Webhooks library, as a receiver in production would."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks import Webhook

SECRET = "whsec_" + base64.b64encode(b"agent-server webhook test secret").decode()
WAIT = 20.0
#: A short retry window: the first retry within 0.3 s (a hundredth of it).
RETRY = ("--webhook-retry-for", "30")
HOOKS = (
    "--webhook-secret",
    SECRET,
    *("--webhook-allow", "127.0.0.1", "--webhook-allow", "localhost"),
    *RETRY,
)


class Receiver:
    """A real HTTP server on a loopback address (IPv4, or IPv6 for `::1`): records every
    request, verifies its signature, and answers 503 to the first `failures` attempts of
    each webhook-id. With `endless`, a 200 answer's body has no end (chunked, written until
    the connection breaks); `sent` holds the bytes each such answer wrote."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        failures: int = 0,
        path: str = "/hooks?token=t",
        endless: bool = False,
    ) -> None:
        self.requests: list[dict[str, Any]] = []
        self.unverified: list[str] = []
        self.failures = failures
        self.sent: list[int] = []
        self.lock = threading.Lock()
        signer = Webhook(SECRET)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {name.lower(): value for name, value in self.headers.items()}
                try:
                    signer.verify(body, headers)
                except Exception as exc:
                    receiver.unverified.append(repr(exc))
                with receiver.lock:
                    seen = sum(1 for r in receiver.requests if r["id"] == headers.get("webhook-id"))
                    status = 503 if seen < receiver.failures else 200
                    receiver.requests.append(
                        {
                            "id": headers.get("webhook-id"),
                            "headers": headers,
                            "body": json.loads(body),
                            "status": status,
                            "at": time.monotonic(),
                        }
                    )
                self.send_response(status)
                if endless and status == 200:
                    self.send_header("transfer-encoding", "chunked")
                    self.end_headers()
                    receiver.sent.append(self._endless())
                    return
                self.send_header("content-length", "0")
                self.end_headers()

            def _endless(self) -> int:
                chunk = b"%x\r\n%s\r\n" % (65_536, b"x" * 65_536)
                sent = 0
                try:
                    while sent < 2**31:  # 2 GiB: far past any bound, and still an end
                        self.wfile.write(chunk)
                        sent += 65_536
                except OSError:  # the client closed the connection
                    pass
                self.close_connection = True
                return sent

            def log_message(self, format: str, *args: Any) -> None:
                return None

        class Server(ThreadingHTTPServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
            daemon_threads = True

        self.server = Server((host, port), Handler)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.server.server_address[1]}{path}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def delivered(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["status"] == 200 and r["body"]["type"] == kind]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
