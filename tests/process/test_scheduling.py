"""Scheduling on real `agent-server run` processes (docs/scheduling.md): time limits,
retries with backoff, delayed starts and queueing instead of 429, on the memory store and on
a real Redis. One server per store for the module; what ran, and when, the test app writes
itself (`starts.log`, tests/apps/scheduling_app.py)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

WAIT = 15.0
APP = "scheduling_app:agent"


class Served:
    """One server of the scheduling app and the directory its starts are marked in."""

    def __init__(self, server: ServerProcess, marks: Path) -> None:
        self.server = server
        self.marks = marks
        self.url = server.url

    def starts(self, execution_id: str) -> list[dict[str, Any]]:
        path = self.marks / "starts.log"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line]
        return [line for line in lines if line["id"] == execution_id]

    def start(self, name: str, body: Any = None, **params: Any) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/reasoners/{name}/async", json=body or {}, params=params, timeout=WAIT
        )
        assert response.status_code == 202, response.text
        found: dict[str, Any] = response.json()
        return found

    def ended(self, execution_id: str) -> dict[str, Any]:
        """The execution once terminal (long-polls; retries pass through `queued`)."""
        deadline = time.monotonic() + WAIT
        while True:
            response = httpx.get(
                f"{self.url}/executions/{execution_id}", params={"wait": 5}, timeout=10
            )
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            if body["status"] in ("succeeded", "failed", "cancelled", "lost"):
                return body
            assert time.monotonic() < deadline, body
            time.sleep(0.02)


def _serve(
    tmp: Path, store: str, *extra: str, redis: RedisServer | None = None
) -> Iterator[Served]:
    marks = tmp / "marks"
    marks.mkdir()
    args = [APP, "--store", store, "--lease-ttl", "1", *extra]
    server = ServerProcess(args, {"SCHEDULING_MARKS": str(marks)}, tmp)
    try:
        server.wait_ready()
        yield Served(server, marks)
    finally:
        server.close()


@pytest.fixture(scope="module")
def redis_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["memory", "redis"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server per store, shared by the module's tests."""
    tmp = tmp_path_factory.mktemp(f"sched-{request.param}")
    if request.param == "memory":
        yield from _serve(tmp, "memory")
        return
    redis = request.getfixturevalue("redis_for_module")
    yield from _serve(tmp, redis.url)


# -- timeouts ---------------------------------------------------------------------------------


def test_an_attempt_past_its_timeout_fails_with_execution_timeout(served: Served) -> None:
    started = served.start("slow")
    ended = served.ended(started["execution_id"])
    assert ended["status"] == "failed", ended
    assert ended["error"]["type"] == "ExecutionTimeout", ended
    assert "0.5 s" in ended["error"]["message"]
    assert 0.4 < ended["duration_seconds"] < 5, ended
    quick = served.ended(served.start("slow", {"seconds": 0.05})["execution_id"])
    assert quick["status"] == "succeeded", quick


def test_time_waiting_for_input_does_not_count_toward_the_timeout(served: Served) -> None:
    execution_id = served.start("patient")["execution_id"]
    waiting = httpx.get(
        f"{served.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5
    ).json()
    assert waiting["status"] == "input_required", waiting
    time.sleep(0.8)  # waiting longer than the limit itself: the clock is stopped
    answered = httpx.post(
        f"{served.url}/executions/{execution_id}/input", json={"value": "yes"}, timeout=WAIT
    )
    assert answered.status_code == 202, answered.text
    ended = served.ended(execution_id)
    assert (ended["status"], ended["result"]) == ("succeeded", "yes"), ended
    # Working past the limit after the answer is still a timeout.
    execution_id = served.start("patient", {"work": 5})["execution_id"]
    httpx.get(f"{served.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5)
    httpx.post(f"{served.url}/executions/{execution_id}/input", json={"value": 1}, timeout=WAIT)
    ended = served.ended(execution_id)
    assert ended["status"] == "failed" and ended["error"]["type"] == "ExecutionTimeout", ended


_ = signal  # used by the shutdown tests below
