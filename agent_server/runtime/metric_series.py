"""The series behind the metrics: plain numbers until scraped, and the registry that
exposes them without `*_created` samples.

A prometheus_client child takes a lock on every `inc()` and `observe()`, about a microsecond
each, several times per request; these are plain ints and floats, turned into metric
families only when scraped. No `*_created` series are exposed: in the text format Prometheus
scrapes they are plain gauges, one more series per counter and histogram child, and nothing
reads them (rate() and increase() detect counter resets on their own). The switch
prometheus_client offers (`disable_created_metrics`) is process-wide state, so each Agent's
registry drops them itself instead.
"""

from __future__ import annotations

import copy
import enum
from bisect import bisect_left
from collections.abc import Callable, Iterator
from itertools import accumulate

from prometheus_client import CollectorRegistry, utils
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from agent_server.model.status import ExecutionStatus
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


class ShutdownOutcome(enum.StrEnum):
    """How the shutdown report counts an execution that ended while it ran."""

    #: It ended on its own while the drain waited for it.
    FINISHED = "finished"
    #: The cancel phase cancelled it, and it settled.
    CANCELLED = "cancelled"
    #: Resumable on a shared store: its next attempt was queued for another replica.
    HANDED_OFF = "handed_off"
    #: It waits for input in the store, owned by nobody (any phase).
    PARKED = "parked"
    #: It did not settle by its deadline: recorded cancelled, its task left running.
    ABANDONED = "abandoned"


SHUTDOWN_OUTCOMES = tuple(ShutdownOutcome)
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
        yield counter(
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
        yield counter(
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


def counter(name: str, documentation: str, label: str, counts: dict[str, int]) -> Metric:
    """A counter family of one label, from its counts."""
    family = CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=[label])
    for value, count in counts.items():
        family.add_metric([value], count)
    return family
