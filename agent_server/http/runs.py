"""Runs: `POST /reasoners/{name}` (synchronous, or streamed with `Accept:
text/event-stream`), `POST /reasoners/{name}/async`, and `GET /reasoners`.

A run starts through the registry (admission, draining, idempotency); a synchronous one
answers once its execution ends, waits for input, or is handed off, by `SYNC_ANSWER`."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from agent_server.http.access import Access
from agent_server.http.executions import Executions
from agent_server.http.http_limits import client_gone
from agent_server.http.params import (
    delay_param,
    first_values,
    idempotency_key,
    query_param,
    read_json,
    validation_detail,
    wants_events,
    webhook_target,
)
from agent_server.http.routing import (
    RETRY_AFTER_SECONDS,
    ApiError,
    JSONResponse,
    acceptance,
    execution_location,
    execution_response,
    in_doubt,
)
from agent_server.http.sse import EventStream, Streams, named, recorded_before_close
from agent_server.model.echoes import one_of, shown
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import SESSION_ID_RULE, is_session_id_bytes
from agent_server.model.principal import Principal
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import SessionPolicy
from agent_server.runtime.registry import AdmissionError, InFlightRegistry, RejectReason
from agent_server.store.base import (
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    SessionTaken,
    StoreUnavailable,
)

logger = logging.getLogger("agent_server.api")


class _ListenerClosed(Exception):
    """A sync run's wait met the listener's close while its work runs nowhere here."""


class _CutAtClose:
    """The callback of the listener's close that cancels a request's task while it waits
    for its start to be written to a shared store, once, and only while `armed`."""

    __slots__ = ("armed", "fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.armed = True
        #: It cancelled the task: the request's wait ended at the close.
        self.fired = False

    def __call__(self, _: object) -> None:
        if self.armed:
            self.armed = False
            self.fired = True
            self.task.cancel()


SESSION_HEADER = b"x-session-id"
IDEMPOTENCY_HEADER = b"idempotency-key"
WEBHOOK_HEADER = b"x-webhook-url"


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


class Runs:
    """The routes that start executions, given the parts they use."""

    def __init__(
        self,
        reasoners: dict[str, Reasoner],
        registry: InFlightRegistry,
        store: ExecutionStore,
        executions: Executions,
        streams: Streams,
        *,
        max_body_size: int,
        idempotency_ttl: float,
        webhooks: bool,
        webhook_url: str | None,
        access: Access | None = None,
    ) -> None:
        self.access = access or Access()
        self.reasoners = reasoners
        self.registry = registry
        self.store = store
        self.executions = executions
        self.streams = streams
        self.max_body_size = max_body_size
        self.idempotency_ttl = idempotency_ttl
        #: Whether webhooks are on (a secret is set), and where they go by default.
        self.webhooks = webhooks
        self.webhook_url = webhook_url

    async def list_reasoners(self, request: Request) -> Response:
        return JSONResponse([r.describe() for r in self.reasoners.values()])

    async def run_sync(self, request: Request) -> Response | EventStream:
        if wants_events(request.scope["headers"]):
            return await self.run_streamed(request)
        execution, started = await self._start(request)
        if not await self.access.reads(self.access.principal(request.scope), execution):
            return acceptance(request.scope, execution.execution_id)  # it runs, unwatched
        location = execution_location(request.scope, execution.execution_id)
        try:
            ended = await self._wait_or_disconnect(execution, request)
        except _ListenerClosed:
            # Shutdown, and its work waits in the queue (or runs elsewhere): another replica
            # may run it, and the client follows it there.
            return await self._handed(
                request.scope,
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
            return await self._handed(request.scope, execution, 499)  # nobody is listening any more
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
            return await self._handed(
                request.scope,
                execution,
                status_code,
                {"Location": execution_location(request.scope, execution.execution_id)},
            )
        if execution.status is ExecutionStatus.QUEUED:  # handed off: follow it elsewhere
            return await self._handed(
                request.scope,
                execution,
                status_code,
                {
                    "Retry-After": RETRY_AFTER_SECONDS,
                    "Location": execution_location(request.scope, execution.execution_id),
                    "Connection": "close",
                },
            )
        if execution.status_reason is CancelReason.SHUTDOWN:  # ask another replica
            return await self._handed(
                request.scope,
                execution,
                503,
                {"Retry-After": RETRY_AFTER_SECONDS, "Location": location, "Connection": "close"},
            )
        return await self._handed(request.scope, execution, status_code)

    async def _handed(
        self, scope: Scope, execution: Execution, status: int, headers: dict[str, str] | None = None
    ) -> Response:
        """A sync run's record as it answers it, `read` asked on it as it is now (its end, an
        ask, a hand-off): else the start's acceptance (the caller started it, reads nothing)."""
        if not await self.access.reads(self.access.principal(scope), execution):
            return acceptance(scope, execution.execution_id)
        return execution_response(execution, status, headers)

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

    async def run_streamed(self, request: Request) -> Response | EventStream:
        """Start and stream the run: `event: start` (the execution JSON, so a client can
        resume on any replica), its events, then `event: end`. The run does not depend on
        the stream: a client that goes away reconnects to `/executions/{id}/events`."""
        execution, _ = await self._start(request)
        if not await self.access.reads(self.access.principal(request.scope), execution):
            return acceptance(request.scope, execution.execution_id)  # it runs, unwatched
        first = named("start", execution.to_json())
        return self.executions.stream(execution, 0, first)

    async def run_async(self, request: Request) -> Response:
        delay = delay_param(request)
        accepted: list[dict[str, Any]] = []
        execution, _ = await self._start(request, delay=delay, may_queue=True, shown=accepted)
        if not await self.access.reads(self.access.principal(request.scope), execution):
            return acceptance(request.scope, execution.execution_id)
        location = execution_location(request.scope, execution.execution_id)
        # The execution as it was accepted: an end it reached since (a quick reasoner, while
        # this handler waited its turn) may not be in the store yet, and a 202 is no verdict.
        return JSONResponse(accepted[0], 202, {"Location": location})

    async def _start(
        self,
        request: Request,
        *,
        delay: float | None = None,
        may_queue: bool = False,
        shown: list[dict[str, Any]] | None = None,
    ) -> tuple[Execution, bool]:
        """Start the execution, or find the one an earlier request with the same
        Idempotency-Key started; True when this request started it. An async start may be
        queued (`delay`, or `may_queue` with --queue-when-full)."""
        if not may_queue and query_param(request, "delay") is not None:
            raise ApiError(400, "delay is for POST /reasoners/{name}/async (a delayed start)")
        reasoner = self._reasoner(request.path_params["name"])
        headers = first_values(request.scope["headers"])
        session_id = self._session_id(headers.get(SESSION_HEADER))
        await self.access.check(
            request.scope, "start", {"reasoner": reasoner.name, "session_id": session_id}
        )
        key = idempotency_key(headers.get(IDEMPOTENCY_HEADER))
        webhook_url = webhook_target(headers.get(WEBHOOK_HEADER), self.webhooks, self.webhook_url)
        body = await read_json(request.receive, headers, self.max_body_size)
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
        try:
            return await self.start_once(
                request.scope,
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
                principal=self.access.principal(request.scope),
                shown=shown,
            )
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

    async def start_once(
        self,
        scope: Scope,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        session_id: str | None,
        *,
        body: Any,
        idempotency: Idempotency | None,
        webhook_url: str | None,
        delay: float | None,
        may_queue: bool,
        concurrency_key: str | None,
        session_policy: SessionPolicy,
        principal: Principal | None,
        shown: list[dict[str, Any]] | None = None,
    ) -> tuple[Execution, bool]:
        """The registry's start as the API and A2A make it (`InFlightRegistry.start_once`'s
        refusals raised as they are), answered before the listener closes on a shared
        store; `shown` keeps its JSON as the store accepted it. An earlier request's
        execution (its Idempotency-Key or messageId) is shown only to a caller allowed to
        `read` it: a key is its tenant's, not its identity's (403 otherwise)."""
        announced: list[Execution] = []
        start = self.registry.start_once(
            reasoner,
            arguments,
            session_id,
            body=body,
            idempotency=idempotency,
            webhook_url=webhook_url,
            delay=delay,
            may_queue=may_queue,
            concurrency_key=concurrency_key,
            session_policy=session_policy,
            announce=announced.append,
            principal=principal,
        )
        if shown is not None:
            start = self._shown(start, shown)
        if not self.store.shared:  # a store in this process writes at once
            execution, started = await start
        else:
            execution, started = await self._started_before_close(start, announced, scope)
        if not started:
            await self.access.allowed_for(principal, "read", execution)
        return execution, started

    @staticmethod
    async def _shown(
        start: Coroutine[Any, Any, tuple[Execution, bool]], shown: list[dict[str, Any]] | None
    ) -> tuple[Execution, bool]:
        """The start, its JSON kept in `shown` as the store accepted it (before its task ran)."""
        execution, started = await start
        if shown is not None:
            shown.append(execution.to_json())
        return execution, started

    async def _started_before_close(
        self,
        start: Coroutine[Any, Any, tuple[Execution, bool]],
        announced: list[Execution],
        scope: Scope,
    ) -> tuple[Execution, bool]:
        """The start, unless the listener closes (the shutdown's point for answering) while
        its record is still being written to a shared store (a paused Redis): then the
        caller is sent to read it (503 + Location), not cut off by uvicorn's plain 500; the
        record says later what became of it (404: never written). The start runs in this
        request's own task, which the close cancels (`_CutAtClose`): no task of its own to
        race against the close."""
        closing = self.streams.closing
        if closing.is_set():  # never begun: nothing was announced, nothing is in doubt
            start.close()
            raise ApiError(
                503,
                "server is shutting down",
                {"Retry-After": RETRY_AFTER_SECONDS, "Connection": "close"},
            )
        task = asyncio.current_task()
        assert task is not None
        cut = _CutAtClose(task)
        closed: asyncio.Future[None] = task.get_loop().create_future()
        closed.add_done_callback(cut)
        closing.waiters.add(closed)
        try:
            return await start
        except asyncio.CancelledError:
            if not cut.fired:  # the server's or the client's, not the close's
                raise
            cut.fired = False  # the close's cancellation, taken back here
            if task.uncancel() > 0:  # and someone else's too
                raise
        finally:
            cut.armed = False
            closing.waiters.discard(closed)
            if cut.fired:  # the close came, but the start ended on its own: taken back
                task.uncancel()
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
            raise ApiError(404, f"unknown reasoner: {shown(name)}: one of {one_of(self.reasoners)}")
        return reasoner

    @staticmethod
    def _session_id(raw: bytes | None) -> str | None:
        if raw is None:
            return None
        if not is_session_id_bytes(raw):
            raise ApiError(400, f"invalid X-Session-ID: {SESSION_ID_RULE}")
        return raw.decode("ascii")

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


#: A start the store did not answer may have been recorded all the same, and then runs
#: (docs/api.md, Errors): the caller is told so, and how to find it.
START_UNANSWERED = (
    "execution store unavailable: this start may have been recorded all the same, and then "
    "runs; send it again with the same Idempotency-Key to get that execution, not a second"
)


def _admission_error(reason: RejectReason) -> ApiError:
    retry = {"Retry-After": RETRY_AFTER_SECONDS}
    if reason is RejectReason.CAPACITY:
        return ApiError(429, "too many executions in flight", retry)
    if reason is RejectReason.SESSION_RELEASED:
        return ApiError(409, "session is being released")
    if reason is RejectReason.STORE_UNAVAILABLE:  # the store's answer may be what was lost
        return ApiError(503, START_UNANSWERED, retry)
    return ApiError(503, "server is shutting down", {**retry, "Connection": "close"})
