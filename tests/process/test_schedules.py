"""Schedules on real `agent-server run` processes (docs/schedules.md): each firing starts
exactly one execution, counted by a witness outside the server (`firings.log`, written by
tests/apps/schedules_app.py), on the memory store and on three replicas sharing a Redis
through kill -9, SIGTERM and a while with every replica down."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.runtime.schedule_entries import firing_id
from tests.support.cluster import Cluster, started_cluster
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

APP = "schedules_app:agent"
WAIT = 20.0


def witnessed(marks: Path, what: str = "start") -> list[dict[str, Any]]:
    path = marks / "firings.log"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["what"] == what]


def wait_until(predicate: Any, timeout: float = WAIT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.05)


def fire_times(first: float, last: float, every: int = 2) -> list[float]:
    """The fire times of `*/every * * * * *` in [first, last]."""
    start = math.ceil(first / every) * every
    return [float(t) for t in range(int(start), int(last) + 1, every)]


def assert_once_each(marks: Path, since: float, until: float, key: str = "tick-0") -> None:
    """Every fire time in [since, until] started exactly one execution, and nothing else ran."""
    starts = [line for line in witnessed(marks) if line["reasoner"] == "tick"]
    counts = Counter(line["id"] for line in starts)
    twice = {i: n for i, n in counts.items() if n > 1}
    assert not twice, f"started more than once: {twice}"
    expected = {firing_id(key, at): at for at in fire_times(since, until)}
    missing = sorted(at for i, at in expected.items() if i not in counts)
    assert not missing, f"fire times with no execution: {missing}"


def test_memory_store_fires_each_time_once_with_schedule_id_and_scheduled_at(
    tmp_path: Path,
) -> None:
    server = ServerProcess([APP], {"SCHEDULE_MARKS": str(tmp_path)}, tmp_path)
    try:
        server.wait_ready()
        began = time.time()
        wait_until(lambda: len(witnessed(tmp_path)) >= 3, what="three firings")
        ended = time.time()
        starts = witnessed(tmp_path)
        first = starts[0]
        with httpx.Client(base_url=server.url, timeout=5) as client:
            body = client.get(f"/executions/{first['id']}").json()
            assert body["schedule_id"] == "tick-0"
            assert body["scheduled_at"] is not None
            listed = client.get("/executions").json()
        assert all(item["schedule_id"] == "tick-0" for item in listed)
        # Fire times before the first replica on a fresh store never run: none before began.
        assert_once_each(tmp_path, began + 2, ended - 1)
        ids = {firing_id("tick-0", at) for at in fire_times(began - 60, began - 1)}
        assert not ids & {line["id"] for line in starts}
        for line in starts:  # each within a second of its fire time (every 2 s, even)
            assert line["at"] - round(line["at"] / 2) * 2 < 1.0
    finally:
        server.close()


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "postgres"])
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Cluster]:
    """Three replicas on one Redis, then on one Postgres."""
    request.getfixturevalue(f"{request.param}_url")  # emptied for this test
    server = request.getfixturevalue(f"{request.param}_server")
    with started_cluster(
        tmp_path, server, env={"SCHEDULE_MARKS": str(tmp_path)}, app=APP
    ) as cluster:
        yield cluster


def test_three_replicas_start_each_firing_once_through_kill_and_sigterm(
    cluster: Cluster, tmp_path: Path
) -> None:
    began = time.time()
    wait_until(lambda: len(witnessed(tmp_path)) >= 2, what="two firings")
    # kill -9 one replica: the others go on firing; the store's idempotent starts still
    # make one execution per fire time.
    cluster.replicas[0].signal(signal.SIGKILL)
    cluster.replicas[0].wait_exit(WAIT)
    seen = len(witnessed(tmp_path))
    wait_until(lambda: len(witnessed(tmp_path)) >= seen + 2, what="firings after kill -9")
    # SIGTERM another: a draining replica fires nothing; the third goes on.
    cluster.replicas[1].signal(signal.SIGTERM)
    cluster.replicas[1].wait_exit(WAIT)
    seen = len(witnessed(tmp_path))
    wait_until(lambda: len(witnessed(tmp_path)) >= seen + 2, what="firings after SIGTERM")
    # Both come back: three replicas fire again.
    cluster.replicas[0] = cluster.start(0)
    cluster.replicas[1] = cluster.start(1)
    for replica in cluster.replicas:
        replica.wait_ready()
    seen = len(witnessed(tmp_path))
    wait_until(lambda: len(witnessed(tmp_path)) >= seen + 3, what="firings on three again")
    ended = time.time()
    assert_once_each(tmp_path, began + 2, ended - 1)
    with httpx.Client(base_url=cluster.url(2), timeout=5) as client:
        one = witnessed(tmp_path)[-1]["id"]
        body = client.get(f"/executions/{one}").json()
    assert body["schedule_id"] == "tick-0"
    assert body["scheduled_at"] is not None


def test_missed_firings_inside_the_window_start_once_each_after_all_replicas_were_down(
    tmp_path: Path, redis_url: str
) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {"SCHEDULE_MARKS": str(marks), "SCHEDULES": "tick,short"}

    def replica(name: str, *extra: str) -> ServerProcess:
        (tmp_path / name).mkdir()
        return ServerProcess(
            [APP, "--store", redis_url, "--replica-id", name, "--lease-ttl", "1", *extra],
            env,
            tmp_path / name,
        )

    first = replica("a")
    try:
        first.wait_ready()
        wait_until(lambda: len(witnessed(marks)) >= 2, what="two firings")
    finally:
        first.signal(signal.SIGKILL)
        first.wait_exit(WAIT)
        first.close()
    down = time.time()
    # The outage: no replica is up (nothing to wait on); `tick` keeps the default 60 s
    # window, `short` a 5 s one.
    time.sleep(9.0)
    up = time.time()
    second = replica("b")
    third = replica("c")
    try:
        second.wait_ready()
        ready = time.time()  # each replica read the marks before it was ready
        third.wait_ready()
        wait_until(lambda: any(line["at"] > up + 3 for line in witnessed(marks)), what="firing")
        ended = time.time()
        with httpx.Client(base_url=second.url, timeout=5) as client:
            metrics = client.get("/metrics").text + third_metrics(third)
    finally:
        second.close()
        third.close()
    ran = {line["id"] for line in witnessed(marks)}
    # Inside the window: every fire time of the outage started late, once.
    assert_once_each(marks, down - 0.5, ended - 1)
    # `short`'s window is 5 s, counted back from a replica's first tick (after `up`,
    # before `ready`): what fell out of it never ran, and was counted as missed.
    old = {firing_id("short-0", at) for at in fire_times(down + 0.5, up - 5.5)}
    assert old and not old & ran
    recent = {firing_id("short-0", at) for at in fire_times(ready - 4.9, up)}
    assert recent and recent <= ran
    missed = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('agent_server_schedule_firings_total{outcome="missed"}')
    )
    assert missed >= len(old)


def third_metrics(server: ServerProcess) -> str:
    with httpx.Client(base_url=server.url, timeout=5) as client:
        return client.get("/metrics").text


def intervals(marks: Path, reasoner: str) -> dict[str, list[float]]:
    """Each execution of `reasoner`: [start, end or cancel] from the witness."""
    spans: dict[str, list[float]] = {}
    for what in ("start", "end", "cancelled"):
        for line in witnessed(marks, what):
            if line["reasoner"] == reasoner:
                spans.setdefault(line["id"], []).append(line["at"])
    return spans


def overlapping(spans: dict[str, list[float]]) -> int:
    """How many pairs of executions ran at the same time (an unfinished one runs on)."""
    closed = [(s[0], s[1] if len(s) > 1 else math.inf) for s in spans.values()]
    return sum(
        1
        for i, (a0, a1) in enumerate(closed)
        for b0, b1 in closed[i + 1 :]
        if a0 < b1 - 0.05 and b0 < a1 - 0.05
    )


@pytest.mark.parametrize("store", ["memory", "redis", "postgres"])
def test_each_overlap_policy(tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    """Every second a firing; each execution runs 2.5 s."""
    url = "memory" if store == "memory" else request.getfixturevalue(f"{store}_url")
    args = [APP] if store == "memory" else [APP, "--store", url, "--lease-ttl", "1"]
    env = {
        "SCHEDULE_MARKS": str(tmp_path),
        "SCHEDULES": "slow_skip,slow_buffer,slow_all,slow_cancel",
    }
    server = ServerProcess(args, env, tmp_path)
    try:
        server.wait_ready()
        wait_until(
            lambda: len(intervals(tmp_path, "slow_skip")) >= 3, timeout=WAIT, what="3 skip runs"
        )
        with httpx.Client(base_url=server.url, timeout=5) as client:
            metrics = client.get("/metrics").text
            queued = client.get("/executions", params={"status": "queued"}).json()
    finally:
        server.close()
    skip = intervals(tmp_path, "slow_skip")
    buffer = intervals(tmp_path, "slow_buffer")
    every = intervals(tmp_path, "slow_all")
    cancel = intervals(tmp_path, "slow_cancel")
    # skip: never two at once, and the firings in between were skipped.
    assert overlapping(skip) == 0, skip
    assert 'agent_server_schedule_firings_total{outcome="skipped"} 0.0' not in metrics
    # buffer_one: never two at once; each waited for the previous (started on its end).
    assert overlapping(buffer) == 0, buffer
    starts = sorted(s[0] for s in buffer.values())
    ends = sorted(s[1] for s in buffer.values() if len(s) > 1)
    assert len(starts) >= 2
    for end, start in zip(ends, starts[1:], strict=False):
        assert 0 <= start - end < 1.0, (ends, starts)
    # ... and at most one waits at a time.
    assert sum(1 for e in queued if e["reasoner"] == "slow_buffer") <= 1, queued
    # allow_all: they run side by side.
    assert overlapping(every) >= 2, every
    # cancel_other: each firing cancelled the one before.
    cancelled = [s for s in cancel.values() if len(s) > 1]
    assert len(cancelled) >= 2, cancel
    assert all(s[1] - s[0] < 1.6 for s in cancelled), cancel


KEYS = {
    "schedule_id",
    "reasoner",
    "cron",
    "timezone",
    "input",
    "session_id",
    "overlap",
    "catchup_window",
    "enabled",
    "declared",
    "next_fire_at",
    "created_at",
    "owner",
    "tenant",
}


@pytest.mark.parametrize("store", ["memory", "redis", "postgres"])
def test_the_schedules_api(tmp_path: Path, store: str, request: pytest.FixtureRequest) -> None:
    url = "memory" if store == "memory" else request.getfixturevalue(f"{store}_url")
    args = [APP] if store == "memory" else [APP, "--store", url, "--lease-ttl", "1"]
    server = ServerProcess(args, {"SCHEDULE_MARKS": str(tmp_path)}, tmp_path)
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            # Refusals name the field, and change nothing.
            for body, field in [
                ({"reasoner": "plain", "cron": "* * *"}, "cron"),
                ({"reasoner": "plain", "cron": "61 * * * *"}, "cron"),
                ({"reasoner": "plain"}, "cron"),
                ({"reasoner": "plain", "cron": "* * * * *", "timezone": "Mars/Base"}, "timezone"),
                ({"reasoner": "nobody", "cron": "* * * * *"}, "reasoner"),
                ({"reasoner": "plain", "cron": "* * * * *", "input": {"n": "x"}}, "input"),
                ({"reasoner": "plain", "cron": "* * * * *", "overlap": "queue"}, "overlap"),
                (
                    {"reasoner": "plain", "cron": "* * * * *", "catchup_window": -1},
                    "catchup_window",
                ),
                (  # past what a float holds: refused as any out of range
                    {"reasoner": "plain", "cron": "* * * * *", "catchup_window": 10**400},
                    "catchup_window",
                ),
                ({"reasoner": "plain", "cron": "* * * * *", "colour": "red"}, "colour"),
            ]:
                refused = client.post("/schedules", json=body)
                assert refused.status_code == 422, (body, refused.text)
                assert refused.json()["detail"].startswith(f"{field}:"), refused.text
            assert client.post("/schedules", content=b"[1]").status_code == 422
            listed = client.get("/schedules").json()
            assert [s["schedule_id"] for s in listed] == ["tick-0"]
            assert set(listed[0]) == KEYS and listed[0]["declared"] is True
            # A declared one is not deleted; PATCH may only disable or enable it.
            assert client.delete("/schedules/tick-0").status_code == 409
            assert client.patch("/schedules/tick-0", json={"cron": "* * * * *"}).status_code == 422
            assert client.get("/schedules/nothing").status_code == 404
            # Made, read, changed, triggered, listed, deleted.
            made = client.post(
                "/schedules",
                json={"reasoner": "plain", "cron": "0 0 1 1 *", "input": {"n": 7}},
            )
            assert made.status_code == 201, made.text
            schedule = made.json()
            assert set(schedule) == KEYS and schedule["declared"] is False
            assert schedule["timezone"] == "UTC" and schedule["overlap"] == "skip"
            assert schedule["catchup_window"] == 60
            sid = schedule["schedule_id"]
            assert client.get(f"/schedules/{sid}").json() == schedule
            patched = client.patch(f"/schedules/{sid}", json={"enabled": False})
            assert patched.status_code == 200 and patched.json()["enabled"] is False
            assert patched.json()["next_fire_at"] is None
            triggered = client.post(f"/schedules/{sid}/trigger")  # ignores enabled
            assert triggered.status_code == 202, triggered.text
            execution = triggered.json()
            assert execution["schedule_id"] == sid and execution["reasoner"] == "plain"
            ended = client.get(f"/executions/{execution['execution_id']}", params={"wait": 5})
            assert ended.json()["result"] == 7
            by_schedule = client.get("/executions", params={"schedule_id": sid}).json()
            assert [e["execution_id"] for e in by_schedule] == [execution["execution_id"]]
            assert client.delete(f"/schedules/{sid}").status_code == 204
            assert client.get(f"/schedules/{sid}").status_code == 404
            assert client.post(f"/schedules/{sid}/trigger").status_code == 404
            assert [s["schedule_id"] for s in client.get("/schedules").json()] == ["tick-0"]
            assert client.patch("/schedules/tick-0", json={"enabled": False}).status_code == 200
            disabled_at = time.time()
            assert client.get("/schedules/tick-0").json()["enabled"] is False
        # A disabled period's fire times never run.
        time.sleep(3.0)  # the disabled period itself: nothing may happen in it
        late = [
            line
            for line in witnessed(tmp_path)
            if line["reasoner"] == "tick" and line["at"] > disabled_at + 1.0
        ]
        assert not late, late
    finally:
        server.close()


def test_a_schedule_is_its_tenants(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("token-a alice acme\ntoken-b bob globex\ntoken-c carol acme nostart\n")
    server = ServerProcess(
        [APP, "--api-tokens-file", str(tokens)], {"SCHEDULE_MARKS": str(tmp_path)}, tmp_path
    )
    try:
        server.wait_ready()
        a = {"Authorization": "Bearer token-a"}
        b = {"Authorization": "Bearer token-b"}
        with httpx.Client(base_url=server.url, timeout=5) as client:
            made = client.post(
                "/schedules", json={"reasoner": "plain", "cron": "0 0 1 1 *"}, headers=a
            )
            assert made.status_code == 201, made.text
            sid = made.json()["schedule_id"]
            assert client.get("/schedules").status_code == 401
            assert [s["schedule_id"] for s in client.get("/schedules", headers=b).json()] == [
                "tick-0"
            ]
            for method, path in [
                ("GET", f"/schedules/{sid}"),
                ("PATCH", f"/schedules/{sid}"),
                ("DELETE", f"/schedules/{sid}"),
                ("POST", f"/schedules/{sid}/trigger"),
            ]:
                kwargs: dict[str, Any] = {"json": {"enabled": False}} if method == "PATCH" else {}
                answer = client.request(method, path, headers=b, **kwargs)
                assert answer.status_code == 404, (method, path, answer.text)
            # `schedule` never stands in for `start`: a schedule starts work in its
            # owner's name, so who makes, re-enables or triggers one must be allowed to.
            c = {"Authorization": "Bearer token-c"}
            for method, path, body in [
                ("POST", "/schedules", {"reasoner": "plain", "cron": "0 0 1 1 *"}),
                ("PATCH", f"/schedules/{sid}", {"input": {}}),
                ("POST", f"/schedules/{sid}/trigger", None),
            ]:
                denied = client.request(method, path, json=body, headers=c)
                assert denied.status_code == 403, (method, path, denied.text)
                assert denied.json() == {"detail": "not allowed to start"}
            assert client.patch(f"/schedules/{sid}", json={"enabled": False}, headers=c).is_success
            assert client.patch(f"/schedules/{sid}", json={"enabled": True}, headers=a).is_success
            fired = client.post(f"/schedules/{sid}/trigger", headers=a)
            assert fired.status_code == 202, fired.text
            assert fired.json()["tenant"] == "acme"
            execution_id = fired.json()["execution_id"]
            assert client.get(f"/executions/{execution_id}", headers=b).status_code == 404
            assert client.get("/schedules/" + sid, headers=a).json()["enabled"] is True
            # A declared schedule is the agent's: read by all, changed by an admin only.
            assert client.get("/schedules/tick-0", headers=b).status_code == 200
            off = client.patch("/schedules/tick-0", json={"enabled": False}, headers=b)
            assert off.status_code == 403, off.text
            assert client.post("/schedules/tick-0/trigger", headers=a).status_code == 403
            assert client.delete("/schedules/tick-0", headers=a).status_code == 403
            assert client.get("/schedules/tick-0", headers=a).json()["enabled"] is True
    finally:
        server.close()


def test_the_client_and_the_cli(tmp_path: Path) -> None:
    from agent_server.client import AgentClient, Conflict

    server = ServerProcess([APP], {"SCHEDULE_MARKS": str(tmp_path)}, tmp_path)
    try:
        server.wait_ready()

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "agent_server", "schedules", *args, "--url", server.url],
                capture_output=True,
                text=True,
                timeout=30,
            )

        made = cli("create", "plain", "0 0 1 1 *", "--input", '{"n": 4}', "--overlap", "allow_all")
        assert made.returncode == 0, made.stderr
        sid = json.loads(made.stdout)["schedule_id"]
        assert json.loads(cli("disable", sid).stdout)["enabled"] is False
        fired = cli("trigger", sid)
        assert fired.returncode == 0, fired.stderr
        assert json.loads(fired.stdout)["schedule_id"] == sid
        bad = cli("create", "plain", "61 * * * *")
        assert bad.returncode != 0 and "cron" in bad.stderr
        with AgentClient(server.url) as client:
            ids = [s["schedule_id"] for s in client.schedules()]
            assert sorted(ids) == sorted(["tick-0", sid])
            assert client.get_schedule(sid)["input"] == {"n": 4}
            assert client.update_schedule(sid, {"enabled": True})["enabled"] is True
            execution = client.trigger_schedule(sid)
            assert client.wait(execution.execution_id, 5).result == 4
            with pytest.raises(Conflict):
                client.delete_schedule("tick-0")
            client.delete_schedule(sid)
            made_here = client.create_schedule("plain", "0 0 1 1 *", {"timezone": "Asia/Tokyo"})
            assert made_here["timezone"] == "Asia/Tokyo"
        assert cli("delete", sid).returncode != 0  # gone
    finally:
        server.close()


def test_a_schedule_made_on_one_replica_fires_once_on_three_and_is_deleted_on_all(
    tmp_path: Path, redis_url: str, redis_server: RedisServer
) -> None:
    env = {"SCHEDULE_MARKS": str(tmp_path), "SCHEDULES": ""}
    with started_cluster(tmp_path, redis_server, env=env, app=APP) as cluster:
        made = httpx.post(
            f"{cluster.url(0)}/schedules",
            json={"reasoner": "tick", "cron": "*/2 * * * * *", "input": {"tag": "api"}},
            timeout=5,
        )
        assert made.status_code == 201, made.text
        sid = made.json()["schedule_id"]
        began = time.time()
        seen = httpx.get(f"{cluster.url(1)}/schedules/{sid}", timeout=5)
        assert seen.status_code == 200 and seen.json()["cron"] == "*/2 * * * * *"
        wait_until(lambda: len(witnessed(tmp_path)) >= 3, what="three firings")
        gone = httpx.delete(f"{cluster.url(2)}/schedules/{sid}", timeout=5)
        assert gone.status_code == 204
        deleted = time.time()
        assert httpx.get(f"{cluster.url(0)}/schedules/{sid}", timeout=5).status_code in (200, 404)
        # Within a tick (a second) every replica has read the deletion: nothing fires after.
        wait_until(
            lambda: all(
                httpx.get(f"{cluster.url(i)}/schedules/{sid}", timeout=5).status_code == 404
                for i in range(3)
            ),
            timeout=5,
            what="the deletion on every replica",
        )
        settled = time.time()
        wait_until(lambda: time.time() > settled + 4.5, what="two more fire times")
        starts = witnessed(tmp_path)
        counts = Counter(line["id"] for line in starts)
        assert max(counts.values()) == 1, counts
        expected = {firing_id(sid, at) for at in fire_times(began + 1, deleted - 1)}
        assert expected <= set(counts)
        assert not [line for line in starts if line["at"] > settled + 0.5]


# -- what the audit of schedules found (docs/schedules.md) ------------------------------------


def bare(tmp_path: Path, name: str, *args: str, **env: str) -> ServerProcess:
    """A replica of the schedules app that declares no schedule (unless `SCHEDULES` says),
    its witness in `tmp_path`, its own stderr in `tmp_path/name`."""
    (tmp_path / name).mkdir()
    return ServerProcess(
        [APP, *args], {"SCHEDULE_MARKS": str(tmp_path), "SCHEDULES": "", **env}, tmp_path / name
    )


def listed(client: httpx.Client, sid: str) -> list[dict[str, Any]]:
    answer = client.get("/executions", params={"schedule_id": sid, "limit": 1000})
    assert answer.status_code == 200, answer.text
    found: list[dict[str, Any]] = answer.json()
    return found


def unix(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


def firings(url: str, outcome: str) -> float:
    from tests.support.cluster import metric

    return metric(url, "agent_server_schedule_firings_total", outcome=outcome)


def test_catchup_window_0_starts_each_firing_that_comes_due_while_a_replica_runs(
    tmp_path: Path,
) -> None:
    """0 means no catch-up, not never: a tick always runs a little after its fire time."""
    server = bare(tmp_path, "a")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            made = client.post(
                "/schedules",
                json={
                    "reasoner": "plain",
                    "cron": "* * * * * *",
                    "catchup_window": 0,
                    "overlap": "allow_all",
                },
            )
            assert made.status_code == 201, made.text
            sid = made.json()["schedule_id"]
            wait_until(lambda: len(listed(client, sid)) >= 3, what="three firings")
        assert firings(server.url, "missed") == 0
    finally:
        server.close()


def test_catchup_window_0_runs_nothing_a_paused_replica_slept_through(tmp_path: Path) -> None:
    """A replica paused (SIGSTOP) past a few seconds was not firing: with no catch-up,
    the fire times it slept through never run when it wakes; the next ones do."""
    server = bare(tmp_path, "a")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            made = client.post(
                "/schedules",
                json={
                    "reasoner": "plain",
                    "cron": "* * * * * *",
                    "catchup_window": 0,
                    "overlap": "allow_all",
                },
            )
            assert made.status_code == 201, made.text
            sid = made.json()["schedule_id"]
            wait_until(lambda: listed(client, sid), what="a firing")
            server.signal(signal.SIGSTOP)
            stopped = time.time()
            try:
                wait_until(lambda: time.time() > stopped + 7.0, what="the pause")
            finally:
                server.signal(signal.SIGCONT)
            resumed = time.time()
            wait_until(
                lambda: [e for e in listed(client, sid) if unix(e["scheduled_at"]) > resumed],
                what="a firing after the pause",
            )
            scheduled = [unix(e["scheduled_at"]) for e in listed(client, sid)]
    finally:
        server.close()
    slept = [at for at in scheduled if stopped + 1 < at < resumed - 1]
    assert not slept, (stopped, resumed, sorted(scheduled))


def test_a_changed_cron_runs_none_of_its_fire_times_from_before_the_change(
    tmp_path: Path,
) -> None:
    server = bare(tmp_path, "a")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            made = client.post(
                "/schedules",
                json={"reasoner": "plain", "cron": "0 0 1 1 *", "overlap": "allow_all"},
            )
            assert made.status_code == 201, made.text
            sid = made.json()["schedule_id"]
            created = time.time()
            # Fire times of the new cron pass between the creation and the change.
            wait_until(lambda: time.time() > created + 3.0, what="three fire times")
            changed = time.time()
            patched = client.patch(f"/schedules/{sid}", json={"cron": "* * * * * *"})
            assert patched.status_code == 200, patched.text
            wait_until(lambda: len(listed(client, sid)) >= 2, what="two firings")
            scheduled = sorted(unix(e["scheduled_at"]) for e in listed(client, sid))
        assert scheduled[0] > changed, (changed, scheduled)
    finally:
        server.close()


def test_skip_sees_the_firing_another_replica_started_while_this_one_was_paused(
    tmp_path: Path, redis_url: str
) -> None:
    """The previous firing comes from the store's marks at each decision: a replica
    paused (SIGSTOP) while the other started a firing skips the fire times it slept
    through instead of starting one beside it."""
    flags = ["--store", redis_url, "--lease-ttl", "1"]
    slow = {"SCHEDULE_SLOW": "5"}
    replicas = [bare(tmp_path, name, *flags, "--replica-id", name, **slow) for name in "ab"]
    try:
        for replica in replicas:
            replica.wait_ready()
        made = httpx.post(
            f"{replicas[0].url}/schedules",
            json={"reasoner": "slow_skip", "cron": "*/2 * * * * *"},
            timeout=5,
        )
        assert made.status_code == 201, made.text
        first = wait_until(lambda: intervals(tmp_path, "slow_skip"), what="a first firing")
        (first_id,) = first
        owner = httpx.get(f"{replicas[0].url}/executions/{first_id}", timeout=5).json()["replica"]
        # Pause the replica that does not run it; the other runs it to its end, then
        # starts the next firing due after it.
        paused = replicas[0] if owner == "b" else replicas[1]
        before = firings(paused.url, "skipped") + firings(paused.url, "started")
        paused.signal(signal.SIGSTOP)
        try:
            wait_until(lambda: len(intervals(tmp_path, "slow_skip")) >= 2, what="the next firing")
        finally:
            paused.signal(signal.SIGCONT)
        # Back, it handles the fire times it slept through.
        wait_until(
            lambda: firings(paused.url, "skipped") + firings(paused.url, "started") >= before + 2,
            what="the paused replica's firings",
        )
        spans = intervals(tmp_path, "slow_skip")
    finally:
        for replica in replicas:
            replica.close()
    assert overlapping(spans) == 0, spans


def test_a_trigger_on_one_replica_is_the_previous_firing_on_every_other(
    tmp_path: Path, redis_url: str
) -> None:
    flags = ["--store", redis_url, "--lease-ttl", "1"]
    slow = {"SCHEDULE_SLOW": "4"}
    a, b = (bare(tmp_path, name, *flags, "--replica-id", name, **slow) for name in "ab")
    try:
        a.wait_ready()
        b.wait_ready()
        made = httpx.post(
            f"{a.url}/schedules",
            json={"reasoner": "slow_skip", "cron": "* * * * * *", "enabled": False},
            timeout=5,
        )
        assert made.status_code == 201, made.text
        sid = made.json()["schedule_id"]
        triggered = httpx.post(f"{a.url}/schedules/{sid}/trigger", timeout=5)
        assert triggered.status_code == 202, triggered.text
        first = triggered.json()["execution_id"]
        # Enabled on the other replica while the triggered execution runs: every firing
        # of either replica is skipped until it ended.
        enabled = httpx.patch(f"{b.url}/schedules/{sid}", json={"enabled": True}, timeout=5)
        assert enabled.status_code == 200, enabled.text
        wait_until(
            lambda: len(intervals(tmp_path, "slow_skip")) >= 2, what="a firing after the trigger"
        )
        spans = intervals(tmp_path, "slow_skip")
        skipped = firings(a.url, "skipped") + firings(b.url, "skipped")
    finally:
        a.close()
        b.close()
    assert first in spans
    assert overlapping(spans) == 0, spans
    assert skipped >= 2


def test_a_firing_whose_input_no_longer_binds_is_counted_logged_and_its_schedule_lives(
    tmp_path: Path, redis_url: str
) -> None:
    """A release renamed the reasoner's parameter: each firing is `invalid` (counted,
    one line of log each, no traceback), a trigger is 422 naming the input, and the
    schedule fires again once its input is changed to bind."""
    flags = ["--store", redis_url, "--lease-ttl", "1"]
    first = bare(tmp_path, "release1", *flags)
    try:
        first.wait_ready()
        made = httpx.post(
            f"{first.url}/schedules",
            json={"reasoner": "counted", "cron": "* * * * * *", "input": {"n": 1}},
            timeout=5,
        )
        assert made.status_code == 201, made.text
        sid = made.json()["schedule_id"]
    finally:
        first.signal(signal.SIGTERM)
        first.wait_exit(WAIT)
        first.close()
    second = bare(tmp_path, "release2", *flags, SCHEDULE_RELEASE="2")
    try:
        second.wait_ready()
        wait_until(lambda: firings(second.url, "invalid") >= 3, what="three invalid firings")
        with httpx.Client(base_url=second.url, timeout=5) as client:
            refused = client.post(f"/schedules/{sid}/trigger")
            assert refused.status_code == 422, refused.text
            assert refused.json()["detail"].startswith("input: n:"), refused.text
            changed = client.patch(f"/schedules/{sid}", json={"input": {"count": 2}})
            assert changed.status_code == 200, changed.text
            done = wait_until(
                lambda: [e for e in listed(client, sid) if e["status"] == "succeeded"],
                what="a firing that binds",
            )
            assert done[0]["result"] == 2
        log = second.stderr()
    finally:
        second.close()
    assert "Traceback" not in log
    lines = [line for line in log.splitlines() if "no longer binds" in line]
    assert lines and all(f"schedule {sid!r}" in line for line in lines)
    assert len({line.split(" the firing at ")[1].split()[0] for line in lines}) == len(lines)


def test_a_declared_schedule_is_its_releases_code_once_toggled_and_stops_when_removed(
    tmp_path: Path, redis_url: str
) -> None:
    """Only `enabled` of a declared schedule is kept by PATCH: its cron and input are the
    running release's (its new cron's fire times from before the release came up never
    run), and a release that no longer declares it fires nothing of it."""
    flags = ["--store", redis_url, "--lease-ttl", "1"]

    def toggled(server: ServerProcess) -> None:
        with httpx.Client(base_url=server.url, timeout=5) as client:
            for enabled in (False, True):
                answer = client.patch("/schedules/report-0", json={"enabled": enabled})
                assert answer.status_code == 200, answer.text

    def reports(tag: str) -> list[dict[str, Any]]:
        return [line for line in witnessed(tmp_path) if line.get("tag") == tag]

    def release(name: str, declared: str, **env: str) -> ServerProcess:
        return bare(tmp_path, name, *flags, SCHEDULES=declared, **env)

    old = release("release1", "report", REPORT_CRON="0 0 1 1 *", REPORT_TAG="old")
    try:
        old.wait_ready()
        toggled(old)
    finally:
        old.signal(signal.SIGTERM)
        old.wait_exit(WAIT)
        old.close()
    began = time.time()
    new = release("release2", "report", REPORT_CRON="* * * * * *", REPORT_TAG="new")
    try:
        new.wait_ready()
        shown = httpx.get(f"{new.url}/schedules/report-0", timeout=5).json()
        assert (shown["cron"], shown["input"]) == ("* * * * * *", {"tag": "new"}), shown
        wait_until(lambda: reports("new"), what="a firing of the new release's cron")
        with httpx.Client(base_url=new.url, timeout=5) as client:
            scheduled = [unix(e["scheduled_at"]) for e in listed(client, "report-0")]
        assert scheduled and min(scheduled) > began, (began, scheduled)
        toggled(new)  # its document now says enabled, as the release said it
    finally:
        new.signal(signal.SIGTERM)
        new.wait_exit(WAIT)
        new.close()
    gone = release("release3", "tick")
    try:
        gone.wait_ready()
        ready = time.time()
        assert httpx.get(f"{gone.url}/schedules/report-0", timeout=5).status_code == 404
        # Two firings of `tick` (every 2 s) pass: `report` would have fired each second.
        wait_until(
            lambda: sum(1 for line in witnessed(tmp_path) if line["reasoner"] == "tick") >= 2,
            what="two firings of tick",
        )
    finally:
        gone.close()
    late = [line for line in reports("new") if line["at"] > ready]
    assert not late, late


def test_coming_up_after_a_long_outage_counts_missed_firings_off_the_event_loop(
    tmp_path: Path, redis_url: str
) -> None:
    """Every replica was down for two weeks (the marks say so): an every-second schedule
    missed 1.2 million firings. They are counted (up to a bound) without holding the
    loop, and the schedule fires on."""
    import redis

    flags = ["--store", redis_url, "--lease-ttl", "1"]
    first = bare(tmp_path, "before", *flags)
    try:
        first.wait_ready()
        made = httpx.post(
            f"{first.url}/schedules",
            json={"reasoner": "plain", "cron": "* * * * * *"},
            timeout=5,
        )
        assert made.status_code == 201, made.text
        sid = made.json()["schedule_id"]
        with httpx.Client(base_url=first.url, timeout=5) as client:
            wait_until(lambda: listed(client, sid), what="a firing")
    finally:
        first.signal(signal.SIGTERM)
        first.wait_exit(WAIT)
        first.close()
    client = redis.Redis.from_url(redis_url)
    try:
        (key,) = client.keys(f"*schedule:{sid}")
        old = time.time() - 14 * 86_400
        client.hset(key, mapping={"created": repr(old), "handled": repr(old)})
    finally:
        client.close()
    up = bare(tmp_path, "after", *flags)
    try:
        up.wait_ready()
        wait_until(lambda: firings(up.url, "missed") >= 100_000, what="the missed counted")
        started = firings(up.url, "started")
        wait_until(lambda: firings(up.url, "started") > started, what="a firing after")
        missed = firings(up.url, "missed")
        log = up.stderr()
    finally:
        up.close()
    stalls = [line for line in log.splitlines() if "stall" in line or "blocked for" in line]
    assert not [line for line in stalls if "cronsim" in line or "schedules" in line], stalls
    from agent_server.model.schedules import MAX_COUNTED

    assert missed == MAX_COUNTED == 100_000


def test_a_refusal_echoes_at_most_64_characters_of_what_was_sent(tmp_path: Path) -> None:
    server = bare(tmp_path, "a")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            huge = "x" * 100_000
            for body, field in [
                ({"cron": "* * * * " + "9" * 240}, "cron"),
                ({"cron": "* * * * *", "input": {"n": huge}}, "input"),
                ({"cron": "* * * * *", "input": {huge: 1}}, "input"),
                ({"cron": "* * * * *", "timezone": "Europe/" + "x" * 56}, "timezone"),
            ]:
                refused = client.post("/schedules", json={"reasoner": "plain", **body})
                assert refused.status_code == 422, refused.text
                detail = refused.json()["detail"]
                assert detail.startswith(f"{field}: "), detail
                assert "x" * 65 not in detail and "9" * 65 not in detail, detail
                assert len(refused.content) < 300, refused.text
    finally:
        server.close()


def test_a_trigger_is_refused_as_a_start_is(tmp_path: Path) -> None:
    """A full replica answers a trigger 429 + Retry-After, as it answers any start."""
    server = bare(tmp_path, "a", "--max-inflight", "1", SCHEDULE_SLOW="5")
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            made = client.post("/schedules", json={"reasoner": "plain", "cron": "0 0 1 1 *"})
            assert made.status_code == 201, made.text
            busy = client.post("/reasoners/slow_all/async", json={})
            assert busy.status_code == 202, busy.text
            start = client.post("/reasoners/plain/async", json={"n": 1})
            assert start.status_code == 429, start.text
            refused = client.post(f"/schedules/{made.json()['schedule_id']}/trigger")
            assert refused.status_code == 429, refused.text
            assert refused.headers["retry-after"] == start.headers["retry-after"] == "1"
    finally:
        server.close()
