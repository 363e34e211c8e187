"""The fixed paths of the OpenAPI document, as the handlers answer them: the reasoners'
list, executions (executions.py, inputs.py), sessions (sessions.py), probes, metrics,
replicas and the document itself (health.py, replicas.py). Each operation's summary is the
route table's (route_table.py), as are its operationId and what authentication adds."""

from __future__ import annotations

from typing import Any

from agent_server.http.openapi_parts import (
    EVENT_STREAM,
    EXECUTION_ID,
    SESSION_ID_SCHEMA,
    error_response,
    json_body,
    operation,
    page_of,
    paging,
    ref,
)
from agent_server.model.execution import MAX_SECONDS, ExecutionStatus
from agent_server.model.names import REASONER_NAME_PATTERN, SCHEDULE_ID_PATTERN
from agent_server.store.cursor import CURSOR_PATTERN


def reasoners_path() -> dict[str, Any]:
    """`/reasoners`: each reasoner's own paths follow it."""
    return {
        "/reasoners": {
            "get": operation(
                "/reasoners",
                "GET",
                responses={
                    "200": json_body({"type": "array", "items": ref("Reasoner")}, "Reasoners")
                },
            )
        },
    }


def execution_paths() -> dict[str, Any]:
    """`/executions` and one execution's paths, in the document's order."""
    return {**_listing(), **_execution(), **_input(), **_events()}


def _listing() -> dict[str, Any]:
    """`GET /executions`: a page of records, by filter."""
    return {
        "/executions": {
            "get": operation(
                "/executions",
                "GET",
                parameters=[
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
                    # A time as both stores write it, and an id (store/cursor.py).
                    *paging(CURSOR_PATTERN),
                ],
                responses={
                    "200": page_of(ref("Execution"), "Executions", "older records may follow"),
                    "400": error_response("Invalid reasoner, session_id, schedule_id or cursor"),
                    "422": error_response("Invalid filter"),
                },
            )
        },
    }


def _execution() -> dict[str, Any]:
    """One execution: read (long-poll), forget, cancel, its history."""
    return {
        "/executions/{execution_id}": {
            "get": operation(
                "/executions/{execution_id}",
                "GET",
                parameters=[
                    EXECUTION_ID,
                    {"name": "wait", "in": "query", "schema": {"type": "number", "minimum": 0}},
                ],
                responses={
                    "200": json_body(ref("Execution"), "The execution"),
                    "404": error_response("Unknown execution"),
                    "422": error_response("Invalid wait"),
                },
            ),
            "delete": operation(
                "/executions/{execution_id}",
                "DELETE",
                parameters=[EXECUTION_ID],
                responses={
                    "204": {"description": "Forgotten"},
                    "404": error_response("Unknown execution"),
                    "409": error_response("Still running"),
                },
            ),
        },
        "/executions/{execution_id}/cancel": {
            "post": operation(
                "/executions/{execution_id}/cancel",
                "POST",
                parameters=[EXECUTION_ID],
                responses={
                    "200": json_body(ref("Execution"), "Already terminal"),
                    "202": json_body(ref("Execution"), "Cancellation requested"),
                    "404": error_response("Unknown execution"),
                },
            )
        },
        "/executions/{execution_id}/history": {
            "get": operation(
                "/executions/{execution_id}/history",
                "GET",
                parameters=[EXECUTION_ID],
                responses={
                    "200": json_body(
                        {"type": "array", "items": ref("Move")}, "Its moves, oldest first"
                    ),
                    "404": error_response("Unknown execution"),
                },
            )
        },
    }


def _input() -> dict[str, Any]:
    """What it was started with, and the answer to its request for input."""
    return {
        "/executions/{execution_id}/input": {
            "get": operation(
                "/executions/{execution_id}/input",
                "GET",
                parameters=[EXECUTION_ID],
                responses={
                    "200": json_body({}, "The start's body, as JSON"),
                    "404": error_response("Unknown execution"),
                },
            ),
            "post": operation(
                "/executions/{execution_id}/input",
                "POST",
                parameters=[EXECUTION_ID],
                requestBody={
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
                responses={
                    "202": json_body(ref("Execution"), "Taken: the execution goes on"),
                    "400": error_response("Malformed JSON body"),
                    "404": error_response("Unknown execution"),
                    "409": error_response("It waits for no input, or that request was answered"),
                    "413": error_response(
                        "Body over the size limit, or an answer over --max-answer-bytes"
                    ),
                    "415": error_response("Body is not JSON"),
                    "422": error_response("Malformed body, or a value that fails the schema"),
                },
            ),
        },
    }


def _events() -> dict[str, Any]:
    """Its event stream."""
    return {
        "/executions/{execution_id}/events": {
            "get": operation(
                "/executions/{execution_id}/events",
                "GET",
                parameters=[
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
                responses={
                    "200": EVENT_STREAM,
                    "400": error_response("Invalid Last-Event-ID or after"),
                    "404": error_response("Unknown execution"),
                },
            )
        },
    }


def session_paths() -> dict[str, Any]:
    """A session's release."""
    return {
        "/sessions/{session_id}": {
            "delete": operation(
                "/sessions/{session_id}",
                "DELETE",
                parameters=[
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
                responses={
                    "200": json_body(ref("SessionRelease"), "Released"),
                    "400": error_response("Invalid session id"),
                    "409": error_response("Running work and cancel_running=false"),
                    "422": error_response("Invalid parameter"),
                },
            )
        },
    }


def service_paths() -> dict[str, Any]:
    """The probes, the scrape, the replicas and this document."""
    return {
        "/healthz": {
            "get": operation(
                "/healthz",
                "GET",
                responses={"200": json_body(ref("Health"), "Alive")},
            )
        },
        "/readyz": {
            "get": operation(
                "/readyz",
                "GET",
                responses={
                    "200": json_body(ref("Health"), "Ready"),
                    "503": json_body(ref("Health"), "Draining"),
                },
            )
        },
        "/metrics": {
            "get": operation(
                "/metrics",
                "GET",
                responses={
                    "200": {
                        "description": "Metrics",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            )
        },
        "/replicas": {
            "get": operation(
                "/replicas",
                "GET",
                responses={
                    "200": json_body({"type": "array", "items": ref("Replica")}, "Replicas"),
                    "403": error_response("Not the admin scope: the replicas span tenants"),
                },
            )
        },
        "/openapi.json": {
            "get": operation(
                "/openapi.json",
                "GET",
                responses={"200": json_body({"type": "object"}, "OpenAPI 3.1")},
            )
        },
    }
