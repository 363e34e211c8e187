"""Another tenant's id costs what an unknown one costs: the store is given the caller's tenant
and decides before it reads the record, so the answer (None) and the work done for it are
those of an id nobody started, whatever the record holds.

The contract on both stores (memory, and Redis on a real `redis-server`); on Redis the work
is counted, not timed: the bytes Redis sends its clients (`INFO stats`) and the commands it
runs (`INFO commandstats`) for a batch of reads of a foreign id against a batch of reads of an
unknown one, beside a batch of the owner's own reads that shows the count sees a record read.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.store import ExecutionStore
from agent_server.store.postgres import PostgresStore
from agent_server.store.redis import RedisStore
from tests.support.stores import Recorder, closed, open_redis

#: A result big enough that reading the record whole shows in any count (1 MiB).
BIG = 1024 * 1024
#: Reads in each batch compared.
READS = 8
UNKNOWN_ID = "0123456789abcdef0123456789abcdef"


def owned(tenant: str | None, result: object = "done") -> Execution:
    execution = Execution("echo", None, "r1")
    execution.owner, execution.tenant = (None, None) if tenant is None else ("id-" + tenant, tenant)
    execution.result = result
    return execution


async def recorded(store: ExecutionStore, execution: Execution) -> None:
    """Created, then ended with its result, and written."""
    assert await store.create(execution) is None
    execution.finish(ExecutionStatus.SUCCEEDED, result=execution.result)
    store.end(execution)
    assert await store.flush(10**9) == []


@pytest.fixture
def store(any_store: ExecutionStore) -> ExecutionStore:
    """Each store (tests/conftest.py `any_store`)."""
    return any_store


async def test_another_tenants_id_reads_as_an_unknown_one(store: ExecutionStore) -> None:
    acme, nobody = owned("acme"), owned(None)
    for execution in (acme, nobody):
        await recorded(store, execution)
    # The tenant's own, and any tenant's (None: an admin, no authentication).
    mine = await store.get(acme.execution_id, "acme")
    assert mine is not None and mine.to_json() == acme.to_json()
    assert (await store.get(acme.execution_id)) is not None
    # Another tenant's, exactly as unknown; a record of no tenant is no tenant's own.
    assert await store.get(acme.execution_id, "globex") is None
    assert await store.get(UNKNOWN_ID, "globex") is None
    assert await store.get(nobody.execution_id, "acme") is None
    assert (await store.get(nobody.execution_id)) is not None


async def _work(plain: aioredis.Redis, reads: int, read: object) -> tuple[int, int]:
    """Bytes Redis sent its clients, and HMGETs it ran, while `read` ran `reads` times."""

    async def counts() -> tuple[int, int]:
        stats = await plain.info("stats")
        commands = await plain.info("commandstats")
        hmget = commands.get("cmdstat_hmget", {}).get("calls", 0)
        return int(stats["total_net_output_bytes"]), int(hmget)

    before = await counts()
    for _ in range(reads):
        await read()  # type: ignore[operator]
    after = await counts()
    return after[0] - before[0], after[1] - before[1]


@pytest.mark.redis
async def test_on_redis_a_foreign_id_does_the_work_of_an_unknown_one(redis_url: str) -> None:
    store = open_redis(redis_url, "r1", Recorder())
    plain = aioredis.from_url(redis_url, decode_responses=True)
    await store.open()
    try:
        assert isinstance(store, RedisStore)
        big = owned("acme", "x" * BIG)
        await recorded(store, big)

        async def own() -> None:
            assert await store.get(big.execution_id, "acme") is not None

        async def foreign() -> None:
            assert await store.get(big.execution_id, "globex") is None

        async def unknown() -> None:
            assert await store.get(UNKNOWN_ID, "globex") is None

        own_bytes, _ = await _work(plain, READS, own)
        assert own_bytes >= READS * BIG  # the count sees a record read whole
        unknown_bytes, unknown_hmgets = await _work(plain, READS, unknown)
        foreign_bytes, foreign_hmgets = await _work(plain, READS, foreign)
        # The same replies (a renewal or a tick between them may add a little, never a
        # record), and no more commands than an unknown id's.
        assert abs(foreign_bytes - unknown_bytes) < BIG // 4, (foreign_bytes, unknown_bytes)
        assert foreign_hmgets <= unknown_hmgets + 2, (foreign_hmgets, unknown_hmgets)
    finally:
        await plain.aclose()
        await closed(store)


async def test_reads_made_together_answer_each_as_alone(store: ExecutionStore) -> None:
    """Many reads at once (Postgres answers those that wait for a statement in one,
    coalesce.py): each caller gets its own answer, a foreign or unknown id None, a repeated
    id twice, whatever else the statement read."""
    acme, globex, nobody = owned("acme", "a"), owned("globex", "g"), owned(None, "n")
    for execution in (acme, globex, nobody):
        await recorded(store, execution)
    asked: list[tuple[str, str | None, Execution | None]] = []
    for _ in range(40):
        asked += [
            (acme.execution_id, "acme", acme),
            (acme.execution_id, None, acme),
            (acme.execution_id, "globex", None),
            (globex.execution_id, "globex", globex),
            (nobody.execution_id, "acme", None),
            (nobody.execution_id, None, nobody),
            (UNKNOWN_ID, None, None),
        ]
    observer = getattr(store, "observer", None)
    operations = len(observer.operations) if isinstance(observer, Recorder) else 0
    found = await asyncio.gather(*(store.get(key, tenant) for key, tenant, _ in asked))
    for (key, tenant, expected), got in zip(asked, found, strict=True):
        if expected is None:
            assert got is None, (key, tenant)
        else:
            assert got is not None and got.to_json() == expected.to_json(), (key, tenant)
    if isinstance(store, PostgresStore):  # fewer statements than reads, and each read answered
        assert isinstance(observer, Recorder)
        reads = [op for op in observer.operations[operations:] if op[0] == "get"]
        assert all(ok for _, ok in reads)
        assert 0 < len(reads) < len(asked) // 4
