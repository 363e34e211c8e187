"""Runs: `POST /reasoners/{name}` (synchronous, or streamed with `Accept:
text/event-stream`), `POST /reasoners/{name}/async`, and `GET /reasoners`.

A run starts through the registry (admission, draining, idempotency); a synchronous one
answers once its execution ends, waits for input, or is handed off, by `SYNC_ANSWER`."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Scope

from agent_server.http.access import RequestAccess
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
    refusal_error,
)
from agent_server.http.sse import EventStream, named
from agent_server.model.echoes import one_of, shown
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import SESSION_ID_RULE, is_session_id_bytes
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import SessionPolicy
from agent_server.service.refusals import Refusal, Why
from agent_server.service.starts import concurrency_value
from agent_server.service.use_cases import UseCases
from agent_server.service.waits import Until

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

#: A start's refusals in this API's words (its header names); the others as they are said.
START_WORDS: dict[Why, str] = {
    Why.KEY_MISMATCH: "Idempotency-Key was first used for a different request",
    Why.KEY_FORGOTTEN: "Idempotency-Key's execution was forgotten (deleted, released or "
    "expired): send a new key to run again",
}


class Runs:
    """The routes that start executions, given the parts they use."""

    def __init__(
        self,
        reasoners: dict[str, Reasoner],
        use_cases: UseCases,
        executions: Executions,
        *,
        max_body_size: int,
        webhooks: bool,
        webhook_url: str | None,
    ) -> None:
        self.reasoners = reasoners
        self.use_cases = use_cases
        assert isinstance(use_cases.access, RequestAccess)
        self.access: RequestAccess = use_cases.access
        self.registry = use_cases.registry
        self.executions = executions
        self.max_body_size = max_body_size
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
        execution_id = execution.execution_id
        readers: list[asyncio.Task[Any]] = []

        def leaving() -> asyncio.Future[Any]:
            gone, reader = client_gone(request.scope, request.receive)
            readers.extend(() if reader is None else (reader,))
            return gone

        try:
            waited = await self.use_cases.waits.until_reached(execution, leaving)
        except asyncio.CancelledError:
            # The server gave up on this request (plain uvicorn's --timeout-graceful-shutdown
            # cancels what is still open): its client is cut off, as if it had gone away.
            if started:
                self.registry.cancel(execution.execution_id, CancelReason.CLIENT_DISCONNECTED)
            raise
        finally:
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

        def location() -> str:  # built only for an answer that sends the client elsewhere
            return execution_location(request.scope, execution_id)

        def retry() -> dict[str, str]:
            close = {"Connection": "close"}
            return {"Retry-After": RETRY_AFTER_SECONDS, "Location": location(), **close}

        if waited.until is Until.CLOSED:
            # Shutdown, and its work waits in the queue (or runs elsewhere): another replica
            # may run it, and the client follows it there.
            return await self._handed(request.scope, execution, 503, retry())
        if waited.until is Until.GONE or waited.execution is None:
            if started:  # a repeat of an idempotent request leaves the first one's work be
                await self.use_cases.cancels.for_caller_gone(execution)
            return await self._handed(request.scope, execution, 499)  # nobody is listening any more
        execution = waited.execution
        if execution.is_terminal and not await self.use_cases.waits.recorded(execution):
            # No verdict the store may contradict: the client reads the record there.
            return JSONResponse(
                {
                    "detail": "the execution ended, but its end is not recorded in the shared "
                    "store yet (or this attempt no longer owns it): read it at Location",
                    "execution_id": execution.execution_id,
                },
                503,
                {"Retry-After": RETRY_AFTER_SECONDS, "Location": location()},
            )
        status_code = SYNC_ANSWER[execution.status]
        if execution.status is ExecutionStatus.INPUT_REQUIRED:  # it goes on once answered
            headers = {"Location": location()}
            return await self._handed(request.scope, execution, status_code, headers)
        if execution.status is ExecutionStatus.QUEUED:  # handed off: follow it elsewhere
            return await self._handed(request.scope, execution, status_code, retry())
        if execution.status_reason is CancelReason.SHUTDOWN:  # ask another replica
            return await self._handed(request.scope, execution, 503, retry())
        return await self._handed(request.scope, execution, status_code)

    async def _handed(
        self, scope: Scope, execution: Execution, status: int, headers: dict[str, str] | None = None
    ) -> Response:
        """A sync run's record as it answers it, `read` asked on it as it is now (its end, an
        ask, a hand-off): else the start's acceptance (the caller started it, reads nothing)."""
        if not await self.access.reads(self.access.principal(scope), execution):
            return acceptance(scope, execution.execution_id)
        return execution_response(execution, status, headers)

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
        starts = self.use_cases.starts
        reasoner = self._reasoner(request.path_params["name"])
        headers = first_values(request.scope["headers"])
        session_id = self._session_id(headers.get(SESSION_HEADER))
        principal = self.access.principal(request.scope)
        try:
            await starts.may_start(principal, reasoner, session_id)
            key = idempotency_key(headers.get(IDEMPOTENCY_HEADER))
            webhook_url = webhook_target(
                headers.get(WEBHOOK_HEADER), self.webhooks, self.webhook_url
            )
            body = await read_json(request.receive, headers, self.max_body_size)
            try:
                arguments = reasoner.bind(body)
            except ValidationError as exc:
                raise ApiError(422, validation_detail(exc)) from None
            return await starts.start(
                principal,
                reasoner,
                arguments,
                session_id,
                body=body,
                idempotency=starts.idempotency(key, reasoner, session_id, body),
                webhook_url=webhook_url,
                delay=delay,
                may_queue=may_queue,
                concurrency_key=concurrency_value(
                    reasoner, lambda name: headers.get(name.lower().encode()), session_id
                ),
                session_policy=_session_policy(reasoner, headers),
                shown=shown,
            )
        except Refusal as refusal:
            raise refusal_error(request.scope, refusal, START_WORDS.get(refusal.why)) from None

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
