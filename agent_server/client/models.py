"""What the server answers, as the client hands it to its caller: the models, and the errors
an answer stands for (those of an execution carry it, so they live beside it), turned into
one in one place (`error_from_response`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

import httpx

from agent_server.model import record
from agent_server.model import status as states

#: The statuses an execution does not leave, from the one table (status.py imports nothing
#: of the server).
TERMINAL = frozenset(status.value for status in states.TERMINAL)
#: The status of an execution whose reasoner waits for input (docs/input.md).
INPUT_REQUIRED = states.ExecutionStatus.INPUT_REQUIRED.value
_S = states.ExecutionStatus
#: The status this client gives a start the server answered with its id alone: the caller
#: may start it but not read it (docs/security.md#what-each-call-asks); reading it is 403.
ACCEPTED = "accepted"


@dataclass(frozen=True)
class Execution:
    """One execution as the server reported it (docs/api.md#the-execution)."""

    execution_id: str
    reasoner: str
    status: str
    session_id: str | None = None
    status_reason: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: str | None = None
    finished_at: str | None = None
    duration_seconds: float | None = None
    replica: str | None = None
    attempt: int = 1
    #: While `input_required`: what it asks (`request_id`, `prompt`, `schema`, `asked_at`,
    #: `expires_at`); None otherwise.
    input_request: dict[str, Any] | None = None
    #: While `queued` for a time (a delayed start, or a retry after its backoff): when it
    #: is due to start (RFC 3339); None otherwise.
    scheduled_at: str | None = None
    #: Who started it (the caller's identity) and whose it is (its tenant); None on a
    #: server without authentication.
    owner: str | None = None
    tenant: str | None = None
    #: The schedule whose firing started it (docs/schedules.md); None otherwise.
    schedule_id: str | None = None
    #: The version of the code that ran its latest attempt (docs/durable.md); None while
    #: unversioned or before a first run.
    version: str | None = None
    #: The JSON object exactly as received (fields this client does not know included).
    json: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Execution:
        """Every field the record declares (agent_server/model/record.py), read by name."""
        values = {name: body.get(name, default) for name, default in _DEFAULTS.items()}
        values["execution_id"] = str(body["execution_id"])
        values["status"] = str(body.get("status", ACCEPTED))
        values["reasoner"] = str(values["reasoner"])
        values["attempt"] = int(values["attempt"])
        return cls(**values, json=body)

    @property
    def is_terminal(self) -> bool:
        """`queued`, `running` and `input_required` are not terminal; every other status is."""
        return self.status in TERMINAL

    @property
    def waits_for_input(self) -> bool:
        """Its reasoner waits for an answer (`respond`): status `input_required`."""
        return self.status == INPUT_REQUIRED

    @property
    def pending_request_id(self) -> int | None:
        """While it waits for input: the id of the request it waits for; else None."""
        request = self.input_request if self.waits_for_input else None
        number = None if request is None else request.get("request_id")
        return number if isinstance(number, int) and not isinstance(number, bool) else None

    def outcome(self) -> Any:
        """The result of a succeeded execution; the typed error of any other end."""
        if self.status == _S.SUCCEEDED:
            return self.result
        if self.status == _S.FAILED:
            raise ExecutionFailed(self)
        if self.status == _S.CANCELLED:
            raise ExecutionCancelled(self)
        if self.status == _S.LOST:
            raise ExecutionLost(self)
        if self.status == INPUT_REQUIRED:
            raise InputRequired(self)
        raise AgentServerError(f"execution {self.execution_id} is {self.status}", body=self.json)


#: Each field of the record and its value when a server leaves it out; the same names as
#: the declaration, or the client is not importable (a field added there is added here).
_DEFAULTS: dict[str, Any] = {
    f.name: "" if f.name == "reasoner" else (None if f.default is MISSING else f.default)
    for f in fields(Execution)
    if f.name != "json"
}
if set(_DEFAULTS) != set(record.JSON_FIELDS):
    raise RuntimeError("the client's Execution must have the record's fields (record.py)")


@dataclass(frozen=True)
class Event:
    """One server-sent event of an execution: its number (None for the unnumbered `start`,
    `missed` and `end`), name and JSON data. The stream's last event is `end`, whose data
    is the execution."""

    id: int | None
    event: str
    data: Any


@dataclass(frozen=True)
class ReasonerInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ReasonerInfo:
        return cls(
            name=body["name"],
            description=body.get("description"),
            input_schema=body.get("input_schema", {}),
            output_schema=body.get("output_schema", {}),
        )


@dataclass(frozen=True)
class SessionRelease:
    """The answer to `DELETE /sessions/{id}`. The server has its own in sessions.py: this
    one keeps the client free of the server's modules."""

    session_id: str
    cancelled: int
    abandoned: int
    forgotten: int
    elapsed_seconds: float

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SessionRelease:
        return cls(
            session_id=body["session_id"],
            cancelled=int(body["cancelled"]),
            abandoned=int(body["abandoned"]),
            forgotten=int(body["forgotten"]),
            elapsed_seconds=float(body["elapsed_seconds"]),
        )


#: Named here: the clients' `list` method hides the builtin inside their class bodies.
Executions = list[Execution]
Reasoners = list[ReasonerInfo]
#: One status, several (any of them), or None (any status).
Statuses = str | Iterable[str] | None


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


class Forbidden(AgentServerError):
    """403: the server's `@agent.authorize` refused this action to the caller."""


class NotFound(AgentServerError):
    """404: unknown reasoner or execution (forgotten, or never there, or another tenant's)."""


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


class InDoubt(Unavailable):
    """A write (a start, an answer, a cancel, a delete) the server took but could not yet
    confirm on a Redis replica, still so after `retry_for` seconds of retries with the same
    `Idempotency-Key` or `request_id`: it may have happened or not. `execution_id` and
    `location` name the execution to read later (section 12: settled later)."""

    def __init__(
        self,
        message: str,
        *,
        execution_id: str,
        location: str,
        status: int | None = None,
        body: Any = None,
    ) -> None:
        super().__init__(message, status=status, body=body)
        self.execution_id = execution_id
        self.location = location


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


class InputRequired(AgentServerError):
    """A run reached `input_required`: its reasoner waits for an answer. `execution` is the
    execution (its `input_request` says what it asks); `handle` (set by `run`) follows it:
    `exc.handle.respond(value)`, then `exc.handle.result()`."""

    def __init__(self, execution: Execution, handle: Any = None) -> None:
        request = execution.input_request or {}
        super().__init__(
            f"execution {execution.execution_id} waits for input "
            f"(request {request.get('request_id')})",
            body=execution.json,
        )
        self.execution = execution
        self.handle = handle


def response_body(response: httpx.Response) -> Any:
    """The answer's JSON; its text as a `detail` when it is not JSON (a proxy's page)."""
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def is_execution(body: Any) -> bool:
    return isinstance(body, dict) and "execution_id" in body and "status" in body


def is_acceptance(response: httpx.Response, body: Any) -> bool:
    """A start's 202 with its id alone: the caller may start it, not read it."""
    return response.status_code == 202 and isinstance(body, dict) and set(body) == {"execution_id"}


def error_from_response(response: httpx.Response) -> AgentServerError:
    """The typed error for an answer the caller did not ask for."""
    status = response.status_code
    body = response_body(response)
    if is_execution(body):
        execution = Execution.from_json(body)
        if execution.status in TERMINAL and execution.status != _S.SUCCEEDED:
            try:
                execution.outcome()
            except ExecutionError as exc:
                exc.status = status
                return exc
    detail = body.get("detail") if isinstance(body, dict) else body
    shown = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    # The path as sent (percent-encoded ids and names: `..%2Fmetrics`, not `../metrics`).
    path = response.request.url.raw_path.partition(b"?")[0].decode("ascii", "replace")
    message = f"{response.request.method} {path}: {status} {shown}"
    kind: type[AgentServerError] = AgentServerError
    if status == 401:
        kind = Unauthorized
    elif status == 403:
        kind = Forbidden
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
