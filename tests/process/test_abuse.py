"""Bad input and protocol abuse against one real process: every case gets a clear 4xx (or
is bounded in size and time), no response leaks internals, and the server stays healthy."""

from __future__ import annotations

import re
import select
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from agent_server.model.names import is_session_id
from tests.support.cluster import wait_for
from tests.support.process import ServerProcess, server_errors, serving
from tests.support.raw_http import Raw, Responses, exchange, rss_kib

#: A small body limit keeps the oversized cases quick.
BODY_LIMIT = 65_536
#: Bound on every single exchange (seconds).
TIMEOUT = 10.0
#: What no response may contain: tracebacks, source paths.
LEAKS = ("Traceback", 'File "', "/agent_server/", "site-packages")
ZERO_RELEASE = {"cancelled": 0, "abandoned": 0, "forgotten": 0}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    args = ["tests_app:agent", "--max-body-size", str(BODY_LIMIT), "--http-timeout", "1"]
    with serving(tmp_path_factory, "abuse", *args) as process:
        yield process


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        yield http


def _assert_clean(body: bytes) -> None:
    text = body.decode("utf-8", "replace")
    for leak in LEAKS:
        assert leak not in text, text


def _assert_json_error(response: httpx.Response, *statuses: int) -> None:
    assert response.status_code in statuses, (response.status_code, response.text)
    assert isinstance(response.json()["detail"], str | list)
    _assert_clean(response.content)


# -- bodies ----------------------------------------------------------------------------------


def test_declared_huge_body_is_refused_before_it_is_sent(server: ServerProcess) -> None:
    head = (
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 10737418240\r\n\r\n"
    )
    started = time.monotonic()
    status, _, body = exchange(server, head + b"x" * 1000)  # 10 GiB announced, 1 KB sent
    assert status == 413
    assert b"exceeds" in body
    assert time.monotonic() - started < 2.0


def test_declared_huge_schedule_bodies_are_refused_before_they_are_sent(
    server: ServerProcess,
) -> None:
    """The schedule routes read a body as the start routes do: 413 from the head, and
    nothing made or changed."""
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        body = {"reasoner": "echo", "cron": "0 0 1 1 *", "input": {"text": "x"}}
        made = http.post("/schedules", json=body)
        assert made.status_code == 201, made.text
        schedule = made.json()
        try:
            for target in ("POST /schedules", f"PATCH /schedules/{schedule['schedule_id']}"):
                head = (
                    f"{target} HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    "Content-Length: 10737418240\r\n\r\n"
                ).encode()
                started = time.monotonic()
                status, _, body = exchange(server, head + b"x" * 1000)
                assert status == 413, (target, body[:200])
                _assert_clean(body)
                assert time.monotonic() - started < 2.0
            assert http.get("/schedules").json() == [schedule]
        finally:
            assert http.delete(f"/schedules/{schedule['schedule_id']}").status_code == 204


def test_streamed_body_is_cut_at_the_limit(server: ServerProcess) -> None:
    """A chunked body with no length: the server answers 413 once the limit is crossed,
    long before the 8 MiB the client would send."""
    raw = Raw(server.port)
    sent = 0
    try:
        raw.send(
            b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        chunk = b"4000\r\n" + b"x" * 16_384 + b"\r\n"
        while sent < 8 * 1024 * 1024:
            # Paced like a real upload, so "sent" is what the server had the chance to read.
            readable, _, _ = select.select([raw.sock], [], [], 0.02)
            if readable:
                break
            try:
                raw.send(chunk)
            except OSError:  # closed after answering: the answer is waiting to be read
                break
            sent += 16_384
        status, _, body = raw.response()
    finally:
        raw.close()
    assert status == 413, body
    assert sent < BODY_LIMIT + 256 * 1024, sent


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b"[" * 50_000 + b"]" * 50_000, 413),  # over the limit before it is parsed
        (b"[" * 30_000 + b"]" * 30_000, 400),  # deeper than any parser recursion
        (b'{"text": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", 400),
        (b'{"text": "\xff\xfe invalid utf-8"}', 400),
        (b"\xef\xbb\xbf\xef\xbb\xbf{}", 400),
        (b'{"text": "unterminated', 400),
        (b'{"text": NaN}', 400),
        (b'{"text": Infinity}', 400),
        (b'{"text": "a", "text": 1}', 422),  # the last duplicate wins, then validation
        (b"null", 422),
        (b"[]", 422),
        (b'"just a string"', 422),
        (b"1e999999", 400),
        (b'{"text": 1e400}', 400),
        (b'{"text": ' + b"9" * 5000 + b"}", 400),
        (b'{"text": "x", "extra": 1}', 422),  # one rule: an undeclared key is refused
        (b'{"text": "' + b"\\ud800" + b'"}', 200),  # a lone surrogate is valid JSON text
    ],
    ids=lambda value: value[:24].decode("latin-1") if isinstance(value, bytes) else str(value),
)
def test_malformed_json_bodies(server: ServerProcess, body: bytes, status: int) -> None:
    head = (
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    got, headers, answer = exchange(server, head + body)
    assert got == status, answer[:300]
    assert headers["content-type"] == "application/json"
    _assert_clean(answer)


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/xml",
        "application/jsonx",
        "",
    ],
)
def test_wrong_content_types_are_415(client: httpx.Client, content_type: str) -> None:
    response = client.post(
        "/reasoners/echo", content=b'{"text": "x"}', headers={"Content-Type": content_type}
    )
    _assert_json_error(response, 415)


@pytest.mark.parametrize(
    "content_type", ["application/json; charset=utf-8", "APPLICATION/JSON", "application/x+json"]
)
def test_json_content_types_are_accepted(client: httpx.Client, content_type: str) -> None:
    response = client.post(
        "/reasoners/echo", content=b'{"text": "x"}', headers={"Content-Type": content_type}
    )
    assert response.status_code == 200


# -- query parameters ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_id(client: httpx.Client) -> str:
    execution_id: str = client.post("/reasoners/echo", json={"text": "x"}).json()["execution_id"]
    return execution_id


@pytest.mark.parametrize(
    "value", ["-1", "nan", "NaN", "inf", "-inf", "1e309", "9" * 400, "abc", "", "0x10", "1,5"]
)
def test_bad_wait_is_422(client: httpx.Client, finished_id: str, value: str) -> None:
    response = client.get(f"/executions/{finished_id}", params={"wait": value})
    _assert_json_error(response, 422)


@pytest.mark.parametrize("value", ["0", "0.0", "1e9", "60", "9" * 300, "\u0661"])
def test_absurd_but_valid_wait_is_capped(
    client: httpx.Client, finished_id: str, value: str
) -> None:
    """Huge waits are capped at 60 s; on a finished execution they return at once."""
    started = time.monotonic()
    response = client.get(f"/executions/{finished_id}", params={"wait": value})
    assert response.status_code == 200
    assert time.monotonic() - started < 2.0


@pytest.mark.parametrize(
    "value", ["0", "-1", "1001", "1.5", "abc", "", "9" * 5000, "1e3", "\u0661\u0660\u0660\u0662"]
)
def test_bad_limit_is_422(client: httpx.Client, value: str) -> None:
    _assert_json_error(client.get("/executions", params={"limit": value}), 422)


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"status": "bogus"}, 422),
        ({"status": ""}, 422),
        ({"reasoner": "x" * 10_000}, 400),  # no reasoner can have that name
        ({"session_id": "\u2603" * 100}, 400),  # no request can carry it (agent_server.model.names)
        ({"limit": "1000"}, 200),
        ({"schedule_id": "x" * 10_000}, 400),  # no schedule can have that id
        ({"schedule_id": "\u2603"}, 400),
        ({"schedule_id": "echo-0"}, 200),
    ],
)
def test_list_filters(client: httpx.Client, params: dict[str, str], status: int) -> None:
    response = client.get("/executions", params=params)
    assert response.status_code == status
    _assert_clean(response.content)


#: Cursors no Link header gave, each with a well-formed id: times that are not numbers
#: Redis parses (an error there), that are not finite, not a time a record can have (12
#: digits: past the year 5138; negative), or spelled as neither store writes (an exponent);
#: then malformed ids.
_ID = "0123456789abcdef" * 2
FORGED_CURSORS = [
    *(
        f"{time}:{_ID}"
        for time in (
            "1.2.3",
            "1..",
            ".5",
            "1.",
            "inf",
            "-inf",
            "+inf",
            "Infinity",
            "nan",
            "NaN",
            "9e999",
            "1e309",
            "9e11",
            "1e9",
            "347.267E69",
            "99999999999.5e0",
            "100000000000",
            "253402300800",
            "-1",
            "-0",
            "+1",
            "0x10",
            "1_0",
            " 1",
            "1 ",
            "\u0661",
            "(1",
            "1e",
            "",
            "9" * 400,
        )
    ),
    "1700000000.5:" + _ID.upper(),
    "1700000000.5:" + _ID[:-1],
    "1700000000.5:" + _ID + "0",
    "1700000000.5:" + _ID + "\n",
    "1700000000.5:" + _ID[:-1] + "\x00",
    "1700000000.5::" + _ID,
    "1700000000.5",
    _ID,
    "",
]


@pytest.mark.parametrize("store", ["memory", pytest.param("redis", marks=pytest.mark.redis)])
def test_forged_cursors_and_filters_are_4xx_on_both_stores(
    request: pytest.FixtureRequest, server_factory: Any, store: str
) -> None:
    """The list route reads its query before any store sees it: a cursor no Link gave is a
    400 (Redis answered 500 for a time it could not parse; memory took `inf` as a time), a
    filter no record can match (a reasoner name no reasoner can have, a huge or odd limit)
    is a 4xx; the pages a Link gives still cover every record once."""
    args = ["tests_app:agent"]
    if store == "redis":
        redis = request.getfixturevalue("own_redis")
        args += ["--store", redis.url, "--replica-id", "c"]
    server: ServerProcess = server_factory(*args)
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        made = [
            http.post("/reasoners/echo", json={"text": str(i)}).json()["execution_id"]
            for i in range(5)
        ]
        for cursor in FORGED_CURSORS:
            response = http.get("/executions", params={"cursor": cursor, "limit": 2})
            _assert_json_error(response, 400)
            assert "cursor" in response.json()["detail"], cursor
        for params, status in [
            ({"reasoner": "x" * 200}, 400),
            ({"reasoner": "echo\x00"}, 400),
            ({"reasoner": "echo\r\nX-Injected: 1"}, 400),
            ({"reasoner": "%ED%A0%80"}, 400),  # a lone surrogate, percent-encoded as is
            ({"reasoner": ""}, 400),
            ({"reasoner": "../echo"}, 400),
            ({"limit": " 5"}, 422),
            ({"limit": "+5"}, 422),
            ({"limit": "1_0"}, 422),
            ({"limit": "\u0665"}, 422),
            ({"limit": "nan"}, 422),
            ({"limit": "1" + "0" * 30}, 422),
            ({"status": "succeeded\x00"}, 422),
            ({"session_id": "s\x01"}, 400),
        ]:
            query = "&".join(f"{k}={quote(v, safe='%')}" for k, v in params.items())
            response = http.get(f"/executions?{query}")
            _assert_json_error(response, status)
        seen: list[str] = []
        path: str | None = "/executions?limit=2&reasoner=echo"
        for _ in range(10):  # bounded: 5 records, 2 a page
            assert path is not None
            page = http.get(path)
            assert page.status_code == 200, page.text
            seen += [e["execution_id"] for e in page.json()]
            path = page.links.get("next", {}).get("url")
            if path is None:
                break
        assert seen == made[::-1]
        assert server_errors(http.get("/metrics").text) == {}
    assert "Traceback" not in server.stderr()


@pytest.mark.parametrize(
    ("params", "status"),
    [
        ({"timeout": "-1"}, 422),
        ({"timeout": "nan"}, 422),
        ({"timeout": "inf"}, 422),
        ({"timeout": "abc"}, 422),
        ({"timeout": ""}, 422),
        ({"cancel_running": "maybe"}, 422),
        ({"timeout": "NONE"}, 200),
        ({"timeout": "1e300"}, 422),  # past a year: what Redis TTLs take (section 12, 7)
        ({"timeout": "31536000"}, 200),
        ({"timeout": "0", "cancel_running": "0"}, 200),
    ],
)
def test_session_release_parameters(
    client: httpx.Client, params: dict[str, str], status: int
) -> None:
    response = client.delete("/sessions/unknown-session", params=params)
    assert response.status_code == status, response.text
    if status == 200:
        assert response.json() | ZERO_RELEASE == response.json()
    else:
        _assert_json_error(response, status)


# -- identifiers -----------------------------------------------------------------------------

WEIRD_IDS = [
    "x" * 20_000,
    "\u2603\u00e9\U0001f600",
    "..%2F..%2Fetc%2Fpasswd",
    "%2e%2e%2f%2e%2e%2fhealthz",
    "%00",
    "%FF%FE",
    "a b",
    "0123456789abcdef0123456789abcdeg",
    "-1",
    "null",
]


@pytest.mark.parametrize("execution_id", WEIRD_IDS)
def test_unknown_or_malformed_execution_ids_are_404(
    server: ServerProcess, execution_id: str
) -> None:
    path = quote(execution_id, safe="%")
    for method, suffix in [("GET", ""), ("DELETE", ""), ("POST", "/cancel")]:
        request = f"{method} /executions/{path}{suffix} HTTP/1.1\r\nHost: t\r\n"
        request += "Content-Length: 0\r\n\r\n"
        status, _, body = exchange(server, request.encode())
        assert status == 404, (method, body[:200])
        _assert_clean(body)


@pytest.mark.parametrize("schedule_id", WEIRD_IDS)
def test_unknown_or_malformed_schedule_ids_are_404(server: ServerProcess, schedule_id: str) -> None:
    path = quote(schedule_id, safe="%")
    for method, suffix in [("GET", ""), ("PATCH", ""), ("DELETE", ""), ("POST", "/trigger")]:
        request = f"{method} /schedules/{path}{suffix} HTTP/1.1\r\nHost: t\r\n"
        request += "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
        status, headers, body = exchange(server, request.encode())
        assert status == 404, (method, body[:200])
        assert headers["content-type"] == "application/json"
        _assert_clean(body)


@pytest.mark.parametrize("session_id", WEIRD_IDS)
def test_unknown_sessions_release_as_empty(server: ServerProcess, session_id: str) -> None:
    """Releasing an unknown session is 200 with nothing done; an id no request could have
    carried (agent_server.model.names: a '/', a '%', a space, non-ASCII...) is 400."""
    request = f"DELETE /sessions/{quote(session_id, safe='%')} HTTP/1.1\r\nHost: t\r\n\r\n"
    status, _, body = exchange(server, request.encode())
    decoded = unquote(quote(session_id, safe="%"))
    assert status == (200 if is_session_id(decoded) else 400), body[:200]
    _assert_clean(body)


@pytest.mark.parametrize(
    ("value", "status"),
    [(b"x" * 257, 400), (b"a\tb", 400), (b"", 400), (b"\xff\xfe", 400), (b"ok-session", 202)],
)
def test_session_header_shapes(server: ServerProcess, value: bytes, status: int) -> None:
    request = (
        b"POST /reasoners/echo/async HTTP/1.1\r\nHost: t\r\nX-Session-ID: " + value + b"\r\n"
        b"Content-Type: application/json\r\nContent-Length: 13\r\n\r\n" + b'{"text": "x"}'
    )
    got, _, body = exchange(server, request)
    assert got == status, body[:300]
    _assert_clean(body)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /executions/" + b"x" * 100_000 + b" HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: " + b"v" * 200_000 + b"\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + b"X-H: v\r\n" * 20_000 + b"\r\n",
        b"FOO /healthz HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\nHost: t\r\n\r\n",
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 100,  # a TLS hello
    ],
    ids=["long-url", "huge-header", "many-headers", "bad-method", "bad-version", "smuggle",
         "negative-length", "tls"],
)  # fmt: skip
def test_broken_requests_are_4xx(server: ServerProcess, request_bytes: bytes) -> None:
    status, _, body = exchange(server, request_bytes)
    assert 400 <= status < 500, (status, body[:200])
    _assert_clean(body)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("PUT", "/reasoners/echo", 405),
        ("GET", "/reasoners/echo", 405),
        ("PATCH", "/executions", 405),
        ("PUT", "/schedules", 405),
        ("GET", "/schedules/x/trigger", 405),
        ("POST", "/schedules/x", 405),
        ("POST", "/reasoners/../healthz", 404),
        ("POST", "/reasoners/%2e%2e%2fhealthz", 404),
        ("POST", "/reasoners/" + "r" * 5000, 404),
        ("GET", "/nowhere", 404),
    ],
)
def test_wrong_routes_and_methods(
    server: ServerProcess, method: str, path: str, status: int
) -> None:
    request = f"{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"
    got, headers, body = exchange(server, request.encode())
    assert got == status, body[:200]
    assert headers["content-type"] == "application/json"
    _assert_clean(body)


# -- slow and idle clients -------------------------------------------------------------------


def test_body_sent_byte_by_byte_is_served_without_blocking_others(
    server: ServerProcess, client: httpx.Client
) -> None:
    """40 clients trickle their bodies a byte at a time; other requests are answered at
    once meanwhile, and each trickled request completes correctly."""
    body = b'{"text": "slow"}'
    head = (
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    raws = [Raw(server.port) for _ in range(40)]
    try:
        for raw in raws:
            raw.send(head)
        slowest_probe = 0.0
        for index in range(len(body)):
            for raw in raws:
                raw.send(body[index : index + 1])
            started = time.monotonic()
            assert client.get("/healthz").status_code == 200
            slowest_probe = max(slowest_probe, time.monotonic() - started)
            time.sleep(0.02)  # the pacing of a slow client, not a synchronisation
        answers = [raw.response() for raw in raws]
    finally:
        for raw in raws:
            raw.close()
    assert all(status == 200 for status, _, _ in answers)
    assert slowest_probe < 1.0


def test_idle_and_unfinished_connections_are_bounded(
    server: ServerProcess, client: httpx.Client
) -> None:
    """300 sockets that send nothing, half a head, or a head and half a body: the server
    keeps answering, spends little memory on them, and closes the first two kinds after its
    head timeout (uvicorn's keep-alive timeout, 5 s)."""
    before = rss_kib(server.proc.pid)
    idle = [Raw(server.port) for _ in range(100)]
    partial_head = [Raw(server.port) for _ in range(100)]
    partial_body = [Raw(server.port) for _ in range(100)]
    sockets = idle + partial_head + partial_body
    try:
        for raw in partial_head:
            raw.send(b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-")
        for raw in partial_body:
            raw.send(
                b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100\r\n\r\n" + b'{"text": '
            )
        started = time.monotonic()
        assert client.get("/healthz").status_code == 200
        assert client.post("/reasoners/echo", json={"text": "x"}).status_code == 200
        assert time.monotonic() - started < 1.0
        assert rss_kib(server.proc.pid) - before < 30 * 1024
        # The head timeout closes the first two kinds: silently if nothing was sent, with a
        # 408 if half a head was.
        for raw in idle:
            raw.sock.settimeout(TIMEOUT)
            assert raw.sock.recv(100) == b""
        for raw in partial_head:
            status, _, _ = raw.response()
            assert status == 408
        elapsed = time.monotonic() - started
        assert 4.0 < elapsed < TIMEOUT
    finally:
        for raw in sockets:
            raw.close()
    assert client.get("/healthz").status_code == 200


def test_client_gone_mid_body_is_not_a_server_error(server: ServerProcess) -> None:
    raw = Raw(server.port)
    raw.send(
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n" + b'{"text": '
    )
    raw.close()
    deadline = time.monotonic() + TIMEOUT
    with httpx.Client(base_url=server.url, timeout=TIMEOUT) as http:
        while "/reasoners/{name}" not in _status_line(http, "499"):
            assert time.monotonic() < deadline, "the disconnect was never counted"
            time.sleep(0.05)
    assert "unhandled error" not in server.stderr()


def _status_line(http: httpx.Client, status: str) -> str:
    lines = http.get("/metrics").text.splitlines()
    return "\n".join(line for line in lines if f'status="{status}"' in line)


# -- request heads over several reads and on keep-alive connections --------------------------


def _echo(text: bytes, *extra_headers: bytes) -> tuple[bytes, bytes]:
    """The head and body of one echo request; `extra_headers` are whole header lines."""
    body = b'{"text": "' + text + b'"}'
    head = (
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        + b"".join(extra_headers)
        + b"Content-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    return head, body


def _pad(size: int) -> bytes:
    """One header line of `size` bytes in all."""
    return b"X-Pad: " + b"p" * (size - 9) + b"\r\n"


def _send_apart(raw: Raw, parts: list[bytes]) -> None:
    """Each part in its own segment, paced like a slow client so the server reads them
    apart (not a synchronisation: a coalesced read must give the same answer)."""
    raw.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for index, part in enumerate(parts):
        if index:
            time.sleep(0.05)
        raw.send(part)


def _answer_to_parts(port: int, parts: list[bytes]) -> tuple[int, bytes]:
    """Send one request in `parts` (`_send_apart`) on a new connection; its answer."""
    raw = Raw(port)
    try:
        _send_apart(raw, parts)
        return Responses(raw).next()
    finally:
        raw.close()


@pytest.mark.parametrize("split", [1, 2, 3], ids=["cr|lf-cr-lf", "crlf|crlf", "cr-lf-cr|lf"])
def test_blank_line_split_across_reads_ends_the_head(server: ServerProcess, split: int) -> None:
    """A 40 KB head whose blank line is cut between two reads, and a 20 KB body after it in
    the second read: were the cut missed, the body would count as head (over 64 KiB, 431)."""
    head, body = _echo(b"b" * 20_000, _pad(40_000))
    status, answer = _answer_to_parts(server.port, [head[:-split], head[-split:] + body])
    assert status == 200, answer[:200]
    assert len(answer) > 20_000


@pytest.mark.parametrize(
    ("pads", "status"),
    [([30_000, 30_000], 200), ([30_000, 30_000, 30_000], 431), ([60_000, 10_000], 431)],
)
def test_head_size_is_counted_across_reads(
    server: ServerProcess, pads: list[int], status: int
) -> None:
    """The 64 KiB bound holds for the whole head, however many reads bring it."""
    head, body = _echo(b"x", *(_pad(size) for size in pads))
    cut = len(head) // len(pads)
    parts = [head[i * cut : (i + 1) * cut] for i in range(len(pads) - 1)]
    parts.append(head[(len(pads) - 1) * cut :] + body)
    got, answer = _answer_to_parts(server.port, parts)
    assert got == status, answer[:200]


@pytest.mark.parametrize(("pad", "status"), [(60_000, 200), (70_000, 431)])
@pytest.mark.parametrize("blank", [b"\r\n", b"\r\n\r\n", b"\n\r\n\r\n"], ids=["1", "2", "lf-2"])
def test_blank_lines_before_a_request_line_do_not_end_its_head(
    server: ServerProcess, blank: bytes, pad: int, status: int
) -> None:
    """The parser skips blank lines before a request line: the head after them is counted
    whole, in one read or in two."""
    head, body = _echo(b"x", _pad(pad))
    for parts in ([blank + head + body], [blank + head[:1000], head[1000:] + body]):
        got, answer = _answer_to_parts(server.port, parts)
        assert got == status, (len(parts), answer[:200])


def test_keep_alive_requests_are_bounded_like_the_first(server: ServerProcess) -> None:
    """On one connection: a request, one with a 60 KB body in three reads (the body is not
    counted as head), one after blank lines, then a head over the limit: 431, closed."""
    raw = Raw(server.port)
    try:
        replies = Responses(raw)
        small_head, small_body = _echo(b"one")
        raw.send(small_head + small_body)
        assert replies.next()[0] == 200
        big_head, big_body = _echo(b"b" * 60_000, _pad(10_000))
        _send_apart(raw, [big_head, big_body[:30_000], big_body[30_000:]])
        status, answer = replies.next()
        assert status == 200 and len(answer) > 60_000, answer[:200]
        raw.send(b"\r\n\r\n" + small_head + small_body)
        assert replies.next()[0] == 200
        huge_head, huge_body = _echo(b"x", _pad(40_000), _pad(40_000))
        _send_apart(raw, [huge_head[:40_000], huge_head[40_000:] + huge_body])
        assert replies.next()[0] == 431
        raw.sock.settimeout(TIMEOUT)
        assert replies.closed()
    finally:
        raw.close()


def test_pipelined_requests_in_one_read_are_answered_in_order(server: ServerProcess) -> None:
    raw = Raw(server.port)
    try:
        raw.send(b"".join(b"".join(_echo(text)) for text in (b"first", b"second", b"third")))
        replies = Responses(raw)
        answers = [replies.next() for _ in range(3)]
    finally:
        raw.close()
    assert [status for status, _ in answers] == [200, 200, 200]
    for (_, body), text in zip(answers, [b"first", b"second", b"third"], strict=True):
        assert b'"' + text + b'"' in body


def test_heads_on_keep_alive_connections_are_timed(server: ServerProcess) -> None:
    """Five connections at once, each checked against the head timeout (uvicorn's keep-alive
    timeout, 5 s): idle after a response, closed silently; half a second head, 408; a
    request and half the next one in one read, 200 then 408; the same completed a second
    later, 200 twice and then closed silently; blank lines then half a head on a new
    connection, 408."""
    head, body = _echo(b"x")
    half = head[:30]
    idle, second, pipelined, completed, blank = (Raw(server.port) for _ in range(5))
    sockets = [idle, second, pipelined, completed, blank]
    try:
        for raw in (idle, second):
            raw.send(head + body)
            assert Responses(raw).next()[0] == 200
        started = time.monotonic()
        second.send(half)
        pipelined.send(head + body + half)
        completed.send(head + body + half)
        blank.send(b"\r\n\r\n")
        blank.send(half)
        completed_replies = Responses(completed)
        assert completed_replies.next()[0] == 200
        time.sleep(1.0)  # a slow client, well inside the head timeout
        completed.send(head[30:] + body)
        assert completed_replies.next()[0] == 200
        for raw in sockets:
            raw.sock.settimeout(TIMEOUT)
        assert Responses(idle).closed()
        assert Responses(second).next()[0] == 408
        pipelined_replies = Responses(pipelined)
        assert [pipelined_replies.next()[0] for _ in range(2)] == [200, 408]
        assert Responses(blank).next()[0] == 408
        elapsed = time.monotonic() - started
        assert 4.0 < elapsed < TIMEOUT
        # Its head completed, the completed connection's timer is gone: no 408 came, and
        # uvicorn's keep-alive timeout closed it silently.
        assert completed_replies.closed()
    finally:
        for raw in sockets:
            raw.close()


# -- the end: healthy, no server errors, clean exit ------------------------------------------


def test_zz_server_is_healthy_and_exits_cleanly_after_all_that(
    server: ServerProcess, client: httpx.Client
) -> None:
    """Runs last in this module: after every case above the server is healthy, logged no
    unhandled error, answered no 5xx, and a SIGTERM with a half-sent body still open exits
    0 inside the budget."""
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.post("/reasoners/echo", json={"text": "after"}).json()["result"] == {
        "text": "after"
    }
    assert server_errors(client.get("/metrics").text) == {}
    stderr = server.stderr()
    assert "unhandled error" not in stderr and "Exception in ASGI application" not in stderr
    holder = Raw(server.port)
    holder.send(
        b"POST /reasoners/echo HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{"
    )
    try:
        server.signal(signal.SIGTERM)
        code, elapsed = server.wait_exit(timeout=TIMEOUT)
    finally:
        holder.close()
    assert code == 0, server.stderr()
    assert elapsed < 5.0, server.stderr()


# -- what a client sends cannot write the server's log lines ---------------------------------

#: A text log line: `TEXT_FORMAT`'s time, level and logger, then the message.
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: ")
#: Percent-encoded characters that end or bend a line: CR LF, each alone, VT, FF, FS, ESC,
#: NEL (U+0085), LINE SEPARATOR (U+2028).
BREAKS = ("%0D%0A", "%0A", "%0D", "%0B", "%0C", "%1C", "%1B[2J", "%C2%85", "%E2%80%A8")


def test_no_request_writes_a_log_line_of_its_own(tmp_path: Path) -> None:
    """Text format, access lines and traces on: paths that carry a line break and then what
    reads as a CRITICAL line, a malformed 40 KB `baggage` header, one of 170 malformed
    entries. Every line of stderr is one whole log line; what was forged appears only
    inside access lines (one each); the baggage propagator's warning quotes at most 64
    characters of the header, and its lines are at most 10 a second."""
    process = ServerProcess(
        ["tests_app:agent", "--access-log"], {"OTEL_TRACES_EXPORTER": "console"}, tmp_path
    )
    try:
        process.wait_ready()
        for number, brk in enumerate(BREAKS):
            forged = f"{brk}2026-12-02%2000:00:00,000%20CRITICAL%20agent_server:%20FORGED-{number}"
            status, _, _ = exchange(
                process, f"GET /executions/x{forged}?q={brk} HTTP/1.1\r\nHost: t\r\n\r\n".encode()
            )
            assert status == 404
        baggage = b"not-a-pair-" * 3_700  # about 40 KB, over the propagator's 8 KB
        status, _, _ = exchange(
            process, b"GET /healthz HTTP/1.1\r\nHost: t\r\nbaggage: " + baggage + b"\r\n\r\n"
        )
        assert status == 200
        with httpx.Client(base_url=process.url, timeout=TIMEOUT) as http:
            assert http.get("/healthz", headers={"baggage": "a,b=c,,=d"}).status_code == 200
            entries = ",".join(f"entry-{n}" for n in range(170))  # a line each, unbounded
            assert http.get("/healthz", headers={"baggage": entries}).status_code == 200
            wait_for(
                lambda: process.stderr().count("agent_server.access:") >= len(BREAKS) + 3,
                TIMEOUT,
                "every access line",
            )
        lines = process.stderr().splitlines()
        for line in lines:
            assert LOG_LINE.match(line), line
            assert len(line) < 1_000, line[:200]
        for number in range(len(BREAKS)):
            mine = [line for line in lines if f"FORGED-{number}" in line]
            assert len(mine) == 1 and " INFO agent_server.access: " in mine[0], mine
        echoed = [line for line in lines if "not-a-pair-" in line]
        assert len(echoed) == 1 and f"({len(baggage)} chars)" in echoed[0], echoed
        # At most 10 a second of the propagator's lines (the requests may span two seconds).
        assert len([line for line in lines if "opentelemetry.baggage" in line]) <= 20
    finally:
        process.close()
