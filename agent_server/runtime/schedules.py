"""`ScheduleTicker`: this replica's firings of every schedule, exactly once across replicas.

Every replica fires every schedule: a firing's execution id and idempotency key come from
(schedule, fire time), so the second replica's start is the idempotent duplicate of the
first's, and no replica has to be elected. The store keeps each schedule's marks (when it
was first seen, the last fire time handled, the last that started one): a replica coming up
starts the missed firings younger than `catchup_window` once each and counts older ones as
missed. A draining replica fires nothing (docs/schedules.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.model.principal import Principal
from agent_server.model.reasoner import Reasoner
from agent_server.model.record import isoformat
from agent_server.model.schedules import Schedule
from agent_server.model.scheduling import SessionPolicy
from agent_server.model.status import TERMINAL
from agent_server.runtime.admission import AdmissionError
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import (
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    StoreUnavailable,
)

logger = logging.getLogger("agent_server.schedules")

#: The longest sleep between two ticks: a schedule added, enabled or due sooner wakes it.
TICK_CAP = 1.0
#: After a firing that could not start (no room, the store unreachable): try again then.
RETRY_AFTER = 0.25
#: Ids derived from (schedule, fire time) live in their own UUID namespace.
_NAMESPACE = uuid.UUID("6f2c1d0e-5b1a-4d8e-9a55-3c1e0f7b2a41")


def firing_id(schedule_key: str, at: float) -> str:
    """The execution id of the firing at `at`: the same on every replica."""
    return uuid.uuid5(_NAMESPACE, f"{schedule_key}\x1f{at:.3f}").hex


@dataclass(eq=False)
class Entry:
    """One schedule as this replica fires it."""

    schedule_id: str
    reasoner: str
    schedule: Schedule
    #: The tenant it belongs to (None: declared, or no authentication) and who made it.
    principal: Principal | None = None
    declared: bool = False
    created_at: float | None = None
    #: Fire times up to this one are handled; None until the store's marks were read.
    cursor: float | None = None
    #: The fire time of the latest execution it started, as known here.
    started: float | None = None
    #: Its next fire time, and when the heap wakes for it (later, to retry a firing).
    next_at: float | None = None
    wake_at: float | None = None
    removed: bool = False
    #: The JSON document the store keeps for it ('' for a declared one not changed).
    document: str = ""

    def view(self) -> dict[str, Any]:
        """What the API shows of it (docs/schedules.md)."""
        schedule = self.schedule
        next_at = schedule.next_fire(time.time()) if schedule.enabled else None
        return {
            "schedule_id": self.schedule_id,
            "reasoner": self.reasoner,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "input": dict(schedule.input),
            "session_id": schedule.session_id,
            "overlap": schedule.overlap,
            "catchup_window": schedule.catchup_window,
            "enabled": schedule.enabled,
            "declared": self.declared,
            "next_fire_at": None if next_at is None else isoformat(next_at),
            "created_at": None if self.created_at is None else isoformat(self.created_at),
        }

    def to_document(self) -> str:
        """The JSON text the store keeps for every replica."""
        schedule = self.schedule
        return json.dumps(
            {
                "schedule_id": self.schedule_id,
                "reasoner": self.reasoner,
                "declared": self.declared,
                "created_at": self.created_at,
                "owner": None if self.principal is None else self.principal.identity,
                "tenant": self.tenant,
                "cron": schedule.cron,
                "timezone": schedule.timezone,
                "input": dict(schedule.input),
                "session_id": schedule.session_id,
                "overlap": schedule.overlap,
                "catchup_window": schedule.catchup_window,
                "enabled": schedule.enabled,
            },
            sort_keys=True,
        )

    @classmethod
    def from_document(cls, text: str) -> Entry:
        doc = json.loads(text)
        principal = None if doc["owner"] is None else Principal(doc["owner"], doc["tenant"])
        schedule = Schedule(
            doc["cron"],
            input=doc["input"],
            timezone=doc["timezone"],
            overlap=doc["overlap"],
            catchup_window=doc["catchup_window"],
            session_id=doc["session_id"],
            enabled=doc["enabled"],
        )
        return cls(
            doc["schedule_id"],
            doc["reasoner"],
            schedule,
            principal=principal,
            declared=doc["declared"],
            created_at=doc["created_at"],
            document=text,
        )

    @property
    def tenant(self) -> str | None:
        return None if self.principal is None else self.principal.tenant

    @property
    def key(self) -> str:
        """Its name in the store: its id, as its tenant's."""
        return scoped(self.tenant, self.schedule_id)


class Firing:
    """What one firing did: the execution, and whether this call started it."""

    __slots__ = ("execution", "outcome")

    def __init__(self, outcome: str, execution: Execution | None = None) -> None:
        self.outcome = outcome
        self.execution = execution


class ScheduleTicker:
    """The schedules this replica fires: a heap of next fire times, one task."""

    def __init__(
        self,
        registry: InFlightRegistry,
        store: ExecutionStore,
        reasoners: Mapping[str, Reasoner],
        *,
        observe: Callable[[str, float | None], None],
        draining: Callable[[], bool],
        idempotency_ttl: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = store
        self.reasoners = reasoners
        self._observe = observe
        self._draining = draining
        self._ttl = idempotency_ttl
        self._clock = clock
        self.entries: dict[str, Entry] = {}
        self._heap: list[tuple[float, int, Entry]] = []
        self._order = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        #: The declared schedules as their reasoners declare them (a document may disable
        #: one), and the store's documents' version last read.
        self.declared: dict[str, Entry] = {}
        self._version: int | None = None

    def declare(self, entry: Entry) -> None:
        """A schedule declared on a reasoner: fired unless a document disables it."""
        self.declared[entry.key] = entry
        self.add(entry)

    async def sync(self) -> None:
        """Take the store's documents when their version moved: schedules made, changed or
        deleted through the API on any replica, and declared ones disabled or enabled."""
        version = await self.store.schedules_version()
        if version == self._version:
            return
        documents = await self.store.schedule_documents()
        self._version = version
        for key, text in documents.items():
            current = self.entries.get(key)
            if current is not None and current.document == text:
                continue
            try:
                entry = Entry.from_document(text)
            except (ValueError, KeyError, TypeError):
                logger.warning("schedule %r: its document cannot be read; not fired", key)
                continue
            if entry.reasoner not in self.reasoners:
                logger.warning("schedule %r: reasoner %r is not served here", key, entry.reasoner)
                continue
            self.add(entry)
        for key, entry in list(self.entries.items()):
            if key not in documents and entry.document:
                self.remove(key)
                if key in self.declared:  # its change deleted: as declared again
                    self.add(self.declared[key])

    def add(self, entry: Entry) -> None:
        """Fire `entry` from now on (its marks are read at its first tick)."""
        old = self.entries.get(entry.key)
        if old is not None:
            old.removed = True
            entry.started = old.started
            entry.cursor = old.cursor
            if entry.created_at is None:
                entry.created_at = old.created_at
            if entry.cursor is not None and not old.schedule.enabled:
                entry.cursor = max(entry.cursor, self._clock())  # a disabled period: never run
        self.entries[entry.key] = entry
        self._push(entry, self._clock())
        if self._wake is not None:
            self._wake.set()

    def wake(self) -> None:
        """Sync and tick now (a schedule changed here)."""
        self._version = None
        if self._wake is not None:
            self._wake.set()

    def remove(self, key: str) -> Entry | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            entry.removed = True
        return entry

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name="agent-server schedules")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _push(self, entry: Entry, at: float) -> None:
        self._order += 1
        heapq.heappush(self._heap, (at, self._order, entry))

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            try:
                await self.sync()
                if not self._draining():
                    await self.tick()
            except StoreUnavailable:
                pass  # readiness says so; the next tick reads the store again
            except Exception:  # one bad tick must not end the firings
                logger.exception("schedule tick failed")
            now = self._clock()
            pause = TICK_CAP if not self._heap else min(TICK_CAP, self._heap[0][0] - now)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.005, pause)):
                    await self._wake.wait()

    async def tick(self) -> None:
        """Fire every firing due by now, each schedule's in order."""
        now = self._clock()
        while self._heap and self._heap[0][0] <= now and not self._draining():
            due, _, entry = heapq.heappop(self._heap)
            if entry.removed or (entry.wake_at is not None and due != entry.wake_at):
                continue
            try:
                if entry.cursor is None:
                    await self._prime(entry, now)
                if entry.next_at is None:  # new here, or changed: its next fire time
                    self._schedule_next(entry)
                    continue
                done = await self._fire_due(entry, entry.next_at, now)
            except StoreUnavailable:
                done = False
            if done:
                self._schedule_next(entry)
            else:  # the same fire time again soon, while it is inside its window
                entry.wake_at = now + RETRY_AFTER
                self._push(entry, entry.wake_at)

    def _schedule_next(self, entry: Entry) -> None:
        assert entry.cursor is not None
        entry.next_at = entry.wake_at = entry.schedule.next_fire(entry.cursor)
        self._push(entry, entry.next_at)

    async def _prime(self, entry: Entry, now: float) -> None:
        """Read the store's marks: start after the later of its creation, its last handled
        fire time and the window's start, counting what falls out of the window as missed."""
        marks = await self.store.schedule_marks(entry.key, now)
        entry.created_at = marks.created if entry.created_at is None else entry.created_at
        entry.started = marks.started
        handled = marks.created if marks.handled is None else max(marks.created, marks.handled)
        window_start = now - entry.schedule.catchup_window
        if handled < window_start and entry.schedule.enabled:
            for _ in entry.schedule.fire_times(handled, window_start):
                self._observe("missed", None)
        entry.cursor = max(handled, window_start)

    async def _fire_due(self, entry: Entry, at: float, now: float) -> bool:
        """Fire `at` (and count it missed when it fell out of the window). False: not done,
        try again soon."""
        if entry.cursor is not None and at <= entry.cursor:
            return True
        if not entry.schedule.enabled:  # a disabled period's fire times never run
            entry.cursor = at
            await self.store.schedule_fired(entry.key, at, False)
            return True
        if at < now - entry.schedule.catchup_window:
            self._observe("missed", None)
            entry.cursor = at
            await self.store.schedule_fired(entry.key, at, False)
            return True
        try:
            firing = await self.fire(entry, at)
        except AdmissionError:
            return False
        entry.cursor = at
        await self.store.schedule_fired(entry.key, at, firing.outcome == "started")
        return True

    async def fire(self, entry: Entry, at: float, *, overlap: bool = True) -> Firing:
        """Start the firing at `at`, or skip it by its overlap policy; its execution (the
        earlier one for a repeat) and the outcome this call had."""
        reasoner = self.reasoners[entry.reasoner]
        schedule = entry.schedule
        policy = SessionPolicy.PARALLEL
        session_id = schedule.session_id
        if schedule.overlap in ("buffer_one", "cancel_other"):
            # The session's gate waits for (or interrupts) the previous firing, on any replica.
            session_id = session_id or f"schedule:{entry.schedule_id}"
            policy = (
                SessionPolicy.ENQUEUE
                if schedule.overlap == "buffer_one"
                else SessionPolicy.INTERRUPT
            )
        if overlap and schedule.overlap in ("skip", "buffer_one"):
            previous = await self._previous(entry)
            full = previous is not None and (
                previous.status is ExecutionStatus.QUEUED or schedule.overlap == "skip"
            )
            if full and previous is not None and previous.execution_id != firing_id(entry.key, at):
                self._observe("skipped", None)
                return Firing("skipped", previous)
        body = dict(schedule.input)
        key = entry.key
        execution_id = firing_id(key, at)

        def stamp(execution: Execution) -> None:
            execution.execution_id = execution_id
            execution.schedule_id = entry.schedule_id
            execution.scheduled_at = at

        window = schedule.catchup_window
        try:
            execution, started = await self.registry.start_once(
                reasoner,
                reasoner.bind(body),
                session_id,
                body=body,
                idempotency=Idempotency(
                    f"schedule\x1f{key}\x1f{at:.3f}",
                    reasoner.fingerprint(session_id, body),
                    max(self._ttl, 2 * window + 60.0),
                ),
                session_policy=policy,
                announce=stamp,
                principal=entry.principal,
            )
        except (IdempotencyForgotten, IdempotencyMismatch):
            return Firing("duplicate")  # started before, and since forgotten or changed
        entry.started = at if entry.started is None else max(entry.started, at)
        if started:
            self._observe("started", self._clock() - at)
            return Firing("started", execution)
        return Firing("duplicate", execution)

    async def _previous(self, entry: Entry) -> Execution | None:
        """The latest execution the schedule started, while it is not terminal."""
        if entry.started is None:
            return None
        previous = await self.store.get(firing_id(entry.key, entry.started))
        if previous is None or previous.status in TERMINAL:
            return None
        return previous
