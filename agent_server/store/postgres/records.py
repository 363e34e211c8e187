"""Writing records: creates (idempotency keys, session policies, the queue's bound),
checkpoints and ends (through the owner's writes), forgets and cancel requests; the
`Records` part of `PostgresStore`, which keeps where cancel requests for this replica go
(`on_cancel`). Plain creates made together share a statement (coalesce.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.model.scheduling import SESSION_GATED
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
    StoreUnavailable,
)
from agent_server.store.postgres.coalesce import Coalesced
from agent_server.store.postgres.link import Conn
from agent_server.store.postgres.notices import Notices
from agent_server.store.postgres.owner import Owner
from agent_server.store.postgres.repair import Repair
from agent_server.store.postgres.rows import LIVE, ROW, TERMINAL, AgentRows, columns, read_row

_INSERT = (
    "INSERT INTO executions (agent, id, status, reasoner, session, tenant, started_by,"
    " schedule_id, created_at, replica, attempt, ckey, climit, doc, take, gated, due_at,"
    " queued_seq) SELECT %(agent)s, %(id)s, %(status)s, %(reasoner)s, %(session)s,"
    " %(tenant)s, %(started_by)s, %(schedule_id)s, %(created_at)s, %(replica)s,"
    " %(attempt)s, %(ckey)s, %(climit)s, %(doc)s, %(take)s, %(gated)s,"
    # The delay's rest from the moment it was measured (clock_timestamp(), not now(): the
    # transaction's start, which a wait for the session's lock leaves behind).
    " CASE WHEN %(queued)s THEN clock_timestamp() + make_interval(secs => %(delay)s) END,"
    " CASE WHEN %(queued)s THEN nextval('executions_queue_seq') END"
    # Running here only while this replica's lease holds: one that lapsed (a pause) would
    # be judged lost at once by the others; it renews first.
    " WHERE %(queued)s OR EXISTS (SELECT 1 FROM replicas WHERE agent = %(agent)s"
    " AND replica = %(replica)s AND expires_at > now())"
    " RETURNING extract(epoch FROM due_at)"
)

#: A run of plain creates' columns and their types, sent as binary arrays (owner.py
#: `_ends` says why); `_OWN` are not the document's `columns`.
_PLAIN = (
    ("id", "text"), ("status", "text"), ("reasoner", "text"), ("session", "text"),
    ("tenant", "text"), ("started_by", "text"), ("schedule_id", "text"),
    ("created_at", "float8"), ("replica", "text"), ("attempt", "int4"), ("ckey", "text"),
    ("climit", "int4"), ("doc", "text"), ("take", "text"),
)  # fmt: skip
_OWN = ("id", "take")
_INSERT_RUN = (
    f"INSERT INTO executions (agent, {', '.join(name for name, _ in _PLAIN)})"
    " SELECT %(agent)s, g.* FROM unnest("
    + ", ".join(f"%({name})b::{kind}[]" for name, kind in _PLAIN)
    + f") AS g ({', '.join(name for name, _ in _PLAIN)})"
    # Each running here only while its replica's lease holds, as `_INSERT` says.
    " WHERE EXISTS (SELECT 1 FROM replicas r WHERE r.agent = %(agent)s"
    " AND r.replica = g.replica AND r.expires_at > now()) RETURNING id"
)


class Records(roles.Records):
    """The record writes of `PostgresStore`: its takes are the repair's to settle
    (`repair`), `claims` keeps `on_unqueued`, which a cancelled queued execution tells, and
    `renew_soon` asks the liveness to renew at its next pass."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        owner: Owner,
        repair: Repair,
        notices: Notices,
        claims: roles.Claims,
        renew_soon: Callable[[], None],
    ) -> None:
        self._rows = rows
        self._owner = owner
        self._repair = repair
        self._notices = notices
        self._claims = claims
        self._renew_soon = renew_soon
        #: Plain creates made together, one statement (`_insert_rows`).
        self._inserts: Coalesced[Execution, bool] = Coalesced(self._insert_rows)

    async def close(self) -> None:
        """Wait for the statements the plain creates made together still run."""
        await self._inserts.close()

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        """One transaction: refused while its session is released; with a key already used
        for the same request, that execution; else the record (and the key: a unique row,
        so one execution per key across replicas)."""
        queued = execution.status is ExecutionStatus.QUEUED
        # The take's token: this process took it (the repair's evidence that its body began
        # here or never did, repair.py).
        execution.take = execution.take or self._repair.token(start=True)
        if queued:
            return await self._create(execution, idempotency, max_queued)
        execution_id = execution.execution_id
        self._repair.creating.add(execution_id)
        try:
            return await self._create(execution, idempotency, max_queued)
        except (StoreUnavailable, asyncio.CancelledError):
            # Its COMMIT may have run (a reset or a timeout as it was answered), or its
            # caller was cut as it ran (the listener's close at shutdown, a client gone):
            # the repair runs it here if the registry still has it, else queues it for its
            # first run elsewhere.
            self._repair.doubt()
            raise
        finally:
            self._repair.creating.discard(execution_id)

    async def _create(
        self, execution: Execution, idempotency: Idempotency | None, max_queued: int
    ) -> Execution | None:
        session = execution.session_name
        queued = execution.status is ExecutionStatus.QUEUED
        # A plain start (no session, no key, not queued) is its INSERT alone: one round trip.
        if session is None and idempotency is None and not queued:
            if not await self._inserts(execution):
                self._renew_soon()
                raise StoreUnavailable(
                    f"replica {execution.replica}'s lease lapsed: it renews before it starts work"
                )
            return None
        async with self._rows.link.tx("enqueue" if queued else "create") as conn:
            if session is not None:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"{self._rows.agent}\x1fsession\x1f{session}",),
                )
                if await self._releasing(conn, session):
                    raise SessionReleasing(execution.session_id)
            key = None if idempotency is None else scoped(execution.tenant, idempotency.key)
            if idempotency is not None and key is not None:
                earlier = await self._first_use(conn, execution, idempotency, key)
                if earlier is not None:
                    return earlier
            others: list[str] = []
            if execution.session_policy is not None and session is not None:
                cursor = await conn.execute(
                    "SELECT id FROM executions WHERE agent = %s AND session = %s"
                    " AND status IN ('queued', 'running', 'input_required')"
                    " ORDER BY created_at, id",
                    (self._rows.agent, session),
                )
                others = [row[0] for row in await cursor.fetchall()]
                if others and execution.session_policy == "reject":
                    raise SessionTaken(others[-1])
            if queued:
                cursor = await conn.execute(
                    "SELECT count(*) FROM executions WHERE agent = %s AND status = 'queued'",
                    (self._rows.agent,),
                )
                row = await cursor.fetchone()
                if row is not None and int(row[0]) >= max_queued:
                    raise QueueFull(max_queued)
            delay = 0.0
            if execution.scheduled_at is not None:
                delay = max(0.0, execution.scheduled_at - time.time())
            values = columns(execution)
            values.update(
                agent=self._rows.agent,
                id=execution.execution_id,
                take=execution.take,
                gated=session is not None and execution.session_policy in SESSION_GATED,
                queued=queued,
                delay=delay,
            )
            cursor = await conn.execute(_INSERT, values)
            if not cursor.rowcount:
                self._renew_soon()
                raise StoreUnavailable(
                    f"replica {execution.replica}'s lease lapsed: it renews before it starts work"
                )
            due = await cursor.fetchone()
            if idempotency is not None and key is not None:
                await conn.execute(
                    "INSERT INTO idempotency (agent, key, fingerprint, execution_id, expires_at)"
                    " VALUES (%s, %s, %s, %s, now() + make_interval(secs => %s))",
                    (self._rows.agent, key, idempotency.fingerprint, execution.execution_id,
                     idempotency.ttl),
                )  # fmt: skip
            if queued:
                await self._rows.notify(conn, "q")
        if queued and execution.scheduled_at is not None and due is not None and due[0]:
            execution.scheduled_at = float(due[0])  # on the database's clock, as it is due
        if execution.session_policy in ("interrupt", "rollback"):
            execution.displaced = tuple(others)
        if queued:
            self._notices.queued.set()
        return None

    async def _insert_rows(self, executions: list[Execution]) -> list[bool]:
        """Plain creates (running here, no session, no key) in one statement: whether each
        was written (not when its replica's lease lapsed). Creates made together share it
        (coalesce.py)."""
        async with self._rows.link.tx("create", one=True) as conn:
            if len(executions) == 1:
                execution = executions[0]
                values = columns(execution)
                values.update(
                    agent=self._rows.agent,
                    id=execution.execution_id,
                    take=execution.take,
                    gated=False,
                    queued=False,
                    delay=0.0,
                )
                cursor = await conn.execute(_INSERT, values)
                return [bool(cursor.rowcount)]
            rows = [columns(execution) for execution in executions]
            given: dict[str, Any] = {
                name: [row[name] for row in rows] for name, _ in _PLAIN if name not in _OWN
            }
            given.update(
                id=[execution.execution_id for execution in executions],
                take=[execution.take for execution in executions],
            )
            given["agent"] = self._rows.agent
            cursor = await conn.execute(_INSERT_RUN, given)
            written = {row[0] for row in await cursor.fetchall()}
        return [execution.execution_id in written for execution in executions]

    async def _releasing(self, conn: Conn, session: str) -> bool:
        cursor = await conn.execute(
            "SELECT 1 FROM releases WHERE agent = %s AND session = %s AND expires_at > now()",
            (self._rows.agent, session),
        )
        return await cursor.fetchone() is not None

    async def _first_use(
        self, conn: Conn, execution: Execution, idempotency: Idempotency, key: str
    ) -> Execution | None:
        """The execution the key was first used for, if the key is remembered."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"{self._rows.agent}\x1fkey\x1f{key}",),
        )
        cursor = await conn.execute(
            "DELETE FROM idempotency WHERE agent = %s AND key = %s AND expires_at <= now()",
            (self._rows.agent, key),
        )
        cursor = await conn.execute(
            "SELECT fingerprint, execution_id FROM idempotency WHERE agent = %s AND key = %s",
            (self._rows.agent, key),
        )
        found = await cursor.fetchone()
        if found is None:
            return None
        if found[0] != idempotency.fingerprint:
            raise IdempotencyMismatch(idempotency.key)
        earlier = await self._read_one(conn, found[1])
        if earlier is None:
            raise IdempotencyForgotten(idempotency.key)
        return earlier

    async def _read_one(self, conn: Conn, execution_id: str) -> Execution | None:
        cursor = await conn.execute(
            f"SELECT {ROW} FROM executions WHERE agent = %s AND id = %s AND {LIVE}",
            (self._rows.agent, execution_id),
        )
        row = await cursor.fetchone()
        return None if row is None else read_row(row)

    async def checkpoint(self, execution: Execution, state: str) -> None:
        await self._owner.checkpoint(execution, state)

    def end(self, execution: Execution) -> None:
        self._owner.end(execution)

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        return await self._owner.recorded(execution, timeout, closing)

    async def forget(self, execution_id: str) -> bool:
        async with self._rows.link.tx("forget") as conn:
            cursor = await conn.execute(
                f"SELECT status FROM executions WHERE agent = %s AND id = %s AND {LIVE} FOR UPDATE",
                (self._rows.agent, execution_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return False
            if row[0] not in TERMINAL:
                raise ExecutionRunning(execution_id, row[0])
            await conn.execute(
                "DELETE FROM executions WHERE agent = %s AND id = %s",
                (self._rows.agent, execution_id),
            )
            await conn.execute(
                "DELETE FROM events WHERE agent = %s AND execution_id = %s",
                (self._rows.agent, execution_id),
            )
        return True

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        """Queued or parked: it ends here, in one transaction. Held by another replica: a
        row for its owner and a notice (the owner's poll finds a lost notice)."""
        owner = execution.replica
        async with self._rows.link.tx("request_cancel") as conn:
            cursor = await conn.execute(
                f"SELECT {ROW} FROM executions WHERE agent = %s AND id = %s FOR UPDATE",
                (self._rows.agent, execution.execution_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return
            found = read_row(row)
            if found.is_terminal:
                return
            if found.owned_by_nobody:
                found.cancel_queued(reason)
                await self._rows.finish(conn, found)
                unqueued = self._claims.on_unqueued
                if unqueued is not None and execution.status is ExecutionStatus.QUEUED:
                    unqueued(found, None)
                return
            owner = found.replica
            if owner != self._rows.replica_id:
                await conn.execute(
                    "INSERT INTO cancels (agent, replica, execution_id, reason, settle_within)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (self._rows.agent, owner, execution.execution_id, reason.value, settle_within),
                )
                await self._rows.notify(conn, f"c:{owner}")
        if owner == self._rows.replica_id and self.on_cancel is not None:
            self.on_cancel(execution.execution_id, reason, settle_within)
