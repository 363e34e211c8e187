"""The agent the scale benchmarks serve: `agent-server run bench.bench_app:agent` (cwd: repo root).

- `echo`: the demo's echo (a retained finished execution with a small result).
- `park`: in flight until the drain begins, holding nothing of its own (memory per execution).
- `cooperative`: a sleeper that returns early once the server drains.
- `swallow`: catches every cancellation and keeps going; it can only be abandoned.
- `deferred_cleanup`: on cancellation, cleans up for `cleanup` seconds, then ends cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext

agent = Agent("bench")


class Message(BaseModel):
    text: str


@agent.reasoner()
async def echo(message: Message) -> Message:
    """Returns its input."""
    return message


@agent.reasoner()
async def park(ctx: ExecutionContext) -> str:
    """Waits for the drain; the smallest in-flight execution."""
    await ctx.wait_for_drain()
    return "drained"


@agent.reasoner()
async def cooperative(ctx: ExecutionContext, seconds: float = 600.0) -> bool:
    """Sleeps up to `seconds`, returning early (True) once the server drains."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await ctx.wait_for_drain()
    return ctx.draining


@agent.reasoner()
async def swallow(seconds: float = 600.0) -> str:
    """Catches every CancelledError and keeps going."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue
    return "outlived"


@agent.reasoner()
async def deferred_cleanup(cleanup: float = 0.35, robust: bool = True) -> str:
    """On cancellation, spends `cleanup` seconds cleaning up, then ends cancelled.

    `robust`: the cleanup completes even if cancelled again meanwhile (as closing a connection
    must); otherwise a second cancellation interrupts it.
    """
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await finish_cleanup(cleanup, robust)
        raise
    return "not reached"


async def finish_cleanup(seconds: float, robust: bool) -> None:
    """Clean up for `seconds`; with `robust`, further cancellations wait for it to finish."""
    cleanup = asyncio.ensure_future(asyncio.sleep(seconds))
    if not robust:
        await asyncio.shield(cleanup)
        return
    while not cleanup.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(cleanup)
