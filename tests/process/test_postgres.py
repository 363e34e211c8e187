"""Replicas on one real Postgres, behind a real haproxy: `agent-server run --store
postgresql://…` processes answer for every execution as they do on Redis. A start on one
and the end read on another, a long-poll woken by a notice, a cancel and a delete across
replicas, a hand-off at SIGTERM continued elsewhere, `lost` after kill -9 counted once,
idempotency across replicas, and Postgres killed and restarted: readiness 503 and new work
503 + Retry-After while it is away, ready again within 10 s of its return, and an end made
meanwhile written.

Postgres runs from the distribution's package as an unprivileged user (the fixtures'
tests/support/postgres_server.py); the store connects as an ordinary role that owns its
database.
"""

from __future__ import annotations

import asyncio
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
from tests.support.postgres_server import PostgresServer
from tests.support.process import APPS_DIR, agent_server_cli, free_port

#: Bound on every wait in this file (seconds) unless it says otherwise.
WAIT = 10.0


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_url: str, postgres_server: PostgresServer
) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path, postgres_server, "--grace-period", "8", "--cancel-timeout", "1"
    ) as running:
        yield running


def final(url: str, execution_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The execution once terminal, read with long-polls (each bounded)."""

    def ended() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", params={"wait": 2}, timeout=5)
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        body: dict[str, Any] = response.json()
        return body if body["status"] in TERMINAL else None

    found: dict[str, Any] = wait_for(ended, timeout=timeout, what=f"the end of {execution_id}")
    return found


def test_any_replica_answers_for_every_execution(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.proxy.url, timeout=WAIT) as client:
        started = [client.post("/reasoners/sleep/async", json={"seconds": 0.2}) for _ in range(20)]
        assert all(r.status_code == 202 for r in started), [r.text for r in started]
        owners = {r.json()["replica"] for r in started}
        results = [
            client.get(f"/executions/{r.json()['execution_id']}", params={"wait": 5})
            for r in started
        ]
    assert all(r.status_code == 200 for r in results), [r.text for r in results]
    assert {r.json()["status"] for r in results} == {"succeeded"}
    assert len(owners) >= 2  # the proxy spread the starts
    execution_id = started[0].json()["execution_id"]
    bodies = [
        httpx.get(f"{cluster.url(i)}/executions/{execution_id}", timeout=5).json() for i in range(3)
    ]
    assert bodies[0] == bodies[1] == bodies[2]
    listed = httpx.get(f"{cluster.url(2)}/executions", params={"limit": 100}, timeout=5).json()
    assert {e["execution_id"] for e in listed} >= {r.json()["execution_id"] for r in started}
    # A synchronous run on one replica, read on another.
    ran = httpx.post(f"{cluster.url(0)}/reasoners/echo", json={"text": "hé"}, timeout=WAIT)
    assert ran.status_code == 200, ran.text
    read = httpx.get(f"{cluster.url(1)}/executions/{ran.json()['execution_id']}", timeout=5)
    assert read.json() == ran.json()


def test_a_long_poll_on_another_replica_is_woken_by_the_notice(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 0.5}, timeout=5
    ).json()
    began = time.monotonic()
    body = httpx.get(
        f"{cluster.url(1)}/executions/{started['execution_id']}", params={"wait": 5}, timeout=10
    ).json()
    elapsed = time.monotonic() - began
    assert body["status"] == "succeeded"
    # 0.5 s of sleep, then the notice (100 ms in the contract; slack for a loaded machine),
    # well inside the poll's 1 s: woken by the notice, not by the poll or the 5 s bound.
    assert elapsed < 1.4, elapsed


def test_cancel_and_delete_through_other_replicas(cluster: Cluster) -> None:
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/sleep/async", json={"seconds": 30}, timeout=5
    ).json()
    execution_id = started["execution_id"]
    assert httpx.delete(f"{cluster.url(2)}/executions/{execution_id}", timeout=5).status_code == 409
    began = time.monotonic()
    cancel = httpx.post(f"{cluster.url(1)}/executions/{execution_id}/cancel", timeout=5)
    assert cancel.status_code == 202
    body = final(cluster.url(2), execution_id, timeout=WAIT)
    assert (body["status"], body["status_reason"]) == ("cancelled", "request")
    assert time.monotonic() - began < 3.0  # the notice (or the 1 s poll) reached the owner
    assert httpx.delete(f"{cluster.url(1)}/executions/{execution_id}", timeout=5).status_code == 204
    assert httpx.get(f"{cluster.url(0)}/executions/{execution_id}", timeout=5).status_code == 404


def test_duplicates_racing_on_two_replicas_make_one_execution(cluster: Cluster) -> None:
    async def race() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            return list(
                await asyncio.gather(
                    *(
                        client.post(
                            f"{cluster.url(i % 3)}/reasoners/sleep/async",
                            json={"seconds": 0.1},
                            headers={"Idempotency-Key": "one-of-many"},
                        )
                        for i in range(9)
                    )
                )
            )

    responses = asyncio.run(race())
    assert all(r.status_code in (200, 202) for r in responses), [r.text for r in responses]
    assert len({r.json()["execution_id"] for r in responses}) == 1


def test_a_hand_off_at_sigterm_is_continued_by_another_replica(cluster: Cluster) -> None:
    owner = cluster.replicas[0]
    started = httpx.post(
        f"{cluster.url(0)}/reasoners/steps/async",
        json={"count": 60, "pause": 0.2, "marker": "pg-steps"},
        timeout=5,
    ).json()
    owner.wait_marker("pg-steps")
    # 12 s of steps: past the drain's 5 s, so the shutdown hands it off.
    owner.signal(signal.SIGTERM)
    code, _ = owner.wait_exit(WAIT + 5)
    assert code == 0, owner.stderr()
    assert "handed off after attempt 1" in owner.stderr(), owner.stderr()[-3000:]
    body = final(cluster.url(1), started["execution_id"])
    assert (body["status"], body["attempt"]) == ("succeeded", 2), body
    assert body["result"] == {"steps": 60, "attempt": 2}
    assert body["replica"] != owner.replica_id


def test_kill_9_of_an_owner_reads_lost_once(cluster: Cluster) -> None:
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
    assert time.monotonic() - killed <= LEASE + 2.0
    assert body["error"]["type"] == "ExecutionLost"
    assert started["replica"] in body["error"]["message"]
    wait_for(
        lambda: (
            sum(
                metric(cluster.url(i), "agent_server_executions_finished_total", status="lost")
                for i in (1, 2)
            )
            >= 1
        ),
        what="lost counted",
    )
    time.sleep(LEASE)  # more renewals and sweeps, none of which may count it again
    counted = sum(
        metric(cluster.url(i), "agent_server_executions_finished_total", status="lost")
        for i in (1, 2)
    )
    assert counted == 1


def test_postgres_killed_and_restarted(cluster: Cluster) -> None:
    """kill -9 of Postgres: readiness 503 (liveness 200), new work 503 + Retry-After, a
    read 503; the running execution's end waits in the outbox; Postgres restarts and every
    replica is ready again within 10 s, the end written."""
    server = cluster.redis
    assert isinstance(server, PostgresServer)
    url = cluster.url(0)
    started = httpx.post(f"{url}/reasoners/sleep/async", json={"seconds": 1.0}, timeout=5).json()
    execution_id = started["execution_id"]
    server.kill()
    try:
        for i in range(3):
            wait_for(
                lambda i=i: httpx.get(f"{cluster.url(i)}/readyz", timeout=5).status_code == 503,
                what="unready",
            )
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        refused = httpx.post(f"{url}/reasoners/echo", json={"text": "x"}, timeout=WAIT)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"]
        assert httpx.get(f"{url}/executions/{execution_id}", timeout=WAIT).status_code == 503
        wait_for(
            lambda: metric(url, "agent_server_executions_finished_total", status="succeeded") >= 1,
            what="the local end",
        )
    finally:
        server.start()
    back = time.monotonic()
    for i in range(3):
        wait_for(
            lambda i=i: httpx.get(f"{cluster.url(i)}/readyz", timeout=5).status_code == 200,
            timeout=12.0,
            what="ready again",
        )
    assert time.monotonic() - back < 10.0
    body = final(cluster.url(1), execution_id, timeout=WAIT)
    assert (body["status"], body["result"]) == ("succeeded", {"slept": 1.0})


def test_both_spellings_and_an_unreachable_store(tmp_path: Path) -> None:
    """`postgres://` is taken as `postgresql://`; an unreachable Postgres stops the start
    (exit 1) naming the host, never the password."""
    port = free_port()
    began = time.monotonic()
    run = subprocess.run(
        run_command(
            "tests_app:agent", "--store", f"postgres://agent:s3cret-pw@127.0.0.1:{port}/db"
        ),
        cwd=APPS_DIR,
        capture_output=True,
        timeout=30,
    )
    output = run.stderr.decode()
    assert run.returncode == 1, output
    assert time.monotonic() - began < 15
    assert f"127.0.0.1:{port}" in output
    assert "s3cret-pw" not in output


def test_store_migrate_is_idempotent_and_refuses_a_newer_schema(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    """`agent-server store migrate URL` as a real process: applies the schema (exit 0), has
    nothing to do the second time (exit 0), takes `postgres://` too, refuses a schema newer
    than itself (exit 2), and an unreachable database is exit 1 naming the host, never the
    password."""

    def migrate(url: str) -> subprocess.CompletedProcess[str]:
        return agent_server_cli("store", "migrate", url)

    first = migrate(postgres_url)
    assert first.returncode == 0, first.stderr
    assert "applied 0001_initial.sql" in first.stdout
    assert "s3cret" not in first.stdout + first.stderr
    again = migrate(postgres_url.replace("postgresql://", "postgres://", 1))
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout
    postgres_server.admin(
        "INSERT INTO agent_server_schema (version, name) VALUES (9999, '9999_later.sql')",
        database="agents",
    )
    newer = migrate(postgres_url)
    assert newer.returncode == 2
    assert "9999" in newer.stderr and len(newer.stderr.strip().splitlines()) == 1
    port = free_port()
    away = migrate(f"postgresql://agent:s3cret-pw@127.0.0.1:{port}/agents")
    assert away.returncode == 1
    assert f"127.0.0.1:{port}" in away.stderr and "s3cret-pw" not in away.stderr
