"""Every call of the client, written once and without I/O (as httpx's `_client.py` keeps
all but the sending in one base).

A call is a generator of the steps of steps.py: it yields what to do (send a request, sleep,
open and read a stream) and is sent back what happened. A call that gives many items
(events, the executions of every page) yields each as `Emit`; an event stream's reader is
event_reader.py's. The blocking and the asyncio front only take these steps, so what a call
means cannot differ between them.
"""

from __future__ import annotations

import builtins
import os
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from agent_server.client import retries as policy
from agent_server.client.event_reader import EventReader
from agent_server.client.models import (
    AgentServerError,
    Conflict,
    Event,
    Execution,
    Executions,
    InDoubt,
    InvalidInput,
    ReasonerInfo,
    Reasoners,
    SessionRelease,
    Statuses,
    Unavailable,
    WaitTimeout,
    error_from_response,
    is_acceptance,
    is_execution,
    response_body,
)
from agent_server.client.retries import Retries
from agent_server.client.steps import (
    NO_BODY,
    Close,
    Emit,
    Flow,
    Items,
    Open,
    Send,
    Sleep,
    as_response,
    checked,
    segment,
)

DEFAULT_URL = "http://127.0.0.1:8000"
#: Where a client without a `url` finds its server, and one without a `token` its token.
URL_ENV = "AGENT_SERVER_URL"
TOKEN_ENV = "AGENT_SERVER_API_TOKEN"
#: The server's bound on one long-poll (`?wait=`).
MAX_WAIT = 60.0


# -- the calls --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StartOptions:
    """What a start says besides its reasoner and input, as the HTTP API's headers:
    `X-Session-ID`, `X-Session-Policy`, `X-Webhook-URL`, and any other header (a
    `concurrency_key="header:NAME"`'s, a proxy's)."""

    session: str | None = None
    session_policy: str | None = None
    webhook_url: str | None = None
    headers: Mapping[str, str] | None = None

    def headers_with(self, key: str) -> dict[str, str]:
        """The start's headers with its `Idempotency-Key`: the named options win over the
        same header in `headers`."""
        headers = dict(self.headers or {})
        headers["Idempotency-Key"] = key
        if self.session is not None:
            headers["X-Session-ID"] = self.session
        if self.session_policy is not None:
            headers["X-Session-Policy"] = self.session_policy
        if self.webhook_url is not None:
            headers["X-Webhook-URL"] = self.webhook_url
        return headers


def resolve_url(url: str | None) -> str:
    """`url`, else AGENT_SERVER_URL, else the default (127.0.0.1:8000)."""
    return url if url is not None else os.environ.get(URL_ENV) or DEFAULT_URL


def resolve_token(token: str | None) -> str | None:
    """`token`, else AGENT_SERVER_API_TOKEN (when set and not empty), else none."""
    return token if token is not None else os.environ.get(TOKEN_ENV) or None


class Core:
    """What both fronts share: the client's settings and every call as a flow."""

    def __init__(
        self,
        url: str | None,
        *,
        token: str | None,
        timeout: float,
        retry_for: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = resolve_url(url).rstrip("/")
        self.token = resolve_token(token)
        self.timeout = timeout
        self.retry_for = retry_for
        #: Sent with every request (the token's `Authorization` wins over one here).
        self.headers = dict(headers or {})

    def http_options(self) -> dict[str, Any]:
        """The arguments of `httpx.Client` and `httpx.AsyncClient` (the transport aside)."""
        headers = {"User-Agent": "agent-server-client", **self.headers}
        if self.token is not None:
            headers["Authorization"] = f"Bearer {self.token}"
        return {"base_url": self.url, "headers": headers}

    def _timeout(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=read)

    def request(
        self, send: Send, *, resend_after_sending: bool = True, told: bool = False
    ) -> Flow[httpx.Response]:
        """Send, retrying refusals, gateway errors and transport errors for at most
        `retry_for` seconds of consecutive failures. A transport error after the request
        may have left is raised as it is when `resend_after_sending` is False. See
        `exchange` for `told`."""
        response, _ = yield from self.exchange(
            send, resend_after_sending=resend_after_sending, told=told
        )
        return response

    def exchange(
        self, send: Send, *, resend_after_sending: bool = True, told: bool = False
    ) -> Flow[tuple[httpx.Response, bool]]:
        """As `request`, and whether an answer in doubt was seen. `told` is for a write the
        server may answer in doubt (taken, on no Redis replica yet) and whose retry is safe
        (its `Idempotency-Key`, its `request_id`, or a write that is the same done twice):
        such an answer is retried like a refusal, within the same budget, and `InDoubt`
        (the execution and its Location) is raised when the budget runs out."""
        retries = Retries(self.retry_for)
        doubted: tuple[str, str] | None = None  # the execution and Location last in doubt
        while True:
            reply = as_response((yield send))
            if isinstance(reply, httpx.Response):
                doubt = policy.in_doubt(reply) if told else None
                if doubt is None and not policy.refusal(reply):
                    return reply, doubted is not None
                if doubt is not None:
                    location = reply.headers["location"]
                    doubted = (doubt, str(reply.request.url.join(location)))
                wanted = policy.retry_after(reply)
                if wanted is None:
                    wanted = policy.backoff(retries.failures)
                wanted *= random.uniform(1.0, 1.2)  # callers refused together come back apart
            else:
                if isinstance(reply, httpx.LocalProtocolError):  # never sendable: no retry
                    raise InvalidInput(
                        f"{send.method} {send.path}: the request cannot be sent: {reply}"
                    ) from reply
                if not resend_after_sending and not isinstance(reply, policy.NOT_SENT):
                    raise reply
                wanted = policy.backoff(retries.failures) * random.uniform(0.5, 1.0)
            delay = retries.delay(wanted)
            if delay is None:
                if doubted is not None:
                    execution_id, location = doubted
                    body = response_body(reply) if isinstance(reply, httpx.Response) else None
                    raise InDoubt(
                        f"{send.method} {send.path}: in doubt after {retries.spent()}: the "
                        f"server took it, but no Redis replica held it yet; read execution "
                        f"{execution_id} at {location} later",
                        execution_id=execution_id,
                        location=location,
                        status=reply.status_code if isinstance(reply, httpx.Response) else None,
                        body=body,
                    )
                if isinstance(reply, httpx.Response):
                    raise error_from_response(reply)
                raise Unavailable(
                    f"{send.method} {send.path}: no answer after {retries.spent()}: "
                    f"{type(reply).__name__}: {reply}"
                ) from reply
            yield Sleep(delay)

    # -- starts and runs ----------------------------------------------------------------------

    @staticmethod
    def _key(given: str | None) -> str:
        """The caller's `Idempotency-Key`, else one for this logical start alone."""
        return uuid.uuid4().hex if given is None else given

    def run(
        self,
        name: str,
        input: Any,
        session: str | None,
        session_policy: str | None,
        webhook_url: str | None,
        headers: Mapping[str, str] | None,
        timeout: float | None,
        idempotency_key: str | None,
    ) -> Flow[Any]:
        execution = yield from self.run_execution(
            name, input, session, session_policy, webhook_url, headers, timeout, idempotency_key
        )
        return execution.outcome()

    def run_execution(
        self,
        name: str,
        input: Any,
        session: str | None,
        session_policy: str | None,
        webhook_url: str | None,
        headers: Mapping[str, str] | None,
        timeout: float | None,
        idempotency_key: str | None,
    ) -> Flow[Execution]:
        """The execution once ended, whatever its end, or once it waits for input. One key
        for every try, and for the start that replaces a synchronous run whose connection
        broke."""
        options = StartOptions(session, session_policy, webhook_url, headers)
        key = self._key(idempotency_key)
        deadline = None if timeout is None else time.monotonic() + timeout
        send = Send(
            "POST",
            f"/reasoners/{segment(name)}",
            self._timeout(timeout),
            body=NO_BODY if input is None else input,
            headers=options.headers_with(key),
        )
        try:
            response = yield from self.request(send, resend_after_sending=False, told=True)
        except httpx.TimeoutException:
            if deadline is not None and time.monotonic() >= deadline - 0.05:
                # The server cancels a synchronous run whose caller left.
                raise WaitTimeout(f"{name} did not end within {timeout:g} s") from None
            execution = yield from self._start(name, input, options, key, None)
            return (yield from self._wait(execution.execution_id, deadline))
        except httpx.TransportError:
            # It may have started: the same key finds that execution instead of a second one.
            execution = yield from self._start(name, input, options, key, None)
            return (yield from self._wait(execution.execution_id, deadline))
        followed = policy.followed(response)
        if followed is not None:  # its end is read where the Location says, not here
            return (yield from self._wait(followed, deadline))
        body = response_body(response)
        if is_acceptance(response, body):  # started; reading it is the caller's 403 to meet
            return (yield from self._wait(str(body["execution_id"]), deadline))
        if not is_execution(body):
            raise error_from_response(response)
        execution = Execution.from_json(body)
        if execution.is_terminal or execution.waits_for_input:
            return execution
        return (yield from self._wait(execution.execution_id, deadline))

    def start(
        self,
        name: str,
        input: Any,
        session: str | None,
        session_policy: str | None,
        webhook_url: str | None,
        headers: Mapping[str, str] | None,
        idempotency_key: str | None,
        delay: float | None,
    ) -> Flow[Execution]:
        options = StartOptions(session, session_policy, webhook_url, headers)
        key = self._key(idempotency_key)
        return (yield from self._start(name, input, options, key, delay))

    def _start(
        self, name: str, input: Any, options: StartOptions, key: str, delay: float | None
    ) -> Flow[Execution]:
        send = Send(
            "POST",
            f"/reasoners/{segment(name)}/async",
            self._timeout(self.timeout),
            body=NO_BODY if input is None else input,
            headers=options.headers_with(key),
            params={} if delay is None else {"delay": str(delay)},
        )
        response = yield from self.request(send, told=True)
        return Execution.from_json(checked(response, 202).json())

    # -- executions ---------------------------------------------------------------------------

    @staticmethod
    def handle(execution_id: str) -> Execution:
        """What a handle on an execution started elsewhere knows before its first `get`."""
        return Execution(execution_id, "", "unknown")

    def get(self, execution_id: str) -> Flow[Execution]:
        return (yield from self._get(execution_id, 0.0))

    def _get(self, execution_id: str, wait: float) -> Flow[Execution]:
        params = {"wait": f"{wait:g}"} if wait > 0 else {}
        send = Send(
            "GET",
            f"/executions/{segment(execution_id)}",
            self._timeout(wait + self.timeout),
            params,
        )
        response = yield from self.request(send)
        return Execution.from_json(checked(response, 200).json())

    def wait(self, execution_id: str, timeout: float | None) -> Flow[Execution]:
        deadline = None if timeout is None else time.monotonic() + timeout
        return (yield from self._wait(execution_id, deadline))

    def _wait(self, execution_id: str, deadline: float | None) -> Flow[Execution]:
        """Long-poll (each poll at most MAX_WAIT seconds) until the execution has ended or
        waits for input (the server's long-poll returns at `input_required` too)."""
        while True:
            remaining = MAX_WAIT if deadline is None else deadline - time.monotonic()
            execution = yield from self._get(execution_id, max(0.0, min(MAX_WAIT, remaining)))
            if execution.is_terminal or execution.waits_for_input:
                return execution
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"execution {execution_id} is still {execution.status}", execution
                )

    def respond(self, execution_id: str, value: Any, request_id: int | None) -> Flow[Execution]:
        """Answer the execution's pending request (`request_id`, or the one pending now,
        read first): the execution, `running` again. The request id is always sent, so a
        retry after a broken connection answers that request or none (409), never the next
        one. `Conflict` (409) when it does not wait for that request, `InvalidInput` (422)
        when the value does not fit the request's schema (413: larger than the server
        keeps). A retry of an answer taken already (its reply lost, or in doubt) is taken
        again (202), the same value for the same request; the server kept it until the
        execution ends."""
        if request_id is None:
            execution = yield from self._get(execution_id, 0)
            request_id = execution.pending_request_id
            if request_id is None:
                raise Conflict(
                    f"execution {execution_id} is {execution.status}: it waits for no input",
                    status=409,
                    body=execution.json,
                )
        body: dict[str, Any] = {"request_id": request_id, "value": value}
        send = Send(
            "POST",
            f"/executions/{segment(execution_id)}/input",
            self._timeout(self.timeout),
            body=body,
        )
        response = yield from self.request(send, told=True)
        return Execution.from_json(checked(response, 202).json())

    def cancel(self, execution_id: str) -> Flow[Execution]:
        send = Send(
            "POST", f"/executions/{segment(execution_id)}/cancel", self._timeout(self.timeout)
        )
        response = yield from self.request(send, told=True)
        return Execution.from_json(checked(response, 200, 202).json())

    def forget(self, execution_id: str) -> Flow[None]:
        """A 404 after an answer in doubt is the delete that was in doubt, done."""
        send = Send("DELETE", f"/executions/{segment(execution_id)}", self._timeout(self.timeout))
        response, doubted = yield from self.exchange(send, told=True)
        if doubted and response.status_code == 404:
            return
        checked(response, 204)

    def _list_first(
        self, status: Statuses, reasoner: str | None, session: str | None, limit: int
    ) -> Send:
        """The request for the first page: `status` repeated once per status asked for."""
        params: dict[str, str | list[str]] = {"limit": str(limit)}
        if status is not None:
            params["status"] = [status] if isinstance(status, str) else list(status)
        for name, value in (("reasoner", reasoner), ("session_id", session)):
            if value is not None:
                params[name] = value
        return Send("GET", "/executions", self._timeout(self.timeout), params)

    def _list_page(self, send: Send, follow: bool) -> Flow[tuple[Executions, Send | None]]:
        """One page of executions and, to `follow`, the request for the next."""
        items, following = yield from self._page(send, follow)
        return [Execution.from_json(item) for item in items], following

    def _page(self, send: Send, follow: bool) -> Flow[tuple[builtins.list[Any], Send | None]]:
        """One page of a list (its JSON items) and, to `follow`, the request for the next:
        the `Link: <...>; rel="next"` the server sends while more items follow (RFC 8288),
        None when it sends none."""
        response = checked((yield from self.request(send)), 200)
        page: builtins.list[Any] = response.json()
        link = response.links.get("next", {}).get("url") if follow else None
        if link is None:
            return page, None
        here = response.request.url
        url = here.join(link)  # relative to the page it came with
        if (url.scheme, url.host, url.port) != (here.scheme, here.host, here.port):
            # The token goes with every request: never to an origin the caller did not name.
            raise AgentServerError(
                f"GET {here.path}: the next page is at another origin ({url}): not followed"
            )
        params: dict[str, str | list[str]] = {}
        for name in url.params:
            params[name] = url.params.get_list(name)
        # Its query as params: httpx sends a request's params instead of its URL's query.
        return page, Send("GET", str(url.copy_with(query=None)), send.timeout, params)

    def list(
        self, status: Statuses, reasoner: str | None, session: str | None, limit: int
    ) -> Flow[Executions]:
        send = self._list_first(status, reasoner, session, limit)
        page, _ = yield from self._list_page(send, follow=False)
        return page

    def iter_executions(
        self, status: Statuses, reasoner: str | None, session: str | None, limit: int
    ) -> Items[Execution]:
        next_page: Send | None = self._list_first(status, reasoner, session, limit)
        while next_page is not None:
            page, next_page = yield from self._list_page(next_page, follow=True)
            for execution in page:
                yield Emit(execution)

    def reasoners(self) -> Flow[Reasoners]:
        send = Send("GET", "/reasoners", self._timeout(self.timeout))
        response = checked((yield from self.request(send)), 200)
        return [ReasonerInfo.from_json(item) for item in response.json()]

    def release_session(
        self, session_id: str, timeout: float | None, cancel_running: bool
    ) -> Flow[SessionRelease]:
        params = {
            "timeout": "none" if timeout is None else f"{timeout:g}",
            "cancel_running": "true" if cancel_running else "false",
        }
        read = None if timeout is None else timeout + self.timeout
        send = Send("DELETE", f"/sessions/{segment(session_id)}", self._timeout(read), params)
        response = checked((yield from self.request(send)), 200)
        return SessionRelease.from_json(response.json())

    # -- schedules (docs/schedules.md) ---------------------------------------------------------

    def _schedule_call(
        self,
        method: str,
        path: str,
        body: Any = NO_BODY,
        *,
        expect: int = 200,
        if_lost: str = "",
    ) -> Flow[Any]:
        """One schedule route: its JSON answer (None for a 204), through the retries of
        every call. A POST is not sent again once it may have left (a second schedule would
        be made, a second firing started): its answer lost is `Unavailable` saying what may
        have been done (`if_lost`) and where to look, as every call's lost answer is a typed
        error."""
        send = Send(method, path, self._timeout(self.timeout), body=body)
        try:
            response = yield from self.request(send, resend_after_sending=method != "POST")
        except httpx.TransportError as exc:  # only after it may have left: not sent again
            raise Unavailable(
                f"{method} {path}: the answer was lost ({type(exc).__name__}: {exc}): {if_lost}"
            ) from exc
        checked(response, expect)
        return None if expect == 204 else response.json()

    def create_schedule(self, reasoner: str, cron: str, fields: dict[str, Any]) -> Flow[Schedule]:
        body = {"reasoner": reasoner, "cron": cron, **fields}
        created: Schedule = yield from self._schedule_call(
            "POST",
            "/schedules",
            body,
            expect=201,
            if_lost="the schedule may have been made: list the schedules before making it again",
        )
        return created

    def _schedules_first(self, limit: int) -> Send:
        return Send("GET", "/schedules", self._timeout(self.timeout), {"limit": str(limit)})

    def schedules(self, limit: int) -> Flow[builtins.list[Schedule]]:
        found, _ = yield from self._page(self._schedules_first(limit), follow=False)
        return found

    def iter_schedules(self, limit: int) -> Items[Schedule]:
        next_page: Send | None = self._schedules_first(limit)
        while next_page is not None:
            page, next_page = yield from self._page(next_page, follow=True)
            for schedule in page:
                yield Emit(schedule)

    def get_schedule(self, schedule_id: str) -> Flow[Schedule]:
        found: Schedule = yield from self._schedule_call("GET", schedule_path(schedule_id))
        return found

    def update_schedule(self, schedule_id: str, fields: dict[str, Any]) -> Flow[Schedule]:
        path = schedule_path(schedule_id)
        changed: Schedule = yield from self._schedule_call("PATCH", path, fields)
        return changed

    def delete_schedule(self, schedule_id: str) -> Flow[None]:
        yield from self._schedule_call("DELETE", schedule_path(schedule_id), expect=204)

    def trigger_schedule(self, schedule_id: str) -> Flow[Execution]:
        path = f"{schedule_path(schedule_id)}/trigger"
        body = yield from self._schedule_call(
            "POST",
            path,
            expect=202,
            if_lost=f"it may have fired: list the executions of schedule {schedule_id} "
            "before triggering it again",
        )
        return Execution.from_json(body)

    # -- events -------------------------------------------------------------------------------

    def events(self, execution_id: str, after: int | None, timeout: float | None) -> Items[Event]:
        """The stream through its `end`, resumed after `Last-Event-ID` whenever a connection
        ends before it, for at most `retry_for` seconds without an event."""
        reader = EventReader(
            execution_id, after, timeout, connect=self.timeout, retry_for=self.retry_for
        )
        while True:
            opened = as_response((yield Open(reader.send(), reader.deadline)))
            delay = yield from reader.connection(opened)
            if delay is None:
                return
            yield Close()
            yield Sleep(delay)


#: A schedule as the server shows it (docs/schedules.md).
Schedule = dict[str, Any]


def schedule_path(schedule_id: str) -> str:
    return f"/schedules/{segment(schedule_id)}"
