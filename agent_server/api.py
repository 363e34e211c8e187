"""HTTP API: thin handlers on Starlette's router that translate between HTTP and the registry.

Handlers know nothing of signals: they start work through the registry (admission,
draining), read records from the store (whichever replica ran them), and read the phase.
Every error is JSON `{"detail": ...}`; nothing a client sends yields a 500.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pydantic import ValidationError
from starlette._utils import get_route_path
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route, Router
from starlette.types import ASGIApp, Lifespan, Message, Receive, Scope, Send

from agent_server import jsoncodec
from agent_server.auth import METRICS_PATH, OPEN_PATHS, BearerAuth
from agent_server.docs_page import DocsPage
from agent_server.execution import CancelReason, Execution, ExecutionStatus
from agent_server.http_limits import client_gone
from agent_server.metrics import Metrics
from agent_server.names import SESSION_ID_RULE, is_session_id, is_session_id_bytes
from agent_server.reasoner import Reasoner
from agent_server.registry import AdmissionError, InFlightRegistry, RejectReason
from agent_server.sessions import SessionBusy, SessionReleases
from agent_server.settings import MAX_SECONDS
from agent_server.sse import (
    RECORD_WAIT,
    EventSource,
    EventStream,
    LocalEvents,
    RemoteEvents,
    Streams,
    named,
)
from agent_server.store.base import (
    BadCursor,
    ExecutionRunning,
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    StoreUnavailable,
)
from agent_server.waiting import Closing

logger = logging.getLogger("agent_server.api")

SESSION_HEADER = b"x-session-id"
IDEMPOTENCY_HEADER = b"idempotency-key"
MAX_IDEMPOTENCY_KEY_LENGTH = 255
MAX_WAIT_SECONDS = 60.0
MAX_LIST_LIMIT = 1000
#: Bytes of JSON a list of executions stops at (with `X-Truncated: true`); it always holds
#: the first one. A list of big results would otherwise be built, and pinned by a client
#: that does not read it, whole: 1000 results of 4 MB are 4 GB.
MAX_LIST_BYTES = 4 * 1024 * 1024
RETRY_AFTER_SECONDS = "1"
JSON_MEDIA_TYPES = ("application/json",)
#: Methods counted by name; any other method string a client sends is counted as "other".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class JSONResponse(Response):
    """Strict JSON (see `agent_server.jsoncodec`), its headers built directly: Starlette's
    general `init_headers` is a fifth of the cost of answering a status read."""

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
    (two coroutine layers, a child scope and its merge: 6% of the instructions of a
    synchronous run, bench/RESULTS.md). Everything else (404, 405 and its `Allow`, slash
    redirects, lifespan) takes Starlette's own path, which also sees a path that matches
    with another method first, so the first full match still wins.
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
        self, status_code: int, detail: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(status_code=status_code, detail=detail, headers=headers)
        self.payload = detail


def execution_location(scope: Scope, execution_id: str) -> str:
    """The execution's path as the client must ask for it: under the ASGI `root_path`, the
    prefix the agent is mounted under (or a proxy strips, `--root-path`)."""
    return f"{scope.get('root_path', '')}/executions/{execution_id}"


def _execution_response(
    execution: Execution, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(execution.to_json(), status_code=status_code, headers=headers)


#: What each route answers in ordinary operation, overload and shutdown included: these
#: `http_requests_total` series start at 0 (see `Metrics.expect_http`); reads answer 503
#: while a shared store is unreachable. Rarer answers (401,
#: 405, 413, 415, 499, unmatched paths) appear on first use.
ROUTE_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/reasoners/{name}"): (200, 400, 404, 409, 422, 429, 500, 503),
    ("POST", "/reasoners/{name}/async"): (202, 400, 404, 409, 422, 429, 503),
    ("GET", "/executions/{execution_id}"): (200, 404, 503),
    ("DELETE", "/executions/{execution_id}"): (204, 404, 409, 503),
    ("POST", "/executions/{execution_id}/cancel"): (200, 202, 404, 503),
    ("GET", "/executions/{execution_id}/events"): (200, 400, 404, 503),
    ("GET", "/reasoners"): (200,),
    ("GET", "/executions"): (200, 422, 503),
    ("DELETE", "/sessions/{session_id}"): (200, 409, 503),
    ("GET", "/healthz"): (200,),
    ("GET", "/readyz"): (200, 503),
    ("GET", "/metrics"): (200,),
    ("GET", "/openapi.json"): (200,),
    ("GET", "/docs"): (200,),
    ("GET", "/docs/{name}"): (200, 404),
}


class Api:
    """The routes of the HTTP API, given the parts they use."""

    def __init__(
        self,
        reasoners: dict[str, Reasoner],
        registry: InFlightRegistry,
        store: ExecutionStore,
        releases: SessionReleases,
        metrics: Metrics,
        *,
        phase: Callable[[], str],
        max_body_size: int,
        openapi: Callable[[], dict[str, Any]],
        idempotency_ttl: float = 86_400.0,
        sse_heartbeat: float = 15.0,
        streams_closing: Closing | None = None,
        docs: DocsPage | None = None,
    ) -> None:
        self.reasoners = reasoners
        self.registry = registry
        self.store = store
        self.releases = releases
        self.metrics = metrics
        self.phase = phase
        self.max_body_size = max_body_size
        self.idempotency_ttl = idempotency_ttl
        #: `closing` is set when the listener closes at shutdown: open streams end with a retry.
        self.streams = Streams(sse_heartbeat, streams_closing or Closing(), metrics.stream_opened)
        self.docs = docs
        self.openapi_document = openapi

    def routes(self) -> list[Route]:
        """The hot routes (runs and status reads) first: the router tries them in order."""
        table: list[tuple[str, Handler, list[str]]] = [
            ("/reasoners/{name}", self.run_sync, ["POST"]),
            ("/reasoners/{name}/async", self.run_async, ["POST"]),
            ("/executions/{execution_id}", self.execution, ["GET", "DELETE"]),
            ("/executions/{execution_id}/cancel", self.cancel_execution, ["POST"]),
            ("/executions/{execution_id}/events", self.execution_events, ["GET"]),
            ("/reasoners", self.list_reasoners, ["GET"]),
            ("/executions", self.list_executions, ["GET"]),
            ("/sessions/{session_id}", self.release_session, ["DELETE"]),
            ("/healthz", self.healthz, ["GET"]),
            ("/readyz", self.readyz, ["GET"]),
            ("/metrics", self.scrape, ["GET"]),
            ("/openapi.json", self.openapi, ["GET"]),
        ]
        if self.docs is not None:  # last: people, not programs, read it
            table += [(path, handler, ["GET"]) for path, handler in self.docs.routes()]
        routes = [
            Route(path, Endpoint(handler), methods=methods) for path, handler, methods in table
        ]
        # Any rest of the path is the session id, so an id with a '/' (sent as '%2F', which
        # uvicorn decodes) is refused as an id (400), not missed as a route (404). The
        # template keeps its plain name in metrics and the OpenAPI document.
        sessions = Route(
            "/sessions/{session_id:path}", Endpoint(self.release_session), methods=["DELETE"]
        )
        sessions.path = "/sessions/{session_id}"
        return [sessions if route.path == sessions.path else route for route in routes]

    # -- reasoners -----------------------------------------------------------------------------

    async def list_reasoners(self, request: Request) -> Response:
        return JSONResponse([r.describe() for r in self.reasoners.values()])

    async def run_sync(self, request: Request) -> Response | EventStream:
        if _wants_events(request.scope["headers"]):
            return await self.run_streamed(request)
        execution, started = await self._start(request)
        try:
            ended = await self._wait_or_disconnect(execution, request)
        except asyncio.CancelledError:
            # The server gave up on this request (plain uvicorn's --timeout-graceful-shutdown
            # cancels what is still open): its client is cut off, as if it had gone away.
            if started:
                self.registry.cancel(execution.execution_id, CancelReason.CLIENT_DISCONNECTED)
            raise
        if ended is None:
            if started:  # a repeat of an idempotent request leaves the first one's work be
                self.registry.cancel(execution.execution_id, CancelReason.CLIENT_DISCONNECTED)
            return _execution_response(execution, 499)  # nobody is listening any more
        execution = ended
        if execution.is_terminal and not await self._recorded(execution):
            # No verdict the store may contradict: the client reads the record there.
            return JSONResponse(
                {
                    "detail": "the execution ended, but its end is not recorded in the shared "
                    "store yet (or this attempt no longer owns it): read it at Location",
                    "execution_id": execution.execution_id,
                },
                503,
                {
                    "Retry-After": RETRY_AFTER_SECONDS,
                    "Location": execution_location(request.scope, execution.execution_id),
                },
            )
        if execution.status is ExecutionStatus.SUCCEEDED:
            return _execution_response(execution)
        if execution.status is ExecutionStatus.FAILED:
            return _execution_response(execution, 500)
        if execution.status is ExecutionStatus.QUEUED:  # handed off: follow it elsewhere
            return _execution_response(
                execution,
                503,
                {
                    "Retry-After": RETRY_AFTER_SECONDS,
                    "Location": execution_location(request.scope, execution.execution_id),
                    "Connection": "close",
                },
            )
        if execution.status_reason is CancelReason.SHUTDOWN:
            return _execution_response(
                execution, 503, {"Retry-After": RETRY_AFTER_SECONDS, "Connection": "close"}
            )
        return _execution_response(execution, 409)

    async def _recorded(self, execution: Execution) -> bool:
        """Whether the end is in the store: a copy read from the store, or an end the
        memory store holds, is (no future to wait on); this replica's own end to a shared
        store is once written, within RECORD_WAIT."""
        if execution.recorded is None:
            return True
        return await self.store.recorded(execution, RECORD_WAIT)

    async def run_streamed(self, request: Request) -> EventStream:
        """Start and stream the run: `event: start` (the execution JSON, so a client can
        resume on any replica), its events, then `event: end`. The run does not depend on
        the stream: a client that goes away reconnects to `/executions/{id}/events`."""
        execution, _ = await self._start(request)
        first = named("start", execution.to_json())
        return self._stream(execution, 0, first)

    async def execution_events(self, request: Request) -> EventStream:
        cursor = _event_cursor(request)
        execution = await self._execution(request)
        return self._stream(execution, cursor, None)

    def _stream(self, execution: Execution, cursor: int, first: bytes | None) -> EventStream:
        """Events from this process when it runs the execution (or, with the memory store,
        ran it); else from the shared store."""
        live = self.registry.running(execution.execution_id)
        source: EventSource
        if live is not None:
            source = LocalEvents(live, self.store if self.store.shared else None)
        elif not self.store.shared:
            source = LocalEvents(execution)
        else:
            source = RemoteEvents(self.store, execution)
        return EventStream(self.streams, source, cursor, first)

    async def run_async(self, request: Request) -> Response:
        execution, _ = await self._start(request)
        location = execution_location(request.scope, execution.execution_id)
        return _execution_response(execution, 202, {"Location": location})

    async def _start(self, request: Request) -> tuple[Execution, bool]:
        """Start the execution, or find the one an earlier request with the same
        Idempotency-Key started; True when this request started it."""
        reasoner = self._reasoner(request.path_params["name"])
        headers = _first_values(request.scope["headers"])
        session_id = self._session_id(headers.get(SESSION_HEADER))
        key = _idempotency_key(headers.get(IDEMPOTENCY_HEADER))
        body = await self._read_json(request.receive, headers)
        try:
            arguments = reasoner.bind(body)
        except ValidationError as exc:
            raise ApiError(422, _validation_detail(exc)) from None
        idempotency = (
            None
            if key is None
            else Idempotency(
                key,
                _fingerprint(reasoner.name, session_id, reasoner.canonical(body)),
                self.idempotency_ttl,
            )
        )
        try:
            return await self.registry.start_once(
                reasoner, arguments, session_id, body=body, idempotency=idempotency
            )
        except AdmissionError as exc:
            raise _admission_error(exc.reason) from None
        except IdempotencyMismatch:
            raise ApiError(422, "Idempotency-Key was first used for a different request") from None
        except IdempotencyForgotten:
            raise ApiError(
                409,
                "Idempotency-Key's execution was forgotten (deleted, released or expired): "
                "send a new key to run again",
            ) from None

    def _reasoner(self, name: str) -> Reasoner:
        reasoner = self.reasoners.get(name)
        if reasoner is None:
            raise ApiError(404, f"unknown reasoner: {name!r}")
        return reasoner

    @staticmethod
    def _session_id(raw: bytes | None) -> str | None:
        if raw is None:
            return None
        if not is_session_id_bytes(raw):
            raise ApiError(400, f"invalid X-Session-ID: {SESSION_ID_RULE}")
        return raw.decode("ascii")

    async def _read_json(self, receive: Receive, headers: dict[bytes, bytes]) -> Any:
        """The body as JSON, within the size limit; an empty body is None."""
        limit = self.max_body_size
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ApiError(413, f"request body exceeds {limit} bytes")
        raw = await _read_body(receive, limit)
        if not raw.strip():
            return None
        content_type = headers.get(b"content-type")
        if content_type is not None:
            media_type = content_type.decode("latin-1").split(";", 1)[0].strip().lower()
            if media_type not in JSON_MEDIA_TYPES and not media_type.endswith("+json"):
                raise ApiError(415, f"unsupported content type {media_type!r}: send JSON")
        try:
            body = jsoncodec.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(400, f"malformed JSON body: {jsoncodec.short_error(exc)}") from None
        try:  # what is accepted must be written back the same (idempotency, hand-off)
            jsoncodec.check(body, "the body")
        except jsoncodec.Unrecordable as exc:
            raise ApiError(400, str(exc)) from None
        return body

    async def _wait_or_disconnect(self, execution: Execution, request: Request) -> Execution | None:
        """The execution once it has ended (or was handed off); None when the client went
        away first. Work this replica runs is waited for here; other work (a repeat of an
        idempotent request) through the store."""
        await asyncio.sleep(0)  # a reasoner that never suspends ends in its task's first step
        if execution.is_terminal:  # so no watcher tasks for it (a third of a sync run's cost)
            return execution
        local = self.registry.running(execution.execution_id) is execution
        ended: asyncio.Task[object] = asyncio.create_task(
            execution.wait(None) if local else self.store.wait(execution, None)
        )
        gone, reader = client_gone(request.scope, request.receive)
        try:
            watched: set[asyncio.Future[Any]] = {ended, gone}
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watchers = [ended] if reader is None else [ended, reader]
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        if local:
            return execution if await execution.wait(0) else None
        if ended.done() and not ended.cancelled() and ended.exception() is None:
            latest = ended.result()
            assert isinstance(latest, Execution)
            return latest
        return None

    # -- executions ----------------------------------------------------------------------------

    async def execution(self, request: Request) -> Response:
        """One route for both methods, so a 405 names them both in `Allow`."""
        if request.method == "DELETE":
            return await self.delete_execution(request)
        return await self.get_execution(request)

    async def get_execution(self, request: Request) -> Response:
        execution = await self._execution(request)
        # Finite, and any size: a wait past MAX_WAIT_SECONDS is capped, as documented.
        wait = _float_param(request, "wait", minimum=0.0, maximum=math.inf)
        if wait is not None and wait > 0 and not execution.is_terminal:
            return await self._long_poll(execution, min(wait, MAX_WAIT_SECONDS))
        return _execution_response(execution)

    async def _long_poll(self, execution: Execution, timeout: float) -> Response:
        """The execution once terminal or after `timeout`; when the listener closes first
        (shutdown), as it is now, with `Connection: close`, so the client polls again on
        another replica instead of being cut into a 500 by the http phase's end."""
        closing = self.streams.closing
        if closing.is_set():
            return _execution_response(execution, headers={"Connection": "close"})
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.waiters.add(closed)
        waiting = asyncio.ensure_future(self.store.wait(execution, timeout))
        watched: set[asyncio.Future[Any]] = {waiting, closed}
        try:
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.waiters.discard(closed)
            if not waiting.done():
                waiting.cancel()
                await asyncio.gather(waiting, return_exceptions=True)
        if waiting.cancelled():
            return _execution_response(execution, headers={"Connection": "close"})
        return _execution_response(waiting.result())

    async def cancel_execution(self, request: Request) -> Response:
        execution = await self._execution(request)
        if execution.is_terminal:
            return _execution_response(execution)
        await self.store.request_cancel(execution, CancelReason.REQUEST, None)
        if execution.status is ExecutionStatus.QUEUED:
            # Nobody runs it: it ended where it waited (or was taken meanwhile: 202 then).
            now = await self.store.get(execution.execution_id)
            if now is not None and now.is_terminal:
                return _execution_response(now)
            return _execution_response(now or execution, 202)
        return _execution_response(execution, 202)

    async def delete_execution(self, request: Request) -> Response:
        try:
            known = await self.store.forget(request.path_params["execution_id"])
        except ExecutionRunning as exc:
            raise ApiError(409, f"execution is {exc.status}: cancel it first") from None
        if not known:
            raise ApiError(404, "unknown execution")
        return Response(status_code=204)

    async def list_executions(self, request: Request) -> Response:
        limit = _int_param(request, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        after = request.query_params.get("cursor")
        try:
            page = await self.store.page(
                statuses=_statuses(request),
                reasoner=request.query_params.get("reasoner"),
                session_id=_checked_session_id(
                    request.query_params.get("session_id"), "session_id"
                ),
                limit=100 if limit is None else limit,
                max_bytes=MAX_LIST_BYTES,
                after=after,
            )
        except BadCursor:
            raise ApiError(400, "cursor is not one a Link header of this list gave") from None
        body, shown = _list_body(page.executions)
        headers: dict[str, str] = {}
        following = page.cursors[shown - 1] if shown < len(page.executions) else page.next
        if shown < len(page.executions):
            headers["X-Truncated"] = "true"
        if following is not None:
            headers["Link"] = _next_link(request, following)
        return Response(body, media_type="application/json", headers=headers)

    async def _execution(self, request: Request) -> Execution:
        execution = await self.store.get(request.path_params["execution_id"])
        if execution is None:
            raise ApiError(404, "unknown execution")
        return execution

    # -- sessions ------------------------------------------------------------------------------

    async def release_session(self, request: Request) -> Response:
        session_id = _checked_session_id(request.path_params["session_id"], "session id")
        assert session_id is not None
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
            release = await self.releases.release(
                session_id, timeout=timeout, cancel_running=cancel_value in ("true", "1")
            )
        except SessionBusy:
            raise ApiError(409, "session has running executions and cancel_running=false") from None
        return JSONResponse(release.to_json())

    # -- health, metrics, schema ------------------------------------------------------------

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "phase": self.phase()})

    async def readyz(self, request: Request) -> Response:
        if self.registry.draining:
            return JSONResponse({"status": "draining", "phase": self.phase()}, 503)
        if not self.store.up:
            return JSONResponse({"status": "store unavailable", "phase": self.phase()}, 503)
        return JSONResponse({"status": "ready", "phase": self.phase()})

    async def scrape(self, request: Request) -> Response:
        return Response(
            self.metrics.exposition(),
            media_type="text/plain; version=0.0.4; charset=utf-8",
        )

    async def openapi(self, request: Request) -> Response:
        document = self.openapi_document()
        root_path = request.scope.get("root_path", "")
        if root_path:  # mounted or behind a proxy: "Try it out" calls under the prefix too
            document = {**document, "servers": [{"url": root_path}]}
        return JSONResponse(document)


# -- helpers ---------------------------------------------------------------------------------


def _first_values(raw_headers: list[tuple[bytes, bytes]]) -> dict[bytes, bytes]:
    """Each header's first value by its (lower-case, per ASGI) name, in one pass."""
    return dict(reversed(raw_headers))


async def _read_body(receive: Receive, limit: int) -> bytes:
    """The whole body, or ApiError: 413 past `limit`, 499 when the client goes away (nobody
    to answer; not a server error worth a traceback)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(499, "client disconnected before sending its body")
        chunk: bytes = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)  # one chunk, the usual case, is returned as it is


def _list_body(executions: list[Execution]) -> tuple[bytes, int]:
    """A JSON list of the executions, in order, stopped before `MAX_LIST_BYTES` would be
    passed (the first always goes in); how many it holds."""
    parts: list[bytes] = []
    size = 2
    for execution in executions:
        part = jsoncodec.dumps(execution.to_json())
        size += len(part) + 1
        if parts and size > MAX_LIST_BYTES:
            break
        parts.append(part)
    return b"[" + b",".join(parts) + b"]", len(parts)


def _statuses(request: Request) -> frozenset[ExecutionStatus]:
    """`status`, repeated or as a comma list: any of them matches."""
    found: set[ExecutionStatus] = set()
    for value in request.query_params.getlist("status"):
        for each in value.split(","):
            try:
                found.add(ExecutionStatus(each.strip()))
            except ValueError:
                allowed = ", ".join(s.value for s in ExecutionStatus)
                raise ApiError(422, f"status must be one of: {allowed}") from None
    return frozenset(found)


def _next_link(request: Request, cursor: str) -> str:
    """RFC 8288: the same list (path as received, mount prefix included; the same filters)
    from `cursor` on. A path without a host: behind a proxy the host is the proxy's."""
    query = [(k, v) for k, v in request.query_params.multi_items() if k != "cursor"]
    query.append(("cursor", cursor))
    return f'<{request.url.path}?{urllib.parse.urlencode(query)}>; rel="next"'


def _checked_session_id(value: str | None, where: str) -> str | None:
    """The same rule as `X-Session-ID`, for a session id in a path or a query: an id no
    request could have carried is a 400, not a silent miss."""
    if value is not None and not is_session_id(value):
        raise ApiError(400, f"invalid {where}: {SESSION_ID_RULE}")
    return value


def _wants_events(raw_headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"accept" and b"text/event-stream" in value for name, value in raw_headers)


def _event_cursor(request: Request) -> int:
    """The last event a client has: `Last-Event-ID`, else `?after=N`, else 0."""
    raw = request.headers.get("last-event-id")
    name = "Last-Event-ID"
    if raw is None:
        raw = _query_param(request, "after")
        name = "after"
    if raw is None or raw == "":
        return 0
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise ApiError(400, f"{name} must be an event number (a non-negative integer)")
    return int(raw)


def _idempotency_key(raw: bytes | None) -> str | None:
    """1 to 255 printable ASCII characters, or 400."""
    if raw is None:
        return None
    if not 0 < len(raw) <= MAX_IDEMPOTENCY_KEY_LENGTH or not all(0x20 <= b < 0x7F for b in raw):
        raise ApiError(
            400,
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_LENGTH} printable ASCII characters",
        )
    return raw.decode("ascii")


def _fingerprint(reasoner: str, session_id: str | None, body: Any) -> str:
    """What makes two requests the same: reasoner, session and the body as the reasoner
    reads it (`Reasoner.canonical`; as JSON, keys sorted)."""
    canonical = json.dumps([reasoner, session_id, body], sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def _admission_error(reason: RejectReason) -> ApiError:
    retry = {"Retry-After": RETRY_AFTER_SECONDS}
    if reason is RejectReason.CAPACITY:
        return ApiError(429, "too many executions in flight", retry)
    if reason is RejectReason.SESSION_RELEASED:
        return ApiError(409, "session is being released")
    if reason is RejectReason.STORE_UNAVAILABLE:
        return ApiError(503, "execution store unavailable", retry)
    return ApiError(503, "server is shutting down", {**retry, "Connection": "close"})


def _validation_detail(exc: ValidationError) -> list[dict[str, Any]]:
    """Pydantic's error list without echoing internals (`url`, `ctx` objects), made of JSON
    data that UTF-8 can always carry: the input echoed back may hold a lone surrogate (a
    valid JSON escape), which pydantic's own `json()` cannot encode (a 500 otherwise)."""
    errors = exc.errors(include_url=False, include_context=False)
    return [{key: _encodable(value) for key, value in error.items()} for error in errors]


def _encodable(value: Any) -> Any:
    """JSON data whose strings all encode to UTF-8: a string that does not is sent with
    its unencodable characters backslash-escaped (`"\\ud800"`); what is not JSON data
    (a validator's own input) is sent as its repr."""
    if isinstance(value, str):
        try:
            value.encode()
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode()
        return value
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {_encodable(str(key)): _encodable(item) for key, item in value.items()}
    return _encodable(repr(value))


def _query_param(request: Request, name: str) -> str | None:
    """Most requests carry no query string: skip parsing one (a third of a status read)."""
    if not request.scope["query_string"]:
        return None
    return request.query_params.get(name)


def _float_param(
    request: Request, name: str, *, minimum: float, maximum: float = MAX_SECONDS
) -> float | None:
    """A duration parameter: finite and within what the clock and Redis TTLs take (as
    every duration setting is), else 422 naming it."""
    value = _query_param(request, name)
    if value is None:
        return None
    try:
        number = float(value)
    except ValueError:
        raise ApiError(422, f"{name} must be a number") from None
    if not math.isfinite(number) or not minimum <= number <= maximum:
        raise ApiError(422, f"{name} must be a finite number from {minimum:g} to {maximum:g}")
    return number


def _int_param(request: Request, name: str, *, minimum: int, maximum: int) -> int | None:
    value = _query_param(request, name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ApiError(422, f"{name} must be an integer") from None
    if not minimum <= number <= maximum:
        raise ApiError(422, f"{name} must be between {minimum} and {maximum}")
    return number


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
    return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=headers)


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
    token: str | None,
    registry: InFlightRegistry,
    *,
    metrics_open: bool = False,
    routes: Sequence[BaseRoute] = (),
    middleware: Sequence[Middleware] = (),
) -> ASGIApp:
    """The routes of `api`, behind the bearer check when a token is set (the probes always
    open, `/metrics` with `metrics_open`), inside `HttpApp` (so 401s are counted and get
    `Connection: close` while draining too).

    `routes`, the user's own, answer what no route of the API matches; `middleware` wraps the
    bearer check and every route, inside `HttpApp` (so an error in either is a JSON 500,
    counted), the first outermost, as in Starlette."""
    for (method, route), statuses in ROUTE_STATUSES.items():
        api.metrics.expect_http(method, route, statuses)
    # The router's `app`, not the router: its `__call__` only passes requests on to it.
    own = Router(routes=list(routes)).app if routes else None
    app: ASGIApp = ApiRouter(routes=api.routes(), lifespan=lifespan, default=own).app
    if token is not None:
        open_paths = OPEN_PATHS | (api.docs.open_paths if api.docs is not None else frozenset())
        if metrics_open:
            open_paths |= {METRICS_PATH}
        app = BearerAuth(app, token, open_paths)
    for cls, args, kwargs in reversed(middleware):
        app = cls(app, *args, **kwargs)
    return HttpApp(app, registry, api.metrics)
