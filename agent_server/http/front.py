"""The agent's HTTP front: the one layer every request passes, and the app built behind it.

It answers every error as JSON, counts every response by route template, and adds
`Connection: close` while draining; one layer instead of Starlette's application stack.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import ASGIApp, Lifespan, Message, Receive, Scope, Send

from agent_server.http.api import Api
from agent_server.http.auth import METRICS_PATH, OPEN_PATHS, Authentication
from agent_server.http.route_table import ROUTE_STATUSES
from agent_server.http.routing import ApiError, ApiRouter, JSONResponse, in_doubt, refusal_error
from agent_server.identity.authenticators import Authenticator
from agent_server.model import jsoncodec
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.service.refusals import Refusal
from agent_server.store.base import StoreInDoubt, StoreUnavailable

logger = logging.getLogger("agent_server.api")

#: Methods counted by name; any other method string a client sends is counted as "other".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """No route takes a WebSocket: a 404 whose body is JSON like every other refusal, through
    the ASGI denial response where the server offers it (uvicorn does), else a close."""
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    body = jsoncodec.dumps({"detail": "no WebSocket route here: the API is plain HTTP"})
    await send(
        {
            "type": "websocket.http.response.start",
            "status": 404,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(body)),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


def _error_response(exc: HTTPException) -> Response:
    headers = dict(exc.headers or {})
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    body = {"detail": exc.detail, **(getattr(exc, "extra", None) or {})}
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


def _start_failures_in_one_line(send: Send) -> Send:
    """A shared store unreachable at start is said in its one line (exit 1), not in the
    traceback Starlette puts in `lifespan.startup.failed` (which uvicorn logs). Starlette
    sends that message while it handles the exception, so the exception is at hand."""

    async def sending(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed":
            failure = sys.exc_info()[1]
            if isinstance(failure, StoreUnavailable):
                message = {**message, "message": f"cannot start: {failure}"}
        await send(message)

    return sending


class HttpApp:
    """The agent's HTTP front: answers every error as JSON, counts every response by route
    template, and adds `Connection: close` while draining.

    One layer instead of Starlette's application stack (two middlewares and an exception
    handler lookup per request) plus a metrics middleware: every layer costs every request.
    """

    def __init__(self, app: ASGIApp, registry: InFlightRegistry, metrics: Metrics) -> None:
        self.app = app
        self.registry = registry
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await _refuse_websocket(scope, receive, send)
            return
        if scope["type"] == "lifespan":
            await self.app(scope, receive, _start_failures_in_one_line(send))
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope["app"] = self  # so the router raises HTTPException for 404 and 405, answered here
        started = time.perf_counter()
        send_wrapper = _Answer(send, self.registry)
        try:
            await self.app(scope, receive, send_wrapper)
        except HTTPException as exc:
            if send_wrapper.status:  # too late to answer: the server closes the connection
                raise
            await _error_response(exc)(scope, receive, send_wrapper)
        except Refusal as exc:  # a use case's, in its own words
            if send_wrapper.status:
                raise
            await _error_response(refusal_error(scope, exc))(scope, receive, send_wrapper)
        except StoreInDoubt as exc:  # an answer, a cancel or a delete no replica holds yet
            if send_wrapper.status:
                raise
            await _error_response(in_doubt(scope, exc.execution_id))(scope, receive, send_wrapper)
        except StoreUnavailable:
            if send_wrapper.status:
                raise
            unavailable = ApiError(503, "execution store unavailable", {"Retry-After": "1"})
            await _error_response(unavailable)(scope, receive, send_wrapper)
        except Exception as exc:
            if send_wrapper.status:
                raise
            logger.error("unhandled error on %s %s", scope["method"], scope["path"], exc_info=exc)
            response = JSONResponse({"detail": "internal server error"}, status_code=500)
            await response(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"
            seconds = time.perf_counter() - started
            self.metrics.http_request(method, template, send_wrapper.status or 500, seconds)


class _Answer:
    """The `send` of one request under `HttpApp`: notes the status it answers, and adds
    `Connection: close` while draining. A slotted object, not a closure: a closure and its
    two cells are held by every request in flight (and every open stream) at twice the
    size."""

    __slots__ = ("registry", "send", "status")

    def __init__(self, send: Send, registry: InFlightRegistry) -> None:
        self.send = send
        self.registry = registry
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            if self.registry.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                headers.append((b"connection", b"close"))
                message["headers"] = headers
        await self.send(message)


def build_app(
    api: Api,
    lifespan: Lifespan[Any],
    authenticator: Authenticator | None,
    registry: InFlightRegistry,
    *,
    metrics_open: bool = False,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
    protocol_routes: Sequence[Route] = (),
    public_paths: frozenset[str] = frozenset(),
) -> ASGIApp:
    """The routes of `api`, behind authentication when an authenticator is given (the probes
    always open, `/metrics` with `metrics_open`), inside `HttpApp` (so 401s are counted and
    get `Connection: close` while draining too).

    `routes`, the user's own, answer what no route of the API matches; `middleware` wraps the
    bearer check and every route, inside `HttpApp` (so an error in either is a JSON 500,
    counted), the first outermost, as in Starlette. `protocol_routes` (A2A's) follow the API's
    own, `public_paths` (a discovery document) are served without a token too."""
    for (method, route), statuses in ROUTE_STATUSES.items():
        api.metrics.expect_http(method, route, statuses)
    # The router's `app`, not the router: its `__call__` only passes requests on to it.
    own = Router(routes=list(routes)).app if routes else None
    table = [*api.routes(), *protocol_routes]
    app: ASGIApp = ApiRouter(routes=table, lifespan=lifespan, default=own).app
    if authenticator is not None:
        open_paths = OPEN_PATHS | public_paths
        open_paths |= api.docs.open_paths if api.docs is not None else frozenset()
        open_paths |= api.console.open_paths if api.console is not None else frozenset()
        if metrics_open:
            open_paths |= {METRICS_PATH}
        app = Authentication(app, authenticator, open_paths)
    for cls, args, kwargs in reversed(middleware):
        app = cls(app, *args, **kwargs)
    return HttpApp(app, registry, api.metrics)
