"""Durable executions: Idempotency-Key, resumable reasoners handed off at shutdown and
retried after their owner's death, and fencing by attempt.

The multi-replica tests run three real `agent-server run` processes on one real Redis behind
a real haproxy (tests/support/cluster.py's Cluster). The `steps` reasoner reports each step it
completes to the test's Redis with its attempt and process: the test's own account of the
work, independent of the server's records.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server import Settings
from agent_server.model.status import TERMINAL
from tests.apps.tests_app import make_agent
from tests.support.cluster import Cluster, metric, started_cluster, wait_for
from tests.support.redis_server import RedisServer

WAIT = 10.0
STEPS = 20


@pytest.fixture(params=["redis", "postgres"])
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, redis_server: RedisServer
) -> Iterator[Cluster]:
    """Three replicas on Redis, then on Postgres; either way the reasoners report their steps
    to the test's Redis (`steps_done`), a witness apart from the store."""
    store = request.getfixturevalue("postgres_url") if request.param == "postgres" else None
    with started_cluster(
        tmp_path,
        redis_server,
        *("--grace-period", "8", "--drain-timeout", "1", "--cancel-timeout", "1"),
        env={"TESTS_REDIS_URL": redis_server.url},
        store=store,
    ) as running:
        yield running


def steps_done(redis: RedisServer, execution_id: str) -> list[tuple[int, int, int, float]]:
    """(attempt, step, pid, time) for each step the reasoner reported, in report order."""
    reply = redis.command("LRANGE", f"tests:steps:{execution_id}", "0", "-1") or b""
    entries = re.findall(rb"\r\n(\d+:\d+:\d+:[\d.]+)\r\n", reply)
    parsed = []
    for entry in entries:
        attempt, step, pid, at = entry.decode().split(":")
        parsed.append((int(attempt), int(step), int(pid), float(at)))
    return parsed


def reports(server: Any) -> list[dict[str, Any]]:
    return [
        json.loads(found) for found in re.findall(r"shutdown report: (\{.*\})", server.stderr())
    ]


def final(url: str, execution_id: str, timeout: float = 60.0) -> dict[str, Any]:
    """The execution once terminal, polled with long-polls (each bounded) for `timeout`."""

    def ended() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", params={"wait": 2}, timeout=5)
        except httpx.TransportError:
            return None
        if response.status_code != 200:
            return None
        body: dict[str, Any] = response.json()
        return body if body["status"] in TERMINAL else None

    result: dict[str, Any] = wait_for(ended, timeout=timeout, what=f"the end of {execution_id}")
    return result


# -- idempotency keys --------------------------------------------------------------------------


@pytest.fixture
async def client() -> Any:
    agent = make_agent(Settings(idempotency_ttl=0.5))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        yield client


async def started_count(client: httpx.AsyncClient, reasoner: str) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(
        rf'agent_server_executions_started_total{{reasoner="{reasoner}"}} (\S+)', text
    )
    assert found is not None
    return float(found.group(1))


async def test_a_repeated_request_gets_the_same_execution(client: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "order-42"}
    first = await client.post("/reasoners/sleep/async", json={"seconds": 0.05}, headers=key)
    again = await client.post("/reasoners/sleep/async", json={"seconds": 0.05}, headers=key)
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["execution_id"] == again.json()["execution_id"]
    assert again.headers["location"] == first.headers["location"]
    # A synchronous repeat waits for that same execution, never a second run.
    waited = await client.post("/reasoners/sleep", json={"seconds": 0.05}, headers=key)
    assert waited.status_code == 200
    assert waited.json()["execution_id"] == first.json()["execution_id"]
    assert await started_count(client, "sleep") == 1


async def test_the_same_key_for_another_request_is_422(client: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "k-1"}
    assert (
        await client.post("/reasoners/echo", json={"text": "a"}, headers=key)
    ).status_code == 200
    other_body = await client.post("/reasoners/echo", json={"text": "b"}, headers=key)
    other_session = await client.post(
        "/reasoners/echo", json={"text": "a"}, headers={**key, "X-Session-ID": "s"}
    )
    other_reasoner = await client.post("/reasoners/no_params", headers=key)
    for response in (other_body, other_session, other_reasoner):
        assert response.status_code == 422, response.text
        assert "Idempotency-Key" in response.json()["detail"]
    # Key order in the body does not make it another request.
    key2 = {"Idempotency-Key": "k-2"}
    one = await client.post("/reasoners/sleep", json={"seconds": 0, "marker": None}, headers=key2)
    reordered = b'{"marker": null, "seconds": 0}'
    json_type = {"content-type": "application/json"}
    two = await client.post("/reasoners/sleep", content=reordered, headers={**key2, **json_type})
    assert one.json()["execution_id"] == two.json()["execution_id"]
    # Equal numbers for a float field, and a default sent or left out, are one request.
    three = await client.post("/reasoners/sleep", json={"seconds": 0.0}, headers=key2)
    assert three.json()["execution_id"] == one.json()["execution_id"]
    other = await client.post("/reasoners/sleep", json={"seconds": 0.001}, headers=key2)
    assert other.status_code == 422


@pytest.mark.parametrize("raw", [b"", b"x" * 256, "caf\u00e9".encode(), b"tab\there", b"\x7f"])
async def test_a_malformed_key_is_400_and_starts_nothing(
    client: httpx.AsyncClient, raw: bytes
) -> None:
    response = await client.post(
        "/reasoners/echo", json={"text": "a"}, headers=[(b"idempotency-key", raw)]
    )
    assert response.status_code == 400
    assert "Idempotency-Key" in response.json()["detail"]
    assert await started_count(client, "echo") == 0


async def test_a_key_is_forgotten_after_its_ttl(client: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "short-lived"}
    first = await client.post("/reasoners/echo", json={"text": "a"}, headers=key)
    await asyncio.sleep(0.6)  # the agent's idempotency TTL is 0.5 s
    again = await client.post("/reasoners/echo", json={"text": "a"}, headers=key)
    assert again.json()["execution_id"] != first.json()["execution_id"]
    other = await client.post("/reasoners/echo", json={"text": "b"}, headers=key)
    assert other.status_code == 422  # the key now belongs to the second request


def test_duplicates_racing_on_two_replicas_make_one_execution(cluster: Cluster) -> None:
    async def race() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{cluster.url(n % 2)}/reasoners/sleep/async",
                        json={"seconds": 0.1},
                        headers={"Idempotency-Key": "race"},
                    )
                    for n in range(20)
                )
            )

    answers = asyncio.run(race())
    assert {r.status_code for r in answers} == {202}
    assert len({r.json()["execution_id"] for r in answers}) == 1
    listed = httpx.get(f"{cluster.url(2)}/executions", params={"reasoner": "sleep"}).json()
    assert len(listed) == 1


# -- hand-off at shutdown ----------------------------------------------------------------------


def test_a_rolling_restart_hands_off_resumable_work(cluster: Cluster) -> None:
    with httpx.Client(base_url=cluster.proxy.url, timeout=WAIT) as client:
        ids = [
            client.post("/reasoners/steps/async", json={"count": STEPS, "pause": 0.2}).json()[
                "execution_id"
            ]
            for _ in range(6)
        ]
    handed_off = 0
    for index in range(3):
        time.sleep(0.5)  # let work run (and move) before the next replica goes
        old = cluster.replicas[index]
        old.signal(signal.SIGTERM)
        code, _ = old.wait_exit(WAIT)
        assert code == 0, old.stderr()
        handed_off += sum(report["handed_off"] for report in reports(old))
        old.close()
        cluster.replicas[index] = cluster.start(index)
        cluster.replicas[index].wait_ready()
    ends = {execution_id: final(cluster.proxy.url, execution_id) for execution_id in ids}
    assert {body["status"] for body in ends.values()} == {"succeeded"}, ends
    assert all(body["result"]["steps"] == STEPS for body in ends.values())
    assert handed_off >= 1  # the rollout did move work
    # Each hand-off made one more attempt, and nothing else did.
    assert sum(body["attempt"] - 1 for body in ends.values()) == handed_off
    for execution_id in ids:
        done = steps_done(cluster.redis, execution_id)
        assert {step for _, step, _, _ in done} == set(range(STEPS)), done  # no step lost
        attempts = [attempt for attempt, _, _, _ in sorted(done, key=lambda e: e[3])]
        assert attempts == sorted(attempts), done  # never two attempts at once


def test_a_sync_caller_on_a_draining_replica_is_sent_to_the_execution(cluster: Cluster) -> None:
    async def call_then_drain() -> httpx.Response:
        async with httpx.AsyncClient(timeout=WAIT) as client:
            call = asyncio.create_task(
                client.post(
                    f"{cluster.url(0)}/reasoners/steps",
                    json={"count": 10, "pause": 0.2, "marker": "sync-steps"},
                )
            )
            await asyncio.to_thread(cluster.replicas[0].wait_marker, "sync-steps")
            cluster.replicas[0].signal(signal.SIGTERM)
            return await call

    response = asyncio.run(call_then_drain())
    assert response.status_code == 503, response.text
    assert response.headers["retry-after"]
    location = response.headers["location"]
    assert location == f"/executions/{response.json()['execution_id']}"
    body = final(cluster.url(1), response.json()["execution_id"])
    assert (body["status"], body["attempt"]) == ("succeeded", 2)
    assert body["result"] == {"steps": 10, "attempt": 2}


# -- retry after an owner's death ----------------------------------------------------------


def test_kill_9_retries_resumable_work_and_loses_the_rest(cluster: Cluster) -> None:
    url = cluster.url(0)
    resumable = httpx.post(
        f"{url}/reasoners/steps/async", json={"count": 8, "pause": 0.2}, timeout=5
    ).json()["execution_id"]
    once = httpx.post(
        f"{url}/reasoners/steps_once/async", json={"count": 50, "pause": 0.2}, timeout=5
    ).json()["execution_id"]
    plain = httpx.post(f"{url}/reasoners/sleep/async", json={"seconds": 60}, timeout=5).json()[
        "execution_id"
    ]
    wait_for(lambda: steps_done(cluster.redis, resumable), what="a step done")
    cluster.replicas[0].proc.kill()
    cluster.replicas[0].proc.wait(timeout=WAIT)

    body = final(cluster.url(1), resumable, timeout=30)
    assert (body["status"], body["attempt"]) == ("succeeded", 2)
    assert body["replica"] != cluster.replicas[0].replica_id
    assert {step for _, step, _, _ in steps_done(cluster.redis, resumable)} == set(range(8))
    for execution_id in (once, plain):  # max_attempts 1, and not resumable at all
        lost = final(cluster.url(2), execution_id, timeout=30)
        assert lost["status"] == "lost"
        assert lost["error"]["type"] == "ExecutionLost"


# -- fencing by attempt ----------------------------------------------------------------------


def test_a_stale_attempt_cannot_overwrite_the_newer_one(cluster: Cluster) -> None:
    owner = cluster.replicas[0]
    execution_id = httpx.post(
        f"{cluster.url(0)}/reasoners/slow_first_attempt/async", json={"first": 3}, timeout=5
    ).json()["execution_id"]
    owner.wait_marker("first-attempt")
    os.kill(owner.proc.pid, signal.SIGSTOP)
    try:
        body = final(cluster.url(1), execution_id, timeout=30)
    finally:
        os.kill(owner.proc.pid, signal.SIGCONT)
    assert (body["status"], body["result"], body["attempt"]) == ("succeeded", "fresh", 2)
    # The first attempt wakes, tries to checkpoint and to end: both refused.
    wait_for(
        lambda: metric(cluster.url(0), "agent_server_store_fenced_writes_total") >= 1,
        what="the fenced write",
    )
    again = httpx.get(f"{cluster.url(2)}/executions/{execution_id}", timeout=5).json()
    assert (again["status"], again["result"], again["attempt"]) == ("succeeded", "fresh", 2)
    assert re.search(rf"{execution_id}.*refused", owner.stderr()), owner.stderr()


async def test_a_key_whose_execution_was_forgotten_is_409(client: httpx.AsyncClient) -> None:
    key = {"Idempotency-Key": "forgotten"}
    first = await client.post("/reasoners/echo", json={"text": "a"}, headers=key)
    assert (await client.delete(f"/executions/{first.json()['execution_id']}")).status_code == 204
    again = await client.post("/reasoners/echo", json={"text": "a"}, headers=key)
    assert again.status_code == 409
    assert "forgotten" in again.json()["detail"]
    assert await started_count(client, "echo") == 1  # never a second run


async def test_a_queued_execution_reads_no_replica_and_is_cancelled_at_once(
    server_factory: Any, redis_url: str
) -> None:
    """docs/api.md: `replica` is "" while queued, and a queued execution (nobody runs it)
    ends `cancelled` at once: the cancel answers 200 with the ended execution and its
    duration; DELETE before that says it is queued."""
    from agent_server.store.redis import RedisStore
    from tests.support.stores import eventually, resumable

    server = server_factory(
        "tests_app:agent", "--store", redis_url, "--max-inflight", "1", "--replica-id", "B"
    )
    server.wait_ready()
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
        # B's one slot is taken, so the queued execution below waits for good.
        busy = await client.post("/reasoners/sleep/async", json={"seconds": 30})
        assert busy.status_code == 202
        a = RedisStore(redis_url, replica_id="A", agent_name="tests")  # B's agent
        await a.open()
        try:
            execution = resumable("A")
            await a.create(execution)
            execution.mark_queued()
            assert execution.to_json()["replica"] == ""  # the local view says it too
            a.hand_off(execution)
            path = f"/executions/{execution.execution_id}"

            async def queued() -> dict[str, Any] | None:
                body: dict[str, Any] = (await client.get(path)).json()
                return body if body["status"] == "queued" else None

            body = await eventually(queued, timeout=10)
            assert (body["replica"], body["attempt"]) == ("", 2)
            refused = await client.delete(path)
            assert refused.status_code == 409
            assert "queued" in refused.json()["detail"]
            cancel = await client.post(f"{path}/cancel")
            assert cancel.status_code == 200, cancel.text
            ended = cancel.json()
            assert (ended["status"], ended["status_reason"]) == ("cancelled", "request")
            assert isinstance(ended["duration_seconds"], float) and ended["duration_seconds"] >= 0
            assert ended["finished_at"] is not None
            assert (await client.get(path)).json() == ended
            assert (await client.delete(path)).status_code == 204
        finally:
            await a.close()
            await client.post(f"/executions/{busy.json()['execution_id']}/cancel")


async def test_claimed_work_this_replica_cannot_run_ends_failed_and_is_counted(
    server_factory: Any, redis_url: str
) -> None:
    """A replica that claims an execution whose reasoner it does not serve (a rollout that
    renamed it) ends it `failed` through its registry: recorded, logged and counted like
    any other end, not written past the metrics."""
    from agent_server.model.execution import Execution
    from agent_server.store.redis import RedisStore
    from tests.support.stores import eventually

    server = server_factory("tests_app:agent", "--store", redis_url, "--replica-id", "B")
    server.wait_ready()
    a = RedisStore(redis_url, replica_id="A", agent_name="tests")  # B's agent
    await a.open()
    try:
        execution = Execution("renamed_away", None, "A")
        execution.resumable, execution.body, execution.max_attempts = True, {}, 3
        await a.create(execution)
        execution.mark_queued()
        a.hand_off(execution)
        path = f"/executions/{execution.execution_id}"
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:

            async def ended() -> dict[str, Any] | None:
                body: dict[str, Any] = (await client.get(path)).json()
                return body if body["status"] in TERMINAL else None

            body = await eventually(ended, timeout=10)
            assert body["status"] == "failed"
            assert body["error"]["type"] == "LookupError"
            assert "not resumable here" in body["error"]["message"]
            metrics = (await client.get("/metrics")).text
        started = 'agent_server_executions_started_total{reasoner="renamed_away"} 1.0'
        finished = (
            'agent_server_executions_finished_total{reasoner="renamed_away",status="failed"} 1.0'
        )
        assert started in metrics and finished in metrics
        assert f"cannot resume execution {execution.execution_id}" in server.stderr()
    finally:
        await a.close()


# -- accepted work is never failed unrun (section 12) --------------------------------------------


@pytest.mark.parametrize("delay", ["0.3", None])
def test_a_claim_whose_answer_was_lost_runs_its_first_run(
    server_factory: Any, redis_server: RedisServer, redis_url: str, delay: str | None
) -> None:
    """Redis runs the claim of a delayed (or queued-while-full) non-resumable start, but its
    answer is held past the command timeout (a slow reply, as a pause or a cut gives): the
    record is running under the claimer, attempt 1, and no body ever started. The repair
    puts it back on the queue with its attempt unchanged, and it runs as its first run:
    `succeeded`, its body run exactly once, never `failed` unrun ("not resumable here")."""
    from agent_server.store.redis import COMMAND_TIMEOUT
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        args = ["--store", proxy.url, "--replica-id", "A", "--lease-ttl", "3"]
        if delay is None:
            args += ["--max-inflight", "1", "--queue-when-full"]
        server = server_factory("tests_app:agent", *args, env={"TESTS_REDIS_URL": redis_server.url})
        key = f"lost-claim-{os.urandom(4).hex()}"
        # Only the claim's reply carries the body, and with it this key.
        proxy.stall(key.encode(), COMMAND_TIMEOUT + 1.0, times=1)
        busy = None
        if delay is None:  # the one slot is taken: the start is queued, claimed once free
            busy = httpx.post(f"{server.url}/reasoners/sleep/async", json={"seconds": 0.5})
            assert busy.status_code == 202
        params = {} if delay is None else {"delay": delay}
        started = httpx.post(
            f"{server.url}/reasoners/counted/async", params=params, json={"key": key}
        )
        assert started.status_code == 202, started.text
        assert started.json()["status"] == "queued"
        execution_id = started.json()["execution_id"]
        body = final(server.url, execution_id, timeout=30)
        assert proxy.stalled == 1  # the claim's answer was lost once
        assert body["status"] == "succeeded", body
        assert body["attempt"] == 1
        assert body["result"] == {"key": key, "runs": 1}
        assert redis_server.command("GET", f"tests:runs:{key}") == b"$1\r\n1\r\n"
        assert "so it never started; it goes back to the queue" in server.stderr()
    finally:
        proxy.stop()


def test_a_claim_unanswered_past_its_token_memory_still_runs_its_first_run(
    server_factory: Any, redis_server: RedisServer, redis_url: str
) -> None:
    """Section 12, accepted work is never failed unrun, however long the repair takes to
    see it. Redis runs the claim of a delayed non-resumable start but its answer is lost;
    then the replica's repair cannot read what it owns for longer than it used to remember
    the claim (its lease plus the command timeout: every reply carrying the record is held
    past the command timeout, twice more). When the repair finally reads it, the record is
    still running under the replica, attempt 1, its body never begun: it must go back for
    its first run (`succeeded`, run once), not to attempt 2, which the claimer refuses
    ("not resumable here": `failed`, its body never run)."""
    from agent_server.store.redis import COMMAND_TIMEOUT
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        args = ["--store", proxy.url, "--replica-id", "A", "--lease-ttl", "1"]
        server = server_factory("tests_app:agent", *args, env={"TESTS_REDIS_URL": redis_server.url})
        key = f"forgotten-claim-{os.urandom(4).hex()}"
        session = f"s-{key}"
        # Only the rows of this record carry its session id: the claim's reply, then the
        # repair's reads of what the replica owns (the queued notice names the id only).
        proxy.stall(session.encode(), COMMAND_TIMEOUT + 1.0, times=3)
        started = httpx.post(
            f"{server.url}/reasoners/counted/async",
            params={"delay": "0.3"},
            json={"key": key},
            headers={"X-Session-ID": session},
        )
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        wait_for(lambda: proxy.stalled >= 3, timeout=30, what="the claim and two repairs held")
        body = final(server.url, execution_id, timeout=30)
        assert body["status"] == "succeeded", body
        assert body["attempt"] == 1
        assert body["result"] == {"key": key, "runs": 1}
        assert redis_server.command("GET", f"tests:runs:{key}") == b"$1\r\n1\r\n"
        assert "so it never started; it goes back to the queue" in server.stderr()
        assert "not resumable here" not in server.stderr()
    finally:
        proxy.stop()


def test_a_claim_unanswered_when_its_replica_shuts_down_runs_its_first_run_elsewhere(
    server_factory: Any, redis_server: RedisServer, redis_url: str
) -> None:
    """Section 12, accepted work is never failed unrun, at a rollout too. Redis runs the
    claim of a delayed non-resumable start for replica A, but the claim's answer, then the
    repair's first read of what A owns, are held past the command timeout: the record is
    running under A, attempt 1, its body never begun. A is then rolled (SIGTERM, exit 0)
    before a repair reads it: its close must put it back on the queue before A's liveness
    ends, so replica B, started after, runs its first run (`succeeded`, run once), rather
    than reading it `lost` because A stopped renewing."""
    from agent_server.store.redis import COMMAND_TIMEOUT
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        env = {"TESTS_REDIS_URL": redis_server.url}
        args = ["--lease-ttl", "30", "--unready-delay", "0"]
        a = server_factory(
            "tests_app:agent", "--store", proxy.url, "--replica-id", "A", *args, env=env
        )
        key = f"rolled-claim-{os.urandom(4).hex()}"
        session = f"s-{key}"
        # Only the rows of this record carry its session id: the claim's reply, then the
        # repair's read of what A owns.
        proxy.stall(session.encode(), COMMAND_TIMEOUT + 1.0, times=2)
        started = httpx.post(
            f"{a.url}/reasoners/counted/async",
            params={"delay": "0.3"},
            json={"key": key},
            headers={"X-Session-ID": session},
        )
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        wait_for(lambda: proxy.stalled >= 2, timeout=30, what="the claim and a repair held")
        a.signal(signal.SIGTERM)
        code, _ = a.wait_exit(WAIT)
        assert code == 0, a.stderr()
        assert redis_server.command("GET", f"tests:runs:{key}") == b"$-1\r\n"  # never ran
        b = server_factory(
            "tests_app:agent", "--store", redis_url, "--replica-id", "B", *args, env=env
        )
        body = final(b.url, execution_id, timeout=30)
        assert body["status"] == "succeeded", body
        assert (body["attempt"], body["replica"]) == (1, "B"), body
        assert body["result"] == {"key": key, "runs": 1}
        assert "so it never started; it goes back to the queue" in a.stderr(), a.stderr()
    finally:
        proxy.stop()


def test_a_take_its_replica_could_not_settle_at_close_runs_its_first_run_elsewhere(
    server_factory: Any, redis_server: RedisServer, redis_url: str
) -> None:
    """As above (a claim unanswered, then a repair's read held), but Redis is cut off from
    the replica when it is rolled: its close cannot put the take back. It says so in a
    WARNING naming what it could not settle, and still exits 0 within its bound (two
    command timeouts for the takes, one for the liveness), never hanging on Redis. The
    record says what A could not: the body never began (no begin mark). Once A's lease
    lapses, replica B's judge puts it back for its first run (`succeeded`, attempt 1, run
    once), where it used to end `lost`, its body never run."""
    from agent_server.store.redis import COMMAND_TIMEOUT
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        env = {"TESTS_REDIS_URL": redis_server.url}
        args = ["--lease-ttl", "2", "--unready-delay", "0"]
        a = server_factory(
            "tests_app:agent", "--store", proxy.url, "--replica-id", "A", *args, env=env
        )
        key = f"cut-claim-{os.urandom(4).hex()}"
        session = f"s-{key}"
        proxy.stall(session.encode(), COMMAND_TIMEOUT + 1.0, times=2)
        started = httpx.post(
            f"{a.url}/reasoners/counted/async",
            params={"delay": "0.3"},
            json={"key": key},
            headers={"X-Session-ID": session},
        )
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        wait_for(lambda: proxy.stalled >= 2, timeout=30, what="the claim and a repair held")
        proxy.cut("refuse")
        a.signal(signal.SIGTERM)
        code, took = a.wait_exit(WAIT)
        assert code == 0, a.stderr()
        assert took < 4 * COMMAND_TIMEOUT + 2, took
        assert "closes with takes it never began unsettled" in a.stderr(), a.stderr()
        assert "claims unanswered 1" in a.stderr(), a.stderr()
        assert "Traceback" not in a.stderr(), a.stderr()
        b = server_factory(
            "tests_app:agent", "--store", redis_url, "--replica-id", "B", *args, env=env
        )
        body = final(b.url, execution_id, timeout=30)
        assert body["status"] == "succeeded", body
        assert (body["attempt"], body["replica"]) == (1, "B"), body
        assert body["result"] == {"key": key, "runs": 1}
        assert redis_server.command("GET", f"tests:runs:{key}") == b"$1\r\n1\r\n"
    finally:
        proxy.stop()


def test_a_claim_that_lands_while_draining_never_starts_there(
    server_factory: Any, redis_server: RedisServer, redis_url: str
) -> None:
    """A claim sent while A admitted work, answered once A's admission had closed (SIGTERM,
    its drain waiting for other work): A must not start it (its drain would cancel it at the
    deadline, a body begun only to be stopped). It goes back to the queue, and replica B,
    started after, runs its first run."""
    from tests.support.faults import CutProxy

    proxy = CutProxy(redis_server.port)
    proxy.start()
    try:
        env = {"TESTS_REDIS_URL": redis_server.url}
        args = ["--lease-ttl", "30", "--unready-delay", "0"]
        a = server_factory(
            "tests_app:agent", "--store", proxy.url, "--replica-id", "A", *args, env=env
        )
        busy = httpx.post(f"{a.url}/reasoners/sleep/async", json={"seconds": 3})
        assert busy.status_code == 202, busy.text
        key = f"drained-claim-{os.urandom(4).hex()}"
        # The claim's reply carries the body (this key): held less than the command timeout.
        proxy.stall(key.encode(), 1.5, times=1)
        started = httpx.post(
            f"{a.url}/reasoners/counted/async", params={"delay": "0.3"}, json={"key": key}
        )
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        wait_for(lambda: proxy.stalled >= 1, timeout=30, what="the claim's answer held")
        a.signal(signal.SIGTERM)
        code, _ = a.wait_exit(WAIT)
        assert code == 0, a.stderr()
        assert redis_server.command("GET", f"tests:runs:{key}") == b"$-1\r\n", a.stderr()
        b = server_factory(
            "tests_app:agent", "--store", redis_url, "--replica-id", "B", *args, env=env
        )
        body = final(b.url, execution_id, timeout=30)
        assert body["status"] == "succeeded", body
        assert (body["attempt"], body["replica"]) == (1, "B"), body
        assert body["result"] == {"key": key, "runs": 1}
        assert "taken from the queue as admission closed" in a.stderr(), a.stderr()
    finally:
        proxy.stop()
