"""How a record begins and is taken: `create` (running here at once) and `enqueue`
(queued), each with its idempotency key, and `claim`, which takes the oldest queued one for
this replica; part of `RedisStore`."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import TENANT_SEPARATOR, scoped
from agent_server.model.versions import Rule
from agent_server.store.base import (
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    QueueFull,
    SessionReleasing,
    SessionTaken,
    StoreInDoubt,
    StoreUnavailable,
)
from agent_server.store.redis import codec
from agent_server.store.redis.part import StorePart
from agent_server.store.redis.scripts import Create, Row, Unclaimed

logger = logging.getLogger("agent_server.store")

#: Seconds after which keyed work waiting for a slot is looked at again without a notice.
BLOCKED_RELOOK = 5.0


class Starts(StorePart):
    """Creates and claims of `RedisStore`."""

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        """One script: refused while the session is released; with an idempotency key
        already used for the same request, the execution it started; else the record, its
        index entries, and the key (set if absent, atomically: one execution per key).
        A queued one is `enqueue.lua`'s.

        Each create is a take of its own (`execution.take`, a token written into the
        record): one whose answer is lost is settled, and voided if absent, as that take
        (settle.lua), so the same object sent again is refused, while a new request for
        the same id (a schedule's firing tried again: its id is the fire time's) is not."""
        # Its names are its tenant's (names.py `scoped`): the session's and the key's.
        session_id = execution.session_name or ""
        # In FIELDS order (the script names them), then the hash-only fields made with it.
        pairs = self._codec.new_record(execution)
        key = "" if idempotency is None else scoped(execution.tenant, idempotency.key)
        fingerprint = "" if idempotency is None else idempotency.fingerprint
        key_ttl = 1 if idempotency is None else max(1, round(idempotency.ttl * 1000))
        if execution.status is ExecutionStatus.QUEUED:
            return await self._enqueue(execution, key, fingerprint, key_ttl, max_queued, pairs)
        execution_id = execution.execution_id
        liveness = self._liveness
        # The take's token: this process took it (the repair's evidence that its body
        # began here or never did), by this create (what a settle voids).
        execution.take = execution.take or liveness.start_token()
        pairs.extend(("claim", execution.take))
        liveness.creating.add(execution_id)
        try:
            with self._link.operation("create"):
                reply, held = await self._link.told(
                    "create",
                    self.keys.script.for_create(
                        execution_id,
                        session_id,
                        execution.replica,
                        key,
                        execution.tenant or "",
                        execution.take,
                    ),
                    execution_id,
                    session_id,
                    repr(execution.created_at),
                    execution.replica,
                    key,
                    fingerprint,
                    key_ttl,
                    *pairs,
                )
        except (StoreUnavailable, asyncio.CancelledError):
            # Sent, perhaps: Redis may run it yet (a pause), or ran it as its caller was cut
            # (the listener's close at shutdown, a client gone). The repair settles it: run
            # here if the registry still has it, else queued for its first run elsewhere.
            liveness.doubt(execution, self._outbox.limit)
            raise
        finally:
            liveness.creating.discard(execution_id)
        code = Create(int(reply[0]))
        if code is Create.VOIDED:
            raise StoreUnavailable(f"the create of execution {execution_id} was given up")
        if code is Create.LEASE_LAPSED:
            liveness.renew_now.set()
            raise StoreUnavailable(f"replica {execution.replica}'s lease lapsed: renewing first")
        existing = self._existing(code, reply, key, session_id)
        if not held:
            if existing is None:  # recorded here, perhaps for good: the repair settles it
                liveness.doubt(execution, self._outbox.limit)
                liveness.renew_now.set()
            raise StoreInDoubt((existing or execution).execution_id, "the start")
        return existing

    def _existing(self, code: Create, reply: Any, key: str, session_id: str) -> Execution | None:
        """The answers create.lua and enqueue.lua share: refused (the session is released,
        the key was used otherwise or forgotten), the execution the key started, or None
        when this one was created."""
        if code is Create.RELEASING:
            raise SessionReleasing(session_id.rpartition(TENANT_SEPARATOR)[2])
        if code is Create.KEY_MISMATCH:
            raise IdempotencyMismatch(key)
        if code is Create.KEY_FORGOTTEN:
            raise IdempotencyForgotten(key)
        if code is Create.EXISTING:
            return self._codec.restore(reply[1])
        return None

    async def _enqueue(
        self,
        execution: Execution,
        key: str,
        fingerprint: str,
        key_ttl: int,
        max_queued: int,
        pairs: list[str | bytes],
    ) -> Execution | None:
        """`enqueue.lua`: nobody owns it, so no lease is asked for; due on Redis's clock."""
        execution_id, session_id = execution.execution_id, execution.session_name or ""
        delay = 0.0 if execution.scheduled_at is None else execution.scheduled_at - time.time()
        with self._link.operation("enqueue"):
            reply, held = await self._link.told(
                "enqueue",
                self.keys.script.for_enqueue(execution_id, session_id, key, execution.tenant or ""),
                execution_id,
                session_id,
                repr(execution.created_at),
                key,
                fingerprint,
                key_ttl,
                max(0, round(delay * 1000)) if execution.scheduled_at is not None else 0,
                max_queued,
                execution.concurrency_key or "",
                str(execution.concurrency_limit),
                execution.session_policy or "",
                *pairs,
            )
        code = Create(int(reply[0]))
        if code is Create.FULL:
            raise QueueFull(max_queued)
        if code is Create.BUSY:
            raise SessionTaken(str(reply[1]))
        existing = self._existing(code, reply, key, session_id)
        if not held:  # queued on the primary: any replica takes it, unless a failover loses it
            raise StoreInDoubt((existing or execution).execution_id, "the start")
        if existing is not None:
            return existing
        if reply[1]:
            execution.scheduled_at = float(reply[1])  # on Redis's clock, as it is due
        execution.displaced = tuple(str(other) for other in reply[2:])
        return None

    def due_in(self) -> float | None:
        if self._due_at is None:
            return None
        return max(0.0, self._due_at - asyncio.get_running_loop().time())

    async def claim(self) -> Execution | None:
        """One script: the oldest queued execution (what fell due in `scheduled` joins the
        queue first), now running here, with its body and last checkpoint; None when
        nothing is due (`due_in` then says when the next one is). With Sentinel it is a told
        write: what it took runs only once a replica holds the claim, as a failover that
        loses the claim would have another replica run it again; one no replica was seen to
        hold is handled as a claim whose answer was lost (StoreInDoubt: never started
        here, put back by the repair while the record still says it is ours)."""
        liveness = self._liveness
        token = liveness.token()  # kept with what it takes: whose it is, which claim
        liveness.claiming.add(token)
        try:
            with self._link.operation("claim"):
                reply, held = await self._link.told(
                    "claim",
                    self.keys.script.for_claim(self.replica_id),
                    self.replica_id,
                    token,
                    self.advert,
                )
        except StoreUnavailable:
            liveness.unanswered(token)  # it may have been claimed here all the same
            raise
        finally:
            liveness.claiming.discard(token)
        if int(reply[2]) and self.on_version_waits is not None:
            self.on_version_waits(int(reply[2]))
        if not held and isinstance(reply[0], list):  # taken, but a failover may undo it
            liveness.unanswered(token, held=False)
            liveness.renew_now.set()  # the repair puts it back at once if it is still ours
            raise StoreInDoubt(str(reply[0][Row.EXECUTION_ID]), "the claim")
        if not isinstance(reply[0], list):  # nothing taken: when to look again
            due_ms, blocked = int(reply[0]), int(reply[1])
            loop = asyncio.get_running_loop()
            self._due_at = None if due_ms < 0 else loop.time() + due_ms / 1000
            if due_ms == Unclaimed.LEASE_LAPSED:  # the renewal wakes the taker once it lands
                liveness.wake_on_renewal()
                return None
            if blocked:  # a missed end notice costs at most this long
                self._due_at = min(self._due_at or math.inf, loop.time() + BLOCKED_RELOOK)
            # Keyed work waits for a slot: the next end (on any replica) may free one.
            self._notices.wake_on_ends = bool(blocked)
            return None
        try:
            execution = self._claimed(reply)
        except Exception:  # taken, but it will not start here: the repair puts it back
            liveness.repair_due = True
            raise
        execution.take = token
        return execution

    async def begin(self, execution: Execution) -> bool:
        """Told (held by a Redis replica under Sentinel) before the body begins: a take whose
        mark never landed is known never begun, here by the repair and by the judge once
        this replica is gone (judge.lua), so it runs its first run elsewhere rather than
        end `lost` unrun. Without an answer the body does not begin: the repair puts the
        take back."""
        liveness = self._liveness
        liveness.claiming.add(execution.take)  # on its way: the repair leaves it alone
        try:
            with self._link.operation("begin"):
                reply, held = await self._link.told(
                    "begin",
                    self.keys.script.for_begin(execution.execution_id),
                    self.replica_id,
                    str(execution.attempt),
                    execution.take,
                )
        except StoreUnavailable:
            liveness.unanswered(execution.take)
            return False
        finally:
            liveness.claiming.discard(execution.take)
        if not held:  # a failover may undo the mark: not begun here
            liveness.unanswered(execution.take, held=False)
            liveness.renew_now.set()
            return False
        if not int(reply[0]):  # no longer this claim's (judged, or put back meanwhile)
            logger.info(
                "execution %s (%s): taken from the queue, then no longer this replica's "
                "(the record is %s); it does not start here",
                execution.execution_id,
                execution.reasoner,
                reply[1] or "gone",
            )
            return False
        return True

    def give_back(self, execution: Execution) -> None:
        """Taken while draining, never begun: the repair puts it back on the queue (its
        record names this process's take), at once, or at close at the latest."""
        logger.info(
            "execution %s (%s): taken from the queue as admission closed; it does not start here",
            execution.execution_id,
            execution.reasoner,
        )
        self._liveness.repair_due = True
        self._liveness.renew_now.set()

    def _claimed(self, reply: Any) -> Execution:
        """The execution a claim took, as this replica runs it."""
        row, extra, _ = reply
        body, checkpoint, max_attempts, last_event, scheduled_at, asks, trace = extra[:7]
        execution = self._codec.restore(row)
        # Its events go on numbering where the last attempt stopped.
        execution.event_log(self.max_events).last_id = int(str(last_event).split("-", 1)[0])
        codec.read_into(
            execution,
            {
                "body": body,
                "checkpoint": checkpoint,
                "checkpoint_asks": asks,
                "max_attempts": max_attempts,
                "trace": trace,
                "checkpoint_version": extra[8],
            },
        )
        execution.version_rule = Rule(str(extra[7]))
        execution.resumable = True
        # Its duration runs from its creation, across attempts.
        execution.started_monotonic = time.monotonic() - max(
            0.0, time.time() - execution.created_at
        )
        # Counted as queued when it was queued (a start or a retry), not when handed off.
        if self.on_unqueued is not None and (scheduled_at or execution.attempt == 1):
            due = float(scheduled_at) if scheduled_at else execution.created_at
            self.on_unqueued(execution, max(0.0, time.time() - due))
        return execution

    async def wait_queued(self, timeout: float) -> None:
        """Woken by the `queued` notice on this replica's pub/sub connection."""
        await self._notices.wait_queued(timeout)
