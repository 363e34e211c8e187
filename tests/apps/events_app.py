"""Reasoners whose events the protocol fronts carry (tests/process/test_protocol_events.py):
one that emits, one that yields, and one that emits around a question, so a subscriber
joins with events kept before it and live ones after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from agent_server import Agent, ExecutionContext

agent = Agent("events-test", default_reasoner="emitter")


@agent.reasoner()
async def emitter(
    ctx: ExecutionContext, count: int = 3, pause: float = 0.05, tag: str = "e"
) -> dict[str, int]:
    """Emits `count` `step` events, `pause` seconds apart."""
    for n in range(1, count + 1):
        await ctx.emit({"n": n, "tag": tag}, event="step")
        await asyncio.sleep(pause)
    return {"emitted": count}


@agent.reasoner()
async def counter(count: int = 3, pause: float = 0.05) -> AsyncIterator[Any]:
    """Yields `count` values of different kinds, `pause` seconds apart."""
    for n in range(1, count + 1):
        yield {"n": n} if n % 2 else f"value {n}"
        await asyncio.sleep(pause)


@agent.reasoner()
async def around(ctx: ExecutionContext, before: int = 2) -> dict[str, Any]:
    """Emits `before` events, asks a question, then emits one more with the answer."""
    for n in range(1, before + 1):
        await ctx.emit({"n": n}, event="before")
    answer = await ctx.ask("go on?", schema=str)
    await ctx.emit({"answer": answer}, event="after")
    return {"answer": answer}
