"""Prometheus metrics, on a CollectorRegistry owned by one Agent.

Metrics observe; they never decide. Label values known up front (reasoner names, statuses,
reasons, outcomes, phases) are initialised to zero so dashboards and rate() see every
series from the first scrape. HTTP labels are route templates, never raw paths.

The series that move on every request (executions, HTTP, rejections, session releases) are
plain ints and floats in dicts keyed by label values (`metric_series.py`), turned into
metric families only when scraped (`Metrics.collect`). The shutdown metrics move a few times
per process and are pushed from the shutdown: they are `shutdown_metrics.py`'s, with a
registry of their own (`Metrics.shutdown.registry`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client import generate_latest
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from agent_server.model.execution import Execution
from agent_server.model.schedules import FIRING_OUTCOMES
from agent_server.model.status import ExecutionStatus
from agent_server.model.versions import Rule
from agent_server.runtime.metric_series import (
    EXECUTION_BUCKETS,
    EXECUTION_LE,
    EXECUTION_OUTCOMES,
    HTTP_BUCKETS,
    HTTP_LE,
    LOOP_LAG_BUCKETS,
    LOOP_LAG_LE,
    PREFIX,
    RETRY_REASONS,
    SESSION_OUTCOMES,
    AgentRegistry,
    HistogramSeries,
    OutcomeSeries,
    StoreSeries,
    counter,
)
from agent_server.runtime.registry import RejectReason
from agent_server.runtime.shutdown_metrics import ShutdownMetrics
from agent_server.runtime.webhooks import OUTCOMES as WEBHOOK_OUTCOMES


class Metrics:
    """Every metric of the agent, registered on its own CollectorRegistry.

    The per-request series live here as plain numbers and `collect()` exposes them; the
    CollectorRegistry calls it on every scrape. Recording and scraping both happen on the
    event loop thread (the in-flight registry's observer calls, the HTTP middleware, the
    /metrics handler), one at a time, so nothing takes a lock.

    `shutdown` holds the shutdown metrics, with a registry of just them (the same objects)
    for the push to a Pushgateway at the end of the shutdown.
    """

    def __init__(self) -> None:
        self._started: dict[str, int] = {}
        self._outcomes: dict[tuple[str, str], OutcomeSeries] = {}
        self._http: dict[tuple[str, str, int], HistogramSeries] = {}
        self._http_expected: dict[tuple[str, str, int], None] = {}
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
        #: Schedule firings by outcome, and fire time to start (docs/schedules.md).
        self._firings: dict[str, int] = dict.fromkeys(FIRING_OUTCOMES, 0)
        self.schedule_lag = HistogramSeries(EXECUTION_BUCKETS, EXECUTION_LE)
        #: How claims met the version of a checkpoint (docs/durable.md, "Versions").
        self._version_rules: dict[str, int] = {
            rule.value: 0 for rule in Rule if rule is not Rule.NONE
        }
        #: How late the loop-lag sampler woke (`agent_server.runtime.loop_lag`), each sample.
        self.loop_lag = HistogramSeries(LOOP_LAG_BUCKETS, LOOP_LAG_LE)
        self.shutdown = ShutdownMetrics()
        self.registry = AgentRegistry(auto_describe=True)
        self.registry.register(self)
        self.shutdown.register(self.registry)

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
        self.shutdown.execution_finished(outcome)

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

    # -- HTTP ---------------------------------------------------------------------------------

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

    # -- exposition ----------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The per-request series as metric families, in the order the registry shows them."""
        yield from self._execution_families()
        yield counter(
            "requests_rejected_total", "New work refused, by reason.", "reason", self._rejected
        )
        yield from self._http_families()
        yield counter(
            "session_releases_total",
            "Session releases, by whether all their work settled.",
            "outcome",
            self._releases,
        )
        yield from self._store.families()
        yield counter(
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
        yield counter(
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
        yield from self._schedule_families()
        yield self.shutdown.elapsed()

    def schedule_fired(self, outcome: str, lag: float | None = None) -> None:
        """A firing's outcome (`FIRING_OUTCOMES`), and for one this replica started, its lag."""
        self._firings[outcome] += 1
        if lag is not None:
            self.schedule_lag.observe(max(0.0, lag))

    def version_rule(self, rule: Rule, count: int) -> None:
        """Claims that met a checkpoint's version by `rule` (WAIT: left it queued)."""
        self._version_rules[rule.value] += count

    def _schedule_families(self) -> Iterator[Metric]:
        yield counter(
            "version_rules_total",
            "Attempts claimed with a checkpoint, by how its version was met: same, "
            "compatible, migrate, migrate_failed, restart, fail; wait counts those left "
            "queued for a replica of the checkpoint's version.",
            "rule",
            self._version_rules,
        )
        yield counter(
            "schedule_firings_total",
            "Schedule firings, by outcome: started (by this replica), skipped (the previous "
            "still running), missed (older than the catch-up window), invalid (its input no "
            "longer binds the reasoner).",
            "outcome",
            self._firings,
        )
        lag = HistogramMetricFamily(
            f"{PREFIX}_schedule_lag_seconds",
            "Seconds from a firing's fire time to its execution's start, on this replica.",
        )
        lag.add_metric([], self.schedule_lag.buckets(), self.schedule_lag.sum)
        yield lag

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
        started = counter(
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
