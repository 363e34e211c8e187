"""Session release: cancel a session's running work wherever it runs, settle it by one
deadline, forget its records.

Each release runs in a task owned here, not in the request that asked for it: concurrent
callers of one release share its answer, and one caller going away does not cut it short
for the others. A release that finds another replica's under way (a shared store) joins it
and answers with its answer. Every wait ends by the release's deadline, and no later than
the shutdown's own settle deadline (`limit`), so a release always answers JSON before the
listener closes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from agent_server.model.execution import CancelReason, Execution
from agent_server.model.names import TENANT_SEPARATOR, scoped
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import ExecutionStore

logger = logging.getLogger("agent_server.sessions")

#: A release that joined another replica's looks at the shutdown's limit this often.
JOIN_SLICE = 1.0
#: ...and waits this long past its own deadline for the shared answer: the release it joined
#: began a moment earlier, and answers a moment after its own deadline (it forgets the
#: session's records first).
JOIN_GRACE = 0.25
#: A release waits this long past its deadline for the ends of work other replicas run: each
#: owner abandons its part at the same deadline, and its end takes a moment to arrive.
OWNER_GRACE = 0.2


class SessionBusy(Exception):
    """The session has running work and the caller chose not to cancel it."""


class ReleaseObserver(Protocol):
    def session_released(self, outcome: str) -> None: ...


@dataclass(frozen=True)
class SessionRelease:
    session_id: str
    cancelled: int
    abandoned: int
    forgotten: int
    elapsed_seconds: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class SessionReleases:
    """The releases in progress on this replica, one task each."""

    def __init__(
        self,
        store: ExecutionStore,
        registry: InFlightRegistry,
        observer: ReleaseObserver | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.observer = observer
        self._ongoing: dict[str, asyncio.Task[SessionRelease]] = {}
        self._limit: float | None = None
        self._limited = asyncio.Event()

    async def release(
        self,
        session_id: str,
        *,
        timeout: float | None,
        cancel_running: bool,
        tenant: str | None = None,
    ) -> SessionRelease:
        """Release the session (the tenant's: names.py `scoped`), or join the release
        already under way on this replica."""
        name = scoped(tenant, session_id)
        task = self._ongoing.get(name)
        if task is None:
            started = time.monotonic()
            found = await self.store.session(session_id, tenant)
            running = [e for e in found if not e.is_terminal]
            if running and not cancel_running:
                raise SessionBusy(session_id)
            task = self._ongoing.get(name)  # another caller may have begun meanwhile
            if task is None:
                deadline = None if timeout is None else started + timeout
                task = asyncio.create_task(
                    self._release(session_id, tenant, running, started, deadline),
                    name=f"session-release-{name}",
                )
                self._ongoing[name] = task
                task.add_done_callback(self._on_done)
        return await asyncio.shield(task)

    def limit(self, deadline: float) -> None:
        """The shutdown settles by `deadline`: every release answers by then too."""
        self._limit = deadline if self._limit is None else min(self._limit, deadline)
        self._limited.set()

    async def close(self) -> None:
        """Cancel releases still under way (their callers have gone) and observe them."""
        tasks = list(self._ongoing.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _end(self, deadline: float | None) -> float | None:
        """The earlier of the release's own deadline and the shutdown's, if any."""
        if self._limit is None:
            return deadline
        return self._limit if deadline is None else min(deadline, self._limit)

    def _on_done(self, task: asyncio.Task[SessionRelease]) -> None:
        name = task.get_name().removeprefix("session-release-")
        if self._ongoing.get(name) is task:
            del self._ongoing[name]
        if not task.cancelled() and task.exception() is not None:
            shown = name.rpartition(TENANT_SEPARATOR)[2]  # the id, as its caller named it
            logger.error("release of session %s failed", shown, exc_info=task.exception())

    async def _release(
        self,
        session_id: str,
        tenant: str | None,
        running: list[Execution],
        started: float,
        deadline: float | None,
    ) -> SessionRelease:
        hold = None if deadline is None else max(0.0, deadline - time.monotonic()) + 1.0
        other = await self.store.begin_release(session_id, hold, tenant)
        if other is not None:
            return await self._join(session_id, tenant, other, started, deadline)
        answer: SessionRelease | None = None
        try:
            settle_within = None if deadline is None else max(0.0, deadline - time.monotonic())
            for execution in running:
                await self.store.request_cancel(
                    execution, CancelReason.SESSION_RELEASED, settle_within
                )
            ended = await self._wait(running, deadline)
            abandoned = len(running) - ended
            forgotten = 0
            for execution in await self.store.session(session_id, tenant):
                if execution.is_terminal and await self.store.forget(execution.execution_id):
                    forgotten += 1
            answer = SessionRelease(
                session_id=session_id,
                cancelled=len(running) - abandoned,
                abandoned=abandoned,
                forgotten=forgotten,
                elapsed_seconds=time.monotonic() - started,
            )
        finally:
            shared = None if answer is None else answer.to_json()
            await self.store.end_release(session_id, shared, tenant)
        assert answer is not None  # set in the try: an exception left above
        if self.observer is not None:
            self.observer.session_released("abandoned" if abandoned else "settled")
        return answer

    async def _join(
        self,
        session_id: str,
        tenant: str | None,
        release_id: str,
        started: float,
        deadline: float | None,
    ) -> SessionRelease:
        """Another replica is releasing this session: its answer is this one's, by this
        release's own deadline (and JOIN_GRACE). Past it, what still runs counts as
        abandoned."""
        while True:
            end = self._end(deadline)
            end = None if end is None else end + JOIN_GRACE
            left = JOIN_SLICE if end is None else min(JOIN_SLICE, end - time.monotonic())
            shared = await self.store.shared_release(release_id, max(0.0, left))
            if shared is not None:
                return SessionRelease(
                    session_id=session_id,
                    cancelled=int(shared["cancelled"]),
                    abandoned=int(shared["abandoned"]),
                    forgotten=int(shared["forgotten"]),
                    elapsed_seconds=time.monotonic() - started,
                )
            end = self._end(deadline)
            if end is not None and time.monotonic() >= end + JOIN_GRACE:
                found = await self.store.session(session_id, tenant)
                still = [e for e in found if not e.is_terminal]
                return SessionRelease(session_id, 0, len(still), 0, time.monotonic() - started)

    async def _wait(self, running: list[Execution], deadline: float | None) -> int:
        """Wait for the executions' ends by the deadline (or the shutdown's); how many
        settled. Those this replica runs that have not are abandoned here, at the deadline;
        those others run, by their owners (OWNER_GRACE)."""
        waiters = {
            asyncio.create_task(self.store.wait(execution, None)): execution
            for execution in running
        }
        limited = asyncio.create_task(self._limited.wait())
        try:
            pending = set(waiters)
            while pending:
                end = self._end(deadline)
                timeout = None if end is None else end - time.monotonic()
                if timeout is not None and timeout <= 0:
                    break
                wake = pending if limited.done() else {*pending, limited}
                done, _ = await asyncio.wait(
                    wake, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if not done:  # the deadline passed
                    break
                pending -= done
            remote = {t for t in pending if self.registry.running(waiters[t].execution_id) is None}
            if remote and not limited.done():
                # Their owners abandon them at this same deadline: wait for those ends, so
                # an abandoned execution is forgotten wherever it ran, as it is here.
                await asyncio.wait(remote, timeout=OWNER_GRACE)
        finally:
            for task in [*waiters, limited]:
                task.cancel()
            await asyncio.gather(*waiters, limited, return_exceptions=True)
        settled = 0
        for task, execution in waiters.items():
            latest = execution
            if task.done() and not task.cancelled() and task.exception() is None:
                latest = task.result()
            elif self.registry.running(execution.execution_id) is not None:
                self.registry.abandon(execution.execution_id)
            if latest.is_terminal and not latest.abandoned and not execution.abandoned:
                settled += 1
        return settled
