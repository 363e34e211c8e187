"""The owner's writes that go through the outbox, in order and fenced by owner and attempt:
events, the end, hand-offs, retries and unclaims. A part of `RedisStore` that no role is
forwarded to: the parts of `Records`, `Claims` and `Events` (records.py, claims.py,
reads.py) write through it, and so does the repair (liveness.py)."""

from __future__ import annotations

import asyncio

from agent_server.model.events import Event
from agent_server.model.execution import Execution
from agent_server.model.waiting import Closing, recorded_within
from agent_server.store import roles
from agent_server.store.redis import codec
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.outbox import Outbox


class OwnerWrites:
    """The outbox writes of `RedisStore`; `webhooks` keeps the handler an end may wake."""

    def __init__(
        self,
        outbox: Outbox,
        keys: Keys,
        row_codec: RowCodec,
        *,
        max_events: int,
        webhooks: roles.Webhooks,
    ) -> None:
        self._outbox = outbox
        self._keys = keys
        self._codec = row_codec
        self._max_events = max_events
        self._webhooks = webhooks

    def emit(self, execution: Execution, event: Event) -> None:
        """Through the outbox, in order with the end: XADD to the execution's capped stream
        (fenced by owner and attempt) and a notice to readers on other replicas."""
        self._outbox.put(
            execution,
            "emit",
            self._keys.script.for_emit(execution.execution_id),
            [
                execution.replica,
                str(execution.attempt),
                str(event.id),
                event.event,
                event.data,
                str(self._max_events),
            ],
        )

    def end(self, execution: Execution) -> None:
        """Queue the end for the outbox writer (its arguments taken now); `recorded` tells
        when it is in Redis."""
        execution.recorded = asyncio.get_running_loop().create_future()
        keys = self._keys.script.for_end(execution.execution_id, execution.replica)
        self._outbox.put(execution, "end", keys, self._codec.end_args(execution))
        # Once written, a delivery may be owed (records.lua): the sender looks at once. A
        # resumed attempt's URL is in the hash only (the sender's next look finds it too).
        wake = self._webhooks.on_webhook
        if wake is not None and (execution.webhook_url is not None or execution.attempt > 1):
            execution.recorded.add_done_callback(lambda _: wake())

    async def recorded(
        self, execution: Execution, timeout: float, closing: Closing | None = None
    ) -> bool:
        """Whether the end is in Redis within `timeout` seconds (and before `closing` is
        set): False when it was refused (fenced), could not be kept, or is still owed."""
        return await recorded_within(execution.recorded, timeout, closing)

    def hand_off(self, execution: Execution) -> None:
        """Through the outbox, fenced: the record goes to `queued` with attempt + 1."""
        self._queue_next(execution, "")

    def unclaim(self, execution: Execution, token: str) -> None:
        """Through the outbox, fenced by owner, attempt and claim: an execution taken here
        whose answer was lost, so its body never started, goes back to the head of the
        queue with its attempt unchanged (`unclaim.lua`)."""
        body = "" if execution.body is None else codec.dumps(execution.body)
        self._outbox.put(
            execution,
            "unclaim",
            self._keys.script.for_unclaim(execution.execution_id, execution.replica),
            [execution.execution_id, execution.replica, str(execution.attempt), token, body],
        )

    def retry(self, execution: Execution, delay: float) -> None:
        """As a hand-off, the next attempt due after `delay` seconds on Redis's clock."""
        self._queue_next(execution, str(max(0, round(delay * 1000))))

    def _queue_next(self, execution: Execution, delay_ms: str) -> None:
        """`handoff.lua`, through the outbox: one script for both, fenced like an end."""
        self._outbox.put(
            execution,
            "handoff",
            self._keys.script.for_handoff(execution.execution_id, execution.replica),
            [
                execution.execution_id,
                execution.replica,
                str(execution.attempt),
                self._keys.queued,
                delay_ms,
            ],
        )
