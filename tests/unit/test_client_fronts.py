"""The client's two fronts cannot drift apart: they have the same methods, signatures and
bodies (`await` aside), each a call into the core operation of its name; the core does no
I/O, parses event streams as httpx-sse does, and is driven here without a server."""

from __future__ import annotations

import ast
import inspect
import json
import random
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import EventSource

import agent_server.client as client
from agent_server.client import aio, core, sse, steps, sync

#: The async front's names, and the names in its annotations and bodies, in the sync one's.
RENAMED = {
    **aio.SYNC_NAMES,
    "AsyncAgentClient": "AgentClient",
    "AsyncExecutionHandle": "ExecutionHandle",
    "AsyncIterator": "Iterator",
    "AsyncBaseTransport": "BaseTransport",
    "AsyncClient": "Client",
}
#: What each front does its own way: taking the core's steps.
STEPS = {"_take", "_drive", "_iterate"}
#: The fronts' methods that are not calls into the core.
LIFECYCLE = {"__init__", "__enter__", "__exit__", "close"}
PAIRS = [
    (sync.AgentClient, aio.AsyncAgentClient),
    (sync.ExecutionHandle, aio.AsyncExecutionHandle),
]


def methods(cls: type) -> dict[str, Callable[..., Any]]:
    """The functions and properties a class defines, by their sync front's names."""
    found = {}
    for name, value in vars(cls).items():
        if isinstance(value, property):
            value = value.fget
        if inspect.isfunction(value):
            found[RENAMED.get(name, name)] = value
    return found


class _AsSync(ast.NodeTransformer):
    """An async function's tree as its blocking twin's: no `await`, `async def` as `def`,
    the async names as the sync ones."""

    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        self.generic_visit(node)
        return ast.FunctionDef(**{f: getattr(node, f) for f in node._fields})

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Name(RENAMED.get(node.id, node.id), node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> ast.AST:
        self.generic_visit(node)
        return ast.Attribute(node.value, RENAMED.get(node.attr, node.attr), node.ctx)

    def visit_Constant(self, node: ast.Constant) -> ast.AST:
        if isinstance(node.value, str):  # annotations are strings (`from __future__`)
            for old, new in RENAMED.items():
                node.value = node.value.replace(old, new)
        return node


def tree(function: Callable[..., Any]) -> ast.FunctionDef:
    parsed = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(parsed, ast.FunctionDef | ast.AsyncFunctionDef)
    if ast.get_docstring(parsed) is not None:
        parsed.body = parsed.body[1:]
    converted = _AsSync().visit(parsed)
    assert isinstance(converted, ast.FunctionDef)
    converted.decorator_list = []
    converted.name = RENAMED.get(converted.name, converted.name)
    return converted


@pytest.mark.parametrize(("blocking", "asynchronous"), PAIRS)
def test_the_fronts_define_the_same_methods_and_nothing_else(
    blocking: type, asynchronous: type
) -> None:
    assert methods(blocking).keys() == methods(asynchronous).keys()
    own = {name for name in methods(blocking) if name.startswith("_")}
    assert own <= STEPS | LIFECYCLE, "logic in a front belongs in the core"


@pytest.mark.parametrize(("blocking", "asynchronous"), PAIRS)
def test_the_fronts_methods_have_the_same_signatures_and_bodies(
    blocking: type, asynchronous: type
) -> None:
    twins = methods(asynchronous)
    for name, function in methods(blocking).items():
        if name in STEPS:
            continue
        mine, twin = inspect.signature(function), inspect.signature(twins[name])
        assert list(mine.parameters) == list(twin.parameters), name
        for parameter in mine.parameters.values():
            other = twin.parameters[parameter.name]
            assert (parameter.kind, parameter.default) == (other.kind, other.default), name
        assert ast.dump(tree(function)) == ast.dump(tree(twins[name])), name


def called_core_operations(function: Callable[..., Any]) -> list[str]:
    return [
        node.func.attr
        for node in ast.walk(tree(function))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and ast.unparse(node.func.value) == "self._core"
    ]


def test_each_call_is_one_core_operation_of_its_name() -> None:
    for name, function in methods(sync.AgentClient).items():
        if name in STEPS | LIFECYCLE:
            continue
        assert called_core_operations(function) == [name], name
        assert len(tree(function).body) <= 2, f"{name}: a front's call is one or two lines"
        operation = getattr(core.Core, name)
        if name != "handle":
            assert inspect.isgeneratorfunction(operation), name
        # The core takes the front's arguments in the same order.
        front = [p for p in inspect.signature(function).parameters if p != "self"]
        assert [p for p in inspect.signature(operation).parameters if p != "self"] == front


def test_each_handle_method_is_the_clients_of_its_name() -> None:
    for name, function in methods(sync.ExecutionHandle).items():
        if name in LIFECYCLE | {"execution_id", "result"}:
            continue
        called = [
            node.func.attr
            for node in ast.walk(tree(function))
            if isinstance(node, ast.Call) and ast.unparse(node.func).startswith("self.client.")
        ]
        assert called == [name], name


def test_the_core_does_no_io() -> None:
    for module in (core, sse, client.models, client.retries):
        imported: set[str] = set()
        attributes: set[str] = set()
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
            elif isinstance(node, ast.Attribute):
                attributes.add(node.attr)
        assert not imported & {"asyncio", "socket", "threading", "select"}, module.__name__
        assert not attributes & {"sleep", "stream", "Client", "AsyncClient"}, module.__name__


def test_the_docstrings_are_one_text_for_both_fronts() -> None:
    for blocking, asynchronous in PAIRS:
        twins = methods(asynchronous)
        for name, function in methods(blocking).items():
            assert twins[name].__doc__ == function.__doc__, name


# -- the core, driven without a server ----------------------------------------------------------

STREAMS = [
    'id: 1\nevent: step\ndata: {"n": 1}\n\n: heartbeat\n\nid: 2\nevent: step\ndata: 2\n\n',
    'retry: 1500\n\nevent: start\ndata: {}\n\nevent: end\ndata: {"status": "succeeded"}\n\n',
    "data: a\ndata: b\r\n\r\nid: 7\r\ndata:c\r\rdata: no-end",
    "event: missed\ndata: 3\n\nid: x\0y\ndata: kept id\n\nretry: soon\ndata: d\n\n\r",
    "data: \u00e9t\u00e9 \u2028 still one line\n\n",
]


def pieces(text: str, seed: int) -> Iterator[str]:
    chance = random.Random(seed)
    while text:
        size = chance.randint(1, 7)
        yield text[:size]
        text = text[size:]


@pytest.mark.parametrize("text", STREAMS)
def test_the_sse_parser_reads_what_httpx_sse_reads(text: str) -> None:
    response = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=text.encode()
    )
    expected = [(s.event, s.data, s.id, s.retry) for s in EventSource(response).iter_sse()]
    for seed in range(20):
        parser = sse.Parser()
        got = [m for piece in pieces(text, seed) for m in parser.feed(piece)] + parser.end()
        assert [(m.event, m.data, m.id, m.retry) for m in got] == expected, seed


def answer(status: int, body: Any = None, **headers: str) -> httpx.Response:
    return httpx.Response(
        status,
        headers=headers,
        content=b"" if body is None else json.dumps(body).encode(),
        request=httpx.Request("GET", "http://server/executions/e-1"),
    )


EXECUTION = {"execution_id": "e-1", "reasoner": "echo", "status": "succeeded", "result": 1}


def test_a_refusal_is_retried_after_its_retry_after() -> None:
    flow = core.Core("http://server", token=None, timeout=5, retry_for=30).get("e-1")
    sent = next(flow)
    assert isinstance(sent, steps.Send) and (sent.method, sent.path) == ("GET", "/executions/e-1")
    wait = flow.send(answer(429, {"detail": "busy"}, **{"retry-after": "2"}))
    assert isinstance(wait, steps.Sleep) and 2.0 <= wait.seconds <= 2.4
    assert flow.send(None) == sent
    with pytest.raises(StopIteration) as ended:
        flow.send(answer(200, EXECUTION))
    assert ended.value.value.result == 1


def test_a_stream_closed_before_its_end_resumes_after_the_last_event() -> None:
    flow = core.Core("http://server", token=None, timeout=5, retry_for=30).events("e-1", None, None)
    opened = next(flow)
    assert isinstance(opened, steps.Open) and "Last-Event-ID" not in opened.send.headers
    stream = answer(200, None, **{"content-type": "text/event-stream"})
    assert isinstance(flow.send(stream), steps.Chunk)
    emitted = flow.send("id: 4\nevent: step\ndata: {}\n\nretry: 500\n\n")
    assert isinstance(emitted, steps.Emit) and emitted.item == client.Event(4, "step", {})
    assert isinstance(flow.send(None), steps.Chunk)
    assert isinstance(flow.send(None), steps.Close)  # closed before its end
    wait = flow.send(None)
    assert isinstance(wait, steps.Sleep) and wait.seconds == 0.5  # the server's retry: hint
    again = flow.send(None)
    assert isinstance(again, steps.Open) and again.send.headers["Last-Event-ID"] == "4"
    assert isinstance(flow.send(stream), steps.Chunk)
    end = flow.send(f"event: end\ndata: {json.dumps(EXECUTION)}\n\n")
    assert isinstance(end, steps.Emit) and end.item.event == "end"
    with pytest.raises(StopIteration):
        flow.send(None)


def test_a_refused_stream_is_read_then_an_error_when_not_a_refusal() -> None:
    flow = core.Core("http://server", token=None, timeout=5, retry_for=30).events("e-1", 2, None)
    opened = next(flow)
    assert isinstance(opened, steps.Open) and opened.send.headers["Last-Event-ID"] == "2"
    missing = answer(404, {"detail": "no such execution"})
    assert isinstance(flow.send(missing), steps.Read)
    with pytest.raises(client.NotFound):
        flow.send(missing)
