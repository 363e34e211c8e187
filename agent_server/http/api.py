"""The HTTP API's handlers: thin, translating between HTTP and the registry and the store.

Handlers know nothing of signals: they start work through the registry (admission,
draining), read records from the store (whichever replica ran them), and read the phase.
Every error is JSON `{"detail": ...}`; nothing a client sends yields a 500.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope

from agent_server.http import answers
from agent_server.http.docs_page import DocsPage
from agent_server.http.http_limits import client_gone
from agent_server.http.params import (
    checked_session_id,
    delay_param,
    event_cursor,
    first_values,
    float_param,
    idempotency_key,
    int_param,
    list_cursor,
    next_link,
    query_param,
    read_body,
    reasoner_filter,
    statuses,
    validation_detail,
    wants_events,
    webhook_target,
)
from agent_server.http.routing import (
    ApiError,
    Endpoint,
    Handler,
    JSONResponse,
    execution_location,
    in_doubt,
)
from agent_server.http.sse import (
    EventSource,
    EventStream,
    LocalEvents,
    RemoteEvents,
    Streams,
    named,
    recorded_before_close,
)
from agent_server.model import jsoncodec
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import SESSION_ID_RULE, is_session_id_bytes
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import SessionPolicy
from agent_server.model.waiting import Closing
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import AdmissionError, InFlightRegistry, RejectReason
from agent_server.runtime.sessions import SessionBusy, SessionReleases
from agent_server.store.base import (
    ExecutionRunning,
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    SessionTaken,
    StoreInDoubt,
    StoreUnavailable,
)

logger = logging.getLogger("agent_server.http.api")


class _ListenerClosed(Exception):
    """A sync run's wait met the listener's close while its work runs nowhere here."""


SESSION_HEADER = b"x-session-id"
IDEMPOTENCY_HEADER = b"idempotency-key"
WEBHOOK_HEADER = b"x-webhook-url"
MAX_WAIT_SECONDS = 60.0
MAX_LIST_LIMIT = 1000
#: Bytes of JSON a list of executions stops at (with `X-Truncated: true`); it always holds
#: the first one. A list of big results would otherwise be built, and pinned by a client
#: that does not read it, whole: 1000 results of 4 MB are 4 GB.
MAX_LIST_BYTES = 4 * 1024 * 1024
RETRY_AFTER_SECONDS = "1"
JSON_MEDIA_TYPES = ("application/json",)


#: What a synchronous run answers, by the status its wait returns at: every status of the
#: state machine (agent_server/model/status.py) but `running`, `queued` included (handed off to
#: another replica at the drain deadline: 503 with its Location). A status added to the table
#: without an answer here stops the import, not a request.
SYNC_ANSWER: dict[ExecutionStatus, int] = {
    ExecutionStatus.SUCCEEDED: 200,
    ExecutionStatus.FAILED: 500,
    ExecutionStatus.CANCELLED: 409,
    ExecutionStatus.LOST: 409,
    ExecutionStatus.QUEUED: 503,
    # Its reasoner waits for input (ctx.ask): 202 with its Location; it goes on once answered.
    ExecutionStatus.INPUT_REQUIRED: 202,
}
if set(SYNC_ANSWER) != set(ExecutionStatus) - {ExecutionStatus.RUNNING}:
    raise RuntimeError("SYNC_ANSWER must answer every status but running")

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
    ("POST", "/executions/{execution_id}/input"): (202, 400, 404, 409, 422, 503),
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
        webhooks: bool = False,
        webhook_url: str | None = None,
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
        #: Whether webhooks are on (a secret is set), and where they go by default.
        self.webhooks = webhooks
        self.webhook_url = webhook_url

    def routes(self) -> list[Route]:
        """The hot routes (runs and status reads) first: the router tries them in order."""
        table: list[tuple[str, Handler, list[str]]] = [
            ("/reasoners/{name}", self.run_sync, ["POST"]),
            ("/reasoners/{name}/async", self.run_async, ["POST"]),
            ("/executions/{execution_id}", self.execution, ["GET", "DELETE"]),
            ("/executions/{execution_id}/cancel", self.cancel_execution, ["POST"]),
            ("/executions/{execution_id}/events", self.execution_events, ["GET"]),
            ("/executions/{execution_id}/input", self.answer_input, ["POST"]),
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
        if wants_events(request.scope["headers"]):
            return await self.run_streamed(request)
        execution, started = await self._start(request)
        location = execution_location(request.scope, execution.execution_id)
        try:
            ended = await self._wait_or_disconnect(execution, request)
        except _ListenerClosed:
            # Shutdown, and its work waits in the queue (or runs elsewhere): another replica
            # may run it, and the client follows it there.
            return _execution_response(
                execution,
                503,
                {"Retry-After": RETRY_AFTER_SECONDS, "Location": location, "Connection": "close"},
            )
        except asyncio.CancelledError:
            # The server gave up on this request (plain uvicorn's --timeout-graceful-shutdown
            # cancels what is still open): its client is cut off, as if it had gone away.
            if started:
                self.registry.cancel(execution.execution_id, CancelReason.CLIENT_DISCONNECTED)
            raise
        if ended is None:
            if started:  # a repeat of an idempotent request leaves the first one's work be
                await self._cancel_for_caller(execution)
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
        status_code = SYNC_ANSWER[execution.status]
        if execution.status is ExecutionStatus.INPUT_REQUIRED:  # it goes on once answered
            return _execution_response(
                execution,
                status_code,
                {"Location": execution_location(request.scope, execution.execution_id)},
            )
        if execution.status is ExecutionStatus.QUEUED:  # handed off: follow it elsewhere
            return _execution_response(
                execution,
                status_code,
                {
                    "Retry-After": RETRY_AFTER_SECONDS,
                    "Location": execution_location(request.scope, execution.execution_id),
                    "Connection": "close",
                },
            )
        if execution.status_reason is CancelReason.SHUTDOWN:  # ask another replica
            return _execution_response(
                execution,
                503,
                {"Retry-After": RETRY_AFTER_SECONDS, "Location": location, "Connection": "close"},
            )
        return _execution_response(execution, status_code)

    async def _cancel_for_caller(self, execution: Execution) -> None:
        """The caller of a sync run left: its work is cancelled wherever it is, running here
        or queued (ended where it waits) or taken by another replica meanwhile."""
        reason = CancelReason.CLIENT_DISCONNECTED
        if self.registry.cancel(execution.execution_id, reason):
            return
        try:
            latest = await self.store.get(execution.execution_id)
            if latest is not None and not latest.is_terminal:
                await self.store.request_cancel(latest, reason, None)
        except StoreUnavailable as exc:  # it runs on; said once
            logger.warning(
                "execution %s: its caller left, not cancelled: %s", execution.execution_id, exc
            )

    async def _recorded(self, execution: Execution) -> bool:
        """Whether the end is in the store: a copy read from the store, or an end the
        memory store holds, is (no future to wait on); this replica's own end to a shared
        store is once written, within RECORD_WAIT and before the listener closes."""
        return await recorded_before_close(self.store, execution, self.streams.closing)

    async def run_streamed(self, request: Request) -> EventStream:
        """Start and stream the run: `event: start` (the execution JSON, so a client can
        resume on any replica), its events, then `event: end`. The run does not depend on
        the stream: a client that goes away reconnects to `/executions/{id}/events`."""
        execution, _ = await self._start(request)
        first = named("start", execution.to_json())
        return self._stream(execution, 0, first)

    async def execution_events(self, request: Request) -> EventStream:
        cursor = event_cursor(request)
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
        delay = delay_param(request)
        execution, _ = await self._start(request, delay=delay, may_queue=True)
        location = execution_location(request.scope, execution.execution_id)
        return _execution_response(execution, 202, {"Location": location})

    async def _start(
        self, request: Request, *, delay: float | None = None, may_queue: bool = False
    ) -> tuple[Execution, bool]:
        """Start the execution, or find the one an earlier request with the same
        Idempotency-Key started; True when this request started it. An async start may be
        queued (`delay`, or `may_queue` with --queue-when-full)."""
        if not may_queue and query_param(request, "delay") is not None:
            raise ApiError(400, "delay is for POST /reasoners/{name}/async (a delayed start)")
        reasoner = self._reasoner(request.path_params["name"])
        headers = first_values(request.scope["headers"])
        session_id = self._session_id(headers.get(SESSION_HEADER))
        key = idempotency_key(headers.get(IDEMPOTENCY_HEADER))
        webhook_url = webhook_target(headers.get(WEBHOOK_HEADER), self.webhooks, self.webhook_url)
        body = await self._read_json(request.receive, headers)
        try:
            arguments = reasoner.bind(body)
        except ValidationError as exc:
            raise ApiError(422, validation_detail(exc)) from None
        idempotency = (
            None
            if key is None
            else Idempotency(
                key,
                reasoner.fingerprint(session_id, body),
                self.idempotency_ttl,
            )
        )
        announced: list[Execution] = []
        try:
            start = self.registry.start_once(
                reasoner,
                arguments,
                session_id,
                body=body,
                idempotency=idempotency,
                webhook_url=webhook_url,
                delay=delay,
                may_queue=may_queue,
                concurrency_key=_concurrency_value(reasoner, headers, session_id),
                session_policy=_session_policy(reasoner, headers),
                announce=announced.append,
            )
            return await self._started_before_close(start, announced, request.scope)
        except SessionTaken as exc:
            raise ApiError(
                409,
                "the session has an execution that is not terminal (session policy reject)",
                extra={"execution_id": exc.execution_id},
            ) from None
        except AdmissionError as exc:
            if exc.in_doubt is not None:  # recorded perhaps, on no replica yet
                raise in_doubt(request.scope, exc.in_doubt) from None
            raise _admission_error(exc.reason) from None
        except IdempotencyMismatch:
            raise ApiError(422, "Idempotency-Key was first used for a different request") from None
        except IdempotencyForgotten:
            raise ApiError(
                409,
                "Idempotency-Key's execution was forgotten (deleted, released or expired): "
                "send a new key to run again",
            ) from None

    async def _started_before_close(
        self,
        start: Coroutine[Any, Any, tuple[Execution, bool]],
        announced: list[Execution],
        scope: Scope,
    ) -> tuple[Execution, bool]:
        """The start, unless the listener closes (the shutdown's point for answering) while
        its record is still being written to a shared store (a paused Redis): then the
        caller is sent to read it (503 + Location), not cut off by uvicorn's plain 500; the
        record says later what became of it (404: never written). A store in this process
        writes at once: no task."""
        if not self.store.shared:
            return await start
        task = asyncio.ensure_future(start)
        closing = self.streams.closing
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.waiters.add(closed)
        if closing.is_set():
            closed.set_result(None)
        try:
            await asyncio.wait((task, closed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            closing.waiters.discard(closed)
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if not task.cancelled():
            return task.result()
        retry = {"Retry-After": RETRY_AFTER_SECONDS, "Connection": "close"}
        if not announced:  # pragma: no cover - announced before the first await
            raise ApiError(503, "server is shutting down", retry)
        execution_id = announced[0].execution_id
        raise ApiError(
            503,
            "the server shut down before the store confirmed this start: read the execution "
            "at Location (404: it was never recorded; a retry with the same Idempotency-Key "
            "is safe)",
            {**retry, "Location": execution_location(scope, execution_id)},
            extra={"execution_id": execution_id, "in_doubt": True},
        )

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
        raw = await read_body(receive, limit)
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
        """The execution once it has ended (or was handed off, or waits for input); None
        when the client went away first. Work this replica runs is waited for here; other
        work (a repeat of an idempotent request) through the store."""
        await asyncio.sleep(0)  # a reasoner that never suspends ends in its task's first step
        if execution.reached(asked=True) and not _retried(execution):  # no watcher tasks
            return execution
        local = self.registry.running(execution.execution_id) is execution
        ended: asyncio.Task[object] = asyncio.create_task(self._until_end(execution, local))
        gone, reader = client_gone(request.scope, request.receive)
        closing = self.streams.closing
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.waiters.add(closed)
        try:
            watched: set[asyncio.Future[Any]] = {ended, gone, closed}
            if closing.is_set():
                closed.set_result(None)
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if not (ended.done() or gone.done()):
                # The listener closed: the shutdown's point for answering. Work this replica
                # ran was settled before it (its end, or a hand-off, answered); what is still
                # awaited is the store (queued work, a retry followed there, a paused
                # Redis), and uvicorn's timeout would cut the caller off with a plain 500.
                raise _ListenerClosed
        finally:
            closing.waiters.discard(closed)
            watchers = [ended] if reader is None else [ended, reader]
            for task in watchers:
                task.cancel()
            await asyncio.gather(*watchers, return_exceptions=True)
        if ended.done() and not ended.cancelled() and ended.exception() is None:
            latest = ended.result()
            assert isinstance(latest, Execution)
            return latest
        return None

    async def _until_end(self, execution: Execution, local: bool) -> Execution:
        """The live execution this replica runs, until it ends (or waits for input, or is
        handed off); one retried through a shared store is followed there (whichever
        replica takes its next attempt)."""
        if local:
            await execution.wait(None, asked=True)
            if not _retried(execution):
                return execution
        return await self.store.wait(execution, None, asked=True)

    # -- executions ----------------------------------------------------------------------------

    async def execution(self, request: Request) -> Response:
        """One route for both methods, so a 405 names them both in `Allow`."""
        if request.method == "DELETE":
            return await self.delete_execution(request)
        return await self.get_execution(request)

    async def get_execution(self, request: Request) -> Response:
        execution = await self._execution(request)
        # Finite, and any size: a wait past MAX_WAIT_SECONDS is capped, as documented.
        wait = float_param(request, "wait", minimum=0.0, maximum=math.inf)
        if wait is not None and wait > 0 and not execution.reached_end(asked=True):
            return await self._long_poll(execution, min(wait, MAX_WAIT_SECONDS))
        return _execution_response(execution)

    async def _long_poll(self, execution: Execution, timeout: float) -> Response:
        """The execution once terminal or waiting for input (`input_required`: someone must
        answer before it can end), or after `timeout`; when the listener closes first
        (shutdown), as it is now, with `Connection: close`, so the client polls again on
        another replica instead of being cut into a 500 by the http phase's end."""
        closing = self.streams.closing
        if closing.is_set():
            return _execution_response(execution, headers={"Connection": "close"})
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        closing.waiters.add(closed)
        waiting = asyncio.ensure_future(self.store.wait(execution, timeout, asked=True))
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
        nobody = execution.owned_by_nobody  # queued or parked: the store ends it where it is
        await self.store.request_cancel(execution, CancelReason.REQUEST, None)
        if nobody:
            # Nobody runs it: it ended where it waited (or was taken meanwhile: 202 then).
            now = await self.store.get(execution.execution_id)
            if now is not None and now.is_terminal:
                return _execution_response(now)
            return _execution_response(now or execution, 202)
        return _execution_response(execution, 202)

    async def answer_input(self, request: Request) -> Response:
        """`POST /executions/{id}/input`: the answer to its pending request, taken once
        (the store decides, on every replica): 202 with the execution, `running` again. The
        same answer to a request answered already is 202 too (a retry; handed over once)."""
        headers = first_values(request.scope["headers"])
        request_id, value = _answer_body(await self._read_json(request.receive, headers))
        execution = await self._execution(request)
        pending = execution.input_request
        waiting = execution.status is ExecutionStatus.INPUT_REQUIRED and pending is not None
        pending_id = int(pending["request_id"]) if waiting and pending is not None else None
        size = len(jsoncodec.dumps(value))
        if size > self.store.max_answer_bytes:
            raise ApiError(
                413,
                f"the answer is {size} bytes as JSON: an execution keeps at most "
                f"{self.store.max_answer_bytes} (--max-answer-bytes)",
            )
        if request_id is not None and request_id != pending_id:
            # Perhaps a retry of an answer taken (its reply lost, or in doubt): the same
            # value for that request is taken again (202, nothing handed twice).
            again = await self.store.answer(execution, request_id, value)
            if again is not None:
                return _execution_response(again, 202)
        if pending is None or pending_id is None:
            raise ApiError(409, f"execution is {execution.status.value}: it waits for no input")
        if request_id is not None and request_id != pending_id:
            raise ApiError(409, f"request {request_id} is not pending (request {pending_id} is)")
        await self._check_answer(pending, value)
        taken = await self.store.answer(execution, pending_id, value)
        if taken is None:
            raise ApiError(409, f"request {pending_id} was answered already (or ended)")
        return _execution_response(taken, 202)

    async def _check_answer(self, pending: dict[str, Any], value: Any) -> None:
        """422 unless `value` fits the request's JSON schema, checked the same way on every
        replica (agent_server/http/answers.py: JSON's own types, linear patterns, off the event
        loop); the owner's type then reads it in `ctx.ask`."""
        schema = pending.get("schema")
        if not isinstance(schema, dict):
            return
        try:
            problems = await answers.check(schema, value)
        except answers.TooSlow as exc:
            raise ApiError(422, str(exc)) from None
        if problems:
            raise ApiError(422, problems)

    async def delete_execution(self, request: Request) -> Response:
        try:
            known = await self.store.forget(request.path_params["execution_id"])
        except ExecutionRunning as exc:
            raise ApiError(409, f"execution is {exc.status}: cancel it first") from None
        if not known:
            raise ApiError(404, "unknown execution")
        return Response(status_code=204)

    async def list_executions(self, request: Request) -> Response:
        limit = int_param(request, "limit", minimum=1, maximum=MAX_LIST_LIMIT)
        page = await self.store.page(
            statuses=statuses(request),
            reasoner=reasoner_filter(request),
            session_id=checked_session_id(request.query_params.get("session_id"), "session_id"),
            limit=100 if limit is None else limit,
            max_bytes=MAX_LIST_BYTES,
            after=list_cursor(request),
        )
        body, shown = _list_body(page.executions)
        headers: dict[str, str] = {}
        following = page.cursors[shown - 1] if shown < len(page.executions) else page.next
        if shown < len(page.executions):
            headers["X-Truncated"] = "true"
        if following is not None:
            headers["Link"] = next_link(request, following)
        return Response(body, media_type="application/json", headers=headers)

    async def _execution(self, request: Request) -> Execution:
        execution = await self.store.get(request.path_params["execution_id"])
        if execution is None:
            raise ApiError(404, "unknown execution")
        return execution

    # -- sessions ------------------------------------------------------------------------------

    async def release_session(self, request: Request) -> Response:
        session_id = checked_session_id(request.path_params["session_id"], "session id")
        assert session_id is not None
        timeout_value = request.query_params.get("timeout", "30")
        timeout: float | None
        if timeout_value.lower() == "none":
            timeout = None
        else:
            timeout = float_param(request, "timeout", minimum=0.0)
        cancel_value = request.query_params.get("cancel_running", "true").lower()
        if cancel_value not in ("true", "false", "1", "0"):
            raise ApiError(422, "cancel_running must be true or false")
        try:
            release = await self.releases.release(
                session_id, timeout=timeout, cancel_running=cancel_value in ("true", "1")
            )
        except SessionBusy:
            raise ApiError(409, "session has running executions and cancel_running=false") from None
        except StoreInDoubt as exc:  # one forget not yet on a replica: the release is retried
            raise StoreUnavailable(str(exc)) from None
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


def _execution_response(
    execution: Execution, status_code: int = 200, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(execution.to_json(), status_code=status_code, headers=headers)


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


def _answer_body(body: Any) -> tuple[int | None, Any]:
    """`{"request_id": N, "value": ...}` (request_id optional): the request id and the
    value; 422 for anything else."""
    if not isinstance(body, dict):
        raise ApiError(422, 'the body must be a JSON object: {"request_id": N, "value": ...}')
    extra = sorted(set(body) - {"request_id", "value"})
    if extra:
        raise ApiError(422, f"unknown keys {extra}: the body holds request_id and value")
    if "value" not in body:
        missing = {"type": "missing", "loc": ["body", "value"], "msg": "Field required"}
        raise ApiError(422, [missing])
    request_id = body.get("request_id")
    if isinstance(request_id, float) and request_id.is_integer():
        request_id = int(request_id)  # 2.0 is an integer to JSON Schema
    if request_id is not None and (
        not isinstance(request_id, int) or isinstance(request_id, bool) or request_id < 1
    ):
        raise ApiError(422, "request_id must be a positive integer (or left out: the pending one)")
    return request_id, body["value"]


def _session_policy(reasoner: Reasoner, headers: dict[bytes, bytes]) -> SessionPolicy:
    """`X-Session-Policy`, else the reasoner's default; a value not of SessionPolicy is 400."""
    raw = headers.get(b"x-session-policy")
    if raw is None:
        return reasoner.session_policy
    try:
        return SessionPolicy(raw.decode("latin-1").strip().lower())
    except ValueError:
        raise ApiError(
            400,
            "invalid X-Session-Policy: one of " + ", ".join(p.value for p in SessionPolicy),
        ) from None


def _concurrency_value(
    reasoner: Reasoner, headers: dict[bytes, bytes], session_id: str | None
) -> str | None:
    """The value of the reasoner's `concurrency_key` this request carries ('' when absent:
    those requests share one value); None when it has no limit. A header present but empty
    (or only spaces and tabs) is a 400 naming it: it would otherwise be a value of its own,
    or silently the one the requests without it share."""
    if reasoner.max_concurrency is None:
        return None
    spec = reasoner.concurrency_key
    if spec is None:
        return ""
    if spec == "session":
        return session_id or ""
    name = spec[len("header:") :]
    raw = headers.get(name.lower().encode())
    if raw is None:
        return ""
    if not raw.strip(b" \t") or len(raw) > 255 or not all(32 <= byte < 127 for byte in raw):
        raise ApiError(400, f"invalid {name}: 1 to 255 printable ASCII characters, not only spaces")
    return raw.decode("ascii")


def _retried(execution: Execution) -> bool:
    """Queued for its next attempt through a shared store: whichever replica takes it runs
    it, so a caller follows the record there."""
    return execution.status is ExecutionStatus.QUEUED and execution.scheduled_at is not None


def _admission_error(reason: RejectReason) -> ApiError:
    retry = {"Retry-After": RETRY_AFTER_SECONDS}
    if reason is RejectReason.CAPACITY:
        return ApiError(429, "too many executions in flight", retry)
    if reason is RejectReason.SESSION_RELEASED:
        return ApiError(409, "session is being released")
    if reason is RejectReason.STORE_UNAVAILABLE:
        return ApiError(503, "execution store unavailable", retry)
    return ApiError(503, "server is shutting down", {**retry, "Connection": "close"})
