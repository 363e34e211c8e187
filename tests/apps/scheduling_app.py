"""Reasoners with time limits, retries and delayed starts, for tests/process/test_scheduling.py.

Each start appends one line to `starts.log` in `SCHEDULING_MARKS` (a directory the test
shares with every replica; the marker directory otherwise): the execution id, the attempt
and the wall time at which the reasoner really began. The test reads what ran from there,
not from the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from agent_server import Agent, ExecutionContext, RetryPolicy

agent = Agent("scheduling-tests")


def _marks() -> Path:
    return Path(os.environ.get("SCHEDULING_MARKS") or os.environ["TESTS_MARKER_DIR"])


def mark(ctx: ExecutionContext, **fields: Any) -> None:
    """One line per start, appended in one write (O_APPEND: whole lines across processes)."""
    line = json.dumps({"id": ctx.execution_id, "attempt": ctx.attempt, "at": time.time(), **fields})
    fd = os.open(_marks() / "starts.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


class Flaky(RuntimeError):
    """What `flaky` raises before its last attempt."""


@agent.reasoner(timeout=0.5)
async def slow(ctx: ExecutionContext, seconds: float = 30.0) -> str:
    """Runs past its 0.5 s limit unless told a shorter time."""
    mark(ctx)
    await asyncio.sleep(seconds)
    return "done"


@agent.reasoner(timeout=0.6)
async def patient(ctx: ExecutionContext, work: float = 0.3) -> Any:
    """Waits for an answer (not counted against its 0.6 s limit), then works `work` s."""
    answer = await ctx.ask("go?")
    await asyncio.sleep(work)
    return answer


@agent.reasoner(retry=RetryPolicy(max_attempts=3, initial_delay=0.2, backoff=2, retry_on=(Flaky,)))
async def flaky(ctx: ExecutionContext, succeed_on: int = 3) -> dict[str, int]:
    """Fails with Flaky until attempt `succeed_on`."""
    mark(ctx)
    if ctx.attempt < succeed_on:
        raise Flaky(f"attempt {ctx.attempt} fails")
    return {"attempt": ctx.attempt}


@agent.reasoner(retry=RetryPolicy(max_attempts=2, initial_delay=0.1, retry_on=(Flaky,)))
async def picky(ctx: ExecutionContext) -> str:
    """Raises what its policy does not retry: fails at once."""
    mark(ctx)
    raise ValueError("not retried")


@agent.reasoner(timeout=0.3, retry=RetryPolicy(max_attempts=2, initial_delay=0.1))
async def stuck(ctx: ExecutionContext) -> str:
    """Times out on every attempt: retried once, then failed with ExecutionTimeout."""
    mark(ctx)
    await asyncio.sleep(30)
    return "never"


@agent.reasoner()
async def stamp(ctx: ExecutionContext) -> float:
    """Says when it began (a delayed start must not begin before its `scheduled_at`)."""
    mark(ctx)
    return time.time()


@agent.reasoner()
async def hold(ctx: ExecutionContext, seconds: float = 30.0) -> str:
    """Holds a slot of --max-inflight for `seconds`."""
    mark(ctx)
    await asyncio.sleep(seconds)
    return "held"


@agent.reasoner(max_concurrency=2, concurrency_key="header:X-Tenant")
async def limited(ctx: ExecutionContext, tenant: str, seconds: float = 0.3) -> str:
    """At most 2 at once per X-Tenant, across replicas: marks its start and its end."""
    mark(ctx, tenant=tenant, event="start")
    try:
        await asyncio.sleep(seconds)
    finally:
        mark(ctx, tenant=tenant, event="end")
    return tenant


@agent.reasoner(max_concurrency=1)
async def single(ctx: ExecutionContext, seconds: float = 0.1) -> str:
    """One at a time for the whole reasoner."""
    mark(ctx, tenant="*", event="start")
    try:
        await asyncio.sleep(seconds)
    finally:
        mark(ctx, tenant="*", event="end")
    return "one"


@agent.reasoner()
async def chat(ctx: ExecutionContext, text: str, seconds: float = 0.2) -> str:
    """One message of a session: marks its start and its end (tenant: the session)."""
    mark(ctx, tenant=ctx.session_id or "", event="start", text=text)
    try:
        await asyncio.sleep(seconds)
    finally:
        mark(ctx, tenant=ctx.session_id or "", event="end", text=text)
    return text


@agent.reasoner(max_concurrency=1, concurrency_key="header:X-Tenant")
async def gate(ctx: ExecutionContext, tenant: str, seconds: float = 0.1) -> str:
    """One at a time per X-Tenant: marks its start and its end."""
    mark(ctx, tenant=tenant, event="start")
    try:
        await asyncio.sleep(seconds)
    finally:
        mark(ctx, tenant=tenant, event="end")
    return tenant


@agent.reasoner("session", max_concurrency=1, concurrency_key="header:X-Tenant")
async def session_named(ctx: ExecutionContext, seconds: float = 0.1) -> str:
    """A reasoner named like the session policy's keys, keyed on a header: its limit is its
    own, never a session's turn."""
    mark(ctx, tenant="session-named", event="start")
    try:
        await asyncio.sleep(seconds)
    finally:
        mark(ctx, tenant="session-named", event="end")
    return "mine"


@agent.reasoner()
async def stubborn(ctx: ExecutionContext, seconds: float = 30.0) -> str:
    """Swallows cancellation and goes on for `seconds` (an interrupt must not wait for it)."""
    mark(ctx, tenant=ctx.session_id or "", event="start")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue
    mark(ctx, tenant=ctx.session_id or "", event="end")
    return "stubborn"


@agent.reasoner(retry=RetryPolicy(max_attempts=27, initial_delay=0.0, retry_on=(Flaky,)))
async def persistent(ctx: ExecutionContext) -> int:
    """Fails 26 times, at once each, then succeeds: more moves than a history keeps."""
    if ctx.attempt < 27:
        raise Flaky(f"attempt {ctx.attempt} fails")
    return ctx.attempt


@agent.reasoner(resumable=True)
async def parks(ctx: ExecutionContext) -> Any:
    """Asks once; on a shared store its task ends while it waits (parked)."""
    return await ctx.ask("go?")
