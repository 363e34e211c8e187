"""Waiting for input end to end: a real `agent-server run` serving tests/apps/input_app.py,
the real client (`InputRequired`, `respond`, `wait`) and the real CLI (`agent-server input`,
and `agent-server call` answering from a terminal, or exiting 8 without one)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from agent_server.client import AgentClient, AsyncAgentClient, Conflict, InputRequired, InvalidInput
from tests.support.process import ServerProcess, one_line

WAIT = 20.0
Start = Callable[..., ServerProcess]


@pytest.fixture
def server(server_factory: Start) -> ServerProcess:
    return server_factory("input_app:agent")


@pytest.fixture
def client(server: ServerProcess) -> Iterator[AgentClient]:
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        yield client


def verb(*args: str, stdin: int | None = subprocess.DEVNULL) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")}
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env=environment,
        stdin=stdin,
    )


def test_run_raises_input_required_and_its_handle_answers(client: AgentClient) -> None:
    with pytest.raises(InputRequired) as asked:
        client.run("approve", {"amount": 9})
    execution = asked.value.execution
    assert execution.status == "input_required"
    assert execution.input_request is not None
    assert execution.input_request["prompt"] == {"question": "approve 9?"}
    handle = asked.value.handle
    assert handle is not None and handle.execution_id == execution.execution_id
    with pytest.raises(InvalidInput):
        handle.respond({"approved": "maybe"})
    taken = handle.respond({"approved": True, "note": "ok"})
    assert taken.status in ("running", "succeeded")
    with pytest.raises(Conflict):
        client.respond(execution.execution_id, {"approved": False}, request_id=1)
    assert handle.result(timeout=WAIT) == {"approved": True, "note": "ok", "amount": 9}


def test_wait_returns_at_input_required_and_at_the_end(client: AgentClient) -> None:
    handle = client.start("twice")
    first = handle.wait(timeout=WAIT)
    assert (first.status, first.waits_for_input) == ("input_required", True)
    assert first.input_request is not None and first.input_request["request_id"] == 1
    client.respond(handle.execution_id, "a")
    second = handle.wait(timeout=WAIT)
    assert second.input_request is not None and second.input_request["request_id"] == 2
    handle.respond("b", request_id=2)
    ended = handle.wait(timeout=WAIT)
    assert (ended.status, ended.result) == ("succeeded", ["a", "b"])


async def test_the_async_client_answers_the_same_way(server: ServerProcess) -> None:
    async with AsyncAgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        with pytest.raises(InputRequired) as asked:
            await client.run("approve")
        assert asked.value.handle is not None
        await asked.value.handle.respond({"approved": False})
        assert (await asked.value.handle.result(timeout=WAIT))["approved"] is False


def test_the_cli_answers_with_input_and_call_exits_8_without_a_terminal(
    server: ServerProcess,
) -> None:
    called = verb("call", "approve", '{"amount": 4}', "--url", server.url)
    assert called.returncode == 8, called.stderr
    execution = json.loads(called.stdout)
    assert execution["status"] == "input_required"
    line = one_line(called.stderr)
    assert "approve 4?" in line and "agent-server input" in line
    execution_id = execution["execution_id"]

    refused = verb("input", execution_id, '{"approved": 3}', "--url", server.url)
    assert refused.returncode == 2, refused.stderr
    one_line(refused.stderr)
    not_json = verb("input", execution_id, "{nope", "--url", server.url)
    assert not_json.returncode == 2
    answered = verb("input", execution_id, '{"approved": true}', "--url", server.url)
    assert answered.returncode == 0, answered.stderr
    assert json.loads(answered.stdout)["execution_id"] == execution_id
    again = verb(
        "input", execution_id, '{"approved": false}', "--request-id", "1", "--url", server.url
    )
    assert again.returncode == 6
    assert "409" in one_line(again.stderr)
    ended = verb("get", execution_id, "--wait", str(WAIT), "--url", server.url)
    assert ended.returncode == 0, ended.stderr
    assert json.loads(ended.stdout)["result"] == {"approved": True, "note": "", "amount": 4}
    unknown = verb("input", "0" * 32, "1", "--url", server.url)
    assert unknown.returncode == 6


def _read_until(fd: int, wanted: str, seen: list[str], deadline: float) -> None:
    """Read `fd` (the call's stderr) until `wanted` has appeared, bounded by `deadline`."""
    while wanted not in "".join(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} in {''.join(seen)!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            assert chunk, f"the call ended before {wanted!r}: {''.join(seen)!r}"
            seen.append(chunk.decode())


def test_call_reads_answers_from_a_terminal(server: ServerProcess) -> None:
    controller, terminal = pty.openpty()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent_server", "call", "twice", "--url", server.url],
        stdin=terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environment,
    )
    os.close(terminal)
    assert proc.stderr is not None and proc.stdout is not None
    deadline = time.monotonic() + WAIT
    seen: list[str] = []
    try:
        _read_until(proc.stderr.fileno(), "answer (JSON)", seen, deadline)
        assert '(request 1): "first?"' in "".join(seen)
        os.write(controller, b"not json\n")
        _read_until(proc.stderr.fileno(), "not JSON", seen, deadline)
        os.write(controller, b'"one"\n')
        _read_until(proc.stderr.fileno(), "(request 2)", seen, deadline)
        _read_until(proc.stderr.fileno(), "answer (JSON)", seen, deadline + 0)
        os.write(controller, b'{"n": 2}\n')
        out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        os.close(controller)
    assert proc.returncode == 0, "".join(seen)
    body: dict[str, Any] = json.loads(out)
    assert (body["status"], body["result"]) == ("succeeded", ["one", {"n": 2}])


# -- a retried attempt's asks are matched by what they ask (the memory store) ---------------


def test_a_retried_attempt_gets_the_answer_of_the_same_question(client: AgentClient) -> None:
    """Attempt 1 is answered, then fails; the retry asks the same question and gets the kept
    answer at once (it is not asked again, and no answer is needed)."""
    handle = client.start("retried")
    asked = handle.wait(timeout=WAIT)
    assert asked.input_request is not None and asked.input_request["prompt"] == "first?"
    handle.respond(41)
    done = handle.wait(timeout=WAIT)
    assert (done.status, done.result) == ("succeeded", {"answer": 41, "attempt": 2}), done


@pytest.mark.parametrize(
    ("reasoner", "body"), [("retried", {"change": True}), ("keyed_retry", {"key": None})]
)
def test_a_retried_attempt_asking_another_question_fails_with_ask_mismatch(
    client: AgentClient, reasoner: str, body: dict[str, Any]
) -> None:
    handle = client.start(reasoner, body)
    handle.wait(timeout=WAIT)
    handle.respond(41)
    done = handle.wait(timeout=WAIT)
    assert done.status == "failed", done
    assert done.error is not None and done.error["type"] == "AskMismatch", done
    assert "request 1" in done.error["message"]
    assert done.attempt == 2  # not retried again: the next attempt would ask the same


def test_a_key_names_the_question_across_retries(client: AgentClient) -> None:
    handle = client.start("keyed_retry", {"key": "approval"})
    asked = handle.wait(timeout=WAIT)
    assert asked.input_request is not None and asked.input_request["prompt"]["attempt"] == 1
    handle.respond("yes")
    done = handle.wait(timeout=WAIT)
    assert (done.status, done.result) == ("succeeded", {"answer": "yes", "attempt": 2}), done


# -- one answer, one request: the client always names the request it answers ---------------


class LosingTransport(httpx.HTTPTransport):
    """Delivers the first answer, then loses its reply (the connection is cut after the
    server took it): the client retries the same POST. Records every answer's body."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[dict[str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.method == "POST" and request.url.path.endswith("/input"):
            self.answers.append(json.loads(request.content))
            if len(self.answers) == 1:
                response.read()
                response.close()
                raise httpx.ReadError("the connection was cut after the answer left")
        return response


def test_a_retried_answer_is_taken_once_never_the_answer_to_the_next_request(
    server: ServerProcess,
) -> None:
    """`twice` asks again at once after its first answer: the retry of the first answer,
    after its reply was lost, names request 1 and is taken again (202, the same value),
    where without the id it would have answered request 2 with the first answer."""
    losing = LosingTransport()
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT, transport=losing) as client:
        handle = client.start("twice")
        assert handle.wait(timeout=WAIT).waits_for_input
        handle.respond("first")
        second = handle.wait(timeout=WAIT)
        assert second.input_request is not None and second.input_request["request_id"] == 2
        assert second.input_request["prompt"] == {"after": "first"}
        client.respond(handle.execution_id, "second")  # reads the pending request first
        done = handle.wait(timeout=WAIT)
    assert (done.status, done.result) == ("succeeded", ["first", "second"])
    assert [body.get("request_id") for body in losing.answers] == [1, 1, 2]


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_the_same_answer_again_is_202_and_handed_over_once_another_is_409(
    server_factory: Start, request: pytest.FixtureRequest, store: str
) -> None:
    """An answer repeated for a request answered already (a retry whose reply was lost, or
    in doubt) is 202 when it is the same JSON data, keys in any order, and handed to the
    reasoner once; any other value (`1.0` for `1`, `true` for `1`) stays 409; the request
    pending meanwhile is untouched."""
    args = ["input_app:agent"]
    if store == "redis":
        args += ["--store", request.getfixturevalue("redis_url")]
    server = server_factory(*args)
    first = {"a": 1, "b": [1, {"c": None, "d": "é"}]}
    with httpx.Client(base_url=server.url, timeout=WAIT) as http:
        started = http.post("/reasoners/twice/async", json={})
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        path = f"/executions/{execution_id}"
        deadline = time.monotonic() + WAIT
        while http.get(path).json()["status"] != "input_required":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        taken = http.post(f"{path}/input", json={"request_id": 1, "value": first})
        assert taken.status_code == 202, taken.text
        # The same data, its keys in another order and its text spaced otherwise.
        same = '{"value": {"b": [1, {"d": "\\u00e9", "c": null}], "a": 1}, "request_id": 1}'
        for _ in range(2):
            again = http.post(
                f"{path}/input", content=same, headers={"Content-Type": "application/json"}
            )
            assert again.status_code == 202, again.text
            assert again.json()["execution_id"] == execution_id
        for other in ({"a": 1.0, "b": first["b"]}, {"a": True, "b": first["b"]}, "first"):
            refused = http.post(f"{path}/input", json={"request_id": 1, "value": other})
            assert refused.status_code == 409, (other, refused.text)
        deadline = time.monotonic() + WAIT
        while (pending := http.get(path).json())["status"] != "input_required":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert pending["input_request"]["request_id"] == 2, pending
        assert pending["input_request"]["prompt"] == {"after": first}
        unknown = http.post(f"{path}/input", json={"request_id": 7, "value": first})
        assert unknown.status_code == 409, unknown.text
        last = http.post(f"{path}/input", json={"request_id": 2, "value": "second"})
        assert last.status_code == 202, last.text
        deadline = time.monotonic() + WAIT
        while (done := http.get(path, params={"wait": "5"}).json())["status"] != "succeeded":
            assert time.monotonic() < deadline, done
        assert done["result"] == [first, "second"]
        # Ended: its answers are gone with it, so a late retry is 409, never a second run.
        late = http.post(f"{path}/input", json={"request_id": 2, "value": "second"})
        assert late.status_code == 409, late.text
