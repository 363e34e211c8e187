"""The push of the shutdown metrics, against small real HTTP receivers on loopback
(tests/support/pushgateway.py): one that answers like a Pushgateway and records what it was
sent, and one that accepts connections and never answers, the worst a gateway can do to an
exiting process.
"""

from __future__ import annotations

import logging
import re
import signal
import socket
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import Agent, Settings
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.pushgateway import (
    EXIT_RESERVE,
    JOB,
    PUSH_TIMEOUT,
    push_bound,
    push_metrics,
    push_shutdown,
)
from tests.apps.tests_app import make_agent
from tests.support.pushgateway import PushReceiver, SilentGateway

SHUTDOWN_FAMILIES = {
    "agent_server_draining",
    "agent_server_shutdown_phase",
    "agent_server_shutdown_started_timestamp_seconds",
    "agent_server_shutdown_duration_seconds",
    "agent_server_shutdown_phase_duration_seconds",
    "agent_server_shutdown_executions",
}


def gave_up(log: str) -> float:
    """Seconds after which the push gave up on a silent gateway, from its log line.

    Either the wait's bound or urllib's socket timeout (the same number) ends it first;
    on a loaded machine the loop may notice a little after the bound.
    """
    found = re.search(r"(?:no answer within|push failed after) (\d+\.\d+)s.*", log)
    assert found is not None, log
    assert "no answer" in found.group(0) or "timed out" in found.group(0), found.group(0)
    return float(found.group(1))


def log_time(log: str, text: str) -> float:
    """The time of the first text-format log line containing `text`."""
    line = next(line for line in log.splitlines() if text in line)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- in process ------------------------------------------------------------------------------


def pushed_by(agent: Agent) -> tuple[str | None, Any, str, float | None]:
    """What the runner hands `push_shutdown` for this agent."""
    started = agent.shutdown.started
    hard_end = None if started is None else agent.shutdown.plan.hard_end(started)
    return agent.settings.pushgateway, agent.metrics.shutdown_registry, agent.name, hard_end


async def test_push_after_a_shutdown_sends_only_the_shutdown_metrics() -> None:
    with PushReceiver() as receiver:
        agent = make_agent(Settings(pushgateway=receiver.url, grace_period=10))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
        ) as client:
            assert (await client.post("/reasoners/echo", json={"text": "x"})).status_code == 200
        agent.shutdown.begin(time.monotonic(), time.time(), "SIGTERM")
        report = await agent.shutdown.run()
        assert await push_shutdown(*pushed_by(agent)) is True
        push = receiver.wait(timeout=5)

    assert len(receiver.pushes) == 1
    assert push.method == "PUT"  # replaces this instance's group as a whole
    assert push.path == f"/metrics/job/{JOB}/agent/tests/instance/{socket.gethostname()}"
    assert push.content_type.startswith("text/plain; version=0.0.4")
    families = {f.name for f in text_string_to_metric_families(push.body)}
    assert families == SHUTDOWN_FAMILIES
    assert push.value("agent_server_draining") == 1
    phase = "agent_server_shutdown_phase"
    assert push.value(phase, **{phase: "stopped"}) == 1
    assert push.value(phase, **{phase: "draining"}) == 0
    assert push.value("agent_server_shutdown_duration_seconds") == pytest.approx(
        report.duration_seconds, abs=1e-3
    )
    assert push.value("agent_server_shutdown_started_timestamp_seconds") > 0
    for name, seconds in report.phase_seconds.items():
        took = push.value("agent_server_shutdown_phase_duration_seconds", phase=name)
        assert took == pytest.approx(seconds, abs=1e-3)
    for outcome in ("finished", "cancelled", "abandoned"):
        assert push.value("agent_server_shutdown_executions_total", outcome=outcome) == 0
    assert "_created" not in push.body


async def test_push_to_a_silent_gateway_returns_by_its_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    with (
        SilentGateway() as gateway,
        caplog.at_level(logging.INFO, "agent_server.pushgateway"),
    ):
        started = time.monotonic()
        pushed = await push_metrics(gateway.url, metrics.shutdown_registry, {"agent": "a"}, 0.4)
        elapsed = time.monotonic() - started
    assert pushed is False
    assert 0.35 <= elapsed < 1.5
    assert 0.35 <= gave_up(caplog.text) <= 1.0


async def test_push_to_a_closed_port_fails_fast_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    metrics = Metrics()
    with caplog.at_level(logging.INFO, "agent_server.pushgateway"):
        started = time.monotonic()
        pushed = await push_metrics(closed_port_url(), metrics.shutdown_registry, {}, 1.0)
        elapsed = time.monotonic() - started
    assert pushed is False
    assert elapsed < 0.9
    assert "push failed" in caplog.text


async def test_push_reports_an_error_status() -> None:
    """A gateway that answers 4xx/5xx is a failure, not a success."""

    class Refusing(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(400)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert await push_metrics(url, Metrics().shutdown_registry, {}, 2.0) is False
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("status", [200, 302])
async def test_no_byte_of_the_gateway_s_answer_is_read(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway whose answer (a success, or a redirect to itself) has a body without end:
    the push ends by its status, reads none of the body and follows no redirect, so the
    gateway's writes soon stop on a closed connection (urllib read a redirect's whole body
    before following it: past the push's bound, until the process ended). Its URL's path
    and query are not logged."""
    ended = threading.Event()
    written: list[int] = []

    class Endless(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(status)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", str(2**40))
            self.end_headers()
            sent = 0
            try:
                while sent < 2**31:
                    self.wfile.write(b"x" * 65_536)
                    sent += 65_536
            except OSError:  # the push closed its connection
                pass
            written.append(sent)
            ended.set()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/gw?token=push-secret"
        with caplog.at_level(logging.INFO, logger="agent_server.pushgateway"):
            pushed = await push_metrics(url, Metrics().shutdown_registry, {}, 2.0)
        assert pushed is (status == 200)
        assert ended.wait(5.0), "the gateway still writing 5 s after the push"
        assert written[0] < 64 * 2**20, written
        assert "push-secret" not in caplog.text and "/gw" not in caplog.text
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def test_nothing_is_pushed_without_time_or_without_a_shutdown() -> None:
    with PushReceiver() as receiver:
        assert await push_metrics(receiver.url, Metrics().shutdown_registry, {}, 0.0) is False
        agent = make_agent(Settings(pushgateway=receiver.url))
        assert await push_shutdown(*pushed_by(agent)) is False  # no shutdown has begun
        assert await push_shutdown(*pushed_by(make_agent())) is False  # no gateway configured
        assert receiver.pushes == []


def test_push_bound_keeps_the_exit_before_the_watchdog() -> None:
    now = 100.0
    assert push_bound(now + 30, now) == PUSH_TIMEOUT
    assert push_bound(now + 0.75 + EXIT_RESERVE, now) == pytest.approx(0.75)
    assert push_bound(now + EXIT_RESERVE / 2, now) == 0.0
    assert push_bound(now - 5, now) == 0.0


# -- a real process ------------------------------------------------------------------------


def test_silent_gateway_does_not_delay_an_idle_exit_past_the_bound(server_factory: Any) -> None:
    with SilentGateway() as gateway:
        server = server_factory("tests_app:agent", "--pushgateway", gateway.url)
        server.signal(signal.SIGTERM)
        code, elapsed = server.wait_exit(timeout=10)
    assert code == 0, server.stderr()
    assert PUSH_TIMEOUT - 0.05 <= gave_up(server.stderr()) <= PUSH_TIMEOUT + 0.6
    # idle exit (under 0.5 s) + the push bound, with room for a loaded machine
    assert elapsed < PUSH_TIMEOUT + 2.0, server.stderr()


def test_push_is_cut_short_to_stay_inside_the_watchdog(server_factory: Any) -> None:
    """Work runs to the drain deadline, so little is left before the watchdog: the push
    gets only that, and the process still exits on its own (not by the watchdog)."""
    with SilentGateway() as gateway:
        # derived drain: 4 - 0.5 cancel - 0.5 http - 1 margin = 2 s; watchdog at 3 s
        server = server_factory(
            "tests_app:agent",
            "--grace-period", "4",
            "--cancel-timeout", "0.5",
            "--http-timeout", "0.5",
            "--pushgateway", gateway.url,
        )  # fmt: skip
        started = httpx.post(
            f"{server.url}/reasoners/sleep/async",
            json={"seconds": 600, "marker": "long"},
            timeout=5,
        )
        assert started.status_code == 202
        server.wait_marker("long")
        server.signal(signal.SIGTERM)
        code, elapsed = server.wait_exit(timeout=15)
    stderr = server.stderr()
    assert code == 0, stderr  # 4 would mean the watchdog had to end it
    assert gave_up(stderr) < PUSH_TIMEOUT - 0.05, stderr  # cut to the time left
    # the push gave up EXIT_RESERVE before the watchdog (grace 4 - margin 1 = 3 s after the
    # signal), give or take a loaded machine's timer latency; unclamped it would end near
    # 3.2 s. "shutdown began" is logged just after the signal, so this bound is safe.
    began, pushed = (log_time(stderr, text) for text in ("shutdown began", "pushgateway"))
    assert pushed - began <= 3.0 - EXIT_RESERVE + 0.3, stderr
    assert elapsed < 4.0, stderr  # within the grace period


def test_abandoned_work_is_pushed_before_the_process_ends_itself(server_factory: Any) -> None:
    with PushReceiver() as receiver:
        server = server_factory(
            "tests_app:agent",
            "--grace-period", "10",
            "--drain-timeout", "0.5",
            "--cancel-timeout", "0.5",
            "--pushgateway", receiver.url,
        )  # fmt: skip
        started = httpx.post(f"{server.url}/reasoners/swallow/async", json={}, timeout=5)
        assert started.status_code == 202
        server.signal(signal.SIGTERM)
        code, _ = server.wait_exit(timeout=15)
        assert code == 3, server.stderr()  # work abandoned
        push = receiver.wait(timeout=1)
    assert push.value("agent_server_shutdown_executions_total", outcome="abandoned") == 1
    assert push.value("agent_server_shutdown_executions_total", outcome="cancelled") == 0
    assert "shutdown metrics pushed" in server.stderr()
