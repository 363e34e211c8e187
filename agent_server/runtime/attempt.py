"""One running attempt, and the ways an attempt ends, decided in one place.

`Attempt` holds everything this process knows of one attempt it runs: its task, its time
limit, whether it runs in a thread, its hand-off and stale marks, and its answer waiter.
`Ending` is the table of how an attempt can end (the status its record ends in, the metric
outcome, the log line), and `classify` the one function that picks the row from what
happened (Starlette's `routing.Match` is the model): "what happens when a time limit
expires" is the `TIMED_OUT` row, one branch here and one in `Attempts.conclude`.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_server.model.context import AskMismatch, Parked
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.scheduling import ExecutionTimeout
from agent_server.model.status import OWNED


class AttemptClock:
    """An attempt's time limit (`timeout=`): its task is cancelled once it has run that long,
    not counting time in `input_required` (the clock stops while `ctx.ask` waits)."""

    __slots__ = ("_handle", "_since", "_used", "expired", "task", "timeout")

    def __init__(self, task: asyncio.Task[None], timeout: float) -> None:
        self.task = task
        self.timeout = timeout
        self.expired = False
        self._used = 0.0
        self._since: float | None = None
        self._handle: asyncio.TimerHandle | None = None
        self.run()

    def run(self) -> None:
        """The attempt works (its start, or an answer came): the clock goes on."""
        if self._since is None and not self.expired:
            loop = asyncio.get_running_loop()
            self._since = loop.time()
            self._handle = loop.call_later(max(0.0, self.timeout - self._used), self._expire)

    def pause(self) -> None:
        """The attempt waits for input: its time does not count."""
        if self._since is not None:
            self._used += asyncio.get_running_loop().time() - self._since
            self._since = None
        self.stop()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _expire(self) -> None:
        self._handle = None
        if not self.task.done():
            self.expired = True
            self.task.cancel()


class Attempt:
    """One attempt of an execution that a task of this process runs, from its launch until
    its task's end is observed. The marks are the attempt's own, not the execution id's: the
    same execution may run again here (a hand-off claimed back) while a stale task of an
    earlier attempt still runs."""

    __slots__ = (
        "clock",
        "execution",
        "handing_off",
        "in_thread",
        "reasoner",
        "stale",
        "task",
        "vanished",
    )

    #: Set by `begin`, right after the task is created (its coroutine needs this object).
    task: asyncio.Task[None]

    def __init__(self, execution: Execution, reasoner: Reasoner) -> None:
        self.execution = execution
        self.reasoner = reasoner
        #: Its time limit, when its reasoner has one.
        self.clock: AttemptClock | None = None
        #: A `def` reasoner's thread runs it now: it cannot be cancelled, only waited for.
        self.in_thread = False
        #: To hand off once it settles (resumable, a store that can, at shutdown).
        self.handing_off = False
        #: Handed off without settling (abandoned): its task is a stale attempt, its end fenced.
        self.stale = False
        #: Its record vanished from the store: it ends `lost`.
        self.vanished = False

    def begin(self, task: asyncio.Task[None]) -> None:
        """Its task runs: the clock starts, if it has a time limit."""
        self.task = task
        if self.reasoner.timeout is not None:
            self.clock = AttemptClock(task, self.reasoner.timeout)

    def stop_clock(self) -> None:
        if self.clock is not None:
            self.clock.stop()

    @property
    def timed_out(self) -> bool:
        """Its own time limit cancelled it, nobody else."""
        return (
            self.clock is not None and self.clock.expired and self.execution.cancel_reason is None
        )

    @property
    def waiter(self) -> asyncio.Future[Any] | None:
        """The future `ctx.ask` waits on for an answer (kept with the execution, which
        `ExecutionContext` is given)."""
        return self.execution.answer_waiter

    def answer(self, request_id: int | None, value: Any) -> bool:
        """Hand an answer to the `ctx.ask` waiting, if it waits for that request."""
        return self.execution.take_answer(request_id, value)


class Happened(enum.Enum):
    """What came of an attempt, as its task or the registry saw it."""

    #: The reasoner returned (and its value serialized).
    RETURNED = "returned"
    #: It raised (a cancellation and `Parked` included).
    RAISED = "raised"
    #: Its task was cancelled before its first step: the reasoner never ran.
    NEVER_RAN = "never_ran"
    #: It did not settle in time after a cancellation: given up on, its task left running.
    GIVEN_UP = "given_up"
    #: Claimed from the queue, it cannot run here (reasoner gone, body no longer binds).
    REFUSED = "refused"


_S = ExecutionStatus


class Ending(enum.Enum):
    """How an attempt ends: the status its record ends in (None: the store keeps it as it
    is), the outcome counted in metrics (None: not counted), and the log line written."""

    status: ExecutionStatus | None
    outcome: str | None
    line: str

    def __init__(self, _: str, status: ExecutionStatus | None, outcome: str | None, line: str):
        self.status = status
        self.outcome = outcome
        self.line = line

    SUCCEEDED = (_S.SUCCEEDED.value, ExecutionStatus.SUCCEEDED, _S.SUCCEEDED.value, "none")
    FAILED = (
        _S.FAILED.value,
        ExecutionStatus.FAILED,
        _S.FAILED.value,
        "error: failed, with its traceback",
    )
    #: Its time limit cancelled it: `failed` with ExecutionTimeout (RETRIED if its policy
    #: retries that).
    TIMED_OUT = ("timed_out", ExecutionStatus.FAILED, _S.FAILED.value, "error: failed (timeout)")
    #: A failure its RetryPolicy retries: the next attempt is queued after the backoff.
    RETRIED = ("retried", ExecutionStatus.QUEUED, None, "warning: attempt failed, next due")
    #: Cancelled by a client, a session release or interruption (the reason recorded).
    CANCELLED = (_S.CANCELLED.value, ExecutionStatus.CANCELLED, _S.CANCELLED.value, "none")
    CANCELLED_AT_SHUTDOWN = ("shutdown", ExecutionStatus.CANCELLED, _S.CANCELLED.value, "none")
    #: At shutdown, resumable on a store that can hand off: the next attempt is queued.
    HANDED_OFF = ("handed_off", ExecutionStatus.QUEUED, "handed_off", "info: handed off")
    #: `ctx.ask` parked it: the record waits in the store, owned by nobody.
    PARKED = ("parked", None, "parked", "info: parked")
    #: Its record vanished from the store while it ran here.
    LOST = (_S.LOST.value, ExecutionStatus.LOST, _S.LOST.value, "none")
    #: It did not settle by its deadline: recorded cancelled and abandoned, task left running.
    ABANDONED = ("abandoned", ExecutionStatus.CANCELLED, "abandoned", "warning: abandoned")
    #: A stale attempt (handed off while it ran) ended later: its end is fenced by the store.
    STALE = ("stale", None, None, "warning: stale attempt ended later")
    #: An abandoned attempt ended later: its record stays as it was reported.
    LATE = ("late", None, None, "warning: abandoned execution ended later")
    #: A claimed execution this replica cannot run: `failed` without running.
    REFUSED = ("refused", ExecutionStatus.FAILED, _S.FAILED.value, "error: cannot resume")


@dataclass(frozen=True, slots=True)
class Verdict:
    """An ending with what it carries: the status the attempt came to (for STALE and LATE,
    the end that came too late), the exception that ended it, the cancel reason."""

    ending: Ending
    status: ExecutionStatus | None = None
    error: BaseException | None = None
    reason: CancelReason | None = None


def _never(_: BaseException) -> bool:
    return False


#: The verdict of every attempt whose reasoner returned (and was not ended otherwise
#: meanwhile): one object, as a verdict is immutable, not one made per run.
_SUCCEEDED = Verdict(Ending.SUCCEEDED, ExecutionStatus.SUCCEEDED)


def classify(
    happened: Happened,
    attempt: Attempt,
    raised: BaseException | None = None,
    *,
    cancelled: bool = False,
    draining: bool = False,
    retries: Callable[[BaseException], bool] = _never,
) -> Verdict:
    """How `attempt` ends, given what `happened` (with the exception `raised`, whether a
    cancellation was asked for, whether the process drains, and whether its retry policy
    would run it again)."""
    execution = attempt.execution
    if happened is Happened.GIVEN_UP:
        if attempt.handing_off:
            return Verdict(Ending.HANDED_OFF, ExecutionStatus.QUEUED)
        return Verdict(Ending.ABANDONED, ExecutionStatus.CANCELLED, reason=execution.cancel_reason)
    if happened is Happened.REFUSED:
        return Verdict(Ending.REFUSED, ExecutionStatus.FAILED, raised)
    if happened is Happened.RETURNED:
        return _late_or(execution, _SUCCEEDED)
    if isinstance(raised, Parked):
        return Verdict(Ending.PARKED)
    never_ran = happened is Happened.NEVER_RAN
    if never_ran or isinstance(raised, asyncio.CancelledError):
        if not never_ran and attempt.timed_out:
            timeout = attempt.clock.timeout if attempt.clock is not None else 0.0
            limit = ExecutionTimeout(timeout, execution.attempt)
            return _failed(execution, limit, retries, Ending.TIMED_OUT)
        if never_ran or cancelled:
            if attempt.handing_off:
                return Verdict(Ending.HANDED_OFF, ExecutionStatus.QUEUED)
            if attempt.vanished:
                return _late_or(execution, Verdict(Ending.LOST, ExecutionStatus.LOST))
            reason = execution.cancel_reason
            if reason is None and draining:
                reason = CancelReason.SHUTDOWN
            if reason is None:  # cancelled from outside the registry: say so, not nothing
                reason = CancelReason.REQUEST
            ending = (
                Ending.CANCELLED_AT_SHUTDOWN
                if reason is CancelReason.SHUTDOWN
                else Ending.CANCELLED
            )
            return _late_or(execution, Verdict(ending, ExecutionStatus.CANCELLED, reason=reason))
        # else a CancelledError raised by the reasoner's own code: nobody asked for it
    assert raised is not None
    return _failed(execution, raised, retries, Ending.FAILED)


def _failed(
    execution: Execution,
    exc: BaseException,
    retries: Callable[[BaseException], bool],
    ending: Ending,
) -> Verdict:
    if (
        execution.status in OWNED
        and not isinstance(exc, AskMismatch)  # the next attempt would ask the same
        and retries(exc)
    ):
        return Verdict(Ending.RETRIED, ExecutionStatus.QUEUED, exc)
    return _late_or(execution, Verdict(ending, ExecutionStatus.FAILED, exc))


def _late_or(execution: Execution, verdict: Verdict) -> Verdict:
    """An end that came after the record ended otherwise is STALE (handed off earlier: the
    record is queued for the next attempt) or LATE (abandoned earlier)."""
    if execution.status is ExecutionStatus.QUEUED:
        return Verdict(Ending.STALE, verdict.status, verdict.error, verdict.reason)
    if execution.is_terminal:
        return Verdict(Ending.LATE, verdict.status, verdict.error, verdict.reason)
    return verdict
