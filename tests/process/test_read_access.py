"""`read` is asked wherever a record or a result is handed out, on every front.

A caller `@agent.authorize` lets start but not read (scope `noread`, tests/apps/tenancy_app.py)
gets a start's acceptance and nothing more: REST answers 202 with the id alone (a sync run,
a streamed run, an async start), A2A the task's id as `submitted` (a blocking send, a
streamed one, one that returns at once), MCP a tool error naming the execution (a plain
call) or the task as accepted (with the tasks extension). A call on an execution whose
answer is the record (a cancel, an answer) asks `read` first and does nothing when denied.
Each time the work ran all the same: a reader of the tenant sees its result.

A real `agent-server run tenancy_app:agent --a2a --mcp --api-tokens-file ...` on the memory
store and on Redis, driven by httpx and by the official SDK clients (`a2a-sdk`, `mcp`).
docs/security.md#what-each-call-asks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import mcp_types as types
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    TaskState,
)
from mcp.shared.exceptions import MCPError

from agent_server.client import AgentClient, Forbidden
from tests.apps.tenancy_app import SECRET
from tests.process.test_a2a import card_of, message, result_of, send, send_request
from tests.process.test_mcp import Ack, CancelTask, TaskParams, call_as_task, get_task, session
from tests.process.test_tenancy import ALICE, BLIND, tokens_file
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

WAIT = 20.0
APP = "tenancy_app:agent"


@pytest.fixture(params=["memory", "redis"])
def server(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, redis_server: RedisServer
) -> Iterator[ServerProcess]:
    flags = ["--a2a", "--mcp", "--api-tokens-file", str(tokens_file(tmp_path))]
    if request.param == "redis":
        flags += ["--store", redis_url]
    marker = tmp_path / "server"
    marker.mkdir()
    process = ServerProcess([APP, *flags], {}, marker)
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


def call(
    server: ServerProcess, token: str, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
    return httpx.request(method, f"{server.url}{path}", headers=headers, timeout=WAIT, **kwargs)


def ended(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    """The record as a reader of the tenant sees it once it ends (or asks)."""
    response = call(server, ALICE, "GET", f"/executions/{execution_id}", params={"wait": 15})
    assert response.status_code == 200, response.text
    found: dict[str, Any] = response.json()
    return found


def started(server: ServerProcess, reasoner: str, body: Any) -> str:
    """An execution a reader of the tenant started (async), by its id."""
    response = call(server, ALICE, "POST", f"/reasoners/{reasoner}/async", json=body)
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["execution_id"]
    return execution_id


def assert_acceptance(response: httpx.Response) -> str:
    """202 with the id alone and its Location; nothing of the record, nor its result."""
    assert response.status_code == 202, response.text
    assert SECRET not in response.text
    body = response.json()
    assert set(body) == {"execution_id"}, body
    assert response.headers["location"] == f"/executions/{body['execution_id']}"
    execution_id: str = body["execution_id"]
    return execution_id


def test_rest_starts_answer_their_acceptance_and_nothing_more(server: ServerProcess) -> None:
    starts = (
        ("/reasoners/secret", {}),
        ("/reasoners/secret", {"Accept": "text/event-stream"}),
        ("/reasoners/secret/async", {}),
    )
    for path, headers in starts:
        answer = call(server, BLIND, "POST", path, json={}, headers=headers)
        execution_id = assert_acceptance(answer)
        # It ran all the same, and a reader of the tenant reads it; this caller does not.
        assert ended(server, execution_id)["result"] == {"secret": SECRET}, path
        refused = call(server, BLIND, "GET", f"/executions/{execution_id}")
        assert refused.status_code == 403 and SECRET not in refused.text


def test_the_client_shows_an_acceptance_and_meets_the_403_when_it_reads(
    server: ServerProcess,
) -> None:
    with AgentClient(server.url, token=BLIND, retry_for=5.0) as client:
        handle = client.start("secret", {})
        assert handle.execution.status == "accepted"
        assert SECRET not in repr(handle.execution)
        assert ended(server, handle.execution_id)["result"] == {"secret": SECRET}
        with pytest.raises(Forbidden) as refused:
            client.run("secret", {})
        assert SECRET not in str(refused.value)


def test_a_cancel_or_an_answer_asks_read_first_and_does_nothing_when_denied(
    server: ServerProcess,
) -> None:
    # A finished execution: its cancel's answer was the record, result and all.
    done = started(server, "secret", {})
    assert ended(server, done)["status"] == "succeeded"
    refused = call(server, BLIND, "POST", f"/executions/{done}/cancel")
    assert refused.status_code == 403, refused.text
    assert refused.json() == {"detail": "not allowed to read"}
    # A running one is not cancelled.
    running = started(server, "hold", {"seconds": 60})
    refused = call(server, BLIND, "POST", f"/executions/{running}/cancel")
    assert refused.status_code == 403, refused.text
    assert call(server, ALICE, "GET", f"/executions/{running}").json()["status"] == "running"
    # A pending request is not answered.
    asking = started(server, "question", {})
    assert ended(server, asking)["status"] == "input_required"
    refused = call(
        server, BLIND, "POST", f"/executions/{asking}/input", json={"value": "from the blind"}
    )
    assert refused.status_code == 403, refused.text
    still = call(server, ALICE, "GET", f"/executions/{asking}").json()
    assert still["status"] == "input_required", still
    for execution_id in (running, asking):
        assert call(server, ALICE, "POST", f"/executions/{execution_id}/cancel").status_code in (
            200,
            202,
        )


@asynccontextmanager
async def a2a(server: ServerProcess, token: str, *, streaming: bool) -> AsyncIterator[Client]:
    """The A2A SDK's client of the served card (v1.0), sending the caller's token."""
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=WAIT, headers=headers) as http:
        card = await card_of(http, server.url)
        config = ClientConfig(streaming=streaming, httpx_client=http)
        async with ClientFactory(config).create(card) as client:
            yield client


async def test_a2a_sends_answer_the_task_as_accepted_and_nothing_more(
    server: ServerProcess,
) -> None:
    async with (
        a2a(server, BLIND, streaming=False) as blind,
        a2a(server, BLIND, streaming=True) as streaming,
        a2a(server, ALICE, streaming=False) as reader,
    ):
        tasks = [
            await send(blind, message(data={}, skill="secret")),  # blocking: until its end
            await send(blind, message(data={}, skill="secret"), immediately=True),
        ]
        events: list[StreamResponse] = []
        async with asyncio.timeout(WAIT):
            async for event in streaming.send_message(
                SendMessageRequest(message=message(data={}, skill="secret"))
            ):
                events.append(event)
        assert len(events) == 1 and events[0].HasField("task"), events
        tasks.append(events[0].task)
        for task in tasks:
            assert SECRET not in str(task), task
            assert task.status.state == TaskState.TASK_STATE_SUBMITTED, task
            assert not task.artifacts and not task.history, task
            # It ran all the same: a reader of the tenant reads its result.
            assert ended(server, task.id)["status"] == "succeeded"
            seen = await reader.get_task(GetTaskRequest(id=task.id))
            assert result_of(seen) == {"secret": SECRET}
            for refused in (
                blind.get_task(GetTaskRequest(id=task.id)),
                blind.cancel_task(CancelTaskRequest(id=task.id)),
            ):
                with pytest.raises(Exception) as denied:
                    await refused
                assert SECRET not in str(denied.value)
        # A blocking send with its configuration spelled out answers the same.
        request = SendMessageRequest(
            message=message(data={}, skill="secret"),
            configuration=SendMessageConfiguration(return_immediately=False),
        )
        again = await send_request(blind, request)
        assert SECRET not in str(again) and not again.artifacts


async def test_mcp_calls_answer_no_result_to_who_may_not_read(server: ServerProcess) -> None:
    async with session(server, token=BLIND) as plain:
        await plain.list_tools()
        result = await plain.call_tool("secret", {})
    dumped = result.model_dump_json()
    assert SECRET not in dumped, dumped
    assert result.is_error and result.structured_content is None
    assert isinstance(result.content[0], types.TextContent)
    text = result.content[0].text
    assert "may not read" in text, text
    execution_id = text.split()[1]
    assert ended(server, execution_id)["result"] == {"secret": SECRET}
    async with session(server, tasks=True, token=BLIND) as client:
        created = await call_as_task(client, "secret", {})
        assert SECRET not in created.model_dump_json()
        assert created.status == "working", created
        assert ended(server, created.task_id)["status"] == "succeeded"
        for refused in (
            get_task(client, created.task_id),
            client.send_request(CancelTask(params=TaskParams(task_id=created.task_id)), Ack),
        ):
            with pytest.raises(MCPError) as denied:
                await refused
            assert "not allowed to read" in str(denied.value)
