"""The store's interface, one Protocol per role: what each part of the server asks of it.

`ExecutionStore` (base.py) is their composition, and every store implements all of them;
a part that uses one role names that role (the webhook sender `Webhooks`, the queue taker
`Claims`, the schedule ticker `Schedules`), so what it may ask of the store is what it
uses. A default body is what a store in this process does (nothing to share, nothing to
repair); the methods marked abstract every store writes.

- `Liveness`: this replica in the store: lifecycle, whether the store is up, what it tells
  the other replicas, the repair of what it owns;
- `Records`: writing records: create, checkpoint, end, forget, cancel requests;
- `Reads`: reading them: one, its input and history, a wait for its end, lists;
- `Claims`: the queue: claims, hand-offs, retries, the versions a claim may run;
- `Asks`: requests for input and their answers;
- `Events`: the live events other replicas read;
- `Webhooks`: the deliveries owed, claimed for a lease;
- `Sessions`: a session's executions, and its release across replicas;
- `Schedules`: schedules' documents and marks.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Collection
from typing import Any, Protocol

from agent_server.model.asks import MAX_ANSWER_BYTES, Found, Question, Reply
from agent_server.model.events import Event
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.waiting import Closing
from agent_server.store.cursor import ListCursor
from agent_server.store.schedule_docs import Marks
from agent_server.store.values import (
    AnswerHandler,
    CancelHandler,
    Delivery,
    Idempotency,
    Page,
    UnqueuedHandler,
)


class Shared(Protocol):
    """Whether the store is shared: what several roles' callers decide by."""

    @property
    def shared(self) -> bool:
        """Whether other replicas read these records (and events) too."""
        return False


class Liveness(Protocol):
    """This replica in the store: its lifecycle, whether the store can be reached, what it
    tells the other replicas of itself, and the repair of the records it owns."""

    #: This process's name in the store; the owner of the executions it runs.
    replica_id: str
    #: The most replicas `GET /replicas` shows (a shared store's read is bounded by it).
    REPLICA_STATES: int = 100
    #: How this replica describes itself to the others (`GET /replicas`): set by `describe`.
    state: Callable[[], dict[str, Any]] | None = None

    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and start what runs in the background. Raises StoreUnavailable when it
        cannot connect."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the background work and disconnect; this replica's liveness ends."""

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the ends still waiting by `deadline` (monotonic); return those that could
        not be written (none for the memory store)."""
        return []

    def writes_owed(self) -> int:
        """Writes this process still owes the store: a count read without the event loop
        (the watchdog's thread), so plain lengths only. 0 for the memory store."""
        return 0

    @property
    def up(self) -> bool:
        """False while the store cannot be reached: readiness turns 503."""
        return True

    def describe(self, state: Callable[[], dict[str, Any]]) -> None:
        """A shared store writes what `state` says with each liveness renewal."""
        self.state = state

    async def replica_states(self) -> list[dict[str, Any]]:
        """What the other live replicas last wrote of themselves: none in this process."""
        return []

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        """What a shared store asks of the registry to repair records this replica owns but
        runs nothing for (section 12, invariant 3): whether it runs a task for an id, and
        to run (`adopt`) an execution whose create got no answer but was recorded after all
        (True when it does). A store in this process never needs them."""
        return None

    def deliver_vanished(
        self, running: Callable[[], Collection[str]], vanish: Callable[[str], object]
    ) -> None:
        """What a shared store asks of the registry to end the tasks whose records vanished
        from it (Redis lost its data): the ids it runs tasks for, and `vanish`, which ends
        one (`lost`) and frees its slot. A store in this process never loses a record."""
        return None


class Records(Protocol):
    """Writing records: a new execution, its progress and its end, forgetting one, and the
    cancel requests that reach its owner."""

    #: Where cancel requests for this replica go; nowhere until `deliver_cancels`.
    on_cancel: CancelHandler | None = None

    def deliver_cancels(self, on_cancel: CancelHandler) -> None:
        """Cancel requests meant for this replica go to `on_cancel` (the registry's)."""
        self.on_cancel = on_cancel

    @abc.abstractmethod
    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        """Record a new execution and return None: running under this replica, or queued
        (its status says so; due at its `scheduled_at`, None: now), for whichever replica
        takes it first, unless `max_queued` are queued already (QueueFull). Or, when
        `idempotency` names a key already used for the same request, create nothing and
        return that execution. Raises SessionReleasing, IdempotencyMismatch,
        IdempotencyForgotten or StoreUnavailable."""

    @abc.abstractmethod
    async def checkpoint(self, execution: Execution, state: str) -> None:
        """Record a resumable execution's progress (JSON text), only while this replica's
        attempt owns it; raises StaleAttempt otherwise."""

    @abc.abstractmethod
    def end(self, execution: Execution) -> None:
        """Record the terminal state of an execution this replica owns, now or as soon as
        the store can be reached; waiters on every replica are woken once it is written."""

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        """Whether the end of an execution this replica ran is recorded where every replica
        reads it, waiting at most `timeout` seconds, and no longer than until `closing` is
        set (the listener's close: False if the end is still owed then): a client is told a
        terminal status only then (section 12, invariant 1). At once for a store in this
        process."""
        return True

    @abc.abstractmethod
    async def forget(self, execution_id: str) -> bool:
        """Forget a finished execution: False when unknown; ExecutionRunning when active."""

    @abc.abstractmethod
    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        """Deliver a cancel request to the execution's owner, wherever it runs."""


class Reads(Protocol):
    """Reading records: one by id, what it was started with, its history, a wait for its
    end, and lists."""

    @abc.abstractmethod
    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        """The execution, or None when unknown (never existed, forgotten or expired); with
        `tenant`, None too when another tenant's, decided before the record is read, so
        another tenant's id costs what an unknown one does (docs/security.md#tenants).
        `tenant` None reads every tenant's (an admin, a server without authentication)."""

    async def input_of(self, execution: Execution) -> tuple[bool, Any]:
        """The body `execution` (as `get` found it) was started with, None for none; False
        first when its record is gone meanwhile. `get` restores it on a store that keeps it
        in the record's document (memory, Postgres); Redis reads it apart, here only, so no
        other read carries it (`GET /executions/{id}/input`)."""
        return True, execution.body

    async def moves_of(self, execution: Execution) -> tuple[bool, list[list[Any]]]:
        """Its history (status.py `KEPT_MOVES`, `kept_move`): the moves that neither made nor
        ended it, oldest first; False first when its record is gone meanwhile. The memory
        store's record is the object, which keeps them; a shared store reads them apart
        (`GET /executions/{id}/history`), so no other read carries them."""
        return True, list(execution.moves or ())

    @abc.abstractmethod
    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        """The execution once terminal (with `asked`, or once it waits for input), or as it
        is when `timeout` seconds have passed."""

    @abc.abstractmethod
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
        """Newest first, filtered (any of `statuses`; all when empty), at most `limit`,
        older than the cursor `after` (read by `ListCursor.read`, which refuses what no page
        gave); bounded work per call, so a page may hold fewer than `limit` while `next`
        says more may follow. With `max_bytes`, a store that sends records over the network
        stops once their results and errors pass it (one record past it at most, so the
        caller sees the page is cut). With `tenant` (the caller's), only that tenant's
        records, read from its own index so that a page is full and a cursor cannot lead
        into another tenant's (all of them with `every_tenant`, an admin's list), and its
        session named by `session_id`; with `owner`, only the records that identity
        started. None: a server without authentication, every record. With `schedule_id`,
        only the executions that schedule's firings started (compared while walking, as
        `reasoner` is). With `bare`, a store that sends records over the network may leave
        their results out (a caller that counts them or reads their states only)."""

    async def list_executions(
        self,
        *,
        status: ExecutionStatus | None = None,
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
    ) -> list[Execution]:
        """The first page's executions."""
        found = await self.page(
            statuses=frozenset() if status is None else frozenset((status,)),
            reasoner=reasoner,
            session_id=session_id,
            limit=limit,
            max_bytes=max_bytes,
        )
        return found.executions


class Claims(Shared, Protocol):
    """The queue: what this replica claims and begins, what it hands off, retries or gives
    back, and the versions its claims may run."""

    #: Told when this replica takes or cancels a queued execution (the registry's).
    on_unqueued: UnqueuedHandler | None = None
    #: This replica's versions as its claims tell the store (versions.py `advert`: every
    #: reasoner it serves, with its version, '' for unversioned): set by `advertise`.
    advert: str = ""
    #: Told how many executions a claim left queued for a replica of their checkpoint's
    #: version (docs/durable.md, "Versions").
    on_version_waits: Callable[[int], object] | None = None

    def advertise(self, advert: str) -> None:
        """Say which versions this replica runs: a shared store shows them to the other
        replicas' claims while this one is alive and admitting. A store in this process
        has one version: its own."""
        self.advert = advert

    def withdraw(self) -> None:
        """Admission closed (draining): work waiting for this replica's version stops
        waiting for it."""
        return None

    @property
    def supports_handoff(self) -> bool:
        """Whether another replica can take an execution this one hands off."""
        return self.shared

    @abc.abstractmethod
    def hand_off(self, execution: Execution) -> None:
        """Queue the next attempt of an execution this replica gives up at shutdown (through
        the same outbox as ends, fenced the same way); a store in this process has nowhere
        to (`ExecutionStore.hand_off`)."""

    def retry(self, execution: Execution, delay: float) -> None:
        """Queue the next attempt of an execution whose attempt failed here, due in `delay`
        seconds (fenced like an end: the record must still be this attempt's)."""
        raise NotImplementedError

    async def claim(self) -> Execution | None:
        """Take the queued execution due first, if it is due, for this replica (atomically),
        with its body and last checkpoint; None when nothing is due."""
        return None

    async def begin(self, execution: Execution) -> bool:
        """Its body begins now: say so before it does. False when it must not begin here
        (the claim is no longer this replica's, or the mark's answer was lost: the repair
        puts it back). A store in this process runs what it claims: nothing to say."""
        return True

    def give_back(self, execution: Execution) -> None:
        """A take this replica will not start: its claim's answer came once admission had
        closed (draining). A shared store puts it back on the queue for its first run
        elsewhere. A store in this process claims without waiting, so admission never
        closes while one of its claims is on its way: nothing to give back."""
        return None

    def due_in(self) -> float | None:
        """Seconds until the next queued execution is due, as the last claim saw it; None
        when nothing waits for a time."""
        return None

    def cancel_all_queued(self, reason: CancelReason) -> list[Execution]:
        """End cancelled what is queued, when nobody else can take it (a store in this
        process, at shutdown); a shared store keeps its queue for the other replicas."""
        return []

    async def wait_queued(self, timeout: float) -> None:
        """Return when work may have been queued, or after `timeout` seconds."""
        await asyncio.sleep(timeout)


class Asks(Protocol):
    """Requests for input: recorded, timed out, and answered exactly once."""

    #: Where answers for this replica's waiting executions go; nowhere until
    #: `deliver_answers`.
    on_answer: AnswerHandler | None = None
    #: Bytes of answers (as JSON) an execution keeps: past it the oldest are dropped.
    max_answer_bytes: int = MAX_ANSWER_BYTES

    def deliver_answers(self, on_answer: AnswerHandler) -> None:
        """Answers to this replica's waiting executions go to `on_answer` (the registry's)."""
        self.on_answer = on_answer

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        """Record that an execution this replica runs waits for input (`question.request`
        is its `input_request`), fenced by owner and attempt (StaleAttempt otherwise); with
        `park` (a resumable execution, a store that can queue it) parked: owned by nobody
        until its answer (or its `timeout`, seconds) queues it. What an earlier attempt left
        instead, matched by the question's identity (asks.Found): its answer, its timeout,
        AGAIN (its answer dropped), or MISMATCH (another question has the number)."""
        return Reply(Found.WAIT, question.request_id)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """The request timed out on its owner: back to `running` unless an answer was taken
        first, which is then returned as (True, value). In one process nothing can have
        been taken that the owner has not seen."""
        return False, None

    async def poll_answer(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """The answer taken for the request, if one was, read from the store: an owner that
        may have missed its notice looks (True, the value). Never needed in one process."""
        return False, None

    @abc.abstractmethod
    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """Take `value` as the answer to the execution's pending request (`request_id`, or
        whichever is pending for None), exactly once: the execution as it is then, `running`
        again; None when it does not wait for that request (not waiting, or answered
        already). In one process the owner's registry decides (`ExecutionStore.answer`)."""


class Events(Protocol):
    """Live events kept where other replicas read them, and notices of new ones."""

    def emit(self, execution: Execution, event: Event) -> None:
        """Keep an event where other replicas can read it (in order with the end); the
        execution's own log already holds it for this process's readers."""
        return None

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        """Up to `limit` kept events after `cursor`, and how many after it are gone."""
        return 0, []

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        """Complete `waiter` when the execution may have new events (or ended)."""
        return None

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        """Nobody waits on `waiter` any more."""
        return None


class Webhooks(Shared, Protocol):
    """Webhook deliveries owed: claimed for a lease, then settled (docs/webhooks.md)."""

    #: Told when a move that may owe a webhook delivery was recorded here.
    on_webhook: Callable[[], object] | None = None

    def deliver_webhooks(self, on_webhook: Callable[[], object]) -> None:
        """`on_webhook` is called when this replica recorded a move that may owe a webhook
        delivery (the sender claims sooner than its next look)."""
        self.on_webhook = on_webhook

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        """Claim up to `limit` deliveries that are due (any, without `due_only`): none is
        claimed again for `lease` seconds unless settled. With the number pending."""
        return 0, []

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        """After an attempt: the delivery is over (None: delivered, given up or refused) or
        is due again in `retry_in` seconds. Returns the number pending."""
        return 0


class Sessions(Protocol):
    """A session's executions, and its release: new work refused on every replica while
    one is under way."""

    @abc.abstractmethod
    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        """Every execution the store holds for the session (the tenant's: names.py)."""

    @abc.abstractmethod
    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        """Refuse new work for the session, on every replica, until `end_release` (or, for
        a store shared with others, until `seconds` have passed, in case this one dies).
        None when this call began the release; else the id of the release another replica
        has under way (its answer comes from `shared_release`)."""

    @abc.abstractmethod
    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        """Accept new work for the session again; `answer` is shared with the releases
        that joined this one on other replicas."""

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        """The answer of a release another replica has under way, once it ends; None when it
        does not end within `timeout` seconds."""
        return None


class Schedules(Protocol):
    """Schedules made through the API, kept for every replica (documents, their versions,
    each tenant's count), and each schedule's marks (docs/schedules.md). A store in this
    process keeps them in `schedule_memory.InProcessSchedules`."""

    @abc.abstractmethod
    async def schedule_marks(self, schedule_key: str, now: float, timing: str = "") -> Marks:
        """When the store first saw the schedule (`now` if this call is the first), its last
        fire time handled and the last one that started an execution: a schedule never runs
        fire times from before it existed (docs/schedules.md). With `timing` (its cron and
        zone): one that differs from the timing the marks were handled with moves `handled`
        on to `now` first, as the fire times of a cron changed (by a PATCH or a release)
        start at the change."""

    @abc.abstractmethod
    async def schedule_fired(
        self,
        schedule_key: str,
        at: float,
        started: bool,
        *,
        handled: bool = True,
        timing: str = "",
    ) -> None:
        """Record `at` as handled (fire times up to it are done with; a change of the cron
        records its own moment, with its new `timing`) and as started, when its execution
        exists (a trigger records only that, as its time is no fire time): each the later
        of it and the one kept, so a mark never goes back."""

    @abc.abstractmethod
    async def put_schedule(
        self,
        schedule_key: str,
        document: str,
        *,
        tenant: str | None = None,
        limit: int | None = None,
    ) -> str:
        """Keep a schedule made (or changed) through the API, as JSON text, for every
        replica: the store's version and the document's own move on (the new version is
        returned, so the writer need not read its own document back). With `limit`, it
        counts among its tenant's schedules, and a new one past `limit` is refused
        (ScheduleLimit, nothing changed), atomically whichever replica makes it."""

    @abc.abstractmethod
    async def delete_schedule(self, schedule_key: str, tenant: str | None = None) -> bool:
        """Forget a schedule's document, its version, its place in its tenant's count and
        its marks: False when there was none."""

    @abc.abstractmethod
    async def schedules_version(self) -> str:
        """A token every `put_schedule` and `delete_schedule` replaces with a new one, on
        any replica: two reads that show the same token show the same documents. Not a
        counter: a store that loses its data or its last writes would count again to a
        number a replica has seen, with other documents ('' before any change)."""

    @abc.abstractmethod
    async def schedule_versions(self) -> dict[str, str]:
        """Each document's own version, by key: a replica reads again only the documents
        whose version is not the one it holds (small: 16 characters a schedule)."""

    @abc.abstractmethod
    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        """The documents of `keys` that exist, by key (every one when None)."""
