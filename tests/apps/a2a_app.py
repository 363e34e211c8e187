"""Reasoners reached over A2A, for tests/process/test_a2a.py: one taking one string (a text
part), one taking an object and returning one, one returning a list, a slow one to cancel,
one asking for input, one that fails, and a resumable one handed off at a rollout."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext


class Approval(BaseModel):
    approved: bool
    note: str = ""


agent = Agent("a2a-test", default_reasoner="echo")


def _mark(name: str) -> None:
    """Touch a marker file, so a test synchronises on a reasoner having started."""
    folder = os.environ.get("TESTS_MARKER_DIR")
    if folder:
        Path(folder, name).touch()


@agent.reasoner()
async def echo(text: str) -> str:
    """Say the text back, upper-cased."""
    return text.upper()


@agent.reasoner()
async def add(a: int, b: int) -> dict[str, int]:
    """Add two integers."""
    return {"sum": a + b}


@agent.reasoner()
async def listing(n: int = 3) -> list[int]:
    """The first n integers: a result that is not an object."""
    return list(range(n))


@agent.reasoner()
async def slow(seconds: float = 30.0, marker: str | None = None) -> dict[str, float]:
    """Sleep, so a test can cancel or subscribe meanwhile."""
    if marker:
        _mark(marker)
    await asyncio.sleep(seconds)
    return {"slept": seconds}


@agent.reasoner()
async def approve(ctx: ExecutionContext, amount: int = 100) -> dict[str, Any]:
    """Ask for an approval, then for a note (a string), and say what was decided."""
    answer = await ctx.ask(f"approve {amount}?", schema=Approval)
    note = await ctx.ask("a note?", schema=str)
    return {"approved": answer.approved, "amount": amount, "note": note}


@agent.reasoner()
async def broken() -> str:
    """Fail."""
    raise ValueError("broken on purpose")


@agent.reasoner(resumable=True, max_attempts=3)
async def steps(ctx: ExecutionContext, count: int = 10, pause: float = 0.3) -> dict[str, int]:
    """Checkpoint after each step; a later attempt resumes after the last one recorded."""
    _mark(f"steps-attempt-{ctx.attempt}")
    state = ctx.checkpoint_state or {"done": 0}
    for step in range(int(state["done"]), count):
        await asyncio.sleep(pause)
        await ctx.checkpoint({"done": step + 1})
    return {"steps": count, "attempt": ctx.attempt}


#: An agent whose default reasoner is none of its reasoners: `--a2a` refuses to start it.
misnamed = Agent("a2a-misnamed", default_reasoner="nope")
misnamed.reasoner()(echo)
