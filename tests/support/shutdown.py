"""What the shutdown tests read of a real process: its budget flags, its one shutdown report,
its phase, what it runs, and stderr free of asyncio's complaints; and the calls that put work
in flight before the signal."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from tests.support.process import ServerProcess

#: A budget that fits a 6 s grace period: 0 + 1 + 1 + 0.5 + 1 (margin) <= 6; watchdog at 5 s.
FAST = (
    *("--grace-period", "6", "--drain-timeout", "1"),
    *("--cancel-timeout", "1", "--http-timeout", "0.5"),
)
#: Lines asyncio prints when a task's end went unobserved; no shutdown path may cause them.
ASYNCIO_COMPLAINTS = ("never retrieved", "destroyed but it is pending")
REPORT_MARK = "shutdown report: "
#: Every client call is bounded; long enough for a loaded machine, short enough to fail fast.
CLIENT_TIMEOUT = 15.0


def assert_clean_stderr(server: ServerProcess) -> None:
    """No unobserved task ended in this process (asserted by every process test)."""
    text = server.stderr()
    for complaint in ASYNCIO_COMPLAINTS:
        assert complaint not in text, text


def shutdown_report(server: ServerProcess) -> dict[str, Any]:
    """The one shutdown report of a text-format process, parsed."""
    lines = [line for line in server.stderr().splitlines() if REPORT_MARK in line]
    assert len(lines) == 1, server.stderr()
    report: dict[str, Any] = json.loads(lines[0].split(REPORT_MARK, 1)[1])
    return report


def wait_until(check: Callable[[], bool], what: str, server: ServerProcess, timeout: float) -> None:
    """Poll `check` until true; fail with the server's stderr after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen in {timeout}s:\n{server.stderr()}")
        time.sleep(0.01)


def phase(server: ServerProcess) -> str:
    response = httpx.get(f"{server.url}/healthz", timeout=CLIENT_TIMEOUT)
    assert response.status_code == 200
    return str(response.json()["phase"])


def wait_phase(server: ServerProcess, name: str, timeout: float = 5.0) -> None:
    wait_until(lambda: phase(server) == name, f"phase {name}", server, timeout)


def running(server: ServerProcess) -> int:
    listed = httpx.get(
        f"{server.url}/executions", params={"status": "running"}, timeout=CLIENT_TIMEOUT
    )
    assert listed.status_code == 200, listed.text
    return len(listed.json())


def wait_running(server: ServerProcess, count: int) -> None:
    wait_until(lambda: running(server) == count, f"{count} running", server, CLIENT_TIMEOUT)


def wait_stderr(server: ServerProcess, text: str, timeout: float = 10.0) -> None:
    wait_until(lambda: text in server.stderr(), repr(text), server, timeout)


def start_async(server: ServerProcess, reasoner: str, body: dict[str, Any]) -> str:
    """Start background work; returns its execution id."""
    response = httpx.post(
        f"{server.url}/reasoners/{reasoner}/async", json=body, timeout=CLIENT_TIMEOUT
    )
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


def get_execution(server: ServerProcess, execution_id: str, wait: float = 0) -> httpx.Response:
    return httpx.get(
        f"{server.url}/executions/{execution_id}",
        params={"wait": wait} if wait else None,
        timeout=CLIENT_TIMEOUT + wait,
    )


def post_sync(
    pool: ThreadPoolExecutor, server: ServerProcess, reasoner: str, body: dict[str, Any]
) -> Future[httpx.Response]:
    return pool.submit(
        httpx.post, f"{server.url}/reasoners/{reasoner}", json=body, timeout=CLIENT_TIMEOUT
    )


def finish(server: ServerProcess, timeout: float) -> tuple[int, float]:
    """Wait for the exit; every process test checks stderr for asyncio complaints."""
    code, elapsed = server.wait_exit(timeout=timeout)
    assert_clean_stderr(server)
    return code, elapsed


#: Budget 0 + 0.5 + 0.5 + 0.5 + 1 <= 3: the watchdog fires at 3 - 1 = 2 s.
WATCHDOG_BUDGET = (
    *("--grace-period", "3", "--drain-timeout", "0.5", "--cancel-timeout", "0.5"),
    *("--http-timeout", "0.5"),
)


#: The lifespan drain's budget, from the environment: drain 1 s, cancel 1 s.
BUDGET = {
    "AGENT_SERVER_GRACE_PERIOD": "6",
    "AGENT_SERVER_DRAIN_TIMEOUT": "1",
    "AGENT_SERVER_CANCEL_TIMEOUT": "1",
}


def slow_import_app(tmp_path: Path) -> Path:
    """A folder with `slow_import.py`, whose import marks "importing" and then takes 30 s."""
    app = tmp_path / "slow_app"
    app.mkdir()
    (app / "slow_import.py").write_text(
        textwrap.dedent(
            """
            import os, pathlib, time
            pathlib.Path(os.environ["TESTS_MARKER_DIR"], "importing").touch()
            time.sleep(30)
            from tests_app import agent
            """
        )
    )
    return app
