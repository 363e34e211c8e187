"""Prometheus metrics, on a CollectorRegistry owned by one Agent.

Metrics observe; they never decide. Label values known up front (reasoner names, statuses,
reasons, outcomes, phases) are initialised to zero so dashboards and rate() see every
series from the first scrape. HTTP labels are route templates, never raw paths.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    generate_latest,
)

from agent_server.execution import Execution
from agent_server.registry import RejectReason

PREFIX = "agent_server"

#: Agent work runs from milliseconds to tens of minutes: 10 ms .. 30 min.
EXECUTION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
#: HTTP handling includes long-polls and sync runs, so the same range applies.
HTTP_BUCKETS = EXECUTION_BUCKETS

EXECUTION_OUTCOMES = ("succeeded", "failed", "cancelled", "abandoned")
SHUTDOWN_PHASES = ("serving", "unready", "draining", "cancelling", "stopped")
SHUTDOWN_OUTCOMES = ("finished", "cancelled", "abandoned")
SESSION_OUTCOMES = ("settled", "abandoned")


class Metrics:
    """Every metric of the agent, registered on its own CollectorRegistry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
            "HTTP requests answered.",
            ["method", "route", "status"],
            registry=r,
        )
        self.http_request_duration = Histogram(
            f"{PREFIX}_http_request_duration_seconds",
            "HTTP request handling time.",
            ["method", "route", "status"],
            buckets=HTTP_BUCKETS,
            registry=r,
        )
        self.draining = Gauge(
            f"{PREFIX}_draining", "1 from the first shutdown signal on.", registry=r
        )
        self.shutdown_phase = Enum(
            f"{PREFIX}_shutdown_phase",
            "Current phase of the shutdown sequence.",
            states=list(SHUTDOWN_PHASES),
            registry=r,
        )
        self.shutdown_started = Gauge(
            f"{PREFIX}_shutdown_started_timestamp_seconds",
            "Unix time of the first shutdown signal.",
            registry=r,
        )
        self.shutdown_duration = Gauge(
            f"{PREFIX}_shutdown_duration_seconds",
            "Seconds from the first signal to the end of the drain.",
            registry=r,
        )
        self.shutdown_executions = Counter(
            f"{PREFIX}_shutdown_executions_total",
            "Executions the shutdown saw end, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.session_releases = Counter(
            f"{PREFIX}_session_releases_total",
            "Session releases, by whether all work settled.",
            ["outcome"],
            registry=r,
        )
        for reason in RejectReason:
            self.requests_rejected.labels(reason.value)
        for outcome in SHUTDOWN_OUTCOMES:
            self.shutdown_executions.labels(outcome)
        for outcome in SESSION_OUTCOMES:
            self.session_releases.labels(outcome)
        self.shutdown_phase.state("serving")

    def add_reasoner(self, name: str) -> None:
        """Create the reasoner's series at zero, so they exist before its first execution."""
        self.executions_started.labels(name)
        self.executions_inflight.labels(name)
        for status in EXECUTION_OUTCOMES:
            self.executions_finished.labels(name, status)
            self.execution_duration.labels(name, status)

    # -- RegistryObserver ----------------------------------------------------------------------

    def execution_started(self, execution: Execution) -> None:
        self.executions_started.labels(execution.reasoner).inc()
        self.executions_inflight.labels(execution.reasoner).inc()

    def execution_finished(self, execution: Execution, outcome: str) -> None:
        self.executions_inflight.labels(execution.reasoner).dec()
        self.executions_finished.labels(execution.reasoner, outcome).inc()
        duration = execution.duration_seconds
        if duration is not None:
            self.execution_duration.labels(execution.reasoner, outcome).observe(duration)

    def execution_rejected(self, reason: RejectReason) -> None:
        self.requests_rejected.labels(reason.value).inc()

    def session_released(self, outcome: str) -> None:
        self.session_releases.labels(outcome).inc()

    # -- HTTP and shutdown -------------------------------------------------------------------

    def http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        code = str(status)
        self.http_requests.labels(method, route, code).inc()
        self.http_request_duration.labels(method, route, code).observe(seconds)

    def shutdown_began(self, wall_time: float) -> None:
        self.draining.set(1)
        self.shutdown_started.set(wall_time)

    def set_phase(self, phase: str) -> None:
        self.shutdown_phase.state(phase)

    def shutdown_ended(self, duration: float, outcomes: Iterable[tuple[str, int]]) -> None:
        for outcome, count in outcomes:
            if count:
                self.shutdown_executions.labels(outcome).inc(count)
        self.shutdown_duration.set(duration)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
