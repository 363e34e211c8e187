"""What a change of one schedule costs every replica's ticker (service/schedule_ticker.py
`ScheduleTicker.sync`): the changed document, never every tenant's.

Two tickers share one memory store here, as two replicas share a Redis (the Redis case runs
on real replicas, counted by MONITOR: tests/process/test_schedule_bounds.py). The reads are
counted at the store, not timed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Any

import pytest

from agent_server import Agent, Schedule
from agent_server.identity.principal import Principal
from agent_server.runtime.schedule_entries import Entry
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.store import ExecutionStore
from agent_server.store.memory import MemoryStore


class CountingStore(MemoryStore):
    """The memory store, with the documents each read asked for (None: all of them)."""

    def __init__(self) -> None:
        super().__init__("r1")
        self.reads: list[list[str] | None] = []

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        if keys is None:
            self.reads.append(None)
            return await super().schedule_documents()
        self.reads.append(sorted(keys))
        return await super().schedule_documents(keys)


def ticker(store: MemoryStore) -> ScheduleTicker:
    agent = Agent("reads")

    @agent.reasoner()
    async def work(n: int = 0) -> int:
        return n

    return ScheduleTicker(
        None,  # type: ignore[arg-type]  # sync starts nothing
        store,
        agent.reasoners,
        observe=lambda outcome, lag: None,
        draining=lambda: False,
    )


async def test_a_change_makes_the_other_ticker_read_only_the_changed_document() -> None:
    store = CountingStore()
    here, there = ticker(store), ticker(store)
    made: list[Entry] = []
    for index in range(40):
        tenant = ("acme", "globex")[index % 2]
        entry = Entry(
            f"s{index:02d}",
            "work",
            Schedule("0 0 1 1 *", input={"n": index}),
            principal=Principal(f"user{index}", tenant),
        )
        await here.keep(entry)
        made.append(entry)
    await there.sync()
    assert len(there.entries) == 40
    store.reads.clear()
    changed = made[13]
    await here.keep(
        Entry(
            changed.schedule_id,
            "work",
            Schedule("0 0 1 1 *", input={"n": -1}),
            principal=changed.principal,
        )
    )
    await there.sync()
    await there.sync()  # nothing changed since: nothing read
    assert store.reads == [[changed.key]]
    assert dict(there.entries[changed.key].schedule.input) == {"n": -1}
    # A deletion is read without any document.
    store.reads.clear()
    gone = made[20]
    assert await store.delete_schedule(gone.key, gone.tenant)
    await there.sync()
    assert gone.key not in there.entries and len(there.entries) == 39
    assert store.reads in ([], [[]])


# On each store (`any_store`): the count is the store's own (a script on Redis, a transaction
# under a lock on Postgres), so each is tried.


async def test_a_refused_create_changes_nothing_and_a_deleted_one_makes_room(
    any_store: ExecutionStore,
) -> None:
    from agent_server.store.base import ScheduleLimit

    store = any_store
    for index in range(3):
        await store.put_schedule(f"k{index}", "{}", tenant="acme", limit=3)
    version = await store.schedules_version()
    try:
        await store.put_schedule("k3", "{}", tenant="acme", limit=3)
    except ScheduleLimit as exc:
        assert exc.limit == 3
    else:
        raise AssertionError("a fourth schedule was kept")
    assert await store.schedules_version() == version
    assert sorted(await store.schedule_versions()) == ["k0", "k1", "k2"]
    await store.put_schedule("k1", '{"changed": true}', tenant="acme", limit=3)  # a change
    await store.put_schedule("x", "{}", tenant="globex", limit=3)  # another tenant's count
    assert await store.delete_schedule("k0", "acme")
    await store.put_schedule("k3", "{}", tenant="acme", limit=3)
    documents: dict[str, Any] = await store.schedule_documents()
    assert sorted(documents) == ["k1", "k2", "k3", "x"]
    assert documents["k1"] == '{"changed": true}'
    versions = await store.schedule_versions()
    assert sorted(versions) == ["k1", "k2", "k3", "x"] and len(set(versions.values())) == 4
    assert await store.schedule_documents(["k2", "gone"]) == {"k2": "{}"}


async def test_a_schedule_made_here_and_deleted_elsewhere_before_any_read_stops_here() -> None:
    """The version of a document made here was never read here: its deletion by another
    replica is still seen (the document gone from the versions)."""
    store = MemoryStore("r1")
    here = ticker(store)
    entry = Entry("s1", "work", Schedule("0 0 1 1 *"), principal=Principal("u", "acme"))
    await here.keep(entry)
    assert entry.key in here.entries
    assert await store.delete_schedule(entry.key, entry.tenant)  # on another replica
    await here.sync()
    assert entry.key not in here.entries


class GatedStore(CountingStore):
    """Holds a sync at one of its reads (`gate`) until released, so a change made here can
    land in the middle of it, as a request's change lands in the middle of the tick's
    sync."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: str | None = None
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def _held(self, name: str) -> None:
        if self.gate == name:
            self.gate = None
            self.reached.set()
            await asyncio.wait_for(self.release.wait(), 5)

    async def schedules_version(self) -> str:
        found = await super().schedules_version()
        await self._held("version")
        return found

    async def schedule_versions(self) -> dict[str, str]:
        found = await super().schedule_versions()
        await self._held("versions")
        return found

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        found = await super().schedule_documents(keys)
        await self._held("documents")
        return found


def _entry(key: str, n: int) -> Entry:
    """A schedule without a tenant: its key is its id."""
    return Entry(key, "work", Schedule("0 0 1 1 *", input={"n": n}))


@pytest.mark.parametrize("gate", ["version", "versions", "documents"])
@pytest.mark.parametrize("change", ["create", "change", "delete"])
async def test_a_sync_never_undoes_a_change_made_here_while_it_read(gate: str, change: str) -> None:
    """Invariant: what a replica's own change made holds once the change returns, whatever
    sync was reading the store meanwhile: a schedule made here is fired (not dropped as
    gone from versions read before it), one deleted here is not fired again (from a
    document read before the delete), and the replica never reads back what it wrote."""
    store = GatedStore()
    here = ticker(store)
    await here.keep(_entry("s0", 0))
    if change != "create":
        await here.keep(_entry("s1", 1))
    # Changes elsewhere, so the sync has something to read (`documents` is reached): one
    # of them to the schedule deleted here, whose document the sync then holds.
    there = ticker(store)
    await there.keep(_entry("s2", 2))
    if change == "delete":
        await there.keep(_entry("s1", 5))
    store.gate = gate
    reading = asyncio.create_task(here.sync())
    await asyncio.wait_for(store.reached.wait(), 5)
    if change == "delete":
        doing = asyncio.create_task(here.forget(here.entries["s1"]))
    else:
        doing = asyncio.create_task(here.keep(_entry("s1", 9)))
    # The change may wait for the sync, never the other way round.
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.wait_for(asyncio.gather(reading, doing), 5)
    if change == "delete":
        assert "s1" not in here.entries
        await here.sync()
        assert "s1" not in here.entries
    else:
        assert dict(here.entries["s1"].schedule.input) == {"n": 9}
        store.reads.clear()
        await here.sync()
        assert dict(here.entries["s1"].schedule.input) == {"n": 9}
        assert ["s1"] not in store.reads, "the replica read back what it wrote"
    assert {"s0", "s2"} <= set(here.entries)
