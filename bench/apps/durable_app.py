"""The agent bench.durable serves: `agent-server run durable_app:agent`, with bench/apps on
PYTHONPATH (see events_app.py). `BENCH_REDIS_URL` names the benchmark's Redis.

- `stamped` (resumable): writes `time.time()` at the start of each attempt to
  `bench:attempt:{execution_id}` (a hash, field = attempt number, value = "time pid"), then
  runs `seconds` on its first attempt and returns at once on later ones.
- `checkpoints` (resumable): `count` checkpoints of a small state, then returns.
- `asking` (resumable): stamps its attempt as `stamped` does, then `ctx.ask`s (bench.parked).
"""

from __future__ import annotations

import asyncio
import os
import time

import redis.asyncio as aioredis

from agent_server import Agent, ExecutionContext

agent = Agent("bench-durable")
_client: aioredis.Redis | None = None


def _redis() -> aioredis.Redis:
    global _client
    if _client is None:
        # Blocking: thousands of attempts starting at once wait for a connection.
        pool = aioredis.BlockingConnectionPool.from_url(
            os.environ["BENCH_REDIS_URL"], max_connections=64, timeout=60
        )
        _client = aioredis.Redis(connection_pool=pool)
    return _client


@agent.reasoner(resumable=True, max_attempts=3)
async def stamped(ctx: ExecutionContext, seconds: float = 600.0) -> dict[str, int]:
    """Records when this attempt began (before anything else), then works."""
    began = time.time()
    await _redis().hset(
        f"bench:attempt:{ctx.execution_id}", str(ctx.attempt), f"{began:.6f} {os.getpid()}"
    )
    if ctx.attempt == 1:
        await asyncio.sleep(seconds)
    return {"attempt": ctx.attempt}


@agent.reasoner(resumable=True, max_attempts=3)
async def checkpoints(ctx: ExecutionContext, count: int = 0) -> int:
    """`count` checkpoints, then returns how many it made."""
    for n in range(count):
        await ctx.checkpoint({"done": n + 1})
    return count


@agent.reasoner(resumable=True, max_attempts=3)
async def asking(ctx: ExecutionContext) -> dict[str, object]:
    """Records when this attempt began (as `stamped`), then asks: parked with a shared
    store, waiting in its task with the memory store; returns the answer."""
    if os.environ.get("BENCH_REDIS_URL"):
        await _redis().hset(
            f"bench:attempt:{ctx.execution_id}",
            str(ctx.attempt),
            f"{time.time():.6f} {os.getpid()}",
        )
    answer = await ctx.ask("go?")
    return {"answer": answer, "attempt": ctx.attempt}
