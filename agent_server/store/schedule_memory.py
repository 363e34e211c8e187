"""The `Schedules` role (roles.py) for a store in this process: documents, their versions,
each tenant's count and each schedule's marks, kept in a `ScheduleDocuments`
(schedule_docs.py). The memory store takes it as a base class; the shared stores write
their own (Redis: redis/schedule_marks.py, Postgres: postgres/records.py)."""

from __future__ import annotations

import functools
from collections.abc import Collection

from agent_server.store.roles import Schedules
from agent_server.store.schedule_docs import Marks, ScheduleDocuments


class InProcessSchedules(Schedules):
    """Schedules in this process's memory: what a replica alone sees of them."""

    async def schedule_marks(self, schedule_key: str, now: float, timing: str = "") -> Marks:
        kept = self._schedules.marks.setdefault(schedule_key, Marks(now))
        if timing and kept.timing != timing:
            if kept.timing is not None:
                kept.handled = now if kept.handled is None else max(kept.handled, now)
            kept.timing = timing
        return Marks(kept.created, kept.handled, kept.started)

    async def schedule_fired(
        self,
        schedule_key: str,
        at: float,
        started: bool,
        *,
        handled: bool = True,
        timing: str = "",
    ) -> None:
        kept = self._schedules.marks.setdefault(schedule_key, Marks(at))
        if timing:
            kept.timing = timing
        if handled:
            kept.handled = at if kept.handled is None else max(kept.handled, at)
        if started:
            kept.started = at if kept.started is None else max(kept.started, at)

    async def put_schedule(
        self,
        schedule_key: str,
        document: str,
        *,
        tenant: str | None = None,
        limit: int | None = None,
    ) -> str:
        return self._schedules.put(schedule_key, document, tenant, limit)

    async def delete_schedule(self, schedule_key: str, tenant: str | None = None) -> bool:
        return self._schedules.delete(schedule_key, tenant)

    async def schedules_version(self) -> str:
        return self._schedules.version

    async def schedule_versions(self) -> dict[str, str]:
        return dict(self._schedules.versions)

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        return self._schedules.read(keys)

    @functools.cached_property
    def _schedules(self) -> ScheduleDocuments:
        return ScheduleDocuments()
