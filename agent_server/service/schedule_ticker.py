"""`ScheduleTicker`: this replica's firings of every schedule, exactly once across replicas.

Every replica fires every schedule: a firing's execution id and idempotency key come from
(schedule, fire time), so the second replica's start is the idempotent duplicate of the
first's, and no replica has to be elected. The store keeps each schedule's marks (when it
was first seen, the fire times handled, the last that started one): a replica coming up
starts the missed firings younger than `catchup_window` once each and counts older ones as
missed, and every overlap decision reads the last started from the marks, whichever replica
(or trigger) started it. A draining replica fires nothing (docs/schedules.md).

A firing's lateness counts from the moment this replica last began firing without a gap
(it came up, found the store again, or woke after a pause past GAP): a firing that comes
due while it runs is tried at least once however late its tick, so `catchup_window: 0`
means no catch-up, not never.

A firing starts through the application layer (`Starts.fire`), as every front's start does:
the registry's refusals reach the ticker as the `Refusal`s a request's start gets, and it
maps them to what a firing does (`RETRIED`: the same fire time soon; a refused key: the
duplicate of a start before it).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from pydantic import ValidationError

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.record import isoformat
from agent_server.model.schedules import MAX_COUNTED, FiringOutcome, Schedule, binding_problem
from agent_server.model.scheduling import SessionPolicy
from agent_server.model.status import TERMINAL
from agent_server.runtime.schedule_entries import Entry, Firing, firing_id, retimed
from agent_server.service.refusals import Refusal, Why
from agent_server.service.starts import Stamp, Starts
from agent_server.store.base import Idempotency, StoreUnavailable
from agent_server.store.roles import Reads, Schedules

logger = logging.getLogger("agent_server.schedules")

#: The longest sleep between two ticks: a schedule added, enabled or due sooner wakes it.
TICK_CAP = 1.0
#: After a firing that could not start (no room, the store unreachable): try again then.
RETRY_AFTER = 0.25
#: A ticker that wakes this much later than it meant to was not firing (the process was
#: paused, or its loop held): a gap, as if the replica had been down. Below it, lateness is
#: the tick's own (a loaded machine), and a firing due meanwhile still starts.
GAP = 5.0
#: A firing refused for now (the registry's admission: full, draining, a session released,
#: the store's answer lost or in doubt): the same fire time is tried again soon, inside its
#: window, and nothing is logged. Any other refusal is a failure, logged once.
RETRIED = frozenset(
    {Why.BUSY, Why.SESSION_RELEASING, Why.UNAVAILABLE, Why.IN_DOUBT, Why.SHUTTING_DOWN}
)
#: A firing's key refused: started before, and since forgotten or changed (a duplicate).
REPEATED = frozenset({Why.KEY_FORGOTTEN, Why.KEY_MISMATCH})


class TickerStore(Schedules, Reads, Protocol):
    """What a ticker asks of the store: the schedules' documents and marks, and the
    execution a firing started (`get`)."""


def firing_session(schedule_id: str, schedule: Schedule) -> tuple[str | None, SessionPolicy]:
    """The session a firing runs in, and its policy: under `buffer_one` and `cancel_other`
    the session's gate waits for (or interrupts) the previous firing, on any replica."""
    if schedule.overlap not in ("buffer_one", "cancel_other"):
        return schedule.session_id, SessionPolicy.PARALLEL
    session_id = schedule.session_id or f"schedule:{schedule_id}"
    if schedule.overlap == "buffer_one":
        return session_id, SessionPolicy.ENQUEUE
    return session_id, SessionPolicy.INTERRUPT


class ScheduleTicker:
    """The schedules this replica fires: a heap of next fire times, one task. Its firings
    start through `starts`, the use case every front starts with."""

    def __init__(
        self,
        starts: Starts,
        store: TickerStore,
        reasoners: Mapping[str, Reasoner],
        *,
        observe: Callable[[str, float | None], None],
        draining: Callable[[], bool],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.starts = starts
        self.store = store
        self.reasoners = reasoners
        self._observe = observe
        self._draining = draining
        self._clock = clock
        self.entries: dict[str, Entry] = {}
        self._heap: list[tuple[float, int, Entry]] = []
        self._order = 0
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        #: The declared schedules as their reasoners declare them (a document may disable
        #: one), and the store's documents' version last read (a token no other set of
        #: documents shows, even after Redis lost data: store/roles.py `schedules_version`).
        self.declared: dict[str, Entry] = {}
        self._version: str | None = None
        #: Each document's version as last read (a document that could not be read too).
        self._tokens: dict[str, str] = {}
        self._syncing = asyncio.Lock()
        #: `listing`'s lists, by tenant (None: every tenant's), until the next change.
        self._listings: dict[str | None, list[Entry]] = {}
        #: Since when this replica has fired without a gap (None: a gap, the store
        #: unreachable, just ended; the next tick begins again from its own moment).
        self._since: float | None = None
        #: A failure to read the documents (other than the store unreachable) was logged.
        self._sync_failed = False

    def declare(self, entry: Entry) -> None:
        """A schedule declared on a reasoner: fired unless a document disables it. The
        declaration stays a template: what fires is a copy of it."""
        self.declared[entry.key] = entry
        self.add(entry.overridden(entry.schedule.enabled))

    async def sync(self) -> None:
        """Take what changed in the store since the version last read: schedules made,
        changed or deleted through the API on any replica, and declared ones disabled or
        enabled. An equal version means the same documents, as each change writes a new
        token; then each document's own version says which changed, and only those are
        read (one change costs one document, whatever the other tenants hold)."""
        async with self._syncing:  # a request's and the tick's: one reads, the other sees it
            await self._sync()

    async def _sync(self) -> None:
        version = await self.store.schedules_version()
        if version == self._version:
            return
        versions = await self.store.schedule_versions()
        changed = [key for key, token in versions.items() if self._tokens.get(key) != token]
        documents = await self.store.schedule_documents(changed) if changed else {}
        self._version = version
        for key in changed:
            text = documents.get(key)
            if text is None:  # deleted since its version was read: the next sync sees it
                continue
            self._tokens[key] = versions[key]
            current = self.entries.get(key)
            if current is not None and current.document == text:
                continue
            entry = self._entry_of(key, text)
            if entry is not None:
                self.add(entry)
        # Gone: read before (a version held), or made here and not read yet (a document).
        held = {*self._tokens, *(key for key, entry in self.entries.items() if entry.document)}
        for key in [key for key in held if key not in versions]:
            self._tokens.pop(key, None)
            entry = self.entries.get(key)
            if entry is not None and entry.document:
                self.remove(key)
                if key in self.declared:  # its change deleted: as declared again
                    base = self.declared[key]
                    self.add(base.overridden(base.schedule.enabled))

    def listing(self, tenant: str | None, every: bool) -> list[Entry]:
        """The schedules a list shows, by id: the declared ones and `tenant`'s (every
        tenant's with `every`). Kept until the schedules change, so a page costs a search,
        not a sort of every tenant's schedules."""
        wanted = None if every else tenant
        found = self._listings.get(wanted)
        if found is None:
            found = sorted(
                (
                    entry
                    for entry in self.entries.values()
                    if every or entry.declared or entry.tenant == tenant
                ),
                key=lambda entry: entry.schedule_id,
            )
            self._listings[wanted] = found
        return found

    def _entry_of(self, key: str, text: str) -> Entry | None:
        """The entry a document makes, or None (logged) when it is not fired here. A
        declared schedule's document only says whether it is enabled: its cron, input and
        the rest are what this release declares, and one no longer declared is not fired."""
        try:
            doc = json.loads(text)
            if isinstance(doc, dict) and doc.get("declared") is True:
                enabled = doc["enabled"]
                if not isinstance(enabled, bool):
                    raise TypeError("enabled")
                base = self.declared.get(key)
                if base is None:
                    logger.warning("schedule %r: not declared by this release; not fired", key)
                    return None
                return base.overridden(enabled, text)
            entry = Entry.from_document(text)
        except (ValueError, KeyError, TypeError):
            logger.warning("schedule %r: its document cannot be read; not fired", key)
            return None
        if entry.reasoner not in self.reasoners:
            logger.warning("schedule %r: reasoner %r is not served here", key, entry.reasoner)
            return None
        return entry

    def add(self, entry: Entry, since: float | None = None) -> None:
        """Fire `entry` from now on, or from `since` (its marks are read at its first tick).
        A change that gives it other fire times reads its marks again, which the change
        moved on (`keep`): nothing of the new fire times before the change runs."""
        old = self.entries.get(entry.key)
        entry.since = self._clock() if since is None else since
        if old is not None:
            old.removed = True
            if entry.created_at is None:
                entry.created_at = old.created_at
            if not retimed(old.schedule, entry.schedule):
                entry.cursor, entry.tried, entry.logged = old.cursor, old.tried, old.logged
        self.entries[entry.key] = entry
        self._listings.clear()
        self._push(entry, self._clock())
        if self._wake is not None:
            self._wake.set()

    async def keep(self, entry: Entry, limit: int | None = None) -> None:
        """A schedule made or changed here: its document into the store for every replica,
        and fired here from now on. With `limit`, it counts among its tenant's schedules: a
        new one past it is refused by the store (ScheduleLimit), and nothing changes. When
        the change gives it other fire times, its `handled` mark moves on to this moment
        first, so no replica (one reading the new document, or one coming up later) runs a
        fire time of the new cron from before it."""
        async with self._syncing:  # no sync reading meanwhile undoes it (see `forget`)
            now = self._clock()
            old = self.entries.get(entry.key)
            if old is not None and retimed(old.schedule, entry.schedule):
                await self.store.schedule_fired(entry.key, now, False, timing=entry.schedule.timing)
            entry.document = entry.to_document()
            # A new one is refused before any mark is written; a change is never refused.
            # Its version is held at once: this replica never reads back what it wrote.
            self._tokens[entry.key] = await self.store.put_schedule(
                entry.key, entry.document, tenant=entry.tenant, limit=limit
            )
            self.add(entry, since=now)
        self.wake()

    async def forget(self, entry: Entry) -> bool:
        """A schedule deleted here: gone from the store and no longer fired here. Like
        `keep`, it holds the sync's lock: a sync that read the versions or the documents
        before the change would otherwise apply them after it, dropping a schedule just
        made (its version not yet in what it read) or firing one just deleted."""
        async with self._syncing:
            found = await self.store.delete_schedule(entry.key, entry.tenant)
            self._tokens.pop(entry.key, None)
            self.remove(entry.key)
        self.wake()
        return found

    def wake(self) -> None:
        """Sync and tick now (a schedule changed here)."""
        self._version = None
        if self._wake is not None:
            self._wake.set()

    def remove(self, key: str) -> Entry | None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            entry.removed = True
            self._listings.clear()
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
            reachable = True
            try:
                await self.sync()
                self._sync_failed = False
            except StoreUnavailable:  # readiness says so; the next tick reads it again
                self._since, reachable = None, False
            except Exception:  # the schedules read before fire on; logged once
                if not self._sync_failed:
                    logger.exception("reading the schedules failed")
                self._sync_failed = True
            if reachable and not self._draining():
                try:
                    await self.tick()
                except Exception:  # pragma: no cover: tick keeps each firing's failure
                    logger.exception("schedule tick failed")
            now = self._clock()
            pause = max(
                0.005, TICK_CAP if not self._heap else min(TICK_CAP, self._heap[0][0] - now)
            )
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):
                    await self._wake.wait()
            if self._clock() - (now + pause) > GAP:  # paused, or its loop held: a gap
                self._since = None

    async def tick(self) -> None:
        """Fire every firing due by now, each schedule's in order. Whatever one firing
        raises, its schedule stays on the heap: tried again soon, then on to the next."""
        now = self._clock()
        if self._since is None:
            self._since = now
        since = self._since
        while self._heap and self._heap[0][0] <= now and not self._draining():
            due, _, entry = heapq.heappop(self._heap)
            if entry.removed or (entry.wake_at is not None and due != entry.wake_at):
                continue
            try:
                if await self._step(entry, now, max(since, entry.since)):
                    self._schedule_next(entry)
                    continue
            except StoreUnavailable:
                self._since = None  # a gap: lateness counts from the next tick on
            except Exception:
                self._failed(entry)
            # The same fire time again soon, while it is inside its window.
            entry.tried = entry.next_at
            entry.wake_at = now + RETRY_AFTER
            self._push(entry, entry.wake_at)

    async def _step(self, entry: Entry, now: float, since: float) -> bool:
        """Handle the entry's next fire time (its marks first, if not read yet). True:
        done, on to the next; False: not started, try the same again soon."""
        if entry.cursor is None:
            await self._prime(entry, now, since)
        if entry.next_at is None:  # new here, or changed: its next fire time
            return True
        return await self._fire_due(entry, entry.next_at, now, since)

    def _failed(self, entry: Entry) -> None:
        """A firing (or the read of its marks) raised: logged once for that fire time, not
        once a retry; the entry is tried again, and its window still ends it."""
        at = -math.inf if entry.next_at is None else entry.next_at
        if entry.logged != at:
            entry.logged = at
            logger.exception("schedule %r: firing failed; tried again", entry.schedule_id)

    def _schedule_next(self, entry: Entry) -> None:
        assert entry.cursor is not None
        entry.next_at = entry.wake_at = entry.schedule.next_fire(entry.cursor)
        self._push(entry, entry.next_at)

    async def _prime(self, entry: Entry, now: float, since: float) -> None:
        """Read the store's marks: start after the later of its creation, its fire times
        handled and the window's start (counted back from `since`), counting what falls
        out of the window as missed. Marks handled with another cron or zone (a release
        changed a declared one, or a replica of an earlier release changed it) move on to
        now first: nothing of a changed cron from before the change runs."""
        marks = await self.store.schedule_marks(entry.key, now, entry.schedule.timing)
        entry.created_at = marks.created if entry.created_at is None else entry.created_at
        handled = marks.created if marks.handled is None else max(marks.created, marks.handled)
        window_start = since - entry.schedule.catchup_window
        if handled < window_start and entry.schedule.enabled:
            await self._missed(entry, handled, window_start)
        entry.cursor = max(handled, window_start)

    async def _missed(self, entry: Entry, after: float, until: float) -> None:
        """Count the fire times in (`after`, `until`] as missed. Walking them is the only
        exact count, and a long outage holds millions: walked in a thread, never on the
        loop, and at most MAX_COUNTED (said in the log when there were more)."""
        count = await asyncio.to_thread(entry.schedule.count_fire_times, after, until)
        if count >= MAX_COUNTED:
            logger.warning(
                "schedule %r: at least %d firings missed since %s (counting stops there)",
                entry.schedule_id,
                count,
                isoformat(after),
            )
        for _ in range(count):
            self._observe(FiringOutcome.MISSED, None)

    async def _fire_due(self, entry: Entry, at: float, now: float, since: float) -> bool:
        """Fire `at`, or count it missed when it fell out of its window: first tried, it is
        late from `since` (a firing due while this replica fires is never late, however
        late its tick); tried again, from now. False: not done, try again soon."""
        if entry.cursor is not None and at <= entry.cursor:
            return True
        if not entry.schedule.enabled:  # a disabled period's fire times never run: all
            entry.cursor = max(at, now)  # those due by now handled at once
            await self.store.schedule_fired(entry.key, entry.cursor, False)
            return True
        retry = entry.tried == at
        horizon = (now if retry else since) - entry.schedule.catchup_window
        if at < horizon:
            if retry:  # tried until its window closed
                self._observe(FiringOutcome.MISSED, None)
                entry.cursor = at
            else:  # reached after a gap: it and every later one out of the window, at once
                assert entry.cursor is not None
                await self._missed(entry, entry.cursor, horizon)
                entry.cursor = horizon
            await self.store.schedule_fired(entry.key, entry.cursor, False)
            return True
        try:
            firing = await self.fire(entry, at)
        except Refusal as refusal:
            if refusal.why not in RETRIED:
                raise
            return False
        entry.cursor = at
        await self.store.schedule_fired(entry.key, at, firing.began)
        return True

    async def trigger(self, entry: Entry) -> Firing:
        """`POST /schedules/{id}/trigger`: a firing now, obeying `overlap`, and recorded as
        the latest started before it starts, so every replica's next overlap decision
        sees it (a start refused after leaves a mark naming no execution: no previous)."""
        return await self.fire(entry, round(self._clock(), 3), mark=True)

    async def fire(
        self, entry: Entry, at: float, *, overlap: bool = True, mark: bool = False
    ) -> Firing:
        """Start the firing at `at`, or skip it by its overlap policy; its execution (the
        earlier one for a repeat) and the outcome this call had. `mark`: record it as the
        latest started before starting it (a trigger, whose time is no fire time). A
        refusal other than a repeated key is raised: the tick tries again (`RETRIED`), the
        trigger's route answers it as a start's."""
        reasoner = self.reasoners[entry.reasoner]
        execution_id = firing_id(entry.key, at)
        if overlap and entry.schedule.overlap in ("skip", "buffer_one"):
            previous = await self._previous(entry)
            full = previous is not None and (
                previous.status is ExecutionStatus.QUEUED or entry.schedule.overlap == "skip"
            )
            if full and previous is not None and previous.execution_id != execution_id:
                self._observe(FiringOutcome.SKIPPED, None)
                return Firing(FiringOutcome.SKIPPED, previous)
        session_id, policy = firing_session(entry.schedule_id, entry.schedule)
        body = dict(entry.schedule.input)
        try:
            arguments = reasoner.bind(body)
            fingerprint = reasoner.fingerprint(session_id, body)
        except ValidationError as exc:  # a release changed the reasoner's parameters
            problem = binding_problem(exc)
            self._observe(FiringOutcome.INVALID, None)
            logger.warning(
                "schedule %r: the firing at %s did not start: its input no longer binds "
                "reasoner %r (input: %s)",
                entry.schedule_id,
                isoformat(at),
                entry.reasoner,
                problem,
            )
            return Firing(FiringOutcome.INVALID, problem=problem)
        if mark:
            await self.store.schedule_fired(entry.key, at, True, handled=False)
        # The key outlives the window: a retry inside it is always the same start's repeat.
        ttl = max(self.starts.idempotency_ttl, 2 * entry.schedule.catchup_window + 60.0)
        try:
            execution, started = await self.starts.fire(
                entry.principal,
                reasoner,
                arguments,
                session_id,
                body=body,
                stamp=Stamp(execution_id, entry.schedule_id, at),
                idempotency=Idempotency(f"schedule\x1f{entry.key}\x1f{at:.3f}", fingerprint, ttl),
                session_policy=policy,
            )
        except Refusal as refusal:
            if refusal.why not in REPEATED:
                raise
            return Firing(FiringOutcome.DUPLICATE)  # started before, and since forgotten or changed
        if started:
            self._observe(FiringOutcome.STARTED, self._clock() - at)
            return Firing(FiringOutcome.STARTED, execution)
        return Firing(FiringOutcome.DUPLICATE, execution)

    async def _previous(self, entry: Entry) -> Execution | None:
        """The latest execution the schedule started, on any replica or by a trigger, while
        it is not terminal: read from the store's marks at each decision, never from what
        this replica saw (another one, or this one before a pause, may have started it)."""
        marks = await self.store.schedule_marks(entry.key, self._clock())
        if marks.started is None:
            return None
        previous = await self.store.get(firing_id(entry.key, marks.started))
        if previous is None or previous.status in TERMINAL:
            return None
        return previous
