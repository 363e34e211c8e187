"""Taking queued work: the next attempt of an execution another replica handed off at its
shutdown, or of one whose owner died (resumable reasoners, shared store only); a retry once
its backoff has passed, a delayed start once due, and a start queued while every replica was
full (any store: the memory store queues within its process).

One task per replica, owned by the agent's lifespan: it claims work while this replica
admits new work and has capacity, woken by the store's `queued` notice (the liveness
renewal, which sees the queue's length, wakes it too in case a notice was missed), and
every `POLL_SECONDS` after a claim left work behind (capacity was full). Claiming is one
atomic script in the store: the claimed record is running under this replica before anything
else can see it, so a replica that dies right after claiming is caught by its liveness like
any other owner. While nothing is due the taker sleeps until the next scheduled execution
is (`store.due_in`), or until a notice says something was queued.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from agent_server.model.execution import Execution
from agent_server.model.reasoner import Reasoner
from agent_server.runtime.logs import execution_fields
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import ExecutionStore, StoreUnavailable

logger = logging.getLogger("agent_server.durable")

#: With capacity full, queued work is looked for again this often.
POLL_SECONDS = 1.0
#: Without a notice, the taker looks anyway this often (the renewal wakes it before).
IDLE_SECONDS = 60.0


class QueueTaker:
    """Claims queued executions for this replica's registry."""

    def __init__(
        self, store: ExecutionStore, registry: InFlightRegistry, reasoners: dict[str, Reasoner]
    ) -> None:
        self.store = store
        self.registry = registry
        self.reasoners = reasoners
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="queue-taker")

    async def close(self) -> None:
        """Stop taking work and observe the task's end."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("taking queued work failed")

    async def _run(self) -> None:
        # The first look is at once: work queued before this replica started (a slot freed
        # while it was down) sends no notice it could have heard.
        wait = 0.0
        full = False
        while True:
            due = None if full else self.store.due_in()  # full: what is due waits anyway
            await self.store.wait_queued(wait if due is None else min(wait, due))
            wait, full = IDLE_SECONDS, False
            try:
                while True:
                    if not self.registry.can_take:
                        wait, full = POLL_SECONDS, True  # work may be left: look again soon
                        break
                    execution = await self.store.claim()
                    if execution is None:
                        break
                    if not self.registry.admitting:  # admission closed while it was on its way
                        self.store.give_back(execution)
                        break
                    self._resume(execution)
            except StoreUnavailable:
                wait = POLL_SECONDS  # readiness says so; try again soon
            except Exception:  # a bug, not an outage: say so, and keep taking work
                logger.exception("taking queued work failed")
                wait = POLL_SECONDS

    def _resume(self, execution: Execution) -> None:
        reasoner = self.reasoners.get(execution.reasoner)
        try:
            if reasoner is None:
                raise LookupError(
                    f"reasoner {execution.reasoner!r} is not resumable here: this replica "
                    "does not serve it"
                )
            # A later attempt follows a body that began (or may have, in a process now
            # gone): a hand-off or retry of one that ran, a dead owner judged, an earlier
            # process's take repaired. A take whose body never began keeps its attempt
            # (unclaim.lua), so its first run is never refused here.
            if execution.attempt > 1 and not (reasoner.resumable or reasoner.retry):
                raise LookupError(f"reasoner {execution.reasoner!r} is not resumable here")
            execution.resumable = reasoner.resumable
            arguments = reasoner.bind(execution.body)
        except (LookupError, ValidationError) as exc:
            # A replica serving other code (a rollout that renamed the reasoner): the
            # execution ends failed here rather than circulating.
            self.registry.refuse_claimed(execution, exc)
            return
        logger.info(
            "execution %s (%s): attempt %d taken from the queue",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            extra={"fields": execution_fields(execution)},
        )
        self.registry.resume(reasoner, arguments, execution)
