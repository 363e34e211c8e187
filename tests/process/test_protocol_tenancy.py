"""Tenants through A2A and MCP: the protocols reach executions as the API does, so another
tenant's task is unknown there too, lists hold the caller's tenant only, a task started
over a protocol is its caller's (owner and tenant in the record), and an action
`@agent.authorize` refuses is refused (a read-only principal cancels nothing).

A real `agent-server run tenancy_app:agent --a2a --mcp --api-tokens-file ...` on the memory
store and on Redis, driven by the official SDK clients (`a2a-sdk`, `mcp`) with each
tenant's token, and by plain HTTP for the API's view of the same records.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, ListTasksRequest, TaskState
from a2a.utils.errors import TaskNotFoundError
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.process.test_a2a import message, send
from tests.process.test_mcp import Ack, CancelTask, TaskParams, call_as_task, get_task, session
from tests.process.test_tenancy import ALICE, BOB, READER, tokens_file
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


@asynccontextmanager
async def a2a(server: ServerProcess, token: str) -> AsyncIterator[Client]:
    """The A2A SDK's client of the served card, sending the caller's token."""
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=WAIT, headers=headers) as http:
        card = await A2ACardResolver(http, server.url).get_agent_card()
        async with ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(
            card
        ) as client:
            yield client


def record(server: ServerProcess, token: str, execution_id: str) -> httpx.Response:
    return httpx.get(
        f"{server.url}/executions/{execution_id}",
        headers={"Authorization": f"Bearer {token}"},
        timeout=WAIT,
    )


async def test_an_a2a_task_is_its_tenants_own(server: ServerProcess) -> None:
    async with a2a(server, ALICE) as alice, a2a(server, BOB) as bob:
        task = await send(alice, message(data={"seconds": 60}, skill="hold"), immediately=True)
        mine = record(server, ALICE, task.id).json()
        assert (mine["owner"], mine["tenant"]) == ("alice", "acme")
        # Another tenant: unknown, as an id nobody started; not in its list; not cancelled.
        for call in (
            bob.get_task(GetTaskRequest(id=task.id)),
            bob.cancel_task(CancelTaskRequest(id=task.id)),
        ):
            with pytest.raises(TaskNotFoundError):
                await call
        listed = await bob.list_tasks(ListTasksRequest(page_size=100))
        assert task.id not in [t.id for t in listed.tasks]
        # Nor in its count: one page holds all of Bob's, and the total is that page's.
        assert not listed.next_page_token and listed.total_size == len(listed.tasks), listed
        assert record(server, BOB, task.id).status_code == 404
        ours = await alice.list_tasks(ListTasksRequest(page_size=100))
        assert task.id in [t.id for t in ours.tasks]
        assert not ours.next_page_token and ours.total_size == len(ours.tasks), ours
        # The same messageId from two tenants starts two tasks (names per tenant).
        sent = message(data={"text": "hi"}, skill="echo")
        first = await send(alice, sent)
        second = await send(bob, sent)
        assert first.id != second.id
        assert record(server, BOB, second.id).json()["tenant"] == "globex"
        cancelled = await alice.cancel_task(CancelTaskRequest(id=task.id))
        assert cancelled.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_read_only_principal_reads_an_a2a_task_and_cancels_nothing(
    server: ServerProcess,
) -> None:
    async with a2a(server, ALICE) as alice, a2a(server, READER) as reader:
        task = await send(alice, message(data={"seconds": 60}, skill="hold"), immediately=True)
        seen = await reader.get_task(GetTaskRequest(id=task.id))
        assert seen.id == task.id
        with pytest.raises(Exception) as refused:  # the API's 403, through the SDK
            await reader.cancel_task(CancelTaskRequest(id=task.id))
        assert "403" in str(refused.value) or "not allowed" in str(refused.value)
        assert record(server, ALICE, task.id).json()["status"] == "running"
        await alice.cancel_task(CancelTaskRequest(id=task.id))


async def _cancel(client: ClientSession, task_id: str) -> None:
    await client.send_request(CancelTask(params=TaskParams(task_id=task_id)), Ack)


async def test_an_mcp_task_is_its_tenants_own(server: ServerProcess) -> None:
    async with (
        session(server, tasks=True, token=ALICE) as alice,
        session(server, tasks=True, token=BOB) as bob,
        session(server, tasks=True, token=READER) as reader,
    ):
        created = await call_as_task(alice, "hold", {"seconds": 60})
        mine = record(server, ALICE, created.task_id).json()
        assert (mine["owner"], mine["tenant"]) == ("alice", "acme")
        for attempt in (get_task(bob, created.task_id), _cancel(bob, created.task_id)):
            with pytest.raises(MCPError) as unknown:
                await attempt
            assert "not found" in str(unknown.value).lower()
        assert (await get_task(reader, created.task_id)).task_id == created.task_id
        with pytest.raises(MCPError) as refused:
            await _cancel(reader, created.task_id)
        assert "not allowed to cancel" in str(refused.value)
        assert record(server, ALICE, created.task_id).json()["status"] == "running"
        await _cancel(alice, created.task_id)
        async with httpx.AsyncClient(timeout=WAIT) as http:
            ended = await http.get(  # the API's long-poll: until terminal
                f"{server.url}/executions/{created.task_id}?wait=15",
                headers={"Authorization": f"Bearer {ALICE}"},
            )
        assert ended.json()["status"] == "cancelled", ended.text
