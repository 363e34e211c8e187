"""The errors the client raises, and the one place an answer is turned into one."""

from __future__ import annotations

import json
from typing import Any

import httpx

from agent_server.client.models import TERMINAL, Execution


class AgentServerError(Exception):
    """Any error this client reports: `status` is the HTTP status of the answer it comes
    from (None when there was none, or for an end read from the execution itself), `body`
    the server's JSON (`{"detail": ...}` or the execution)."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def detail(self) -> Any:
        return self.body.get("detail") if isinstance(self.body, dict) else None


class Unauthorized(AgentServerError):
    """401: no token, or the wrong one."""


class NotFound(AgentServerError):
    """404: unknown reasoner or execution (forgotten, or never there)."""


class InvalidInput(AgentServerError):
    """The server refused the request itself: 422 with pydantic's error list in `errors`,
    or 400, 413, 415."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        detail = self.detail
        return detail if isinstance(detail, list) else []


class Conflict(AgentServerError):
    """409 without an execution: a session being released, a running execution deleted,
    `cancel_running=false` with running work."""


class Unavailable(AgentServerError):
    """Not answered within `retry_for` seconds of retries: unreachable, shutting down, or
    the shared store unavailable."""


class Busy(Unavailable):
    """Still 429 (`max_inflight` reached) after `retry_for` seconds of retries."""


class WaitTimeout(AgentServerError, TimeoutError):
    """The execution had not ended within the time the caller gave; `execution` is the last
    state seen, when one was seen."""

    def __init__(self, message: str, execution: Execution | None = None) -> None:
        super().__init__(message, body=None if execution is None else execution.json)
        self.execution = execution


class ExecutionError(AgentServerError):
    """An execution that ended other than `succeeded`; `execution` is how it ended."""

    def __init__(self, execution: Execution, message: str, status: int | None = None) -> None:
        super().__init__(message, status=status, body=execution.json)
        self.execution = execution


class ExecutionFailed(ExecutionError):
    """The reasoner raised: `error_type` and `message` name the exception."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        error = execution.error or {}
        self.error_type = str(error.get("type", "Error"))
        self.message = str(error.get("message", ""))
        super().__init__(
            execution,
            f"execution {execution.execution_id} failed: {self.error_type}: {self.message}",
            status,
        )


class ExecutionCancelled(ExecutionError):
    """Cancelled; `reason` is `request`, `session_released`, `shutdown` or
    `client_disconnected`."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        self.reason = execution.status_reason
        super().__init__(
            execution,
            f"execution {execution.execution_id} was cancelled ({self.reason})",
            status,
        )


class ExecutionLost(ExecutionError):
    """The replica that ran it stopped renewing its liveness, and it could not be retried."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        message = (execution.error or {}).get("message", "its replica was lost")
        super().__init__(
            execution, f"execution {execution.execution_id} was lost: {message}", status
        )


def response_body(response: httpx.Response) -> Any:
    """The answer's JSON; its text as a `detail` when it is not JSON (a proxy's page)."""
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def is_execution(body: Any) -> bool:
    return isinstance(body, dict) and "execution_id" in body and "status" in body


def error_from_response(response: httpx.Response) -> AgentServerError:
    """The typed error for an answer the caller did not ask for."""
    status = response.status_code
    body = response_body(response)
    if is_execution(body):
        execution = Execution.from_json(body)
        if execution.status in TERMINAL and execution.status != "succeeded":
            try:
                execution.outcome()
            except ExecutionError as exc:
                exc.status = status
                return exc
    detail = body.get("detail") if isinstance(body, dict) else body
    shown = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    message = f"{response.request.method} {response.request.url.path}: {status} {shown}"
    kind: type[AgentServerError] = AgentServerError
    if status == 401:
        kind = Unauthorized
    elif status == 404:
        kind = NotFound
    elif status in (400, 413, 415, 422):
        kind = InvalidInput
    elif status == 409:
        kind = Conflict
    elif status == 429:
        kind = Busy
    elif status in (502, 503, 504):
        kind = Unavailable
    return kind(message, status=status, body=body)
