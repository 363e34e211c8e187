"""Error replies with which Redis refuses a command for a while (NOREPLICAS, MASTERDOWN,
BUSY...) are an outage of the store, as a refused connection is: a 503 and a retry for the
caller, never an exception the store's callers do not expect (a 500, a ticker stopped)."""

from __future__ import annotations

import pytest

from agent_server.model.execution import Execution
from agent_server.store.base import StoreUnavailable
from tests.support.redis_server import RedisServer
from tests.support.stores import Recorder, closed, open_redis

pytestmark = pytest.mark.redis


async def test_a_write_redis_refuses_for_now_is_the_store_unavailable(
    redis_url: str, redis_server: RedisServer
) -> None:
    store = open_redis(redis_url, "A", Recorder())
    await store.open()
    try:
        # No replica connected: every write is refused with NOREPLICAS until this is undone.
        assert redis_server.command("CONFIG", "SET", "min-replicas-to-write", "1") == b"+OK\r\n"
        with pytest.raises(StoreUnavailable) as refused:
            await store.create(Execution("sleep", None, "A"))
        assert "NOREPLICAS" in str(refused.value)
        assert redis_server.command("CONFIG", "SET", "min-replicas-to-write", "0") == b"+OK\r\n"
        created = Execution("sleep", None, "A")
        await store.create(created)  # and once Redis takes writes again, the store does
        found = await store.get(created.execution_id)
        assert found is not None and found.execution_id == created.execution_id
    finally:
        redis_server.command("CONFIG", "SET", "min-replicas-to-write", "0")
        await closed(store)
