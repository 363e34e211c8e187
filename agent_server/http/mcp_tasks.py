"""MCP's tasks (the tasks extension, 2026-07-28; docs/protocols.md): `tasks/get`,
`tasks/update`, `tasks/cancel` and `subscriptions/listen`, each a translation onto the use
cases every front shares (agent_server/service/), and the refusals as JSON-RPC errors."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    SubscriptionsListenRequestParams,
)

from agent_server.http.event_feed import EventFeed
from agent_server.http.mcp_progress import Count, progress_token, task_progress
from agent_server.http.mcp_requests import (
    SUBSCRIPTION_ID,
    TaskParams,
    TaskUpdateParams,
    caller_of,
    declares_tasks,
    notify,
    task_ids,
)
from agent_server.http.mcp_tools import TASKS_EXTENSION, answer_value, task
from agent_server.identity.principal import Principal
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.service.refusals import Denied, Refusal, Why
from agent_server.service.use_cases import UseCases
from agent_server.store.base import StoreUnavailable

#: Seconds between reads of a task that waits for input (an answer moves it on from any
#: replica); a task that works is followed by the store's own wait, in pieces this long.
LISTEN_POLL = 0.5
LISTEN_WAIT = 30.0

#: The JSON-RPC error code of each refusal: what the caller sent (params), what it may not
#: do (request), or the server's state (internal: retry).
REFUSAL_CODES: dict[Why, int] = {
    Why.INVALID: INVALID_PARAMS,
    Why.UNPROCESSABLE: INVALID_PARAMS,
    Why.UNKNOWN: INVALID_PARAMS,
    Why.DENIED: INVALID_REQUEST,
    Why.CONFLICT: INVALID_PARAMS,
    Why.KEY_MISMATCH: INVALID_PARAMS,
    Why.KEY_FORGOTTEN: INVALID_PARAMS,
    Why.SESSION_BUSY: INVALID_PARAMS,
    Why.SESSION_RELEASING: INTERNAL_ERROR,
    Why.TOO_LARGE: INVALID_PARAMS,
    Why.BUSY: INTERNAL_ERROR,
    Why.UNAVAILABLE: INTERNAL_ERROR,
    Why.IN_DOUBT: INTERNAL_ERROR,
    Why.SHUTTING_DOWN: INTERNAL_ERROR,
}
if set(REFUSAL_CODES) != set(Why):
    raise RuntimeError("REFUSAL_CODES must give every refusal a code")


def mcp_error(refusal: Refusal, message: str | None = None) -> MCPError:
    """A refusal as a JSON-RPC error: a detail that is a list (an answer's problems) goes
    in `data` under a message that says what it is; an execution it is about, as `taskId`."""
    detail = refusal.detail
    data: Any = None
    if refusal.execution_id is not None:
        data = {"taskId": refusal.execution_id}
    if not isinstance(detail, str):
        data, detail = detail, "the answer does not fit the request's schema"
    return MCPError(REFUSAL_CODES[refusal.why], message or detail, data)


class McpTasks:
    """The tasks' handlers, and the reads, checks and refusals a tool call shares with them,
    given the use cases and how long a finished task is kept (its `ttlMs`)."""

    def __init__(self, use_cases: UseCases, result_ttl: float) -> None:
        self.use_cases = use_cases
        self.access = use_cases.access
        self.registry = use_cases.registry
        self.store = use_cases.store
        #: Set when the listener closes (shutdown): a listen still open then ends.
        self.closing = use_cases.waits.closing
        self.result_ttl = result_ttl

    async def read(self, execution_id: str, principal: Principal | None) -> Execution | None:
        """The execution by a client's id (a task id, a `requestState`'s); None for an id no
        store key can hold (a lone surrogate: JSON carries one, UTF-8 cannot), which no
        execution has, and for another tenant's (the store tells it from an unknown one
        before it reads the record)."""
        try:
            execution_id.encode()
        except UnicodeEncodeError:
            return None
        try:
            return await self.store.get(execution_id, self.access.reach(principal))
        except StoreUnavailable:
            raise MCPError(INTERNAL_ERROR, "execution store unavailable: retry later") from None

    async def find(self, ctx: ServerRequestContext[Any], task_id: str) -> Execution:
        """The task's execution, read from the store as `GET /executions/{id}` does; unknown
        is invalid params (the extension's rule). The caller must have declared the tasks
        extension. Another tenant's is unknown too; `read` must be allowed on it."""
        if not declares_tasks(ctx):
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        principal = caller_of(ctx)
        execution = await self.read(task_id, principal)
        if execution is None or not self.access.sees(principal, execution):
            raise MCPError(INVALID_PARAMS, "Failed to retrieve task: Task not found")
        return await self.allowed(principal, "read", execution)

    async def allowed(
        self, principal: Principal | None, action: str, execution: Execution
    ) -> Execution:
        """The execution once `@agent.authorize` allows the action; a denial is an invalid
        request naming it (the API's 403)."""
        try:
            return await self.access.allowed_for(principal, action, execution)
        except Denied as exc:
            raise mcp_error(exc) from None

    async def may(self, principal: Principal | None, action: str, execution: Execution) -> bool:
        """Whether `@agent.authorize` allows the action (no error either way)."""
        return await self.access.may(principal, action, execution)

    async def get_task(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        return task(await self.find(ctx, params.task_id), self.result_ttl)

    async def cancel_task(
        self, ctx: ServerRequestContext[Any], params: TaskParams
    ) -> dict[str, Any]:
        """As `POST /executions/{id}/cancel`: a cancel request (`request`) to wherever it is."""
        execution = await self.find(ctx, params.task_id)
        await self.allowed(caller_of(ctx), "cancel", execution)
        try:
            await self.use_cases.cancels.request(execution)
        except StoreUnavailable:
            raise MCPError(INTERNAL_ERROR, "execution store unavailable: retry later") from None
        return {}

    async def update_task(
        self, ctx: ServerRequestContext[Any], params: TaskUpdateParams
    ) -> dict[str, Any]:
        """As `POST /executions/{id}/input`: the answer to the pending request (its key),
        checked against its schema and taken once; a declined or cancelled elicitation
        cancels the task. Keys not outstanding are ignored, as the extension says."""
        execution = await self.find(ctx, params.task_id)
        await self.allowed(caller_of(ctx), "answer", execution)
        pending = execution.input_request
        if execution.status is not ExecutionStatus.INPUT_REQUIRED or pending is None:
            return {}
        request_id = int(pending["request_id"])
        response = params.input_responses.get(str(request_id))
        if not isinstance(response, dict):
            return {}
        action = response.get("action")
        try:
            if action in ("decline", "cancel"):
                await self.allowed(caller_of(ctx), "cancel", execution)
                await self.store.request_cancel(execution, CancelReason.REQUEST, None)
                return {}
            if action != "accept":
                raise MCPError(
                    INVALID_PARAMS,
                    'an elicitation result\'s action: "accept", "decline" or "cancel"',
                )
            schema = pending.get("schema")
            try:
                value = answer_value(schema, response.get("content"))
            except ValueError as exc:
                raise MCPError(INVALID_PARAMS, str(exc)) from None
            await self.check(schema, value)
            await self.store.answer(execution, request_id, value)
        except StoreUnavailable:
            raise MCPError(INTERNAL_ERROR, "execution store unavailable: retry later") from None
        return {}

    async def listen(
        self, ctx: ServerRequestContext[Any], params: SubscriptionsListenRequestParams
    ) -> dict[str, Any]:
        """`subscriptions/listen` with `taskIds`: `notifications/tasks` on this stream each
        time one of those tasks changes status (read from the store: whichever replica runs
        it), until the client closes the stream or the listener closes (shutdown); with a
        `progressToken`, their events as `notifications/progress` too (mcp_progress.py).
        No other kind of notification is offered (the tools never change)."""
        if ctx.request_id is None:  # pragma: no cover - the transport always gives one
            raise MCPError(INVALID_REQUEST, "subscriptions/listen requires a request id")
        wanted = (params.notifications.model_extra or {}).get("taskIds")
        if wanted is not None and not declares_tasks(ctx):
            raise MCPError(
                MISSING_REQUIRED_CLIENT_CAPABILITY,
                "Missing required client capability",
                {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
            )
        ids = task_ids(wanted)
        principal = caller_of(ctx)
        read = [await self.read(i, principal) for i in ids]
        found = [e for e in read if e is not None and await self._reads(principal, e)]
        meta = {SUBSCRIPTION_ID: ctx.request_id}
        honored = {"taskIds": [e.execution_id for e in found]}
        await notify(ctx, "notifications/subscriptions/acknowledged", {"notifications": honored})
        closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closing.waiters.add(closed)
        if self.closing.is_set():
            closed.set_result(None)
        try:
            token, count = progress_token(ctx), Count()
            async with anyio.create_task_group() as watchers:
                for execution in found:
                    watchers.start_soon(self._watch, ctx, execution, meta)
                    if token is not None:  # its events as progress too (mcp_progress.py)
                        feed = EventFeed(self.registry, self.store, execution)
                        watchers.start_soon(task_progress, ctx, token, feed, self.store, count)
                await closed
                watchers.cancel_scope.cancel()
        finally:
            self.closing.waiters.discard(closed)
        return {"_meta": meta, "resultType": "complete"}

    async def _reads(self, principal: Principal | None, execution: Execution) -> bool:
        """Whether the caller may follow the task: its tenant's, `read` allowed."""
        return self.access.sees(principal, execution) and await self.may(
            principal, "read", execution
        )

    async def _watch(
        self, ctx: ServerRequestContext[Any], execution: Execution, meta: dict[str, Any]
    ) -> None:
        """One task's changes as `notifications/tasks`, each the whole `DetailedTask`."""
        said: tuple[str, object] | None = None
        current: Execution | None = execution
        while current is not None:
            view = task(current, self.result_ttl)
            asked = current.input_request
            now = (view["status"], None if asked is None else asked.get("request_id"))
            if now != said:
                await notify(ctx, "notifications/tasks", {**view, "_meta": meta})
                said = now
            if current.is_terminal:
                return
            try:
                if current.status is ExecutionStatus.INPUT_REQUIRED:
                    await self.store.wait(current, LISTEN_POLL)
                    current = await self.store.get(current.execution_id)
                else:
                    current = await self.store.wait(current, LISTEN_WAIT, asked=True)
                    current = await self.store.get(current.execution_id)
            except StoreUnavailable:
                await asyncio.sleep(LISTEN_POLL)

    async def check(self, schema: Any, value: Any) -> None:
        """The answer as every front checks it (service/answering.py): what the record
        cannot keep or keeps no more of, then the request's schema."""
        answering = self.use_cases.answering
        try:
            answering.check_size(value)
            await answering.check_schema({"schema": schema}, value)
        except Refusal as refusal:
            raise mcp_error(refusal) from None
