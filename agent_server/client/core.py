"""Every call of the client, written once and without I/O (as httpx's `_client.py` keeps
all but the sending in one base).

A call is a generator: it yields the steps to take (`Send` a request, `Sleep`, and for a
stream `Open`, `Read`, `Chunk`, `Close`) and is sent back what happened (the response, the
transport error, the text). A call that gives many items (events, the executions of every
page) yields each as `Emit`. The blocking and the asyncio front only take these steps, so
what a call means cannot differ between them.
"""

from __future__ import annotations

import json
import random
import time
import urllib.parse
import uuid
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from httpx_sse import SSEError

from agent_server.client import retries as policy
from agent_server.client.models import (
    AgentServerError,
    Conflict,
    Event,
    Execution,
    Executions,
    InDoubt,
    ReasonerInfo,
    Reasoners,
    SessionRelease,
    Statuses,
    Unavailable,
    WaitTimeout,
    error_from_response,
    is_execution,
    response_body,
)
from agent_server.client.retries import Retries
from agent_server.client.sse import Message, Parser

DEFAULT_URL = "http://127.0.0.1:8000"
#: The server's bound on one long-poll (`?wait=`).
MAX_WAIT = 60.0
#: Seconds an event stream may stay silent (the server sends a heartbeat every 15 s by
#: default) before it is taken for dead and resumed.
STREAM_SILENCE = 60.0
#: Events the stream sends around a reasoner's own: they carry no number.
UNNUMBERED = frozenset({"start", "missed", "end"})
#: A JSON body that is absent (not the JSON `null`).
NO_BODY: Any = object()

T = TypeVar("T")


def segment(value: str) -> str:
    """`value` as one path segment: every character but the unreserved ones percent-encoded
    (an id or name with '/', '?', '#' or '%' never names another path), and '.' or '..'
    with their dots encoded too (a URL parser would resolve them away: `release ..` sent
    `DELETE /`). An empty one names no resource: ValueError."""
    if not value:
        raise ValueError("an execution id, reasoner name or session id cannot be empty")
    quoted = urllib.parse.quote(value, safe="")
    return quoted.replace(".", "%2E") if quoted in (".", "..") else quoted


# -- the steps --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Send:
    """Send this request; the reply is the response or the transport error."""

    method: str
    #: A path under the client's URL, or an absolute URL (a `Link` the server gave).
    path: str
    timeout: httpx.Timeout
    params: Mapping[str, str | list[str]] = field(default_factory=dict)
    body: Any = NO_BODY
    headers: dict[str, str] = field(default_factory=dict)

    def request(self) -> dict[str, Any]:
        """The arguments of `httpx.Client.request` and `.stream` (and their async twins)."""
        arguments: dict[str, Any] = {
            "method": self.method,
            "url": self.path,
            "params": self.params,
            "headers": self.headers,
            "timeout": self.timeout,
        }
        if self.body is not NO_BODY:
            arguments["json"] = self.body
        return arguments


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Open:
    """Open `send` as a stream, its connection shut at the monotonic `deadline` (httpx
    bounds each read, not a whole stream); the reply is the response, its body unread."""

    send: Send
    deadline: float | None


@dataclass(frozen=True)
class Read:
    """Read the open stream's whole body; the reply is the response or the error."""


@dataclass(frozen=True)
class Chunk:
    """The open stream's next text: the reply is it, None at its end, or the error."""


@dataclass(frozen=True)
class Close:
    """Close the open stream (and let its connection go back to the pool)."""


@dataclass(frozen=True)
class Emit(Generic[T]):
    """Give `item` to the caller iterating."""

    item: T


Step = Send | Sleep
StreamStep = Step | Open | Read | Chunk | Close
Reply = httpx.Response | httpx.TransportError | str | None
#: A call whose answer is its return value.
Flow = Generator[Step, Reply, T]
#: A call that gives the caller its items one by one.
Items = Generator[StreamStep | Emit[T], Reply, None]


def _response(reply: Reply) -> httpx.Response | httpx.TransportError:
    assert isinstance(reply, httpx.Response | httpx.TransportError), reply
    return reply


def _text(reply: Reply) -> str | httpx.TransportError | None:
    assert not isinstance(reply, httpx.Response), reply
    return reply


def _checked(response: httpx.Response, *expected: int) -> httpx.Response:
    if response.status_code not in expected:
        raise error_from_response(response)
    return response


# -- the calls --------------------------------------------------------------------------------


class Core:
    """What both fronts share: the client's settings and every call as a flow."""

    def __init__(self, url: str, *, token: str | None, timeout: float, retry_for: float) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.retry_for = retry_for

    def http_options(self) -> dict[str, Any]:
        """The arguments of `httpx.Client` and `httpx.AsyncClient` (the transport aside)."""
        headers = {"User-Agent": "agent-server-client"}
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
            reply = _response((yield send))
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

    @staticmethod
    def _start_headers(session: str | None, key: str) -> dict[str, str]:
        headers = {"Idempotency-Key": key}
        if session is not None:
            headers["X-Session-ID"] = session
        return headers

    def run(
        self,
        name: str,
        input: Any,
        session: str | None,
        timeout: float | None,
        idempotency_key: str | None,
    ) -> Flow[Any]:
        execution = yield from self.run_execution(name, input, session, timeout, idempotency_key)
        return execution.outcome()

    def run_execution(
        self,
        name: str,
        input: Any,
        session: str | None,
        timeout: float | None,
        idempotency_key: str | None,
    ) -> Flow[Execution]:
        """The execution once ended, whatever its end, or once it waits for input. One key
        for every try, and for the start that replaces a synchronous run whose connection
        broke."""
        key = self._key(idempotency_key)
        deadline = None if timeout is None else time.monotonic() + timeout
        send = Send(
            "POST",
            f"/reasoners/{segment(name)}",
            self._timeout(timeout),
            body=NO_BODY if input is None else input,
            headers=self._start_headers(session, key),
        )
        try:
            response = yield from self.request(send, resend_after_sending=False, told=True)
        except httpx.TimeoutException:
            if deadline is not None and time.monotonic() >= deadline - 0.05:
                # The server cancels a synchronous run whose caller left.
                raise WaitTimeout(f"{name} did not end within {timeout:g} s") from None
            execution = yield from self._start(name, input, session, key)
            return (yield from self._wait(execution.execution_id, deadline))
        except httpx.TransportError:
            # It may have started: the same key finds that execution instead of a second one.
            execution = yield from self._start(name, input, session, key)
            return (yield from self._wait(execution.execution_id, deadline))
        followed = policy.followed(response)
        if followed is not None:  # its end is read where the Location says, not here
            return (yield from self._wait(followed, deadline))
        body = response_body(response)
        if not is_execution(body):
            raise error_from_response(response)
        execution = Execution.from_json(body)
        if execution.is_terminal or execution.waits_for_input:
            return execution
        return (yield from self._wait(execution.execution_id, deadline))

    def start(
        self, name: str, input: Any, session: str | None, idempotency_key: str | None
    ) -> Flow[Execution]:
        return (yield from self._start(name, input, session, self._key(idempotency_key)))

    def _start(self, name: str, input: Any, session: str | None, key: str) -> Flow[Execution]:
        send = Send(
            "POST",
            f"/reasoners/{segment(name)}/async",
            self._timeout(self.timeout),
            body=NO_BODY if input is None else input,
            headers=self._start_headers(session, key),
        )
        response = yield from self.request(send, told=True)
        return Execution.from_json(_checked(response, 202).json())

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
        return Execution.from_json(_checked(response, 200).json())

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
        return Execution.from_json(_checked(response, 202).json())

    def cancel(self, execution_id: str) -> Flow[Execution]:
        send = Send(
            "POST", f"/executions/{segment(execution_id)}/cancel", self._timeout(self.timeout)
        )
        response = yield from self.request(send, told=True)
        return Execution.from_json(_checked(response, 200, 202).json())

    def forget(self, execution_id: str) -> Flow[None]:
        """A 404 after an answer in doubt is the delete that was in doubt, done."""
        send = Send("DELETE", f"/executions/{segment(execution_id)}", self._timeout(self.timeout))
        response, doubted = yield from self.exchange(send, told=True)
        if doubted and response.status_code == 404:
            return
        _checked(response, 204)

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
        """One page and, to `follow`, the request for the next: the `Link: <...>;
        rel="next"` the server sends while more records match (RFC 8288), None when it
        sends none."""
        response = _checked((yield from self.request(send)), 200)
        page = [Execution.from_json(item) for item in response.json()]
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
        response = _checked((yield from self.request(send)), 200)
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
        response = _checked((yield from self.request(send)), 200)
        return SessionRelease.from_json(response.json())

    # -- events -------------------------------------------------------------------------------

    def events(self, execution_id: str, after: int | None, timeout: float | None) -> Items[Event]:
        """The stream through its `end`, resumed after `Last-Event-ID` whenever a connection
        ends before it, for at most `retry_for` seconds without an event."""
        reader = _EventReader(self, execution_id, after, timeout)
        while True:
            opened = _response((yield Open(reader.send(), reader.deadline)))
            delay = yield from reader.connection(opened)
            if delay is None:
                return
            yield Close()
            yield Sleep(delay)

    def _events_send(self, execution_id: str, last_id: int | None, left: float | None) -> Send:
        """The request for a stream, its timeouts cut to the `left` seconds of the caller's
        deadline, when there is one."""
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        connect, silence = self.timeout, STREAM_SILENCE
        if left is not None:
            connect, silence = min(connect, left), min(silence, left)
        return Send(
            "GET",
            f"/executions/{segment(execution_id)}/events",
            httpx.Timeout(connect, read=silence),
            {},
            headers=headers,
        )


class _EventReader:
    """What one reader of an execution's events decides between connections."""

    def __init__(
        self, core: Core, execution_id: str, after: int | None, timeout: float | None
    ) -> None:
        self.core = core
        self.execution_id = execution_id
        #: The number of the last event received: where a new connection resumes.
        self.last_id = after
        #: The server's `retry:` hint, in seconds.
        self.retry: float | None = None
        self.retries = Retries(core.retry_for)
        #: The caller's bound on the whole stream, every connection and wait included.
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        """Seconds left before the caller's deadline (None without one); `WaitTimeout` once
        it has passed."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(
                f"execution {self.execution_id} did not end within {self.timeout:g} s"
            )
        return left

    def send(self) -> Send:
        return self.core._events_send(self.execution_id, self.last_id, self.left())

    def take(self, message: Message) -> Event | None:
        """The event a message carries, or None for a bare `retry:` hint. Its data is JSON;
        `start`, `missed` and `end` have no number. An event that comes after the deadline
        comes too late: `WaitTimeout`."""
        self.left()
        if message.retry is not None:
            self.retry = message.retry / 1000
        if not message.data:
            return None
        number = None
        if message.event not in UNNUMBERED and message.id.isdigit():
            number = self.last_id = int(message.id)
        try:
            data: Any = json.loads(message.data)
        except ValueError:
            data = message.data
        return Event(number, message.event, data)

    def connection(
        self, opened: httpx.Response | httpx.TransportError
    ) -> Generator[StreamStep | Emit[Event], Reply, float | None]:
        """One connection's events; then the seconds to wait before the next, None once
        the `end` has come."""
        if isinstance(opened, httpx.TransportError):
            return self.failed(opened, None)
        self.left()
        if opened.status_code != 200:
            read = _response((yield Read()))
            if isinstance(read, httpx.TransportError):
                return self.failed(read, None)
            if not policy.refusal(opened):
                raise error_from_response(opened)
            return self.failed(opened, policy.retry_after(opened))
        kind = opened.headers.get("content-type", "").partition(";")[0]
        if "text/event-stream" not in kind:
            # As httpx-sse refuses it: a failure to retry, like a broken connection.
            not_a_stream = SSEError(
                "Expected response header Content-Type to contain 'text/event-stream', "
                f"got {kind!r}"
            )
            return self.failed(not_a_stream, None)
        parser = Parser()
        while True:
            chunk = _text((yield Chunk()))
            if isinstance(chunk, httpx.TransportError):
                return self.failed(chunk, None)
            for message in parser.feed(chunk) if chunk is not None else parser.end():
                event = self.take(message)
                if event is not None:
                    self.received()
                    yield Emit(event)
                    if event.event == "end":
                        return None
            if chunk is None:  # closed before its end: resume
                return self.failed(None, None)

    def received(self) -> None:
        self.retries.received()

    def failed(self, reason: httpx.Response | Exception | None, hint: float | None) -> float:
        """Seconds to wait before resuming (never past the deadline), or the error when
        retries are exhausted; `WaitTimeout` once the deadline has passed (the connection
        cut at it, say)."""
        left = self.left()
        wanted = hint if hint is not None else self.retry
        if wanted is None:
            wanted = policy.backoff(self.retries.failures)
        delay = self.retries.delay(wanted)
        if delay is None:
            if isinstance(reason, httpx.Response):
                raise error_from_response(reason)
            raise Unavailable(
                f"events of {self.execution_id}: stream lost after {self.retries.spent()}: "
                f"{reason!r}"
            )
        return delay if left is None else min(delay, left)
