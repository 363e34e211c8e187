"""Prometheus metrics, on a CollectorRegistry owned by one Agent.

Metrics observe; they never decide. Label values known up front (reasoner names, statuses,
reasons, outcomes, phases) are initialised to zero so dashboards and rate() see every
series from the first scrape. HTTP labels are route templates, never raw paths.

No `*_created` series are exposed. In the text format Prometheus scrapes they are plain
gauges, one more series per counter and histogram child (a third of the output here), and
nothing reads them: rate() and increase() detect counter resets on their own. The switch
prometheus_client offers (`disable_created_metrics`) is process-wide state, so each Agent's
registry drops them itself instead.
"""

from __future__ import annotations

import copy
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TypeVar, cast

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from agent_server.execution import Execution
from agent_server.registry import RejectReason

M = TypeVar("M", bound=MetricWrapperBase)

PREFIX = "agent_server"

#: Agent work runs from milliseconds to tens of minutes: 10 ms .. 30 min.
EXECUTION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
#: Synchronous runs and long-polls last as long as agent work; probes, scrapes and status
#: reads answer in about a millisecond, so the HTTP histogram starts lower to tell them apart.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, *EXECUTION_BUCKETS)

EXECUTION_OUTCOMES = ("succeeded", "failed", "cancelled", "abandoned")
SHUTDOWN_PHASES = ("serving", "unready", "draining", "cancelling", "stopped")
SHUTDOWN_OUTCOMES = ("finished", "cancelled", "abandoned")
SESSION_OUTCOMES = ("settled", "abandoned")


class AgentRegistry(CollectorRegistry):
    """A CollectorRegistry that leaves out `*_created` samples (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if any(sample.name.endswith("_created") for sample in metric.samples):
                metric = copy.copy(metric)
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class Metrics:
    """Every metric of the agent, registered on its own CollectorRegistry.

    `shutdown_registry` holds only the shutdown metrics (the same objects), for the push to
    a Pushgateway at the end of the shutdown.
    """

    def __init__(self) -> None:
        self.registry = AgentRegistry(auto_describe=True)
        self._children: dict[tuple[int, tuple[str, ...]], MetricWrapperBase] = {}
        self.shutdown_registry = AgentRegistry(auto_describe=True)
        r = self.registry
        self.executions_started = Counter(
            f"{PREFIX}_executions_started_total", "Executions started.", ["reasoner"], registry=r
        )
        self.executions_finished = Counter(
            f"{PREFIX}_executions_finished_total",
            "Executions ended, by how they ended.",
            ["reasoner", "status"],
            registry=r,
        )
        self.executions_inflight = Gauge(
            f"{PREFIX}_executions_inflight", "Executions running now.", ["reasoner"], registry=r
        )
        self.execution_duration = Histogram(
            f"{PREFIX}_execution_duration_seconds",
            "Execution duration from start to its recorded end.",
            ["reasoner", "status"],
            buckets=EXECUTION_BUCKETS,
            registry=r,
        )
        self.requests_rejected = Counter(
            f"{PREFIX}_requests_rejected_total",
            "New work refused, by reason.",
            ["reason"],
            registry=r,
        )
        self.http_requests = Counter(
            f"{PREFIX}_http_requests_total",
            "HTTP requests answered, by route template.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_request_duration = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "HTTP request handling time, by route template.",
            ["method", "route", "status"],
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        self.session_releases = Counter(
            f"{PREFIX}_session_releases_total",
            "Session releases, by whether all their work settled.",
            ["outcome"],
            registry=r,
        )
        self.draining = Gauge(
            f"{PREFIX}_draining", "1 from the first shutdown signal on.", registry=None
        )
        self.shutdown_phase = Enum(
            f"{PREFIX}_shutdown_phase",
            "Current phase of the shutdown sequence.",
            states=list(SHUTDOWN_PHASES),
            registry=None,
        )
        self.shutdown_started = Gauge(
            f"{PREFIX}_shutdown_started_timestamp_seconds",
            "Unix time of the first shutdown signal; 0 while serving.",
            registry=None,
        )
        self.shutdown_duration = Gauge(
            f"{PREFIX}_shutdown_duration_seconds",
            "Seconds from the first signal to the shutdown report; 0 until then.",
            registry=None,
        )
        self.shutdown_executions = Counter(
            f"{PREFIX}_shutdown_executions_total",
            "Executions that ended during the shutdown: finished before the drain deadline, "
            "cancelled at it and settled, or abandoned.",
            ["outcome"],
            registry=None,
        )
        for collector in self._shutdown_collectors():
            self.registry.register(collector)
            self.shutdown_registry.register(collector)
        for reason in RejectReason:
            self.requests_rejected.labels(reason.value)
        for outcome in SHUTDOWN_OUTCOMES:
            self.shutdown_executions.labels(outcome)
        for outcome in SESSION_OUTCOMES:
            self.session_releases.labels(outcome)
        self._phase = SHUTDOWN_PHASES[0]
        self.shutdown_phase.state(self._phase)
        self._shutdown_counted: Tally[str] = Tally()

    def _shutdown_collectors(self) -> Iterable[Collector]:
        return (
            self.draining,
            self.shutdown_phase,
            self.shutdown_started,
            self.shutdown_duration,
            self.shutdown_executions,
        )

    def add_reasoner(self, name: str) -> None:
        """Create the reasoner's series at zero, so they exist before its first execution."""
        self.executions_started.labels(name)
        self.executions_inflight.labels(name)
        for status in EXECUTION_OUTCOMES:
            self.executions_finished.labels(name, status)
            self.execution_duration.labels(name, status)

    # -- RegistryObserver ----------------------------------------------------------------------

    def execution_started(self, execution: Execution) -> None:
        self._child(self.executions_started, execution.reasoner).inc()
        self._child(self.executions_inflight, execution.reasoner).inc()

    def execution_finished(self, execution: Execution, outcome: str) -> None:
        self._child(self.executions_inflight, execution.reasoner).dec()
        self._child(self.executions_finished, execution.reasoner, outcome).inc()
        duration = execution.duration_seconds
        if duration is not None:
            self._child(self.execution_duration, execution.reasoner, outcome).observe(duration)
        during_shutdown = self._shutdown_outcome(outcome)
        if during_shutdown is not None:
            self._count_shutdown(during_shutdown, 1)

    def execution_rejected(self, reason: RejectReason) -> None:
        self.requests_rejected.labels(reason.value).inc()

    def session_released(self, outcome: str) -> None:
        self.session_releases.labels(outcome).inc()

    # -- HTTP and shutdown -------------------------------------------------------------------

    def http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        code = str(status)
        self._child(self.http_requests, method, route, code).inc()
        self._child(self.http_request_duration, method, route, code).observe(seconds)

    def _child(self, metric: M, *labels: str) -> M:
        """`metric.labels(*labels)`, looked up once: `labels()` costs microseconds per call
        (validation and a lock), and it runs several times per request."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return cast(M, child)

    def shutdown_began(self, wall_time: float) -> None:
        self.draining.set(1)
        self.shutdown_started.set(wall_time)

    def set_phase(self, phase: str) -> None:
        self._phase = phase
        self.shutdown_phase.state(phase)

    def shutdown_ended(self, duration: float, outcomes: Iterable[tuple[str, int]]) -> None:
        """Make the shutdown counters agree with the report, then set the duration.

        The counters already moved as executions ended during the drain (so a scrape shows
        progress); the report's totals only top them up where they differ.
        """
        for outcome, count in outcomes:
            missing = count - self._shutdown_counted[outcome]
            if missing > 0:
                self._count_shutdown(outcome, missing)
        self.shutdown_duration.set(duration)

    def _shutdown_outcome(self, outcome: str) -> str | None:
        """How the shutdown report will count an execution that ends now, if it does."""
        if self._phase in ("unready", "draining"):
            return "finished"
        if self._phase == "cancelling":
            return "abandoned" if outcome == "abandoned" else "cancelled"
        return None

    def _count_shutdown(self, outcome: str, count: int) -> None:
        self._shutdown_counted[outcome] += count
        self._child(self.shutdown_executions, outcome).inc(count)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
