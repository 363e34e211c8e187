"""What an MCP request carries, read for the endpoint (mcp_server.py): the task methods'
params, the caller and its declared capabilities, a call's concurrency key, the answers it
is sent (an elicitation as an `InputRequiredResult`, a task notification)."""

from __future__ import annotations

from typing import Any, cast

from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS, RequestParams
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, Field
from starlette.requests import Request

from agent_server.http.auth import principal_of
from agent_server.http.mcp_tools import TASKS_EXTENSION, elicitation
from agent_server.http.params import first_values
from agent_server.identity.principal import Principal
from agent_server.model.reasoner import Reasoner
from agent_server.service.refusals import Refusal
from agent_server.service.starts import concurrency_value

#: Task ids one `subscriptions/listen` may follow.
MAX_LISTENED_TASKS = 100
#: Characters of a task id (an execution id) a request may name.
MAX_TASK_ID = 200
#: Digits of the request number a `requestState` ends with (far more asks than any run makes).
MAX_REQUEST_DIGITS = 9
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"


class TaskParams(RequestParams):
    """`tasks/get` and `tasks/cancel`: the task's id."""

    task_id: str = Field(alias="taskId", min_length=1, max_length=MAX_TASK_ID)


class TaskUpdateParams(TaskParams):
    """`tasks/update`: answers to the task's outstanding input requests, by key."""

    input_responses: dict[str, Any] = Field(alias="inputResponses")


class Notification(BaseModel):
    """A notification of the tasks extension, its params as they are (the SDK's
    `Notification` would read them as the core's `NotificationParams`)."""

    method: str
    params: dict[str, Any]


async def notify(ctx: ServerRequestContext[Any], method: str, params: dict[str, Any]) -> None:
    """A notification on this request's stream (the SDK types only the core ones)."""
    if ctx.request_id is not None and "_meta" not in params:
        params = {**params, "_meta": {SUBSCRIPTION_ID: ctx.request_id}}
    note = Notification(method=method, params=params)
    await ctx.session.send_notification(cast(Any, note), related_request_id=ctx.request_id)


def task_ids(wanted: Any) -> list[str]:
    """`taskIds` of a listen: a list of strings, at most MAX_LISTENED_TASKS."""
    if wanted is None:
        return []
    if (
        not isinstance(wanted, list)
        or len(wanted) > MAX_LISTENED_TASKS
        or not all(isinstance(i, str) and 0 < len(i) <= MAX_TASK_ID for i in wanted)
    ):
        raise MCPError(INVALID_PARAMS, f"taskIds: a list of at most {MAX_LISTENED_TASKS} task ids")
    return list(dict.fromkeys(wanted))


def concurrency_of(reasoner: Reasoner, ctx: ServerRequestContext[Any]) -> str | None:
    """The reasoner's concurrency key value for this call, by runs.py's rule (a
    `header:NAME` key read from the POST's headers; no session on MCP); a bad header is
    invalid params."""
    request = ctx.request
    raw_headers = request.scope["headers"] if isinstance(request, Request) else []
    headers = first_values(raw_headers)
    try:
        return concurrency_value(reasoner, lambda name: headers.get(name.lower().encode()), None)
    except Refusal as refusal:
        raise MCPError(INVALID_PARAMS, str(refusal.detail)) from None


def caller_of(ctx: ServerRequestContext[Any]) -> Principal | None:
    """Who sent the request (auth.py put it in the scope)."""
    request = ctx.request
    return principal_of(request.scope) if isinstance(request, Request) else None


def elicits(ctx: ServerRequestContext[Any]) -> bool:
    """The request is of 2026-07-28 and its client declared elicitation: an ask is put to
    it as an `InputRequiredResult` (a stateless server has no stream back on 2025-11-25)."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    return capabilities is not None and capabilities.elicitation is not None


def input_required(execution_id: str, asked: dict[str, Any]) -> dict[str, Any]:
    """The ask as an `InputRequiredResult`: its elicitation, keyed by its request's number,
    and the state the client sends back with its answer."""
    number = str(asked["request_id"])
    return {
        "resultType": "input_required",
        "inputRequests": {number: elicitation(asked)},
        "requestState": f"{execution_id}:{number}",
    }


def asked_in(state: str) -> tuple[str, int]:
    """The execution and request number of a `requestState` as `input_required` writes it
    (`ID:N`, N in ASCII digits without leading zeros); anything else is invalid params, never
    read further (`int` alone takes other scripts' digits, and thousands of digits raise)."""
    execution_id, _, number = state.rpartition(":")
    if (
        not 0 < len(execution_id) <= MAX_TASK_ID
        or not 0 < len(number) <= MAX_REQUEST_DIGITS
        or not (number.isascii() and number.isdigit())
        or number != str(int(number))
    ):
        raise MCPError(INVALID_PARAMS, "requestState is not one this server gave")
    return execution_id, int(number)


def declares_tasks(ctx: ServerRequestContext[Any]) -> bool:
    """The request is of 2026-07-28 and declares the tasks extension in its capabilities."""
    if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
        return False
    capabilities = ctx.session.client_capabilities
    extensions = None if capabilities is None else capabilities.extensions
    return bool(extensions) and TASKS_EXTENSION in (extensions or {})
