"""Session release (docs/api.md), in-process: on the registry and through the API.

The defining case: a reasoner that catches CancelledError and then spends 0.35 s cleaning up,
released with timeout=0.03, returns in about 0.03 s and counts it abandoned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent_server import Agent
from agent_server.model.execution import CancelReason, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerOptions
from agent_server.runtime.registry import AdmissionError, InFlightRegistry, RejectReason
from agent_server.runtime.sessions import SessionBusy, SessionRelease
from tests.apps.tests_app import (
    deferred_cleanup,
    echo,
    make_agent,
    sleep,
    swallow,
    swallow_then_fail,
)
from tests.support.local_parts import make_local
from tests.support.loop_reports import loop_reports

#: Bound for every wait on an event in this file.
WAIT = 5.0
#: What "returns in about 0.03 s" may take on a loaded 2-core machine; 0.35 s would fail it.
QUICK = 0.25
RELEASE_KEYS = {"session_id", "cancelled", "abandoned", "forgotten", "elapsed_seconds"}


@pytest.fixture
async def observed(caplog: pytest.LogCaptureFixture) -> AsyncIterator[pytest.LogCaptureFixture]:
    """Fails the test if asyncio reports an unobserved exception or a destroyed pending task."""
    caplog.set_level(logging.DEBUG)
    async with loop_reports() as reports:
        yield caplog
    assert reports.unobserved() == []


class Stubborn:
    """Catches the cancellation, reports it, and ends only when the test says so."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.finish = asyncio.Event()

    async def stubborn(self) -> str:
        self.entered.set()
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            self.cancelled.set()
            await self.finish.wait()
            raise
        return "not reached"


async def start_in(
    registry: InFlightRegistry, func: Any, session_id: str | None, **kwargs: Any
) -> Any:
    """Start an execution and let its task take its first step (it is inside the reasoner)."""
    execution = await registry.start(
        Reasoner(func, ReasonerOptions(func.__name__)), kwargs, session_id
    )
    await asyncio.sleep(0)
    return execution


# -- on the registry ---------------------------------------------------------------------------


async def test_defining_case_returns_at_the_deadline(observed: pytest.LogCaptureFixture) -> None:
    local = await make_local()
    registry = local.registry
    execution = await start_in(registry, deferred_cleanup, "s1", cleanup=0.35)
    began = time.monotonic()
    release = await local.releases.release("s1", timeout=0.03, cancel_running=True)
    elapsed = time.monotonic() - began
    assert 0.025 <= elapsed < QUICK, elapsed
    assert 0.025 <= release.elapsed_seconds < QUICK
    assert (release.cancelled, release.abandoned, release.forgotten) == (0, 1, 1)
    assert execution.status is ExecutionStatus.CANCELLED
    assert execution.status_reason is CancelReason.SESSION_RELEASED
    assert execution.abandoned
    assert await registry.store.get(execution.execution_id) is None
    # The cleanup goes on, still owned; its end is observed.
    assert registry.abandoned_pending == 1
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0
    assert time.monotonic() - began >= 0.3
    assert "ended later" in observed.text
    assert registry.stats.outcomes == {"abandoned": 1}


async def test_swallowing_forever_is_abandoned_at_the_deadline(
    observed: pytest.LogCaptureFixture,
) -> None:
    local = await make_local()
    registry = local.registry
    forever = await start_in(registry, swallow, "s1", seconds=0.6)
    raising = await start_in(registry, swallow_then_fail, "s1", linger=0.3)
    began = time.monotonic()
    release = await local.releases.release("s1", timeout=0.05, cancel_running=True)
    assert time.monotonic() - began < QUICK
    assert (release.cancelled, release.abandoned, release.forgotten) == (0, 2, 2)
    assert forever.abandoned and raising.abandoned
    # Cancelling again does not help either: they keep going, still referenced.
    for execution in (forever, raising):
        registry.cancel(execution.execution_id, CancelReason.REQUEST)
    await registry.wait_abandoned(time.monotonic() + WAIT)
    assert registry.abandoned_pending == 0
    assert "gave up after swallowing cancellation" in observed.text  # its exception, observed


async def test_settled_work_counts_cancelled_not_abandoned(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    a = await start_in(registry, sleep, "s1", seconds=30.0, marker=None)
    b = await start_in(registry, deferred_cleanup, "s1", cleanup=0.05)
    done = await start_in(registry, echo, "s1", message={"text": "x"})
    assert await done.wait(WAIT)
    release = await local.releases.release("s1", timeout=WAIT, cancel_running=True)
    assert (release.cancelled, release.abandoned, release.forgotten) == (2, 0, 3)
    for execution in (a, b):
        assert execution.status is ExecutionStatus.CANCELLED
        assert execution.status_reason is CancelReason.SESSION_RELEASED
        assert not execution.abandoned
    assert await registry.store.list_executions(session_id="s1") == []


async def test_two_concurrent_releases_share_one_drain(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    await start_in(registry, swallow, "s1", seconds=0.6)
    await start_in(registry, deferred_cleanup, "s1", cleanup=0.01)
    began = time.monotonic()
    first = asyncio.create_task(local.releases.release("s1", timeout=0.15, cancel_running=True))
    await asyncio.sleep(0)  # the first release is now under way
    # The second asks to wait without bound; it shares the first's drain and deadline.
    second = asyncio.create_task(local.releases.release("s1", timeout=None, cancel_running=True))
    done, _ = await asyncio.wait({first, second}, timeout=WAIT)
    assert len(done) == 2
    elapsed = time.monotonic() - began
    assert 0.14 <= elapsed < 0.15 + QUICK
    assert first.result() == second.result()
    assert (first.result().cancelled, first.result().abandoned) == (1, 1)
    await registry.wait_abandoned(time.monotonic() + WAIT)


async def test_session_being_released_refuses_new_work(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    stubborn = Stubborn()
    await start_in(registry, stubborn.stubborn, "s1")
    release = asyncio.create_task(local.releases.release("s1", timeout=None, cancel_running=True))
    await asyncio.wait_for(stubborn.cancelled.wait(), WAIT)
    with pytest.raises(AdmissionError) as refused:
        await registry.start(
            Reasoner(sleep, ReasonerOptions("sleep")), {"seconds": 0, "marker": None}, "s1"
        )
    assert refused.value.reason is RejectReason.SESSION_RELEASED
    assert registry.stats.rejected["session_released"] == 1
    other = await registry.start(
        Reasoner(sleep, ReasonerOptions("sleep")), {"seconds": 0, "marker": None}, "s2"
    )
    assert await other.wait(WAIT) and other.status is ExecutionStatus.SUCCEEDED
    stubborn.finish.set()
    result = await asyncio.wait_for(release, WAIT)
    assert (result.cancelled, result.abandoned) == (1, 0)
    # Released: the session id may be used again.
    again = await registry.start(
        Reasoner(sleep, ReasonerOptions("sleep")), {"seconds": 0, "marker": None}, "s1"
    )
    assert await again.wait(WAIT)


async def test_releasing_one_session_leaves_another_untouched(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    mine = await start_in(registry, sleep, "a", seconds=30.0, marker=None)
    theirs = await start_in(registry, sleep, "b", seconds=30.0, marker=None)
    theirs_done = await start_in(registry, echo, "b", message={"text": "kept"})
    no_session = await start_in(registry, sleep, None, seconds=30.0, marker=None)
    release = await local.releases.release("a", timeout=WAIT, cancel_running=True)
    assert (release.cancelled, release.forgotten) == (1, 1)
    assert mine.status is ExecutionStatus.CANCELLED
    assert theirs.status is ExecutionStatus.RUNNING
    assert no_session.status is ExecutionStatus.RUNNING
    assert (await registry.store.get(theirs_done.execution_id)).result == {"text": "kept"}
    assert {e.execution_id for e in await registry.store.list_executions(session_id="b")} == {
        theirs.execution_id,
        theirs_done.execution_id,
    }
    tasks = registry.cancel_all(CancelReason.SHUTDOWN)
    assert await registry.settle(tasks, time.monotonic() + WAIT) == []


async def test_timeout_zero_returns_at_once(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    execution = await start_in(registry, deferred_cleanup, "s1", cleanup=0.5)
    began = time.monotonic()
    release = await local.releases.release("s1", timeout=0, cancel_running=True)
    assert time.monotonic() - began < QUICK
    assert (release.cancelled, release.abandoned) == (0, 1)
    assert execution.status_reason is CancelReason.SESSION_RELEASED
    await registry.wait_abandoned(time.monotonic() + WAIT)


async def test_timeout_none_waits_for_the_cleanup(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    await start_in(registry, deferred_cleanup, "s1", cleanup=0.2)
    began = time.monotonic()
    release = await local.releases.release("s1", timeout=None, cancel_running=True)
    assert time.monotonic() - began >= 0.19
    assert (release.cancelled, release.abandoned, release.forgotten) == (1, 0, 1)


async def test_cancel_running_false_with_running_work_changes_nothing(observed: object) -> None:
    local = await make_local()
    registry = local.registry
    running = await start_in(registry, sleep, "s1", seconds=30.0, marker=None)
    finished = await start_in(registry, echo, "s1", message={"text": "x"})
    assert await finished.wait(WAIT)
    with pytest.raises(SessionBusy):
        await local.releases.release("s1", timeout=WAIT, cancel_running=False)
    assert running.status is ExecutionStatus.RUNNING
    assert await registry.store.get(finished.execution_id) is finished
    # Not left half-released: new work for the session is still admitted.
    extra = await start_in(registry, echo, "s1", message={"text": "y"})
    assert await extra.wait(WAIT)
    registry.cancel(running.execution_id, CancelReason.REQUEST)
    assert await running.wait(WAIT)
    # Nothing running any more: cancel_running=false just forgets the records.
    release = await local.releases.release("s1", timeout=WAIT, cancel_running=False)
    assert (release.cancelled, release.abandoned, release.forgotten) == (0, 0, 3)


async def test_unknown_or_released_session_is_empty() -> None:
    local = await make_local()
    for _ in range(2):
        release = await local.releases.release("nobody", timeout=0, cancel_running=False)
        assert release == SessionRelease("nobody", 0, 0, 0, release.elapsed_seconds)


# -- through the API ------------------------------------------------------------------------------


@pytest.fixture
def agent() -> Agent:
    return make_agent()


@pytest.fixture
async def client(agent: Agent) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as http:
        yield http
    tasks = agent.registry.cancel_all(CancelReason.SHUTDOWN)
    await agent.registry.settle(tasks, time.monotonic() + WAIT)
    await agent.registry.wait_abandoned(time.monotonic() + WAIT)


async def start_async(
    client: httpx.AsyncClient, name: str, session: str, body: dict[str, Any]
) -> str:
    response = await client.post(
        f"/reasoners/{name}/async", json=body, headers={"X-Session-ID": session}
    )
    assert response.status_code == 202, response.text
    await asyncio.sleep(0)  # one loop iteration: the task takes its first step
    return str(response.json()["execution_id"])


async def release(client: httpx.AsyncClient, session: str, **params: Any) -> httpx.Response:
    return await client.delete(f"/sessions/{session}", params=params)


async def test_http_defining_case(
    agent: Agent, client: httpx.AsyncClient, observed: pytest.LogCaptureFixture
) -> None:
    execution_id = await start_async(client, "deferred_cleanup", "s1", {"cleanup": 0.35})
    began = time.monotonic()
    response = await release(client, "s1", timeout=0.03)
    elapsed = time.monotonic() - began
    assert response.status_code == 200
    body = response.json()
    assert set(body) == RELEASE_KEYS
    assert body["session_id"] == "s1"
    assert (body["cancelled"], body["abandoned"], body["forgotten"]) == (0, 1, 1)
    assert 0.025 <= body["elapsed_seconds"] < QUICK
    assert elapsed < QUICK, elapsed
    assert (await client.get(f"/executions/{execution_id}")).status_code == 404
    await agent.registry.wait_abandoned(time.monotonic() + WAIT)
    assert agent.registry.abandoned_pending == 0
    assert "ended later" in observed.text
    metrics = (await client.get("/metrics")).text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics)
        for s in family.samples
    }
    assert samples[("agent_server_session_releases_total", (("outcome", "abandoned"),))] == 1
    finished = "agent_server_executions_finished_total"
    labels = (("reasoner", "deferred_cleanup"), ("status", "abandoned"))
    assert samples[(finished, labels)] == 1


async def test_http_swallowing_forever_is_abandoned(
    agent: Agent, client: httpx.AsyncClient, observed: pytest.LogCaptureFixture
) -> None:
    await start_async(client, "swallow", "s1", {"seconds": 0.6})
    await start_async(client, "swallow_then_fail", "s1", {"linger": 0.3})
    began = time.monotonic()
    response = await release(client, "s1", timeout=0.05)
    assert time.monotonic() - began < QUICK
    body = response.json()
    assert (body["cancelled"], body["abandoned"], body["forgotten"]) == (0, 2, 2)
    await agent.registry.wait_abandoned(time.monotonic() + WAIT)
    assert "gave up after swallowing cancellation" in observed.text


async def test_http_concurrent_releases_answer_the_same(
    agent: Agent, client: httpx.AsyncClient, observed: object
) -> None:
    await start_async(client, "swallow", "s1", {"seconds": 0.6})
    await start_async(client, "sleep", "s1", {"seconds": 30})
    first = asyncio.create_task(release(client, "s1", timeout=0.15))
    second = asyncio.create_task(release(client, "s1", timeout="none"))
    done, _ = await asyncio.wait({first, second}, timeout=WAIT)
    assert len(done) == 2
    assert first.result().status_code == second.result().status_code == 200
    assert first.result().json() == second.result().json()
    body = first.result().json()
    assert (body["cancelled"], body["abandoned"], body["forgotten"]) == (1, 1, 2)
    assert 0.14 <= body["elapsed_seconds"] < 0.15 + QUICK


async def test_http_session_being_released_refuses_new_work(
    agent: Agent, client: httpx.AsyncClient, observed: object
) -> None:
    stubborn = Stubborn()
    agent.reasoner(name="stubborn")(stubborn.stubborn)
    await start_async(client, "stubborn", "s1", {})
    pending = asyncio.create_task(release(client, "s1", timeout="none"))
    await asyncio.wait_for(stubborn.cancelled.wait(), WAIT)
    for path in ("/reasoners/echo", "/reasoners/echo/async"):
        refused = await client.post(path, json={"text": "x"}, headers={"X-Session-ID": "s1"})
        assert refused.status_code == 409
        assert "released" in refused.json()["detail"]
    other = await client.post("/reasoners/echo", json={"text": "x"}, headers={"X-Session-ID": "s2"})
    assert other.status_code == 200
    stubborn.finish.set()
    response = await asyncio.wait_for(pending, WAIT)
    assert (response.json()["cancelled"], response.json()["abandoned"]) == (1, 0)
    assert [e["session_id"] for e in (await client.get("/executions")).json()] == ["s2"]


async def test_http_release_leaves_other_sessions_untouched(client: httpx.AsyncClient) -> None:
    a = await start_async(client, "sleep", "a", {"seconds": 30})
    b = await start_async(client, "sleep", "b", {"seconds": 30})
    response = await release(client, "a")  # default timeout: 30 s, plenty
    assert (response.json()["cancelled"], response.json()["forgotten"]) == (1, 1)
    assert (await client.get(f"/executions/{a}")).status_code == 404
    assert (await client.get(f"/executions/{b}")).json()["status"] == "running"


async def test_http_timeout_zero_and_none(client: httpx.AsyncClient, observed: object) -> None:
    await start_async(client, "deferred_cleanup", "zero", {"cleanup": 0.5})
    began = time.monotonic()
    zero = (await release(client, "zero", timeout=0)).json()
    assert time.monotonic() - began < QUICK
    assert zero["cancelled"] + zero["abandoned"] == 1
    await start_async(client, "deferred_cleanup", "none", {"cleanup": 0.2})
    began = time.monotonic()
    none = (await release(client, "none", timeout="None")).json()
    assert time.monotonic() - began >= 0.19
    assert (none["cancelled"], none["abandoned"]) == (1, 0)


async def test_http_cancel_running_false(client: httpx.AsyncClient) -> None:
    running = await start_async(client, "sleep", "s1", {"seconds": 30})
    busy = await release(client, "s1", cancel_running="false")
    assert busy.status_code == 409
    assert set(busy.json()) == {"detail"}
    assert (await client.get(f"/executions/{running}")).json()["status"] == "running"
    assert (await client.post(f"/executions/{running}/cancel")).status_code == 202
    assert (await client.get(f"/executions/{running}", params={"wait": WAIT})).json()[
        "status"
    ] == "cancelled"
    ok = await release(client, "s1", cancel_running="0")
    assert ok.status_code == 200
    assert (ok.json()["cancelled"], ok.json()["forgotten"]) == (0, 1)


async def test_http_unknown_and_released_session_is_200(client: httpx.AsyncClient) -> None:
    for _ in range(2):
        response = await release(client, "never-seen")
        assert response.status_code == 200
        body = response.json()
        assert set(body) == RELEASE_KEYS
        assert (body["cancelled"], body["abandoned"], body["forgotten"]) == (0, 0, 0)


@pytest.mark.parametrize(
    "params", [{"timeout": "soon"}, {"timeout": "-1"}, {"timeout": "nan"}, {"cancel_running": "x"}]
)
async def test_http_bad_release_parameters_are_422(
    client: httpx.AsyncClient, params: dict[str, str]
) -> None:
    response = await release(client, "s1", **params)
    assert response.status_code == 422
    assert set(response.json()) == {"detail"}
