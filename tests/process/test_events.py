"""Live execution events over Server-Sent Events, against real processes over loopback:
replay and resume by event id on one replica and across two replicas behind haproxy, a
slow reader that does not slow the reasoner, 1,000 open streams through a SIGTERM drain,
events of a failed or cancelled run, authentication, and bad input.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from httpx_sse import ServerSentEvent, aconnect_sse, connect_sse

from tests.support.cluster import Cluster, metric, started_cluster, wait_for
from tests.support.redis_server import RedisServer
from tests.support.shutdown import shutdown_report

WAIT = 10.0


def read_all(url: str, path: str, headers: dict[str, str] | None = None) -> list[ServerSentEvent]:
    """Every event of a stream until it ends (bounded by WAIT per read)."""
    with (
        httpx.Client(timeout=WAIT) as client,
        connect_sse(client, "GET", f"{url}{path}", headers=headers or {}) as source,
    ):
        assert source.response.status_code == 200, source.response.read()
        return list(source.iter_sse())


def numbered(events: list[ServerSentEvent]) -> list[int]:
    """The numbers of the real events (a retry hint carries the last id seen, as SSE says)."""
    return [
        int(e.id)
        for e in events
        if e.event not in ("end", "start", "missed") and e.retry is None and e.data
    ]


def start(url: str, reasoner: str, body: dict[str, Any]) -> str:
    response = httpx.post(f"{url}/reasoners/{reasoner}/async", json=body, timeout=WAIT)
    assert response.status_code == 202, response.text
    execution_id: str = response.json()["execution_id"]
    return execution_id


# -- one replica -------------------------------------------------------------------------------


def test_replay_then_resume_by_last_event_id(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    execution_id = start(server.url, "chatter", {"count": 10})
    events = read_all(server.url, f"/executions/{execution_id}/events")
    assert numbered(events) == list(range(1, 11))
    assert [json.loads(e.data) for e in events[:-1]] == [{"n": n} for n in range(10)]
    assert {e.event for e in events[:-1]} == {"progress"}
    assert events[-1].event == "end"
    end = json.loads(events[-1].data)
    assert (end["execution_id"], end["status"], end["result"]) == (
        execution_id,
        "succeeded",
        {"emitted": 10},
    )
    resumed = read_all(
        server.url, f"/executions/{execution_id}/events", headers={"Last-Event-ID": "4"}
    )
    assert numbered(resumed) == list(range(5, 11))
    after = read_all(server.url, f"/executions/{execution_id}/events?after=9")
    assert numbered(after) == [10]
    assert metric(server.url, "agent_server_events_emitted_total", reasoner="chatter") == 10


def test_a_streamed_start_begins_with_the_execution(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    with (
        httpx.Client(timeout=WAIT) as client,
        connect_sse(
            client, "POST", f"{server.url}/reasoners/tokens", json={"text": "a b c", "pause": 0.01}
        ) as source,
    ):
        events = list(source.iter_sse())
    assert events[0].event == "start"
    first = json.loads(events[0].data)
    assert first["status"] == "running"
    assert [(e.event, json.loads(e.data)) for e in events[1:-1]] == [
        ("token", "a"),
        ("token", "b"),
        ("token", "c"),
    ]
    assert json.loads(events[-1].data)["execution_id"] == first["execution_id"]
    assert json.loads(events[-1].data)["result"] == "a b c"


def test_a_slow_reader_does_not_slow_the_reasoner(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", "--max-events", "50")
    execution_id = start(server.url, "chatter", {"count": 2000, "pause": 0.0005})
    with (
        httpx.Client(timeout=WAIT) as client,
        connect_sse(client, "GET", f"{server.url}/executions/{execution_id}/events") as source,
    ):
        stream = source.iter_sse()
        first = next(stream)  # then it stops reading while the reasoner emits the rest
        ended = httpx.get(
            f"{server.url}/executions/{execution_id}", params={"wait": 30}, timeout=40
        ).json()
        assert ended["status"] == "succeeded"  # it finished with its reader stalled
        rest = list(stream)
    missed = [json.loads(e.data) for e in [first, *rest] if e.event == "missed"]
    assert missed and missed[0]["missed"] > 0  # told how many were not kept for it
    ids = numbered([first, *rest])
    assert ids[-1] == 2000 and ids == sorted(set(ids))  # nothing twice, in order
    assert len(ids) + sum(m["missed"] for m in missed) == 2000  # nothing silently lost
    assert rest[-1].event == "end"


@pytest.mark.parametrize(
    ("body", "status", "count"),
    [({"count": 5, "fail_at": 3}, "failed", 3), ({"count": 100, "pause": 0.05}, "cancelled", None)],
)
def test_a_failed_or_cancelled_run_ends_its_stream(
    server_factory: Any, body: dict[str, Any], status: str, count: int | None
) -> None:
    server = server_factory("tests_app:agent")
    execution_id = start(server.url, "chatter", body)
    if status == "cancelled":

        def cancel_soon() -> None:
            time.sleep(0.3)
            httpx.post(f"{server.url}/executions/{execution_id}/cancel", timeout=WAIT)

        async def both() -> list[ServerSentEvent]:
            canceller = asyncio.create_task(asyncio.to_thread(cancel_soon))
            events = await asyncio.to_thread(
                read_all, server.url, f"/executions/{execution_id}/events"
            )
            await canceller
            return events

        events = asyncio.run(both())
    else:
        events = read_all(server.url, f"/executions/{execution_id}/events")
    end = json.loads(events[-1].data)
    assert events[-1].event == "end"
    assert end["status"] == status
    ids = numbered(events)
    assert ids == list(range(1, len(ids) + 1))
    if count is not None:
        assert len(ids) == count
        assert end["error"]["message"] == "failed after 3 events"


def test_bad_input_and_unknown_executions(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    execution_id = start(server.url, "chatter", {"count": 1})
    for headers, query in (
        ({"Last-Event-ID": "abc"}, ""),
        ({"Last-Event-ID": "-1"}, ""),
        ({"Last-Event-ID": "1" * 40}, ""),
        ({}, "?after=1.5"),
    ):
        response = httpx.get(
            f"{server.url}/executions/{execution_id}/events{query}", headers=headers, timeout=WAIT
        )
        assert response.status_code == 400, (headers, query)
        assert response.headers["content-type"] == "application/json"
    missing = httpx.get(f"{server.url}/executions/{'0' * 32}/events", timeout=WAIT)
    assert missing.status_code == 404


def test_streams_need_the_token_like_every_route(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", "--api-token", "s3cret-token-0123456789")
    auth = {"Authorization": "Bearer s3cret-token-0123456789"}
    started = httpx.post(
        f"{server.url}/reasoners/chatter/async", json={"count": 2}, headers=auth, timeout=WAIT
    )
    execution_id = started.json()["execution_id"]
    path = f"/executions/{execution_id}/events"
    assert httpx.get(f"{server.url}{path}", timeout=WAIT).status_code == 401
    assert numbered(read_all(server.url, path, headers=auth)) == [1, 2]


def test_1000_open_streams_end_cleanly_through_a_drain(server_factory: Any) -> None:
    server = server_factory(
        "tests_app:agent",
        *("--grace-period", "10", "--drain-timeout", "1", "--cancel-timeout", "1"),
        *("--sse-heartbeat", "1", "--max-inflight", "2000"),
    )
    ids = [start(server.url, "chatter", {"count": 10_000, "pause": 0.05}) for _ in range(10)]
    endings: list[str] = []

    async def follow(client: httpx.AsyncClient, execution_id: str, opened: list[int]) -> None:
        async with aconnect_sse(client, "GET", f"/executions/{execution_id}/events") as source:
            opened.append(1)
            last = "nothing"
            async for event in source.aiter_sse():
                last = "retry" if event.retry is not None else event.event
            endings.append(last)  # the stream's last word: `end`, or a retry hint

    async def run() -> float:
        limits = httpx.Limits(max_connections=1100, max_keepalive_connections=0)
        async with httpx.AsyncClient(
            base_url=server.url, timeout=httpx.Timeout(30.0), limits=limits
        ) as client:
            opened: list[int] = []
            readers = [
                asyncio.create_task(follow(client, ids[n % 10], opened)) for n in range(1000)
            ]
            await asyncio.to_thread(
                wait_for,
                lambda: metric(server.url, "agent_server_event_streams_open") >= 1000,
                60,
                "1000 streams open",
            )
            assert metric(server.url, "agent_server_event_streams_open") == 1000
            server.signal(signal.SIGTERM)
            began = time.monotonic()
            await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
            return time.monotonic() - began

    asyncio.run(run())
    code, _ = server.wait_exit(timeout=20)
    assert code == 0, server.stderr()
    # Inside the grace period, by the server's own clock (the 1,000 readers here, all in
    # this one process, may finish reading well after it exited).
    assert shutdown_report(server)["duration_seconds"] < 10
    assert len(endings) == 1000
    # The executions were cancelled at the drain deadline: their streams saw the end.
    assert endings.count("end") == 1000, set(endings)
    stderr = server.stderr()
    assert "Exception in ASGI application" not in stderr
    assert "Task was destroyed" not in stderr and "never retrieved" not in stderr


def test_readers_that_leave_are_let_go_at_once_without_a_heartbeat(server_factory: Any) -> None:
    """An idle stream notices its client leaving from the connection itself, not at its
    next write: with heartbeats 600 s apart, 50 readers that hang up are gone from the
    open-streams gauge within seconds, and the server keeps serving."""
    server = server_factory("tests_app:agent", "--sse-heartbeat", "600")
    execution_id = start(server.url, "sleep", {"seconds": 60})

    async def run() -> None:
        connections = []
        for _ in range(50):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(
                f"GET /executions/{execution_id}/events HTTP/1.1\r\nhost: x\r\n\r\n".encode()
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT)
            assert head.startswith(b"HTTP/1.1 200"), head
            connections.append(writer)
        await asyncio.to_thread(
            wait_for,
            lambda: metric(server.url, "agent_server_event_streams_open") == 50,
            WAIT,
            "50 streams open",
        )
        for writer in connections:
            writer.close()
        await asyncio.to_thread(
            wait_for,
            lambda: metric(server.url, "agent_server_event_streams_open") == 0,
            WAIT,
            "every stream let go",
        )

    asyncio.run(run())
    assert httpx.get(f"{server.url}/executions/{execution_id}", timeout=WAIT).status_code == 200
    assert "Exception in ASGI application" not in server.stderr()


def test_a_quiet_stream_gets_a_heartbeat_each_period_and_events_between(
    server_factory: Any,
) -> None:
    """Heartbeats come from timers the waiting streams share: in 1.6 s of quiet between two
    events, with a 0.5 s period, come 3 of them (2 when the last one's tick falls after the
    second event, up to 4 on a slow machine whose sleep runs long), never a burst; and the
    event after them still arrives at once. Counted, not timed, so a client that reads late
    sees the same count."""
    server = server_factory("tests_app:agent", "--sse-heartbeat", "0.5")
    execution_id = start(server.url, "tokens", {"text": "a b", "pause": 1.6})

    async def run() -> list[bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(f"GET /executions/{execution_id}/events HTTP/1.1\r\nhost: x\r\n\r\n".encode())
        frames: list[bytes] = []
        async with asyncio.timeout(WAIT):
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            while not any(frame.startswith(b"event: end") for frame in frames):
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)  # chunked
                if size == 0:
                    break
                data = await reader.readexactly(size + 2)
                frames += [frame for frame in data[:-2].split(b"\n\n") if frame]
        writer.close()
        return frames

    frames = asyncio.run(run())
    kinds = [b"heartbeat" if f.startswith(b": heartbeat") else f.split(b"\n")[-1] for f in frames]
    first, second = kinds.index(b'data: "a"'), kinds.index(b'data: "b"')
    between = kinds[first + 1 : second]
    assert between and set(between) == {b"heartbeat"}, frames
    assert 2 <= len(between) <= 4, frames
    assert kinds[-1].startswith(b"data: {"), frames  # the end, with the execution


# -- across replicas ---------------------------------------------------------------------------


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_server: RedisServer) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path,
        redis_server,
        *("--grace-period", "8", "--drain-timeout", "2", "--cancel-timeout", "1"),
    ) as running:
        yield running


def test_a_reader_resumes_on_another_replica_missing_nothing(cluster: Cluster) -> None:
    text = " ".join(f"w{n}" for n in range(40))
    execution_id = start(cluster.url(0), "tokens", {"text": text, "pause": 0.05})
    seen: list[ServerSentEvent] = []
    with (
        httpx.Client(timeout=WAIT) as client,
        connect_sse(client, "GET", f"{cluster.url(0)}/executions/{execution_id}/events") as source,
    ):
        for event in source.iter_sse():
            seen.append(event)
            if len(seen) == 10:
                break  # the reader goes away mid-run
    last = seen[-1].id
    rest = read_all(
        cluster.url(1), f"/executions/{execution_id}/events", headers={"Last-Event-ID": last}
    )
    ids = numbered(seen) + numbered(rest)
    assert ids == list(range(1, 41))  # nothing missed, nothing twice
    assert [json.loads(e.data) for e in [*seen, *rest[:-1]]] == text.split()
    assert rest[-1].event == "end"
    # Any replica replays it all once it has ended, through haproxy too.
    replay = read_all(cluster.proxy.url, f"/executions/{execution_id}/events")
    assert numbered(replay) == list(range(1, 41))


def read_while_draining(cluster: Cluster, index: int, execution_id: str) -> list[ServerSentEvent]:
    """Read the stream from replica `index`, which gets SIGTERM after five events, to the
    stream's end."""
    seen: list[ServerSentEvent] = []

    async def read_then_drain() -> None:
        async with (
            httpx.AsyncClient(timeout=WAIT) as client,
            aconnect_sse(
                client, "GET", f"{cluster.url(index)}/executions/{execution_id}/events"
            ) as source,
        ):
            async for event in source.aiter_sse():
                seen.append(event)
                if len(seen) == 5:
                    cluster.replicas[index].signal(signal.SIGTERM)

    asyncio.run(read_then_drain())
    return seen


def test_a_draining_replica_sends_its_readers_elsewhere(cluster: Cluster) -> None:
    """The stream on the draining replica ends with a retry hint when its listener closes
    (the run was cancelled at the drain deadline, so it ends: `end` comes first)."""
    execution_id = start(cluster.url(0), "tokens", {"text": "x " * 500, "pause": 0.02})
    seen = read_while_draining(cluster, 0, execution_id)
    code, _ = cluster.replicas[0].wait_exit(timeout=WAIT)
    assert code == 0
    assert seen[-1].event == "end" or seen[-1].retry is not None
    rest = read_all(
        cluster.url(1),
        f"/executions/{execution_id}/events",
        headers={"Last-Event-ID": [e for e in seen if e.id][-1].id},
    )
    ids = numbered(seen) + numbered(rest)
    assert ids == list(range(1, len(ids) + 1))
    assert rest[-1].event == "end"


def test_a_stream_of_work_elsewhere_ends_with_retry_when_its_replica_drains(
    cluster: Cluster,
) -> None:
    """Replica 0 serves the stream of a run owned by replica 1; when replica 0's listener
    closes, the stream ends with a retry hint, and the reader resumes on replica 2."""
    execution_id = start(cluster.url(1), "tokens", {"text": "y " * 200, "pause": 0.02})
    seen = read_while_draining(cluster, 0, execution_id)
    assert cluster.replicas[0].wait_exit(timeout=WAIT)[0] == 0
    assert seen[-1].retry is not None  # not `end`: the run goes on elsewhere
    last = [e for e in seen if e.id][-1].id
    rest = read_all(
        cluster.url(2), f"/executions/{execution_id}/events", headers={"Last-Event-ID": last}
    )
    ids = numbered(seen) + numbered(rest)
    assert ids == list(range(1, 201))
    assert rest[-1].event == "end"
    assert json.loads(rest[-1].data)["status"] == "succeeded"


async def test_a_replay_leaves_in_bounded_writes() -> None:
    """A thousand kept events of 100 kB replayed to a reader: written a chunk at a time
    (each send waits on the connection's flow control), never as one 100 MB write that a
    reader who never reads would pin."""
    from agent_server.http.sse import REPLAY_CHUNK, EventStream, LocalEvents, Streams
    from agent_server.model.execution import Execution, ExecutionStatus
    from agent_server.model.waiting import Closing

    execution = Execution("chatter", None, "here")
    log = execution.event_log(1000)
    payload = '"' + "x" * 100_000 + '"'
    for _ in range(1000):
        log.append("progress", payload)
    execution.finish(ExecutionStatus.SUCCEEDED, result=None)
    writes: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            writes.append(len(message.get("body", b"")))

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()  # the client stays
        raise AssertionError("unreachable")

    stream = EventStream(Streams(15.0, Closing(), lambda _: None), LocalEvents(execution), 0)
    await asyncio.wait_for(stream({"type": "http"}, receive, send), 10)
    assert sum(writes) > 100_000_000
    assert max(writes) <= REPLAY_CHUNK + 110_000  # a chunk, and one event past it at most
    assert len(writes) > 300
