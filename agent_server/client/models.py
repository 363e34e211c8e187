"""What the server answers, as the client hands it to its caller."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agent_server import status as states

#: The statuses an execution does not leave, from the one table (status.py imports nothing
#: of the server).
TERMINAL = frozenset(status.value for status in states.TERMINAL)


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
    #: The JSON object exactly as received (fields this client does not know included).
    json: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Execution:
        return cls(
            execution_id=str(body["execution_id"]),
            reasoner=str(body.get("reasoner", "")),
            status=str(body["status"]),
            session_id=body.get("session_id"),
            status_reason=body.get("status_reason"),
            result=body.get("result"),
            error=body.get("error"),
            created_at=body.get("created_at"),
            finished_at=body.get("finished_at"),
            duration_seconds=body.get("duration_seconds"),
            replica=body.get("replica"),
            attempt=int(body.get("attempt", 1)),
            json=body,
        )

    @property
    def is_terminal(self) -> bool:
        """`queued` and `running` are not terminal; every other status is."""
        return self.status in TERMINAL

    def outcome(self) -> Any:
        """The result of a succeeded execution; the typed error of any other end."""
        # Imported here: the errors carry executions, so errors.py imports this module.
        from agent_server.client import errors

        if self.status == "succeeded":
            return self.result
        if self.status == "failed":
            raise errors.ExecutionFailed(self)
        if self.status == "cancelled":
            raise errors.ExecutionCancelled(self)
        if self.status == "lost":
            raise errors.ExecutionLost(self)
        raise errors.AgentServerError(
            f"execution {self.execution_id} is {self.status}", body=self.json
        )


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
