"""The shutdown told by its metrics: read while the drain runs, and pushed at its end.

In process, the phases are watched through GET /metrics while the shutdown sequence runs.
End to end, a real `agent-server run` process gets a real SIGTERM; /metrics, /healthz and
/readyz are scraped over loopback during its drain, and the final counts arrive at a real
HTTP receiver standing in for the Pushgateway.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import Settings
from agent_server.runtime.pushgateway import JOB
from tests.apps.tests_app import make_agent
from tests.support.pushgateway import PushReceiver

P = "agent_server_"
PHASES = ["serving", "unready", "draining", "cancelling", "stopped"]


class Reading:
    """One parsed /metrics text."""

    def __init__(self, text: str) -> None:
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(P + name, frozenset(labels.items()))]

    @property
    def phase(self) -> str:
        label = P + "shutdown_phase"
        current = [p for p in PHASES if self("shutdown_phase", **{label: p}) == 1]
        assert len(current) == 1, current
        return current[0]

    def shutdown(self, outcome: str) -> float:
        return self("shutdown_executions_total", outcome=outcome)


async def test_phases_and_counters_move_through_an_in_process_shutdown() -> None:
    """serving -> unready -> draining -> cancelling -> stopped, each phase long enough to be
    seen, with one execution finishing, one cancelled and settling, one abandoned."""
    # wide margins: a scrape of every series blocks the loop for tens of milliseconds
    settings = Settings(
        unready_delay=0.8, drain_timeout=1.5, cancel_timeout=2.0, http_timeout=0, grace_period=10
    )
    agent = make_agent(settings)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:

        async def read() -> Reading:
            return Reading((await client.get("/metrics")).text)

        for reasoner, body in (
            ("sleep", {"seconds": 1.2}),  # ends during the drain: finished
            ("deferred_cleanup", {"cleanup": 0.3}),  # cancelled, settles in time
            ("swallow", {"seconds": 6.0}),  # never settles: abandoned at +4.3 s
        ):
            assert (await client.post(f"/reasoners/{reasoner}/async", json=body)).status_code == 202
        await asyncio.sleep(0)  # one loop turn: every execution has taken its first step
        assert (await read()).phase == "serving"

        wall = time.time()
        agent.shutdown.begin(time.monotonic(), wall, "SIGTERM")
        run = asyncio.create_task(agent.shutdown.run())
        seen: list[str] = []
        finished_while_draining = 0.0
        deadline = time.monotonic() + 10
        while True:
            reading = await read()
            if not seen or seen[-1] != reading.phase:
                seen.append(reading.phase)
            if reading.phase == "draining":
                finished_while_draining = max(finished_while_draining, reading.shutdown("finished"))
            if reading.phase == "stopped":
                break
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.1)  # each phase lasts 0.8 s or more
        report = await run

        assert seen == PHASES[1:]
        assert finished_while_draining == 1  # the counter moved before the report
        final = await read()
        assert final("draining") == 1
        assert abs(final("shutdown_started_timestamp_seconds") - wall) < 1e-3
        assert abs(final("shutdown_duration_seconds") - report.duration_seconds) < 1e-3
        # Each phase's time, in the report and the metric: they add up to the duration, and
        # the settle of the swallowing execution is the cancelling phase's.
        took = report.phase_seconds
        assert list(took) == ["unready", "draining", "cancelling", "flushing", "reporting"]
        assert sum(took.values()) == pytest.approx(report.duration_seconds, abs=0.01)
        # The settle waits for its deadline, one plan from the signal: a loop late in waking
        # (each scrape here blocks it a while) shortens the cancelling phase, not the plan.
        settle_deadline = settings.unready_delay + settings.drain_timeout + settings.cancel_timeout
        assert took["unready"] + took["draining"] + took["cancelling"] >= settle_deadline - 0.01
        assert took["cancelling"] >= settings.cancel_timeout / 2
        for phase, seconds in took.items():
            assert final("shutdown_phase_duration_seconds", phase=phase) == pytest.approx(
                seconds, abs=1e-3
            )
        assert final("shutdown_phase_duration_seconds", phase="http") == 0  # not a runner here
        assert (report.finished, report.cancelled, report.abandoned) == (1, 1, 1)
        assert [final.shutdown(o) for o in ("finished", "cancelled", "abandoned")] == [1, 1, 1]
        assert final("executions_finished_total", reasoner="swallow", status="abandoned") == 1
        assert final("executions_inflight", reasoner="swallow") == 0

        health = (await client.get("/healthz")).json()
        ready = await client.get("/readyz")
        assert health == {"status": "ok", "phase": "stopped"}
        assert ready.status_code == 503
        assert ready.json()["phase"] == "stopped"

    await agent.registry.wait_abandoned(time.monotonic() + 10)
    assert agent.registry.abandoned_pending == 0
    agent.registry.close()


def poll(url: str, until: Callable[[Reading], bool], timeout: float) -> Reading:
    """Scrape `url`/metrics until `until(reading)`, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        reading = Reading(httpx.get(f"{url}/metrics", timeout=2).text)
        if until(reading):
            return reading
        assert time.monotonic() < deadline, "condition not reached; last reading: " + str(
            {k: v for k, v in reading.samples.items() if "shutdown" in k[0] or "drain" in k[0]}
        )
        time.sleep(0.02)


def test_a_real_drain_is_visible_in_metrics_health_and_the_push(server_factory: Any) -> None:
    with PushReceiver() as receiver:
        server = server_factory(
            "tests_app:agent",
            "--grace-period", "30",
            "--unready-delay", "1.5",
            "--drain-timeout", "4",
            "--cancel-timeout", "5",
            "--pushgateway", receiver.url,
        )  # fmt: skip
        url = server.url
        short = httpx.post(
            f"{url}/reasoners/sleep/async", json={"seconds": 2.5, "marker": "short"}, timeout=5
        )
        long = httpx.post(
            f"{url}/reasoners/deferred_cleanup/async", json={"cleanup": 2.0}, timeout=5
        )
        assert (short.status_code, long.status_code) == (202, 202)
        server.wait_marker("short")
        before = Reading(httpx.get(f"{url}/metrics", timeout=2).text)
        assert before("draining") == 0
        assert before.phase == "serving"

        signalled_wall = time.time()
        server.signal(signal.SIGTERM)

        # unready window: draining already 1, readiness 503, work still accepted
        unready = poll(url, lambda r: r("draining") == 1, timeout=5)
        assert unready.phase in ("unready", "draining")
        assert abs(unready("shutdown_started_timestamp_seconds") - signalled_wall) < 2.0
        ready = httpx.get(f"{url}/readyz", timeout=2)
        assert ready.status_code == 503
        assert ready.json()["phase"] in ("unready", "draining")
        seen = [unready.phase]

        # draining: admission closed; a refusal and the short execution's end are counted
        draining = poll(url, lambda r: r.phase == "draining", timeout=5)
        seen.append("draining")
        health = httpx.get(f"{url}/healthz", timeout=2)
        assert health.status_code == 200
        assert health.json() == {"status": "ok", "phase": "draining"}
        refused = httpx.post(f"{url}/reasoners/echo", json={"text": "x"}, timeout=2)
        assert refused.status_code == 503
        draining = poll(
            url,
            lambda r: r.shutdown("finished") == 1 or r.phase != "draining",
            timeout=5,
        )
        assert draining.phase == "draining", "the short execution should end before the deadline"
        assert draining("requests_rejected_total", reason="draining") == 1
        assert draining("executions_inflight", reasoner="deferred_cleanup") == 1
        assert draining("shutdown_duration_seconds") == 0  # not over yet

        # cancelling: the long execution spends 2 s cleaning up
        cancelling = poll(url, lambda r: r.phase != "draining", timeout=8)
        assert cancelling.phase == "cancelling", cancelling.phase
        seen.append("cancelling")
        assert cancelling.shutdown("finished") == 1
        assert cancelling.shutdown("abandoned") == 0
        health = httpx.get(f"{url}/healthz", timeout=2)
        assert health.json() == {"status": "ok", "phase": "cancelling"}
        ready = httpx.get(f"{url}/readyz", timeout=2)
        assert (ready.status_code, ready.json()["phase"]) == (503, "cancelling")

        code, elapsed = server.wait_exit(timeout=20)
        assert code == 0, server.stderr()
        push = receiver.wait(timeout=1)

    assert [p for p in PHASES if p in seen] == seen  # observed in the enum's order
    assert len(receiver.pushes) == 1
    assert push.method == "PUT"
    assert push.path == f"/metrics/job/{JOB}/agent/tests/instance/{socket.gethostname()}"
    assert push.value(P + "shutdown_executions_total", outcome="finished") == 1
    assert push.value(P + "shutdown_executions_total", outcome="cancelled") == 1
    assert push.value(P + "shutdown_executions_total", outcome="abandoned") == 0
    assert push.value(P + "draining") == 1
    phase = P + "shutdown_phase"
    assert push.value(phase, **{phase: "stopped"}) == 1
    started = push.value(P + "shutdown_started_timestamp_seconds")
    assert started == unready("shutdown_started_timestamp_seconds")
    # 1.5 unready + 4 drain + about 2 of cleanup
    assert 7.0 < push.value(P + "shutdown_duration_seconds") < elapsed
    assert "shutdown metrics pushed" in server.stderr()
    # Every phase's time is pushed, the http phase after the listener closed included, and
    # the process's last line says what the phases after the report took.
    took = {
        name: push.value(P + "shutdown_phase_duration_seconds", phase=name)
        for name in ("unready", "draining", "cancelling", "flushing", "reporting", "http")
    }
    assert took["unready"] == pytest.approx(1.5, abs=0.2)
    assert 1.5 < took["cancelling"] < 4.0  # about 2 s of cleanup after the cancellation
    assert 0 < took["http"] < 2.0
    assert sum(took.values()) < elapsed
    last = [line for line in server.stderr().splitlines() if "shutdown ended" in line]
    assert len(last) == 1 and "http" in last[0] and "exit code 0" in last[0], last
