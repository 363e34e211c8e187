"""Agents for `agent-server drill` (tests/process/test_drill.py), served from tests/apps/:
`drill_apps:cooperative` (shutdown-safe), `drill_apps:swallowing` (a reasoner that swallows
its cancellation), `drill_apps:blocking` (a reasoner that blocks the loop with `time.sleep`),
`drill_apps:threaded` (a `def` reasoner, whose thread cannot be cancelled),
`drill_apps:strict` (a required input with neither example nor default, and a pattern),
`drill_apps:asking` (reasoners that wait for input: `ctx.ask`, resumable or not),
`drill_apps:limited` (a reasoner with `max_concurrency=1`: one runs, the rest wait queued)."""

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
asking = Agent("asking")
limited = Agent("limited")


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
async def needs(text: Annotated[str, Field(pattern="^[A-Z]{3}$")]) -> str:
    """No example, no default, and a pattern no plain value is sure to fit."""
    return text


@asking.reasoner()
async def ask(ctx: ExecutionContext, question: str = "go on?") -> str:
    """Waits inside its task for an answer that never comes (until the drain deadline)."""
    answer = await ctx.ask(question)
    return f"answered {answer}"


@asking.reasoner(resumable=True)
async def ask_later(ctx: ExecutionContext, question: str = "go on?") -> str:
    """Resumable: with a shared store its wait is parked (no task); in memory, as `ask`."""
    answer = await ctx.ask(question)
    return f"answered {answer}"


@asking.reasoner(name="quick")
async def asking_quick() -> str:
    return "done"


@limited.reasoner(max_concurrency=1)
async def single(seconds: float = 600.0) -> str:
    """One at a time: the first runs until the drain deadline cancels it, the rest queue."""
    await asyncio.sleep(seconds)
    return "slept"


@limited.reasoner(max_concurrency=1, resumable=True)
async def single_later(seconds: float = 600.0) -> str:
    """Resumable `single`: with a shared store the running one is handed off at the drain
    deadline, and the queued ones stay queued; in memory, as `single`."""
    await asyncio.sleep(seconds)
    return "slept"


@limited.reasoner(name="quick")
async def limited_quick() -> str:
    return "done"
