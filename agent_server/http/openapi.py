"""OpenAPI 3.1 description of the HTTP API, reasoner schemas included.

Each reasoner gets its own concrete paths so clients and fuzzers see its real input schema.
Pydantic's `$defs` are hoisted into `components/schemas`: in OpenAPI a `$ref` is resolved
against the document, not the embedded schema.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent_server.http.auth import OPEN_PATHS
from agent_server.http.openapi_parts import (
    EXECUTION_LINKS,
    REF_TEMPLATE,
    STARTED,
    error_response,
    hoist,
    json_body,
    ref,
)
from agent_server.http.openapi_schedules import schedule_paths
from agent_server.http.replicas import REPLICA_SCHEMA
from agent_server.model import record
from agent_server.model.execution import MAX_SECONDS, ExecutionStatus
from agent_server.model.names import (
    REASONER_NAME_PATTERN,
    SCHEDULE_ID_PATTERN,
    SESSION_ID_PATTERN,
)
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import MAX_DELAY_SECONDS, SessionPolicy
from agent_server.model.status import HOW, KEPT_MOVES
from agent_server.store.cursor import CURSOR_PATTERN

NULLABLE_STRING = {"type": ["string", "null"]}

#: The execution's JSON, from its fields' declaration.
EXECUTION_SCHEMA: dict[str, Any] = record.schema()

BASE_SCHEMAS: dict[str, Any] = {
    "Execution": EXECUTION_SCHEMA,
    # One entry of `GET /executions/{id}/history` (status.py `kept_move`).
    "Move": {
        "type": "object",
        "required": ["at", "move", "from", "to", "attempt", "replica", "version"],
        "properties": {
            "at": {"type": "string", "format": "date-time"},
            "move": {"enum": list(HOW)},
            "from": {"type": "string", "description": "a status, or parked (nobody owns it)"},
            "to": {"type": "string", "description": "a status, or parked (nobody owns it)"},
            "attempt": {
                "type": "integer",
                "description": "the attempt it begins (to running), else the one it leaves",
            },
            "replica": {"type": "string"},
            "version": {
                "type": ["string", "null"],
                "description": "the code that ran the attempt it leaves (null: begins one)",
            },
        },
        "additionalProperties": False,
    },
    "Error": {"type": "object", "required": ["detail"], "properties": {"detail": {}}},
    # A start's answer to a caller that may start but not read (docs/security.md).
    "Accepted": {
        "type": "object",
        "required": ["execution_id"],
        "properties": {"execution_id": {"type": "string"}},
        "additionalProperties": False,
    },
    "SessionRelease": {
        "type": "object",
        "required": ["session_id", "cancelled", "abandoned", "forgotten", "elapsed_seconds"],
        "properties": {
            "session_id": {"type": "string"},
            "cancelled": {"type": "integer"},
            "abandoned": {"type": "integer"},
            "forgotten": {"type": "integer"},
            "elapsed_seconds": {"type": "number"},
        },
    },
    "Reasoner": {
        "type": "object",
        "required": ["name", "description", "input_schema", "output_schema"],
        "properties": {
            "name": {"type": "string"},
            "description": NULLABLE_STRING,
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object"},
        },
    },
    "Health": {
        "type": "object",
        "required": ["status", "phase"],
        "properties": {"status": {"type": "string"}, "phase": {"type": "string"}},
    },
}

EXECUTION_ID = {
    "name": "execution_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
#: agent_server.model.names: what every route that takes a session id accepts (else 400).
SESSION_ID_SCHEMA = {"type": "string", "maxLength": 256, "pattern": SESSION_ID_PATTERN}
SESSION_HEADER = {
    "name": "X-Session-ID",
    "in": "header",
    "required": False,
    "schema": SESSION_ID_SCHEMA,
}
IDEMPOTENCY_HEADER = {
    "name": "Idempotency-Key",
    "in": "header",
    "required": False,
    "description": "A repeat with the same reasoner, session and body gets the same "
    "execution, never a second run; the same key with another request is 422.",
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]+$"},
}
WEBHOOK_HEADER = {
    "name": "X-Webhook-URL",
    "in": "header",
    "required": False,
    "description": "Where this execution's webhooks go (execution.finished, "
    "execution.input_required), signed per Standard Webhooks; an absolute http(s) URL, and "
    "the server needs a webhook secret (else 400). docs/webhooks.md.",
    "schema": {"type": "string", "maxLength": 2048, "pattern": "^https?://[!-~]+$"},
}
SESSION_POLICY_HEADER = {
    "name": "X-Session-Policy",
    "in": "header",
    "required": False,
    "description": "With X-Session-ID, what this start does among the session's non-terminal "
    "executions (the reasoner's default otherwise): parallel runs beside them; reject is 409 "
    "naming one; enqueue queues it after them, in arrival order; interrupt cancels them "
    "(interrupted) and starts once they settled; rollback also forgets them. 400 otherwise.",
    "schema": {"enum": [policy.value for policy in SessionPolicy]},
}
DELAY_PARAMETER = {
    "name": "delay",
    "in": "query",
    "required": False,
    "description": "Start no sooner than this many seconds from now (at most 7 days): the "
    "execution is `queued` with its `scheduled_at` until then; 400 past 7 days.",
    "schema": {"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS},
}
#: operationId of every fixed route; reasoner routes are `run_{name}` and `start_{name}`.
OPERATION_IDS = {
    ("/reasoners", "get"): "listReasoners",
    ("/executions", "get"): "listExecutions",
    ("/executions/{execution_id}", "get"): "getExecution",
    ("/executions/{execution_id}", "delete"): "deleteExecution",
    ("/executions/{execution_id}/cancel", "post"): "cancelExecution",
    ("/executions/{execution_id}/events", "get"): "streamExecutionEvents",
    ("/executions/{execution_id}/input", "get"): "getExecutionInput",
    ("/executions/{execution_id}/history", "get"): "getExecutionHistory",
    ("/executions/{execution_id}/input", "post"): "answerInput",
    ("/sessions/{session_id}", "delete"): "releaseSession",
    ("/healthz", "get"): "healthz",
    ("/readyz", "get"): "readyz",
    ("/metrics", "get"): "metrics",
    ("/openapi.json", "get"): "openapi",
    ("/replicas", "get"): "listReplicas",
}
#: operationId of the schedule routes, documented when the server serves them.
SCHEDULE_OPERATION_IDS = {
    ("/schedules", "get"): "listSchedules",
    ("/schedules", "post"): "createSchedule",
    ("/schedules/{schedule_id}", "get"): "getSchedule",
    ("/schedules/{schedule_id}", "patch"): "changeSchedule",
    ("/schedules/{schedule_id}", "delete"): "deleteSchedule",
    ("/schedules/{schedule_id}/trigger", "post"): "triggerSchedule",
}
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
START_ERRORS: dict[str, Any] = {
    "400": error_response(
        "Malformed JSON body, X-Session-ID, X-Session-Policy, Idempotency-Key, X-Webhook-URL "
        "or ?delay="
    ),
    "409": error_response(
        "The session is being released, or has a non-terminal execution (session "
        "policy reject: the body also names its execution_id)"
    ),
    "413": error_response("Body over the size limit"),
    "415": error_response("Body is not JSON"),
    "422": error_response("Invalid input, or an Idempotency-Key first used for another request"),
    "429": error_response("Too many executions in flight"),
    "503": error_response("Not accepting work: shutting down"),
}


def _reasoner_paths(reasoner: Reasoner, components: dict[str, Any]) -> dict[str, Any]:
    input_schema = hoist(reasoner.input_schema(REF_TEMPLATE), components)
    body = {
        # No body is an empty object: only a reasoner with required fields needs one.
        "required": bool(input_schema.get("required")),
        "content": {"application/json": {"schema": input_schema}},
    }
    output = hoist(reasoner.output_schema(REF_TEMPLATE), components)
    succeeded = {"allOf": [ref("Execution"), {"properties": {"result": output}}]}
    tag = [reasoner.name]
    run = {
        "operationId": f"run_{reasoner.name}",
        "summary": reasoner.description or f"Run {reasoner.name} and wait",
        "tags": tag,
        "parameters": [SESSION_HEADER, SESSION_POLICY_HEADER, IDEMPOTENCY_HEADER],
        "requestBody": body,
        "responses": {
            "200": {
                "description": "The execution succeeded; with `Accept: text/event-stream`, "
                "its events (`event: start` first, `event: end` last)",
                "content": {
                    "application/json": {"schema": succeeded},
                    **EVENT_STREAM["content"],
                },
                "links": EXECUTION_LINKS,
            },
            "202": {
                **json_body(
                    STARTED,
                    "Its reasoner waits for input (`input_required`): answer it at "
                    "`Location` + `/input`; it goes on. To a caller that may start but not "
                    "read: the id alone (`Accepted`), and it runs",
                ),
                "links": EXECUTION_LINKS,
            },
            "500": json_body(ref("Execution"), "The execution failed"),
            **START_ERRORS,
            "409": json_body(
                {"oneOf": [ref("Execution"), ref("Error")]}, "Cancelled, or session released"
            ),
            "503": json_body(
                {"oneOf": [ref("Execution"), ref("Error")]},
                "Cancelled by shutdown, or not accepting work",
            ),
        },
    }
    start = {
        "operationId": f"start_{reasoner.name}",
        "summary": f"Start {reasoner.name} in the background",
        "tags": tag,
        "parameters": [SESSION_HEADER, SESSION_POLICY_HEADER, IDEMPOTENCY_HEADER, DELAY_PARAMETER],
        "requestBody": body,
        "responses": {
            "202": {
                **json_body(STARTED, "Started, or queued (?delay=, --queue-when-full)"),
                "links": EXECUTION_LINKS,
            },
            **START_ERRORS,
        },
    }
    return {
        f"/reasoners/{reasoner.name}": {"post": run},
        f"/reasoners/{reasoner.name}/async": {"post": start},
    }


#: The paths of the actions `@agent.authorize` decides (docs/security.md#authorization).
GUARDED_PREFIXES = ("/reasoners/", "/executions", "/sessions/", "/schedules")


def _secure(document: dict[str, Any]) -> None:
    """Bearer auth on every operation but the probes and the scrape, which stay open."""
    document["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    document["security"] = [{"bearer": []}]
    for path, operations in document["paths"].items():
        for operation in operations.values():
            if path in OPEN_PATHS:
                operation["security"] = []
                continue
            operation["responses"]["401"] = error_response("Missing or wrong bearer token")
            if path.startswith(GUARDED_PREFIXES):  # the actions @agent.authorize is asked
                responses = operation["responses"]
                responses.setdefault("403", error_response("Not allowed (@agent.authorize)"))


def _webhooks(document: dict[str, Any]) -> None:
    """`X-Webhook-URL` on the start routes: documented only where webhooks are on (a
    server without a secret refuses it)."""
    for operations in document["paths"].values():
        post = operations.get("post", {})
        if post.get("operationId", "").startswith(("run_", "start_")):
            post["parameters"] = [*post["parameters"], WEBHOOK_HEADER]


def openapi_document(
    title: str,
    reasoners: Iterable[Reasoner],
    *,
    secured: bool = False,
    webhooks: bool = False,
    schedules: bool = False,
) -> dict[str, Any]:
    """The whole document; built per request, it is small and reasoners are few. With
    `schedules`, the `/schedules` routes (mounted when the server has a schedule ticker)."""
    reasoners = list(reasoners)
    components: dict[str, Any] = {**BASE_SCHEMAS, "Replica": REPLICA_SCHEMA}
    paths: dict[str, Any] = {
        "/reasoners": {
            "get": {
                "summary": "The registered reasoners and their schemas",
                "responses": {
                    "200": json_body({"type": "array", "items": ref("Reasoner")}, "Reasoners")
                },
            }
        },
    }
    for reasoner in reasoners:
        paths.update(_reasoner_paths(reasoner, components))
    paths.update(
        {
            "/executions": {
                "get": {
                    "summary": "List executions, newest first",
                    "parameters": [
                        {
                            "name": "status",
                            "in": "query",
                            "description": "Any of these (repeated, or a comma list)",
                            "style": "form",
                            "explode": True,
                            "schema": {
                                "type": "array",
                                "items": {"enum": [status.value for status in ExecutionStatus]},
                            },
                        },
                        {
                            "name": "reasoner",
                            "in": "query",
                            "schema": {"type": "string", "pattern": REASONER_NAME_PATTERN},
                        },
                        {"name": "session_id", "in": "query", "schema": SESSION_ID_SCHEMA},
                        {
                            "name": "schedule_id",
                            "in": "query",
                            "description": "Only the executions this schedule's firings started",
                            "schema": {"type": "string", "pattern": SCHEDULE_ID_PATTERN},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 1000},
                        },
                        {
                            "name": "cursor",
                            "in": "query",
                            "description": "Where the page before ended: from its Link header",
                            # A time as both stores write it, and an id (store/cursor.py).
                            "schema": {"type": "string", "pattern": CURSOR_PATTERN},
                        },
                    ],
                    "responses": {
                        "200": {
                            **json_body({"type": "array", "items": ref("Execution")}, "Executions"),
                            "headers": {
                                "Link": {
                                    "description": 'RFC 8288 `<...>; rel="next"` while older '
                                    "records may follow",
                                    "schema": {"type": "string"},
                                },
                                "X-Truncated": {
                                    "description": "`true` when the page was cut at 4 MiB",
                                    "schema": {"type": "string"},
                                },
                            },
                        },
                        "400": error_response(
                            "Invalid reasoner, session_id, schedule_id or cursor"
                        ),
                        "422": error_response("Invalid filter"),
                    },
                }
            },
            "/executions/{execution_id}": {
                "get": {
                    "summary": "One execution; ?wait=S long-polls up to S seconds (at most 60)",
                    "parameters": [
                        EXECUTION_ID,
                        {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0}},
                    ],
                    "responses": {
                        "200": json_body(ref("Execution"), "The execution"),
                        "404": error_response("Unknown execution"),
                        "422": error_response("Invalid wait"),
                    },
                },
                "delete": {
                    "summary": "Forget a finished execution",
                    "parameters": [EXECUTION_ID],
                    "responses": {
                        "204": {"description": "Forgotten"},
                        "404": error_response("Unknown execution"),
                        "409": error_response("Still running"),
                    },
                },
            },
            "/executions/{execution_id}/cancel": {
                "post": {
                    "summary": "Request cancellation",
                    "parameters": [EXECUTION_ID],
                    "responses": {
                        "200": json_body(ref("Execution"), "Already terminal"),
                        "202": json_body(ref("Execution"), "Cancellation requested"),
                        "404": error_response("Unknown execution"),
                    },
                }
            },
            "/executions/{execution_id}/history": {
                "get": {
                    "summary": "Its moves that neither made nor ended it (claims, hand-offs, "
                    "retries, requeues, parks, answers), oldest first, the last "
                    f"{KEPT_MOVES}: the attempts its record's start and end frame",
                    "parameters": [EXECUTION_ID],
                    "responses": {
                        "200": json_body(
                            {"type": "array", "items": ref("Move")}, "Its moves, oldest first"
                        ),
                        "404": error_response("Unknown execution"),
                    },
                }
            },
            "/executions/{execution_id}/input": {
                "get": {
                    "summary": "The input it was started with: the start's JSON body, null "
                    "for none (what a new start with the same input sends)",
                    "parameters": [EXECUTION_ID],
                    "responses": {
                        "200": json_body({}, "The start's body, as JSON"),
                        "404": error_response("Unknown execution"),
                    },
                },
                "post": {
                    "summary": "Answer the execution's pending request for input (ctx.ask): "
                    "one answer per request wins, on every replica",
                    "parameters": [EXECUTION_ID],
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "required": ["value"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "request_id": {
                                            "type": ["integer", "null"],
                                            "minimum": 1,
                                            "description": "the request answered; left out: "
                                            "the pending one (a client that may retry names "
                                            "it, so a retry is 409, never the next "
                                            "request's answer)",
                                        },
                                        "value": {
                                            "description": "the answer (JSON), validated "
                                            "against the request's schema"
                                        },
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "202": json_body(ref("Execution"), "Taken: the execution goes on"),
                        "400": error_response("Malformed JSON body"),
                        "404": error_response("Unknown execution"),
                        "409": error_response(
                            "It waits for no input, or that request was answered"
                        ),
                        "413": error_response(
                            "Body over the size limit, or an answer over --max-answer-bytes"
                        ),
                        "415": error_response("Body is not JSON"),
                        "422": error_response("Malformed body, or a value that fails the schema"),
                    },
                },
            },
            "/executions/{execution_id}/events": {
                "get": {
                    "summary": "Its events as Server-Sent Events: replay after Last-Event-ID "
                    "(or ?after=N), then live, heartbeats, and `event: end` with the execution",
                    "parameters": [
                        EXECUTION_ID,
                        {
                            "name": "Last-Event-ID",
                            "in": "header",
                            "required": False,
                            "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                        },
                        {
                            "name": "after",
                            "in": "query",
                            "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                        },
                    ],
                    "responses": {
                        "200": EVENT_STREAM,
                        "400": error_response("Invalid Last-Event-ID or after"),
                        "404": error_response("Unknown execution"),
                    },
                }
            },
            "/sessions/{session_id}": {
                "delete": {
                    "summary": "Release a session: cancel, settle within timeout, forget",
                    "parameters": [
                        {
                            "name": "session_id",
                            "in": "path",
                            "required": True,
                            "schema": SESSION_ID_SCHEMA,
                        },
                        {
                            "name": "timeout",
                            "in": "query",
                            "schema": {
                                "oneOf": [
                                    {"type": "number", "minimum": 0, "maximum": MAX_SECONDS},
                                    {"const": "none"},
                                ]
                            },
                        },
                        {
                            "name": "cancel_running",
                            "in": "query",
                            "schema": {"enum": ["true", "false", "1", "0"]},
                        },
                    ],
                    "responses": {
                        "200": json_body(ref("SessionRelease"), "Released"),
                        "400": error_response("Invalid session id"),
                        "409": error_response("Running work and cancel_running=false"),
                        "422": error_response("Invalid parameter"),
                    },
                }
            },
            "/healthz": {
                "get": {
                    "summary": "Liveness",
                    "responses": {"200": json_body(ref("Health"), "Alive")},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness: 503 from the first moment of shutdown",
                    "responses": {
                        "200": json_body(ref("Health"), "Ready"),
                        "503": json_body(ref("Health"), "Draining"),
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus text exposition",
                    "responses": {
                        "200": {
                            "description": "Metrics",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/replicas": {
                "get": {
                    "summary": "The live replicas: versions, draining, in flight (admin scope)",
                    "responses": {
                        "200": json_body({"type": "array", "items": ref("Replica")}, "Replicas"),
                        "403": error_response("Not the admin scope: the replicas span tenants"),
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {"200": json_body({"type": "object"}, "OpenAPI 3.1")},
                }
            },
        }
    )
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }
    operation_ids = dict(OPERATION_IDS)
    if schedules:
        paths.update(schedule_paths(reasoners, components))
        operation_ids.update(SCHEDULE_OPERATION_IDS)
    for (path, method), operation_id in operation_ids.items():
        paths[path][method]["operationId"] = operation_id
    if secured:
        _secure(document)
    if webhooks:
        _webhooks(document)
    return document
