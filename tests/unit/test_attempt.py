"""`classify`: every way an attempt ends is one row of `Ending`, chosen in one function.

Each case builds what happened to an attempt (its task's outcome, its marks, its record's
status) and checks the row chosen, and the status and outcome that row gives.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from agent_server.model.context import AskMismatch, Parked
from agent_server.model.execution import CancelReason, Execution
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerOptions
from agent_server.model.scheduling import ExecutionTimeout
from agent_server.model.status import ExecutionStatus
from agent_server.runtime.attempt import Attempt, Ending, Happened, Verdict, classify

S = ExecutionStatus


def work() -> None:
    return None


async def async_work() -> None:
    return None


def attempt_of(status: ExecutionStatus = S.RUNNING, **marks: Any) -> Attempt:
    execution = Execution("work", None, "test-replica")
    if status is S.QUEUED:
        execution.mark_queued()
    elif status is not S.RUNNING:
        execution.finish(status, reason=CancelReason.SHUTDOWN)
    attempt = Attempt(execution, Reasoner(work, ReasonerOptions("work")))
    for name, value in marks.items():
        setattr(attempt, name, value)
    return attempt


def always(_: BaseException) -> bool:
    return True


async def expired_attempt(cancel_reason: CancelReason | None = None) -> Attempt:
    """An attempt whose own time limit fired (its task cancelled by its clock)."""
    execution = Execution("work", None, "test-replica")
    execution.cancel_reason = cancel_reason
    attempt = Attempt(execution, Reasoner(async_work, ReasonerOptions("work", timeout=0.01)))
    task = asyncio.get_running_loop().create_task(asyncio.sleep(30))
    attempt.begin(task)  # type: ignore[arg-type]
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5.0)
    return attempt


Case = tuple[str, Callable[[], Attempt], Happened, BaseException | None, dict[str, Any], Ending]
CASES: list[Case] = [
    ("returned", attempt_of, Happened.RETURNED, None, {}, Ending.SUCCEEDED),
    ("raised", attempt_of, Happened.RAISED, ValueError("x"), {}, Ending.FAILED),
    ("retried", attempt_of, Happened.RAISED, ValueError("x"), {"retries": always}, Ending.RETRIED),
    (
        "ask mismatch never retried",
        attempt_of,
        Happened.RAISED,
        AskMismatch("e", 1, "a", "b"),
        {"retries": always},
        Ending.FAILED,
    ),
    ("parked", attempt_of, Happened.RAISED, Parked(), {}, Ending.PARKED),
    (
        "cancel nobody asked for",
        attempt_of,
        Happened.RAISED,
        asyncio.CancelledError(),
        {},
        Ending.FAILED,
    ),
    (
        "cancelled",
        attempt_of,
        Happened.RAISED,
        asyncio.CancelledError(),
        {"cancelled": True},
        Ending.CANCELLED,
    ),
    (
        "cancelled draining",
        attempt_of,
        Happened.RAISED,
        asyncio.CancelledError(),
        {"cancelled": True, "draining": True},
        Ending.CANCELLED_AT_SHUTDOWN,
    ),
    ("never ran", attempt_of, Happened.NEVER_RAN, None, {}, Ending.CANCELLED),
    (
        "handed off",
        lambda: attempt_of(handing_off=True),
        Happened.RAISED,
        asyncio.CancelledError(),
        {"cancelled": True},
        Ending.HANDED_OFF,
    ),
    (
        "vanished",
        lambda: attempt_of(vanished=True),
        Happened.RAISED,
        asyncio.CancelledError(),
        {"cancelled": True},
        Ending.LOST,
    ),
    ("given up", attempt_of, Happened.GIVEN_UP, None, {}, Ending.ABANDONED),
    (
        "given up handing off",
        lambda: attempt_of(handing_off=True),
        Happened.GIVEN_UP,
        None,
        {},
        Ending.HANDED_OFF,
    ),
    ("stale succeeded", lambda: attempt_of(S.QUEUED), Happened.RETURNED, None, {}, Ending.STALE),
    (
        "stale failed, not retried",
        lambda: attempt_of(S.QUEUED),
        Happened.RAISED,
        ValueError("x"),
        {"retries": always},
        Ending.STALE,
    ),
    (
        "late failed",
        lambda: attempt_of(S.CANCELLED),
        Happened.RAISED,
        ValueError("x"),
        {},
        Ending.LATE,
    ),
    (
        "late cancelled",
        lambda: attempt_of(S.CANCELLED),
        Happened.RAISED,
        asyncio.CancelledError(),
        {"cancelled": True},
        Ending.LATE,
    ),
    ("refused", attempt_of, Happened.REFUSED, KeyError("gone"), {}, Ending.REFUSED),
]


@pytest.mark.parametrize(
    ("make", "happened", "raised", "facts", "ending"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_happening_ends_in_one_row(
    make: Callable[[], Attempt],
    happened: Happened,
    raised: BaseException | None,
    facts: dict[str, Any],
    ending: Ending,
) -> None:
    verdict = classify(happened, make(), raised, **facts)
    assert verdict.ending is ending


def test_every_row_is_reachable() -> None:
    """No ending in the table that nothing can come to (TIMED_OUT: the tests below)."""
    reached = {case[-1] for case in CASES} | {Ending.TIMED_OUT}
    assert reached == set(Ending)


async def test_a_time_limit_ends_failed_with_its_timeout() -> None:
    attempt = await expired_attempt()
    verdict = classify(Happened.RAISED, attempt, asyncio.CancelledError(), cancelled=True)
    assert verdict.ending is Ending.TIMED_OUT
    assert isinstance(verdict.error, ExecutionTimeout)
    assert (verdict.ending.status, verdict.ending.outcome) == (S.FAILED, "failed")


async def test_a_time_limit_its_policy_retries_queues_the_next_attempt() -> None:
    attempt = await expired_attempt()
    verdict = classify(Happened.RAISED, attempt, asyncio.CancelledError(), retries=always)
    assert verdict.ending is Ending.RETRIED
    assert isinstance(verdict.error, ExecutionTimeout)


async def test_a_cancellation_asked_for_wins_over_an_expired_clock() -> None:
    attempt = await expired_attempt(CancelReason.REQUEST)
    verdict = classify(Happened.RAISED, attempt, asyncio.CancelledError(), cancelled=True)
    assert verdict == Verdict(Ending.CANCELLED, S.CANCELLED, reason=CancelReason.REQUEST)


def test_a_cancellation_from_outside_is_recorded_as_a_request() -> None:
    verdict = classify(Happened.NEVER_RAN, attempt_of())
    assert verdict.reason is CancelReason.REQUEST
    draining = classify(Happened.NEVER_RAN, attempt_of(), draining=True)
    assert draining.reason is CancelReason.SHUTDOWN


def test_rows_that_end_the_record_name_its_status_and_outcome() -> None:
    """The outcomes metrics count: every ending that writes an end counts it once."""
    for ending in Ending:
        if ending.status in {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST}:
            assert ending.outcome is not None, ending
    assert Ending.ABANDONED.outcome == "abandoned"
    assert Ending.HANDED_OFF.outcome == "handed_off"
    assert Ending.STALE.outcome is None and Ending.LATE.outcome is None
