"""The blocking front: the core's steps taken with httpx.Client and time.sleep.

Each public method is a call into the core; tests/test_client_fronts.py holds this front and
the asyncio one (aio.py) to the same methods, signatures and bodies, `await` aside.
"""

from __future__ import annotations

import builtins
import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Any, TypeVar

import httpx

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


class AgentClient:
    """A blocking client. `url` is the server (or the Service in front of its replicas);
    `timeout` bounds connecting and each ordinary answer; `retry_for` bounds the seconds
    spent retrying one call through consecutive failures."""

    def __init__(
        self,
        url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._core = Core(url, token=token, timeout=timeout, retry_for=retry_for, headers=headers)
        self._http = httpx.Client(**self._core.http_options(), transport=transport)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- the steps: all that is this front's own ----------------------------------------------

    def _take(self, step: Step) -> Reply:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        try:
            return self._http.request(**step.request())
        except httpx.TransportError as exc:
            return exc

    def _drive(self, flow: Flow[T]) -> T:
        reply: Reply = None
        while True:
            try:
                step = flow.send(reply)
            except StopIteration as stop:
                result: T = stop.value
                return result
            reply = self._take(step)

    def _iterate(self, flow: Items[T]) -> Iterator[T]:
        with contextlib.ExitStack() as opened, contextlib.closing(flow):
            response: httpx.Response | None = None
            chunks: Iterator[str] = iter(())
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
                    opened.close()
                elif isinstance(step, Open | Read | Chunk):
                    try:
                        if isinstance(step, Open):
                            response = opened.enter_context(
                                self._http.stream(**step.send.request())
                            )
                            opened.enter_context(cut_at(response, step.deadline))
                            chunks = response.iter_text()
                            reply = response
                        elif isinstance(step, Read):
                            assert response is not None
                            response.read()
                            reply = response
                        else:
                            reply = next(chunks, None)
                    except httpx.TransportError as exc:
                        reply = exc
                else:
                    reply = self._take(step)

    # -- the calls ----------------------------------------------------------------------------

    def run(
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
        """Run `name` with `input` (a JSON object of its parameters) and return its result,
        or raise the typed error of its end. `timeout` bounds the wait for the end (the
        server then cancels the run: nobody waits for it any more). `idempotency_key` is
        the caller's own key for this run (else one is chosen), sent on every try. A run
        whose reasoner asks for input raises `InputRequired`, whose `handle` follows it."""
        try:
            return self._drive(
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
            exc.handle = ExecutionHandle(self, exc.execution)
            raise

    def run_execution(
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
        """As `run`, but the ended execution itself, whatever its end."""
        flow = self._core.run_execution(
            name, input, session, session_policy, webhook_url, headers, timeout, idempotency_key
        )
        return self._drive(flow)

    def start(
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
    ) -> ExecutionHandle:
        """Start `name` in the background; the handle follows it. A repeat with the same
        `idempotency_key` gets the execution the first one started."""
        flow = self._core.start(
            name, input, session, session_policy, webhook_url, headers, idempotency_key, delay
        )
        return ExecutionHandle(self, self._drive(flow))

    def handle(self, execution_id: str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (its state read on first `get`)."""
        return ExecutionHandle(self, self._core.handle(execution_id))

    def get(self, execution_id: str) -> Execution:
        return self._drive(self._core.get(execution_id))

    def wait(self, execution_id: str, timeout: float | None = None) -> Execution:
        return self._drive(self._core.wait(execution_id, timeout))

    def respond(self, execution_id: str, value: Any, request_id: int | None = None) -> Execution:
        """Answer the execution's pending request (or `request_id`): the execution,
        `running` again; `Conflict` when it does not wait for it, `InvalidInput` when the
        value does not fit its schema."""
        return self._drive(self._core.respond(execution_id, value, request_id))

    def cancel(self, execution_id: str) -> Execution:
        return self._drive(self._core.cancel(execution_id))

    def forget(self, execution_id: str) -> None:
        """Delete a finished execution's record (`Conflict` while it runs)."""
        return self._drive(self._core.forget(execution_id))

    def list(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Executions:
        """One page of executions, newest first, filtered: `status` one or several (any of
        them)."""
        return self._drive(self._core.list(status, reasoner, session, limit))

    def iter_executions(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Iterator[Execution]:
        """Every execution `list` would filter, page after page (`limit` a page), following
        the server's `Link: rel="next"`; one page when it sends none."""
        return self._iterate(self._core.iter_executions(status, reasoner, session, limit))

    def reasoners(self) -> Reasoners:
        return self._drive(self._core.reasoners())

    def release_session(
        self, session_id: str, timeout: float | None = 30.0, cancel_running: bool = True
    ) -> SessionRelease:
        """Cancel the session's running work, wait for it at most `timeout` seconds (None:
        without bound), and forget the session's records."""
        return self._drive(self._core.release_session(session_id, timeout, cancel_running))

    def events(
        self, execution_id: str, after: int | None = None, *, timeout: float | None = None
    ) -> Iterator[Event]:
        """The execution's events, live, through its `end` event (whose data is the
        execution); resumed with `Last-Event-ID` after a disconnect. `timeout` bounds the
        whole stream: `WaitTimeout` when it passes before the end (the execution goes on)."""
        return self._iterate(self._core.events(execution_id, after, timeout))

    # -- schedules (docs/schedules.md) ---------------------------------------------------------

    def create_schedule(self, reasoner: str, cron: str, fields: dict[str, Any]) -> Schedule:
        """A schedule made (`fields`: `timezone`, `input`, `session_id`, `overlap`,
        `catchup_window`, `enabled`): the schedule, as the server shows it."""
        return self._drive(self._core.create_schedule(reasoner, cron, fields))

    def schedules(self, limit: int = 100) -> builtins.list[Schedule]:
        """One page of the schedules the caller sees (the declared ones and its tenant's),
        by id: at most `limit` (1 to 1000)."""
        return self._drive(self._core.schedules(limit))

    def iter_schedules(self, limit: int = 100) -> Iterator[Schedule]:
        """Every schedule the caller sees, page after page (`limit` a page), following the
        server's `Link: rel="next"`."""
        return self._iterate(self._core.iter_schedules(limit))

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self._drive(self._core.get_schedule(schedule_id))

    def update_schedule(self, schedule_id: str, fields: dict[str, Any]) -> Schedule:
        """Change fields (only `enabled` for a declared one): the schedule."""
        return self._drive(self._core.update_schedule(schedule_id, fields))

    def delete_schedule(self, schedule_id: str) -> None:
        """Delete it (a declared one cannot be: `Conflict`)."""
        return self._drive(self._core.delete_schedule(schedule_id))

    def trigger_schedule(self, schedule_id: str) -> Execution:
        """Fire now (whatever `enabled` says; `overlap` is obeyed): the execution."""
        return self._drive(self._core.trigger_schedule(schedule_id))


class ExecutionHandle:
    """One execution started by `AgentClient.start`."""

    def __init__(self, client: AgentClient, execution: Execution) -> None:
        self.client = client
        self.execution = execution

    @property
    def execution_id(self) -> str:
        return self.execution.execution_id

    def get(self) -> Execution:
        self.execution = self.client.get(self.execution_id)
        return self.execution

    def wait(self, timeout: float | None = None) -> Execution:
        """The execution once ended (any end) or waiting for input (`input_required`),
        long-polling; `WaitTimeout` after `timeout`."""
        self.execution = self.client.wait(self.execution_id, timeout)
        return self.execution

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then the result, or the typed error of its end (`InputRequired` when it
        waits for input)."""
        return self.wait(timeout).outcome()

    def respond(self, value: Any, request_id: int | None = None) -> Execution:
        """Answer `request_id`, else the request this handle last saw pending (else the one
        pending now); see `AgentClient.respond`."""
        if request_id is None:
            request_id = self.execution.pending_request_id
        self.execution = self.client.respond(self.execution_id, value, request_id)
        return self.execution

    def cancel(self) -> Execution:
        self.execution = self.client.cancel(self.execution_id)
        return self.execution

    def events(self, after: int | None = None, *, timeout: float | None = None) -> Iterator[Event]:
        return self.client.events(self.execution_id, after, timeout=timeout)
