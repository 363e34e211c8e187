"""How queued work is taken: `claim` takes the oldest queued execution for this replica,
`begin` marks its body begun, and hand-offs and retries queue the next attempt (through the
owner's writes); the `Claims` part of `RedisStore`, which keeps when the next queued one is
due and the versions this replica's claims advertise."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from agent_server.model.execution import Execution
from agent_server.model.versions import Rule
from agent_server.store import roles
from agent_server.store.base import StoreInDoubt, StoreUnavailable
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.owner_writes import OwnerWrites
from agent_server.store.redis.scripts import Row, Unclaimed

logger = logging.getLogger("agent_server.store")

#: Seconds after which keyed work waiting for a slot is looked at again without a notice.
BLOCKED_RELOOK = 5.0


class Claims(roles.Claims):
    """The claims of `RedisStore`. It keeps the handlers of its role (`on_unqueued`,
    `on_version_waits`) and its `advert`, which the renewal writes too (liveness.py)."""

    def __init__(
        self,
        link: Link,
        keys: Keys,
        row_codec: RowCodec,
        *,
        replica_id: str,
        max_events: int,
        liveness: Liveness,
        notices: Notices,
        writes: OwnerWrites,
    ) -> None:
        self._link = link
        self._keys = keys
        self._codec = row_codec
        self._replica_id = replica_id
        self._max_events = max_events
        self._liveness = liveness
        self._notices = notices
        self._writes = writes
        #: When the next scheduled execution is due (the loop's clock), as the last claim
        #: said; None when nothing waits for a time.
        self._due_at: float | None = None

    @property
    def shared(self) -> bool:
        return True

    def advertise(self, advert: str) -> None:
        self.advert = self._liveness.advert = advert

    def withdraw(self) -> None:
        """Renewed now, without its versions: the other replicas' next claims stop leaving
        work for this one (tick.lua tells them)."""
        if self._liveness.advertising:
            self._liveness.advertising = False
            self._liveness.renew_now.set()

    def hand_off(self, execution: Execution) -> None:
        self._writes.hand_off(execution)

    def retry(self, execution: Execution, delay: float) -> None:
        self._writes.retry(execution, delay)

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
                    self._keys.script.for_claim(self._replica_id),
                    self._replica_id,
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
                    self._keys.script.for_begin(execution.execution_id),
                    self._replica_id,
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
        execution.event_log(self._max_events).last_id = int(str(last_event).split("-", 1)[0])
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
