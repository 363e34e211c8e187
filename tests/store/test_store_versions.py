"""Versions in the shared stores' claims (DESIGN section 22, docs/durable.md "Versions"), on
a real Redis and a real Postgres alike (`shared_store`).

Invariants: a claim never takes a checkpoint its replica does not read (nor migrates) while a
live, admitting replica of the checkpoint's version is alive; once none is, it takes it and
answers the rule (`restart`: set aside, attempt + 1; `fail`). Work for a reasoner a replica
does not serve waits for a live replica that serves it. A migration's claimer gets the stored
checkpoint, and the store keeps it (never the migrated state) until the body's first
checkpoint: a hand-off before it is migrated again from the same checkpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.versions import OnVersionChange, Rule, VersionRule, advert
from agent_server.store.base import ExecutionStore
from tests.support.stores import Recorder, closed, eventually, resumable

Opener = Callable[..., Any]


def migrate(state: Any, from_version: str | None) -> Any:
    return state


def versions(**rules: VersionRule) -> str:
    return advert(rules)


async def opened(shared_store: Opener, replica: str, advertised: str) -> ExecutionStore:
    store: ExecutionStore = shared_store(replica, Recorder(), lease_ttl=1.0)
    store.advertise(advertised)  # written with its first renewal, at open
    await store.open()
    return store


async def handed_off_with_a_checkpoint(
    store: ExecutionStore, version: str | None, checkpoint: str | None = '{"done": 2}'
) -> Execution:
    """An execution of `steps` run by `store` as `version`, checkpointed (unless None) and
    handed off: queued as attempt 2."""
    execution = resumable(store.replica_id)
    execution.version = version
    await store.create(execution)
    if checkpoint is not None:
        await store.checkpoint(execution, checkpoint)
    execution.mark_queued()
    store.hand_off(execution)

    async def queued() -> bool:
        found = await store.get(execution.execution_id)
        return found is not None and found.status is ExecutionStatus.QUEUED

    await eventually(queued)
    return execution


async def claimed(store: ExecutionStore) -> Execution:
    async def taken() -> Execution | None:
        return await store.claim()

    found: Execution = await eventually(taken)
    return found


async def with_stores(
    shared_store: Opener, adverts: dict[str, str], body: Callable[..., Awaitable[None]]
) -> None:
    stores = [await opened(shared_store, name, text) for name, text in adverts.items()]
    try:
        await body(*stores)
    finally:
        for store in stores:
            await closed(store)


async def test_a_checkpoint_waits_for_a_live_replica_of_its_version(shared_store: Opener) -> None:
    async def body(old: ExecutionStore, new: ExecutionStore) -> None:
        waits: list[int] = []
        new.on_version_waits = waits.append
        execution = await handed_off_with_a_checkpoint(old, "v1")
        assert await new.claim() is None  # v1 is alive: v2 leaves it for v1
        assert sum(waits) == 1
        assert await new.claim() is None
        taken = await claimed(old)  # v1 resumes it
        assert taken.execution_id == execution.execution_id
        assert (taken.attempt, taken.version_rule, taken.checkpoint) == (
            2,
            Rule.SAME,
            '{"done": 2}',
        )

    await with_stores(
        shared_store,
        {"A": versions(steps=VersionRule("v1")), "B": versions(steps=VersionRule("v2"))},
        body,
    )


@pytest.mark.parametrize("change", [OnVersionChange.RESTART, OnVersionChange.FAIL])
async def test_once_no_replica_of_its_version_admits_the_rule_applies(
    shared_store: Opener, change: OnVersionChange
) -> None:
    async def body(old: ExecutionStore, new: ExecutionStore) -> None:
        execution = await handed_off_with_a_checkpoint(old, "v1")
        assert await new.claim() is None
        old.withdraw()  # the last v1 replica drains: nobody is left to wait for
        taken = await claimed(new)
        assert taken.execution_id == execution.execution_id
        if change is OnVersionChange.RESTART:
            assert (taken.version_rule, taken.attempt, taken.checkpoint) == (Rule.RESTART, 3, None)
            found = await new.get(execution.execution_id)
            assert found is not None and (found.attempt, found.checkpoint) == (3, None)
        else:
            assert (taken.version_rule, taken.attempt) == (Rule.FAIL, 2)
            assert (taken.checkpoint, taken.checkpoint_version) == ('{"done": 2}', "v1")

    await with_stores(
        shared_store,
        {
            "A": versions(steps=VersionRule("v1")),
            "B": versions(steps=VersionRule("v2", on_version_change=change)),
        },
        body,
    )


async def test_same_compatible_and_migrate_take_it_at_once(shared_store: Opener) -> None:
    """A live v1 replica waits for nothing a v2 replica reads: compatible or migrate take it."""

    async def body(
        old: ExecutionStore, compatible: ExecutionStore, migrates: ExecutionStore
    ) -> None:
        await handed_off_with_a_checkpoint(old, "v1")
        assert (await claimed(compatible)).version_rule is Rule.COMPATIBLE
        await handed_off_with_a_checkpoint(old, "v1")
        assert (await claimed(migrates)).version_rule is Rule.MIGRATE

    await with_stores(
        shared_store,
        {
            "A": versions(steps=VersionRule("v1")),
            "B": versions(steps=VersionRule("v2", frozenset({"v1"}))),
            "C": versions(steps=VersionRule("v2", migrate=migrate)),
        },
        body,
    )


async def test_work_without_a_checkpoint_runs_on_any_version(shared_store: Opener) -> None:
    async def body(old: ExecutionStore, new: ExecutionStore) -> None:
        execution = await handed_off_with_a_checkpoint(old, "v1", checkpoint=None)
        taken = await claimed(new)
        assert (taken.execution_id, taken.version_rule) == (execution.execution_id, Rule.NONE)

    await with_stores(
        shared_store,
        {"A": versions(steps=VersionRule("v1")), "B": versions(steps=VersionRule("v2"))},
        body,
    )


async def test_work_for_a_reasoner_not_served_here_waits_for_one_that_serves_it(
    shared_store: Opener,
) -> None:
    async def body(old: ExecutionStore, new: ExecutionStore) -> None:
        execution = await handed_off_with_a_checkpoint(old, "v1", checkpoint=None)
        assert await new.claim() is None  # v1 serves `steps`: never taken (and failed) here
        old.withdraw()
        taken = await claimed(new)  # nobody serves it: taken here, for its taker to fail
        assert taken.execution_id == execution.execution_id

    await with_stores(
        shared_store,
        {
            "A": versions(steps=VersionRule("v1"), other=VersionRule("v1")),
            "B": versions(other=VersionRule("v2")),
        },
        body,
    )


async def test_a_migration_handed_off_before_its_first_checkpoint_migrates_the_same_one(
    shared_store: Opener,
) -> None:
    """The claimer's migrated state lives in its memory only: a hand-off before the body's
    first checkpoint leaves v1's checkpoint, as v1's, for the next claim to migrate."""

    async def body(old: ExecutionStore, new: ExecutionStore) -> None:
        execution = await handed_off_with_a_checkpoint(old, "v1")
        taken = await claimed(new)
        assert (taken.version_rule, taken.checkpoint) == (Rule.MIGRATE, '{"done": 2}')
        assert await new.begin(taken)
        taken.checkpoint = '{"steps": 2}'  # what the runtime's migration made of it
        taken.version = "v2"
        taken.mark_queued()
        new.hand_off(taken)
        again = await claimed(new)
        assert again.execution_id == execution.execution_id
        assert (again.attempt, again.version_rule) == (3, Rule.MIGRATE)
        assert (again.checkpoint, again.checkpoint_version) == ('{"done": 2}', "v1")

    await with_stores(
        shared_store,
        {
            "A": versions(steps=VersionRule("v1")),
            "B": versions(steps=VersionRule("v2", migrate=migrate)),
        },
        body,
    )
