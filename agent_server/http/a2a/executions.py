"""The use cases A2A reaches (agent_server/service/), each given the caller's principal:
a start, a wait, a cancel and an answer as every front makes them, their refusals in A2A's
words.

Every method takes the principal, so the ownership rules of docs/security.md apply here
in one place, through the shared `Access`: a start is the principal's (its tenant's
names, its `start` action), another tenant's execution is "not found" as an unknown one, a
list is filtered in the store, a read, a cancel or an answer is checked for its action (a
denial is the API's 403).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from pydantic import ValidationError
from starlette.types import Scope

from agent_server.http.event_feed import EventFeed
from agent_server.http.params import first_values, validation_detail
from agent_server.identity.principal import Principal
from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.status import TERMINAL
from agent_server.service.refusals import Refusal, Why
from agent_server.service.starts import concurrency_value
from agent_server.service.use_cases import UseCases
from agent_server.service.waits import Until
from agent_server.store.base import Page
from agent_server.store.cursor import ListCursor

#: Seconds a cancel waits for the task to end before answering it as it is then.
CANCEL_WAIT = 5.0
#: Seconds between reads of a task a stream follows while it waits for input or is queued
#: (the store wakes waiters at an end or an ask, not when an answer or a claim moves it on):
#: the first, doubled while nothing changes up to the last (an idle subscriber costs the
#: store about one read a second), and the first again after a change.
FOLLOW_POLL = (0.1, 1.0)
#: Seconds a stream waits on the store before reading the task again (a claim, a retry).
FOLLOW_WAIT = 1.0
#: The longest message id kept as it is in its idempotency key (a key is 255 at most).
MAX_KEPT_ID = 200


def message_key(message_id: str) -> str:
    """The idempotency key of a message id: kept as it is when it is a key's printable
    ASCII, else its digest (any string is a message id)."""
    if 0 < len(message_id) <= MAX_KEPT_ID and all(" " <= c <= "~" for c in message_id):
        return f"a2a:{message_id}"
    digest = hashlib.sha256(message_id.encode("utf-8", "surrogatepass")).hexdigest()
    return f"a2a-sha256:{digest}"


class Bad(Exception):
    """A request A2A answers with invalid params: the message says what to send."""


#: The refusals A2A answers as invalid params, in its words (`{skill}`: the reasoner's name);
#: the others keep their HTTP answer (a 403, a 429, a 503).
BAD_WORDS: dict[Why, str] = {
    Why.KEY_MISMATCH: "messageId was first used for a different message",
    Why.KEY_FORGOTTEN: "messageId's task was forgotten (deleted, released or expired): send "
    "the message with a new messageId to run it again",
    Why.SESSION_BUSY: "the context has a task that is not terminal ({execution_id}) and skill "
    "{skill!r} takes one at a time (session policy reject)",
    Why.CONFLICT: "{detail}",
    Why.UNPROCESSABLE: "the answer does not fit the request's schema: {detail}",
    Why.TOO_LARGE: "{detail}",
}


def mark(execution: Execution) -> tuple[str, Any, int]:
    """What a stream reports a change of: the status, the pending request, the attempt."""
    pending = execution.input_request
    request_id = None if pending is None else pending.get("request_id")
    return execution.status.value, request_id, execution.attempt


class A2AExecutions:
    """The executions as A2A reaches them, through the use cases every front shares."""

    def __init__(self, use_cases: UseCases) -> None:
        self.use_cases = use_cases
        self.access = use_cases.access
        self.store = use_cases.store
        self.registry = use_cases.registry
        #: Set when the listener closes (shutdown): every wait and stream ends then.
        self.closing = use_cases.waits.closing

    async def start(
        self,
        principal: Principal | None,
        scope: Scope,
        reasoner: Reasoner,
        body: Any,
        session_id: str,
        *,
        named_session: bool,
        message_id: str,
        may_queue: bool,
        webhook_url: str | None,
    ) -> Execution:
        """Start the reasoner as `POST /reasoners/{name}` does (admission, draining, the
        session policy and concurrency key of the request's headers), the message id its
        idempotency key: a message sent again (a retry) gets the task the first one started.
        The execution, its session and its key are the principal's tenant's. `webhook_url`
        is the push config's, checked (`ExecutionsHandler._push_url`); without one, the
        server's `--webhook-url`."""
        try:
            arguments = reasoner.bind(body)
        except ValidationError as exc:
            detail = validation_detail(exc)
            raise Bad(f"invalid input for skill {reasoner.name!r}: {detail}") from None
        starts = self.use_cases.starts
        headers = first_values(scope["headers"])
        try:
            await starts.may_start(principal, reasoner, session_id)
            key = message_key(message_id) if message_id else None
            execution, _ = await starts.start(
                principal,
                reasoner,
                arguments,
                session_id,
                body=body,
                idempotency=starts.idempotency(
                    key, reasoner, session_id if named_session else None, body
                ),
                webhook_url=starts.webhook_url if webhook_url is None else webhook_url,
                may_queue=may_queue,
                concurrency_key=concurrency_value(
                    reasoner, lambda name: headers.get(name.lower().encode()), session_id
                ),
            )
        except Refusal as refusal:
            raise bad(refusal, reasoner.name) from None
        return execution

    async def find(self, principal: Principal | None, execution_id: str) -> Execution | None:
        """The execution, or None when unknown or another tenant's (the store tells them
        apart from neither); 403 when `read` is denied on it."""
        return await self.access.find(self.store, principal, execution_id, "read")

    async def reads(self, principal: Principal | None, execution: Execution) -> bool:
        """Whether the task may be handed to the caller as it is now (`read` allowed)."""
        return await self.access.reads(principal, execution)

    async def page(
        self,
        principal: Principal | None,
        *,
        statuses: frozenset[ExecutionStatus],
        session_id: str | None,
        limit: int,
        after: ListCursor | None,
        bare: bool = False,
    ) -> Page:
        """A page of executions, newest first, filtered in the store by the principal's
        tenant (a page full, a cursor within it) and `list`'s verdict; `bare`: their results
        may be left out."""
        reach = await self.access.list_scope_for(
            principal, {"reasoner": None, "session_id": session_id, "statuses": sorted(statuses)}
        )
        return await self.store.page(
            statuses=statuses,
            session_id=session_id,
            limit=limit,
            after=after,
            max_bytes=0,
            bare=bare,
            tenant=reach.tenant,
            every_tenant=reach.every_tenant,
            owner=reach.owner,
        )

    async def cancel(self, principal: Principal | None, execution: Execution) -> Execution:
        """Cancel it as `POST /executions/{id}/cancel` does (`request`), wherever it runs,
        and wait a little for its end, once `cancel` is allowed (found by `find`)."""
        await self.access.allowed_for(principal, "cancel", execution)
        latest = await self.use_cases.cancels.cancel(execution, CANCEL_WAIT)
        return await self.access.allowed_for(principal, "read", latest)  # as it is now

    async def answer(
        self, principal: Principal | None, execution: Execution, value: Any
    ) -> Execution:
        """Answer its pending request as every front does (service/answering.py): bounded,
        checked against the request's schema, taken once, once `answer` is allowed (found
        by `find`)."""
        await self.access.allowed_for(principal, "answer", execution)
        try:
            return await self.use_cases.answering.answer(execution, None, value)
        except Refusal as refusal:
            raise bad(refusal, execution.reasoner) from None

    async def settle(
        self, principal: Principal | None, execution: Execution, gone: asyncio.Future[None]
    ) -> Execution:
        """The execution once terminal, waiting for input or handed off, as a synchronous
        run waits for it; as it is when the listener closes (shutdown) or the client goes
        away first (the execution was read through `find`)."""
        waits = self.use_cases.waits
        waited = await waits.until_reached(execution, lambda: gone)
        if waited.until is not Until.REACHED or waited.execution is None:
            return await self.store.get(execution.execution_id) or execution
        return await waits.as_told(waited.execution)

    def feed(self, execution: Execution) -> EventFeed:
        """The execution's events from the first kept, read as SSE reads them."""
        return EventFeed(self.registry, self.store, execution)

    async def follow(
        self,
        principal: Principal | None,
        execution: Execution,
        seen: tuple[str, Any, int],
        *,
        stop_at_input: bool,
        feed: EventFeed | None = None,
    ) -> AsyncIterator[Execution | list[Event]]:
        """The execution each time its status (or pending request, or attempt) changes from
        `seen` (the `mark` of what the client was last sent), until it ends (or waits for
        input, with `stop_at_input`), is forgotten, or the listener closes (a shutdown: the
        client subscribes again elsewhere); and, given a `feed`, its events as they come,
        each batch before the change that followed it. The execution was read through
        `find`."""
        closing = self.closing
        poll = FOLLOW_POLL[0]
        while not closing.is_set():
            if feed is not None and (events := await feed.take()):
                yield events
                continue
            status = ExecutionStatus(seen[0])
            if status in TERMINAL:
                return
            if stop_at_input and status is ExecutionStatus.INPUT_REQUIRED:
                return
            moving = execution.status is ExecutionStatus.RUNNING
            wait = self.store.wait(execution, FOLLOW_WAIT, asked=True) if moving else None
            await self._pause(wait if wait is not None else asyncio.sleep(poll), feed)
            poll = min(poll * 2, FOLLOW_POLL[1])
            latest = await self.store.get(execution.execution_id)
            if latest is None:
                return
            if latest.is_terminal and not await self.use_cases.waits.recorded(latest):
                continue
            if mark(latest) != seen:
                if feed is not None and (events := await feed.take()):
                    yield events  # written before the change: sent before it
                seen, poll = mark(latest), FOLLOW_POLL[0]
                yield latest  # the caller sends it before this resumes: `seen` is what it sent
            execution = latest

    async def _pause(self, wait: Coroutine[Any, Any, Any], feed: EventFeed | None) -> None:
        """The store's wait (or a poll's sleep), cut short when the listener closes or, with
        a feed, at its next event."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if feed is not None:
            feed.listen(woken)
        try:
            await self.use_cases.waits.before_close(wait, woken)
        finally:
            if feed is not None:
                feed.unlisten(woken)


def bad(refusal: Refusal, skill: str) -> Exception:
    """A refusal as A2A answers it: invalid params in its words (`BAD_WORDS`), else the
    refusal itself, which the HTTP front answers with its status (a 403, a 429, a 503)."""
    words = BAD_WORDS.get(refusal.why)
    if words is None:
        return refusal
    detail = refusal.detail if isinstance(refusal.detail, str) else str(refusal.detail)
    return Bad(words.format(detail=detail, execution_id=refusal.execution_id, skill=skill))
