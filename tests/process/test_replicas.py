"""Several replicas sharing one real Redis, behind a real haproxy: any replica answers for
any execution, results outlive the pod, a dead owner's work reads `lost`, a paused owner
cannot overwrite it, and an outage of Redis loses nothing accepted.

Each replica is a real `agent-server run` process on its own loopback port; haproxy picks a
replica per request, as a Kubernetes Service does, and follows their readiness.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.model.status import TERMINAL
from agent_server.process.launcher import run_command
from tests.support.cluster import LEASE, Cluster, metric, started_cluster, wait_for
from tests.support.process import APPS_DIR, free_port
from tests.support.redis_server import RedisServer

#: Bound on every wait in this file (seconds) unless it says otherwise.
WAIT = 10.0


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_server: RedisServer) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path, redis_server, "--grace-period", "8", "--cancel-timeout", "1"
    ) as running:
        yield running


def terminal(body: dict[str, Any]) -> bool:
    return body["status"] in TERMINAL


# -- any replica answers --------------------------------------------------------------------


def test_background_runs_are_read_from_any_replica(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.proxy.url, timeout=WAIT) as client:
        started = [client.post("/reasoners/sleep/async", json={"seconds": 0.2}) for _ in range(30)]
        assert all(r.status_code == 202 for r in started)
        owners = {r.json()["replica"] for r in started}
        results = [
            client.get(f"/executions/{r.json()['execution_id']}", params={"wait": 5})
            for r in started
        ]
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert all(r.json()["status"] == "succeeded" for r in results)
    assert len(owners) >= 2  # the proxy spread the starts
    # The record is the same whichever replica reads it.
    execution_id = started[0].json()["execution_id"]
    bodies = [
        httpx.get(f"{cluster.url(i)}/executions/{execution_id}", timeout=5).json() for i in range(3)
    ]
    assert bodies[0] == bodies[1] == bodies[2]
    assert bodies[0]["attempt"] == 1
    listed = httpx.get(f"{cluster.url(2)}/executions", params={"limit": 100}, timeout=5).json()
    assert {e["execution_id"] for e in listed} >= {r.json()["execution_id"] for r in started}


def test_a_long_poll_on_another_replica_wakes_at_the_end(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 0.5}, timeout=5
    ).json()
    began = time.monotonic()
    body = httpx.get(
        f"{cluster.url(1)}/executions/{started['execution_id']}", params={"wait": 5}, timeout=10
    ).json()
    elapsed = time.monotonic() - began
    assert body["status"] == "succeeded"
    assert elapsed < 2.0, elapsed  # woken by the end, not by the 5 s bound


def test_cancel_through_another_replica_reaches_the_owner(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 30}, timeout=5
    ).json()
    execution_id = started["execution_id"]
    cancel = httpx.post(f"{cluster.url(1)}/executions/{execution_id}/cancel", timeout=5)
    assert cancel.status_code == 202
    body = httpx.get(
        f"{cluster.url(2)}/executions/{execution_id}", params={"wait": 5}, timeout=10
    ).json()
    assert (body["status"], body["status_reason"]) == ("cancelled", "request")
    # DELETE through yet another replica forgets it everywhere.
    assert httpx.delete(f"{cluster.url(1)}/executions/{execution_id}", timeout=5).status_code == 204
    assert httpx.get(f"{cluster.url(0)}/executions/{execution_id}", timeout=5).status_code == 404


def test_delete_of_a_running_execution_elsewhere_is_409(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 30}, timeout=5
    ).json()
    response = httpx.delete(f"{cluster.url(2)}/executions/{started['execution_id']}", timeout=5)
    assert response.status_code == 409


def test_session_release_across_owners_answers_by_its_deadline(cluster: Cluster) -> None:
    headers = {"X-Session-ID": "shared-session"}
    stubborn = httpx.post(
        f"{cluster.url(0)}/reasoners/swallow/async",
        json={"seconds": 3},
        headers=headers,
        timeout=5,
    ).json()
    polite = httpx.post(
        f"{cluster.url(1)}/reasoners/sleep/async", json={"seconds": 30}, headers=headers, timeout=5
    ).json()
    done = httpx.post(
        f"{cluster.url(1)}/reasoners/echo", json={"text": "kept"}, headers=headers, timeout=5
    )
    assert done.status_code == 200

    async def release_and_start() -> tuple[httpx.Response, httpx.Response, float]:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            began = time.monotonic()
            release = asyncio.create_task(
                client.delete(f"{cluster.url(2)}/sessions/shared-session", params={"timeout": 1})
            )
            await asyncio.sleep(0.3)
            refused = await client.post(
                f"{cluster.url(1)}/reasoners/echo", json={"text": "x"}, headers=headers
            )
            answer = await release
            return answer, refused, time.monotonic() - began

    answer, refused, elapsed = asyncio.run(release_and_start())
    assert refused.status_code == 409  # a start in a session being released, on any replica
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert (body["cancelled"], body["abandoned"]) == (1, 1)
    assert body["forgotten"] == 3  # the abandoned one too, wherever it ran
    assert elapsed < 1.0 + 1.0, elapsed
    assert httpx.get(f"{cluster.url(0)}/executions/{polite['execution_id']}").status_code == 404
    # The session can be used again once released.
    again = httpx.post(
        f"{cluster.url(0)}/reasoners/echo", json={"text": "x"}, headers=headers, timeout=5
    )
    assert again.status_code == 200
    del stubborn


# -- results outlive the pod ----------------------------------------------------------------


def test_a_rolling_restart_under_load_leaves_every_result_readable(cluster: Cluster) -> None:
    accepted: list[str] = []
    stop = time.monotonic() + 60  # bound on the load, whatever happens

    async def load(rolling: asyncio.Event) -> None:
        async with httpx.AsyncClient(base_url=cluster.proxy.url, timeout=WAIT) as client:
            while not rolling.is_set() and time.monotonic() < stop and len(accepted) < 2000:
                seconds = random.choice([0.05, 0.2, 0.5])
                try:
                    response = await client.post(
                        "/reasoners/sleep/async", json={"seconds": seconds}
                    )
                except httpx.TransportError:
                    continue
                if response.status_code == 202:
                    accepted.append(response.json()["execution_id"])
                await asyncio.sleep(0.01)

    async def roll() -> None:
        done = asyncio.Event()
        clients = [asyncio.create_task(load(done)) for _ in range(4)]
        try:
            for index in range(3):
                await asyncio.sleep(0.5)
                old = cluster.replicas[index]
                old.signal(signal.SIGTERM)
                code = await asyncio.to_thread(old.proc.wait, WAIT)
                assert code in (0, 3), old.stderr()
                old.close()
                fresh = cluster.start(index)
                await asyncio.to_thread(fresh.wait_ready)
                cluster.replicas[index] = fresh
            await asyncio.sleep(0.5)
        finally:
            done.set()
            await asyncio.gather(*clients)

    asyncio.run(roll())
    assert len(accepted) >= 50
    unreadable: list[str] = []
    statuses: dict[str, int] = {}
    with httpx.Client(base_url=cluster.proxy.url, timeout=WAIT) as client:
        for execution_id in accepted:
            response = client.get(f"/executions/{execution_id}", params={"wait": 5})
            if response.status_code != 200 or not terminal(response.json()):
                unreadable.append(f"{execution_id}: {response.status_code} {response.text}")
                continue
            status = response.json()["status"]
            statuses[status] = statuses.get(status, 0) + 1
    assert unreadable == []
    assert set(statuses) <= {"succeeded", "cancelled"}, statuses
    assert statuses.get("succeeded", 0) > 0


# -- a dead owner's work reads lost ---------------------------------------------------------


def test_kill_9_of_an_owner_reads_lost_within_a_lease(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 60}, timeout=5
    ).json()
    execution_id = started["execution_id"]
    cluster.replicas[0].proc.kill()
    cluster.replicas[0].proc.wait(timeout=WAIT)
    killed = time.monotonic()

    def lost() -> dict[str, Any] | None:
        body = httpx.get(f"{cluster.url(1)}/executions/{execution_id}", timeout=5).json()
        return body if body["status"] == "lost" else None

    body = wait_for(lost, timeout=LEASE + 3, what="lost")
    assert time.monotonic() - killed <= LEASE + 1.5
    assert body["error"]["type"] == "ExecutionLost"
    assert started["replica"] in body["error"]["message"]
    assert httpx.get(f"{cluster.url(2)}/executions/{execution_id}").json()["status"] == "lost"
    counted = sum(
        metric(cluster.url(i), "agent_server_executions_finished_total", status="lost")
        for i in (1, 2)
    )
    assert counted == 1


def test_the_sweep_shows_lost_in_lists_without_a_read(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async",
        json={"seconds": 60},
        headers={"X-Session-ID": "swept"},
        timeout=5,
    ).json()
    cluster.replicas[0].proc.kill()

    def listed_lost() -> bool:
        listed = httpx.get(
            f"{cluster.url(1)}/executions", params={"status": "lost"}, timeout=5
        ).json()
        return started["execution_id"] in {e["execution_id"] for e in listed}

    wait_for(listed_lost, timeout=LEASE * 2 + 3, what="lost in the list")


def test_a_paused_owner_cannot_overwrite_lost(cluster: Cluster) -> None:
    owner = cluster.replicas[0]
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 1.0}, timeout=5
    ).json()
    execution_id = started["execution_id"]
    os.kill(owner.proc.pid, signal.SIGSTOP)
    try:

        def lost() -> bool:
            body = httpx.get(f"{cluster.url(1)}/executions/{execution_id}", timeout=5).json()
            return bool(body["status"] == "lost")

        wait_for(lost, timeout=LEASE + 3, what="lost")
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
    # The owner wakes, its reasoner ends, and its write of `succeeded` is refused.
    wait_for(
        lambda: metric(cluster.url(0), "agent_server_store_fenced_writes_total") >= 1,
        what="the fenced write",
    )
    body = httpx.get(f"{cluster.url(2)}/executions/{execution_id}", timeout=5).json()
    assert body["status"] == "lost"
    assert re.search(rf"{execution_id}.*(fenced|refused)", owner.stderr()), owner.stderr()


# -- store outage ---------------------------------------------------------------------------


def test_a_redis_outage_keeps_running_work_and_flushes_its_end(cluster: Cluster) -> None:
    url = cluster.url(0)
    started = httpx.post(f"{url}/reasoners/sleep/async", json={"seconds": 1.0}, timeout=5).json()
    execution_id = started["execution_id"]
    cluster.redis.stop(save=True)
    try:
        wait_for(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 503, what="unready")
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        refused = httpx.post(f"{url}/reasoners/echo", json={"text": "x"}, timeout=5)
        assert refused.status_code == 503
        assert refused.headers["retry-after"]
        assert httpx.get(f"{url}/executions/{execution_id}", timeout=5).status_code == 503
        # The reasoner ends while Redis is away: its end waits in the outbox.
        wait_for(
            lambda: metric(url, "agent_server_executions_finished_total", status="succeeded") >= 1,
            what="the local end",
        )
    finally:
        cluster.redis.start()
    wait_for(lambda: httpx.get(f"{url}/readyz", timeout=5).status_code == 200, what="ready")
    body = wait_for(
        lambda: (
            b
            if terminal(b := httpx.get(f"{cluster.url(1)}/executions/{execution_id}").json())
            else None
        ),
        what="the flushed end",
    )
    assert body["status"] == "succeeded"


def test_ends_unwritable_at_shutdown_are_reported_and_exit_6(cluster: Cluster) -> None:
    owner = cluster.replicas[0]
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 0.3}, timeout=5
    ).json()
    cluster.redis.stop()
    wait_for(
        lambda: (
            metric(cluster.url(0), "agent_server_executions_finished_total", status="succeeded")
            >= 1
        ),
        what="the local end",
    )
    owner.signal(signal.SIGTERM)
    code, elapsed = owner.wait_exit(timeout=WAIT + 5)
    log = owner.stderr()
    assert code == 6, log
    assert elapsed < 8, elapsed
    report = json.loads(re.search(r"shutdown report: (\{.*\})", log).group(1))  # type: ignore[union-attr]
    assert report["unrecorded"] == 1
    assert report["exit_code"] == 6
    line = re.search(r"end not written to the store: (\{.*\})", log)
    assert line is not None, log
    logged = json.loads(line.group(1))
    assert logged["execution_id"] == started["execution_id"]
    assert "result" not in logged  # a log line never carries a result (megabytes, maybe)


def test_an_unreachable_store_at_start_exits_1_naming_the_host(tmp_path: Path) -> None:
    port = free_port()
    began = time.monotonic()
    run = subprocess.run(
        run_command("tests_app:agent", "--store", f"redis://:s3cret-password@127.0.0.1:{port}/0"),
        cwd=APPS_DIR,
        capture_output=True,
        timeout=30,
    )
    output = run.stderr.decode()
    assert run.returncode == 1, output
    assert time.monotonic() - began < 15
    assert f"127.0.0.1:{port}" in output
    assert "s3cret-password" not in output


def test_concurrent_releases_on_two_replicas_share_one_answer(cluster: Cluster) -> None:
    headers = {"X-Session-ID": "twice"}
    httpx.post(
        f"{cluster.url(0)}/reasoners/swallow/async", json={"seconds": 3}, headers=headers
    ).raise_for_status()
    httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 30}, headers=headers
    ).raise_for_status()

    async def both() -> tuple[list[httpx.Response], float]:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            began = time.monotonic()
            answers = await asyncio.gather(
                client.delete(f"{cluster.url(1)}/sessions/twice", params={"timeout": 1}),
                client.delete(f"{cluster.url(2)}/sessions/twice", params={"timeout": 1}),
            )
            return list(answers), time.monotonic() - began

    answers, elapsed = asyncio.run(both())
    assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
    counts = [
        (a.json()["cancelled"], a.json()["abandoned"], a.json()["forgotten"]) for a in answers
    ]
    # The abandoned one is forgotten too, as on one process: its owner ends it at the deadline.
    assert counts[0] == counts[1] == (1, 1, 2), counts
    assert elapsed < 2.5, elapsed  # each by its own deadline


def test_a_cancel_sent_while_the_owner_resubscribes_still_reaches_it(cluster: Cluster) -> None:
    """A cancel answered 202 ends the execution `cancelled`, whatever the state of its
    owner's subscriber: every pub/sub connection is killed right before each cancel (the
    owner's subscriber reconnects meanwhile, and the publish finds nobody listening). The
    request is kept for the owner beside the publish, and its next renewal takes it."""
    for _ in range(4):
        started = httpx.post(
            f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 60}, timeout=5
        )
        assert started.status_code == 202
        execution_id = started.json()["execution_id"]
        assert cluster.redis.command("CLIENT", "KILL", "TYPE", "pubsub")
        cancel = httpx.post(f"{cluster.url(1)}/executions/{execution_id}/cancel", timeout=5)
        assert cancel.status_code == 202, cancel.text

        def cancelled(execution_id: str = execution_id) -> dict[str, Any] | None:
            body: dict[str, Any] = httpx.get(
                f"{cluster.url(2)}/executions/{execution_id}", params={"wait": 2}, timeout=5
            ).json()
            return body if terminal(body) else None

        body = wait_for(cancelled, timeout=WAIT, what=f"the cancel of {execution_id}")
        assert (body["status"], body["status_reason"]) == ("cancelled", "request"), body


def test_one_unanswered_renewal_leaves_an_idle_replica_ready(
    server_factory: Any, redis_server: RedisServer, redis_url: str
) -> None:
    """Readiness reflects reachability, not one slow operation (section 12, invariant 5):
    one renewal of an idle replica whose reply is held past the command timeout (the probe's
    own connection stalls; Redis answers everything else) neither turns /readyz 503 nor
    says the store is unreachable. The probe asks again at once on a fresh connection, and
    only a probe unanswered that long again would turn the replica unready."""
    from agent_server.model.execution import Execution
    from agent_server.store.redis import COMMAND_TIMEOUT, RedisStore
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        server = server_factory(
            "tests_app:agent", "--store", proxy.url, "--replica-id", "A", "--lease-ttl", "1"
        )
        marker = f"judged-{os.urandom(4).hex()}"
        # Only the renewal that judges this record returns it (the reply carries the
        # reasoner's name): a replica Z leaves it running and ends its liveness.
        proxy.stall(marker.encode(), COMMAND_TIMEOUT + 0.5, times=1)

        async def leave_a_record() -> None:
            z = RedisStore(redis_server.url, replica_id="Z", agent_name="tests")
            await z.open()
            await z.create(Execution(marker, None, "Z"))
            await z.close()

        asyncio.run(leave_a_record())
        wait_for(lambda: proxy.stalled >= 1, timeout=WAIT, what="the renewal's reply held")
        answers = []
        until = time.monotonic() + COMMAND_TIMEOUT + 1.5
        while time.monotonic() < until:
            answers.append(httpx.get(f"{server.url}/readyz", timeout=5).status_code)
            time.sleep(0.02)
        assert set(answers) == {200}, answers
        assert "unreachable" not in server.stderr()
        found = httpx.get(f"{server.url}/executions", params={"status": "lost"}, timeout=5)
        assert [e["reasoner"] for e in found.json()] == [marker]
    finally:
        proxy.stop()
