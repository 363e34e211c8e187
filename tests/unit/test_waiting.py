"""The small parts an idle connection waits with: `Flag` (uvicorn's per-connection events),
`Pipeline` (its queue of pipelined requests), `Waiters` and `Ticks` (what an event stream
waits on instead of a timer and callbacks of its own). On a real event loop."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from agent_server.http.http_limits import Pipeline
from agent_server.http.sse import Ticks
from agent_server.model.waiting import Flag, Waiters

TIMEOUT = 5.0


async def test_a_flag_wakes_its_waiters_and_can_be_cleared() -> None:
    flag = Flag()
    waiting = [asyncio.create_task(flag.wait()) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(task.done() for task in waiting)
    flag.set()
    async with asyncio.timeout(TIMEOUT):
        assert await asyncio.gather(*waiting) == [True, True, True]
    assert await flag.wait() is True  # set: at once
    flag.clear()
    assert not flag.is_set()
    again = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    assert not again.done()
    flag.set()
    async with asyncio.timeout(TIMEOUT):
        await again


async def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    flag = Flag()
    waiting = asyncio.create_task(flag.wait())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not flag._waiters  # nothing kept for a waiter that left
    flag.set()
    assert flag.is_set()


async def test_a_flag_made_set_does_not_wait() -> None:
    async with asyncio.timeout(TIMEOUT):
        assert await Flag(True).wait() is True


def test_the_pipeline_is_first_in_first_out_like_uvicorns_deque() -> None:
    pipeline = Pipeline()
    assert not pipeline
    for n in range(3):
        pipeline.appendleft(n)  # type: ignore[arg-type]
    assert len(pipeline) == 3
    assert [pipeline.pop() for _ in range(3)] == [0, 1, 2]


async def test_waiters_wake_once_and_skip_those_gone() -> None:
    loop = asyncio.get_running_loop()
    waiters = Waiters()
    kept, cancelled = loop.create_future(), loop.create_future()
    waiters.update((kept, cancelled))
    cancelled.cancel()
    waiters.wake()
    assert kept.done() and kept.result() is None
    assert not waiters  # a wake is for those waiting now; the next wait adds itself again


async def test_a_tick_comes_at_or_after_its_deadline_and_is_shared() -> None:
    loop = asyncio.get_running_loop()
    ticks = Ticks(0.05)
    deadline = math.ceil((loop.time() + 0.2) / 0.05) * 0.05 - 0.04  # early in its tick
    tick = ticks.at(loop, deadline)
    assert ticks.at(loop, deadline + 0.01) is tick  # one timer for the deadlines of one tick
    assert ticks.at(loop, deadline + 0.1) is not tick
    woken = loop.create_future()
    tick.add(woken)
    async with asyncio.timeout(TIMEOUT):
        await woken
    assert loop.time() >= deadline - 0.002  # never early (the loop's clock resolution aside)


def test_ticks_follow_the_running_loop() -> None:
    """A tick made on a loop that is gone would never fire: the next loop makes its own."""
    ticks = Ticks(0.05)
    deadline = time.monotonic() + 0.3  # asyncio's loop clock

    async def make_a_tick() -> None:
        ticks.at(
            asyncio.get_running_loop(), deadline
        )  # its timer is on this loop, gone before it fires

    async def wait_for_it() -> None:
        loop = asyncio.get_running_loop()
        woken = loop.create_future()
        ticks.at(loop, deadline).add(woken)
        async with asyncio.timeout(TIMEOUT):
            await woken

    asyncio.run(make_a_tick())
    asyncio.run(wait_for_it())
