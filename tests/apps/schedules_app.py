"""Reasoners started by schedules, for tests/process/test_schedules.py.

Each start (and each end) appends one JSON line to `firings.log` in `SCHEDULE_MARKS` (a
directory the test shares with every replica; the marker directory otherwise): the witness
outside the server that counts the executions each firing started.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from agent_server import Agent, ExecutionContext, Principal, Schedule

agent = Agent("schedule-tests")


@agent.authorize
async def no_start(principal: Principal, action: str, resource: dict[str, Any]) -> bool:
    """A principal with the scope `nostart` may do all but start work; one with `own` may
    make and list schedules, and read, change, delete or trigger its own only (the resource
    of `schedule` names the schedule's owner)."""
    if "own" in principal.scopes and action == "schedule":
        if resource.get("operation") in ("create", "list"):
            return resource.get("owner", principal.identity) == principal.identity
        return resource.get("owner") == principal.identity
    return not ("nostart" in principal.scopes and action == "start")


#: Which reasoners' schedules this process declares: `SCHEDULES=tick,slow_skip,...`.
ON = set(filter(None, os.environ.get("SCHEDULES", "tick").split(",")))
#: How long the overlap reasoners run (seconds).
SLOW = float(os.environ.get("SCHEDULE_SLOW", "2.5"))


def mark(ctx: ExecutionContext, what: str, **fields: Any) -> None:
    """One line, appended in one write (O_APPEND: whole lines across processes)."""
    marks = Path(os.environ.get("SCHEDULE_MARKS") or os.environ["TESTS_MARKER_DIR"])
    line = json.dumps(
        {
            "id": ctx.execution_id,
            "reasoner": ctx.reasoner,
            "what": what,
            "at": time.time(),
            **fields,
        }
    )
    fd = os.open(marks / "firings.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def declared(name: str, *schedules: Schedule) -> list[Schedule]:
    return list(schedules) if name in ON else []


@agent.reasoner(schedules=declared("tick", Schedule("*/2 * * * * *", input={"tag": "every 2 s"})))
async def tick(ctx: ExecutionContext, tag: str = "") -> str:
    mark(ctx, "start", tag=tag)
    return tag


@agent.reasoner(
    schedules=declared("short", Schedule("*/2 * * * * *", catchup_window=5, input={"tag": "s"}))
)
async def short(ctx: ExecutionContext, tag: str = "") -> str:
    mark(ctx, "start", tag=tag)
    return tag


async def _slow(ctx: ExecutionContext) -> None:
    mark(ctx, "start")
    try:
        await asyncio.sleep(SLOW)
    except asyncio.CancelledError:
        mark(ctx, "cancelled")
        raise
    mark(ctx, "end")


@agent.reasoner(schedules=declared("slow_skip", Schedule("* * * * * *")))
async def slow_skip(ctx: ExecutionContext) -> None:
    await _slow(ctx)


@agent.reasoner(schedules=declared("slow_buffer", Schedule("* * * * * *", overlap="buffer_one")))
async def slow_buffer(ctx: ExecutionContext) -> None:
    await _slow(ctx)


@agent.reasoner(schedules=declared("slow_all", Schedule("* * * * * *", overlap="allow_all")))
async def slow_all(ctx: ExecutionContext) -> None:
    await _slow(ctx)


@agent.reasoner(schedules=declared("slow_cancel", Schedule("* * * * * *", overlap="cancel_other")))
async def slow_cancel(ctx: ExecutionContext) -> None:
    await _slow(ctx)


@agent.reasoner()
async def plain(n: int = 0) -> int:
    """Not scheduled: for the API's schedules."""
    return n


#: The release this process plays: release 2 renamed `counted`'s parameter, and declares
#: `report` as REPORT_CRON and REPORT_TAG say (its cron and input changed in code).
RELEASE = os.environ.get("SCHEDULE_RELEASE", "1")

if RELEASE == "1":

    @agent.reasoner()
    async def counted(n: int = 0) -> int:
        """Not scheduled: an API schedule's input binds it in release 1 only."""
        return n

else:

    @agent.reasoner()
    async def counted(count: int = 0) -> int:
        """The same reasoner after a release renamed its parameter."""
        return count


@agent.reasoner(
    schedules=declared(
        "report",
        Schedule(
            os.environ.get("REPORT_CRON", "0 0 1 1 *"),
            input={"tag": os.environ.get("REPORT_TAG", "old")},
        ),
    )
)
async def report(ctx: ExecutionContext, tag: str = "") -> str:
    mark(ctx, "start", tag=tag)
    return tag
