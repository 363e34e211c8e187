"""Cancel, settle and abandon: the bounded waits session releases and the shutdown share.

Settling uses `asyncio.wait` with the time left to one deadline: `wait_for(gather(...))`
would wait past its deadline for a task that swallows `CancelledError`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Collection

from agent_server.model.execution import CancelReason, Execution
from agent_server.runtime.attempt import Attempt
from agent_server.runtime.attempts import Attempts
from agent_server.store.base import ExecutionStore

#: The registry's lines keep the logger name users know, whichever part writes them.
logger = logging.getLogger("agent_server.registry")

#: Executions a settle abandons that each get a log line of their own; the rest are counted
#: in one line, by reasoner (a drain that abandons 10,000 would otherwise write 10,000 lines
#: past its deadline, the time a grace period does not have).
ABANDONED_LINES = 20
#: Abandoning one execution costs about this many times recording an end (the bookkeeping
#: around it); a settle reserves that much per pending task before its deadline.
ABANDON_COST = 2.0
#: Times a settle looks again at what is still pending before its reserve is spent.
SETTLE_LOOKS = 3


class Settler:
    """Cancels attempts, waits for them within a deadline, and gives up on the rest."""

    def __init__(self, store: ExecutionStore, attempts: Attempts) -> None:
        self.store = store
        self.attempts = attempts

    def cancel(
        self, execution_id: str, reason: CancelReason, settle_within: float | None = None
    ) -> bool:
        """Cancel one execution this process runs; the first reason given is the one
        recorded. With `settle_within`, it is abandoned if it has not ended by then.
        False when it does not run here (any more)."""
        attempt = self.attempts.live.get(execution_id)
        if attempt is None:
            return False
        execution = attempt.execution
        if execution.is_terminal:
            return False
        if execution.cancel_reason is None:
            execution.cancel_reason = reason
        attempt.task.cancel()
        if settle_within is not None:
            asyncio.get_running_loop().call_later(settle_within, self._abandon_late, attempt)
        return True

    def cancel_all(self, reason: CancelReason) -> list[asyncio.Task[None]]:
        """Cancel every running execution; returns their tasks for `settle`. At shutdown
        with a store that can hand off, resumable executions are handed off once settled
        (or abandoned) instead of ending cancelled."""
        hand_off = reason is CancelReason.SHUTDOWN and self.store.supports_handoff
        tasks: list[asyncio.Task[None]] = []
        for key, attempt in list(self.attempts.live.items()):
            execution = attempt.execution
            if hand_off and execution.resumable and not execution.is_terminal:
                attempt.handing_off = True
            if self.cancel(key, reason):
                tasks.append(attempt.task)
        return tasks

    async def settle(
        self, tasks: Collection[asyncio.Task[None]], deadline: float | None
    ) -> list[Execution]:
        """Wait for `tasks` until `deadline` (monotonic; None waits without bound).

        What has not ended by then is abandoned and returned, the abandoning done by the
        deadline too (the wait stops a little before it). Never waits past the deadline.
        """
        pending = {task for task in tasks if not task.done()}
        if pending and deadline is None:
            _, pending = await asyncio.wait(pending)
        # Abandoning is work too (each is recorded, counted and stored): the wait stops early
        # enough that abandoning what is still pending ends by the deadline, re-estimated as
        # tasks settle, and never by more than a quarter of the time there was to settle.
        window = 0.0 if deadline is None else max(0.0, deadline - time.monotonic())
        for _ in range(SETTLE_LOOKS):
            if not pending or deadline is None:
                break
            reserve = min(len(pending) * self.attempts.end_seconds * ABANDON_COST, window / 4)
            remaining = deadline - reserve - time.monotonic()
            if remaining <= 0:
                break
            _, pending = await asyncio.wait(pending, timeout=remaining)
        by_task = {attempt.task: attempt for attempt in self.attempts.live.values()}
        abandoned: list[Execution] = []
        in_threads: list[str] = []
        for task in pending:
            attempt = by_task.get(task)
            if task.done() or attempt is None:  # ended in the same loop turn as the timeout
                continue
            in_thread = attempt.in_thread
            execution = self.attempts.give_up(attempt, say=len(abandoned) < ABANDONED_LINES)
            if execution is not None:
                if len(abandoned) >= ABANDONED_LINES and in_thread:
                    in_threads.append(execution.execution_id)
                abandoned.append(execution)
        if len(abandoned) > ABANDONED_LINES:
            rest = abandoned[ABANDONED_LINES:]
            by_reasoner = Counter(execution.reasoner for execution in rest)
            logger.warning(
                "%d more executions abandoned: they did not settle after cancellation (%s); "
                "each is recorded cancelled and abandoned",
                len(rest),
                ", ".join(f"{name} {count}" for name, count in by_reasoner.most_common()),
                extra={
                    "fields": {  # the ids, for a JSON log (the drill reads them)
                        "abandoned_executions": [e.execution_id for e in rest],
                        "in_threads": in_threads,
                    }
                },
            )
        return abandoned

    def abandon(self, execution_id: str) -> Execution | None:
        """Abandon now an execution this process runs, if it still does."""
        attempt = self.attempts.live.get(execution_id)
        return None if attempt is None else self.attempts.give_up(attempt)

    def _abandon_late(self, attempt: Attempt) -> None:
        if not attempt.task.done():
            self.attempts.give_up(attempt)

    async def wait_idle(self, deadline: float, interrupt: asyncio.Event | None = None) -> bool:
        """Wait until nothing runs, the deadline passes, or `interrupt` is set; True if idle."""
        idle = self.attempts.idle
        if idle.is_set():
            return True
        timeout = max(0.0, deadline - time.monotonic())
        waiters = [asyncio.create_task(idle.wait())]
        if interrupt is not None:
            waiters.append(asyncio.create_task(interrupt.wait()))
        try:
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)
        return idle.is_set()

    async def wait_abandoned(self, deadline: float) -> None:
        """Give abandoned tasks until `deadline` to end late (bounded, never required)."""
        if self.attempts.abandoned:
            timeout = max(0.0, deadline - time.monotonic())
            await asyncio.wait(list(self.attempts.abandoned), timeout=timeout)
