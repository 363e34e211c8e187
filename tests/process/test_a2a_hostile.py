"""A2A against what protobuf cannot carry: a real `agent-server run --a2a` (webhooks on)
serving a small app of its own, driven by the official SDK's clients (v1.0 and v0.3) and
raw HTTP. A request holding a lone surrogate, an integer past a double or params nested too
deep is a JSON-RPC error naming where; a record holding them (legal in the HTTP API) is
shown mended, and never fails a read or a list; a push config's URL is checked as invalid
params; a v0.3 method name under A2A-Version 1.0 is "method not found"."""

from __future__ import annotations

import json
import textwrap
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentInterface,
    GetTaskRequest,
    ListTasksRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from agent_server.http.a2a.tasks import CARRIED_DEPTH
from tests.process.test_a2a import card_of, message, send, send_request
from tests.support.process import ServerProcess, server_errors
from tests.support.webhooks import HOOKS

WAIT = 20.0
#: The app these tests serve: a result, an error and a prompt made of what the client sent.
APP = textwrap.dedent(
    '''
    """Reasoners that hand back whatever JSON the API took, for test_a2a_hostile.py."""

    from typing import Any

    from agent_server import Agent, ExecutionContext

    agent = Agent("a2a-hostile", default_reasoner="mirror")


    @agent.reasoner()
    async def mirror(value: Any = None) -> Any:
        """The value, as the result."""
        return value


    @agent.reasoner()
    async def fail(message: str = "boom") -> None:
        """Fail with the message."""
        raise ValueError(message)


    @agent.reasoner()
    async def ask(ctx: ExecutionContext, prompt: Any = "?") -> Any:
        """Ask with the prompt; the answer is the result."""
        return await ctx.ask(prompt)
    '''
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("a2a-hostile")
    (folder / "hostile_a2a_app.py").write_text(APP)
    (folder / "markers").mkdir()
    process = ServerProcess(
        ["hostile_a2a_app:agent", "--a2a", *HOOKS], {}, folder / "markers", cwd=folder
    )
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


@pytest.fixture
async def client(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    card = await card_of(http, server.url)
    async with ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card) as c:
        yield c


@pytest.fixture
async def streaming(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    card = await card_of(http, server.url)
    async with ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card) as c:
        yield c


@pytest.fixture
async def legacy(server: ServerProcess, http: httpx.AsyncClient) -> AsyncIterator[Client]:
    """The SDK's v0.3 client: the card's 0.3 interface only."""
    card = await card_of(http, server.url)
    keep = AgentInterface()
    keep.CopyFrom(next(i for i in card.supported_interfaces if i.protocol_version == "0.3"))
    del card.supported_interfaces[:]
    card.supported_interfaces.append(keep)
    async with ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card) as c:
        yield c


def post(server: ServerProcess, body: bytes, version: str | None) -> dict[str, Any]:
    """A raw JSON-RPC call: answered 200, in UTF-8, with a JSON-RPC error (never an
    internal one, none of the server's 5xx)."""
    headers = {"Content-Type": "application/json"}
    if version is not None:
        headers["A2A-Version"] = version
    with httpx.Client(base_url=server.url, timeout=WAIT) as plain:
        errors = server_errors(plain.get("/metrics").text)
        answer = plain.post("/a2a", content=body, headers=headers)
        assert answer.status_code == 200, answer.text
        found: dict[str, Any] = json.loads(answer.content.decode("utf-8"))
        assert found["error"]["code"] != -32603, found
        assert server_errors(plain.get("/metrics").text) == errors
    return found


def executions(server: ServerProcess) -> int:
    with httpx.Client(base_url=server.url, timeout=WAIT) as plain:
        return len(plain.get("/executions", params={"limit": 1000}).json())


def v1_send(metadata: str = "{}", parts: str = '[{"text":"x"}]', extra: str = "") -> bytes:
    return (
        '{"jsonrpc":"2.0","id":7,"method":"SendMessage","params":{"message":{"messageId":"'
        + uuid.uuid4().hex
        + '","role":"ROLE_USER","parts":'
        + parts
        + ',"metadata":'
        + metadata
        + "}"
        + extra
        + "}}"
    ).encode("latin-1")  # what is not ASCII here is meant as raw bytes


def v03_send(parts: str, extra: str = "") -> bytes:
    return (
        '{"jsonrpc":"2.0","id":7,"method":"message/send","params":{"message":{"kind":"message",'
        '"messageId":"' + uuid.uuid4().hex + '","role":"user","parts":' + parts + "}" + extra + "}}"
    ).encode("latin-1")


# -- a request protobuf cannot carry ------------------------------------------------------------


SURROGATES: list[tuple[bytes, Any, str]] = [
    (b'{"jsonrpc":"2.0","id":"\\ud800","method":"nope"}', None, "id"),
    (b'{"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"\\ud800"}}', 1, "params.id"),
    (
        b'{"jsonrpc":"2.0","id":"a","method":"GetTask","params":{"id":"x\\udfffy"}}',
        "a",
        "params.id",
    ),
    (v1_send(metadata='{"skill":"mirror","\\udc00":1}'), 7, "a key of params.message.metadata"),
    (v1_send(parts='[{"data":{"value":["ok","\\ud83d"]}}]'), 7, "parts[0].data.value[1]"),
    # Surrogate bytes in the UTF-8 itself (CESU-8), which the body's decoder lets through.
    (v1_send(parts='[{"text":"\xed\xa0\x80"}]'), 7, "params.message.parts[0].text"),
    (v03_send('[{"kind":"text","text":"\\udbff"}]'), 7, "params.message.parts[0].text"),
]


@pytest.mark.parametrize(("body", "echoed", "where"), SURROGATES, ids=range(len(SURROGATES)))
@pytest.mark.parametrize("version", ["1.0", None])
def test_a_lone_surrogate_in_a_request_is_an_invalid_request(
    server: ServerProcess, body: bytes, echoed: Any, where: str, version: str | None
) -> None:
    before = executions(server)
    found = post(server, body, version)
    assert found["id"] == echoed, found
    assert found["error"]["code"] == -32600, found
    text = found["error"]["message"]
    assert "strings must be valid Unicode" in text and where in text, text
    assert executions(server) == before


PROTOBUF_CANNOT: list[tuple[bytes, str]] = [
    (v03_send('[{"kind":"data","data":{"value":1' + "0" * 400 + "}}]"), "beyond a double"),
    (v1_send(parts='[{"data":{"value":-1' + "0" * 400 + "}}]"), "beyond a double"),
    (v03_send('[{"kind":"data","data":{"value":' + "[" * 60 + "]" * 60 + "}}]"), "deeper than"),
    (v1_send(metadata='{"skill":"mirror","x":' + "[" * 60 + "]" * 60 + "}"), "deeper than"),
]


@pytest.mark.parametrize(("body", "why"), PROTOBUF_CANNOT, ids=range(len(PROTOBUF_CANNOT)))
def test_params_protobuf_cannot_carry_are_invalid_params(
    server: ServerProcess, body: bytes, why: str
) -> None:
    """v0.3's conversion failed on them as an internal error; both versions now say where."""
    before = executions(server)
    version = None if b"message/send" in body else "1.0"
    found = post(server, body, version)
    assert found["error"]["code"] == -32602, found
    assert why in found["error"]["message"] and "params.message." in found["error"]["message"]
    assert found["id"] == 7
    assert executions(server) == before


def test_a_v03_method_under_a2a_version_1_is_method_not_found(server: ServerProcess) -> None:
    """A2A 3.6.2: a request is served with its version's methods; v1.0 has no `tasks/get`
    (the version is supported: -32601 names v1.0's method). A version not served at all
    is -32009, as for v1.0's names."""
    body = b'{"jsonrpc":"2.0","id":3,"method":"tasks/get","params":{"id":"no-such-task"}}'
    found = post(server, body, "1.0")
    assert (found["id"], found["error"]["code"]) == (3, -32601), found
    assert "GetTask" in found["error"]["message"]
    assert post(server, body, "1.1")["error"]["code"] == -32601
    assert post(server, body, "2.0")["error"]["code"] == -32009
    assert post(server, body, "not-a-version")["error"]["code"] == -32009
    for version in ("0.3", None):  # v0.3 itself: the task is not found
        assert post(server, body, version)["error"]["code"] == -32001


# -- a record protobuf cannot carry --------------------------------------------------------------


def deep(levels: int, bottom: str = "bottom\ud800") -> Any:
    """A value nested `levels` deep, objects and lists in turn (an object outermost)."""
    value: Any = bottom
    for level in range(levels, 0, -1):
        value = {f"k{level}": value} if level % 2 else [value]
    return value


def descend(value: Any, levels: int) -> Any:
    """What lies `levels` down a `deep` value."""
    for _ in range(levels):
        value = next(iter(value.values())) if isinstance(value, dict) else value[0]
    return value


def mended(value: Any) -> Any:
    """What the task shows of a JSON value: each lone surrogate U+FFFD."""
    if isinstance(value, str):
        return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in value)
    if isinstance(value, dict):
        return {mended(key): mended(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mended(item) for item in value]
    return value


async def started(http: httpx.AsyncClient, reasoner: str, body: Any, context: str) -> str:
    """An execution started through the HTTP API (which keeps lone surrogates), ended or
    asking: its id."""
    raw = json.dumps(body).encode()  # ensure_ascii: lone surrogates as escapes
    answer = await http.post(
        f"/reasoners/{reasoner}/async",
        content=raw,
        headers={"Content-Type": "application/json", "X-Session-ID": context},
    )
    assert answer.status_code == 202, answer.text
    execution_id: str = answer.json()["execution_id"]
    waited = await http.get(f"/executions/{execution_id}", params={"wait": WAIT / 2})
    assert waited.json()["status"] in ("succeeded", "failed", "input_required"), waited.text
    return execution_id


def shown_result(task: Task) -> Any:
    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task
    (artifact,) = task.artifacts
    (part,) = artifact.parts
    return MessageToDict(part.data)


async def test_a_record_protobuf_cannot_carry_is_shown_mended(
    http: httpx.AsyncClient, client: Client, legacy: Client, streaming: Client
) -> None:
    """Results, an error's message and a prompt holding lone surrogates (in keys and values,
    at any depth) are shown with U+FFFD; an integer past a double as its digits; nesting past
    CARRIED_DEPTH as the JSON text of what lies below. Each task reads (v1.0 and v0.3), the
    list shows them all, and a stream follows one."""
    context = f"hostile-{uuid.uuid4().hex}"
    # (A result's key cannot hold one: the execution fails serializing it. A prompt's can.)
    odd = {"key": ["\udfff", {"inner": "a\ud800b"}], "plain": "ok"}
    ids = {
        "odd": await started(http, "mirror", {"value": odd}, context),
        "text": await started(http, "mirror", {"value": "\udfff"}, context),
        "big": await started(http, "mirror", {"value": {"n": 10**400}}, context),
        "deep": await started(http, "mirror", {"value": deep(CARRIED_DEPTH + 8)}, context),
        "fail": await started(http, "fail", {"message": "bad \ud800 news"}, context),
        "ask": await started(http, "ask", {"prompt": {"q\udfff": "which\ud800?"}}, context),
        "ask_text": await started(http, "ask", {"prompt": "yes\udc00?"}, context),
    }
    tasks = {name: await client.get_task(GetTaskRequest(id=i)) for name, i in ids.items()}
    assert shown_result(tasks["odd"]) == mended(odd)
    assert shown_result(tasks["text"]) == {"result": "\ufffd"}
    assert shown_result(tasks["big"]) == {"n": str(10**400)}
    # Below CARRIED_DEPTH levels: the JSON text of what is there (its surrogates escaped).
    shown = descend(shown_result(tasks["deep"]), CARRIED_DEPTH)
    assert isinstance(shown, str), shown
    assert json.loads(shown) == descend(deep(CARRIED_DEPTH + 8), CARRIED_DEPTH)
    failed = tasks["fail"].status
    assert failed.state == TaskState.TASK_STATE_FAILED
    assert failed.message.parts[0].text == "bad \ufffd news"
    assert MessageToDict(failed.message.metadata)["error"]["message"] == "bad \ufffd news"
    asking = tasks["ask"].status
    assert asking.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert MessageToDict(asking.message.parts[0].data) == {"q\ufffd": "which\ufffd?"}
    assert tasks["ask_text"].status.message.parts[0].text == "yes\ufffd?"
    # The v0.3 client reads them too; the list shows every one (none fails it).
    for name, execution_id in ids.items():
        old = await legacy.get_task(GetTaskRequest(id=execution_id))
        assert old.status.state == tasks[name].status.state
    listed = await client.list_tasks(ListTasksRequest(context_id=context, include_artifacts=True))
    assert {task.id for task in listed.tasks} == set(ids.values())
    assert listed.total_size == len(ids)
    # A stream follows the asking task: its first event shows the prompt mended.
    events: list[StreamResponse] = []
    async for event in streaming.subscribe(SubscribeToTaskRequest(id=ids["ask_text"])):
        events.append(event)
        break
    assert events[0].task.status.message.parts[0].text == "yes\ufffd?"
    # An answer nested deeper than a task carries ends it: the SDK's client reads the result.
    answer = deep(CARRIED_DEPTH + 3, bottom="fine")
    done = await send(client, message(data=answer, task_id=ids["ask"]))
    assert json.loads(descend(shown_result(done), CARRIED_DEPTH)) == descend(answer, CARRIED_DEPTH)
    # The API still has them as they were: nothing was changed but what A2A shows.
    kept = (await http.get(f"/executions/{ids['text']}")).content
    assert json.loads(kept)["result"] == "\udfff"


# -- a push config's URL ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://日本.example/h", "printable ASCII"),
        ("ftp://x/", "must be an absolute http:// or https:// URL"),
        ("https://x/#a", "must be an absolute http:// or https:// URL"),
        ("http://a..b/h", "host has an empty label"),
    ],
)
async def test_a_push_config_url_that_is_not_one_is_invalid_params(
    server: ServerProcess, client: Client, url: str, why: str
) -> None:
    before = executions(server)
    sent = SendMessageRequest(
        message=message(data={"value": 1}, skill="mirror"),
        configuration=SendMessageConfiguration(
            return_immediately=True,
            task_push_notification_config=TaskPushNotificationConfig(url=url),
        ),
    )
    with pytest.raises(InvalidParamsError) as refused:
        await send_request(client, sent)
    said = str(refused.value)
    assert "configuration.taskPushNotificationConfig.url" in said and why in said, said
    # v0.3 names the field as v0.3 spells it.
    config = json.dumps({"pushNotificationConfig": {"url": url}})
    body = v03_send('[{"kind":"data","data":{"value":1}}]', extra=',"configuration":' + config)
    found = post(server, body, None)
    assert found["error"]["code"] == -32602, found
    assert "configuration.pushNotificationConfig.url" in found["error"]["message"], found
    assert executions(server) == before
