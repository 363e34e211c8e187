"""A synchronous caller still waiting when the process shuts down is answered by agent-server
(503 + Retry-After + Location, JSON), never by uvicorn's plain-text 500, whatever its wait
is on: the end's write to a paused Redis, or queued work followed through a paused Redis.

Invariant: once the listener closes (the shutdown's answer point), every sync response
still waiting is answered with what is known (the result only if recorded), before uvicorn's
graceful-shutdown timeout cancels the request; the process exits within its grace period;
the execution ends in a state every replica reads once Redis answers again.

Real parts: `agent-server run` with the redis store on a redis-server of the test's own,
paused with SIGSTOP, and real signals.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cluster import wait_for
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

GRACE = 6.0
#: unready 0 + drain 1 + cancel 1 + http 1 + margin 1 <= GRACE.
BUDGET = [
    *("--grace-period", str(GRACE), "--unready-delay", "0", "--drain-timeout", "1"),
    *("--cancel-timeout", "1", "--http-timeout", "1", "--lease-ttl", "1"),
]
WAIT = 15.0


class Call:
    """One synchronous POST in a thread of its own: the test signals the server meanwhile."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.response: httpx.Response | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(url, body, headers))
        self._thread.start()

    def _run(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        try:
            self.response = httpx.post(url, json=body, headers=headers, timeout=WAIT)
        except BaseException as exc:  # reported by `answer`
            self.error = exc

    def answer(self) -> httpx.Response:
        self._thread.join(WAIT + 1)
        assert not self._thread.is_alive(), "the sync call never returned"
        assert self.response is not None, f"the sync call failed: {self.error!r}"
        return self.response


@pytest.fixture
def paused(own_redis: RedisServer) -> Iterator[RedisServer]:
    """The test's Redis, resumed at the end whatever happened (so it can be killed)."""
    yield own_redis
    assert own_redis.proc is not None
    own_redis.proc.send_signal(signal.SIGCONT)


def serve(
    redis: RedisServer, tmp_path: Path, name: str, app: str = "tests_app:agent"
) -> ServerProcess:
    marker_dir = tmp_path / name
    marker_dir.mkdir()
    args = [app, "--store", redis.url, "--replica-id", name, *BUDGET]
    server = ServerProcess(args, {}, marker_dir)
    server.wait_ready()
    return server


def assert_sent_elsewhere(response: httpx.Response, server: ServerProcess) -> str:
    """503 JSON from agent-server, with where to read the execution and when to retry."""
    assert response.status_code == 503, (response.status_code, response.text, server.stderr())
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert response.headers["retry-after"]
    execution_id = body["execution_id"]
    assert response.headers["location"] == f"/executions/{execution_id}"
    assert "Exception in ASGI application" not in server.stderr(), server.stderr()
    return str(execution_id)


def ended_on(url: str, execution_id: str) -> dict[str, Any]:
    """The execution once it reads terminal there (long-polls, bounded)."""
    seen: list[object] = []

    def ended() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", params={"wait": 1}, timeout=5)
        except httpx.TransportError as exc:
            seen.append(exc)
            return None
        body: dict[str, Any] = response.json()
        seen.append((response.status_code, body))
        return body if body.get("status") not in (None, "queued", "running") else None

    try:
        found: dict[str, Any] = wait_for(ended, timeout=30, what=f"the end of {execution_id}")
    except AssertionError:
        raise AssertionError(f"{execution_id} never ended: last read {seen[-1:]}") from None
    return found


def test_a_sync_run_ending_while_redis_is_paused_is_answered_at_shutdown(
    paused: RedisServer, tmp_path: Path
) -> None:
    """The run ends during the drain, its end's write waits on a paused Redis: the caller
    gets 503 + Location before uvicorn's timeout, not a plain 500 after it."""
    server = serve(paused, tmp_path, "a")
    other: ServerProcess | None = None
    try:
        call = Call(f"{server.url}/reasoners/sleep", {"seconds": 0.4, "marker": "slept"}, {})
        server.wait_marker("slept")
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)
        server.signal(signal.SIGTERM)
        response = call.answer()
        code, elapsed = server.wait_exit(GRACE + 2)
        execution_id = assert_sent_elsewhere(response, server)
        assert "status" not in response.json()  # no verdict the store may contradict
        assert elapsed < GRACE - 0.5, (elapsed, server.stderr())  # before the watchdog
        assert code in (0, 6), (code, server.stderr())
        paused.proc.send_signal(signal.SIGCONT)
        other = serve(paused, tmp_path, "b")
        body = ended_on(other.url, execution_id)
        assert body["status"] in ("succeeded", "lost"), body
    finally:
        server.close()
        if other is not None:
            other.close()


def test_a_sync_caller_of_queued_work_is_answered_at_shutdown_while_redis_is_paused(
    paused: RedisServer, tmp_path: Path
) -> None:
    """A sync run queued behind a concurrency limit, its wait followed through a paused
    Redis: at shutdown it is sent to the execution, which runs once Redis answers again."""
    server = serve(paused, tmp_path, "a", "scheduling_app:agent")
    other: ServerProcess | None = None
    try:
        tenant = {"X-Tenant": "t"}
        blocker = httpx.post(
            f"{server.url}/reasoners/gate/async",
            json={"tenant": "t", "seconds": 30},
            headers=tenant,
        ).json()["execution_id"]
        starts = server.marker_dir / "starts.log"
        wait_for(lambda: starts.exists() and blocker in starts.read_text(), what="the blocker")
        session = {**tenant, "X-Session-ID": "queued-at-shutdown"}
        call = Call(f"{server.url}/reasoners/gate", {"tenant": "t", "seconds": 0.05}, session)
        queued = wait_for(
            lambda: httpx.get(
                f"{server.url}/executions",
                params={"session_id": "queued-at-shutdown", "status": "queued"},
            ).json(),
            what="the sync run queued",
        )
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)
        server.signal(signal.SIGTERM)
        response = call.answer()
        code, elapsed = server.wait_exit(GRACE + 2)
        execution_id = assert_sent_elsewhere(response, server)
        assert execution_id == queued[0]["execution_id"]
        assert elapsed < GRACE - 0.5, (elapsed, server.stderr())
        assert code in (0, 6), (code, server.stderr())
        paused.proc.send_signal(signal.SIGCONT)
        other = serve(paused, tmp_path, "b", "scheduling_app:agent")
        # The blocker's end (cancelled at the drain deadline) was owed to the paused Redis:
        # it reads an end (its write landed after all, or its owner is judged gone) ...
        assert ended_on(other.url, blocker)["status"] in ("cancelled", "lost")
        # ... and the queued run then takes the slot and runs on the replica left.
        assert ended_on(other.url, execution_id)["status"] == "succeeded"
    finally:
        server.close()
        if other is not None:
            other.close()


def test_starts_whose_records_wait_on_a_paused_redis_at_shutdown_are_sent_to_read_them(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """Starts admitted in the unready window, their creates held by a paused Redis when
    the listener closes (the drain does not wait for them): each caller, sync and async,
    gets 503 + Location, and the id there reads 404 or an end once Redis answers again."""
    marker_dir = tmp_path / "a"
    marker_dir.mkdir()
    unready = [*BUDGET, "--unready-delay", "1", "--drain-timeout", "0.5"]
    args = ["tests_app:agent", "--store", own_redis.url, "--replica-id", "a", *unready]
    server = ServerProcess(args, {}, marker_dir)
    other: ServerProcess | None = None
    assert own_redis.proc is not None
    try:
        server.wait_ready()
        own_redis.proc.send_signal(signal.SIGSTOP)
        server.signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{server.url}/readyz").status_code == 503, what="unready")
        calls = [
            Call(f"{server.url}/reasoners/sleep", {"seconds": 0.05}, {}),
            Call(f"{server.url}/reasoners/sleep/async", {"seconds": 0.05}, {}),
        ]
        responses = [call.answer() for call in calls]
        code, elapsed = server.wait_exit(GRACE + 2)
        ids = [assert_sent_elsewhere(response, server) for response in responses]
        assert elapsed < GRACE - 0.5, (elapsed, server.stderr())
        assert code == 0, (code, server.stderr())
        own_redis.proc.send_signal(signal.SIGCONT)
        other = serve(own_redis, tmp_path, "b")
        for execution_id in ids:
            read = httpx.get(f"{other.url}/executions/{execution_id}", timeout=5)
            if read.status_code != 404:
                assert ended_on(other.url, execution_id)["status"] == "lost", read.text
    finally:
        own_redis.proc.send_signal(signal.SIGCONT)
        server.close()
        if other is not None:
            other.close()


def test_the_watchdog_says_what_a_loop_blocked_mid_drain_left_unrecorded(
    paused: RedisServer, tmp_path: Path
) -> None:
    """Invariant: when a loop turn outlasts the grace period and the watchdog ends the
    process (exit 4, no report), its one line still says where the shutdown stood, what
    still ran here and how many writes the store was never sent or never answered; the
    other replicas settle those executions from the store once it answers again."""
    server = serve(paused, tmp_path, "a")
    other: ServerProcess | None = None
    try:
        ids = []
        for name in ("cooperative", "cooperative", "cooperative", "block_at_drain"):
            started = httpx.post(f"{server.url}/reasoners/{name}/async", json={}, timeout=WAIT)
            assert started.status_code == 202, started.text
            ids.append(started.json()["execution_id"])
        for execution_id in ids:  # each one's start is recorded and it runs here
            wait_for(
                lambda i=execution_id: (
                    httpx.get(f"{server.url}/executions/{i}", timeout=5).json()["status"]
                    == "running"
                ),
                timeout=WAIT,
                what=f"{execution_id} running",
            )
        assert paused.proc is not None
        paused.proc.send_signal(signal.SIGSTOP)  # the three ends at the drain stay owed
        server.signal(signal.SIGTERM)
        code, elapsed = server.wait_exit(GRACE + 3)
        stderr = server.stderr()
        assert code == 4, stderr
        assert elapsed < GRACE, stderr  # inside the grace period: no SIGKILL needed
        lines = [line for line in stderr.splitlines() if "watchdog fired" in line]
        assert len(lines) == 1, stderr
        line = lines[0]
        assert "in phase draining" in line, line
        assert "1 execution still running here" in line, line  # the one that blocks the loop
        assert "3 writes not yet recorded in the store" in line, line
        assert "shutdown report" not in stderr
        paused.proc.send_signal(signal.SIGCONT)
        other = serve(paused, tmp_path, "b")
        # None silently stays running: an end sent before the exit (in the socket's buffer
        # when Redis paused) is recorded once Redis reads it; the rest are lost.
        ends = [ended_on(other.url, execution_id)["status"] for execution_id in ids]
        assert set(ends[:3]) <= {"succeeded", "lost"}, ends
        assert ends[3] == "lost", ends
    finally:
        server.close()
        if other is not None:
            other.close()
