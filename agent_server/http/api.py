"""The HTTP API: its routes (declared in `route_table.py`), each group in a module of its
own, bound to the parts they use.

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
from operator import attrgetter
from typing import Any

from starlette.routing import Route

from agent_server.http.access import RequestAccess
from agent_server.http.console_page import ConsolePage
from agent_server.http.docs_page import DocsPage
from agent_server.http.executions import Executions
from agent_server.http.health import Health
from agent_server.http.inputs import Inputs
from agent_server.http.replicas import Replicas
from agent_server.http.route_table import ROUTE_STATUSES, Mount, mounted_specs
from agent_server.http.routing import Endpoint, Handler
from agent_server.http.runs import Runs
from agent_server.http.schedules import Schedules
from agent_server.http.sessions import Sessions
from agent_server.http.sse import Streams
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.sessions import SessionReleases
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.service.use_cases import UseCases
from agent_server.store.base import ExecutionStore

#: `ROUTE_STATUSES`, what each route answers in ordinary operation, is the route table's.
__all__ = ["ROUTE_STATUSES", "Api"]


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

    def mounted(self) -> frozenset[Mount]:
        """The parts whose routes are served: the API's always, the others when given."""
        parts: dict[Mount, object] = {
            "schedules": self.schedules,
            "mcp": self.mcp,
            "docs": self.docs,
            "console": self.console,
        }
        return frozenset({"api", *(mount for mount, part in parts.items() if part is not None)})

    def routes(self) -> list[Route]:
        """The routes of `ROUTES` served here, in its order (the router tries them in order:
        the hot ones, runs and status reads, come first), each answered by the `Api`
        attribute it names."""
        routes = []
        for spec in mounted_specs(self.mounted()):
            handler: Handler = attrgetter(spec.handler)(self)
            route = Route(spec.pattern or spec.path, Endpoint(handler), methods=list(spec.methods))
            # The template keeps its plain name in metrics and the OpenAPI document.
            route.path = spec.path
            routes.append(route)
        return routes
