"""MCP at `/mcp` end to end: a real `agent-server run --mcp` serving tests/apps/mcp_app.py,
driven by the official SDK's client (`streamable_http_client` + `ClientSession`) as a user
would, on both revisions it speaks (2026-07-28 through `server/discover`, 2025-11-25 through
`initialize`), and read back through the HTTP API: the execution record is the one truth."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import httpx
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.support.process import ServerProcess, serving

WAIT = 20.0
TASKS = "io.modelcontextprotocol/tasks"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory, "mcp", "mcp_app:agent", "--mcp") as process:
        yield process


class TaskParams(types.RequestParams):
    task_id: str


class GetTask(types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "task_id"


class CancelTask(types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "task_id"


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]


class UpdateTask(types.Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "task_id"


class Task(types.Result):
    """The tasks extension's `Task` (and `DetailedTask`): extra fields kept."""

    model_config = types.Result.model_config | {"extra": "allow"}
    task_id: str
    status: str


class CreatedTask(Task):
    result_type: Literal["task"] = "task"  # type: ignore[assignment]


@asynccontextmanager
async def session(
    server: ServerProcess, *, legacy: bool = False, tasks: bool = False
) -> AsyncIterator[ClientSession]:
    """A connected client session: discovered (2026-07-28) or initialized (2025-11-25)."""
    extensions = {TASKS} if tasks else None
    async with (
        streamable_http_client(f"{server.url}/mcp") as (read, write),
        ClientSession(
            read,
            write,
            read_timeout_seconds=WAIT,
            extensions={e: {} for e in extensions} if extensions else None,
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
    tools = {t.name: t for t in listed.tools}
    assert set(tools) == {"add", "shout", "nap", "broken", "approve", "pick"}
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


async def _wait_status(server: ServerProcess, reasoner: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [r for r in executions_of(server, reasoner) if r["status"] == status]
        if found:
            return found[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {reasoner} execution {status} in {WAIT}s")
