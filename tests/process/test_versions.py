"""Versions: new code never silently resumes what old code checkpointed.

Real `agent-server run` processes of two versions of one app (tests/apps/versions_app.py) on
one real Redis, then on one real Postgres (`store_url`). v1 runs a resumable job that
checkpoints `{"done": n}`; it is moved to v2 (whose shape is `{"steps": n}`) by a hand-off at
SIGTERM or a retry after kill -9, and v2 meets the checkpoint by what it declares:
compatible, migrate, a migration that raises, restart, fail; or the work waits for a live v1
replica. The witness is the body's own note (to the test's Redis, whichever store the
replicas share) of the checkpoint each attempt began from, with its version: v2 never begins
from a v1 checkpoint unless it declared it reads one.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.model.status import TERMINAL
from tests.support.cluster import Replica, metric, wait_for
from tests.support.process import free_port
from tests.support.redis_server import RedisServer

WAIT = 10.0
FLAGS = ("--grace-period", "8", "--drain-timeout", "0.5", "--cancel-timeout", "1")


class Versions:
    """Starts replicas of a version on the test's store, and closes them all at the end."""

    def __init__(self, tmp_path: Path, redis: RedisServer, store: str, rule: str) -> None:
        self.tmp_path = tmp_path
        self.redis = redis
        self.store = store
        self.rule = rule
        self.started: list[Replica] = []

    def start(self, version: str, *extra: str) -> Replica:
        index = len(self.started)
        marker_dir = self.tmp_path / f"{version}-{index}"
        marker_dir.mkdir()
        env = {
            "AGENT_SERVER_VERSION": version,
            "TESTS_V2_RULE": self.rule,
            "TESTS_REDIS_URL": self.redis.url,
        }
        replica = Replica(
            free_port(),
            f"{version}-{index}",
            self.store,
            marker_dir,
            [*FLAGS, *extra],
            env,
            "versions_app:agent",
        )
        self.started.append(replica)
        replica.wait_ready()
        return replica

    def close(self) -> None:
        for replica in self.started:
            replica.close()

    def notes(self, execution_id: str) -> list[dict[str, Any]]:
        """What each attempt's body noted when it began (the witness)."""
        reply = self.redis.command("LRANGE", f"tests:versions:{execution_id}", "0", "-1") or b""
        return [json.loads(line) for line in reply.decode().split("\r\n") if line.startswith("{")]

    def record(self, execution_id: str, field: str) -> str | None:
        """A field of the execution's record as the store keeps it: the Redis hash's, or
        the Postgres row's (its document's, or a column of its own)."""
        if not self.store.startswith("postgres"):
            key = f"{{agent-server:versions}}:x:{execution_id}"
            reply = self.redis.command("HGET", key, field) or b""
            return (
                reply.decode().split("\r\n")[1]
                if reply.startswith(b"$") and reply != b"$-1\r\n"
                else None
            )
        import psycopg

        with psycopg.connect(self.store, connect_timeout=5) as conn:
            if field == "checkpoint_aside":
                row = conn.execute(
                    "SELECT checkpoint_aside FROM executions WHERE id = %s", (execution_id,)
                ).fetchone()
                return None if row is None else row[0]
            row = conn.execute(
                "SELECT doc FROM executions WHERE id = %s", (execution_id,)
            ).fetchone()
        value = None if row is None else json.loads(row[0]).get(field)
        return None if value is None else str(value)


@pytest.fixture
def versions(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    redis_url: str,
    redis_server: RedisServer,
    store_url: str,
) -> Iterator[Versions]:
    """Replicas on Redis, then on Postgres; the witness's notes on the Redis either way."""
    running = Versions(tmp_path, redis_server, store_url, getattr(request, "param", "fail"))
    try:
        yield running
    finally:
        running.close()


def start_job(replica: Replica, count: int = 40) -> str:
    response = httpx.post(
        f"{replica.url}/reasoners/job/async", json={"count": count, "pause": 0.1}, timeout=WAIT
    )
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["execution_id"]
    return execution_id


def checkpointed(versions: Versions, execution_id: str) -> None:
    """Until v1 has written a checkpoint (its steps are in the record)."""
    wait_for(
        lambda: versions.record(execution_id, "checkpoint_version") == "v1",
        what="a checkpoint of v1",
    )


def final(url: str, execution_id: str, timeout: float = 30.0) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", params={"wait": 2}, timeout=5)
        except httpx.TransportError:
            return None
        body: dict[str, Any] = response.json()
        return body if response.status_code == 200 and body["status"] in TERMINAL else None

    found: dict[str, Any] = wait_for(ended, timeout=timeout, what=f"the end of {execution_id}")
    return found


def move_to_v2(versions: Versions, old: Replica, how: str) -> None:
    """Take the execution away from its v1 owner: SIGTERM (a hand-off) or kill -9 (a
    retry once its owner is judged dead)."""
    if how == "handoff":
        old.signal(signal.SIGTERM)
        code, _ = old.wait_exit(WAIT)
        assert code == 0, old.stderr()
        assert "handed off after attempt 1" in old.stderr()
    else:
        old.proc.kill()
        old.proc.wait(timeout=WAIT)


def moved_to_v2(versions: Versions, how: str, count: int = 40) -> tuple[Replica, str]:
    """A job begun on v1 that checkpointed, moved away from it (`move_to_v2`) while a v2
    replica runs: that replica, and the execution's id."""
    old, new = versions.start("v1"), versions.start("v2")
    execution_id = start_job(old, count)
    checkpointed(versions, execution_id)
    move_to_v2(versions, old, how)
    return new, execution_id


def assert_v2_read_only_what_it_declared(notes: list[dict[str, Any]], rule: str) -> None:
    """The witness: a v2 body began from a v1 checkpoint (`done`) only where v2 declared it
    reads v1's (`compatible`); after a migration it began from the migrated state."""
    for note in notes:
        if note["version"] != "v2" or note["state"] is None:
            continue
        if rule == "compatible":
            assert set(note["state"]) == {"done"}, notes
        else:
            assert "done" not in note["state"], f"v2 began from a v1 checkpoint: {notes}"


HOW = ("handoff", "kill")


@pytest.mark.parametrize("versions", ["compatible"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_compatible_resumes_the_checkpoint(versions: Versions, how: str) -> None:
    new, execution_id = moved_to_v2(versions, how)
    body = final(new.url, execution_id)
    assert (body["status"], body["version"], body["attempt"]) == ("succeeded", "v2", 2), body
    assert body["result"]["resumed_from"] > 0  # resumed, not restarted
    notes = versions.notes(execution_id)
    assert [(n["version"], n["attempt"]) for n in notes] == [("v1", 1), ("v2", 2)], notes
    assert_v2_read_only_what_it_declared(notes, "compatible")
    assert metric(new.url, "agent_server_version_rules_total", rule="compatible") == 1


@pytest.mark.parametrize("versions", ["migrate"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_migrate_resumes_with_its_result(versions: Versions, how: str) -> None:
    new, execution_id = moved_to_v2(versions, how)
    body = final(new.url, execution_id)
    assert (body["status"], body["version"], body["attempt"]) == ("succeeded", "v2", 2), body
    notes = versions.notes(execution_id)
    began = [n for n in notes if n["version"] == "v2"]
    assert len(began) == 1 and began[0]["state"]["migrated_from"] == "v1", notes
    assert body["result"]["resumed_from"] == began[0]["state"]["steps"] > 0
    assert_v2_read_only_what_it_declared(notes, "migrate")
    assert metric(new.url, "agent_server_version_rules_total", rule="migrate") == 1


@pytest.mark.parametrize("versions", ["migrate_raising"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_a_migration_that_raises_fails_the_execution_with_it(versions: Versions, how: str) -> None:
    new, execution_id = moved_to_v2(versions, how)
    body = final(new.url, execution_id)
    assert body["status"] == "failed", body
    assert body["error"]["type"] == "ValueError", body
    assert "cannot migrate a checkpoint of v1" in body["error"]["message"]
    notes = versions.notes(execution_id)
    assert [n["version"] for n in notes] == ["v1"], f"v2 ran a body: {notes}"
    assert metric(new.url, "agent_server_version_rules_total", rule="migrate_failed") == 1


@pytest.mark.parametrize("versions", ["restart"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_restart_runs_from_the_start_with_the_next_attempt(versions: Versions, how: str) -> None:
    new, execution_id = moved_to_v2(versions, how, count=20)
    body = final(new.url, execution_id)
    assert (body["status"], body["version"], body["attempt"]) == ("succeeded", "v2", 3), body
    assert body["result"]["resumed_from"] == 0
    notes = versions.notes(execution_id)
    assert [(n["version"], n["attempt"], n["state"] is None) for n in notes] == [
        ("v1", 1, True),
        ("v2", 3, True),
    ], notes
    aside = versions.record(execution_id, "checkpoint_aside") or ""
    assert '"done"' in aside  # v1's checkpoint, set aside, not read
    assert metric(new.url, "agent_server_version_rules_total", rule="restart") == 1


@pytest.mark.parametrize("versions", ["fail"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_fail_is_the_default_and_names_both_versions(versions: Versions, how: str) -> None:
    new, execution_id = moved_to_v2(versions, how)
    body = final(new.url, execution_id)
    assert body["status"] == "failed", body
    assert body["error"]["type"] == "VersionMismatch", body
    assert "'v1'" in body["error"]["message"] and "'v2'" in body["error"]["message"]
    assert [n["version"] for n in versions.notes(execution_id)] == ["v1"]
    assert metric(new.url, "agent_server_version_rules_total", rule="fail") == 1


@pytest.mark.parametrize("versions", ["fail"], indirect=True)
@pytest.mark.parametrize("how", HOW)
def test_work_waits_for_a_live_replica_of_its_version(versions: Versions, how: str) -> None:
    """v2 cannot read v1's checkpoint, but another v1 replica is alive: the work waits for it
    (v2 leaves it queued) and v1 resumes it there once it has room."""
    old = versions.start("v1")
    busy = versions.start("v1", "--max-inflight", "1")
    new = versions.start("v2")
    execution_id = start_job(old)
    hold = httpx.post(f"{busy.url}/reasoners/hold/async", json={"seconds": 4}, timeout=WAIT)
    assert hold.status_code == 202, hold.text
    checkpointed(versions, execution_id)
    move_to_v2(versions, old, how)
    wait_for(
        lambda: metric(new.url, "agent_server_version_rules_total", rule="wait") >= 1,
        timeout=WAIT,
        what="v2 leaving the work for v1",
    )
    body = final(new.url, execution_id)
    assert (body["status"], body["version"], body["attempt"]) == ("succeeded", "v1", 2), body
    assert body["replica"] == busy.replica_id
    assert body["result"]["resumed_from"] > 0
    assert [n["version"] for n in versions.notes(execution_id)] == ["v1", "v1"]
    assert metric(new.url, "agent_server_version_rules_total", rule="fail") == 0


@pytest.mark.parametrize("versions", ["restart"], indirect=True)
def test_waiting_work_meets_the_rule_once_its_last_replica_drains(versions: Versions) -> None:
    """The work waits while a v1 replica is alive and admitting; when that replica drains,
    v2 applies its rule (restart) instead of waiting for nobody."""
    old = versions.start("v1")
    busy = versions.start("v1", "--max-inflight", "1")
    new = versions.start("v2")
    execution_id = start_job(old, count=20)
    hold = httpx.post(f"{busy.url}/reasoners/hold/async", json={"seconds": 30}, timeout=WAIT)
    assert hold.status_code == 202, hold.text
    checkpointed(versions, execution_id)
    move_to_v2(versions, old, "handoff")
    wait_for(
        lambda: metric(new.url, "agent_server_version_rules_total", rule="wait") >= 1,
        what="v2 leaving the work for v1",
    )
    busy.signal(signal.SIGTERM)  # the last v1 replica drains: nobody is left to wait for
    body = final(new.url, execution_id)
    assert (body["status"], body["version"]) == ("succeeded", "v2"), body
    assert body["result"]["resumed_from"] == 0
    notes = versions.notes(execution_id)
    assert [(n["version"], n["state"] is None) for n in notes] == [("v1", True), ("v2", True)]
    busy.wait_exit(WAIT)


def test_work_without_a_checkpoint_runs_on_any_version(
    versions: Versions,
) -> None:
    """A start queued before any checkpoint (a delayed start) has nothing to misread: v2
    runs it under the default rule (fail), and says so in `version`."""
    new = versions.start("v2")
    response = httpx.post(
        f"{new.url}/reasoners/job/async",
        params={"delay": 0.5},
        json={"count": 2, "pause": 0.01},
        timeout=WAIT,
    )
    assert response.status_code == 202, response.text
    assert response.json()["version"] is None  # queued: no code ran it yet
    body = final(new.url, response.json()["execution_id"])
    assert (body["status"], body["version"]) == ("succeeded", "v2"), body


def test_the_memory_store_shows_its_one_version(server_factory: Any) -> None:
    """The memory store has one version, its process's: a run shows it, a delayed start
    shows null until its first run, and its checkpoints resume as the same version."""
    served = server_factory(
        "versions_app:agent", env={"AGENT_SERVER_VERSION": "v2", "TESTS_V2_RULE": "fail"}
    )
    with httpx.Client(base_url=served.url, timeout=WAIT) as client:
        ran = client.post("/reasoners/job", json={"count": 2, "pause": 0.01})
        delayed = client.post(
            "/reasoners/job/async", params={"delay": 0.3}, json={"count": 2, "pause": 0.01}
        )
    assert ran.status_code == 200, ran.text
    assert (ran.json()["status"], ran.json()["version"]) == ("succeeded", "v2")
    assert delayed.status_code == 202 and delayed.json()["version"] is None
    body = final(served.url, delayed.json()["execution_id"])
    assert (body["status"], body["version"]) == ("succeeded", "v2"), body


def test_work_for_a_reasoner_only_old_code_serves_waits_for_it_while_it_lives(
    versions: Versions,
) -> None:
    """v2 dropped `old_only`: its queued work (a delayed start) is never failed unrun by
    v2 while a v1 replica lives; it waits for one, here v1 full (--max-inflight 1) as the
    work falls due, and runs there once v1 has room."""
    old = versions.start("v1", "--max-inflight", "1")
    new = versions.start("v2")
    busy = httpx.post(f"{old.url}/reasoners/hold/async", json={"seconds": 2.0}, timeout=WAIT)
    assert busy.status_code == 202, busy.text
    started = httpx.post(
        f"{old.url}/reasoners/old_only/async",
        params={"delay": 0.3},
        json={"n": 7},
        timeout=WAIT,
    )
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    body = final(old.url, execution_id)
    assert (body["status"], body["result"]) == ("succeeded", {"n": 7, "version": "v1"}), body
    assert body["attempt"] == 1
    assert "does not serve it" not in new.stderr()
