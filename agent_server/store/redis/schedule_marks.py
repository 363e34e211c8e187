"""Schedules' marks in Redis: when each was first seen, its last fire time handled and the
last that started an execution, shared by every replica, so a replica that comes up knows
which firings it may still start and which execution ran last."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, cast

from agent_server.store.base import Marks
from agent_server.store.redis.part import StorePart


class ScheduleMarks(StorePart):
    """One hash per schedule: `created` (set once, HSETNX), `handled` and `started` (a
    replica writes only a later one than it read; a race rewrites a near value)."""

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

    async def forget_schedule(self, schedule_key: str) -> None:
        with self._link.operation("forget_schedule"):
            await cast(Awaitable[Any], self._link.redis.delete(self._schedule_key(schedule_key)))


def _time(value: Any) -> float | None:
    return None if value is None else float(value)


def _later(kept: Any, at: float) -> bool:
    return kept is None or float(kept) < at
