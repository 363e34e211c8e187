"""The attempts this process runs, from launch to their observed end.

`Attempts` holds each running attempt once (`live`, by execution id) and the abandoned
ones until they end by themselves (`abandoned`, by task); it runs the reasoner, observes
every task's end once, and carries out the ending `classify` chose (`conclude`): the
record's end, the count, the log line. It decides no admission and waits for nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, assert_never

from agent_server.model.context import ExecutionContext, InputChannel
from agent_server.model.events import Event
from agent_server.model.execution import (
    CancelReason,
    Execution,
    ExecutionStatus,
    error_of,
    exception_text,
)
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import ExecutionTimeout
from agent_server.model.status import OWNED
from agent_server.runtime.attempt import Attempt, Ending, Happened, Verdict, classify
from agent_server.runtime.logs import LOG_EXECUTION, execution_fields
from agent_server.runtime.observer import RegistryObserver, RegistryStats
from agent_server.runtime.signals import block_in_this_thread
from agent_server.runtime.tracing import Tracing
from agent_server.store.base import ExecutionStore

#: The registry's lines keep the logger name users know, whichever part writes them.
logger = logging.getLogger("agent_server.registry")

#: Worker threads for `def` reasoners; they cannot be cancelled, only waited for or abandoned.
THREAD_WORKERS = 32
#: The error of an execution whose record vanished from the store while it ran here.
VANISHED = {
    "type": "ExecutionLost",
    "message": "its record vanished from the store (Redis lost its data) while it ran",
}


class Gate:
    """Whether this process drains (`ctx.draining`) and still admits work: read by the
    attempts (a cancellation while draining is the shutdown's; a retry needs a taker)."""

    def __init__(self) -> None:
        self.drain = asyncio.Event()
        self.admitting = True

    @property
    def draining(self) -> bool:
        return self.drain.is_set()


class Attempts:
    """Running attempts, strongly held until their end is observed; abandoned ones stay
    held until they end by themselves."""

    def __init__(
        self,
        store: ExecutionStore,
        gate: Gate,
        stats: RegistryStats,
        observer: RegistryObserver | None,
        tracing: Tracing,
        *,
        max_checkpoint_size: int,
        max_events: int,
    ) -> None:
        self.store = store
        self.gate = gate
        self.stats = stats
        self.observer = observer
        self.tracing = tracing
        self.max_checkpoint_size = max_checkpoint_size
        self.max_events = max_events
        #: Where `ctx.ask` records its requests (the registry's input part), set once built.
        self.channel: InputChannel | None = None
        #: The attempt each execution runs here now, by execution id.
        self.live: dict[str, Attempt] = {}
        #: Attempts given up on that still run, by task: they outlive their removal from
        #: `live`, and the same execution may run again here meanwhile (a hand-off claimed
        #: back), so they cannot be kept by execution id.
        self.abandoned: dict[asyncio.Task[None], Attempt] = {}
        self.idle = asyncio.Event()
        self.idle.set()
        self._executor: ThreadPoolExecutor | None = None
        #: Seconds recording one end takes (a moving average over the ends so far).
        self.end_seconds = 10e-6

    # -- what runs ---------------------------------------------------------------------------

    def running(self, execution_id: str) -> Execution | None:
        attempt = self.live.get(execution_id)
        return None if attempt is None else attempt.execution

    def of(self, execution: Execution) -> Attempt | None:
        """The attempt running `execution` (this very object), abandoned ones included."""
        attempt = self.live.get(execution.execution_id)
        if attempt is not None and attempt.execution is execution:
            return attempt
        return next((a for a in self.abandoned.values() if a.execution is execution), None)

    def owned_ids(self) -> list[str]:
        """The executions whose attempt this process runs, owned in the store (running or
        waiting for input in their task; not abandoned, not handed off)."""
        return [key for key, attempt in self.live.items() if attempt.execution.status in OWNED]

    @property
    def stale_pending(self) -> int:
        return sum(1 for attempt in self.abandoned.values() if attempt.stale)

    # -- launch and run ----------------------------------------------------------------------

    def launch(self, execution: Execution, reasoner: Reasoner, arguments: dict[str, Any]) -> None:
        context = None
        if reasoner.emits:  # only for a reasoner that asks for one, or a generator
            execution.event_log(self.max_events)
            context = ExecutionContext(
                execution,
                self.gate.drain,
                self.store.checkpoint if reasoner.resumable else None,
                self.max_checkpoint_size,
                self.emitted,
                self.channel,
            )
        attempt = Attempt(execution, reasoner)
        run = self._run(attempt, arguments, context)
        if self.tracing.enabled:
            run = self.tracing.attempt(execution, run)
        task = asyncio.get_running_loop().create_task(
            run, name=f"execution-{execution.execution_id}"
        )
        attempt.begin(task)
        self.live[execution.execution_id] = attempt
        self.idle.clear()
        task.add_done_callback(functools.partial(self._on_task_done, attempt))
        self.stats.started += 1
        if self.observer is not None:
            self.observer.execution_started(execution)

    def emitted(self, execution: Execution, event: Event) -> None:
        self.store.emit(execution, event)
        if self.observer is not None:
            self.observer.event_emitted(execution)
        if self.tracing.enabled:
            self.tracing.emitted(execution, event)

    async def _run(
        self, attempt: Attempt, arguments: dict[str, Any], context: ExecutionContext | None
    ) -> None:
        """Run the reasoner and record how it really ended; never raises."""
        execution, reasoner = attempt.execution, attempt.reasoner
        # The task's own context names its execution, for every line logged in it (the
        # reasoner's own included): agent_server.runtime.logs.
        LOG_EXECUTION.set(execution)
        try:
            if reasoner.is_generator:
                assert context is not None  # `launch` gives every generator one
                value = await self._stream(attempt, arguments, context)
            elif reasoner.is_async:
                value = await reasoner.coroutine(arguments, context)
            else:
                value = await self._run_in_thread(attempt, arguments, context)
            result = reasoner.serialize(value)
        except BaseException as exc:
            task = asyncio.current_task()
            cancelled = execution.cancel_reason is not None or (
                task is not None and task.cancelling() > 0
            )
            if isinstance(exc, asyncio.CancelledError) and attempt.timed_out and task:
                task.uncancel()  # its own limit: it ends here, failed, not cancelled
            verdict = classify(
                Happened.RAISED,
                attempt,
                exc,
                cancelled=cancelled,
                draining=self.gate.draining,
                retries=functools.partial(self._retries, attempt),
            )
            self.conclude(execution, verdict, attempt=attempt)
        else:
            verdict = classify(Happened.RETURNED, attempt)
            self.conclude(execution, verdict, attempt=attempt, result=result)

    @staticmethod
    async def _stream(
        attempt: Attempt, arguments: dict[str, Any], context: ExecutionContext
    ) -> list[Any]:
        """Run a generator reasoner: each value it yields is an `output` event, the list of
        them its result. It is closed (`aclose`, its `finally` runs) however it ends; once
        its task is cancelled it is not read again, even if it swallowed the cancellation
        and yields on (a close that does not end is abandoned as any body is: settle.py)."""
        reasoner = attempt.reasoner
        task = asyncio.current_task()
        values: list[Any] = []
        async with contextlib.aclosing(reasoner.generator(arguments, context)) as generator:
            async for value in generator:
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError  # asked to stop, and it yielded on
                context.output(reasoner.serialize_item(value))
                values.append(value)
        return values

    def _retries(self, attempt: Attempt, exc: BaseException) -> bool:
        """Whether its policy runs it again, and someone is there to take the next attempt."""
        policy = attempt.reasoner.retry
        return (
            policy is not None
            and policy.retries(exc, attempt.execution.attempt)
            and (self.gate.admitting or self.store.shared)  # else nobody here would take it
        )

    async def _run_in_thread(
        self, attempt: Attempt, arguments: dict[str, Any], context: ExecutionContext | None
    ) -> Any:
        """A thread cannot be interrupted: on cancellation keep waiting, so the record is
        honest; settle bounds the wait and abandons it if need be."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                THREAD_WORKERS, thread_name_prefix="reasoner", initializer=block_in_this_thread
            )
        loop = asyncio.get_running_loop()
        # In a copy of the task's context: the execution's log scope and span go along.
        call = functools.partial(
            contextvars.copy_context().run, attempt.reasoner.call, arguments, context
        )
        future = loop.run_in_executor(self._executor, call)
        attempt.in_thread = True
        try:
            while True:
                with contextlib.suppress(asyncio.CancelledError):
                    return await asyncio.shield(future)
        finally:
            attempt.in_thread = False

    def _on_task_done(self, attempt: Attempt, task: asyncio.Task[None]) -> None:
        """Observe the task's end exactly once and drop the strong reference."""
        attempt.stop_clock()
        execution = attempt.execution
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:  # _run never raises; anything here is a bug worth seeing
                logger.error("execution task %s raised", task.get_name(), exc_info=exc)
        elif attempt.handing_off or not execution.is_terminal:  # before its first step
            verdict = classify(Happened.NEVER_RAN, attempt, draining=self.gate.draining)
            self.conclude(execution, verdict, attempt=attempt)
        if self.live.get(execution.execution_id) is attempt:
            del self.live[execution.execution_id]
        self.abandoned.pop(task, None)
        if not self.live:
            self.idle.set()

    def give_up(self, attempt: Attempt, *, say: bool = True) -> Execution | None:
        """Give up on an attempt that will not settle: its task stays referenced until it
        ends; it is handed off now if it was to be (its task a stale attempt), else
        recorded abandoned and returned. `say`: log its own line."""
        execution = attempt.execution
        if attempt.task.done() or execution.is_terminal:
            return None
        if self.live.get(execution.execution_id) is attempt:
            del self.live[execution.execution_id]
        self.abandoned[attempt.task] = attempt
        if not self.live:
            self.idle.set()
        verdict = classify(Happened.GIVEN_UP, attempt)
        if verdict.ending is Ending.HANDED_OFF:
            attempt.stale = True
        self.conclude(execution, verdict, attempt=attempt, say=say)
        return execution if verdict.ending is Ending.ABANDONED else None

    def refuse(self, execution: Execution, exc: BaseException) -> None:
        """A claimed execution this replica cannot run ends `failed`, counted and recorded."""
        verdict = Verdict(Ending.REFUSED, ExecutionStatus.FAILED, exc)
        self.conclude(execution, verdict)

    # -- ends --------------------------------------------------------------------------------

    def conclude(
        self,
        execution: Execution,
        verdict: Verdict,
        *,
        attempt: Attempt | None = None,
        result: Any = None,
        say: bool = True,
    ) -> None:
        """Carry out `verdict`: one branch per ending (the most common first: a match
        tries its cases in order)."""
        ending, exc = verdict.ending, verdict.error
        match ending:
            case Ending.SUCCEEDED:
                self._finish(execution, ending, result=result)
            case Ending.RETRIED:
                assert attempt is not None and exc is not None
                policy = attempt.reasoner.retry
                assert policy is not None
                self._retry(execution, exc, policy.delay(execution.attempt))
            case Ending.PARKED:
                self._count(execution, ending)
                logger.info(
                    "execution %s (%s) parked after attempt %d: it waits for input with no "
                    "task; its answer resumes it on any replica",
                    execution.execution_id,
                    execution.reasoner,
                    execution.attempt,
                )
            case Ending.HANDED_OFF:
                self._hand_off(execution)
            case Ending.LATE:
                self._log_late(execution, verdict)
            case Ending.STALE:
                self._stale(execution, verdict, result)
            case Ending.FAILED | Ending.TIMED_OUT:
                error = self._error(verdict)
                assert exc is not None and error is not None
                self._log_failure(execution, exc, error)
                self._finish(execution, ending, error=error)
            case Ending.REFUSED:
                logger.error(
                    "cannot resume execution %s: %s",
                    execution.execution_id,
                    exc,
                    extra={"fields": execution_fields(execution)},
                )
                if self.observer is not None:
                    self.observer.execution_started(execution)
                self._finish(execution, ending, error=self._error(verdict))
            case Ending.ABANDONED:
                execution.abandoned = True
                self._finish(execution, ending, reason=verdict.reason)
                if say:
                    self._log_abandoned(execution, attempt is not None and attempt.in_thread)
            case Ending.CANCELLED | Ending.CANCELLED_AT_SHUTDOWN | Ending.LOST:
                self._finish(execution, ending, error=self._error(verdict), reason=verdict.reason)
            case _:  # a new Ending row without its case here stops type checking
                assert_never(ending)

    @staticmethod
    def _log_late(execution: Execution, verdict: Verdict) -> None:
        """An abandoned attempt ended later: said, its record left as it was reported."""
        exc = verdict.error
        if exc is not None:
            logger.warning(
                "abandoned execution %s (%s) ended later with %s: %s",
                execution.execution_id,
                execution.reasoner,
                type(exc).__name__,
                exception_text(exc),
                extra={"fields": execution_fields(execution)},
            )
        else:
            logger.warning(
                "abandoned execution %s (%s) ended later: %s",
                execution.execution_id,
                execution.reasoner,
                verdict.status,
                extra={"fields": execution_fields(execution)},
            )

    def _stale(self, execution: Execution, verdict: Verdict, result: Any) -> None:
        """A stale attempt (handed off while it ran) ended later: said, and its end sent to
        the store, which fences it (a newer attempt owns the record)."""
        assert verdict.status is not None
        exc, error = verdict.error, self._error(verdict)
        if exc is not None and error is not None:
            self._log_failure(execution, exc, error)
        logger.warning(
            "stale attempt %d of execution %s (%s) ended later: %s; its end is fenced",
            execution.attempt,
            execution.execution_id,
            execution.reasoner,
            verdict.status.value,
            extra={"fields": execution_fields(execution)},
        )
        execution.finish(verdict.status, result=result, error=error, reason=verdict.reason)
        self.store.end(execution)  # refused by the store: a newer attempt owns it

    @staticmethod
    def _error(verdict: Verdict) -> dict[str, str] | None:
        if verdict.status is ExecutionStatus.LOST:
            return VANISHED
        return None if verdict.error is None else error_of(verdict.error)

    def _count(self, execution: Execution, ending: Ending) -> None:
        assert ending.outcome is not None
        self.stats.outcomes[ending.outcome] += 1
        if self.observer is not None:
            self.observer.execution_finished(execution, ending.outcome)

    def _finish(
        self,
        execution: Execution,
        ending: Ending,
        *,
        result: Any = None,
        error: dict[str, str] | None = None,
        reason: CancelReason | None = None,
    ) -> None:
        """Record the end in the row's status, count its outcome, and measure the cost."""
        assert ending.status is not None
        began = time.perf_counter()
        execution.finish(ending.status, result=result, error=error, reason=reason)
        self._count(execution, ending)
        self.store.end(execution)
        # What recording an end costs here, as a moving average: what a settle reserves.
        self.end_seconds += (time.perf_counter() - began - self.end_seconds) / 64

    def _log_failure(self, execution: Execution, exc: BaseException, error: dict[str, str]) -> None:
        try:
            logger.error(
                "execution %s (%s) failed",
                execution.execution_id,
                execution.reasoner,
                exc_info=exc,
                extra={"fields": execution_fields(execution)},
            )
        except Exception:  # a traceback that cannot be formatted: the record still ends
            logger.error(
                "execution %s (%s) failed: %s",
                execution.execution_id,
                *error.values(),
                extra={"fields": execution_fields(execution)},
            )

    def _log_abandoned(self, execution: Execution, in_thread: bool) -> None:
        reason = None if execution.cancel_reason is None else execution.cancel_reason.value
        logger.warning(
            "execution %s (%s) abandoned: it did not settle after cancellation (%s)%s",
            execution.execution_id,
            execution.reasoner,
            reason,
            "; it runs in a thread, which cannot be cancelled (a def reasoner)"
            if in_thread
            else "",
            extra={
                "fields": {
                    **execution_fields(execution),
                    "abandoned_execution": execution.execution_id,
                    "in_thread": in_thread,
                    "cancel_reason": reason,
                }
            },
        )

    def _retry(self, execution: Execution, exc: BaseException, delay: float) -> None:
        """The attempt failed with what its policy retries: the next is queued, due after
        `delay` seconds, for whichever replica has room then (this one, in one process)."""
        logger.warning(
            "execution %s (%s): attempt %d failed with %s: %s; attempt %d is due in %.3g s",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            type(exc).__name__,
            exception_text(exc),
            execution.attempt + 1,
            delay,
        )
        self.store.retry(execution, delay)  # its arguments (the attempt that failed) now
        execution.retry(time.time() + delay, moved_away=self.store.shared)
        if self.observer is not None:
            reason = "timeout" if isinstance(exc, ExecutionTimeout) else "exception"
            self.observer.execution_retried(execution, reason)
            self.observer.execution_queued(execution, 1, None)

    def _hand_off(self, execution: Execution) -> None:
        """The next attempt goes to the queue; this one ends here (status_reason: handoff)."""
        if execution.status is not ExecutionStatus.RUNNING:
            return  # handed off already: a stale attempt's task ended
        execution.mark_queued()
        self._count(execution, Ending.HANDED_OFF)
        self.store.hand_off(execution)
        logger.info(
            "execution %s (%s) handed off after attempt %d (status_reason: handoff)",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            extra={"fields": {**execution_fields(execution), "handed_off": True}},
        )

    def close(self) -> None:
        """Release the worker threads without waiting for abandoned ones."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
