"""MCP tasks across replicas: three real `agent-server run --mcp` on one real Redis, each
MCP request sent to another replica with the official SDK's client, and the replica that
took the call stopped (SIGTERM) while its task waits for input: the task is the execution,
so any replica reads it, answers it, tells its changes and sees it end."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import mcp_types as types
import pytest
from mcp.client.extension import NotificationBinding

from tests.process.test_mcp import WAIT, TaskNote, call_as_task, follow, session, update
from tests.support.cluster import Cluster, started_cluster
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_server: RedisServer) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path,
        redis_server,
        *("--mcp", "--grace-period", "8", "--drain-timeout", "1", "--cancel-timeout", "1"),
        app="mcp_app:agent",
    ) as running:
        yield running


async def test_a_task_is_followed_answered_and_ended_on_other_replicas_through_a_stop(
    cluster: Cluster,
) -> None:
    first, second, third = (cluster.url(i) for i in range(3))
    seen: list[TaskNote] = []
    ended = asyncio.Event()

    async def on_task(note: TaskNote) -> None:
        seen.append(note)
        if note.status in ("completed", "failed", "cancelled"):
            ended.set()

    binding = NotificationBinding(
        method="notifications/tasks", params_type=TaskNote, handler=on_task
    )
    async with session(first, tasks=True) as client:
        created = await call_as_task(client, "approve", {"amount": 8})
    # The second replica listens to a task the first runs, and reads it.
    async with session(second, tasks=True, bindings=[binding]) as listener:
        wanted = types.SubscriptionFilter.model_validate({"taskIds": [created.task_id]})
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(notifications=wanted)
        )
        stream = asyncio.ensure_future(
            listener.send_request(listen, types.SubscriptionsListenResult)
        )
        asked = await follow(listener, created.task_id, "input_required")
        assert "1" in (asked.model_extra or {})["inputRequests"]
        cluster.replicas[0].signal()
        code, _ = await asyncio.to_thread(cluster.replicas[0].wait_exit, 15.0)
        assert code == 0
        async with session(third, tasks=True) as client:
            await update(
                client, created.task_id, {"1": {"action": "accept", "content": {"approved": True}}}
            )
        await asyncio.wait_for(ended.wait(), WAIT)
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
    async with session(cluster.proxy.url, tasks=True) as client:
        done = await follow(client, created.task_id, "completed", "failed", "cancelled")
    result = (done.model_extra or {})["result"]
    assert result["structuredContent"] == {"approved": True, "note": "", "amount": 8}
    statuses = [note.status for note in seen]
    assert "input_required" in statuses and statuses[-1] == "completed", statuses
