"""Claims of due work: one transaction takes the queued execution due first by
`FOR UPDATE SKIP LOCKED`, honouring concurrency keys, session turns and versions (DESIGN
section 22, docs/durable.md "Versions"); part of `PostgresStore`.

Versions, as Redis's claim.lua decides them, in the claim's own statement: each replica's
advert (versions.py `advert`: per reasoner its version, the versions it reads, whether it
migrates, its `on_version_change`) is in its `replicas` row while it is alive and admitting
(a draining one renews without it). Work is left queued, unlooked at by this replica, while

- its reasoner is not served here and a live replica serves it (in any version), or
- its checkpoint was written by a version this replica neither is nor reads nor migrates,
  and a live replica of that version is alive;

once none is, the claim takes it: a reasoner not served here is failed by its taker, a
checkpoint meets `on_version_change` (`restart`: set aside, attempt + 1, its requests for
input dropped, here; `fail`: by its taker). Queued work without a checkpoint runs on any
version.

The `Claims` part of `PostgresStore`: it keeps the handlers of its role (`on_unqueued`,
`on_version_waits`), its `advert` (which each renewal writes, store.py) and when the next
queued execution is due; hand-offs, retries and give-backs go through the owner's writes
(owner.py), and its takes are the repair's to settle (repair.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from agent_server.model.execution import CancelReason, Execution
from agent_server.model.versions import Rule
from agent_server.store import roles
from agent_server.store.base import StoreUnavailable
from agent_server.store.postgres import codec
from agent_server.store.postgres.link import Conn
from agent_server.store.postgres.notices import Notices
from agent_server.store.postgres.owner import Owner
from agent_server.store.postgres.repair import Repair
from agent_server.store.postgres.rows import ROW, AgentRows, read_row

#: Candidates one claim looks at.
CLAIM_WINDOW = 32
#: Waiting executions one look counts at most (`on_version_waits`).
WAITS_COUNTED = 1000

#: The live replicas other than this one that advertise (`%(me)s`); `o.advert` theirs.
_OTHERS = (
    "SELECT 1 FROM replicas o WHERE o.agent = e.agent AND o.replica <> %(me)s"
    " AND o.expires_at > now() AND o.advert <> ''"
)
#: Whether queued `e` waits for another replica (`%(mine)s`: this replica's advert): its
#: reasoner is not served here and a live replica serves it, or its checkpoint's version is
#: neither this replica's nor read nor migrated here and a live replica of it is alive.
WAITS = (
    "((NOT %(mine)s::jsonb ? e.reasoner"
    f" AND EXISTS ({_OTHERS} AND o.advert::jsonb ? e.reasoner))"
    " OR (e.checkpoint_version IS NOT NULL AND %(mine)s::jsonb ? e.reasoner"
    " AND e.checkpoint_version <> %(mine)s::jsonb -> e.reasoner ->> 0"
    " AND NOT (%(mine)s::jsonb -> e.reasoner -> 1 ? e.checkpoint_version)"
    " AND %(mine)s::jsonb -> e.reasoner ->> 2 = '0'"
    f" AND EXISTS ({_OTHERS} AND o.advert::jsonb -> e.reasoner ->> 0 = e.checkpoint_version)))"
)


def rule_for(mine: dict[str, Any], execution: Execution) -> Rule:
    """How this replica meets the claimed execution's checkpoint (claim.lua's `rule_for`),
    knowing no live replica of its version is left (else the claim left it queued)."""
    if execution.checkpoint is None:
        return Rule.NONE  # nothing to misread: any version runs it
    served = mine.get(execution.reasoner)
    if not isinstance(served, list) or len(served) < 4:
        return Rule.SAME  # not served here: its taker refuses it
    written = execution.checkpoint_version or ""
    if written == served[0]:
        return Rule.SAME
    if written in served[1]:
        return Rule.COMPATIBLE
    if served[2]:
        return Rule.MIGRATE
    return Rule(served[3])


def advertised(advert: str) -> dict[str, Any]:
    """This replica's advert as the claim reads it ({} for none)."""
    try:
        found = json.loads(advert) if advert else {}
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


class Claims(roles.Claims):
    """The claims of `PostgresStore`; `renew_soon` asks the liveness to renew at its next
    pass."""

    def __init__(
        self,
        rows: AgentRows,
        *,
        max_events: int,
        owner: Owner,
        repair: Repair,
        notices: Notices,
        renew_soon: Callable[[], None],
    ) -> None:
        self._rows = rows
        self._max_events = max_events
        self._owner = owner
        self._repair = repair
        self._notices = notices
        self._renew_soon = renew_soon
        #: When the next scheduled execution is due (the loop's clock), as the last claim
        #: said; None when nothing waits for a time.
        self._due_at: float | None = None
        #: The executions the last look found waiting for another replica (counted once).
        self._waiting: set[str] = set()

    @property
    def shared(self) -> bool:
        return True

    def withdraw(self) -> None:
        """Renewed at the next pass without its versions: the other replicas' claims stop
        leaving work for this one."""
        self.advert = ""
        self._renew_soon()

    def hand_off(self, execution: Execution) -> None:
        self._owner.hand_off(execution)

    def retry(self, execution: Execution, delay: float) -> None:
        self._owner.retry(execution, delay)

    def give_back(self, execution: Execution) -> None:
        self._owner.give_back(execution)

    async def claim(self) -> Execution | None:
        """One transaction: the queued execution due first whose concurrency key has a
        free slot, whose session's turn has come and which no other replica is waited for
        (module docstring), taken by this replica (rows other claims hold are skipped,
        keys serialised by an advisory lock); queued work of a session being released ends
        cancelled on the way."""
        token = self._repair.token()  # kept with what it takes: whose it is, which claim
        self._repair.claiming.add(token)
        try:
            return await self._claim(token)
        except (StoreUnavailable, asyncio.CancelledError):
            self._repair.doubt()  # its COMMIT may have run: taken here, never to start here
            raise
        finally:
            self._repair.claiming.discard(token)

    async def _claim(self, token: str) -> Execution | None:
        mine = advertised(self.advert)
        args = {
            "agent": self._rows.agent,
            "me": self._rows.replica_id,
            "mine": json.dumps(mine),
            "window": CLAIM_WINDOW,
        }
        waiting: list[str] = []
        row: Any = None
        async with self._rows.link.tx("claim") as conn:
            cursor = await conn.execute(
                f"SELECT {ROW}, ckey, climit, gated, session, created_at,"
                " EXISTS (SELECT 1 FROM releases r WHERE r.agent = e.agent"
                " AND r.session = e.session AND r.expires_at > now()),"
                " extract(epoch FROM due_at)"
                " FROM executions e WHERE agent = %(agent)s AND status = 'queued'"
                " AND due_at <= now()"
                # Only while this replica's lease holds (a paused one renews first).
                " AND EXISTS (SELECT 1 FROM replicas r WHERE r.agent = e.agent"
                " AND r.replica = %(me)s AND r.expires_at > now())"
                # Work whose key is full, or whose session's turn has not come, is not looked
                # at: a new key behind any number of blocked ones is claimed at once (both
                # are checked again under the key's lock below).
                " AND (ckey IS NULL OR (SELECT count(*) FROM executions h WHERE"
                " h.agent = e.agent AND h.ckey = e.ckey"
                " AND h.status IN ('running', 'input_required')) < greatest(e.climit, 1))"
                " AND (NOT gated OR NOT EXISTS (SELECT 1 FROM executions o WHERE"
                " o.agent = e.agent AND o.session = e.session AND o.id <> e.id"
                " AND o.status IN ('queued', 'running', 'input_required')"
                " AND o.created_at <= e.created_at"
                " AND (o.status <> 'queued' OR o.created_at < e.created_at)))"
                # Nor work that waits for another replica (versions).
                f" AND NOT {WAITS}"
                " ORDER BY due_at, queued_seq LIMIT %(window)s FOR UPDATE SKIP LOCKED",
                args,
            )
            rows = await cursor.fetchall()
            taken: Execution | None = None
            blocked = False
            for row in rows:
                execution = read_row(row)
                ckey, climit, gated, session, created_at, releasing, due = row[4:11]
                if releasing:
                    execution.cancel_queued(CancelReason.SESSION_RELEASED)
                    await self._rows.finish(conn, execution)
                    continue
                if gated and not await self._turn(conn, execution.execution_id, session,
                                                  created_at):  # fmt: skip
                    blocked = True
                    continue
                if ckey is not None and not await self._slot(conn, ckey, int(climit)):
                    blocked = True
                    continue
                taken = execution
                scheduled = execution.scheduled_at
                await self._take(conn, execution, token, mine)
                waited_from = scheduled if scheduled else float(due or created_at)
                break
            if taken is None:
                waiting, row = await self._nothing_taken(conn, args)
        if taken is None:
            self._count_waits(waiting)
            self._look_again(row, blocked)
            return None
        taken.resumable = True
        taken.started_monotonic = time.monotonic() - max(0.0, time.time() - taken.created_at)
        if self.on_unqueued is not None and (taken.scheduled_at or taken.attempt == 1):
            self.on_unqueued(taken, max(0.0, time.time() - waited_from))
        return taken

    @staticmethod
    async def _nothing_taken(conn: Conn, args: dict[str, Any]) -> tuple[list[str], Any]:
        """What waits for another replica (its version), counted; and when to look again:
        the soonest due time of the rest (what waits for another replica is not due here),
        with whether this replica's lease holds (nothing is due while it has lapsed)."""
        cursor = await conn.execute(
            "SELECT e.id FROM executions e WHERE agent = %(agent)s"
            f" AND status = 'queued' AND due_at <= now() AND {WAITS} LIMIT {WAITS_COUNTED}",
            args,
        )
        waiting = [str(r[0]) for r in await cursor.fetchall()]
        cursor = await conn.execute(
            "SELECT extract(epoch FROM min(due_at) - now()),"
            " EXISTS (SELECT 1 FROM replicas r WHERE r.agent = %(agent)s"
            " AND r.replica = %(me)s AND r.expires_at > now())"
            " FROM executions e"
            f" WHERE agent = %(agent)s AND status = 'queued' AND NOT {WAITS}",
            args,
        )
        return waiting, await cursor.fetchone()

    def _look_again(self, row: Any, blocked: bool) -> None:
        """When the taker looks again after a claim took nothing (`due_in`)."""
        if row is not None and row[0] is not None and not row[1]:
            # Due work, but this replica's lease has lapsed: renewed at the next pass,
            # which wakes the taker (a due time of now would have it spin meanwhile).
            self._renew_soon()
            self._due_at = None
            return
        due_in = None if row is None or row[0] is None else max(0.0, float(row[0]))
        if blocked:
            due_in = 1.0 if due_in is None else min(due_in, 1.0)
        self._due_at = None if due_in is None else asyncio.get_running_loop().time() + due_in

    async def _take(
        self, conn: Conn, execution: Execution, token: str, mine: dict[str, Any]
    ) -> None:
        """Mark it running here, met by its version rule: a restart sets its checkpoint
        aside and runs as the next attempt, its requests for input dropped."""
        rule = rule_for(mine, execution)
        aside: str | None = None
        if rule is Rule.RESTART:
            aside = execution.checkpoint
            execution.checkpoint = None
            execution.checkpoint_version = None
            execution.checkpoint_asks = 0
            execution.attempt += 1
        if rule is Rule.MIGRATE:  # migrated in the taker's memory only (owner.py `migrating`)
            self._owner.migrating(
                execution.execution_id, execution.checkpoint, execution.checkpoint_version
            )
        served = mine.get(execution.reasoner)
        if isinstance(served, list) and served:
            execution.version = served[0] or None  # the code that runs this attempt
        execution.claim(self._rows.replica_id)
        execution.take = token
        await conn.execute(
            "UPDATE executions SET status = 'running', replica = %(me)s, take = %(take)s,"
            " unbegun = true, due_at = NULL, doc = %(doc)s, attempt = %(attempt)s,"
            " checkpoint_version = CASE WHEN %(restart)s THEN NULL ELSE checkpoint_version END,"
            " checkpoint_aside = CASE WHEN %(restart)s THEN %(aside)s ELSE checkpoint_aside END,"
            " ledger = CASE WHEN %(restart)s THEN NULL ELSE ledger END"
            " WHERE agent = %(agent)s AND id = %(id)s",
            {"me": self._rows.replica_id, "take": token, "doc": codec.encode(execution),
             "attempt": execution.attempt, "restart": rule is Rule.RESTART, "aside": aside,
             "agent": self._rows.agent, "id": execution.execution_id},
        )  # fmt: skip
        cursor = await conn.execute(
            "SELECT coalesce(max(seq), 0) FROM events WHERE agent = %s AND execution_id = %s",
            (self._rows.agent, execution.execution_id),
        )
        last = await cursor.fetchone()
        execution.event_log(self._max_events).last_id = int(last[0]) if last else 0
        execution.version_rule = rule
        await self._rows.notify(conn, f"e:{execution.execution_id}")

    def _count_waits(self, waiting: list[str]) -> None:
        """Tell `on_version_waits` of the executions newly found waiting (each once while
        it waits)."""
        new = len(set(waiting) - self._waiting)
        self._waiting = set(waiting)
        if new and self.on_version_waits is not None:
            self.on_version_waits(new)

    async def _turn(self, conn: Conn, execution_id: str, session: str, created: float) -> bool:
        """Its session's turn: no earlier execution of the session is still to end."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"{self._rows.agent}\x1fsession\x1f{session}",),
        )
        cursor = await conn.execute(
            "SELECT 1 FROM executions WHERE agent = %s AND session = %s AND id <> %s"
            " AND status IN ('queued', 'running', 'input_required') AND created_at <= %s"
            " AND (status <> 'queued' OR created_at < %s) LIMIT 1",
            (self._rows.agent, session, execution_id, created, created),
        )
        return await cursor.fetchone() is None

    async def _slot(self, conn: Conn, key: str, limit: int) -> bool:
        """A free slot of the concurrency key (held slots counted under its lock)."""
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"{self._rows.agent}\x1fckey\x1f{key}",),
        )
        cursor = await conn.execute(
            "SELECT count(*) FROM executions WHERE agent = %s AND ckey = %s"
            " AND status IN ('running', 'input_required')",
            (self._rows.agent, key),
        )
        row = await cursor.fetchone()
        return row is None or int(row[0]) < max(1, limit)

    async def begin(self, execution: Execution) -> bool:
        """Its body begins: the take's mark cleared, fenced by owner, attempt and take. On
        its way, the repair leaves the take alone; without an answer the body does not
        begin, and the take goes back (an unclaim, or the repair if its caller was cut)."""
        self._repair.claiming.add(execution.take)
        try:
            async with self._rows.link.tx("begin") as conn:
                cursor = await conn.execute(
                    "UPDATE executions SET unbegun = false WHERE agent = %s AND id = %s"
                    " AND replica = %s AND attempt = %s AND take = %s AND status = 'running'",
                    (self._rows.agent, execution.execution_id, self._rows.replica_id,
                     execution.attempt, execution.take),
                )  # fmt: skip
        except StoreUnavailable:
            self.give_back(execution)
            return False
        except asyncio.CancelledError:
            self._repair.doubt()
            raise
        finally:
            self._repair.claiming.discard(execution.take)
        return bool(cursor.rowcount)

    def due_in(self) -> float | None:
        if self._due_at is None:
            return None
        return max(0.0, self._due_at - asyncio.get_running_loop().time())

    async def wait_queued(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(min(timeout, 1.0)):  # the bounded poll
                await self._notices.queued.wait()
        except TimeoutError:
            pass
        self._notices.queued.clear()
