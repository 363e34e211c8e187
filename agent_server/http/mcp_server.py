"""MCP over Streamable HTTP at `/mcp` (`--mcp`; docs/protocols.md): the official SDK's
low-level `Server` and its session manager (stateless: any replica answers any request)
speak the protocol, revisions 2026-07-28 and 2025-11-25; the handlers here reach executions
through the same registry and store calls as the HTTP routes (runs.py, executions.py,
inputs.py), so an MCP call or task is an execution like any other.

A plain `tools/call` runs its tool as an execution and answers when it ends; a client that
closes the stream first cancels it (`client_disconnected`). With the tasks extension
(2026-07-28, declared in the request's capabilities) a call answers at once with the task
(task id = execution id), which `tasks/get`, `tasks/update` and `tasks/cancel` follow on
any replica. Needs the `mcp` extra (`pip install agent-server[mcp]`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http import check_accept_headers
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    CallToolRequestParams,
    ListToolsResult,
    PaginatedRequestParams,
    SubscriptionsListenRequestParams,
    Tool,
)
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from agent_server.http.event_feed import EventFeed
from agent_server.http.mcp_progress import progress_token, with_progress
from agent_server.http.mcp_requests import (
    TaskParams,
    TaskUpdateParams,
    asked_in,
    caller_of,
    concurrency_of,
    declares_tasks,
    elicits,
    input_required,
)
from agent_server.http.mcp_tasks import McpTasks, mcp_error
from agent_server.http.mcp_tools import (
    TASKS_EXTENSION,
    accepted_task,
    answer_value,
    task,
    tool,
    tool_error,
    tool_result,
    unread_call,
)
from agent_server.http.params import read_body, validation_detail
from agent_server.http.routing import JSONResponse
from agent_server.identity.principal import Principal
from agent_server.model import jsoncodec
from agent_server.model.echoes import one_of, shown
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.service.refusals import Denied, Refusal, Why
from agent_server.service.use_cases import UseCases
from agent_server.service.waits import Until
from agent_server.store.base import StoreUnavailable

logger = logging.getLogger("agent_server.mcp")
#: The SDK's Streamable HTTP transport's logger (its one INFO line is a session's end).
SDK_TRANSPORT_LOGGER = "mcp.server.streamable_http"


#: A start's refusals in this protocol's words (a JSON-RPC error's message); the others as
#: the application layer says them.
START_WORDS: dict[Why, str] = {
    Why.BUSY: "too many executions in flight: retry later",
    Why.UNAVAILABLE: "execution store unavailable: retry later",
    Why.SHUTTING_DOWN: "server is shutting down: retry elsewhere",
    Why.IN_DOUBT: "the store did not confirm the start: it may run (read it as a task)",
}


class McpEndpoint:
    """The `/mcp` route: the SDK's server and session manager, and the handlers that reach
    executions. `run()` is entered for the app's lifespan."""

    def __init__(
        self,
        name: str,
        reasoners: Mapping[str, Reasoner],
        use_cases: UseCases,
        *,
        result_ttl: float,
        allowed_origins: tuple[str, ...],
        max_body_size: int,
        webhook_url: str | None = None,
    ) -> None:
        self.reasoners = reasoners
        self.use_cases = use_cases
        #: Who reaches what: the API's tenant rule and `@agent.authorize` (access.py).
        self.access = use_cases.access
        self.registry = use_cases.registry
        self.store = use_cases.store
        #: Set when the listener closes (shutdown): a plain call still waiting then answers.
        self.closing = use_cases.waits.closing
        #: The tasks extension's handlers, and the reads and checks a call shares with them.
        self.tasks = McpTasks(use_cases, result_ttl)
        self.result_ttl = result_ttl
        #: Where every execution's webhooks go (`--webhook-url`), as for the API's starts.
        self.webhook_url = webhook_url
        self.allowed_origins = frozenset(allowed_origins)
        #: Request body bytes at most (`--max-body-size`), as on every route.
        self.max_body_size = max_body_size
        #: The tools, built once (a reasoner's schemas do not change while it serves).
        self._tools: list[Tool] | None = None
        self.server: Server[Any] = Server(
            name, on_list_tools=self._list_tools, get_tool_input_schema=self._input_schema
        )
        self.server.add_request_handler("tools/call", CallToolRequestParams, self._call_tool)
        self.server.add_request_handler("tasks/get", TaskParams, self.tasks.get_task)
        self.server.add_request_handler("tasks/update", TaskUpdateParams, self.tasks.update_task)
        self.server.add_request_handler("tasks/cancel", TaskParams, self.tasks.cancel_task)
        self.server.add_request_handler(
            "subscriptions/listen", SubscriptionsListenRequestParams, self.tasks.listen
        )
        self.server.extensions = {TASKS_EXTENSION: {}}
        # Stateless, each request is a session the SDK's transport ends with an INFO line
        # ("Terminating session: None"): one a request, saying nothing. Its warnings stay.
        logging.getLogger(SDK_TRANSPORT_LOGGER).setLevel(logging.WARNING)
        # Origin is checked here (`allowed`), before the SDK: its own check also pins Host.
        self.manager = StreamableHTTPSessionManager(
            self.server,
            stateless=True,
            security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
            max_request_body_size=max_body_size,
        )

    @contextlib.asynccontextmanager
    async def run(self) -> AsyncIterator[None]:
        """The session manager's task group, for the app's lifespan."""
        async with self.manager.run():
            yield

    async def endpoint(self, request: Request) -> Response:
        """The route's handler: a foreign `Origin` is 403; a request the transport cannot
        take is refused here with a JSON body, as every route refuses (the SDK's own
        refusals are plain text or empty); the body is read here, so a client that leaves
        before sending it all is a 499, not the SDK's error; the rest is the SDK's."""
        origin = request.headers.get("origin")
        if origin is not None and not self.allowed(origin, request.scope):
            return JSONResponse(
                {"detail": "Origin not allowed (the server's own, or a --cors-allow-origin)"},
                403,
            )
        refused = self.refusal(request)
        if refused is not None:
            return refused
        body = await read_body(request.receive, self.max_body_size)  # ApiError: 413, 499
        return _Delegated(self.manager.handle_request, body)

    def refusal(self, request: Request) -> Response | None:
        """What the SDK's transport would refuse, with its status: a declared body over
        `--max-body-size` (413), a Content-Type other than JSON (400), an Accept without
        both of the answer's media types (406). Other methods than POST carry no message:
        the SDK answers them (405 where the transport has no stream to open)."""
        if request.method != "POST":
            return None
        declared = request.headers.get("content-length", "")
        if _over(declared, self.max_body_size):
            return JSONResponse({"detail": f"request body exceeds {self.max_body_size} bytes"}, 413)
        media_type = request.headers.get("content-type", "").split(";", 1)[0]
        if media_type.strip().lower() != "application/json":
            return JSONResponse(
                {"detail": "Content-Type must be application/json (one JSON-RPC message)"}, 400
            )
        has_json, has_sse = check_accept_headers(request)
        if not (has_json and has_sse):
            return JSONResponse(
                {
                    "detail": "Accept must allow application/json and text/event-stream "
                    "(the answer is one or the other)"
                },
                406,
            )
        return None

    def allowed(self, origin: str, scope: Scope) -> bool:
        """The server's own origin (the request's scheme and Host), or one of
        `--cors-allow-origin` (`*`: any)."""
        if "*" in self.allowed_origins or origin in self.allowed_origins:
            return True
        host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), None)
        return host is not None and origin == f"{scope.get('scheme', 'http')}://{host}"

    # -- tools -------------------------------------------------------------------------------

    @property
    def tools(self) -> list[Tool]:
        if self._tools is None:
            self._tools = [Tool.model_validate(tool(r)) for r in self.reasoners.values()]
        return self._tools

    async def _list_tools(
        self, ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        return ListToolsResult(tools=self.tools)

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        """For the SDK's `Mcp-Param-*` header check, instead of listing the tools again
        for every call."""
        found = next((t for t in self.tools if t.name == name), None)
        return None if found is None else found.input_schema

    async def _call_tool(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> dict[str, Any]:
        """Run the tool as an execution: a task at once with the tasks extension, else its
        result once it ends (a tool error for bad arguments or a failed run)."""
        reasoner = self.reasoners.get(params.name)
        if reasoner is None:
            raise MCPError(
                INVALID_PARAMS,
                f"unknown tool: {shown(params.name)}: one of {one_of(self.reasoners)}",
            )
        if params.request_state is not None:
            return await self._resume_call(ctx, params)
        body: dict[str, Any] = dict(params.arguments or {})
        try:
            # What the API's body check refuses (NaN, Infinity, too deep): the record could
            # not keep it, so nothing starts.
            jsoncodec.check(body, "the input")
            arguments = reasoner.bind(body)
        except jsoncodec.Unrecordable as exc:
            return tool_error(f"invalid arguments: {exc}")
        except ValidationError as exc:
            detail = jsoncodec.dumps(validation_detail(exc)).decode()
            return tool_error(f"invalid arguments: {detail}")
        principal = caller_of(ctx)
        concurrency = concurrency_of(reasoner, ctx)
        if declares_tasks(ctx):
            execution = await self._start(
                principal, reasoner, arguments, body, concurrency, may_queue=True
            )
            if await self.access.reads(principal, execution):
                view = task(execution, self.result_ttl)
            else:  # it may be started, not read: its acceptance alone
                view = accepted_task(execution)
            return {"resultType": "task", **{k: view[k] for k in _TASK_FIELDS if k in view}}
        execution = await self._start(
            principal, reasoner, arguments, body, concurrency, may_queue=False
        )
        if not await self.access.reads(principal, execution):
            return unread_call(execution)  # it runs, unwatched
        return await self._answer_call(ctx, execution)

    async def _answer_call(
        self, ctx: ServerRequestContext[Any], execution: Execution, *, may_cancel: bool = True
    ) -> dict[str, Any]:
        """A plain call's answer: the execution's end as a tool result; its ask as an
        elicitation the client answers by calling again (2026-07-28's multi round-trip
        requests) when it declared elicitation, else a tool error. A caller that may not
        cancel it (one resuming another's call) leaves it running where the call would
        cancel it."""
        following = self._follow(execution, may_cancel=may_cancel)
        token = progress_token(ctx)
        if token is not None:  # the execution's events as progress meanwhile (mcp_progress.py)
            feed = EventFeed(self.registry, self.store, execution)
            following = with_progress(ctx, token, feed, following)
        ended = await following
        if ended is not None and not await self.access.reads(caller_of(ctx), ended):
            return unread_call(ended)  # `read` asked of what the call would hand out
        if ended is None:
            return tool_error(
                f"the server is shutting down: execution {execution.execution_id} did not end "
                "here (call again)"
            )
        if ended.status is ExecutionStatus.INPUT_REQUIRED:
            if elicits(ctx) and ended.input_request is not None:
                return input_required(ended.execution_id, ended.input_request)
            # No way to answer on this call's stream: nobody could, so it ends here.
            if may_cancel:
                await self.use_cases.cancels.for_caller_gone(ended, CancelReason.REQUEST)
            return tool_error(
                f"the tool asks for input; call it with the tasks extension ({TASKS_EXTENSION}) "
                "to answer through tasks/update"
            )
        if not ended.is_terminal or ended.status_reason is CancelReason.SHUTDOWN:
            return tool_error(
                f"the server is shutting down: execution {ended.execution_id} was handed "
                "off or stopped (call again)"
            )
        return tool_result(ended)

    async def _resume_call(
        self, ctx: ServerRequestContext[Any], params: CallToolRequestParams
    ) -> dict[str, Any]:
        """A call again with the answer to its elicitation (`requestState` names the
        execution and its request): the answer is taken as `POST /executions/{id}/input`
        takes it, and the call follows the execution on. Ownership (issue 39): the caller
        must own the execution `requestState` names."""
        execution_id, request_id = asked_in(params.request_state or "")
        principal = caller_of(ctx)
        execution = await self.tasks.read(execution_id, principal)
        if (
            execution is None
            or execution.reasoner != params.name
            or not self.access.sees(principal, execution)
        ):
            raise MCPError(INVALID_PARAMS, "requestState names no call of this tool")
        # Following the call is reading it (its end is the result); answering it, answering;
        # declining, cancelling it; and the call cancels it when its caller leaves.
        await self.tasks.allowed(principal, "read", execution)
        await self.tasks.allowed(principal, "answer", execution)
        may_cancel = await self.tasks.may(principal, "cancel", execution)
        pending = execution.input_request
        if execution.status is ExecutionStatus.INPUT_REQUIRED and pending is not None:
            if int(pending["request_id"]) != request_id:  # answered; it asks anew
                return await self._answer_call(ctx, execution, may_cancel=may_cancel)
            response = (params.input_responses or {}).get(str(request_id))
            if response is None:
                return input_required(execution.execution_id, pending)
            action = getattr(response, "action", None)
            if action != "accept":
                if not may_cancel:
                    raise mcp_error(Denied("cancel"))
                await self.use_cases.cancels.for_caller_gone(execution, CancelReason.REQUEST)
                return tool_error(f"the input was not given ({action}): the call ended")
            schema = pending.get("schema")
            try:
                value = answer_value(schema, getattr(response, "content", None))
            except ValueError as exc:
                raise MCPError(INVALID_PARAMS, str(exc)) from None
            await self.tasks.check(schema, value)
            try:
                taken = await self.store.answer(execution, request_id, value)
            except StoreUnavailable:
                raise MCPError(INTERNAL_ERROR, "execution store unavailable: retry later") from None
            execution = taken or execution
        return await self._answer_call(ctx, execution, may_cancel=may_cancel)

    async def _start(
        self,
        principal: Principal | None,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        body: dict[str, Any],
        concurrency: str | None,
        *,
        may_queue: bool,
    ) -> Execution:
        """Start as every front starts (service/starts.py); a refusal is a JSON-RPC error.
        Ownership (issue 39): the execution is `principal`'s (its tenant's names, its
        `start` action)."""
        starts = self.use_cases.starts
        try:
            await starts.may_start(principal, reasoner, None)
            execution, _ = await starts.start(
                principal,
                reasoner,
                arguments,
                None,
                body=body,
                webhook_url=self.webhook_url,
                may_queue=may_queue,
                concurrency_key=concurrency,
            )
        except Refusal as refusal:
            raise mcp_error(refusal, START_WORDS.get(refusal.why)) from None
        return execution

    async def _follow(self, execution: Execution, *, may_cancel: bool) -> Execution | None:
        """The execution once it ends, waits for input, or is handed off; None when the
        listener closes first. The caller leaving (its stream closed) cancels it, when it
        may."""
        try:
            waited = await self.use_cases.waits.until_reached(execution)
        except BaseException:  # the stream closed (anyio's cancellation), or worse
            if may_cancel:
                with anyio.CancelScope(shield=True):
                    await self.use_cases.cancels.for_caller_gone(execution)
            raise
        return waited.execution if waited.until is Until.REACHED else None


def _over(declared: str, limit: int) -> bool:
    """A declared Content-Length past `limit` (read only when it is ASCII digits, and never
    converted when longer than any length could be)."""
    if not (declared.isascii() and declared.isdigit()):
        return False
    return len(declared) > 20 or int(declared) > limit


#: The fields of a `CreateTaskResult` (a `Task`).
_TASK_FIELDS = (
    "taskId",
    "status",
    "statusMessage",
    "createdAt",
    "lastUpdatedAt",
    "ttlMs",
    "pollIntervalMs",
)


class _Delegated(Response):
    """The SDK's ASGI app as the route's response, given the body the endpoint read (then
    the connection's own messages: the SDK watches them for the client leaving). When it
    answered nothing (the client closed the stream first, and the call was cancelled), the
    answer is a 499, as a sync run whose caller left: counted as the client's doing, not the
    server's 500."""

    def __init__(self, app: Any, body: bytes) -> None:
        self.app = app
        self.request_body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False
        given = False

        async def receiving() -> Message:
            nonlocal given
            if given:
                return await receive()
            given = True
            return {"type": "http.request", "body": self.request_body, "more_body": False}

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, receiving, sending)
        if not started:
            await JSONResponse({"detail": "the client closed the request"}, 499)(
                scope, receive, send
            )
