"""Schedules in Redis: the API's documents (a hash, each with a version of its own, a set of
keys per tenant that counts them, and a version of them all every change writes anew),
and each schedule's marks: when each was first seen, its last fire time handled and the
last that started an execution, shared by every replica, so a replica that comes up knows
which firings it may still start and which execution ran last. The `Schedules` part of
`RedisStore`."""

from __future__ import annotations

from collections.abc import Awaitable, Collection
from typing import Any, cast

from agent_server.store import roles
from agent_server.store.base import Marks, ScheduleLimit, new_schedules_version
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link

#: Documents read in one reply: each is at most `--max-schedule-input-size` and a little,
#: so a reply stays bounded however many change at once (a replica coming up reads all).
DOCUMENTS_AT_ONCE = 32
#: Fields a scan of the documents' versions asks for at once (Redis's COUNT hint).
SCAN_COUNT = 1000


class ScheduleMarks(roles.Schedules):
    """The documents in one hash, changed with the version in one transaction; one hash of
    marks per schedule, read and moved on by one script (marks.lua): `created` set once,
    `handled` and `started` never moved back, whichever replica writes last, and the
    timing (cron and zone) `handled` belongs to, so a changed cron starts at its change."""

    def __init__(self, link: Link, keys: Keys) -> None:
        self._link = link
        self._keys = keys

    def _schedule_key(self, schedule_key: str) -> str:
        return f"{self._keys.prefix}schedule:{schedule_key}"

    async def schedule_marks(self, schedule_key: str, now: float, timing: str = "") -> Marks:
        key = self._schedule_key(schedule_key)
        with self._link.operation("schedule_marks"):
            created, handled, started = await self._link.script(
                "marks", [key], repr(now), timing, ""
            )
        return Marks(float(created), _time(handled), _time(started))

    async def schedule_fired(
        self,
        schedule_key: str,
        at: float,
        started: bool,
        *,
        handled: bool = True,
        timing: str = "",
    ) -> None:
        key = self._schedule_key(schedule_key)
        fields = ("handled",) * handled + ("started",) * started
        with self._link.operation("schedule_fired"):
            await self._link.script("marks", [key], "", timing, repr(at), *fields)

    async def put_schedule(
        self,
        schedule_key: str,
        document: str,
        *,
        tenant: str | None = None,
        limit: int | None = None,
    ) -> str:
        """The document, its own version and the version every replica watches change in
        one script (a version left behind would keep the change from the other replicas),
        which also counts it in its tenant's set and refuses one past `limit`."""
        token = new_schedules_version()
        keys = [self._documents, self._versions, self._version, self._counted(tenant)]
        with self._link.operation("put_schedule"):
            kept = await self._link.script(
                "schedule_put", keys, schedule_key, document, token, "" if limit is None else limit
            )
        if not kept:
            raise ScheduleLimit(0 if limit is None else limit)
        return token

    async def delete_schedule(self, schedule_key: str, tenant: str | None = None) -> bool:
        with self._link.operation("delete_schedule"):
            async with self._link.redis.pipeline(transaction=True) as together:
                together.hdel(self._documents, schedule_key)
                together.hdel(self._versions, schedule_key)
                together.srem(self._counted(tenant), schedule_key)
                together.delete(self._schedule_key(schedule_key))
                together.set(self._version, new_schedules_version())
                found, *_ = await together.execute()
        return bool(found)

    async def schedules_version(self) -> str:
        """A token each change writes anew, never a count: Redis restarted empty, or come
        back without its last writes, would count again to a number a replica has seen
        with other documents ('' before any change, or after a loss of everything)."""
        with self._link.operation("schedules_version"):
            found = await cast(Awaitable[Any], self._link.redis.get(self._version))
        return "" if found is None else _text(found)

    async def schedule_versions(self) -> dict[str, str]:
        """Each document's version, scanned a bounded reply at a time (16 characters and
        the key a schedule, whatever the documents hold)."""
        return await self._scan(self._versions, "schedule_versions", SCAN_COUNT)

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        """The documents of `keys` (every one when None), DOCUMENTS_AT_ONCE a reply: each
        is bounded (`--max-schedule-input-size`), so a reply is too."""
        if keys is None:
            return await self._scan(self._documents, "schedule_documents", DOCUMENTS_AT_ONCE)
        wanted = list(keys)
        found: dict[str, str] = {}
        for first in range(0, len(wanted), DOCUMENTS_AT_ONCE):
            chunk = wanted[first : first + DOCUMENTS_AT_ONCE]
            with self._link.operation("schedule_documents"):
                texts = await cast(
                    Awaitable[list[Any]], self._link.redis.hmget(self._documents, chunk)
                )
            found.update(
                {
                    key: _text(text)
                    for key, text in zip(chunk, texts, strict=True)
                    if text is not None
                }
            )
        return found

    async def _scan(self, key: str, operation: str, count: int) -> dict[str, str]:
        found: dict[str, str] = {}
        cursor: Any = 0
        while True:
            with self._link.operation(operation):
                cursor, part = await cast(
                    Awaitable[tuple[Any, dict[Any, Any]]],
                    self._link.redis.hscan(key, cursor, count=count),
                )
            found.update({_text(k): _text(v) for k, v in part.items()})
            if int(cursor) == 0:
                return found

    def _counted(self, tenant: str | None) -> str:
        """The set of the keys a tenant's count holds (a server without tenants: one)."""
        if tenant is None:
            return f"{self._keys.prefix}schedules:untenanted"
        return f"{self._keys.prefix}schedules:tenant:{tenant}"

    @property
    def _versions(self) -> str:
        return f"{self._keys.prefix}schedules:versions"

    @property
    def _documents(self) -> str:
        return f"{self._keys.prefix}schedules"

    @property
    def _version(self) -> str:
        return f"{self._keys.prefix}schedules:version"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)
