"""The HTTP API: its routes, each group in a module of its own, bound to the parts they use.

Handlers are thin, translating between HTTP and the registry and the store, and know nothing
of signals: they start work through the registry (admission, draining), read records from
the store (whichever replica ran them), and read the phase. The groups: runs
(`runs.py`), recorded executions and their events (`executions.py`), input (`inputs.py`:
an answer, and what it was started with), sessions (`sessions.py`), probes, metrics and
the schema (`health.py`).
Every error is JSON `{"detail": ...}`; nothing a client sends yields a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.routing import Route

from agent_server.http.access import RequestAccess
from agent_server.http.console_page import ConsolePage
from agent_server.http.docs_page import DocsPage
from agent_server.http.executions import Executions
from agent_server.http.health import Health
from agent_server.http.inputs import Inputs
from agent_server.http.replicas import Replicas
from agent_server.http.routing import Endpoint, Handler
from agent_server.http.runs import Runs
from agent_server.http.schedules import Schedules
from agent_server.http.sessions import Sessions
from agent_server.http.sse import Streams
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.schedules import ScheduleTicker
from agent_server.runtime.sessions import SessionReleases
from agent_server.service.use_cases import UseCases
from agent_server.store.base import ExecutionStore

#: What each route answers in ordinary operation, overload and shutdown included: these
#: `http_requests_total` series start at 0 (see `Metrics.expect_http`); reads answer 503
#: while a shared store is unreachable. Rarer answers (401,
#: 405, 413, 415, 499, unmatched paths) appear on first use.
ROUTE_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("POST", "/reasoners/{name}"): (200, 400, 404, 409, 422, 429, 500, 503),
    ("POST", "/reasoners/{name}/async"): (202, 400, 404, 409, 422, 429, 503),
    ("GET", "/executions/{execution_id}"): (200, 404, 503),
    ("DELETE", "/executions/{execution_id}"): (204, 404, 409, 503),
    ("POST", "/executions/{execution_id}/cancel"): (200, 202, 404, 503),
    ("POST", "/executions/{execution_id}/input"): (202, 400, 404, 409, 422, 503),
    ("GET", "/executions/{execution_id}/input"): (200, 404, 503),
    ("GET", "/executions/{execution_id}/history"): (200, 404, 503),
    ("GET", "/executions/{execution_id}/events"): (200, 400, 404, 503),
    ("GET", "/reasoners"): (200,),
    ("GET", "/executions"): (200, 422, 503),
    ("DELETE", "/sessions/{session_id}"): (200, 409, 503),
    ("GET", "/schedules"): (200, 400, 503),
    ("POST", "/schedules"): (201, 400, 409, 422, 503),
    ("GET", "/schedules/{schedule_id}"): (200, 404, 503),
    ("PATCH", "/schedules/{schedule_id}"): (200, 400, 403, 404, 422, 503),
    ("DELETE", "/schedules/{schedule_id}"): (204, 403, 404, 409, 503),
    ("POST", "/schedules/{schedule_id}/trigger"): (202, 403, 404, 409, 503),
    ("GET", "/healthz"): (200,),
    ("GET", "/readyz"): (200, 503),
    ("GET", "/metrics"): (200,),
    ("GET", "/openapi.json"): (200,),
    ("GET", "/replicas"): (200, 403, 503),
    ("GET", "/docs"): (200,),
    ("GET", "/docs/{name}"): (200, 404),
    ("GET", "/console"): (200,),
    ("GET", "/console/{name}"): (200, 404),
}


class Api:
    """The routes of the HTTP API, given the parts they use."""

    def __init__(
        self,
        reasoners: dict[str, Reasoner],
        registry: InFlightRegistry,
        store: ExecutionStore,
        releases: SessionReleases,
        metrics: Metrics,
        use_cases: UseCases,
        *,
        phase: Callable[[], str],
        max_body_size: int,
        openapi: Callable[[], dict[str, Any]],
        sse_heartbeat: float = 15.0,
        docs: DocsPage | None = None,
        webhooks: bool = False,
        webhook_url: str | None = None,
        mcp: Handler | None = None,
        schedules: ScheduleTicker | None = None,
        console: ConsolePage | None = None,
        describe: Callable[[], dict[str, Any]] | None = None,
        schedule_limits: tuple[int, int] = (1000, 65_536),
    ) -> None:
        self.reasoners = reasoners
        self.registry = registry
        self.store = store
        self.releases = releases
        self.metrics = metrics
        self.phase = phase
        self.max_body_size = max_body_size
        #: `closing` is set when the listener closes at shutdown: open streams end with a retry.
        self.streams = Streams(sse_heartbeat, use_cases.waits.closing, metrics.stream_opened)
        self.docs = docs
        #: `/console` (docs/console.md), and how this replica describes itself there.
        self.console = console
        self.replicas = Replicas(describe or (lambda: {"replica_id": store.replica_id}), store)
        #: `/mcp`'s handler with `--mcp` (agent_server/http/mcp_server.py).
        self.mcp = mcp
        self.openapi_document = openapi
        #: Whether webhooks are on (a secret is set), and where they go by default.
        self.webhooks = webhooks
        self.webhook_url = webhook_url
        #: The use cases every front shares (agent_server/service/), and who reaches what:
        #: the tenant rule and `@agent.authorize` (access.py).
        self.use_cases = use_cases
        assert isinstance(use_cases.access, RequestAccess)
        self.access: RequestAccess = use_cases.access
        self.executions = Executions(use_cases, self.streams)
        self.runs = Runs(
            reasoners,
            use_cases,
            self.executions,
            max_body_size=max_body_size,
            webhooks=webhooks,
            webhook_url=webhook_url,
        )
        self.inputs = Inputs(store, use_cases.answering, self.executions, max_body_size)
        self.sessions = Sessions(releases, self.access)
        self.health = Health(registry, store, metrics, phase, openapi)
        #: `/schedules` (docs/schedules.md), given the ticker that fires them.
        self.schedules = (
            None
            if schedules is None
            else Schedules(
                schedules,
                reasoners,
                self.access,
                max_body_size,
                max_schedules=schedule_limits[0],
                max_input_size=schedule_limits[1],
            )
        )

    def routes(self) -> list[Route]:
        """The hot routes (runs and status reads) first: the router tries them in order."""
        table: list[tuple[str, Handler, list[str]]] = [
            ("/reasoners/{name}", self.runs.run_sync, ["POST"]),
            ("/reasoners/{name}/async", self.runs.run_async, ["POST"]),
            ("/executions/{execution_id}", self.executions.execution, ["GET", "DELETE"]),
            ("/executions/{execution_id}/cancel", self.executions.cancel_execution, ["POST"]),
            ("/executions/{execution_id}/events", self.executions.execution_events, ["GET"]),
            ("/executions/{execution_id}/input", self.inputs.input, ["GET", "POST"]),
            ("/executions/{execution_id}/history", self.executions.execution_history, ["GET"]),
            ("/reasoners", self.runs.list_reasoners, ["GET"]),
            ("/executions", self.executions.list_executions, ["GET"]),
            ("/sessions/{session_id}", self.sessions.release_session, ["DELETE"]),
            ("/healthz", self.health.healthz, ["GET"]),
            ("/readyz", self.health.readyz, ["GET"]),
            ("/metrics", self.health.scrape, ["GET"]),
            ("/openapi.json", self.health.openapi, ["GET"]),
            ("/replicas", self.replicas.list_replicas, ["GET"]),
        ]
        if self.schedules is not None:
            table += [
                ("/schedules", self.schedules.collection, ["GET", "POST"]),
                ("/schedules/{schedule_id}", self.schedules.schedule, ["GET", "PATCH", "DELETE"]),
                ("/schedules/{schedule_id}/trigger", self.schedules.trigger, ["POST"]),
            ]
        if self.mcp is not None:  # POST only: a stateless server has no stream to GET
            table.append(("/mcp", self.mcp, ["POST"]))
        if self.docs is not None:  # last: people, not programs, read it
            table += [(path, handler, ["GET"]) for path, handler in self.docs.routes()]
        if self.console is not None:
            table += [(path, handler, ["GET"]) for path, handler in self.console.routes()]
        routes = [
            Route(path, Endpoint(handler), methods=methods) for path, handler, methods in table
        ]
        # Any rest of the path is the session id, so an id with a '/' (sent as '%2F', which
        # uvicorn decodes) is refused as an id (400), not missed as a route (404). The
        # template keeps its plain name in metrics and the OpenAPI document.
        sessions = Route(
            "/sessions/{session_id:path}",
            Endpoint(self.sessions.release_session),
            methods=["DELETE"],
        )
        sessions.path = "/sessions/{session_id}"
        return [sessions if route.path == sessions.path else route for route in routes]
