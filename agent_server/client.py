"""A Python client for an agent-server: `AgentClient` (blocking) and `AsyncAgentClient`.

Both ride rollouts (docs/client.md):

- 429 and 503 refusals (nothing was started) are retried after their `Retry-After`, and
  connection errors and gateway errors (502, 504) after a short backoff, for at most
  `retry_for` seconds of consecutive failures (the last wait is cut to what is left of it,
  and one last try made at its end); then `Busy` (429) or `Unavailable`.
- Every start carries one `Idempotency-Key`, the caller's own or one chosen per logical start
  (a UUID 4), so a start retried after a connection error gets the execution the first
  attempt started, never a second run. Reads, cancels and session releases are retried as
  they are.
- A synchronous run that a shutdown handed off (503 + `Location`) is followed to its end
  with long-polls (`GET /executions/{id}?wait=`); one whose connection broke is found again
  by its key through the background route and followed the same way.

Both clients share one implementation of each call: a generator that yields what to do
(send a request, sleep) and receives what happened, driven by a blocking or an async driver.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import random
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from httpx_sse import EventSource as SseEvents
from httpx_sse import ServerSentEvent

from agent_server import status as states

__all__ = [
    "AgentClient",
    "AgentServerError",
    "AsyncAgentClient",
    "AsyncExecutionHandle",
    "Busy",
    "Conflict",
    "Event",
    "Execution",
    "ExecutionCancelled",
    "ExecutionError",
    "ExecutionFailed",
    "ExecutionHandle",
    "ExecutionLost",
    "InvalidInput",
    "NotFound",
    "ReasonerInfo",
    "SessionRelease",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]

DEFAULT_URL = "http://127.0.0.1:8000"
#: The server's bound on one long-poll (`?wait=`).
MAX_WAIT = 60.0
#: The statuses an execution does not leave, from the one table (status.py imports nothing
#: of the server).
TERMINAL = frozenset(status.value for status in states.TERMINAL)
#: Backoff after a connection or gateway error: doubled from the first up to the last.
BACKOFF_FIRST = 0.1
BACKOFF_MAX = 2.0
#: The longest Retry-After honoured as given; a longer one is cut to this.
RETRY_AFTER_MAX = 10.0
#: Seconds an event stream may stay silent (the server sends a heartbeat every 15 s by
#: default) before it is taken for dead and resumed.
STREAM_SILENCE = 60.0
#: A JSON body that is absent (not the JSON `null`).
_NO_BODY: Any = object()

T = TypeVar("T")


# -- what the server answers ------------------------------------------------------------------


@dataclass(frozen=True)
class Execution:
    """One execution as the server reported it (docs/api.md#the-execution)."""

    execution_id: str
    reasoner: str
    status: str
    session_id: str | None = None
    status_reason: str | None = None
    result: Any = None
    error: dict[str, Any] | None = None
    created_at: str | None = None
    finished_at: str | None = None
    duration_seconds: float | None = None
    replica: str | None = None
    attempt: int = 1
    #: The JSON object exactly as received (fields this client does not know included).
    json: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> Execution:
        return cls(
            execution_id=str(body["execution_id"]),
            reasoner=str(body.get("reasoner", "")),
            status=str(body["status"]),
            session_id=body.get("session_id"),
            status_reason=body.get("status_reason"),
            result=body.get("result"),
            error=body.get("error"),
            created_at=body.get("created_at"),
            finished_at=body.get("finished_at"),
            duration_seconds=body.get("duration_seconds"),
            replica=body.get("replica"),
            attempt=int(body.get("attempt", 1)),
            json=body,
        )

    @property
    def is_terminal(self) -> bool:
        """`queued` and `running` are not terminal; every other status is."""
        return self.status in TERMINAL

    def outcome(self) -> Any:
        """The result of a succeeded execution; the typed error of any other end."""
        if self.status == "succeeded":
            return self.result
        if self.status == "failed":
            raise ExecutionFailed(self)
        if self.status == "cancelled":
            raise ExecutionCancelled(self)
        if self.status == "lost":
            raise ExecutionLost(self)
        raise AgentServerError(f"execution {self.execution_id} is {self.status}", body=self.json)


@dataclass(frozen=True)
class Event:
    """One server-sent event of an execution: its number (None for the unnumbered `start`,
    `missed` and `end`), name and JSON data. The stream's last event is `end`, whose data
    is the execution."""

    id: int | None
    event: str
    data: Any


@dataclass(frozen=True)
class ReasonerInfo:
    name: str
    description: str | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]


@dataclass(frozen=True)
class SessionRelease:
    session_id: str
    cancelled: int
    abandoned: int
    forgotten: int
    elapsed_seconds: float


#: Named here: the clients' `list` method hides the builtin inside their class bodies.
Executions = list[Execution]
Reasoners = list[ReasonerInfo]
#: One status, several (any of them), or None (any status).
Statuses = str | Iterable[str] | None


# -- errors ---------------------------------------------------------------------------------


class AgentServerError(Exception):
    """Any error this client reports: `status` is the HTTP status of the answer it comes
    from (None when there was none, or for an end read from the execution itself), `body`
    the server's JSON (`{"detail": ...}` or the execution)."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = body

    @property
    def detail(self) -> Any:
        return self.body.get("detail") if isinstance(self.body, dict) else None


class Unauthorized(AgentServerError):
    """401: no token, or the wrong one."""


class NotFound(AgentServerError):
    """404: unknown reasoner or execution (forgotten, or never there)."""


class InvalidInput(AgentServerError):
    """The server refused the request itself: 422 with pydantic's error list in `errors`,
    or 400, 413, 415."""

    @property
    def errors(self) -> list[dict[str, Any]]:
        detail = self.detail
        return detail if isinstance(detail, list) else []


class Conflict(AgentServerError):
    """409 without an execution: a session being released, a running execution deleted,
    `cancel_running=false` with running work."""


class Unavailable(AgentServerError):
    """Not answered within `retry_for` seconds of retries: unreachable, shutting down, or
    the shared store unavailable."""


class Busy(Unavailable):
    """Still 429 (`max_inflight` reached) after `retry_for` seconds of retries."""


class WaitTimeout(AgentServerError, TimeoutError):
    """The execution had not ended within the time the caller gave; `execution` is the last
    state seen, when one was seen."""

    def __init__(self, message: str, execution: Execution | None = None) -> None:
        super().__init__(message, body=None if execution is None else execution.json)
        self.execution = execution


class ExecutionError(AgentServerError):
    """An execution that ended other than `succeeded`; `execution` is how it ended."""

    def __init__(self, execution: Execution, message: str, status: int | None = None) -> None:
        super().__init__(message, status=status, body=execution.json)
        self.execution = execution


class ExecutionFailed(ExecutionError):
    """The reasoner raised: `error_type` and `message` name the exception."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        error = execution.error or {}
        self.error_type = str(error.get("type", "Error"))
        self.message = str(error.get("message", ""))
        super().__init__(
            execution,
            f"execution {execution.execution_id} failed: {self.error_type}: {self.message}",
            status,
        )


class ExecutionCancelled(ExecutionError):
    """Cancelled; `reason` is `request`, `session_released`, `shutdown` or
    `client_disconnected`."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        self.reason = execution.status_reason
        super().__init__(
            execution,
            f"execution {execution.execution_id} was cancelled ({self.reason})",
            status,
        )


class ExecutionLost(ExecutionError):
    """The replica that ran it stopped renewing its liveness, and it could not be retried."""

    def __init__(self, execution: Execution, status: int | None = None) -> None:
        message = (execution.error or {}).get("message", "its replica was lost")
        super().__init__(
            execution, f"execution {execution.execution_id} was lost: {message}", status
        )


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return {"detail": response.text[:500]}


def _execution_body(body: Any) -> bool:
    return isinstance(body, dict) and "execution_id" in body and "status" in body


def error_from_response(response: httpx.Response) -> AgentServerError:
    """The typed error for an answer the caller did not ask for."""
    status = response.status_code
    body = _body(response)
    if _execution_body(body):
        execution = Execution.from_json(body)
        if execution.status in TERMINAL and execution.status != "succeeded":
            try:
                execution.outcome()
            except ExecutionError as exc:
                exc.status = status
                return exc
    detail = body.get("detail") if isinstance(body, dict) else body
    shown = detail if isinstance(detail, str) else json.dumps(detail, ensure_ascii=False)
    message = f"{response.request.method} {response.request.url.path}: {status} {shown}"
    kind: type[AgentServerError] = AgentServerError
    if status == 401:
        kind = Unauthorized
    elif status == 404:
        kind = NotFound
    elif status in (400, 413, 415, 422):
        kind = InvalidInput
    elif status == 409:
        kind = Conflict
    elif status == 429:
        kind = Busy
    elif status in (502, 503, 504):
        kind = Unavailable
    return kind(message, status=status, body=body)


# -- the calls, shared by both clients ------------------------------------------------------


@dataclass
class _Send:
    """Send this request; the driver answers with the response or the transport error."""

    method: str
    #: A path under the client's URL, or an absolute URL (a `Link` the server gave).
    path: str
    timeout: httpx.Timeout
    params: Mapping[str, str | list[str]] = field(default_factory=dict)
    body: Any = _NO_BODY
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Sleep:
    seconds: float


_Action = _Send | _Sleep
_Reply = httpx.Response | httpx.TransportError | None
_Flow = Generator[_Action, _Reply, T]

#: Transport errors raised before the request left: a retry can never repeat anything.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return min(float(value), RETRY_AFTER_MAX)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return min(max(0.0, when.timestamp() - time.time()), RETRY_AFTER_MAX)


def _refusal(response: httpx.Response) -> bool:
    """A 429, 502, 503 or 504 that did no work: no execution in its body, and no
    `Location` of one to follow."""
    if response.status_code not in (429, 502, 503, 504) or _followed(response):
        return False
    return not _execution_body(_body(response))


def _followed(response: httpx.Response) -> str | None:
    """The execution a 503 + `Location` points to: a synchronous run whose end is to be
    read there (handed off at shutdown, or not yet recorded in the shared store)."""
    location = response.headers.get("location")
    if response.status_code != 503 or not location:
        return None
    return location.rstrip("/").rsplit("/", 1)[-1] or None


def _backoff(failures: int) -> float:
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0**failures)


class _Retries:
    """One run of consecutive failures of a call, and its bound: retrying stops `retry_for`
    seconds after the first failure. The last wait is cut to what is left, so that a
    `Retry-After` longer than the bound still gets one last try at its end."""

    def __init__(self, retry_for: float) -> None:
        self.retry_for = retry_for
        self.failures = 0
        self.first_failure: float | None = None
        self.last_try = False

    def received(self) -> None:
        """An answer came: the next failure starts a new run."""
        self.failures = 0
        self.first_failure = None
        self.last_try = False

    def delay(self, wanted: float) -> float | None:
        """Seconds to wait before the next try (at most `wanted`), or None when the failure
        just seen ends the retries."""
        self.failures += 1
        now = time.monotonic()
        if self.first_failure is None:
            self.first_failure = now
        left = self.first_failure + self.retry_for - now
        if self.last_try or left <= 0:
            return None
        self.last_try = wanted >= left
        return min(wanted, left)

    def spent(self) -> str:
        assert self.first_failure is not None
        elapsed = time.monotonic() - self.first_failure
        return f"{self.failures} attempts in {elapsed:.1f} s"


class _Calls:
    """Every call as a flow: the requests to send and what their answers mean."""

    def __init__(self, *, timeout: float, retry_for: float) -> None:
        self.timeout = timeout
        self.retry_for = retry_for

    def _timeout(self, read: float | None) -> httpx.Timeout:
        return httpx.Timeout(self.timeout, read=read)

    def request(self, send: _Send, *, resend_after_sending: bool = True) -> _Flow[httpx.Response]:
        """Send, retrying refusals, gateway errors and transport errors for at most
        `retry_for` seconds of consecutive failures. A transport error after the request
        may have left is raised as it is when `resend_after_sending` is False."""
        retries = _Retries(self.retry_for)
        while True:
            reply = yield send
            assert reply is not None
            if isinstance(reply, httpx.Response):
                if not _refusal(reply):
                    return reply
                wanted = _retry_after(reply)
                if wanted is None:
                    wanted = _backoff(retries.failures)
                wanted *= random.uniform(1.0, 1.2)  # callers refused together come back apart
            else:
                if not resend_after_sending and not isinstance(reply, _NOT_SENT):
                    raise reply
                wanted = _backoff(retries.failures) * random.uniform(0.5, 1.0)
            delay = retries.delay(wanted)
            if delay is None:
                if isinstance(reply, httpx.Response):
                    raise error_from_response(reply)
                raise Unavailable(
                    f"{send.method} {send.path}: no answer after {retries.spent()}: "
                    f"{type(reply).__name__}: {reply}"
                ) from reply
            yield _Sleep(delay)

    # -- starts and runs ----------------------------------------------------------------------

    @staticmethod
    def key(given: str | None) -> str:
        """The caller's `Idempotency-Key`, else one for this logical start alone."""
        return uuid.uuid4().hex if given is None else given

    @staticmethod
    def _start_headers(session: str | None, key: str) -> dict[str, str]:
        headers = {"Idempotency-Key": key}
        if session is not None:
            headers["X-Session-ID"] = session
        return headers

    def start(self, name: str, input: Any, session: str | None, key: str) -> _Flow[Execution]:
        send = _Send(
            "POST",
            f"/reasoners/{name}/async",
            self._timeout(self.timeout),
            body=_NO_BODY if input is None else input,
            headers=self._start_headers(session, key),
        )
        response = yield from self.request(send)
        if response.status_code != 202:
            raise error_from_response(response)
        return Execution.from_json(response.json())

    def run(
        self, name: str, input: Any, session: str | None, timeout: float | None, key: str
    ) -> _Flow[Execution]:
        """The execution once ended, whatever its end (the caller turns it into a result)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        send = _Send(
            "POST",
            f"/reasoners/{name}",
            self._timeout(timeout),
            body=_NO_BODY if input is None else input,
            headers=self._start_headers(session, key),
        )
        try:
            response = yield from self.request(send, resend_after_sending=False)
        except httpx.TimeoutException:
            if deadline is not None and time.monotonic() >= deadline - 0.05:
                # The server cancels a synchronous run whose caller left.
                raise WaitTimeout(f"{name} did not end within {timeout:g} s") from None
            execution = yield from self.start(name, input, session, key)
            return (yield from self.wait(execution.execution_id, deadline))
        except httpx.TransportError:
            # It may have started: the same key finds that execution instead of a second one.
            execution = yield from self.start(name, input, session, key)
            return (yield from self.wait(execution.execution_id, deadline))
        followed = _followed(response)
        if followed is not None:  # its end is read where the Location says, not here
            return (yield from self.wait(followed, deadline))
        body = _body(response)
        if not _execution_body(body):
            raise error_from_response(response)
        execution = Execution.from_json(body)
        if execution.is_terminal:
            return execution
        return (yield from self.wait(execution.execution_id, deadline))

    # -- executions ---------------------------------------------------------------------------

    def get(self, execution_id: str, wait: float = 0.0) -> _Flow[Execution]:
        params = {"wait": f"{wait:g}"} if wait > 0 else {}
        send = _Send(
            "GET", f"/executions/{execution_id}", self._timeout(wait + self.timeout), params
        )
        response = yield from self.request(send)
        if response.status_code != 200:
            raise error_from_response(response)
        return Execution.from_json(response.json())

    def wait(self, execution_id: str, deadline: float | None) -> _Flow[Execution]:
        """Long-poll (each poll at most MAX_WAIT seconds) until the execution has ended."""
        while True:
            remaining = MAX_WAIT if deadline is None else deadline - time.monotonic()
            execution = yield from self.get(execution_id, max(0.0, min(MAX_WAIT, remaining)))
            if execution.is_terminal:
                return execution
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"execution {execution_id} is still {execution.status}", execution
                )

    def cancel(self, execution_id: str) -> _Flow[Execution]:
        send = _Send("POST", f"/executions/{execution_id}/cancel", self._timeout(self.timeout))
        response = yield from self.request(send)
        if response.status_code not in (200, 202):
            raise error_from_response(response)
        return Execution.from_json(response.json())

    def forget(self, execution_id: str) -> _Flow[None]:
        send = _Send("DELETE", f"/executions/{execution_id}", self._timeout(self.timeout))
        response = yield from self.request(send)
        if response.status_code != 204:
            raise error_from_response(response)

    def list_first(
        self, status: Statuses, reasoner: str | None, session: str | None, limit: int
    ) -> _Send:
        """The request for the first page: `status` repeated once per status asked for."""
        params: dict[str, str | list[str]] = {"limit": str(limit)}
        if status is not None:
            params["status"] = [status] if isinstance(status, str) else list(status)
        for name, value in (("reasoner", reasoner), ("session_id", session)):
            if value is not None:
                params[name] = value
        return _Send("GET", "/executions", self._timeout(self.timeout), params)

    def list_page(self, send: _Send, follow: bool) -> _Flow[tuple[Executions, _Send | None]]:
        """One page and, to `follow`, the request for the next: the `Link: <...>;
        rel="next"` the server sends while more records match (RFC 8288), None when it
        sends none."""
        response = yield from self.request(send)
        if response.status_code != 200:
            raise error_from_response(response)
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
        return page, _Send("GET", str(url.copy_with(query=None)), send.timeout, params)

    def list(
        self, status: Statuses, reasoner: str | None, session: str | None, limit: int
    ) -> _Flow[Executions]:
        send = self.list_first(status, reasoner, session, limit)
        page, _ = yield from self.list_page(send, follow=False)
        return page

    def reasoners(self) -> _Flow[Reasoners]:
        send = _Send("GET", "/reasoners", self._timeout(self.timeout))
        response = yield from self.request(send)
        if response.status_code != 200:
            raise error_from_response(response)
        return [
            ReasonerInfo(
                name=item["name"],
                description=item.get("description"),
                input_schema=item.get("input_schema", {}),
                output_schema=item.get("output_schema", {}),
            )
            for item in response.json()
        ]

    def release_session(
        self, session_id: str, timeout: float | None, cancel_running: bool
    ) -> _Flow[SessionRelease]:
        params = {
            "timeout": "none" if timeout is None else f"{timeout:g}",
            "cancel_running": "true" if cancel_running else "false",
        }
        read = None if timeout is None else timeout + self.timeout
        send = _Send("DELETE", f"/sessions/{session_id}", self._timeout(read), params)
        response = yield from self.request(send)
        if response.status_code != 200:
            raise error_from_response(response)
        body = response.json()
        return SessionRelease(
            session_id=body["session_id"],
            cancelled=int(body["cancelled"]),
            abandoned=int(body["abandoned"]),
            forgotten=int(body["forgotten"]),
            elapsed_seconds=float(body["elapsed_seconds"]),
        )

    # -- events -------------------------------------------------------------------------------

    def events_send(self, execution_id: str, last_id: int | None, left: float | None) -> _Send:
        """The request for a stream, its timeouts cut to the `left` seconds of the caller's
        deadline, when there is one."""
        headers = {"Accept": "text/event-stream"}
        if last_id is not None:
            headers["Last-Event-ID"] = str(last_id)
        connect, silence = self.timeout, STREAM_SILENCE
        if left is not None:
            connect, silence = min(connect, left), min(silence, left)
        return _Send(
            "GET",
            f"/executions/{execution_id}/events",
            httpx.Timeout(connect, read=silence),
            {},
            headers=headers,
        )


#: Events the stream sends around a reasoner's own: they carry no number.
UNNUMBERED = frozenset({"start", "missed", "end"})


class _Stream:
    """What one reader of an execution's events decides between connections."""

    def __init__(
        self, calls: _Calls, execution_id: str, after: int | None, timeout: float | None
    ) -> None:
        self.calls = calls
        self.execution_id = execution_id
        #: The number of the last event received: where a new connection resumes.
        self.last_id = after
        #: The server's `retry:` hint, in seconds.
        self.retry: float | None = None
        self.retries = _Retries(calls.retry_for)
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

    def send(self) -> _Send:
        return self.calls.events_send(self.execution_id, self.last_id, self.left())

    def take(self, sse: ServerSentEvent) -> Event | None:
        """The event a server-sent event carries (httpx-sse parses the stream), or None for
        a bare `retry:` hint. Its data is JSON; `start`, `missed` and `end` have no number.
        An event that comes after the deadline comes too late: `WaitTimeout`."""
        self.left()
        if sse.retry is not None:
            self.retry = sse.retry / 1000
        if not sse.data:
            return None
        number = None
        if sse.event not in UNNUMBERED and sse.id.isdigit():
            number = self.last_id = int(sse.id)
        try:
            data: Any = json.loads(sse.data)
        except ValueError:
            data = sse.data
        return Event(number, sse.event, data)

    def opened(self, response: httpx.Response) -> None:
        """Raise for an answer that is not a stream (404, 401, ... or retries exhausted)."""
        if response.status_code == 200:
            return
        if not _refusal(response):
            raise error_from_response(response)
        raise _Refused(self.failed(response, _retry_after(response)))

    def received(self) -> None:
        self.retries.received()

    def failed(self, reason: httpx.Response | Exception | None, hint: float | None) -> float:
        """Seconds to wait before resuming (never past the deadline), or the error when
        retries are exhausted; `WaitTimeout` once the deadline has passed (the connection
        cut at it, say)."""
        left = self.left()
        wanted = hint if hint is not None else self.retry
        if wanted is None:
            wanted = _backoff(self.retries.failures)
        delay = self.retries.delay(wanted)
        if delay is None:
            if isinstance(reason, httpx.Response):
                raise error_from_response(reason)
            raise Unavailable(
                f"events of {self.execution_id}: stream lost after {self.retries.spent()}: "
                f"{reason!r}"
            )
        return delay if left is None else min(delay, left)


class _Refused(Exception):
    """A refusal (429/503) to open a stream: wait `delay` seconds and try again."""

    def __init__(self, delay: float) -> None:
        self.delay = delay


def _shut(sock: Any) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def _cut_at(response: httpx.Response, left: float | None) -> Iterator[None]:
    """Shut the stream's connection once `left` seconds have passed, so that a read waiting
    on a quiet stream ends at the caller's deadline: httpx bounds each read, not a whole
    stream. A shut socket ends a blocking and an asyncio read alike, so both clients use
    this; without a socket (another transport) the read timeout, cut to `left`, bounds it."""
    network = response.extensions.get("network_stream")
    sock = None if network is None else network.get_extra_info("socket")
    if left is None or sock is None:
        yield
        return
    timer = threading.Timer(left, _shut, (sock,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # never shut a connection the pool has taken back


# -- the blocking client --------------------------------------------------------------------


def _content(body: Any) -> dict[str, Any]:
    return {} if body is _NO_BODY else {"json": body}


def _headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": "agent-server-client"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class AgentClient:
    """A blocking client. `url` is the server (or the Service in front of its replicas);
    `timeout` bounds connecting and each ordinary answer; `retry_for` bounds the seconds
    spent retrying one call through consecutive failures."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._calls = _Calls(timeout=timeout, retry_for=retry_for)
        self._http = httpx.Client(
            base_url=url.rstrip("/"), headers=_headers(token), transport=transport
        )

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _drive(self, flow: _Flow[T]) -> T:
        try:
            action = next(flow)
            while True:
                reply: _Reply = None
                if isinstance(action, _Sleep):
                    time.sleep(action.seconds)
                else:
                    try:
                        reply = self._http.request(
                            action.method,
                            action.path,
                            params=action.params,
                            **_content(action.body),
                            headers=action.headers,
                            timeout=action.timeout,
                        )
                    except httpx.TransportError as exc:
                        reply = exc
                action = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    def run(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """Run `name` with `input` (a JSON object of its parameters) and return its result,
        or raise the typed error of its end. `timeout` bounds the wait for the end (the
        server then cancels the run: nobody waits for it any more). `idempotency_key` is
        the caller's own key for this run (else one is chosen), sent on every try."""
        execution = self.run_execution(
            name, input, session=session, timeout=timeout, idempotency_key=idempotency_key
        )
        return execution.outcome()

    def run_execution(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        """As `run`, but the ended execution itself, whatever its end."""
        key = self._calls.key(idempotency_key)
        return self._drive(self._calls.run(name, input, session, timeout, key))

    def start(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
    ) -> ExecutionHandle:
        """Start `name` in the background; the handle follows it. A repeat with the same
        `idempotency_key` gets the execution the first one started."""
        key = self._calls.key(idempotency_key)
        execution = self._drive(self._calls.start(name, input, session, key))
        return ExecutionHandle(self, execution)

    def handle(self, execution_id: str) -> ExecutionHandle:
        """A handle on an execution started elsewhere (its state read on first `get`)."""
        return ExecutionHandle(self, Execution(execution_id, "", "unknown"))

    def get(self, execution_id: str) -> Execution:
        return self._drive(self._calls.get(execution_id))

    def wait(self, execution_id: str, timeout: float | None = None) -> Execution:
        deadline = None if timeout is None else time.monotonic() + timeout
        return self._drive(self._calls.wait(execution_id, deadline))

    def cancel(self, execution_id: str) -> Execution:
        return self._drive(self._calls.cancel(execution_id))

    def forget(self, execution_id: str) -> None:
        """Delete a finished execution's record (`Conflict` while it runs)."""
        self._drive(self._calls.forget(execution_id))

    def list(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Executions:
        """One page of executions, newest first, filtered: `status` one or several (any of
        them)."""
        return self._drive(self._calls.list(status, reasoner, session, limit))

    def iter_executions(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Iterator[Execution]:
        """Every execution `list` would filter, page after page (`limit` a page), following
        the server's `Link: rel="next"`; one page when it sends none."""
        send: _Send | None = self._calls.list_first(status, reasoner, session, limit)
        while send is not None:
            page, send = self._drive(self._calls.list_page(send, follow=True))
            yield from page

    def reasoners(self) -> Reasoners:
        return self._drive(self._calls.reasoners())

    def release_session(
        self, session_id: str, timeout: float | None = 30.0, cancel_running: bool = True
    ) -> SessionRelease:
        """Cancel the session's running work, wait for it at most `timeout` seconds (None:
        without bound), and forget the session's records."""
        return self._drive(self._calls.release_session(session_id, timeout, cancel_running))

    def events(
        self, execution_id: str, after: int | None = None, *, timeout: float | None = None
    ) -> Iterator[Event]:
        """The execution's events, live, through its `end` event (whose data is the
        execution); resumed with `Last-Event-ID` after a disconnect. `timeout` bounds the
        whole stream: `WaitTimeout` when it passes before the end (the execution goes on)."""
        stream = _Stream(self._calls, execution_id, after, timeout)
        while True:
            send = stream.send()
            try:
                with (
                    self._http.stream(
                        "GET", send.path, headers=send.headers, timeout=send.timeout
                    ) as response,
                    _cut_at(response, stream.left()),
                ):
                    if response.status_code != 200:
                        response.read()
                        stream.opened(response)
                    for sse in SseEvents(response).iter_sse():
                        event = stream.take(sse)
                        if event is None:
                            continue
                        stream.received()
                        yield event
                        if event.event == "end":
                            return
                delay = stream.failed(None, None)  # closed before its end: resume
            except httpx.TransportError as exc:
                delay = stream.failed(exc, None)
            except _Refused as refused:
                delay = refused.delay
            time.sleep(delay)


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
        """The execution once ended (any end), long-polling; `WaitTimeout` after `timeout`."""
        self.execution = self.client.wait(self.execution_id, timeout)
        return self.execution

    def result(self, timeout: float | None = None) -> Any:
        """Wait, then the result, or the typed error of its end."""
        return self.wait(timeout).outcome()

    def cancel(self) -> Execution:
        self.execution = self.client.cancel(self.execution_id)
        return self.execution

    def events(self, after: int | None = None, *, timeout: float | None = None) -> Iterator[Event]:
        return self.client.events(self.execution_id, after, timeout=timeout)


# -- the async client -----------------------------------------------------------------------


class AsyncAgentClient:
    """The same client for asyncio: every method is a coroutine; `events` an async
    iterator."""

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._calls = _Calls(timeout=timeout, retry_for=retry_for)
        self._http = httpx.AsyncClient(
            base_url=url.rstrip("/"), headers=_headers(token), transport=transport
        )

    async def __aenter__(self) -> AsyncAgentClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _drive(self, flow: _Flow[T]) -> T:
        try:
            action = next(flow)
            while True:
                reply: _Reply = None
                if isinstance(action, _Sleep):
                    await asyncio.sleep(action.seconds)
                else:
                    try:
                        reply = await self._http.request(
                            action.method,
                            action.path,
                            params=action.params,
                            **_content(action.body),
                            headers=action.headers,
                            timeout=action.timeout,
                        )
                    except httpx.TransportError as exc:
                        reply = exc
                action = flow.send(reply)
        except StopIteration as stop:
            result: T = stop.value
            return result

    async def run(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """See `AgentClient.run`."""
        execution = await self.run_execution(
            name, input, session=session, timeout=timeout, idempotency_key=idempotency_key
        )
        return execution.outcome()

    async def run_execution(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        timeout: float | None = None,
        idempotency_key: str | None = None,
    ) -> Execution:
        key = self._calls.key(idempotency_key)
        return await self._drive(self._calls.run(name, input, session, timeout, key))

    async def start(
        self,
        name: str,
        input: Any = None,
        *,
        session: str | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncExecutionHandle:
        key = self._calls.key(idempotency_key)
        execution = await self._drive(self._calls.start(name, input, session, key))
        return AsyncExecutionHandle(self, execution)

    def handle(self, execution_id: str) -> AsyncExecutionHandle:
        return AsyncExecutionHandle(self, Execution(execution_id, "", "unknown"))

    async def get(self, execution_id: str) -> Execution:
        return await self._drive(self._calls.get(execution_id))

    async def wait(self, execution_id: str, timeout: float | None = None) -> Execution:
        deadline = None if timeout is None else time.monotonic() + timeout
        return await self._drive(self._calls.wait(execution_id, deadline))

    async def cancel(self, execution_id: str) -> Execution:
        return await self._drive(self._calls.cancel(execution_id))

    async def forget(self, execution_id: str) -> None:
        await self._drive(self._calls.forget(execution_id))

    async def list(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> Executions:
        return await self._drive(self._calls.list(status, reasoner, session, limit))

    async def iter_executions(
        self,
        status: Statuses = None,
        reasoner: str | None = None,
        session: str | None = None,
        limit: int = 100,
    ) -> AsyncIterator[Execution]:
        """See `AgentClient.iter_executions`."""
        send: _Send | None = self._calls.list_first(status, reasoner, session, limit)
        while send is not None:
            page, send = await self._drive(self._calls.list_page(send, follow=True))
            for execution in page:
                yield execution

    async def reasoners(self) -> Reasoners:
        return await self._drive(self._calls.reasoners())

    async def release_session(
        self, session_id: str, timeout: float | None = 30.0, cancel_running: bool = True
    ) -> SessionRelease:
        return await self._drive(self._calls.release_session(session_id, timeout, cancel_running))

    async def events(
        self, execution_id: str, after: int | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Event]:
        """See `AgentClient.events`."""
        stream = _Stream(self._calls, execution_id, after, timeout)
        while True:
            send = stream.send()
            try:
                async with self._http.stream(
                    "GET", send.path, headers=send.headers, timeout=send.timeout
                ) as response:
                    with _cut_at(response, stream.left()):
                        if response.status_code != 200:
                            await response.aread()
                            stream.opened(response)
                        async for sse in SseEvents(response).aiter_sse():
                            event = stream.take(sse)
                            if event is None:
                                continue
                            stream.received()
                            yield event
                            if event.event == "end":
                                return
                delay = stream.failed(None, None)
            except httpx.TransportError as exc:
                delay = stream.failed(exc, None)
            except _Refused as refused:
                delay = refused.delay
            await asyncio.sleep(delay)


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

    async def cancel(self) -> Execution:
        self.execution = await self.client.cancel(self.execution_id)
        return self.execution

    def events(
        self, after: int | None = None, *, timeout: float | None = None
    ) -> AsyncIterator[Event]:
        return self.client.events(self.execution_id, after, timeout=timeout)
