"""The verdicts on held rows nobody runs: a dead owner's (its lease lapsed), and this
replica's own takes it runs no task for (a create or a claim whose COMMIT ran while its
answer was lost, or whose caller was cancelled); part of `PostgresStore`.

Accepted work runs (section 12, invariant 3), with the input it was accepted with (every
row's document keeps its body). Every take writes a token into its row (`take`) that opens
with the taking process's `incarnation`, so the row itself says which process took it: one
this process took and runs no task for never began its body here (a body this process
began has its task here, or its end or hand-off owed or written), and goes back to the
head of the queue for its first run, its attempt unchanged; one an earlier process of this
replica id took is judged as a dead owner's. Each repair is one transaction on the locked
rows, their owner, status and take read under the lock.

A part of `PostgresStore` that no role is forwarded to but `deliver_orphans`: it keeps the
takes on their way (`creating`, `claiming`, which the `Records` and `Claims` parts write)
and the tokens they write (`token`); the store's liveness runs the judge and the repair.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from agent_server.model.execution import Execution, ExecutionStatus, log_fields
from agent_server.store.base import StoreObserver
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import COMMAND_TIMEOUT, Conn
from agent_server.store.postgres.owner import Owner
from agent_server.store.postgres.rows import ROW, START, AgentRows, read_row
from agent_server.store.values import OUTAGE_LEASES

logger = logging.getLogger("agent_server.store")

#: Held rows of this replica looked at per repair; the rest wait for the next one.
ORPHAN_SCAN = 10_000
#: Seconds between two repairs when nothing made one due: a commit whose answer was lost
#: and that no doubt was raised for (a very late one, after a long pause) is found within it.
REPAIR_EVERY = 10.0
#: Held by owners that lapsed, judged per pass at most.
JUDGE_LIMIT = 1000


class Repair:
    """The judge of dead owners and the repair of this replica's takes; `owner` says which
    writes are owed (not orphans)."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        lease_ttl: float,
        observer: StoreObserver | None,
        owner: Owner,
    ) -> None:
        self._rows = rows
        self._lease_ttl = lease_ttl
        self._observer = observer
        self._owner = owner
        #: This process among those that used its replica id: every take (a create, a
        #: claim) writes a token opening with it into its row (`take`), so the repair knows
        #: which takes are this process's.
        self.incarnation = os.urandom(4).hex()
        #: Ids whose create is on its way, and tokens of claims (and begins) on their way:
        #: not orphans, whatever the rows say (their answer, read after the repair's, starts
        #: them).
        self.creating: set[str] = set()
        self.claiming: set[str] = set()
        #: What the registry says: whether a task of this process runs an id, and `adopt`,
        #: which runs a create that got no answer after all (True when it does). None until
        #: `deliver_orphans`: a store no registry runs knows of no task, and repairs nothing.
        self._runs: Callable[[str], bool] | None = None
        self._adopt: Callable[[str], bool] | None = None
        #: A repair is due at the next liveness pass (at open: a replica id used before).
        self._repair_due = True
        #: Until when (monotonic) a commit whose answer was lost may still land: every pass
        #: repairs meanwhile.
        self._doubt_until = 0.0
        self._repaired_at = -float("inf")

    def token(self, *, start: bool = False) -> str:
        """A take's token: this process's incarnation, `START` for a create, then its own."""
        return f"{self.incarnation}{START if start else ''}{os.urandom(8).hex()}"

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._runs = runs
        self._adopt = adopt

    def doubt(self) -> None:
        """A take got no answer it can trust (a timeout, a reset, its caller cancelled):
        its COMMIT may have run, or run yet (a paused Postgres reads it late). The repair
        looks at the next pass and at every pass for a lease and a command timeout after
        it; a later landing is found by the repair every REPAIR_EVERY."""
        self._repair_due = True
        self._doubt_until = time.monotonic() + self._lease_ttl + COMMAND_TIMEOUT

    def wanted(self) -> bool:
        """Whether a repair is due at this liveness pass."""
        if self._runs is None:
            return False
        now = time.monotonic()
        return (
            self._repair_due or now < self._doubt_until or now - self._repaired_at >= REPAIR_EVERY
        )

    # -- a dead owner's verdict --------------------------------------------------------------

    async def judge(self, conn: Conn, ids: list[str] | None = None) -> list[Execution]:
        """Move the held records of owners whose lease lapsed (once: the rows are locked,
        the status rechecked), if this replica may judge: it renewed for a whole lease and
        lately. An owner whose lease lapsed before this replica's run of renewals began
        (an outage of the store stopped everyone's, and it has not reconnected yet) is
        judged only once this replica's run is OUTAGE_LEASES of its leases old: a store
        outage is nobody's death, whoever reconnects first."""
        cursor = await conn.execute(
            "SELECT since, lease FROM replicas WHERE agent = %(a)s AND replica = %(r)s"
            " AND renewed_at >= now() - make_interval(secs => lease / 2)"
            " AND since <= now() - make_interval(secs => lease)",
            {"a": self._rows.agent, "r": self._rows.replica_id},
        )
        mine = await cursor.fetchone()
        if mine is None:
            return []
        only = "" if ids is None else " AND e.id = ANY(%(ids)s)"
        cursor = await conn.execute(
            f"SELECT {ROW}, unbegun, retries FROM executions e WHERE agent = %(a)s"
            " AND status IN ('running', 'input_required') AND replica <> ''"
            " AND NOT EXISTS (SELECT 1 FROM replicas r WHERE r.agent = e.agent"
            " AND r.replica = e.replica AND (r.expires_at > now()"
            " OR (r.expires_at < %(since)s"
            " AND %(since)s > now() - make_interval(secs => %(grace)s))))"
            f"{only} LIMIT {JUDGE_LIMIT} FOR UPDATE SKIP LOCKED",
            {"a": self._rows.agent, "ids": ids, "since": mine[0], "grace": mine[1] * OUTAGE_LEASES},
        )
        moved: list[Execution] = []
        for row in await cursor.fetchall():
            execution = read_row(row)
            why = f"replica {execution.replica} stopped renewing its liveness"
            await self._verdict(conn, execution, bool(row[4]), int(row[5]), why)
            moved.append(execution)
        return moved

    async def _verdict(
        self, conn: Conn, execution: Execution, unbegun: bool, retries: int, why: str
    ) -> None:
        """A gone owner's held row (locked): a take whose body never began goes back to the
        queue, its attempt unchanged; resumable work with attempts left is queued as its
        next attempt; the rest is `lost` (counted here)."""
        if unbegun and execution.status is ExecutionStatus.RUNNING:
            execution.status, execution.replica = ExecutionStatus.QUEUED, ""
            await self._requeue(conn, execution, retries, "'epoch'")
        elif retries + 1 < execution.max_attempts:
            execution.status, execution.replica = ExecutionStatus.QUEUED, ""
            execution.attempt += 1
            execution.input_request = None
            await self._requeue(conn, execution, retries + 1, "now()")
            logger.warning(
                "execution %s (%s): %s; attempt %d queued",
                execution.execution_id,
                execution.reasoner,
                why,
                execution.attempt,
            )
        else:
            execution.status = ExecutionStatus.LOST
            execution.status_reason = None
            execution.error = {"type": "ExecutionLost", "message": why}
            execution.input_request = None
            cursor = await conn.execute("SELECT extract(epoch FROM now())")
            now = await cursor.fetchone()
            execution.finished_at = float(now[0]) if now else None
            execution._duration = None
            await self._rows.finish(conn, execution)
            if self._observer is not None:
                self._observer.execution_lost(execution)

    async def _requeue(self, conn: Conn, execution: Execution, retries: int, due: str) -> None:
        await conn.execute(
            "UPDATE executions SET status = 'queued', replica = '', attempt = %s, doc = %s,"
            f" retries = %s, unbegun = false, take = '', due_at = {due},"
            " queued_seq = nextval('executions_queue_seq') WHERE agent = %s AND id = %s",
            (execution.attempt, codec.encode(execution), retries, self._rows.agent,
             execution.execution_id),
        )  # fmt: skip
        await self._rows.notify(conn, "q")
        await self._rows.notify(conn, f"e:{execution.execution_id}")

    # -- this replica's own takes -------------------------------------------------------------

    def _on_its_way(self, execution_id: str, take: str, owed: set[str]) -> bool:
        """A write of its owner is owed, or its take is on its way (a create or a claim
        sent, answered after the repair's read): not an orphan yet, looked at again."""
        return execution_id in owed or execution_id in self.creating or take in self.claiming

    async def repair(self, *, closing: bool = False) -> None:
        """Every held row of this replica with no task here and no write owed: one this
        process took never began (its create's answer, or its claim's, was lost, or came
        once admission had closed), so it runs here after all if it is a create the
        registry still holds (`adopt`, never at close), else goes back to the head of the
        queue for its first run, resumable or not, with its body (never failed unrun).
        One an earlier process of this replica id took may have begun there, and that
        process is gone: judged as a dead owner's (a claim it never began goes back as
        well; else its next attempt while attempts are left, else `lost`). Raises
        StoreUnavailable when Postgres cannot answer (due again)."""
        runs = self._runs
        if runs is None:
            return
        self._repair_due = False
        self._repaired_at = time.monotonic()
        try:
            async with self._rows.link.tx("repair") as conn:
                cursor = await conn.execute(
                    "SELECT id, take FROM executions WHERE agent = %s AND replica = %s"
                    " AND status IN ('running', 'input_required') LIMIT %s",
                    (self._rows.agent, self._rows.replica_id, ORPHAN_SCAN),
                )
                owed = self._owner.owed_ids(closing)
                orphans: list[str] = []
                for key, take in await cursor.fetchall():
                    if runs(key):
                        continue
                    if self._on_its_way(key, take, owed):
                        self._repair_due = True
                        continue
                    orphans.append(key)
                if not orphans:
                    return
                cursor = await conn.execute(
                    f"SELECT {ROW}, take, unbegun, retries FROM executions WHERE agent = %s"
                    " AND id = ANY(%s) AND replica = %s AND status IN ('running',"
                    " 'input_required') FOR UPDATE SKIP LOCKED",
                    (self._rows.agent, orphans, self._rows.replica_id),
                )
                rows = await cursor.fetchall()
                if len(rows) < len(orphans):  # locked by a write: looked at again
                    self._repair_due = True
                for row in rows:
                    execution = read_row(row)
                    take, unbegun, retries = str(row[4]), bool(row[5]), int(row[6])
                    # Looked at again with the row locked: a take that arrived meanwhile
                    # is its own (a claim's begin waits for this lock, fenced by the take).
                    key = execution.execution_id
                    if runs(key) or self._on_its_way(key, take, self._owner.owed_ids(closing)):
                        self._repair_due = True
                        continue
                    await self._orphan(conn, execution, take, unbegun, retries, closing)
        except BaseException:
            self._repair_due = True
            raise

    async def _orphan(
        self,
        conn: Conn,
        execution: Execution,
        take: str,
        unbegun: bool,
        retries: int,
        closing: bool,
    ) -> None:
        execution_id = execution.execution_id
        mine = take.startswith(self.incarnation)
        if not mine or execution.status is not ExecutionStatus.RUNNING:
            logger.warning(
                "execution %s (%s): replica %s holds attempt %d, taken by %s, and runs no "
                "task for it; judged as a dead owner's",
                execution_id,
                execution.reasoner,
                self._rows.replica_id,
                execution.attempt,
                "this process" if mine else "an earlier process of this replica id",
                extra={"fields": log_fields(execution)},
            )
            why = (
                f"replica {self._rows.replica_id} runs no task for it"
                if mine
                else f"an earlier process of replica {self._rows.replica_id} took it and is gone"
            )
            await self._verdict(conn, execution, unbegun, retries, why)
            return
        start = take[len(self.incarnation) :].startswith(START)
        if start and not closing and self._adopt is not None and self._adopt(execution_id):
            logger.warning(
                "execution %s: its start got no answer from Postgres in time but was "
                "recorded; it runs now",
                execution_id,
            )
            return
        logger.warning(
            "execution %s (%s): replica %s took attempt %d but never began it (its %s got "
            "no answer from Postgres in time, or came too late), so it never started; it "
            "goes back to the queue for its first run",
            execution_id,
            execution.reasoner,
            self._rows.replica_id,
            execution.attempt,
            "start" if start else "claim",
            extra={"fields": log_fields(execution)},
        )
        execution.status, execution.replica = ExecutionStatus.QUEUED, ""
        await self._requeue(conn, execution, retries, "'epoch'")
