"""Plain `python -m uvicorn tests_app:agent`: the lifespan shutdown drains, bounded.

uvicorn closes its listener at once on SIGTERM, waits for open connections (bounded only by
its `--timeout-graceful-shutdown`), then runs the lifespan shutdown, where the Agent runs
the drain, cancel and settle phases with the budget of its AGENT_SERVER_* environment and
logs the report. Nothing may hang afterwards: abandoned work or a thread still in a
blocking call ends the process instead of holding `asyncio.run`'s cleanup forever.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.process import ServerProcess
from tests.support.shutdown import (
    BUDGET,
    CLIENT_TIMEOUT,
    finish,
    post_sync,
    shutdown_report,
    start_async,
)


class UvicornProcess(ServerProcess):
    """`python -m uvicorn tests_app:agent` on a free loopback port (cwd: tests/apps/)."""

    def __init__(self, args: list[str], env: dict[str, str], marker_dir: Path) -> None:
        super().__init__(args, {**BUDGET, **env}, marker_dir)

    def command(self, args: list[str]) -> list[str]:
        return [sys.executable, "-m", "uvicorn", "tests_app:agent", "--port", "0", *args]


UvicornFactory = Callable[..., UvicornProcess]


@pytest.fixture
def uvicorn_factory(tmp_path: Path) -> Iterator[UvicornFactory]:
    started: list[UvicornProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> UvicornProcess:
        marker_dir = tmp_path / f"uvicorn{len(started)}"
        marker_dir.mkdir()
        server = UvicornProcess(list(args), env or {}, marker_dir)
        started.append(server)
        server.wait_ready()
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def test_idle_uvicorn_exits_with_a_report(uvicorn_factory: UvicornFactory) -> None:
    server = uvicorn_factory()
    server.signal()
    code, elapsed = finish(server, timeout=10)
    # uvicorn re-raises the SIGTERM it caught once it has finished: the status says so.
    assert code == -signal.SIGTERM, server.stderr()
    assert elapsed < 1.5, elapsed
    report = shutdown_report(server)
    assert report["signal"] is None  # the lifespan, not a signal, started this drain
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 0, 0)


def test_background_work_is_drained_then_cancelled(uvicorn_factory: UvicornFactory) -> None:
    server = uvicorn_factory()
    start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    start_async(server, "cooperative", {"seconds": 600})
    server.wait_marker("held")
    # Under plain uvicorn the drain begins only after uvicorn's own first steps: started
    # just before the signal, this sleep ends inside the drain, not before it.
    start_async(server, "sleep", {"seconds": 0.8, "marker": "short"})
    server.wait_marker("short")
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == -signal.SIGTERM, server.stderr()
    report = shutdown_report(server)
    # The short sleep and the cooperative one finish inside the drain; the held one is
    # cancelled at its 1 s deadline.
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (2, 1, 0)
    assert 0.95 <= report["phases"]["cancelling"] < 1.3, report
    assert 1.0 <= elapsed < 1.0 + 1.5, elapsed


def test_work_swallowing_cancellation_ends_the_process(uvicorn_factory: UvicornFactory) -> None:
    server = uvicorn_factory()
    start_async(server, "swallow", {"seconds": 600})
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 3, server.stderr()
    assert 2.0 <= elapsed < 2.0 + 1.5, elapsed
    assert shutdown_report(server)["abandoned"] == 1
    assert "exiting with abandoned work still running (exit code 3)" in server.stderr()


def test_a_thread_in_a_blocking_call_does_not_hold_the_exit(
    uvicorn_factory: UvicornFactory,
) -> None:
    server = uvicorn_factory()
    start_async(server, "to_thread_sleep", {"seconds": 600, "marker": "thread"})
    server.wait_marker("thread")
    server.signal()
    # Without the bound, asyncio.run would wait for the default executor for ten minutes.
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    assert shutdown_report(server)["cancelled"] == 1
    # Drain 1 s, then the thread gets the cancel timeout (1 s) before the process ends.
    assert 2.0 <= elapsed < 2.0 + 1.5, elapsed
    assert "not ending after the shutdown: thread" in server.stderr()


def test_synchronous_request_is_bounded_by_uvicorns_timeout(
    uvicorn_factory: UvicornFactory, pool: ThreadPoolExecutor
) -> None:
    """uvicorn waits for open requests before the lifespan runs: only its own
    `--timeout-graceful-shutdown` bounds that wait (without it, a long synchronous request
    holds the shutdown until it ends)."""
    server = uvicorn_factory("--timeout-graceful-shutdown", "1")
    request = post_sync(pool, server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    server.signal()
    started = time.monotonic()
    # At its timeout uvicorn cancels the request's task: the agent answers 503 (retry
    # elsewhere) and cancels the run nobody waits for any more (client_disconnected).
    # `agent-server run` answers 503 + the execution instead: it drains before closing.
    answer = request.result(timeout=CLIENT_TIMEOUT)
    assert answer.status_code == 503 and answer.json() == {"detail": "server is shutting down"}
    assert answer.headers["connection"] == "close"
    assert time.monotonic() - started < 1.0 + 1.5
    code, elapsed = finish(server, timeout=10)
    assert code == -signal.SIGTERM, server.stderr()
    # uvicorn's 1 s; the cancelled run then settles at once, not at the drain's deadline.
    assert 1.0 <= elapsed < 1.0 + 1.5, elapsed
    report = shutdown_report(server)
    # It ended during the drain, cancelled by its request's end rather than by the drain.
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (1, 0, 0)
    assert "Traceback" not in server.stderr()
