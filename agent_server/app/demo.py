"""The embedded demo agent: what `agent-server run` serves when no APP is given.

It shows each way of running: sync, background, failure, a thread, and a long run that
reports each step as a live event and returns early when the server begins to drain.
"""

from __future__ import annotations

import asyncio
import time
from typing import Annotated

from pydantic import BaseModel, Field

from agent_server.app.agent import Agent
from agent_server.model.context import ExecutionContext

agent = Agent("demo")


class Message(BaseModel):
    text: str = Field(examples=["hello"])


@agent.reasoner()
async def echo(message: Message) -> Message:
    """Returns its input: the smallest round trip."""
    return message


@agent.reasoner(name="sleep", description="Sleeps, then echoes")
async def sleep_then_echo(seconds: float = 1.0, text: str = "done") -> dict[str, object]:
    await asyncio.sleep(seconds)
    return {"text": text, "slept": seconds}


@agent.reasoner()
async def fail(message: str = "boom") -> None:
    """Always raises: shows a failed execution."""
    raise RuntimeError(message)


@agent.reasoner()
def count_words(text: Annotated[str, Field(examples=["a few words"])]) -> int:
    """A plain `def`: runs in a worker thread."""
    return len(text.split())


@agent.reasoner()
async def research(
    steps: int = 10, step_seconds: float = 1.0, *, ctx: ExecutionContext
) -> dict[str, object]:
    """A long run that emits a `progress` event after each step and stops early when the
    server drains."""
    done = 0
    started = time.monotonic()
    for _ in range(steps):
        if ctx.draining:
            break
        drain = asyncio.ensure_future(ctx.wait_for_drain())
        try:
            await asyncio.wait({drain}, timeout=step_seconds)
        finally:
            drain.cancel()
        if ctx.draining:
            break
        done += 1
        await ctx.emit({"step": done, "of": steps}, event="progress")
    return {
        "steps_done": done,
        "steps_asked": steps,
        "stopped_early": done < steps,
        "seconds": round(time.monotonic() - started, 3),
    }
