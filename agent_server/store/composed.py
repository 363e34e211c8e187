"""A store composed of parts: each role of roles.py forwarded to the part that implements it.

A shared store (Redis, Postgres) is made of plain parts, each given what it uses by the
store's `__init__`; a part that implements roles subclasses their Protocols (their default
bodies are its own defaults) and keeps their attributes: the handlers the server sets after
the store is made (`on_cancel`, `on_unqueued`, ...), `advert`, `max_answer_bytes`. A part
that calls a handler another role keeps is handed that part, typed as its role.

`ComposedStore` is what a caller holds: it is given one part per role, and one class here per
role forwards every member of that role, attributes included, to that role's part: so each
forwarding class is small (tests/unit/test_sizes.py), written once for both stores, and says
which part answers which call. Two things are the store's own, not a part's: `Liveness` (its
lifecycle: it starts and stops the parts' background work) and `shared`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

from agent_server.model.asks import Question, Reply
from agent_server.model.events import Event
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.waiting import Closing
from agent_server.store.base import ExecutionStore
from agent_server.store.cursor import ListCursor
from agent_server.store.roles import (
    Asks,
    Claims,
    Events,
    Reads,
    Records,
    Schedules,
    Sessions,
    Webhooks,
)
from agent_server.store.schedule_docs import Marks
from agent_server.store.values import (
    AnswerHandler,
    CancelHandler,
    Delivery,
    Idempotency,
    Page,
    UnqueuedHandler,
)


class RecordsVia(Records):
    """`Records`, forwarded to `_records`."""

    _records: Records

    @property
    def on_cancel(self) -> CancelHandler | None:
        return self._records.on_cancel

    @on_cancel.setter
    def on_cancel(self, handler: CancelHandler | None) -> None:
        self._records.on_cancel = handler

    def deliver_cancels(self, on_cancel: CancelHandler) -> None:
        self._records.deliver_cancels(on_cancel)

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None, max_queued: int = 0
    ) -> Execution | None:
        return await self._records.create(execution, idempotency, max_queued)

    async def checkpoint(self, execution: Execution, state: str) -> None:
        await self._records.checkpoint(execution, state)

    def end(self, execution: Execution) -> None:
        self._records.end(execution)

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        return await self._records.recorded(execution, timeout, closing)

    async def forget(self, execution_id: str) -> bool:
        return await self._records.forget(execution_id)

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        await self._records.request_cancel(execution, reason, settle_within)


class ReadsVia(Reads):
    """`Reads`, forwarded to `_reads`."""

    _reads: Reads

    async def get(self, execution_id: str, tenant: str | None = None) -> Execution | None:
        return await self._reads.get(execution_id, tenant)

    async def input_of(self, execution: Execution) -> tuple[bool, Any]:
        return await self._reads.input_of(execution)

    async def moves_of(self, execution: Execution) -> tuple[bool, list[list[Any]]]:
        return await self._reads.moves_of(execution)

    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        return await self._reads.wait(execution, timeout, asked)

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
        return await self._reads.page(
            statuses=statuses,
            reasoner=reasoner,
            session_id=session_id,
            limit=limit,
            max_bytes=max_bytes,
            after=after,
            tenant=tenant,
            every_tenant=every_tenant,
            owner=owner,
            schedule_id=schedule_id,
            bare=bare,
        )

    async def list_executions(
        self,
        *,
        status: ExecutionStatus | None = None,
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
    ) -> list[Execution]:
        return await self._reads.list_executions(
            status=status,
            reasoner=reasoner,
            session_id=session_id,
            limit=limit,
            max_bytes=max_bytes,
        )


class ClaimsVia(Claims):
    """`Claims`, forwarded to `_claims` (but `shared`: the store's own)."""

    _claims: Claims

    @property
    def on_unqueued(self) -> UnqueuedHandler | None:
        return self._claims.on_unqueued

    @on_unqueued.setter
    def on_unqueued(self, handler: UnqueuedHandler | None) -> None:
        self._claims.on_unqueued = handler

    @property
    def advert(self) -> str:
        return self._claims.advert

    @advert.setter
    def advert(self, advert: str) -> None:
        self._claims.advert = advert

    @property
    def on_version_waits(self) -> Callable[[int], object] | None:
        return self._claims.on_version_waits

    @on_version_waits.setter
    def on_version_waits(self, handler: Callable[[int], object] | None) -> None:
        self._claims.on_version_waits = handler

    def advertise(self, advert: str) -> None:
        self._claims.advertise(advert)

    def withdraw(self) -> None:
        self._claims.withdraw()

    @property
    def supports_handoff(self) -> bool:
        return self._claims.supports_handoff

    def hand_off(self, execution: Execution) -> None:
        self._claims.hand_off(execution)

    def retry(self, execution: Execution, delay: float) -> None:
        self._claims.retry(execution, delay)

    async def claim(self) -> Execution | None:
        return await self._claims.claim()

    async def begin(self, execution: Execution) -> bool:
        return await self._claims.begin(execution)

    def give_back(self, execution: Execution) -> None:
        self._claims.give_back(execution)

    def due_in(self) -> float | None:
        return self._claims.due_in()

    def cancel_all_queued(self, reason: CancelReason) -> list[Execution]:
        return self._claims.cancel_all_queued(reason)

    async def wait_queued(self, timeout: float) -> None:
        await self._claims.wait_queued(timeout)


class AsksVia(Asks):
    """`Asks`, forwarded to `_asks`."""

    _asks: Asks

    @property
    def on_answer(self) -> AnswerHandler | None:
        return self._asks.on_answer

    @on_answer.setter
    def on_answer(self, handler: AnswerHandler | None) -> None:
        self._asks.on_answer = handler

    @property
    def max_answer_bytes(self) -> int:
        return self._asks.max_answer_bytes

    @max_answer_bytes.setter
    def max_answer_bytes(self, size: int) -> None:
        self._asks.max_answer_bytes = size

    def deliver_answers(self, on_answer: AnswerHandler) -> None:
        self._asks.deliver_answers(on_answer)

    async def ask(
        self, execution: Execution, question: Question, park: bool, timeout: float | None
    ) -> Reply:
        return await self._asks.ask(execution, question, park, timeout)

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self._asks.expire_ask(execution, request_id)

    async def poll_answer(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self._asks.poll_answer(execution, request_id)

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        return await self._asks.answer(execution, request_id, value)


class EventsVia(Events):
    """`Events`, forwarded to `_events`."""

    _events: Events

    def emit(self, execution: Execution, event: Event) -> None:
        self._events.emit(execution, event)

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        return await self._events.events_since(execution_id, cursor, limit)

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._events.event_notice(execution_id, waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self._events.drop_notice(execution_id, waiter)


class WebhooksVia(Webhooks):
    """`Webhooks`, forwarded to `_webhooks` (but `shared`: the store's own)."""

    _webhooks: Webhooks

    @property
    def on_webhook(self) -> Callable[[], object] | None:
        return self._webhooks.on_webhook

    @on_webhook.setter
    def on_webhook(self, handler: Callable[[], object] | None) -> None:
        self._webhooks.on_webhook = handler

    def deliver_webhooks(self, on_webhook: Callable[[], object]) -> None:
        self._webhooks.deliver_webhooks(on_webhook)

    async def claim_webhooks(
        self, limit: int, lease: float, *, due_only: bool = True
    ) -> tuple[int, list[Delivery]]:
        return await self._webhooks.claim_webhooks(limit, lease, due_only=due_only)

    async def settle_webhook(self, delivery: Delivery, retry_in: float | None) -> int:
        return await self._webhooks.settle_webhook(delivery, retry_in)


class SessionsVia(Sessions):
    """`Sessions`, forwarded to `_sessions`."""

    _sessions: Sessions

    async def session(self, session_id: str, tenant: str | None = None) -> list[Execution]:
        return await self._sessions.session(session_id, tenant)

    async def begin_release(
        self, session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        return await self._sessions.begin_release(session_id, seconds, tenant)

    async def end_release(
        self, session_id: str, answer: dict[str, Any] | None = None, tenant: str | None = None
    ) -> None:
        await self._sessions.end_release(session_id, answer, tenant)

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        return await self._sessions.shared_release(release_id, timeout)


class SchedulesVia(Schedules):
    """`Schedules`, forwarded to `_schedules`."""

    _schedules: Schedules

    async def schedule_marks(self, schedule_key: str, now: float, timing: str = "") -> Marks:
        return await self._schedules.schedule_marks(schedule_key, now, timing)

    async def schedule_fired(
        self,
        schedule_key: str,
        at: float,
        started: bool,
        *,
        handled: bool = True,
        timing: str = "",
    ) -> None:
        await self._schedules.schedule_fired(
            schedule_key, at, started, handled=handled, timing=timing
        )

    async def put_schedule(
        self,
        schedule_key: str,
        document: str,
        *,
        tenant: str | None = None,
        limit: int | None = None,
    ) -> str:
        return await self._schedules.put_schedule(
            schedule_key, document, tenant=tenant, limit=limit
        )

    async def delete_schedule(self, schedule_key: str, tenant: str | None = None) -> bool:
        return await self._schedules.delete_schedule(schedule_key, tenant)

    async def schedules_version(self) -> str:
        return await self._schedules.schedules_version()

    async def schedule_versions(self) -> dict[str, str]:
        return await self._schedules.schedule_versions()

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        return await self._schedules.schedule_documents(keys)


class ComposedStore(
    RecordsVia,
    ReadsVia,
    ClaimsVia,
    AsksVia,
    EventsVia,
    WebhooksVia,
    SessionsVia,
    SchedulesVia,
    ExecutionStore,
):
    """A store whose roles are its parts' (one part may implement several), but `Liveness`
    and `shared`, which a subclass implements: its `__init__` makes the parts, then hands
    them here."""

    def __init__(
        self,
        *,
        records: Records,
        reads: Reads,
        claims: Claims,
        asks: Asks,
        events: Events,
        webhooks: Webhooks,
        sessions: Sessions,
        schedules: Schedules,
    ) -> None:
        self._records = records
        self._reads = reads
        self._claims = claims
        self._asks = asks
        self._events = events
        self._webhooks = webhooks
        self._sessions = sessions
        self._schedules = schedules
