"""InFlightRegistry: this process's executions, from admission to an observed end.

The registry is the admission gate (draining, capacity), the owner of every task this
process runs, and the one place that cancels, settles and abandons them with a deadline.
Records live in the store (`agent_server.store`), which may be shared with other replicas;
the registry writes each execution's start and end there. Session release and the shutdown
sequence both use `cancel` / `settle` / `abandon`, so they bound their waits the same way.

It is a narrow facade over its parts, one concern each: `admission` (starts, idempotency,
sessions and concurrency keys), `attempts` (one `Attempt` per running attempt and how each
ends: `attempt.classify`), `settle` (cancel, settle, abandon) and `inputs` (`ctx.ask`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

from agent_server.model.asks import Question, Reply
from agent_server.model.execution import CancelReason, Execution
from agent_server.model.reasoner import Reasoner
from agent_server.model.status import OWNED
from agent_server.runtime.admission import (
    ROLLBACK_WAIT,
    UNANSWERED_LIMIT,
    Admission,
    AdmissionError,
)
from agent_server.runtime.attempt import Attempt, AttemptClock, Ending, classify
from agent_server.runtime.attempts import THREAD_WORKERS, VANISHED, Attempts, Gate
from agent_server.runtime.inputs import ANSWER_RECHECK, InputWaits
from agent_server.runtime.observer import RegistryObserver, RegistryStats, RejectReason
from agent_server.runtime.settle import ABANDON_COST, ABANDONED_LINES, SETTLE_LOOKS, Settler
from agent_server.runtime.tracing import Tracing
from agent_server.store.base import ExecutionStore

__all__ = [
    "ABANDONED_LINES",
    "ABANDON_COST",
    "ANSWER_RECHECK",
    "ROLLBACK_WAIT",
    "SETTLE_LOOKS",
    "THREAD_WORKERS",
    "UNANSWERED_LIMIT",
    "VANISHED",
    "AdmissionError",
    "Attempt",
    "AttemptClock",
    "Ending",
    "InFlightRegistry",
    "RegistryObserver",
    "RegistryStats",
    "RejectReason",
    "classify",
]


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
        #: Traces (agent_server/runtime/tracing.py): off unless the OTEL_* variables ask for them.
        self.tracing = tracing if tracing is not None else Tracing()
        self.observer = observer
        self.stats = RegistryStats()
        self._gate = Gate()
        self._attempts = Attempts(
            store,
            self._gate,
            self.stats,
            observer,
            self.tracing,
            max_checkpoint_size=max_checkpoint_size,
            max_events=max_events,
        )
        self._inputs = InputWaits(store, self._attempts, observer)
        self._attempts.channel = self._inputs
        #: An async start past max_inflight is queued (202 queued) rather than refused (429),
        #: up to `max_queued` queued executions in all; a session policy's interruption
        #: settles within `cancel_timeout` seconds.
        self._admission = Admission(
            store,
            self._attempts,
            self._gate,
            self.stats,
            observer,
            self.tracing,
            max_inflight=max_inflight,
            queue_when_full=queue_when_full,
            max_queued=max_queued,
            cancel_timeout=cancel_timeout,
        )
        self._settler = Settler(store, self._attempts)
        self._emitted = self._attempts.emitted
        #: `Admission.start_once`: the execution, and True when this call started it (the
        #: admission's own method, not a forwarding layer: a coroutine less per start).
        self.start_once = self._admission.start_once

    # -- admission -------------------------------------------------------------------------

    @property
    def admitting(self) -> bool:
        return self._gate.admitting

    @property
    def draining(self) -> bool:
        return self._gate.draining

    @property
    def inflight(self) -> int:
        return len(self._attempts.live)

    @property
    def abandoned_pending(self) -> int:
        """Abandoned tasks that have still not ended (stale attempts included)."""
        return len(self._attempts.abandoned)

    @property
    def stale_pending(self) -> int:
        """Tasks of executions handed off that did not settle: their attempt is stale."""
        return self._attempts.stale_pending

    @property
    def can_take(self) -> bool:
        """Whether queued work may be claimed now: admitting, with capacity to spare."""
        return self._admission.can_take

    async def start(
        self, reasoner: Reasoner, arguments: dict[str, Any], session_id: str | None = None
    ) -> Execution:
        """Admit, record and start one execution, or raise AdmissionError."""
        execution, _ = await self.start_once(reasoner, arguments, session_id)
        return execution

    def cancel_queued(self) -> int:
        return self._admission.cancel_queued()

    def adopt(self, execution_id: str) -> bool:
        return self._admission.adopt(execution_id)

    # -- attempts --------------------------------------------------------------------------

    def runs(self, execution_id: str) -> bool:
        """Whether a task of this process runs the execution."""
        return execution_id in self._attempts.live

    def running(self, execution_id: str) -> Execution | None:
        """The live execution when this process runs it."""
        return self._attempts.running(execution_id)

    def owned_ids(self) -> list[str]:
        return self._attempts.owned_ids()

    def vanish(self, execution_id: str) -> bool:
        """The store lost the record of an execution this process runs (Redis lost its
        data): nobody can answer, cancel or read it any more, so its task is cancelled and
        it ends `lost` here (counted, logged; its end is refused by the store), freeing
        its slot. False when it does not run here (any more)."""
        attempt = self._attempts.live.get(execution_id)
        if attempt is None or attempt.execution.status not in OWNED:
            return False
        attempt.vanished = True
        return self.cancel(execution_id, CancelReason.REQUEST)

    def resume(self, reasoner: Reasoner, arguments: dict[str, Any], execution: Execution) -> None:
        """Run the next attempt of an execution this replica has claimed from the queue."""
        self._attempts.launch(execution, reasoner, arguments)

    def refuse_claimed(self, execution: Execution, exc: BaseException) -> None:
        """End `failed` an execution claimed from the queue that this replica cannot run
        (its reasoner is gone or not resumable here, or its body no longer binds): counted
        and recorded like any other end, rather than circulating."""
        self._attempts.refuse(execution, exc)

    # -- input (ctx.ask: the registry's InputChannel) --------------------------------------

    async def record_ask(
        self, execution: Execution, question: Question, timeout: float | None
    ) -> Reply:
        return await self._inputs.record_ask(execution, question, timeout)

    async def await_answer(
        self,
        execution: Execution,
        request_id: int,
        waiter: asyncio.Future[Any],
        timeout: float | None,
    ) -> Any:
        return await self._inputs.await_answer(execution, request_id, waiter, timeout)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self._inputs.expire_ask(execution, request_id)

    def ask_ended(self, execution: Execution, asked: bool, seconds: float) -> None:
        self._inputs.ask_ended(execution, asked, seconds)

    def answer(self, execution_id: str, request_id: int | None, value: Any) -> bool:
        return self._inputs.answer(execution_id, request_id, value)

    # -- cancellation, settling, abandonment -----------------------------------------------

    def cancel(
        self, execution_id: str, reason: CancelReason, settle_within: float | None = None
    ) -> bool:
        return self._settler.cancel(execution_id, reason, settle_within)

    def cancel_all(self, reason: CancelReason) -> list[asyncio.Task[None]]:
        return self._settler.cancel_all(reason)

    async def settle(
        self, tasks: Collection[asyncio.Task[None]], deadline: float | None
    ) -> list[Execution]:
        return await self._settler.settle(tasks, deadline)

    def abandon(self, execution_id: str) -> Execution | None:
        return self._settler.abandon(execution_id)

    async def wait_idle(self, deadline: float, interrupt: asyncio.Event | None = None) -> bool:
        return await self._settler.wait_idle(deadline, interrupt)

    async def wait_abandoned(self, deadline: float) -> None:
        await self._settler.wait_abandoned(deadline)

    # -- drain -----------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """From now on `ctx.draining` is true and `ctx.wait_for_drain()` returns."""
        self._gate.drain.set()

    def close_admission(self) -> None:
        self._gate.admitting = False
        self.store.withdraw()  # work waiting for this replica's version waits no more

    def close(self) -> None:
        """Release the worker threads without waiting for abandoned ones; stop forgetting
        what a rollback interrupted (the records stay, visibly)."""
        self._admission.close()
        self._attempts.close()
