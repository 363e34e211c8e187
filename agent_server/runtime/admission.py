"""Admission: which starts run now, which are queued, which are refused, and why.

The gate (draining, capacity), idempotent starts (the store answers a repeated key with
the execution it started first), session policies and concurrency keys (both queue a
start for the store's claim to decide), and starts the store did not answer (`adopt`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NoReturn

from agent_server.identity.principal import Principal
from agent_server.model.counts import counted
from agent_server.model.execution import CancelReason, Execution
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import SessionPolicy, limit_key
from agent_server.runtime.attempts import Attempts, Gate
from agent_server.runtime.observer import RegistryObserver, RegistryStats, RejectReason
from agent_server.runtime.tracing import Tracing
from agent_server.store.base import (
    ExecutionStore,
    Idempotency,
    QueueFull,
    SessionReleasing,
    StoreInDoubt,
    StoreUnavailable,
)

#: The registry's lines keep the logger name users know, whichever part writes them.
logger = logging.getLogger("agent_server.registry")

#: Starts kept after the store did not answer them, for `adopt` (the oldest go first).
UNANSWERED_LIMIT = 10_000
#: Seconds a rollback waits for an interrupted execution to end before it forgets it.
ROLLBACK_WAIT = 60.0


class AdmissionError(Exception):
    """New work was refused; the reason maps to 503, 429 or 409. `in_doubt` names the
    execution the store may have recorded after all (a replica may lack it): read it later."""

    def __init__(self, reason: RejectReason, in_doubt: str | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.in_doubt = in_doubt


class Admission:
    """Admits, records and launches starts; queues those that wait; refuses the rest."""

    def __init__(
        self,
        store: ExecutionStore,
        attempts: Attempts,
        gate: Gate,
        stats: RegistryStats,
        observer: RegistryObserver | None,
        tracing: Tracing,
        *,
        max_inflight: int,
        queue_when_full: bool,
        max_queued: int,
        cancel_timeout: float,
    ) -> None:
        self.store = store
        self.attempts = attempts
        self.gate = gate
        self.stats = stats
        self.observer = observer
        self.tracing = tracing
        self.max_inflight = max_inflight
        self.queue_when_full = queue_when_full
        self.max_queued = max_queued
        self.cancel_timeout = cancel_timeout
        store.on_unqueued = self.unqueued
        #: Starts counted against capacity while their record is written.
        self._starting = 0
        #: Starts refused because the store did not answer, by id, oldest first: the store
        #: may have recorded them (see `adopt`).
        #: An OrderedDict: dropping the oldest is O(1) (see RedisStore._recent_ends).
        self._unanswered: OrderedDict[str, tuple[Execution, Reasoner, dict[str, Any]]] = (
            OrderedDict()
        )
        #: Session policy rollback: forgetting interrupted records once they end.
        self._forgetting: set[asyncio.Task[None]] = set()

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
        principal: Principal | None = None,
    ) -> tuple[Execution, bool]:
        """Admit, record and start one execution (its webhooks to `webhook_url`); or, for a
        repeated idempotency key, the execution it started first. True when this call
        started it. `announce` is given the execution before its record is written (a
        caller answered before the store is, at shutdown, is sent to it). `principal`, the
        caller's, owns it: its identity and tenant are the record's `owner` and `tenant`.

        With `delay` (seconds) it is queued, due then, whatever the capacity now; with
        `may_queue` (an async start) and `queue_when_full`, one past capacity is queued,
        due at once. Either way a replica with room takes it (QueueTaker), and past
        `max_queued` it is refused for capacity (429). A reasoner with a concurrency limit
        is always queued, under its `concurrency_key` value: the store's claim decides,
        atomically across replicas, when a slot of that value is free."""
        reason = self.refusal()
        by_session = session_id is not None and session_policy is not SessionPolicy.PARALLEL
        limited = reasoner.max_concurrency is not None
        queue = (delay is not None and delay > 0) or limited or by_session
        if reason is RejectReason.CAPACITY and (queue or (may_queue and self.queue_when_full)):
            queue, reason = True, None
        if reason is not None:
            self.reject(reason)
        execution = self._new_execution(
            reasoner,
            session_id,
            principal,
            body=body,
            webhook_url=webhook_url,
            queue=queue,
            session_policy=session_policy if by_session else None,
            concurrency_key=concurrency_key,
        )
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
            self.reject(RejectReason.CAPACITY)
        except SessionReleasing:
            self.reject(RejectReason.SESSION_RELEASED)
        except StoreUnavailable as exc:
            self._unanswered_start(execution, reasoner, arguments, exc)
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
        self.attempts.launch(execution, reasoner, arguments)
        return execution, True

    def _unanswered_start(
        self,
        execution: Execution,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        exc: StoreUnavailable,
    ) -> NoReturn:
        """A start the store did not answer: refused, though the store may have recorded it
        all the same (its answer was lost); if so it asks, through `adopt`, for it to run
        here after all, or queues it with its body for any replica to run."""
        self._unanswered[execution.execution_id] = (execution, reasoner, arguments)
        while len(self._unanswered) > UNANSWERED_LIMIT:
            self._unanswered.popitem(last=False)
        in_doubt = exc.execution_id if isinstance(exc, StoreInDoubt) else None
        self.reject(RejectReason.STORE_UNAVAILABLE, in_doubt)

    def _new_execution(
        self,
        reasoner: Reasoner,
        session_id: str | None,
        principal: Principal | None,
        *,
        body: Any,
        webhook_url: str | None,
        queue: bool,
        session_policy: SessionPolicy | None,
        concurrency_key: str | None,
    ) -> Execution:
        """The record of a start, as it is written: its owner and tenant, webhooks, version,
        attempts, body, trace, and what it waits for (its session's turn under a gated
        `session_policy`, a slot of its reasoner's limit)."""
        execution = Execution(reasoner.name, session_id, self.store.replica_id)
        if principal is not None:  # its names are its tenant's from here on (names.py)
            execution.owner, execution.tenant = principal.identity, principal.tenant
            execution.principal = principal
        execution.webhook_url = webhook_url
        if not queue:  # it runs here now: this code's version (a claim writes its own)
            execution.version = reasoner.versions.version
        if reasoner.resumable:
            execution.resumable = True
            execution.max_attempts = reasoner.max_attempts
        # Kept with every record: a later attempt binds it again, and so does a first run
        # elsewhere (a start whose caller was cut while its create was on its way, put back
        # on the queue by the repair), and the console's Run again starts from it.
        execution.body = body
        if self.tracing.enabled:  # the request's span: every attempt joins its trace
            execution.trace = self.tracing.start_context()
        # A start may wait for two things, each decided by the store's claim: its session's
        # turn (a gated policy: after every earlier execution of the session ended), then a
        # slot of its reasoner's limit. A request's policy never lifts the limit.
        if session_policy is not None:
            execution.session_policy = session_policy.value
        if reasoner.max_concurrency is not None:
            # A value the request carries is its tenant's; a limit of the whole reasoner
            # (no concurrency_key) is everyone's.
            tenant = None if reasoner.concurrency_key is None else execution.tenant
            execution.concurrency_key = limit_key(reasoner.name, concurrency_key or "", tenant)
            execution.concurrency_limit = reasoner.max_concurrency or 1
        return execution

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

    def unqueued(self, execution: Execution, waited: float | None) -> None:
        """The store took a queued execution for this replica (`waited` seconds past its
        due time) or cancelled one (None)."""
        if self.observer is not None:
            self.observer.execution_queued(execution, -1, waited)

    def cancel_queued(self) -> int:
        """At shutdown: what a store in this process still queues has nowhere to go and
        ends cancelled (`shutdown`); a shared store keeps its queue for other replicas."""
        cancelled = self.store.cancel_all_queued(CancelReason.SHUTDOWN)
        for execution in cancelled:
            self.unqueued(execution, None)
        if cancelled:
            logger.info("shutdown: %s cancelled", counted(len(cancelled), "queued execution"))
        return len(cancelled)

    def adopt(self, execution_id: str) -> bool:
        """Run an execution whose start was refused for want of an answer from the store,
        which recorded it after all (a client retrying with its key is told it runs).
        False when this process no longer knows it, or no longer admits work."""
        unanswered = self._unanswered.pop(execution_id, None)
        if unanswered is None or not self.gate.admitting:
            return False
        execution, reasoner, arguments = unanswered
        self.attempts.launch(execution, reasoner, arguments)
        return True

    @property
    def can_take(self) -> bool:
        """Whether queued work may be claimed now: admitting, with capacity to spare."""
        return self.gate.admitting and self.refusal() is None

    def refusal(self) -> RejectReason | None:
        if not self.gate.admitting:
            return RejectReason.DRAINING
        if len(self.attempts.live) + self._starting >= self.max_inflight:
            return RejectReason.CAPACITY
        return None

    def reject(self, reason: RejectReason, in_doubt: str | None = None) -> NoReturn:
        self.stats.rejected[reason.value] += 1
        if self.observer is not None:
            self.observer.execution_rejected(reason)
        raise AdmissionError(reason, in_doubt)

    def close(self) -> None:
        """Stop forgetting what a rollback interrupted (the records stay, visibly)."""
        for task in list(self._forgetting):
            task.cancel()
