"""A real Redis keeps each tenant's index exact: every record a tenant starts is in its
`tenant:{t}` sorted set, and leaves it with the record, whichever way the record goes
(forgotten, or pruned past `max_retained`); a session's index and a session's turn are the
tenant's (names.scoped). Exact, so that a tenant's page never scans ids of records gone."""

from __future__ import annotations

import redis.asyncio as aioredis

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.names import scoped
from agent_server.store.redis.keys import Keys
from tests.support.stores import AGENT, Recorder, closed, open_redis


def started(tenant: str | None, session_id: str | None = None) -> Execution:
    execution = Execution("echo", session_id, "r1")
    execution.owner, execution.tenant = (None, None) if tenant is None else ("id-" + tenant, tenant)
    return execution


async def test_a_tenants_index_follows_its_records(redis_url: str) -> None:
    store = open_redis(redis_url, "r1", Recorder(), max_retained=3)
    keys = Keys(AGENT)
    plain = aioredis.from_url(redis_url, decode_responses=True)
    await store.open()
    try:
        # A tenant holding '|' and ':' (a tenant is any printable text).
        odd = "a|b:c"
        made = [started(t, "chat") for t in ("acme", odd, "acme", None)]
        for execution in made:
            assert await store.create(execution) is None
        assert await plain.zcard(keys.tenant("acme")) == 2
        assert await plain.zcard(keys.tenant(odd)) == 1
        assert await plain.zcard(keys.session(scoped("acme", "chat"))) == 2
        assert await plain.zcard(keys.session("chat")) == 1  # the open server's own
        listed = await store.page(tenant="acme")
        assert {e.execution_id for e in listed.executions} == {
            made[0].execution_id,
            made[2].execution_id,
        }
        assert [e.execution_id for e in await store.session("chat", odd)] == [made[1].execution_id]
        for execution in made:
            execution.finish(ExecutionStatus.SUCCEEDED, result="done")
            store.end(execution)
        await store.flush(10**9)
        assert await store.forget(made[1].execution_id)
        assert await plain.zcard(keys.tenant(odd)) == 0
        assert await plain.zcard(keys.session(scoped(odd, "chat"))) == 0
        # Past max_retained the oldest are pruned: their tenant's entries go with them.
        for _ in range(4):
            extra = started("globex")
            await store.create(extra)
            extra.finish(ExecutionStatus.SUCCEEDED, result="done")
            store.end(extra)
        await store.flush(10**9)
        assert await plain.zcard(keys.tenant("acme")) == 0
        assert await plain.zcard(keys.session(scoped("acme", "chat"))) == 0
        assert await plain.zcard(keys.tenant("globex")) == 3
    finally:
        await plain.aclose()
        await closed(store)
