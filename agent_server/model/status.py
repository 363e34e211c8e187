"""The execution's state machine, declared once: its statuses and every transition between
them, with who makes each one.

Everything else reads this table: Python moves through `move` (a move it does not hold is
a bug, `IllegalTransition`), which sets the status and clears what the move declares; the
Redis scripts move through lua/moves.lua, whose checks and clears `codes.lua` generates from
the same rows; the terminal statuses are derived from it (a status no transition leaves);
`parked` is the one named state finer than a status; the client imports it (it imports
nothing else of the server), and docs/architecture.md shows the diagram `diagram()` draws
from it (a test compares them). A new status or transition is one row here; status names
are literals nowhere else (tests/unit/test_status.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol


class ExecutionStatus(enum.StrEnum):
    """Where an execution is; `queued` while it waits for a replica to take it (a delayed
    start, a retry, a start waiting for room or a slot, a hand-off); `lost` only with a
    shared store; `input_required` while its reasoner waits for an answer (`ctx.ask`)."""

    QUEUED = "queued"
    RUNNING = "running"
    INPUT_REQUIRED = "input_required"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


class CancelReason(enum.StrEnum):
    """Why an execution was cancelled; recorded so a client can tell who stopped its work."""

    REQUEST = "request"
    SESSION_RELEASED = "session_released"
    SHUTDOWN = "shutdown"
    CLIENT_DISCONNECTED = "client_disconnected"
    #: A later start in its session had session policy `interrupt` or `rollback`.
    INTERRUPTED = "interrupted"


class Transition(enum.StrEnum):
    """A move of an execution, by name."""

    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"
    CANCEL = "cancel"
    LOSE = "lose"
    HAND_OFF = "hand_off"
    REQUEUE = "requeue"
    CLAIM = "claim"
    CANCEL_QUEUED = "cancel_queued"
    LATE_END = "late_end"
    ASK = "ask"
    ANSWER = "answer"
    RESUME = "resume"
    EXPIRE = "expire"
    ENQUEUE = "enqueue"
    RETRY = "retry"


@dataclass(frozen=True)
class Step:
    """One row of the table: `transition` moves an execution from any of `sources` (empty:
    from nothing, its creation) to one of `targets`, made by `by`, clearing the record's
    fields `clears` (a move to `queued` clears QUEUED_CLEARS too)."""

    transition: Transition
    sources: frozenset[ExecutionStatus]
    targets: frozenset[ExecutionStatus]
    by: str
    clears: tuple[str, ...] = ()


_S = ExecutionStatus
_ENDS = frozenset({_S.SUCCEEDED, _S.FAILED, _S.CANCELLED})
#: Where an owner runs its task: working, or waiting in `ctx.ask` (the task still runs, so
#: whatever ends a running execution ends a waiting one, and its owner may die either way).
#: The scripts read it as `OWNED` (codes.lua).
OWNED: frozenset[ExecutionStatus] = frozenset({_S.RUNNING, _S.INPUT_REQUIRED})
#: What a record stops holding when nobody waits in a task for it any more: the request it
#: asked and the id of the one an ask waits for.
_ASKED = ("input_request", "asking")
#: What every move to `queued` clears, whichever move it is: a queued record is nobody's (no
#: owner, no claim), asks nothing, and is parked by nobody. Written once (moves.lua
#: `to_queued`).
QUEUED_CLEARS: tuple[str, ...] = ("replica", *_ASKED, "parked_by", "claim")

#: The state machine. Local objects and records follow the same table; LATE_END is the one
#: move only a local object makes (an attempt handed off at the drain deadline that ended
#: after all: its end is fenced by the store, which keeps the record as the next attempt
#: has it).
TABLE: tuple[Step, ...] = (
    Step(Transition.START, frozenset(), frozenset({_S.RUNNING}), "registry; create.lua"),
    Step(Transition.SUCCEED, OWNED, frozenset({_S.SUCCEEDED}), "registry; end.lua", _ASKED),
    Step(Transition.FAIL, OWNED, frozenset({_S.FAILED}), "registry; end.lua", _ASKED),
    Step(Transition.CANCEL, OWNED, frozenset({_S.CANCELLED}), "registry; end.lua", _ASKED),
    Step(
        Transition.LOSE,
        OWNED,
        frozenset({_S.LOST}),
        "judge.lua read(): its owner stopped renewing; registry: its record vanished from "
        "the store; the repair: an earlier process of its replica id took it and is gone",
        _ASKED,
    ),
    Step(
        Transition.HAND_OFF,
        OWNED,
        frozenset({_S.QUEUED}),
        "registry at the drain deadline; handoff.lua",
    ),
    Step(
        Transition.REQUEUE,
        OWNED,
        frozenset({_S.QUEUED}),
        "judge.lua read(): its owner died, attempts left; unclaim.lua: taken, its answer "
        "lost, never started",
    ),
    Step(
        Transition.CLAIM,
        frozenset({_S.QUEUED}),
        frozenset({_S.RUNNING}),
        "QueueTaker, once due: claim.lua; the memory store's queue",
    ),
    Step(
        Transition.CANCEL_QUEUED,
        frozenset({_S.QUEUED, _S.INPUT_REQUIRED}),
        frozenset({_S.CANCELLED}),
        "cancel_queued.lua (queued, or parked: owned by nobody); claim.lua (session "
        "released); the memory store (and its shutdown)",
        ("scheduled_at",),
    ),
    Step(
        Transition.LATE_END, frozenset({_S.QUEUED}), _ENDS, "registry (a local object only)", _ASKED
    ),
    Step(
        Transition.ASK,
        frozenset({_S.RUNNING}),
        frozenset({_S.INPUT_REQUIRED}),
        "ctx.ask; ask.lua (a resumable one on a shared store is parked: no owner, no task)",
    ),
    Step(
        Transition.ANSWER,
        frozenset({_S.INPUT_REQUIRED}),
        frozenset({_S.RUNNING, _S.QUEUED}),
        "POST /executions/{id}/input; answer.lua (exactly one answer per request; a parked "
        "one is queued, for any replica to resume)",
        _ASKED,
    ),
    Step(
        Transition.RESUME,
        frozenset({_S.INPUT_REQUIRED}),
        frozenset({_S.RUNNING}),
        "ctx.ask left unanswered: its timeout (expire.lua), or its task cancelled",
        _ASKED,
    ),
    Step(
        Transition.EXPIRE,
        frozenset({_S.INPUT_REQUIRED}),
        frozenset({_S.QUEUED}),
        "tick.lua: a parked execution's request expired (the resumed ask raises InputTimeout)",
    ),
    Step(
        Transition.ENQUEUE,
        frozenset(),
        frozenset({_S.QUEUED}),
        "registry: ?delay=, or --queue-when-full at capacity; enqueue.lua",
    ),
    Step(
        Transition.RETRY,
        OWNED,
        frozenset({_S.QUEUED}),
        "registry: a failure its RetryPolicy retries, after the backoff; handoff.lua with a delay",
    ),
)

#: The status an ending with that outcome reaches from `running`, by transition.
END_OF: dict[ExecutionStatus, Transition] = {
    _S.SUCCEEDED: Transition.SUCCEED,
    _S.FAILED: Transition.FAIL,
    _S.CANCELLED: Transition.CANCEL,
    _S.LOST: Transition.LOSE,
}

_BY_NAME = {step.transition: step for step in TABLE}
#: Statuses some transition leaves: not terminal.
ACTIVE: frozenset[ExecutionStatus] = frozenset(s for step in TABLE for s in step.sources)
#: Statuses no transition leaves.
TERMINAL: frozenset[ExecutionStatus] = frozenset(ExecutionStatus) - ACTIVE


class IllegalTransition(RuntimeError):
    """A move the table does not hold: a bug, never a client's doing."""


def step(status: ExecutionStatus | None, transition: Transition, target: ExecutionStatus) -> None:
    """Check that `transition` may move an execution from `status` (None: not yet created)
    to `target`; IllegalTransition otherwise."""
    row = _BY_NAME[transition]
    source_ok = status in row.sources if row.sources else status is None
    if not source_ok or target not in row.targets:
        raise IllegalTransition(f"{transition.value}: {status} -> {target.value} is not a move")


def _cleared_by(row: Step, target: ExecutionStatus) -> tuple[str, ...]:
    if target is not ExecutionStatus.QUEUED:
        return row.clears
    return row.clears + tuple(name for name in QUEUED_CLEARS if name not in row.clears)


_CLEARS = {(row.transition, t): _cleared_by(row, t) for row in TABLE for t in row.targets}


def clears(transition: Transition, target: ExecutionStatus) -> tuple[str, ...]:
    """The record's fields `transition` to `target` (one of its row's targets) clears: its
    row's, and QUEUED_CLEARS for every move to `queued` (Lua's `MOVES`, the rows as code in
    codes.lua)."""
    return _CLEARS[transition, target]


class Movable(Protocol):
    """What `move` moves: an object with a status, and the record's fields it holds with
    the value each has once a move clears it (`CLEARED`; a field it lacks is the store's)."""

    CLEARED: ClassVar[Mapping[str, object]]
    status: ExecutionStatus


def move(subject: Movable, transition: Transition, target: ExecutionStatus) -> None:
    """The one way Python changes a status: check the move against the table (from the
    subject's status; a creation's row from nothing), set `target`, and clear the fields
    the move declares. IllegalTransition, changing nothing, for a move the table lacks."""
    row = _BY_NAME[transition]
    if target not in row.targets or (row.sources and subject.status not in row.sources):
        step(subject.status if row.sources else None, transition, target)  # raises
    subject.status = target
    cleared = subject.CLEARED
    for name in _CLEARS[transition, target]:
        if name in cleared:
            setattr(subject, name, cleared[name])


#: The one state finer than a status: an `input_required` record that nobody owns (ask.lua
#: parks a resumable execution on a shared store: its task ends, its `replica` is ''). Not a
#: status: clients see `input_required` (section 13). Nobody's task runs it, so nobody
#: judges it, a cancel ends it where it waits (`cancel_queued`), and only its answer or
#: its request's expiry move it (to `queued`). Lua: `parked(status, owner)` (moves.lua).
PARKED = "parked"


def parked(status: ExecutionStatus, owner: str) -> bool:
    """Whether a record with `status` and owner (`replica`) `owner` is parked."""
    return status is ExecutionStatus.INPUT_REQUIRED and not owner


def unowned(status: ExecutionStatus, owner: str) -> bool:
    """Queued or parked: no task runs it, so it ends where it waits."""
    return status is ExecutionStatus.QUEUED or parked(status, owner)


#: How many moves a record's history keeps (the last ones), on every store: the moves that
#: neither create nor end it (its record dates those: `created_at`, `finished_at`), so an
#: execution that runs once, start to end, keeps none and pays nothing. Each is one entry
#: `[at, from, to, attempt, replica, version, how]` (`kept_move`). Lua: `KEPT_MOVES` (codes.lua);
#: Postgres: the `executions_moved` trigger (migrations/0002_moves.sql), checked by
#: tests/store/test_history.py on each store.
KEPT_MOVES = 50


def keeps_move(target: ExecutionStatus) -> bool:
    """Whether a move (never a creation) to `target` joins the history: not an end."""
    return target in ACTIVE


def shown_status(status: ExecutionStatus, owner: str) -> str:
    """A status as the history names it: `parked` for a record nobody owns that waits for
    input, else the status."""
    return PARKED if parked(status, owner) else status.value


#: What a kept move is, by the one name every store gives it (`kept_move`'s `how`): from
#: what each store knows alike, so the same life reads the same on each.
HOW = ("claim", "resume", "ask", "park", "answer", "expire", "retry", "hand_off", "requeue")


def how_of(transition: Transition, source: str, target: str) -> str:
    """A kept move's name: its transition's, but a move back to `running` from waiting for
    input is `resume` (answered or not: the request says) and an ask that parks is `park`."""
    if target == ExecutionStatus.RUNNING and source != ExecutionStatus.QUEUED:
        return "resume"
    if target == PARKED:
        return "park"
    return transition.value


def kept_move(
    at: float,
    source: str,
    target: str,
    attempt: int,
    replica: str,
    version: str | None,
    how: str,
) -> list[Any]:
    """One entry of a record's history. `attempt` and `replica` are the attempt the move
    concerns: the one it begins for a move to `running` (a claim, a resume), else the one
    it leaves (a hand-off, a requeue, a retry, a park); `version` is the code that ran that
    attempt (None for a move to `running`: its record says, once begun); `how`, one of
    HOW."""
    return [at, str(source), str(target), attempt, replica, version, how]


def appended(history: list[list[Any]] | None, entry: list[Any]) -> list[list[Any]]:
    """`history` with `entry` last, KEPT_MOVES at most (the oldest dropped)."""
    kept = [*(history or ()), entry]
    return kept[-KEPT_MOVES:]


def diagram() -> str:
    """The table as a Mermaid state diagram (docs/architecture.md holds it)."""
    lines = ["stateDiagram-v2"]
    for row in TABLE:
        for target in sorted(row.targets):
            for source in [s.value for s in sorted(row.sources)] or ["[*]"]:
                lines.append(f"    {source} --> {target.value}: {row.transition.value}")
    for status in sorted(TERMINAL):
        lines.append(f"    {status.value} --> [*]")
    waiting = ExecutionStatus.INPUT_REQUIRED.value
    lines.append(f"    note right of {waiting}: {PARKED} when nobody owns it")
    return "\n".join(lines)
