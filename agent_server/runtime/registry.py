"""InFlightRegistry: this process's executions, from admission to an observed end.

The registry is the admission gate (draining, capacity), the owner of every task this
process runs, and the one place that cancels, settles and abandons them with a deadline.
Records live in the store (`agent_server.store`), which may be shared with other replicas;
the registry writes each execution's start and end there. Session release and the shutdown
sequence both use `cancel` / `settle` / `abandon`, so they bound their waits the same way.

Settling uses `asyncio.wait` with the time left to one deadline: `wait_for(gather(...))`
would wait past its deadline for a task that swallows `CancelledError`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import enum
import functools
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent_server.model.asks import Question, Reply
from agent_server.model.events import Event
from agent_server.model.execution import (
    AskMismatch,
    CancelReason,
    Execution,
    ExecutionContext,
    ExecutionStatus,
    Parked,
    error_of,
    exception_text,
)
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import ExecutionTimeout, SessionPolicy, limit_key
from agent_server.model.status import OWNED
from agent_server.runtime.logs import LOG_EXECUTION, execution_fields
from agent_server.runtime.signals import block_in_this_thread
from agent_server.runtime.tracing import Tracing
from agent_server.store.base import (
    ExecutionStore,
    Idempotency,
    QueueFull,
    SessionReleasing,
    StoreInDoubt,
    StoreUnavailable,
)

logger = logging.getLogger("agent_server.runtime.registry")

#: Worker threads for `def` reasoners; they cannot be cancelled, only waited for or abandoned.
THREAD_WORKERS = 32
#: A reasoner waiting for an answer through a shared store looks at its record this often
#: (seconds), in case the answer's notice was missed.
ANSWER_RECHECK = 5.0
#: The error of an execution whose record vanished from the store while it ran here.
VANISHED = {
    "type": "ExecutionLost",
    "message": "its record vanished from the store (Redis lost its data) while it ran",
}
#: Starts kept after the store did not answer them, for `adopt` (the oldest go first).
UNANSWERED_LIMIT = 10_000
#: Executions a settle abandons that each get a log line of their own; the rest are counted
#: in one line, by reasoner (a drain that abandons 10,000 would otherwise write 10,000 lines
#: past its deadline, the time a grace period does not have).
ABANDONED_LINES = 20
#: Abandoning one execution costs about this many times recording an end (the bookkeeping
#: around it); a settle reserves that much per pending task before its deadline.
ABANDON_COST = 2.0
#: Seconds a rollback waits for an interrupted execution to end before it forgets it.
ROLLBACK_WAIT = 60.0
#: Times a settle looks again at what is still pending before its reserve is spent.
SETTLE_LOOKS = 3


class AttemptClock:
    """An attempt's time limit (`timeout=`): its task is cancelled once it has run that long,
    not counting time in `input_required` (the clock stops while `ctx.ask` waits)."""

    __slots__ = ("_handle", "_since", "_used", "expired", "task", "timeout")

    def __init__(self, task: asyncio.Task[None], timeout: float) -> None:
        self.task = task
        self.timeout = timeout
        self.expired = False
        self._used = 0.0
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.run()

    def run(self) -> None:
        """The attempt works (its start, or an answer came): the clock goes on."""
        if self._since is None and not self.expired:
            loop = asyncio.get_running_loop()
            self._since = loop.time()
            self._handle = loop.call_later(max(0.0, self.timeout - self._used), self._expire)

    def pause(self) -> None:
        """The attempt waits for input: its time does not count."""
        if self._since is not None:
            self._used += asyncio.get_running_loop().time() - self._since
            self._since = None
        self.stop()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        if not self.task.done():
            self.expired = True
            self.task.cancel()


class RejectReason(enum.StrEnum):
    DRAINING = "draining"
    CAPACITY = "capacity"
    SESSION_RELEASED = "session_released"
    STORE_UNAVAILABLE = "store_unavailable"


class AdmissionError(Exception):
    """New work was refused; the reason maps to 503, 429 or 409. `in_doubt` names the
    execution the store may have recorded after all (a replica may lack it): read it later."""

    def __init__(self, reason: RejectReason, in_doubt: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.in_doubt = in_doubt


class RegistryObserver(Protocol):
    """Told what happened; never decides anything (metrics implements it)."""

    def execution_started(self, execution: Execution) -> None: ...

    def execution_finished(self, execution: Execution, outcome: str) -> None: ...

    def execution_rejected(self, reason: RejectReason) -> None: ...

    def event_emitted(self, execution: Execution) -> None: ...

    def input_waiting(self, execution: Execution, asked: bool, seconds: float) -> None: ...

    def execution_queued(self, execution: Execution, delta: int, waited: float | None) -> None:
        """One more queued (delta 1), or one fewer (-1: taken after `waited` seconds past
        its due time, or cancelled while queued: None)."""

    def execution_retried(self, execution: Execution, reason: str) -> None: ...


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
    """Runs executions: their tasks are strongly held, keyed by identity, until their end
    is observed; abandoned ones stay held until they end by themselves."""

    def __init__(
        self,
        store: ExecutionStore,
        *,
        max_inflight: int = 1000,
        max_checkpoint_size: int = 65_536,
        max_events: int = 1000,
        observer: RegistryObserver | None = None,
        queue_when_full: bool = False,
        max_queued: int = 10_000,
        tracing: Tracing | None = None,
        cancel_timeout: float = 5.0,
    ) -> None:
        self.store = store
        #: Seconds an interrupted execution (session policy) may take to settle.
        self.cancel_timeout = cancel_timeout
        #: Traces (agent_server/runtime/tracing.py): off unless the OTEL_* variables ask for them.
        self.tracing = tracing if tracing is not None else Tracing()
        self.max_inflight = max_inflight
        #: An async start past max_inflight is queued (202 queued) rather than refused (429),
        #: up to `max_queued` queued executions in all.
        self.queue_when_full = queue_when_full
        self.max_queued = max_queued
        store.on_unqueued = self._unqueued
        self.max_checkpoint_size = max_checkpoint_size
        self.max_events = max_events
        self.observer = observer
        self.stats = RegistryStats()
        self.admitting = True
        self._running: dict[str, asyncio.Task[None]] = {}
        self._executions: dict[asyncio.Task[None], Execution] = {}
        self._abandoned: dict[asyncio.Task[None], Execution] = {}
        #: Executions to hand off once they settle (resumable, shared store, at shutdown).
        self._handing_off: set[str] = set()
        #: Abandoned tasks of executions handed off: stale attempts, still running here.
        self._stale: set[asyncio.Task[None]] = set()
        self._starting = 0
        #: Starts refused because the store did not answer, by id, oldest first: the store
        #: may have recorded them (see `adopt`).
        #: An OrderedDict: dropping the oldest is O(1) (see RedisStore._recent_ends).
        self._unanswered: OrderedDict[str, tuple[Execution, Reasoner, dict[str, Any]]] = (
            OrderedDict()
        )
        self._drain = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._executor: ThreadPoolExecutor | None = None
        #: Executions of `def` reasoners, whose threads cannot be cancelled, while they run.
        self._in_threads: set[str] = set()
        #: Seconds recording one end takes (a moving average over the ends so far).
        self._end_seconds = 10e-6
        #: The time limits of attempts that have one (`timeout=`), by execution id.
        self._clocks: dict[str, AttemptClock] = {}
        #: Executions whose record vanished from the store: their tasks end `lost`.
        self._vanished: set[str] = set()
        #: Session policy rollback: forgetting interrupted records once they end.
        self._forgetting: set[asyncio.Task[None]] = set()

    # -- admission -------------------------------------------------------------------------

    @property
    def draining(self) -> bool:
        return self._drain.is_set()

    @property
    def inflight(self) -> int:
        return len(self._running)

    @property
    def abandoned_pending(self) -> int:
        """Abandoned tasks that have still not ended (stale attempts included)."""
        return len(self._abandoned)

    @property
    def stale_pending(self) -> int:
        """Tasks of executions handed off that did not settle: their attempt is stale."""
        return len(self._stale)

    async def start(
        self, reasoner: Reasoner, arguments: dict[str, Any], session_id: str | None = None
    ) -> Execution:
        """Admit, record and start one execution, or raise AdmissionError."""
        execution, _ = await self.start_once(reasoner, arguments, session_id)
        return execution

    async def start_once(
        self,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        session_id: str | None = None,
        *,
        body: Any = None,
        idempotency: Idempotency | None = None,
        webhook_url: str | None = None,
        delay: float | None = None,
        may_queue: bool = False,
        concurrency_key: str | None = None,
        session_policy: SessionPolicy = SessionPolicy.PARALLEL,
        announce: Callable[[Execution], object] | None = None,
    ) -> tuple[Execution, bool]:
        """Admit, record and start one execution (its webhooks to `webhook_url`); or, for a
        repeated idempotency key, the execution it started first. True when this call
        started it. `announce` is given the execution before its record is written (a
        caller answered before the store is, at shutdown, is sent to it).

        With `delay` (seconds) it is queued, due then, whatever the capacity now; with
        `may_queue` (an async start) and `queue_when_full`, one past capacity is queued,
        due at once. Either way a replica with room takes it (QueueTaker), and past
        `max_queued` it is refused for capacity (429). A reasoner with a concurrency limit
        is always queued, under its `concurrency_key` value: the store's claim decides,
        atomically across replicas, when a slot of that value is free."""
        reason = self._refusal()
        by_session = session_id is not None and session_policy is not SessionPolicy.PARALLEL
        limited = reasoner.max_concurrency is not None
        queue = (delay is not None and delay > 0) or limited or by_session
        if reason is RejectReason.CAPACITY and (queue or (may_queue and self.queue_when_full)):
            queue, reason = True, None
        if reason is not None:
            self._reject(reason)
        execution = Execution(reasoner.name, session_id, self.store.replica_id)
        execution.webhook_url = webhook_url
        if reasoner.resumable:
            execution.resumable = True
            execution.max_attempts = reasoner.max_attempts
        if reasoner.resumable or reasoner.retry is not None or queue:
            execution.body = body  # a later attempt, or this one elsewhere, binds it again
        if self.tracing.enabled:  # the request's span: every attempt joins its trace
            execution.trace = self.tracing.start_context()
        # A start may wait for two things, each decided by the store's claim: its session's
        # turn (a gated policy: after every earlier execution of the session ended), then a
        # slot of its reasoner's limit. A request's policy never lifts the limit.
        if by_session:
            execution.session_policy = session_policy.value
        if limited:
            execution.concurrency_key = limit_key(reasoner.name, concurrency_key or "")
            execution.concurrency_limit = reasoner.max_concurrency or 1
        if queue:
            execution.enqueue(time.time() + delay if delay else None)
        else:
            self._starting += 1  # counts against capacity while its record is written
        if announce is not None:
            announce(execution)
        try:
            earlier = await self.store.create(
                execution, idempotency, max_queued=self.max_queued if queue else 0
            )
        except QueueFull:
            self._reject(RejectReason.CAPACITY)
        except SessionReleasing:
            self._reject(RejectReason.SESSION_RELEASED)
        except StoreUnavailable as exc:
            # The store may have recorded it all the same (its answer was lost): if so it
            # asks, through `adopt`, for it to run here after all, or queues it with its
            # body for any replica to run.
            execution.body = body
            self._unanswered[execution.execution_id] = (execution, reasoner, arguments)
            while len(self._unanswered) > UNANSWERED_LIMIT:
                self._unanswered.popitem(last=False)
            in_doubt = exc.execution_id if isinstance(exc, StoreInDoubt) else None
            self._reject(RejectReason.STORE_UNAVAILABLE, in_doubt)
        finally:
            if not queue:
                self._starting -= 1
        if earlier is not None:
            return earlier, False
        if queue:
            if self.observer is not None:
                self.observer.execution_queued(execution, 1, None)
            if execution.displaced:
                await self._interrupt(execution)
            return execution, True
        self._launch(execution, reasoner, arguments)
        return execution, True

    async def _interrupt(self, execution: Execution) -> None:
        """Session policy interrupt or rollback: cancel the session's earlier executions
        (`interrupted`), wherever they run; the new one starts once they ended (the store
        made them hold its slot). With rollback their records are forgotten once ended."""
        for execution_id in execution.displaced:
            try:
                other = await self.store.get(execution_id)
                if other is not None and not other.is_terminal:
                    # Bounded: what has not settled by the cancel timeout is abandoned
                    # (counted), its slot freed, and the new one starts.
                    await self.store.request_cancel(
                        other, CancelReason.INTERRUPTED, self.cancel_timeout
                    )
            except StoreUnavailable as exc:  # it was accepted: it starts once they end
                logger.warning("could not interrupt execution %s: %s", execution_id, exc)
        if execution.session_policy == SessionPolicy.ROLLBACK.value:
            for execution_id in execution.displaced:
                task = asyncio.get_running_loop().create_task(self._forget_when_ended(execution_id))
                self._forgetting.add(task)
                task.add_done_callback(self._forgetting.discard)

    async def _forget_when_ended(self, execution_id: str) -> None:
        """Rollback: forget an interrupted execution once it ended (bounded)."""
        try:
            other = await self.store.get(execution_id)
            if other is None:
                return
            ended = await self.store.wait(other, ROLLBACK_WAIT)
            if ended.is_terminal:
                await self.store.forget(execution_id)
            else:
                logger.warning("rollback: execution %s did not end; kept", execution_id)
        except Exception as exc:  # a store outage: the record stays, said once
            logger.warning("rollback: execution %s not forgotten: %s", execution_id, exc)

    def _unqueued(self, execution: Execution, waited: float | None) -> None:
        """The store took a queued execution for this replica (`waited` seconds past its
        due time) or cancelled one (None)."""
        if self.observer is not None:
            self.observer.execution_queued(execution, -1, waited)

    def cancel_queued(self) -> int:
        """At shutdown: what a store in this process still queues has nowhere to go and
        ends cancelled (`shutdown`); a shared store keeps its queue for other replicas."""
        cancelled = self.store.cancel_all_queued(CancelReason.SHUTDOWN)
        for execution in cancelled:
            self._unqueued(execution, None)
        if cancelled:
            logger.info("shutdown: %d queued executions cancelled", len(cancelled))
        return len(cancelled)

    def runs(self, execution_id: str) -> bool:
        """Whether a task of this process runs the execution."""
        return execution_id in self._running

    def adopt(self, execution_id: str) -> bool:
        """Run an execution whose start was refused for want of an answer from the store,
        which recorded it after all (a client retrying with its key is told it runs).
        False when this process no longer knows it, or no longer admits work."""
        unanswered = self._unanswered.pop(execution_id, None)
        if unanswered is None or not self.admitting:
            return False
        execution, reasoner, arguments = unanswered
        self._launch(execution, reasoner, arguments)
        return True

    def owned_ids(self) -> list[str]:
        """The executions whose attempt this process runs, owned in the store (running or
        waiting for input in their task; not abandoned, not handed off)."""
        return [
            key
            for key, task in self._running.items()
            if (execution := self._executions.get(task)) is not None
            and execution.status in OWNED
            and task not in self._abandoned
        ]

    def vanish(self, execution_id: str) -> bool:
        """The store lost the record of an execution this process runs (Redis lost its
        data): nobody can answer, cancel or read it any more, so its task is cancelled and
        it ends `lost` here (counted, logged; its end is refused by the store), freeing
        its slot. False when it does not run here (any more)."""
        task = self._running.get(execution_id)
        execution = None if task is None else self._executions.get(task)
        if task is None or execution is None or execution.status not in OWNED:
            return False
        self._vanished.add(execution_id)
        return self.cancel(execution_id, CancelReason.REQUEST)

    def resume(self, reasoner: Reasoner, arguments: dict[str, Any], execution: Execution) -> None:
        """Run the next attempt of an execution this replica has claimed from the queue."""
        self._launch(execution, reasoner, arguments)

    def refuse_claimed(self, execution: Execution, exc: BaseException) -> None:
        """End `failed` an execution claimed from the queue that this replica cannot run
        (its reasoner is gone or not resumable here, or its body no longer binds): counted
        and recorded like any other end, rather than circulating."""
        logger.error(
            "cannot resume execution %s: %s",
            execution.execution_id,
            exc,
            extra={"fields": execution_fields(execution)},
        )
        if self.observer is not None:
            self.observer.execution_started(execution)
        self._record(execution, ExecutionStatus.FAILED, error=error_of(exc))

    def _emitted(self, execution: Execution, event: Event) -> None:
        self.store.emit(execution, event)
        if self.observer is not None:
            self.observer.event_emitted(execution)
        if self.tracing.enabled:
            self.tracing.emitted(execution, event)

    # -- input (ctx.ask: the registry is its InputChannel) ----------------------------------

    async def record_ask(
        self, execution: Execution, question: Question, timeout: float | None
    ) -> Reply:
        """A resumable execution is parked where the store can queue it (section 13): its
        task ends, and no drain waits for a person."""
        park = execution.resumable and self.store.supports_handoff
        return await self.store.ask(execution, question, park, timeout)

    async def await_answer(
        self,
        execution: Execution,
        request_id: int,
        waiter: asyncio.Future[Any],
        timeout: float | None,
    ) -> Any:
        """The answer handed to `waiter`; TimeoutError after `timeout` seconds. With a shared
        store the answer comes by pub/sub, and a notice may be missed (a reconnect): every
        ANSWER_RECHECK seconds the record is looked at for an answer taken."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        shared = self.store.shared
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError
            pause = left if not shared else min(left or ANSWER_RECHECK, ANSWER_RECHECK)
            await asyncio.wait({waiter}, timeout=pause)
            if waiter.done():
                return waiter.result()
            if shared and (deadline is None or loop.time() < deadline):
                answered, value = await self.store.poll_answer(execution, request_id)
                if answered:
                    execution.take_answer(request_id, value)
                    return value

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self.store.expire_ask(execution, request_id)

    def ask_ended(self, execution: Execution, asked: bool, seconds: float) -> None:
        clock = self._clocks.get(execution.execution_id)
        if clock is not None:
            clock.pause() if asked else clock.run()
        if self.observer is not None:
            self.observer.input_waiting(execution, asked, seconds)

    def answer(self, execution_id: str, request_id: int | None, value: Any) -> bool:
        """Hand an answer the store took to the `ctx.ask` waiting here; False when none
        waits for it (it ended meanwhile)."""
        task = self._running.get(execution_id)
        execution = None if task is None else self._executions.get(task)
        return execution is not None and execution.take_answer(request_id, value)

    @property
    def can_take(self) -> bool:
        """Whether queued work may be claimed now: admitting, with capacity to spare."""
        return self.admitting and self._refusal() is None

    def _launch(self, execution: Execution, reasoner: Reasoner, arguments: dict[str, Any]) -> None:
        context = None
        if reasoner.wants_context:  # only for a reasoner that asks for one: it may emit
            execution.event_log(self.max_events)
            context = ExecutionContext(
                execution,
                self._drain,
                self.store.checkpoint if reasoner.resumable else None,
                self.max_checkpoint_size,
                self._emitted,
                self,
            )
        run = self._run(execution, reasoner, arguments, context)
        if self.tracing.enabled:
            run = self.tracing.attempt(execution, run)
        task = asyncio.get_running_loop().create_task(
            run, name=f"execution-{execution.execution_id}"
        )
        self._running[execution.execution_id] = task
        self._executions[task] = execution
        if reasoner.timeout is not None:
            self._clocks[execution.execution_id] = AttemptClock(task, reasoner.timeout)
        self._idle.clear()
        task.add_done_callback(self._on_task_done)
        self.stats.started += 1
        if self.observer is not None:
            self.observer.execution_started(execution)

    def _refusal(self) -> RejectReason | None:
        if not self.admitting:
            return RejectReason.DRAINING
        if len(self._running) + self._starting >= self.max_inflight:
            return RejectReason.CAPACITY
        return None

    def _reject(self, reason: RejectReason, in_doubt: str | None = None) -> None:
        self.stats.rejected[reason.value] += 1
        if self.observer is not None:
            self.observer.execution_rejected(reason)
        raise AdmissionError(reason, in_doubt)

    def running(self, execution_id: str) -> Execution | None:
        """The live execution when this process runs it."""
        task = self._running.get(execution_id)
        return None if task is None else self._executions.get(task)

    # -- cancellation, settling, abandonment -------------------------------------------------

    def cancel(
        self, execution_id: str, reason: CancelReason, settle_within: float | None = None
    ) -> bool:
        """Cancel one execution this process runs; the first reason given is the one
        recorded. With `settle_within`, it is abandoned if it has not ended by then.
        False when it does not run here (any more)."""
        task = self._running.get(execution_id)
        if task is None:
            return False
        execution = self._executions[task]
        if execution.is_terminal:
            return False
        if execution.cancel_reason is None:
            execution.cancel_reason = reason
        task.cancel()
        if settle_within is not None:
            asyncio.get_running_loop().call_later(settle_within, self._abandon_late, task)
        return True

    def cancel_all(self, reason: CancelReason) -> list[asyncio.Task[None]]:
        """Cancel every running execution; returns their tasks for `settle`. At shutdown
        with a store that can hand off, resumable executions are handed off once settled
        (or abandoned) instead of ending cancelled."""
        hand_off = reason is CancelReason.SHUTDOWN and self.store.supports_handoff
        tasks: list[asyncio.Task[None]] = []
        for key, task in list(self._running.items()):
            execution = self._executions[task]
            if hand_off and execution.resumable and not execution.is_terminal:
                self._handing_off.add(key)
            if self.cancel(key, reason):
                tasks.append(task)
        return tasks

    async def settle(
        self, tasks: Collection[asyncio.Task[None]], deadline: float | None
    ) -> list[Execution]:
        """Wait for `tasks` until `deadline` (monotonic; None waits without bound).

        What has not ended by then is abandoned and returned, the abandoning done by the
        deadline too (the wait stops a little before it). Never waits past the deadline.
        """
        pending = {task for task in tasks if not task.done()}
        if pending and deadline is None:
            _, pending = await asyncio.wait(pending)
        # Abandoning is work too (each is recorded, counted and stored): the wait stops early
        # enough that abandoning what is still pending ends by the deadline, re-estimated as
        # tasks settle, and never by more than a quarter of the time there was to settle.
        window = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
        for _ in range(SETTLE_LOOKS):
            if not pending or deadline is None:
                break
            reserve = min(len(pending) * self._end_seconds * ABANDON_COST, window / 4)
            remaining = deadline - reserve - time.monotonic()
            if remaining <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=remaining)
        abandoned: list[Execution] = []
        for task in pending:
            if task.done():  # ended in the same loop iteration as the timeout
                continue
            execution = self._abandon(task, say=len(abandoned) < ABANDONED_LINES)
            if execution is not None:
                abandoned.append(execution)
        if len(abandoned) > ABANDONED_LINES:
            rest = abandoned[ABANDONED_LINES:]
            by_reasoner = Counter(execution.reasoner for execution in rest)
            logger.warning(
                "%d more executions abandoned: they did not settle after cancellation (%s); "
                "each is recorded cancelled and abandoned",
                len(rest),
                ", ".join(f"{name} {count}" for name, count in by_reasoner.most_common()),
                extra={
                    "fields": {  # the ids, for a JSON log (the drill reads them)
                        "abandoned_executions": [e.execution_id for e in rest],
                        "in_threads": [
                            e.execution_id for e in rest if e.execution_id in self._in_threads
                        ],
                    }
                },
            )
        return abandoned

    def abandon(self, execution_id: str) -> Execution | None:
        """Abandon now an execution this process runs, if it still does."""
        task = self._running.get(execution_id)
        return None if task is None else self._abandon(task)

    def _abandon_late(self, task: asyncio.Task[None]) -> None:
        if not task.done():
            self._abandon(task)

    def _abandon(self, task: asyncio.Task[None], *, say: bool = True) -> Execution | None:
        """Give up on a task that will not settle: record it, keep it referenced, observe it.
        An execution being handed off is handed off now; its task is a stale attempt.
        `say`: log its own line (a settle that abandons thousands logs the rest in one)."""
        execution = self._executions.get(task)
        if execution is None or execution.is_terminal:
            return None
        self._running.pop(execution.execution_id, None)
        self._abandoned[task] = execution
        if not self._running:
            self._idle.set()
        if execution.execution_id in self._handing_off:
            self._stale.add(task)
            self._hand_off(execution)
            return None
        execution.abandoned = True
        self._record(execution, ExecutionStatus.CANCELLED, reason=execution.cancel_reason)
        if not say:
            return execution
        in_thread = execution.execution_id in self._in_threads
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

    # -- the task --------------------------------------------------------------------------

    async def _run(
        self,
        execution: Execution,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        context: ExecutionContext | None,
    ) -> None:
        """Run the reasoner and record how it really ended; never raises."""
        # The task's own context names its execution, for every line logged in it (the
        # reasoner's own included): agent_server.runtime.logs.
        LOG_EXECUTION.set(execution)
        try:
            if reasoner.is_async:
                value = await reasoner.coroutine(arguments, context)
            else:
                value = await self._run_in_thread(execution, reasoner, arguments, context)
            result = reasoner.serialize(value)
        except Parked:
            self._parked(execution)
        except asyncio.CancelledError as exc:
            clock = self._clocks.get(execution.execution_id)
            if clock is not None and clock.expired and execution.cancel_reason is None:
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()  # its own limit: it ends here, failed, not cancelled
                timed_out = ExecutionTimeout(clock.timeout, execution.attempt)
                self._record_failure(execution, timed_out, reasoner)
            elif self._was_cancelled(execution) and execution.execution_id in self._handing_off:
                self._hand_off(execution)
            elif self._was_cancelled(execution):
                self._record_cancelled(execution)
            else:  # raised by the reasoner's own code: nobody asked for it
                self._record_failure(execution, exc, reasoner)
        except BaseException as exc:
            self._record_failure(execution, exc, reasoner)
        else:
            self._record(execution, ExecutionStatus.SUCCEEDED, result=result)

    def _was_cancelled(self, execution: Execution) -> bool:
        """Whether a cancellation was asked for, by this registry or by anyone else."""
        task = asyncio.current_task()
        return execution.cancel_reason is not None or (task is not None and task.cancelling() > 0)

    def _record_cancelled(self, execution: Execution) -> None:
        if execution.execution_id in self._vanished:
            self._vanished.discard(execution.execution_id)
            self._record(execution, ExecutionStatus.LOST, error=VANISHED)
            return
        reason = execution.cancel_reason
        if reason is None and self.draining:
            reason = CancelReason.SHUTDOWN
        if reason is None:  # cancelled from outside the registry: say so rather than nothing
            reason = CancelReason.REQUEST
        self._record(execution, ExecutionStatus.CANCELLED, reason=reason)

    def _record_failure(
        self, execution: Execution, exc: BaseException, reasoner: Reasoner | None = None
    ) -> None:
        policy = None if reasoner is None else reasoner.retry
        if (
            policy is not None
            and execution.status in OWNED
            and not isinstance(exc, AskMismatch)  # the next attempt would ask the same
            and policy.retries(exc, execution.attempt)
            and (self.admitting or self.store.shared)  # else nobody here would take it
        ):
            self._retry(execution, exc, policy.delay(execution.attempt))
            return
        if execution.is_terminal and execution.status is not ExecutionStatus.QUEUED:
            logger.warning(
                "abandoned execution %s (%s) ended later with %s: %s",
                execution.execution_id,
                execution.reasoner,
                type(exc).__name__,
                exception_text(exc),
                extra={"fields": execution_fields(execution)},
            )
            return
        error = error_of(exc)
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
        self._record(execution, ExecutionStatus.FAILED, error=error)

    async def _run_in_thread(
        self,
        execution: Execution,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        context: ExecutionContext | None,
    ) -> Any:
        """A thread cannot be interrupted: on cancellation keep waiting, so the record is
        honest; settle bounds the wait and abandons it if need be."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                THREAD_WORKERS, thread_name_prefix="reasoner", initializer=block_in_this_thread
            )
        loop = asyncio.get_running_loop()
        # In a copy of the task's context: the execution's log scope and span go along.
        call = functools.partial(contextvars.copy_context().run, reasoner.call, arguments, context)
        future = loop.run_in_executor(self._executor, call)
        key = execution.execution_id
        self._in_threads.add(key)
        try:
            while True:
                with contextlib.suppress(asyncio.CancelledError):
                    return await asyncio.shield(future)
        finally:
            self._in_threads.discard(key)

    def _record(
        self,
        execution: Execution,
        status: ExecutionStatus,
        *,
        result: Any = None,
        error: dict[str, str] | None = None,
        reason: CancelReason | None = None,
    ) -> None:
        if execution.status is ExecutionStatus.QUEUED:  # a stale attempt, handed off earlier
            logger.warning(
                "stale attempt %d of execution %s (%s) ended later: %s; its end is fenced",
                execution.attempt,
                execution.execution_id,
                execution.reasoner,
                status.value,
                extra={"fields": execution_fields(execution)},
            )
            execution.finish(status, result=result, error=error, reason=reason)
            self.store.end(execution)  # refused by the store: a newer attempt owns it
            return
        if execution.is_terminal:  # abandoned earlier; its record stays as it was reported
            logger.warning(
                "abandoned execution %s (%s) ended later: %s",
                execution.execution_id,
                execution.reasoner,
                status.value,
                extra={"fields": execution_fields(execution)},
            )
            return
        began = time.perf_counter()
        execution.finish(status, result=result, error=error, reason=reason)
        outcome = "abandoned" if execution.abandoned else str(status)  # str(): no enum lookup
        self.stats.outcomes[outcome] += 1
        if self.observer is not None:
            self.observer.execution_finished(execution, outcome)
        self.store.end(execution)
        # What recording an end costs here, as a moving average: what a settle reserves.
        self._end_seconds += (time.perf_counter() - began - self._end_seconds) / 64

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        """Observe the task's end exactly once and drop the strong reference."""
        execution = self._executions.pop(task)
        clock = self._clocks.get(execution.execution_id)
        if clock is not None and clock.task is task:
            clock.stop()
            del self._clocks[execution.execution_id]
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:  # _run never raises; anything here is a bug worth seeing
                logger.error("execution task %s raised", task.get_name(), exc_info=exc)
        elif execution.execution_id in self._handing_off:  # cancelled before its first step
            self._hand_off(execution)
        elif not execution.is_terminal:  # cancelled before its first step: _run never ran
            self._record_cancelled(execution)
        if self._running.get(execution.execution_id) is task:
            del self._running[execution.execution_id]
        self._abandoned.pop(task, None)
        self._vanished.discard(execution.execution_id)
        self._stale.discard(task)
        self._handing_off.discard(execution.execution_id)
        if not self._running:
            self._idle.set()

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
            return
        execution.mark_queued()
        self.stats.outcomes["handed_off"] += 1
        if self.observer is not None:
            self.observer.execution_finished(execution, "handed_off")
        self.store.hand_off(execution)
        logger.info(
            "execution %s (%s) handed off after attempt %d (status_reason: handoff)",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            extra={"fields": {**execution_fields(execution), "handed_off": True}},
        )

    def _parked(self, execution: Execution) -> None:
        """Parked by `ctx.ask`: the record waits in the store, owned by nobody; this attempt
        ends here without an end (its answer queues the next)."""
        self.stats.outcomes["parked"] += 1
        if self.observer is not None:
            self.observer.execution_finished(execution, "parked")
        logger.info(
            "execution %s (%s) parked after attempt %d: it waits for input with no task; "
            "its answer resumes it on any replica",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
        )

    def close(self) -> None:
        """Release the worker threads without waiting for abandoned ones; stop forgetting
        what a rollback interrupted (the records stay, visibly)."""
        for task in list(self._forgetting):
            task.cancel()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
