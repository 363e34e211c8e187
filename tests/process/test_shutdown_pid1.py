"""The shutdown sequence with the server as PID 1, as in a container with an exec-form CMD.

PID 1 ignores every signal it has no handler for, and nothing reaps or forwards for it, so
these runs prove the server relies on no default handler and no shell. `unshare --pid
--fork --mount-proc` makes the server PID 1 of a new PID namespace; signals go to its host
pid (the child of `unshare`, which does not forward them).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.support.process import ServerProcess
from tests.support.shutdown import (
    CLIENT_TIMEOUT,
    FAST,
    WATCHDOG_BUDGET,
    finish,
    get_execution,
    post_sync,
    shutdown_report,
    slow_import_app,
    start_async,
    wait_until,
)

UNSHARE = ["unshare", "--pid", "--fork", "--mount-proc"]


def _unshare_refusal() -> str | None:
    """Why a PID namespace cannot be made here, or None when it can."""
    try:
        probe = subprocess.run(
            [*UNSHARE, "true"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare is not available: {exc}"
    if probe.returncode != 0:
        return f"unshare --pid is not permitted here: {probe.stderr.strip()}"
    return None


REFUSAL = _unshare_refusal()
pytestmark = pytest.mark.skipif(REFUSAL is not None, reason=REFUSAL or "")


class Pid1Server(ServerProcess):
    """`agent-server run` as PID 1 of its own PID namespace; `proc` is the `unshare` process."""

    def __init__(self, args: list[str], env: dict[str, str], marker_dir: Path) -> None:
        super().__init__(args, env, marker_dir)
        self.server_pid = self._child_pid()

    def command(self, args: list[str]) -> list[str]:
        return [*UNSHARE, *super().command(args)]

    def _child_pid(self) -> int:
        """The host pid of the server: the one child of `unshare`."""
        deadline = time.monotonic() + CLIENT_TIMEOUT
        while time.monotonic() < deadline:
            found = subprocess.run(
                ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
            ).stdout.split()
            if found:
                assert len(found) == 1, found
                return int(found[0])
            time.sleep(0.01)
        raise AssertionError(f"no child of unshare after {CLIENT_TIMEOUT}s:\n{self.stderr()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        os.kill(self.server_pid, sig)


Pid1Factory = Callable[..., Pid1Server]


@pytest.fixture
def pid1_factory(tmp_path: Path) -> Iterator[Pid1Factory]:
    """Start servers as PID 1 with `pid1_factory(*args)`; all are killed at the end."""
    started: list[Pid1Server] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> Pid1Server:
        marker_dir = tmp_path / f"pid1-server{len(started)}"
        marker_dir.mkdir()
        server = Pid1Server(list(args), env or {}, marker_dir)
        started.append(server)
        if ready:
            server.wait_ready()
            assert "Started server process [1]" in server.stderr(), server.stderr()
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            os.kill(server.server_pid, signal.SIGKILL)  # PID 1's end ends the namespace
        server.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(4) as executor:
        yield executor


def test_idle_exit_as_pid1(pid1_factory: Pid1Factory) -> None:
    server = pid1_factory("tests_app:agent", *FAST)
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    assert elapsed < 1.5, elapsed
    assert shutdown_report(server)["exit_code"] == 0


def test_drain_as_pid1(pid1_factory: Pid1Factory, pool: ThreadPoolExecutor) -> None:
    server = pid1_factory(
        "tests_app:agent", "--grace-period", "7", "--drain-timeout", "3", "--cancel-timeout", "1"
    )
    short = start_async(server, "sleep", {"seconds": 0.5, "marker": "short"})
    held = post_sync(pool, server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("short")
    server.wait_marker("held")
    server.signal()
    wait_until(
        lambda: httpx.get(f"{server.url}/readyz").status_code == 503, "readyz 503", server, 2.0
    )
    finished = get_execution(server, short, wait=5).json()
    assert (finished["status"], finished["result"]) == ("succeeded", {"slept": 0.5})
    answered = held.result(timeout=CLIENT_TIMEOUT)
    assert answered.status_code == 503
    assert answered.json()["status_reason"] == "shutdown"
    code, elapsed = finish(server, timeout=15)
    assert code == 0, server.stderr()
    assert 3.0 <= elapsed < 3.0 + 0.5 + 1.5, elapsed
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (1, 1, 0)


def test_abandoned_work_as_pid1(pid1_factory: Pid1Factory) -> None:
    server = pid1_factory("tests_app:agent", *FAST)
    start_async(server, "swallow", {"seconds": 600})
    start_async(server, "to_thread_sleep", {"seconds": 600, "marker": "thread"})
    server.wait_marker("thread")
    server.signal()
    code, elapsed = finish(server, timeout=15)
    assert code == 3, server.stderr()
    assert 2.0 <= elapsed < 2.0 + 0.5 + 1.0, elapsed
    report = shutdown_report(server)
    assert (report["cancelled"], report["abandoned"]) == (1, 1)


def test_watchdog_as_pid1(pid1_factory: Pid1Factory) -> None:
    server = pid1_factory(
        "tests_app:agent",
        *WATCHDOG_BUDGET,
    )
    start_async(server, "block_loop", {"seconds": 600, "marker": "blocked"})
    server.wait_marker("blocked")
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 4, server.stderr()
    assert 1.9 <= elapsed < 3.0, elapsed
    assert server.stderr().count("watchdog fired") == 1


def test_signal_before_serving_as_pid1(pid1_factory: Pid1Factory, tmp_path: Path) -> None:
    """PID 1 would ignore a SIGTERM that arrives while the app imports, and hang."""
    app = slow_import_app(tmp_path)
    server = pid1_factory("slow_import:agent", *FAST, env={"PYTHONPATH": str(app)}, ready=False)
    server.wait_marker("importing", timeout=CLIENT_TIMEOUT)
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    assert elapsed < 1.0, elapsed
    assert "SIGTERM before serving" in server.stderr()
