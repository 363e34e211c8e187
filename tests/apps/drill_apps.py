"""Agents for `agent-server drill` (tests/process/test_drill.py), served from tests/apps/:
`drill_apps:cooperative` (shutdown-safe), `drill_apps:swallowing` (a reasoner that swallows
its cancellation), `drill_apps:blocking` (a reasoner that blocks the loop with `time.sleep`),
`drill_apps:threaded` (a `def` reasoner, whose thread cannot be cancelled),
`drill_apps:strict` (a required input with neither example nor default)."""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from pydantic import Field

from agent_server import Agent, ExecutionContext

cooperative = Agent("cooperative")
swallowing = Agent("swallowing")
blocking = Agent("blocking")
threaded = Agent("threaded")
strict = Agent("strict")


@cooperative.reasoner()
async def steps(ctx: ExecutionContext, count: int = 100, step: float = 0.1) -> dict[str, int]:
    """Checks `ctx.draining` between steps and returns what it has."""
    done = 0
    for _ in range(count):
        if ctx.draining:
            break
        await asyncio.sleep(step)
        done += 1
    return {"done": done}


@cooperative.reasoner()
async def patient(seconds: float = 600.0) -> str:
    """Ignores the drain, but ends at once when cancelled (it settles)."""
    await asyncio.sleep(seconds)
    return "slept"


@cooperative.reasoner()
async def greet(name: Annotated[str, Field(examples=["Ada"])]) -> str:
    """Its input comes from its schema's example."""
    return f"hello {name}"


async def _ignore_cancellation(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue


@swallowing.reasoner()
async def stubborn(seconds: float = 600.0) -> str:
    """Catches every CancelledError and keeps going: it can only be abandoned."""
    await _ignore_cancellation(seconds)
    return "outlived"


@swallowing.reasoner()
async def quick() -> str:
    return "done"


def crunch(seconds: float) -> None:
    """Stands in for synchronous work called from `async def` (a blocking client, say)."""
    time.sleep(seconds)


@blocking.reasoner()
async def hog(seconds: float = 2.5) -> str:
    """Blocks the event loop: every other request waits."""
    crunch(seconds)
    return "done"


@blocking.reasoner(name="quick")
async def blocking_quick() -> str:
    return "done"


@threaded.reasoner()
def sleeper(seconds: float = 30.0) -> str:
    """A plain `def` runs in a worker thread: cancelled, it goes on, and is abandoned."""
    time.sleep(seconds)
    return "woke"


@strict.reasoner()
async def needs(text: str) -> str:
    return text
