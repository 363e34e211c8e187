"""Misbehaving reasoners against a real process: each is contained, the process stays
healthy, exits inside its grace period, and asyncio never prints its own unobserved-task
warnings (errors of tasks reasoners dropped become the server's own log lines)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.raw_http import rss_kib

#: What asyncio prints when a task's end goes unobserved; no path may print it.
FORBIDDEN = ("Task exception was never retrieved", "Task was destroyed but it is pending")
#: Bound on every wait for the server (seconds).
WAIT = 10.0
#: A short budget: 0 unready + 1 drain + 1 cancel + 0.5 http + 1 margin <= 4; watchdog at 3 s.
SHORT = ("--grace-period", "4", "--drain-timeout", "1", "--cancel-timeout", "1")
SHORT += ("--http-timeout", "0.5")
GRACE = 4.0


def _wait_until(check: Callable[[], bool], what: str, server: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {WAIT}s:\n{server.stderr()}")
        time.sleep(0.02)


def _assert_clean(stderr: str) -> None:
    for text in FORBIDDEN:
        assert text not in stderr, stderr


def _report(stderr: str) -> dict[str, Any]:
    line = next(line for line in stderr.splitlines() if "shutdown report: " in line)
    report: dict[str, Any] = json.loads(line.split("shutdown report: ", 1)[1])
    return report


def test_misbehaviour_while_serving_is_contained(server_factory: Any) -> None:
    """Cleanup that raises, unserialisable results, dropped tasks, big results, and at the
    end work that swallows cancellation: one process, served and shut down cleanly."""
    server = server_factory("tests_app:agent", *SHORT, "--max-retained", "10")
    client = httpx.Client(base_url=server.url, timeout=WAIT)

    # Cleanup that raises when cancelled: failed, with that error as the reason.
    started = client.post("/reasoners/cleanup_raises/async", json={"marker": "c1"})
    server.wait_marker("c1")
    location = started.headers["location"]
    assert client.post(f"{location}/cancel").status_code == 202
    ended = client.get(location, params={"wait": WAIT}).json()
    assert ended["status"] == "failed"
    assert ended["error"] == {"type": "RuntimeError", "message": "cleanup failed"}

    # Values no JSON can carry: the execution fails, and stays readable afterwards.
    for path, body, error in [
        ("unserialisable", {"kind": "object"}, "PydanticSerializationError"),
        ("unserialisable", {"kind": "cycle"}, "ValueError"),
        ("unserialisable", {"kind": "bytes"}, "UnicodeDecodeError"),
        ("nan_result", {"value": "nan"}, "Unrecordable"),
        ("nan_result", {"value": "-inf"}, "Unrecordable"),
    ]:
        answer = client.post(f"/reasoners/{path}", json=body)
        assert answer.status_code == 500, answer.text
        assert answer.json()["status"] == "failed"
        assert answer.json()["error"]["type"] == error
        again = client.get(f"/executions/{answer.json()['execution_id']}")
        assert again.status_code == 200
        assert again.json()["error"]["type"] == error
        assert "Traceback" not in answer.text and "/agent_server/" not in answer.text

    # Tasks a reasoner started and dropped: their errors are our log lines, not asyncio's.
    assert client.post("/reasoners/spawn_failing_task", json={}).status_code == 200
    assert client.post("/reasoners/spawn_forgotten_task", json={}).status_code == 200
    assert client.post("/reasoners/collect_garbage", json={}).status_code == 200
    _wait_until(
        lambda: "LookupError: raised by a task nobody awaited" in server.stderr(),
        "the dropped task's error",
        server,
    )
    _wait_until(
        lambda: "garbage-collected while still pending" in server.stderr(),
        "the collected pending task",
        server,
    )
    assert "unobserved task error in task" in server.stderr()

    # Big results: the server keeps at most --max-retained of them (10 x 256 KiB here).
    for _ in range(5):
        assert client.post("/reasoners/big_result", json={"kilobytes": 256}).status_code == 200
    before = rss_kib(server.proc.pid)
    for _ in range(200):  # 50 MiB of results in all
        assert client.post("/reasoners/big_result", json={"kilobytes": 256}).status_code == 200
    grown = rss_kib(server.proc.pid) - before
    assert grown < 20 * 1024, f"RSS grew {grown} KiB for 10 retained results of 256 KiB"
    assert len(client.get("/executions", params={"reasoner": "big_result"}).json()) <= 10

    # Shutdown with work that swallows cancellation and work whose cleanup raises.
    client.post("/reasoners/swallow/async", json={})
    cleanup = client.post("/reasoners/cleanup_raises/async", json={"marker": "c2"})
    server.wait_marker("c2")
    assert client.get("/healthz").status_code == 200
    server.signal(signal.SIGTERM)
    during = client.get(cleanup.headers["location"], params={"wait": WAIT}).json()
    assert during["status"] == "failed"
    assert during["error"]["message"] == "cleanup failed"
    client.close()
    code, elapsed = server.wait_exit(timeout=GRACE + 5)
    stderr = server.stderr()
    assert code == 3, stderr  # the swallowing one was abandoned
    assert elapsed < GRACE, stderr
    report = _report(stderr)
    assert (report["cancelled"], report["abandoned"]) == (1, 1), report
    _assert_clean(stderr)


def test_leak_meets_memory_error_and_the_server_lives_on(server_factory: Any) -> None:
    """A reasoner leaking 64 MiB a call under a capped address space: the call that no
    longer fits fails with MemoryError; the server keeps serving and exits cleanly."""
    server = server_factory("tests_app:agent", *SHORT, env={"TESTS_MEMORY_HEADROOM_MB": "400"})
    client = httpx.Client(base_url=server.url, timeout=WAIT)
    outcomes: list[str] = []
    for _ in range(12):  # 768 MiB would be needed: the cap is reached well before
        answer = client.post("/reasoners/leak", json={"megabytes": 64})
        outcomes.append(answer.json()["status"])
        if answer.status_code == 500:
            assert answer.json()["error"]["type"] == "MemoryError"
            break
    assert outcomes[-1] == "failed", outcomes
    assert outcomes.count("succeeded") >= 1, outcomes
    assert client.get("/healthz").status_code == 200
    assert client.post("/reasoners/echo", json={"text": "still here"}).status_code == 200
    # A task left pending that raises when cancelled at the very end of the process.
    assert client.post("/reasoners/spawn_failing_task", json={"on_cancel": True}).status_code == 200
    client.close()
    server.signal(signal.SIGTERM)
    code, elapsed = server.wait_exit(timeout=GRACE + 5)
    stderr = server.stderr()
    assert code == 0, stderr
    assert elapsed < GRACE, stderr
    assert "LookupError: raised while being cancelled" in stderr
    _assert_clean(stderr)


@pytest.mark.parametrize("reasoner", ["block_loop", "swallow"])
def test_the_process_ends_inside_the_grace_period(server_factory: Any, reasoner: str) -> None:
    """Blocking the loop leaves only the watchdog (exit 4); swallowing cancellation is
    abandoned (exit 3). Either way the platform's SIGKILL is never needed."""
    server = server_factory("tests_app:agent", *SHORT)
    body: dict[str, Any] = {"seconds": 60}
    if reasoner == "block_loop":
        body["marker"] = "blocked"
    answer = httpx.post(f"{server.url}/reasoners/{reasoner}/async", json=body, timeout=WAIT)
    assert answer.status_code == 202
    if reasoner == "block_loop":
        server.wait_marker("blocked")
    server.signal(signal.SIGTERM)
    code, elapsed = server.wait_exit(timeout=GRACE + 5)
    stderr = server.stderr()
    assert elapsed < GRACE, stderr
    if reasoner == "block_loop":
        assert code == 4, stderr
        assert "watchdog fired" in stderr
    else:
        assert code == 3, stderr
        assert "abandoned" in stderr
    _assert_clean(stderr)
