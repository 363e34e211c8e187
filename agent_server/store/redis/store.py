"""The redis store: the records of one agent shared by its replicas through one Redis.

Redis is the engine: every transition of a record is one Lua script (atomic, one round
trip), results expire with a Redis TTL, completion notices and cancel requests travel by
pub/sub, and each replica's liveness is one entry of a sorted set scored by its expiry on
Redis's own clock (no replica's clock decides another's fate). `RedisStore` is composed of
parts, plain objects its `__init__` makes, each given what it uses: the connections
(`link.py`), the outbox (`outbox.py`), the notices (`notices.py`), the renewal and repair
(`liveness.py`), session releases (`releases.py`), the row codec (`codec.py`), the owner's
writes through the outbox (`owner_writes.py`), and a part per role of the interface
(store/roles.py): `Records` (`records.py`), `Claims` (`claims.py`), `Asks` (`inputs.py`),
`Reads`, `Events` and `Sessions` (`reads.py`), `Webhooks` (`webhooks.py`) and `Schedules`
(`schedule_marks.py`), which `ComposedStore` (store/composed.py) forwards each call to. The
store itself is its `Liveness`: it starts and stops the parts' background work. The key
layout is in `keys.py` and docs/replicas.md#key-layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import orjson

from agent_server.model.asks import MAX_ANSWER_BYTES
from agent_server.model.execution import CancelReason, Execution
from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.composed import ComposedStore
from agent_server.store.redis import codec, sentinel
from agent_server.store.redis.claims import Claims
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.failures import OPEN_FAILURES
from agent_server.store.redis.inputs import Inputs
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.outbox import OUTBOX_LIMIT, Outbox
from agent_server.store.redis.owner_writes import OwnerWrites
from agent_server.store.redis.reads import Reads, read
from agent_server.store.redis.records import Records
from agent_server.store.redis.releases import Releases
from agent_server.store.redis.schedule_marks import ScheduleMarks
from agent_server.store.redis.webhooks import Webhooks

logger = logging.getLogger("agent_server.store")

#: Seconds the close gives the takes this process never began to go back to the queue: a
#: command timeout for a connection a slow command holds to be dropped, and one more.
RELEASE_SECONDS = 2 * COMMAND_TIMEOUT
#: Seconds between tries of that final repair.
RELEASE_RETRY = 0.05
#: The most replicas `GET /replicas` lists.
REPLICA_STATES = 100


class RedisStore(ComposedStore):
    """Records in Redis, shared by every replica of the agent; see the module docstring.
    Here its parts are made, started and stopped; each role's calls go to its part."""

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
        self.url = url
        self.where = codec.describe_url(url)
        self.keys = keys = Keys(agent_name)
        #: Behind Sentinel a failover can lose writes the old primary acknowledged but no
        #: replica had: the outbox follows its writes with `WAIT 1 <ms>`.
        self.replicated_writes = sentinel.is_sentinel_url(url)
        self.observer = observer
        self._tasks: list[asyncio.Task[None]] = []
        self._codec = row_codec = RowCodec(observer)
        renew_now = asyncio.Event()
        self._link = link = self._make_link(result_ttl, max_retained, max_retained_bytes, renew_now)
        self._notices = notices = self._make_notices()
        self._outbox = outbox = self._make_outbox(outbox_limit)
        self._releases = Releases(link, keys)
        # The parts of the roles, each given what it uses (store/composed.py): `webhooks`
        # keeps the handler an end or an ask wakes, `claims` the one a cancelled queued
        # execution tells.
        webhooks = Webhooks(link, keys, row_codec)
        writes = OwnerWrites(outbox, keys, row_codec, max_events=max_events, webhooks=webhooks)
        self._liveness = liveness = self._make_liveness(lease_ttl, renew_now, writes)
        claims = Claims(
            link,
            keys,
            row_codec,
            replica_id=replica_id,
            max_events=max_events,
            liveness=liveness,
            notices=notices,
            writes=writes,
        )
        reads = Reads(
            link, keys, row_codec, notices=notices, writes=writes, releases=self._releases
        )
        super().__init__(
            records=Records(
                link,
                keys,
                row_codec,
                replica_id=replica_id,
                liveness=liveness,
                outbox=outbox,
                writes=writes,
                claims=claims,
            ),
            reads=reads,
            claims=claims,
            asks=Inputs(
                link,
                keys,
                row_codec,
                outbox=outbox,
                webhooks=webhooks,
                max_answer_bytes=max_answer_bytes,
            ),
            events=reads,
            webhooks=webhooks,
            sessions=reads,
            schedules=ScheduleMarks(link, keys),
        )

    def _make_link(
        self,
        result_ttl: float,
        max_retained: int,
        max_retained_bytes: int,
        renew_now: asyncio.Event,
    ) -> Link:
        """The connections to Redis, with the arguments every script takes (the caller's id
        lets a script decide, when it runs, whether this replica may judge others:
        `judged`)."""
        return Link(
            self.url,
            where=self.where,
            common=(
                max(1, round(result_ttl * 1000)),
                f"{max(0, max_retained)}:{max(0, max_retained_bytes)}".encode(),
                self.replica_id.encode(),
            ),
            observer=self.observer,
            on_up=self._on_up,
            renew_now=renew_now,
            libraries=self.keys.libraries,
            acked_channel=self.keys.acked if self.replicated_writes else None,
        )

    def _make_notices(self) -> Notices:
        """The subscriber and its waiters: records read by `get.lua` (reads.py `read`),
        cancel requests and answers to the handlers `Records` and `Asks` keep."""
        link, keys, row_codec = self._link, self.keys, self._codec
        return Notices(
            link,
            row_codec,
            replica_id=self.replica_id,
            ends=keys.ends,
            events=keys.events,
            queued=keys.queued,
            cancels=keys.cancel(self.replica_id),
            read=functools.partial(read, link, keys, row_codec),
            cancel=self._cancelled,
            answer=self._answered,
        )

    def _make_outbox(self, limit: int) -> Outbox:
        """The writes owed to Redis: a written end wakes its waiters here (notices.py)."""
        return Outbox(
            self._link,
            end_keys=self.keys.records,
            events_channel=self.keys.events,
            replicated=self.replicated_writes,
            observer=self.observer,
            limit=limit,
            on_written=self._notices.written,
        )

    def _make_liveness(
        self, lease_ttl: float, renew_now: asyncio.Event, writes: OwnerWrites
    ) -> Liveness:
        """The renewal and the repair, over the parts `__init__` made before it: the repair
        writes through the owner's writes."""
        return Liveness(
            self._link,
            self._codec,
            self.keys,
            replica_id=self.replica_id,
            lease_ttl=lease_ttl,
            observer=self.observer,
            renew_now=renew_now,
            queued=self._notices.queued,
            owed=self._outbox.owed_ids,
            end=writes.end,
            hand_off=writes.hand_off,
            unclaim=writes.unclaim,
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

    def _on_up(self) -> None:
        self._outbox.wake_if_owed()

    def _cancelled(self, execution_id: str, reason: CancelReason, within: float | None) -> None:
        if self.on_cancel is not None:
            self.on_cancel(execution_id, reason, within)

    def _answered(self, execution_id: str, request_id: int, value: Any) -> None:
        """An answer published to this replica: to the `ctx.ask` waiting here."""
        if self.on_answer is None or not self.on_answer(execution_id, request_id, value):
            logger.warning(
                "the answer to request %d of execution %s reached no waiting ask here (it "
                "ended, or timed out and took the answer from the record)",
                request_id,
                execution_id,
            )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
