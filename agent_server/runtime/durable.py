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
from collections.abc import Callable

from pydantic import ValidationError

from agent_server.model import jsoncodec
from agent_server.model.execution import Execution
from agent_server.model.reasoner import Reasoner
from agent_server.model.versions import Rule, VersionMismatch, shown
from agent_server.runtime.logs import execution_fields
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import StoreUnavailable
from agent_server.store.roles import Claims

logger = logging.getLogger("agent_server.durable")

#: With capacity full, queued work is looked for again this often.
POLL_SECONDS = 1.0
#: Without a notice, the taker looks anyway this often (the renewal wakes it before).
IDLE_SECONDS = 60.0


class MigrationFailed(Exception):
    """A reasoner's `migrate=` raised: the execution fails with its exception."""

    def __init__(self, exception: Exception) -> None:
        super().__init__(str(exception))
        self.exception = exception


class QueueTaker:
    """Claims queued executions for this replica's registry."""

    def __init__(
        self,
        store: Claims,
        registry: InFlightRegistry,
        reasoners: dict[str, Reasoner],
        count_rule: Callable[[Rule, int], object] = lambda rule, count: None,
    ) -> None:
        """`count_rule`: told how each claim met its checkpoint's version (metrics)."""
        self.store = store
        self.registry = registry
        self.reasoners = reasoners
        self.count_rule = count_rule
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
                    await self._resume(execution)
            except StoreUnavailable:
                wait = POLL_SECONDS  # readiness says so; try again soon
            except Exception:  # a bug, not an outage: say so, and keep taking work
                logger.exception("taking queued work failed")
                wait = POLL_SECONDS

    async def _resume(self, execution: Execution) -> None:
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
            self._meet_version(execution, reasoner)
        except MigrationFailed as failed:  # it fails with the migration's own exception
            self.registry.refuse_claimed(execution, failed.exception)
            return
        except (LookupError, ValidationError, VersionMismatch) as exc:
            # A replica serving other code (a rollout that renamed the reasoner): the
            # execution ends failed here rather than circulating.
            self.registry.refuse_claimed(execution, exc)
            return
        if not await self.store.begin(execution):
            return  # not this replica's to begin: put back, or taken over
        if not self.registry.admitting:  # admission closed while the mark was on its way
            self.store.give_back(execution)
            return
        logger.info(
            "execution %s (%s): attempt %d taken from the queue",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            extra={"fields": execution_fields(execution)},
        )
        self.registry.resume(reasoner, arguments, execution)

    def _meet_version(self, execution: Execution, reasoner: Reasoner) -> None:
        """This code resumes the checkpoint as claim.lua decided (a store in this process
        has one version: its own): as it is, migrated, from the start, or not at all
        (VersionMismatch; a migration's own exception)."""
        versions = reasoner.versions
        rule = execution.version_rule
        if rule is Rule.NONE and execution.checkpoint is not None:
            rule = versions.reads(execution.checkpoint_version)
        execution.version = versions.version  # the code that runs this attempt
        if rule is Rule.NONE:
            return
        if rule is Rule.FAIL or rule is Rule.WAIT:  # WAIT: nobody to wait for, in here
            self.count_rule(Rule.FAIL, 1)
            raise VersionMismatch(reasoner.name, execution.checkpoint_version, versions.version)
        if rule is Rule.MIGRATE:
            assert versions.migrate is not None and execution.checkpoint is not None
            try:
                state = versions.migrate(
                    jsoncodec.loads(execution.checkpoint.encode()), execution.checkpoint_version
                )
                text = jsoncodec.dumps_recordable(state, "the migrated checkpoint").decode()
            except Exception as exc:
                self.count_rule(Rule.MIGRATE_FAILED, 1)
                raise MigrationFailed(exc) from exc
            execution.checkpoint = text
        self.count_rule(rule, 1)
        logger.info(
            "execution %s (%s): attempt %d %s a checkpoint of version %s on version %s",
            execution.execution_id,
            execution.reasoner,
            execution.attempt,
            "sets aside" if rule is Rule.RESTART else f"resumes ({rule.value})",
            shown(execution.checkpoint_version),
            shown(versions.version),
            extra={"fields": execution_fields(execution)},
        )
