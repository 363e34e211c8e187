"""The history of a fault run: every HTTP exchange (recorded by the clients' transport),
every logical call, every nemesis action and note, on one clock."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "lost"})


@dataclass(frozen=True)
class Exchange:
    """One HTTP request and what came back (or the transport error instead)."""

    client: str
    op: str  # run, start, get, wait, cancel, other
    method: str
    path: str
    key: str | None  # the request's Idempotency-Key
    execution_id: str | None  # from the path or the answer's execution
    invoked: float
    answered: float
    status: int | None  # HTTP status; None: no answer (error says why)
    error: str | None = None
    body_status: str | None = None  # the execution's, when the answer is an execution
    attempt: int | None = None
    replica: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    text: str = ""  # the start of a body that is not an execution
    delay: float | None = None  # a start's `?delay=`
    session: str | None = None  # a start's X-Session-ID

    @property
    def is_execution(self) -> bool:
        return self.body_status is not None

    def describe(self) -> str:
        if self.status is None:
            outcome = f"no answer ({self.error})"
        elif self.is_execution:
            outcome = f"{self.status} {self.body_status}@{self.attempt} on {self.replica or '-'}"
            if self.error_type:
                outcome += f" [{self.error_type}: {(self.error_message or '')[:80]}]"
        else:
            outcome = f"{self.status} {self.text[:80]!r}"
        return (
            f"t={self.invoked:.3f}-{self.answered:.3f} {self.client} {self.method} {self.path}"
            f" -> {outcome}"
        )


@dataclass(frozen=True)
class Call:
    """One logical client operation (a run, a start and its wait, a cancel) and its outcome."""

    client: str
    op: str
    reasoner: str
    execution_id: str | None
    invoked: float
    answered: float
    outcome: str  # the execution's status, or the exception
    failed: bool = False  # the client raised something other than a wait timeout


@dataclass(frozen=True)
class NemesisEvent:
    time: float
    #: A fault's kind, `start` (a replica replaced), `heal`, or `unreplicated` (a span with
    #: no Redis replica in sync: its begin and end).
    kind: str
    target: str  # a replica id, "redis" or "proxy"
    phase: str  # begin, end, note
    detail: str = ""


@dataclass(frozen=True)
class Note:
    """Something the harness saw that is not an HTTP exchange (a replica not ready again)."""

    time: float
    kind: str
    detail: str


class History:
    """Every exchange, call and nemesis action of one run, on one clock (seconds from its
    start). Appended to from many threads."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        #: The wall clock at t=0, to place the replicas' log lines and records' times.
        self.wall0 = time.time()
        self._lock = threading.Lock()
        self.exchanges: list[Exchange] = []
        self.calls: list[Call] = []
        self.nemesis: list[NemesisEvent] = []
        self.notes: list[Note] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    def add(self, item: Exchange | Call | NemesisEvent | Note) -> None:
        with self._lock:
            if isinstance(item, Exchange):
                self.exchanges.append(item)
            elif isinstance(item, Call):
                self.calls.append(item)
            elif isinstance(item, NemesisEvent):
                self.nemesis.append(item)
            else:
                self.notes.append(item)

    def nemesis_event(self, kind: str, target: str, phase: str, detail: str = "") -> None:
        self.add(NemesisEvent(self.now(), kind, target, phase, detail))

    def note(self, kind: str, detail: str) -> None:
        self.add(Note(self.now(), kind, detail))


_EXECUTION_PATH = re.compile(r"^/executions/([0-9a-f]{32})(/cancel|/input)?$")
REASONER_PATH = re.compile(r"^/reasoners/([^/]+)(/async)?$")


def _op(method: str, path: str, params: httpx.QueryParams) -> tuple[str, str | None]:
    """The operation a request is, and the execution its path names."""
    found = _EXECUTION_PATH.match(path)
    if found is not None:
        if found.group(2):
            return found.group(2)[1:], found.group(1)
        return ("wait" if "wait" in params else "get"), found.group(1)
    found = REASONER_PATH.match(path)
    if found is not None and method == "POST":
        return ("start" if found.group(2) else "run"), None
    return "other", None


class RecordingTransport(httpx.BaseTransport):
    """httpx's own transport, with every exchange written to the history."""

    def __init__(self, history: History, client: str) -> None:
        self._inner = httpx.HTTPTransport()
        self.history = history
        self.client = client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        op, execution_id = _op(request.method, request.url.path, request.url.params)
        base = {
            "client": self.client,
            "op": op,
            "method": request.method,
            "path": request.url.path,
            "key": request.headers.get("idempotency-key"),
            "invoked": self.history.now(),
            "delay": float(request.url.params["delay"]) if "delay" in request.url.params else None,
            "session": request.headers.get("x-session-id"),
        }
        try:
            response = self._inner.handle_request(request)
            response.read()
        except httpx.TransportError as exc:
            self.history.add(
                Exchange(
                    **base,
                    execution_id=execution_id,
                    answered=self.history.now(),
                    status=None,
                    error=type(exc).__name__,
                )
            )
            raise
        answered = self.history.now()
        body = execution_of(response)
        if body is None:
            # A 503 + Location (an end not yet recorded, a fenced attempt) names its
            # execution without giving its status: it began then, and nothing was told.
            location = response.headers.get("location", "")
            if response.status_code == 503 and location.startswith("/executions/"):
                execution_id = location.rsplit("/", 1)[-1]
            self.history.add(
                Exchange(
                    **base,
                    execution_id=execution_id,
                    answered=answered,
                    status=response.status_code,
                    text=response.content[:300].decode(errors="replace"),
                )
            )
        else:
            error = body.get("error") or {}
            self.history.add(
                Exchange(
                    **base,
                    execution_id=str(body["execution_id"]),
                    answered=answered,
                    status=response.status_code,
                    body_status=str(body["status"]),
                    attempt=int(body.get("attempt") or 1),
                    replica=body.get("replica"),
                    error_type=error.get("type") if isinstance(error, dict) else None,
                    error_message=error.get("message") if isinstance(error, dict) else None,
                )
            )
        return response

    def close(self) -> None:
        self._inner.close()


def execution_of(response: httpx.Response) -> dict[str, Any] | None:
    """The execution an answer carries, if it is one."""
    if "json" not in response.headers.get("content-type", ""):
        return None
    try:
        body = json.loads(response.content)
    except ValueError:
        return None
    if isinstance(body, dict) and "execution_id" in body and "status" in body:
        return body
    return None
