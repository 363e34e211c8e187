"""The app of the console's browser tests (tests/process/test_console.py): a reasoner that
echoes (markup included), one that holds until cancelled, one whose result, events and
error carry markup, and one that asks with a schema of every kind the answer form makes."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext

agent = Agent("console-tests")

#: What a page would run if it took a value for markup.
MARKUP = '<img src=x onerror="window.__injected=1"><script>window.__injected=2</script>'


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str
    floor: int


class Order(BaseModel):
    approved: bool
    amount: int
    ratio: float
    note: str
    color: Color
    address: Address
    tags: list[str]


@agent.reasoner()
async def echo(text: str) -> dict[str, str]:
    return {"text": text}


@agent.reasoner()
async def hold(ctx: ExecutionContext, seconds: float = 120.0) -> str:
    """Says it started, then runs until cancelled (or `seconds`)."""
    await ctx.emit({"started": True}, event="progress")
    await asyncio.sleep(seconds)
    return "held"


@agent.reasoner()
async def marked(ctx: ExecutionContext, text: str = MARKUP) -> dict[str, str]:
    """Markup in an event and in its result."""
    await ctx.emit({"note": text}, event="progress")
    return {"text": text}


@agent.reasoner()
async def explode(text: str = MARKUP) -> None:
    """Markup in its error's message."""
    raise ValueError(text)


@agent.reasoner()
async def order(ctx: ExecutionContext) -> dict[str, Any]:
    """Asks for an Order and returns it as it was typed."""
    answer = await ctx.ask({"question": "the order?", "markup": MARKUP}, schema=Order)
    return answer.model_dump(mode="json")


@agent.reasoner(resumable=True, max_attempts=3)
async def steps(ctx: ExecutionContext, count: int = 600) -> dict[str, int]:
    """Resumable: a checkpoint every step of 0.1 s, so a drain hands it off mid-way."""
    done = int((ctx.checkpoint_state or {}).get("done", 0))
    while done < count:
        await asyncio.sleep(0.1)
        done += 1
        await ctx.checkpoint({"done": done})
    return {"done": done, "attempt": ctx.attempt}
