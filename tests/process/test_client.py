"""agent_server.client against real `agent-server run` processes: every method and every
error type, events resumed after a cut, a start whose connection is cut retried without a
second run, and 200 runs that ride a rolling restart of three replicas behind haproxy.

Runs are counted by the `counted` reasoner in the test's own Redis (TESTS_REDIS_URL), an
account independent of the server's records.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.client import (
    AgentClient,
    AgentServerError,
    AsyncAgentClient,
    Busy,
    Conflict,
    Execution,
    ExecutionCancelled,
    ExecutionFailed,
    ExecutionLost,
    InvalidInput,
    NotFound,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)
from tests.support.cluster import Cluster, metric, started_cluster
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.redis

WAIT = 10.0
Start = Callable[..., ServerProcess]


def runs(redis: RedisServer, key: str) -> int:
    """How often `counted` ran with this key (0 when never)."""
    reply = redis.command("GET", f"tests:runs:{key}") or b""
    if reply.startswith(b"$-1"):
        return 0
    return int(reply.split(b"\r\n")[1])


@pytest.fixture
def server(server_factory: Start, redis_url: str) -> ServerProcess:
    return server_factory("tests_app:agent", env={"TESTS_REDIS_URL": redis_url})


@pytest.fixture
def client(server: ServerProcess) -> Iterator[AgentClient]:
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        yield client


# -- every method ---------------------------------------------------------------------------


def test_run_returns_the_result(client: AgentClient, redis_server: RedisServer) -> None:
    assert client.run("echo", {"text": "hi"}) == {"text": "hi"}
    assert client.run("counted", {"key": "once"}) == {"key": "once", "runs": 1}
    assert runs(redis_server, "once") == 1
    execution = client.run_execution("echo", {"text": "x"}, session="s-1")
    assert (execution.status, execution.session_id, execution.result) == (
        "succeeded",
        "s-1",
        {"text": "x"},
    )


def test_start_then_wait_get_cancel(client: AgentClient) -> None:
    handle = client.start("sleep", {"seconds": 0.3})
    assert handle.execution.status in ("queued", "running")
    assert handle.get().execution_id == handle.execution_id
    ended = handle.wait(timeout=WAIT)
    assert (ended.status, ended.result) == ("succeeded", {"slept": 0.3})
    assert handle.result() == {"slept": 0.3}

    slow = client.start("sleep", {"seconds": 30})
    with pytest.raises(WaitTimeout) as timed_out:
        slow.wait(timeout=0.3)
    assert timed_out.value.execution is not None
    assert timed_out.value.execution.status == "running"
    assert slow.cancel().execution_id == slow.execution_id
    with pytest.raises(ExecutionCancelled) as cancelled:
        slow.result(timeout=WAIT)
    assert cancelled.value.reason == "request"
    assert cancelled.value.execution.status == "cancelled"
    # A finished execution can be forgotten; then it is unknown.
    client.forget(slow.execution_id)
    with pytest.raises(NotFound):
        slow.get()


def test_list_reasoners_and_release_session(client: AgentClient) -> None:
    described = {reasoner.name: reasoner for reasoner in client.reasoners()}
    assert "echo" in described and "counted" in described
    assert described["echo"].input_schema["properties"]["text"]["type"] == "string"

    done = client.run_execution("echo", {"text": "listed"}, session="lister")
    running = client.start("sleep", {"seconds": 30}, session="lister")
    listed = client.list(session="lister")
    assert {e.execution_id for e in listed} == {done.execution_id, running.execution_id}
    assert [e.execution_id for e in client.list(status="running", session="lister")] == [
        running.execution_id
    ]
    assert all(e.reasoner == "echo" for e in client.list(reasoner="echo", limit=5))
    assert len(client.list(limit=1)) == 1

    with pytest.raises(Conflict) as busy:
        client.release_session("lister", cancel_running=False)
    assert busy.value.status == 409
    release = client.release_session("lister", timeout=5)
    assert (release.session_id, release.cancelled, release.forgotten) == ("lister", 1, 2)
    assert client.list(session="lister") == []


def test_events_stream_through_the_end_and_resume_after(client: AgentClient) -> None:
    handle = client.start("chatter", {"count": 4, "pause": 0.05})
    events = list(handle.events())
    progress = [event for event in events if event.event == "progress"]
    assert [(e.id, e.data) for e in progress] == [(n + 1, {"n": n}) for n in range(4)]
    end = events[-1]
    assert end.event == "end" and end.id is None
    assert Execution.from_json(end.data).status == "succeeded"
    # Resumed after event 2: only what follows it.
    later = list(client.events(handle.execution_id, after=2))
    assert [e.id for e in later if e.event == "progress"] == [3, 4]
    assert later[-1].event == "end"


# -- every error ----------------------------------------------------------------------------


def test_errors_are_typed(client: AgentClient, server: ServerProcess) -> None:
    with pytest.raises(ExecutionFailed) as failed:
        client.run("fail", {"message": "bad input"})
    assert (failed.value.error_type, failed.value.message) == ("ValueError", "bad input")
    assert failed.value.execution.status == "failed"

    with pytest.raises(NotFound) as unknown:
        client.run("no_such_reasoner")
    assert unknown.value.status == 404 and "no_such_reasoner" in str(unknown.value.detail)
    with pytest.raises(NotFound):
        client.get("0" * 32)

    with pytest.raises(InvalidInput) as invalid:
        client.run("echo", {"text": 3})
    assert invalid.value.status == 422
    assert invalid.value.errors[0]["loc"] == ["text"]

    with (
        AgentClient("http://127.0.0.1:9", retry_for=0.5) as nowhere,
        pytest.raises(Unavailable) as unreachable,
    ):
        nowhere.reasoners()
    assert unreachable.value.status is None
    assert isinstance(unreachable.value.__cause__, httpx.ConnectError)


def test_a_run_cancelled_by_a_session_release_raises_cancelled(
    client: AgentClient, server: ServerProcess
) -> None:
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            client.run, "sleep", {"seconds": 30, "marker": "in-session"}, session="doomed"
        )
        server.wait_marker("in-session")
        assert client.release_session("doomed", timeout=5).cancelled == 1
        with pytest.raises(ExecutionCancelled) as cancelled:
            running.result(timeout=WAIT)
    assert cancelled.value.reason == "session_released"


def test_unauthorized_without_the_token(server_factory: Start) -> None:
    secured = server_factory("tests_app:agent", "--api-token", "s3cret-token")
    with AgentClient(secured.url) as anonymous, pytest.raises(Unauthorized) as refused:
        anonymous.reasoners()
    assert refused.value.status == 401
    with AgentClient(secured.url, token="s3cret-token") as client:
        assert client.run("echo", {"text": "in"}) == {"text": "in"}


def test_429_is_retried_after_retry_after_then_busy(server_factory: Start) -> None:
    narrow = server_factory("tests_app:agent", "--max-inflight", "1")
    with AgentClient(narrow.url, retry_for=WAIT) as client:
        client.start("sleep", {"seconds": 1.0, "marker": "holding"})
        narrow.wait_marker("holding")
        # Refused with 429 + Retry-After: 1 until the sleep ends, then run.
        assert client.run("echo", {"text": "after"}) == {"text": "after"}
    assert metric(narrow.url, "agent_server_http_requests_total", status="429") >= 1
    with AgentClient(narrow.url, retry_for=0.5) as impatient:
        impatient.start("sleep", {"seconds": 30})
        with pytest.raises(Busy) as busy:
            impatient.run("echo", {"text": "never"})
    assert busy.value.status == 429


def test_a_lost_execution_raises_lost(server_factory: Start, redis_url: str) -> None:
    store = ["tests_app:agent", "--store", redis_url, "--lease-ttl", "1"]
    owner = server_factory(*store)
    witness = server_factory(*store)
    with AgentClient(owner.url) as client:
        handle = client.start("sleep", {"seconds": 60, "marker": "owned"})
    owner.wait_marker("owned")
    owner.signal(signal.SIGKILL)
    owner.wait_exit(WAIT)
    with (
        AgentClient(witness.url, retry_for=WAIT) as client,
        pytest.raises(ExecutionLost) as lost,
    ):
        client.handle(handle.execution_id).result(timeout=WAIT)
    assert lost.value.execution.status == "lost"
    assert lost.value.execution.error is not None
    assert lost.value.execution.error["type"] == "ExecutionLost"


# -- the async client -----------------------------------------------------------------------


async def test_the_async_client(server: ServerProcess) -> None:
    async with AsyncAgentClient(server.url, retry_for=WAIT) as client:
        assert await client.run("echo", {"text": "a"}) == {"text": "a"}
        assert "chatter" in {r.name for r in await client.reasoners()}
        handle = await client.start("chatter", {"count": 3})
        seen = [event async for event in handle.events()]
        assert [e.id for e in seen if e.event == "progress"] == [1, 2, 3]
        assert (await handle.wait(WAIT)).status == "succeeded"
        assert (await handle.get()).result == {"emitted": 3}
        slow = await client.start("sleep", {"seconds": 30}, session="async-s")
        with pytest.raises(WaitTimeout):
            await slow.wait(0.2)
        assert [e.execution_id for e in await client.list(session="async-s")] == [slow.execution_id]
        await slow.cancel()
        with pytest.raises(ExecutionCancelled):
            await slow.result(WAIT)
        with pytest.raises(ExecutionFailed):
            await client.run("fail")
        with pytest.raises(NotFound):
            await client.run("no_such_reasoner")
        with pytest.raises(InvalidInput):
            await client.run("echo", {})
        release = await client.release_session("async-s")
        assert release.forgotten == 1
        await client.forget(handle.execution_id)
        with pytest.raises(NotFound):
            await client.get(handle.execution_id)


# -- connections cut ------------------------------------------------------------------------


class CuttingProxy:
    """A loopback TCP proxy that relays connections to `target`, except that the first
    `cuts` connections are closed once the server's answer has begun: before any byte of
    it reaches the client, or (with `cut_at`) just before that marker in the answer."""

    def __init__(self, target: int, cuts: int = 1, cut_at: bytes | None = None) -> None:
        self.target = target
        self.cuts = cuts
        self.cut_at = cut_at
        self.connections = 0
        self.cut = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            cutting = self.cut < self.cuts
            if cutting:
                self.cut += 1
            upstream = socket.create_connection(("127.0.0.1", self.target), timeout=WAIT)
            threading.Thread(
                target=self._pipe, args=(downstream, upstream, False), daemon=True
            ).start()
            threading.Thread(
                target=self._pipe, args=(upstream, downstream, cutting), daemon=True
            ).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, cutting: bool) -> None:
        seen = b""
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if cutting:
                    seen += data
                    if self.cut_at is None:
                        break  # the answer began: the client gets none of it
                    at = seen.find(self.cut_at)
                    if at >= 0:
                        sink.sendall(data[: len(data) - (len(seen) - at)])
                        break
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()


def test_a_start_cut_before_its_answer_is_retried_without_a_second_run(
    server: ServerProcess, redis_server: RedisServer
) -> None:
    proxy = CuttingProxy(server.port)
    try:
        with AgentClient(proxy.url, retry_for=WAIT) as client:
            handle = client.start("counted", {"key": "cut-start"})
            assert handle.result(timeout=WAIT) == {"key": "cut-start", "runs": 1}
    finally:
        proxy.close()
    assert proxy.cut == 1 and proxy.connections >= 2  # it was cut, and the client came back
    assert runs(redis_server, "cut-start") == 1
    with AgentClient(server.url) as direct:
        assert len(direct.list(reasoner="counted")) == 1


def test_a_sync_run_cut_before_its_answer_finds_its_execution(
    server: ServerProcess, redis_server: RedisServer
) -> None:
    proxy = CuttingProxy(server.port)
    try:
        with AgentClient(proxy.url, retry_for=WAIT) as client:
            assert client.run("counted", {"key": "cut-run"}) == {"key": "cut-run", "runs": 1}
    finally:
        proxy.close()
    assert proxy.cut == 1 and proxy.connections >= 2
    assert runs(redis_server, "cut-run") == 1


def test_events_cut_mid_stream_resume_after_the_last_event(
    client: AgentClient, server: ServerProcess
) -> None:
    handle = client.start("chatter", {"count": 6, "pause": 0.1})
    proxy = CuttingProxy(server.port, cut_at=b"id: 3\n")
    try:
        with AgentClient(proxy.url, retry_for=WAIT) as through:
            events = list(through.events(handle.execution_id))
    finally:
        proxy.close()
    assert proxy.cut == 1 and proxy.connections >= 2
    assert [e.id for e in events if e.event == "progress"] == [1, 2, 3, 4, 5, 6]
    assert events[-1].event == "end"


# -- a rolling restart ----------------------------------------------------------------------

RUNS = 200
CALLERS = 8


@pytest.fixture
def cluster(tmp_path: Path, redis_url: str, redis_server: RedisServer) -> Iterator[Cluster]:
    with started_cluster(
        tmp_path,
        redis_server,
        *("--grace-period", "8", "--cancel-timeout", "1"),
        env={"TESTS_REDIS_URL": redis_server.url},
    ) as running:
        yield running


def test_runs_ride_a_rolling_restart(cluster: Cluster, redis_server: RedisServer) -> None:
    """200 runs from 8 callers while each replica in turn is stopped (SIGTERM, drained) and
    started again: every run returns its result, and each ran exactly once."""
    keys = [f"roll-{n}" for n in range(RUNS)]
    pending = list(reversed(keys))
    lock = threading.Lock()
    results: dict[str, Any] = {}
    errors: list[str] = []
    completed_before_last_stop: list[int] = []
    began = threading.Event()

    def caller() -> None:
        with AgentClient(cluster.proxy.url, timeout=WAIT, retry_for=30) as client:
            while True:
                with lock:
                    if not pending:
                        return
                    key = pending.pop()
                try:
                    results[key] = client.run(
                        "counted", {"key": key, "seconds": random.uniform(0.3, 0.8)}
                    )
                except Exception as exc:
                    errors.append(f"{key}: {type(exc).__name__}: {exc}")
                if len(results) >= CALLERS:
                    began.set()

    def roll() -> None:
        assert began.wait(60), "no run finished"
        for index in range(3):
            old = cluster.replicas[index]
            if index == 2:
                completed_before_last_stop.append(len(results))
            old.signal(signal.SIGTERM)
            code, _ = old.wait_exit(WAIT + 5)
            assert code == 0, old.stderr()
            old.close()
            fresh = cluster.start(index)
            fresh.wait_ready()
            cluster.replicas[index] = fresh

    with ThreadPoolExecutor(CALLERS + 1) as pool:
        callers = [pool.submit(caller) for _ in range(CALLERS)]
        rolling = pool.submit(roll)
        for future in [*callers, rolling]:
            future.result(timeout=180)
    assert errors == []
    assert completed_before_last_stop[0] < RUNS  # the load was still on as the last one went
    assert results == {key: {"key": key, "runs": 1} for key in keys}
    assert {key: runs(redis_server, key) for key in keys} == dict.fromkeys(keys, 1)


def test_a_sync_run_handed_off_at_shutdown_is_followed_to_its_end(cluster: Cluster) -> None:
    """A resumable run whose replica drains past its drain timeout: the client gets 503 +
    Location and follows the execution to its next attempt on another replica."""

    def owner() -> ServerProcess:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            for replica in cluster.replicas:
                if (replica.marker_dir / "followed").exists():
                    return replica
            time.sleep(0.02)
        raise AssertionError("the run never started")

    async def run_then_drain() -> tuple[Execution, ServerProcess]:
        async with AsyncAgentClient(cluster.proxy.url, retry_for=30) as client:
            running = asyncio.create_task(
                client.run_execution("steps", {"count": 70, "pause": 0.1, "marker": "followed"})
            )
            replica = await asyncio.to_thread(owner)
            replica.signal(signal.SIGTERM)
            return await running, replica

    execution, replica = asyncio.run(run_then_drain())
    assert replica.wait_exit(WAIT + 5)[0] == 0, replica.stderr()
    assert (execution.status, execution.attempt) == ("succeeded", 2)
    assert execution.result == {"steps": 70, "attempt": 2}
    assert execution.replica != replica.replica_id  # type: ignore[attr-defined]


# -- the caller's Idempotency-Key -----------------------------------------------------------


def test_the_callers_idempotency_key_names_one_execution(
    client: AgentClient, server: ServerProcess, redis_server: RedisServer
) -> None:
    """Two starts with one key are one execution; the same key with another body is the
    server's 422 (`InvalidInput`); a run with a key runs once however often it is asked."""
    first = client.start("sleep", {"seconds": 30}, idempotency_key="order-42")
    again = client.start("sleep", {"seconds": 30}, idempotency_key="order-42")
    assert again.execution_id == first.execution_id
    with pytest.raises(InvalidInput) as other_body:
        client.start("sleep", {"seconds": 29}, idempotency_key="order-42")
    assert other_body.value.status == 422
    assert "different request" in str(other_body.value.detail)
    first.cancel()

    ran = client.run("counted", {"key": "keyed-run"}, idempotency_key="keyed-run")
    assert client.run("counted", {"key": "keyed-run"}, idempotency_key="keyed-run") == ran
    assert runs(redis_server, "keyed-run") == 1

    async def keyed() -> tuple[str, str]:
        async with AsyncAgentClient(server.url, retry_for=WAIT) as aclient:
            one = await aclient.start("sleep", {"seconds": 0.1}, idempotency_key="async-key")
            two = await aclient.start("sleep", {"seconds": 0.1}, idempotency_key="async-key")
            return one.execution_id, two.execution_id

    one, two = asyncio.run(keyed())
    assert one == two


def test_a_start_cut_before_its_answer_is_retried_with_the_callers_key(
    server: ServerProcess, redis_server: RedisServer
) -> None:
    """The retry after a cut carries the caller's key, not one of the client's own: a later
    start with that key finds the execution the cut attempt started."""
    proxy = CuttingProxy(server.port)
    try:
        with AgentClient(proxy.url, retry_for=WAIT) as through:
            handle = through.start("counted", {"key": "cut-keyed"}, idempotency_key="mine-1")
    finally:
        proxy.close()
    assert proxy.cut == 1 and proxy.connections >= 2
    with AgentClient(server.url) as direct:
        assert direct.start(
            "counted", {"key": "cut-keyed"}, idempotency_key="mine-1"
        ).execution_id == (handle.execution_id)
        assert direct.handle(handle.execution_id).result(timeout=WAIT) == {
            "key": "cut-keyed",
            "runs": 1,
        }
    assert runs(redis_server, "cut-keyed") == 1


# -- retry_for shorter than Retry-After -----------------------------------------------------


class CountingTransport(httpx.HTTPTransport):
    """Real HTTP, with the status of every answer noted, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.statuses: list[int] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.statuses.append(response.status_code)
        return response


def test_busy_comes_once_retry_for_is_spent_even_below_retry_after(
    server_factory: Start,
) -> None:
    """The server's Retry-After (1 s) is longer than `retry_for` (0.3 s): the client waits
    what is left of `retry_for`, not the whole Retry-After, tries once more at its end, then
    raises `Busy`."""
    full = server_factory("tests_app:agent", "--max-inflight", "1")
    with AgentClient(full.url) as holder:
        held = holder.start("sleep", {"seconds": 30, "marker": "full"})
        full.wait_marker("full")
        counted = CountingTransport()
        with AgentClient(full.url, retry_for=0.3, transport=counted) as impatient:
            began = time.monotonic()
            with pytest.raises(Busy) as busy:
                impatient.run("echo", {"text": "never"})
            elapsed = time.monotonic() - began
        held.cancel()
    assert busy.value.status == 429
    assert counted.statuses == [429, 429]  # the first try, and one at the end of retry_for
    assert 0.3 <= elapsed < 1.0  # not the Retry-After's 1 s


# -- events bounded by a timeout ------------------------------------------------------------


def test_a_timeout_bounds_the_whole_event_stream(
    client: AgentClient, server: ServerProcess
) -> None:
    """Events come at 0, 1.5 and 3 s; a 2 s timeout ends the stream at 2 s, though the event
    at 1.5 s restarted the connection's read timeout (which alone would wait to 3 s), for
    both clients. The execution goes on."""
    handle = client.start("chatter", {"count": 3, "pause": 1.5})
    seen: list[int | None] = []
    began = time.monotonic()
    with pytest.raises(WaitTimeout) as timed_out:
        for event in handle.events(timeout=2.0):
            seen.append(event.id)
    elapsed = time.monotonic() - began
    assert seen == [1, 2]
    assert 2.0 <= elapsed < 2.9, elapsed
    assert "did not end within 2 s" in str(timed_out.value)
    assert handle.result(timeout=WAIT) == {"emitted": 3}

    async def streamed() -> tuple[list[int | None], float]:
        async with AsyncAgentClient(server.url, retry_for=WAIT) as aclient:
            ahandle = await aclient.start("chatter", {"count": 3, "pause": 1.5})
            aseen: list[int | None] = []
            abegan = time.monotonic()
            with pytest.raises(WaitTimeout):
                async for event in ahandle.events(timeout=2.0):
                    aseen.append(event.id)
            return aseen, time.monotonic() - abegan

    aseen, aelapsed = asyncio.run(streamed())
    assert aseen == [1, 2]
    assert 2.0 <= aelapsed < 2.9, aelapsed


# -- pages ----------------------------------------------------------------------------------


def test_iter_executions_follows_the_next_links_to_the_last_page(
    client: AgentClient, server: ServerProcess
) -> None:
    """Five records, two a page: three requests, each following the `Link: rel="next"` of
    the one before, every record once, newest first; a page with no Link is the last one
    (one request). `list` stays one page; several statuses match any of them."""
    ended = [client.run_execution("echo", {"text": str(n)}, session="paged") for n in range(4)]
    running = client.start("sleep", {"seconds": 30}, session="paged")
    newest_first = [running.execution_id] + [e.execution_id for e in reversed(ended)]

    counted = CountingTransport()
    with AgentClient(server.url, transport=counted) as paging:
        assert [e.execution_id for e in paging.list(session="paged", limit=2)] == newest_first[:2]
        assert len(counted.statuses) == 1
        counted.statuses.clear()
        every = [e.execution_id for e in paging.iter_executions(session="paged", limit=2)]
        assert every == newest_first
        assert counted.statuses == [200, 200, 200]
        counted.statuses.clear()
        assert [e.execution_id for e in paging.iter_executions(session="paged", limit=5)] == (
            newest_first
        )
        assert counted.statuses == [200]  # no Link: one page

        both = paging.iter_executions(status=["running", "failed"], session="paged", limit=1)
        assert [e.execution_id for e in both] == [running.execution_id]
        assert [
            e.status for e in paging.list(status=("succeeded", "running"), session="paged")
        ] == ["running"] + ["succeeded"] * 4

    async def paged() -> list[str]:
        async with AsyncAgentClient(server.url, retry_for=WAIT) as aclient:
            return [e.execution_id async for e in aclient.iter_executions(session="paged", limit=3)]

    assert asyncio.run(paged()) == newest_first


class LinkingServer:
    """A loopback HTTP server whose `GET /executions` answers one execution and a next
    link to another origin."""

    def __init__(self) -> None:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                body = b'[{"execution_id": "e1", "reasoner": "echo", "status": "succeeded"}]'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Link", '<http://127.0.0.2:9/executions?cursor=x>; rel="next"')
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_a_next_page_at_another_origin_is_not_followed() -> None:
    """The token goes with every request of the client: a Link to another origin is refused
    rather than followed there (`list`, one page, does not read it)."""
    linking = LinkingServer()
    try:
        with AgentClient(linking.url, token="secret", retry_for=1) as client:
            assert [e.execution_id for e in client.list()] == ["e1"]
            with pytest.raises(AgentServerError) as refused:
                list(client.iter_executions())
    finally:
        linking.close()
    assert "another origin" in str(refused.value)
