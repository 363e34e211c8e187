"""The postgres store: the records of one agent shared by its replicas through one
PostgreSQL database (DESIGN section 26, docs/postgres.md).

Postgres is the engine: every transition is one transaction on rows, fenced in its `WHERE`
(owner, attempt, status, take); claims take due work with `FOR UPDATE SKIP LOCKED`; leases,
due times and expiry are on the database's clock; `LISTEN`/`NOTIFY` is a wake-up hint that
carries ids only, and a poll of at most a second serves when a notice is lost or `LISTEN` is
off (`--store-notify poll`, for a pooler in transaction mode). `PostgresStore` is composed of
parts, plain objects its `__init__` makes, each given what it uses: the connections
(`link.py`), the waiters (`notices.py`), the owner's writes (`owner.py`: the outbox and
checkpoints), the verdicts on held rows nobody runs (`repair.py`: a dead owner's, and this
replica's takes whose answer was lost), and a part per role of the interface
(store/roles.py): `Records` (`records.py`), `Claims` (`claims.py`, versions included),
`Asks` (`inputs.py`), `Reads`, `Events` and `Sessions` (`reads.py`), `Webhooks`
(`webhooks.py`) and `Schedules` (`schedules.py`), which `ComposedStore` (store/composed.py)
forwards each call to; plain creates and reads made together share a statement
(`coalesce.py`, in `records.py` and `reads.py`). The store itself is its `Liveness`: the replica's
lease (which runs the judge and the repair), the notices it listens for, and retention.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
import psycopg

from agent_server.model.asks import MAX_ANSWER_BYTES
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.store.base import SchemaTooNew, StoreObserver, StoreUnavailable
from agent_server.store.composed import ComposedStore
from agent_server.store.postgres import codec, schema, statistics
from agent_server.store.postgres.claims import Claims
from agent_server.store.postgres.inputs import Inputs
from agent_server.store.postgres.link import COMMAND_TIMEOUT, CONNECT_TIMEOUT, FAILURES, Link
from agent_server.store.postgres.notices import POLL_SECONDS, Notices
from agent_server.store.postgres.owner import Owner
from agent_server.store.postgres.reads import Reads
from agent_server.store.postgres.records import Records
from agent_server.store.postgres.repair import Repair
from agent_server.store.postgres.rows import ROW, WRITER, AgentRows, read_row
from agent_server.store.postgres.schedules import Schedules
from agent_server.store.postgres.webhooks import Webhooks

logger = logging.getLogger("agent_server.store")

#: What a failed open, and a failed LISTEN connection, may raise.
OPEN_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, StoreUnavailable, psycopg.Error)
LISTEN_FAILURES: tuple[type[BaseException], ...] = (*FAILURES, psycopg.Error)
#: Rows one retention pass deletes at most (bounded deletes, no long lock).
RETENTION_BATCH = 1000


class PostgresStore(ComposedStore):
    """Records in Postgres, shared by every replica of the agent; see the module docstring.
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
        max_events: int = 1000,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        pool_size: int = 10,
        notify: str = "listen",
    ) -> None:
        self.url = url
        self.where = codec.describe_url(url)
        self.agent = agent = agent_name
        self.replica_id = replica_id
        self.lease_ttl = lease_ttl
        self.observer = observer
        self.listen = notify != "poll"
        self.channel = channel = (
            "agent_server_" + hashlib.sha256(agent_name.encode()).hexdigest()[:24]
        )
        self._link = link = Link(url, pool_size=pool_size, observer=observer, on_up=self._on_up)
        self._tasks: list[asyncio.Task[None]] = []
        #: Set when the next liveness pass must renew, whenever the last renewal was.
        self._renew_now = False
        #: The advert the last renewal wrote: a change is told to the other replicas.
        self._advertised = ""
        # The parts, each given what it uses (store/composed.py): `webhooks` keeps the
        # handler an end or an ask wakes, `claims` the one a cancelled queued execution
        # tells; the repair keeps the takes on their way (due at open, as the replica id
        # may have been used before).
        self._rows = rows = AgentRows(link, agent, replica_id, channel, result_ttl)
        self._notices = notices = Notices()
        webhooks = Webhooks(link, agent)
        self._owner = owner = Owner(
            rows,
            max_retained=max_retained,
            max_retained_bytes=max_retained_bytes,
            max_events=max_events,
            observer=observer,
            notices=notices,
            webhooks=webhooks,
        )
        self._repair = repair = Repair(rows, lease_ttl=lease_ttl, observer=observer, owner=owner)
        claims = Claims(
            rows,
            max_events=max_events,
            owner=owner,
            repair=repair,
            notices=notices,
            renew_soon=self._renew_soon,
        )
        reads = Reads(rows, notices=notices, owner=owner, repair=repair)
        records = Records(
            rows,
            owner=owner,
            repair=repair,
            notices=notices,
            claims=claims,
            renew_soon=self._renew_soon,
        )
        #: The parts whose calls made together share a statement: the close waits for them.
        self._batched = (reads, records)
        super().__init__(
            records=records,
            reads=reads,
            claims=claims,
            asks=Inputs(rows, owner=owner, webhooks=webhooks, max_answer_bytes=max_answer_bytes),
            events=reads,
            webhooks=webhooks,
            sessions=reads,
            schedules=Schedules(link, agent),
        )

    @property
    def up(self) -> bool:
        return self._link.up

    @property
    def shared(self) -> bool:
        return True

    def _renew_soon(self) -> None:
        self._renew_now = True

    @property
    def fenced(self) -> int:
        """Writes refused because this attempt no longer owned the record."""
        return self._owner.fenced

    @property
    def events_dropped(self) -> int:
        return self._owner.events_dropped

    def _on_up(self) -> None:
        self._owner.wake()
        self._renew_now = True  # back from an outage: the lease first

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Connect (bounded), apply the migrations an empty (or older) database lacks,
        announce this replica, and start the liveness, outbox and notices."""
        try:
            await self._link.open()
            async with asyncio.timeout(CONNECT_TIMEOUT + COMMAND_TIMEOUT):
                async with self._link.tx("migrate", one=True) as conn:
                    await schema.migrate(conn)  # its own transaction
                alive = await self._renew()
                renewed = time.monotonic()
                # The lease first after an outage: this was it (the migration's statement
                # marked Postgres up, which asks for a renewal at the next pass).
                self._renew_now = False
                listening = await self._listening() if self.listen else None
        except SchemaTooNew:
            await self._link.close()
            raise
        except OPEN_FAILURES as exc:
            await self._link.close()
            reason = self._link.scrub(str(exc).strip() or type(exc).__name__)
            raise StoreUnavailable(f"cannot reach Postgres at {self.where}: {reason}") from None
        self._link.set_up(True)
        if self.observer is not None:
            self.observer.replicas_alive(alive)
        self._tasks = [
            asyncio.create_task(self._keep_alive(renewed), name="store-liveness"),
            asyncio.create_task(self._owner.write_owed(), name="store-outbox"),
        ]
        if self.listen:
            self._tasks.append(asyncio.create_task(self._listen(listening), name="store-listen"))

    async def close(self) -> None:
        """Stop the background work, put back on the queue what this process took but never
        began, end this replica's liveness (its other running records are judged at once),
        and disconnect."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=COMMAND_TIMEOUT)
        for part in self._batched:
            await part.close()
        if self._link.is_open:
            await self._release_takes()
            with contextlib.suppress(StoreUnavailable):
                async with self._link.tx("close") as conn:
                    await conn.execute(
                        "UPDATE replicas SET expires_at = 'epoch' WHERE agent = %s"
                        " AND replica = %s",
                        (self.agent, self.replica_id),
                    )
        await self._link.close()
        self._notices.wake_all()

    async def _release_takes(self) -> None:
        """At close, before the lease ends: the takes of this process whose body never
        began go back to the queue for their first run elsewhere (repair.py); left held by
        a replica that stops renewing, a create would be judged `lost` unrun. What
        Postgres cannot settle in time is named, and the judge ends it."""
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                await self._repair.repair(closing=True)
        except (StoreUnavailable, TimeoutError) as exc:
            logger.warning(
                "replica %s closes with the takes it never began unsettled: Postgres at %s "
                "did not answer in time (%s); whatever it recorded of them the judge ends",
                self.replica_id,
                self.where,
                type(exc).__name__,
            )

    # -- liveness ----------------------------------------------------------------------------

    async def _renew(self) -> int:
        """This replica's lease, on the database's clock; `since` starts again after a gap
        of over half a lease (an outage: nobody judges until every owner renewed)."""
        async with self._link.tx("renew") as conn:
            await conn.execute(
                "INSERT INTO replicas AS r (agent, replica, expires_at, renewed_at, since,"
                " lease, advert, state) VALUES (%(a)s, %(r)s,"
                " now() + make_interval(secs => %(l)s), now(), now(), %(l)s, %(v)s, %(s)s)"
                " ON CONFLICT (agent, replica) DO UPDATE SET"
                " expires_at = now() + make_interval(secs => %(l)s), renewed_at = now(),"
                " since = CASE WHEN r.renewed_at >= now() - make_interval(secs => %(l)s / 2)"
                " AND r.expires_at > 'epoch' THEN r.since ELSE now() END,"
                " lease = %(l)s, advert = %(v)s, state = %(s)s",
                {
                    "a": self.agent,
                    "r": self.replica_id,
                    "l": self.lease_ttl,
                    "v": self.advert,
                    "s": self._state_text(),
                },
            )
            if self.advert != self._advertised:  # work may wait for it, or no longer
                await self._rows.notify(conn, "q")
            cursor = await conn.execute(
                "SELECT count(*) FROM replicas WHERE agent = %s AND expires_at > now()",
                (self.agent,),
            )
            row = await cursor.fetchone()
        self._advertised = self.advert
        return int(row[0]) if row else 0

    def _state_text(self) -> str:
        """What `GET /replicas` shows of this replica on the others, written with each
        renewal ('' until `describe`)."""
        if self.state is None:
            return ""
        return orjson.dumps(self.state()).decode()

    async def replica_states(self) -> list[dict[str, Any]]:
        """What each live replica wrote of itself with its last renewal (at most
        REPLICA_STATES), live by the database's clock."""
        async with self._link.tx("replicas") as conn:
            cursor = await conn.execute(
                "SELECT state FROM replicas WHERE agent = %s AND expires_at > now()"
                " AND state <> '' ORDER BY replica LIMIT %s",
                (self.agent, self.REPLICA_STATES),
            )
            rows = await cursor.fetchall()
        found: list[dict[str, Any]] = []
        for (text,) in rows:
            with contextlib.suppress(ValueError):
                state = orjson.loads(text)
                if isinstance(state, dict):
                    found.append(state)
        return found

    async def _keep_alive(self, renewed: float) -> None:
        """Renew every third of a lease (`renewed`: when the open did); at most every second
        judge, repair this replica's takes nobody runs when it is due (repair.py), read what
        notices may have missed (cancels and answers for this replica, ends for its
        waiters), expire parked requests, retention, and the planner's statistics after a
        burst (statistics.py); while Postgres is down, probe it."""
        interval = max(0.05, min(self.lease_ttl / 3, POLL_SECONDS))
        passes = 0
        while True:
            try:
                if not self._link.up and not await self._link.probe():
                    await asyncio.sleep(min(interval, 0.5))
                    continue
                if self._renew_now or time.monotonic() - renewed >= self.lease_ttl / 3:
                    self._renew_now = False
                    alive = await self._renew()
                    renewed = time.monotonic()
                    if self.observer is not None:
                        self.observer.replicas_alive(alive)
                async with self._link.tx("judge") as conn:
                    await self._repair.judge(conn)
                if self._repair.wanted():
                    await self._repair.repair()
                await self._poll_requests()
                await self._expire_parked()
                passes += 1
                if passes % 10 == 0:
                    await self._retention()
                if passes % 5 == 0:
                    async with self._link.tx("statistics") as conn:
                        await statistics.refresh(conn)
                self._notices.queued.set()  # the bounded poll of the queue
                self._notices.poll()
            except StoreUnavailable:
                pass
            except Exception:  # a bug, not an outage: say so and go on
                logger.exception("the store's liveness pass failed")
            await asyncio.sleep(interval)

    async def _poll_requests(self) -> None:
        """Cancels and answers for this replica, deleted as they are read (delivered
        once); a notice only makes this come sooner."""
        async with self._link.tx("requests") as conn:
            cursor = await conn.execute(
                "DELETE FROM cancels WHERE agent = %s AND replica = %s"
                " RETURNING execution_id, reason, settle_within",
                (self.agent, self.replica_id),
            )
            cancels = await cursor.fetchall()
            cursor = await conn.execute(
                "DELETE FROM answers WHERE agent = %s AND replica = %s"
                " RETURNING execution_id, request_id, value",
                (self.agent, self.replica_id),
            )
            answers = await cursor.fetchall()
        for execution_id, reason, within in cancels:
            if self.on_cancel is not None:
                self.on_cancel(execution_id, CancelReason(reason), within)
        for execution_id, request_id, value in answers:
            if self.on_answer is None or not self.on_answer(
                execution_id, int(request_id), codec.loads(value)
            ):
                logger.warning(
                    "the answer to request %d of execution %s reached no waiting ask here",
                    request_id,
                    execution_id,
                )

    async def _expire_parked(self) -> None:
        """A parked request past its timeout: queued again, the request marked expired (its
        next attempt's ask times out at once)."""
        async with self._link.tx("expire") as conn:
            cursor = await conn.execute(
                f"SELECT {ROW}, ledger FROM executions WHERE agent = %s AND ask_expires <= now()"
                " AND status = 'input_required' AND replica = '' FOR UPDATE SKIP LOCKED"
                " LIMIT 100",
                (self.agent,),
            )
            for row in await cursor.fetchall():
                execution = read_row(row)
                ledger = codec.ledger_loads(row[4])
                pending = execution.input_request or {}
                if isinstance(pending.get("request_id"), int):
                    ledger.expire(pending["request_id"])
                execution.status, execution.input_request = ExecutionStatus.QUEUED, None
                await conn.execute(
                    "UPDATE executions SET status = 'queued', doc = %s, ledger = %s,"
                    " ask_expires = NULL, due_at = now(),"
                    " queued_seq = nextval('executions_queue_seq') WHERE agent = %s AND id = %s",
                    (codec.encode(execution), codec.ledger_dumps(ledger), self.agent,
                     execution.execution_id),
                )  # fmt: skip
                await self._rows.notify(conn, "q")

    async def _retention(self) -> None:
        """Bounded deletes of what expired: finished records past the TTL (their events
        with them), idempotency keys, releases' answers."""
        async with self._link.tx("retention") as conn:
            await conn.execute(
                "WITH gone AS (DELETE FROM executions WHERE agent = %(a)s AND id IN (SELECT id"
                " FROM executions WHERE agent = %(a)s AND expires_at <= now() LIMIT %(n)s)"
                " RETURNING id) DELETE FROM events WHERE agent = %(a)s"
                " AND execution_id IN (SELECT id FROM gone)",
                {"a": self.agent, "n": RETENTION_BATCH},
            )
            await conn.execute(
                "DELETE FROM idempotency WHERE agent = %s AND expires_at <= now()", (self.agent,)
            )
            await conn.execute(
                "DELETE FROM release_answers WHERE agent = %s AND expires_at <= now()",
                (self.agent,),
            )

    # -- notices and waiters ------------------------------------------------------------------

    async def _listening(self) -> psycopg.AsyncConnection[Any]:
        """A connection of its own that LISTENs on the agent's channel."""
        conn = await psycopg.AsyncConnection.connect(
            self.url, autocommit=True, connect_timeout=max(1, round(CONNECT_TIMEOUT))
        )
        try:
            await conn.execute(f'LISTEN "{self.channel}"'.encode())
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _listen(self, conn: psycopg.AsyncConnection[Any] | None) -> None:
        """Read notices (reconnecting with a bounded backoff); a notice only wakes: whoever
        is woken reads the store."""
        backoff = 0.1
        while True:
            try:
                if conn is None:
                    conn = await self._listening()
                    backoff = 0.1
                    self._notices.poll()  # what ended while nobody listened
                async with conn:
                    async for notice in conn.notifies():
                        self._noticed(notice.payload)
            except asyncio.CancelledError:
                raise
            except LISTEN_FAILURES:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, POLL_SECONDS)
            conn = None

    def _noticed(self, payload: str) -> None:
        kind, _, rest = payload.partition(":")
        if kind == "e":
            execution_id, _, writer = rest.partition(WRITER)
            if writer != self.replica_id:  # an end written here woke its waiters already
                self._notices.moved(execution_id)
            self._notices.wake_events(execution_id)
        elif kind == "v":
            self._notices.wake_events(rest)
        elif kind == "q":
            self._notices.queued.set()
        elif kind in ("c", "a") and rest == self.replica_id:
            asyncio.get_running_loop().create_task(self._poll_quietly())

    async def _poll_quietly(self) -> None:
        with contextlib.suppress(StoreUnavailable):
            await self._poll_requests()

    def writes_owed(self) -> int:
        return self._owner.writes_owed()

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the outbox until `deadline` (monotonic); the ends still owed then."""
        return await self._owner.flush(deadline)

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._repair.deliver_orphans(runs, adopt)
