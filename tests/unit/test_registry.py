"""InFlightRegistry in-process: task ownership, observation, ids, and the shutdown operations.

These drive the registry directly (no HTTP), because its guarantees are what session release
and the shutdown sequence are built on.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agent_server.model.context import ExecutionContext
from agent_server.model.execution import CancelReason, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerOptions
from agent_server.model.scheduling import RetryPolicy
from agent_server.runtime.registry import (
    ABANDONED_LINES,
    AdmissionError,
    InFlightRegistry,
    RejectReason,
)
from tests.apps.tests_app import (
    cooperative,
    deferred_cleanup,
    fail,
    sleep,
    swallow,
    swallow_then_fail,
)
from tests.support.local_parts import local_registry, make_local
from tests.support.loop_reports import loop_reports, settle_loop

#: Bound for every wait on an event in this file.
WAIT = 5.0


def reasoner(func: Callable[..., Any], name: str | None = None) -> Reasoner:
    return Reasoner(func, ReasonerOptions(name or func.__name__))


@pytest.fixture
async def observed(caplog: pytest.LogCaptureFixture) -> AsyncIterator[pytest.LogCaptureFixture]:
    """Fails the test if asyncio reports an unobserved exception or a destroyed pending task."""
    caplog.set_level(logging.DEBUG)
    async with loop_reports() as reports:
        yield caplog
    assert reports.unobserved() == []


async def started(registry: InFlightRegistry, func: Callable[..., Any], **kwargs: Any) -> Any:
    """Start an execution and let its task take its first step (it is inside the reasoner)."""
    execution = await registry.start(reasoner(func), kwargs)
    await asyncio.sleep(0)
    return execution


# -- the detector itself -----------------------------------------------------------------------


async def test_detector_sees_an_unretrieved_exception() -> None:
    """The check the other tests rely on really catches what it looks for."""

    async def boom() -> None:
        raise ValueError("nobody looks at me")

    async with loop_reports() as reports:
        task = asyncio.create_task(boom())
        await asyncio.wait({task}, timeout=WAIT)
        del task
    assert any("Task exception was never retrieved" in line for line in reports.unobserved())


async def test_detector_sees_a_destroyed_pending_task() -> None:
    async def forever() -> None:
        await asyncio.Event().wait()

    async with loop_reports() as reports:
        task = asyncio.create_task(forever())
        await asyncio.sleep(0)
        del task  # the loop holds only a weak reference: the task is lost
    assert any("Task was destroyed but it is pending" in line for line in reports.unobserved())


# -- ids and lookups -----------------------------------------------------------------------------


async def test_execution_ids_are_unique_and_random_looking(observed: object) -> None:
    registry = await local_registry(max_inflight=2000)
    echo = reasoner(sleep)
    ids = [
        (await registry.start(echo, {"seconds": 0.0, "marker": None})).execution_id
        for _ in range(500)
    ]
    assert len(set(ids)) == 500
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    # No shared prefix or counter pattern: the ids spread over the whole space.
    assert len({i[:4] for i in ids}) > 400
    assert len({i[-4:] for i in ids}) > 400
    assert await registry.wait_idle(time.monotonic() + WAIT)


async def test_a_lookup_returns_that_executions_own_outcome(observed: object) -> None:
    registry = await local_registry()

    async def double(n: int) -> int:
        await asyncio.sleep(0.001 * (n % 7))
        return n * 2

    func = reasoner(double)
    executions = {(await registry.start(func, {"n": n})).execution_id: n for n in range(50)}
    assert await registry.wait_idle(time.monotonic() + WAIT)
    for execution_id, n in executions.items():
        execution = await registry.store.get(execution_id)
        assert execution.execution_id == execution_id
        assert execution.status is ExecutionStatus.SUCCEEDED
        assert execution.result == n * 2


async def test_unknown_execution_is_not_found() -> None:
    registry = await local_registry()
    assert await registry.store.get("0" * 32) is None


# -- every task observed ---------------------------------------------------------------------------


async def test_failed_execution_is_recorded_and_observed(
    observed: pytest.LogCaptureFixture,
) -> None:
    registry = await local_registry()
    execution = await registry.start(reasoner(fail), {"message": "bad thing"})
    assert await execution.wait(WAIT)
    assert execution.status is ExecutionStatus.FAILED
    assert execution.error == {"type": "ValueError", "message": "bad thing"}
    assert registry.stats.outcomes["failed"] == 1
    # Logged with its traceback, for the operator.
    assert "Traceback" in observed.text and "bad thing" in observed.text


async def test_cancel_before_first_step_is_recorded(observed: object) -> None:
    """A task cancelled before it ever ran still ends its execution (cancelled, with reason)."""
    registry = await local_registry()
    execution = await registry.start(reasoner(sleep), {"seconds": 30.0, "marker": None})
    registry.cancel(execution.execution_id, CancelReason.REQUEST)
    assert await execution.wait(WAIT)
    assert execution.status is ExecutionStatus.CANCELLED
    assert execution.status_reason is CancelReason.REQUEST
    assert registry.inflight == 0
    assert registry.stats.outcomes["cancelled"] == 1


async def test_cancel_records_the_first_reason(observed: object) -> None:
    registry = await local_registry()
    execution = await started(registry, sleep, seconds=30.0, marker=None)
    registry.cancel(execution.execution_id, CancelReason.REQUEST)
    registry.cancel(execution.execution_id, CancelReason.SHUTDOWN)
    assert await execution.wait(WAIT)
    assert execution.status is ExecutionStatus.CANCELLED
    assert execution.status_reason is CancelReason.REQUEST
    # Cancelling a finished execution changes nothing.
    registry.cancel(execution.execution_id, CancelReason.SHUTDOWN)
    assert execution.status_reason is CancelReason.REQUEST


async def test_catching_cancel_and_returning_is_succeeded(observed: object) -> None:
    async def stubborn() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "finished anyway"
        return "not reached"

    registry = await local_registry()
    execution = await started(registry, stubborn)
    registry.cancel(execution.execution_id, CancelReason.REQUEST)
    assert await execution.wait(WAIT)
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert execution.result == "finished anyway"


async def test_running_tasks_are_strongly_referenced(observed: object) -> None:
    """Nothing but the registry holds the task; garbage collection must not destroy it."""
    registry = await local_registry()
    execution_id = (await started(registry, sleep, seconds=0.2, marker=None)).execution_id
    await settle_loop()
    execution = await registry.store.get(execution_id)
    assert await execution.wait(WAIT)
    assert execution.status is ExecutionStatus.SUCCEEDED


async def test_context_is_injected_and_sees_the_drain(observed: object) -> None:
    registry = await local_registry()
    seen: list[ExecutionContext] = []
    entered = asyncio.Event()

    async def watcher(ctx: ExecutionContext) -> bool:
        seen.append(ctx)
        entered.set()
        await ctx.wait_for_drain()
        return ctx.draining

    execution = await registry.start(reasoner(watcher), {}, session_id="s-ctx")
    coop = await registry.start(reasoner(cooperative), {"seconds": 30.0})
    await asyncio.wait_for(entered.wait(), WAIT)
    assert seen[0].execution_id == execution.execution_id
    assert seen[0].session_id == "s-ctx"
    assert seen[0].reasoner == "watcher"
    assert not seen[0].draining
    registry.begin_drain()
    assert registry.draining
    assert await execution.wait(WAIT) and execution.result is True
    assert await coop.wait(WAIT)
    assert coop.status is ExecutionStatus.SUCCEEDED
    assert coop.result["stopped_early"] is True


# -- admission ----------------------------------------------------------------------------------


async def test_capacity_and_closed_admission_refuse_with_a_reason(observed: object) -> None:
    registry = await local_registry(max_inflight=1)
    first = await started(registry, sleep, seconds=30.0, marker=None)
    with pytest.raises(AdmissionError) as refused:
        await registry.start(reasoner(sleep), {"seconds": 0.0, "marker": None})
    assert refused.value.reason is RejectReason.CAPACITY
    registry.close_admission()
    assert not registry.admitting
    with pytest.raises(AdmissionError) as refused:
        await registry.start(reasoner(sleep), {"seconds": 0.0, "marker": None})
    assert refused.value.reason is RejectReason.DRAINING
    assert registry.stats.rejected == {"capacity": 1, "draining": 1}
    assert registry.stats.started == 1
    registry.cancel(first.execution_id, CancelReason.SHUTDOWN)
    assert await first.wait(WAIT)


# -- the shutdown operations ---------------------------------------------------------------------


async def test_wait_idle_true_at_once_when_nothing_runs() -> None:
    registry = await local_registry()
    began = time.monotonic()
    assert await registry.wait_idle(began + 10)
    assert time.monotonic() - began < 0.1


async def test_wait_idle_returns_when_work_finishes(observed: object) -> None:
    registry = await local_registry()
    await started(registry, sleep, seconds=0.1, marker=None)
    began = time.monotonic()
    assert await registry.wait_idle(began + 10)
    assert 0.05 < time.monotonic() - began < 2.0


async def test_wait_idle_stops_at_the_deadline(observed: object) -> None:
    registry = await local_registry()
    execution = await started(registry, sleep, seconds=30.0, marker=None)
    began = time.monotonic()
    assert not await registry.wait_idle(began + 0.1)
    elapsed = time.monotonic() - began
    assert 0.08 < elapsed < 0.5
    assert execution.status is ExecutionStatus.RUNNING  # waiting cancels nothing
    registry.cancel_all(CancelReason.SHUTDOWN)
    assert await execution.wait(WAIT)


async def test_wait_idle_returns_early_on_interrupt(observed: object) -> None:
    registry = await local_registry()
    execution = await started(registry, sleep, seconds=30.0, marker=None)
    interrupt = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, interrupt.set)
    began = time.monotonic()
    assert not await registry.wait_idle(began + 10, interrupt=interrupt)
    assert time.monotonic() - began < 1.0
    registry.cancel_all(CancelReason.SHUTDOWN)
    assert await execution.wait(WAIT)


async def test_cancel_all_then_settle_counts_each_outcome(
    observed: pytest.LogCaptureFixture,
) -> None:
    """The shutdown path: cancel everything, settle by one deadline, abandon the rest."""
    registry = await local_registry()
    done = await started(registry, sleep, seconds=0.0, marker=None)
    failed = await started(registry, fail, message="x")
    assert await done.wait(WAIT) and await failed.wait(WAIT)
    cooperative_one = await started(registry, sleep, seconds=30.0, marker=None)
    stubborn = await started(registry, swallow, seconds=0.6)
    slow_cleanup = await started(registry, deferred_cleanup, cleanup=0.05)
    registry.begin_drain()
    registry.close_admission()

    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    assert len(tasks) == 3
    began = time.monotonic()
    abandoned = await registry.settle(tasks, began + 0.25)
    elapsed = time.monotonic() - began
    assert 0.2 < elapsed < 0.5, elapsed  # returns at the deadline, not when swallow ends
    assert [e.execution_id for e in abandoned] == [stubborn.execution_id]
    assert stubborn.status is ExecutionStatus.CANCELLED
    assert stubborn.status_reason is CancelReason.SHUTDOWN
    assert stubborn.abandoned
    for execution in (cooperative_one, slow_cleanup):
        assert execution.status is ExecutionStatus.CANCELLED
        assert execution.status_reason is CancelReason.SHUTDOWN
        assert not execution.abandoned
    assert registry.stats.started == 5
    assert registry.stats.outcomes == {"succeeded": 1, "failed": 1, "cancelled": 2, "abandoned": 1}
    assert registry.stats.ended == 5
    assert registry.inflight == 0
    assert registry.abandoned_pending == 1
    assert await registry.wait_idle(time.monotonic())  # abandoned work no longer counts

    # The abandoned task is still held and observed when it ends on its own.
    await settle_loop()
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0
    assert "ended later" in observed.text
    assert stubborn.status is ExecutionStatus.CANCELLED  # the record stays as reported


async def test_a_settle_that_abandons_many_logs_a_few_lines_and_counts_the_rest(
    observed: pytest.LogCaptureFixture,
) -> None:
    """Past the cancel deadline the process has no time to spare: abandoning thousands writes
    ABANDONED_LINES lines of their own and one for the rest, by reasoner; every one is still
    recorded abandoned."""
    registry = await local_registry()
    extra = 5
    stubborn = [
        await started(registry, swallow, seconds=0.4) for _ in range(ABANDONED_LINES + extra)
    ]
    registry.begin_drain()
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    abandoned = await registry.settle(tasks, time.monotonic() + 0.05)
    assert {e.execution_id for e in abandoned} == {e.execution_id for e in stubborn}
    assert all(e.abandoned and e.status is ExecutionStatus.CANCELLED for e in stubborn)
    assert registry.stats.outcomes["abandoned"] == ABANDONED_LINES + extra
    lines = [r.getMessage() for r in observed.records if "abandoned" in r.getMessage()]
    own = [line for line in lines if "abandoned: it did not settle" in line]
    assert len(own) == ABANDONED_LINES
    assert f"{extra} more executions abandoned" in " ".join(lines)
    assert f"swallow {extra}" in " ".join(lines)
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0


async def test_a_settle_ends_with_its_abandonments_done_by_its_deadline(
    observed: pytest.LogCaptureFixture,
) -> None:
    """Abandoning is work past the wait: the settle reserves what recording an end costs
    here (learnt from the ends before it) for each task still pending, so the phase ends by
    its deadline, abandonments included."""
    local = await make_local(max_inflight=500)
    registry = local.registry
    ending = local.store.end

    def slow_end(execution: Any) -> None:  # a store that takes 2 ms to record an end
        until = time.perf_counter() + 0.002
        while time.perf_counter() < until:
            pass
        ending(execution)

    local.store.end = slow_end  # type: ignore[method-assign]
    quick = [await started(registry, sleep, seconds=0.0, marker=None) for _ in range(100)]
    for execution in quick:  # 100 ends at 2 ms each: the registry learns what one costs
        assert await execution.wait(WAIT)
    stubborn = [await started(registry, swallow, seconds=4.0) for _ in range(100)]
    registry.begin_drain()
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    # A window of 2 s: its quarter (the most a reserve may take) is more than abandoning
    # 100 costs even on a loaded machine, so the reserve the registry learnt is what counts.
    deadline = time.monotonic() + 2.0
    abandoned = await registry.settle(tasks, deadline)
    overrun = time.monotonic() - deadline
    assert len(abandoned) == len(stubborn)
    # Abandoning 100 costs about 0.2 s here: without the reserve the settle ends that late.
    assert overrun < 0.1, overrun
    await registry.wait_abandoned(time.monotonic() + WAIT)


async def test_cancel_all_skips_work_that_just_ended(observed: object) -> None:
    """Right after an execution is recorded its task is still finishing (and, with nothing
    retained, its record already evicted): it is neither cancelled nor a crash."""
    registry = await local_registry(max_retained=0)
    execution = await registry.start(reasoner(sleep), {"seconds": 0.0, "marker": None})
    assert await execution.wait(WAIT)
    assert registry.cancel_all(CancelReason.SHUTDOWN) == []
    assert execution.status is ExecutionStatus.SUCCEEDED
    assert registry.stats.outcomes == {"succeeded": 1}


async def test_settle_without_deadline_waits_for_the_end(observed: object) -> None:
    registry = await local_registry()
    execution = await started(registry, deferred_cleanup, cleanup=0.1)
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    began = time.monotonic()
    assert await registry.settle(tasks, None) == []
    assert time.monotonic() - began >= 0.09
    assert execution.status is ExecutionStatus.CANCELLED
    assert registry.stats.outcomes["abandoned"] == 0


async def test_settle_with_a_passed_deadline_abandons_at_once(observed: object) -> None:
    registry = await local_registry()
    execution = await started(registry, swallow, seconds=0.3)
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    began = time.monotonic()
    abandoned = await registry.settle(tasks, began - 1.0)
    assert time.monotonic() - began < 0.1
    assert abandoned == [execution]
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0


async def test_abandoning_an_attempt_that_ended_in_the_same_turn_keeps_its_end(
    observed: object,
) -> None:
    """A release's deadline may abandon an execution whose task ended in the same loop turn
    (its end not yet observed): what that attempt came to stands. Here it failed with what
    its policy retries: the record stays queued for the next attempt, not abandoned."""
    registry = await local_registry()
    failed = asyncio.Event()

    async def flaky() -> None:
        failed.set()  # wakes this test before the task's end is observed
        raise ValueError("try again")

    policy = RetryPolicy(initial_delay=60.0)
    execution = await registry.start(Reasoner(flaky, ReasonerOptions("flaky", retry=policy)), {})
    await failed.wait()
    assert registry.abandon(execution.execution_id) is None
    assert registry.stats.outcomes["abandoned"] == 0
    stored = await registry.store.get(execution.execution_id)
    assert stored is not None and stored.status is ExecutionStatus.QUEUED
    assert not stored.abandoned
    assert await registry.wait_idle(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0


async def test_abandoned_task_that_raises_later_is_observed(
    observed: pytest.LogCaptureFixture,
) -> None:
    """Abandoned, dropped by everyone but the registry, then raises: the error is logged."""
    registry = await local_registry()
    execution = await started(registry, swallow_then_fail, linger=0.2)
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    abandoned = await registry.settle(tasks, time.monotonic() + 0.05)
    assert abandoned == [execution]
    del tasks, abandoned
    await settle_loop()
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0
    assert "gave up after swallowing cancellation" in observed.text
    assert execution.status is ExecutionStatus.CANCELLED
    assert registry.stats.outcomes == {"abandoned": 1}


async def test_thread_reasoner_is_waited_for_or_abandoned(observed: object) -> None:
    """A `def` reasoner cannot be cancelled: it is waited for, and abandoned at the deadline."""
    import threading

    release = threading.Event()

    def blocking() -> str:
        release.wait(WAIT)
        return "thread done"

    registry = await local_registry()
    execution = await started(registry, blocking)
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    abandoned = await registry.settle(tasks, time.monotonic() + 0.05)
    assert abandoned == [execution]
    release.set()
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0
    registry.close()


async def test_thread_reasoner_runs_in_a_worker_thread(observed: object) -> None:
    import threading

    def where() -> str:
        return threading.current_thread().name

    registry = await local_registry()
    execution = await registry.start(reasoner(where), {})
    assert await execution.wait(WAIT)
    assert execution.result.startswith("reasoner")
    assert execution.result != threading.current_thread().name
    registry.close()


async def test_many_mixed_executions_leave_nothing_unobserved(observed: object) -> None:
    """A bounded burst of every kind of ending; afterwards every task is accounted for."""
    registry = await local_registry(max_inflight=500)
    kinds: list[tuple[Callable[..., Awaitable[Any]], dict[str, Any]]] = [
        (sleep, {"seconds": 0.0, "marker": None}),
        (fail, {"message": "m"}),
        (sleep, {"seconds": 30.0, "marker": None}),
    ]
    executions = [await registry.start(reasoner(f), dict(kw)) for _ in range(40) for f, kw in kinds]
    await asyncio.sleep(0.01)
    tasks = registry.cancel_all(CancelReason.REQUEST)
    assert await registry.settle(tasks, time.monotonic() + WAIT) == []
    assert all(e.is_terminal for e in executions)
    assert registry.stats.ended == len(executions) == registry.stats.started
    assert registry.inflight == 0
