"""The execution store: where records live, whichever replica runs the work.

One interface, three implementations: `memory` (one process, the embedded default),
`redis` and `postgres` (several replicas sharing one store). The registry keeps only what
must be local (the tasks this process runs, its admission gate, its drain); everything a
client may ask of any replica goes through here: records and their indexes, sessions being
released, cancel requests for the owner, completion notices for waiters, and replica
liveness. The interface is declared by role, one Protocol each (roles.py), and
`ExecutionStore` composes them; this module holds it and the store's errors. See
docs/architecture.md for which guarantee lives where.
"""

from __future__ import annotations

import abc
from typing import Any, Protocol

from agent_server.model.execution import Execution, ExecutionStatus

# Re-exported: the stores and the routes import them with the rest of the interface.
from agent_server.store.cursor import BadCursor as BadCursor
from agent_server.store.cursor import ListCursor as ListCursor
from agent_server.store.roles import (
    Asks,
    Claims,
    Events,
    Liveness,
    Reads,
    Records,
    Schedules,
    Sessions,
    Webhooks,
)
from agent_server.store.schedule_docs import Marks as Marks
from agent_server.store.schedule_docs import ScheduleLimit as ScheduleLimit
from agent_server.store.schedule_docs import new_schedules_version as new_schedules_version
from agent_server.store.values import FINISHED_EVENT as FINISHED_EVENT
from agent_server.store.values import INPUT_REQUIRED_EVENT as INPUT_REQUIRED_EVENT
from agent_server.store.values import AnswerHandler as AnswerHandler
from agent_server.store.values import CancelHandler as CancelHandler
from agent_server.store.values import Delivery as Delivery
from agent_server.store.values import Idempotency as Idempotency
from agent_server.store.values import Page as Page
from agent_server.store.values import UnqueuedHandler as UnqueuedHandler


class IdempotencyMismatch(Exception):
    """The key was first used for a different request (reasoner, session or body): 422."""


class IdempotencyForgotten(Exception):
    """The key's execution was forgotten (deleted, released or expired) while the key is
    still remembered: starting again would be a second run (409)."""


class StoreUnavailable(Exception):
    """The shared store cannot be reached now: new work and reads get 503."""


class SchemaTooNew(Exception):
    """The store's schema is newer than this code knows (a database migrated by a later
    release): the start stops with one line (exit 2) rather than write rows it cannot read."""


class StoreInDoubt(StoreUnavailable):
    """A write Redis ran that no replica was seen to hold in time (Sentinel): a failover may
    keep it or lose it, so the client is told neither. 503 + `Location` (the execution's
    record, read it later), never a 202 for a record that can vanish (section 12)."""

    def __init__(self, execution_id: str, what: str) -> None:
        super().__init__(f"{what} of execution {execution_id} is not yet held by a replica")
        self.execution_id = execution_id


class QueueFull(Exception):
    """`--max-queued` executions are queued already: a start that would queue is refused
    (429, as for capacity)."""


class SessionTaken(Exception):
    """Session policy `reject`: the session has an execution that is not terminal (409,
    naming it)."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(execution_id)
        self.execution_id = execution_id


class SessionReleasing(Exception):
    """The session is being released: new work for it is refused (409)."""


class ExecutionRunning(Exception):
    """An execution that is not terminal (running or queued) cannot be forgotten."""

    def __init__(self, execution_id: str, status: str = ExecutionStatus.RUNNING.value) -> None:
        super().__init__(execution_id)
        self.status = status


#: Why a shared store may refuse a write for a while (section 12, invariant 4): such a write
#: stays in the outbox and is retried; only a fencing refusal drops one.
WRITE_RETRY_REASONS = (
    "readonly",
    "oom",
    "loading",
    "busy",
    "masterdown",
    "tryagain",
    "noreplicas",
    "connection",
    "timeout",
)


class StoreObserver(Protocol):
    """Told what the store did; metrics implements it."""

    def store_operation(self, operation: str, seconds: float, ok: bool) -> None: ...

    def store_up(self, up: bool) -> None: ...

    def execution_lost(self, execution: Execution) -> None: ...

    def fenced_write(self, execution: Execution) -> None: ...

    def replicas_alive(self, count: int) -> None: ...

    def write_retried(self, reason: str) -> None: ...


class ExecutionStore(
    Liveness, Records, Reads, Claims, Asks, Events, Webhooks, Sessions, Schedules, abc.ABC
):
    """Records of every execution of one agent; shared by its replicas when remote. Every
    role of roles.py at once: what a store implements, and what a part that uses several
    roles takes."""

    def hand_off(self, execution: Execution) -> None:
        """A store in this process has nowhere to hand off to (`Claims.hand_off`)."""
        raise NotImplementedError("this store has nowhere to hand off to")

    async def answer(
        self, execution: Execution, request_id: int | None, value: Any
    ) -> Execution | None:
        """In one process the owner's registry decides (`Asks.answer`)."""
        if execution.status is not ExecutionStatus.INPUT_REQUIRED or self.on_answer is None:
            return None
        if not self.on_answer(execution.execution_id, request_id, value):
            return None
        return await self.get(execution.execution_id)
