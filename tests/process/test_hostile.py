"""Hostile values (section 12, invariant 6): what a reasoner returns, raises, emits or
checkpoints, and what a client sends, that the codec cannot carry or a log line cannot
print. Each ends its execution `failed` with a clear error at the moment it is recorded, or
is a 400, on both stores; never a record left `running`, a read answering 500, or a list
poisoned. Real `agent-server run` processes, real HTTP, a real Redis.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agent_server.model.jsoncodec import MAX_DEPTH
from agent_server.model.status import TERMINAL
from agent_server.store.redis.keys import Keys
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

#: Bound on every wait here (seconds).
WAIT = 15.0


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
def hostile(request: pytest.FixtureRequest, server_factory: Any) -> Iterator[ServerProcess]:
    """`agent-server run hostile_app:agent` on the memory store, or on a real Redis."""
    args = ["hostile_app:agent"]
    if request.param == "redis":
        redis = request.getfixturevalue("own_redis")
        assert isinstance(redis, RedisServer)
        args += ["--store", redis.url, "--replica-id", "h", "--lease-ttl", "2"]
    yield server_factory(*args)


def ended(client: httpx.Client, response: httpx.Response) -> dict[str, Any]:
    """The execution a run answered for, read back once it ended (and listed)."""
    body = response.json()
    assert "execution_id" in body, response.text
    location = f"/executions/{body['execution_id']}"
    read = client.get(location, params={"wait": WAIT})
    assert read.status_code == 200, read.text
    record: dict[str, Any] = read.json()
    assert record["status"] in TERMINAL, record
    listed = client.get("/executions", params={"limit": 1000})
    assert listed.status_code == 200, listed.text
    assert record["execution_id"] in {e["execution_id"] for e in listed.json()}
    return record


Case = tuple[str, dict[str, Any], str, str]

CASES: list[Case] = [
    ("unprintable", {"kind": "raises"}, "Unprintable", "cannot be shown"),
    ("unprintable", {"kind": "not-text"}, "NotText", ""),
    ("unprintable", {"kind": "long"}, "ValueError", "..."),
    ("huge", {"digits": 4400}, "Unrecordable", "digits"),
    ("huge", {"digits": 3, "nested": MAX_DEPTH + 5}, "Unrecordable", "nested deeper"),
    ("huge", {"value": "nan"}, "Unrecordable", "JSON cannot carry"),
    ("huge", {"value": "-inf", "nested": 3}, "Unrecordable", "JSON cannot carry"),
    ("bad_event", {"value": "nan"}, "Unrecordable", "event data"),
    ("bad_checkpoint", {"value": "-inf"}, "Unrecordable", "checkpoint"),
]


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{c[0]}-{'-'.join(map(str, c[1].values()))}" for c in CASES]
)
def test_a_value_that_cannot_be_recorded_fails_its_execution(
    hostile: ServerProcess, case: Case
) -> None:
    name, body, kind, says = case
    with httpx.Client(base_url=hostile.url, timeout=WAIT) as client:
        sync = client.post(f"/reasoners/{name}", json=body)
        assert sync.status_code == 500, sync.text
        assert sync.json()["status"] == "failed"
        record = ended(client, sync)
        assert record["status"] == "failed"
        assert record["error"]["type"] == kind
        assert says in record["error"]["message"]
        assert len(record["error"]["message"]) < 10_000  # kept bounded
        started = client.post(f"/reasoners/{name}/async", json=body)
        assert started.status_code == 202, started.text
        assert ended(client, started)["error"]["type"] == kind
        assert client.delete(f"/executions/{record['execution_id']}").status_code == 204
        ready = client.get("/readyz")
        assert ready.status_code == 200
    assert "Logging error" not in hostile.stderr()


@pytest.mark.parametrize("route", ["/reasoners/keep", "/reasoners/keep/async"])
@pytest.mark.parametrize("key", [None, "deep-1"])
def test_a_body_nested_past_the_limit_is_400_and_changes_nothing(
    hostile: ServerProcess, route: str, key: str | None
) -> None:
    """Every depth the parser reads must be written back (an idempotency fingerprint, a
    resumable execution's body in the store): past the limit it is refused, clearly."""
    deep: Any = 1
    for _ in range(MAX_DEPTH + 10):
        deep = {"a": deep}
    headers = {} if key is None else {"Idempotency-Key": key}
    with httpx.Client(base_url=hostile.url, timeout=WAIT) as client:
        before = client.get("/executions").json()
        refused = client.post(route, json={"anything": deep}, headers=headers)
        assert refused.status_code == 400, refused.text
        assert "nested deeper" in refused.json()["detail"]
        assert client.get("/executions").json() == before
        # Just inside the limit is served.
        shallow: Any = 1
        for _ in range(MAX_DEPTH - 3):
            shallow = {"a": shallow}
        served = client.post(route, json={"anything": shallow}, headers=headers)
        assert served.status_code in (200, 202), served.text


@pytest.mark.parametrize(
    ("method", "path", "value"),
    [
        *[("DELETE", "/sessions/s1?timeout={}", v) for v in ("1e16", "inf", "nan", "-1", "1e400")],
        *[("GET", "/executions/{id}?wait={}", v) for v in ("inf", "nan", "-1", "1e400")],
    ],
)
def test_a_duration_parameter_out_of_range_is_422(
    hostile: ServerProcess, method: str, path: str, value: str
) -> None:
    """Section 12, invariant 7, for query parameters: past what the clock and Redis TTLs
    take, the request is refused naming the parameter, on both stores."""
    with httpx.Client(base_url=hostile.url, timeout=WAIT) as client:
        started = client.post("/reasoners/keep/async", json={}).json()
        url = path.replace("{}", value).replace("{id}", started["execution_id"])
        answer = client.request(method, url)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"].split(" ", 1)[0] in ("timeout", "wait")


def test_settle(hostile: ServerProcess) -> None:
    """The server these tests used shut down cleanly: nothing left running or unreported."""
    hostile.signal()
    code, _ = hostile.wait_exit(WAIT)
    assert code == 0, hostile.stderr()[-3000:]


@pytest.mark.redis
def test_a_remote_stream_ends_once_its_record_is_gone(
    own_redis: RedisServer, server_factory: Any
) -> None:
    """A stream served by a replica that does not run the execution reads it from the store;
    once the record is gone (forgotten, released or expired elsewhere) the stream ends,
    instead of sending heartbeats for ever."""
    import time

    common = ["--store", own_redis.url, "--lease-ttl", "2", "--sse-heartbeat", "0.2"]
    owner = server_factory("hostile_app:agent", *common, "--replica-id", "owner")
    other = server_factory("hostile_app:agent", *common, "--replica-id", "other")
    started = httpx.post(f"{owner.url}/reasoners/slow/async", json={"seconds": 60}).json()
    execution_id = started["execution_id"]
    with httpx.Client(timeout=WAIT) as client:
        url = f"{other.url}/executions/{execution_id}/events"
        with client.stream("GET", url) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            assert next(lines).startswith("id: 1")  # its one event, from the store
            assert own_redis.command("DEL", Keys("hostile").record(execution_id))
            began = time.monotonic()
            rest: list[str] = []
            for line in lines:  # ends when the server closes the body; bounded here
                rest.append(line)
                assert time.monotonic() - began < WAIT / 2, f"still streaming: {rest[-5:]}"
    assert not any(line.startswith("event: end") for line in rest)  # no verdict: it is gone


def test_a_websocket_upgrade_is_refused_with_a_json_body(hostile: ServerProcess) -> None:
    """Every refusal is JSON, the WebSocket handshake's included (it used to be 403 with an
    empty body)."""
    headers = {
        "Connection": "Upgrade",
        "Upgrade": "websocket",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    }
    answer = httpx.get(f"{hostile.url}/executions", headers=headers, timeout=WAIT)
    assert answer.status_code == 404
    assert answer.headers["content-type"] == "application/json"
    assert "WebSocket" in answer.json()["detail"]


@pytest.mark.redis
def test_long_polls_open_at_a_shutdown_answer_200_not_500(
    own_redis: RedisServer, server_factory: Any
) -> None:
    """Long-polls on a replica that is shut down while they wait (for work another replica
    runs) answer 200 with the execution as it is and `Connection: close` when the listener
    closes, instead of being cut into uvicorn's text/plain 500 at the end of the http phase."""
    import signal
    import time
    from concurrent.futures import ThreadPoolExecutor

    common = ["--store", own_redis.url, "--lease-ttl", "2", "--http-timeout", "0.5"]
    owner = server_factory("hostile_app:agent", *common, "--replica-id", "owner")
    rolled = server_factory("hostile_app:agent", *common, "--replica-id", "rolled")
    started = httpx.post(f"{owner.url}/reasoners/slow/async", json={"seconds": 60}).json()
    url = f"{rolled.url}/executions/{started['execution_id']}"
    reads_before = _store_reads(rolled)
    with ThreadPoolExecutor(8) as pool:
        polls = [pool.submit(httpx.get, url, params={"wait": 60}, timeout=WAIT) for _ in range(8)]
        # Each poll reads the record once before it waits: eight more reads, all waiting.
        deadline = time.monotonic() + WAIT
        while _store_reads(rolled) < reads_before + 8:
            assert time.monotonic() < deadline, "the long-polls never reached the replica"
        rolled.signal(signal.SIGTERM)
        answers = [poll.result(timeout=WAIT) for poll in polls]
    code, _ = rolled.wait_exit(WAIT)
    assert code == 0, rolled.stderr()[-3000:]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        assert answer.json()["status"] == "running"
        assert answer.headers["connection"] == "close"
    assert "Exception in ASGI application" not in rolled.stderr()


def _store_reads(server: ServerProcess) -> float:
    """`get` operations the replica's store has made, from its own /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "agent_server_store_operation_duration_seconds_count"
        and sample.labels.get("operation") == "get"
    )


# -- /schedules: every route, every hostile value, a clear 4xx that changes nothing --------

#: A body nested past what the parser reads.
DEEP: Any = 1
for _ in range(MAX_DEPTH + 10):
    DEEP = {"a": DEEP}
#: A valid schedule's fields; each case below spoils one of them.
VALID = {"reasoner": "keep", "cron": "0 0 1 1 *"}
#: Bound on a refusal's detail: a hostile value is never echoed whole.
MAX_DETAIL = 1000

#: (a field, values it refuses): each is sent in POST /schedules (and PATCH, but for
#: `reasoner`), and refused 422 with a detail that begins with the field's name.
SCHEDULE_FIELDS: list[tuple[str, list[Any]]] = [
    (
        "cron",
        [
            "",
            "* * *",
            "* * * * * * *",
            "61 * * * *",
            "*/0 * * * *",
            "0 0 31 2 *",
            "* * * * *\x00",
            "*\x1b[31m * * * *",
            "1-99999999999999999999 * * * *",
            "@reboot",
            "* " * 100_000,
            "0," * 100_000 + "0 * * * *",
            "\ud800 * * * *",
            5,
            None,
            ["* * * * *"],
            {"cron": "* * * * *"},
        ],
    ),
    (
        "timezone",
        [
            "Mars/Base",
            "",
            "x" * 100_000,
            "../../etc/passwd",
            "/etc/localtime",
            "Europe",
            "Europe/Paris\x00",
            "UTC\n",
            "\u202eUTC",
            "\ud800",
            0,
            None,
            ["UTC"],
        ],
    ),
    ("session_id", ["", ".", "a b", "x" * 300, "s\x00", "\ud800", 5, ["s"]]),
    ("overlap", ["SKIP", "", None, 1, "skip\x00"]),
    ("catchup_window", [-1, 86_401, 1e300, "60", True, None, [60]]),
    ("enabled", ["true", 1, None, [True]]),
    ("input", [[], "x", 1, None, ["anything"]]),
    ("reasoner", ["nobody", "", None, 5, "keep\x00", "x" * 100_000, "\ud800", ["keep"]]),
]
#: Fields no schedule has (the view's own included): 422 naming the field, shortened.
UNKNOWN_FIELDS = ["colour", "", "\x00", "\ud800", "x" * 100_000, "schedule_id", "declared",
                  "next_fire_at", "created_at", "Cron"]  # fmt: skip
#: Bodies refused before any field is read: (content, content type, status, detail start).
RAW_BODIES: list[tuple[bytes, str, int, str]] = [
    (b"{", "application/json", 400, "malformed JSON"),
    (b"", "application/json", 422, "the body"),
    (b"\xff\xfe{}", "application/json", 400, "malformed JSON"),
    (b'{"reasoner": "keep", "cron": "0 0 1 1 *", "catchup_window": NaN}', "application/json",
     400, "malformed JSON"),
    (b'{"reasoner": "keep", "cron": "0 0 1 1 *", "catchup_window": 1e400}', "application/json",
     400, "malformed JSON"),
    (b"[" * 100_000, "application/json", 400, "malformed JSON"),
    (b"[]", "application/json", 422, "the body"),
    (b'"x"', "application/json", 422, "the body"),
    (b"null", "application/json", 422, "the body"),
    (b"1", "application/json", 422, "the body"),
    (b'{"reasoner": "keep"}', "text/plain", 415, "unsupported content type"),
    (b"{" + b" " * 2_000_000 + b"}", "application/json", 413, "request body exceeds"),
]  # fmt: skip
#: Ids no schedule has, as a path segment carries them: 404, never a 500.
BAD_IDS = ["nothing", "x" * 5000, "%00", "%0A", "%C3%A9", "%ED%A0%80", "..%2F..%2Fetc",
           "%ff", "a%20b", "'%3B%20DROP", "%7Bschedule_id%7D", "yearly-0%00"]  # fmt: skip


def send(client: httpx.Client, method: str, url: str, body: Any) -> httpx.Response:
    """`body` as JSON with every non-ASCII character escaped, so that a lone surrogate is
    sent as the valid JSON escape `\\ud800` (httpx would refuse to encode it)."""
    content = json.dumps(body).encode()
    return client.request(
        method, url, content=content, headers={"content-type": "application/json"}
    )


def refused(answer: httpx.Response, status: int, starts: str, what: object) -> None:
    """A clear 4xx: the status, JSON `{"detail": ...}` beginning as it should, bounded."""
    assert answer.status_code == status, (what, answer.status_code, answer.text[:500])
    assert answer.headers["content-type"].startswith("application/json"), what
    detail = answer.json()["detail"]
    assert str(detail).startswith(starts), (what, str(detail)[:500])
    assert len(answer.text) < MAX_DETAIL, (what, answer.text[:500])


def test_hostile_values_on_every_schedule_route_are_4xx_and_change_nothing(
    hostile: ServerProcess,
) -> None:
    """Bad cron, odd and huge zones, control characters, lone surrogates, deep and huge
    bodies, unknown fields and bad ids, on POST, GET, PATCH, DELETE and trigger: each a
    clear 4xx JSON error, and the schedules (read back) and executions are as before."""
    with httpx.Client(base_url=hostile.url, timeout=WAIT) as client:
        made = client.post("/schedules", json=VALID)
        assert made.status_code == 201, made.text
        sid = made.json()["schedule_id"]
        before = client.get("/schedules").json()
        assert {s["schedule_id"] for s in before} == {sid, "yearly-0"}
        executions = client.get("/executions").json()

        for field, values in SCHEDULE_FIELDS:
            for value in values:
                what = (field, repr(value)[:80])
                refused(
                    send(client, "POST", "/schedules", {**VALID, field: value}), 422, field, what
                )
                change = send(client, "PATCH", f"/schedules/{sid}", {field: value})
                refused(change, 422, field, ("PATCH", *what))
        for name in UNKNOWN_FIELDS:
            what = ("unknown", repr(name)[:80])
            # A name that cannot be shown as it is (unprintable, huge) is shown shortened.
            starts = name if name.isprintable() and len(name) < 40 else ""
            refused(send(client, "POST", "/schedules", {**VALID, name: 1}), 422, starts, what)
            refused(send(client, "PATCH", f"/schedules/{sid}", {name: 1}), 422, starts, what)
        for content, media, status, starts in RAW_BODIES:
            headers = {"content-type": media}
            what = (content[:40], media)
            refused(
                client.post("/schedules", content=content, headers=headers), status, starts, what
            )
            answer = client.patch(f"/schedules/{sid}", content=content, headers=headers)
            refused(answer, status, starts, ("PATCH", *what))
        deep = client.post("/schedules", json={**VALID, "input": {"anything": DEEP}})
        refused(deep, 400, "the body is nested deeper", "deep input")
        unbound = client.post(
            "/schedules", json={**VALID, "reasoner": "slow", "input": {"seconds": "x"}}
        )
        refused(unbound, 422, "input", "an input its reasoner does not take")
        # A declared schedule: never deleted, only enabled or disabled.
        refused(client.delete("/schedules/yearly-0"), 409, "a declared schedule", "DELETE")
        for body in ({"cron": "* * * * *"}, {"input": {}}, {"enabled": "no"}, {"reasoner": "keep"}):
            answer = client.patch("/schedules/yearly-0", json=body)
            refused(answer, 422, next(iter(body)), ("declared", body))
        for bad in BAD_IDS:
            for method, suffix in [
                ("GET", ""),
                ("PATCH", ""),
                ("DELETE", ""),
                ("POST", "/trigger"),
            ]:
                body = {"enabled": False} if method == "PATCH" else None
                answer = client.request(method, f"/schedules/{bad}{suffix}", json=body)
                assert answer.status_code == 404, (method, bad[:40], answer.text[:300])
                assert answer.headers["content-type"].startswith("application/json"), bad
                assert len(answer.text) < MAX_DETAIL, (method, bad[:40])
        for bad in ["", "x" * 300, "%00", "a%20b", "..%2Fx", "%C3%A9", "%ED%A0%80", "%ff", "-"]:
            listed = client.get(f"/executions?schedule_id={bad}")
            refused(listed, 400, "invalid schedule_id", ("list", bad[:40]))

        assert client.get("/schedules").json() == before
        assert client.get("/executions").json() == executions
        assert client.get("/readyz").status_code == 200
    assert "Traceback" not in hostile.stderr()
