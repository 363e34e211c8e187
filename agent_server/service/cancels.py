"""Cancelling an execution for a caller: one that asked (`cancel`), and one that left while
it waited (`for_caller_gone`), wherever the execution is: running here, elsewhere, queued or
parked."""

from __future__ import annotations

import asyncio
import logging

from agent_server.model.execution import CancelReason, Execution
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import ExecutionStore, StoreUnavailable

logger = logging.getLogger("agent_server.api")

#: Seconds a cancel for a caller that left may take to reach the store.
CANCEL_WITHIN = 5.0


class Cancels:
    """Cancels executions, given the registry and the store."""

    def __init__(self, registry: InFlightRegistry, store: ExecutionStore) -> None:
        self.registry = registry
        self.store = store

    async def request(self, execution: Execution) -> None:
        """A cancel request (`request`) to wherever it is, for a front that shows nothing
        of what follows (MCP's `tasks/cancel`). Raises StoreUnavailable."""
        if not execution.is_terminal:
            await self.store.request_cancel(execution, CancelReason.REQUEST, None)

    async def cancel(self, execution: Execution, wait: float = 0.0) -> Execution:
        """A cancel request (`request`) to wherever it is; the execution as it is then: a
        queued or parked one ends where it waits (read again), and one that runs is given
        up to `wait` seconds to end. Raises StoreUnavailable."""
        if execution.is_terminal:
            return execution
        nobody = execution.owned_by_nobody  # queued or parked: the store ends it where it is
        await self.request(execution)
        latest = (await self.store.get(execution.execution_id) if nobody else None) or execution
        if latest.is_terminal or wait <= 0:
            return latest
        try:
            async with asyncio.timeout(wait):
                return await self.store.wait(latest, None)  # the record as it ended
        except TimeoutError:  # still running: as it is now
            return await self.store.get(execution.execution_id) or latest

    async def for_caller_gone(
        self, execution: Execution, reason: CancelReason = CancelReason.CLIENT_DISCONNECTED
    ) -> None:
        """The caller of a waiting call left (or, `reason`, could never answer it): its work
        is cancelled wherever it is, running here or queued (ended where it waits) or taken
        by another replica meanwhile, within CANCEL_WITHIN. A store that cannot be reached
        leaves it running, said once."""
        if self.registry.cancel(execution.execution_id, reason):
            return
        try:
            async with asyncio.timeout(CANCEL_WITHIN):
                latest = await self.store.get(execution.execution_id)
                if latest is not None and not latest.is_terminal:
                    await self.store.request_cancel(latest, reason, None)
        except (StoreUnavailable, TimeoutError) as exc:  # it runs on; said once
            logger.warning(
                "execution %s: its caller left, not cancelled: %s", execution.execution_id, exc
            )
