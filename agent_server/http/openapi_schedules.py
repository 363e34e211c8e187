"""The `/schedules` routes of the OpenAPI document (docs/schedules.md), as
http/schedules.py answers them: a schedule's fields from `Schedule`'s declaration, a POST's
`input` from each reasoner's input schema."""

from __future__ import annotations

from typing import Any

from agent_server.http.openapi_parts import (
    EXECUTION_LINKS,
    REF_TEMPLATE,
    STARTED,
    error_response,
    hoist,
    json_body,
    operation,
    page_of,
    paging,
    ref,
)
from agent_server.model.names import SCHEDULE_ID_PATTERN
from agent_server.model.reasoner import Reasoner
from agent_server.model.schedules import field_schemas

SCHEDULE_ID = {
    "name": "schedule_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
}
#: A schedule a response carries is reachable at these operations (OpenAPI links). Not
#: PATCH: its `input` must bind the schedule's own reasoner, which a body drawn from the
#: document cannot know.
SCHEDULE_LINKS = {
    name: {"operationId": operation, "parameters": {"schedule_id": "$response.body#/schedule_id"}}
    for name, operation in [
        ("GetSchedule", "getSchedule"),
        ("TriggerSchedule", "triggerSchedule"),
        ("DeleteSchedule", "deleteSchedule"),
    ]
}
BODY_ERRORS: dict[str, Any] = {
    "400": error_response("Malformed JSON body"),
    "413": error_response("Body over the size limit"),
    "415": error_response("Body is not JSON"),
}
UNREACHABLE = error_response("The shared store is unreachable")
UNKNOWN = error_response("Unknown schedule (or another tenant's)")
DECLARED_ONLY = error_response("A declared schedule, changed by a caller other than an admin")
SCHEDULE = ref("Schedule")


def _schedule_schema() -> dict[str, Any]:
    """A schedule as the API shows it (`Entry.view`), its settings from `Schedule`."""
    time_or_null = {"oneOf": [{"type": "null"}, {"type": "string", "format": "date-time"}]}
    properties = {
        "schedule_id": {"type": "string"},
        "reasoner": {"type": "string"},
        **field_schemas(request=False),
        "declared": {"type": "boolean", "description": "declared on its reasoner"},
        "next_fire_at": time_or_null,
        "created_at": time_or_null,
        "owner": {
            "type": ["string", "null"],
            "description": "the identity that made it (null: declared, or no authentication)",
        },
        "tenant": {"type": ["string", "null"], "description": "the tenant it belongs to"},
    }
    return {"type": "object", "required": list(properties), "properties": properties}


def _schedule_bodies(reasoners: list[Reasoner], components: dict[str, Any]) -> dict[str, Any]:
    """What a POST and a PATCH take: a POST one object per reasoner (its `input` that
    reasoner's input schema), a PATCH all but `reasoner` (`input` binding the schedule's
    reasoner, else 422; a declared schedule's PATCH takes `enabled` only, else 422)."""
    fields = field_schemas(request=True)
    # Once in the document, however many bodies name it (its pattern lists every zone).
    zone = fields["timezone"]
    components["TimeZone"] = {k: v for k, v in zone.items() if k != "default"}
    fields["timezone"] = {**ref("TimeZone"), "default": zone["default"]}
    made = []
    for reasoner in reasoners:
        input_schema = hoist(reasoner.input_schema(REF_TEMPLATE), components)
        required = ["reasoner", "cron", *(["input"] if input_schema.get("required") else [])]
        made.append(
            {
                "type": "object",
                "additionalProperties": False,
                "required": required,
                "properties": {
                    "reasoner": {"const": reasoner.name},
                    **fields,
                    "input": {**input_schema, "default": {}},
                },
            }
        )
    create = (
        {"oneOf": made}
        if made
        else {"type": "object", "required": ["reasoner", "cron"], "properties": fields}
    )
    change = {"type": "object", "additionalProperties": False, "properties": fields}
    return {
        "create": {"required": True, "content": {"application/json": {"schema": create}}},
        "change": {"required": True, "content": {"application/json": {"schema": change}}},
    }


def schedule_paths(reasoners: list[Reasoner], components: dict[str, Any]) -> dict[str, Any]:
    """`/schedules` (docs/schedules.md), as http/schedules.py answers it."""
    components["Schedule"] = _schedule_schema()
    bodies = _schedule_bodies(reasoners, components)
    return {**_collection(bodies["create"]), **_one(bodies["change"]), **_trigger()}


def _collection(create: dict[str, Any]) -> dict[str, Any]:
    """A page of schedules, and a new one (`create`: its body)."""
    return {
        "/schedules": {
            "get": operation(
                "/schedules",
                "GET",
                parameters=[
                    *paging(SCHEDULE_ID_PATTERN),
                ],
                responses={
                    "200": page_of(SCHEDULE, "Schedules", "more schedules follow"),
                    "400": error_response("Invalid cursor"),
                    "422": error_response("Invalid limit"),
                    "503": UNREACHABLE,
                },
            ),
            "post": operation(
                "/schedules",
                "POST",
                requestBody=create,
                responses={
                    "201": {**json_body(SCHEDULE, "Made"), "links": SCHEDULE_LINKS},
                    **BODY_ERRORS,
                    "409": error_response("The tenant has --max-schedules schedules already"),
                    "413": error_response("Body, or its input, over the size limit"),
                    "422": error_response(
                        "A field refused (the detail begins with its name): a bad cron, "
                        "zone, reasoner, input, overlap, catchup_window, session_id, or a "
                        "field no schedule has"
                    ),
                    "503": UNREACHABLE,
                },
            ),
        },
    }


def _one(change: dict[str, Any]) -> dict[str, Any]:
    """One schedule: read, change (`change`: the body), delete."""
    return {
        "/schedules/{schedule_id}": {
            "get": operation(
                "/schedules/{schedule_id}",
                "GET",
                parameters=[SCHEDULE_ID],
                responses={
                    "200": json_body(SCHEDULE, "The schedule"),
                    "404": UNKNOWN,
                    "503": UNREACHABLE,
                },
            ),
            "patch": operation(
                "/schedules/{schedule_id}",
                "PATCH",
                parameters=[SCHEDULE_ID],
                requestBody=change,
                responses={
                    "200": json_body(SCHEDULE, "Changed"),
                    **BODY_ERRORS,
                    "413": error_response("Body, or its input, over the size limit"),
                    "403": DECLARED_ONLY,
                    "404": UNKNOWN,
                    "422": error_response(
                        "A field refused (the detail begins with its name), or a field "
                        "other than enabled for a declared schedule"
                    ),
                    "503": UNREACHABLE,
                },
            ),
            "delete": operation(
                "/schedules/{schedule_id}",
                "DELETE",
                parameters=[SCHEDULE_ID],
                responses={
                    "204": {"description": "Deleted"},
                    "403": DECLARED_ONLY,
                    "404": UNKNOWN,
                    "409": error_response("A declared schedule: PATCH enabled=false instead"),
                    "503": UNREACHABLE,
                },
            ),
        },
    }


def _trigger() -> dict[str, Any]:
    """A firing now."""
    return {
        "/schedules/{schedule_id}/trigger": {
            "post": operation(
                "/schedules/{schedule_id}/trigger",
                "POST",
                parameters=[SCHEDULE_ID],
                responses={
                    "202": {**json_body(STARTED, "Started"), "links": EXECUTION_LINKS},
                    "403": DECLARED_ONLY,
                    "404": UNKNOWN,
                    "409": error_response(
                        "The previous firing is still running (overlap skip or buffer_one): "
                        "the body also names its execution_id; or its session is being "
                        "released; or this moment's firing was started and forgotten"
                    ),
                    "422": error_response("Its input no longer binds the reasoner"),
                    "429": error_response("Too many executions in flight (Retry-After)"),
                    "503": error_response(
                        "Not started: shutting down, or the store is unreachable"
                    ),
                },
            )
        },
    }
