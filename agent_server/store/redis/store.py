"""The redis store: the records of one agent shared by its replicas through one Redis.

Redis is the engine: every transition of a record is one Lua script (atomic, one round
trip), results expire with a Redis TTL, completion notices and cancel requests travel by
pub/sub, and each replica's liveness is one entry of a sorted set scored by its expiry on
Redis's own clock (no replica's clock decides another's fate). `RedisStore` composes the
parts: the connections (`link.py`), the outbox (`outbox.py`), the notices (`notices.py`),
the renewal and repair (`liveness.py`), session releases (`releases.py`) and the row codec
(`codec.py`); its operations, one concept per module: starts and claims (`starts.py`), the
owner's writes through the outbox (`owner_writes.py`), input and checkpoints (`inputs.py`),
reads and lists (`reads.py`) and webhook deliveries (`webhooks.py`), each a base class over
the attributes `part.py` declares. The key layout is in `keys.py` and
docs/replicas.md#key-layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import orjson

from agent_server.model.asks import MAX_ANSWER_BYTES
from agent_server.model.execution import CancelReason, Execution
from agent_server.model.names import scoped
from agent_server.store.base import ExecutionRunning, StoreInDoubt, StoreObserver, StoreUnavailable
from agent_server.store.redis import codec, sentinel
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.failures import OPEN_FAILURES
from agent_server.store.redis.inputs import Inputs
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.outbox import OUTBOX_LIMIT, Outbox
from agent_server.store.redis.owner_writes import OwnerWrites
from agent_server.store.redis.reads import Reads
from agent_server.store.redis.releases import Releases
from agent_server.store.redis.schedule_marks import ScheduleMarks
from agent_server.store.redis.scripts import Forget
from agent_server.store.redis.starts import Starts
from agent_server.store.redis.webhooks import Webhooks

logger = logging.getLogger("agent_server.store")

#: Seconds the close gives the takes this process never began to go back to the queue: a
#: command timeout for a connection a slow command holds to be dropped, and one more.
RELEASE_SECONDS = 2 * COMMAND_TIMEOUT
#: Seconds between tries of that final repair.
RELEASE_RETRY = 0.05
#: The most replicas `GET /replicas` lists.
REPLICA_STATES = 100


class RedisStore(Starts, OwnerWrites, Inputs, Reads, Webhooks, ScheduleMarks):
    """Records in Redis, shared by every replica of the agent; see the module docstring.
    Its operations are its parts' (one module each); here its parts are made, started and
    stopped."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str,
        agent_name: str,
        result_ttl: float = 3600.0,
        max_retained: int = 10_000,
        max_retained_bytes: int = 256 * 1024 * 1024,
        lease_ttl: float = 10.0,
        observer: StoreObserver | None = None,
        outbox_limit: int = OUTBOX_LIMIT,
        max_events: int = 1000,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.replica_id = replica_id
        self.max_answer_bytes = max_answer_bytes
        self.url = url
        self.where = codec.describe_url(url)
        self.keys = Keys(agent_name)
        #: Behind Sentinel a failover can lose writes the old primary acknowledged but no
        #: replica had: the outbox follows its writes with `WAIT 1 <ms>`.
        self.replicated_writes = sentinel.is_sentinel_url(url)
        self.result_ttl = result_ttl
        self.max_retained = max_retained
        self.lease_ttl = lease_ttl
        self.observer = observer
        self.max_events = max_events
        self._tasks: list[asyncio.Task[None]] = []
        #: When the next scheduled execution is due (the loop's clock), as the last claim
        #: said; None when nothing waits for a time.
        self._due_at: float | None = None
        self._codec = RowCodec(observer)
        renew_now = asyncio.Event()
        self._link = self._make_link(max_retained_bytes, renew_now)
        self._notices = Notices(
            self._link,
            self._codec,
            replica_id=replica_id,
            ends=self.keys.ends,
            events=self.keys.events,
            queued=self.keys.queued,
            cancels=self.keys.cancel(replica_id),
            read=self._read,
            cancel=self._cancelled,
            answer=self._answered,
        )
        self._outbox = Outbox(
            self._link,
            end_keys=self.keys.records,
            events_channel=self.keys.events,
            replicated=self.replicated_writes,
            observer=observer,
            limit=outbox_limit,
            on_written=self._notices.written,
        )
        self._releases = Releases(self._link, self.keys)
        self._liveness = self._make_liveness(renew_now)

    def _make_link(self, max_retained_bytes: int, renew_now: asyncio.Event) -> Link:
        """The connections to Redis (`__init__`'s settings set), with the arguments every
        script takes (the caller's id lets a script decide, when it runs, whether this
        replica may judge others: `judged`)."""
        return Link(
            self.url,
            where=self.where,
            common=(
                max(1, round(self.result_ttl * 1000)),
                f"{max(0, self.max_retained)}:{max(0, max_retained_bytes)}".encode(),
                self.replica_id.encode(),
            ),
            observer=self.observer,
            on_up=self._on_up,
            renew_now=renew_now,
            acked_channel=self.keys.acked if self.replicated_writes else None,
        )

    def _make_liveness(self, renew_now: asyncio.Event) -> Liveness:
        """The renewal and the repair, over the parts `__init__` made before it."""
        return Liveness(
            self._link,
            self._codec,
            self.keys,
            replica_id=self.replica_id,
            lease_ttl=self.lease_ttl,
            observer=self.observer,
            renew_now=renew_now,
            queued=self._notices.queued,
            owed=self._outbox.owed_ids,
            end=self.end,
            hand_off=self.hand_off,
            unclaim=self.unclaim,
            cancel=self._notices.missed_cancel,
        )

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._link.up

    @property
    def shared(self) -> bool:
        return True

    @property
    def fenced(self) -> int:
        """Writes refused because this attempt no longer owned the record."""
        return self._outbox.fenced

    @property
    def events_dropped(self) -> int:
        return self._outbox.events_dropped

    async def open(self) -> None:
        """Connect (bounded), load the scripts, announce this replica, subscribe, and start
        the renewal, the outbox writer and the pub/sub reader. Cancel requests for this
        replica go where `deliver_cancels` said."""
        link = self._link
        link.connect()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT + COMMAND_TIMEOUT):
                await link.ping()
                await self._liveness.tick()
                subscribed = await self._notices.subscribe()
        except OPEN_FAILURES as exc:
            await link.disconnect(link.detach())
            reason = link.scrub(str(exc) or type(exc).__name__)
            raise StoreUnavailable(f"cannot reach Redis at {self.where}: {reason}") from None
        link.set_up(True)
        self._tasks = [
            asyncio.create_task(self._liveness.keep_alive(), name="store-liveness"),
            asyncio.create_task(self._outbox.run(), name="store-outbox"),
            asyncio.create_task(self._notices.listen(subscribed), name="store-pubsub"),
            asyncio.create_task(self._notices.read_woken(), name="store-wakes"),
        ]
        self._outbox.wake_if_owed()

    async def close(self) -> None:
        """Stop the background tasks (observing them), put back on the queue what this
        process took but never began, end this replica's liveness so its remaining running
        records read lost at once, and disconnect."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a task that ignores its cancellation is named, not waited for
            _, late = await asyncio.wait(tasks, timeout=COMMAND_TIMEOUT)
            for task in late:
                logger.error("store task %s did not stop when cancelled", task.get_name())
        for task in tasks:
            outcome = task.exception() if task.done() and not task.cancelled() else None
            if outcome is not None:
                logger.error("store task %s failed", task.get_name(), exc_info=outcome)
        if self._link.is_open:
            await self._release_takes()
        client = self._link.detach()
        if client is None:
            return
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                async with client.pipeline(transaction=True) as pipe:
                    pipe.zadd(self.keys.replicas, {self.replica_id: 0})
                    pipe.hdel(self.keys.renewals, self.replica_id)
                    pipe.hdel(self.keys.states, self.replica_id)
                    await pipe.execute()
        except Exception as exc:  # unreachable, or a reset surfacing as uvloop's RuntimeError
            logger.warning(
                "could not end the liveness of replica %s (%s): it lapses within its lease",
                self.replica_id,
                type(exc).__name__,
            )
        await self._link.disconnect(client)
        self._notices.wake_all()

    async def _release_takes(self) -> None:
        """Before the liveness ends: the takes of this process whose body never began go
        back to the queue (`Liveness.release_takes`), their unclaims written, all within
        RELEASE_SECONDS: tried again once the connection a slow command held is dropped.
        What Redis could not settle by then is named (the judge ends it)."""
        deadline = time.monotonic() + RELEASE_SECONDS
        liveness = self._liveness
        failure: Exception | None = None
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    await liveness.release_takes()
                failure = None
                break
            except (StoreUnavailable, TimeoutError) as exc:
                failure = exc
                if deadline - time.monotonic() <= RELEASE_RETRY:
                    break
                await asyncio.sleep(RELEASE_RETRY)
        if failure is not None:
            logger.warning(
                "replica %s closes with takes it never began unsettled (%s): Redis at %s "
                "did not answer in time (%s); whatever it recorded of them the judge ends",
                self.replica_id,
                liveness.unsettled(),
                self.where,
                type(failure).__name__,
            )
        await self._outbox.flush(deadline)
        unwritten = self._outbox.unwritten("unclaim")
        if unwritten:
            logger.warning(
                "replica %s closes with executions it never began still owned (their "
                "return to the queue not written to Redis at %s in time): %s; the judge "
                "ends them",
                self.replica_id,
                self.where,
                ", ".join(unwritten),
            )

    def writes_owed(self) -> int:
        return self._outbox.owed_count()

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the outbox until `deadline` (monotonic); what is left is unrecorded."""
        return await self._outbox.flush(deadline)

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._liveness.deliver_orphans(runs, adopt)

    def deliver_vanished(
        self, running: Callable[[], Collection[str]], vanish: Callable[[str], object]
    ) -> None:
        self._liveness.deliver_vanished(running, vanish)

    def advertise(self, advert: str) -> None:
        self.advert = self._liveness.advert = advert

    def describe(self, state: Callable[[], dict[str, Any]]) -> None:
        self.state = self._liveness.state = state

    async def replica_states(self) -> list[dict[str, Any]]:
        """What each live replica wrote of itself with its last renewal (at most
        REPLICA_STATES of them), by Redis's clock for who is live."""
        with self._link.operation("replicas"):
            now, live, states = await self._link.scripts.pipeline(
                [
                    [b"TIME"],
                    [b"ZRANGE", self.keys.replicas, 0, -1, b"WITHSCORES"],
                    [b"HGETALL", self.keys.states],
                ]
            )
        now_ms = int(now[0]) * 1000 + int(now[1]) // 1000
        known = {_text(live[i]): float(live[i + 1]) for i in range(0, len(live), 2)}
        alive = {replica for replica, until in known.items() if until > now_ms}
        # A replica the renewals dropped (tick.lua: dead, nothing left owned) keeps no entry.
        gone = [states[i] for i in range(0, len(states), 2) if _text(states[i]) not in known]
        if gone:
            with self._link.operation("replicas"):
                await self._link.scripts.call(b"HDEL", self.keys.states, *gone)
        found: list[dict[str, Any]] = []
        for i in range(0, len(states), 2):
            if _text(states[i]) in alive and len(found) < REPLICA_STATES:
                with contextlib.suppress(ValueError):
                    state = orjson.loads(states[i + 1])
                    if isinstance(state, dict):
                        found.append(state)
        return sorted(found, key=lambda state: str(state.get("replica_id")))

    def withdraw(self) -> None:
        """Renewed now, without its versions: the other replicas' next claims stop leaving
        work for this one (tick.lua tells them)."""
        if self._liveness.advertising:
            self._liveness.advertising = False
            self._liveness.renew_now.set()

    def _on_up(self) -> None:
        self._outbox.wake_if_owed()

    def _cancelled(self, execution_id: str, reason: CancelReason, within: float | None) -> None:
        if self.on_cancel is not None:
            self.on_cancel(execution_id, reason, within)

    # -- records ---------------------------------------------------------------------------

    async def forget(self, execution_id: str) -> bool:
        """One script: False when unknown, ExecutionRunning while active, else deleted."""
        with self._link.operation("forget"):
            reply, held = await self._link.told(
                "forget", self.keys.script.for_forget(execution_id), execution_id
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
                    self.keys.script.for_cancel_queued(execution.execution_id),
                    execution.execution_id,
                    reason.value,
                )
            if int(reply[0]) and self.on_unqueued is not None:
                self.on_unqueued(execution, None)
            if int(reply[0]) and not held:
                raise StoreInDoubt(execution.execution_id, "the cancel")
            if int(reply[0]) or not reply[1]:
                return
            owner = reply[1]  # claimed meanwhile: the request goes to its new owner
        if owner == self.replica_id:
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
                self.keys.script.for_cancel(execution.execution_id),
                execution.execution_id,
                message,
            )

    # -- sessions --------------------------------------------------------------------------

    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        return await self._releases.begin(scoped(tenant, session_id), seconds)

    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        await self._releases.end(scoped(tenant, session_id), answer)

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        return await self._releases.shared(release_id, timeout)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
