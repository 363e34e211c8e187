"""Scheduling on real `agent-server run` processes (docs/scheduling.md): time limits,
retries with backoff, delayed starts and queueing instead of 429, on the memory store and on
a real Redis. One server per store for the module; what ran, and when, the test app writes
itself (`starts.log`, tests/apps/scheduling_app.py)."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.model.status import TERMINAL
from tests.support.cluster import Cluster, started_cluster
from tests.support.process import ServerProcess
from tests.support.raw_http import exchange
from tests.support.redis_server import RedisServer
from tests.support.shutdown import assert_clean_stderr, shutdown_report

WAIT = 15.0
APP = "scheduling_app:agent"


class Served:
    """One server of the scheduling app and the directory its starts are marked in."""

    def __init__(self, server: ServerProcess, marks: Path) -> None:
        self.server = server
        self.marks = marks
        self.url = server.url

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *_: object) -> None:
        self.server.close()

    def starts(self, execution_id: str) -> list[dict[str, Any]]:
        path = self.marks / "starts.log"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line]
        return [line for line in lines if line["id"] == execution_id]

    def start(self, name: str, body: Any = None, **params: Any) -> dict[str, Any]:
        response = httpx.post(
            f"{self.url}/reasoners/{name}/async", json=body or {}, params=params, timeout=WAIT
        )
        assert response.status_code == 202, response.text
        found: dict[str, Any] = response.json()
        return found

    def ended(self, execution_id: str) -> dict[str, Any]:
        return self.ended_at(self.url, execution_id)

    @staticmethod
    def ended_at(url: str, execution_id: str) -> dict[str, Any]:
        """The execution once terminal (long-polls; retries pass through `queued`)."""
        deadline = time.monotonic() + WAIT
        while True:
            response = httpx.get(f"{url}/executions/{execution_id}", params={"wait": 5}, timeout=10)
            assert response.status_code == 200, response.text
            body: dict[str, Any] = response.json()
            if body["status"] in TERMINAL:
                return body
            assert time.monotonic() < deadline, body
            time.sleep(0.02)


def _serve(tmp: Path, store: str, *extra: str, marks: Path | None = None) -> tuple[Served]:
    """A server of the scheduling app (closed by the caller: `with`)."""
    if marks is None:
        marks = tmp / "marks"
        marks.mkdir()
    args = [APP, "--store", store, "--lease-ttl", "1", *extra]
    server = ServerProcess(args, {"SCHEDULING_MARKS": str(marks)}, tmp)
    try:
        server.wait_ready()
    except BaseException:
        server.close()
        raise
    return (Served(server, marks),)


@pytest.fixture(scope="module")
def redis_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module", params=["memory", "redis", "postgres"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One server per store, shared by the module's tests."""
    tmp = tmp_path_factory.mktemp(f"sched-{request.param}")
    store = "memory"
    if request.param == "redis":
        store = request.getfixturevalue("redis_for_module").url
    elif request.param == "postgres":
        postgres = request.getfixturevalue("postgres_server")
        postgres.reset()  # the module's own database, empty
        _POSTGRES[:] = [postgres]
        store = postgres.url
    (server,) = _serve(tmp, store)
    with server:
        yield server


# -- timeouts ---------------------------------------------------------------------------------


def test_an_attempt_past_its_timeout_fails_with_execution_timeout(served: Served) -> None:
    started = served.start("slow")
    ended = served.ended(started["execution_id"])
    assert ended["status"] == "failed", ended
    assert ended["error"]["type"] == "ExecutionTimeout", ended
    assert "0.5 s" in ended["error"]["message"]
    assert 0.4 < ended["duration_seconds"] < 5, ended
    quick = served.ended(served.start("slow", {"seconds": 0.05})["execution_id"])
    assert quick["status"] == "succeeded", quick


def test_time_waiting_for_input_does_not_count_toward_the_timeout(served: Served) -> None:
    execution_id = served.start("patient")["execution_id"]
    waiting = httpx.get(
        f"{served.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5
    ).json()
    assert waiting["status"] == "input_required", waiting
    time.sleep(0.8)  # waiting longer than the limit itself: the clock is stopped
    answered = httpx.post(
        f"{served.url}/executions/{execution_id}/input", json={"value": "yes"}, timeout=WAIT
    )
    assert answered.status_code == 202, answered.text
    ended = served.ended(execution_id)
    assert (ended["status"], ended["result"]) == ("succeeded", "yes"), ended
    # Working past the limit after the answer is still a timeout.
    execution_id = served.start("patient", {"work": 5})["execution_id"]
    httpx.get(f"{served.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5)
    httpx.post(f"{served.url}/executions/{execution_id}/input", json={"value": 1}, timeout=WAIT)
    ended = served.ended(execution_id)
    assert ended["status"] == "failed" and ended["error"]["type"] == "ExecutionTimeout", ended


# -- retries ----------------------------------------------------------------------------------


def test_a_retried_execution_succeeds_on_its_third_attempt(served: Served) -> None:
    started = served.start("flaky")
    execution_id = started["execution_id"]
    ended = served.ended(execution_id)
    assert (ended["status"], ended["result"], ended["attempt"]) == (
        "succeeded",
        {"attempt": 3},
        3,
    ), ended
    # It keeps the time its last attempt was due (docs/api.md).
    assert ended["scheduled_at"] is not None and ended["error"] is None, ended
    starts = served.starts(execution_id)
    assert [s["attempt"] for s in starts] == [1, 2, 3], starts
    # The backoff: 0.2 s, then 0.4 s (each attempt begins no sooner than its delay).
    gaps = [b["at"] - a["at"] for a, b in itertools.pairwise(starts)]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.4, gaps


def test_a_retry_waits_queued_with_its_scheduled_at(served: Served) -> None:
    response = httpx.post(f"{served.url}/reasoners/flaky/async", json={}, timeout=WAIT)
    execution_id = response.json()["execution_id"]
    deadline = time.monotonic() + WAIT
    while True:  # the first backoff is 0.2 s: it is seen queued, due, with attempt 2
        body = httpx.get(f"{served.url}/executions/{execution_id}", timeout=WAIT).json()
        if body["status"] == "queued" or body["status"] == "succeeded":
            break
        assert time.monotonic() < deadline, body
        time.sleep(0.01)
    if body["status"] == "queued":
        assert body["attempt"] >= 2 and body["scheduled_at"] is not None, body
        assert body["replica"] == "", body
    assert served.ended(execution_id)["status"] == "succeeded"


def test_a_synchronous_run_waits_through_its_retries(served: Served) -> None:
    response = httpx.post(f"{served.url}/reasoners/flaky", json={}, timeout=WAIT)
    assert response.status_code == 200, response.text
    assert response.json()["attempt"] == 3


def test_retries_give_up_after_max_attempts_and_on_what_is_not_retried(served: Served) -> None:
    gave_up = served.ended(served.start("flaky", {"succeed_on": 9})["execution_id"])
    assert (gave_up["status"], gave_up["attempt"]) == ("failed", 3), gave_up
    assert gave_up["error"] == {"type": "Flaky", "message": "attempt 3 fails"}, gave_up
    assert len(served.starts(gave_up["execution_id"])) == 3
    picky = served.ended(served.start("picky")["execution_id"])
    assert (picky["status"], picky["attempt"], picky["error"]["type"]) == (
        "failed",
        1,
        "ValueError",
    ), picky
    stuck = served.ended(served.start("stuck")["execution_id"])  # a timeout is retried too
    assert (stuck["status"], stuck["attempt"]) == ("failed", 2), stuck
    assert stuck["error"]["type"] == "ExecutionTimeout", stuck
    metrics = httpx.get(f"{served.url}/metrics", timeout=WAIT).text
    assert 'agent_server_execution_retries_total{reason="timeout",reasoner="stuck"} 1.0' in (
        metrics
    ), metrics


# -- delayed starts ---------------------------------------------------------------------------


def test_a_delayed_start_is_queued_until_its_scheduled_at(served: Served) -> None:
    asked = time.time()
    started = served.start("stamp", delay=0.6)
    assert started["status"] == "queued" and started["scheduled_at"] is not None, started
    scheduled = _unix(started["scheduled_at"])
    assert asked + 0.55 <= scheduled <= time.time() + 0.7, (asked, started)
    listed = httpx.get(f"{served.url}/executions", params={"status": "queued"}, timeout=WAIT).json()
    assert started["execution_id"] in [e["execution_id"] for e in listed], listed
    ended = served.ended(started["execution_id"])
    assert ended["status"] == "succeeded", ended
    assert _unix(ended["scheduled_at"]) == pytest.approx(scheduled, abs=0.01), ended  # kept
    (mark,) = served.starts(started["execution_id"])
    assert mark["at"] >= scheduled, (mark, scheduled)


def test_a_delayed_start_can_be_cancelled_while_it_waits(served: Served) -> None:
    started = served.start("stamp", delay=30)
    cancelled = httpx.post(
        f"{served.url}/executions/{started['execution_id']}/cancel", timeout=WAIT
    )
    assert cancelled.status_code == 200, cancelled.text
    body = cancelled.json()
    assert (body["status"], body["status_reason"], body["scheduled_at"]) == (
        "cancelled",
        "request",
        None,
    ), body
    assert served.starts(started["execution_id"]) == []


@pytest.mark.parametrize("delay", ["-1", "604801", "nan", "soon"])
def test_a_bad_delay_is_400_and_starts_nothing(served: Served, delay: str) -> None:
    response = httpx.post(
        f"{served.url}/reasoners/stamp/async", params={"delay": delay}, json={}, timeout=WAIT
    )
    assert response.status_code == 400, response.text
    assert "delay" in response.json()["detail"]
    sync = httpx.post(f"{served.url}/reasoners/stamp", params={"delay": "1"}, json={}, timeout=5)
    assert sync.status_code == 400, sync.text


# -- queueing instead of 429 ------------------------------------------------------------------

FULL = ("--max-inflight", "1", "--queue-when-full", "--max-queued", "2")
#: A drain that does not wait long for the held slot, so a SIGTERM test ends soon.
SHORT_DRAIN = ("--drain-timeout", "0.5", "--cancel-timeout", "0.5", "--grace-period", "8")


def test_a_full_server_queues_then_refuses_past_max_queued(served: Served, tmp_path: Path) -> None:
    # On Redis a database of its own: no other replica takes what it queues.
    store = "memory" if "memory" in str(served.marks) else _fresh(served, 1)
    (server,) = _serve(tmp_path, store, *FULL, *SHORT_DRAIN)
    with server:
        held = server.start("hold", {"seconds": 0.8})
        assert held["status"] == "running", held
        first = server.start("stamp")
        second = server.start("stamp")
        for queued in (first, second):
            assert (queued["status"], queued["scheduled_at"]) == ("queued", None), queued
        refused = httpx.post(f"{server.url}/reasoners/stamp/async", json={}, timeout=WAIT)
        assert refused.status_code == 429 and "Retry-After" in refused.headers, refused.text
        sync = httpx.post(f"{server.url}/reasoners/stamp", json={}, timeout=WAIT)
        assert sync.status_code == 429, sync.text  # a synchronous run is never queued
        keyed = httpx.post(
            f"{server.url}/reasoners/limited/async", json={"tenant": "t"}, timeout=WAIT
        )
        assert keyed.status_code == 429, keyed.text  # the bound counts every queue
        # Once the slot frees, the queued ones run, in their order.
        ran = [server.ended(queued["execution_id"]) for queued in (first, second)]
        assert [r["status"] for r in ran] == ["succeeded", "succeeded"], ran
        assert ran[0]["result"] <= ran[1]["result"], ran
        held_end = server.ended(held["execution_id"])
        assert _unix(held_end["finished_at"]) <= ran[0]["result"], (held_end, ran)
        metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
        assert 'agent_server_executions_queued{reasoner="stamp"} 0.0' in metrics
        assert 'agent_server_queue_wait_seconds_count{reasoner="stamp"} 2.0' in metrics


def test_sigterm_does_not_wait_for_queued_work(served: Served, tmp_path: Path) -> None:
    """Queued and scheduled work belongs to no replica: the drain never waits for it. With
    the memory store it ends cancelled (shutdown), counted in the report; with Redis it
    stays queued for the replicas that remain."""
    memory = "memory" in str(served.marks)
    store = "memory" if memory else _store_of(served)
    (server,) = _serve(tmp_path, store, *FULL, *SHORT_DRAIN, "--replica-id", "full")
    with server:
        # The first outlasts the drain (cancelled at its deadline), so the second is still
        # queued at the signal however slowly the starts arrive.
        server.start("hold", {"seconds": 5})
        waiting = server.start("hold", {"seconds": 0.2})  # queued behind the first
        later = server.start("stamp", delay=60)  # scheduled
        server.server.signal(signal.SIGTERM)
        code, elapsed = server.server.wait_exit(10)
        assert code == 0, server.server.stderr()
        assert elapsed < 3, elapsed  # the 60 s delay is not waited for
        report = shutdown_report(server.server)
        assert_clean_stderr(server.server)
        if memory:
            assert report["queued_cancelled"] == 2, report
        else:
            assert report["queued_cancelled"] == 0, report
            # The module's server, with room, takes what the full one queued.
            taken = served.ended(waiting["execution_id"])
            assert taken["status"] == "succeeded" and taken["replica"] != "full", taken
            record = httpx.get(
                f"{served.url}/executions/{later['execution_id']}", timeout=WAIT
            ).json()
            assert record["status"] == "queued" and record["scheduled_at"], record
        assert served.starts(later["execution_id"]) == []


# -- concurrency limits -----------------------------------------------------------------------


def most_at_once(starts: list[dict[str, Any]]) -> dict[str, int]:
    """The most executions of each tenant that ran at once, from the app's own marks (an
    end is marked before its slot is given back, a start after it is taken)."""
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for line in sorted(starts, key=lambda line: (line["at"], line["event"] == "start")):
        tenant = line["tenant"]
        running[tenant] = running.get(tenant, 0) + (1 if line["event"] == "start" else -1)
        most[tenant] = max(most.get(tenant, 0), running[tenant])
    return most


def _marks_of(marks: Path, ids: set[str]) -> list[dict[str, Any]]:
    path = marks / "starts.log"
    if not path.exists():  # nothing started yet
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["id"] in ids and "event" in line]


def _limit_run(urls: list[str], marks: Path) -> None:
    """Six 0.6 s runs of tenant A (limit 2) sent at once, spread over `urls`, then one of
    tenant B: A never runs more than 2 at once, and B does not wait behind A's backlog."""

    def start_a(index: int) -> str:
        response = httpx.post(
            f"{urls[index % len(urls)]}/reasoners/limited/async",
            json={"tenant": "A", "seconds": 0.6},
            headers={"X-Tenant": "A"},
            timeout=WAIT,
        )
        assert response.status_code == 202, response.text
        return str(response.json()["execution_id"])

    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(start_a, range(6)))
    b_sent = time.time()
    response = httpx.post(
        f"{urls[-1]}/reasoners/limited/async",
        json={"tenant": "B", "seconds": 0.05},
        headers={"X-Tenant": "B"},
        timeout=WAIT,
    )
    b_id = response.json()["execution_id"]
    for execution_id in [*ids, b_id]:
        ended = Served.ended_at(urls[0], execution_id)
        assert ended["status"] == "succeeded", ended
    marks_seen = _marks_of(marks, {*ids, b_id})
    assert most_at_once(marks_seen) == {"A": 2, "B": 1}, marks_seen
    a_starts = sorted(m["at"] for m in marks_seen if m["tenant"] == "A" and m["event"] == "start")
    (b_start,) = [m["at"] for m in marks_seen if m["tenant"] == "B" and m["event"] == "start"]
    # Not behind A's backlog: B began before A's last (A's queue drains for 1.8 s).
    assert b_sent < b_start < a_starts[-1], (b_sent, b_start, a_starts)


def test_a_concurrency_limit_per_header_value(served: Served) -> None:
    _limit_run([served.url], served.marks)


@pytest.mark.parametrize("value", ["a" * 256, "", " ", "   \t ", "caf\u00e9"])
def test_a_bad_concurrency_header_is_400(served: Served, value: str) -> None:
    """A value that is not 1 to 255 printable ASCII characters, an empty one (or only
    blanks, which HTTP strips to empty) included: a 400 naming the header, and nothing
    started (it was a key value of its own, or the one requests without the header
    share)."""
    listed = {"reasoner": "limited", "limit": 1000}
    before = httpx.get(f"{served.url}/executions", params=listed, timeout=WAIT)
    body = b'{"tenant": "x"}'
    # On the wire as given (an HTTP client refuses to send a value of blanks only).
    status, _, answer = exchange(
        served.server,
        b"POST /reasoners/limited/async HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
        b"\r\nX-Tenant: " + value.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body,
    )
    assert status == 400, answer
    assert "X-Tenant" in json.loads(answer)["detail"]
    after = httpx.get(f"{served.url}/executions", params=listed, timeout=WAIT)
    assert {e["execution_id"] for e in after.json()} == {e["execution_id"] for e in before.json()}


@pytest.fixture(scope="module")
def cluster(
    redis_for_module: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, Path]]:
    """Three replicas of the scheduling app on one Redis (a database of their own)."""
    tmp = tmp_path_factory.mktemp("sched-cluster")
    marks = tmp / "marks"
    marks.mkdir()
    redis = _Database(redis_for_module, 2)
    with started_cluster(
        tmp,
        redis,  # type: ignore[arg-type]
        env={"SCHEDULING_MARKS": str(marks)},
        app=APP,
    ) as three:
        yield three, marks


class _Database:
    """The module's Redis, another database number (no other server of the module uses it)."""

    def __init__(self, server: RedisServer, db: int) -> None:
        self.url = server.url[:-1] + str(db)


def test_a_concurrency_limit_holds_across_three_replicas(cluster: tuple[Cluster, Path]) -> None:
    three, marks = cluster
    _limit_run([three.url(index) for index in range(3)], marks)


# -- session policies -------------------------------------------------------------------------


def _chat(
    url: str, session: str, text: str, policy: str | None, seconds: float = 0.2
) -> httpx.Response:
    headers = {"X-Session-ID": session}
    if policy is not None:
        headers["X-Session-Policy"] = policy
    return httpx.post(
        f"{url}/reasoners/chat/async",
        json={"text": text, "seconds": seconds},
        headers=headers,
        timeout=WAIT,
    )


def _enqueue_order(urls: list[str], marks: Path, session: str) -> None:
    """Four messages of one session, policy enqueue, each sent to the next replica: they run
    one at a time, in the order they arrived."""
    ids = []
    for index in range(4):
        response = _chat(urls[index % len(urls)], session, f"m{index}", "enqueue")
        assert response.status_code == 202 and response.json()["status"] == "queued", response.text
        ids.append(response.json()["execution_id"])
    for execution_id in ids:
        assert Served.ended_at(urls[0], execution_id)["status"] == "succeeded"
    seen = _marks_of(marks, set(ids))
    starts = [m for m in sorted(seen, key=lambda m: m["at"]) if m["event"] == "start"]
    assert [m["text"] for m in starts] == ["m0", "m1", "m2", "m3"], seen
    assert most_at_once(seen) == {session: 1}, seen


def test_session_policy_enqueue_runs_in_arrival_order(served: Served) -> None:
    _enqueue_order([served.url], served.marks, f"enq-{time.time_ns()}")


def test_session_policy_enqueue_order_across_three_replicas(
    cluster: tuple[Cluster, Path],
) -> None:
    three, marks = cluster
    _enqueue_order([three.url(index) for index in range(3)], marks, "enq-cluster")


def test_session_policy_reject_names_the_busy_execution(served: Served) -> None:
    session = f"rej-{time.time_ns()}"
    busy = _chat(served.url, session, "first", None, seconds=0.5).json()["execution_id"]
    refused = _chat(served.url, session, "second", "reject")
    assert refused.status_code == 409, refused.text
    assert refused.json()["execution_id"] == busy and refused.json()["detail"], refused.text
    assert served.ended(busy)["status"] == "succeeded"
    accepted = _chat(served.url, session, "third", "reject")  # nothing active: it runs
    assert accepted.status_code == 202, accepted.text
    assert served.ended(accepted.json()["execution_id"])["status"] == "succeeded"


@pytest.mark.parametrize("policy", ["interrupt", "rollback"])
def test_session_policy_interrupt_cancels_the_earlier_work_first(
    served: Served, policy: str
) -> None:
    session = f"{policy}-{time.time_ns()}"
    first = _chat(served.url, session, "first", None, seconds=30).json()["execution_id"]
    deadline = time.monotonic() + WAIT
    while not _marks_of(served.marks, {first}):  # it really runs
        assert time.monotonic() < deadline
        time.sleep(0.01)
    second = _chat(served.url, session, "second", policy)
    assert second.status_code == 202, second.text
    ended = served.ended(second.json()["execution_id"])
    assert ended["status"] == "succeeded", ended
    first_marks = _marks_of(served.marks, {first})
    second_start = next(
        m["at"] for m in _marks_of(served.marks, {ended["execution_id"]}) if m["event"] == "start"
    )
    first_end = next(m["at"] for m in first_marks if m["event"] == "end")
    assert first_end <= second_start, (first_marks, second_start)
    record = httpx.get(f"{served.url}/executions/{first}", timeout=WAIT)
    if policy == "interrupt":
        body = record.json()
        assert (body["status"], body["status_reason"]) == ("cancelled", "interrupted"), body
    else:
        deadline = time.monotonic() + WAIT
        while record.status_code != 404:  # forgotten once it ended
            assert time.monotonic() < deadline, record.text
            time.sleep(0.02)
            record = httpx.get(f"{served.url}/executions/{first}", timeout=WAIT)


def test_a_bad_session_policy_is_400(served: Served) -> None:
    response = _chat(served.url, "bad-policy", "x", "sometimes")
    assert response.status_code == 400 and "X-Session-Policy" in response.json()["detail"]


def _store_of(served: Served) -> str:
    args = served.server.proc.args
    assert isinstance(args, list)
    return str(args[args.index("--store") + 1])


#: The module's Postgres, when its `served` runs on one (a test's own store is a database).
_POSTGRES: list[Any] = []


def _fresh(served: Served, number: int) -> str:
    """A store of the test's own beside the module's: Redis's database `number`, or on
    Postgres an empty database of the store's role."""
    url = _store_of(served)
    if not url.startswith("postgresql://"):
        return url[:-1] + str(number)
    server = _POSTGRES[0]
    name = f"agents{number}"
    server.admin(
        f"DROP DATABASE IF EXISTS {name} WITH (FORCE)", f"CREATE DATABASE {name} OWNER agent"
    )
    return url.rsplit("/", 1)[0] + "/" + name


def _unix(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- the key model: limits, sessions and their queues ------------------------------------------


def _post(url: str, name: str, body: Any, headers: dict[str, str], **params: Any) -> str:
    response = httpx.post(
        f"{url}/reasoners/{name}/async", json=body, headers=headers, params=params, timeout=WAIT
    )
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


def _until(check: Any, what: str, timeout: float = WAIT) -> None:
    """Wait, bounded, for `check()` to be true."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def _redis_keys(served: Served, db: int, pattern: str) -> list[str]:
    """The keys of `db` matching `pattern`, read with redis-cli."""
    port = _store_of(served).rsplit(":", 1)[1].split("/")[0]
    found = subprocess.run(
        ["redis-cli", "-p", port, "-n", str(db), "--scan", "--pattern", pattern],
        capture_output=True,
        text=True,
        timeout=10,
        check=True,
    )
    return found.stdout.split()


def test_a_session_policy_never_escapes_a_concurrency_limit(served: Served) -> None:
    """Seven starts of a limit-1 reasoner, each with `X-Session-Policy: enqueue` (five
    sessions of their own, one session with two): an execution both limited and enqueued
    waits for both its slot and its session's turn, so they never overlap."""
    sessions = [f"esc-{time.time_ns()}-{index % 6}" for index in range(7)]

    def start(session: str) -> str:
        headers = {"X-Session-ID": session, "X-Session-Policy": "enqueue"}
        return _post(served.url, "single", {"seconds": 0.15}, headers)

    with ThreadPoolExecutor(7) as pool:
        ids = list(pool.map(start, sessions))
    for execution_id in ids:
        assert served.ended(execution_id)["status"] == "succeeded"
    seen = _marks_of(served.marks, set(ids))
    assert len([m for m in seen if m["event"] == "start"]) == 7, seen
    assert most_at_once(seen) == {"*": 1}, seen


def test_a_key_behind_150_blocked_keys_is_claimed_promptly(served: Served, tmp_path: Path) -> None:
    """150 values of a limit-1 key each hold their slot with one more waiting; a new value
    (last in every order the keys are kept in) still runs at once, while the others stay
    blocked."""
    store = "memory" if "memory" in str(served.marks) else _fresh(served, 3)
    (server,) = _serve(tmp_path, store, "--max-inflight", "1000")
    with server:

        def start(index: int) -> str:
            tenant = f"k{index // 2:03d}"
            headers = {"X-Tenant": tenant}
            return _post(server.url, "gate", {"tenant": tenant, "seconds": 60}, headers)

        with ThreadPoolExecutor(8) as pool:
            ids = list(pool.map(start, range(300)))
        _until(
            lambda: len(_marks_of(server.marks, set(ids))) >= 150,
            "one of each value started",
            timeout=30,
        )
        waiting = set(ids) - {m["id"] for m in _marks_of(server.marks, set(ids))}
        assert len(waiting) == 150, "the limit held"
        sent = time.monotonic()
        free = _post(server.url, "gate", {"tenant": "zz", "seconds": 0.05}, {"X-Tenant": "zz"})
        ended = server.ended(free)
        took = time.monotonic() - sent
        assert ended["status"] == "succeeded" and took < 3.0, (ended, took)
        assert _marks_of(server.marks, waiting) == []  # the blocked ones stayed blocked


def test_slot_sets_are_deleted_once_the_work_ended(served: Served, tmp_path: Path) -> None:
    """On Redis nothing of a key outlives its work: no `cslots:`, `cq:` or ready entry."""
    if "memory" in str(served.marks):
        pytest.skip("the memory store has no keys to look at (its sets go with the process)")
    if _store_of(served).startswith("postgresql://"):
        pytest.skip("Postgres keeps no slot sets: a slot is a row's status, counted")
    store = _fresh(served, 4)
    (server,) = _serve(tmp_path, store)
    with server:
        ids = []
        for index in range(4):
            tenant = f"t{index % 2}"
            ids.append(_post(server.url, "limited", {"tenant": tenant}, {"X-Tenant": tenant}))
            ids.append(_post(server.url, "single", {}, {}))
            headers = {"X-Session-ID": f"s{index % 2}", "X-Session-Policy": "enqueue"}
            ids.append(_post(server.url, "chat", {"text": "x", "seconds": 0.05}, headers))
        for execution_id in ids:
            assert server.ended(execution_id)["status"] == "succeeded"
        _until(
            lambda: _redis_keys(server, 4, "*cslots:*") == [],
            f"slot sets left: {_redis_keys(server, 4, '*cslots:*')}",
            timeout=5,
        )
        assert _redis_keys(server, 4, "*:cq:*") == []
        assert _redis_keys(server, 4, "*cready") == []


def test_a_reasoner_named_session_keeps_its_own_slots(served: Served) -> None:
    """A reasoner named `session`, limited per header value, never shares a slot with a
    session whose id is that value."""
    value = f"shared-{time.time_ns()}"
    headers = {"X-Session-ID": value, "X-Session-Policy": "enqueue"}
    busy = _post(served.url, "chat", {"text": "busy", "seconds": 5}, headers)
    _until(lambda: bool(_marks_of(served.marks, {busy})), "the session's work started")
    mine = _post(served.url, "session", {"seconds": 0.05}, {"X-Tenant": value})
    ended = Served.ended_at(served.url, mine)
    assert ended["status"] == "succeeded", ended
    assert not [m for m in _marks_of(served.marks, {busy}) if m["event"] == "end"]
    assert served.ended(busy)["status"] == "succeeded"


@pytest.mark.parametrize("first_policy", ["enqueue", "parallel"])
def test_enqueue_waits_for_an_earlier_delayed_start_of_its_session(
    served: Served, first_policy: str
) -> None:
    """`enqueue` runs after every earlier execution of the session that has not ended, a
    delayed start included."""
    session = f"delayed-{first_policy}-{time.time_ns()}"
    first = _post(
        served.url,
        "chat",
        {"text": "first", "seconds": 0.2},
        {"X-Session-ID": session, "X-Session-Policy": first_policy},
        delay=0.7,
    )
    then = {"X-Session-ID": session, "X-Session-Policy": "enqueue"}
    second = _post(served.url, "chat", {"text": "second", "seconds": 0.05}, then)
    for execution_id in (first, second):
        assert served.ended(execution_id)["status"] == "succeeded"
    seen = sorted(_marks_of(served.marks, {first, second}), key=lambda m: m["at"])
    assert [(m["text"], m["event"]) for m in seen] == [
        ("first", "start"),
        ("first", "end"),
        ("second", "start"),
        ("second", "end"),
    ], seen


def test_enqueue_waits_for_an_earlier_retry_of_its_session(served: Served) -> None:
    """A retry between attempts is queued but not ended: the next message waits for it."""
    session = f"retry-{time.time_ns()}"
    headers = {"X-Session-ID": session, "X-Session-Policy": "enqueue"}
    first = _post(served.url, "flaky", {"succeed_on": 2}, headers)
    _until(lambda: bool(served.starts(first)), "the first attempt started")
    second = _post(served.url, "chat", {"text": "second", "seconds": 0.05}, headers)
    ended = served.ended(first)
    assert ended["status"] == "succeeded" and ended["attempt"] == 2, ended
    assert served.ended(second)["status"] == "succeeded"
    last_attempt = max(m["at"] for m in served.starts(first))
    (second_start,) = [m["at"] for m in served.starts(second) if m["event"] == "start"]
    assert last_attempt < second_start, (served.starts(first), second_start)


def _queued_of(url: str, session: str) -> list[dict[str, Any]]:
    response = httpx.get(
        f"{url}/executions", params={"session_id": session, "status": "queued"}, timeout=WAIT
    )
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()
    return found


def test_a_sync_caller_that_leaves_cancels_its_queued_execution(served: Served) -> None:
    session = f"gone-{time.time_ns()}"
    tenant = f"gone-{time.time_ns()}"
    blocker = _post(served.url, "gate", {"tenant": tenant, "seconds": 3}, {"X-Tenant": tenant})
    _until(lambda: bool(_marks_of(served.marks, {blocker})), "the blocker started")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            f"{served.url}/reasoners/gate",
            json={"tenant": tenant, "seconds": 0.05},
            headers={"X-Tenant": tenant, "X-Session-ID": session},
            timeout=httpx.Timeout(WAIT, read=0.5),
        )
    listed = httpx.get(f"{served.url}/executions", params={"session_id": session}, timeout=WAIT)
    (left,) = listed.json()
    ended = served.ended(left["execution_id"])
    assert (ended["status"], ended["status_reason"]) == ("cancelled", "client_disconnected")
    assert served.ended(blocker)["status"] == "succeeded"
    assert _marks_of(served.marks, {left["execution_id"]}) == []  # it never ran


def test_sigterm_answers_a_sync_caller_of_queued_work_503_with_location(
    served: Served, tmp_path: Path
) -> None:
    """The listener closes while a sync caller waits on work queued for a slot: the caller
    gets 503 JSON with Retry-After and Location (another replica may run it), not a 500."""
    memory = "memory" in str(served.marks)
    store = "memory" if memory else _fresh(served, 5)
    (server,) = _serve(tmp_path, store, *SHORT_DRAIN)
    with server:
        session = f"term-{time.time_ns()}"
        blocker = _post(server.url, "gate", {"tenant": "t", "seconds": 30}, {"X-Tenant": "t"})
        _until(lambda: bool(_marks_of(server.marks, {blocker})), "the blocker started")
        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(
                httpx.post,
                f"{server.url}/reasoners/gate",
                json={"tenant": "t", "seconds": 0.05},
                headers={"X-Tenant": "t", "X-Session-ID": session},
                timeout=WAIT,
            )
            _until(lambda: len(_queued_of(server.url, session)) == 1, "the sync run queued")
            server.server.signal(signal.SIGTERM)
            response = answer.result(timeout=WAIT)
        assert response.status_code == 503, (response.text, server.server.stderr()[-3000:])
        assert response.headers["content-type"].startswith("application/json"), response.text
        assert response.headers["Retry-After"] and response.headers["Location"], response.headers
        assert response.json()["execution_id"] in response.headers["Location"], response.text
        code, _ = server.server.wait_exit(15)
        assert code == 0, server.server.stderr()


def test_interrupt_abandons_work_that_swallows_cancellation(served: Served) -> None:
    """`interrupt` waits for the interrupted work at most the cancel timeout (5 s here):
    past it the work is abandoned and the new message starts."""
    session = f"stubborn-{time.time_ns()}"
    first = _post(served.url, "stubborn", {"seconds": 14}, {"X-Session-ID": session})
    _until(lambda: bool(_marks_of(served.marks, {first})), "the stubborn work started")
    sent = time.monotonic()
    then = {"X-Session-ID": session, "X-Session-Policy": "interrupt"}
    second = _post(served.url, "chat", {"text": "next", "seconds": 0.05}, then)
    ended = served.ended(second)
    took = time.monotonic() - sent
    assert ended["status"] == "succeeded" and took < 9, (ended, took)
    record = httpx.get(f"{served.url}/executions/{first}", timeout=WAIT).json()
    assert (record["status"], record["status_reason"]) == ("cancelled", "interrupted"), record
    metrics = httpx.get(f"{served.url}/metrics", timeout=WAIT).text
    abandoned = [
        line
        for line in metrics.splitlines()
        if 'reasoner="stubborn"' in line and '"abandoned"' in line and not line.startswith("#")
    ]
    assert abandoned and float(abandoned[0].rsplit(" ", 1)[1]) >= 1, abandoned  # counted
    assert not [m for m in _marks_of(served.marks, {first}) if m["event"] == "end"]
