"""Every route of the HTTP API, declared once.

A route is a `RouteSpec`: its path, the `Api` handler that answers it, and per method an
`Operation`: what it answers in ordinary operation (`statuses`, the `http_requests_total`
series metrics start at 0), what the OpenAPI document lists for it (`documented`: the 401 and
403 of authentication are added when the server authenticates), its operationId, the
`@agent.authorize` actions it asks (a denial of any is 403) and its summary. From this
table come the routes `Api.routes` mounts (in its order: the router tries them in order, so
the hot ones come first), `ROUTE_STATUSES`, the document's operation ids, summaries and
403s, and the methods CORS allows. A route of a part the server may go without (schedules,
MCP, the docs and console pages) names that part (`mount`): it is mounted, and documented,
only with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agent_server.model.status import KEPT_MOVES

#: What a route needs to be served: `api` always, the others with their part.
Mount = Literal["api", "schedules", "mcp", "docs", "console"]
#: The parts whose routes the OpenAPI document describes (the schedules' when mounted).
DOCUMENTED: tuple[Mount, ...] = ("api", "schedules")
#: A reasoner's routes: the document has each reasoner's own (`{name}` its name).
PER_REASONER = "/reasoners/{name}"
#: The order methods are listed in (CORS's `Access-Control-Allow-Methods`).
METHOD_ORDER = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


@dataclass(frozen=True)
class Operation:
    """One method of a route."""

    method: str
    #: What it answers in ordinary operation, overload and shutdown included: these
    #: `http_requests_total` series start at 0 (see `Metrics.expect_http`). Rarer answers
    #: (401, 405, 413, 415, 499, unmatched paths) appear on first use.
    statuses: tuple[int, ...]
    #: The statuses its OpenAPI operation lists, before authentication adds its own.
    documented: tuple[int, ...] = ()
    #: Its operationId (`{name}`: the reasoner's); None: not in the document.
    operation_id: str | None = None
    #: The `@agent.authorize` actions it asks (docs/security.md): a denial of any is 403.
    asks: tuple[str, ...] = ()
    summary: str = ""


@dataclass(frozen=True)
class RouteSpec:
    """One path: the `Api` attribute that answers it (dotted: `runs.run_sync`), and its
    methods."""

    path: str
    handler: str
    operations: tuple[Operation, ...]
    mount: Mount = "api"
    #: What the router matches when it is not `path` (which metrics and the document name).
    pattern: str | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(operation.method for operation in self.operations)

    @property
    def per_reasoner(self) -> bool:
        return self.path.startswith(PER_REASONER)


def route(
    path: str,
    handler: str,
    *operations: Operation,
    mount: Mount = "api",
    pattern: str | None = None,
) -> RouteSpec:
    return RouteSpec(path, handler, operations, mount, pattern)


def _page(statuses: tuple[int, ...], summary: str) -> Operation:
    """A page's GET: not in the document, asks nothing."""
    return Operation("GET", statuses, summary=summary)


_EXECUTION = "/executions/{execution_id}"
_SCHEDULE = "/schedules/{schedule_id}"

#: The routes, in the router's order: the hot ones (runs and status reads) first.
ROUTES: tuple[RouteSpec, ...] = (
    route(
        PER_REASONER,
        "runs.run_sync",
        Operation(
            "POST",
            statuses=(200, 400, 404, 409, 422, 429, 500, 503),
            documented=(200, 202, 400, 409, 413, 415, 422, 429, 500, 503),
            operation_id="run_{name}",
            asks=("start",),
            summary="Run {name} and wait",
        ),
    ),
    route(
        PER_REASONER + "/async",
        "runs.run_async",
        Operation(
            "POST",
            statuses=(202, 400, 404, 409, 422, 429, 503),
            documented=(202, 400, 409, 413, 415, 422, 429, 503),
            operation_id="start_{name}",
            asks=("start",),
            summary="Start {name} in the background",
        ),
    ),
    route(
        _EXECUTION,
        "executions.execution",
        Operation(
            "GET",
            statuses=(200, 404, 503),
            documented=(200, 404, 422),
            operation_id="getExecution",
            asks=("read",),
            summary="One execution; ?wait=S long-polls up to S seconds (at most 60)",
        ),
        Operation(
            "DELETE",
            statuses=(204, 404, 409, 503),
            documented=(204, 404, 409),
            operation_id="deleteExecution",
            asks=("delete",),
            summary="Forget a finished execution",
        ),
    ),
    route(
        _EXECUTION + "/cancel",
        "executions.cancel_execution",
        Operation(
            "POST",
            statuses=(200, 202, 404, 503),
            documented=(200, 202, 404),
            operation_id="cancelExecution",
            asks=("read", "cancel"),
            summary="Request cancellation",
        ),
    ),
    route(
        _EXECUTION + "/events",
        "executions.execution_events",
        Operation(
            "GET",
            statuses=(200, 400, 404, 503),
            documented=(200, 400, 404),
            operation_id="streamExecutionEvents",
            asks=("read",),
            summary="Its events as Server-Sent Events: replay after Last-Event-ID (or "
            "?after=N), then live, heartbeats, and `event: end` with the execution",
        ),
    ),
    route(
        _EXECUTION + "/input",
        "inputs.input",
        Operation(
            "GET",
            statuses=(200, 404, 503),
            documented=(200, 404),
            operation_id="getExecutionInput",
            asks=("read",),
            summary="The input it was started with: the start's JSON body, null for none "
            "(what a new start with the same input sends)",
        ),
        Operation(
            "POST",
            statuses=(202, 400, 404, 409, 422, 503),
            documented=(202, 400, 404, 409, 413, 415, 422),
            operation_id="answerInput",
            asks=("read", "answer"),
            summary="Answer the execution's pending request for input (ctx.ask): one answer per "
            "request wins, on every replica",
        ),
    ),
    route(
        _EXECUTION + "/history",
        "executions.execution_history",
        Operation(
            "GET",
            statuses=(200, 404, 503),
            documented=(200, 404),
            operation_id="getExecutionHistory",
            asks=("read",),
            summary="Its moves that neither made nor ended it (claims, hand-offs, retries, "
            "requeues, parks, answers), oldest first, the last "
            f"{KEPT_MOVES}: the attempts its record's start and end frame",
        ),
    ),
    route(
        "/reasoners",
        "runs.list_reasoners",
        Operation(
            "GET",
            statuses=(200,),
            documented=(200,),
            operation_id="listReasoners",
            summary="The registered reasoners and their schemas",
        ),
    ),
    route(
        "/executions",
        "executions.list_executions",
        Operation(
            "GET",
            statuses=(200, 422, 503),
            documented=(200, 400, 422),
            operation_id="listExecutions",
            asks=("list",),
            summary="List executions, newest first",
        ),
    ),
    # Any rest of the path is the session id, so an id with a '/' (sent as '%2F', which
    # uvicorn decodes) is refused as an id (400), not missed as a route (404).
    route(
        "/sessions/{session_id}",
        "sessions.release_session",
        Operation(
            "DELETE",
            statuses=(200, 409, 503),
            documented=(200, 400, 409, 422),
            operation_id="releaseSession",
            asks=("release",),
            summary="Release a session: cancel, settle within timeout, forget",
        ),
        pattern="/sessions/{session_id:path}",
    ),
    route(
        "/healthz",
        "health.healthz",
        Operation(
            "GET",
            statuses=(200,),
            documented=(200,),
            operation_id="healthz",
            summary="Liveness",
        ),
    ),
    route(
        "/readyz",
        "health.readyz",
        Operation(
            "GET",
            statuses=(200, 503),
            documented=(200, 503),
            operation_id="readyz",
            summary="Readiness: 503 from the first moment of shutdown",
        ),
    ),
    route(
        "/metrics",
        "health.scrape",
        Operation(
            "GET",
            statuses=(200,),
            documented=(200,),
            operation_id="metrics",
            summary="Prometheus text exposition",
        ),
    ),
    route(
        "/openapi.json",
        "health.openapi",
        Operation(
            "GET",
            statuses=(200,),
            documented=(200,),
            operation_id="openapi",
            summary="This document",
        ),
    ),
    route(
        "/replicas",
        "replicas.list_replicas",
        Operation(
            "GET",
            statuses=(200, 403, 503),
            documented=(200, 403),
            operation_id="listReplicas",
            summary="The live replicas: versions, draining, in flight (admin scope)",
        ),
    ),
    route(
        "/schedules",
        "schedules.collection",
        Operation(
            "GET",
            statuses=(200, 400, 503),
            documented=(200, 400, 422, 503),
            operation_id="listSchedules",
            asks=("schedule",),
            summary="A page of the schedules this caller sees, by id: declared ones and its "
            "tenant's",
        ),
        Operation(
            "POST",
            statuses=(201, 400, 409, 422, 503),
            documented=(201, 400, 409, 413, 415, 422, 503),
            operation_id="createSchedule",
            asks=("schedule", "start"),
            summary="Make a schedule: its reasoner's executions start at each fire time",
        ),
        mount="schedules",
    ),
    route(
        _SCHEDULE,
        "schedules.schedule",
        Operation(
            "GET",
            statuses=(200, 404, 503),
            documented=(200, 404, 503),
            operation_id="getSchedule",
            asks=("schedule",),
            summary="One schedule",
        ),
        Operation(
            "PATCH",
            statuses=(200, 400, 403, 404, 422, 503),
            documented=(200, 400, 403, 404, 413, 415, 422, 503),
            operation_id="changeSchedule",
            asks=("schedule", "start"),
            summary="Change a schedule (a declared one: only `enabled`)",
        ),
        Operation(
            "DELETE",
            statuses=(204, 403, 404, 409, 503),
            documented=(204, 403, 404, 409, 503),
            operation_id="deleteSchedule",
            asks=("schedule",),
            summary="Delete a schedule made at run time",
        ),
        mount="schedules",
    ),
    route(
        _SCHEDULE + "/trigger",
        "schedules.trigger",
        Operation(
            "POST",
            statuses=(202, 403, 404, 409, 503),
            documented=(202, 403, 404, 409, 422, 429, 503),
            operation_id="triggerSchedule",
            asks=("schedule", "start"),
            summary="Fire it now (whether enabled or not), obeying its overlap",
        ),
        mount="schedules",
    ),
    # POST only: a stateless server has no stream to GET. Its answers are JSON-RPC's, its
    # description the protocol's (docs/protocols.md): none start at 0, none are in the document.
    route(
        "/mcp",
        "mcp",
        Operation("POST", statuses=(), summary="MCP's JSON-RPC requests (streamable HTTP)"),
        mount="mcp",
    ),
    # Last: people, not programs, read them (docs/console.md).
    route("/docs", "docs.page", _page((200,), "The API's reference page"), mount="docs"),
    route("/docs/{name}", "docs.asset", _page((200, 404), "Its assets"), mount="docs"),
    route("/console", "console.page", _page((200,), "The console"), mount="console"),
    route("/console/{name}", "console.asset", _page((200, 404), "Its assets"), mount="console"),
)

#: What each route answers in ordinary operation (`Operation.statuses`), by method and
#: path: `build_app` starts these series at 0, for every part (mounted or not).
ROUTE_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    (operation.method, spec.path): operation.statuses
    for spec in ROUTES
    for operation in spec.operations
    if operation.statuses
}

#: operationId of every fixed route of the document, by path and (lower case) method;
#: a reasoner's are `run_{name}` and `start_{name}`.
OPERATION_IDS: dict[tuple[str, str], str] = {
    (spec.path, operation.method.lower()): operation.operation_id
    for spec in ROUTES
    for operation in spec.operations
    if operation.operation_id is not None and not spec.per_reasoner
}

#: Every method a route answers, in `METHOD_ORDER` (what CORS allows a page to send).
METHODS: tuple[str, ...] = tuple(
    method for method in METHOD_ORDER if any(method in spec.methods for spec in ROUTES)
)


def declared(path: str, method: str) -> Operation:
    """The declaration of a route's method (KeyError when there is none)."""
    for spec in ROUTES:
        if spec.path == path:
            for operation in spec.operations:
                if operation.method == method.upper():
                    return operation
    raise KeyError((method, path))


def mounted_specs(mounts: frozenset[str]) -> list[RouteSpec]:
    """The routes served with these parts, in the router's order."""
    return [spec for spec in ROUTES if spec.mount in mounts]
