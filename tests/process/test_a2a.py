"""A2A end to end: a real `agent-server run --a2a` serving tests/apps/a2a_app.py, on the
memory store and on a real Redis, driven by the official SDK's client (`a2a-sdk`) as another
agent would: the card, blocking and streamed sends, get, list, cancel and subscribe, a task
that waits for input answered by messages, v0.3's method names, and bad JSON-RPC input."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    AgentInterface,
    CancelTaskRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import (
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict

from agent_server.http.a2a.handler import COUNT_PAGE
from tests.support.process import ServerProcess, agent_server_cli, one_line, server_errors
from tests.support.webhooks import HOOKS, Receiver

WAIT = 20.0
REASONERS = {"echo", "add", "listing", "slow", "approve", "broken", "steps"}


@pytest.fixture(scope="module", params=["memory", "redis"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    args = ["a2a_app:agent", "--a2a"]
    if request.param == "redis":
        redis = request.getfixturevalue("redis_server")
        args += ["--store", redis.url]
    process = ServerProcess(args, {}, tmp_path_factory.mktemp(f"a2a-{request.param}"))
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        base_url=server.url, timeout=WAIT, headers={"A2A-Version": "1.0"}
    ) as client:
        yield client


async def card_of(http: httpx.AsyncClient, url: str) -> AgentCard:
    return await A2ACardResolver(http, url).get_agent_card()


@pytest.fixture
async def client(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    """The SDK's client, made from the served card (v1.0), without streaming."""
    card = await card_of(http, server.url)
    factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
    async with factory.create(card) as made:
        yield made


@pytest.fixture
async def streaming(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    card = await card_of(http, server.url)
    factory = ClientFactory(ClientConfig(streaming=True, httpx_client=http))
    async with factory.create(card) as made:
        yield made


@pytest.fixture
async def legacy(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    """The SDK's v0.3 client (its compatibility transport): the card's 0.3 interface only."""
    card = await card_of(http, server.url)
    old = [i for i in card.supported_interfaces if i.protocol_version == "0.3"]
    assert len(old) == 1
    keep = AgentInterface()
    keep.CopyFrom(old[0])
    del card.supported_interfaces[:]
    card.supported_interfaces.append(keep)
    factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
    async with factory.create(card) as made:
        yield made


def message(
    *,
    text: str | None = None,
    data: Any = None,
    skill: str | None = None,
    task_id: str = "",
    context_id: str = "",
) -> Message:
    parts = []
    if text is not None:
        parts.append(Part(text=text))
    if data is not None:
        parts.append(Part(data=ParseDict(data, struct_pb2.Value())))
    made = Message(
        message_id=uuid.uuid4().hex,
        role=Role.ROLE_USER,
        parts=parts,
        task_id=task_id,
        context_id=context_id,
    )
    if skill is not None:
        made.metadata.update({"skill": skill})
    return made


async def send(client: Client, sent: Message, *, immediately: bool = False) -> Task:
    """The task a non-streaming send answers with."""
    request = SendMessageRequest(
        message=sent, configuration=SendMessageConfiguration(return_immediately=immediately)
    )
    return await send_request(client, request)


async def send_request(client: Client, request: SendMessageRequest) -> Task:
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1 and answers[0].HasField("task")
    return answers[0].task


def result_of(task: Task) -> Any:
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    (artifact,) = task.artifacts
    (part,) = artifact.parts
    return MessageToDict(part.data)


async def until(client: Client, task_id: str, *states: int) -> Task:
    """The task once in one of `states`, read again and again (bounded)."""
    async with asyncio.timeout(WAIT):
        while True:
            task = await client.get_task(GetTaskRequest(id=task_id))
            if task.status.state in states:
                return task
            await asyncio.sleep(0.05)


# -- the card -----------------------------------------------------------------------------------


async def test_the_card_has_a_skill_per_reasoner_with_their_schemas(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    card = await card_of(http, server.url)
    assert {skill.id for skill in card.skills} == REASONERS
    assert card.capabilities.streaming is True
    assert card.capabilities.push_notifications is False  # no webhook secret
    assert not card.security_schemes  # no authentication
    interfaces = {(i.protocol_version, i.url) for i in card.supported_interfaces}
    assert interfaces == {("1.0", f"{server.url}/a2a"), ("0.3", f"{server.url}/a2a")}
    (extension,) = card.capabilities.extensions
    schemas = MessageToDict(extension.params)["skills"]
    assert schemas["add"]["input_schema"]["required"] == ["a", "b"]
    assert schemas["listing"]["output_schema"]["type"] == "array"
    echo = next(skill for skill in card.skills if skill.id == "echo")
    assert "text/plain" in echo.input_modes  # one string: a text part is its input


async def test_the_card_url_follows_the_host_the_client_reached(http: httpx.AsyncClient) -> None:
    answer = await http.get(
        "/.well-known/agent-card.json", headers={"Host": "agents.example.test:8443"}
    )
    assert answer.status_code == 200
    urls = {i["url"] for i in answer.json()["supportedInterfaces"]}
    assert urls == {"http://agents.example.test:8443/a2a"}
    assert answer.json()["url"] == "http://agents.example.test:8443/a2a"  # v0.3's field


# -- sends --------------------------------------------------------------------------------------


async def test_a_blocking_send_answers_the_ended_task(client: Client) -> None:
    # A text part reaches the default reasoner (echo, one string).
    task = await send(client, message(text="hello"))
    assert result_of(task) == {"result": "HELLO"}
    assert task.context_id  # every task has a context: a new session here
    # A data part is the input of the skill named in metadata.skill; an object result is
    # the data part itself, any other value {"result": value}.
    added = await send(client, message(data={"a": 2, "b": 40}, skill="add"))
    assert result_of(added) == {"sum": 42}
    listed = await send(client, message(data={"n": 2}, skill="listing"))
    assert result_of(listed) == {"result": [0, 1]}
    failed = await send(client, message(data={}, skill="broken"))
    assert failed.status.state == TaskState.TASK_STATE_FAILED
    assert "broken on purpose" in failed.status.message.parts[0].text


async def test_a_send_in_a_context_runs_in_that_session(
    client: Client, http: httpx.AsyncClient
) -> None:
    context = f"ctx-{uuid.uuid4().hex}"
    task = await send(client, message(text="a", context_id=context))
    assert task.context_id == context
    execution = (await http.get(f"/executions/{task.id}")).json()
    assert (execution["session_id"], execution["reasoner"]) == (context, "echo")


async def test_bad_messages_are_invalid_params_and_start_nothing(
    client: Client, http: httpx.AsyncClient
) -> None:
    before = len((await http.get("/executions", params={"limit": 1000})).json())
    bad = [
        message(data={"a": "x", "b": 1}, skill="add"),  # fails the input schema
        message(data={"a": 1}, skill="nope"),  # unknown skill
        message(text="words", skill="add"),  # text for a skill that takes an object
        message(text="a", data={"text": "b"}),  # two parts
        message(text="a", context_id="bad id with spaces"),
        message(skill="broken"),  # no part: A2A requires one ({} for no input)
        Message(role=Role.ROLE_USER, parts=[Part(text="a")]),  # no messageId
    ]
    for sent in bad:
        with pytest.raises(InvalidParamsError):
            await send(client, sent)
    after = len((await http.get("/executions", params={"limit": 1000})).json())
    assert after == before


async def test_a_streamed_send_follows_the_task_to_its_end(streaming: Client) -> None:
    request = SendMessageRequest(message=message(data={"seconds": 0.4}, skill="slow"))
    events: list[StreamResponse] = []
    async with asyncio.timeout(WAIT):
        async for event in streaming.send_message(request):
            events.append(event)
    assert events[0].HasField("task")
    first = events[0].task
    assert first.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    kinds = [event.WhichOneof("payload") for event in events]
    assert kinds[-2:] == ["artifact_update", "status_update"]
    assert MessageToDict(events[-2].artifact_update.artifact.parts[0].data) == {"slept": 0.4}
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED
    assert {event.status_update.task_id for event in events[1:] if kinds} <= {first.id, ""}


# -- get, list, cancel, subscribe ---------------------------------------------------------------


async def test_get_cancel_and_subscribe(client: Client, streaming: Client) -> None:
    task = await send(client, message(data={"seconds": 30}, skill="slow"), immediately=True)
    assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
    await until(client, task.id, TaskState.TASK_STATE_WORKING)
    seen: list[StreamResponse] = []

    async def subscribe() -> None:
        async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
            seen.append(event)

    following = asyncio.create_task(subscribe())
    async with asyncio.timeout(WAIT):
        while not seen:  # noqa: ASYNC110 - the SDK's stream has no event to wait on
            await asyncio.sleep(0.02)
    assert seen[0].task.id == task.id
    cancelled = await client.cancel_task(CancelTaskRequest(id=task.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    async with asyncio.timeout(WAIT):
        await following  # the stream ends at the terminal state
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_CANCELED
    read = await client.get_task(GetTaskRequest(id=task.id))
    assert read.status.state == TaskState.TASK_STATE_CANCELED
    # A terminal task cannot be cancelled again, nor subscribed to; an unknown one is not found.
    with pytest.raises(TaskNotCancelableError):
        await client.cancel_task(CancelTaskRequest(id=task.id))
    with pytest.raises(UnsupportedOperationError):
        async for _ in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
            pass
    with pytest.raises(TaskNotFoundError):
        await client.get_task(GetTaskRequest(id="no-such-task"))


async def every_page(client: Client, context: str, page_size: int) -> list[ListTasksResponse]:
    """The context's list, page by page, following `nextPageToken` to its end (bounded)."""
    pages: list[ListTasksResponse] = []
    token = ""
    async with asyncio.timeout(WAIT):
        while not pages or token:
            pages.append(
                await client.list_tasks(
                    ListTasksRequest(context_id=context, page_size=page_size, page_token=token)
                )
            )
            token = pages[-1].next_page_token
    return pages


async def test_list_pages_through_a_context(client: Client) -> None:
    context = f"list-{uuid.uuid4().hex}"
    ids = set()
    for word in ("a", "b", "c"):
        ids.add((await send(client, message(text=word, context_id=context))).id)
    other = await send(client, message(text="elsewhere"))
    pages = await every_page(client, context, page_size=1)
    assert all(page.total_size == 3 for page in pages), pages  # each counts the whole context
    found = [task.id for page in pages for task in page.tasks]
    assert set(found) == ids and len(found) == 3 and other.id not in found
    completed = await client.list_tasks(
        ListTasksRequest(context_id=context, status=TaskState.TASK_STATE_COMPLETED)
    )
    assert {task.id for task in completed.tasks} == ids and completed.total_size == 3
    failed = await client.list_tasks(
        ListTasksRequest(context_id=context, status=TaskState.TASK_STATE_FAILED)
    )
    assert list(failed.tasks) == [] and failed.total_size == 0


async def test_list_counts_every_task_its_filters_match_not_its_page(
    client: Client, http: httpx.AsyncClient
) -> None:
    """Invariant: `totalSize` is how many tasks the request's filters match before
    pagination (the SDK's own stores' meaning), however many store calls counting them
    takes (more than one here: COUNT_PAGE), and whichever way they started (REST here)."""
    context = f"count-{uuid.uuid4().hex}"
    started = COUNT_PAGE + 20

    async def run(index: int) -> None:  # started, then read once ended (a long-poll)
        answer = await http.post(
            "/reasoners/echo/async", json={"text": str(index)}, headers={"X-Session-ID": context}
        )
        assert answer.status_code == 202, answer.text
        location = answer.headers["location"]
        ended = await http.get(location, params={"wait": WAIT / 2})
        assert ended.json()["status"] == "succeeded", ended.text

    async with asyncio.timeout(WAIT * 2):
        for first in range(0, started, 50):  # bounded: 50 at a time
            await asyncio.gather(*(run(i) for i in range(first, min(first + 50, started))))
    completed = await client.list_tasks(
        ListTasksRequest(context_id=context, status=TaskState.TASK_STATE_COMPLETED)
    )
    assert (len(completed.tasks), completed.total_size) == (50, started)  # the default page
    page = await client.list_tasks(ListTasksRequest(context_id=context, page_size=7))
    assert (len(page.tasks), page.total_size) == (7, started)
    failed = await client.list_tasks(
        ListTasksRequest(context_id=context, status=TaskState.TASK_STATE_FAILED)
    )
    assert (list(failed.tasks), failed.total_size) == ([], 0)
    # Changed after an hour from now: none; after the epoch: all of them.
    later = ListTasksRequest(context_id=context)
    later.status_timestamp_after.FromSeconds(int(time.time()) + 3600)
    assert (await client.list_tasks(later)).total_size == 0
    since_epoch = ListTasksRequest(context_id=context)
    since_epoch.status_timestamp_after.FromSeconds(0)
    assert (await client.list_tasks(since_epoch)).total_size == started
    # From the latest status timestamp of them all: the tasks set at that instant are
    # counted (inclusive), none other.
    pages = await every_page(client, context, page_size=100)
    stamps = [task.status.timestamp.ToNanoseconds() for page in pages for task in page.tasks]
    assert len(stamps) == started
    latest = ListTasksRequest(context_id=context)
    latest.status_timestamp_after.FromNanoseconds(max(stamps))
    assert (await client.list_tasks(latest)).total_size == stamps.count(max(stamps))


# -- input --------------------------------------------------------------------------------------


async def test_input_required_is_answered_by_messages_on_the_task(client: Client) -> None:
    task = await send(client, message(data={"amount": 7}, skill="approve"))
    assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    asked = task.status.message
    assert asked.parts[0].text == "approve 7?"
    schema = MessageToDict(asked.metadata)["schema"]
    assert schema["required"] == ["approved"]
    # An answer that does not fit the schema is refused; the task still waits.
    with pytest.raises(InvalidParamsError):
        await send(client, message(data={"approved": "maybe"}, task_id=task.id))
    still = await client.get_task(GetTaskRequest(id=task.id))
    assert still.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    # The answer as a data part: the task goes on to its next request (a string: text).
    second = await send(client, message(data={"approved": True}, task_id=task.id))
    assert second.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert second.status.message.parts[0].text == "a note?"
    done = await send(client, message(text="fine", task_id=task.id))
    assert result_of(done) == {"approved": True, "amount": 7, "note": "fine"}
    # A terminal task takes no more messages.
    with pytest.raises(UnsupportedOperationError):
        await send(client, message(text="again", task_id=task.id))


# -- v0.3 ---------------------------------------------------------------------------------------


async def test_v03_clients_use_v03_method_names(legacy: Client) -> None:
    task = await send(legacy, message(data={"a": 1, "b": 2}, skill="add"))
    assert result_of(task) == {"sum": 3}
    read = await legacy.get_task(GetTaskRequest(id=task.id))
    assert read.status.state == TaskState.TASK_STATE_COMPLETED
    slow = await send(legacy, message(data={"seconds": 30}, skill="slow"), immediately=True)
    cancelled = await legacy.cancel_task(CancelTaskRequest(id=slow.id))
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED


async def test_a_missing_version_means_v03(server: ServerProcess) -> None:
    plain = httpx.AsyncClient(base_url=server.url, timeout=WAIT)  # no A2A-Version
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {
                "kind": "message",
                "messageId": "m-1",
                "role": "user",
                "parts": [{"kind": "text", "text": "old"}],
            }
        },
    }
    async with plain:
        old = (await plain.post("/a2a", json=body)).json()
        assert old["result"]["kind"] == "task"
        assert old["result"]["status"]["state"] == "completed"
        # v1.0's name without A2A-Version: the name says 1.x, served as 1.0 (v1.0's params).
        new = {**body, "method": "SendMessage"}
        new["params"] = {
            "message": {"messageId": "m-2", "role": "ROLE_USER", "parts": [{"text": "new"}]}
        }
        served = (await plain.post("/a2a", json=new)).json()
        assert served["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", served


# -- bad JSON-RPC input -------------------------------------------------------------------------


BAD_BODIES: list[bytes] = [
    b"",
    b"{",
    b"[]",
    b"[1,2]",
    b'"text"',
    b"null",
    b'{"jsonrpc":"1.0","id":1,"method":"GetTask"}',
    b'{"jsonrpc":"2.0","id":1}',
    b'{"jsonrpc":"2.0","id":1,"method":"NoSuchMethod","params":{}}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":[1]}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":5}}',
    b'{"jsonrpc":"2.0","id":{"a":1},"method":"GetTask","params":{"id":"x"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"parts":[]}}}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",'
    b'"messageId":"m","parts":[{"raw":"aGk="}]}}}',
    b'{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageSize":100000}}',
    b'{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageToken":"zzz"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"contextId":"a b"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"pageSize":-5}}',
    b'{"jsonrpc":"2.0","id":1,"method":"CancelTask","params":{"id":"no-such-task"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":5}}',
    b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{}}',
    b'{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"' + b"x" * 5000 + b'"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",'
    b'"messageId":"m","parts":[{"data":' + b"[" * 5000 + b"]" * 5000 + b"}]}}}",
    b'{"jsonrpc":"2.0","id":1e999,"method":"GetTask","params":{"id":"x"}}',
    # What protobuf cannot carry: a lone surrogate, an integer past a double, deep params.
    b'{"jsonrpc":"2.0","id":"\\ud800","method":"nope"}',
    b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"\\udfff"}}',
    b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message",'
    b'"messageId":"m","role":"user","parts":[{"kind":"data","data":{"a":1' + b"0" * 400 + b"}}]}}}",
    b'{"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":{"kind":"message",'
    b'"messageId":"m","role":"user","parts":[{"kind":"data","data":{"a":'
    + b"[" * 60
    + b"]" * 60
    + b"}}]}}}",
]


def test_bad_input_leaves_no_line_in_the_log(server: ServerProcess) -> None:
    """Each bad request is answered to its client; none is written to the server's log
    (a client could fill it), nor the body of any request."""
    with httpx.Client(base_url=server.url, timeout=WAIT) as plain:
        for body in BAD_BODIES:
            for headers in ({"A2A-Version": "1.0"}, {}):
                plain.post("/a2a", content=body, headers=headers)
    logged = server.stderr()
    for line in ("Request Error", "Failed to", "Request body", "Version mismatch"):
        assert line not in logged, logged[-3000:]
    assert not re.search(r"(DEBUG|INFO|WARNING|ERROR) a2a\.", logged), logged[-3000:]


@pytest.mark.parametrize("body", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_jsonrpc_input_gets_a_jsonrpc_error(server: ServerProcess, body: bytes) -> None:
    with httpx.Client(base_url=server.url, timeout=WAIT) as plain:
        for version in ("1.0", None):
            headers = {"Content-Type": "application/json"}
            if version is not None:
                headers["A2A-Version"] = version
            answer = plain.post("/a2a", content=body, headers=headers)
            assert answer.status_code == 200, answer.text
            assert "error" in answer.json(), answer.text
            assert answer.json()["error"]["code"] != -32603, answer.text  # never the input's
        errors = server_errors(plain.get("/metrics").text)
    assert errors == {}, errors


# -- off unless enabled; behind authentication ---------------------------------------------------


def test_public_url_names_where_clients_reach_the_server(server_factory: Any) -> None:
    public = "https://agents.example.test/trips"
    served = server_factory("a2a_app:agent", "--a2a", "--public-url", public + "/")
    with httpx.Client(base_url=served.url, timeout=WAIT) as client:
        card = client.get("/.well-known/agent-card.json").json()
    assert {i["url"] for i in card["supportedInterfaces"]} == {f"{public}/a2a"}


def test_a_page_of_an_allowed_origin_may_send_a2a_headers(server_factory: Any) -> None:
    """`--cors-allow-origin` with `--a2a`: the preflight allows the headers A2A's clients
    send (`A2A-Version`, `A2A-Extensions`), as it allows the API's."""
    page = "https://app.example"
    served = server_factory("a2a_app:agent", "--a2a", "--cors-allow-origin", page)
    with httpx.Client(base_url=served.url, timeout=WAIT) as client:
        preflight = client.options(
            "/a2a",
            headers={
                "origin": page,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type,a2a-version,a2a-extensions",
            },
        )
    assert preflight.status_code == 200, preflight.text
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "a2a-version" in allowed and "a2a-extensions" in allowed


@pytest.mark.parametrize(
    "bad", ["ftp://x/", "agents.example.test", "https://x/?token=1", "https://x/#a", "https:// x"]
)
def test_a_public_url_that_is_not_one_stops_the_start(bad: str) -> None:
    done = agent_server_cli("run", "a2a_app:agent", "--a2a", "--public-url", bad)
    assert done.returncode == 2, done.stderr
    assert "public-url" in done.stderr


def test_a_default_reasoner_that_is_none_stops_the_start() -> None:
    done = agent_server_cli("run", "a2a_app:misnamed", "--a2a")
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) == (
        "agent-server: default_reasoner 'nope' is not a reasoner of agent 'a2a-misnamed'"
    )


def test_without_the_extra_a2a_stops_the_start_naming_it(
    tmp_path: Path, server_factory: Any
) -> None:
    """Where the SDK cannot be imported (a package named `a2a` that raises as an absent one
    does), `--a2a` stops the start in one line naming the extra."""
    (tmp_path / "a2a").mkdir()
    (tmp_path / "a2a" / "__init__.py").write_text(
        'raise ImportError("No module named \'a2a\'", name="a2a")\n'
    )
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    done = agent_server_cli("run", "a2a_app:agent", "--a2a", env={"PYTHONPATH": path})
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr) == (
        "agent-server: --a2a needs the a2a extra: pip install 'agent-server[a2a]'"
    )
    # Without --a2a the same agent serves as ever: the SDK is imported only for it.
    plain = server_factory("a2a_app:agent", env={"PYTHONPATH": path})
    assert httpx.get(f"{plain.url}/reasoners", timeout=WAIT).status_code == 200


def test_a2a_is_off_unless_enabled(server_factory: Any) -> None:
    plain = server_factory("a2a_app:agent")
    with httpx.Client(base_url=plain.url, timeout=WAIT) as client:
        assert client.get("/.well-known/agent-card.json").status_code == 404
        refused = client.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "GetTask"})
        assert refused.status_code == 404


async def test_with_a_token_the_card_stays_public_and_names_the_scheme(
    server_factory: Any,
) -> None:
    token = "a2a-test-token-" + uuid.uuid4().hex
    # Behind a proxy that strips /agent: the card's URL names the path the client uses.
    secured = server_factory(
        "a2a_app:agent", "--a2a", "--api-token", token, "--root-path", "/agent"
    )
    async with httpx.AsyncClient(
        base_url=secured.url, timeout=WAIT, headers={"A2A-Version": "1.0"}
    ) as anonymous:
        card = await card_of(anonymous, secured.url)  # discovery needs no token
        assert {i.url for i in card.supported_interfaces} == {f"{secured.url}/agent/a2a"}
        # The client reaches the server as the proxy would: the card's path, prefix stripped.
        for interface in card.supported_interfaces:
            interface.url = f"{secured.url}/a2a"
        assert set(card.security_schemes) == {"bearer"}
        assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
        assert [set(r.schemes) for r in card.security_requirements] == [{"bearer"}]
        body = {"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "x"}}
        assert (await anonymous.post("/a2a", json=body)).status_code == 401
    headers = {"A2A-Version": "1.0", "Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=WAIT, headers=headers) as http:
        factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
        async with factory.create(card) as client:
            task = await send(client, message(text="secret"))
            assert result_of(task) == {"result": "SECRET"}
            extended = await client.get_extended_agent_card(GetExtendedAgentCardRequest())
            assert {skill.id for skill in extended.skills} == REASONERS


# -- push notifications: the execution's signed, durable webhooks --------------------------------


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_push_notifications_are_the_signed_webhooks(
    server_factory: Any, request: pytest.FixtureRequest, store: str
) -> None:
    # A Redis of its own: the module's is in use by its server (no FLUSHALL under it).
    stores = [] if store == "memory" else ["--store", request.getfixturevalue("own_redis").url]
    hooked = server_factory("a2a_app:agent", "--a2a", *HOOKS, *stores)
    receiver = Receiver()
    try:
        async with httpx.AsyncClient(
            base_url=hooked.url, timeout=WAIT, headers={"A2A-Version": "1.0"}
        ) as http:
            card = await card_of(http, hooked.url)
            assert card.capabilities.push_notifications is True
            factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
            async with factory.create(card) as client:
                sent = SendMessageRequest(
                    message=message(data={"amount": 3}, skill="approve"),
                    configuration=SendMessageConfiguration(
                        task_push_notification_config=TaskPushNotificationConfig(url=receiver.url)
                    ),
                )
                task = await send_request(client, sent)
                assert task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
                with pytest.raises(UnsupportedOperationError):  # the URL is never shown
                    await client.get_task_push_notification_config(
                        GetTaskPushNotificationConfigRequest(task_id=task.id, id="webhook")
                    )
                await send(client, message(data={"approved": True}, task_id=task.id))
                await send(client, message(text="ok", task_id=task.id))

        def delivered(kind: str) -> list[dict[str, Any]]:
            return [
                r for r in receiver.delivered(kind) if r["body"]["data"]["execution_id"] == task.id
            ]

        async with asyncio.timeout(WAIT):  # the receiver is a thread: polled
            while len(delivered("execution.input_required")) < 2 or not delivered(  # noqa: ASYNC110
                "execution.finished"
            ):
                await asyncio.sleep(0.05)
        assert delivered("execution.finished")[0]["body"]["data"]["result"] == {
            "approved": True,
            "amount": 3,
            "note": "ok",
        }
        assert receiver.unverified == []
    finally:
        receiver.close()


async def test_push_configs_need_webhooks(client: Client) -> None:
    sent = SendMessageRequest(
        message=message(text="x"),
        configuration=SendMessageConfiguration(
            task_push_notification_config=TaskPushNotificationConfig(url="http://127.0.0.1:9/x")
        ),
    )
    with pytest.raises(PushNotificationNotSupportedError):
        await send_request(client, sent)


async def test_a_message_sent_again_gets_the_task_it_started(client: Client) -> None:
    """The message id is the start's idempotency key: a retry (the first answer lost) runs
    nothing twice; the same id for another message is refused."""
    first = message(data={"seconds": 30}, skill="slow")
    task = await send(client, first, immediately=True)
    again = await send(client, first, immediately=True)
    assert again.id == task.id
    in_context = message(text="x", context_id=f"ctx-{uuid.uuid4().hex}")
    assert (await send(client, in_context)).id == (await send(client, in_context)).id
    other = message(data={"seconds": 29}, skill="slow")
    other.message_id = first.message_id
    with pytest.raises(InvalidParamsError):
        await send(client, other, immediately=True)
    await client.cancel_task(CancelTaskRequest(id=task.id))


async def test_a_stream_stops_at_input_and_a_streamed_answer_goes_on(
    streaming: Client, client: Client
) -> None:
    async def streamed(sent: Message) -> list[StreamResponse]:
        async with asyncio.timeout(WAIT):
            return [
                event async for event in streaming.send_message(SendMessageRequest(message=sent))
            ]

    asked = await streamed(message(data={"amount": 5}, skill="approve"))
    last = asked[-1].status_update.status if len(asked) > 1 else asked[-1].task.status
    assert last.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert last.message.parts[0].text == "approve 5?"
    task_id = asked[0].task.id
    # A subscriber follows the task through the answers to its end.
    seen: list[StreamResponse] = []
    subscribed = asyncio.Event()

    async def subscribe() -> None:
        async for event in streaming.subscribe(SubscribeToTaskRequest(id=task_id)):
            seen.append(event)
            subscribed.set()

    following = asyncio.create_task(subscribe())
    # Subscribed before the answers: a task that has ended takes no subscriber (A2A).
    first = asyncio.ensure_future(subscribed.wait())
    try:
        async with asyncio.timeout(WAIT):
            await asyncio.wait({following, first}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        first.cancel()
    assert subscribed.is_set(), following
    second = await streamed(message(data={"approved": False}, task_id=task_id))
    assert second[0].task.id == task_id
    assert second[-1].status_update.status.message.parts[0].text == "a note?"
    done = await send(client, message(text="no", task_id=task_id))
    assert result_of(done) == {"approved": False, "amount": 5, "note": "no"}
    async with asyncio.timeout(WAIT):
        await following
    assert seen[0].task.id == task_id
    assert seen[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


async def test_v03_streams(server: ServerProcess, http: httpx.AsyncClient) -> None:
    card = await card_of(http, server.url)
    old = next(i for i in card.supported_interfaces if i.protocol_version == "0.3")
    keep = AgentInterface()
    keep.CopyFrom(old)
    del card.supported_interfaces[:]
    card.supported_interfaces.append(keep)
    factory = ClientFactory(ClientConfig(streaming=True, httpx_client=http))
    async with factory.create(card) as legacy:
        sent = SendMessageRequest(message=message(data={"seconds": 0.3}, skill="slow"))
        async with asyncio.timeout(WAIT):
            events = [event async for event in legacy.send_message(sent)]
    assert events[0].task.id
    assert events[-1].status_update.status.state == TaskState.TASK_STATE_COMPLETED


def test_an_open_stream_ends_at_shutdown_and_the_server_exits_clean(
    server_factory: Any,
) -> None:
    """SIGTERM while a subscriber follows a task: the stream ends (its task cancelled by the
    drain, or cut when the listener closes) and the server exits 0 within its budget."""
    served = server_factory(
        "a2a_app:agent",
        "--a2a",
        *("--grace-period", "8", "--drain-timeout", "1", "--cancel-timeout", "1"),
    )

    async def scenario() -> list[StreamResponse]:
        async with httpx.AsyncClient(timeout=WAIT, headers={"A2A-Version": "1.0"}) as http:
            card = await card_of(http, served.url)
            factory = ClientFactory(ClientConfig(streaming=True, httpx_client=http))
            async with factory.create(card) as streaming:
                factory = ClientFactory(ClientConfig(streaming=False, httpx_client=http))
                async with factory.create(card) as plain:
                    started = message(data={"seconds": 60, "marker": "slow-began"}, skill="slow")
                    task = await send(plain, started, immediately=True)
                await asyncio.to_thread(served.wait_marker, "slow-began", WAIT)
                seen: list[StreamResponse] = []
                async with asyncio.timeout(WAIT):
                    async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
                        seen.append(event)
                        if len(seen) == 1:
                            served.signal(signal.SIGTERM)
                return seen

    seen = asyncio.run(scenario())
    assert seen[0].HasField("task")
    code, took = served.wait_exit(WAIT)
    assert code == 0, served.stderr()
    assert took < 8, took  # within its grace period: the stream held nothing up


async def test_a_blocking_send_whose_client_leaves_lets_its_task_run(
    server: ServerProcess, client: Client
) -> None:
    """Unlike a synchronous run (cancelled when its caller leaves), an A2A task is durable:
    the client that gave up waiting finds it by ListTasks and reads its end."""
    context = f"left-{uuid.uuid4().hex}"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {
                "messageId": uuid.uuid4().hex,
                "role": "ROLE_USER",
                "contextId": context,
                "parts": [{"data": {"seconds": 1.0}}],
                "metadata": {"skill": "slow"},
            }
        },
    }
    async with httpx.AsyncClient(base_url=server.url, headers={"A2A-Version": "1.0"}) as quick:
        with pytest.raises(httpx.ReadTimeout):
            await quick.post("/a2a", json=body, timeout=0.3)
    async with asyncio.timeout(WAIT):
        while True:
            listed = await client.list_tasks(
                ListTasksRequest(context_id=context, include_artifacts=True)
            )
            if listed.tasks and listed.tasks[0].status.state == TaskState.TASK_STATE_COMPLETED:
                break
            assert all(t.status.state != TaskState.TASK_STATE_CANCELED for t in listed.tasks)
            await asyncio.sleep(0.1)
    assert len(listed.tasks) == 1
    assert result_of(listed.tasks[0]) == {"slept": 1.0}
