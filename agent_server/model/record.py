"""The execution record's fields, declared once.

What every route returns for an execution, what a shared store keeps of it, and what the
client reads back are made from this one list: `Execution.to_json` (generated from it, as
`dataclasses` generates `__init__`), the OpenAPI schema (`schema()`), the Redis hash and the
positions its scripts return (`store/redis/scripts.py`, `codes.lua`) and the client's model
(`agent_server.client`, checked against it). A new field is one row here. It imports only the
state machine, so the client can read it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from agent_server.model.status import CancelReason, ExecutionStatus


class Shown(enum.Enum):
    """How a field's value is written in the execution's JSON."""

    #: As it is.
    VALUE = "value"
    #: A Unix time, as RFC 3339 in UTC with microseconds (`...T12:00:00.000000Z`).
    TIME = "time"
    #: The same, or null.
    TIME_OR_NULL = "time_or_null"
    #: The replica that runs it: "" while it is queued (nobody runs it; the replica that
    #: handed it off keeps its id, which fences its late end, but no client is told so).
    OWNER = "owner"
    #: Not shown: kept by the store only.
    HIDDEN = "hidden"


@dataclass(frozen=True)
class Field:
    """One field: its name (in JSON, in the Redis hash and on `Execution`), how it is
    shown, and its JSON schema."""

    name: str
    shown: Shown
    schema: dict[str, Any]


_NULLABLE_STRING: dict[str, Any] = {"type": ["string", "null"]}
_TIME: dict[str, Any] = {"type": "string", "format": "date-time"}

#: What an execution waiting for input asks (`ctx.ask`), in the Execution schema.
INPUT_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["request_id", "prompt", "schema", "asked_at", "expires_at"],
    "properties": {
        "request_id": {"type": "integer", "minimum": 1, "description": "1, 2, ... per execution"},
        "prompt": {"description": "the reasoner's prompt (JSON)"},
        "schema": {
            "type": ["object", "null"],
            "description": "the JSON schema the answer is validated against; null for any JSON",
        },
        "asked_at": _TIME,
        "expires_at": {"oneOf": [{"type": "null"}, _TIME]},
    },
}

#: The record, in the order of its JSON and of the Redis hash.
FIELDS: tuple[Field, ...] = (
    Field("execution_id", Shown.VALUE, {"type": "string"}),
    Field("reasoner", Shown.VALUE, {"type": "string"}),
    Field("session_id", Shown.VALUE, _NULLABLE_STRING),
    Field("status", Shown.VALUE, {"enum": [status.value for status in ExecutionStatus]}),
    Field(
        "status_reason", Shown.VALUE, {"enum": [*(reason.value for reason in CancelReason), None]}
    ),
    Field("result", Shown.VALUE, {}),
    Field(
        "error",
        Shown.VALUE,
        {
            "oneOf": [
                {"type": "null"},
                {
                    "type": "object",
                    "required": ["type", "message"],
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                },
            ]
        },
    ),
    Field("created_at", Shown.TIME, _TIME),
    Field("finished_at", Shown.TIME_OR_NULL, {"oneOf": [{"type": "null"}, _TIME]}),
    Field("duration_seconds", Shown.VALUE, {"type": ["number", "null"]}),
    Field(
        "replica",
        Shown.OWNER,
        {"type": "string", "description": "the replica that runs it (or ran it); '' if queued"},
    ),
    Field("attempt", Shown.VALUE, {"type": "integer", "minimum": 1}),
    #: The pending request while `input_required`, else null (docs/input.md).
    Field(
        "input_request",
        Shown.VALUE,
        {"oneOf": [{"type": "null"}, INPUT_REQUEST_SCHEMA]},
    ),
    #: When a queued execution is due to start (a delayed start, or a retry after its
    #: backoff); null unless it waits for a time.
    Field("scheduled_at", Shown.TIME_OR_NULL, {"oneOf": [{"type": "null"}, _TIME]}),
    #: Ended by the drain without settling (the reasoner ignored its cancellation).
    Field("abandoned", Shown.HIDDEN, {"type": "boolean"}),
)

#: The fields of the execution's JSON, in order.
JSON_FIELDS: tuple[str, ...] = tuple(f.name for f in FIELDS if f.shown is not Shown.HIDDEN)


def schema() -> dict[str, Any]:
    """The execution's JSON schema (OpenAPI's `Execution`)."""
    shown = [f for f in FIELDS if f.shown is not Shown.HIDDEN]
    return {
        "type": "object",
        "required": [f.name for f in shown],
        "properties": {f.name: f.schema for f in shown},
    }


_EXPRESSIONS = {
    Shown.VALUE: "self.{name}",
    Shown.TIME: "isoformat(self.{name})",
    Shown.TIME_OR_NULL: "None if self.{name} is None else isoformat(self.{name})",
    Shown.OWNER: "'' if self.status is QUEUED else self.{name}",
}


def json_maker(isoformat: Any) -> Any:
    """`to_json` for a class with an attribute per field: one dict display, made from
    FIELDS once at import, as fast as one written out (a response builds one per
    execution)."""
    items = ",\n        ".join(
        f"{f.name!r}: {_EXPRESSIONS[f.shown].format(name=f.name)}"
        for f in FIELDS
        if f.shown is not Shown.HIDDEN
    )
    source = f"def to_json(self):\n    return {{\n        {items},\n    }}\n"
    namespace: dict[str, Any] = {"isoformat": isoformat, "QUEUED": ExecutionStatus.QUEUED}
    exec(compile(source, "<agent_server.model.record FIELDS>", "exec"), namespace)
    return namespace["to_json"]
