"""The shutdown sequence: plan (one budget), phases on one clock, watchdog, report.

Phases are consecutive from the first signal at t0: admission closes at t0 + unready; the
rest is cancelled at that + drain; what has not settled is abandoned at that + cancel. Each
wait is bounded by a deadline computed here once; remaining time is recomputed from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from agent_server.execution import CancelReason, Execution
from agent_server.metrics import Metrics
from agent_server.registry import InFlightRegistry, RejectReason
from agent_server.settings import SHUTDOWN_MARGIN, Settings
from agent_server.signals import block_in_this_thread

logger = logging.getLogger("agent_server.shutdown")

#: Kept free before the watchdog deadline for what follows the planned phases: uvicorn's
#: lifespan shutdown and the interpreter's exit.
EXIT_RESERVE = 0.25
#: Ends owed to the store get at least this long at shutdown (within the watchdog's bound).
FLUSH_AT_LEAST = 0.5
#: How often the end of the remaining non-daemon threads is checked.
THREAD_POLL = 0.01


class Phase(enum.StrEnum):
    SERVING = "serving"
    UNREADY = "unready"
    DRAINING = "draining"
    CANCELLING = "cancelling"
    STOPPED = "stopped"


class ExitCode(enum.IntEnum):
    OK = 0
    STARTUP_FAILED = 1  # uvicorn's own code for it is 3, which here means work abandoned
    INVALID_SETTINGS = 2
    ABANDONED = 3
    WATCHDOG = 4
    FORCED = 5
    UNRECORDED = 6  # ends that could not be written to the shared store


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
    phases: dict[str, float] = field(default_factory=dict)
    finished: int = 0
    cancelled: int = 0
    #: Resumable executions queued for another replica at the drain deadline.
    handed_off: int = 0
    abandoned: int = 0
    #: Abandoned earlier (by a session release) and still running: the exit ends them too.
    abandoned_earlier: int = 0
    rejected: int = 0
    #: Ends that could not be written to the shared store (each logged as a JSON line).
    unrecorded: int = 0
    duration_seconds: float = 0.0
    exit_code: int = ExitCode.OK
    plan: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Seconds an exit that cannot wait gives its last line to reach stderr.
EXIT_LINE_WAIT = 0.1


def exit_with_line(line: str, code: int) -> None:
    """Write one line to the stderr descriptor, then end the process at once, whether or
    not the line could be written.

    For exits that cannot wait for the event loop or the logging machinery: a signal
    handler may run while the interrupted code holds the logging locks, and a blocked loop
    never gets back to anything else. The write happens in a thread of its own, waited for
    at most `EXIT_LINE_WAIT`: stderr may be a full pipe nobody reads, where a write blocks
    for good (the descriptor's blocking mode is shared with other processes, so it is not
    changed).
    """
    writer = threading.Thread(
        target=_write_stderr, args=((line + "\n").encode(),), name="exit-line", daemon=True
    )
    try:
        writer.start()
        writer.join(EXIT_LINE_WAIT)
    finally:
        os._exit(code)


def _write_stderr(data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(2, data)


class Watchdog:
    """Ends the process at a deadline even when the event loop is blocked.

    A daemon thread: it needs nothing from the loop. It writes its one line straight to the
    stderr file descriptor, since a blocked main thread may hold the logging locks.
    """

    def __init__(self, line: Callable[[float], str]) -> None:
        self._line = line
        self._disarmed = threading.Event()
        self._thread: threading.Thread | None = None

    def arm(self, after: float, started: float) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._watch, args=(started + after, started), name="watchdog", daemon=True
        )
        self._thread.start()

    def disarm(self) -> None:
        self._disarmed.set()

    def _watch(self, deadline: float, started: float) -> None:
        block_in_this_thread()
        if self._disarmed.wait(max(0.0, deadline - time.monotonic())):
            return
        exit_with_line(self._line(time.monotonic() - started), ExitCode.WATCHDOG)


#: Writes the ends still waiting for the store by a deadline; returns those it could not.
FlushEnds = Callable[[float], Awaitable[list[Execution]]]


async def _nothing_to_flush(deadline: float) -> list[Execution]:
    return []


class ShutdownSequence:
    """Runs the phases against the registry; reports and sets the final metrics.

    `limit_releases` bounds session releases under way by the shutdown's settle deadline;
    `flush_ends` writes what the store still owes before the report; `end_streams` ends
    open event streams when the listener closes (the runner calls it then).
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
    ) -> None:
        self.registry = registry
        self.metrics = metrics
        self.set_phase = set_phase
        self.plan = plan
        self.limit_releases = limit_releases
        self.flush_ends = flush_ends
        #: Ends open event streams (with a retry hint) as the listener closes.
        self.end_streams = end_streams
        #: True when `agent-server run` drives the sequence from signals; otherwise the
        #: lifespan shutdown of plain uvicorn runs it.
        self.driven_by_signals = False
        self.started: float | None = None
        self.report: ShutdownReport | None = None
        self._signal: str | None = None
        self._skip = asyncio.Event()
        self._ended_before = 0
        self._rejected_before = 0

    def begin(self, started: float, wall_time: float, signal_name: str | None) -> None:
        """The first instant of shutdown: unready, `ctx.draining` true, metrics say so."""
        if self.started is not None:
            return
        self.started = started
        self._signal = signal_name
        self._ended_before = self.registry.stats.ended
        self._rejected_before = self.registry.stats.rejected[RejectReason.DRAINING.value]
        self.registry.begin_drain()
        self.metrics.shutdown_began(wall_time, started)
        self.set_phase(Phase.UNREADY)
        logger.info(
            "shutdown began (%s): %d executions in flight; admission closes in %gs, "
            "cancellation at +%gs, abandonment at +%gs",
            signal_name or "lifespan",
            self.registry.inflight,
            self.plan.unready_delay,
            self.plan.unready_delay + self.plan.drain_timeout,
            self.plan.unready_delay + self.plan.drain_timeout + self.plan.cancel_timeout,
        )

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

        admission_at = t0 + (0.0 if skip_unready else self.plan.unready_delay)
        await self._until(admission_at)
        self.registry.close_admission()
        self.set_phase(Phase.DRAINING)
        phases["draining"] = time.monotonic() - t0

        cancel_at = admission_at + self.plan.drain_timeout
        if not self._skip.is_set():
            await self.registry.wait_idle(cancel_at, interrupt=self._skip)
        cancel_at = min(cancel_at, time.monotonic())
        finished = self.registry.stats.ended - self._ended_before

        self.set_phase(Phase.CANCELLING)
        phases["cancelling"] = time.monotonic() - t0
        handed_before = self.registry.stats.outcomes["handed_off"]
        tasks = self.registry.cancel_all(CancelReason.SHUTDOWN)
        if tasks:
            logger.info("drain deadline: cancelling %d executions", len(tasks))
        settle_at = cancel_at + self.plan.cancel_timeout
        if self.limit_releases is not None:
            self.limit_releases(settle_at)
        abandoned = await self.registry.settle(tasks, settle_at)
        handed_off = self.registry.stats.outcomes["handed_off"] - handed_before
        unrecorded = await self.flush_ends(self.plan.flush_deadline(t0, time.monotonic()))
        for execution in unrecorded:
            # Everything but the result: a log line never carries a result (it may be
            # megabytes, and a thousand of them would flood the log at the worst moment).
            record = execution.to_json()
            record.pop("result", None)
            logger.error(
                "end not written to the store: %s",
                json.dumps(record, default=str),
                extra={"unrecorded_execution": record},
            )

        duration = time.monotonic() - t0
        phases["stopped"] = duration
        abandoned_earlier = max(
            0, self.registry.abandoned_pending - len(abandoned) - self.registry.stale_pending
        )
        report = ShutdownReport(
            signal=self._signal,
            phases={name: round(seconds, 4) for name, seconds in phases.items()},
            finished=finished,
            cancelled=len(tasks) - len(abandoned) - handed_off,
            handed_off=handed_off,
            abandoned=len(abandoned),
            abandoned_earlier=abandoned_earlier,
            rejected=self.registry.stats.rejected[RejectReason.DRAINING.value]
            - self._rejected_before,
            duration_seconds=round(duration, 4),
            unrecorded=len(unrecorded),
            exit_code=_exit_code(bool(unrecorded), bool(abandoned or abandoned_earlier)),
            plan=asdict(self.plan),
        )
        self.metrics.shutdown_ended(
            duration,
            [
                ("finished", report.finished),
                ("cancelled", report.cancelled),
                ("handed_off", report.handed_off),
                ("abandoned", report.abandoned),
            ],
        )
        self.set_phase(Phase.STOPPED)
        logger.info(
            "shutdown report: %s",
            json.dumps(report.as_dict(), sort_keys=True),
            extra={"shutdown_report": report.as_dict()},
        )
        self.report = report
        return report

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


def _exit_code(unrecorded: bool, abandoned: bool) -> ExitCode:
    """Ends missing from the store weigh most: clients cannot see them anywhere."""
    if unrecorded:
        return ExitCode.UNRECORDED
    return ExitCode.ABANDONED if abandoned else ExitCode.OK


async def finish_process(
    code: int, *, abandoned_pending: int, deadline: float, cancel_tasks: bool
) -> None:
    """The last step of every shutdown, `agent-server run` or plain uvicorn: never wait
    without bound in `asyncio.run`'s cleanup or the interpreter's exit. Abandoned work ends
    the process at once; other leftovers get until `deadline`, then end it too."""
    if abandoned_pending:
        end_process(code)
    if await end_leftovers(deadline, cancel_tasks=cancel_tasks):
        end_process(code, "tasks or threads")


def end_process(code: int, still_running: str = "abandoned work") -> None:
    """Exit now: asyncio.run's cleanup would wait without bound for abandoned tasks."""
    logger.warning("exiting with %s still running (exit code %d)", still_running, code)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


async def end_leftovers(deadline: float, *, cancel_tasks: bool) -> list[str]:
    """Give what would hold the exit without bound until `deadline`; name what still runs.

    `asyncio.run` ends by cancelling the remaining tasks and waiting for them, then for the
    default executor's threads, with no bound; the interpreter then joins every non-daemon
    thread. A task user code left behind that swallows cancellation, or a thread still in a
    blocking call (`asyncio.to_thread`), would hold the process until the watchdog or
    SIGKILL. With `cancel_tasks`, every other task is cancelled first: only the process's
    last coroutine may do that (under plain uvicorn the lifespan runs while uvicorn's own
    tasks wait for it). An empty answer means the exit will not wait on anything.
    """
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    tasks = [task for task in asyncio.all_tasks() if task is not current] if cancel_tasks else []
    for task in tasks:
        task.cancel()
    existing = set(threading.enumerate())  # not the helper thread the executor shutdown starts
    executor = asyncio.create_task(
        loop.shutdown_default_executor(), name="shutdown-default-executor"
    )
    _, pending = await asyncio.wait(
        [*tasks, executor], timeout=max(0.0, deadline - time.monotonic())
    )
    for task in tasks:
        if task.done() and not task.cancelled() and task.exception() is not None:
            logger.error("task %s raised", task.get_name(), exc_info=task.exception())
    threads = [thread for thread in await _joinable_threads(deadline) if thread in existing]
    stuck = sorted(task.get_name() for task in pending if task is not executor)
    stuck += sorted(f"thread {thread.name}" for thread in threads)
    if pending or threads:
        logger.warning(
            "not ending after the shutdown: %s", ", ".join(stuck) or "default executor threads"
        )
        stuck = stuck or ["default executor"]
    return stuck


async def _joinable_threads(deadline: float) -> list[threading.Thread]:
    """Non-daemon threads (the interpreter's exit joins them) still alive at `deadline`."""
    while True:
        threads = [
            thread
            for thread in threading.enumerate()
            if thread is not threading.main_thread() and not thread.daemon
        ]
        if not threads or time.monotonic() >= deadline:
            return threads
        await asyncio.sleep(THREAD_POLL)
