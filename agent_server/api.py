"""HTTP API: thin Starlette handlers that translate between HTTP and the registry.

Handlers know nothing of signals: they read the registry (admission, draining) and the
agent's phase. Every error is JSON `{"detail": ...}`; nothing a client sends yields a 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agent_server.auth import BearerAuth
from agent_server.execution import CancelReason, Execution, ExecutionStatus
from agent_server.openapi import openapi_document
from agent_server.reasoner import Reasoner
from agent_server.registry import (
    AdmissionError,
    ExecutionNotFound,
    ExecutionRunning,
    RejectReason,
    SessionBusy,
)

if TYPE_CHECKING:
    from agent_server.agent import Agent

logger = logging.getLogger("agent_server.api")

SESSION_HEADER = "x-session-id"
MAX_WAIT_SECONDS = 60.0
MAX_LIST_LIMIT = 1000
MAX_SESSION_ID_LENGTH = 256
RETRY_AFTER_SECONDS = "1"
JSON_MEDIA_TYPES = ("application/json",)
#: Methods counted by name; any other method string a client sends is counted as "other".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class JSONResponse(StarletteJSONResponse):
    """Strict JSON escaped to ASCII: a lone surrogate a client sent (a valid JSON escape that
    UTF-8 cannot encode) goes back out as an escape, never as a 500 on every later read."""

    def render(self, content: Any) -> bytes:
        text = json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
        return text.encode("ascii")


class ApiError(HTTPException):
    """An HTTP error with a JSON detail and optional headers."""

    def __init__(
        self, status_code: int, detail: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=headers)
        self.payload = detail


def _execution_response(
    execution: Execution, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(execution.to_json(), status_code=status_code, headers=headers)


class Api:
    """The routes of DESIGN.md section 3, bound to one agent."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.registry = agent.registry

    def routes(self) -> list[Route]:
        return [
            Route("/reasoners", self.list_reasoners, methods=["GET"]),
            Route("/reasoners/{name}", self.run_sync, methods=["POST"]),
            Route("/reasoners/{name}/async", self.run_async, methods=["POST"]),
            Route("/executions", self.list_executions, methods=["GET"]),
            Route("/executions/{execution_id}", self.execution, methods=["GET", "DELETE"]),
            Route("/executions/{execution_id}/cancel", self.cancel_execution, methods=["POST"]),
            Route("/sessions/{session_id}", self.release_session, methods=["DELETE"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    # -- reasoners -----------------------------------------------------------------------------

    async def list_reasoners(self, request: Request) -> Response:
        return JSONResponse([r.describe() for r in self.agent.reasoners.values()])

    async def run_sync(self, request: Request) -> Response:
        execution = await self._start(request)
        if not await self._wait_or_disconnect(execution, request):
            self.registry.cancel(execution.execution_id, CancelReason.CLIENT_DISCONNECTED)
            return _execution_response(execution, 499)  # nobody is listening any more
        if execution.status is ExecutionStatus.SUCCEEDED:
            return _execution_response(execution)
        if execution.status is ExecutionStatus.FAILED:
            return _execution_response(execution, 500)
        if execution.status_reason is CancelReason.SHUTDOWN:
            return _execution_response(
                execution, 503, {"Retry-After": RETRY_AFTER_SECONDS, "Connection": "close"}
            )
        return _execution_response(execution, 409)

    async def run_async(self, request: Request) -> Response:
        execution = await self._start(request)
        location = f"/executions/{execution.execution_id}"
        return _execution_response(execution, 202, {"Location": location})

    async def _start(self, request: Request) -> Execution:
        reasoner = self._reasoner(request.path_params["name"])
        session_id = self._session_id(request)
        body = await self._read_json(request)
        try:
            arguments = reasoner.bind(body)
        except ValidationError as exc:
            raise ApiError(422, _validation_detail(exc)) from None
        try:
            return self.registry.start(reasoner, arguments, session_id)
        except AdmissionError as exc:
            raise _admission_error(exc.reason) from None

    def _reasoner(self, name: str) -> Reasoner:
        reasoner = self.agent.reasoners.get(name)
        if reasoner is None:
            raise ApiError(404, f"unknown reasoner: {name!r}")
        return reasoner

    @staticmethod
    def _session_id(request: Request) -> str | None:
        value = request.headers.get(SESSION_HEADER)
        if value is None:
            return None
        if not 0 < len(value) <= MAX_SESSION_ID_LENGTH or not value.isprintable():
            raise ApiError(
                400, f"X-Session-ID must be 1 to {MAX_SESSION_ID_LENGTH} printable characters"
            )
        return value

    async def _read_json(self, request: Request) -> Any:
        """The body as JSON, within the size limit; an empty body is None."""
        limit = self.agent.settings.max_body_size
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise ApiError(413, f"request body exceeds {limit} bytes")
                chunks.append(chunk)
        except ClientDisconnect:  # nobody to answer; not a server error worth a traceback
            raise ApiError(499, "client disconnected before sending its body") from None
        raw = b"".join(chunks)
        if not raw.strip():
            return None
        content_type = request.headers.get("content-type")
        if content_type is not None:
            media_type = content_type.split(";", 1)[0].strip().lower()
            if media_type not in JSON_MEDIA_TYPES and not media_type.endswith("+json"):
                raise ApiError(415, f"unsupported content type {media_type!r}: send JSON")
        try:
            return json.loads(raw, parse_constant=_refuse_constant, parse_float=_finite_float)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"malformed JSON body: {_short(exc)}") from None

    async def _wait_or_disconnect(self, execution: Execution, request: Request) -> bool:
        """Wait for the execution's end; False when the client went away first."""
        await asyncio.sleep(0)  # a reasoner that never suspends ends in its task's first step
        if execution.is_terminal:  # so no watcher tasks for it (a third of a sync run's cost)
            return True
        ended = asyncio.create_task(execution.wait(None))
        gone = asyncio.create_task(_disconnected(request.receive))
        try:
            await asyncio.wait({ended, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (ended, gone):
                task.cancel()
            await asyncio.gather(ended, gone, return_exceptions=True)
        return execution.is_terminal

    # -- executions ----------------------------------------------------------------------------

    async def execution(self, request: Request) -> Response:
        """One route for both methods, so a 405 names them both in `Allow`."""
        if request.method == "DELETE":
            return await self.delete_execution(request)
        return await self.get_execution(request)

    async def get_execution(self, request: Request) -> Response:
        execution = self._execution(request)
        wait = _float_param(request, "wait", minimum=0.0)
        if wait is not None and wait > 0:
            await execution.wait(min(wait, MAX_WAIT_SECONDS))
        return _execution_response(execution)

    async def cancel_execution(self, request: Request) -> Response:
        execution = self._execution(request)
        if execution.is_terminal:
            return _execution_response(execution)
        self.registry.cancel(execution.execution_id, CancelReason.REQUEST)
        return _execution_response(execution, 202)

    async def delete_execution(self, request: Request) -> Response:
        execution = self._execution(request)
        try:
            self.registry.forget(execution.execution_id)
        except ExecutionRunning:
            raise ApiError(409, "execution is running: cancel it first") from None
        return Response(status_code=204)

    async def list_executions(self, request: Request) -> Response:
        status_value = request.query_params.get("status")
        status: ExecutionStatus | None = None
        if status_value is not None:
            try:
                status = ExecutionStatus(status_value)
            except ValueError:
                allowed = ", ".join(s.value for s in ExecutionStatus)
                raise ApiError(422, f"status must be one of: {allowed}") from None
        limit = _int_param(request, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        executions = self.registry.list_executions(
            status=status,
            reasoner=request.query_params.get("reasoner"),
            session_id=request.query_params.get("session_id"),
            limit=100 if limit is None else limit,
        )
        return JSONResponse([e.to_json() for e in executions])

    def _execution(self, request: Request) -> Execution:
        execution_id = request.path_params["execution_id"]
        try:
            return self.registry.get(execution_id)
        except ExecutionNotFound:
            raise ApiError(404, "unknown execution") from None

    # -- sessions ------------------------------------------------------------------------------

    async def release_session(self, request: Request) -> Response:
        session_id = request.path_params["session_id"]
        timeout_value = request.query_params.get("timeout", "30")
        timeout: float | None
        if timeout_value.lower() == "none":
            timeout = None
        else:
            timeout = _float_param(request, "timeout", minimum=0.0)
        cancel_value = request.query_params.get("cancel_running", "true").lower()
        if cancel_value not in ("true", "false", "1", "0"):
            raise ApiError(422, "cancel_running must be true or false")
        try:
            release = await self.registry.release_session(
                session_id, timeout=timeout, cancel_running=cancel_value in ("true", "1")
            )
        except SessionBusy:
            raise ApiError(409, "session has running executions and cancel_running=false") from None
        return JSONResponse(release.to_json())

    # -- health, metrics, schema ------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "phase": self.agent.phase.value})

    async def readyz(self, request: Request) -> Response:
        if self.registry.draining:
            return JSONResponse({"status": "draining", "phase": self.agent.phase.value}, 503)
        return JSONResponse({"status": "ready", "phase": self.agent.phase.value})

    async def metrics(self, request: Request) -> Response:
        return Response(
            self.agent.metrics.exposition(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def openapi(self, request: Request) -> Response:
        secured = self.agent.settings.bearer_token is not None
        document = openapi_document(self.agent.name, self.agent.reasoners.values(), secured=secured)
        return JSONResponse(document)


# -- helpers ---------------------------------------------------------------------------------


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def _admission_error(reason: RejectReason) -> ApiError:
    retry = {"Retry-After": RETRY_AFTER_SECONDS}
    if reason is RejectReason.CAPACITY:
        return ApiError(429, "too many executions in flight", retry)
    if reason is RejectReason.SESSION_RELEASED:
        return ApiError(409, "session is being released")
    return ApiError(503, "server is shutting down", {**retry, "Connection": "close"})


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's error list without echoing internals (`url`, `ctx` objects)."""
    return json.loads(exc.json(include_url=False, include_context=False))  # type: ignore[no-any-return]


def _refuse_constant(name: str) -> Any:
    """NaN and Infinity are not JSON (RFC 8259), though Python's parser accepts them."""
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    """A number too large for a float (1e999) would silently become infinity."""
    number = float(text)
    if not math.isfinite(number):
        raise ValueError(f"number out of range: {_short(ValueError(text))}")
    return number


def _short(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


def _float_param(request: Request, name: str, *, minimum: float) -> float | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise ApiError(422, f"{name} must be a number") from None
    if not math.isfinite(number) or number < minimum:
        raise ApiError(422, f"{name} must be a finite number >= {minimum:g}")
    return number


def _int_param(request: Request, name: str, *, minimum: int, maximum: int) -> int | None:
    value = request.query_params.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ApiError(422, f"{name} must be an integer") from None
    if not minimum <= number <= maximum:
        raise ApiError(422, f"{name} must be between {minimum} and {maximum}")
    return number


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    headers = dict(exc.headers or {})
    if exc.status_code in (204, 304):
        return Response(status_code=exc.status_code, headers=headers)
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse({"detail": "internal server error"}, status_code=500)


class HttpMiddleware:
    """Counts every response by route template and adds `Connection: close` while draining."""

    def __init__(self, app: ASGIApp, agent: Agent) -> None:
        self.app = app
        self.agent = agent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        registry = self.agent.registry

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if registry.draining:
                    headers = [(k, v) for k, v in message.get("headers", []) if k != b"connection"]
                    headers.append((b"connection", b"close"))
                    message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope["method"] if scope["method"] in KNOWN_METHODS else "other"
            self.agent.metrics.http_request(method, template, status, time.perf_counter() - started)


def build_app(agent: Agent) -> ASGIApp:
    """The Starlette app for `agent`, behind the bearer check when a token is set, wrapped in
    the HTTP middleware (so 401s are counted and get `Connection: close` while draining)."""
    api = Api(agent)
    app: ASGIApp = Starlette(
        routes=api.routes(),
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
        lifespan=agent.lifespan,
    )
    token = agent.settings.bearer_token
    if token is not None:
        app = BearerAuth(app, token)
    return HttpMiddleware(app, agent)
