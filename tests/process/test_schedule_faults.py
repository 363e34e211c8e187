"""Schedules under the store's faults (docs/schedules.md, docs/guarantees.md), on
real `agent-server run` replicas and a real `redis-server` of the test's own: what a
replica fires follows the store's documents across a restart of Redis that loses them,
and a firing whose create was cut in flight starts once, on its retry, on time.
Each firing is counted by the witness outside the server (`firings.log`, written by
tests/apps/schedules_app.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from agent_server.runtime.schedule_entries import firing_id
from agent_server.store.redis import scripts
from tests.support.faults import CutProxy
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

APP = "schedules_app:agent"
#: Bound of every wait here (seconds) unless it says otherwise.
WAIT = 20.0


def starts(marks: Path, tag: str) -> list[dict[str, Any]]:
    """The witness's starts of the `tick` executions whose input carried `tag`."""
    path = marks / "firings.log"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["what"] == "start" and line.get("tag") == tag]


def wait_until(predicate: Any, timeout: float = WAIT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} not reached in {timeout}s"
        time.sleep(0.05)


def metric(client: httpx.Client, series: str) -> float:
    """One series' value from `/metrics` (0 while it is not shown)."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def replica(tmp_path: Path, redis: RedisServer, name: str, marks: Path) -> ServerProcess:
    (tmp_path / name).mkdir()
    return ServerProcess(
        [APP, "--store", redis.url, "--replica-id", name, "--lease-ttl", "1"],
        {"SCHEDULE_MARKS": str(marks), "SCHEDULES": ""},
        tmp_path / name,
    )


def every_second(client: httpx.Client, tag: str, **fields: Any) -> str | None:
    """Make a schedule firing `tick` every second; None while the store refuses it."""
    made = client.post(
        "/schedules",
        json={"reasoner": "tick", "cron": "* * * * * *", "input": {"tag": tag}, **fields},
    )
    if made.status_code == 503:
        return None
    assert made.status_code == 201, made.text
    return str(made.json()["schedule_id"])


def listed(client: httpx.Client) -> set[str]:
    return {schedule["schedule_id"] for schedule in client.get("/schedules").json()}


def test_a_replica_paused_across_a_redis_restart_fires_what_was_made_since(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """A saw S1 made; paused, it misses Redis restarting empty and S2 made on B. Resumed,
    A must read the documents again (S1 is gone, S2 is there), though as many changes
    were made since the restart as before it."""
    marks = tmp_path / "marks"
    marks.mkdir()
    a = replica(tmp_path, own_redis, "A", marks)
    b = replica(tmp_path, own_redis, "B", marks)
    try:
        a.wait_ready()
        b.wait_ready()
        with (
            httpx.Client(base_url=a.url, timeout=5) as on_a,
            httpx.Client(base_url=b.url, timeout=5) as on_b,
        ):
            s1 = every_second(on_a, "S1")
            assert s1 is not None
            wait_until(lambda: starts(marks, "S1"), what="S1 fired")
            wait_until(lambda: s1 in listed(on_b), what="B reads S1")
            assert s1 in listed(on_a)  # A has read the version S1's change wrote
            a.proc.send_signal(signal.SIGSTOP)
            try:
                own_redis.stop()  # nothing kept
                own_redis.start()
                s2 = wait_until(lambda: every_second(on_b, "S2"), what="S2 made on B")
                b.signal(signal.SIGTERM)  # from now on only A can fire S2
                b.wait_exit(WAIT)
            finally:
                a.proc.send_signal(signal.SIGCONT)
            wait_until(lambda: starts(marks, "S2"), what="A fires S2")
            first_s2 = min(line["at"] for line in starts(marks, "S2"))
            seen_by_a = listed(on_a)
        late = [line for line in starts(marks, "S1") if line["at"] > first_s2]
    finally:
        a.close()
        b.close()
    assert s2 in seen_by_a and s1 not in seen_by_a, seen_by_a
    assert not late, f"S1, deleted with Redis's data, still fired on A: {late}"


class DropProxy(CutProxy):
    """A proxy between a replica and Redis that, once armed, cuts the connection carrying
    the next request holding `marker` before Redis reads it: a command sent and never
    run, whose sender cannot tell (a cut in flight)."""

    def __init__(self, target_port: int, marker: bytes) -> None:
        super().__init__(target_port)
        self.marker = marker
        self.armed = threading.Event()
        self.dropped = threading.Event()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool = False
    ) -> None:
        if replies:
            await super()._pump(reader, writer, replies=True)
            return
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if self.armed.is_set() and self.marker in data:
                    self.armed.clear()
                    self.dropped.set()
                    return  # the connection ends here: Redis never sees the request
                writer.write(data)
                await writer.drain()


def test_a_firing_whose_create_was_cut_in_flight_starts_once_and_on_time(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    """The connection carrying a firing's create is cut before Redis reads it: the create
    is in doubt, and the repair settles it (absent: voided). The ticker tries the same fire
    time again, with the same execution id. The firing must start once (never refused for
    the day the void lasts, which stalls the schedule on every replica, nor started a second
    time by the settle when the retry made it first), inside its window, and the firings
    after it on time: none missed, none in a burst."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proxy = DropProxy(own_redis.port, scripts.FCALL["create"][1])
    proxy.start()
    (tmp_path / "A").mkdir()
    server = ServerProcess(
        [APP, "--store", proxy.url, "--replica-id", "A", "--lease-ttl", "1"],
        {"SCHEDULE_MARKS": str(marks), "SCHEDULES": ""},
        tmp_path / "A",
    )
    try:
        server.wait_ready()
        with httpx.Client(base_url=server.url, timeout=5) as client:
            sid = every_second(client, "cut", catchup_window=20)
            assert sid is not None
            began = time.time()
            wait_until(lambda: len(starts(marks, "cut")) >= 2, what="two firings")
            proxy.armed.set()
            assert proxy.dropped.wait(WAIT), "no create was sent"
            cut = time.time()

            def started(at: float) -> bool:
                return firing_id(sid, at) in {line["id"] for line in starts(marks, "cut")}

            # The firing cut starts on its retry, and the next ones on time.
            soon = float(math.ceil(cut) + 2)
            wait_until(lambda: started(soon), timeout=soon - time.time() + 3.0, what="on time")
            # The repair has settled the create in doubt (a settle answered)...
            settles = 'agent_server_store_operation_duration_seconds_count{operation="settle"}'
            failed = 'agent_server_store_errors_total{operation="settle"}'
            wait_until(lambda: metric(client, settles) > metric(client, failed), what="settle")
            # ... and a firing has started since: a second run of one would show by now.
            after = float(math.ceil(time.time()) + 1)
            wait_until(lambda: started(after), what="a firing after the settle")
            missed = metric(client, 'agent_server_schedule_firings_total{outcome="missed"}')
    finally:
        server.close()
        proxy.stop()
    counts = Counter(line["id"] for line in starts(marks, "cut"))
    twice = {execution_id: n for execution_id, n in counts.items() if n > 1}
    assert not twice, f"started more than once: {twice}"
    expected = {firing_id(sid, float(at)): at for at in range(math.ceil(began) + 1, int(after))}
    absent = sorted(at for execution_id, at in expected.items() if execution_id not in counts)
    assert not absent, f"fire times with no execution: {absent}"
    assert missed == 0
