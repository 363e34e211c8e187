"""ExecutionContext: what a reasoner sees of its own execution (section 2), and what its
calls raise."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import TypeAdapter

from agent_server.identity.principal import Principal
from agent_server.model import asks, jsoncodec
from agent_server.model.asks import Found, Question, Reply
from agent_server.model.events import Event, encode_data
from agent_server.model.execution import MAX_SECONDS
from agent_server.model.record import isoformat
from agent_server.model.status import ExecutionStatus

if TYPE_CHECKING:
    from agent_server.model.execution import Execution


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
#: The event each value a generator reasoner yields is sent as.
OUTPUT_EVENT = "output"
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
    def principal(self) -> Principal | None:
        """Whom it runs for: the caller that started it (None on a server without
        authentication). On the replica that admitted it, the principal as authenticated
        (scopes and claims included); a later attempt elsewhere is told the record's owner
        and tenant only, since scopes and claims are never stored (docs/security.md)."""
        execution = self._execution
        if execution.principal is not None:
            return execution.principal
        if execution.owner is None:
            return None
        return Principal(execution.owner, execution.tenant)

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

    def output(self, data: Any) -> int:
        """Publish a value a generator reasoner yielded (JSON-ready) as an `output` event."""
        return self._publish(OUTPUT_EVENT, data)

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
        if timeout is not None and not 0 < timeout <= MAX_SECONDS:  # NaN is not, nor 10**400
            raise ValueError("timeout must be a positive number of seconds (at most a year)")
        key = asks.check_key(key)
        if self._inputs is None:
            raise RuntimeError(f"reasoner {self.reasoner!r} cannot ask for input here")
        execution = self._execution
        if execution.status is not ExecutionStatus.RUNNING:
            raise RuntimeError("one request at a time: an earlier ctx.ask still waits")
        question, adapter = self._question(prompt, schema, timeout, key)
        reply, waiter = await self._numbered(question, adapter, timeout)
        request_id = reply.request_id
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
        value = await self._answer(request_id, waiter, timeout)
        return value if adapter is None else adapter.validate_python(value)

    def _question(
        self, prompt: Any, schema: Any, timeout: float | None, key: str | None
    ) -> tuple[Question, TypeAdapter[Any] | None]:
        """The next request (`input_request`, numbered on from the last one), what identifies
        its question, and the adapter its answer is validated by (None: any JSON)."""
        shown = jsoncodec.loads(jsoncodec.dumps_recordable(prompt, "the prompt"))
        adapter: TypeAdapter[Any] | None = None if schema is None else TypeAdapter(schema)
        json_schema = None if adapter is None else adapter.json_schema()
        asked_at = time.time()
        request: dict[str, Any] = {
            "request_id": self._asked + 1,
            "prompt": shown,
            "schema": json_schema,
            "asked_at": isoformat(asked_at),
            "expires_at": None if timeout is None else isoformat(asked_at + timeout),
        }
        identity = asks.identity(key, shown, json_schema)
        question = Question(
            request, identity, asks.label(key, shown), self._matched.get(identity, 0)
        )
        return question, adapter

    async def _numbered(
        self, question: Question, adapter: TypeAdapter[Any] | None, timeout: float | None
    ) -> tuple[Reply, asyncio.Future[Any]]:
        """The store's reply to the question (recorded again as the earlier request it was,
        when that one's answer was dropped), counted: a new request moves the numbering on,
        an earlier one it matched is where the next ask of this question starts looking.
        Raises AskMismatch when the numbered request asked another question."""
        number = question.request_id
        reply, waiter = await self._record(question, adapter, timeout)
        if reply.found is Found.AGAIN:  # an earlier request's, its answer dropped: again
            question.request = {**question.request, "request_id": reply.request_id}
            reply, waiter = await self._record(question, adapter, timeout)
        if reply.found is Found.MISMATCH:
            raise AskMismatch(self._execution.execution_id, number, question.label, reply.other)
        if reply.request_id == number:
            self._asked = number
        else:
            self._matched[question.identity] = reply.request_id
        return reply, waiter

    async def _answer(
        self, request_id: int, waiter: asyncio.Future[Any], timeout: float | None
    ) -> Any:
        """Wait for the answer (unvalidated) to the request now asked; InputTimeout once
        `timeout` passed unless an answer won the race. The execution is `running` again
        after, however the wait ended."""
        assert self._inputs is not None
        execution = self._execution
        self._inputs.ask_ended(execution, True, 0.0)
        started = time.monotonic()
        try:
            try:
                return await self._inputs.await_answer(execution, request_id, waiter, timeout)
            except TimeoutError:
                if waiter.done() and not waiter.cancelled():
                    return waiter.result()
                answered, value = await self._inputs.expire_ask(execution, request_id)
                if not answered:
                    assert timeout is not None
                    raise InputTimeout(execution.execution_id, request_id, timeout) from None
                return value
        finally:
            if execution.reached_end(asked=True) and not execution.is_terminal:
                execution.resume()  # unanswered: cancelled or timed out
            if not waiter.done():
                waiter.cancel()
            execution.stop_waiting()
            self._inputs.ask_ended(execution, False, time.monotonic() - started)

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
