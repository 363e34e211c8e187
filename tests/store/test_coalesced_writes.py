"""Creates made together: on Postgres the plain ones that wait for a statement share one
(coalesce.py). Invariant: each caller is told what its own create did, exactly as alone:
written and readable when told so, refused (StoreUnavailable, nothing written) when its
replica's lease had lapsed where it was written; a caller cancelled while the statement
runs leaves the others' answers whole. Run on every store: the memory and Redis stores
answer each create alone, and must answer the same."""

from __future__ import annotations

import asyncio

import pytest

from agent_server.model.execution import Execution
from agent_server.store.base import ExecutionStore, StoreUnavailable
from agent_server.store.postgres import PostgresStore
from tests.store.test_lapsed_lease import lapse
from tests.support.stores import Recorder, closed, open_postgres, open_redis

#: Creates sent at once.
MANY = 120


@pytest.fixture
def store(any_store: ExecutionStore) -> ExecutionStore:
    """Each store (tests/conftest.py `any_store`)."""
    return any_store


def plain(index: int) -> Execution:
    execution = Execution("echo", None, "r1")
    execution.concurrency_key = f"k{index % 7}"
    if index % 3 == 0:
        execution.owner, execution.tenant = "id-acme", "acme"
    return execution


async def test_creates_made_together_are_each_written_as_alone(store: ExecutionStore) -> None:
    executions = [plain(index) for index in range(MANY)]
    observer = getattr(store, "observer", None)
    before = len(observer.operations) if isinstance(observer, Recorder) else 0
    answers = await asyncio.gather(*(store.create(execution) for execution in executions))
    assert answers == [None] * MANY
    for execution in executions:
        found = await store.get(execution.execution_id, execution.tenant)
        assert found is not None and found.to_json() == execution.to_json()
    if isinstance(store, PostgresStore):  # fewer statements than creates
        assert isinstance(observer, Recorder)
        creates = [op for op in observer.operations[before:] if op[0] == "create"]
        assert all(ok for _, ok in creates)
        assert 0 < len(creates) < MANY // 4


async def test_a_cancelled_create_leaves_the_others_answered(store: ExecutionStore) -> None:
    executions = [plain(index) for index in range(MANY)]
    tasks = [asyncio.create_task(store.create(execution)) for execution in executions]
    await asyncio.sleep(0)  # every create sent or waiting for its statement
    tasks[MANY // 2].cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for index, (execution, result) in enumerate(zip(executions, results, strict=True)):
        if index == MANY // 2:
            continue
        assert result is None, result
        assert await store.get(execution.execution_id) is not None


@pytest.mark.parametrize("backend", [pytest.param("redis", marks=pytest.mark.redis), "postgres"])
async def test_creates_made_together_while_the_lease_lapsed_are_each_told_their_own(
    backend: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"{backend}_url")
    store = (open_redis if backend == "redis" else open_postgres)(url, "r1", Recorder())
    await store.open()
    try:
        await lapse(url, "r1")
        executions = [plain(index) for index in range(MANY)]
        results = await asyncio.gather(
            *(store.create(execution) for execution in executions), return_exceptions=True
        )
        refused = 0
        for execution, result in zip(executions, results, strict=True):
            found = await store.get(execution.execution_id)
            if isinstance(result, StoreUnavailable):  # refused: never recorded
                refused += 1
                assert found is None
            else:  # the renewal the first refusal asked for landed before it: written
                assert result is None, result
                assert found is not None
        assert refused > 0
    finally:
        await closed(store)
