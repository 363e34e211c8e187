"""Reasoners for the edges of every front (tests/process/test_protocol_edges.py,
tests/process/test_cli_edges.py): one that asks a boolean then an integer question (what a
v0.3 A2A client must be able to answer), one that fails with pydantic's many-line error,
and enough others that a refusal naming the reasoners has to stop listing them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext

agent = Agent("edges-test", default_reasoner="confirm")

#: How many filler reasoners the agent serves besides its own: more than a refusal lists.
FILLERS = 30
#: How many reasoners of its own it serves (confirm, note, add, invalid).
OWN = 4


class Count(BaseModel):
    count: int


@agent.reasoner()
async def confirm(ctx: ExecutionContext, item: str) -> dict[str, Any]:
    """Ask whether to go on (a boolean), then how many (an integer)."""
    go = await ctx.ask(f"order {item}?", schema=bool)
    many = await ctx.ask("how many?", schema=int)
    return {"item": item, "go": go, "count": many}


@agent.reasoner()
async def note(ctx: ExecutionContext, topic: str) -> dict[str, str]:
    """Ask for a note of free text: what bounds it is the server's --max-answer-bytes."""
    return {"topic": topic, "note": await ctx.ask(f"a note on {topic}?", schema=str)}


@agent.reasoner()
async def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@agent.reasoner()
async def invalid() -> int:
    """Fail with a pydantic ValidationError, whose message spans four lines."""
    Count.model_validate({"count": "many"})
    return 0


def _filler(number: int) -> Any:
    async def filler() -> int:
        return number

    filler.__doc__ = f"Filler {number}."
    return filler


for _number in range(FILLERS):
    agent.reasoner(name=f"filler_{_number:02d}")(_filler(_number))
