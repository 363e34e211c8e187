"""The batcher the Postgres store shares statements with (store/postgres/coalesce.py).
Invariant: every caller gets the answer for its own key, or the failure of the statement
that carried it, and never waits on a caller that left; at most `in_flight` statements run
at once, and a lone call is its own statement."""

from __future__ import annotations

import asyncio

import pytest

from agent_server.store.postgres.coalesce import Coalesced


class Statements:
    """A `run` that records each statement's keys and is released by the test."""

    def __init__(self) -> None:
        self.sent: list[list[int]] = []
        self.running = 0
        self.most_running = 0
        self.release = asyncio.Event()
        self.fail: BaseException | None = None

    async def __call__(self, keys: list[int]) -> list[str]:
        self.sent.append(keys)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.wait_for(self.release.wait(), 5)
            if self.fail is not None:
                raise self.fail
            return [f"v{key}" for key in keys]
        finally:
            self.running -= 1


async def test_a_lone_call_is_its_own_statement_in_its_own_task() -> None:
    run = Statements()
    run.release.set()
    batch: Coalesced[int, str] = Coalesced(run)
    assert await batch(7) == "v7"
    assert run.sent == [[7]]
    await batch.close()


async def test_calls_that_wait_share_the_next_statement_and_each_gets_its_own() -> None:
    run = Statements()
    batch: Coalesced[int, str] = Coalesced(run, in_flight=2)
    calls = [asyncio.create_task(batch(key)) for key in range(50)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert run.sent == [[0], [1]]  # two alone, the rest wait
    run.release.set()
    assert await asyncio.gather(*calls) == [f"v{key}" for key in range(50)]
    assert sorted(key for keys in run.sent for key in keys) == list(range(50))
    assert len(run.sent) == 3 and run.most_running <= 2
    await batch.close()


async def test_a_statement_that_fails_fails_each_of_its_callers_only() -> None:
    run = Statements()
    batch: Coalesced[int, str] = Coalesced(run, in_flight=1)
    first = asyncio.create_task(batch(0))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(batch(key)) for key in (1, 2, 3)]
    await asyncio.sleep(0)
    run.fail = ConnectionError("gone")
    run.release.set()
    for call in (first, *waiting):
        with pytest.raises(ConnectionError):
            await call
    run.fail = None
    assert await batch(4) == "v4"  # the batcher is whole after a failure
    await batch.close()


async def test_a_waiting_caller_that_leaves_leaves_the_others_answered() -> None:
    run = Statements()
    batch: Coalesced[int, str] = Coalesced(run, in_flight=1)
    first = asyncio.create_task(batch(0))
    await asyncio.sleep(0)
    waiting = {key: asyncio.create_task(batch(key)) for key in (1, 2, 3)}
    await asyncio.sleep(0)
    waiting[2].cancel()
    run.release.set()
    assert await first == "v0"
    assert await waiting[1] == "v1" and await waiting[3] == "v3"
    with pytest.raises(asyncio.CancelledError):
        await waiting[2]
    await batch.close()
    assert run.running == 0
