"""Starlette's router with a shortcut for the usual request, and the responses it writes.

`ApiRouter` sends a request that matches a route in full straight to its endpoint; every
other request (404, 405, slash redirects, lifespan) takes Starlette's own path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette._utils import get_route_path
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from agent_server.http.sse import EventStream
from agent_server.model import jsoncodec
from agent_server.model.execution import Execution
from agent_server.service.refusals import IN_DOUBT_DETAIL, Refusal, Why

#: The `Retry-After` of a refusal a client may send again at once elsewhere (or here soon).
RETRY_AFTER_SECONDS = "1"


class JSONResponse(Response):
    """Strict JSON (see `agent_server.model.jsoncodec`), its headers built directly: Starlette's
    general `init_headers` costs every response (bench/RESULTS.md)."""

    media_type = "application/json"

    def __init__(
        self, content: Any, status_code: int = 200, headers: dict[str, str] | None = None
    ) -> None:
        self.status_code = status_code
        self.background = None
        self.body = jsoncodec.dumps(content)
        self.raw_headers = [
            (b"content-length", b"%d" % len(self.body)),
            (b"content-type", b"application/json"),
        ]
        if headers:
            self.raw_headers += [(k.lower().encode(), v.encode()) for k, v in headers.items()]


Handler = Callable[[Request], Awaitable[Response | EventStream]]


class Endpoint:
    """One handler as an ASGI app: Starlette's `request_response` without its per-request
    exception-handler plumbing, since `HttpApp` answers every error in one place."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)


class ApiRouter(Router):
    """Starlette's router, with a shortcut for a request that matches a route in full.

    Such a request goes straight to the route's endpoint, set up as `Router.app` would set
    it up (`route`, `endpoint`, `path_params`), without the general matching bookkeeping
    (two coroutine layers, a child scope and its merge; bench/RESULTS.md). Everything else
    (404, 405 and its `Allow`, slash redirects, lifespan) takes Starlette's own path, which
    also sees a path that matches with another method first, so the first full match still
    wins.
    """

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = get_route_path(scope)
            for route in self.routes:
                assert isinstance(route, Route)
                match = route.path_regex.match(path)
                if match is None:
                    continue
                if route.methods is None or scope["method"] not in route.methods:
                    break
                params = match.groupdict()
                for key, convertor in route.param_convertors.items():
                    params[key] = convertor.convert(params[key])
                scope["router"] = self
                scope["route"] = route
                scope["endpoint"] = route.endpoint
                scope["path_params"] = params
                endpoint = route.app
                assert isinstance(endpoint, Endpoint)  # every route's (Api.routes)
                # Endpoint.__call__, inline: one frame less held by every request in flight
                response = await endpoint.handler(Request(scope, receive))
                await response(scope, receive, send)
                return
        await Router.app(self, scope, receive, send)


class ApiError(HTTPException):
    """An HTTP error with a JSON detail and optional headers."""

    def __init__(
        self,
        status_code: int,
        detail: Any,
        headers: dict[str, str] | None = None,
        *,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=headers)
        self.payload = detail
        #: More members of the JSON error beside `detail` (a 409's `execution_id`).
        self.extra = extra


def execution_location(scope: Scope, execution_id: str) -> str:
    """The execution's path as the client must ask for it: under the ASGI `root_path`, the
    prefix the agent is mounted under (or a proxy strips, `--root-path`)."""
    return f"{scope.get('root_path', '')}/executions/{execution_id}"


def in_doubt(scope: Scope, execution_id: str) -> ApiError:
    """503 for a write the shared store ran but no replica was seen to hold (Sentinel): not
    the 202 a failover could take back, not a refusal; the record says later what it became."""
    return ApiError(
        503,
        IN_DOUBT_DETAIL,
        {"Retry-After": "1", "Location": execution_location(scope, execution_id)},
        extra={"execution_id": execution_id, "in_doubt": True},
    )


#: The status of each refusal of the application layer (service/refusals.py).
REFUSAL_STATUS: dict[Why, int] = {
    Why.INVALID: 400,
    Why.UNPROCESSABLE: 422,
    Why.UNKNOWN: 404,
    Why.DENIED: 403,
    Why.CONFLICT: 409,
    Why.KEY_MISMATCH: 422,
    Why.KEY_FORGOTTEN: 409,
    Why.SESSION_BUSY: 409,
    Why.SESSION_RELEASING: 409,
    Why.TOO_LARGE: 413,
    Why.BUSY: 429,
    Why.UNAVAILABLE: 503,
    Why.IN_DOUBT: 503,
    Why.SHUTTING_DOWN: 503,
}
if set(REFUSAL_STATUS) != set(Why):
    raise RuntimeError("REFUSAL_STATUS must give every refusal a status")


def refusal_error(scope: Scope, refusal: Refusal, detail: Any = None) -> ApiError:
    """The HTTP error of a refusal (`detail`: the front's own words for it, if any): a
    retry's `Retry-After`, a shutdown's `Connection: close`, and an execution it is about as
    `execution_id` (with its `Location` when the caller should read it: a start in doubt)."""
    why, execution_id = refusal.why, refusal.execution_id
    headers: dict[str, str] = {}
    extra: dict[str, Any] | None = None
    if why in (Why.BUSY, Why.UNAVAILABLE, Why.IN_DOUBT, Why.SHUTTING_DOWN):
        headers["Retry-After"] = RETRY_AFTER_SECONDS
    if why is Why.SHUTTING_DOWN:
        headers["Connection"] = "close"
    if execution_id is not None:
        extra = {"execution_id": execution_id}
        if why in (Why.IN_DOUBT, Why.SHUTTING_DOWN):
            headers["Location"] = execution_location(scope, execution_id)
            extra["in_doubt"] = True
    return ApiError(
        REFUSAL_STATUS[why],
        refusal.detail if detail is None else detail,
        headers or None,
        extra=extra,
    )


def execution_response(
    execution: Execution, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    """The execution's JSON, the one body every route about an execution answers with."""
    return JSONResponse(execution.to_json(), status_code=status_code, headers=headers)


def acceptance(scope: Scope, execution_id: str) -> JSONResponse:
    """A start's answer to a caller `@agent.authorize` lets start but not read: 202, the id
    and its Location, nothing of the record (docs/security.md#what-each-call-asks)."""
    location = execution_location(scope, execution_id)
    return JSONResponse({"execution_id": execution_id}, 202, {"Location": location})
