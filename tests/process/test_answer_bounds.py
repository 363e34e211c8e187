"""What an answer must satisfy is decided once (agent_server/service/answering.py) and holds
on every front: an answer over `--max-answer-bytes` is refused on REST (413) and on A2A
(invalid params, through the official SDK), and the execution still waits for its answer,
which a fitting one then gives. Before the application layer, A2A took any size."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from a2a.types.a2a_pb2 import TaskState
from a2a.utils.errors import InvalidParamsError

from tests.process.test_protocol_edges import a2a_client, message, send
from tests.support.process import ServerProcess, serving

WAIT = 20.0
#: The server's bound on an answer (bytes of its JSON), and an answer just over it.
BOUND = 256
OVER = "x" * BOUND


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(
        tmp_path_factory,
        "answer-bounds",
        "edges_app:agent",
        "--a2a",
        "--max-answer-bytes",
        str(BOUND),
    ) as process:
        yield process


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        yield client


async def test_rest_refuses_an_answer_over_the_bound_and_takes_one_within(
    server: ServerProcess, http: httpx.AsyncClient
) -> None:
    started = await http.post(f"{server.url}/reasoners/note", json={"topic": "tea"})
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    refused = await http.post(f"{server.url}/executions/{execution_id}/input", json={"value": OVER})
    assert refused.status_code == 413, refused.text
    assert f"at most {BOUND}" in refused.json()["detail"]
    still = await http.get(f"{server.url}/executions/{execution_id}")
    assert still.json()["status"] == "input_required", still.text
    taken = await http.post(f"{server.url}/executions/{execution_id}/input", json={"value": "ok"})
    assert taken.status_code == 202, taken.text
    done = await http.get(f"{server.url}/executions/{execution_id}", params={"wait": WAIT})
    assert done.json()["result"] == {"topic": "tea", "note": "ok"}, done.text


@pytest.mark.parametrize("version", ["0.3", "1.0"])
async def test_a2a_refuses_an_answer_over_the_bound_and_takes_one_within(
    server: ServerProcess, http: httpx.AsyncClient, version: str
) -> None:
    async with await a2a_client(server, http, version) as client:
        asked = await send(client, message(data={"topic": "jam"}, skill="note"))
        assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED, asked
        with pytest.raises(InvalidParamsError) as refused:
            await send(client, message(text=OVER, task_id=asked.id))
        assert f"at most {BOUND}" in str(refused.value), refused.value
        still = await http.get(f"{server.url}/executions/{asked.id}")
        assert still.json()["status"] == "input_required", still.text
        done = await send(client, message(text="fine", task_id=asked.id))
    assert done.status.state == TaskState.TASK_STATE_COMPLETED, done
