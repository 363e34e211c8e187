"""Waiting for input across replicas: two real `agent-server run` processes on one real
Redis. The ask is recorded on its owner (A), any replica answers (B), exactly one answer
per request wins when replicas race (decided in one Lua script), and the answer reaches the
owner's waiting `ctx.ask` through pub/sub; cancel, DELETE, timeouts and events as in one
process."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess

WAIT = 20.0
Start = Callable[..., ServerProcess]

pytestmark = pytest.mark.redis


#: A short lease, so that a dead owner is judged within a test.
LEASE = ("--lease-ttl", "1")
#: A drain that ends soon, so that a resumable execution is handed off within a test.
SHORT_DRAIN = ("--unready-delay", "0", "--drain-timeout", "0.5", "--grace-period", "8")


@pytest.fixture
def pair(server_factory: Start, redis_url: str) -> tuple[ServerProcess, ServerProcess]:
    a = server_factory(
        "input_app:agent", "--store", redis_url, "--replica-id", "A", *LEASE, *SHORT_DRAIN
    )
    b = server_factory("input_app:agent", "--store", redis_url, "--replica-id", "B", *LEASE)
    return a, b


def start(server: ServerProcess, name: str, body: Any = None) -> str:
    response = httpx.post(f"{server.url}/reasoners/{name}/async", json=body or {}, timeout=WAIT)
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


def poll(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def ended(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    """Once terminal: its event stream ends with `end` (a long-poll stops at asks too)."""
    stream = httpx.get(f"{server.url}/executions/{execution_id}/events", timeout=WAIT)
    frames = [f for f in stream.text.split("\n\n") if "event: end" in f]
    assert frames, stream.text
    data = next(line[6:] for line in frames[-1].splitlines() if line.startswith("data: "))
    body: dict[str, Any] = json.loads(data)
    return body


def answer(server: ServerProcess, execution_id: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/executions/{execution_id}/input", json=body, timeout=WAIT)


def test_asked_on_a_answered_on_b_succeeds_on_a(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "approve", {"amount": 12})
    waiting = poll(b, execution_id)  # B's long-poll is woken at input_required
    assert (waiting["status"], waiting["replica"]) == ("input_required", "A")
    assert waiting["input_request"]["prompt"] == {"question": "approve 12?"}
    refused = answer(b, execution_id, {"value": {"approved": "yes"}})  # B checks the schema
    assert refused.status_code == 422, refused.text
    taken = answer(b, execution_id, {"request_id": 1, "value": {"approved": True, "note": "B"}})
    assert taken.status_code == 202, taken.text
    assert taken.json()["status"] in ("running", "succeeded")
    assert (
        answer(a, execution_id, {"request_id": 1, "value": {"approved": False}}).status_code == 409
    )
    done = ended(b, execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", "A")
    assert done["result"] == {"approved": True, "note": "B", "amount": 12}
    assert done["input_request"] is None


def test_answers_racing_on_both_replicas_one_wins(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "twice")
    assert poll(a, execution_id)["status"] == "input_required"
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda i: (i, answer((a, b)[i % 2], execution_id, {"request_id": 1, "value": i})),
                range(16),
            )
        )
    codes = sorted(response.status_code for _, response in answers)
    assert codes == [202] + [409] * 15, codes
    winner = next(i for i, response in answers if response.status_code == 202)
    second = poll(b, execution_id)
    assert second["input_request"]["request_id"] == 2
    assert second["input_request"]["prompt"] == {"after": winner}
    assert answer(b, execution_id, {"value": "last"}).status_code == 202
    assert ended(a, execution_id)["result"] == [winner, "last"]


def test_a_waiting_execution_is_cancelled_from_another_replica(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "guarded")
    assert poll(b, execution_id)["status"] == "input_required"
    refused = httpx.delete(f"{b.url}/executions/{execution_id}", timeout=WAIT)
    assert refused.status_code == 409
    assert httpx.post(f"{b.url}/executions/{execution_id}/cancel", timeout=WAIT).status_code == 202
    done = ended(b, execution_id)
    assert (done["status"], done["status_reason"]) == ("cancelled", "request")
    assert answer(b, execution_id, {"value": 1}).status_code == 409
    stream = httpx.get(f"{b.url}/executions/{execution_id}/events", timeout=WAIT).text
    assert "event: input_required" in stream and "event: note" in stream


def test_a_timeout_closes_the_request_in_the_store(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "impatient", {"timeout": 0.3})
    done = ended(b, execution_id)
    assert done["result"] == {"timed_out": True, "request_id": 1}
    assert answer(b, execution_id, {"value": 1}).status_code == 409
    answered = start(a, "impatient", {"timeout": 30})
    assert poll(b, answered)["status"] == "input_required"
    assert answer(b, answered, {"value": 7}).status_code == 202
    assert ended(a, answered)["result"] == {"timed_out": False, "answer": 7}


def test_a_synchronous_run_answers_202_and_goes_on(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    response = httpx.post(f"{a.url}/reasoners/approve", json={}, timeout=WAIT)
    assert response.status_code == 202, response.text
    execution_id = response.json()["execution_id"]
    assert response.headers["location"] == f"/executions/{execution_id}"
    assert answer(b, execution_id, {"value": {"approved": False}}).status_code == 202
    assert ended(b, execution_id)["result"]["approved"] is False


def test_an_owner_that_died_while_its_execution_waited_leaves_it_lost(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "approve")
    assert poll(b, execution_id)["status"] == "input_required"
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=WAIT)
    body = ended(b, execution_id)  # B's renewal judges A's work once A's lease lapsed
    assert (body["status"], body["error"]["type"]) == ("lost", "ExecutionLost")
    assert body["input_request"] is None
    assert answer(b, execution_id, {"value": {"approved": True}}).status_code == 409


def test_a_request_answered_before_a_hand_off_is_not_asked_again(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """The next attempt of a resumable execution asks request 1 again: the answer kept
    from the earlier attempt is returned at once."""
    a, b = pair
    execution_id = start(a, "asked_once")
    assert poll(b, execution_id)["status"] == "input_required"
    assert answer(b, execution_id, {"value": "yes"}).status_code == 202
    with httpx.stream("GET", f"{a.url}/executions/{execution_id}/events", timeout=WAIT) as events:
        for line in events.iter_lines():  # the first attempt has the answer
            if line == "event: got":
                break
    a.signal(signal.SIGTERM)
    code, _ = a.wait_exit(WAIT)
    assert code == 0, a.stderr()
    done = ended(b, execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", "B")
    assert done["result"] == {"answer": "yes", "attempt": 2}
