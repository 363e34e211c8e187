"""Authentication: every request but the open ones is turned into a principal, or a 401.

The probes (`/healthz`, `/readyz`) stay open, since the kubelet carries no token; `/metrics`
needs one too unless `--metrics-open` (Prometheus sends it with its `authorization` scrape
setting). Everything else, `/openapi.json` and unknown paths included, answers the same 401
without a good token, so an unauthenticated client learns nothing about which routes,
reasoners or executions exist, nor why its token was refused.

The principal rides in the request's scope, `scope["state"]["principal"]` (Starlette's
`request.state.principal`), for the routes and the reasoner's context (`principal_of`). Who
a token names is `agent_server.identity`'s to say: this module is the HTTP adapter, the
middleware, and the flags' authenticator built from the settings (`authenticator_from`).
"""

from __future__ import annotations

import json
import logging
import traceback

from starlette._utils import get_route_path
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.identity.authenticators import Authenticator, BearerAuthenticator, SharedToken
from agent_server.identity.jwks import RemoteJwks, StaticKeys
from agent_server.identity.jwt_bearer import JwtBearer
from agent_server.identity.principal import Principal, Unauthorized
from agent_server.identity.tokens_file import TokensFile
from agent_server.runtime.logs import LOG_PRINCIPAL
from agent_server.runtime.settings import Settings

logger = logging.getLogger("agent_server.auth")

#: Paths served without a token: liveness and readiness (the kubelet sends none).
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
#: Served without a token only with `--metrics-open`: its series name every reasoner, which a
#: client without the token must not be able to probe (Prometheus sends one with its
#: `authorization` scrape setting, a ServiceMonitor with `bearerTokenSecret`).
METRICS_PATH = "/metrics"
#: The key of the request's `scope["state"]` that holds its principal.
PRINCIPAL_KEY = "principal"

UNAUTHORIZED_BODY = json.dumps({"detail": "unauthorized"}, separators=(",", ":")).encode()
UNAUTHORIZED_HEADERS = [
    (b"content-type", b"application/json"),
    (b"content-length", str(len(UNAUTHORIZED_BODY)).encode()),
    (b"www-authenticate", b"Bearer"),
]


def principal_of(scope: Scope) -> Principal | None:
    """The principal a request was authenticated as; None on an open path, or when no
    authentication is configured."""
    found = scope.get("state", {}).get(PRINCIPAL_KEY)
    return found if isinstance(found, Principal) else None


def _where(exc: BaseException) -> str:
    """Where an exception was raised (file:line), for a line that must not quote its
    message: it may hold the header it was reading."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


class Authentication:
    """ASGI middleware: runs the authenticator on every HTTP request but the open paths and
    puts its principal in the scope; any failure is the one 401, never a 500."""

    def __init__(
        self, app: ASGIApp, authenticate: Authenticator, open_paths: frozenset[str] = OPEN_PATHS
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The route's path: under a mount or --root-path, `path` carries the prefix too.
        if scope["type"] != "http" or get_route_path(scope) in self.open_paths:
            await self.app(scope, receive, send)
            return
        principal = await self._principal(scope)
        if principal is None:
            # The body is never read: the server closes the connection if it is left unread.
            await send(
                {"type": "http.response.start", "status": 401, "headers": UNAUTHORIZED_HEADERS}
            )
            await send({"type": "http.response.body", "body": UNAUTHORIZED_BODY})
            return
        state = scope.get("state")
        if state is None:
            scope["state"] = state = {}
        state[PRINCIPAL_KEY] = principal
        # This request's lines (and its span) say who it is from: this task's context.
        LOG_PRINCIPAL.set((principal.identity, principal.tenant))
        await self.app(scope, receive, send)

    async def _principal(self, scope: Scope) -> Principal | None:
        try:
            principal = await self.authenticate(Headers(scope=scope))
        except Unauthorized:  # its message is the authenticator's to log: it may quote
            return None  # what it was given
        except Exception as exc:
            # A bug of the authenticator: said with its type and place, not its message.
            logger.error(
                "the authenticator raised %s at %s; answered 401",
                type(exc).__name__,
                _where(exc),
            )
            return None
        if not isinstance(principal, Principal):
            logger.error(
                "the authenticator returned %s, not a Principal; answered 401",
                type(principal).__name__,
            )
            return None
        return principal


def authenticator_from(settings: Settings) -> Authenticator | None:
    """The authenticator the settings configure, or None when they configure none."""
    static: list[SharedToken | TokensFile] = []
    if settings.bearer_token is not None:
        static.append(SharedToken(settings.bearer_token))
    if settings.api_tokens_file is not None:
        static.append(TokensFile(settings.api_tokens_file))
    jwt = None
    if settings.jwt_audience is not None:  # required with a key, refused without one
        keys = (
            RemoteJwks(settings.jwt_jwks_url)
            if settings.jwt_jwks_url is not None
            else StaticKeys(settings.jwt_keys)
        )
        jwt = JwtBearer(
            keys,
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            tenant_claim=settings.jwt_tenant_claim,
        )
    if not static and jwt is None:
        return None
    return BearerAuthenticator(static, jwt)
