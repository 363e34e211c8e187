"""The app the end-to-end tests serve: `agent-server run tests_app:agent` (cwd: tests/)."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext, Settings


class Text(BaseModel):
    text: str


def _mark(name: str) -> None:
    """Touch a marker file so a test can synchronise on a reasoner having started."""
    folder = os.environ.get("TESTS_MARKER_DIR")
    if folder:
        Path(folder, name).touch()


async def echo(message: Text) -> Text:
    return message


async def sleep(seconds: float = 1.0, marker: str | None = None) -> dict[str, float]:
    if marker:
        _mark(marker)
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def cooperative(ctx: ExecutionContext, seconds: float = 60.0) -> dict[str, object]:
    """Returns early, with a partial result, once the server begins to drain."""
    started = time.monotonic()
    drain = asyncio.ensure_future(ctx.wait_for_drain())
    try:
        await asyncio.wait({drain}, timeout=seconds)
    finally:
        drain.cancel()
    return {"stopped_early": ctx.draining, "seconds": time.monotonic() - started}


async def swallow(seconds: float = 600.0) -> str:
    """Catches every CancelledError and keeps going: can only be abandoned."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue
    return "outlived"


async def deferred_cleanup(cleanup: float = 0.35) -> str:
    """On cancellation, spends `cleanup` seconds cleaning up, then ends cancelled."""
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.sleep(cleanup))
        raise
    return "not reached"


async def block_loop(seconds: float = 600.0, marker: str | None = None) -> str:
    """Blocks the event loop: only the watchdog can end the process."""
    if marker:
        _mark(marker)
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    return "woke"


async def fail(message: str = "boom") -> None:
    raise ValueError(message)


def thread_sleep(seconds: float = 0.1) -> float:
    time.sleep(seconds)
    return seconds


REASONERS = [echo, sleep, cooperative, swallow, deferred_cleanup, block_loop, fail, thread_sleep]


def make_agent(settings: Settings | None = None) -> Agent:
    """A fresh agent (own registry and metrics) with every test reasoner."""
    fresh = Agent("tests", settings)
    for func in REASONERS:
        fresh.reasoner()(func)
    return fresh


agent = make_agent()
