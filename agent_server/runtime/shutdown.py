"""The shutdown sequence: plan (one budget), phases on one clock, report.

Phases are consecutive from the first signal at t0: admission closes at t0 + unready; the
rest is cancelled at that + drain; what has not settled is abandoned at that + cancel. Each
wait is bounded by a deadline computed here once; remaining time is recomputed from it.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_server.model.counts import counted
from agent_server.model.execution import CancelReason, Execution
from agent_server.runtime.exits import ExitCode
from agent_server.runtime.metric_series import ShutdownOutcome
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry, RejectReason
from agent_server.runtime.settings import SHUTDOWN_MARGIN, Settings

logger = logging.getLogger("agent_server.shutdown")

#: Kept free before the watchdog deadline for what follows the planned phases: uvicorn's
#: lifespan shutdown and the interpreter's exit.
EXIT_RESERVE = 0.25
#: Ends owed to the store get at least this long at shutdown (within the watchdog's bound).
FLUSH_AT_LEAST = 0.5


class Phase(enum.StrEnum):
    SERVING = "serving"
    UNREADY = "unready"
    DRAINING = "draining"
    CANCELLING = "cancelling"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ShutdownPlan:
    """The budget: unready + drain + cancel + http + margin <= grace (checked by Settings)."""

    unready_delay: float
    drain_timeout: float
    cancel_timeout: float
    http_timeout: float
    grace_period: float
    margin: float = SHUTDOWN_MARGIN

    @classmethod
    def from_settings(cls, settings: Settings) -> ShutdownPlan:
        return cls(
            unready_delay=settings.unready_delay,
            drain_timeout=settings.effective_drain_timeout,
            cancel_timeout=settings.cancel_timeout,
            http_timeout=settings.http_timeout,
            grace_period=settings.grace_period,
        )

    @property
    def watchdog_after(self) -> float:
        """Seconds after the first signal at which the process must end, whatever happens."""
        return max(0.0, self.grace_period - self.margin)

    def hard_end(self, started: float) -> float:
        """The monotonic time the watchdog fires for a shutdown that began at `started`."""
        return started + self.watchdog_after

    def flush_deadline(self, started: float, now: float) -> float:
        """Ends still owed to the store get what the budget leaves before the http phase:
        at least a moment, never past the watchdog."""
        latest = self.hard_end(started) - self.http_timeout - EXIT_RESERVE
        return min(max(latest, now + FLUSH_AT_LEAST), self.hard_end(started) - EXIT_RESERVE)

    def lines_deadline(self, started: float) -> float:
        """The lines naming the ends not written stop here: what follows the report (the
        listener's close, open responses, the exit) keeps half the http phase, at least
        FLUSH_AT_LEAST, and the exit reserve before the watchdog."""
        return self.hard_end(started) - EXIT_RESERVE - max(self.http_timeout / 2, FLUSH_AT_LEAST)

    def leftovers_deadline(self, started: float | None, now: float) -> float:
        """What the process's leftovers get after the shutdown: the cancel timeout, and
        never past the exit reserve before the watchdog."""
        deadline = now + self.cancel_timeout
        if started is not None:
            deadline = min(deadline, self.hard_end(started) - EXIT_RESERVE)
        return deadline

    def lifespan_exit_deadline(self, started: float | None, now: float) -> float:
        """The user's lifespan (`Agent(lifespan=...)`) exits, closing its clients, within the
        cancel timeout, in the exit reserve at the latest: it is part of uvicorn's lifespan
        shutdown, which the reserve is kept for, and half of it stays for the interpreter."""
        deadline = now + self.cancel_timeout
        if started is not None:
            deadline = min(deadline, self.hard_end(started) - EXIT_RESERVE / 2)
        return deadline

    def http_deadline(self, started: float, listener_closed: float) -> float:
        """Open responses get `http_timeout` after the listener closes, and never so long
        that the process could not end before the watchdog: with the whole budget used
        (drain derived from the grace period), the phases end exactly at the watchdog's
        deadline, and the exit needs a moment of its own."""
        return min(listener_closed + self.http_timeout, self.hard_end(started) - EXIT_RESERVE)


@dataclass
class ShutdownReport:
    """What the shutdown did; logged once as one structured line."""

    signal: str | None
    #: When each phase began, in seconds after the first signal.
    phases: dict[str, float] = field(default_factory=dict)
    #: How long each phase took up to the report: unready, draining, cancelling (the
    #: cancellation and the settle), flushing (ends still owed to the store, then webhook
    #: deliveries owed), reporting (a log line for each end that could not be written).
    phase_seconds: dict[str, float] = field(default_factory=dict)
    finished: int = 0
    cancelled: int = 0
    #: Resumable executions queued for another replica at the drain deadline.
    handed_off: int = 0
    #: Executions that began waiting for input during the shutdown and were parked in the
    #: shared store (their tasks ended; an answer resumes them on another replica).
    parked: int = 0
    #: Queued executions (delayed, retrying, waiting for room) that the memory store still
    #: held when admission closed: nobody else can take them, so they ended cancelled.
    queued_cancelled: int = 0
    abandoned: int = 0
    #: Abandoned earlier (by a session release) and still running: the exit ends them too.
    abandoned_earlier: int = 0
    rejected: int = 0
    #: Ends that could not be written to the shared store (each logged as a JSON line).
    unrecorded: int = 0
    #: Webhook deliveries still owed by this process when it stopped (memory store: lost;
    #: a shared store keeps them for the other replicas, so 0).
    webhooks_undelivered: int = 0
    duration_seconds: float = 0.0
    exit_code: int = ExitCode.OK
    plan: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Writes the ends still waiting for the store by a deadline; returns those it could not.
FlushEnds = Callable[[float], Awaitable[list[Execution]]]


async def _nothing_to_flush(deadline: float) -> list[Execution]:
    return []


#: Delivers the webhooks still owed by a deadline; returns how many are left undelivered.
FlushWebhooks = Callable[[float], Awaitable[int]]


async def _no_webhooks(deadline: float) -> int:
    return 0


async def _no_spans(deadline: float) -> None:
    return None


class ShutdownSequence:
    """Runs the phases against the registry; reports and sets the final metrics.

    `limit_releases` bounds session releases under way by the shutdown's settle deadline;
    `flush_ends` writes what the store still owes before the report; `end_streams` ends
    open event streams when the listener closes (the runner calls it then);
    `flush_spans` exports the spans ended so far (traces on), in the flushing phase after
    the ends, by the same kind of deadline.
    """

    def __init__(
        self,
        registry: InFlightRegistry,
        metrics: Metrics,
        set_phase: Callable[[Phase], None],
        plan: ShutdownPlan,
        *,
        limit_releases: Callable[[float], None] | None = None,
        flush_ends: FlushEnds = _nothing_to_flush,
        end_streams: Callable[[], None] | None = None,
        flush_webhooks: FlushWebhooks | None = None,
        cancel_queued: Callable[[], int] | None = None,
        flush_spans: Callable[[float], Awaitable[None]] = _no_spans,
        writes_owed: Callable[[], int] = lambda: 0,
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self._set_phase = set_phase
        #: The phase it is in, read by the watchdog's thread too (`account`).
        self.phase = Phase.SERVING
        self.plan = plan
        self.limit_releases = limit_releases
        self.flush_ends = flush_ends
        self.flush_webhooks = _no_webhooks if flush_webhooks is None else flush_webhooks
        self.flush_spans = flush_spans
        #: Writes this process owes the store (ends, hand-offs, events): a count any thread
        #: may read.
        self.writes_owed = writes_owed
        #: Ends open event streams (with a retry hint) as the listener closes.
        self.end_streams = end_streams
        #: Ends what a store in this process still queues, once admission closes (queued
        #: work belongs to no replica: the drain never waits for it); returns how many.
        self.cancel_queued = cancel_queued
        #: True when `agent-server run` drives the sequence from signals; otherwise the
        #: lifespan shutdown of plain uvicorn runs it.
        self.driven_by_signals = False
        self.started: float | None = None
        #: When the phase it is in ends (monotonic), planned: None while serving.
        self.phase_ends: float | None = None
        self.report: ShutdownReport | None = None
        self._signal: str | None = None
        self._skip = asyncio.Event()
        self._ended_before = 0
        self._parked_before = 0
        self._rejected_before = 0
        self._after_report: dict[str, float] = {}

    def begin(self, started: float, wall_time: float, signal_name: str | None) -> None:
        """The first instant of shutdown: unready, `ctx.draining` true, metrics say so."""
        if self.started is not None:
            return
        self.started = started
        self._signal = signal_name
        self._ended_before = self.registry.stats.ended
        self._parked_before = self.registry.stats.outcomes[ShutdownOutcome.PARKED]
        self._rejected_before = self.registry.stats.rejected[RejectReason.DRAINING.value]
        self.registry.begin_drain()
        self.metrics.shutdown.began(wall_time, started)
        self.phase_ends = started + self.plan.unready_delay
        self._enter(Phase.UNREADY)
        logger.info(
            "shutdown began (%s): %s in flight; admission closes in %gs, "
            "cancellation at +%gs, abandonment at +%gs",
            signal_name or "lifespan",
            counted(self.registry.inflight, "execution"),
            self.plan.unready_delay,
            self.plan.unready_delay + self.plan.drain_timeout,
            self.plan.unready_delay + self.plan.drain_timeout + self.plan.cancel_timeout,
        )

    def _enter(self, phase: Phase) -> None:
        self.phase = phase
        self._set_phase(phase)

    def account(self) -> str:
        """Where the shutdown stands, for the watchdog's line when the report will not come
        (a loop turn longer than the grace period): its phase, what still runs here, and
        what the store is still owed. Plain reads of counts, safe from another thread."""
        if self.phase is Phase.SERVING:  # `begin` never ran
            where = "the shutdown never began (the event loop did not turn after the signal)"
        else:
            where = f"in phase {self.phase.value}"
        owed = self.writes_owed()
        left = [counted(self.registry.inflight, "execution") + " still running here"]
        if owed:
            left.append(counted(owed, "write") + " not yet recorded in the store")
        return f"{where}; " + ", ".join(left)

    def skip_to_cancel(self) -> None:
        """A second signal: stop waiting, cancel now (after the report there is nothing left)."""
        if self.report is not None:
            return
        logger.warning("second signal: cancelling running work now")
        self._skip.set()

    async def run(self, *, skip_unready: bool = False) -> ShutdownReport:
        """Steps 2 to 7 of docs/shutdown.md. `begin` must have been called."""
        assert self.started is not None, "begin() first"
        t0 = self.started
        phases: dict[str, float] = {"unready": 0.0}

        took: dict[str, float] = {}
        admission_at = t0 + (0.0 if skip_unready else self.plan.unready_delay)
        await self._until(admission_at)
        self.registry.close_admission()
        queued_cancelled = 0 if self.cancel_queued is None else self.cancel_queued()
        self.phase_ends = admission_at + self.plan.drain_timeout
        self._enter(Phase.DRAINING)
        phases["draining"] = time.monotonic() - t0
        took["unready"] = phases["draining"]

        cancel_at = admission_at + self.plan.drain_timeout
        if not self._skip.is_set():
            await self.registry.wait_idle(cancel_at, interrupt=self._skip)
        cancel_at = min(cancel_at, time.monotonic())
        parked_draining = self.registry.stats.outcomes[ShutdownOutcome.PARKED] - self._parked_before
        finished = self.registry.stats.ended - self._ended_before - parked_draining

        self.phase_ends = cancel_at + self.plan.cancel_timeout
        self._enter(Phase.CANCELLING)
        phases["cancelling"] = time.monotonic() - t0
        took["draining"] = phases["cancelling"] - phases["draining"]
        handed_before = self.registry.stats.outcomes[ShutdownOutcome.HANDED_OFF]
        tasks = self.registry.cancel_all(CancelReason.SHUTDOWN)
        if tasks:
            logger.info("drain deadline: cancelling %s", counted(len(tasks), "execution"))
        settle_at = cancel_at + self.plan.cancel_timeout
        if self.limit_releases is not None:
            self.limit_releases(settle_at)
        abandoned = await self.registry.settle(tasks, settle_at)
        handed_off = self.registry.stats.outcomes[ShutdownOutcome.HANDED_OFF] - handed_before
        parked = self.registry.stats.outcomes[ShutdownOutcome.PARKED] - self._parked_before
        flushing = time.monotonic()
        took["cancelling"] = flushing - t0 - phases["cancelling"]
        unrecorded, undelivered = await self._flush(t0)
        reporting = time.monotonic()
        took["flushing"] = reporting - flushing
        name_unrecorded(unrecorded, self.plan.lines_deadline(t0))

        duration = time.monotonic() - t0
        took["reporting"] = time.monotonic() - reporting  # a line per unrecorded end, if any
        phases["stopped"] = duration
        abandoned_earlier = max(
            0, self.registry.abandoned_pending - len(abandoned) - self.registry.stale_pending
        )
        report = ShutdownReport(
            signal=self._signal,
            phases={name: round(seconds, 4) for name, seconds in phases.items()},
            phase_seconds={name: round(seconds, 4) for name, seconds in took.items()},
            finished=finished,
            cancelled=len(tasks) - len(abandoned) - handed_off - (parked - parked_draining),
            handed_off=handed_off,
            parked=parked,
            queued_cancelled=queued_cancelled,
            abandoned=len(abandoned),
            abandoned_earlier=abandoned_earlier,
            rejected=self.registry.stats.rejected[RejectReason.DRAINING.value]
            - self._rejected_before,
            duration_seconds=round(duration, 4),
            unrecorded=len(unrecorded),
            webhooks_undelivered=undelivered,
            exit_code=_exit_code(bool(unrecorded), bool(abandoned or abandoned_earlier)),
            plan=asdict(self.plan),
        )
        self._stopped(report, duration, took, self.plan.hard_end(t0))
        return report

    async def _flush(self, t0: float) -> tuple[list[Execution], int]:
        """Step 6: the ends owed to the store, then the attempts' spans (exported before the
        http phase, whose own requests' spans may be left unexported), then the webhooks
        owed (the ends just written may owe some: an http phase's length at most, within
        what the budget leaves before it). What stayed unrecorded, and undelivered."""
        unrecorded = await self.flush_ends(self.plan.flush_deadline(t0, time.monotonic()))
        await self.flush_spans(self.plan.flush_deadline(t0, time.monotonic()))
        now = time.monotonic()
        undelivered = await self.flush_webhooks(
            min(
                self.plan.flush_deadline(t0, now),
                now + max(self.plan.http_timeout, FLUSH_AT_LEAST),
            )
        )
        return unrecorded, undelivered

    def _stopped(
        self, report: ShutdownReport, duration: float, took: dict[str, float], hard_end: float
    ) -> None:
        """Step 7: the report in the metrics (each outcome counted) and in one log line."""
        self.metrics.shutdown.ended(
            duration,
            [
                (ShutdownOutcome.FINISHED, report.finished),
                (ShutdownOutcome.CANCELLED, report.cancelled),
                (ShutdownOutcome.HANDED_OFF, report.handed_off),
                (ShutdownOutcome.PARKED, report.parked),
                (ShutdownOutcome.ABANDONED, report.abandoned),
            ],
            took,
        )
        self.phase_ends = hard_end
        self._enter(Phase.STOPPED)
        logger.info(
            "shutdown report: %s",
            json.dumps(report.as_dict(), sort_keys=True),
            extra={"shutdown_report": report.as_dict()},
        )
        self.report = report

    def took(self, phase: str, seconds: float) -> None:
        """A phase after the report (the runner's `http`, then `exit`): in the phase metric
        (pushed, for `http`) and in the last line."""
        self.metrics.shutdown.phase_took(phase, seconds)
        self._after_report[phase] = seconds

    def last_line(self, code: int) -> None:
        """One line as the process ends: what each phase after the report took."""
        assert self.started is not None
        logger.info(
            "shutdown ended %.3fs after the first signal (%s); exit code %d",
            time.monotonic() - self.started,
            ", ".join(f"{name} {seconds:.3f}s" for name, seconds in self._after_report.items()),
            code,
        )

    async def _until(self, deadline: float) -> None:
        """Wait for the deadline, or less when a second signal asks to skip ahead."""
        if self._skip.is_set():
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            async with asyncio.timeout(remaining):
                await self._skip.wait()
        except TimeoutError:
            pass


def name_unrecorded(unrecorded: list[Execution], deadline: float) -> None:
    """A JSON line for each end not written to the store, while there is time (`deadline`,
    monotonic: ShutdownPlan.lines_deadline); the rest in one line with their ids,
    so that the report still comes before the watchdog (a line costs tens of microseconds:
    a hundred thousand of them take seconds)."""
    for index, execution in enumerate(unrecorded):
        if time.monotonic() >= deadline:
            ids = [rest.execution_id for rest in unrecorded[index:]]
            logger.error(
                "ends not written to the store, %d without a line of their own (no time "
                "left before the watchdog): %s",
                len(ids),
                json.dumps(ids),
                extra={"unrecorded_ids": ids},
            )
            return
        # Everything but the result: a log line never carries a result (it may be
        # megabytes, and a thousand of them would flood the log at the worst moment).
        record = execution.to_json()
        record.pop("result", None)
        logger.error(
            "end not written to the store: %s",
            json.dumps(record, default=str),
            extra={"unrecorded_execution": record},
        )


def _exit_code(unrecorded: bool, abandoned: bool) -> ExitCode:
    """Ends missing from the store weigh most: clients cannot see them anywhere."""
    if unrecorded:
        return ExitCode.UNRECORDED
    return ExitCode.ABANDONED if abandoned else ExitCode.OK
