"""A replica's claim runs only while its lease holds where the claim runs. After a failover
the new primary is a node that last saw every lease long ago: until this replica's renewal
lands there, its claims take nothing. Invariant: such a claim is never read as "nothing
is due", which would leave the taker asleep (up to its idle look, a minute) beside work
that is due now; the renewal wakes it, and it takes the work."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest
import redis.asyncio as aioredis

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store.base import ExecutionStore
from agent_server.store.redis.keys import Keys
from agent_server.store.values import OUTAGE_LEASES
from tests.support.stores import AGENT, Recorder, closed, open_postgres, open_redis

#: The bound of every wait here: a failing test fails this fast, never after the idle look.
WAIT = 15.0


async def lapse(url: str, replica: str) -> None:
    """This replica's lease, as a node that last saw it long ago holds it: lapsed."""
    if url.startswith("redis"):
        client = aioredis.Redis.from_url(url)
        try:
            await client.zadd(Keys(AGENT).replicas, {replica: 1})
        finally:
            await client.aclose()
        return
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE replicas SET expires_at = now() - interval '1 second'"
            " WHERE agent = %s AND replica = %s",
            (AGENT, replica),
        )


@pytest.mark.parametrize("backend", [pytest.param("redis", marks=pytest.mark.redis), "postgres"])
async def test_a_claim_refused_for_a_lapsed_lease_wakes_the_taker_once_renewed(
    backend: str, request: pytest.FixtureRequest
) -> None:
    url: str = request.getfixturevalue(f"{backend}_url")
    opener = open_redis if backend == "redis" else open_postgres
    store: ExecutionStore = opener(url, "A", Recorder(), lease_ttl=3.0)
    await store.open()
    try:
        due = Execution("sleep", None, "A")
        due.enqueue(time.time() + 0.2)
        assert await store.create(due, max_queued=10) is None
        assert due.scheduled_at is not None
        await asyncio.sleep(max(0.0, due.scheduled_at + 0.05 - time.time()))  # a time: due
        await lapse(url, "A")

        assert await store.claim() is None  # not while the lease has lapsed here
        # Nothing may be due "now" (a taker would spin on it) nor "never" (it would sleep).
        assert store.due_in() is None, store.due_in()
        async with asyncio.timeout(WAIT):  # woken by the renewal the refusal asked for
            await store.wait_queued(3600.0)
            while (taken := await store.claim()) is None:
                await store.wait_queued(3600.0)
        assert taken.execution_id == due.execution_id
        assert taken.attempt == 1
    finally:
        await closed(store)


async def lapsed_before(url: str, replica: str, seconds: float) -> None:
    """`replica`'s lease as an outage leaves it: lapsed `seconds` ago, not closed."""
    if url.startswith("redis"):
        client = aioredis.Redis.from_url(url)
        try:
            now_s, now_us = await client.time()
            lapsed = now_s * 1000 + now_us // 1000 - round(seconds * 1000)
            await client.zadd(Keys(AGENT).replicas, {replica: lapsed})
        finally:
            await client.aclose()
        return
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE replicas SET expires_at = now() - make_interval(secs => %s)"
            " WHERE agent = %s AND replica = %s",
            (seconds, AGENT, replica),
        )


@pytest.mark.parametrize("backend", [pytest.param("redis", marks=pytest.mark.redis), "postgres"])
async def test_an_owner_that_lapsed_during_an_outage_is_not_judged_by_the_first_back(
    backend: str, request: pytest.FixtureRequest
) -> None:
    """A store outage stops every renewal; the replica that reconnects first must not judge
    an owner that has not reconnected yet (a loaded machine, a slower backoff): an owner
    whose lease lapsed before the judge's renewals began again is judged only after
    OUTAGE_LEASES of the judge's leases, not after its one."""
    url: str = request.getfixturevalue(f"{backend}_url")
    opener = open_redis if backend == "redis" else open_postgres
    # The owner renews every 20 s: its lease is set lapsed below and stays so meanwhile.
    owner = opener(url, "A", Recorder(), lease_ttl=60.0)
    await owner.open()
    judge = opener(url, "B", Recorder(), lease_ttl=1.0)
    try:
        held = Execution("sleep", None, "A")
        assert await owner.create(held) is None
        await lapsed_before(url, "A", 5.0)
        began = time.monotonic()
        await judge.open()

        async def status() -> ExecutionStatus:
            found = await judge.get(held.execution_id)
            assert found is not None
            return found.status

        # Past one lease of its own the judge may judge; this owner lapsed before it began.
        await asyncio.sleep(max(0.0, began + 1.5 - time.monotonic()))
        assert await status() is ExecutionStatus.RUNNING
        async with asyncio.timeout(WAIT):
            while await status() is ExecutionStatus.RUNNING:  # judged at a renewal
                await judge.wait_queued(0.1)
        assert time.monotonic() - began >= OUTAGE_LEASES * 1.0 - 0.5
        assert await status() is ExecutionStatus.LOST
    finally:
        await closed(judge)
        await closed(owner)
