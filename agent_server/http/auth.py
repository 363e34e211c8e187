"""Bearer-token authentication: one shared secret guards the work routes.

The probes (`/healthz`, `/readyz`) stay open, since the kubelet carries no token; `/metrics`
needs it too unless `--metrics-open` (Prometheus sends it with its `authorization` scrape
setting). Everything else, `/openapi.json` and unknown paths included, answers the same 401
without the token, so an unauthenticated client learns nothing about which routes,
reasoners or executions exist.
"""

from __future__ import annotations

import hashlib
import hmac
import json

from starlette._utils import get_route_path
from starlette.types import ASGIApp, Receive, Scope, Send

#: Paths served without a token: liveness and readiness (the kubelet sends none).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
#: Served without a token only with `--metrics-open`: its series name every reasoner, which a
#: client without the token must not be able to probe (Prometheus sends one with its
#: `authorization` scrape setting, a ServiceMonitor with `bearerTokenSecret`).
METRICS_PATH = "/metrics"

UNAUTHORIZED_BODY = json.dumps({"detail": "unauthorized"}, separators=(",", ":")).encode()
UNAUTHORIZED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
    (b"www-authenticate", b"Bearer"),
]


def _digest(value: bytes) -> bytes:
    """Compare fixed-length digests, so the comparison time does not reveal the length."""
    return hashlib.sha256(value).digest()


class BearerAuth:
    """ASGI middleware: 401 for any non-open HTTP request without `Authorization: Bearer`."""

    def __init__(self, app: ASGIApp, token: str, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.open_paths = open_paths
        self._expected = _digest(token.encode("ascii"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The route's path: under a mount or --root-path, `path` carries the prefix too.
        if (
            scope["type"] != "http"
            or get_route_path(scope) in self.open_paths
            or self._allowed(scope)
        ):
            await self.app(scope, receive, send)
            return
        # The body is never read: the server closes the connection if it is left unread.
        await send({"type": "http.response.start", "status": 401, "headers": UNAUTHORIZED_HEADERS})
        await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})

    def _allowed(self, scope: Scope) -> bool:
        values = [value for name, value in scope["headers"] if name == b"authorization"]
        if len(values) != 1:
            return False
        scheme, _, credentials = values[0].strip().partition(b" ")
        if scheme.lower() != b"bearer":
            return False
        return hmac.compare_digest(_digest(credentials.strip()), self._expected)
