"""Reasoners that are `async def` generators: `agent-server run generators_app:agent`
(cwd: tests/apps/). Each `yield` is an `output` event; the result is the list yielded."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext


class Token(BaseModel):
    text: str
    n: int


def _mark(name: str) -> None:
    folder = os.environ.get("TESTS_MARKER_DIR")
    if folder:
        Path(folder, name).touch()


agent = Agent("generators")


@agent.reasoner()
async def words(text: str = "hello streaming world", pause: float = 0.0) -> AsyncIterator[str]:
    """Yields the words of `text`, `pause` seconds apart."""
    for word in text.split():
        yield word
        if pause:
            await asyncio.sleep(pause)


@agent.reasoner()
async def tokens(count: int = 3) -> AsyncIterator[Token]:
    """Yields models: the events and the result are their JSON."""
    for n in range(count):
        yield Token(text=f"t{n}", n=n)


@agent.reasoner()
async def mixed(ctx: ExecutionContext, count: int = 2):  # type: ignore[no-untyped-def]
    """Unannotated, with a context: its own progress events and its yields, in order."""
    for n in range(count):
        await ctx.emit({"step": n})
        yield {"value": n}


@agent.reasoner()
async def endless(marker: str = "endless") -> AsyncIterator[int]:
    """Yields forever; marks `<marker>.closed` when closed (its `finally` ran)."""
    n = 0
    try:
        while True:
            yield n
            n += 1
            if n == 3:
                _mark(marker)
            await asyncio.sleep(0.01)
    finally:
        _mark(f"{marker}.closed")


@agent.reasoner()
async def stubborn(marker: str = "stubborn") -> AsyncIterator[int]:
    """Swallows its cancellation and yields on: stopped and closed all the same."""
    n = 0
    while True:
        try:
            yield n
            n += 1
            if n == 3:
                _mark(marker)
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            _mark(f"{marker}.swallowed")
        except GeneratorExit:
            _mark(f"{marker}.closed")
            raise


@agent.reasoner()
async def wrong(count: int = 2) -> AsyncIterator[int]:
    """Yields a value its annotation refuses after `count` good ones: the run fails."""
    for n in range(count):
        yield n
    yield "not a number"  # type: ignore[misc]


@agent.reasoner()
async def failing(after: int = 2) -> AsyncIterator[int]:
    """Raises after `after` yields: the events stay, the run fails."""
    for n in range(after):
        yield n
    raise RuntimeError(f"failed after {after}")
