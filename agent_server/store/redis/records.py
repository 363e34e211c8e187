"""Writing records: `create` (running here at once) and `enqueue` (queued), each with its
idempotency key, checkpoints, the end (through the owner's writes), forgetting one, and
cancel requests; the `Records` part of `RedisStore`, which keeps where cancel requests for
this replica go (`on_cancel`)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from agent_server.model.context import StaleAttempt
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import TENANT_SEPARATOR, scoped
from agent_server.model.waiting import Closing
from agent_server.store import roles
from agent_server.store.base import (
    ExecutionRunning,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    QueueFull,
    SessionReleasing,
    SessionTaken,
    StoreInDoubt,
    StoreUnavailable,
)
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.outbox import Outbox
from agent_server.store.redis.owner_writes import OwnerWrites
from agent_server.store.redis.scripts import Create, Forget


class Records(roles.Records):
    """The record writes of `RedisStore`: `claims` keeps `on_unqueued`, which a cancelled
    queued execution tells."""

    def __init__(
        self,
        link: Link,
        keys: Keys,
        row_codec: RowCodec,
        *,
        replica_id: str,
        liveness: Liveness,
        outbox: Outbox,
        writes: OwnerWrites,
        claims: roles.Claims,
    ) -> None:
        self._link = link
        self._keys = keys
        self._codec = row_codec
        self._replica_id = replica_id
        self._liveness = liveness
        self._outbox = outbox
        self._writes = writes
        self._claims = claims

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
                    self._keys.script.for_create(
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
                self._keys.script.for_enqueue(
                    execution_id, session_id, key, execution.tenant or ""
                ),
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

    async def checkpoint(self, execution: Execution, state: str) -> None:
        """One script, fenced by owner and attempt like an end. Redis unreachable or
        refusing for a while is waited out (retried with a bounded backoff, as the outbox
        does; a cancellation still ends the wait): a reasoner's progress is written before
        it goes on, and an outage does not fail it (section 12, invariant 4)."""
        reply = await self._outbox.waiting_out(
            "checkpoint",
            self._keys.script.for_checkpoint(execution.execution_id),
            execution.replica,
            str(execution.attempt),
            state,
            str(execution.checkpoint_asks),
            execution.version or "",  # the code that wrote it (claim.lua compares)
        )
        execution.checkpoint_version = execution.version
        if not int(reply[0]):
            self._outbox.fence("checkpoint", execution, reply[1])
            raise StaleAttempt(
                f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
                f"owns it (the record is {reply[1] or 'gone'})"
            )

    def end(self, execution: Execution) -> None:
        self._writes.end(execution)

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        return await self._writes.recorded(execution, timeout, closing)

    async def forget(self, execution_id: str) -> bool:
        """One script: False when unknown, ExecutionRunning while active, else deleted."""
        with self._link.operation("forget"):
            reply, held = await self._link.told(
                "forget", self._keys.script.for_forget(execution_id), execution_id
            )
        code = Forget(int(reply[0]))
        if code is Forget.UNKNOWN:
            return False
        found = self._codec.restore(reply[1])  # counts a move to lost made on the way
        if code is Forget.ACTIVE:
            raise ExecutionRunning(execution_id, found.status.value)
        if not held:
            raise StoreInDoubt(execution_id, "the delete")
        return True

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        """Straight to the local registry when this replica owns it, else one PUBLISH to
        the owner's channel (nothing listens there once the owner is gone: it reads lost)."""
        owner = execution.replica
        if execution.owned_by_nobody:  # queued or parked: it ends here
            with self._link.operation("request_cancel"):
                reply, held = await self._link.told(
                    "cancel_queued",
                    self._keys.script.for_cancel_queued(execution.execution_id),
                    execution.execution_id,
                    reason.value,
                )
            if int(reply[0]) and self._claims.on_unqueued is not None:
                self._claims.on_unqueued(execution, None)
            if int(reply[0]) and not held:
                raise StoreInDoubt(execution.execution_id, "the cancel")
            if int(reply[0]) or not reply[1]:
                return
            owner = reply[1]  # claimed meanwhile: the request goes to its new owner
        if owner == self._replica_id:
            if self.on_cancel is not None:
                self.on_cancel(execution.execution_id, reason, settle_within)
            return
        message = orjson.dumps(
            {"id": execution.execution_id, "reason": reason.value, "settle_within": settle_within}
        )
        # Kept for the owner as well as published (cancel.lua): its renewals return a
        # request its subscriber missed.
        with self._link.operation("request_cancel"):
            await self._link.script(
                "cancel",
                self._keys.script.for_cancel(execution.execution_id),
                execution.execution_id,
                message,
            )
