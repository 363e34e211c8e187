"""A schedule's firing whose create got no answer, settled by the repair, in process
against a real redis-server (docs/guarantees.md, docs/schedules.md).

A firing's execution id is the fire time's (runtime/schedule_entries.py `firing_id`), so the
ticker's retry sends the same id again, with the same idempotency key and body. The repair
settles the create whose answer was lost: it voids that create when Redis never ran it, and
runs it here when Redis did. Invariants: the given-up create never lands (a start refused
is never run later); the retry of the same firing is not refused for it (the firing starts
once Redis takes writes again, not a day later); and the settle runs only the record its own
create made (a record the retry made, already running here, is not started a second time).
A full Redis (OOM) refuses the first create: its answer is an error Redis gives mid-script,
which the store cannot tell from a partial write, so the create is in doubt.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store.base import Idempotency, StoreUnavailable
from agent_server.store.redis import RedisStore
from tests.support.redis_server import RedisServer
from tests.support.stores import Recorder, closed, eventually, open_redis

pytestmark = pytest.mark.redis

#: Bound on every wait here (seconds).
BOUND = 10.0
#: The fire time's id and idempotency key, as every replica derives them.
FIRING = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
KEY = Idempotency("schedule\x1fnightly\x1f1000.000", "the same body", 120.0)


def firing(replica: str) -> Execution:
    """One try at the firing: a new request each time, with the fire time's id."""
    execution = Execution("sleep", None, replica)
    execution.execution_id = FIRING
    return execution


class Runs:
    """What the registry of replica A would say: the ids it runs, the ids adopted."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.adopted: list[str] = []

    def runs(self, execution_id: str) -> bool:
        return execution_id in self.running

    def adopt(self, execution_id: str) -> bool:
        self.adopted.append(execution_id)
        self.running.add(execution_id)
        return True


@pytest.fixture
async def stores(own_redis: RedisServer) -> AsyncIterator[Callable[..., Awaitable[RedisStore]]]:
    opened: list[RedisStore] = []

    async def make(replica_id: str, **options: Any) -> RedisStore:
        store = open_redis(own_redis.url, replica_id, Recorder(), **options)
        await store.open()
        opened.append(store)
        return store

    yield make
    own_redis.command("CONFIG", "SET", "maxmemory", "0")
    for store in opened:
        await closed(store)


async def refused_in_doubt(redis: RedisServer, a: RedisStore, execution: Execution) -> None:
    """`a` creates `execution` while Redis is full: no answer it can trust."""
    assert redis.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    assert redis.command("CONFIG", "SET", "maxmemory", "1") == b"+OK\r\n"
    try:
        with pytest.raises(StoreUnavailable):
            await a.create(execution, KEY)
    finally:
        assert redis.command("CONFIG", "SET", "maxmemory", "0") == b"+OK\r\n"
    assert a._liveness.in_doubt


async def settled(a: RedisStore) -> None:
    a._liveness.renew_now.set()  # the repair follows the renewal
    await eventually(lambda: asyncio.sleep(0, not a._liveness.in_doubt), timeout=BOUND)


async def test_a_firing_tried_again_after_its_create_was_voided_starts_once(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    a = await stores("A", lease_ttl=30.0)
    b = await stores("B", lease_ttl=30.0)
    registry = Runs()
    a.deliver_orphans(registry.runs, registry.adopt)
    given_up = firing("A")
    await refused_in_doubt(own_redis, a, given_up)
    await settled(a)
    assert await b.get(FIRING) is None  # Redis never ran it: voided
    # The ticker's retry of the same fire time, once Redis takes writes again.
    assert await a.create(firing("A"), KEY) is None
    registry.running.add(FIRING)
    found = await b.get(FIRING)
    assert found is not None and (found.status, found.replica) == (ExecutionStatus.RUNNING, "A")
    # The create given up on, should it reach Redis only now, still never lands.
    with pytest.raises(StoreUnavailable, match="given up"):
        await a.create(given_up, KEY)
    # Another replica's try at the same firing is the first's idempotent duplicate.
    duplicate = await b.create(firing("B"), KEY)
    assert duplicate is not None and duplicate.execution_id == FIRING
    assert duplicate.replica == "A"
    assert registry.adopted == []


async def test_a_firing_made_by_its_retry_is_not_run_again_by_the_settle(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    a = await stores("A", lease_ttl=30.0)
    registry = Runs()
    a.deliver_orphans(registry.runs, registry.adopt)
    await refused_in_doubt(own_redis, a, firing("A"))
    # The retry is answered before the repair settles the first try: it runs here.
    assert await a.create(firing("A"), KEY) is None
    registry.running.add(FIRING)
    await settled(a)
    # The record is the retry's: the first try, which Redis never ran, is not adopted as
    # well (a second task for one firing), nor put back on the queue under its runner.
    assert registry.adopted == []
    found = await a.get(FIRING)
    assert found is not None
    assert (found.status, found.replica, found.attempt) == (ExecutionStatus.RUNNING, "A", 1)
