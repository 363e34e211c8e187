"""Execution: the record of one run of a reasoner, and the moves that change it.

Its fields are declared in record.py, which makes its slots, `__init__`, `restore` and
`to_json`; what only the replica running it holds is live.py's; what the reasoner sees is
context.py's `ExecutionContext`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from agent_server.model import record
from agent_server.model.events import EventLog
from agent_server.model.ids import new_execution_id
from agent_server.model.live import INITIAL, LiveState
from agent_server.model.names import scoped
from agent_server.model.status import (
    END_OF,
    TERMINAL,
    Transition,
    appended,
    how_of,
    kept_move,
    move,
    shown_status,
    unowned,
)
from agent_server.model.status import CancelReason as CancelReason  # its home is status.py
from agent_server.model.status import ExecutionStatus as ExecutionStatus  # its home is status.py
from agent_server.model.versions import Rule


def log_fields(execution: Execution) -> dict[str, Any]:
    """What a JSON log line about `execution` carries as fields (agent_server/runtime/logs.py)."""
    fields: dict[str, Any] = {
        "execution_id": execution.execution_id,
        "reasoner": execution.reasoner,
        "attempt": execution.attempt,
        "replica": execution.replica,
    }
    if execution.session_id is not None:
        fields["session_id"] = execution.session_id
    if execution.owner is not None:
        fields["identity"] = execution.owner
        fields["tenant"] = execution.tenant
    return fields


class Execution(LiveState):
    """One execution. Slots keep the per-execution memory small: a server holds many.

    The replica that runs it holds the live object; a shared store hands other replicas
    copies made by `restore`, which carry the recorded duration instead of clock readings.
    Each field record.py declares is a slot here, typed below (an import-time check holds
    the two to the same names).
    """

    __slots__ = tuple(f.slot for f in record.HELD)

    #: The record's fields a move clears (status.py `move`), as this object holds them empty.
    #: Not `replica`: this object stays its attempt's view, whose owner fences the writes it
    #: still owes (a hand-off, a late end); its JSON shows '' while queued (record.py).
    CLEARED: ClassVar[Mapping[str, object]] = {
        "input_request": None,
        "asking": 0,
        "scheduled_at": None,
    }

    execution_id: str
    reasoner: str
    session_id: str | None
    status: ExecutionStatus
    status_reason: CancelReason | None
    result: Any
    error: dict[str, str] | None
    created_at: float
    finished_at: float | None
    _duration: float | None
    replica: str
    attempt: int
    #: While `input_required`: what it asks (the record's `input_request`).
    input_request: dict[str, Any] | None
    #: While queued for a time: when it is due (a Unix time), else None.
    scheduled_at: float | None
    abandoned: bool
    #: The identity that started it and its tenant; None without authentication.
    owner: str | None
    tenant: str | None
    #: The schedule whose firing started it, else None (docs/schedules.md).
    schedule_id: str | None
    #: The version of the code that ran its latest attempt (docs/durable.md, "Versions").
    version: str | None
    #: The request body (a later attempt, or a first run elsewhere, binds its arguments
    #: again; None for none); resumable executions only: the last checkpoint (JSON text) and
    #: how many attempts an owner's death may cost (None and 1 for the others).
    body: Any
    max_attempts: int
    checkpoint: str | None
    #: The requests its reasoner had asked by its last checkpoint: a later attempt's asks
    #: are numbered on from it (those it replays are the ones after it).
    checkpoint_asks: int
    #: The version of the code that wrote the last checkpoint.
    checkpoint_version: str | None
    #: Where its webhook deliveries go (X-Webhook-URL or --webhook-url), None for none.
    webhook_url: str | None
    #: With traces on: the `traceparent` of the request that started it (not shown), so
    #: every attempt joins that trace (agent_server/runtime/tracing.py).
    trace: str | None
    #: Its reasoner's concurrency limit: the key value whose slots it takes (None: no
    #: limit) and how many attempts of that key may run at once.
    concurrency_key: str | None
    concurrency_limit: int

    if TYPE_CHECKING:

        def __init__(
            self, reasoner: str, session_id: str | None, replica: str = "", attempt: int = 1
        ) -> None:
            """A new execution, running under `replica`."""

    else:  # made from record.py's declaration, with the live state's initial values
        __init__ = record.assigner(
            "__init__",
            "self, reasoner, session_id, replica='', attempt=1",
            {
                "execution_id": "new_execution_id()",
                "reasoner": "reasoner",
                "session_id": "session_id",
                "status": "RUNNING",
                "created_at": "time()",
                "replica": "replica",
                "attempt": "attempt",
                **INITIAL,
            },
            {
                "new_execution_id": new_execution_id,
                "RUNNING": ExecutionStatus.RUNNING,
                "time": time.time,
                "monotonic": time.monotonic,
                "NO_RULE": Rule.NONE,
            },
        )

    if TYPE_CHECKING:

        @classmethod
        def restore(cls, **row: Any) -> Execution:
            """A copy of a record read from a store (what another replica sees): each field
            of record.FIELDS by name, the others at their declared defaults."""

    else:  # made from record.py's declaration: the row's fields, every other slot's default
        restore = classmethod(
            record.assigner(
                "restore",
                "cls, *, "
                + ", ".join(
                    f.name if f.default is record.REQUIRED else f"{f.name}={f.default!r}"
                    for f in record.FIELDS
                ),
                {
                    **{f.slot: f.name for f in record.FIELDS},
                    **INITIAL,
                    "cancel_reason": "status_reason",
                    "started_monotonic": "0.0",
                },
                {"NO_RULE": Rule.NONE},
                new=True,
            )
        )

    @property
    def session_name(self) -> str | None:
        """Its session as the stores key it: the session id, its tenant's (names.py)."""
        session_id = self.session_id
        return None if session_id is None else scoped(self.tenant, session_id)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_monotonic is None:
            return self._duration
        return self.finished_monotonic - self.started_monotonic

    def event_log(self, keep: int = 1) -> EventLog:
        """Its event log; made with room for `keep` events if it has none yet, or given that
        room if it has less: a reader of a queued execution (SSE, A2A, MCP) may make it
        before its attempt does, and must not leave it keeping one event."""
        if self.events is None:
            self.events = EventLog(keep)
        elif keep > self.events.keep:
            self.events.widen(keep)
        return self.events

    def mark_queued(self) -> None:
        """Handed off: the next attempt runs on another replica; this object stays this
        attempt's view (its end, if it comes, is fenced). Wakes local waiters: a
        synchronous caller answers 503 with the execution's Location."""
        source = shown_status(self.status, self.replica)
        move(self, Transition.HAND_OFF, ExecutionStatus.QUEUED)
        self._kept(Transition.HAND_OFF, source, ExecutionStatus.QUEUED, self.version)
        self.moved_away = True
        if self._done is not None:
            self._done.set()
        if self.events is not None:
            self.events.wake()

    def enqueue(self, scheduled_at: float | None) -> None:
        """Created queued rather than running (a delayed start, or a full server that
        queues): due at `scheduled_at` (None: as soon as a replica has room)."""
        move(self, Transition.ENQUEUE, ExecutionStatus.QUEUED)
        self.replica = ""  # created queued: nobody owns it
        self.scheduled_at = scheduled_at

    def retry(self, scheduled_at: float, moved_away: bool) -> None:
        """The attempt failed and its policy runs it again: queued, due at `scheduled_at`,
        as the next attempt. `moved_away` (a shared store): whichever replica takes it runs
        it, so this object's waiters are woken to follow the store."""
        source = shown_status(self.status, self.replica)
        move(self, Transition.RETRY, ExecutionStatus.QUEUED)
        self._kept(Transition.RETRY, source, ExecutionStatus.QUEUED, self.version)
        self.attempt += 1
        self.scheduled_at = scheduled_at
        self.moved_away = moved_away
        if moved_away:
            self._wake()
        if self.events is not None:
            self.events.wake()

    def claim(self, replica: str) -> None:
        """Taken from the queue (the memory store's, where the record is this object)."""
        move(self, Transition.CLAIM, ExecutionStatus.RUNNING)
        self.replica = replica
        self._kept(Transition.CLAIM, ExecutionStatus.QUEUED, ExecutionStatus.RUNNING, None)

    def cancel_queued(self, reason: CancelReason) -> None:
        """Cancelled while queued: nobody runs it, so it ends where it waited."""
        move(self, Transition.CANCEL_QUEUED, ExecutionStatus.CANCELLED)
        self.status_reason = reason
        self.cancel_reason = reason
        self.finished_at = time.time()
        self.finished_monotonic = time.monotonic()
        self.principal = None  # its claims are not kept with a retained record
        if self._done is not None:
            self._done.set()
        if self.events is not None:
            self.events.wake()

    def finish(
        self,
        status: ExecutionStatus,
        *,
        result: Any = None,
        error: dict[str, str] | None = None,
        reason: CancelReason | None = None,
    ) -> None:
        """Record the terminal state once and wake every waiter: from `running` (its
        attempt's end), or from `queued` for an attempt handed off that ended after all
        (LATE_END; the store fences its end)."""
        late = self.status is ExecutionStatus.QUEUED
        move(self, Transition.LATE_END if late else END_OF[status], status)
        self.result = result
        self.error = error
        self.status_reason = reason
        self.finished_at = time.time()
        self.finished_monotonic = time.monotonic()
        self.principal = None  # its claims are not kept with a retained record
        if self._done is not None:
            self._done.set()
        if self.events is not None:
            self.events.wake()

    def leave(self) -> None:
        """Parked: its owner's task ends and nobody owns it (as its record now says), so a
        local reader knows to look for it elsewhere."""
        self.replica = ""

    @property
    def owned_by_nobody(self) -> bool:
        """Queued, or parked (status.py): a cancel ends it where it waits, since no task runs
        it."""
        return unowned(self.status, self.replica)

    def ask(self, request: dict[str, Any]) -> None:
        """Its reasoner waits for input (`request` is the record's `input_request`, already
        in the store): wakes local waiters that return at `input_required` (a synchronous
        caller answers 202, a long-poll returns)."""
        move(self, Transition.ASK, ExecutionStatus.INPUT_REQUIRED)
        self._kept(Transition.ASK, ExecutionStatus.RUNNING, self.status, self.version)
        self.input_request = request
        self._wake()

    def take_answer(self, request_id: int | None, value: Any) -> bool:
        """Hand `value` to the `ctx.ask` waiting here, if it waits for that request (None:
        the pending one); it goes on `running`. False when nothing here waits for it (never
        asked, answered already, timed out or cancelled): exactly one answer per request."""
        waiter = self.answer_waiter
        if waiter is None or waiter.done() or not self.asking:
            return False
        if request_id is not None and request_id != self.asking:
            return False
        if self.status is ExecutionStatus.INPUT_REQUIRED:
            move(self, Transition.ANSWER, ExecutionStatus.RUNNING)
            self._kept(Transition.ANSWER, ExecutionStatus.INPUT_REQUIRED, self.status, None)
        elif self.status is not ExecutionStatus.RUNNING:
            return False
        else:  # running: its answer came in before ask() (the store's reply) did
            self.input_request = None
            self.asking = 0
        waiter.set_result(value)
        return True

    def stop_waiting(self) -> None:
        """Nothing here waits for an answer any more (`ctx.ask` returned or raised)."""
        self.answer_waiter = None
        self.input_adapter = None
        self.asking = 0

    def resume(self) -> None:
        """The ask ended unanswered (its timeout, or its task cancelled): running again."""
        move(self, Transition.RESUME, ExecutionStatus.RUNNING)
        self._kept(Transition.RESUME, ExecutionStatus.INPUT_REQUIRED, self.status, None)

    def _kept(self, transition: Transition, source: str, target: str, version: str | None) -> None:
        """A move into its history (status.py `kept_move`): the memory store's, whose record
        is this object; a shared store's scripts and statements keep the record's own."""
        how = how_of(transition, source, target)
        entry = kept_move(time.time(), source, target, self.attempt, self.replica, version, how)
        self.moves = appended(self.moves, entry)

    def _wake(self) -> None:
        """Wake the waiters of now without keeping the flag set: the execution goes on."""
        if self._done is not None:
            self._done.set()
            self._done = None

    def reached_end(self, asked: bool = False) -> bool:
        """Terminal, or (with `asked`) waiting for input: where a read of the store stops
        waiting."""
        return self.status in TERMINAL or (asked and self.status is ExecutionStatus.INPUT_REQUIRED)

    def reached(self, asked: bool = False) -> bool:
        """Terminal, queued where this object no longer follows it (handed off, or retried
        through a shared store), or (with `asked`) waiting for input. A queued execution
        this process will run (the memory store's queue) is waited for to its end."""
        status = self.status
        return (
            status in TERMINAL
            or (status is ExecutionStatus.QUEUED and self.moved_away)
            or (asked and status is ExecutionStatus.INPUT_REQUIRED)
        )

    async def wait(self, timeout: float | None, asked: bool = False) -> bool:
        """Wait until terminal (or handed off; with `asked`, or waiting for input) or
        `timeout` seconds pass; True when so."""
        if self.reached(asked):
            return True
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        try:
            async with asyncio.timeout_at(deadline):
                while not self.reached(asked):
                    if self._done is None:
                        self._done = asyncio.Event()
                    await self._done.wait()
        except TimeoutError:
            return self.reached(asked)
        return True

    #: The one execution shape every route returns, made from its fields' declaration
    #: (agent_server/model/record.py).
    to_json: ClassVar[Callable[[Execution], dict[str, Any]]] = record.json_maker()


_typed = set(Execution.__annotations__) - {"to_json", "CLEARED"}
if _typed != {f.slot for f in record.HELD}:
    raise RuntimeError(
        "Execution must type each field of agent_server/model/record.py: "
        f"{sorted(_typed ^ {f.slot for f in record.HELD})}"
    )


#: The longest duration any setting (or duration parameter of a request) takes: a year. Past
#: it a value is refused at start (exit 2, naming the flag) rather than failing later where
#: it is used: the watchdog's timer (at most threading.TIMEOUT_MAX), Redis TTLs in ms, the
#: event loop's clock.
MAX_SECONDS = 365 * 86_400.0
#: Characters of an exception's message an execution's `error` keeps (and a log line shows).
MAX_ERROR_MESSAGE = 8192


def exception_text(exc: BaseException) -> str:
    """An exception's message, taken safely: a reasoner's exception whose `__str__` raises
    (or returns something that is not text) must still end its execution `failed`. Falls
    back to `repr`, then to a placeholder; cut to MAX_ERROR_MESSAGE characters."""
    for render in (str, repr):
        try:
            text = render(exc)
        except Exception:
            continue
        if isinstance(text, str):
            return text if len(text) <= MAX_ERROR_MESSAGE else text[:MAX_ERROR_MESSAGE] + "..."
    return f"<{type(exc).__name__} whose message cannot be shown>"


def error_of(exc: BaseException) -> dict[str, str]:
    """The `error` of an execution that failed with `exc`."""
    return {"type": type(exc).__name__, "message": exception_text(exc)}
