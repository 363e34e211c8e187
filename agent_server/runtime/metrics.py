"""Prometheus metrics, on a CollectorRegistry owned by one Agent.

Metrics observe; they never decide. Label values known up front (reasoner names, statuses,
reasons, outcomes, phases) are initialised to zero so dashboards and rate() see every
series from the first scrape. HTTP labels are route templates, never raw paths.

The series that move on every request (executions, HTTP, rejections, session releases) are
plain ints and floats in dicts keyed by label values, turned into metric families only when
scraped (`Metrics.collect`). A prometheus_client child takes a lock on every `inc()` and
`observe()`, about a microsecond each, several times per request. The shutdown metrics move
a few times per process and are pushed from the shutdown, so they stay prometheus_client
objects (and `shutdown_registry` holds just them).

No `*_created` series are exposed. In the text format Prometheus scrapes they are plain
gauges, one more series per counter and histogram child, and
nothing reads them: rate() and increase() detect counter resets on their own. The switch
prometheus_client offers (`disable_created_metrics`) is process-wide state, so each Agent's
registry drops them itself instead.
"""

from __future__ import annotations

import copy
import time
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    generate_latest,
    utils,
)
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent_server.model.execution import Execution
from agent_server.model.status import ExecutionStatus
from agent_server.runtime.registry import RejectReason
from agent_server.runtime.webhooks import OUTCOMES as WEBHOOK_OUTCOMES
from agent_server.store.base import WRITE_RETRY_REASONS

PREFIX = "agent_server"

#: Agent work runs from milliseconds to tens of minutes: 10 ms .. 30 min.
EXECUTION_BUCKETS = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0,
)  # fmt: skip
#: Synchronous runs and long-polls last as long as agent work; probes, scrapes and status
#: reads answer in about a millisecond, so the HTTP histogram starts lower to tell them apart.
HTTP_BUCKETS = (0.001, 0.0025, 0.005, *EXECUTION_BUCKETS)
#: A healthy loop turns within a millisecond or two; a stall is seconds: 1 ms .. 30 s.
LOOP_LAG_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip

_ENDS = (ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED, ExecutionStatus.CANCELLED)
EXECUTION_OUTCOMES = (*(status.value for status in _ENDS), "abandoned")
SHUTDOWN_PHASES = ("serving", "unready", "draining", "cancelling", "stopped")
SHUTDOWN_OUTCOMES = ("finished", "cancelled", "handed_off", "parked", "abandoned")
#: The phases whose duration is measured (`shutdown_phase_duration_seconds`), in order.
TIMED_PHASES = ("unready", "draining", "cancelling", "flushing", "reporting", "http")
SESSION_OUTCOMES = ("settled", "abandoned")
#: Why a failed attempt was retried (`execution_retries_total{reason}`).
RETRY_REASONS = ("timeout", "exception")

#: prometheus_client's own float formatting, so `le` reads as its Histogram writes it.
_go_float: Callable[[float], str] = utils.floatToGoString


def _le_labels(bounds: tuple[float, ...]) -> tuple[str, ...]:
    return (*(_go_float(b) for b in bounds), "+Inf")


EXECUTION_LE = _le_labels(EXECUTION_BUCKETS)
HTTP_LE = _le_labels(HTTP_BUCKETS)
LOOP_LAG_LE = _le_labels(LOOP_LAG_BUCKETS)


class AgentRegistry(CollectorRegistry):
    """A CollectorRegistry that leaves out `*_created` samples (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            if any(sample.name.endswith("_created") for sample in metric.samples):
                metric = copy.copy(metric)
                metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


class HistogramSeries:
    """One histogram series: a count per bucket (not cumulative, +Inf last) and the sum."""

    __slots__ = ("bounds", "counts", "les", "sum")

    def __init__(self, bounds: tuple[float, ...], les: tuple[str, ...]) -> None:
        self.bounds = bounds
        self.les = les
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Buckets are `le`: the first bound >= value, which is what bisect_left finds.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative, by `le` label: what HistogramMetricFamily takes."""
        return list(zip(self.les, accumulate(self.counts), strict=True))


class OutcomeSeries(HistogramSeries):
    """Executions of one reasoner that ended one way: how many, and how long they took."""

    __slots__ = ("finished",)

    def __init__(self) -> None:
        super().__init__(EXECUTION_BUCKETS, EXECUTION_LE)
        self.finished = 0


class Metrics:
    """Every metric of the agent, registered on its own CollectorRegistry.

    The per-request series live here as plain numbers and `collect()` exposes them; the
    CollectorRegistry calls it on every scrape. Recording and scraping both happen on the
    event loop thread (the in-flight registry's observer calls, the HTTP middleware, the
    /metrics handler), one at a time, so nothing takes a lock.

    `shutdown_registry` holds only the shutdown metrics (the same objects), for the push to
    a Pushgateway at the end of the shutdown.
    """

    def __init__(self) -> None:
        self._started: dict[str, int] = {}
        self._outcomes: dict[tuple[str, str], OutcomeSeries] = {}
        self._http: dict[tuple[str, str, int], HistogramSeries] = {}
        self._http_expected: dict[tuple[str, str, int], None] = {}
        self._shutdown_started_at: float | None = None
        self._rejected: dict[str, int] = {reason.value: 0 for reason in RejectReason}
        self._releases: dict[str, int] = dict.fromkeys(SESSION_OUTCOMES, 0)
        self._store = StoreSeries()
        self._emitted: dict[str, int] = {}
        #: Executions waiting in `ctx.ask` now, and how long answered or closed requests
        #: waited, by reasoner.
        self._waiting: dict[str, int] = {}
        self._input_waits: dict[str, HistogramSeries] = {}
        #: Executions queued (delayed, retrying, or waiting for room) that this replica
        #: queued less those it took or cancelled; the seconds each waited past its due time;
        #: retries by reason (docs/scheduling.md).
        self._queued: dict[str, int] = {}
        self._queue_waits: dict[str, HistogramSeries] = {}
        self._retries: dict[tuple[str, str], int] = {}
        self.streams_open = 0
        #: Webhook attempts by outcome, and the deliveries pending (agent_server.runtime.webhooks).
        self._webhooks: dict[str, int] = dict.fromkeys(WEBHOOK_OUTCOMES, 0)
        self._webhooks_pending = 0
        #: How late the loop-lag sampler woke (`agent_server.runtime.loop_lag`), each sample.
        self.loop_lag = HistogramSeries(LOOP_LAG_BUCKETS, LOOP_LAG_LE)
        self.registry = AgentRegistry(auto_describe=True)
        self.registry.register(self)
        self.shutdown_registry = AgentRegistry(auto_describe=True)
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
        for collector in self._shutdown_collectors():
            self.registry.register(collector)
            self.shutdown_registry.register(collector)
        for outcome in SHUTDOWN_OUTCOMES:
            self.shutdown_executions.labels(outcome)
        for phase in TIMED_PHASES:
            self.shutdown_phase_duration.labels(phase)
        self._phase = SHUTDOWN_PHASES[0]
        self.shutdown_phase.state(self._phase)
        self._shutdown_counted: Tally[str] = Tally()

    def _shutdown_collectors(self) -> Iterable[Collector]:
        return (
            self.draining,
            self.shutdown_phase,
            self.shutdown_started,
            self.shutdown_duration,
            self.shutdown_phase_duration,
            self.shutdown_executions,
        )

    def add_reasoner(self, name: str) -> None:
        """Create the reasoner's series at zero, so they exist before its first execution."""
        self._started.setdefault(name, 0)
        self._store.lost.setdefault(name, 0)
        self._emitted.setdefault(name, 0)
        self._waiting.setdefault(name, 0)
        if name not in self._input_waits:
            self._input_waits[name] = HistogramSeries(EXECUTION_BUCKETS, EXECUTION_LE)
        self._queued.setdefault(name, 0)
        if name not in self._queue_waits:
            self._queue_waits[name] = HistogramSeries(EXECUTION_BUCKETS, EXECUTION_LE)
        for reason in RETRY_REASONS:
            self._retries.setdefault((name, reason), 0)
        for status in EXECUTION_OUTCOMES:
            if (name, status) not in self._outcomes:
                self._outcomes[name, status] = OutcomeSeries()

    # -- RegistryObserver ----------------------------------------------------------------------

    def execution_started(self, execution: Execution) -> None:
        reasoner = execution.reasoner
        self._started[reasoner] = self._started.get(reasoner, 0) + 1

    def execution_finished(self, execution: Execution, outcome: str) -> None:
        key = (execution.reasoner, outcome)
        ended = self._outcomes.get(key)
        if ended is None:
            ended = self._outcomes[key] = OutcomeSeries()
        ended.finished += 1
        duration = execution.duration_seconds
        if duration is not None:
            ended.observe(duration)
        if self._phase != "serving":
            during_shutdown = self._shutdown_outcome(outcome)
            if during_shutdown is not None:
                self._count_shutdown(during_shutdown, 1)

    def execution_rejected(self, reason: RejectReason) -> None:
        self._rejected[reason.value] += 1

    def session_released(self, outcome: str) -> None:
        self._releases[outcome] = self._releases.get(outcome, 0) + 1

    def event_emitted(self, execution: Execution) -> None:
        reasoner = execution.reasoner
        self._emitted[reasoner] = self._emitted.get(reasoner, 0) + 1

    def execution_queued(self, execution: Execution, delta: int, waited: float | None) -> None:
        reasoner = execution.reasoner
        self._queued[reasoner] = self._queued.get(reasoner, 0) + delta
        if waited is not None:
            series = self._queue_waits.get(reasoner)
            if series is None:
                series = self._queue_waits[reasoner] = HistogramSeries(
                    EXECUTION_BUCKETS, EXECUTION_LE
                )
            series.observe(waited)

    def execution_retried(self, execution: Execution, reason: str) -> None:
        key = (execution.reasoner, reason)
        self._retries[key] = self._retries.get(key, 0) + 1

    def input_waiting(self, execution: Execution, asked: bool, seconds: float) -> None:
        """A request of `ctx.ask` began (asked) or ended after `seconds` of waiting
        (answered, timed out or cancelled)."""
        reasoner = execution.reasoner
        self._waiting[reasoner] = self._waiting.get(reasoner, 0) + (1 if asked else -1)
        if not asked:
            series = self._input_waits.get(reasoner)
            if series is None:
                series = self._input_waits[reasoner] = HistogramSeries(
                    EXECUTION_BUCKETS, EXECUTION_LE
                )
            series.observe(seconds)

    def stream_opened(self, change: int) -> None:
        """+1 when an event stream opens, -1 when it ends."""
        self.streams_open += change

    def webhook_delivery(self, outcome: str) -> None:
        self._webhooks[outcome] = self._webhooks.get(outcome, 0) + 1

    def webhooks_pending(self, count: int) -> None:
        self._webhooks_pending = count

    def loop_lagged(self, seconds: float) -> None:
        """One sample of the loop-lag sampler, on the loop's thread like every other."""
        self.loop_lag.observe(seconds)

    # -- StoreObserver -------------------------------------------------------------------------

    def store_operation(self, operation: str, seconds: float, ok: bool) -> None:
        self._store.operation(operation, seconds, ok)

    def store_up(self, up: bool) -> None:
        self._store.up = up

    def execution_lost(self, execution: Execution) -> None:
        """Counted by the replica that recorded the loss, which is seldom the owner: so not
        part of any replica's in-flight arithmetic."""
        lost = self._store.lost
        lost[execution.reasoner] = lost.get(execution.reasoner, 0) + 1

    def fenced_write(self, execution: Execution) -> None:
        self._store.fenced += 1

    def replicas_alive(self, count: int) -> None:
        self._store.replicas = count

    def write_retried(self, reason: str) -> None:
        retries = self._store.retries
        retries[reason] = retries.get(reason, 0) + 1

    # -- HTTP and shutdown -------------------------------------------------------------------

    def http_request(self, method: str, route: str, status: int, seconds: float) -> None:
        key = (method, route, status)
        series = self._http.get(key)
        if series is None:
            series = self._http[key] = HistogramSeries(HTTP_BUCKETS, HTTP_LE)
        series.observe(seconds)

    def expect_http(self, method: str, route: str, statuses: Iterable[int]) -> None:
        """Expose `http_requests_total` at 0 for answers a route can give before it gives them.

        A counter series that appears with its first count already in it is invisible to
        rate() and increase() until its second sample: a pod's first 503s during a drain, or
        all the POSTs of a short-lived pod, would add up to nothing. Only the counter starts
        at 0; the duration histogram (25 lines per series) still appears on first use.
        """
        for status in statuses:
            self._http_expected.setdefault((method, route, status))

    def shutdown_began(self, wall_time: float, started: float | None = None) -> None:
        """`started` is the signal's monotonic time, from which scrapes read the elapsed drain."""
        self.draining.set(1)
        self.shutdown_started.set(wall_time)
        self._shutdown_started_at = time.monotonic() if started is None else started

    def set_phase(self, phase: str) -> None:
        self._phase = phase
        self.shutdown_phase.state(phase)

    def shutdown_phase_took(self, phase: str, seconds: float) -> None:
        self.shutdown_phase_duration.labels(phase).set(seconds)

    def shutdown_ended(
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
            missing = count - self._shutdown_counted[outcome]
            if missing > 0:
                self._count_shutdown(outcome, missing)
        for phase, seconds in (phase_seconds or {}).items():
            self.shutdown_phase_took(phase, seconds)
        self.shutdown_duration.set(duration)

    def _shutdown_outcome(self, outcome: str) -> str | None:
        """How the shutdown report will count an execution that ends now, if it does."""
        if outcome == "parked":  # it left this replica waiting for input, in any phase
            return outcome
        if self._phase in ("unready", "draining"):
            return "finished"
        if self._phase == "cancelling":
            return outcome if outcome in ("abandoned", "handed_off") else "cancelled"
        return None

    def _count_shutdown(self, outcome: str, count: int) -> None:
        self._shutdown_counted[outcome] += count
        self.shutdown_executions.labels(outcome).inc(count)

    # -- exposition ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The per-request series as metric families, in the order the registry shows them."""
        yield from self._execution_families()
        yield _counter(
            "requests_rejected_total", "New work refused, by reason.", "reason", self._rejected
        )
        yield from self._http_families()
        yield _counter(
            "session_releases_total",
            "Session releases, by whether all their work settled.",
            "outcome",
            self._releases,
        )
        yield from self._store.families()
        yield _counter(
            "events_emitted_total", "Events emitted by reasoners.", "reasoner", self._emitted
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}_executions_waiting",
            "Executions whose reasoner waits for input (ctx.ask) on this replica now.",
            labels=["reasoner"],
        )
        for reasoner, count in self._waiting.items():
            waiting.add_metric([reasoner], count)
        yield waiting
        waits = HistogramMetricFamily(
            f"{PREFIX}_input_wait_seconds",
            "Seconds a request for input waited, from ctx.ask to its answer, timeout or "
            "cancellation.",
            labels=["reasoner"],
        )
        for reasoner, series in self._input_waits.items():
            waits.add_metric([reasoner], series.buckets(), series.sum)
        yield waits
        yield from self._queue_families()
        yield GaugeMetricFamily(
            f"{PREFIX}_event_streams_open",
            "Event streams (Server-Sent Events) open now.",
            value=self.streams_open,
        )
        yield _counter(
            "webhook_deliveries_total",
            "Webhook attempts, by outcome: delivered (2xx), retried, gave_up (a 4xx but 408 "
            "and 429, or retried for --webhook-retry-for), refused (a target not allowed).",
            "outcome",
            self._webhooks,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_webhooks_pending",
            "Webhook deliveries owed (with a shared store: by every replica, as last seen).",
            value=self._webhooks_pending,
        )
        lag = HistogramMetricFamily(
            f"{PREFIX}_event_loop_lag_seconds",
            "How late the event loop's lag sampler woke (it sleeps 0.25 s at a time): a "
            "loop blocked by code that does not await shows here.",
        )
        lag.add_metric([], self.loop_lag.buckets(), self.loop_lag.sum)
        yield lag
        yield self._shutdown_elapsed()

    def _queue_families(self) -> Iterator[Metric]:
        queued = GaugeMetricFamily(
            f"{PREFIX}_executions_queued",
            "Executions queued (a delayed start, a retry after its backoff, a start waiting "
            "for room): those this replica queued less those it took or cancelled; summed "
            "over replicas, the agent's queue.",
            labels=["reasoner"],
        )
        for reasoner, count in self._queued.items():
            queued.add_metric([reasoner], count)
        yield queued
        waits = HistogramMetricFamily(
            f"{PREFIX}_queue_wait_seconds",
            "Seconds a queued execution waited past its due time before a replica took it.",
            labels=["reasoner"],
        )
        for reasoner, series in self._queue_waits.items():
            waits.add_metric([reasoner], series.buckets(), series.sum)
        yield waits
        retries = CounterMetricFamily(
            f"{PREFIX}_execution_retries",
            "Failed attempts run again by their RetryPolicy, by reason (timeout: an "
            "ExecutionTimeout; exception: anything else it retries).",
            labels=["reasoner", "reason"],
        )
        for (reasoner, reason), count in self._retries.items():
            retries.add_metric([reasoner, reason], count)
        yield retries

    def _shutdown_elapsed(self) -> Metric:
        """Seconds since the first signal, as of this scrape: what a scrape can see of a
        shutdown in progress. `shutdown_duration_seconds` is set at the report, a moment
        before the listener closes, so scrapes almost never see it; the pushed copy has it.
        Not pushed: frozen in a Pushgateway it would read as a drain that never ends."""
        started = self._shutdown_started_at
        elapsed = 0.0 if started is None else max(0.0, time.monotonic() - started)
        family = GaugeMetricFamily(
            f"{PREFIX}_shutdown_elapsed_seconds",
            "Seconds since the first shutdown signal, as of this scrape; 0 while serving.",
        )
        family.add_metric([], elapsed)
        return family

    def _execution_families(self) -> tuple[Metric, Metric, Metric, Metric]:
        """`executions_inflight` is derived: every started execution is recorded finished
        exactly once (abandoned included), so started minus finished is what runs now."""
        running = dict(self._started)
        finished = CounterMetricFamily(
            f"{PREFIX}_executions_finished_total",
            "Executions ended, by how they ended.",
            labels=["reasoner", "status"],
        )
        duration = HistogramMetricFamily(
            f"{PREFIX}_execution_duration_seconds",
            "Execution duration from start to its recorded end.",
            labels=["reasoner", "status"],
        )
        for (reasoner, status), ended in self._outcomes.items():
            running[reasoner] = running.get(reasoner, 0) - ended.finished
            finished.add_metric([reasoner, status], ended.finished)
            duration.add_metric([reasoner, status], ended.buckets(), ended.sum)
        for reasoner, lost in self._store.lost.items():
            finished.add_metric([reasoner, ExecutionStatus.LOST.value], lost)
        started = _counter(
            "executions_started_total", "Executions started.", "reasoner", self._started
        )
        inflight = GaugeMetricFamily(
            f"{PREFIX}_executions_inflight", "Executions running now.", labels=["reasoner"]
        )
        for reasoner, count in running.items():
            inflight.add_metric([reasoner], count)
        return started, finished, inflight, duration

    def _http_families(self) -> tuple[Metric, Metric]:
        """`http_requests_total` is each duration series' count: both move on every request."""
        names = ["method", "route", "status"]
        requests = CounterMetricFamily(
            f"{PREFIX}_http_requests_total",
            "HTTP requests answered, by route template.",
            labels=names,
        )
        duration = HistogramMetricFamily(
            f"{PREFIX}_http_request_duration_seconds",
            "HTTP request handling time, by route template.",
            labels=names,
        )
        for (method, route, code), series in self._http.items():
            labels = [method, route, str(code)]
            requests.add_metric(labels, series.count)
            duration.add_metric(labels, series.buckets(), series.sum)
        for method, route, code in self._http_expected:
            if (method, route, code) not in self._http:
                requests.add_metric([method, route, str(code)], 0)
        return requests, duration

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class StoreSeries:
    """What the execution store did, as plain numbers until scraped."""

    def __init__(self) -> None:
        self.durations: dict[str, HistogramSeries] = {}
        self.errors: dict[str, int] = {}
        self.up = True
        self.fenced = 0
        self.replicas = 1
        self.lost: dict[str, int] = {}
        #: Outbox writes Redis refused for a transient reason, kept and retried, by reason.
        self.retries: dict[str, int] = dict.fromkeys(WRITE_RETRY_REASONS, 0)

    def operation(self, operation: str, seconds: float, ok: bool) -> None:
        series = self.durations.get(operation)
        if series is None:
            series = self.durations[operation] = HistogramSeries(HTTP_BUCKETS, HTTP_LE)
            self.errors.setdefault(operation, 0)
        series.observe(seconds)
        if not ok:
            self.errors[operation] += 1

    def families(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            f"{PREFIX}_store_operation_duration_seconds",
            "Execution store operations (round trips), by operation.",
            labels=["operation"],
        )
        for operation, series in self.durations.items():
            duration.add_metric([operation], series.buckets(), series.sum)
        yield duration
        yield _counter(
            "store_errors_total", "Store operations that failed.", "operation", self.errors
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_store_up", "1 while the execution store answers.", value=int(self.up)
        )
        yield CounterMetricFamily(
            f"{PREFIX}_store_fenced_writes",
            "Writes of an attempt (its end, hand-off or checkpoint) refused because this "
            "replica's attempt no longer owns the execution.",
            value=self.fenced,
        )
        yield _counter(
            "store_write_retries_total",
            "Outbox writes Redis refused for a transient reason, kept and retried.",
            "reason",
            self.retries,
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_replicas_alive",
            "Replicas whose liveness the store holds (1 with the memory store).",
            value=self.replicas,
        )


def _counter(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family
