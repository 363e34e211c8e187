"""The schedules' version, which every replica compares to decide whether to read the
documents again (service/schedule_ticker.py `ScheduleTicker.sync`).

Invariant: two reads that see the same version see the same documents. A replica that saw
a version never reads the documents again while the store shows that version, so a version
that comes back with other documents hides them from it for good: it fires a schedule that
no longer exists and never fires the one made since. A restart that loses Redis's data, or
the last writes (a crash after the last save, a failover to a replica behind), must never
bring back a version with other documents.
"""

from __future__ import annotations

import json

import pytest

from agent_server.store import MemoryStore
from agent_server.store.base import ExecutionStore, StoreUnavailable
from agent_server.store.redis import RedisStore
from tests.support.redis_server import RedisServer
from tests.support.stores import Recorder, closed, eventually, open_redis

#: What one read saw: the version, and the documents (as sorted JSON, to compare).
Seen = tuple[str, str]


async def seen(store: ExecutionStore) -> Seen:
    """The version, then the documents (the order `sync` reads them in)."""
    version = await store.schedules_version()
    documents = await store.schedule_documents()
    return str(version), json.dumps(documents, sort_keys=True)


def assert_one_set_per_version(history: list[Seen]) -> None:
    by_version: dict[str, str] = {}
    for version, documents in history:
        earlier = by_version.setdefault(version, documents)
        assert earlier == documents, (
            f"version {version!r} showed {earlier} and later {documents}: a replica that "
            "read the first never reads the second"
        )


async def put(store: RedisStore, key: str) -> None:
    """Put a document, retried while the store reconnects after a restart (bounded)."""

    async def done() -> bool:
        try:
            await store.put_schedule(key, json.dumps({"schedule": key}))
        except StoreUnavailable:
            return False
        return True

    await eventually(done, timeout=10.0)


@pytest.mark.redis
async def test_a_version_never_comes_back_with_other_documents_after_redis_restarts_empty(
    own_redis: RedisServer,
) -> None:
    store = open_redis(own_redis.url, "A", Recorder())
    await store.open()
    history: list[Seen] = []
    try:
        await put(store, "s1")
        history.append(await seen(store))
        own_redis.stop()  # nothing kept: the documents and the version are gone
        own_redis.start()
        await answering(store)
        history.append(await seen(store))
        await put(store, "s2")
        history.append(await seen(store))
    finally:
        await closed(store)
    assert_one_set_per_version(history)


@pytest.mark.redis
async def test_a_version_never_comes_back_with_other_documents_after_the_last_write_is_lost(
    own_redis: RedisServer,
) -> None:
    """A crash after the last save (or a failover to a replica behind) loses the last
    change; the next change must not show the version the lost one showed."""
    store = open_redis(own_redis.url, "A", Recorder())
    await store.open()
    history: list[Seen] = []
    try:
        await put(store, "s1")
        history.append(await seen(store))
        assert own_redis.command("SAVE") == b"+OK\r\n"
        await put(store, "s2")
        history.append(await seen(store))
        own_redis.kill()
        own_redis.start()  # from the snapshot: s2 is lost
        await put(store, "s3")
        history.append(await seen(store))
        assert await store.delete_schedule("s3")
        history.append(await seen(store))
    finally:
        await closed(store)
    assert_one_set_per_version(history)


async def answering(store: RedisStore) -> None:
    """Wait (bounded) until the store answers reads again after a restart."""

    async def read() -> bool:
        try:
            await store.schedules_version()
        except StoreUnavailable:
            return False
        return True

    await eventually(read, timeout=10.0)


async def test_every_change_of_the_memory_store_shows_a_version_not_seen_before() -> None:
    store = MemoryStore("A")
    history = [await seen(store)]
    for key in ("s1", "s2"):
        await store.put_schedule(key, json.dumps({"schedule": key}))
        history.append(await seen(store))
    assert await store.delete_schedule("s1")
    history.append(await seen(store))
    await store.put_schedule("s1", json.dumps({"schedule": "s1"}))
    history.append(await seen(store))
    assert len({version for version, _ in history}) == len(history)
    assert_one_set_per_version(history)
