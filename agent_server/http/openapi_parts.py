"""What the OpenAPI document's modules share: references, responses, the execution's
links, an operation's declared summary, and the hoisting of a schema's `$defs` into the
document's components."""

from __future__ import annotations

from typing import Any

from agent_server.http.route_table import declared
from agent_server.model.names import SESSION_ID_PATTERN

REF_TEMPLATE = "#/components/schemas/{model}"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


#: A start's 202: the execution, or only its id to a caller that may not read it.
STARTED = {"anyOf": [ref("Execution"), ref("Accepted")]}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_response(description: str) -> dict[str, Any]:
    return json_body(ref("Error"), description)


#: The execution a response carries is reachable at these operations (OpenAPI links):
#: clients and stateful fuzzers follow them from a start to its poll, input, cancel and
#: delete.
EXECUTION_LINKS = {
    name: {"operationId": operation, "parameters": {"execution_id": "$response.body#/execution_id"}}
    for name, operation in [
        ("GetExecution", "getExecution"),
        ("GetExecutionInput", "getExecutionInput"),
        ("GetExecutionHistory", "getExecutionHistory"),
        ("CancelExecution", "cancelExecution"),
        ("DeleteExecution", "deleteExecution"),
        ("AnswerInput", "answerInput"),
    ]
}


def hoist(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    components.update(schema.pop("$defs", {}))
    return schema


def operation(path: str, method: str, **fields: Any) -> dict[str, Any]:
    """An operation of the document: its summary as the route table declares it, then the
    rest (its operationId, and authentication's answers, are added from the table too)."""
    return {"summary": declared(path, method).summary, **fields}


EXECUTION_ID = {
    "name": "execution_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
#: agent_server.model.names: what every route that takes a session id accepts (else 400).
SESSION_ID_SCHEMA = {"type": "string", "maxLength": 256, "pattern": SESSION_ID_PATTERN}
EVENT_STREAM: dict[str, Any] = {
    "description": "text/event-stream: `id:` numbered events, comment heartbeats, a `missed` "
    "event when a reader fell behind what is kept, and `event: end` (data: the execution)",
    "content": {
        "text/event-stream": {
            "schema": {  # one event; `data` is JSON text
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "event": {"type": "string"},
                    "data": {"type": "string"},
                    "retry": {"type": "integer"},
                },
            }
        }
    },
}


def paging(cursor_pattern: str) -> list[dict[str, Any]]:
    """A paged list's query parameters: `limit`, and `cursor` (where the page before ended)."""
    return [
        {
            "name": "limit",
            "in": "query",
            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
        {
            "name": "cursor",
            "in": "query",
            "description": "Where the page before ended: from its Link header",
            "schema": {"type": "string", "pattern": cursor_pattern},
        },
    ]


def page_of(item: dict[str, Any], description: str, more: str) -> dict[str, Any]:
    """A page's 200: an array of `item`, its `Link` to the next page while `more`, and
    `X-Truncated` when it was cut at 4 MiB."""
    return {
        **json_body({"type": "array", "items": item}, description),
        "headers": {
            "Link": {
                "description": f'RFC 8288 `<...>; rel="next"` while {more}',
                "schema": {"type": "string"},
            },
            "X-Truncated": {
                "description": "`true` when the page was cut at 4 MiB",
                "schema": {"type": "string"},
            },
        },
    }
