"""What any replica reads: a record (moved to lost first if its owner stopped
renewing), its events, its end (waited for), the lists and a session's executions; the part
of `RedisStore` for `Reads`, `Events` (an event is written through the owner's writes) and
`Sessions` (a release is `releases.py`'s)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Sequence
from typing import Any, cast

from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.model.status import KEPT_MOVES
from agent_server.store import roles
from agent_server.store.base import ListCursor, Page
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.owner_writes import OwnerWrites
from agent_server.store.redis.releases import Releases
from agent_server.store.redis.scripts import Row

#: Executions read per session (release, listing by session).
SESSION_LIMIT = 10_000


async def read(
    link: Link, keys: Keys, row_codec: RowCodec, ids: Sequence[str], tenant: str | None = None
) -> list[Execution | None]:
    """One `get` call for many ids (a `get`, a waiter's re-read, or those woken together:
    notices.py's `Reader`)."""
    wanted = "" if tenant is None else f"={tenant}"
    with link.operation("get"):
        rows = await link.script("get", keys.script.for_ids(ids), wanted, *ids)
    found: list[Execution | None] = [row_codec.restore(row) if row else None for row in rows]
    return found or [None] * len(ids)


class Reads(roles.Reads, roles.Events, roles.Sessions):
    """The reads of `RedisStore`, its events and its sessions."""

    def __init__(
        self,
        link: Link,
        keys: Keys,
        row_codec: RowCodec,
        *,
        notices: Notices,
        writes: OwnerWrites,
        releases: Releases,
    ) -> None:
        self._link = link
        self._keys = keys
        self._codec = row_codec
        self._notices = notices
        self._writes = writes
        self._releases = releases

    def emit(self, execution: Execution, event: Event) -> None:
        self._writes.emit(execution, event)

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        """One XRANGE after `cursor` (exclusive). Numbers are contiguous: a gap before the
        first one read is what the cap trimmed."""
        with self._link.operation("events"):
            rows = await cast(
                Awaitable[Any],
                self._link.redis.xrange(
                    self._keys.stream(execution_id), min=f"({cursor}-1", count=limit
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

    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        """One script: the record, moved to lost first if its owner stopped renewing; with
        `tenant`, another tenant's is unknown, its tenant read before the rest (get.lua)."""
        return (await read(self._link, self._keys, self._codec, [execution_id], tenant))[0]

    async def input_of(self, execution: Execution) -> tuple[bool, Any]:
        """Its `body` field, which no script's record carries (a start without one writes
        none: None); False when the record is gone meanwhile."""
        found, body = await self._hash_field(execution, "body", "input")
        return found, codec.READERS["body"](body) if found else None

    async def moves_of(self, execution: Execution) -> tuple[bool, list[list[Any]]]:
        """Its `moves` field, which moves.lua keeps (up to twice KEPT_MOVES: the last
        KEPT_MOVES shown) and no script's record carries (none yet: []); False when the
        record is gone meanwhile."""
        found, moves = await self._hash_field(execution, "moves", "history")
        return found, [] if moves is None else json.loads(moves)[-KEPT_MOVES:]

    async def _hash_field(
        self, execution: Execution, name: str, operation: str
    ) -> tuple[bool, Any]:
        """One HMGET of the record's hash: whether it is there, and field `name` (a field
        read apart, here only, so no other read carries it)."""
        with self._link.operation(operation):
            found, value = await cast(
                Awaitable[list[Any]],
                self._link.redis.hmget(
                    self._keys.record(execution.execution_id), ["execution_id", name]
                ),
            )
        return (False, None) if found is None else (True, value)

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
        tenant: str | None = None,
        every_tenant: bool = False,
        owner: str | None = None,
        schedule_id: str | None = None,
        bare: bool = False,
    ) -> Page:
        """One script. Bounded work: it reads at most max(limit * 10, 1000) ids of one
        index (the session's, the tenant's, the running ones, or all, newest first), so a
        rare filter (a reasoner, a schedule) may return fewer than `limit` while `next` says
        older ones may match. A
        cursor is the index score and id of the last record looked at: in a tenant's index
        (or its session's) it names a place among that tenant's records only."""
        if session_id is not None:  # a session's index holds its tenant's records only
            index = self._keys.session(scoped(tenant, session_id))
        elif tenant is not None and not every_tenant:
            index = self._keys.tenant(tenant)
        elif statuses == {ExecutionStatus.RUNNING}:
            index = self._keys.running
        else:
            index = self._keys.all
        return await self._list(
            "list",
            index,
            max(limit * 10, 1000),
            limit,
            ",".join(sorted(statuses)),
            reasoner or "",
            budget=max_bytes,
            bare=bare,
            after=after,
            owner=owner or "",
            schedule_id=schedule_id or "",
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
        owner: str = "",
        schedule_id: str = "",
    ) -> Page:
        since, since_id = codec.cursor(after)
        with self._link.operation(operation):
            reply = await self._link.script(
                "list",
                self._keys.script.for_list(index),
                scan,
                limit,
                statuses,
                reasoner,
                budget,
                "1" if bare else "0",
                since,
                since_id,
                owner,
                schedule_id,
            )
        found: list[Execution] = []
        cursors: list[str] = []
        for row in reply[:-1]:
            execution = self._codec.restore(row)
            if int(row[Row.MATCHED]):
                found.append(execution)
                cursors.append(str(row[Row.CURSOR]))
        return Page(found, cursors, str(reply[-1]) or None)

    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        """One script: the session's executions (at most SESSION_LIMIT), newest first,
        without their results (a release reads statuses: 10,000 big results would be a
        read of gigabytes)."""
        found = await self._list(
            "session",
            self._keys.session(scoped(tenant, session_id)),
            SESSION_LIMIT,
            SESSION_LIMIT,
            "",
            "",
            bare=True,
        )
        return found.executions

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
