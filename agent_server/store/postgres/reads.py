"""What any replica reads: a record (moved first, once, if its owner stopped renewing),
its history, its end (waited for), the lists, its events and a session's executions and
releases; the part of `PostgresStore` for `Reads`, `Events` (an event is written through
the owner's writes, owner.py) and `Sessions`. Reads made together share a statement
(coalesce.py)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.store import roles
from agent_server.store.base import ListCursor, Page
from agent_server.store.postgres import codec
from agent_server.store.postgres.coalesce import Coalesced
from agent_server.store.postgres.notices import Notices
from agent_server.store.postgres.owner import Owner
from agent_server.store.postgres.repair import Repair
from agent_server.store.postgres.rows import LIVE, ROW, AgentRows, read_row

#: Executions a session's read returns at most (a release reads their statuses).
SESSION_LIMIT = 10_000


class Reads(roles.Reads, roles.Events, roles.Sessions):
    """The reads of `PostgresStore`, its events and its sessions: a record read whose owner
    lapsed is judged by the repair (`repair`)."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        notices: Notices,
        owner: Owner,
        repair: Repair,
    ) -> None:
        self._rows = rows
        self._notices = notices
        self._owner = owner
        self._repair = repair
        #: Reads by (id, tenant) made together, one statement (`_read_rows`).
        self._reads: Coalesced[tuple[str, str | None], Any] = Coalesced(self._read_rows)

    async def close(self) -> None:
        """Wait for the statements the reads made together still run."""
        await self._reads.close()

    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        """The record, moved first (once, whoever reads) if its owner stopped renewing. With
        `tenant`, another tenant's row is left unread by the same index lookup that finds
        none for an unknown id: a foreign id costs what an unknown one does. Reads made
        together share one statement (coalesce.py)."""
        row = await self._reads((execution_id, tenant))
        if row is None:
            return None
        if row[4]:  # its owner stopped renewing: judged in a transaction (rows locked)
            async with self._rows.link.tx("judge") as conn:
                moved = await self._repair.judge(conn, [execution_id])
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
        async with self._rows.link.tx("get", one=True) as conn:
            if len(keys) == 1:
                execution_id, tenant = keys[0]
                tenant_only = "" if tenant is None else " AND tenant = %s"
                arguments = (self._rows.agent, execution_id) + (() if tenant is None else (tenant,))
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
                ([key[0] for key in keys], [key[1] for key in keys], self._rows.agent),
            )
            rows: list[Any] = [None] * len(keys)
            for row in await cursor.fetchall():
                rows[int(row[5]) - 1] = row
            return rows

    async def moves_of(self, execution: Execution) -> tuple[bool, list[list[Any]]]:
        """The row's `moves` (the `executions_moved` trigger keeps them, whichever statement
        moves it: migrations/0002_moves.sql); False when the row is gone meanwhile."""
        async with self._rows.link.tx("history", one=True) as conn:
            cursor = await conn.execute(
                f"SELECT moves FROM executions WHERE agent = %s AND id = %s AND {LIVE}",
                (self._rows.agent, execution.execution_id),
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
        params: dict[str, Any] = {"agent": self._rows.agent, "limit": max(1, limit) + 1}
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
        async with self._rows.link.tx("list", one=True) as conn:
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

    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        """Read, then wait for a notice (or the poll) and read again (notices.py)."""
        return await self._notices.wait(execution, timeout, asked, self.get)

    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        found = await self.page(
            session_id=session_id, tenant=tenant, limit=SESSION_LIMIT, bare=True
        )
        return found.executions

    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        """One row per session being released, expiring after `seconds` (a replica that
        dies mid-release holds it no longer); another's under way is named."""
        session = scoped(tenant, session_id)
        release_id = uuid.uuid4().hex
        async with self._rows.link.tx("release") as conn:
            await conn.execute(
                "DELETE FROM releases WHERE agent = %s AND session = %s AND expires_at <= now()",
                (self._rows.agent, session),
            )
            cursor = await conn.execute(
                "INSERT INTO releases (agent, session, release_id, expires_at) VALUES"
                " (%s, %s, %s, now() + make_interval(secs => %s)) ON CONFLICT DO NOTHING"
                " RETURNING release_id",
                (self._rows.agent, session, release_id, 3600.0 if seconds is None else seconds),
            )
            if await cursor.fetchone() is not None:
                return None
            cursor = await conn.execute(
                "SELECT release_id FROM releases WHERE agent = %s AND session = %s",
                (self._rows.agent, session),
            )
            row = await cursor.fetchone()
        return None if row is None else str(row[0])

    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        session = scoped(tenant, session_id)
        async with self._rows.link.tx("release") as conn:
            cursor = await conn.execute(
                "DELETE FROM releases WHERE agent = %s AND session = %s RETURNING release_id",
                (self._rows.agent, session),
            )
            row = await cursor.fetchone()
            if row is not None and answer is not None:
                await conn.execute(
                    "INSERT INTO release_answers (agent, release_id, answer, expires_at)"
                    " VALUES (%s, %s, %s, now() + interval '5 minutes')"
                    " ON CONFLICT DO NOTHING",
                    (self._rows.agent, row[0], codec.dumps(answer)),
                )
                await self._rows.notify(conn, f"r:{row[0]}")

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        """Polled (every 0.1 s, bounded): a release's answer comes once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            async with self._rows.link.tx("release") as conn:
                cursor = await conn.execute(
                    "SELECT answer FROM release_answers WHERE agent = %s AND release_id = %s",
                    (self._rows.agent, release_id),
                )
                row = await cursor.fetchone()
            if row is not None:
                value = codec.loads(row[0])
                return value if isinstance(value, dict) else None
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(min(0.1, max(0.0, deadline - loop.time())))

    def emit(self, execution: Execution, event: Event) -> None:
        self._owner.emit(execution, event)

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        async with self._rows.link.tx("events") as conn:
            rows = await conn.execute(
                "SELECT seq, event, data FROM events WHERE agent = %s AND execution_id = %s"
                " AND seq > %s ORDER BY seq LIMIT %s",
                (self._rows.agent, execution_id, cursor, limit),
            )
            events = [Event(int(r[0]), r[1], r[2]) for r in await rows.fetchall()]
        missed = events[0].id - cursor - 1 if events else 0
        return max(0, missed), events

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._notices.event_notice(execution_id, waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._notices.drop_notice(execution_id, waiter)
