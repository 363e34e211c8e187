"""Live events on every front (docs/protocols.md, "Events"): what a reasoner emits
(`ctx.emit`) and yields reaches an A2A stream, an A2A subscription (replayed from the first
event kept, on any replica) and an MCP call's progress notifications, every one, in order,
with its data. Real `agent-server run --a2a --mcp` serving tests/apps/events_app.py, on the
memory store and on a real Redis (two replicas: a subscriber on the one that does not run
the task), driven by the official SDKs' clients."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import mcp_types as types
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from tests.process.test_a2a import card_of, message
from tests.process.test_mcp import call_as_task, follow, session, update
from tests.support.process import serving

WAIT = 20.0


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def replicas(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[str]]:
    """Two base URLs: the one server of the memory store twice, or two replicas on one
    Redis (a task started on the first is followed on the second)."""
    args = ["events_app:agent", "--a2a", "--mcp"]
    with contextlib.ExitStack() as stack:
        if request.param == "memory":
            process = stack.enter_context(serving(tmp_path_factory, "events", *args))
            yield [process.url, process.url]
            return
        redis = request.getfixturevalue("redis_server")
        store = ["--store", redis.url]
        urls = [
            stack.enter_context(serving(tmp_path_factory, f"events-{n}", *args, *store)).url
            for n in range(2)
        ]
        yield urls


@contextlib.asynccontextmanager
async def a2a_client(
    url: str, *, streaming: bool = True, version: str = "1.0"
) -> AsyncIterator[Client]:
    """The SDK's client for the server at `url`, made from its card, speaking `version`
    (its v0.3 compatibility transport for "0.3")."""
    async with httpx.AsyncClient(
        base_url=url, timeout=WAIT, headers={"A2A-Version": version}
    ) as http:
        card = await card_of(http, url)
        kept = [i for i in card.supported_interfaces if i.protocol_version == version]
        del card.supported_interfaces[:]
        card.supported_interfaces.extend(kept)
        factory = ClientFactory(ClientConfig(streaming=streaming, httpx_client=http))
        async with factory.create(card) as made:
            yield made


def emitted(responses: list[StreamResponse]) -> list[tuple[str, int, Any]]:
    """The events a stream carried, in its order: (name, number, data), from the status
    updates whose message is an event and the `output` artifact's chunks."""
    found: list[tuple[str, int, Any]] = []
    for response in responses:
        kind = response.WhichOneof("payload")
        if kind == "status_update":
            said = response.status_update.status.message
            about = MessageToDict(said.metadata) if said.HasField("metadata") else {}
            if "event" in about:
                assert response.status_update.status.state == TaskState.TASK_STATE_WORKING
                (part,) = said.parts
                found.append((about["event"], int(about["eventId"]), _json(part.data)))
        elif kind == "artifact_update" and response.artifact_update.artifact.name == "output":
            artifact = response.artifact_update.artifact
            about = MessageToDict(artifact.metadata)
            (part,) = artifact.parts
            found.append((about["event"], int(about["eventId"]), _json(part.data)))
    return found


def _json(value: Any) -> Any:
    """A data part's value as JSON (protobuf holds every number as a double)."""
    data = MessageToDict(value)
    return json.loads(json.dumps(data).replace(".0,", ",").replace(".0}", "}"))


def last_state(responses: list[StreamResponse]) -> int:
    last = responses[-1]
    if last.HasField("status_update"):
        return last.status_update.status.state
    return last.task.status.state


# -- A2A ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["1.0", "0.3"])
async def test_an_a2a_stream_carries_every_emitted_event_in_order(
    replicas: list[str], version: str
) -> None:
    tag = uuid.uuid4().hex[:8]
    sent = SendMessageRequest(
        message=message(data={"count": 3, "pause": 0.1, "tag": tag}, skill="emitter")
    )
    async with a2a_client(replicas[0], version=version) as client, asyncio.timeout(WAIT):
        responses = [response async for response in client.send_message(sent)]
    assert responses[0].HasField("task")
    assert emitted(responses) == [("step", n, {"n": n, "tag": tag}) for n in (1, 2, 3)]
    assert last_state(responses) == TaskState.TASK_STATE_COMPLETED
    # The events come before the end: the result, then the completed status, close the stream.
    kinds = [response.WhichOneof("payload") for response in responses]
    assert kinds[-2:] == ["artifact_update", "status_update"]
    assert responses[-2].artifact_update.artifact.name == "result"


@pytest.mark.parametrize("version", ["1.0", "0.3"])
async def test_an_a2a_stream_carries_each_yield_as_a_chunk_of_the_output_artifact(
    replicas: list[str], version: str
) -> None:
    sent = SendMessageRequest(message=message(data={"count": 3, "pause": 0.1}, skill="counter"))
    async with a2a_client(replicas[0], version=version) as client, asyncio.timeout(WAIT):
        responses = [response async for response in client.send_message(sent)]
    assert emitted(responses) == [
        ("output", 1, {"n": 1}),
        ("output", 2, "value 2"),
        ("output", 3, {"n": 3}),
    ]
    chunks = [
        response.artifact_update
        for response in responses
        if response.HasField("artifact_update")
        and response.artifact_update.artifact.name == "output"
    ]
    assert [chunk.append for chunk in chunks] == [False, True, True]
    assert {chunk.artifact.artifact_id for chunk in chunks} == {"output"}
    assert last_state(responses) == TaskState.TASK_STATE_COMPLETED
    result = responses[-2].artifact_update.artifact
    assert result.name == "result"
    assert _json(result.parts[0].data) == {"result": [{"n": 1}, "value 2", {"n": 3}]}


async def test_a_subscription_replays_what_was_kept_then_follows_live_on_any_replica(
    replicas: list[str],
) -> None:
    """A task that emitted two events and waits for input: each subscriber (on the replica
    that does not run it, with Redis) gets those two replayed, then the one emitted after
    the answer, in order, and the end; a second subscription replays them again."""
    owner, other = replicas
    async with a2a_client(owner, streaming=False) as client:
        started = SendMessageRequest(
            message=message(data={"before": 2}, skill="around"),
            configuration=SendMessageConfiguration(return_immediately=True),
        )
        (answer,) = [response async for response in client.send_message(started)]
        task_id = answer.task.id
        async with asyncio.timeout(WAIT):
            while True:
                task = await client.get_task(GetTaskRequest(id=task_id))
                if task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
                    break
                await asyncio.sleep(0.05)

    seen: list[list[StreamResponse]] = [[], []]
    replayed = [asyncio.Event(), asyncio.Event()]

    async def subscribe(index: int) -> None:
        async with a2a_client(other) as subscriber:
            request = SubscribeToTaskRequest(id=task_id)
            async for response in subscriber.subscribe(request):
                seen[index].append(response)
                if len(emitted(seen[index])) >= 2:
                    replayed[index].set()

    following = [asyncio.create_task(subscribe(n)) for n in range(2)]
    try:
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*(kept.wait() for kept in replayed))
        async with a2a_client(owner, streaming=False) as client:
            reply = message(text="yes", task_id=task_id)
            (done,) = [
                response
                async for response in client.send_message(SendMessageRequest(message=reply))
            ]
        assert done.task.status.state == TaskState.TASK_STATE_COMPLETED
        async with asyncio.timeout(WAIT):
            await asyncio.gather(*following)
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
    expected = [("before", 1, {"n": 1}), ("before", 2, {"n": 2}), ("after", 4, {"answer": "yes"})]
    for responses in seen:
        assert responses[0].task.id == task_id
        assert emitted(responses) == expected
        assert last_state(responses) == TaskState.TASK_STATE_COMPLETED


# -- MCP ------------------------------------------------------------------------------------


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_an_mcp_call_with_a_progress_token_gets_every_event_as_progress(
    replicas: list[str], legacy: bool
) -> None:
    tag = uuid.uuid4().hex[:8]
    progress: list[tuple[float, float | None, str | None]] = []
    all_in = asyncio.Event()

    async def on_progress(value: float, total: float | None, said: str | None) -> None:
        progress.append((value, total, said))
        if len(progress) == 3:
            all_in.set()

    async with session(replicas[0], legacy=legacy) as client:
        await client.list_tools()
        result = await client.call_tool(
            "emitter", {"count": 3, "pause": 0.1, "tag": tag}, progress_callback=on_progress
        )
        async with asyncio.timeout(WAIT):
            await all_in.wait()
    assert not result.is_error and result.structured_content == {"emitted": 3}
    assert [value for value, _, _ in progress] == [1, 2, 3]
    assert [json.loads(said or "") for _, _, said in progress] == [
        {"n": n, "tag": tag} for n in (1, 2, 3)
    ]


async def test_an_mcp_call_of_a_generator_gets_each_yield_as_progress(
    replicas: list[str],
) -> None:
    progress: list[tuple[float, str | None]] = []
    all_in = asyncio.Event()

    async def on_progress(value: float, total: float | None, said: str | None) -> None:
        progress.append((value, said))
        if len(progress) == 3:
            all_in.set()

    async with session(replicas[0]) as client:
        result = await client.call_tool(
            "counter", {"count": 3, "pause": 0.1}, progress_callback=on_progress
        )
        async with asyncio.timeout(WAIT):
            await all_in.wait()
    assert not result.is_error
    # A string's own text; any other value its JSON.
    assert progress == [(1, '{"n":1}'), (2, "value 2"), (3, '{"n":3}')]


async def test_an_mcp_listen_with_a_progress_token_gets_a_tasks_events_on_any_replica(
    replicas: list[str],
) -> None:
    """`subscriptions/listen` carrying a progressToken (the SDK's progress callback): the
    listened task's kept events, then the live ones, as progress on the listen's stream,
    from the replica that does not run it (with Redis)."""
    owner, other = replicas
    progress: list[tuple[float, str | None]] = []
    counted = {2: asyncio.Event(), 4: asyncio.Event()}

    async def on_progress(value: float, total: float | None, said: str | None) -> None:
        progress.append((value, said))
        if len(progress) in counted:
            counted[len(progress)].set()

    async with session(owner, tasks=True) as client:
        created = await call_as_task(client, "around", {"before": 2})
        await follow(client, created.task_id, "input_required")
    async with session(other, tasks=True) as listener:
        wanted = types.SubscriptionFilter.model_validate({"taskIds": [created.task_id]})
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(notifications=wanted)
        )
        stream = asyncio.ensure_future(
            listener.send_request(
                listen, types.SubscriptionsListenResult, progress_callback=on_progress
            )
        )
        try:
            async with asyncio.timeout(WAIT):
                await counted[2].wait()  # the two kept before the listen began
            async with session(owner, tasks=True) as client:
                answer = {"1": {"action": "accept", "content": {"value": "yes"}}}
                await update(client, created.task_id, answer)
            async with asyncio.timeout(WAIT):
                await counted[4].wait()
        finally:
            stream.cancel()
            await asyncio.gather(stream, return_exceptions=True)
    assert [value for value, _ in progress] == [1, 2, 3, 4]
    messages = [json.loads(said or "") for _, said in progress]
    assert messages[:2] == [{"n": 1}, {"n": 2}]
    assert messages[2]["prompt"] == "go on?"  # the ask's own `input_required` event
    assert messages[3] == {"answer": "yes"}


async def test_a_reader_of_a_queued_task_leaves_every_event_kept(replicas: list[str]) -> None:
    """A subscriber that reaches a task before its first attempt (a delayed start) sees
    each event live, and the task keeps all of them (`--max-events`) for the next reader:
    a reader never decides how many are kept."""
    owner, other = replicas
    tag = uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(base_url=owner, timeout=WAIT) as http:
        started = await http.post(
            "/reasoners/emitter/async",
            params={"delay": "3"},
            json={"count": 3, "pause": 0.05, "tag": tag},
        )
        assert started.status_code == 202, started.text
        task_id = started.json()["execution_id"]
        async with a2a_client(other) as subscriber, asyncio.timeout(WAIT):
            responses = [r async for r in subscriber.subscribe(SubscribeToTaskRequest(id=task_id))]
        assert responses[0].task.status.state == TaskState.TASK_STATE_SUBMITTED  # before it ran
        expected = [("step", n, {"n": n, "tag": tag}) for n in (1, 2, 3)]
        assert emitted(responses) == expected
        assert last_state(responses) == TaskState.TASK_STATE_COMPLETED
        replay = await http.get(f"/executions/{task_id}/events", params={"after": 0})
    ids = [line for line in replay.text.splitlines() if line.startswith("id: ")]
    assert ids == ["id: 1", "id: 2", "id: 3"], replay.text
