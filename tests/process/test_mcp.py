"""MCP at `/mcp` end to end: a real `agent-server run --mcp` serving tests/apps/mcp_app.py,
driven by the official SDK's client (`streamable_http_client` + `ClientSession`) as a user
would, on both revisions it speaks (2026-07-28 through `server/discover`, 2025-11-25 through
`initialize`), and read back through the HTTP API: the execution record is the one truth."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import mcp_types as types
import pytest
from mcp.client.extension import ClaimContext, NotificationBinding, ResultClaim
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from prometheus_client.parser import text_string_to_metric_families

from tests.support.process import ServerProcess, server_errors, serving
from tests.support.redis_server import RedisServer

WAIT = 20.0
TASKS = "io.modelcontextprotocol/tasks"


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """The module's server, on each store: a task is the record, wherever it is kept."""
    store = []
    if request.param == "redis":
        redis: RedisServer = request.getfixturevalue("redis_server")
        store = ["--store", redis.url]
    with serving(tmp_path_factory, "mcp", "mcp_app:agent", "--mcp", *store) as process:
        yield process


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class Task(types.Result):
    """The tasks extension's `Task` (and `DetailedTask`): extra fields kept."""

    model_config = types.Result.model_config | {"extra": "allow"}
    task_id: str
    status: str


class Ack(types.Result):
    """`tasks/update` and `tasks/cancel` answer an empty acknowledgement."""

    result_type: Literal["complete"]


class CreatedTask(Task):
    result_type: Literal["task"] = "task"


async def _unresolved(created: CreatedTask, ctx: ClaimContext) -> types.CallToolResult:
    raise AssertionError("the tests follow their tasks themselves (allow_claimed=True)")


#: A `CreateTaskResult` answers a `tools/call` (the extension's claimed result shape).
TASK_CLAIM = ResultClaim(result_type="task", model=CreatedTask, resolve=_unresolved)


async def _never_called(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    raise AssertionError("a stateless server sends no request back: it asks in its answer")


@asynccontextmanager
async def session(
    server: ServerProcess | str,
    *,
    legacy: bool = False,
    tasks: bool = False,
    elicits: bool = False,
    bindings: list[NotificationBinding[Any]] | None = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[ClientSession]:
    """A connected client session to a server (or a base URL): discovered (2026-07-28) or
    initialized (2025-11-25); with `tasks`, declaring the tasks extension."""
    base = server if isinstance(server, str) else server.url
    sent = dict(headers or {})
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    extensions = {TASKS} if tasks else None
    async with (
        streamable_http_client(
            f"{base}/mcp",
            http_client=create_mcp_http_client(headers=sent) if sent else None,
        ) as (read, write),
        ClientSession(
            read,
            write,
            read_timeout_seconds=WAIT,
            extensions={e: {} for e in extensions} if extensions else None,
            result_claims={TASKS: [TASK_CLAIM]} if tasks else None,
            elicitation_callback=_never_called if elicits else None,
            notification_bindings=bindings,
        ) as opened,
    ):
        if legacy:
            await opened.initialize()
        else:
            await opened.discover()
        yield opened


def record(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    response = httpx.get(f"{server.url}/executions/{execution_id}", timeout=WAIT)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def executions_of(server: ServerProcess, reasoner: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{server.url}/executions", params={"reasoner": reasoner}, timeout=WAIT)
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_each_reasoner_is_a_tool_with_its_schemas(
    server: ServerProcess, legacy: bool
) -> None:
    async with session(server, legacy=legacy) as client:
        listed = await client.list_tools()
        expected = "2025-11-25" if legacy else "2026-07-28"
        assert client.protocol_version == expected
        capabilities = client.server_capabilities
    # The tasks extension is offered on 2026-07-28 only; tools on both.
    assert capabilities is not None and capabilities.tools is not None
    offered = capabilities.extensions or {}
    assert (TASKS in offered) is (not legacy)
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == {"add", "shout", "nap", "broken", "approve", "pick", "per_tenant"}
    add = tools["add"]
    assert add.description == "Adds two integers."
    assert add.input_schema["type"] == "object"
    assert set(add.input_schema["properties"]) == {"a", "b"}
    assert add.output_schema is not None and add.output_schema["type"] == "object"
    shout = tools["shout"].output_schema
    assert shout == {
        "type": "object",
        "properties": {"result": {"type": "string"}},
        "required": ["result"],
    }


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_a_plain_call_runs_an_execution_and_answers_its_result(
    server: ServerProcess, legacy: bool
) -> None:
    async with session(server, legacy=legacy) as client:
        await client.list_tools()  # the client checks results against the output schemas
        summed = await client.call_tool("add", {"a": 2, "b": 40})
        shouted = await client.call_tool("shout", {"text": "hi"})
        failed = await client.call_tool("broken", {})
    assert not summed.is_error and summed.structured_content == {"sum": 42}
    assert not shouted.is_error and shouted.structured_content == {"result": "HI"}
    assert failed.is_error
    assert isinstance(failed.content[0], types.TextContent)
    assert "it broke" in failed.content[0].text
    # Each was an execution, recorded like any other.
    runs = executions_of(server, "add")
    assert any(r["result"] == {"sum": 42} and r["status"] == "succeeded" for r in runs)


async def test_invalid_arguments_are_a_tool_error_and_start_nothing(
    server: ServerProcess,
) -> None:
    before = len(executions_of(server, "add"))
    async with session(server) as client:
        wrong = await client.call_tool("add", {"a": "two", "b": 1})
        missing = await client.call_tool("add", {"a": 1})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
    for result in (wrong, missing):
        assert result.is_error
        assert isinstance(result.content[0], types.TextContent)
        assert "invalid arguments" in result.content[0].text
    assert unknown.value.code == types.INVALID_PARAMS
    assert len(executions_of(server, "add")) == before


def test_a_foreign_origin_is_403_and_the_own_or_none_is_served(server: ServerProcess) -> None:
    discover = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "server/discover",
        "params": {
            "_meta": {
                "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                "io.modelcontextprotocol/clientCapabilities": {},
            }
        },
    }
    headers = {
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "server/discover",
    }
    url = f"{server.url}/mcp"
    foreign = httpx.post(
        url, json=discover, headers={**headers, "origin": "https://evil.example"}, timeout=WAIT
    )
    assert foreign.status_code == 403
    assert "Origin" in foreign.json()["detail"]
    own = httpx.post(url, json=discover, headers={**headers, "origin": server.url}, timeout=WAIT)
    none = httpx.post(url, json=discover, headers=headers, timeout=WAIT)
    for answered in (own, none):
        assert answered.status_code == 200, answered.text
        assert answered.json()["result"]["capabilities"]["extensions"] == {TASKS: {}}


@pytest.mark.parametrize(
    "body",
    [b"{", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": 7}', b"null"],
)
def test_bad_input_is_a_json_rpc_error_never_a_500(server: ServerProcess, body: bytes) -> None:
    response = httpx.post(
        f"{server.url}/mcp",
        content=body,
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2026-07-28",
            "mcp-method": "tools/call",
            "mcp-name": "add",
        },
        timeout=WAIT,
    )
    assert response.status_code < 500, response.text
    assert "error" in response.json()


async def call_as_task(client: ClientSession, name: str, arguments: dict[str, Any]) -> CreatedTask:
    created = await client.call_tool(name, arguments, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created


async def get_task(client: ClientSession, task_id: str) -> Task:
    return await client.send_request(GetTask(params=TaskParams(task_id=task_id)), Task)


async def follow(client: ClientSession, task_id: str, *statuses: str) -> Task:
    """`tasks/get` until the task is in one of `statuses`."""
    deadline = time.monotonic() + WAIT
    while True:
        got = await get_task(client, task_id)
        if got.status in statuses:
            return got
        assert time.monotonic() < deadline, f"task {task_id} still {got.status}"
        await asyncio.sleep(0.05)


async def test_a_task_augmented_call_answers_at_once_and_is_followed_to_completion(
    server: ServerProcess,
) -> None:
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "nap", {"seconds": 0.5})
        assert created.status == "working"
        # Task id = execution id: the record exists before the answer, running.
        assert record(server, created.task_id)["status"] in ("queued", "running")
        done = await follow(client, created.task_id, "completed", "failed", "cancelled")
        summed = await call_as_task(client, "add", {"a": 1, "b": 2})
        summed_done = await follow(client, summed.task_id, "completed")
        failed = await call_as_task(client, "broken", {})
        failed_done = await follow(client, failed.task_id, "completed")
    assert done.status == "completed"
    extra = done.model_extra or {}
    assert extra["result"]["structuredContent"] == {"result": "rested"}
    assert extra["result"]["isError"] is False
    assert isinstance(extra["ttlMs"], int) and extra["ttlMs"] > 0
    assert (summed_done.model_extra or {})["result"]["structuredContent"] == {"sum": 3}
    # A reasoner's failure is a tool error: completed, isError (the extension's rule).
    failed_result = (failed_done.model_extra or {})["result"]
    assert failed_result["isError"] is True and "it broke" in failed_result["content"][0]["text"]
    assert record(server, failed.task_id)["status"] == "failed"


async def test_tasks_cancel_cancels_the_execution(server: ServerProcess) -> None:
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "nap", {"seconds": 60})
        await client.send_request(CancelTask(params=TaskParams(task_id=created.task_id)), Ack)
        ended = await follow(client, created.task_id, "cancelled", "completed", "failed")
    assert ended.status == "cancelled"
    recorded = record(server, created.task_id)
    assert (recorded["status"], recorded["status_reason"]) == ("cancelled", "request")


async def update(client: ClientSession, task_id: str, responses: dict[str, Any]) -> Ack:
    request = UpdateTask(params=UpdateParams(task_id=task_id, input_responses=responses))
    return await client.send_request(request, Ack)


async def test_an_ask_is_input_required_with_an_elicitation_answered_by_tasks_update(
    server: ServerProcess,
) -> None:
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "approve", {"amount": 5})
        asked = await follow(client, created.task_id, "input_required")
        requests = (asked.model_extra or {})["inputRequests"]
        assert list(requests) == ["1"]
        elicit = requests["1"]
        assert elicit["method"] == "elicitation/create"
        assert elicit["params"]["message"] == '{"question":"approve 5?"}'
        schema = elicit["params"]["requestedSchema"]
        assert schema["type"] == "object" and set(schema["properties"]) == {"approved", "note"}
        # An answer that does not fit the schema is refused and changes nothing.
        with pytest.raises(MCPError) as wrong:
            await update(
                client, created.task_id, {"1": {"action": "accept", "content": {"approved": "x"}}}
            )
        assert wrong.value.code == types.INVALID_PARAMS
        assert (await get_task(client, created.task_id)).status == "input_required"
        # A key that is not outstanding is ignored (the extension's rule).
        await update(client, created.task_id, {"7": {"action": "accept", "content": {}}})
        await update(
            client,
            created.task_id,
            {"1": {"action": "accept", "content": {"approved": True, "note": "ok"}}},
        )
        done = await follow(client, created.task_id, "completed", "failed", "cancelled")
        # A schema that is not a flat object is asked wrapped as {"value": ...}.
        listed = await call_as_task(client, "pick", {})
        picking = await follow(client, listed.task_id, "input_required")
        wrapped = (picking.model_extra or {})["inputRequests"]["1"]["params"]["requestedSchema"]
        await update(
            client, listed.task_id, {"1": {"action": "accept", "content": {"value": [3, 1]}}}
        )
        picked = await follow(client, listed.task_id, "completed", "failed", "cancelled")
    result = (done.model_extra or {})["result"]
    assert result["structuredContent"] == {"approved": True, "note": "ok", "amount": 5}
    assert wrapped["required"] == ["value"]
    assert wrapped["properties"]["value"]["type"] == "array"
    assert (picked.model_extra or {})["result"]["structuredContent"] == {"result": [3, 1]}
    assert record(server, created.task_id)["result"]["note"] == "ok"


async def test_a_declined_elicitation_cancels_the_task(server: ServerProcess) -> None:
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "approve", {})
        await follow(client, created.task_id, "input_required")
        await update(client, created.task_id, {"1": {"action": "decline"}})
        ended = await follow(client, created.task_id, "cancelled", "completed", "failed")
    assert ended.status == "cancelled"


async def test_tasks_need_the_extension_declared_and_a_known_id(server: ServerProcess) -> None:
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "add", {"a": 1, "b": 1})
        with pytest.raises(MCPError) as unknown:
            await get_task(client, "no-such-task")
    async with session(server) as plain:
        with pytest.raises(MCPError) as undeclared:
            await get_task(plain, created.task_id)
        # Without the extension a call is plain: its result, not a task.
        result = await plain.call_tool("add", {"a": 1, "b": 1})
    assert unknown.value.code == types.INVALID_PARAMS
    assert undeclared.value.code == types.MISSING_REQUIRED_CLIENT_CAPABILITY
    assert result.structured_content == {"sum": 2}


async def test_an_ask_in_a_plain_call_is_a_tool_error_naming_the_tasks_extension(
    server: ServerProcess,
) -> None:
    async with session(server) as client:
        result = await client.call_tool("approve", {"amount": 3})
    assert result.is_error
    assert isinstance(result.content[0], types.TextContent)
    assert TASKS in result.content[0].text
    # Nobody could answer it: it ended.
    ended = [r for r in executions_of(server, "approve") if r["status"] == "cancelled"]
    assert ended


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_a_plain_call_whose_stream_closes_is_cancelled(
    server: ServerProcess, legacy: bool
) -> None:
    before = {r["execution_id"] for r in executions_of(server, "nap")}
    async with session(server, legacy=legacy) as client:
        call = asyncio.ensure_future(client.call_tool("nap", {"seconds": 60}))
        running = await _wait_new(server, "nap", before)
        call.cancel()  # the client gives up: its POST's stream closes
        await asyncio.gather(call, return_exceptions=True)
    deadline = time.monotonic() + WAIT
    while (now := record(server, running["execution_id"]))["status"] == "running":
        assert time.monotonic() < deadline, "the execution ran on after its stream closed"
        await asyncio.sleep(0.05)
    assert (now["status"], now["status_reason"]) == ("cancelled", "client_disconnected")


async def _wait_new(server: ServerProcess, reasoner: str, before: set[str]) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        for found in executions_of(server, reasoner):
            if found["execution_id"] not in before and found["status"] == "running":
                return found
        await asyncio.sleep(0.05)
    raise AssertionError(f"no new running {reasoner} execution in {WAIT}s")


async def test_a_plain_call_open_at_sigterm_does_not_hold_the_drain(
    server_factory: Any,
) -> None:
    """An MCP call waiting at SIGTERM answers by the drain's deadline (its execution is
    stopped there, `shutdown`), a listen stream open then ends with the listener, and the
    server exits well inside its grace period."""
    stopping = server_factory(
        "mcp_app:agent",
        "--mcp",
        *("--grace-period", "8", "--drain-timeout", "1", "--cancel-timeout", "1"),
    )
    async with session(stopping) as client, session(stopping, tasks=True) as tasks:
        created = await call_as_task(tasks, "approve", {})
        wanted = types.SubscriptionFilter.model_validate({"taskIds": [created.task_id]})
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(notifications=wanted)
        )
        listening = asyncio.ensure_future(
            tasks.send_request(listen, types.SubscriptionsListenResult)
        )
        call = asyncio.ensure_future(client.call_tool("nap", {"seconds": 60}))
        running = await _wait_new(stopping, "nap", set())
        stopping.signal()
        answered = await asyncio.wait_for(call, WAIT)
        ended = await asyncio.wait_for(listening, WAIT)
    code, took = await asyncio.to_thread(stopping.wait_exit, WAIT)
    assert isinstance(ended, types.SubscriptionsListenResult)
    assert answered.is_error
    assert isinstance(answered.content[0], types.TextContent)
    assert "shutting down" in answered.content[0].text
    assert running["execution_id"] in answered.content[0].text
    assert code == 0 and took < 6.0, (code, took)


async def test_an_ask_in_a_plain_call_is_elicited_when_the_client_declared_elicitation(
    server: ServerProcess,
) -> None:
    """2026-07-28: the answer is an `InputRequiredResult` with the elicitation; the call
    again with the response (and the state it was given) answers the ask and ends."""
    async with session(server, elicits=True) as client:
        await client.list_tools()
        asked = await client.call_tool("approve", {"amount": 4}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        assert asked.input_requests is not None and list(asked.input_requests) == ["1"]
        elicit = asked.input_requests["1"]
        assert isinstance(elicit, types.ElicitRequest)
        assert elicit.params.message == '{"question":"approve 4?"}'
        execution_id = (asked.request_state or "").split(":")[0]
        assert record(server, execution_id)["status"] == "input_required"
        answer = types.ElicitResult(action="accept", content={"approved": True, "note": "fine"})
        done = await client.call_tool(
            "approve",
            {"amount": 4},
            input_responses={"1": answer},
            request_state=asked.request_state,
            allow_input_required=True,
        )
        declined = await client.call_tool("approve", {}, allow_input_required=True)
        assert isinstance(declined, types.InputRequiredResult)
        refused = await client.call_tool(
            "approve",
            {},
            input_responses={"1": types.ElicitResult(action="decline")},
            request_state=declined.request_state,
            allow_input_required=True,
        )
        with pytest.raises(MCPError) as forged:
            await client.call_tool("approve", {}, request_state="nothing-here:1")
    assert isinstance(done, types.CallToolResult) and not done.is_error
    assert done.structured_content == {"approved": True, "note": "fine", "amount": 4}
    assert isinstance(refused, types.CallToolResult) and refused.is_error
    refused_id = (declined.request_state or "").split(":")[0]
    assert record(server, refused_id)["status"] == "cancelled"
    assert forged.value.code == types.INVALID_PARAMS


class TaskNote(types.NotificationParams):
    """`notifications/tasks`: the whole task."""

    model_config = types.NotificationParams.model_config | {"extra": "allow"}
    task_id: str
    status: str


async def test_a_listen_stream_tells_each_change_of_a_task(server: ServerProcess) -> None:
    """`subscriptions/listen` with `taskIds`: `notifications/tasks` as the task works, waits
    for input, works again and completes, each carrying the whole task."""
    seen: list[TaskNote] = []
    completed = asyncio.Event()

    async def on_task(note: TaskNote) -> None:
        seen.append(note)
        if note.status == "completed":
            completed.set()

    binding = NotificationBinding(
        method="notifications/tasks", params_type=TaskNote, handler=on_task
    )
    async with session(server, tasks=True, bindings=[binding]) as client:
        created = await call_as_task(client, "approve", {"amount": 6})
        wanted = types.SubscriptionFilter.model_validate({"taskIds": [created.task_id, "nope"]})
        listen = types.SubscriptionsListenRequest(
            params=types.SubscriptionsListenRequestParams(notifications=wanted)
        )
        stream = asyncio.ensure_future(client.send_request(listen, types.SubscriptionsListenResult))
        await follow(client, created.task_id, "input_required")
        deadline = time.monotonic() + WAIT
        while not any(n.status == "input_required" for n in seen):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.05)
        answer = {"1": {"action": "accept", "content": {"approved": False}}}
        await update(client, created.task_id, answer)
        await asyncio.wait_for(completed.wait(), WAIT)
        stream.cancel()
        await asyncio.gather(stream, return_exceptions=True)
    statuses = [n.status for n in seen]
    assert statuses[-1] == "completed" and "input_required" in statuses, statuses
    assert all(n.task_id == created.task_id for n in seen)
    last = seen[-1].model_extra or {}
    assert last["result"]["structuredContent"] == {"approved": False, "note": "", "amount": 6}
    asked = next(n for n in seen if n.status == "input_required").model_extra or {}
    assert "1" in asked["inputRequests"]


def _modern(method: str, params: Any, *, name: str | None = None) -> tuple[bytes, dict[str, str]]:
    """A 2026-07-28 request as the SDK's client sends it, with `params` as given."""
    envelope = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS: {}}},
    }
    if isinstance(params, dict):
        params = {**params, "_meta": envelope}
    body = {"jsonrpc": "2.0", "id": 9, "method": method, "params": params}
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": method,
    }
    if name is not None:
        headers["mcp-name"] = name
    return json.dumps(body).encode(), headers


HOSTILE: list[tuple[str, Any, str | None]] = [
    ("tools/call", {"name": "add", "arguments": [1, 2]}, "add"),
    ("tools/call", {"name": 5, "arguments": {}}, "5"),
    ("tools/call", {"name": "add", "arguments": {"a": "1", "b": [1]}}, "add"),
    ("tools/call", {"name": "add", "arguments": {}, "requestState": "x" * 5000}, "add"),
    ("tools/call", {"name": "approve", "requestState": ":1"}, "approve"),
    ("tasks/get", {"taskId": 5}, "5"),
    ("tasks/get", {"taskId": "t" * 5000}, "t"),
    ("tasks/get", {}, None),
    ("tasks/update", {"taskId": "x", "inputResponses": []}, "x"),
    ("tasks/update", {"taskId": "x", "inputResponses": {"1": "accept"}}, "x"),
    ("tasks/cancel", {"taskId": None}, None),
    ("subscriptions/listen", {"notifications": {"taskIds": "x"}}, None),
    ("subscriptions/listen", {"notifications": {"taskIds": ["t"] * 1000}}, None),
    ("no/such/method", {}, None),
    ("tools/call", 7, "add"),
]


@pytest.mark.parametrize(("method", "params", "name"), HOSTILE)
def test_hostile_requests_are_json_rpc_errors_never_a_500(
    server: ServerProcess, method: str, params: Any, name: str | None
) -> None:
    body, headers = _modern(method, params, name=name)
    response = httpx.post(f"{server.url}/mcp", content=body, headers=headers, timeout=WAIT)
    assert response.status_code < 500, response.text
    answered = response.json()
    assert "error" in answered or answered["result"].get("isError"), answered


def test_the_protocol_edges_answer_4xx_and_no_answer_was_a_500(server: ServerProcess) -> None:
    url = f"{server.url}/mcp"
    json_headers = {"content-type": "application/json", "accept": "application/json"}
    answers = [
        httpx.get(url, timeout=WAIT),
        httpx.delete(url, timeout=WAIT),
        httpx.post(url, content=b"{", headers=json_headers, timeout=WAIT),
        httpx.post(url, content=b"[]", headers=json_headers, timeout=WAIT),
        httpx.post(
            url,
            content=b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}',
            headers={**json_headers, "mcp-protocol-version": "1999-01-01"},
            timeout=WAIT,
        ),
        httpx.post(
            url,
            content=b"x" * (2 * 1024 * 1024),
            headers={**json_headers, "mcp-protocol-version": "2026-07-28"},
            timeout=WAIT,
        ),
    ]
    for answer in answers:
        assert 400 <= answer.status_code < 500, (answer.request.method, answer.text)
    # No standalone stream: nothing would ever be sent on it, and it would hold a connection.
    assert answers[0].status_code == 405 and answers[0].headers["allow"] == "POST"
    metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    assert server_errors(metrics) == {}, server_errors(metrics)


def _nested(levels: int) -> Any:
    """A list `levels` deep: past the codec's MAX_DEPTH, within the SDK parser's reach."""
    value: Any = 0.5
    for _ in range(levels):
        value = [value]
    return value


def _post(server: ServerProcess, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{server.url}/mcp", content=body, headers=headers, timeout=WAIT)


async def test_arguments_the_record_cannot_keep_are_invalid_and_start_nothing(
    server: ServerProcess,
) -> None:
    """NaN, Infinity and nesting past what the record keeps are refused as the API refuses
    them (its 400): the invalid-arguments tool error, before anything starts; its text is
    JSON (a lone surrogate escaped), not a bytes repr."""
    before = {r["execution_id"] for r in executions_of(server, "nap")}
    texts = []
    for seconds in (math.nan, math.inf, _nested(250), "\udc00"):
        body, headers = _modern("tools/call", {"name": "nap", "arguments": {"seconds": seconds}})
        response = _post(server, body, {**headers, "mcp-name": "nap"})
        assert response.status_code == 200, response.text
        result = response.json()["result"]
        assert result.get("isError") is True, result
        texts.append(result["content"][0]["text"])
    assert texts[0] == "invalid arguments: the input holds nan, which JSON cannot carry"
    assert texts[1] == "invalid arguments: the input holds inf, which JSON cannot carry"
    assert texts[2] == "invalid arguments: the input is nested deeper than 200 levels"
    detail = json.loads(texts[3].removeprefix("invalid arguments: "))
    assert detail[0]["loc"] == ["seconds"] and detail[0]["input"] == "\\udc00"
    assert {r["execution_id"] for r in executions_of(server, "nap")} == before


async def test_an_answer_the_record_cannot_keep_is_refused_and_the_ask_stays(
    server: ServerProcess,
) -> None:
    """The ask's schema leaves other properties open, so NaN or deep nesting beside its
    fields fits it: refused as `POST /executions/{id}/input` refuses it (its 400), invalid
    params, and the ask waits on for a good answer."""
    async with session(server, tasks=True) as client:
        created = await call_as_task(client, "approve", {"amount": 7})
        await follow(client, created.task_id, "input_required")
        for extra in (math.nan, _nested(250)):
            content = {"approved": True, "note": "x", "extra": extra}
            responses = {"1": {"action": "accept", "content": content}}
            body, headers = _modern(
                "tasks/update",
                {"taskId": created.task_id, "inputResponses": responses},
                name=created.task_id,
            )
            refused = _post(server, body, headers).json()
            assert refused["error"]["code"] == types.INVALID_PARAMS, refused
            assert (await get_task(client, created.task_id)).status == "input_required"
        good = {"action": "accept", "content": {"approved": True, "note": "ok"}}
        await update(client, created.task_id, {"1": good})
        done = await follow(client, created.task_id, "completed", "failed", "cancelled")
    assert (done.model_extra or {})["result"]["structuredContent"]["note"] == "ok"


async def test_a_request_state_or_task_id_the_server_never_gave_is_invalid_not_internal(
    server: ServerProcess,
) -> None:
    """`requestState` is `ID:N` as the server wrote it: other scripts' digits (`²`, or the
    Arabic-Indic one that `int` reads as 1), thousands of digits or a leading zero are
    invalid params, and the ask stays unanswered; an id with a lone surrogate (JSON carries
    it, no store key can hold it) is unknown, there and in `subscriptions/listen`. No
    traceback for any of it."""
    mark = len(server.stderr())
    async with session(server, elicits=True) as client:
        await client.list_tools()
        asked = await client.call_tool("approve", {"amount": 8}, allow_input_required=True)
        assert isinstance(asked, types.InputRequiredResult)
        execution_id = (asked.request_state or "").split(":")[0]
        answer = types.ElicitResult(action="accept", content={"approved": True})
        for number in ("\u00b2", "\u0661", "1" * 5000, "01"):
            with pytest.raises(MCPError) as refused:
                await client.call_tool(
                    "approve",
                    {},
                    input_responses={number: answer},
                    request_state=f"{execution_id}:{number}",
                    allow_input_required=True,
                )
            assert refused.value.code == types.INVALID_PARAMS, number[:8]
        assert record(server, execution_id)["status"] == "input_required"
        body, headers = _modern(
            "tools/call", {"name": "approve", "arguments": {}, "requestState": "\ud800:1"}
        )
        forged = _post(server, body, {**headers, "mcp-name": "approve"}).json()
        listen_body, listen_headers = _modern(
            "subscriptions/listen", {"notifications": {"taskIds": ["\ud800", execution_id]}}
        )
        async with (
            httpx.AsyncClient(timeout=WAIT) as http,
            http.stream(
                "POST", f"{server.url}/mcp", content=listen_body, headers=listen_headers
            ) as stream,
        ):
            lines = (line async for line in stream.aiter_lines() if line.startswith("data:"))
            first = await anext(lines)
        done = await client.call_tool(
            "approve",
            {},
            input_responses={"1": answer},
            request_state=asked.request_state,
            allow_input_required=True,
        )
    assert forged["error"]["code"] == types.INVALID_PARAMS, forged
    acknowledged = json.loads(first.removeprefix("data:"))
    assert acknowledged["params"]["notifications"] == {"taskIds": [execution_id]}, acknowledged
    assert isinstance(done, types.CallToolResult) and not done.is_error
    assert "Traceback" not in server.stderr()[mark:]


@pytest.mark.parametrize("version", ["2026-07-28", "2025-11-25"])
def test_what_the_transport_refuses_is_answered_in_json(
    server: ServerProcess, version: str
) -> None:
    """A Content-Type other than JSON (400), an Accept without both of the answer's media
    types (406) and a body past `--max-body-size`, declared or chunked (413): the SDK's
    statuses, with `{"detail": ...}` as every route refuses (the SDK's are plain text or
    empty; the protocol prescribes no JSON-RPC body for these)."""
    body, headers = _modern("tools/list", {})
    headers["mcp-protocol-version"] = version
    too_large = b" " * 600_000
    answers = {
        400: _post(server, body, {**headers, "content-type": "text/plain"}),
        406: _post(server, body, {**headers, "accept": "application/json"}),
        413: _post(server, too_large * 2, headers),
    }
    chunked = httpx.post(
        f"{server.url}/mcp", content=iter([too_large, too_large]), headers=headers, timeout=WAIT
    )
    for status, answer in [*answers.items(), (413, chunked)]:
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/json", answer.headers
        assert isinstance(answer.json()["detail"], str), answer.text
    metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    assert server_errors(metrics) == {}, server_errors(metrics)


def _mcp_answers(server: ServerProcess) -> dict[str, float]:
    """`/mcp`'s answers so far, by status (`agent_server_http_requests_total`)."""
    exposition = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name == "agent_server_http_requests":
            for sample in family.samples:
                if sample.name.endswith("_total") and sample.labels.get("route") == "/mcp":
                    status = sample.labels["status"]
                    found[status] = found.get(status, 0.0) + sample.value
    return found


@pytest.mark.parametrize("version", ["2026-07-28", "2025-11-25"])
async def test_a_client_leaving_mid_body_is_a_499_not_an_error(
    server: ServerProcess, version: str
) -> None:
    """It sends part of the body it declared and closes: the client's doing, counted 499 as
    on the API's routes, with no error logged (neither ours nor the SDK's)."""
    mark = len(server.stderr())
    before = _mcp_answers(server)
    head = (
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\n"
        f"MCP-Protocol-Version: {version}\r\nMcp-Method: tools/list\r\n"
        "Content-Length: 1000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=WAIT) as raw:
        raw.sendall(head.encode() + b'{"jsonrpc":"2.0","id":1,')
        await asyncio.sleep(0.2)  # the server reads the part sent, then sees the close
    deadline = time.monotonic() + WAIT
    while sum((now := _mcp_answers(server)).values()) == sum(before.values()):
        assert time.monotonic() < deadline, "the request was never counted"
        await asyncio.sleep(0.05)
    assert now.get("499", 0.0) == before.get("499", 0.0) + 1, (before, now)
    logged = server.stderr()[mark:]
    assert "ERROR" not in logged and "Traceback" not in logged, logged


async def test_mcp_needs_the_servers_token_like_every_route(server_factory: Any) -> None:
    token = "mcp-test-token-0123456789abcdef"
    secured = server_factory("mcp_app:agent", "--mcp", "--api-token", token)
    body, headers = _modern("tools/list", {})
    async with httpx.AsyncClient(base_url=secured.url, timeout=WAIT) as http:
        refused = await http.post("/mcp", content=body, headers=headers)
        wrong = await http.post(
            "/mcp", content=body, headers={**headers, "authorization": "Bearer nope"}
        )
    assert (refused.status_code, wrong.status_code) == (401, 401)
    async with session(secured, token=token, tasks=True) as client:
        listed = await client.list_tools()
        created = await call_as_task(client, "add", {"a": 20, "b": 22})
        done = await follow(client, created.task_id, "completed")
    assert "add" in {t.name for t in listed.tools}
    assert (done.model_extra or {})["result"]["structuredContent"] == {"sum": 42}


async def test_a_concurrency_key_header_limits_mcp_calls_as_it_limits_the_apis(
    server: ServerProcess,
) -> None:
    """`concurrency_key="header:X-Tenant"`: read from the MCP POST's headers, so one
    tenant's second task waits for the first while another tenant's runs."""
    ids: dict[str, list[str]] = {}
    for tenant in ("a", "a", "b"):
        async with session(server, tasks=True, headers={"X-Tenant": tenant}) as client:
            created = await call_as_task(client, "per_tenant", {"seconds": 60})
            ids.setdefault(tenant, []).append(created.task_id)
    first, second = ids["a"]
    (other,) = ids["b"]
    deadline = time.monotonic() + WAIT
    while not (record(server, first)["status"] == record(server, other)["status"] == "running"):
        assert time.monotonic() < deadline, "each tenant's first task should run"
        await asyncio.sleep(0.05)
    assert record(server, second)["status"] == "queued"
    async with session(server, tasks=True) as client:
        for task_id in (first, second, other):
            await client.send_request(CancelTask(params=TaskParams(task_id=task_id)), Ack)


async def test_a_page_of_an_allowed_origin_may_call_mcp(server_factory: Any) -> None:
    """`--cors-allow-origin`: its pages pass the Origin check and the preflight allows MCP's
    headers; another origin is 403."""
    page = "https://app.example"
    cors = server_factory("mcp_app:agent", "--mcp", "--cors-allow-origin", page)
    body, headers = _modern("tools/list", {})
    async with httpx.AsyncClient(base_url=cors.url, timeout=WAIT) as http:
        preflight = await http.options(
            "/mcp",
            headers={
                "origin": page,
                "access-control-request-method": "POST",
                "access-control-request-headers": "content-type,mcp-protocol-version,mcp-method",
            },
        )
        listed = await http.post("/mcp", content=body, headers={**headers, "origin": page})
        foreign = await http.post(
            "/mcp", content=body, headers={**headers, "origin": "https://other.example"}
        )
    assert preflight.status_code == 200, preflight.text
    allowed = preflight.headers["access-control-allow-headers"].lower()
    assert "mcp-protocol-version" in allowed and "mcp-method" in allowed
    assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == page
    assert "add" in {t["name"] for t in listed.json()["result"]["tools"]}
    assert foreign.status_code == 403
