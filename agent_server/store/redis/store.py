"""The redis store: the records of one agent shared by its replicas through one Redis.

Redis is the engine: every transition of a record is one Lua script (atomic, one round
trip), results expire with a Redis TTL, completion notices and cancel requests travel by
pub/sub, and each replica's liveness is one entry of a sorted set scored by its expiry on
Redis's own clock (no replica's clock decides another's fate). `RedisStore` composes the
parts: the connections (`link.py`), the outbox (`outbox.py`), the notices (`notices.py`),
the renewal and repair (`liveness.py`), session releases (`releases.py`) and the row codec
(`codec.py`); the key layout is in `keys.py` and docs/replicas.md#key-layout.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, cast

import orjson

from agent_server.model import jsoncodec
from agent_server.model.asks import MAX_ANSWER_BYTES, Found, Question, Reply
from agent_server.model.events import Event
from agent_server.model.execution import (
    CancelReason,
    Execution,
    ExecutionStatus,
    StaleAttempt,
)
from agent_server.model.waiting import Wakeup
from agent_server.store import sentinel
from agent_server.store.base import (
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
    StoreInDoubt,
    StoreObserver,
    StoreUnavailable,
)
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.failures import OPEN_FAILURES, transient_reason
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import COMMAND_TIMEOUT, CONNECT_TIMEOUT, Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.outbox import BACKOFF_FIRST, BACKOFF_MAX, OUTBOX_LIMIT, Outbox
from agent_server.store.redis.releases import Releases
from agent_server.store.redis.scripts import Asked, Create, Forget, Row

logger = logging.getLogger("agent_server.store")

#: Seconds after which keyed work waiting for a slot is looked at again without a notice.
BLOCKED_RELOOK = 5.0
#: Executions read per session (release, listing by session).
SESSION_LIMIT = 10_000


class RedisStore(ExecutionStore):
    """Records in Redis, shared by every replica of the agent; see the module docstring."""

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
        self._link = Link(
            url,
            where=self.where,
            # The arguments every script takes (the caller's id lets a script decide, when
            # it runs, whether this replica may judge others: `judged`).
            common=(
                max(1, round(result_ttl * 1000)),
                f"{max(0, max_retained)}:{max(0, max_retained_bytes)}".encode(),
                replica_id.encode(),
            ),
            observer=observer,
            on_up=self._on_up,
            renew_now=renew_now,
            acked_channel=self.keys.acked if self.replicated_writes else None,
        )
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
        self._liveness = Liveness(
            self._link,
            self._codec,
            self.keys,
            replica_id=replica_id,
            lease_ttl=lease_ttl,
            observer=observer,
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
        """Stop the background tasks (observing them), end this replica's liveness so its
        remaining running records read lost at once, and disconnect."""
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
        client = self._link.detach()
        if client is None:
            return
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                async with client.pipeline(transaction=True) as pipe:
                    pipe.zadd(self.keys.replicas, {self.replica_id: 0})
                    pipe.hdel(self.keys.renewals, self.replica_id)
                    await pipe.execute()
        except Exception as exc:  # unreachable, or a reset surfacing as uvloop's RuntimeError
            logger.warning(
                "could not end the liveness of replica %s (%s): it lapses within its lease",
                self.replica_id,
                type(exc).__name__,
            )
        await self._link.disconnect(client)
        self._notices.wake_all()

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the outbox until `deadline` (monotonic); what is left is unrecorded."""
        return await self._outbox.flush(deadline)

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._liveness.deliver_orphans(runs, adopt)

    def deliver_vanished(
        self, running: Callable[[], Collection[str]], vanish: Callable[[str], object]
    ) -> None:
        self._liveness.deliver_vanished(running, vanish)

    def _on_up(self) -> None:
        self._outbox.wake_if_owed()

    def _cancelled(self, execution_id: str, reason: CancelReason, within: float | None) -> None:
        if self.on_cancel is not None:
            self.on_cancel(execution_id, reason, within)

    # -- events ----------------------------------------------------------------------------

    def emit(self, execution: Execution, event: Event) -> None:
        """Through the outbox, in order with the end: XADD to the execution's capped stream
        (fenced by owner and attempt) and a notice to readers on other replicas."""
        self._outbox.put(
            execution,
            "emit",
            self.keys.for_emit(execution.execution_id),
            [
                execution.replica,
                str(execution.attempt),
                str(event.id),
                event.event,
                event.data,
                str(self.max_events),
            ],
        )

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        """One XRANGE after `cursor` (exclusive). Numbers are contiguous: a gap before the
        first one read is what the cap trimmed."""
        with self._link.operation("events"):
            rows = await cast(
                Awaitable[Any],
                self._link.redis.xrange(
                    self.keys.stream(execution_id), min=f"({cursor}-1", count=limit
                ),
            )
        events = [
            Event(
                int(entry_id.split("-", 1)[0]), fields.get("e", "message"), fields.get("d", "null")
            )
            for entry_id, fields in rows
        ]
        missed = events[0].id - cursor - 1 if events else 0
        return max(0, missed), events

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        """`waiter` is completed at the `events` (or `ends`) notice for this execution on
        this replica's one pub/sub connection."""
        self._notices.event_notice(execution_id, waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._notices.drop_notice(execution_id, waiter)

    # -- records ---------------------------------------------------------------------------

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        """One script: refused while the session is released; with an idempotency key
        already used for the same request, the execution it started; else the record, its
        index entries, and the key (set if absent, atomically: one execution per key).
        A queued one is `enqueue.lua`'s."""
        session_id = execution.session_id or ""
        pairs = self._codec.new_record(execution)  # in FIELDS order: the script names them
        if execution.resumable or execution.body is not None:
            pairs.extend(
                ("body", codec.dumps(execution.body), "max_attempts", str(execution.max_attempts))
            )
        if execution.webhook_url is not None:  # kept in the hash, never in the record's JSON
            pairs.extend(("webhook", execution.webhook_url))
        if execution.trace is not None:  # traces on: the starting request's span
            pairs.extend(("trace", execution.trace))
        key = "" if idempotency is None else idempotency.key
        fingerprint = "" if idempotency is None else idempotency.fingerprint
        key_ttl = 1 if idempotency is None else max(1, round(idempotency.ttl * 1000))
        if execution.status is ExecutionStatus.QUEUED:
            return await self._enqueue(execution, key, fingerprint, key_ttl, max_queued, pairs)
        execution_id = execution.execution_id
        liveness = self._liveness
        # The take's token: this process took it (the repair's evidence that its body
        # began here or never did).
        pairs.extend(("claim", liveness.incarnation))
        liveness.creating.add(execution_id)
        try:
            with self._link.operation("create"):
                reply, held = await self._link.told(
                    "create",
                    self.keys.for_create(execution_id, session_id, execution.replica, key),
                    execution_id,
                    session_id,
                    repr(execution.created_at),
                    execution.replica,
                    key,
                    fingerprint,
                    key_ttl,
                    *pairs,
                )
        except StoreUnavailable:
            # Sent, perhaps: Redis may run it yet (a pause). The repair settles it.
            if len(liveness.in_doubt) < self._outbox.limit:
                liveness.in_doubt[execution_id] = execution
            liveness.repair_due = True
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
                if len(liveness.in_doubt) < self._outbox.limit:
                    liveness.in_doubt[execution_id] = execution
                liveness.repair_due = True
                liveness.renew_now.set()
            raise StoreInDoubt((existing or execution).execution_id, "the start")
        return existing

    def _existing(self, code: Create, reply: Any, key: str, session_id: str) -> Execution | None:
        """The answers create.lua and enqueue.lua share: refused (the session is released,
        the key was used otherwise or forgotten), the execution the key started, or None
        when this one was created."""
        if code is Create.RELEASING:
            raise SessionReleasing(session_id)
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
        execution_id, session_id = execution.execution_id, execution.session_id or ""
        delay = 0.0 if execution.scheduled_at is None else execution.scheduled_at - time.time()
        with self._link.operation("enqueue"):
            reply, held = await self._link.told(
                "enqueue",
                self.keys.for_enqueue(execution_id, session_id, key),
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
        reply = await self._waiting_out(
            "checkpoint",
            self.keys.for_checkpoint(execution.execution_id),
            execution.replica,
            str(execution.attempt),
            state,
            str(execution.checkpoint_asks),
        )
        if not int(reply[0]):
            self._outbox.fence("checkpoint", execution, reply[1])
            raise StaleAttempt(
                f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
                f"owns it (the record is {reply[1] or 'gone'})"
            )

    async def _waiting_out(self, name: str, keys: Sequence[str], *args: str | bytes) -> Any:
        """One script call of an owner's own write, Redis unreachable or refusing for a while
        waited out (a bounded backoff, as the outbox does; a cancellation still ends the
        wait): what the reasoner does next depends on it being written."""
        backoff = BACKOFF_FIRST
        while True:
            try:
                with self._link.operation(name):
                    return await self._link.script(name, keys, *args)
            except StoreUnavailable as exc:
                if not self._link.is_open:
                    raise  # closed: nothing will write it
                self._outbox.count_retry(transient_reason(exc) or "connection")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    # -- input (ctx.ask) -------------------------------------------------------------------

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        """One script (`ask.lua`), fenced by owner and attempt: the record reads
        `input_required` with its request before anyone is told (the reply, the event),
        parked with `park`. A request an earlier attempt had answered or let expire is not
        asked again: its answer, or its timeout, matched by the question's identity."""
        number = question.request_id
        reply = await self._waiting_out(
            "ask",
            self.keys.for_ask(execution.execution_id, execution.replica),
            execution.replica,
            str(execution.attempt),
            str(number),
            codec.dumps(question.request),
            "1" if park else "0",
            "" if timeout is None else str(max(1, round(timeout * 1000))),
            question.identity,
            question.label,
            str(question.after),
        )
        code = Asked(int(reply[0]))
        if code is Asked.FENCED:
            self._outbox.fence("ask", execution, reply[1])
            raise StaleAttempt(
                f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
                f"owns it (the record is {reply[1] or 'gone'})"
            )
        if code is Asked.ANSWERED:
            return Reply(Found.ANSWERED, int(reply[2]), codec.loads(reply[1]))
        if code is Asked.TIMED_OUT:
            return Reply(Found.TIMED_OUT, int(reply[2]))
        if code is Asked.AGAIN:
            return Reply(Found.AGAIN, int(reply[2]))
        if code is Asked.MISMATCH:
            other = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
            return Reply(Found.MISMATCH, int(reply[2]), other=other)
        if self.on_webhook is not None and (
            execution.webhook_url is not None or execution.attempt > 1
        ):
            self.on_webhook()  # ask.lua may have recorded a delivery
        return Reply(Found.PARKED if code is Asked.PARKED else Found.WAIT, number)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """`expire.lua`: closed unanswered, unless an answer was taken first (returned)."""
        return await self._look(execution, request_id, close=True)

    async def poll_answer(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """`expire.lua`, looking only: the answer taken, if one was (its notice missed)."""
        return await self._look(execution, request_id, close=False)

    async def _look(
        self, execution: Execution, request_id: int, *, close: bool
    ) -> tuple[bool, Any]:
        reply = await self._waiting_out(
            "expire",
            self.keys.for_expire(execution.execution_id),
            execution.replica,
            str(execution.attempt),
            str(request_id),
            "1" if close else "0",
        )
        if int(reply[0]) == 2:
            return True, codec.loads(reply[1])
        return False, None

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """One script (`answer.lua`): taken only while the record waits for that request,
        so exactly one answer per request wins across replicas; published to the owner,
        whose waiting `ctx.ask` returns it. The same answer again (the same JSON data for
        a request whose answer is kept) is taken again without a second publish: a retry of
        an answer in doubt or whose reply was lost is not refused."""
        if request_id is None:
            pending = execution.input_request or {}
            request_id = pending.get("request_id")
            if not isinstance(request_id, int):
                return None
        keys = self.keys.for_answer(execution.execution_id)
        text: str | bytes = codec.dumps(value)
        with self._link.operation("answer"):
            reply, held = await self._link.told(
                "answer", keys, str(request_id), text, str(self.max_answer_bytes)
            )
            if int(reply[0]) == 3 and jsoncodec.canonical(
                codec.loads(reply[1])
            ) == jsoncodec.canonical(value):
                # A retry of the answer taken, in other JSON text: taken again in the kept text.
                text = reply[1]
                reply, held = await self._link.told(
                    "answer", keys, str(request_id), text, str(self.max_answer_bytes)
                )
        if int(reply[0]) not in (1, 2):
            return None
        if not held:
            raise StoreInDoubt(execution.execution_id, "the answer")
        return self._codec.restore([*reply[1], 0])

    def _answered(self, execution_id: str, request_id: int, value: Any) -> None:
        """An answer published to this replica: to the `ctx.ask` waiting here."""
        if self.on_answer is None or not self.on_answer(execution_id, request_id, value):
            logger.warning(
                "the answer to request %d of execution %s reached no waiting ask here (it "
                "ended, or timed out and took the answer from the record)",
                request_id,
                execution_id,
            )

    def hand_off(self, execution: Execution) -> None:
        """Through the outbox, fenced: the record goes to `queued` with attempt + 1."""
        self._queue_next(execution, "")

    def unclaim(self, execution: Execution, token: str) -> None:
        """Through the outbox, fenced by owner, attempt and claim: an execution taken here
        whose answer was lost, so its body never started, goes back to the head of the
        queue with its attempt unchanged (`unclaim.lua`)."""
        body = "" if execution.body is None else codec.dumps(execution.body)
        self._outbox.put(
            execution,
            "unclaim",
            self.keys.for_unclaim(execution.execution_id, execution.replica),
            [execution.execution_id, execution.replica, str(execution.attempt), token, body],
        )

    def retry(self, execution: Execution, delay: float) -> None:
        """As a hand-off, the next attempt due after `delay` seconds on Redis's clock."""
        self._queue_next(execution, str(max(0, round(delay * 1000))))

    def _queue_next(self, execution: Execution, delay_ms: str) -> None:
        """`handoff.lua`, through the outbox: one script for both, fenced like an end."""
        self._outbox.put(
            execution,
            "handoff",
            self.keys.for_handoff(execution.execution_id, execution.replica),
            [
                execution.execution_id,
                execution.replica,
                str(execution.attempt),
                self.keys.queued,
                delay_ms,
            ],
        )

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
                    "claim", self.keys.for_claim(self.replica_id), self.replica_id, token
                )
        except StoreUnavailable:
            liveness.unanswered(token)  # it may have been claimed here all the same
            raise
        finally:
            liveness.claiming.discard(token)
        if not held and isinstance(reply[0], list):  # taken, but a failover may undo it
            liveness.unanswered(token, held=False)
            liveness.renew_now.set()  # the repair puts it back at once if it is still ours
            raise StoreInDoubt(str(reply[0][Row.EXECUTION_ID]), "the claim")
        if not isinstance(reply[0], list):  # nothing taken: when to look again
            due_ms, blocked = int(reply[0]), int(reply[1])
            loop = asyncio.get_running_loop()
            self._due_at = None if due_ms < 0 else loop.time() + due_ms / 1000
            if blocked:  # a missed end notice costs at most this long
                self._due_at = min(self._due_at or math.inf, loop.time() + BLOCKED_RELOOK)
            # Keyed work waits for a slot: the next end (on any replica) may free one.
            self._notices.wake_on_ends = bool(blocked)
            return None
        try:
            return self._claimed(reply)
        except Exception:  # taken, but it will not start here: the repair puts it back
            liveness.repair_due = True
            raise

    def _claimed(self, reply: Any) -> Execution:
        """The execution a claim took, as this replica runs it."""
        row, (body, checkpoint, max_attempts, last_event, scheduled_at, asks, trace) = reply
        execution = self._codec.restore(row)
        # Its events go on numbering where the last attempt stopped.
        execution.event_log(self.max_events).last_id = int(str(last_event).split("-", 1)[0])
        execution.body = codec.loads(body) if body else None
        execution.checkpoint = checkpoint or None
        execution.checkpoint_asks = int(asks or 0)
        execution.max_attempts = int(max_attempts or 1)
        execution.resumable = True
        execution.trace = str(trace) if trace else None
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

    def end(self, execution: Execution) -> None:
        """Queue the end for the outbox writer (its arguments taken now); `recorded` tells
        when it is in Redis."""
        execution.recorded = asyncio.get_running_loop().create_future()
        keys = self.keys.for_end(execution.execution_id, execution.replica)
        self._outbox.put(execution, "end", keys, self._codec.end_args(execution))
        # Once written, a delivery may be owed (records.lua): the sender looks at once. A
        # resumed attempt's URL is in the hash only (the sender's next look finds it too).
        if self.on_webhook is not None and (
            execution.webhook_url is not None or execution.attempt > 1
        ):
            wake = self.on_webhook
            execution.recorded.add_done_callback(lambda _: wake())

    # -- webhook deliveries (lua/webhooks.lua) ---------------------------------------------

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        """One script: the due deliveries of every replica, each claimed for `lease`
        seconds. `due_only` is for the memory store: what is owed here stays for others."""
        with self._link.operation("webhook_claim"):
            reply = await self._link.script(
                "webhook_claim", self.keys.for_webhooks(), round(lease * 1000), limit
            )
        pending, now = int(reply[0]), int(reply[1]) / 1000
        deliveries = []
        for delivery_id, text in reply[2:]:
            try:
                deliveries.append(self._delivery(str(delivery_id), text, now))
            except Exception as exc:  # one body unread must not hold the others back
                logger.warning(
                    "webhook %s: its stored body cannot be read here (%s); left claimed for "
                    "a replica that can",
                    delivery_id,
                    type(exc).__name__,
                )
        return pending, deliveries

    def _delivery(self, delivery_id: str, text: Any, now: float) -> Delivery:
        """A delivery as webhooks.lua stored it (`now`: Redis's clock, seconds)."""
        body = codec.loads(text)
        at = float(body["at"]) / 1000
        execution = self._codec.restore([*body["row"], 0])
        return Delivery(
            delivery_id,
            str(body["type"]),
            str(body["url"]),
            at,
            max(0.0, now - at),
            int(body["attempts"]),
            execution.to_json(),
            str(body.get("trace") or "") or None,
            int(body.get("attempt") or execution.attempt),
        )

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        """One script: the delivery goes, or is due again `retry_in` seconds from now on
        Redis's clock."""
        delay = "" if retry_in is None else str(max(0, round(retry_in * 1000)))
        with self._link.operation("webhook_settle"):
            reply = await self._link.script(
                "webhook_settle", self.keys.for_webhooks(), delivery.delivery_id, delay
            )
        return int(reply)

    async def recorded(self, execution: Execution, timeout: float) -> bool:
        """Whether the end is in Redis within `timeout` seconds: False when it was refused
        (fenced), could not be kept, or is still owed."""
        future = execution.recorded
        if future is None:
            return False
        if not future.done():  # one future and one timer, not asyncio.wait's set and task
            waiter = Wakeup(loop=asyncio.get_running_loop())
            timer = waiter.get_loop().call_later(timeout, waiter, None)
            future.add_done_callback(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                future.remove_done_callback(waiter)
        return future.done() and future.result()

    async def get(self, execution_id: str) -> Execution | None:
        """One script: the record, moved to lost first if its owner stopped renewing."""
        return (await self._read([execution_id]))[0]

    async def _read(self, ids: Sequence[str]) -> list[Execution | None]:
        """One `get` call for many ids (a waiter's re-read, or those woken together)."""
        with self._link.operation("get"):
            rows = await self._link.script("get", self.keys.for_ids(ids), *ids)
        found: list[Execution | None] = [self._codec.restore(row) if row else None for row in rows]
        return found or [None] * len(ids)

    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        """Woken by this replica's one pub/sub connection when the end is written (notices.py)
        (with `asked`, also when it asks for input)."""
        return await self._notices.wait(execution, timeout, asked)

    async def page(
        self,
        *,
        statuses: frozenset[ExecutionStatus] = frozenset(),
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
        after: ListCursor | None = None,
    ) -> Page:
        """One script. Bounded work: it reads at most max(limit * 10, 1000) ids of one
        index (the session's, the running ones, or all, newest first), so a rare filter
        may return fewer than `limit` while `next` says older ones may match. A cursor is
        the index score and id of the last record looked at."""
        if session_id is not None:
            index = self.keys.session(session_id)
        elif statuses == {ExecutionStatus.RUNNING}:
            index = self.keys.running
        else:
            index = self.keys.all
        return await self._list(
            "list",
            index,
            max(limit * 10, 1000),
            limit,
            ",".join(sorted(statuses)),
            reasoner or "",
            budget=max_bytes,
            after=after,
        )

    async def forget(self, execution_id: str) -> bool:
        """One script: False when unknown, ExecutionRunning while active, else deleted."""
        with self._link.operation("forget"):
            reply, held = await self._link.told(
                "forget", self.keys.for_forget(execution_id), execution_id
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
                    self.keys.for_cancel_queued(execution.execution_id),
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
                self.keys.for_cancel(execution.execution_id),
                execution.execution_id,
                message,
            )

    async def _list(
        self,
        operation: str,
        index: str,
        scan: int,
        limit: int,
        statuses: str,
        reasoner: str,
        *,
        budget: int = 0,
        bare: bool = False,
        after: ListCursor | None = None,
    ) -> Page:
        since, since_id = codec.cursor(after)
        with self._link.operation(operation):
            reply = await self._link.script(
                "list",
                self.keys.for_list(index),
                scan,
                limit,
                statuses,
                reasoner,
                budget,
                "1" if bare else "0",
                since,
                since_id,
            )
        found: list[Execution] = []
        cursors: list[str] = []
        for row in reply[:-1]:
            execution = self._codec.restore(row)
            if int(row[Row.MATCHED]):
                found.append(execution)
                cursors.append(str(row[Row.CURSOR]))
        return Page(found, cursors, str(reply[-1]) or None)

    # -- sessions --------------------------------------------------------------------------

    async def session(self, session_id: str) -> list[Execution]:
        """One script: the session's executions (at most SESSION_LIMIT), newest first,
        without their results (a release reads statuses: 10,000 big results would be a
        read of gigabytes)."""
        found = await self._list(
            "session",
            self.keys.session(session_id),
            SESSION_LIMIT,
            SESSION_LIMIT,
            "",
            "",
            bare=True,
        )
        return found.executions

    async def begin_release(self, session_id: str, seconds: float | None) -> str | None:
        return await self._releases.begin(session_id, seconds)

    async def end_release(self, session_id: str, answer: dict[str, Any] | None = None) -> None:
        await self._releases.end(session_id, answer)

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        return await self._releases.shared(release_id, timeout)
