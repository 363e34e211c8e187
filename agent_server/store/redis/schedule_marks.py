"""Schedules in Redis: the API's documents (a hash, and a version every change moves on),
and each schedule's marks: when each was first seen, its last fire time handled and the
last that started an execution, shared by every replica, so a replica that comes up knows
which firings it may still start and which execution ran last."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

from agent_server.store.base import Marks
from agent_server.store.redis.part import StorePart


class ScheduleMarks(StorePart):
    """The documents in one hash; one hash of marks per schedule: `created` (set once,
    HSETNX), `handled` and `started` (a replica writes only a later one than it read; a
    race rewrites a near value)."""

    def _schedule_key(self, schedule_key: str) -> str:
        return f"{self.keys.prefix}schedule:{schedule_key}"

    async def schedule_marks(self, schedule_key: str, now: float) -> Marks:
        key = self._schedule_key(schedule_key)
        redis = self._link.redis
        with self._link.operation("schedule_marks"):
            await cast(Awaitable[Any], redis.hsetnx(key, "created", repr(now)))
            created, handled, started = await cast(
                Awaitable[list[Any]], redis.hmget(key, "created", "handled", "started")
            )
        return Marks(float(created), _time(handled), _time(started))

    async def schedule_fired(self, schedule_key: str, at: float, started: bool) -> None:
        key = self._schedule_key(schedule_key)
        redis = self._link.redis
        fields = ("handled", "started") if started else ("handled",)
        with self._link.operation("schedule_fired"):
            kept = await cast(Awaitable[list[Any]], redis.hmget(key, *fields))
            later: dict[Any, Any] = {
                f: repr(at) for f, v in zip(fields, kept, strict=True) if _later(v, at)
            }
            if later:
                await cast(Awaitable[Any], redis.hset(key, mapping=later))

    async def put_schedule(self, schedule_key: str, document: str) -> None:
        redis = self._link.redis
        with self._link.operation("put_schedule"):
            await cast(Awaitable[Any], redis.hset(self._documents, schedule_key, document))
            await cast(Awaitable[Any], redis.incr(self._version))

    async def delete_schedule(self, schedule_key: str) -> bool:
        redis = self._link.redis
        with self._link.operation("delete_schedule"):
            found = await cast(Awaitable[Any], redis.hdel(self._documents, schedule_key))
            await cast(Awaitable[Any], redis.delete(self._schedule_key(schedule_key)))
            await cast(Awaitable[Any], redis.incr(self._version))
        return bool(found)

    async def schedules_version(self) -> int:
        with self._link.operation("schedules_version"):
            found = await cast(Awaitable[Any], self._link.redis.get(self._version))
        return 0 if found is None else int(found)

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


def _later(kept: Any, at: float) -> bool:
    return kept is None or float(kept) < at
