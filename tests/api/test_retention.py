"""Retention: finished executions kept until deleted or past `result_ttl`; `max_retained`
bounds memory by evicting the oldest finished first; running work is never evicted."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from agent_server import Agent, Settings
from tests.apps.tests_app import make_agent

#: Bound for every wait in this file.
WAIT = 5.0


class Gates:
    """Reasoners the test lets finish one by one, in the order it chooses."""

    def __init__(self) -> None:
        self.entered: dict[str, asyncio.Event] = {}
        self.release: dict[str, asyncio.Event] = {}

    async def gated(self, key: str) -> str:
        self.entered.setdefault(key, asyncio.Event()).set()
        await self.release.setdefault(key, asyncio.Event()).wait()
        return key

    async def start(self, client: httpx.AsyncClient, key: str) -> str:
        response = await client.post("/reasoners/gated/async", json={"key": key})
        assert response.status_code == 202
        await asyncio.wait_for(self.entered.setdefault(key, asyncio.Event()).wait(), WAIT)
        return str(response.json()["execution_id"])

    async def finish(self, client: httpx.AsyncClient, key: str, execution_id: str) -> None:
        self.release.setdefault(key, asyncio.Event()).set()
        response = await client.get(f"/executions/{execution_id}", params={"wait": WAIT})
        assert response.json()["status"] == "succeeded"


def serve(settings: Settings) -> tuple[Agent, Gates, httpx.AsyncClient]:
    agent = make_agent(settings)
    gates = Gates()
    agent.reasoner(name="gated")(gates.gated)
    client = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    )
    return agent, gates, client


async def run_echo(client: httpx.AsyncClient, text: str = "x") -> str:
    response = await client.post("/reasoners/echo", json={"text": text})
    assert response.status_code == 200
    return str(response.json()["execution_id"])


async def status_of(client: httpx.AsyncClient, execution_id: str) -> int:
    return (await client.get(f"/executions/{execution_id}")).status_code


async def listed(client: httpx.AsyncClient, **params: Any) -> list[str]:
    response = await client.get("/executions", params={"limit": 1000, **params})
    return [e["execution_id"] for e in response.json()]


async def test_finished_execution_is_forgotten_after_result_ttl() -> None:
    _, gates, client = serve(Settings(result_ttl=0.3))
    async with client:
        running = await gates.start(client, "long")
        finished = await run_echo(client)
        assert await status_of(client, finished) == 200
        deadline = time.monotonic() + WAIT
        while await status_of(client, finished) == 200:
            assert time.monotonic() < deadline, "not forgotten after its ttl"
            await asyncio.sleep(0.02)
        assert await status_of(client, finished) == 404
        assert finished not in await listed(client)
        # Older than the ttl, but running: kept; after it ends its own ttl starts.
        assert await status_of(client, running) == 200
        await gates.finish(client, "long", running)
        assert await status_of(client, running) == 200


async def test_results_are_kept_within_the_ttl() -> None:
    _, _, client = serve(Settings())  # default ttl: an hour
    async with client:
        ids = [await run_echo(client, str(n)) for n in range(5)]
        for execution_id in ids:
            response = await client.get(f"/executions/{execution_id}")
            assert response.status_code == 200
        assert await listed(client) == list(reversed(ids))


async def test_max_retained_evicts_the_oldest_finished_first() -> None:
    _, gates, client = serve(Settings(max_retained=2))
    async with client:
        first_created = await gates.start(client, "a")
        b = await run_echo(client, "b")
        c = await run_echo(client, "c")
        assert set(await listed(client)) == {first_created, b, c}  # running is not counted
        await gates.finish(client, "a", first_created)
        # Finished order is b, c, a: b is the oldest finished, though `a` was created first.
        assert await status_of(client, b) == 404
        assert await status_of(client, c) == 200
        assert await status_of(client, first_created) == 200
        d = await run_echo(client, "d")
        assert set(await listed(client)) == {first_created, d}


async def test_running_executions_are_never_evicted() -> None:
    agent, gates, client = serve(Settings(max_retained=0))
    async with client:
        running = [await gates.start(client, f"r{n}") for n in range(3)]
        for n in range(5):
            await run_echo(client, str(n))
        assert set(await listed(client)) == set(running)
        assert set(await listed(client, status="running")) == set(running)
        for n in range(3):
            gates.release.setdefault(f"r{n}", asyncio.Event()).set()
        assert await agent.registry.wait_idle(time.monotonic() + WAIT)
        assert agent.registry.stats.outcomes["succeeded"] == 8
        assert await listed(client) == []


async def test_memory_stays_bounded_under_many_executions() -> None:
    agent, _, client = serve(Settings(max_retained=50))
    async with client:
        ids = [await run_echo(client, str(n)) for n in range(300)]
        assert await listed(client) == list(reversed(ids[-50:]))
        # Not only hidden from the list: the store itself has dropped all but the newest 50.
        assert [i for i in ids if await agent.store.get(i) is not None] == ids[-50:]


async def test_delete_forgets_only_that_execution() -> None:
    _, _, client = serve(Settings())
    async with client:
        keep, drop = await run_echo(client, "keep"), await run_echo(client, "drop")
        assert (await client.delete(f"/executions/{drop}")).status_code == 204
        assert await listed(client) == [keep]


async def test_sync_answer_is_complete_even_when_not_retained() -> None:
    """With nothing retained the run-and-wait caller still gets its own full result."""
    _, _, client = serve(Settings(max_retained=0))
    async with client:
        response = await client.post("/reasoners/echo", json={"text": "mine"})
        assert response.status_code == 200
        body = response.json()
        assert body["result"] == {"text": "mine"}
        assert await status_of(client, body["execution_id"]) == 404
