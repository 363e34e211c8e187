"""`async def` generators as reasoners (docs/events.md), on real processes over
loopback: each `yield` is an `output` event for the stream's readers, the result is the list
yielded, OpenAPI shows an array of the yield type, and a cancel or a drain closes the
generator, one that swallows its cancellation included."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from httpx_sse import connect_sse

from agent_server import Agent
from agent_server.client import AgentClient
from agent_server.model.reasoner import ReasonerDefinitionError
from tests.support.shutdown import shutdown_report

WAIT = 10.0


def events_of(url: str, execution_id: str) -> list[tuple[str, Any]]:
    with (
        httpx.Client(timeout=WAIT) as client,
        connect_sse(client, "GET", f"{url}/executions/{execution_id}/events") as source,
    ):
        assert source.response.status_code == 200, source.response.read()
        return [(e.event, json.loads(e.data)) for e in source.iter_sse() if e.data]


def test_a_generator_runs_and_its_result_is_the_list_yielded(server_factory: Any) -> None:
    server = server_factory("generators_app:agent")
    answer = httpx.post(
        f"{server.url}/reasoners/words", json={"text": "one two three"}, timeout=WAIT
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"] == ["one", "two", "three"]
    models = httpx.post(f"{server.url}/reasoners/tokens", json={"count": 2}, timeout=WAIT)
    assert models.status_code == 200, models.text
    assert models.json()["result"] == [{"text": "t0", "n": 0}, {"text": "t1", "n": 1}]


def test_each_yield_is_an_output_event_in_order_with_the_reasoners_own(
    server_factory: Any,
) -> None:
    server = server_factory("generators_app:agent")
    started = httpx.post(f"{server.url}/reasoners/mixed/async", json={"count": 3}, timeout=WAIT)
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    events = events_of(server.url, execution_id)
    assert events[:-1] == [
        (name, data)
        for n in range(3)
        for name, data in (("progress", {"step": n}), ("output", {"value": n}))
    ]
    assert events[-1][0] == "end"
    assert events[-1][1]["result"] == [{"value": n} for n in range(3)]
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        handle = client.start("words", {"text": "a b"})
        seen = [(e.event, e.data) for e in handle.events(timeout=WAIT)]
    assert seen[:-1] == [("output", "a"), ("output", "b")]
    assert seen[-1][0] == "end" and seen[-1][1]["result"] == ["a", "b"]


def test_openapi_shows_an_array_of_the_yield_type(server_factory: Any) -> None:
    server = server_factory("generators_app:agent")
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        described = {info.name: info.output_schema for info in client.reasoners()}
    assert described["words"] == {"type": "array", "items": {"type": "string"}}
    tokens = described["tokens"]
    assert tokens["type"] == "array" and tokens["items"]["$ref"].endswith("/Token")
    assert described["mixed"] == {"type": "array", "items": {}}
    document = httpx.get(f"{server.url}/openapi.json", timeout=WAIT).json()
    text = json.dumps(document)
    assert '"Token"' in text
    assert "AsyncIterator" not in text


def test_a_value_its_yield_type_refuses_fails_the_run_after_the_good_ones(
    server_factory: Any,
) -> None:
    server = server_factory("generators_app:agent")
    started = httpx.post(f"{server.url}/reasoners/wrong/async", json={"count": 2}, timeout=WAIT)
    execution_id = started.json()["execution_id"]
    events = events_of(server.url, execution_id)
    assert events[:-1] == [("output", 0), ("output", 1)]
    assert events[-1][1]["status"] == "failed"
    raised = httpx.post(f"{server.url}/reasoners/failing", json={"after": 1}, timeout=WAIT)
    assert raised.json()["status"] == "failed"
    assert "failed after 1" in json.dumps(raised.json()["error"])


def test_a_cancel_closes_the_generator_even_one_that_swallows_it(server_factory: Any) -> None:
    server = server_factory("generators_app:agent")
    for name in ("endless", "stubborn"):
        started = httpx.post(
            f"{server.url}/reasoners/{name}/async", json={"marker": name}, timeout=WAIT
        )
        execution_id = started.json()["execution_id"]
        server.wait_marker(name)
        cancelled = httpx.post(f"{server.url}/executions/{execution_id}/cancel", timeout=WAIT)
        assert cancelled.status_code in (200, 202), cancelled.text
        server.wait_marker(f"{name}.closed")
        final = httpx.get(f"{server.url}/executions/{execution_id}?wait=5", timeout=WAIT).json()
        assert final["status"] == "cancelled", (name, final)
    assert (server.marker_dir / "stubborn.swallowed").exists()


def test_a_drain_closes_a_running_generator(server_factory: Any) -> None:
    server = server_factory(
        "generators_app:agent",
        *("--grace-period", "12", "--drain-timeout", "1", "--cancel-timeout", "2"),
    )
    started = httpx.post(f"{server.url}/reasoners/endless/async", json={}, timeout=WAIT)
    assert started.status_code == 202, started.text
    server.wait_marker("endless")
    server.signal(signal.SIGTERM)
    server.wait_exit(WAIT)
    assert (server.marker_dir / "endless.closed").exists(), server.stderr()
    report = shutdown_report(server)
    assert report["abandoned"] == 0, report


def test_on_redis_a_reader_gets_the_output_events_and_the_list(
    server_factory: Any, redis_url: str
) -> None:
    server = server_factory("generators_app:agent", "--store", redis_url)
    started = httpx.post(
        f"{server.url}/reasoners/words/async", json={"text": "x y z", "pause": 0.05}, timeout=WAIT
    )
    execution_id = started.json()["execution_id"]
    events = events_of(server.url, execution_id)
    assert events[:-1] == [("output", "x"), ("output", "y"), ("output", "z")]
    assert events[-1][1]["result"] == ["x", "y", "z"]
    replay = httpx.get(f"{server.url}/executions/{execution_id}/events?after=1", timeout=WAIT)
    assert replay.text.count("event: output") == 2


def test_a_def_generator_is_refused_at_registration() -> None:
    agent = Agent("refusing")

    def numbers() -> Iterator[int]:
        yield 1

    with pytest.raises(ReasonerDefinitionError, match="async def generator"):
        agent.reasoner()(numbers)
