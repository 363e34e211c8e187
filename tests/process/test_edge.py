"""The HTTP edge against one real process: 422 details that always encode, session ids
every route agrees on, uvicorn's own errors as JSON, and bounds on what one connection may
hold (its body's time, its unread answers, its pipelined requests)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from agent_server.http.http_limits import MAX_PIPELINE
from agent_server.model.names import is_session_id
from agent_server.process.launcher import run_command
from tests.support.process import APPS_DIR, ServerProcess, free_port, serving
from tests.support.raw_http import Raw, Responses, exchange, rss_kib

#: Bound on every single exchange (seconds).
TIMEOUT = 10.0
#: The module's server gives bodies and unread answers this long (seconds).
DEADLINE = 1.0

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["tests_app:agent", "--body-timeout", str(DEADLINE), "--write-timeout", str(DEADLINE)]
    with serving(tmp_path_factory, "edge", *args) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        yield http


def _post(server: ServerProcess, path: str, body: bytes, *headers: bytes) -> tuple[int, bytes]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n".encode()
        + b"".join(header + b"\r\n" for header in headers)
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    status, headers_seen, answer = exchange(server, request)
    assert headers_seen["content-type"] == "application/json", answer[:200]
    return status, answer


# -- 3: 422 details ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reasoner", "body"),
    [
        ("sleep", rb'{"seconds": "\ud800"}'),  # a float given a lone surrogate
        ("sleep", rb'{"\udfff": 1}'),  # an unknown key that is one
        ("sleep", rb'{"seconds": 0, "marker": ["\udbff\udbff"]}'),  # inside a list
        ("echo", rb'{"text": {"\ud800": "\udc00x"}}'),  # a nested key and value
        ("labelled", rb'{"label": {"name": "\ud83d"}}'),  # a pattern-constrained string
        ("labelled", rb'{"label": {"name": "ab", "kind": "\ud800"}, "note": "\udc01"}'),
        ("labelled", rb'{"label": "\ud800", "\ud800\ud800": null}'),  # extra key, bad model
    ],
)
def test_422_details_always_encode(server: ServerProcess, reasoner: str, body: bytes) -> None:
    """Lone surrogates are valid JSON escapes but not UTF-8: the detail echoes them escaped
    as text, in a body that is strict UTF-8 JSON, never a 500."""
    status, answer = _post(server, f"/reasoners/{reasoner}", body)
    assert status == 422, answer[:300]
    text = answer.decode("utf-8")  # strict: raises on anything UTF-8 cannot carry
    detail = json.loads(text)["detail"]
    assert detail and all({"type", "loc", "msg"} <= set(error) for error in detail)
    assert "\\\\u" in text  # the surrogate came back as the text of its escape


def test_422_detail_keeps_encodable_input_as_it_was(server: ServerProcess) -> None:
    status, answer = _post(server, "/reasoners/labelled", '{"label": {"name": "Été"}}'.encode())
    assert status == 422
    [error] = json.loads(answer)["detail"]
    assert error["loc"] == ["label", "name"] and error["input"] == "Été"


# -- 6: session ids ----------------------------------------------------------------------------

#: Refused wherever a session id is given: what a path segment cannot carry as it is.
BAD_SESSION_IDS = [
    "a/b",
    "café",
    "a b",
    "a%2Fb",
    "%41",
    "..",
    ".",
    "x" * 257,
    "a?b",
    "a#b",
    "a\\b",
    'a"b',
    "a<b>",
    "tab\there",
]
#: Accepted, and so releasable at /sessions/{id} and findable by ?session_id=.
GOOD_SESSION_IDS = [
    "s",
    "conv-7",
    "user:42@example.com",
    "a.b_c~d",
    "!$&'()*+,;=",
    "...",
    "x" * 256,
]


@pytest.mark.parametrize("session_id", BAD_SESSION_IDS)
def test_unaddressable_session_ids_are_400_everywhere(
    server: ServerProcess, client: httpx.Client, session_id: str
) -> None:
    """The header, the release route and the list filter refuse the same ids, so no work
    can be started under an id that could not be released or found."""
    header = b"X-Session-ID: " + session_id.encode()
    status, answer = _post(server, "/reasoners/echo/async", b'{"text": "x"}', header)
    assert status == 400 and b"session id is" in answer, answer[:300]
    path = quote(session_id, safe="")
    status, _, answer = exchange(
        server, f"DELETE /sessions/{path} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
    )
    assert status == 400 and b"session id is" in answer, (path, answer[:300])
    listed = client.get("/executions", params={"session_id": session_id})
    assert listed.status_code == 400 and "session id is" in listed.json()["detail"]


def test_a_slash_in_the_release_path_is_400_in_any_form(server: ServerProcess) -> None:
    """uvicorn decodes '%2F' in the path: both forms reach the release route and are
    refused as ids, not missed as routes."""
    for path in ["a/b", "a%2Fb", "a%2fb", "%2F", "a/", "%2E%2E", "a%252Fb"]:
        request = f"DELETE /sessions/{path} HTTP/1.1\r\nHost: t\r\n\r\n"
        status, _, answer = exchange(server, request.encode())
        assert status == 400, (path, answer[:200])


@pytest.mark.parametrize("session_id", GOOD_SESSION_IDS)
def test_every_accepted_session_id_is_findable_and_releasable(
    client: httpx.Client, session_id: str
) -> None:
    assert is_session_id(session_id)
    started = client.post(
        "/reasoners/sleep/async", json={"seconds": 60}, headers={"X-Session-ID": session_id}
    )
    assert started.status_code == 202, started.text
    execution_id = started.json()["execution_id"]
    found = client.get("/executions", params={"session_id": session_id}).json()
    assert [e["execution_id"] for e in found] == [execution_id]
    # The id as the path segment, unencoded: every accepted character may stand there.
    released = client.delete(f"/sessions/{session_id}", params={"timeout": 5})
    assert released.status_code == 200, released.text
    assert released.json()["session_id"] == session_id
    assert released.json()["cancelled"] == 1
    assert client.get("/executions", params={"session_id": session_id}).json() == []
    assert client.get(f"/executions/{execution_id}").status_code == 404


# -- 9: uvicorn's own refusals, as JSON ---------------------------------------------------------


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nNo colon here\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\nHost: t\r\n\r\n",
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n",
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100,
        b"GET /\x00 HTTP/1.1\r\n\r\n",
    ],
    ids=["header", "version", "length", "chunk", "tls", "nul"],
)
def test_parse_errors_are_json_400(server: ServerProcess, request_bytes: bytes) -> None:
    status, headers, body = exchange(server, request_bytes)
    assert status == 400, body[:200]
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    assert json.loads(body)["detail"] == "invalid HTTP request"


def test_parse_error_after_a_pipelined_request_does_not_cut_its_answer(
    server: ServerProcess,
) -> None:
    """The request before the garbage is answered whole; then the connection closes."""
    raw = Raw(server.port)
    try:
        raw.send(
            b"POST /reasoners/sleep HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 16\r\n\r\n" + b'{"seconds": 0.2}' + b"GARBAGE\x00\r\n\r\n"
        )
        replies = Responses(raw)
        status, body = replies.next()
        assert status == 200 and json.loads(body)["result"] == {"slept": 0.2}
        assert replies.closed()
    finally:
        raw.close()


# -- 8: a body's deadline, unread answers, the list's byte cap ----------------------------------


def _head(length: int) -> bytes:
    return (
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(length).encode() + b"\r\n\r\n"
    )


@pytest.mark.parametrize("sent", [b"", b'{"text": '], ids=["no-body", "part"])
def test_a_body_not_sent_in_time_is_408_and_closed(server: ServerProcess, sent: bytes) -> None:
    raw = Raw(server.port)
    started = time.monotonic()
    try:
        raw.send(_head(100) + sent)
        status, headers, body = raw.response()
        elapsed = time.monotonic() - started
        assert status == 408 and headers["content-type"] == "application/json", body
        assert json.loads(body)["detail"] == "request body not received in time"
        assert Responses(raw).closed()
    finally:
        raw.close()
    assert DEADLINE * 0.9 <= elapsed < DEADLINE + 3.0


def test_a_body_trickled_byte_by_byte_gets_no_more_time(server: ServerProcess) -> None:
    """A byte every 0.2 s (paced like a slow client) keeps reads coming but does not move
    the deadline: it runs from the end of the head."""
    raw = Raw(server.port)
    started = time.monotonic()
    try:
        raw.send(_head(100))
        answered = False
        while not answered and time.monotonic() - started < TIMEOUT:
            try:
                raw.send(b" ")
            except OSError:
                break
            answered = bool(socket_readable(raw.sock, 0.2))
        status, _, body = raw.response()
    finally:
        raw.close()
    assert status == 408, body
    assert time.monotonic() - started < DEADLINE + 3.0


def socket_readable(sock: socket.socket, timeout: float) -> bool:
    import select

    return bool(select.select([sock], [], [], timeout)[0])


def test_a_body_in_time_is_served_across_reads(server: ServerProcess) -> None:
    raw = Raw(server.port)
    try:
        raw.send(_head(13))
        raw.send(b'{"text": "x"}')
        status, _, body = raw.response()
    finally:
        raw.close()
    assert status == 200 and json.loads(body)["result"] == {"text": "x"}


def _big_results(client: httpx.Client, count: int, kilobytes: int) -> None:
    session = f"big-{kilobytes}-{count}-{time.monotonic_ns()}"
    for _ in range(count):
        response = client.post(
            "/reasoners/big_result",
            json={"kilobytes": kilobytes},
            headers={"X-Session-ID": session},
        )
        assert response.status_code == 200


def test_list_responses_stop_at_their_byte_cap(client: httpx.Client) -> None:
    """Five results of 1 MiB: a list stops before 4 MiB of JSON and says so."""
    _big_results(client, 5, 1024)
    listed = client.get("/executions", params={"reasoner": "big_result", "limit": 1000})
    assert listed.status_code == 200
    assert listed.headers["x-truncated"] == "true"
    assert len(listed.content) <= 4 * 1024 * 1024
    assert len(listed.json()) == 3
    small = client.get("/executions", params={"reasoner": "big_result", "limit": 2})
    assert "x-truncated" not in small.headers and len(small.json()) == 2


def _open_sockets(pid: int) -> int:
    """The server's open sockets: one fewer once it has ended a connection."""
    folder = Path(f"/proc/{pid}/fd")
    count = 0
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            count += os.readlink(folder / name).startswith("socket:")
    return count


def test_a_client_that_does_not_read_is_cut_off(
    server: ServerProcess, client: httpx.Client
) -> None:
    """Megabytes of answer to a client that reads none: after the write deadline the server
    drops the connection and the unsent part of the answer (the client, reading at last,
    gets less than the whole answer, then the end)."""
    _big_results(client, 3, 1024)
    pid = server.proc.pid
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(TIMEOUT)
    sock.connect(("127.0.0.1", server.port))
    try:
        sock.sendall(b"GET /executions?reasoner=big_result&limit=3 HTTP/1.1\r\nHost: t\r\n\r\n")
        started = time.monotonic()
        with_it = _open_sockets(pid)
        while _open_sockets(pid) >= with_it:
            assert time.monotonic() - started < DEADLINE + TIMEOUT, "never cut off"
            time.sleep(0.05)  # polling the server's sockets, not waiting for a guess
        elapsed = time.monotonic() - started
        received = b""
        try:
            while chunk := sock.recv(1 << 20):
                received += chunk
        except ConnectionResetError:
            pass
    finally:
        sock.close()
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert 0 < len(body) < length
    assert elapsed >= DEADLINE * 0.9


# -- 7: pipelining ------------------------------------------------------------------------------


def test_pipelined_requests_are_bounded_per_connection(server: ServerProcess) -> None:
    """A slow request then 14,000 pipelined GETs in one send: the first and the next
    MAX_PIPELINE are answered in order, the rest are never read (the connection closes, as
    HTTP/1.1 lets a server do), and the server's memory barely moves."""
    before = rss_kib(server.proc.pid)
    raw = Raw(server.port)
    try:
        slow = b'{"seconds": 0.5}'
        raw.send(
            b"POST /reasoners/sleep HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: "
            + str(len(slow)).encode()
            + b"\r\n\r\n"
            + slow
            + b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n" * 14_000
        )
        replies = Responses(raw)
        statuses = [replies.next()[0]]
        while not replies.closed():
            statuses.append(replies.next()[0])
    finally:
        raw.close()
    assert statuses == [200] * (1 + MAX_PIPELINE)
    grown = rss_kib(server.proc.pid) - before
    assert grown < 4 * 1024, f"RSS grew {grown} KiB"


def test_zz_edge_server_logged_no_error(server: ServerProcess, client: httpx.Client) -> None:
    """Runs last: after every case above, healthy, and no unhandled error was logged."""
    assert client.get("/healthz").status_code == 200
    stderr = server.stderr()
    for text in ("Traceback", "Exception in ASGI application", "unhandled error", "ERROR"):
        assert text not in stderr, stderr[-3000:]


# -- 10, 11, 12: shutdown and start at the edge ------------------------------------------------


def test_a_body_cut_by_shutdown_is_503_json_and_the_log_stays_clean(
    server_factory: ServerFactory,
) -> None:
    server = server_factory("tests_app:agent", "--http-timeout", "1")
    holders = [Raw(server.port) for _ in range(5)]
    for raw in holders:
        raw.send(_head(100) + b'{"text": ')
    assert _echo_ok(server)  # the heads above were read before this answer
    server.signal(signal.SIGTERM)
    try:
        for raw in holders:
            status, headers, body = raw.response()
            assert status == 503, body
            assert headers["content-type"] == "application/json"
            assert headers["connection"] == "close" and headers["retry-after"] == "1"
            assert json.loads(body)["detail"] == "server is shutting down"
        code, _ = server.wait_exit(TIMEOUT)
    finally:
        for raw in holders:
            raw.close()
    assert code == 0
    stderr = server.stderr()
    for text in ("Exception in ASGI application", "Traceback", "Cancel ", "ERROR"):
        assert text not in stderr, stderr[-3000:]


def _echo_ok(server: ServerProcess) -> bool:
    response = httpx.post(f"{server.url}/reasoners/echo", json={"text": "x"}, timeout=TIMEOUT)
    return response.status_code == 200


def test_clients_that_do_not_read_do_not_make_shutdown_errors(
    server_factory: ServerFactory,
) -> None:
    """Unread answers still buffered at the http deadline: their connections are closed
    before uvicorn would cancel their tasks (an ERROR and a traceback each)."""
    server = server_factory("tests_app:agent", "--http-timeout", "1", "--write-timeout", "60")
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        _big_results(http, 3, 1024)
    sockets = []
    for _ in range(3):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        sock.sendall(b"GET /executions?reasoner=big_result&limit=3 HTTP/1.1\r\nHost: t\r\n\r\n")
        sockets.append(sock)
    try:
        assert _echo_ok(server)  # served after the three lists were written
        server.signal(signal.SIGTERM)
        code, _ = server.wait_exit(TIMEOUT)
    finally:
        for sock in sockets:
            sock.close()
    assert code == 0, server.stderr()
    stderr = server.stderr()
    for text in ("Exception in ASGI application", "Cancel ", "ERROR", "Traceback"):
        assert text not in stderr, stderr[-3000:]
    assert "closed 3 connections whose clients were not reading" in stderr


def test_watchdog_exits_even_when_stderr_is_a_full_pipe(tmp_path: Path) -> None:
    """stderr is a pipe nobody reads, full when SIGTERM comes: logging blocks the loop, and
    the watchdog must still end the process at the grace period (exit 4), its own line
    unwritten."""
    port = free_port()
    read_end, write_end = os.pipe()
    command = run_command(
        "tests_app:agent",
        *("--grace-period", "3", "--cancel-timeout", "0.5", "--http-timeout", "0.5"),
        port=port,
    )
    env = {**os.environ, "TESTS_MARKER_DIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        command, cwd=APPS_DIR, env=env, stdout=subprocess.DEVNULL, stderr=write_end
    )
    os.close(write_end)
    try:
        started = time.monotonic()
        captured = b""
        while b"running on" not in captured:  # read the start-up lines, then stop reading
            assert time.monotonic() - started < TIMEOUT and proc.poll() is None, captured
            captured += os.read(read_end, 65_536)
        ready = False
        while not ready:
            assert time.monotonic() - started < TIMEOUT, "never ready"
            with contextlib.suppress(httpx.TransportError):
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
        _fill_pipe(proc.pid)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=TIMEOUT)
        elapsed = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_end)
    assert code == 4
    assert 1.5 <= elapsed < 5.0


def _fill_pipe(pid: int) -> None:
    """Fill the server's stderr pipe. Opened through /proc, the pipe gets a descriptor of
    its own, non-blocking for this only; the idle server writes nothing meanwhile."""
    fd = os.open(f"/proc/{pid}/fd/2", os.O_WRONLY | os.O_NONBLOCK)
    try:
        for size in (4096, 1):
            with contextlib.suppress(BlockingIOError):
                while True:
                    os.write(fd, b"x" * size)
    finally:
        os.close(fd)


class _OnPort(ServerProcess):
    """A server on the port its arguments name (the usual one takes port 0)."""

    def command(self, args: list[str]) -> list[str]:
        return run_command(None, *args, port=None)


def test_a_failed_start_exits_1_without_a_shutdown(tmp_path: Path) -> None:
    """The port is taken: exit 1, and no "shutdown began" nor a report saying exit code 0."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = _OnPort(["tests_app:agent", "--port", str(port)], {}, tmp_path)
        try:
            code, _ = server.wait_exit(TIMEOUT)
            stderr = server.stderr()
        finally:
            server.close()
    assert code == 1, stderr
    assert "address already in use" in stderr.lower()
    for text in ("shutdown began", "shutdown report", "exit_code", "Traceback"):
        assert text not in stderr, stderr
