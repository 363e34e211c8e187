"""Input waits (`ctx.ask`): the `InputChannel` of every attempt's context.

Records a request in the store, waits for its answer (by notice, looking at the record
now and then with a shared store), stops an attempt's clock while it waits, and hands an
answer the store took to the attempt that waits for it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from agent_server.model.asks import Question, Reply
from agent_server.model.execution import Execution
from agent_server.runtime.attempts import Attempts
from agent_server.runtime.observer import RegistryObserver
from agent_server.store.base import ExecutionStore

#: A reasoner waiting for an answer through a shared store looks at its record this often
#: (seconds), in case the answer's notice was missed.
ANSWER_RECHECK = 5.0


class InputWaits:
    """What `ctx.ask` asks of the runtime: the store behind it, and metrics told."""

    def __init__(
        self, store: ExecutionStore, attempts: Attempts, observer: RegistryObserver | None
    ) -> None:
        self.store = store
        self.attempts = attempts
        self.observer = observer

    async def record_ask(
        self, execution: Execution, question: Question, timeout: float | None
    ) -> Reply:
        """A resumable execution is parked where the store can queue it (section 13): its
        task ends, and no drain waits for a person."""
        park = execution.resumable and self.store.supports_handoff
        return await self.store.ask(execution, question, park, timeout)

    async def await_answer(
        self,
        execution: Execution,
        request_id: int,
        waiter: asyncio.Future[Any],
        timeout: float | None,
    ) -> Any:
        """The answer handed to `waiter`; TimeoutError after `timeout` seconds. With a shared
        store the answer comes by pub/sub, and a notice may be missed (a reconnect): every
        ANSWER_RECHECK seconds the record is looked at for an answer taken."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        shared = self.store.shared
        while True:
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                raise TimeoutError
            pause = left if not shared else min(left or ANSWER_RECHECK, ANSWER_RECHECK)
            await asyncio.wait({waiter}, timeout=pause)
            if waiter.done():
                return waiter.result()
            if shared and (deadline is None or loop.time() < deadline):
                answered, value = await self.store.poll_answer(execution, request_id)
                if answered:
                    execution.take_answer(request_id, value)
                    return value

    async def expire_ask(self, execution: Execution, request_id: int) -> tuple[bool, Any]:
        return await self.store.expire_ask(execution, request_id)

    def ask_ended(self, execution: Execution, asked: bool, seconds: float) -> None:
        """The clock stops while the attempt waits (`asked`) and goes on once it ended."""
        attempt = self.attempts.of(execution)
        clock = None if attempt is None else attempt.clock
        if clock is not None:
            clock.pause() if asked else clock.run()
        if self.observer is not None:
            self.observer.input_waiting(execution, asked, seconds)

    def answer(self, execution_id: str, request_id: int | None, value: Any) -> bool:
        """Hand an answer the store took to the `ctx.ask` waiting here; False when none
        waits for it (it ended meanwhile)."""
        attempt = self.attempts.live.get(execution_id)
        return attempt is not None and attempt.answer(request_id, value)
