"""The agent bench.events serves: `agent-server run events_app:agent`, with bench/apps on
PYTHONPATH (a top-level module, so the server's `agent_server` can come from another
checkout: the working directory, `--source`).

- `burst`: after `delay` seconds (readers attach), emits `count` small events as fast as it
  can, letting the loop run every `yield_every` events; returns the wall-clock times of its
  first and last emit.
- `hold`: runs (emitting nothing) until the drain begins: the execution idle streams follow.
"""

from __future__ import annotations

import asyncio
import time

from agent_server import Agent, ExecutionContext

agent = Agent("bench-events")


@agent.reasoner()
async def burst(
    ctx: ExecutionContext, count: int = 1000, delay: float = 0.0, yield_every: int = 1
) -> dict[str, float]:
    """Emits `count` events `{"n": i}` as fast as it can after `delay` seconds; the loop
    runs (readers are served) every `yield_every` events, as a model's tokens arriving over
    a socket would let it."""
    if delay:
        await asyncio.sleep(delay)
    began = time.time()
    for n in range(count):
        await ctx.emit({"n": n})
        if yield_every and (n + 1) % yield_every == 0:
            await asyncio.sleep(0)
    return {"emitted": count, "began": began, "ended": time.time()}


@agent.reasoner()
async def hold(ctx: ExecutionContext) -> str:
    """In flight until the drain begins."""
    await ctx.wait_for_drain()
    return "drained"
