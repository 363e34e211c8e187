"""Starting an execution for a caller, as every front starts one: admission, idempotency,
the session policy, the concurrency value, the caller's tenant, and an answer before the
listener closes; and a schedule's firing, stamped with the id its fire time gives it. A
refusal is a `Refusal`, which each front (and the schedule ticker) words and maps."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Coroutine
from typing import Any

from agent_server.identity.principal import Principal
from agent_server.model.execution import Execution
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import SessionPolicy
from agent_server.model.waiting import Closing
from agent_server.runtime.registry import AdmissionError, InFlightRegistry, RejectReason
from agent_server.service.access import Access
from agent_server.service.refusals import IN_DOUBT_DETAIL, Refusal, Why
from agent_server.store.base import (
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    SessionTaken,
)

#: A start the store did not answer may have been recorded all the same, and then runs
#: (docs/api.md, Errors): the caller is told so, and how to find it.
START_UNANSWERED = (
    "execution store unavailable: this start may have been recorded all the same, and then "
    "runs; send it again with the same Idempotency-Key to get that execution, not a second"
)
SHUTTING_DOWN = "server is shutting down"
#: A start whose record was still on its way to a shared store when the listener closed.
CLOSED_IN_DOUBT = (
    "the server shut down before the store confirmed this start: read the execution at "
    "Location (404: it was never recorded; a retry with the same Idempotency-Key is safe)"
)


def admission_refusal(reason: RejectReason) -> Refusal:
    """The refusal of a start the registry did not admit."""
    if reason is RejectReason.CAPACITY:
        return Refusal(Why.BUSY, "too many executions in flight")
    if reason is RejectReason.SESSION_RELEASED:
        return Refusal(Why.SESSION_RELEASING, "session is being released")
    if reason is RejectReason.STORE_UNAVAILABLE:  # the store's answer may be what was lost
        return Refusal(Why.UNAVAILABLE, START_UNANSWERED)
    return Refusal(Why.SHUTTING_DOWN, SHUTTING_DOWN)


def start_refusal(
    exc: SessionTaken | AdmissionError | IdempotencyMismatch | IdempotencyForgotten,
) -> Refusal:
    """The refusal of a start the registry or the store refused, for `start` and `fire`
    alike: one mapping, so a firing is refused in the words a request's start is."""
    if isinstance(exc, SessionTaken):
        return Refusal(
            Why.SESSION_BUSY,
            "the session has an execution that is not terminal (session policy reject)",
            execution_id=exc.execution_id,
        )
    if isinstance(exc, AdmissionError):
        if exc.in_doubt is not None:  # recorded perhaps, on no replica yet
            return Refusal(Why.IN_DOUBT, IN_DOUBT_DETAIL, execution_id=exc.in_doubt)
        return admission_refusal(exc.reason)
    if isinstance(exc, IdempotencyMismatch):
        return Refusal(
            Why.KEY_MISMATCH, "the idempotency key was first used for a different request"
        )
    return Refusal(
        Why.KEY_FORGOTTEN,
        "the idempotency key's execution was forgotten (deleted, released or expired): send "
        "a new key to run again",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp:
    """What a schedule's firing writes on its execution before the record is: the id its
    (schedule, fire time) gives it, the same on every replica, so a second replica's start
    is the first's idempotent duplicate; and the schedule and fire time it shows."""

    execution_id: str
    schedule_id: str
    scheduled_at: float

    def apply(self, execution: Execution) -> None:
        execution.execution_id = self.execution_id
        execution.schedule_id = self.schedule_id
        execution.scheduled_at = self.scheduled_at


def concurrency_value(
    reasoner: Reasoner, header: Callable[[str], bytes | None], session_id: str | None
) -> str | None:
    """The value of the reasoner's `concurrency_key` a request carries ('' when absent:
    those requests share one value); None when it has no limit. `header` reads a request
    header by name. A header present but empty (or only spaces and tabs) is refused naming
    it: it would otherwise be a value of its own, or silently the one the requests without
    it share."""
    if reasoner.max_concurrency is None:
        return None
    spec = reasoner.concurrency_key
    if spec is None:
        return ""
    if spec == "session":
        return session_id or ""
    name = spec[len("header:") :]
    raw = header(name)
    if raw is None:
        return ""
    if not raw.strip(b" \t") or len(raw) > 255 or not all(32 <= byte < 127 for byte in raw):
        raise Refusal(
            Why.INVALID, f"invalid {name}: 1 to 255 printable ASCII characters, not only spaces"
        )
    return raw.decode("ascii")


class _CutAtClose:
    """The callback of the listener's close that cancels a start's task while it waits
    for its record to be written to a shared store, once, and only while `armed`."""

    __slots__ = ("armed", "fired", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self.armed = True
        #: It cancelled the task: the start's wait ended at the close.
        self.fired = False

    def __call__(self, _: object) -> None:
        if self.armed:
            self.armed = False
            self.fired = True
            self.task.cancel()


class Starts:
    """Starts executions for callers, given the registry, the store, the access rule and
    the listener's close."""

    def __init__(
        self,
        registry: InFlightRegistry,
        store: ExecutionStore,
        access: Access,
        closing: Closing,
        *,
        idempotency_ttl: float,
        webhook_url: str | None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.access = access
        self.closing = closing
        self.idempotency_ttl = idempotency_ttl
        #: Where every execution's webhooks go by default (`--webhook-url`): a front that
        #: names no target of its own passes it.
        self.webhook_url = webhook_url

    async def may_start(
        self, principal: Principal | None, reasoner: Reasoner, session_id: str | None
    ) -> None:
        """`start` asked of `@agent.authorize` (`Denied`)."""
        await self.access.check_for(
            principal, "start", {"reasoner": reasoner.name, "session_id": session_id}
        )

    def idempotency(
        self, key: str | None, reasoner: Reasoner, session_id: str | None, body: Any
    ) -> Idempotency | None:
        """A start's idempotency: its key, and the request it was first used for."""
        if key is None:
            return None
        return Idempotency(key, reasoner.fingerprint(session_id, body), self.idempotency_ttl)

    async def start(
        self,
        principal: Principal | None,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        session_id: str | None,
        *,
        body: Any,
        idempotency: Idempotency | None = None,
        webhook_url: str | None = None,
        delay: float | None = None,
        may_queue: bool = False,
        concurrency_key: str | None = None,
        session_policy: SessionPolicy | None = None,
        shown: list[dict[str, Any]] | None = None,
    ) -> tuple[Execution, bool]:
        """Start the execution, or find the one an earlier request with the same key
        started (shown only to a caller allowed to `read` it: a key is its tenant's, not
        its identity's); True when this call started it. Answered before the listener
        closes on a shared store; `shown` keeps its JSON as the store accepted it. An async
        start may be queued (`delay`, or `may_queue` with --queue-when-full)."""
        announced: list[Execution] = []
        start = self.registry.start_once(
            reasoner,
            arguments,
            session_id,
            body=body,
            idempotency=idempotency,
            webhook_url=webhook_url,
            delay=delay,
            may_queue=may_queue,
            concurrency_key=concurrency_key,
            session_policy=reasoner.session_policy if session_policy is None else session_policy,
            announce=announced.append,
            principal=principal,
        )
        try:
            if not self.store.shared:  # a store in this process writes at once
                execution, started = await start
            else:
                execution, started = await self.answered_before_close(start, announced)
        except (SessionTaken, AdmissionError, IdempotencyMismatch, IdempotencyForgotten) as exc:
            raise start_refusal(exc) from None
        if shown is not None:
            shown.append(execution.to_json())
        if not started:
            await self.access.allowed_for(principal, "read", execution)
        return execution, started

    async def fire(
        self,
        principal: Principal | None,
        reasoner: Reasoner,
        arguments: dict[str, Any],
        session_id: str | None,
        *,
        body: Any,
        stamp: Stamp,
        idempotency: Idempotency,
        session_policy: SessionPolicy,
    ) -> tuple[Execution, bool]:
        """Start a schedule's firing in its owner's name (`principal`), stamped before its
        record is written; or find the one another replica (or an earlier try) started
        under the same key. True when this call started it. Refused as `start` is, but it
        asks nothing of `@agent.authorize` and no listener's close cuts it: no caller waits
        on it (the routes asked `start` when the schedule was made, changed or triggered,
        and a trigger's route asks `read` before it hands out the record)."""
        try:
            return await self.registry.start_once(
                reasoner,
                arguments,
                session_id,
                body=body,
                idempotency=idempotency,
                session_policy=session_policy,
                announce=stamp.apply,
                principal=principal,
            )
        except (SessionTaken, AdmissionError, IdempotencyMismatch, IdempotencyForgotten) as exc:
            raise start_refusal(exc) from None

    async def answered_before_close(
        self, start: Coroutine[Any, Any, tuple[Execution, bool]], announced: list[Execution]
    ) -> tuple[Execution, bool]:
        """The start, unless the listener closes (the shutdown's point for answering) while
        its record is still being written to a shared store (a paused Redis): then the
        caller is sent to read it (SHUTTING_DOWN naming it), not cut off by uvicorn's plain
        500; the record says later what became of it (404: never written). The start runs
        in the caller's own task, which the close cancels (`_CutAtClose`): no task of its
        own to race against the close."""
        if self.closing.is_set():  # never begun: nothing was announced, nothing is in doubt
            start.close()
            raise Refusal(Why.SHUTTING_DOWN, SHUTTING_DOWN)
        task = asyncio.current_task()
        assert task is not None
        cut = _CutAtClose(task)
        closed: asyncio.Future[None] = task.get_loop().create_future()
        closed.add_done_callback(cut)
        self.closing.waiters.add(closed)
        try:
            return await start
        except asyncio.CancelledError:
            if not cut.fired:  # the server's or the client's, not the close's
                raise
            cut.fired = False  # the close's cancellation, taken back here
            if task.uncancel() > 0:  # and someone else's too
                raise
        finally:
            cut.armed = False
            self.closing.waiters.discard(closed)
            if cut.fired:  # the close came, but the start ended on its own: taken back
                task.uncancel()
        if not announced:  # pragma: no cover - announced before the first await
            raise Refusal(Why.SHUTTING_DOWN, SHUTTING_DOWN)
        raise Refusal(Why.SHUTTING_DOWN, CLOSED_IN_DOUBT, execution_id=announced[0].execution_id)
