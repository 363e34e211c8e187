"""OpenAPI 3.1 description of the HTTP API, reasoner schemas included.

Each reasoner gets its own concrete paths so clients and fuzzers see its real input schema.
Pydantic's `$defs` are hoisted into `components/schemas`: in OpenAPI a `$ref` is resolved
against the document, not the embedded schema. The paths are written per group (here the
reasoners', `openapi_paths.py` the fixed ones, `openapi_schedules.py` the schedules'); the
route table (`route_table.py`) gives each operation its summary and operationId, and, with
authentication, its 401 and 403.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agent_server.http.auth import OPEN_PATHS
from agent_server.http.openapi_parts import (
    EVENT_STREAM,
    EXECUTION_LINKS,
    REF_TEMPLATE,
    SESSION_ID_SCHEMA,
    STARTED,
    error_response,
    hoist,
    json_body,
    ref,
)
from agent_server.http.openapi_paths import (
    execution_paths,
    reasoners_path,
    service_paths,
    session_paths,
)
from agent_server.http.openapi_schedules import schedule_paths
from agent_server.http.replicas import REPLICA_SCHEMA
from agent_server.http.route_table import (
    DOCUMENTED,
    PER_REASONER,
    Mount,
    RouteSpec,
    declared,
    mounted_specs,
)
from agent_server.model import record
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import MAX_DELAY_SECONDS, SessionPolicy
from agent_server.model.status import HOW

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


def _reasoner_paths(
    reasoner: Reasoner, components: dict[str, Any], *, webhooks: bool
) -> dict[str, Any]:
    """A reasoner's own run and start, its input and output schemas in them. With
    `webhooks`, their `X-Webhook-URL` (a server without a secret refuses it)."""
    input_schema = hoist(reasoner.input_schema(REF_TEMPLATE), components)
    body = {
        # No body is an empty object: only a reasoner with required fields needs one.
        "required": bool(input_schema.get("required")),
        "content": {"application/json": {"schema": input_schema}},
    }
    output = hoist(reasoner.output_schema(REF_TEMPLATE), components)
    parameters = [SESSION_HEADER, SESSION_POLICY_HEADER, IDEMPOTENCY_HEADER]
    webhook = [WEBHOOK_HEADER] if webhooks else []
    run, start = declared(PER_REASONER, "POST"), declared(PER_REASONER + "/async", "POST")
    name, tag = reasoner.name, [reasoner.name]
    return {
        f"/reasoners/{name}": {
            "post": {
                "operationId": _named(run.operation_id, name),
                "summary": reasoner.description or _named(run.summary, name),
                "tags": tag,
                "parameters": [*parameters, *webhook],
                "requestBody": body,
                "responses": _run_responses(output),
            }
        },
        f"/reasoners/{name}/async": {
            "post": {
                "operationId": _named(start.operation_id, name),
                "summary": _named(start.summary, name),
                "tags": tag,
                "parameters": [*parameters, DELAY_PARAMETER, *webhook],
                "requestBody": body,
                "responses": {
                    "202": {
                        **json_body(STARTED, "Started, or queued (?delay=, --queue-when-full)"),
                        "links": EXECUTION_LINKS,
                    },
                    **START_ERRORS,
                },
            }
        },
    }


def _named(template: str | None, name: str) -> str:
    """A reasoner's operationId or summary, from its route's declaration."""
    assert template is not None
    return template.replace("{name}", name)


def _run_responses(output: dict[str, Any]) -> dict[str, Any]:
    """What a synchronous run answers: the execution, its result of the reasoner's output
    schema."""
    succeeded = {"allOf": [ref("Execution"), {"properties": {"result": output}}]}
    return {
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
    }


def documented_paths(spec: RouteSpec, reasoners: list[Reasoner]) -> list[str]:
    """Where the document describes a declared route: a reasoner's, once per reasoner."""
    if spec.per_reasoner:
        return [spec.path.replace("{name}", reasoner.name) for reasoner in reasoners]
    return [spec.path]


def _bind(
    document: dict[str, Any], reasoners: list[Reasoner], mounts: frozenset[Mount], secured: bool
) -> None:
    """Each declared operation's operationId and, when `secured`, bearer auth: every
    operation but the probes' needs a token (401), and one that asks `@agent.authorize`
    an action may be refused it (403)."""
    if secured:
        scheme = {"type": "http", "scheme": "bearer"}
        document["components"]["securitySchemes"] = {"bearer": scheme}
        document["security"] = [{"bearer": []}]
    for spec in mounted_specs(mounts):
        for path in documented_paths(spec, reasoners):
            for op in spec.operations:
                if op.operation_id is None:  # not in the document
                    continue
                operation = document["paths"][path][op.method.lower()]
                operation.setdefault("operationId", op.operation_id)  # a reasoner's has its own
                if not secured:
                    continue
                if path in OPEN_PATHS:
                    operation["security"] = []
                    continue
                responses = operation["responses"]
                responses["401"] = error_response("Missing or wrong bearer token")
                if op.asks:
                    responses.setdefault("403", error_response("Not allowed (@agent.authorize)"))


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
    paths = reasoners_path()
    for reasoner in reasoners:
        paths.update(_reasoner_paths(reasoner, components, webhooks=webhooks))
    paths.update({**execution_paths(), **session_paths(), **service_paths()})
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }
    mounts: frozenset[Mount] = frozenset(DOCUMENTED if schedules else ("api",))
    if schedules:
        paths.update(schedule_paths(reasoners, components))
    _bind(document, reasoners, mounts, secured)
    return document
