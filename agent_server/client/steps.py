"""The steps a call of the client takes, as values: what `Core`'s calls yield and the
fronts (sync.py, aio.py) carry out, the request to `Send` built here once for both.

A call is a generator: it yields the steps to take (`Send` a request, `Sleep`, and for a
stream `Open`, `Read`, `Chunk`, `Close`) and is sent back what happened (the response, the
transport error, the text). A call that gives many items yields each as `Emit`.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx

from agent_server.client.models import error_from_response

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


def as_response(reply: Reply) -> httpx.Response | httpx.TransportError:
    assert isinstance(reply, httpx.Response | httpx.TransportError), reply
    return reply


def as_text(reply: Reply) -> str | httpx.TransportError | None:
    assert not isinstance(reply, httpx.Response), reply
    return reply


def checked(response: httpx.Response, *expected: int) -> httpx.Response:
    if response.status_code not in expected:
        raise error_from_response(response)
    return response
