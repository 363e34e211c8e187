"""The memory store: records in this process's memory (one replica, nothing to run).

A restart forgets what clients had not collected; several replicas need the redis store.
Finished executions are kept until deleted, released with their session, or past
`result_ttl`, and at most `max_retained` of them (the oldest go first).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

from agent_server.model import jsoncodec
from agent_server.model.asks import MAX_ANSWER_BYTES, Found, Ledger, Question, Reply
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.model.scheduling import SESSION_GATED, is_session_key, session_key
from agent_server.store.base import (
    FINISHED_EVENT,
    INPUT_REQUIRED_EVENT,
    Delivery,
    ExecutionRunning,
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    ListCursor,
    Page,
    QueueFull,
    SessionReleasing,
    SessionTaken,
)
from agent_server.store.memory_index import Indexes
from agent_server.store.memory_webhooks import OwedWebhooks
from agent_server.store.schedule_memory import InProcessSchedules

#: Idempotency keys remembered at most (the oldest go first), whatever their TTL.
MAX_IDEMPOTENCY_KEYS = 100_000
#: Webhook deliveries owed at most (each holds its execution's JSON): past it the oldest is
#: dropped, with a WARNING naming it.
MAX_WEBHOOKS = 10_000


class MemoryStore(InProcessSchedules, ExecutionStore):
    """Every record is the live object the registry runs: reads cost a dict lookup.
    Schedules are kept in this process too (`InProcessSchedules`)."""

    def __init__(
        self,
        replica_id: str,
        *,
        result_ttl: float = 3600.0,
        max_retained: int = 10_000,
        max_retained_bytes: int = 256 * 1024 * 1024,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.replica_id = replica_id
        self.max_answer_bytes = max_answer_bytes
        self.result_ttl = result_ttl
        self.max_retained = max_retained
        self.max_retained_bytes = max_retained_bytes
        self._executions: dict[str, Execution] = {}
        #: Finished ids, oldest first, with the bytes of their result and error as JSON.
        self._finished: OrderedDict[str, int] = OrderedDict()
        self._finished_bytes = 0
        self._index = Indexes()
        self._releasing: set[str] = set()
        #: key -> (fingerprint, execution id, monotonic expiry), oldest first.
        self._keys: OrderedDict[str, tuple[str, str, float]] = OrderedDict()
        #: Webhook deliveries owed (at most MAX_WEBHOOKS).
        self._webhooks = OwedWebhooks()
        #: The queue: (due, monotonic; arrival number, id), soonest first. An entry whose
        #: execution is no longer queued (cancelled) is skipped when it comes up.
        self._queue: list[tuple[float, int, str]] = []
        self._arrivals = itertools.count()
        #: Ids queued now (what --max-queued bounds).
        self._queued: set[str] = set()
        self._queued_notice: asyncio.Event | None = None
        #: Concurrency keys: each value's queue (first in, first out), the ids holding its
        #: slots, and when it last got one (keys least recently served are tried first).
        self._keyed: dict[str, deque[str]] = {}
        self._holders: dict[str, set[str]] = {}
        self._served: dict[str, float] = {}
        #: Ids in a session's queue that are due (a delayed one keeps its place, not due).
        self._due: set[str] = set()

    async def open(self) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to disconnect from."""

    async def create(
        self,
        execution: Execution,
        idempotency: Idempotency | None = None,
        max_queued: int = 0,
    ) -> Execution | None:
        session_id = execution.session_name  # its tenant's (names.py `scoped`)
        if session_id is not None and session_id in self._releasing:
            raise SessionReleasing(execution.session_id)
        queued = execution.status is ExecutionStatus.QUEUED
        key = None if idempotency is None else scoped(execution.tenant, idempotency.key)
        if idempotency is not None and key is not None:
            earlier = self._first_use(idempotency, key)
            if earlier is not None:
                return earlier
        others: list[Execution] = []
        if execution.session_policy is not None and session_id is not None:
            ids = self._index.sessions.get(session_id, ())
            others = [e for e in map(self._executions.__getitem__, ids) if not e.is_terminal]
            others.sort(key=lambda e: e.created_at)
            if others and execution.session_policy == "reject":
                raise SessionTaken(others[-1].execution_id)
        if queued and len(self._queued) >= max_queued:
            raise QueueFull(max_queued)
        if idempotency is not None and key is not None:
            self._keys[key] = (
                idempotency.fingerprint,
                execution.execution_id,
                time.monotonic() + idempotency.ttl,
            )
            while len(self._keys) > MAX_IDEMPOTENCY_KEYS:
                self._keys.popitem(last=False)
        self._index.add(execution)
        self._executions[execution.execution_id] = execution
        turn = _session_gate(execution)
        if turn is not None:
            # Its turn comes once every earlier execution of the session ended: the gated
            # ones are ahead in the session's queue (or hold its slot), the others hold it.
            holders = self._holders.setdefault(turn, set())
            holders.update(e.execution_id for e in others if _session_gate(e) != turn)
            if execution.session_policy in ("interrupt", "rollback"):
                execution.displaced = tuple(e.execution_id for e in others)
        if queued:
            scheduled = execution.scheduled_at
            self._queued.add(execution.execution_id)
            if turn is not None:  # its place in the session's order is kept from now
                self._wait_in(turn, execution.execution_id)
            if scheduled is not None:
                self._push(execution, scheduled - time.time())
            elif turn is not None:
                self._due.add(execution.execution_id)
            elif execution.concurrency_key is not None:
                self._wait_in(execution.concurrency_key, execution.execution_id)
            else:
                self._push(execution, 0.0)
        return None

    def _wait_in(self, key: str, execution_id: str) -> None:
        """It joins the tail of the key's queue."""
        self._keyed.setdefault(key, deque()).append(execution_id)
        self._served.setdefault(key, 0.0)
        self._notice().set()

    def _gate(self, execution: Execution) -> str | None:
        """The first key whose slot it does not hold yet: its session's turn, then its
        limit; None when it may run."""
        for key in (_session_gate(execution), execution.concurrency_key):
            if key is not None and execution.execution_id not in self._holders.get(key, ()):
                return key
        return None

    # -- the queue -------------------------------------------------------------------------

    def _push(self, execution: Execution, delay: float) -> None:
        """Queue it, due in `delay` seconds, after what is due before."""
        due = time.monotonic() + max(0.0, delay)
        heapq.heappush(self._queue, (due, next(self._arrivals), execution.execution_id))
        self._queued.add(execution.execution_id)
        self._notice().set()

    def _notice(self) -> asyncio.Event:
        if self._queued_notice is None:
            self._queued_notice = asyncio.Event()
        return self._queued_notice

    @property
    def queued_count(self) -> int:
        return len(self._queued)

    def retry(self, execution: Execution, delay: float) -> None:
        self._push(execution, delay)

    async def claim(self) -> Execution | None:
        """The execution due first, if it is due: this process runs it (the same object).
        One that waits for a key (its session's turn, a slot of its limit) waits in that
        key's queue; every key with waiting work is tried, least recently served first."""
        now = time.monotonic()
        while self._queue and self._queue[0][0] <= now:
            due, _, execution_id = heapq.heappop(self._queue)
            execution = self._executions.get(execution_id)
            if execution is None or execution.status is not ExecutionStatus.QUEUED:
                continue
            gate = self._gate(execution)
            if gate is None:
                return self._take(execution, now - due)
            if gate == _session_gate(execution):
                self._due.add(execution_id)  # it waits in its session's queue already
            else:
                self._wait_in(gate, execution_id)
        for key in sorted(self._keyed, key=self._served.__getitem__):
            claimed = self._claim_key(key, now)
            if claimed is not None:
                return claimed
        return None

    def _claim_key(self, key: str, now: float) -> Execution | None:
        """The oldest of the key's queue, once a slot of the key is free; it goes on to its
        next key, or runs. A slot is held until its holder's execution ended (a retry
        between attempts keeps it)."""
        waiting = self._keyed[key]
        holders = self._holders.setdefault(key, set())
        for holder in list(holders):
            found = self._executions.get(holder)
            if found is None or found.is_terminal:
                holders.discard(holder)
        turn = is_session_key(key)
        while waiting:
            execution = self._executions.get(waiting[0])
            if execution is None or execution.status is not ExecutionStatus.QUEUED:
                waiting.popleft()
                continue
            if len(holders) >= (1 if turn else execution.concurrency_limit):
                break
            if turn and execution.execution_id not in self._due:
                break  # the session's next one waits for its time: so does the session
            waiting.popleft()
            holders.add(execution.execution_id)
            self._due.discard(execution.execution_id)
            self._served[key] = now
            gate = self._gate(execution)
            if gate is not None:
                self._wait_in(gate, execution.execution_id)  # its turn came: now its limit
                continue
            if not waiting:
                self._forget_key(key)
            waited = time.time() - execution.created_at if execution.attempt == 1 else None
            return self._take(execution, waited)
        if not waiting:
            self._forget_key(key)
        return None

    def _forget_key(self, key: str) -> None:
        """Nothing waits for the key: its queue and turn go (its holders stay counted)."""
        self._keyed.pop(key, None)
        self._served.pop(key, None)
        if not self._holders.get(key):
            self._holders.pop(key, None)

    def _take(self, execution: Execution, waited: float | None) -> Execution:
        self._queued.discard(execution.execution_id)
        execution.claim(self.replica_id)
        if self.on_unqueued is not None:
            self.on_unqueued(execution, waited)
        return execution

    def due_in(self) -> float | None:
        if not self._queue:
            return None
        return max(0.0, self._queue[0][0] - time.monotonic())

    async def wait_queued(self, timeout: float) -> None:
        notice = self._notice()
        try:
            async with asyncio.timeout(timeout):
                await notice.wait()
        except TimeoutError:
            pass
        notice.clear()

    def cancel_all_queued(self, reason: CancelReason) -> list[Execution]:
        """At shutdown: what is still queued has nowhere to go; it ends cancelled."""
        cancelled = []
        for execution_id in list(self._queued):
            execution = self._executions.get(execution_id)
            if execution is not None and execution.status is ExecutionStatus.QUEUED:
                self._cancel_queued(execution, reason)
                cancelled.append(execution)
        self._queue.clear()
        return cancelled

    def _cancel_queued(self, execution: Execution, reason: CancelReason) -> None:
        self._queued.discard(execution.execution_id)
        execution.cancel_queued(reason)
        self.end(execution)

    def _first_use(self, idempotency: Idempotency, key: str) -> Execution | None:
        """The execution the key (its tenant's: `key`) was first used for, if still known."""
        now = time.monotonic()
        while self._keys:  # expired keys leave, oldest first
            oldest = next(iter(self._keys.values()))
            if oldest[2] > now:
                break
            self._keys.popitem(last=False)
        found = self._keys.get(key)
        if found is None:
            return None
        fingerprint, execution_id, _ = found
        if fingerprint != idempotency.fingerprint:
            raise IdempotencyMismatch(idempotency.key)
        earlier = self._executions.get(execution_id)
        if earlier is None:
            raise IdempotencyForgotten(idempotency.key)
        return earlier

    async def checkpoint(self, execution: Execution, state: str) -> None:
        """One process, one attempt: nothing can own it but the caller."""
        execution.checkpoint = state
        execution.checkpoint_version = execution.version

    def end(self, execution: Execution) -> None:
        execution.ledger = None  # no answer outlives its execution
        if execution.webhook_url is not None:
            self._owe_webhook(execution, f"{execution.execution_id}.finished", FINISHED_EVENT)
        keys = [execution.concurrency_key]
        if execution.session_id is not None:  # any execution of a session may hold its turn
            keys.append(session_key(execution.session_id, execution.tenant))
        for key in keys:
            holders = None if key is None else self._holders.get(key)
            if key is not None and holders is not None:
                holders.discard(execution.execution_id)
                if not holders and key not in self._keyed:
                    del self._holders[key]
        self._due.discard(execution.execution_id)
        if self._keyed:
            self._notice().set()  # a slot may be free (its key's, or a session's): look
        # What it keeps of its own counts against max_retained_bytes: input, result, error.
        size = len(jsoncodec.dumps(execution.result))
        if execution.error is not None:
            size += len(jsoncodec.dumps(execution.error))
        if execution.body is not None:
            size += len(jsoncodec.dumps(execution.body))
        self._finished[execution.execution_id] = size
        self._finished_bytes += size
        self._expire()

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        """Nowhere to park: the live object is the record, and its ledger keeps the
        requests (a retried attempt's asks find their answers, matched by identity); a
        webhook may be owed."""
        if execution.ledger is None:
            execution.ledger = Ledger()
        found = execution.ledger.find(question)
        if found is not None:
            return found
        request = question.request
        if execution.webhook_url is not None:
            data = execution.to_json()
            data["status"] = ExecutionStatus.INPUT_REQUIRED.value  # what it is about to read
            data["input_request"] = request
            delivery_id = f"{execution.execution_id}.input.{execution.attempt}"
            self._owe_webhook(
                execution,
                f"{delivery_id}.{request['request_id']}",
                INPUT_REQUIRED_EVENT,
                data,
            )
        return Reply(Found.WAIT, question.request_id)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """Closed unanswered: a retried attempt that asks it again times out at once."""
        if execution.ledger is not None:
            execution.ledger.expire(request_id)
        return False, None

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """Handed to the waiting `ctx.ask`, and kept in its ledger (bounded in bytes) for
        a retried attempt's replay, and for a retry of the same answer (taken again)."""
        pending = execution.input_request or {}
        number = pending.get("request_id") if request_id is None else request_id
        taken = await super().answer(execution, request_id, value)
        if taken is not None and execution.ledger is not None and isinstance(number, int):
            size = len(jsoncodec.dumps(value))
            execution.ledger.keep(number, value, size, self.max_answer_bytes)
        elif taken is None and execution.ledger is not None and isinstance(number, int):
            entry = execution.ledger.entries.get(number)
            # A retry of the answer taken (its reply lost): the same JSON data is taken
            # again, handed to nobody; another value stays refused (as answer.lua).
            if (
                entry is not None
                and entry.answered
                and jsoncodec.canonical(entry.value) == jsoncodec.canonical(value)
            ):
                return await self.get(execution.execution_id)
        return taken

    # -- webhook deliveries, in this process -----------------------------------------------

    def _owe_webhook(
        self,
        execution: Execution,
        delivery_id: str,
        kind: str,
        data: dict[str, Any] | None = None,
    ) -> None:
        assert execution.webhook_url is not None
        delivery = Delivery(
            delivery_id,
            kind,
            execution.webhook_url,
            time.time(),
            0.0,
            0,
            execution.to_json() if data is None else data,
            execution.trace,
            execution.attempt,
        )
        self._webhooks.owe(delivery, MAX_WEBHOOKS)
        if self.on_webhook is not None:
            self.on_webhook()

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        return self._webhooks.claim(limit, lease, due_only)

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        return self._webhooks.settle(delivery, retry_in)

    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        self._expire()
        execution = self._executions.get(execution_id)
        if execution is None or (tenant is not None and execution.tenant != tenant):
            return None
        return execution

    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        await execution.wait(timeout, asked)
        return execution

    async def page(
        self,
        *,
        statuses: frozenset[ExecutionStatus] = frozenset(),
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
        after: ListCursor | None = None,
        tenant: str | None = None,
        every_tenant: bool = False,
        owner: str | None = None,
        schedule_id: str | None = None,
        bare: bool = False,
    ) -> Page:
        """A cursor is the creation time and id of the last execution looked at: the next
        page starts past that id, or past that time when the id is gone meanwhile. A
        tenant's list walks that tenant's records only (its session's are its own too)."""
        self._expire()
        only = None if every_tenant else tenant
        if session_id is not None:
            keys: Iterable[str] = sorted(
                self._index.sessions.get(scoped(tenant, session_id), ()),
                key=lambda k: self._executions[k].created_at,
                reverse=True,
            )
        elif only is not None:
            keys = reversed(self._index.tenants.get(only, {}))
        else:
            keys = reversed(self._executions)
        since = None if after is None else (after.created_at, after.execution_id)
        found: list[Execution] = []
        cursors: list[str] = []
        last: str | None = None
        for key in keys:
            execution = self._executions[key]
            if since is not None:
                if key == since[1]:
                    since = None  # the next one is past it
                    continue
                if execution.created_at >= since[0]:
                    continue
                since = None
            if len(found) >= limit:
                return Page(found, cursors, last)
            last = f"{execution.created_at!r}:{key}"
            if statuses and execution.status not in statuses:
                continue
            if reasoner is not None and execution.reasoner != reasoner:
                continue
            if owner is not None and execution.owner != owner:
                continue
            if schedule_id is not None and execution.schedule_id != schedule_id:
                continue
            found.append(execution)
            cursors.append(last)
        return Page(found, cursors, None)

    async def forget(self, execution_id: str) -> bool:
        execution = self._executions.get(execution_id)
        if execution is None:
            return False
        if not execution.is_terminal:
            raise ExecutionRunning(execution_id, execution.status.value)
        self._forget(execution_id)
        return True

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        if execution.status is ExecutionStatus.QUEUED:  # nobody runs it: it ends here
            self._cancel_queued(execution, reason)
            if self.on_unqueued is not None:
                self.on_unqueued(execution, None)
            return
        if self.on_cancel is not None:
            self.on_cancel(execution.execution_id, reason, settle_within)

    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        keys = self._index.sessions.get(scoped(tenant, session_id), ())
        return [self._executions[key] for key in keys]

    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        """One process: concurrent releases already share one (agent_server.runtime.sessions)."""
        self._releasing.add(scoped(tenant, session_id))
        return None

    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        self._releasing.discard(scoped(tenant, session_id))

    # -- retention -------------------------------------------------------------------------

    def _expire(self) -> None:
        """Forget the oldest finished executions past the TTL, over `max_retained`, or over
        `max_retained_bytes` (the newest always stays: a result larger than the budget is
        still read once)."""
        if not self._finished:
            return
        cutoff = time.monotonic() - self.result_ttl
        while self._finished:
            key = next(iter(self._finished))
            finished = self._executions[key].finished_monotonic
            over = len(self._finished) > self.max_retained or (
                self._finished_bytes > self.max_retained_bytes and len(self._finished) > 1
            )
            if not over and finished is not None and finished > cutoff:
                break
            self._forget(key)

    def _forget(self, key: str) -> None:
        execution = self._executions.pop(key, None)
        self._finished_bytes -= self._finished.pop(key, 0)
        if execution is not None:
            self._index.drop(execution)


def _session_gate(execution: Execution) -> str | None:
    """The key of its session's turn, when its policy waits for one."""
    if execution.session_id is None or execution.session_policy not in SESSION_GATED:
        return None
    return session_key(execution.session_id, execution.tenant)
