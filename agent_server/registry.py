"""InFlightRegistry: owns every execution's task from start to an observed end.

The registry is the admission gate (draining, capacity, sessions being released), the
lookup table (retention by TTL and count), and the one place that cancels, settles and
abandons work with a deadline. Session release and the shutdown sequence both use the same
`cancel` / `settle` / `abandon` operations, so they bound their waits the same way.

Settling uses `asyncio.wait` with the time left to one deadline: `wait_for(gather(...))`
would wait past its deadline for a task that swallows `CancelledError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Collection, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_server.execution import CancelReason, Execution, ExecutionContext, ExecutionStatus
from agent_server.reasoner import Reasoner
from agent_server.signals import block_in_this_thread

logger = logging.getLogger("agent_server.registry")

#: Worker threads for `def` reasoners; they cannot be cancelled, only waited for or abandoned.
THREAD_WORKERS = 32


class RejectReason(enum.StrEnum):
    DRAINING = "draining"
    CAPACITY = "capacity"
    SESSION_RELEASED = "session_released"


class AdmissionError(Exception):
    """New work was refused; the reason maps to 503, 429 or 409."""

    def __init__(self, reason: RejectReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


class ExecutionNotFound(LookupError):
    pass


class ExecutionRunning(Exception):
    """A running execution cannot be forgotten."""


class SessionBusy(Exception):
    """The session has running work and the caller chose not to cancel it."""


class RegistryObserver(Protocol):
    """Told what happened; never decides anything (metrics implements it)."""

    def execution_started(self, execution: Execution) -> None: ...

    def execution_finished(self, execution: Execution, outcome: str) -> None: ...

    def execution_rejected(self, reason: RejectReason) -> None: ...

    def session_released(self, outcome: str) -> None: ...


@dataclass(frozen=True)
class SessionRelease:
    session_id: str
    cancelled: int
    abandoned: int
    forgotten: int
    elapsed_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "session_id": self.session_id,
            "cancelled": self.cancelled,
            "abandoned": self.abandoned,
            "forgotten": self.forgotten,
            "elapsed_seconds": self.elapsed_seconds,
        }


@dataclass
class RegistryStats:
    """Running totals; the shutdown report takes differences of these across its phases."""

    started: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def ended(self) -> int:
        return sum(self.outcomes.values())


class InFlightRegistry:
    """Tracks executions: running tasks are strongly held until their end is observed."""

    def __init__(
        self,
        *,
        max_inflight: int = 1000,
        result_ttl: float = 3600.0,
        max_retained: int = 10_000,
        observer: RegistryObserver | None = None,
    ) -> None:
        self.max_inflight = max_inflight
        self.result_ttl = result_ttl
        self.max_retained = max_retained
        self.observer = observer
        self.stats = RegistryStats()
        self.admitting = True
        self._executions: dict[str, Execution] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._abandoned: dict[asyncio.Task[None], Execution] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._sessions: dict[str, set[str]] = {}
        self._releasing: dict[str, asyncio.Future[SessionRelease]] = {}
        self._drain = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor: ThreadPoolExecutor | None = None

    # -- admission and lookup ---------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._drain.is_set()

    @property
    def inflight(self) -> int:
        return len(self._running)

    @property
    def abandoned_pending(self) -> int:
        """Abandoned tasks that have still not ended."""
        return len(self._abandoned)

    def start(
        self, reasoner: Reasoner, arguments: dict[str, Any], session_id: str | None = None
    ) -> Execution:
        """Admit and start one execution, or raise AdmissionError."""
        reason = self._refusal(session_id)
        if reason is not None:
            self.stats.rejected[reason.value] += 1
            if self.observer is not None:
                self.observer.execution_rejected(reason)
            raise AdmissionError(reason)
        execution = Execution(reasoner.name, session_id)
        key = execution.execution_id
        context = (  # only for a reasoner that asks for one
            ExecutionContext(key, reasoner.name, session_id, self._drain)
            if reasoner.wants_context
            else None
        )
        task = asyncio.get_running_loop().create_task(
            self._run(execution, reasoner, arguments, context), name=f"execution-{key}"
        )
        self._executions[key] = execution
        self._running[key] = task
        self._idle.clear()
        if session_id is not None:
            self._sessions.setdefault(session_id, set()).add(key)
        task.add_done_callback(functools.partial(self._on_task_done, key))
        self.stats.started += 1
        if self.observer is not None:
            self.observer.execution_started(execution)
        return execution

    def _refusal(self, session_id: str | None) -> RejectReason | None:
        if not self.admitting:
            return RejectReason.DRAINING
        if session_id is not None and session_id in self._releasing:
            return RejectReason.SESSION_RELEASED
        if len(self._running) >= self.max_inflight:
            return RejectReason.CAPACITY
        return None

    def get(self, execution_id: str) -> Execution:
        self._expire()
        execution = self._executions.get(execution_id)
        if execution is None:
            raise ExecutionNotFound(execution_id)
        return execution

    def list_executions(
        self,
        *,
        status: ExecutionStatus | None = None,
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
    ) -> list[Execution]:
        """Newest first, filtered; bounded by `limit`."""
        self._expire()
        if session_id is not None:
            keys: Iterable[str] = sorted(
                self._sessions.get(session_id, ()),
                key=lambda k: self._executions[k].created_at,
                reverse=True,
            )
        else:
            keys = reversed(self._executions)
        found: list[Execution] = []
        for key in keys:
            if len(found) >= limit:
                break
            execution = self._executions[key]
            if status is not None and execution.status is not status:
                continue
            if reasoner is not None and execution.reasoner != reasoner:
                continue
            found.append(execution)
        return found

    def forget(self, execution_id: str) -> None:
        """Forget a finished execution; a running one raises ExecutionRunning."""
        execution = self.get(execution_id)
        if not execution.is_terminal:
            raise ExecutionRunning(execution_id)
        self._forget(execution_id)

    # -- cancellation, settling, abandonment -------------------------------------------------

    def cancel(self, execution_id: str, reason: CancelReason) -> Execution:
        """Request cancellation; the first reason given is the one recorded."""
        execution = self.get(execution_id)
        self._cancel(execution, reason)
        return execution

    def _cancel(self, execution: Execution, reason: CancelReason) -> None:
        task = self._running.get(execution.execution_id)
        if execution.is_terminal or task is None:
            return
        if execution.cancel_reason is None:
            execution.cancel_reason = reason
        task.cancel()

    def cancel_all(self, reason: CancelReason) -> list[asyncio.Task[None]]:
        """Cancel every running execution; returns their tasks for `settle`."""
        tasks: list[asyncio.Task[None]] = []
        for key, task in list(self._running.items()):
            execution = self._executions.get(key)  # None: ended and already evicted
            if execution is not None and not execution.is_terminal:
                self._cancel(execution, reason)
                tasks.append(task)
        return tasks

    async def settle(
        self, tasks: Collection[asyncio.Task[None]], deadline: float | None
    ) -> list[Execution]:
        """Wait for `tasks` until `deadline` (monotonic; None waits without bound).

        What has not ended by then is abandoned and returned. Never waits past the deadline.
        """
        pending = {task for task in tasks if not task.done()}
        if pending:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, pending = await asyncio.wait(pending, timeout=timeout)
        abandoned: list[Execution] = []
        for task in pending:
            if task.done():  # ended in the same loop iteration as the timeout
                continue
            execution = self._abandon(task)
            if execution is not None:
                abandoned.append(execution)
        return abandoned

    def _abandon(self, task: asyncio.Task[None]) -> Execution | None:
        """Give up on a task that will not settle: record it, keep it referenced, observe it."""
        key = task.get_name().removeprefix("execution-")
        execution = self._executions.get(key)
        if execution is None or execution.is_terminal:
            return None
        self._running.pop(key, None)
        self._abandoned[task] = execution
        if not self._running:
            self._idle.set()
        execution.abandoned = True
        self._record(execution, ExecutionStatus.CANCELLED, reason=execution.cancel_reason)
        logger.warning(
            "execution %s (%s) abandoned: it did not settle after cancellation (%s)",
            key,
            execution.reasoner,
            None if execution.cancel_reason is None else execution.cancel_reason.value,
        )
        return execution

    async def wait_idle(self, deadline: float, interrupt: asyncio.Event | None = None) -> bool:
        """Wait until nothing runs, the deadline passes, or `interrupt` is set; True if idle."""
        if self._idle.is_set():
            return True
        timeout = max(0.0, deadline - time.monotonic())
        waiters = [asyncio.create_task(self._idle.wait())]
        if interrupt is not None:
            waiters.append(asyncio.create_task(interrupt.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return self._idle.is_set()

    async def wait_abandoned(self, deadline: float) -> None:
        """Give abandoned tasks until `deadline` to end late (bounded, never required)."""
        if self._abandoned:
            timeout = max(0.0, deadline - time.monotonic())
            await asyncio.wait(list(self._abandoned), timeout=timeout)

    # -- drain ---------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """From now on `ctx.draining` is true and `ctx.wait_for_drain()` returns."""
        self._drain.set()

    def close_admission(self) -> None:
        self.admitting = False

    # -- sessions ------------------------------------------------------------------------------

    async def release_session(
        self, session_id: str, *, timeout: float | None, cancel_running: bool
    ) -> SessionRelease:
        """Cancel a session's running work, settle it by one deadline, forget its records.

        Concurrent releases of one session share the first one's drain and answer.
        """
        ongoing = self._releasing.get(session_id)
        if ongoing is not None:
            return await asyncio.shield(ongoing)
        started = time.monotonic()
        keys = self._sessions.get(session_id, set())
        # An ended execution's task leaves `_running` a loop iteration later: not running.
        running = [
            self._running[key]
            for key in keys
            if key in self._running and not self._executions[key].is_terminal
        ]
        if running and not cancel_running:
            raise SessionBusy(session_id)
        outcome: asyncio.Future[SessionRelease] = asyncio.get_running_loop().create_future()
        self._releasing[session_id] = outcome
        try:
            deadline = None if timeout is None else started + timeout
            for task in running:
                key = task.get_name().removeprefix("execution-")
                self._cancel(self._executions[key], CancelReason.SESSION_RELEASED)
            abandoned = await self.settle(running, deadline)
            forgotten = 0
            for key in list(self._sessions.get(session_id, ())):
                if not self._executions[key].is_terminal:  # running work is never forgotten
                    continue
                self._forget(key)
                forgotten += 1
            release = SessionRelease(
                session_id=session_id,
                cancelled=len(running) - len(abandoned),
                abandoned=len(abandoned),
                forgotten=forgotten,
                elapsed_seconds=time.monotonic() - started,
            )
        except BaseException:
            outcome.cancel()
            raise
        finally:
            del self._releasing[session_id]
        outcome.set_result(release)
        if self.observer is not None:
            self.observer.session_released("abandoned" if abandoned else "settled")
        return release

    # -- the task --------------------------------------------------------------------------

    async def _run(
        self,
        execution: Execution,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        context: ExecutionContext | None,
    ) -> None:
        """Run the reasoner and record how it really ended; never raises."""
        try:
            if reasoner.is_async:
                value = await reasoner.coroutine(arguments, context)
            else:
                value = await self._run_in_thread(reasoner, arguments, context)
            result = reasoner.serialize(value)
        except asyncio.CancelledError:
            reason = execution.cancel_reason
            if reason is None and self.draining:
                reason = CancelReason.SHUTDOWN
            self._record(execution, ExecutionStatus.CANCELLED, reason=reason)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            if execution.is_terminal:
                logger.warning(
                    "abandoned execution %s (%s) ended later with %s: %s",
                    execution.execution_id,
                    execution.reasoner,
                    type(exc).__name__,
                    exc,
                    exc_info=exc,
                )
                return
            logger.error(
                "execution %s (%s) failed",
                execution.execution_id,
                execution.reasoner,
                exc_info=exc,
            )
            error = {"type": type(exc).__name__, "message": str(exc)}
            self._record(execution, ExecutionStatus.FAILED, error=error)
        else:
            self._record(execution, ExecutionStatus.SUCCEEDED, result=result)

    async def _run_in_thread(
        self, reasoner: Reasoner, arguments: dict[str, Any], context: ExecutionContext | None
    ) -> Any:
        """A thread cannot be interrupted: on cancellation keep waiting, so the record is
        honest; settle bounds the wait and abandons it if need be."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                THREAD_WORKERS, thread_name_prefix="reasoner", initializer=block_in_this_thread
            )
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(
            self._executor, functools.partial(reasoner.call, arguments, context)
        )
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                return await asyncio.shield(future)

    def _record(
        self,
        execution: Execution,
        status: ExecutionStatus,
        *,
        result: Any = None,
        error: dict[str, str] | None = None,
        reason: CancelReason | None = None,
    ) -> None:
        if execution.is_terminal:  # abandoned earlier; its record stays as it was reported
            logger.warning(
                "abandoned execution %s (%s) ended later: %s",
                execution.execution_id,
                execution.reasoner,
                status.value,
            )
            return
        execution.finish(status, result=result, error=error, reason=reason)
        outcome = "abandoned" if execution.abandoned else str(status)  # str(): no enum lookup
        self.stats.outcomes[outcome] += 1
        if self.observer is not None:
            self.observer.execution_finished(execution, outcome)
        self._finished[execution.execution_id] = None
        self._expire()

    def _on_task_done(self, key: str, task: asyncio.Task[None]) -> None:
        """Observe the task's end exactly once and drop the strong reference."""
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:  # _run never raises; anything here is a bug worth seeing
                logger.error("execution task %s raised", key, exc_info=exc)
        else:  # cancelled before its first step: _run never ran, so record the end here
            execution = self._executions.get(key)
            if execution is not None and not execution.is_terminal:
                reason = execution.cancel_reason
                if reason is None and self.draining:
                    reason = CancelReason.SHUTDOWN
                self._record(execution, ExecutionStatus.CANCELLED, reason=reason)
        if self._running.get(key) is task:
            del self._running[key]
        self._abandoned.pop(task, None)
        if not self._running:
            self._idle.set()

    # -- retention -------------------------------------------------------------------------

    def _expire(self) -> None:
        """Forget the oldest finished executions past the TTL or over `max_retained`."""
        if not self._finished:
            return
        cutoff = time.monotonic() - self.result_ttl
        while self._finished:
            key = next(iter(self._finished))
            finished = self._executions[key].finished_monotonic
            over = len(self._finished) > self.max_retained
            if not over and finished is not None and finished > cutoff:
                break
            self._forget(key)

    def _forget(self, key: str) -> None:
        execution = self._executions.pop(key, None)
        self._finished.pop(key, None)
        if execution is not None and execution.session_id is not None:
            keys = self._sessions.get(execution.session_id)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._sessions[execution.session_id]

    def close(self) -> None:
        """Release the worker threads without waiting for abandoned ones."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
