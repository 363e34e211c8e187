"""The owner's side of an execution: the outbox (events, ends, hand-offs, retries and
unclaims, written in order, each fenced in its `WHERE` by owner and attempt: zero rows is a
fenced write, counted), checkpoints, and the owner's own writes that wait an outage out. A
part of `PostgresStore` that no role is forwarded to: the parts of `Records`, `Claims`,
`Asks` and `Events` (records.py, claims.py, inputs.py, reads.py) write through it, and the
repair reads what it owes (repair.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agent_server.model.context import StaleAttempt
from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.waiting import Closing, recorded_within
from agent_server.store import roles
from agent_server.store.base import FINISHED_EVENT, StoreObserver, StoreUnavailable
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import Conn
from agent_server.store.postgres.notices import Notices
from agent_server.store.postgres.rows import COUNTED, FENCE, AgentRows

logger = logging.getLogger("agent_server.store")

#: Events the outbox holds at most: past it an event is dropped (counted), never an end.
EVENTS_PENDING = 10_000
#: Writes of one outbox transaction at most, and the bytes of their documents past which a
#: batch takes no more. A batch of ends alone is one statement and takes ENDS_BATCH: a
#: drain's 90,000 ends left in 450 statements of 200, and 33,600 were still owed at exit;
#: in statements of 1,000, 2,000 (bench/RESULTS.md, "R55h").
BATCH = 200
ENDS_BATCH = 1000
BATCH_BYTES = 4 * 1024 * 1024
#: Backoff of the outbox (and of the owner's own writes) while Postgres is down.
BACKOFF_FIRST, BACKOFF_MAX = 0.05, 1.0
#: The types of an end's values in its statement (`_ends`), in their order.
_TYPES = ("text", "text", "integer", "text", "text", "bigint", "bigint")
#: Finished records one trim looks at (and deletes) at most, oldest first.
TRIM_SCAN = 1000

T = TypeVar("T")
#: Statuses as a record's document writes them.
QUEUED = ExecutionStatus.QUEUED.value
RUNNING = ExecutionStatus.RUNNING.value
INPUT_REQUIRED = ExecutionStatus.INPUT_REQUIRED.value


@dataclass
class Owed:
    """A write the owner owes the store, its arguments taken when it was owed."""

    kind: str
    execution: Execution
    args: dict[str, Any] = field(default_factory=dict)


class Owner:
    """The outbox and checkpoints of `PostgresStore`. It keeps the checkpoints a migrating
    take was given (`migrating`) until the body's first checkpoint; `notices` is told of
    each end written, and `webhooks` keeps the handler an end that owes a delivery wakes."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        max_retained: int,
        max_retained_bytes: int,
        max_events: int,
        observer: StoreObserver | None,
        notices: Notices,
        webhooks: roles.Webhooks,
    ) -> None:
        self._rows = rows
        self._max_retained = max_retained
        self._max_retained_bytes = max_retained_bytes
        self._max_events = max_events
        self._observer = observer
        self._notices = notices
        self._webhooks = webhooks
        self._owed: deque[Owed] = deque()
        self._owed_event = asyncio.Event()
        self._events_owed = 0
        self.events_dropped = 0
        self.fenced = 0
        #: Per execution id, the checkpoint (and its version) a migrating take was given,
        #: as stored: the owner's writes keep it, never the migrated state in memory, until
        #: the body's first checkpoint (a hand-off before it is migrated again from the
        #: same one).
        self._unread: dict[str, tuple[str | None, str | None]] = {}

    def migrating(self, execution_id: str, checkpoint: str | None, version: str | None) -> None:
        """A take migrated in its taker's memory only (claims.py): its stored checkpoint
        is what the owner's writes keep until the body's first checkpoint."""
        self._unread[execution_id] = (checkpoint, version)

    def as_stored(self, execution: Execution, *, last: bool) -> dict[str, Any]:
        """The checkpoint fields a document of `execution` is written with: the stored ones
        while a migration's are unread ({} otherwise); `last`: this attempt's last write."""
        kept = self._unread.pop if last else self._unread.get
        stored = kept(execution.execution_id, None)
        if stored is None:
            return {}
        return {"checkpoint": stored[0], "checkpoint_version": stored[1]}

    def wake(self) -> None:
        """Postgres is back: the writer looks at once."""
        self._owed_event.set()

    def owed_ids(self, closing: bool) -> set[str]:
        """Ids with an owner's write owed. At close an unclaim still owed is the repair's
        (the outbox no longer runs); an end still owed is not (its body began)."""
        return {
            owed.execution.execution_id
            for owed in self._owed
            if owed.kind != "emit" and not (closing and owed.kind == "unclaim")
        }

    # -- the outbox ---------------------------------------------------------------------------

    def _put(self, kind: str, execution: Execution, **args: Any) -> None:
        args.update(
            agent=self._rows.agent,
            id=execution.execution_id,
            owner=execution.replica,
            attempt=execution.attempt,
        )
        self._owed.append(Owed(kind, execution, args))
        self._owed_event.set()

    def emit(self, execution: Execution, event: Event) -> None:
        if self._events_owed >= EVENTS_PENDING:
            self.events_dropped += 1
            return
        self._events_owed += 1
        self._put("emit", execution, seq=event.id, event=event.event, data=event.data)

    def end(self, execution: Execution) -> None:
        execution.recorded = asyncio.get_running_loop().create_future()
        self._unread.pop(execution.execution_id, None)
        self._put(
            "end",
            execution,
            status=execution.status.value,
            doc=codec.encode(execution),
            bytes=codec.result_bytes(execution),
            kept=codec.kept_bytes(execution),
            webhook=execution.webhook_url,
            data=None if execution.webhook_url is None else codec.dumps(execution.to_json()),
        )

    def hand_off(self, execution: Execution) -> None:
        self._queue_next(execution, None)

    def retry(self, execution: Execution, delay: float) -> None:
        self._queue_next(execution, max(0.0, delay))

    def _queue_next(self, execution: Execution, delay: float | None) -> None:
        doc = codec.encode_with(
            execution,
            status=QUEUED,
            replica="",
            attempt=execution.attempt + 1,
            input_request=None,
            scheduled_at=None if delay is None else time.time() + delay,
            **self.as_stored(execution, last=True),
        )
        self._put("next", execution, doc=doc, delay=delay or 0.0)

    def give_back(self, execution: Execution) -> None:
        """Taken, never begun here: back to the head of the queue, the same attempt."""
        logger.info(
            "execution %s (%s): taken from the queue as admission closed; it does not start here",
            execution.execution_id,
            execution.reasoner,
        )
        self._put("unclaim", execution, take=execution.take, doc=codec.encode_with(
            execution, status=QUEUED, replica="",
            **self.as_stored(execution, last=True)))  # fmt: skip

    def writes_owed(self) -> int:
        return len(self._owed)

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        """Whether the end is written within `timeout` seconds (and before `closing` is
        set): False when it was refused (fenced) or is still owed."""
        return await recorded_within(execution.recorded, timeout, closing)

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the outbox until `deadline` (monotonic); the ends still owed then."""
        while self._owed and time.monotonic() < deadline:
            self._owed_event.set()
            await asyncio.sleep(0.01)
        return [o.execution for o in self._owed if o.kind == "end"]

    async def write_owed(self) -> None:
        """The outbox's writer: batches in order, one transaction each; while Postgres is
        down they wait (backing off) and are written once it answers."""
        backoff = BACKOFF_FIRST
        while True:
            if not self._owed:
                self._owed_event.clear()
                await self._owed_event.wait()
            batch = self._batch()
            try:
                outcomes = await self._write(batch)
            except StoreUnavailable:
                if self._observer is not None:
                    self._observer.write_retried("connection")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
                continue
            backoff = BACKOFF_FIRST
            for owed, written in zip(batch, outcomes, strict=True):
                self._owed.popleft()
                if owed.kind == "emit":
                    self._events_owed -= 1
                if not written and owed.kind != "emit":
                    self.fenced += 1
                    logger.warning(
                        "execution %s: the %s of attempt %d refused: the record is no "
                        "longer this attempt's",
                        owed.execution.execution_id,
                        owed.kind,
                        owed.args["attempt"],
                    )
                    if self._observer is not None:
                        self._observer.fenced_write(owed.execution)
                future = owed.execution.recorded if owed.kind == "end" else None
                if future is not None and not future.done():
                    future.set_result(written)
                if written and owed.kind == "end":
                    # Its waiters here take the record as written, one copy for them all
                    # as one read would be (the notice still tells the other replicas').
                    self._notices.moved(owed.execution.execution_id, owed.args["doc"])
            wake = self._webhooks.on_webhook
            if any(o.kind == "end" and o.args["webhook"] for o in batch) and wake:
                wake()

    def _batch(self) -> list[Owed]:
        """The next writes, in order: at most BATCH (ENDS_BATCH while they are all ends), and
        about BATCH_BYTES of documents (a burst of big results leaves in transactions that
        each end well within the command timeout, never one that times out again and
        again)."""
        batch: list[Owed] = []
        size = 0
        ends_only = True
        for owed in self._owed:
            ends_only = ends_only and owed.kind == "end"
            most = ENDS_BATCH if ends_only else BATCH
            if batch and (len(batch) >= most or size >= BATCH_BYTES):
                break
            batch.append(owed)
            size += len(owed.args.get("doc") or "") + len(owed.args.get("data") or "")
        return batch

    async def _write(self, batch: list[Owed]) -> list[bool]:
        """One transaction for the batch, in order; each run of ends in it is one statement
        (a drain's thousands of ends leave in a few round trips), and a batch that is only
        ends without webhooks is that statement alone, atomic by itself."""
        outcomes: list[bool] = []
        one = all(o.kind == "end" and not o.args["webhook"] for o in batch)
        async with self._rows.link.tx("outbox", one=one) as conn:
            retained: tuple[int, int] | None = None
            index = 0
            while index < len(batch):
                owed = batch[index]
                if owed.kind == "end":
                    run = [owed]
                    while index + len(run) < len(batch) and batch[index + len(run)].kind == "end":
                        run.append(batch[index + len(run)])
                    written, retained = await self._ends(conn, run)
                    for done, ended in zip(written, run, strict=True):
                        if done and ended.args["webhook"]:
                            await self._rows.owe_webhook(
                                conn, ended.execution, f"{ended.args['id']}.finished",
                                FINISHED_EVENT, ended.args["data"])  # fmt: skip
                    outcomes.extend(written)
                    index += len(run)
                    continue
                index += 1
                outcomes.append(await self._write_one(conn, owed))
            if retained is not None:
                await self._trim(conn, *retained)
        return outcomes

    async def _write_one(self, conn: Conn, owed: Owed) -> bool:
        """An event, a hand-off or retry (`next`), or an unclaim, fenced."""
        args = owed.args
        if owed.kind == "emit":
            cursor = await conn.execute(
                "INSERT INTO events (agent, execution_id, seq, event, data)"
                " SELECT %(agent)s, %(id)s, %(seq)s, %(event)s, %(data)s"
                f" WHERE EXISTS (SELECT 1 FROM executions WHERE {FENCE})"
                # The attempt that parked it: its events still owed are written.
                " OR EXISTS (SELECT 1 FROM executions WHERE agent = %(agent)s"
                " AND id = %(id)s AND parked_by = %(owner)s || '|' || %(attempt)s)"
                " ON CONFLICT DO NOTHING",
                args,
            )
            if cursor.rowcount:
                await conn.execute(
                    "DELETE FROM events WHERE agent = %(agent)s AND execution_id = %(id)s"
                    " AND seq <= %(seq)s - %(keep)s",
                    {**args, "keep": self._max_events},
                )
                await self._rows.notify(conn, f"v:{args['id']}")
            return True
        if owed.kind == "next":
            cursor = await conn.execute(
                "UPDATE executions SET status = 'queued', replica = '',"
                " attempt = attempt + 1, doc = %(doc)s, unbegun = false,"
                " due_at = now() + make_interval(secs => %(delay)s),"
                " queued_seq = nextval('executions_queue_seq'), ask_expires = NULL"
                f" WHERE {FENCE}",
                args,
            )
        else:  # unclaim: the same attempt, at the head of the queue
            cursor = await conn.execute(
                "UPDATE executions SET status = 'queued', replica = '', doc = %(doc)s,"
                " unbegun = false, due_at = 'epoch', take = ''"
                f" WHERE {FENCE} AND take = %(take)s",
                args,
            )
        if cursor.rowcount:
            await self._rows.notify(conn, "q")
            await self._rows.notify(conn, f"e:{args['id']}")
        return bool(cursor.rowcount)

    async def _ends(self, conn: Conn, run: list[Owed]) -> tuple[list[bool], tuple[int, int]]:
        """One statement for a run of ends: each written (fenced by owner, attempt and
        status), its waiters told, and counted in what the agent retains (the `retained`
        row, whose totals it returns). Which were written, in order. One end's values go
        as plain parameters, a run's as arrays (unnest)."""
        fields = ("id", "owner", "attempt", "status", "doc", "bytes", "kept")
        params: dict[str, Any] = {
            "ttl": self._rows.result_ttl,
            "channel": self._rows.channel,
            "agent": self._rows.agent,
            "me": self._rows.replica_id,
        }
        typed = list(zip(fields, _TYPES, strict=True))
        if len(run) == 1:
            given = "SELECT " + ", ".join(f"%(g_{f})s::{t}" for f, t in typed)
            params.update({f"g_{f}": run[0].args[f] for f in fields})
        else:
            # Binary: a text array is escaped element by element in Python (50 us a
            # document), a binary one is copied (bench/RESULTS.md, "PG4").
            arrays = ", ".join(f"%(g_{f})b::{t}[]" for f, t in typed)
            given = f"SELECT * FROM unnest({arrays})"
            params.update({f"g_{f}": [o.args[f] for o in run] for f in fields})
        cursor = await conn.execute(
            f"WITH given (id, owner, attempt, status, doc, size, kept) AS ({given}),"
            " done AS (UPDATE executions e SET status = g.status, doc = g.doc,"
            " due_at = NULL, ledger = NULL, ask_expires = NULL, unbegun = false,"
            " finished = clock_timestamp(),"
            " expires_at = now() + make_interval(secs => %(ttl)s), result_bytes = g.size,"
            " kept_bytes = g.kept"
            " FROM given g WHERE e.agent = %(agent)s AND e.id = g.id AND e.replica = g.owner"
            " AND e.attempt = g.attempt AND e.status IN ('running', 'input_required')"
            " RETURNING e.id, e.kept_bytes),"
            # The writer named after the id: its own notice wakes nobody here (it woke its
            # waiters with the record as written), the others' replicas read.
            " told AS (SELECT pg_notify(%(channel)s, 'e:' || id || chr(31) || %(me)s)"
            " FROM done),"
            f" counted AS ({COUNTED} RETURNING records, bytes)"
            " SELECT (SELECT coalesce(array_agg(id), '{}') FROM done),"
            " 0 * (SELECT count(*) FROM told),"
            " coalesce((SELECT records FROM counted), 0),"
            " coalesce((SELECT bytes FROM counted), 0)",
            params,
        )
        row = await cursor.fetchone()
        assert row is not None  # one row, whatever the update did
        written = set(row[0])
        return [o.args["id"] in written for o in run], (int(row[2]), int(row[3]))

    async def _trim(self, conn: Conn, records: int, size: int) -> None:
        """At most `max_retained` finished records, and at most `max_retained_bytes` of
        their inputs, results and errors (the newest stays, even alone over it): when the counts
        say so, the oldest go (their events with them), at most TRIM_SCAN a statement, by
        the index of finished records. Past the count it trims a hundredth below it, so a
        full store trims once in that many ends, not at each."""
        excess = records - max(0, self._max_retained)
        if excess > 0:
            excess += self._max_retained // 100
        over = size - max(0, self._max_retained_bytes)
        if excess <= 0 and over <= 0:
            return
        async with conn.transaction():
            await self._trim_oldest(conn, records, excess, over)

    async def _trim_oldest(self, conn: Conn, records: int, excess: int, over: int) -> None:
        """The oldest TRIM_SCAN finished records in index order (`executions_finished`,
        migration 3), whatever the statistics say: a table that grew since its last ANALYZE
        (minutes, at a start or under churn) has the planner fetch every finished record
        and sort them, at each trim (bench/RESULTS.md, "PG5")."""
        await conn.execute("SET LOCAL enable_sort = off")
        await conn.execute("SET LOCAL enable_bitmapscan = off")
        await conn.execute(
            "WITH oldest AS (SELECT id, row_number() OVER w AS n,"
            " sum(kept_bytes) OVER w - kept_bytes AS before FROM (SELECT id, finished,"
            " kept_bytes FROM executions WHERE agent = %(agent)s AND finished IS NOT NULL"
            " ORDER BY finished, id LIMIT %(scan)s) AS o WINDOW w AS (ORDER BY finished, id)),"
            " gone AS (DELETE FROM executions WHERE agent = %(agent)s AND id IN (SELECT id"
            " FROM oldest WHERE (n <= %(excess)s OR before < %(over)s) AND n < %(records)s)"
            " RETURNING id)"
            " DELETE FROM events WHERE agent = %(agent)s AND execution_id IN (SELECT id FROM gone)",
            {
                "agent": self._rows.agent,
                "scan": TRIM_SCAN,
                "excess": excess,
                "over": over,
                "records": records,
            },
        )

    # -- the owner's own writes, waiting an outage out ---------------------------------------

    async def waiting_out(self, write: Callable[[], Awaitable[T]]) -> T:
        """`write` (an owner's own write: a checkpoint, an ask), Postgres down waited out
        with the outbox's backoff (a cancellation still ends the wait): what the reasoner
        does next depends on it being written."""
        backoff = BACKOFF_FIRST
        while True:
            try:
                return await write()
            except StoreUnavailable:
                if not self._rows.link.is_open:
                    raise
                if self._observer is not None:
                    self._observer.write_retried("connection")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    def stale(self, operation: str, execution: Execution) -> StaleAttempt:
        """An owner's own write fenced: counted as the outbox's are, and what it raises."""
        self.fenced += 1
        if self._observer is not None:
            self._observer.fenced_write(execution)
        return StaleAttempt(
            f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
            f"owns it ({operation} refused)"
        )

    async def checkpoint(self, execution: Execution, state: str) -> None:
        args = {
            "agent": self._rows.agent,
            "id": execution.execution_id,
            "owner": execution.replica,
            "attempt": execution.attempt,
            "doc": codec.encode_with(
                execution,
                checkpoint=state,
                checkpoint_version=execution.version,
            ),
            "version": execution.version or "",
        }

        async def write() -> int:
            async with self._rows.link.tx("checkpoint") as conn:
                # The column the claims read the checkpoint's version from (claims.py).
                cursor = await conn.execute(
                    "UPDATE executions SET doc = %(doc)s, checkpoint_version = %(version)s"
                    f" WHERE {FENCE}",
                    args,
                )
                return cursor.rowcount

        if not await self.waiting_out(write):
            raise self.stale("checkpoint", execution)
        self._unread.pop(execution.execution_id, None)  # its own from now on
        execution.checkpoint = state
        execution.checkpoint_version = execution.version
