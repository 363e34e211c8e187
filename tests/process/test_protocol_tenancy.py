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
from typing import Any

import httpx
import mcp_types
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, ListTasksRequest, TaskState
from a2a.utils.errors import TaskNotFoundError
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.process.test_a2a import message, send
from tests.process.test_mcp import (
    Ack,
    CancelTask,
    TaskParams,
    call_as_task,
    get_task,
    session,
    update,
)
from tests.process.test_tenancy import ALICE, ANN, ANSWERER, BLIND, BOB, READER, tokens_file
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


def post(
    server: ServerProcess, token: str, path: str, body: Any, headers: dict[str, str]
) -> httpx.Response:
    return httpx.post(
        f"{server.url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}", **headers},
        timeout=WAIT,
    )


async def test_a_repeated_start_shows_the_earlier_execution_only_to_who_may_read_it(
    server: ServerProcess,
) -> None:
    """An Idempotency-Key (an A2A messageId) is its tenant's: a repeat by another identity
    of the tenant leads to the first request's execution, which it gets only when
    `@agent.authorize` lets it read that execution, on every start route."""
    key = {"Idempotency-Key": "the-same-key"}
    body = {"text": "alice's own words"}
    first = post(server, ALICE, "/reasoners/echo", body, key)
    assert first.status_code == 200, first.text
    execution_id = first.json()["execution_id"]
    assert record(server, BLIND, execution_id).status_code == 403
    for path, extra in (
        ("/reasoners/echo", {}),
        ("/reasoners/echo/async", {}),
        ("/reasoners/echo", {"Accept": "text/event-stream"}),
    ):
        refused = post(server, BLIND, path, body, {**key, **extra})
        assert refused.status_code == 403, (path, extra, refused.text)
        assert refused.json() == {"detail": "not allowed to read"}
    # One that may read it gets it, as the key promises; one's own repeat is its own.
    again = post(server, ANN, "/reasoners/echo", body, key)
    assert again.status_code == 200 and again.json()["execution_id"] == execution_id
    own = {"Idempotency-Key": "answerer-own-key"}
    mine = post(server, ANSWERER, "/reasoners/echo/async", body, own)
    assert mine.status_code == 202, mine.text
    repeated = post(server, ANSWERER, "/reasoners/echo/async", body, own)
    assert repeated.status_code == 202
    assert repeated.json()["execution_id"] == mine.json()["execution_id"]
    # A2A: the messageId is the key.
    async with a2a(server, ALICE) as alice, a2a(server, BLIND) as blind:
        sent = message(data={"text": "alice's message"}, skill="echo")
        task = await send(alice, sent)
        with pytest.raises(Exception) as denied:  # the API's 403, through the SDK
            await send(blind, sent)
        assert "403" in str(denied.value) or "not allowed" in str(denied.value)
    assert record(server, ALICE, task.id).json()["status"] == "succeeded"


async def _asked(server: ServerProcess) -> tuple[str, int]:
    """Alice's `question`, started over the API, once it waits for its answer."""
    started = post(server, ALICE, "/reasoners/question/async", {}, {})
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    async with httpx.AsyncClient(timeout=WAIT) as http:
        asked = await http.get(
            f"{server.url}/executions/{execution_id}?wait=15",
            headers={"Authorization": f"Bearer {ALICE}"},
        )
    assert asked.json()["status"] == "input_required", asked.text
    return execution_id, int(asked.json()["input_request"]["request_id"])


async def test_mcp_asks_authorize_for_each_thing_a_call_does_to_anothers_execution(
    server: ServerProcess,
) -> None:
    """Through MCP a caller reaches an execution of its tenant it did not start by its task
    id or by a call's `requestState`: declining its elicitation cancels it (`cancel`),
    following the call gets its result (`read`), and a caller that may not cancel it does
    not end it by calling without a way to answer."""
    execution_id, request_id = await _asked(server)
    state = f"{execution_id}:{request_id}"
    declined = {str(request_id): {"action": "decline"}}
    async with (
        session(server, tasks=True, token=ANSWERER) as answerer,
        session(server, token=ANSWERER) as plain,
    ):
        with pytest.raises(MCPError) as refused:
            await update(answerer, execution_id, declined)
        assert "not allowed to cancel" in str(refused.value)
        with pytest.raises(MCPError) as refused_call:
            await answerer.call_tool(
                "question",
                {},
                input_responses={str(request_id): mcp_types.ElicitResult(action="decline")},
                request_state=state,
                allow_input_required=True,
            )
        assert "not allowed to cancel" in str(refused_call.value)
        # No elicitation declared, and the ask it names is not the one pending: the call
        # cannot answer it; it says so, and leaves it be (cancelling is not this caller's).
        stale = f"{execution_id}:{request_id + 1}"
        told = await plain.call_tool("question", {}, request_state=stale)
        assert told.is_error
    assert record(server, ALICE, execution_id).json()["status"] == "input_required"
    echoed = post(server, ALICE, "/reasoners/echo", {"text": "alice's result"}, {})
    ended_id = echoed.json()["execution_id"]
    async with session(server, token=BLIND) as blind:
        with pytest.raises(MCPError) as unread:
            await blind.call_tool("echo", {}, request_state=f"{ended_id}:1")
        assert "not allowed to read" in str(unread.value)
        assert "alice's result" not in str(unread.value)
    async with session(server, tasks=True, token=ALICE) as alice:
        await update(alice, execution_id, declined)  # its owner may: cancelled
    async with httpx.AsyncClient(timeout=WAIT) as http:
        ended = await http.get(
            f"{server.url}/executions/{execution_id}?wait=15",
            headers={"Authorization": f"Bearer {ALICE}"},
        )
    assert ended.json()["status"] == "cancelled", ended.text
