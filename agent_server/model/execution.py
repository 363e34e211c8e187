"""Execution: the record of one run of a reasoner, and the context the reasoner sees."""

from __future__ import annotations

import asyncio
import functools
import math
import os
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, Protocol

from pydantic import TypeAdapter

from agent_server.model import asks, jsoncodec, record
from agent_server.model.asks import Found, Question, Reply
from agent_server.model.events import Event, EventLog, encode_data
from agent_server.model.status import END_OF, TERMINAL, Transition, move, unowned
from agent_server.model.status import CancelReason as CancelReason  # its home is status.py
from agent_server.model.status import ExecutionStatus as ExecutionStatus  # its home is status.py


class RandomIds:
    """Random UUID 4s as 32 hex digits: unguessable and unique across restarts.

    The same values as `uuid.uuid4().hex`, from `os.urandom` read 4 KiB at a time: one system
    call per 256 ids instead of one per id (bench/RESULTS.md).
    """

    __slots__ = ("_next", "_pool")

    POOL_BYTES = 4096

    def __init__(self) -> None:
        self._pool = bytearray()
        self._next = 0

    def new(self) -> str:
        start = self._next
        if start + 16 > len(self._pool):
            self._pool = bytearray(os.urandom(self.POOL_BYTES))
            start = 0
        self._next = start + 16
        raw = self._pool[start : start + 16]
        raw[6] = raw[6] & 0x0F | 0x40  # version 4
        raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
        return raw.hex()

    def discard(self) -> None:
        """Forget the pooled bytes: a forked child must not hand out its parent's ids."""
        self._pool = bytearray()
        self._next = 0


#: One pool per process, like the operating system's random source it draws on.
_ids = RandomIds()
os.register_at_fork(after_in_child=_ids.discard)


def new_execution_id() -> str:
    return _ids.new()


def _isoformat(timestamp: float) -> str:
    """`datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")`, the same
    characters (microseconds rounded half to even), cheaper: every response that carries an
    execution formats two of these, mostly within the same few seconds (bench/RESULTS.md)."""
    fraction, whole = math.modf(timestamp)
    micros = round(fraction * 1e6)
    if micros >= 1_000_000:
        whole += 1
        micros -= 1_000_000
    return "%s.%06dZ" % (_whole_second(int(whole)), micros)  # noqa: UP031 - faster than f"{}"


@functools.lru_cache(maxsize=64)
def _whole_second(seconds: int) -> str:
    return "%04d-%02d-%02dT%02d:%02d:%02d" % time.gmtime(seconds)[:6]  # noqa: UP031


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
    return fields


class Execution:
    """One execution. Slots keep the per-execution memory small: a server holds many.

    The replica that runs it holds the live object; a shared store hands other replicas
    copies made by `restore`, which carry the recorded duration instead of clock readings.
    """

    __slots__ = (
        "_done",
        "_duration",
        "abandoned",
        "answer_waiter",
        "asking",
        "attempt",
        "body",
        "cancel_reason",
        "checkpoint",
        "checkpoint_asks",
        "concurrency_key",
        "concurrency_limit",
        "created_at",
        "displaced",
        "error",
        "events",
        "execution_id",
        "finished_at",
        "finished_monotonic",
        "input_adapter",
        "input_request",
        "ledger",
        "max_attempts",
        "moved_away",
        "reasoner",
        "recorded",
        "replica",
        "result",
        "resumable",
        "scheduled_at",
        "session_id",
        "session_policy",
        "started_monotonic",
        "status",
        "status_reason",
        "trace",
        "webhook_url",
    )

    #: The record's fields a move clears (status.py `move`), as this object holds them empty.
    #: Not `replica`: this object stays its attempt's view, whose owner fences the writes it
    #: still owes (a hand-off, a late end); its JSON shows '' while queued (record.py).
    CLEARED: ClassVar[Mapping[str, object]] = {
        "input_request": None,
        "asking": 0,
        "scheduled_at": None,
    }

    def __init__(
        self, reasoner: str, session_id: str | None, replica: str = "", attempt: int = 1
    ) -> None:
        self.execution_id = new_execution_id()
        self.reasoner = reasoner
        self.session_id = session_id
        self.replica = replica
        self.attempt = attempt
        self.status = ExecutionStatus.RUNNING
        self.status_reason: CancelReason | None = None
        self.cancel_reason: CancelReason | None = None
        self.result: Any = None
        self.error: dict[str, str] | None = None
        self.created_at = time.time()
        self.started_monotonic = time.monotonic()
        self.finished_at: float | None = None
        self.finished_monotonic: float | None = None
        self._duration: float | None = None
        self.abandoned = False
        #: While `input_required`: what it asks (the record's `input_request`), and, on the
        #: replica whose task waits in `ctx.ask`, the future its answer completes and the
        #: type the answer is validated against (None: any JSON).
        self.input_request: dict[str, Any] | None = None
        self.answer_waiter: asyncio.Future[Any] | None = None
        self.input_adapter: TypeAdapter[Any] | None = None
        #: The id of the request `ctx.ask` waits for here (0: none), set before the store
        #: records it: an answer may come back before the store's reply does.
        self.asking = 0
        #: The memory store's record of its requests (identity, kept answer), None until
        #: it first asks and once it ends; a shared store keeps them in the record instead.
        self.ledger: asks.Ledger | None = None
        #: Resumable executions only: the request body (to bind a later attempt's arguments
        #: again), the last checkpoint (JSON text) and how many attempts an owner's death
        #: may cost. None, None, 1 for the others.
        self.resumable = False
        self.body: Any = None
        self.checkpoint: str | None = None
        #: The requests its reasoner had asked by its last checkpoint: a later attempt's
        #: asks are numbered on from it (those it replays are the ones after it).
        self.checkpoint_asks = 0
        self.max_attempts = 1
        #: Where its webhook deliveries go (X-Webhook-URL or --webhook-url), None for none:
        #: kept by the store, never shown in its JSON (a URL may carry a receiver's token).
        self.webhook_url: str | None = None
        #: While queued for a time: when it is due (a Unix time), else None.
        self.scheduled_at: float | None = None
        #: Its reasoner's concurrency limit: the key value whose slots it takes (None: no
        #: limit) and how many attempts of that key may run at once.
        self.concurrency_key: str | None = None
        self.concurrency_limit = 0
        #: Its start's session policy when not `parallel` (agent_server.model.scheduling), and
        #: the earlier executions of its session the store found it must interrupt.
        self.session_policy: str | None = None
        self.displaced: tuple[str, ...] = ()
        #: Queued where another replica may take it (handed off, or retried through a
        #: shared store): this object no longer follows it, and its waiters read the store.
        self.moved_away = False
        #: Its live events (agent_server.model.events), made when first needed.
        self.events: EventLog | None = None
        self._done: asyncio.Event | None = None
        #: With a shared store, done once its end is written there (True) or refused
        #: (False): a client is told a terminal status only once it is recorded.
        self.recorded: asyncio.Future[bool] | None = None
        #: With traces on: the `traceparent` of the request that started it, kept with the
        #: record (not shown), so every attempt joins that trace (agent_server/runtime/tracing.py).
        self.trace: str | None = None

    @classmethod
    def restore(
        cls,
        execution_id: str,
        reasoner: str,
        session_id: str | None,
        *,
        replica: str,
        attempt: int,
        status: ExecutionStatus,
        created_at: float,
        status_reason: CancelReason | None = None,
        result: Any = None,
        error: dict[str, str] | None = None,
        finished_at: float | None = None,
        duration_seconds: float | None = None,
        abandoned: bool = False,
        input_request: dict[str, Any] | None = None,
        scheduled_at: float | None = None,
    ) -> Execution:
        """A copy of a record read from a store: what another replica sees."""
        execution = cls.__new__(cls)
        execution.execution_id = execution_id
        execution.reasoner = reasoner
        execution.session_id = session_id
        execution.replica = replica
        execution.attempt = attempt
        execution.status = status
        execution.status_reason = status_reason
        execution.cancel_reason = status_reason
        execution.result = result
        execution.error = error
        execution.created_at = created_at
        execution.started_monotonic = 0.0
        execution.finished_at = finished_at
        execution.finished_monotonic = None
        execution._duration = duration_seconds
        execution.abandoned = abandoned
        execution.input_request = input_request
        execution.answer_waiter = None
        execution.input_adapter = None
        execution.asking = 0
        execution.ledger = None
        execution.resumable = False
        execution.body = None
        execution.checkpoint = None
        execution.max_attempts = 1
        execution.webhook_url = None
        execution.scheduled_at = scheduled_at
        execution.concurrency_key = None
        execution.concurrency_limit = 0
        execution.session_policy = None
        execution.displaced = ()
        execution.moved_away = False
        execution.events = None
        execution._done = None
        execution.recorded = None
        execution.trace = None
        return execution

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def duration_seconds(self) -> float | None:
        if self.finished_monotonic is None:
            return self._duration
        return self.finished_monotonic - self.started_monotonic

    def event_log(self, keep: int = 1) -> EventLog:
        """Its event log; made with room for `keep` events if it has none yet."""
        if self.events is None:
            self.events = EventLog(keep)
        return self.events

    def mark_queued(self) -> None:
        """Handed off: the next attempt runs on another replica; this object stays this
        attempt's view (its end, if it comes, is fenced). Wakes local waiters: a
        synchronous caller answers 503 with the execution's Location."""
        move(self, Transition.HAND_OFF, ExecutionStatus.QUEUED)
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
        move(self, Transition.RETRY, ExecutionStatus.QUEUED)
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

    def cancel_queued(self, reason: CancelReason) -> None:
        """Cancelled while queued: nobody runs it, so it ends where it waited."""
        move(self, Transition.CANCEL_QUEUED, ExecutionStatus.CANCELLED)
        self.status_reason = reason
        self.cancel_reason = reason
        self.finished_at = time.time()
        self.finished_monotonic = time.monotonic()
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
    to_json: ClassVar[Callable[[Execution], dict[str, Any]]] = record.json_maker(_isoformat)


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


class CheckpointTooLarge(ValueError):
    """A checkpoint's JSON is over `--max-checkpoint-size` bytes."""


class StaleAttempt(RuntimeError):
    """This attempt no longer owns its execution (a newer attempt runs it, or it was lost):
    its checkpoints and its end are refused."""


#: Writes a checkpoint's JSON for an execution (fenced by owner and attempt).
CheckpointWriter = Callable[["Execution", str], Awaitable[None]]
#: Told of each event an execution emits (the shared store, metrics).
EmitObserver = Callable[["Execution", Event], None]
#: Event names travel on an `event:` line of a stream.
EVENT_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
#: Names the stream itself uses around a reasoner's events (`input_required` is sent by
#: `ctx.ask`).
RESERVED_EVENTS = frozenset({"start", "missed", "end", ExecutionStatus.INPUT_REQUIRED.value})


class InputTimeout(TimeoutError):
    """`ctx.ask(..., timeout=S)` had no answer within S seconds; the execution goes on
    `running` (the reasoner decides what to do)."""

    def __init__(self, execution_id: str, request_id: int, timeout: float | None) -> None:
        within = "in time" if timeout is None else f"in {timeout:g} s"
        super().__init__(f"request {request_id} of execution {execution_id} had no answer {within}")
        self.execution_id = execution_id
        self.request_id = request_id


class AskMismatch(RuntimeError):
    """A resumed `ctx.ask` asks another question than the request its number had, and no
    earlier request of the execution asked this one: rather than hand it another question's
    answer, the ask fails (and the execution with it, unless the reasoner catches it)."""

    def __init__(self, execution_id: str, request_id: int, asked: str, recorded: str) -> None:
        super().__init__(
            f"request {request_id} of execution {execution_id} was {recorded}, but the "
            f"reasoner now asks {asked}, which no earlier request asked: its code changed, or "
            "asks in another order than its checkpoint says (give ctx.ask a key= to name a "
            "question whose prompt changes)"
        )
        self.execution_id = execution_id
        self.request_id = request_id
        self.asked = asked
        self.recorded = recorded


class Parked(BaseException):
    """Raised out of `ctx.ask` once the execution is parked: the attempt's task ends without
    an end (the record waits in the store; the answer resumes it on any replica). A
    BaseException, like a cancellation, so that `except Exception` does not keep it."""


class InputChannel(Protocol):
    """Where `ctx.ask` records its request and learns how it ended (the registry: the store
    and metrics behind it)."""

    async def record_ask(
        self, execution: Execution, question: Question, timeout: float | None
    ) -> Reply:
        """Record the request in the store (fenced by owner and attempt) before anyone is
        told of it, parked where it can be; or what an earlier attempt left for the same
        question (asks.Found)."""

    async def await_answer(
        self,
        execution: Execution,
        request_id: int,
        waiter: asyncio.Future[Any],
        timeout: float | None,
    ) -> Any:
        """The answer `waiter` is given, within `timeout` seconds (TimeoutError after)."""

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        """The request timed out here: close it in the store unless an answer won first;
        (True, the answer) when one did."""

    def ask_ended(self, execution: Execution, asked: bool, seconds: float) -> None:
        """Told when a request begins (asked) and ends (after `seconds` of waiting)."""


class ExecutionContext:
    """What a reasoner may know about its own execution, and whether the server is draining.

    A resumable reasoner also reads `attempt` and `checkpoint_state` (its last checkpoint, or
    None) when it starts, and calls `await ctx.checkpoint(state)` after each step.
    """

    __slots__ = (
        "_asked",
        "_drain",
        "_emitted",
        "_execution",
        "_inputs",
        "_matched",
        "_max_checkpoint",
        "_names",
        "_writer",
        "checkpoint_state",
    )

    def __init__(
        self,
        execution: Execution,
        drain: asyncio.Event,
        writer: CheckpointWriter | None = None,
        max_checkpoint_size: int = 65_536,
        emitted: EmitObserver | None = None,
        inputs: InputChannel | None = None,
    ) -> None:
        self._execution = execution
        self._inputs = inputs
        #: Requests made so far (by the last checkpoint, for a later attempt): the next one's
        #: id is one more.
        self._asked = execution.checkpoint_asks
        #: By identity, the last earlier request a replayed ask of it was matched to (asks
        #: of one question asked again from the top get the earlier answers in order).
        self._matched: dict[str, int] = {}
        self._drain = drain
        self._writer = writer
        self._max_checkpoint = max_checkpoint_size
        self._emitted = emitted
        #: Event names this execution emitted already (found valid then).
        self._names: set[str] = set()
        self.checkpoint_state: Any = (
            None if execution.checkpoint is None else jsoncodec.loads(execution.checkpoint.encode())
        )

    @property
    def execution_id(self) -> str:
        return self._execution.execution_id

    @property
    def reasoner(self) -> str:
        return self._execution.reasoner

    @property
    def session_id(self) -> str | None:
        return self._execution.session_id

    @property
    def attempt(self) -> int:
        """1 for the first attempt; each hand-off or retry after an owner's death adds one."""
        return self._execution.attempt

    @property
    def draining(self) -> bool:
        """True from the first moment of shutdown: time to checkpoint and return early."""
        return self._drain.is_set()

    async def wait_for_drain(self) -> None:
        """Return once shutdown has begun; race it against work to stop cooperatively."""
        await self._drain.wait()

    async def emit(self, data: Any, event: str = "progress") -> int:
        """Publish an event (JSON data) to the execution's readers; its number is returned.
        Never waits for a reader: the last `--max-events` are kept for replay."""
        if event not in self._names and (
            not EVENT_NAME.fullmatch(event) or event in RESERVED_EVENTS
        ):
            raise ValueError(
                "event names are 1 to 64 of A-Z a-z 0-9 _ . : -, other than "
                + ", ".join(sorted(RESERVED_EVENTS))
            )
        if len(self._names) < 64:  # a reasoner uses a few names: each is checked once
            self._names.add(event)
        return self._publish(event, data)

    def _publish(self, event: str, data: Any) -> int:
        emitted = self._execution.event_log().append(event, encode_data(data))
        if self._emitted is not None:
            self._emitted(self._execution, emitted)
        return emitted.id

    async def ask(
        self,
        prompt: Any,
        schema: Any = None,
        timeout: float | None = None,
        *,
        key: str | None = None,
    ) -> Any:
        """Ask for input and wait for the answer: the execution reads `input_required` with
        its `input_request` (`prompt`, JSON; the JSON schema of `schema`, a type pydantic
        validates the answer against, None for any JSON), an `input_required` event is
        sent, and the first answer to `POST /executions/{id}/input` is returned, validated
        (a model instance for a model). `timeout` seconds without one raise InputTimeout;
        the execution is `running` again either way. A cancellation while waiting cancels
        the reasoner as anywhere else. A resumable execution on a shared store is parked
        instead (`Parked` ends this attempt): its answer resumes the next attempt anywhere,
        where this call returns the kept answer (numbered on from the last checkpoint).

        A request is matched by what it asks: `key` names the question (else a digest of
        the prompt and the schema does); a replayed ask whose numbered request asked
        something else gets the earlier request of its own question, or raises
        AskMismatch."""
        if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= MAX_SECONDS):
            raise ValueError("timeout must be a positive number of seconds (at most a year)")
        key = asks.check_key(key)
        if self._inputs is None:
            raise RuntimeError(f"reasoner {self.reasoner!r} cannot ask for input here")
        execution = self._execution
        if execution.status is not ExecutionStatus.RUNNING:
            raise RuntimeError("one request at a time: an earlier ctx.ask still waits")
        shown = jsoncodec.loads(jsoncodec.dumps_recordable(prompt, "the prompt"))
        adapter: TypeAdapter[Any] | None = None if schema is None else TypeAdapter(schema)
        json_schema = None if adapter is None else adapter.json_schema()
        number = self._asked + 1
        asked_at = time.time()
        request: dict[str, Any] = {
            "request_id": number,
            "prompt": shown,
            "schema": json_schema,
            "asked_at": _isoformat(asked_at),
            "expires_at": None if timeout is None else _isoformat(asked_at + timeout),
        }
        identity = asks.identity(key, shown, json_schema)
        question = Question(
            request, identity, asks.label(key, shown), self._matched.get(identity, 0)
        )
        reply, waiter = await self._record(question, adapter, timeout)
        if reply.found is Found.AGAIN:  # an earlier request's, its answer dropped: again
            question.request = {**request, "request_id": reply.request_id}
            reply, waiter = await self._record(question, adapter, timeout)
        if reply.found is Found.MISMATCH:
            raise AskMismatch(execution.execution_id, number, question.label, reply.other)
        request_id = reply.request_id
        if request_id == number:
            self._asked = number
        else:
            self._matched[identity] = request_id
        if reply.found is Found.ANSWERED:  # in an earlier attempt: that answer, at once
            return reply.value if adapter is None else adapter.validate_python(reply.value)
        if reply.found is Found.TIMED_OUT:  # in an earlier attempt: so here too
            raise InputTimeout(execution.execution_id, request_id, timeout)
        request = question.request
        if reply.found is Found.PARKED:  # its task ends; the answer resumes it anywhere
            execution.ask(request)
            self._publish(ExecutionStatus.INPUT_REQUIRED.value, request)  # as this attempt's
            execution.leave()
            raise Parked
        if not waiter.done():  # else answered (elsewhere) before the store's reply came
            execution.ask(request)
        self._publish(ExecutionStatus.INPUT_REQUIRED.value, request)
        self._inputs.ask_ended(execution, True, 0.0)
        started = time.monotonic()
        try:
            try:
                value = await self._inputs.await_answer(execution, request_id, waiter, timeout)
            except TimeoutError:
                if waiter.done() and not waiter.cancelled():
                    value = waiter.result()
                else:
                    answered, value = await self._inputs.expire_ask(execution, request_id)
                    if not answered:
                        assert timeout is not None
                        raise InputTimeout(execution.execution_id, request_id, timeout) from None
        finally:
            if execution.reached_end(asked=True) and not execution.is_terminal:
                execution.resume()  # unanswered: cancelled or timed out
            if not waiter.done():
                waiter.cancel()
            execution.stop_waiting()
            self._inputs.ask_ended(execution, False, time.monotonic() - started)
        return value if adapter is None else adapter.validate_python(value)

    async def _record(
        self, question: Question, adapter: TypeAdapter[Any] | None, timeout: float | None
    ) -> tuple[Reply, asyncio.Future[Any]]:
        """The store's reply to the question, with the future its answer completes, made
        ready before the store is told: an answer may come back before its reply does."""
        assert self._inputs is not None
        execution = self._execution
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        execution.answer_waiter = waiter
        execution.input_adapter = adapter
        execution.asking = question.request_id
        found = Found.ANSWERED
        try:
            reply = await self._inputs.record_ask(execution, question, timeout)
            found = reply.found
        finally:
            if found is not Found.WAIT:
                execution.stop_waiting()
        return reply, waiter

    async def checkpoint(self, state: Any) -> None:
        """Record `state` (JSON) as this execution's progress: a later attempt starts with
        it as `checkpoint_state`. Raises CheckpointTooLarge past the size limit, and
        StaleAttempt when a newer attempt owns the execution."""
        text = jsoncodec.dumps_recordable(state, "the checkpoint").decode()
        if len(text.encode()) > self._max_checkpoint:
            raise CheckpointTooLarge(
                f"checkpoint of {len(text.encode())} bytes exceeds {self._max_checkpoint}"
            )
        if self._writer is None:
            raise RuntimeError(f"reasoner {self.reasoner!r} is not resumable: no checkpoints")
        self._execution.checkpoint_asks = self._asked
        await self._writer(self._execution, text)
        self._execution.checkpoint = text
        self.checkpoint_state = state
