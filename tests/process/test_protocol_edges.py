"""The edges of every front on a real `agent-server run --a2a --mcp` (tests/apps/edges_app.py),
driven by the official SDKs where a protocol is involved (docs/protocols.md, docs/api.md):

- an enumeration's value that names none (a `ListTasks` status, a message's role) is
  invalid params naming the values allowed, never read as "unset";
- a v1.0 method sent without `A2A-Version` is served as 1.0 (its name says which version);
- a v0.3 client answers a boolean or an integer question (a text part read by the schema,
  a data part `{"value": ...}`);
- a refusal that echoes what the caller sent (an id, a name, an input) echoes a bounded
  prefix, on every front; one naming what exists lists a bounded number of names;
- an MCP request leaves no line of the SDK's session bookkeeping in the log, and `--mcp`
  without its extra stops the start in one line naming it, as `--a2a` does.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentInterface,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict, ParseDict
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.apps.edges_app import FILLERS, OWN
from tests.support.process import ServerProcess, agent_server_cli, one_line, serving

WAIT = 20.0
#: A value far past any bound on what an error echoes.
HUGE = 900_000
#: The most an error answer may weigh once it echoes a huge value (bytes).
SMALL = 2_000
TASK_STATES = (
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory, "edges", "edges_app:agent", "--a2a", "--mcp") as process:
        yield process


def rpc(
    server: ServerProcess, method: str, params: Any, version: str | None = "1.0"
) -> dict[str, Any]:
    """One JSON-RPC call to /a2a, its answer's JSON."""
    headers = {} if version is None else {"A2A-Version": version}
    body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
    answer = httpx.post(f"{server.url}/a2a", json=body, headers=headers, timeout=WAIT)
    assert answer.status_code == 200, answer.text
    found: dict[str, Any] = answer.json()
    return found


def v1_message(
    text: str | None = None, data: Any = None, skill: str = "add", **fields: Any
) -> dict[str, Any]:
    """A v1.0 message's JSON, to `skill` unless `fields` give its metadata."""
    part = {"text": text} if text is not None else {"data": data}
    made = {"messageId": uuid.uuid4().hex, "role": "ROLE_USER", "parts": [part]}
    return {"metadata": {"skill": skill}, **made, **fields}


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        yield client


async def a2a_client(server: ServerProcess, http: httpx.AsyncClient, version: str) -> Client:
    """The SDK's client speaking `version` only (the card's interface of that version)."""
    card = await A2ACardResolver(http, server.url).get_agent_card()
    (chosen,) = [i for i in card.supported_interfaces if i.protocol_version == version]
    keep = AgentInterface()
    keep.CopyFrom(chosen)
    del card.supported_interfaces[:]
    card.supported_interfaces.append(keep)
    return ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)


async def send(client: Client, message: Message) -> Task:
    request = SendMessageRequest(
        message=message, configuration=SendMessageConfiguration(return_immediately=False)
    )
    answers = [answer async for answer in client.send_message(request)]
    assert len(answers) == 1 and answers[0].HasField("task"), answers
    return answers[0].task


def message(
    *, text: str | None = None, data: Any = None, task_id: str = "", skill: str | None = None
) -> Message:
    part = Part(text=text) if text is not None else Part(data=ParseDict(data, struct_pb2.Value()))
    made = Message(message_id=uuid.uuid4().hex, role=Role.ROLE_USER, parts=[part], task_id=task_id)
    if skill is not None:
        made.metadata.update({"skill": skill})
    return made


# -- A2A: enumerations ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["TASK_STATE_BOGUS", "completed", "", 99, -1, 1.5, True])
def test_a_list_status_that_names_no_state_is_invalid_params_naming_the_states(
    server: ServerProcess, status: Any
) -> None:
    """A status the SDK would read as unset (an unknown name is its zero value) must not
    list every task: -32602 naming the field and each state."""
    started = rpc(server, "SendMessage", {"message": v1_message(data={"a": 1, "b": 2})})
    assert "result" in started, started
    answer = rpc(server, "ListTasks", {"status": status})
    assert "error" in answer, answer
    assert answer["error"]["code"] == -32602, answer
    said = answer["error"]["message"]
    assert "status" in said
    for state in TASK_STATES:
        assert state in said, said
    assert "TASK_STATE_UNSPECIFIED" not in said


def test_each_state_filters_and_one_no_task_is_in_lists_none(server: ServerProcess) -> None:
    done = rpc(server, "SendMessage", {"message": v1_message(data={"a": 2, "b": 3})})
    assert done["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", done
    completed = rpc(server, "ListTasks", {"status": "TASK_STATE_COMPLETED"})["result"]
    assert completed["tasks"] and completed["totalSize"] >= 1
    assert all(t["status"]["state"] == "TASK_STATE_COMPLETED" for t in completed["tasks"])
    by_number = rpc(server, "ListTasks", {"status": 3})["result"]
    assert by_number["totalSize"] == completed["totalSize"]
    for nobody in ("TASK_STATE_REJECTED", "TASK_STATE_AUTH_REQUIRED"):
        listed = rpc(server, "ListTasks", {"status": nobody})["result"]
        assert listed.get("tasks", []) == [] and listed.get("totalSize", 0) == 0, listed
    unset = rpc(server, "ListTasks", {"status": "TASK_STATE_UNSPECIFIED"})["result"]
    assert unset["totalSize"] >= completed["totalSize"]


def test_an_unknown_role_is_invalid_params_naming_the_roles(server: ServerProcess) -> None:
    sent = v1_message(data={"a": 1, "b": 1})
    sent["role"] = "ROLE_ROBOT"
    answer = rpc(server, "SendMessage", {"message": sent})
    assert answer["error"]["code"] == -32602, answer
    said = answer["error"]["message"]
    assert "message.role" in said and "ROLE_USER" in said and "ROLE_AGENT" in said, said


async def test_the_sdk_client_sending_a_state_number_no_state_has_is_refused(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    async with await a2a_client(server, http, "1.0") as client:
        with pytest.raises(InvalidParamsError) as refused:
            await client.list_tasks(ListTasksRequest(status=42))  # type: ignore[arg-type]
    assert "TASK_STATE_COMPLETED" in str(refused.value)


# -- A2A: versions -------------------------------------------------------------------------------


def test_a_v1_method_without_a_version_header_is_served_as_v1(server: ServerProcess) -> None:
    """A missing `A2A-Version` means 0.3, where `SendMessage` does not exist: its name says
    the client speaks 1.x, and it is answered so (not "version 0.3 is not supported")."""
    sent = rpc(server, "SendMessage", {"message": v1_message(data={"a": 4, "b": 5})}, None)
    assert "result" in sent, sent
    task = sent["result"]["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", sent
    read = rpc(server, "GetTask", {"id": task["id"]}, None)
    assert read["result"]["artifacts"][0]["parts"][0]["data"] == {"sum": 9}
    listed = rpc(server, "ListTasks", {"pageSize": 1}, None)
    assert len(listed["result"]["tasks"]) == 1
    # v0.3's names still mean 0.3 without the header; an empty header is no header.
    old = rpc(
        server,
        "tasks/get",
        {"id": task["id"]},
        None,
    )
    assert old["result"]["kind"] == "task", old
    empty = rpc(server, "GetTask", {"id": task["id"]}, "")
    assert "result" in empty and empty["result"]["id"] == task["id"], empty


# -- A2A: a v0.3 client answers what a schema other than a string asks --------------------------


@pytest.mark.parametrize("version", ["0.3", "1.0"])
async def test_a_client_answers_boolean_and_integer_questions(
    server: ServerProcess, http: httpx.AsyncClient, version: str
) -> None:
    """A v0.3 data part holds only an object: a text part holding the JSON ("true") and a
    data part `{"value": 42}` answer a boolean and an integer question, on 0.3 as on 1.0;
    what the schema refuses is invalid params and the task still waits."""
    async with await a2a_client(server, http, version) as client:
        asked = await send(client, message(data={"item": "tea"}, skill="confirm"))
        assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, asked
        assert MessageToDict(asked.status.message.metadata)["schema"] == {"type": "boolean"}
        with pytest.raises(InvalidParamsError):
            await send(client, message(text="perhaps", task_id=asked.id))
        second = await send(client, message(text="true", task_id=asked.id))
        assert second.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, second
        assert second.status.message.parts[0].text == "how many?"
        with pytest.raises(InvalidParamsError):
            await send(client, message(data={"value": "lots"}, task_id=asked.id))
        done = await send(client, message(data={"value": 42}, task_id=asked.id))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
    result = MessageToDict(done.artifacts[0].parts[0].data)
    assert result == {"item": "tea", "go": True, "count": 42}


async def test_a_text_part_holding_an_integer_answers_an_integer_question(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    async with await a2a_client(server, http, "0.3") as client:
        asked = await send(client, message(data={"item": "jam"}, skill="confirm"))
        second = await send(client, message(data={"value": False}, task_id=asked.id))
        done = await send(client, message(text="7", task_id=second.id))
    assert MessageToDict(done.artifacts[0].parts[0].data) == {
        "item": "jam",
        "go": False,
        "count": 7,
    }


# -- bounded echoes, bounded lists of names ------------------------------------------------------


def test_a2a_errors_echo_a_bounded_prefix_of_what_was_sent(server: ServerProcess) -> None:
    huge = "x" * HUGE
    calls: list[tuple[str, Any]] = [
        ("GetTask", {"id": huge}),
        ("CancelTask", {"id": huge}),
        ("SendMessage", {"message": v1_message(text="hi", taskId=huge)}),
        ("SendMessage", {"message": v1_message(data={}, metadata={"skill": huge})}),
        ("ListTasks", {"status": huge}),
        (
            "SendMessage",
            {"message": v1_message(data={"a": huge, "b": 1}, metadata={"skill": "add"})},
        ),
    ]
    for method, params in calls:
        body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
        answer = httpx.post(
            f"{server.url}/a2a", json=body, headers={"A2A-Version": "1.0"}, timeout=WAIT
        )
        assert "error" in answer.json(), (method, answer.text[:300])
        assert len(answer.content) < SMALL, (method, answer.text[:300])
        assert "xxxx" in answer.text, (method, answer.text[:300])  # a prefix is shown


def test_a2a_unknown_skill_names_a_bounded_list_of_skills(server: ServerProcess) -> None:
    params = {"message": v1_message(data={}, metadata={"skill": "nope"})}
    said = rpc(server, "SendMessage", params)["error"]["message"]
    assert "'nope'" in said and "add" in said, said
    assert f"and {FILLERS + OWN - 20} more" in said, said


def test_rest_errors_echo_a_bounded_prefix_and_name_the_reasoners(
    server: ServerProcess,
) -> None:
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        unknown = client.post("/reasoners/nope", json={})
        assert unknown.status_code == 404
        said = unknown.json()["detail"]
        assert "'nope'" in said and "add" in said and "confirm" in said, said
        assert f"and {FILLERS + OWN - 20} more" in said, said

        long_name = client.post("/reasoners/" + "n" * 8000, json={})
        assert long_name.status_code == 404
        assert len(long_name.content) < SMALL, long_name.text[:300]

        big_input = client.post("/reasoners/add", json={"a": "x" * HUGE, "b": 1})
        assert big_input.status_code == 422, big_input.text[:300]
        assert len(big_input.content) < SMALL, big_input.text[:300]
        small_input = client.post("/reasoners/add", json={"a": "two", "b": 1})
        assert small_input.json()["detail"][0]["input"] == "two"  # a short one as sent

        started = client.post("/reasoners/confirm/async", json={"item": "x"}).json()
        keys = {f"k{i}-" + "y" * 10_000: 1 for i in range(50)}
        answer = client.post(f"/executions/{started['execution_id']}/input", json=keys)
        assert answer.status_code == 422
        assert len(answer.content) < SMALL, answer.text[:300]

        typed = client.post(
            "/reasoners/add", content=b"{}", headers={"Content-Type": "text/" + "z" * 6000}
        )
        assert typed.status_code == 415
        assert len(typed.content) < SMALL, typed.text[:300]

        schedule = client.post("/schedules", json={"reasoner": "r" * HUGE, "cron": "* * * * *"})
        assert schedule.status_code == 422
        assert len(schedule.content) < SMALL, schedule.text[:300]
        named = client.post("/schedules", json={"reasoner": "nope", "cron": "* * * * *"})
        assert "add" in named.json()["detail"], named.text


async def test_mcp_errors_echo_a_bounded_prefix_and_name_the_tools(
    server: ServerProcess,
) -> None:
    async with (
        streamable_http_client(f"{server.url}/mcp") as (read, write),
        ClientSession(read, write, read_timeout_seconds=WAIT) as client,
    ):
        await client.discover()
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("nope", {})
        said = unknown.value.error.message
        assert "'nope'" in said and "add" in said, said
        assert f"and {FILLERS + OWN - 20} more" in said, said
        with pytest.raises(MCPError) as long_name:
            await client.call_tool("t" * 6000, {})
        assert len(long_name.value.error.message) < SMALL
        wrong = await client.call_tool("add", {"a": "x" * HUGE, "b": 1})
    assert wrong.is_error
    text = wrong.content[0].text  # type: ignore[union-attr]
    assert "invalid arguments" in text and len(text) < SMALL, text[:300]


# -- MCP: the log, the extra ---------------------------------------------------------------------


def logged_past(served: ServerProcess, text: str) -> str:
    """The server's log once `text` is in it (bounded)."""
    deadline = time.monotonic() + WAIT
    while text not in served.stderr():
        assert time.monotonic() < deadline, served.stderr()[-2000:]
        time.sleep(0.05)
    return served.stderr()


@pytest.mark.parametrize("legacy", [False, True], ids=["2026-07-28", "2025-11-25"])
async def test_an_mcp_request_leaves_no_session_bookkeeping_in_the_log(
    server_factory: Any, legacy: bool
) -> None:
    """Stateless, each request is a session to the SDK, which logged its end at INFO
    ("Terminating session: None"), one line a request. The access log's line of the last
    request is the point past which every line of the calls is written."""
    served = server_factory("edges_app:agent", "--mcp", "--access-log")
    mark = len(served.stderr())  # past the start's lines (the SDK's manager says it started)
    async with (
        streamable_http_client(f"{served.url}/mcp") as (read, write),
        ClientSession(read, write, read_timeout_seconds=WAIT) as client,
    ):
        if legacy:
            await client.initialize()
        else:
            await client.discover()
        for number in range(3):
            result = await client.call_tool("add", {"a": number, "b": 2})
            assert result.structured_content == {"sum": number + 2}
    async with httpx.AsyncClient(timeout=WAIT) as plain:
        await plain.get(f"{served.url}/healthz?last")
    logged = logged_past(served, "/healthz?last")[mark:]
    assert logged.count("/mcp") >= 4, logged[-3000:]  # the calls were logged, and ...
    assert "Terminating session" not in logged, logged[-3000:]  # ... nothing of the SDK's
    assert "mcp.server" not in logged, logged[-3000:]


def test_without_the_extra_mcp_stops_the_start_naming_it(tmp_path: Path) -> None:
    """Where the SDK cannot be imported (a package named `mcp` that raises as an absent one
    does), `--mcp` stops the start in one line naming the extra, exit 2, as `--a2a` does."""
    for package in ("mcp", "mcp_types"):
        fake = tmp_path / package / package
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text(
            f"raise ImportError(\"No module named '{package}'\", name={package!r})\n"
        )
        path = os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])
        done = agent_server_cli("run", "edges_app:agent", "--mcp", env={"PYTHONPATH": path})
        assert done.returncode == 2, done.stderr
        assert one_line(done.stderr) == (
            "agent-server: --mcp needs the mcp extra: pip install 'agent-server[mcp]'"
        )
