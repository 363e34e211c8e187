"""The shutdown's metrics: prometheus_client objects registered on the agent's registry and
on a registry of their own, which the shutdown pushes to a Pushgateway at its end.

They move a few times per process, so they stay prometheus_client objects (the per-request
series are plain numbers, `metric_series.py`). The counters move as executions end during
the drain, so a scrape shows progress; the report's totals top them up at the end.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Enum, Gauge
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent_server.runtime.metric_series import (
    PREFIX,
    SHUTDOWN_OUTCOMES,
    SHUTDOWN_PHASES,
    TIMED_PHASES,
    AgentRegistry,
    ShutdownOutcome,
)


class ShutdownMetrics:
    """The shutdown metrics, on the agent's registry and on `registry`, which holds just
    them (the same objects) for the push."""

    def __init__(self) -> None:
        self._started_at: float | None = None
        self.registry = AgentRegistry(auto_describe=True)
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
        self.shutdown_phase_duration = Gauge(
            f"{PREFIX}_shutdown_phase_duration_seconds",
            "Seconds each phase of the shutdown took: unready, draining, cancelling (the "
            "cancellation and the settle), flushing (ends owed to the store), reporting (a line "
            "per end it could not write), then http (open "
            "responses after the listener closed); 0 until it ends.",
            ["phase"],
            registry=None,
        )
        self.shutdown_executions = Counter(
            f"{PREFIX}_shutdown_executions_total",
            "Executions that ended during the shutdown: finished before the drain deadline, "
            "cancelled at it and settled, handed off to another replica, or abandoned.",
            ["outcome"],
            registry=None,
        )
        for collector in self._collectors():
            self.registry.register(collector)
        #: Each outcome's child, looked up once: 90,000 ends in one loop turn of a drain
        #: each count one, and `labels` costs more than the count.
        self._outcome_counters: dict[str, Counter] = {
            outcome: self.shutdown_executions.labels(outcome) for outcome in SHUTDOWN_OUTCOMES
        }
        for phase in TIMED_PHASES:
            self.shutdown_phase_duration.labels(phase)
        self._phase = SHUTDOWN_PHASES[0]
        self.shutdown_phase.state(self._phase)
        self._counted: Tally[str] = Tally()

    def register(self, agent_registry: CollectorRegistry) -> None:
        """Expose them on the agent's registry too (after its own series, as scrapes show)."""
        for collector in self._collectors():
            agent_registry.register(collector)

    def _collectors(self) -> Iterable[Collector]:
        return (
            self.draining,
            self.shutdown_phase,
            self.shutdown_started,
            self.shutdown_duration,
            self.shutdown_phase_duration,
            self.shutdown_executions,
        )

    def began(self, wall_time: float, started: float | None = None) -> None:
        """`started` is the signal's monotonic time, from which scrapes read the elapsed drain."""
        self.draining.set(1)
        self.shutdown_started.set(wall_time)
        self._started_at = time.monotonic() if started is None else started

    def set_phase(self, phase: str) -> None:
        self._phase = phase
        self.shutdown_phase.state(phase)

    def phase_took(self, phase: str, seconds: float) -> None:
        self.shutdown_phase_duration.labels(phase).set(seconds)

    def ended(
        self,
        duration: float,
        outcomes: Iterable[tuple[str, int]],
        phase_seconds: dict[str, float] | None = None,
    ) -> None:
        """Make the shutdown counters agree with the report, then set the duration.

        The counters already moved as executions ended during the drain (so a scrape shows
        progress); the report's totals only top them up where they differ.
        """
        for outcome, count in outcomes:
            missing = count - self._counted[outcome]
            if missing > 0:
                self._count(outcome, missing)
        for phase, seconds in (phase_seconds or {}).items():
            self.phase_took(phase, seconds)
        self.shutdown_duration.set(duration)

    def execution_finished(self, outcome: str) -> None:
        """An execution ended `outcome` (by `Metrics.execution_finished`): counted as the
        shutdown report will count it, while a shutdown runs."""
        if self._phase != "serving":
            during_shutdown = self._outcome(outcome)
            if during_shutdown is not None:
                self._count(during_shutdown, 1)

    def _outcome(self, outcome: str) -> str | None:
        """How the shutdown report will count an execution that ends now, if it does."""
        if outcome == ShutdownOutcome.PARKED:  # it left this replica waiting for input
            return ShutdownOutcome.PARKED
        if self._phase in ("unready", "draining"):
            return ShutdownOutcome.FINISHED
        if self._phase == "cancelling":
            kept = (ShutdownOutcome.ABANDONED, ShutdownOutcome.HANDED_OFF)
            return ShutdownOutcome(outcome) if outcome in kept else ShutdownOutcome.CANCELLED
        return None

    def _count(self, outcome: str, count: int) -> None:
        self._counted[outcome] += count
        counter = self._outcome_counters.get(outcome)
        if counter is None:
            counter = self._outcome_counters[outcome] = self.shutdown_executions.labels(outcome)
        counter.inc(count)

    def elapsed(self) -> Metric:
        """Seconds since the first signal, as of this scrape: what a scrape can see of a
        shutdown in progress. `shutdown_duration_seconds` is set at the report, a moment
        before the listener closes, so scrapes almost never see it; the pushed copy has it.
        Not pushed: frozen in a Pushgateway it would read as a drain that never ends."""
        started = self._started_at
        elapsed = 0.0 if started is None else max(0.0, time.monotonic() - started)
        family = GaugeMetricFamily(
            f"{PREFIX}_shutdown_elapsed_seconds",
            "Seconds since the first shutdown signal, as of this scrape; 0 while serving.",
        )
        family.add_metric([], elapsed)
        return family
