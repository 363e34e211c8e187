"""Schedules in Redis: the API's documents (a hash, and a version every change writes anew),
and each schedule's marks: when each was first seen, its last fire time handled and the
last that started an execution, shared by every replica, so a replica that comes up knows
which firings it may still start and which execution ran last."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

from agent_server.store.base import Marks, new_schedules_version
from agent_server.store.redis.part import StorePart


class ScheduleMarks(StorePart):
    """The documents in one hash, changed with the version in one transaction; one hash of
    marks per schedule, read and moved on by one script (marks.lua): `created` set once,
    `handled` and `started` never moved back, whichever replica writes last, and the
    timing (cron and zone) `handled` belongs to, so a changed cron starts at its change."""

    def _schedule_key(self, schedule_key: str) -> str:
        return f"{self.keys.prefix}schedule:{schedule_key}"

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

    async def put_schedule(self, schedule_key: str, document: str) -> None:
        """The document and the version every replica watches change together: a version
        left behind would keep the change from the other replicas until the next one."""
        with self._link.operation("put_schedule"):
            async with self._link.redis.pipeline(transaction=True) as both:
                both.hset(self._documents, schedule_key, document)
                both.set(self._version, new_schedules_version())
                await both.execute()

    async def delete_schedule(self, schedule_key: str) -> bool:
        with self._link.operation("delete_schedule"):
            async with self._link.redis.pipeline(transaction=True) as all_three:
                all_three.hdel(self._documents, schedule_key)
                all_three.delete(self._schedule_key(schedule_key))
                all_three.set(self._version, new_schedules_version())
                found, _, _ = await all_three.execute()
        return bool(found)

    async def schedules_version(self) -> str:
        """A token each change writes anew, never a count: Redis restarted empty, or come
        back without its last writes, would count again to a number a replica has seen
        with other documents ('' before any change, or after a loss of everything)."""
        with self._link.operation("schedules_version"):
            found = await cast(Awaitable[Any], self._link.redis.get(self._version))
        return "" if found is None else _text(found)

    async def schedule_documents(self) -> dict[str, str]:
        with self._link.operation("schedule_documents"):
            found = await cast(Awaitable[dict[Any, Any]], self._link.redis.hgetall(self._documents))
        return {_text(k): _text(v) for k, v in found.items()}

    @property
    def _documents(self) -> str:
        return f"{self.keys.prefix}schedules"

    @property
    def _version(self) -> str:
        return f"{self.keys.prefix}schedules:version"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _time(value: Any) -> float | None:
    return None if value is None else float(value)
