"""An A2A task through a rollout: three real `agent-server run --a2a` replicas on one real
Redis behind haproxy; a resumable reasoner's task, started over A2A on one replica, is handed
off when that replica gets SIGTERM and completed by another, and the SDK's client follows it
there (GetTask through the proxy, SubscribeToTask on a replica that never ran it)."""

from __future__ import annotations

import asyncio
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from tests.support.cluster import Cluster, started_cluster
from tests.support.redis_server import RedisServer

WAIT = 30.0


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_server: RedisServer) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path,
        redis_server,
        *("--a2a", "--grace-period", "8", "--drain-timeout", "1", "--cancel-timeout", "1"),
        app="a2a_app:agent",
    ) as running:
        yield running


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT, headers={"A2A-Version": "1.0"}) as client:
        yield client


async def client_of(http: httpx.AsyncClient, url: str, *, streaming: bool) -> Client:
    card = await A2ACardResolver(http, url).get_agent_card()
    return ClientFactory(ClientConfig(streaming=streaming, httpx_client=http)).create(card)


def steps_message(count: int, pause: float) -> Message:
    made = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=[Part(data=ParseDict({"count": count, "pause": pause}, struct_pb2.Value()))],
    )
    made.metadata.update({"skill": "steps"})
    return made


async def test_a_task_is_handed_off_at_sigterm_and_completed_elsewhere(
    cluster: Cluster, http: httpx.AsyncClient
) -> None:
    first = cluster.replicas[0]
    on_first = await client_of(http, cluster.url(0), streaming=False)
    request = SendMessageRequest(
        message=steps_message(count=12, pause=0.25),
        configuration=SendMessageConfiguration(return_immediately=False),
    )

    async def blocking_send() -> Task:
        answers = [answer async for answer in on_first.send_message(request)]
        return answers[-1].task

    sent = asyncio.create_task(blocking_send())
    await asyncio.to_thread(first.wait_marker, "steps-attempt-1", WAIT)
    first.signal(signal.SIGTERM)
    async with asyncio.timeout(WAIT):
        handed = await sent
    # The blocking send answers at the hand-off: the task goes on elsewhere, still working.
    assert handed.status.state == TaskState.TASK_STATE_WORKING, handed
    code, _ = await asyncio.to_thread(first.wait_exit, WAIT)
    assert code == 0, first.stderr()

    # A replica that never ran it follows it to its end.
    on_second = await client_of(http, cluster.url(1), streaming=True)
    seen: list[StreamResponse] = []
    async with asyncio.timeout(WAIT):
        async for event in on_second.subscribe(SubscribeToTaskRequest(id=handed.id)):
            seen.append(event)
    assert seen[0].task.id == handed.id
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED

    through_proxy = await client_of(http, cluster.proxy.url, streaming=False)
    done = await through_proxy.get_task(GetTaskRequest(id=handed.id))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    result = MessageToDict(done.artifacts[0].parts[0].data)
    assert result["steps"] == 12 and result["attempt"] >= 2, result
    assert MessageToDict(done.metadata)["attempt"] >= 2
    for made in (on_first, on_second, through_proxy):
        await made.close()


async def test_a_task_asks_on_one_replica_and_is_answered_on_the_others(
    cluster: Cluster, http: httpx.AsyncClient
) -> None:
    """Each message of the conversation goes to another replica: the answer is taken once,
    wherever it lands, and the blocking send on the third replica sees the end."""
    clients = [await client_of(http, cluster.url(i), streaming=False) for i in range(3)]

    async def send(client: Client, sent: Message) -> Task:
        answers = [answer async for answer in client.send_message(SendMessageRequest(message=sent))]
        return answers[-1].task

    def say(data: object, task_id: str = "", skill: str | None = None) -> Message:
        made = Message(
            message_id=uuid.uuid4().hex,
            role=Role.ROLE_USER,
            task_id=task_id,
            parts=[Part(data=ParseDict(data, struct_pb2.Value()))],
        )
        if skill:
            made.metadata.update({"skill": skill})
        return made

    asked = await send(clients[0], say({"amount": 11}, skill="approve"))
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    second = await send(clients[1], say({"approved": True}, task_id=asked.id))
    assert second.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert second.status.message.parts[0].text == "a note?"
    done = await send(clients[2], say("from the third", task_id=asked.id))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    result = MessageToDict(done.artifacts[0].parts[0].data)
    assert result == {"approved": True, "amount": 11, "note": "from the third"}
    for made in clients:
        await made.close()
