"""Records, their indexes and what any replica asks of them: creates (idempotency keys,
session policies, the queue's bound), reads and lists, forgets, sessions and their
releases, and cancel requests; part of `PostgresStore`. Plain creates and reads made
together share a statement (coalesce.py)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.model.scheduling import SESSION_GATED
from agent_server.store.base import (
    ExecutionRunning,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    ListCursor,
    Page,
    QueueFull,
    SessionReleasing,
    SessionTaken,
    StoreUnavailable,
)
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import Conn
from agent_server.store.postgres.part import ROW, TERMINAL, PgPart, columns, read_row

#: Executions a session's read returns at most (a release reads their statuses).
SESSION_LIMIT = 10_000
#: What a read sees: a finished record past its expiry is gone.
LIVE = "(expires_at IS NULL OR expires_at > now())"

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


class Records(PgPart):
    """Creates, reads, lists and sessions of `PostgresStore`."""

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        """One transaction: refused while its session is released; with a key already used
        for the same request, that execution; else the record (and the key: a unique row,
        so one execution per key across replicas)."""
        queued = execution.status is ExecutionStatus.QUEUED
        # The take's token: this process took it (the repair's evidence that its body began
        # here or never did, repair.py).
        execution.take = execution.take or self._token(start=True)
        if queued:
            return await self._create(execution, idempotency, max_queued)
        execution_id = execution.execution_id
        self._creating.add(execution_id)
        try:
            return await self._create(execution, idempotency, max_queued)
        except (StoreUnavailable, asyncio.CancelledError):
            # Its COMMIT may have run (a reset or a timeout as it was answered), or its
            # caller was cut as it ran (the listener's close at shutdown, a client gone):
            # the repair runs it here if the registry still has it, else queues it for its
            # first run elsewhere.
            self._doubt()
            raise
        finally:
            self._creating.discard(execution_id)

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
        async with self._link.tx("enqueue" if queued else "create") as conn:
            if session is not None:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"{self.agent}\x1fsession\x1f{session}",),
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
                    (self.agent, session),
                )
                others = [row[0] for row in await cursor.fetchall()]
                if others and execution.session_policy == "reject":
                    raise SessionTaken(others[-1])
            if queued:
                cursor = await conn.execute(
                    "SELECT count(*) FROM executions WHERE agent = %s AND status = 'queued'",
                    (self.agent,),
                )
                row = await cursor.fetchone()
                if row is not None and int(row[0]) >= max_queued:
                    raise QueueFull(max_queued)
            delay = 0.0
            if execution.scheduled_at is not None:
                delay = max(0.0, execution.scheduled_at - time.time())
            values = columns(execution)
            values.update(
                agent=self.agent,
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
                    (self.agent, key, idempotency.fingerprint, execution.execution_id,
                     idempotency.ttl),
                )  # fmt: skip
            if queued:
                await self._notify(conn, "q")
        if queued and execution.scheduled_at is not None and due is not None and due[0]:
            execution.scheduled_at = float(due[0])  # on the database's clock, as it is due
        if execution.session_policy in ("interrupt", "rollback"):
            execution.displaced = tuple(others)
        if queued:
            self._queued_event.set()
        return None

    async def _insert_rows(self, executions: list[Execution]) -> list[bool]:
        """Plain creates (running here, no session, no key) in one statement: whether each
        was written (not when its replica's lease lapsed). Creates made together share it
        (coalesce.py)."""
        async with self._link.tx("create", one=True) as conn:
            if len(executions) == 1:
                execution = executions[0]
                values = columns(execution)
                values.update(
                    agent=self.agent,
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
            given["agent"] = self.agent
            cursor = await conn.execute(_INSERT_RUN, given)
            written = {row[0] for row in await cursor.fetchall()}
        return [execution.execution_id in written for execution in executions]

    async def _releasing(self, conn: Conn, session: str) -> bool:
        cursor = await conn.execute(
            "SELECT 1 FROM releases WHERE agent = %s AND session = %s AND expires_at > now()",
            (self.agent, session),
        )
        return await cursor.fetchone() is not None

    async def _first_use(
        self, conn: Conn, execution: Execution, idempotency: Idempotency, key: str
    ) -> Execution | None:
        """The execution the key was first used for, if the key is remembered."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"{self.agent}\x1fkey\x1f{key}",),
        )
        cursor = await conn.execute(
            "DELETE FROM idempotency WHERE agent = %s AND key = %s AND expires_at <= now()",
            (self.agent, key),
        )
        cursor = await conn.execute(
            "SELECT fingerprint, execution_id FROM idempotency WHERE agent = %s AND key = %s",
            (self.agent, key),
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
            (self.agent, execution_id),
        )
        row = await cursor.fetchone()
        return None if row is None else read_row(row)

    # -- reads -----------------------------------------------------------------------------

    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        """The record, moved first (once, whoever reads) if its owner stopped renewing. With
        `tenant`, another tenant's row is left unread by the same index lookup that finds
        none for an unknown id: a foreign id costs what an unknown one does. Reads made
        together share one statement (coalesce.py)."""
        row = await self._reads((execution_id, tenant))
        if row is None:
            return None
        if row[4]:  # its owner stopped renewing: judged in a transaction (rows locked)
            async with self._link.tx("judge") as conn:
                moved = await self._judge(conn, [execution_id])
            if moved:
                return moved[0]
        return read_row(row)

    async def _read_rows(self, keys: list[tuple[str, str | None]]) -> list[Any]:
        """`ROW` and whether its owner stopped renewing, for each (id, tenant) asked; None
        for an unknown, expired or foreign one."""
        stale = (
            "status IN ('running', 'input_required') AND replica <> ''"
            " AND NOT EXISTS (SELECT 1 FROM replicas r WHERE r.agent = e.agent"
            " AND r.replica = e.replica AND r.expires_at > now())"
        )
        async with self._link.tx("get", one=True) as conn:
            if len(keys) == 1:
                execution_id, tenant = keys[0]
                tenant_only = "" if tenant is None else " AND tenant = %s"
                arguments = (self.agent, execution_id) + (() if tenant is None else (tenant,))
                cursor = await conn.execute(
                    f"SELECT {ROW}, {stale} FROM executions e"
                    f" WHERE agent = %s AND id = %s{tenant_only} AND {LIVE}",
                    arguments,
                )
                return [await cursor.fetchone()]
            # Each key its own lookup of the primary key: OFFSET 0 keeps the planner from
            # flattening the LATERAL into a join, which scanned the agent's every record
            # (its statistics lag a table that grows fast).
            cursor = await conn.execute(
                f"SELECT e.*, k.n FROM unnest(%b::text[], %b::text[]) WITH ORDINALITY"
                f" AS k(id, tenant, n) CROSS JOIN LATERAL (SELECT {ROW}, {stale}"
                " FROM executions e WHERE e.agent = %s AND e.id = k.id"
                f" AND (k.tenant IS NULL OR e.tenant = k.tenant) AND {LIVE} OFFSET 0) e",
                ([key[0] for key in keys], [key[1] for key in keys], self.agent),
            )
            rows: list[Any] = [None] * len(keys)
            for row in await cursor.fetchall():
                rows[int(row[5]) - 1] = row
            return rows

    async def moves_of(self, execution: Execution) -> tuple[bool, list[list[Any]]]:
        """The row's `moves` (the `executions_moved` trigger keeps them, whichever statement
        moves it: migrations/0002_moves.sql); False when the row is gone meanwhile."""
        async with self._link.tx("history", one=True) as conn:
            cursor = await conn.execute(
                f"SELECT moves FROM executions WHERE agent = %s AND id = %s AND {LIVE}",
                (self.agent, execution.execution_id),
            )
            row = await cursor.fetchone()
        if row is None:
            return False, []
        return True, list(row[0] or ())

    async def page(
        self,
        *,
        statuses: frozenset[ExecutionStatus] = frozenset(),
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
        after: ListCursor | None = None,
        tenant: str | None = None,
        every_tenant: bool = False,
        owner: str | None = None,
        schedule_id: str | None = None,
        bare: bool = False,
    ) -> Page:
        """One statement on the index the filters name (newest first, keyset-paged by the
        cursor's time and id); a tenant's list reads that tenant's rows only."""
        where = ["agent = %(agent)s", LIVE]
        params: dict[str, Any] = {"agent": self.agent, "limit": max(1, limit) + 1}
        if session_id is not None:
            where.append("session = %(session)s")
            params["session"] = scoped(tenant, session_id)
        elif tenant is not None and not every_tenant:
            where.append("tenant = %(tenant)s")
            params["tenant"] = tenant
        if statuses:
            where.append("status = ANY(%(statuses)s)")
            params["statuses"] = sorted(s.value for s in statuses)
        for column, value in (
            ("reasoner", reasoner),
            ("started_by", owner),
            ("schedule_id", schedule_id),
        ):
            if value is not None:
                where.append(f"{column} = %({column})s")
                params[column] = value
        if after is not None:
            where.append("(created_at, id) < (%(since)s, %(since_id)s)")
            params.update(since=after.created_at, since_id=after.execution_id)
        async with self._link.tx("list", one=True) as conn:
            cursor = await conn.execute(
                f"SELECT {ROW}, created_at, id, result_bytes FROM executions"
                f" WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC"
                " LIMIT %(limit)s",
                params,
            )
            rows = await cursor.fetchall()
        found: list[Execution] = []
        cursors: list[str] = []
        spent = 0
        for row in rows[: max(1, limit)]:
            execution = read_row(row)
            if bare:
                execution.result = None
            found.append(execution)
            cursors.append(f"{row[4]!r}:{row[5]}")
            spent += int(row[6])
            if max_bytes and spent > max_bytes:
                break
        more = len(rows) > len(found) or (bool(max_bytes) and spent > max_bytes)
        return Page(found, cursors, cursors[-1] if more and cursors else None)

    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        found = await self.page(
            session_id=session_id, tenant=tenant, limit=SESSION_LIMIT, bare=True
        )
        return found.executions

    async def forget(self, execution_id: str) -> bool:
        async with self._link.tx("forget") as conn:
            cursor = await conn.execute(
                f"SELECT status FROM executions WHERE agent = %s AND id = %s AND {LIVE} FOR UPDATE",
                (self.agent, execution_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return False
            if row[0] not in TERMINAL:
                raise ExecutionRunning(execution_id, row[0])
            await conn.execute(
                "DELETE FROM executions WHERE agent = %s AND id = %s", (self.agent, execution_id)
            )
            await conn.execute(
                "DELETE FROM events WHERE agent = %s AND execution_id = %s",
                (self.agent, execution_id),
            )
        return True

    # -- cancels ---------------------------------------------------------------------------

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        """Queued or parked: it ends here, in one transaction. Held by another replica: a
        row for its owner and a notice (the owner's poll finds a lost notice)."""
        owner = execution.replica
        async with self._link.tx("request_cancel") as conn:
            cursor = await conn.execute(
                f"SELECT {ROW} FROM executions WHERE agent = %s AND id = %s FOR UPDATE",
                (self.agent, execution.execution_id),
            )
            row = await cursor.fetchone()
            if row is None:
                return
            found = read_row(row)
            if found.is_terminal:
                return
            if found.owned_by_nobody:
                found.cancel_queued(reason)
                await self._finish(conn, found)
                if self.on_unqueued is not None and execution.status is ExecutionStatus.QUEUED:
                    self.on_unqueued(found, None)
                return
            owner = found.replica
            if owner != self.replica_id:
                await conn.execute(
                    "INSERT INTO cancels (agent, replica, execution_id, reason, settle_within)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    (self.agent, owner, execution.execution_id, reason.value, settle_within),
                )
                await self._notify(conn, f"c:{owner}")
        if owner == self.replica_id and self.on_cancel is not None:
            self.on_cancel(execution.execution_id, reason, settle_within)

    # -- sessions ----------------------------------------------------------------------------

    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        """One row per session being released, expiring after `seconds` (a replica that
        dies mid-release holds it no longer); another's under way is named."""
        session = scoped(tenant, session_id)
        release_id = uuid.uuid4().hex
        async with self._link.tx("release") as conn:
            await conn.execute(
                "DELETE FROM releases WHERE agent = %s AND session = %s AND expires_at <= now()",
                (self.agent, session),
            )
            cursor = await conn.execute(
                "INSERT INTO releases (agent, session, release_id, expires_at) VALUES"
                " (%s, %s, %s, now() + make_interval(secs => %s)) ON CONFLICT DO NOTHING"
                " RETURNING release_id",
                (self.agent, session, release_id, 3600.0 if seconds is None else seconds),
            )
            if await cursor.fetchone() is not None:
                return None
            cursor = await conn.execute(
                "SELECT release_id FROM releases WHERE agent = %s AND session = %s",
                (self.agent, session),
            )
            row = await cursor.fetchone()
        return None if row is None else str(row[0])

    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        session = scoped(tenant, session_id)
        async with self._link.tx("release") as conn:
            cursor = await conn.execute(
                "DELETE FROM releases WHERE agent = %s AND session = %s RETURNING release_id",
                (self.agent, session),
            )
            row = await cursor.fetchone()
            if row is not None and answer is not None:
                await conn.execute(
                    "INSERT INTO release_answers (agent, release_id, answer, expires_at)"
                    " VALUES (%s, %s, %s, now() + interval '5 minutes')"
                    " ON CONFLICT DO NOTHING",
                    (self.agent, row[0], codec.dumps(answer)),
                )
                await self._notify(conn, f"r:{row[0]}")

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        """Polled (every 0.1 s, bounded): a release's answer comes once."""
        import asyncio

        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            async with self._link.tx("release") as conn:
                cursor = await conn.execute(
                    "SELECT answer FROM release_answers WHERE agent = %s AND release_id = %s",
                    (self.agent, release_id),
                )
                row = await cursor.fetchone()
            if row is not None:
                value = codec.loads(row[0])
                return value if isinstance(value, dict) else None
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))
