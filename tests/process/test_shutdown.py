"""The shutdown sequence of `agent-server run`, proven on real processes with real signals.

Every test starts `agent-server run tests_app:agent` on a loopback port, puts work in flight,
signals it and checks what clients saw, what the shutdown report says, the exit code, the
time from the first signal to the exit, and that stderr holds no asyncio complaint. Bounds
leave the margins a loaded two-core machine keeps; the budgets are small so the file runs
in well under a minute.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from agent_server.process.launcher import run_command
from tests.support.process import APPS_DIR, ServerProcess
from tests.support.shutdown import (
    ASYNCIO_COMPLAINTS,
    CLIENT_TIMEOUT,
    FAST,
    REPORT_MARK,
    WATCHDOG_BUDGET,
    finish,
    get_execution,
    phase,
    post_sync,
    shutdown_report,
    slow_import_app,
    start_async,
    wait_phase,
    wait_running,
    wait_stderr,
    wait_until,
)

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    """Threads for synchronous requests that stay open across the signal."""
    with ThreadPoolExecutor(8) as executor:
        yield executor


# -- idle ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_idle_process_exits_at_once(server_factory: ServerFactory, sig: signal.Signals) -> None:
    server = server_factory("tests_app:agent", *FAST)
    assert httpx.post(f"{server.url}/reasoners/echo", json={"text": "x"}).status_code == 200
    server.signal(sig)
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    # docs/shutdown.md: within half a second; 1.5 s leaves room for a loaded machine.
    assert elapsed < 1.5, (elapsed, server.stderr())
    report = shutdown_report(server)
    assert report["signal"] == sig.name
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 0, 0)
    assert report["exit_code"] == 0
    assert report["duration_seconds"] < 0.5


# -- work that finishes, cooperates, or is cancelled ---------------------------------------


def test_work_finishing_inside_the_drain_is_answered(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    # A 20 s drain that a second signal ends once the checks are done: no race with the
    # machine's speed.
    server = server_factory(
        "tests_app:agent", "--grace-period", "30", "--drain-timeout", "20", "--cancel-timeout", "1"
    )
    short = start_async(server, "sleep", {"seconds": 1.0, "marker": "short"})
    sync = post_sync(pool, server, "sleep", {"seconds": 1.0, "marker": "sync"})
    held = post_sync(pool, server, "sleep", {"seconds": 600, "marker": "held"})
    for marker in ("short", "held", "sync"):
        server.wait_marker(marker)
    server.signal()

    # During the drain: the result is retrievable (long-poll) and the sync caller gets 200.
    finished = get_execution(server, short, wait=5)
    assert finished.status_code == 200
    assert finished.json()["status"] == "succeeded"
    assert finished.json()["result"] == {"slept": 1.0}
    assert finished.headers["connection"] == "close"
    answered = sync.result(timeout=CLIENT_TIMEOUT)
    assert answered.status_code == 200
    assert answered.json()["result"] == {"slept": 1.0}
    assert phase(server) == "draining"
    assert httpx.get(f"{server.url}/readyz").status_code == 503
    assert get_execution(server, short).json()["result"] == {"slept": 1.0}  # still there
    assert not held.done()

    server.signal()  # the held one is cancelled now; its caller gets 503 and its execution
    ended = held.result(timeout=CLIENT_TIMEOUT)
    assert ended.status_code == 503
    assert (ended.json()["status"], ended.json()["status_reason"]) == ("cancelled", "shutdown")
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (2, 1, 0)


def test_cooperative_reasoners_return_early(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    server = server_factory(
        "tests_app:agent", "--grace-period", "12", "--drain-timeout", "8", "--cancel-timeout", "1"
    )
    background = start_async(server, "cooperative", {"seconds": 60})
    sync = post_sync(pool, server, "cooperative", {"seconds": 60})
    wait_running(server, 2)
    server.signal()
    answered = sync.result(timeout=CLIENT_TIMEOUT)
    assert answered.status_code == 200
    assert answered.json()["result"]["stopped_early"] is True
    code, elapsed = finish(server, timeout=15)
    assert code == 0, server.stderr()
    # Both returned at the signal, far before the 8 s drain deadline.
    assert elapsed < 2.5, elapsed
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (2, 0, 0)
    assert background  # its record went with the process; the report counted it


def test_work_is_cancelled_at_the_deadline(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    server = server_factory("tests_app:agent", *FAST)
    held = start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    cleanup = start_async(server, "deferred_cleanup", {"cleanup": 0.3})
    sync = post_sync(pool, server, "sleep", {"seconds": 600, "marker": "sync"})
    server.wait_marker("held")
    server.wait_marker("sync")
    server.signal()

    answered = sync.result(timeout=CLIENT_TIMEOUT)
    assert answered.status_code == 503
    assert answered.headers["retry-after"] == "1"
    assert answered.headers["connection"] == "close"
    body = answered.json()
    assert (body["status"], body["status_reason"]) == ("cancelled", "shutdown")
    assert body["reasoner"] == "sleep" and body["finished_at"] is not None
    code, elapsed = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 3, 0)
    # deferred_cleanup settles 0.3 s after the cancellation at +1 s.
    assert 1.25 <= report["phases"]["stopped"] < 1.0 + 1.0, report
    assert 1.3 <= elapsed < 1.3 + 0.5 + 1.5, elapsed
    assert held and cleanup  # their records went with the process; the report counted them


def test_work_swallowing_cancellation_is_abandoned(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    server = server_factory("tests_app:agent", *FAST)
    swallower = start_async(server, "swallow", {"seconds": 600})
    start_async(server, "thread_sleep", {"seconds": 600})
    sync = post_sync(pool, server, "swallow", {"seconds": 600})
    wait_running(server, 3)
    server.signal()
    poll = pool.submit(get_execution, server, swallower, 10)

    answered = sync.result(timeout=CLIENT_TIMEOUT)
    assert answered.status_code == 503
    assert answered.headers["retry-after"] == "1"
    assert (answered.json()["status"], answered.json()["status_reason"]) == (
        "cancelled",
        "shutdown",
    )
    polled = poll.result(timeout=CLIENT_TIMEOUT).json()
    assert (polled["status"], polled["status_reason"]) == ("cancelled", "shutdown")

    code, elapsed = finish(server, timeout=15)
    assert code == 3, server.stderr()
    # unready 0 + drain 1 + cancel 1, then the http phase (0.5) and a margin for the exit.
    assert 2.0 <= elapsed < 2.0 + 0.5 + 1.0, elapsed
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 0, 3)
    assert report["exit_code"] == 3
    assert 1.95 <= report["phases"]["stopped"] < 2.3, report
    assert server.stderr().count("abandoned: it did not settle") == 3


# -- the watchdog and repeated signals -----------------------------------------------------


def test_watchdog_ends_a_blocked_event_loop(server_factory: ServerFactory) -> None:
    server = server_factory(
        "tests_app:agent",
        *WATCHDOG_BUDGET,
    )
    start_async(server, "block_loop", {"seconds": 600, "marker": "blocked"})
    server.wait_marker("blocked")
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 4, server.stderr()
    assert 1.9 <= elapsed < 2.0 + 1.0, elapsed
    lines = [line for line in server.stderr().splitlines() if "watchdog fired" in line]
    assert len(lines) == 1, server.stderr()
    assert "CRITICAL" in lines[0] and "exiting with code 4" in lines[0]
    # Its account: the loop never turned after the signal, so no phase began.
    assert "the shutdown never began" in lines[0], lines[0]
    assert "1 execution still running here" in lines[0], lines[0]
    assert REPORT_MARK not in server.stderr()


def test_second_signal_skips_to_cancel(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    server = server_factory(
        "tests_app:agent", "--grace-period", "40", "--drain-timeout", "30", "--cancel-timeout", "2"
    )
    held = post_sync(pool, server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    server.signal()
    wait_phase(server, "draining")
    server.signal()
    ended = held.result(timeout=CLIENT_TIMEOUT)
    assert ended.status_code == 503
    assert (ended.json()["status"], ended.json()["status_reason"]) == ("cancelled", "shutdown")
    code, elapsed = finish(server, timeout=15)
    assert code == 0, server.stderr()
    assert elapsed < 3.0, elapsed  # not the 30 s drain
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 1, 0)
    assert "second signal" in server.stderr()


def test_third_signal_exits_at_once(server_factory: ServerFactory) -> None:
    server = server_factory(
        "tests_app:agent",
        *("--grace-period", "40", "--drain-timeout", "5", "--cancel-timeout", "30"),
    )
    start_async(server, "swallow", {"seconds": 600})
    wait_running(server, 1)
    server.signal()
    wait_phase(server, "draining")
    server.signal()
    wait_phase(server, "cancelling")  # the swallower holds the settle for 30 s
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code, _ = finish(server, timeout=10)
    assert code == 5, server.stderr()
    assert time.monotonic() - sent < 1.0
    assert "third signal" in server.stderr()


# -- admission, readiness and what stays served during the drain -------------------------


def test_unready_window_then_admission_closes(server_factory: ServerFactory) -> None:
    # Budget 3 + 20 + 1 + 0.5 + 1 <= 30; a second signal ends the drain after the checks.
    server = server_factory(
        "tests_app:agent",
        *("--grace-period", "30", "--unready-delay", "3", "--drain-timeout", "20"),
        *("--cancel-timeout", "1", "--http-timeout", "0.5"),
    )
    start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    server.signal()
    wait_until(
        lambda: httpx.get(f"{server.url}/readyz").status_code == 503, "readyz 503", server, 2.0
    )
    assert phase(server) == "unready"
    accepted = httpx.post(f"{server.url}/reasoners/echo", json={"text": "late"})
    assert accepted.status_code == 200, accepted.text
    assert accepted.headers["connection"] == "close"
    assert phase(server) == "unready", "the 3 s unready window passed before the request"

    wait_phase(server, "draining")
    rejected = [httpx.post(f"{server.url}/reasoners/echo", json={"text": "x"}) for _ in range(2)]
    for response in rejected:
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.headers["connection"] == "close"
        assert response.json() == {"detail": "server is shutting down"}
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'agent_server_requests_rejected_total{reason="draining"} 2.0' in metrics

    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert report["rejected"] == 2
    assert (report["finished"], report["cancelled"]) == (1, 1)  # the echo, the held sleep
    # Admission closed at signal + unready, on the clock that started at the signal.
    assert 2.95 <= report["phases"]["draining"] < 3.3, report


def test_status_cancel_list_metrics_and_health_are_served_during_the_drain(
    server_factory: ServerFactory, pool: ThreadPoolExecutor
) -> None:
    server = server_factory(
        "tests_app:agent", "--grace-period", "30", "--drain-timeout", "20", "--cancel-timeout", "1"
    )
    first = start_async(server, "sleep", {"seconds": 600, "marker": "first"})
    second = start_async(server, "sleep", {"seconds": 600, "marker": "second"})
    server.wait_marker("first")
    server.wait_marker("second")
    server.signal()
    wait_phase(server, "draining")
    poll = pool.submit(get_execution, server, second, 20)

    assert get_execution(server, first).json()["status"] == "running"
    cancelled = httpx.post(f"{server.url}/executions/{first}/cancel")
    assert cancelled.status_code == 202
    ended = get_execution(server, first, wait=5).json()
    assert (ended["status"], ended["status_reason"]) == ("cancelled", "request")
    listed = httpx.get(f"{server.url}/executions", params={"status": "running"})
    assert [e["execution_id"] for e in listed.json()] == [second]
    assert listed.headers["connection"] == "close"
    health = httpx.get(f"{server.url}/healthz")
    assert health.status_code == 200 and health.json()["phase"] == "draining"
    metrics = httpx.get(f"{server.url}/metrics").text
    assert "agent_server_draining 1.0" in metrics
    assert 'agent_server_shutdown_phase{agent_server_shutdown_phase="draining"} 1.0' in metrics
    assert not poll.done()  # the long-poll is still open, waiting for the execution's end

    server.signal()  # cancel now rather than at the 20 s deadline
    polled = poll.result(timeout=CLIENT_TIMEOUT).json()
    assert (polled["status"], polled["status_reason"]) == ("cancelled", "shutdown")
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    # The request-cancelled one ended during the drain: counted as finished by the drain.
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (1, 1, 0)


def test_json_report(server_factory: ServerFactory) -> None:
    server = server_factory("tests_app:agent", *FAST, "--log-format", "json")
    start_async(server, "swallow", {"seconds": 600})
    wait_running(server, 1)
    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == 3
    lines = [json.loads(line) for line in server.stderr().splitlines() if line.startswith("{")]
    assert lines and len(lines) == len(server.stderr().splitlines()), server.stderr()
    reports = [line for line in lines if line["message"] == "shutdown report"]
    assert len(reports) == 1
    report = reports[0]["report"]
    assert reports[0]["logger"] == "agent_server.shutdown" and reports[0]["level"] == "info"
    assert report["signal"] == "SIGTERM"
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 0, 1)
    assert report["exit_code"] == 3
    assert set(report["phases"]) == {"unready", "draining", "cancelling", "stopped"}
    assert report["plan"] == {
        "unready_delay": 0.0,
        "drain_timeout": 1.0,
        "cancel_timeout": 1.0,
        "http_timeout": 0.5,
        "grace_period": 6.0,
        "margin": 1.0,
    }


# -- the listener: closed after the report, accepted requests answered -----------------------


def test_request_arriving_after_the_report_is_answered_not_reset(
    server_factory: ServerFactory,
) -> None:
    # http-timeout 5: the connection below is given that long after the report.
    server = server_factory(
        "tests_app:agent",
        *("--grace-period", "8", "--drain-timeout", "0.5", "--cancel-timeout", "0.5"),
        *("--http-timeout", "5"),
    )
    start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    body = json.dumps({"text": "late"}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT) as conn:
        head = (
            f"POST /reasoners/echo HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        conn.sendall(head + body[:3])  # accepted, but its body is not complete
        server.signal()
        wait_stderr(server, REPORT_MARK)
        # The listening socket is closed now: new connections are refused ...
        wait_until(lambda: not _connects(server.port), "listener closed", server, 2.0)
        # ... but the request already accepted gets its answer.
        conn.sendall(body[3:])
        answer = _read_response(conn)
    assert answer.startswith(b"HTTP/1.1 503 "), answer
    assert b"connection: close" in answer.lower()
    assert b"retry-after: 1" in answer.lower()
    code, _ = finish(server, timeout=15)
    assert code == 0, server.stderr()


def _connects(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _read_response(conn: socket.socket) -> bytes:
    """Read until the server closes the connection (it answers with Connection: close)."""
    chunks: list[bytes] = []
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _read_one_response(conn: socket.socket) -> bytes:
    """Read one response with a Content-Length body from a kept-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = conn.recv(65536)
        assert chunk, data
        body += chunk
    return head + b"\r\n\r\n" + body


def test_idle_keep_alive_connection_is_closed_cleanly(server_factory: ServerFactory) -> None:
    server = server_factory("tests_app:agent", *FAST)
    with socket.create_connection(("127.0.0.1", server.port), timeout=CLIENT_TIMEOUT) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = _read_one_response(conn)
        assert first.startswith(b"HTTP/1.1 200 ") and first.endswith(b"}"), first
        server.signal()
        # The server closes the idle connection with a FIN, never a reset.
        assert conn.recv(65536) == b""
    code, elapsed = finish(server, timeout=10)
    assert code == 0 and elapsed < 1.5, (code, elapsed, server.stderr())


# -- startup, and what asyncio.run would otherwise wait for ----------------------------------


def test_signal_while_the_app_is_still_importing(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    app = slow_import_app(tmp_path)
    server = server_factory("slow_import:agent", *FAST, env={"PYTHONPATH": str(app)}, ready=False)
    server.wait_marker("importing", timeout=CLIENT_TIMEOUT)
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    assert elapsed < 1.0, elapsed
    assert "before serving" in server.stderr()


def test_signals_a_parent_left_blocked_still_reach_the_server(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    """A process inherits the signal mask of the thread that started it: a supervisor (or a
    test runner's worker thread) that blocks SIGTERM would leave the server deaf to it, the
    import never interrupted and the pod waiting for SIGKILL. The server unblocks them."""
    app = slow_import_app(tmp_path)

    def start_blocked() -> ServerProcess:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        return server_factory("slow_import:agent", *FAST, env={"PYTHONPATH": str(app)}, ready=False)

    with ThreadPoolExecutor(1) as pool:
        server = pool.submit(start_blocked).result(timeout=CLIENT_TIMEOUT)
    server.wait_marker("importing", timeout=CLIENT_TIMEOUT)
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    blocked = [line for line in status.splitlines() if line.startswith("SigBlk")]
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 0, (server.stderr(), blocked)
    assert elapsed < 1.0, elapsed
    assert "SIGTERM before serving" in server.stderr()


def test_stray_task_and_thread_do_not_hold_the_exit(server_factory: ServerFactory) -> None:
    server = server_factory("tests_app:agent", *FAST)
    stray = start_async(server, "spawn_stubborn_task", {})
    threaded = start_async(server, "to_thread_sleep", {"seconds": 600, "marker": "thread"})
    server.wait_marker("thread")
    assert get_execution(server, stray, wait=5).json()["status"] == "succeeded"
    server.signal()
    code, elapsed = finish(server, timeout=15)
    # The to_thread execution settled when cancelled (its thread runs on): exit 0, as reported.
    assert code == 0, server.stderr()
    report = shutdown_report(server)
    assert (report["finished"], report["cancelled"], report["abandoned"]) == (0, 1, 0)
    # drain 1 s, then the stray task and thread get at most the cancel timeout (1 s).
    assert 1.0 <= elapsed < 1.0 + 0.5 + 1.0 + 1.5, elapsed
    text = server.stderr()
    assert "not ending" in text, text
    assert threaded


def test_signal_during_the_lifespan_startup(server_factory: ServerFactory, tmp_path: Path) -> None:
    """The loop runs but nothing listens yet: the shutdown runs as soon as startup ends."""
    app = tmp_path / "slow_start"
    app.mkdir()
    (app / "slow_start.py").write_text(
        textwrap.dedent(
            """
            import asyncio, contextlib, os, pathlib
            from agent_server import Agent
            import tests_app

            class SlowStart(Agent):
                @contextlib.asynccontextmanager
                async def lifespan(self, app):
                    pathlib.Path(os.environ["TESTS_MARKER_DIR"], "starting").touch()
                    await asyncio.sleep(1.5)
                    async with super().lifespan(app):
                        yield

            agent = SlowStart("slow")
            for func in tests_app.REASONERS:
                agent.reasoner()(func)
            """
        )
    )
    server = server_factory("slow_start:agent", *FAST, env={"PYTHONPATH": str(app)}, ready=False)
    server.wait_marker("starting", timeout=CLIENT_TIMEOUT)
    server.signal()
    code, elapsed = finish(server, timeout=10)
    assert code == 0, server.stderr()
    # After the 1.5 s startup it drains nothing; well before the watchdog (5 s).
    assert elapsed < 4.5, elapsed
    report = shutdown_report(server)
    assert report["signal"] == "SIGTERM" and report["exit_code"] == 0
    assert 1.4 <= report["duration_seconds"] < 1.5 + 1.0, report


def test_startup_failure_exits_1_not_3(tmp_path: Path) -> None:
    """uvicorn exits 3 when it cannot start; 3 means abandoned work here, so it becomes 1."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            run_command("tests_app:agent", port=port),
            cwd=APPS_DIR,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert "address already in use" in result.stderr
    for complaint in ASYNCIO_COMPLAINTS:
        assert complaint not in result.stderr


def test_signal_after_the_shutdown_exits_with_the_reported_code(
    server_factory: ServerFactory,
) -> None:
    """While the process waits for a thread it cannot stop, another signal ends it at once."""
    server = server_factory("tests_app:agent", *FAST)
    start_async(server, "to_thread_sleep", {"seconds": 600, "marker": "thread"})
    server.wait_marker("thread")
    server.signal()
    wait_stderr(server, "Finished server process")  # the thread now gets the cancel timeout
    sent = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    code, _ = finish(server, timeout=10)
    assert code == 0, server.stderr()
    assert time.monotonic() - sent < 0.8
    assert "SIGTERM after the shutdown (exit code 0)" in server.stderr()
    assert "not ending" not in server.stderr()  # it did not wait out the cancel timeout
