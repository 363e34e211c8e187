"""MCP's view of reasoners and executions (docs/protocols.md): each reasoner a tool with its
schemas, an execution's end a tool result, an execution a task of the tasks extension, and
a pending `ctx.ask` an elicitation. Plain JSON both ways: the record stays the one truth,
these are only how MCP reads it."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner

#: The request headers of MCP's Streamable HTTP transport, which a browser page of a
#: `--cors-allow-origin` origin must be allowed to send.
MCP_REQUEST_HEADERS = ("MCP-Protocol-Version", "Mcp-Method", "Mcp-Name")
#: The tasks extension's identifier (modelcontextprotocol/ext-tasks).
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
#: How often a client should poll `tasks/get`, in milliseconds (a hint; notifications and
#: the record's own waits are what follow a task closely).
POLL_INTERVAL_MS = 1000


class TaskStatus(enum.StrEnum):
    """The tasks extension's statuses (three share a name with an execution's status)."""

    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Statuses of the tasks extension by the execution's (agent_server/model/status.py). A
#: reasoner's failure is a tool error (`completed` with `isError`), as the extension says:
#: `failed` is for an end with no tool result at all (`lost`).
TASK_STATUS: dict[ExecutionStatus, TaskStatus] = {
    ExecutionStatus.QUEUED: TaskStatus.WORKING,
    ExecutionStatus.RUNNING: TaskStatus.WORKING,
    ExecutionStatus.INPUT_REQUIRED: TaskStatus.INPUT_REQUIRED,
    ExecutionStatus.SUCCEEDED: TaskStatus.COMPLETED,
    ExecutionStatus.FAILED: TaskStatus.COMPLETED,
    ExecutionStatus.CANCELLED: TaskStatus.CANCELLED,
    ExecutionStatus.LOST: TaskStatus.FAILED,
}
if set(TASK_STATUS) != set(ExecutionStatus):
    raise RuntimeError("TASK_STATUS must map every status")

#: JSON Schema types an elicitation's flat form may hold (MCP's PrimitiveSchemaDefinition).
_PRIMITIVE_TYPES = frozenset({"string", "number", "integer", "boolean"})


def tool(reasoner: Reasoner) -> dict[str, Any]:
    """The reasoner as an MCP tool: its name, description and input schema, and its output
    schema as the object `structuredContent` is (wrapped as `{"result": ...}` when the
    reasoner returns something else; none when its type is open, as `Any` is)."""
    described: dict[str, Any] = {
        "name": reasoner.name,
        "inputSchema": object_schema(reasoner.input_schema()),
    }
    if reasoner.description:
        described["description"] = reasoner.description
    output = output_schema(reasoner.output_schema())
    if output is not None:
        described["outputSchema"] = output
    return described


def object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema MCP accepts: `type: object` at its root."""
    return schema if schema.get("type") == "object" else {**schema, "type": "object"}


def output_schema(schema: dict[str, Any]) -> dict[str, Any] | None:
    """What `structuredContent` follows: the schema itself for an object, `{"result":
    schema}` for another named type, None when the type is open (the value may or may not
    be an object, so no one schema holds for what is sent)."""
    kind = schema.get("type")
    if kind == "object":
        return schema
    if not isinstance(kind, str):
        return None
    return wrapped(schema, "result")


def wrapped(schema: dict[str, Any], name: str) -> dict[str, Any]:
    """`schema` as the one required property `name` of an object, its `$defs` kept at the
    root where its `$ref`s point."""
    inner = {key: value for key, value in schema.items() if key != "$defs"}
    outer: dict[str, Any] = {
        "type": "object",
        "properties": {name: inner},
        "required": [name],
    }
    if "$defs" in schema:
        outer["$defs"] = schema["$defs"]
    return outer


def structured(value: Any) -> dict[str, Any]:
    """A result as `structuredContent`: an object as it is, anything else `{"result": v}`."""
    return value if isinstance(value, dict) else {"result": value}


def tool_result(execution: Execution) -> dict[str, Any]:
    """A `CallToolResult` for an ended execution: its result (text and structured), or a
    tool error saying how it ended."""
    if execution.status is ExecutionStatus.SUCCEEDED:
        return {
            "content": [{"type": "text", "text": jsoncodec.dumps(execution.result).decode()}],
            "structuredContent": structured(execution.result),
            "isError": False,
            "resultType": "complete",
        }
    return tool_error(ended_message(execution))


def tool_error(message: str) -> dict[str, Any]:
    """A tool result with `isError`: what the model reads and may correct. (`resultType`
    is 2026-07-28's; the SDK drops it for 2025-11-25.)"""
    text = {"type": "text", "text": message}
    return {"content": [text], "isError": True, "resultType": "complete"}


def ended_message(execution: Execution) -> str:
    """How an execution that did not succeed ended, in one line."""
    if execution.status is ExecutionStatus.FAILED and execution.error:
        kind = execution.error.get("type", "error")
        return f"{kind}: {execution.error.get('message', '')}"
    reason = execution.status_reason.value if execution.status_reason else None
    said = execution.status.value + (f" ({reason})" if reason else "")
    return f"execution {execution.execution_id} ended {said}"


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def task(execution: Execution, result_ttl: float) -> dict[str, Any]:
    """The tasks extension's `DetailedTask` for an execution (task id = execution id): its
    status, and by it the tool result, the error, or the pending elicitation. Its TTL is
    unlimited until it ends, then counts to when the end is forgotten (`--result-ttl`)."""
    status = TASK_STATUS[execution.status]
    updated = execution.finished_at or execution.created_at
    asked = execution.input_request
    if asked is not None and isinstance(asked.get("asked_at"), str):
        updated_text = asked["asked_at"]
    else:
        updated_text = _iso(updated)
    view: dict[str, Any] = {
        "taskId": execution.execution_id,
        "status": status.value,
        "createdAt": _iso(execution.created_at),
        "lastUpdatedAt": updated_text,
        "ttlMs": ttl_ms(execution, result_ttl),
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if status is TaskStatus.COMPLETED:
        view["result"] = tool_result(execution)
    elif status is TaskStatus.FAILED:
        message = ended_message(execution)
        view["statusMessage"] = message
        view["error"] = {"code": -32603, "message": message}
    elif status is TaskStatus.CANCELLED:
        view["statusMessage"] = ended_message(execution)
    elif status is TaskStatus.INPUT_REQUIRED and asked is not None:
        view["inputRequests"] = {str(asked["request_id"]): elicitation(asked)}
    return view


def accepted_task(execution: Execution) -> dict[str, Any]:
    """A new task as a caller that may start it but not read it is answered: its id,
    `working` (accepted) and its creation, nothing else of the record (docs/security.md)."""
    created = _iso(execution.created_at)
    return {
        "taskId": execution.execution_id,
        "status": TaskStatus.WORKING.value,
        "createdAt": created,
        "lastUpdatedAt": created,
        "ttlMs": None,
        "pollIntervalMs": POLL_INTERVAL_MS,
    }


def unread_call(execution: Execution) -> dict[str, Any]:
    """A plain call's answer to a caller that may start the tool but not read its result:
    a tool error naming the execution, which runs on (docs/security.md)."""
    return tool_error(
        f"execution {execution.execution_id} was started, but this caller may not read it "
        "(authorize denies read): its result is not shown"
    )


def ttl_ms(execution: Execution, result_ttl: float) -> int | None:
    """Milliseconds from its creation until its record may be forgotten; None while it runs."""
    if execution.finished_at is None:
        return None
    return round((execution.finished_at + result_ttl - execution.created_at) * 1000)


def elicitation(asked: dict[str, Any]) -> dict[str, Any]:
    """A pending `ctx.ask` as an `elicitation/create` request: its prompt the message, its
    schema the requested schema, wrapped as `{"value": ...}` unless a flat object."""
    prompt = asked.get("prompt")
    message = prompt if isinstance(prompt, str) else jsoncodec.dumps(prompt).decode()
    schema = asked.get("schema")
    return {
        "method": "elicitation/create",
        "params": {"mode": "form", "message": message, "requestedSchema": requested(schema)},
    }


def is_flat(schema: Any) -> bool:
    """An object whose properties are each of one primitive type (or an enum of strings):
    what an elicitation form may ask as it is."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return False
    properties = schema.get("properties")
    if not isinstance(properties, dict) or not properties:
        return False
    for prop in properties.values():
        if not isinstance(prop, dict) or prop.get("type") not in _PRIMITIVE_TYPES:
            return False
    return True


def requested(schema: Any) -> dict[str, Any]:
    """The `requestedSchema` of an ask's schema (None: any JSON)."""
    if is_flat(schema):
        assert isinstance(schema, dict)
        return schema
    return wrapped(schema if isinstance(schema, dict) else {}, "value")


def answer_value(schema: Any, content: Any) -> Any:
    """The value an accepted elicitation gives: its content for a flat schema, else the
    content's `value`. Raises ValueError when the content is not of that shape."""
    if not isinstance(content, dict):
        raise ValueError("an accepted elicitation carries its content as an object")
    if is_flat(schema):
        return content
    if "value" not in content:
        raise ValueError('the content must hold "value" (the requested schema wraps it)')
    return content["value"]
