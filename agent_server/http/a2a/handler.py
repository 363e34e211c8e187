"""The SDK's request handler, implemented on the executions: every method reads or moves an
execution through `A2AExecutions` (nothing is kept in an SDK task store), and the SDK's
JSON-RPC dispatcher (v1.0, and v0.3 through its compatibility layer) calls it."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any, TypeVar, cast

from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event
from a2a.server.request_handlers.request_handler import RequestHandler, validate_request_params
from a2a.server.request_handlers.response_helpers import agent_card_to_dict
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from starlette.requests import Request

from agent_server.http.a2a.body import major_of, protocol_version
from agent_server.http.a2a.card import CardMaker
from agent_server.http.a2a.events import EventUpdates
from agent_server.http.a2a.executions import A2AExecutions, Bad, mark
from agent_server.http.a2a.tasks import (
    STATUSES_OF,
    accepted_task,
    answer_of,
    input_of,
    result_artifact,
    status_time,
    task_of,
    task_state,
)
from agent_server.http.auth import principal_of
from agent_server.http.http_limits import client_gone
from agent_server.http.routing import ApiError
from agent_server.identity.principal import Principal
from agent_server.model.echoes import one_of, shown
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import SESSION_ID_RULE, is_session_id
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.webhooks import check_url
from agent_server.service.refusals import Denied
from agent_server.store.base import StoreInDoubt, StoreUnavailable
from agent_server.store.cursor import BadCursor, ListCursor

#: A page of `ListTasks` when the request names no size, and the most it may name.
DEFAULT_PAGE = 50
MAX_PAGE = 100
#: Records a store call reads while ListTasks counts its `totalSize`.
COUNT_PAGE = 500
#: Why a task's push config is not read back: the store keeps its webhook URL unshown.
WEBHOOK_URL_UNSHOWN = (
    "a task's webhook URL is kept but never shown (it may carry the receiver's token): "
    "its deliveries say what they are about"
)


F = TypeVar("F", bound=Callable[..., Any])


def _required(method: F) -> F:
    """The SDK's own check of the fields A2A requires (a message's id, role and parts, a
    task's id): invalid params naming each missing one, before the method runs."""
    return cast(F, validate_request_params(method))


def _check_message(params: SendMessageRequest) -> None:
    """What A2A requires of a message, checked as the SDK's check would answer (its errors
    as `data.errors`): the SDK's own walks every field of the request, the input's values
    included: 155 us for a small SendMessage, a sync run's whole cost (bench/RESULTS.md)."""
    message = params.message
    errors = []
    if not params.HasField("message"):
        errors.append({"field": "message", "message": "Field is required."})
    else:
        if not message.message_id:
            errors.append({"field": "message.message_id", "message": "Field is required."})
        if message.role == Role.ROLE_UNSPECIFIED:
            errors.append({"field": "message.role", "message": "Field is required."})
        if not message.parts:
            errors.append(
                {"field": "message.parts", "message": "Field must contain at least one element."}
            )
    if errors:
        raise InvalidParamsError(message="Validation failed", data={"errors": errors})


def _request(context: ServerCallContext) -> Request:
    request = context.state.get("request")
    assert isinstance(request, Request)  # put there by the context builder (routes.py)
    return request


def _shown_by(params: ListTasksRequest) -> Callable[[Execution], bool]:
    """ListTasks' filters the store does not apply: the task's state (a queued execution
    is submitted or working by its attempt) and `statusTimestampAfter`, on the task's own
    timestamp and inclusive, as the SDK's own task stores compare it (a client that asks
    again from the last timestamp it saw misses nothing set in that same instant)."""
    state = params.status or None
    since = (
        params.status_timestamp_after.ToNanoseconds()
        if params.HasField("status_timestamp_after")
        else None
    )

    def shown(execution: Execution) -> bool:
        return (state is None or task_state(execution) == state) and (
            since is None or status_time(execution).ToNanoseconds() >= since
        )

    return shown


def _principal(context: ServerCallContext) -> Principal | None:
    return principal_of(_request(context).scope)


def _translated(exc: Exception) -> Exception:
    """A store that cannot be reached is the API's 503 (with Retry-After), not an internal
    error quoting it."""
    if isinstance(exc, StoreInDoubt | StoreUnavailable):
        return ApiError(503, "execution store unavailable", {"Retry-After": "1"})
    if isinstance(exc, Bad):
        return InvalidParamsError(message=str(exc))
    return exc


class ExecutionsHandler(RequestHandler):
    """A2A's methods on the executions."""

    def __init__(
        self,
        executions: A2AExecutions,
        reasoners: dict[str, Reasoner],
        default_reasoner: str | None,
        card: CardMaker,
        webhooks: bool,
    ) -> None:
        self.executions = executions
        self.reasoners = reasoners
        self.default_reasoner = default_reasoner
        self.card = card
        self.webhooks = webhooks

    # -- helpers ---------------------------------------------------------------------------

    async def _find(self, context: ServerCallContext, task_id: str) -> Execution:
        execution = await self.executions.find(_principal(context), task_id)
        if execution is None:
            raise TaskNotFoundError(message=f"no task {shown(task_id)}")
        return execution

    def _reasoner(self, message: Message, params: SendMessageRequest) -> Reasoner:
        """The reasoner the message names by `metadata.skill` (or the request's), else the
        agent's default reasoner, else the only one."""
        skill: Any = None
        for metadata in (message.metadata, params.metadata):
            if "skill" in metadata:
                skill = metadata["skill"]
                break
        skills = one_of(self.reasoners)
        if skill is None:
            if self.default_reasoner is not None:
                skill = self.default_reasoner
            elif len(self.reasoners) == 1:
                skill = next(iter(self.reasoners))
            else:
                raise InvalidParamsError(
                    message=f"name the skill in the message's metadata.skill: one of {skills}"
                )
        reasoner = self.reasoners.get(skill) if isinstance(skill, str) else None
        if reasoner is None:
            raise InvalidParamsError(message=f"unknown skill {shown(skill)}: one of {skills}")
        return reasoner

    @staticmethod
    def _context_id(message: Message) -> str:
        """The session the message's context names, or a new one: every task has a context."""
        if not message.context_id:
            return uuid.uuid4().hex
        if not is_session_id(message.context_id):
            raise InvalidParamsError(message=f"invalid contextId: {SESSION_ID_RULE}")
        return message.context_id

    async def _begin(
        self, params: SendMessageRequest, context: ServerCallContext, *, may_queue: bool
    ) -> tuple[Execution, bool]:
        """Start the message's task, or answer the task it continues: the execution, and
        whether it was started here."""
        _check_message(params)
        message = params.message
        principal = _principal(context)
        if message.task_id:
            execution = await self._find(context, message.task_id)
            if message.context_id and message.context_id != (execution.session_id or ""):
                raise InvalidParamsError(message="the message's contextId is not its task's")
            if execution.is_terminal:
                raise UnsupportedOperationError(
                    message=f"task {execution.execution_id} is {execution.status.value}: a "
                    "terminal task takes no more messages"
                )
            pending = execution.input_request
            if execution.status is not ExecutionStatus.INPUT_REQUIRED or pending is None:
                raise UnsupportedOperationError(
                    message=f"task {execution.execution_id} is {execution.status.value}: it "
                    "takes a message only while it waits for input (input-required)"
                )
            value = answer_of(message, pending)
            return await self.executions.answer(principal, execution, value), False
        reasoner = self._reasoner(message, params)
        body = input_of(message, reasoner)
        webhook_url = self._push_url(params, context)
        execution = await self.executions.start(
            principal,
            _request(context).scope,
            reasoner,
            body,
            self._context_id(message),
            named_session=bool(message.context_id),
            message_id=message.message_id,
            may_queue=may_queue,
            webhook_url=webhook_url,
        )
        return execution, True

    def _push_url(self, params: SendMessageRequest, context: ServerCallContext) -> str | None:
        """The URL of the message's push config, checked as `X-Webhook-URL` is (an absolute
        http(s) URL of printable ASCII): invalid params naming the field, as the client's
        version spells it, and why."""
        url = params.configuration.task_push_notification_config.url
        if not url:
            return None
        if not self.webhooks:
            raise PushNotificationNotSupportedError(
                message="push notifications need webhooks on this server (--webhook-secret)"
            )
        v03 = major_of(protocol_version(context.state.get("headers", {}))) == 0
        config = "pushNotificationConfig" if v03 else "taskPushNotificationConfig"
        field = f"configuration.{config}.url"
        if not all(" " < c < "\x7f" for c in url):
            raise InvalidParamsError(
                message=f"{field} must be printable ASCII: a host name in its IDNA (xn--) "
                "form, other characters percent-encoded"
            )
        try:
            return check_url(url, field)
        except ValueError as exc:
            raise InvalidParamsError(message=str(exc)) from None

    async def _guarded(self, call: Callable[[], Any]) -> Any:
        try:
            return await call()
        except Exception as exc:
            raise _translated(exc) from None

    # -- messages --------------------------------------------------------------------------

    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """Blocking (the default) until the task ends, waits for input or is handed off;
        with `returnImmediately`, the task as it was accepted."""
        blocking = not params.configuration.return_immediately

        async def send() -> Task:
            execution, started = await self._begin(params, context, may_queue=not blocking)
            if not await self.executions.reads(_principal(context), execution):
                return self._unread(execution, started)  # it runs, unwatched
            if not blocking:
                return task_of(execution)
            request = _request(context)
            gone, reader = client_gone(request.scope, request.receive)
            try:
                settled = await self.executions.settle(_principal(context), execution, gone)
            finally:
                if reader is not None:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
            if not await self.executions.reads(_principal(context), settled):
                return self._unread(settled, started)
            return task_of(settled)

        task: Task = await self._guarded(send)
        return task

    @staticmethod
    def _unread(execution: Execution, started: bool) -> Task:
        """What a caller that may not read the task is answered: a task it started, as
        accepted (its id alone); a task it answered, the 403 of `read`."""
        if not started:
            raise Denied("read")
        return accepted_task(execution)

    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        """The task, then an event at each change, until it ends or waits for input."""
        execution, started = await self._guarded(
            lambda: self._begin(params, context, may_queue=False)
        )
        if not await self._guarded(lambda: self.executions.reads(_principal(context), execution)):
            yield self._unread(execution, started)  # it runs, unwatched: the stream ends
            return
        first, seen = task_of(execution), mark(execution)
        yield first
        async for event in self._updates(context, execution, seen, stop_at_input=True):
            yield event

    @_required
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[Event]:
        """The task as it is, then an event at each change, until it ends."""
        execution = await self._guarded(lambda: self._find(context, params.id))
        if execution.is_terminal:
            raise UnsupportedOperationError(
                message=f"task {execution.execution_id} is {execution.status.value}: nothing "
                "more will happen to it (GetTask reads it)"
            )
        first, seen = task_of(execution), mark(execution)
        yield first
        async for event in self._updates(context, execution, seen, stop_at_input=False):
            yield event

    async def _updates(
        self,
        context: ServerCallContext,
        execution: Execution,
        seen: tuple[str, Any, int],
        *,
        stop_at_input: bool,
    ) -> AsyncGenerator[Event]:
        """An event for each change after the one `seen` (what the client was sent), and
        for each of the task's events (a2a/events.py), every one kept replayed first."""
        updates = EventUpdates(execution)
        following = self.executions.follow(
            _principal(context),
            execution,
            seen,
            stop_at_input=stop_at_input,
            feed=self.executions.feed(execution),
        )
        try:
            async for latest in following:
                if isinstance(latest, list):
                    for event in latest:
                        if updates.carries(event):
                            yield updates.update(event)
                    continue
                task = task_of(latest)
                if latest.status is ExecutionStatus.SUCCEEDED:
                    yield TaskArtifactUpdateEvent(
                        task_id=task.id,
                        context_id=task.context_id,
                        artifact=result_artifact(latest),
                        last_chunk=True,
                    )
                yield TaskStatusUpdateEvent(
                    task_id=task.id, context_id=task.context_id, status=task.status
                )
        except Exception as exc:
            raise _translated(exc) from None

    # -- tasks -----------------------------------------------------------------------------

    @_required
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        execution = await self._guarded(lambda: self._find(context, params.id))
        return task_of(execution)

    @_required
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        """Newest first, a page at a time (`nextPageToken`), by context and state: every
        execution the caller may see, however it started."""
        if params.page_size < 0 or params.page_size > MAX_PAGE:
            raise InvalidParamsError(message=f"pageSize is 1 to {MAX_PAGE}")
        size = params.page_size or DEFAULT_PAGE
        after = None
        if params.page_token:
            try:
                after = ListCursor.read(params.page_token)
            except BadCursor:
                raise InvalidParamsError(
                    message="pageToken is one a ListTasks answer gave"
                ) from None
        session_id = params.context_id or None
        if session_id is not None and not is_session_id(session_id):
            raise InvalidParamsError(message=f"invalid contextId: {SESSION_ID_RULE}")
        principal = _principal(context)
        statuses = STATUSES_OF.get(params.status, frozenset()) if params.status else frozenset()
        if params.status and not statuses:  # a state no execution is in (rejected, ...)
            return ListTasksResponse(page_size=size, total_size=0)
        shown = _shown_by(params)
        page = await self._guarded(
            lambda: self.executions.page(
                principal, statuses=statuses, session_id=session_id, limit=size, after=after
            )
        )
        total = await self._guarded(lambda: self._total(principal, statuses, session_id, shown))
        return ListTasksResponse(
            tasks=[task_of(execution) for execution in page.executions if shown(execution)],
            next_page_token=page.next or "",
            page_size=size,
            total_size=total,
        )

    async def _total(
        self,
        principal: Principal | None,
        statuses: frozenset[ExecutionStatus],
        session_id: str | None,
        shown: Callable[[Execution], bool],
    ) -> int:
        """ListTasks' `totalSize`: the tasks its filters match on every page, not this page
        alone (as the SDK's own task stores count them), with their results left out. A
        shared store is read a page at a time (its work per call stays bounded, others'
        commands go between); a store in this process in one walk (a page resumed from a
        cursor walks again from the newest)."""
        limit = COUNT_PAGE if self.executions.store.shared else sys.maxsize
        total, after, seen = 0, None, None
        while True:
            page = await self.executions.page(
                principal,
                statuses=statuses,
                session_id=session_id,
                limit=limit,
                after=after,
                bare=True,
            )
            total += sum(1 for execution in page.executions if shown(execution))
            if page.next is None or page.next == seen:  # the oldest looked at
                return total
            seen = page.next
            after = ListCursor.read(page.next)

    @_required
    async def on_cancel_task(
        self, params: CancelTaskRequest, context: ServerCallContext
    ) -> Task | None:
        async def cancel() -> Task:
            execution = await self._find(context, params.id)
            if execution.is_terminal:
                raise TaskNotCancelableError(
                    message=f"task {execution.execution_id} is {execution.status.value} already"
                )
            return task_of(await self.executions.cancel(_principal(context), execution))

        task: Task = await self._guarded(cancel)
        return task

    # -- push notifications: the execution's webhook ---------------------------------------

    def _push_on(self) -> None:
        if not self.webhooks:
            raise PushNotificationNotSupportedError(
                message="push notifications need webhooks on this server (--webhook-secret)"
            )

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        self._push_on()
        raise UnsupportedOperationError(
            message="a task's push config is given with its first message "
            "(configuration.taskPushNotificationConfig): its webhooks are durable from the start"
        )

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        self._push_on()
        raise UnsupportedOperationError(message=WEBHOOK_URL_UNSHOWN)

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        self._push_on()
        raise UnsupportedOperationError(message=WEBHOOK_URL_UNSHOWN)

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        self._push_on()
        raise UnsupportedOperationError(
            message="a task's webhook stays until it ends (its deliveries are durable)"
        )

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        """The card, to a caller that passed authentication (with it on)."""
        return self.card.card(_request(context))


def card_json(card: AgentCard) -> dict[str, Any]:
    """The card as JSON, v1.0's fields and v0.3's beside them (the SDK's own conversion)."""
    found: dict[str, Any] = agent_card_to_dict(card)
    return found
