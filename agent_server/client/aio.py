"""The asyncio front: the core's steps taken with httpx.AsyncClient and asyncio.sleep.

The same methods as the blocking front (sync.py), as coroutines and async iterators; their
docstrings are that front's (one text for both), and tests/test_client_fronts.py holds the
two to the same signatures and bodies, `await` aside.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any, TypeVar, cast

import httpx

from agent_server.client import sync
from agent_server.client.core import Core, Schedule
from agent_server.client.cut import cut_at
from agent_server.client.models import (
    Event,
    Execution,
    Executions,
    InputRequired,
    Reasoners,
    SessionRelease,
    Statuses,
)
from agent_server.client.steps import (
    Chunk,
    Close,
    Emit,
    Flow,
    Items,
    Open,
    Read,
    Reply,
    Sleep,
    Step,
)

T = TypeVar("T")

#: This front's names for the blocking front's methods, where they differ.
SYNC_NAMES = {"aclose": "close", "__aenter__": "__enter__", "__aexit__": "__exit__"}


class AsyncAgentClient:
    """The same client for asyncio: every method is a coroutine; `events` and
    `iter_executions` async iterators."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._core = Core(url, token=token, timeout=timeout, retry_for=retry_for, headers=headers)
        self._http = httpx.AsyncClient(**self._core.http_options(), transport=transport)

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the steps: all that is this front's own ----------------------------------------------

    async def _take(self, step: Step) -> Reply:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        try:
            return await self._http.request(**step.request())
        except httpx.TransportError as exc:
            return exc

    async def _drive(self, flow: Flow[T]) -> T:
        reply: Reply = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            reply = await self._take(step)

    async def _iterate(self, flow: Items[T]) -> AsyncIterator[T]:
        async with contextlib.AsyncExitStack() as opened:
            with contextlib.closing(flow):
                response: httpx.Response | None = None
                chunks: AsyncGenerator[str, None] | None = None
                reply: Reply = None
                while True:
                    try:
                        step = flow.send(reply)
                    except StopIteration:
                        return
                    reply = None
                    if isinstance(step, Emit):
                        yield step.item
                    elif isinstance(step, Close):
                        await opened.aclose()
                    elif isinstance(step, Open | Read | Chunk):
                        try:
                            if isinstance(step, Open):
                                response = await opened.enter_async_context(
                                    self._http.stream(**step.send.request())
                                )
                                opened.enter_context(cut_at(response, step.deadline))
                                # Closed before its response: an async generator is not
                                # closed by being dropped.
                                chunks = cast(AsyncGenerator[str, None], response.aiter_text())
                                opened.push_async_callback(chunks.aclose)
                                reply = response
                            elif isinstance(step, Read):
                                assert response is not None
                                await response.aread()
                                reply = response
                            else:
                                assert chunks is not None
                                reply = await anext(chunks, None)
                        except httpx.TransportError as exc:
                            reply = exc
                    else:
                        reply = await self._take(step)

    # -- the calls ----------------------------------------------------------------------------

    async def run(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        session_policy: str | None = None,
        webhook_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        try:
            return await self._drive(
                self._core.run(
                    name,
                    input,
                    session,
                    session_policy,
                    webhook_url,
                    headers,
                    timeout,
                    idempotency_key,
                )
            )
        except InputRequired as exc:
            exc.handle = AsyncExecutionHandle(self, exc.execution)
            raise

    async def run_execution(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        session_policy: str | None = None,
        webhook_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        flow = self._core.run_execution(
            name, input, session, session_policy, webhook_url, headers, timeout, idempotency_key
        )
        return await self._drive(flow)

    async def start(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        session_policy: str | None = None,
        webhook_url: str | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        delay: float | None = None,
    ) -> AsyncExecutionHandle:
        flow = self._core.start(
            name, input, session, session_policy, webhook_url, headers, idempotency_key, delay
        )
        return AsyncExecutionHandle(self, await self._drive(flow))

    def handle(self, execution_id: str) -> AsyncExecutionHandle:
        return AsyncExecutionHandle(self, self._core.handle(execution_id))

    async def get(self, execution_id: str) -> Execution:
        return await self._drive(self._core.get(execution_id))

    async def wait(self, execution_id: str, timeout: float | None = None) -> Execution:
        return await self._drive(self._core.wait(execution_id, timeout))

    async def respond(
        self, execution_id: str, value: Any, request_id: int | None = None
    ) -> Execution:
        return await self._drive(self._core.respond(execution_id, value, request_id))

    async def cancel(self, execution_id: str) -> Execution:
        return await self._drive(self._core.cancel(execution_id))

    async def forget(self, execution_id: str) -> None:
        return await self._drive(self._core.forget(execution_id))

    async def list(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Executions:
        return await self._drive(self._core.list(status, reasoner, session, limit))

    def iter_executions(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> AsyncIterator[Execution]:
        return self._iterate(self._core.iter_executions(status, reasoner, session, limit))

    async def reasoners(self) -> Reasoners:
        return await self._drive(self._core.reasoners())

    async def release_session(
        self, session_id: str, timeout: float | None = 30.0, cancel_running: bool = True
    ) -> SessionRelease:
        return await self._drive(self._core.release_session(session_id, timeout, cancel_running))

    def events(
        self, execution_id: str, after: int | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Event]:
        return self._iterate(self._core.events(execution_id, after, timeout))

    # -- schedules (docs/schedules.md) ---------------------------------------------------------

    async def create_schedule(self, reasoner: str, cron: str, fields: dict[str, Any]) -> Schedule:
        """A schedule made (`fields`: `timezone`, `input`, `session_id`, `overlap`,
        `catchup_window`, `enabled`): the schedule, as the server shows it."""
        return await self._drive(self._core.create_schedule(reasoner, cron, fields))

    async def schedules(self, limit: int = 100) -> builtins.list[Schedule]:
        """One page of the schedules the caller sees (the declared ones and its tenant's),
        by id: at most `limit` (1 to 1000)."""
        return await self._drive(self._core.schedules(limit))

    def iter_schedules(self, limit: int = 100) -> AsyncIterator[Schedule]:
        """Every schedule the caller sees, page after page (`limit` a page), following the
        server's `Link: rel="next"`."""
        return self._iterate(self._core.iter_schedules(limit))

    async def get_schedule(self, schedule_id: str) -> Schedule:
        return await self._drive(self._core.get_schedule(schedule_id))

    async def update_schedule(self, schedule_id: str, fields: dict[str, Any]) -> Schedule:
        """Change fields (only `enabled` for a declared one): the schedule."""
        return await self._drive(self._core.update_schedule(schedule_id, fields))

    async def delete_schedule(self, schedule_id: str) -> None:
        """Delete it (a declared one cannot be: `Conflict`)."""
        return await self._drive(self._core.delete_schedule(schedule_id))

    async def trigger_schedule(self, schedule_id: str) -> Execution:
        """Fire now (whatever `enabled` says; `overlap` is obeyed): the execution."""
        return await self._drive(self._core.trigger_schedule(schedule_id))


class AsyncExecutionHandle:
    """One execution started by `AsyncAgentClient.start`."""

    def __init__(self, client: AsyncAgentClient, execution: Execution) -> None:
        self.client = client
        self.execution = execution

    @property
    def execution_id(self) -> str:
        return self.execution.execution_id

    async def get(self) -> Execution:
        self.execution = await self.client.get(self.execution_id)
        return self.execution

    async def wait(self, timeout: float | None = None) -> Execution:
        self.execution = await self.client.wait(self.execution_id, timeout)
        return self.execution

    async def result(self, timeout: float | None = None) -> Any:
        return (await self.wait(timeout)).outcome()

    async def respond(self, value: Any, request_id: int | None = None) -> Execution:
        if request_id is None:  # the request this handle last saw pending (see the sync one)
            request_id = self.execution.pending_request_id
        self.execution = await self.client.respond(self.execution_id, value, request_id)
        return self.execution

    async def cancel(self) -> Execution:
        self.execution = await self.client.cancel(self.execution_id)
        return self.execution

    def events(
        self, after: int | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Event]:
        return self.client.events(self.execution_id, after, timeout=timeout)


def _share_docstrings(front: type, like: type) -> None:
    for name, method in vars(front).items():
        twin = vars(like).get(SYNC_NAMES.get(name, name))
        if callable(method) and method.__doc__ is None and twin is not None:
            method.__doc__ = twin.__doc__


_share_docstrings(AsyncAgentClient, sync.AgentClient)
_share_docstrings(AsyncExecutionHandle, sync.ExecutionHandle)
