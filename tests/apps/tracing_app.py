"""The app tests/process/test_tracing.py serves: reasoners that log through their own logger
(async and `def`), emit events, and a resumable one that is handed off."""

from __future__ import annotations

import logging

from tests_app import steps

from agent_server import Agent, ExecutionContext

logger = logging.getLogger("tracing_app")

agent = Agent("tracing")


@agent.reasoner()
async def chatter(ctx: ExecutionContext, count: int = 3) -> dict[str, int]:
    """Logs one line of its own, then emits `count` progress events."""
    logger.info("chatter begins with %d events", count)
    for n in range(count):
        await ctx.emit({"n": n}, event="progress")
    return {"emitted": count}


@agent.reasoner()
def blocking(word: str = "hi") -> str:
    """A `def` reasoner (it runs in a thread) that logs a line of its own."""
    logger.info("blocking says %s", word)
    return word


agent.reasoner(resumable=True, max_attempts=3)(steps)
