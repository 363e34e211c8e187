"""Metrics, read the way Prometheus reads them: GET /metrics, parsed by prometheus_client.

Each test gets a fresh Agent (its own CollectorRegistry), so no test sees another's counts.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import Agent, Settings
from agent_server.http.api import ROUTE_STATUSES
from agent_server.model.execution import CancelReason
from agent_server.runtime.metric_series import EXECUTION_BUCKETS, HTTP_BUCKETS
from agent_server.runtime.metrics import Metrics
from tests.apps.tests_app import make_agent, reasoner_names

P = "agent_server_"
Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass
class Served:
    agent: Agent
    client: httpx.AsyncClient


async def serve(agent: Agent) -> AsyncIterator[Served]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        yield Served(agent, client)
    agent.registry.close()


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for s in serve(make_agent()):
        yield s


class Scrape:
    """One GET /metrics, parsed."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.families = list(text_string_to_metric_families(text))
        self.samples: dict[Key, float] = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in self.families
            for s in family.samples
        }

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(P + name, frozenset(labels.items()))]

    def labels(self, name: str, label: str) -> set[str]:
        return {dict(key[1])[label] for key in self.samples if key[0] == P + name}


async def scrape(client: httpx.AsyncClient) -> Scrape:
    response = await client.get("/metrics")
    assert response.status_code == 200
    return Scrape(response.text)


async def wait_terminal(client: httpx.AsyncClient, execution_id: str) -> dict[str, object]:
    response = await client.get(f"/executions/{execution_id}", params={"wait": 10})
    body: dict[str, object] = response.json()
    assert body["status"] != "running", body
    return body


# -- the exposition --------------------------------------------------------------------------


async def test_exposition_parses_with_every_metric_of_the_design(served: Served) -> None:
    response = await served.client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = {f.name: f.type for f in text_string_to_metric_families(response.text)}
    assert types == {
        P + "executions_started": "counter",
        P + "executions_finished": "counter",
        P + "executions_inflight": "gauge",
        P + "execution_duration_seconds": "histogram",
        P + "requests_rejected": "counter",
        P + "http_requests": "counter",
        P + "http_request_duration_seconds": "histogram",
        P + "draining": "gauge",
        P + "shutdown_phase": "gauge",  # an Enum: one 0/1 series per phase
        P + "shutdown_started_timestamp_seconds": "gauge",
        P + "shutdown_duration_seconds": "gauge",
        P + "shutdown_phase_duration_seconds": "gauge",
        P + "shutdown_executions": "counter",
        P + "session_releases": "counter",
        P + "store_operation_duration_seconds": "histogram",
        P + "store_errors": "counter",
        P + "store_up": "gauge",
        P + "store_fenced_writes": "counter",
        P + "store_write_retries": "counter",
        P + "replicas_alive": "gauge",
        P + "events_emitted": "counter",
        P + "executions_waiting": "gauge",
        P + "input_wait_seconds": "histogram",
        P + "executions_queued": "gauge",
        P + "queue_wait_seconds": "histogram",
        P + "execution_retries": "counter",
        P + "event_streams_open": "gauge",
        P + "webhook_deliveries": "counter",
        P + "webhooks_pending": "gauge",
        P + "shutdown_elapsed_seconds": "gauge",  # computed per scrape, never pushed
        P + "event_loop_lag_seconds": "histogram",
        P + "schedule_firings": "counter",
        P + "version_rules": "counter",
        P + "schedule_lag_seconds": "histogram",
    }
    # _created series are left out on purpose (see agent_server.runtime.metrics)
    assert "_created" not in response.text


async def test_known_label_values_start_at_zero(served: Served) -> None:
    m = await scrape(served.client)
    names = reasoner_names()
    assert m.labels("executions_started_total", "reasoner") == names
    for name in names:
        assert m("executions_started_total", reasoner=name) == 0
        assert m("executions_inflight", reasoner=name) == 0
        for status in ("succeeded", "failed", "cancelled", "abandoned"):
            assert m("executions_finished_total", reasoner=name, status=status) == 0
            assert m("execution_duration_seconds_count", reasoner=name, status=status) == 0
        assert m("executions_finished_total", reasoner=name, status="lost") == 0
        assert m("executions_waiting", reasoner=name) == 0
        assert m("input_wait_seconds_count", reasoner=name) == 0
        assert m("executions_queued", reasoner=name) == 0
        assert m("queue_wait_seconds_count", reasoner=name) == 0
        assert m("execution_retries_total", reasoner=name, reason="timeout") == 0
    assert m.labels("requests_rejected_total", "reason") == {
        "draining",
        "capacity",
        "session_released",
        "store_unavailable",
    }
    assert m("store_up") == 1
    assert m("replicas_alive") == 1
    assert all(m("requests_rejected_total", reason=r) == 0 for r in ("draining", "capacity"))
    for outcome in ("finished", "cancelled", "abandoned"):
        assert m("shutdown_executions_total", outcome=outcome) == 0
    for outcome in ("settled", "abandoned"):
        assert m("session_releases_total", outcome=outcome) == 0
    # rate() and increase() miss a counter's first count unless the series was seen at 0
    for (method, route), statuses in ROUTE_STATUSES.items():
        for status in statuses:
            assert m("http_requests_total", method=method, route=route, status=str(status)) == 0
    assert m("shutdown_elapsed_seconds") == 0
    phase = P + "shutdown_phase"
    assert m("shutdown_phase", **{phase: "serving"}) == 1
    for other in ("unready", "draining", "cancelling", "stopped"):
        assert m("shutdown_phase", **{phase: other}) == 0
    assert m("draining") == 0
    assert m("shutdown_started_timestamp_seconds") == 0
    assert m("shutdown_duration_seconds") == 0


def test_every_route_has_its_statuses_known_up_front() -> None:
    routes = {
        (method, route.path)
        for route in make_agent().api().routes()
        for method in route.methods or ()
        if method != "HEAD"
    }
    assert set(ROUTE_STATUSES) == routes


async def test_elapsed_shutdown_grows_from_the_signal_and_is_not_pushed() -> None:
    metrics = Metrics()
    metrics.shutdown.began(time.time(), time.monotonic() - 2.0)
    elapsed = metrics.registry.get_sample_value(P + "shutdown_elapsed_seconds")
    assert elapsed is not None and 2.0 <= elapsed < 10.0
    pushed = {s.name for f in metrics.shutdown.registry.collect() for s in f.samples}
    assert P + "draining" in pushed
    assert P + "shutdown_elapsed_seconds" not in pushed


async def test_buckets_span_ten_milliseconds_to_thirty_minutes(served: Served) -> None:
    await served.client.get("/healthz")
    m = await scrape(served.client)

    def bounds(name: str) -> list[float]:
        return sorted(
            float(dict(labels)["le"])
            for sample, labels in m.samples
            if sample == P + name + "_bucket"
        )

    execution = sorted(set(bounds("execution_duration_seconds")))
    assert execution[0] == 0.01
    assert execution[-2:] == [1800.0, float("inf")]
    assert execution[:-1] == list(EXECUTION_BUCKETS)
    http = sorted(set(bounds("http_request_duration_seconds")))
    assert http[:-1] == list(HTTP_BUCKETS)
    assert http[-2] == 1800.0


# -- executions ------------------------------------------------------------------------------


async def test_succeeded_and_failed_executions_move_their_counters(served: Served) -> None:
    client = served.client
    assert (await client.post("/reasoners/echo", json={"text": "a"})).status_code == 200
    assert (await client.post("/reasoners/echo", json={"text": "b"})).status_code == 200
    assert (await client.post("/reasoners/fail", json={})).status_code == 500
    assert (await client.post("/reasoners/thread_sleep", json={"seconds": 0.02})).status_code == 200
    m = await scrape(client)
    assert m("executions_started_total", reasoner="echo") == 2
    assert m("executions_finished_total", reasoner="echo", status="succeeded") == 2
    assert m("execution_duration_seconds_count", reasoner="echo", status="succeeded") == 2
    assert m("executions_started_total", reasoner="fail") == 1
    assert m("executions_finished_total", reasoner="fail", status="failed") == 1
    assert m("executions_finished_total", reasoner="fail", status="succeeded") == 0
    assert m("executions_finished_total", reasoner="thread_sleep", status="succeeded") == 1
    slept = m("execution_duration_seconds_sum", reasoner="thread_sleep", status="succeeded")
    assert slept >= 0.02
    assert all(m("executions_inflight", reasoner=name) == 0 for name in ("echo", "fail"))


async def test_inflight_rises_and_falls_and_cancellation_is_counted(served: Served) -> None:
    client = served.client
    started = await client.post("/reasoners/sleep/async", json={"seconds": 600})
    assert started.status_code == 202
    execution_id = started.json()["execution_id"]
    m = await scrape(client)
    assert m("executions_started_total", reasoner="sleep") == 1
    assert m("executions_inflight", reasoner="sleep") == 1
    assert (await client.post(f"/executions/{execution_id}/cancel")).status_code == 202
    assert (await wait_terminal(client, execution_id))["status"] == "cancelled"
    m = await scrape(client)
    assert m("executions_inflight", reasoner="sleep") == 0
    assert m("executions_finished_total", reasoner="sleep", status="cancelled") == 1
    assert m("execution_duration_seconds_count", reasoner="sleep", status="cancelled") == 1


async def test_capacity_rejection_is_counted() -> None:
    async for s in serve(make_agent(Settings(max_inflight=1))):
        running = await s.client.post("/reasoners/sleep/async", json={"seconds": 600})
        assert running.status_code == 202
        refused = await s.client.post("/reasoners/echo", json={"text": "x"})
        assert refused.status_code == 429
        m = await scrape(s.client)
        assert m("requests_rejected_total", reason="capacity") == 1
        assert m("requests_rejected_total", reason="draining") == 0
        assert m("executions_started_total", reasoner="echo") == 0  # refused work never starts
        assert m("http_requests_total", method="POST", route="/reasoners/{name}", status="429") == 1
        await s.client.post(f"/executions/{running.json()['execution_id']}/cancel")
        await wait_terminal(s.client, running.json()["execution_id"])


async def test_session_release_rejection_and_outcome_are_counted(served: Served) -> None:
    client, registry = served.client, served.agent.registry
    headers = {"X-Session-ID": "s-1"}
    started = await client.post(
        "/reasoners/deferred_cleanup/async", json={"cleanup": 0.5}, headers=headers
    )
    execution_id = started.json()["execution_id"]
    release = asyncio.create_task(client.delete("/sessions/s-1", params={"timeout": 10}))
    deadline = time.monotonic() + 5
    while registry.running(execution_id).cancel_reason is not CancelReason.SESSION_RELEASED:  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "the release did not begin"
        await asyncio.sleep(0.005)
    refused = await client.post("/reasoners/echo", json={"text": "x"}, headers=headers)
    assert refused.status_code == 409
    released = await asyncio.wait_for(release, timeout=10)
    assert released.json()["cancelled"] == 1
    m = await scrape(client)
    assert m("requests_rejected_total", reason="session_released") == 1
    assert m("session_releases_total", outcome="settled") == 1
    assert m("session_releases_total", outcome="abandoned") == 0
    assert m("executions_finished_total", reasoner="deferred_cleanup", status="cancelled") == 1


async def test_abandoned_execution_is_counted_once_and_leaves_inflight(served: Served) -> None:
    client, registry = served.client, served.agent.registry
    started = await client.post(
        "/reasoners/swallow/async", json={"seconds": 1.0}, headers={"X-Session-ID": "s-2"}
    )
    assert started.status_code == 202
    await asyncio.sleep(0)  # one loop turn: the task takes its first step and can swallow
    released = await client.delete("/sessions/s-2", params={"timeout": 0.1})
    assert released.json()["abandoned"] == 1
    m = await scrape(client)
    assert m("executions_finished_total", reasoner="swallow", status="abandoned") == 1
    assert m("executions_finished_total", reasoner="swallow", status="cancelled") == 0
    assert m("executions_inflight", reasoner="swallow") == 0
    assert m("session_releases_total", outcome="abandoned") == 1
    # the abandoned task ends on its own later; that end is not counted a second time
    await registry.wait_abandoned(time.monotonic() + 5)
    assert registry.abandoned_pending == 0
    m = await scrape(client)
    assert m("executions_finished_total", reasoner="swallow", status="abandoned") == 1
    assert m("executions_finished_total", reasoner="swallow", status="succeeded") == 0


async def test_draining_rejection_is_counted(served: Served) -> None:
    agent, client = served.agent, served.client
    agent.shutdown.begin(time.monotonic(), time.time(), "SIGTERM")
    await agent.shutdown.run()
    refused = await client.post("/reasoners/echo", json={"text": "x"})
    assert refused.status_code == 503
    m = await scrape(client)
    assert m("requests_rejected_total", reason="draining") == 1
    assert m("executions_started_total", reasoner="echo") == 0


# -- HTTP ------------------------------------------------------------------------------------


async def test_http_metrics_use_route_templates_never_raw_ids(served: Served) -> None:
    client = served.client
    started = await client.post("/reasoners/echo/async", json={"text": "x"})
    execution_id = started.json()["execution_id"]
    await wait_terminal(client, execution_id)
    assert (await client.get(f"/executions/{execution_id}")).status_code == 200
    assert (await client.get("/executions/no-such-id")).status_code == 404
    assert (await client.post(f"/executions/{execution_id}/cancel")).status_code == 200
    assert (await client.delete(f"/executions/{execution_id}")).status_code == 204
    assert (await client.post("/reasoners/no-such-reasoner", json={})).status_code == 404
    assert (await client.get("/no/such/path")).status_code == 404
    assert (await client.patch(f"/executions/{execution_id}")).status_code == 405
    assert (await client.request("BREW", "/healthz")).status_code == 405
    m = await scrape(client)
    for value in (execution_id, "no-such-id", "no-such-reasoner", "/no/such/path"):
        assert value not in m.text
    routes = m.labels("http_requests_total", "route")
    assert routes == {template for _, template in ROUTE_STATUSES} | {"unmatched"}
    get = {"method": "GET", "route": "/executions/{execution_id}"}
    # the two terminal reads (long-poll and plain) and the unknown id
    assert m("http_requests_total", **get, status="200") == 2
    assert m("http_requests_total", **get, status="404") == 1
    assert m("http_requests_total", method="PATCH", route=get["route"], status="405") == 1
    assert m("http_requests_total", method="other", route="/healthz", status="405") == 1
    assert m("http_requests_total", method="GET", route="unmatched", status="404") == 1
    assert m("http_request_duration_seconds_count", **get, status="200") == 2


async def test_label_cardinality_is_fixed_under_a_thousand_execution_ids(served: Served) -> None:
    client = served.client

    async def one_round(session: str) -> None:
        started = await client.post(
            "/reasoners/echo/async", json={"text": session}, headers={"X-Session-ID": session}
        )
        assert started.status_code == 202
        execution_id = started.json()["execution_id"]
        assert (await client.get(f"/executions/{execution_id}", params={"wait": 5})).json()[
            "status"
        ] == "succeeded"
        assert (await client.delete(f"/executions/{execution_id}")).status_code == 204
        assert (await client.get(f"/executions/{uuid.uuid4().hex}")).status_code == 404
        assert (await client.delete(f"/sessions/{session}")).status_code == 200

    await one_round("warm-up")  # every label combination these requests use now exists
    await scrape(client)  # and the scrape's own series
    before = await scrape(client)
    deadline = time.monotonic() + 120
    for n in range(1000):
        assert time.monotonic() < deadline, f"only {n} rounds in 120 s"
        await one_round(f"session-{n}")
    after = await scrape(client)
    assert set(after.samples) == set(before.samples)
    assert after("executions_started_total", reasoner="echo") == 1001
    get = {"method": "GET", "route": "/executions/{execution_id}"}
    assert after("http_requests_total", **get, status="404") == 1001


# -- isolation -------------------------------------------------------------------------------


async def test_two_agents_in_one_process_do_not_collide() -> None:
    first, second = make_agent(), make_agent()  # same metric names, no duplicate error
    assert first.metrics.registry is not second.metrics.registry
    async for a in serve(first):
        assert (await a.client.post("/reasoners/echo", json={"text": "x"})).status_code == 200
        assert (await scrape(a.client))("executions_started_total", reasoner="echo") == 1
    async for b in serve(second):
        m = await scrape(b.client)
        assert m("executions_started_total", reasoner="echo") == 0
        counted = {
            (labels["method"], labels["route"], labels["status"])
            for (name, frozen), value in m.samples.items()
            if name == P + "http_requests_total" and value > 0
            for labels in [dict(frozen)]
        }
        assert counted == set()  # the scrape counts itself only once it has answered
    # nothing leaks into prometheus_client's process-wide default registry
    leaked = prometheus_client.REGISTRY.get_sample_value(
        P + "executions_started_total", {"reasoner": "echo"}
    )
    assert leaked is None


# -- the histograms against prometheus_client's own ----------------------------------------


def test_http_histogram_matches_prometheus_client_on_every_bound() -> None:
    """The HTTP series are plain counts read at scrape time; they must bucket (`le`: value <=
    bound), sum and print exactly as a prometheus_client Histogram fed the same values."""
    from agent_server.runtime.metrics import Metrics

    values = [
        *HTTP_BUCKETS,  # exactly on each bound: counted in that bucket
        *(b * (1 + 1e-9) for b in HTTP_BUCKETS),  # just above: the next one
        0.0,
        -0.25,
        1e-9,
        1e9,
        float("inf"),
        *(0.0001 * 1.37**n for n in range(50)),
    ]
    ours = Metrics()
    reference_registry = prometheus_client.CollectorRegistry()
    reference = prometheus_client.Histogram(
        P + "http_request_duration_seconds",
        "HTTP request handling time, by route template.",
        ["method", "route", "status"],
        buckets=HTTP_BUCKETS,
        registry=reference_registry,
    ).labels("GET", "/healthz", "200")
    for value in values:
        ours.http_request("GET", "/healthz", 200, value)
        reference.observe(value)

    def samples(registry: prometheus_client.CollectorRegistry) -> dict[Key, float]:
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in registry.collect()
            if family.name == P + "http_request_duration_seconds"
            for s in family.samples
            if not s.name.endswith("_created")
        }

    expected = samples(reference_registry)
    assert len(expected) == len(HTTP_BUCKETS) + 3  # the buckets, +Inf, count and sum
    assert samples(ours.registry) == expected
    healthz = {"method": "GET", "route": "/healthz", "status": "200"}
    scraped = Scrape(ours.exposition().decode())
    assert scraped("http_requests_total", **healthz) == len(values)
    at_most_a_millisecond = sum(value <= 0.001 for value in values)
    assert scraped("http_request_duration_seconds_bucket", **healthz, le="0.001") == (
        at_most_a_millisecond
    )
    lines = prometheus_client.generate_latest(reference_registry).decode().splitlines()
    bucket_lines = [line for line in lines if "_bucket{" in line]
    assert bucket_lines and set(bucket_lines) <= set(scraped.text.splitlines())


def test_inflight_is_started_minus_finished_for_every_reasoner() -> None:
    """`executions_inflight` is computed at scrape time from the two counters."""
    from agent_server.model.execution import Execution, ExecutionStatus
    from agent_server.runtime.metrics import Metrics

    metrics = Metrics()
    metrics.add_reasoner("a")
    running = [Execution("a", None) for _ in range(3)] + [Execution("unlisted", None)]
    for execution in running:
        metrics.execution_started(execution)
    running[0].finish(ExecutionStatus.SUCCEEDED)
    metrics.execution_finished(running[0], "succeeded")
    running[1].finish(ExecutionStatus.CANCELLED)
    metrics.execution_finished(running[1], "abandoned")
    m = Scrape(metrics.exposition().decode())
    assert m("executions_started_total", reasoner="a") == 3
    assert m("executions_inflight", reasoner="a") == 1
    assert m("executions_finished_total", reasoner="a", status="abandoned") == 1
    # a name never added gets its series on first use, as a labelled child would
    assert m("executions_started_total", reasoner="unlisted") == 1
    assert m("executions_inflight", reasoner="unlisted") == 1
    assert m.labels("executions_finished_total", "reasoner") == {"a"}
