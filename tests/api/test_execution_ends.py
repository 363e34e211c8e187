"""Every accepted execution ends in a visible state, however its reasoner ends, and session
releases answer by their deadline whoever waits on them and whatever the server is doing."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import httpx
import pytest

from agent_server.model.execution import CancelReason
from tests.apps.tests_app import make_agent

WAIT = 5.0


@pytest.fixture
async def client() -> Any:
    agent = make_agent()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        client.agent = agent  # type: ignore[attr-defined]
        yield client


async def metric(client: httpx.AsyncClient, line_start: str) -> float:
    text = (await client.get("/metrics")).text
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not exposed")


@pytest.mark.parametrize(
    ("kind", "error_type"),
    [
        ("generator_exit", "GeneratorExit"),
        ("group", "BaseExceptionGroup"),
        ("keyboard", "KeyboardInterrupt"),
        ("system_exit", "SystemExit"),
        ("library", "LibraryStop"),
    ],
)
async def test_a_base_exception_ends_the_execution_failed(
    client: httpx.AsyncClient, kind: str, error_type: str
) -> None:
    response = await asyncio.wait_for(
        client.post("/reasoners/raise_base", json={"kind": kind}), WAIT
    )
    assert response.status_code == 500
    body = response.json()
    assert body["status"] == "failed"
    assert body["error"]["type"] == error_type
    # Nothing is left running: DELETE forgets it, the gauge is back at zero.
    assert (await client.delete(f"/executions/{body['execution_id']}")).status_code == 204
    inflight = 'agent_server_executions_inflight{reasoner="raise_base"}'
    assert await metric(client, inflight) == 0


async def test_a_base_exception_in_the_background_is_visible_to_pollers(
    client: httpx.AsyncClient,
) -> None:
    started = await client.post("/reasoners/raise_base/async", json={"kind": "group"})
    execution_id = started.json()["execution_id"]
    body = (await client.get(f"/executions/{execution_id}", params={"wait": WAIT})).json()
    assert body["status"] == "failed"
    assert body["error"] == {"type": "BaseExceptionGroup", "message": "several (2 sub-exceptions)"}


@pytest.mark.parametrize("after", [0.0, 0.02])
async def test_a_cancelled_error_nobody_asked_for_is_a_failure(
    client: httpx.AsyncClient, after: float
) -> None:
    response = await client.post("/reasoners/raise_cancelled", json={"after": after})
    body = response.json()
    assert response.status_code == 500
    assert body["status"] == "failed"
    assert body["status_reason"] is None
    assert body["error"] == {"type": "CancelledError", "message": "raised by the reasoner"}


async def test_a_real_cancel_still_reads_cancelled_with_its_reason(
    client: httpx.AsyncClient,
) -> None:
    started = await client.post("/reasoners/sleep/async", json={"seconds": 30})
    execution_id = started.json()["execution_id"]
    assert (await client.post(f"/executions/{execution_id}/cancel")).status_code == 202
    body = (await client.get(f"/executions/{execution_id}", params={"wait": WAIT})).json()
    assert (body["status"], body["status_reason"]) == ("cancelled", "request")


@pytest.mark.parametrize("name", ["my-own-name", "execution-0000", ""])
async def test_a_task_that_renames_itself_is_still_released_and_abandoned(
    client: httpx.AsyncClient, name: str
) -> None:
    headers = {"X-Session-ID": "renamed"}
    started = await client.post(
        "/reasoners/renamed_swallow/async", json={"name": name, "seconds": 0.6}, headers=headers
    )
    execution_id = started.json()["execution_id"]
    await asyncio.sleep(0.01)  # its first step renames the task
    release = await client.delete("/sessions/renamed", params={"timeout": 0.1})
    assert release.status_code == 200, release.text
    assert (release.json()["cancelled"], release.json()["abandoned"]) == (0, 1)
    assert (await client.get(f"/executions/{execution_id}")).status_code == 404
    agent = client.agent  # type: ignore[attr-defined]
    assert agent.registry.abandoned_pending == 1
    # The shutdown's settle finds it by identity too.
    second = await client.post(
        "/reasoners/renamed_swallow/async", json={"name": name, "seconds": 0.6}
    )
    await asyncio.sleep(0.01)
    tasks = agent.registry.cancel_all(CancelReason.SHUTDOWN)
    abandoned = await agent.registry.settle(tasks, time.monotonic() + 0.1)
    assert [e.execution_id for e in abandoned] == [second.json()["execution_id"]]
    await agent.registry.wait_abandoned(time.monotonic() + WAIT)  # they end by themselves
    assert agent.registry.abandoned_pending == 0


async def test_a_second_caller_gets_the_release_when_the_first_goes_away(
    client: httpx.AsyncClient,
) -> None:
    headers = {"X-Session-ID": "shared"}
    await client.post("/reasoners/deferred_cleanup/async", json={"cleanup": 0.3}, headers=headers)
    agent = client.agent  # type: ignore[attr-defined]
    begun = asyncio.Event()
    begin_release = agent.store.begin_release

    async def noted(
        session_id: str, seconds: float | None, tenant: str | None = None
    ) -> str | None:
        begun.set()  # the first release is under way: a second caller joins it
        return await begin_release(session_id, seconds, tenant)

    agent.store.begin_release = noted
    first = asyncio.create_task(client.delete("/sessions/shared", params={"timeout": 5}))
    await asyncio.wait_for(begun.wait(), WAIT)
    second = asyncio.create_task(client.delete("/sessions/shared", params={"timeout": 5}))
    await asyncio.sleep(0.02)
    first.cancel()  # the first caller goes away
    with pytest.raises(asyncio.CancelledError):
        await first
    answer = await asyncio.wait_for(second, WAIT)
    assert answer.status_code == 200, answer.text
    assert (answer.json()["cancelled"], answer.json()["forgotten"]) == (1, 1)


def test_a_release_waiting_at_sigterm_answers_json_before_the_exit(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", "--grace-period", "6", "--cancel-timeout", "1")
    headers = {"X-Session-ID": "stuck"}
    started = httpx.post(
        f"{server.url}/reasoners/renamed_swallow/async",
        json={"marker": "in"},
        headers=headers,
        timeout=WAIT,
    )
    assert started.status_code == 202
    server.wait_marker("in")
    answers: list[httpx.Response] = []

    async def release_then_signal() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=15) as client:
            release = asyncio.create_task(
                client.delete("/sessions/stuck", params={"timeout": "none"})
            )
            await asyncio.sleep(0.3)  # the release is waiting on the swallowing reasoner
            assert not release.done()
            server.signal(signal.SIGTERM)
            answers.append(await asyncio.wait_for(release, 10))

    asyncio.run(release_then_signal())
    code, elapsed = server.wait_exit(timeout=10)
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].headers["content-type"] == "application/json"
    assert answers[0].json()["abandoned"] == 1
    assert code == 3
    assert elapsed < 6
    log = server.stderr()
    assert "Exception in ASGI application" not in log
    assert "CancelledError" not in log
