"""The reasoners bench/scheduling.py measures: the same trivial work with no limit, with a
concurrency limit that never binds, and with a limit of one (whose starts and ends it marks)."""

from __future__ import annotations

import os
import time

from agent_server import Agent

agent = Agent("scheduling-bench")


@agent.reasoner()
async def free() -> int:
    return 1


@agent.reasoner(max_concurrency=100_000)
async def limited() -> int:
    return 1


def _mark(kind: str) -> None:
    fd = os.open(os.environ["SCHEDULING_BENCH_MARKS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{kind} {time.monotonic()}\n".encode())
    finally:
        os.close(fd)


@agent.reasoner(max_concurrency=1)
async def one() -> int:
    """One at a time: each start and end is a line `start|end <monotonic>` in MARKS."""
    _mark("start")
    _mark("end")
    return 1
