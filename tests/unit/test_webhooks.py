"""The rules of webhooks that need no process: which targets are refused, what a URL and a
secret may be, and the backoff's bounds (the deliveries themselves: tests/process)."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import logging
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
import pytest

from agent_server.model import redaction
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.redaction import QuoteArgs, RedactUrls
from agent_server.runtime import logs
from agent_server.runtime.webhooks import (
    MAX_RETRY_DELAY,
    AllowList,
    WebhookSender,
    check_secret,
    check_url,
    first_retry_delay,
    host_problem,
    retry_delay,
)
from agent_server.store import ExecutionStore, MemoryStore, memory
from agent_server.store.base import Delivery
from tests.support.redis_server import RedisServer
from tests.support.stores import Recorder, closed, eventually, open_redis


def addresses(*texts: str) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return [ipaddress.ip_address(text) for text in texts]


@pytest.mark.parametrize(
    "address",
    ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "::1", "fe80::1",
     "fd00::1", "0.0.0.0", "100.64.0.1", "::ffff:127.0.0.1"],
)  # fmt: skip
def test_addresses_that_are_not_public_are_refused(address: str) -> None:
    refusal = AllowList().refusal("hooks.example.com", addresses(address))
    assert refusal is not None and "not a public address" in refusal


def test_one_private_address_among_public_ones_is_enough_to_refuse() -> None:
    assert AllowList().refusal("h", addresses("93.184.216.34", "10.0.0.1")) is not None
    assert AllowList().refusal("h", addresses("93.184.216.34", "2606:2800::1")) is None


def test_what_the_allow_list_names_is_allowed() -> None:
    allow = AllowList.parse(["10.0.0.0/8", "hooks.internal", "::1"])
    assert allow.refusal("x", addresses("10.9.8.7")) is None
    assert allow.refusal("x", addresses("::1")) is None
    assert allow.refusal("x", addresses("192.168.0.1")) is not None
    assert allow.refusal("Hooks.Internal.", addresses("192.168.0.1")) is None  # by name


@pytest.mark.parametrize("entry", ["", "a b", "http://x", "10.0.0.0/33/1"])
def test_an_allow_entry_is_a_host_or_a_network(entry: str) -> None:
    with pytest.raises(ValueError, match="neither a host name nor a CIDR"):
        AllowList.parse([entry])


@pytest.mark.parametrize(
    "url", ["https://h.example/x?y=1", "http://10.0.0.1:8080/", "http://[::1]:9/p", "http://u:p@h/"]
)
def test_absolute_http_urls_are_webhook_urls(url: str) -> None:
    assert check_url(url, "X") == url


@pytest.mark.parametrize(
    "url",
    ["ftp://h/", "h/x", "http:///x", "http://h/#frag", "http://h:0x/", "http://h/ x", "http://é/"],
)
def test_other_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError, match="absolute http"):
        check_url(url, "X-Webhook-URL")


def secret(size: int) -> str:
    return "whsec_" + base64.b64encode(b"k" * size).decode()


def test_a_secret_is_whsec_and_24_to_64_bytes() -> None:
    assert check_secret(secret(24)) == secret(24)
    assert check_secret(secret(64)) == secret(64)
    for bad, said in (
        (secret(23), "24 to 64 bytes"),
        (secret(65), "24 to 64 bytes"),
        ("whsec_not base64!", "not valid base64"),
        (secret(32)[6:], "whsec_"),
    ):
        with pytest.raises(ValueError, match=said) as caught:
            check_secret(bad)
        assert bad not in str(caught.value)


def test_the_backoff_doubles_under_full_jitter_up_to_its_cap() -> None:
    assert first_retry_delay(86_400) == 1.0
    assert first_retry_delay(30) == pytest.approx(0.3)
    top = lambda: 1.0  # noqa: E731 - the largest draw
    assert [retry_delay(n, 86_400, top) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert retry_delay(30, 86_400, top) == MAX_RETRY_DELAY
    assert retry_delay(500, 86_400, top) == MAX_RETRY_DELAY  # no overflow
    assert retry_delay(3, 86_400, lambda: 0.0) == 0.0


async def test_without_a_secret_x_webhook_url_is_400_and_undocumented(
    app_client: httpx.AsyncClient,
) -> None:
    response = await app_client.post(
        "/reasoners/echo/async",
        json={"text": "hi"},
        headers={"X-Webhook-URL": "https://hooks.example.com/x"},
    )
    assert response.status_code == 400
    assert "--webhook-secret" in response.json()["detail"]
    assert (await app_client.get("/executions")).json() == []
    document = (await app_client.get("/openapi.json")).json()
    start = document["paths"]["/reasoners/echo/async"]["post"]
    assert "X-Webhook-URL" not in {p["name"] for p in start["parameters"]}


async def ended(store: MemoryStore) -> Execution:
    execution = Execution("echo", None, store.replica_id)
    execution.webhook_url = "https://hooks.example.com/x"
    await store.create(execution)
    execution.finish(ExecutionStatus.SUCCEEDED, result={"ok": True})
    store.end(execution)
    return execution


async def test_the_memory_store_claims_under_a_lease_and_settles() -> None:
    store = MemoryStore("r")
    execution = await ended(store)
    pending, claimed = await store.claim_webhooks(10, 60.0)
    assert pending == 1 and [d.delivery_id for d in claimed] == [
        f"{execution.execution_id}.finished"
    ]
    assert claimed[0].data == execution.to_json() and claimed[0].attempts == 0
    assert (await store.claim_webhooks(10, 60.0))[1] == []  # claimed: not again in its lease
    assert await store.settle_webhook(claimed[0], 0.0) == 1  # a retry, due at once
    again = (await store.claim_webhooks(10, 60.0))[1]
    assert [d.attempts for d in again] == [1]
    assert await store.settle_webhook(again[0], None) == 0


async def test_the_memory_store_owes_a_bounded_number(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "MAX_WEBHOOKS", 2)
    store = MemoryStore("r")
    _, *rest = [await ended(store) for _ in range(3)]
    pending, claimed = await store.claim_webhooks(10, 60.0)
    assert pending == 2
    assert {d.delivery_id for d in claimed} == {f"{e.execution_id}.finished" for e in rest}


class Answers(BaseHTTPRequestHandler):
    """Answers each POST with the status its path names (`/410`), after reading it."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(int(self.path.strip("/")))
        self.send_header("content-length", "0")
        if self.path.startswith("/3"):
            self.send_header("location", "http://127.0.0.1:1/elsewhere")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


async def test_each_answer_has_its_outcome() -> None:
    """One real attempt per status against a real HTTP server on loopback."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sender = WebhookSender(
        MemoryStore("r"), secret=secret(32), allow=AllowList.parse(["127.0.0.1"]), retry_for=60
    )
    sender.start()
    try:
        port = server.server_address[1]
        outcomes = {}
        for status in (200, 204, 302, 404, 408, 410, 422, 429, 500, 503):
            delivery = Delivery(
                "x.finished", "execution.finished", f"http://127.0.0.1:{port}/{status}",
                time.time(), 0.0, 0, {"execution_id": "x"},
            )  # fmt: skip
            outcomes[status] = (await sender.send(delivery))[0]
        assert outcomes == {
            200: "delivered", 204: "delivered", 302: "retried", 404: "gave_up",
            408: "retried", 410: "gave_up", 422: "gave_up", 429: "retried",
            500: "retried", 503: "retried",
        }  # fmt: skip
        refused = Delivery(
            "y.finished", "execution.finished", f"http://127.0.0.2:{port}/200", time.time(),
            0.0, 0, {},
        )  # fmt: skip
        assert (await sender.send(refused))[0] == "refused"
    finally:
        await sender.close()
        server.shutdown()
        server.server_close()


# -- hostile values: what a log line shows of a URL, hosts no resolver takes, endless answers


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://hooks.slack.com/services/T000/B000/XXXXSECRET", "https://hooks.slack.com/…"),
        ("https://discord.com/api/webhooks/123/TOKEN", "https://discord.com/…"),
        (
            "https://acme.webhook.office.com/webhookb2/1a2b@3c4d/IncomingWebhook/5e6f/7a8b",
            "https://acme.webhook.office.com/…",
        ),
        ("https://webhook.site/0f2c1d6e-8f7a-4b4e-9d41-1f5a3c2b7e90", "https://webhook.site/…"),
        ("https://user:hunter2@Hooks.Example.com:8443/x?token=abc#f", "https://hooks.example.com:8443/…"),
        ("http://h.example?token=abc", "http://h.example/…"),
        ("http://[2001:db8::1]:8080/p", "http://[2001:db8::1]:8080/…"),
        ("http://[::1]/", "http://[::1]/"),
        ("http://h.example:notaport/secret", "http://h.example/…"),
        ("http://[::1/secret", "http://…"),
        ("https://h.example", "https://h.example"),
        ("redis://:hunter2@store:6379/0", "redis://store:6379/0"),
    ],
)  # fmt: skip
def test_a_log_line_shows_a_url_by_one_rule(url: str, shown: str) -> None:
    assert redaction.shown_url(url) == shown
    line = redaction.redact_urls(f'HTTP Request: POST {url} "HTTP/1.1 200 OK"')
    assert line == f'HTTP Request: POST {shown} "HTTP/1.1 200 OK"'
    for secret in ("SECRET", "TOKEN", "hunter2", "token", "0f2c1d6e", "IncomingWebhook"):
        assert secret not in line


def test_the_rule_applies_to_every_line_a_handler_writes() -> None:
    """The filter renders the message and the traceback; a record of httpx's logger is
    redacted by the filter on that logger whoever handles it."""
    record = logging.LogRecord(
        "httpx", logging.INFO, "", 0, "HTTP Request: %s %s", ("POST", "http://u:p@h/s?t=1"), None
    )
    try:
        raise ValueError("bad http://h.example/private-token")
    except ValueError:
        record.exc_info = sys.exc_info()
    record.fields = {"query": "next=https://h.example/p?token=field-token", "status": 200}
    assert RedactUrls().filter(record)
    assert record.getMessage() == "HTTP Request: POST http://h/…"
    assert record.fields == {"query": "next=https://h.example/…", "status": 200}
    assert record.exc_text is not None and "private-token" not in record.exc_text
    for formatter in (logs.TextFormatter(), logs.JsonFormatter()):
        line = formatter.format(record)
        assert "private-token" not in line and "field-token" not in line


def test_a_text_line_is_one_line() -> None:
    hostile = "/x\r\n2026-12-02 00:00:00,000 CRITICAL agent_server: forged\x1b[2J\x85\u2028end"
    record = logging.LogRecord("agent_server.access", logging.INFO, "", 0, "%s", (hostile,), None)
    line = logs.TextFormatter().format(record)
    assert len(line.splitlines()) == 1
    assert line.endswith("/x\\r\\n2026-12-02 00:00:00,000 CRITICAL agent_server: forged"
                         "\\x1b[2J\\x85\\u2028end")  # fmt: skip


def test_what_a_library_echoes_is_quoted_and_bounded() -> None:
    record = logging.LogRecord(
        "opentelemetry.baggage.propagation", logging.WARNING, "", 0,
        "Baggage header `%s` exceeded the maximum", ("k=" + "v" * 65_000 + "\n",), None,
    )  # fmt: skip
    assert QuoteArgs(64).filter(record)
    message = record.getMessage()
    assert len(message) < 200 and "\n" not in message and "(65003 chars)" in message


def test_what_a_library_echoes_is_at_most_ten_lines_a_second() -> None:
    """A baggage header of 180 malformed entries is a line each: 10 a second pass, and the
    next one let through says how many were dropped."""
    now = [100.0]
    echoes = QuoteArgs(64, clock=lambda: now[0])

    def line(entry: str) -> logging.LogRecord:
        return logging.LogRecord(
            "opentelemetry.baggage.propagation", logging.WARNING, "", 0,
            "Baggage list-member `%s` doesn't match the format", (entry,), None,
        )  # fmt: skip

    passed = [echoes.filter(line(f"e{n}")) for n in range(180)]
    assert passed == [True] * 10 + [False] * 170
    now[0] += 1.0
    record = line("next")
    assert echoes.filter(record)
    assert record.getMessage().endswith("(170 such lines dropped before this one)")


@pytest.mark.parametrize(
    ("host", "problem"),
    [
        ("a" * 64 + ".example.com", "label longer than 63"),
        ("x..y", "empty label"),
        (".x", "empty label"),
        ("x.y..", "empty label"),
        (".".join(["a" * 60] * 5), "longer than 253"),
        ("xn--zz.example", "not a valid IDNA"),
        ("xn--.example", "not a valid IDNA"),
        ("a<b.example", "character no host name has"),
        ("a%41b.example", "character no host name has"),
        ('a"b', "character no host name has"),
    ],
)  # fmt: skip
def test_a_host_no_resolver_takes_is_refused_at_the_start(host: str, problem: str) -> None:
    assert problem in (host_problem(host) or "")
    with pytest.raises(ValueError, match=problem):
        check_url(f"https://{host}/hook", "X-Webhook-URL")


@pytest.mark.parametrize(
    "host",
    ["a" * 63 + ".example.com", "h.example.", "my_service", "xn--bcher-kva.example", "10.0.0.1",
     "2001:db8::1", ".".join(["a" * 62] * 4)],
)  # fmt: skip
def test_hosts_a_resolver_may_take_are_kept(host: str) -> None:
    assert host_problem(host) is None


async def test_an_attempt_ends_in_an_outcome_whatever_it_meets() -> None:
    """URLs kept before the start's check (or by another version): the attempt gives up at
    once rather than raising out of the resolver (UnicodeError) and never settling; an
    address nobody listens on is retried."""
    sender = WebhookSender(
        MemoryStore("r"), secret=secret(32), allow=AllowList.parse(["127.0.0.1"]), retry_for=60
    )
    sender.start()
    try:
        for url, outcome in (
            ("http://" + "a" * 64 + ".example.com/h", "gave_up"),
            ("http://x..y/h", "gave_up"),
            ("http://xn--zz.example/h", "gave_up"),
            ("http://127.0.0.1:1/h", "retried"),
        ):
            delivery = Delivery("x.finished", "execution.finished", url, time.time(), 0.0, 0, {})
            assert (await sender.send(delivery))[0] == outcome, url
    finally:
        await sender.close()


class Endless(BaseHTTPRequestHandler):
    """Answers 200 and a body without end (chunked), counting what it could send."""

    sent: ClassVar[list[int]] = []
    done: ClassVar[threading.Event] = threading.Event()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunk = b"%x\r\n%s\r\n" % (65_536, b"x" * 65_536)
        sent = 0
        try:
            while sent < 2**30:
                self.wfile.write(chunk)
                sent += 65_536
        except OSError:
            pass
        finally:
            Endless.sent.append(sent)
            Endless.done.set()

    def log_message(self, format: str, *args: object) -> None:
        return None


async def test_an_endless_answer_is_read_no_further_than_the_bound() -> None:
    """The attempt is delivered at once and its connection closed: the receiver could send
    no more than what the socket buffers hold beyond the bound (without the bound, the
    attempt reads until its 10 s timeout, and is retried)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sender = WebhookSender(
        MemoryStore("r"), secret=secret(32), allow=AllowList.parse(["127.0.0.1"]), retry_for=60
    )
    sender.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/endless"
        delivery = Delivery("e.finished", "execution.finished", url, time.time(), 0.0, 0, {})
        started = time.monotonic()
        assert await sender.send(delivery) == ("delivered", "HTTP 200")
        assert time.monotonic() - started < 5.0
        assert await asyncio.to_thread(Endless.done.wait, 5.0)
        assert Endless.sent and Endless.sent[0] < 64 * 2**20, Endless.sent
    finally:
        await sender.close()
        server.shutdown()
        server.server_close()


@dataclass
class Outcomes:
    """A WebhookObserver that remembers what it was told."""

    outcomes: list[str] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)

    def webhook_delivery(self, outcome: str) -> None:
        self.outcomes.append(outcome)

    def webhooks_pending(self, count: int) -> None:
        self.pending.append(count)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis)])
async def one_store(request: pytest.FixtureRequest) -> AsyncIterator[ExecutionStore]:
    store: ExecutionStore = MemoryStore("r")
    if request.param == "redis":
        store = open_redis(request.getfixturevalue("redis_url"), "r", Recorder())
    await store.open()
    yield store
    await closed(store)


@pytest.mark.parametrize("host", ["d" * 64 + ".example.com", "x..y"])
async def test_a_kept_url_no_resolver_takes_gives_up_once(
    one_store: ExecutionStore, host: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A delivery kept with such a URL (recorded before the start's check, or by another
    version) is settled: given up at its first attempt, counted, logged in one WARNING
    without a traceback, and never claimed again (it raised out of the resolver, was never
    settled, and was claimed again after each lease, forever)."""
    execution = Execution("echo", None, one_store.replica_id)
    execution.webhook_url = f"https://{host}/hook"
    await one_store.create(execution)
    execution.finish(ExecutionStatus.SUCCEEDED, result={"ok": True})
    one_store.end(execution)
    seen = Outcomes()
    sender = WebhookSender(
        one_store, secret=secret(32), allow=AllowList(), retry_for=60, observer=seen
    )
    sender.start()
    try:
        await eventually(lambda: _true(seen.outcomes and seen.pending[-1:] == [0]))
    finally:
        await sender.close()
    assert seen.outcomes == ["gave_up"]
    assert await one_store.claim_webhooks(10, 0.0, due_only=False) == (0, [])
    lines = [r for r in caplog.records if r.name == "agent_server.webhooks"]
    assert [(r.levelname, r.exc_info) for r in lines] == [("WARNING", None)]
    assert "can never be delivered" in lines[0].getMessage()


async def _true(value: object) -> bool:
    return bool(value)


@pytest.mark.redis
async def test_a_body_unread_holds_no_other_delivery_back(
    redis_server: RedisServer, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Redis: a stored delivery whose body this version cannot read (written by another, or
    damaged) is left claimed for a replica that can, with a WARNING; the deliveries claimed
    with it are returned (one such body failed the whole claim, every lease, forever)."""
    store = open_redis(redis_url, "r", Recorder())
    await store.open()
    try:
        executions = []
        for _ in range(2):
            execution = Execution("echo", None, "r")
            execution.webhook_url = "https://hooks.example.com/x"
            await store.create(execution)
            execution.finish(ExecutionStatus.SUCCEEDED, result={"ok": True})
            store.end(execution)
            executions.append(execution)
        damaged, kept = (f"{e.execution_id}.finished" for e in executions)
        bodies = store.keys.webhook_bodies
        await eventually(  # both ends written
            lambda: _true(redis_server.command("HLEN", bodies) == b":2\r\n")
        )
        assert redis_server.command("HSET", bodies, damaged, '{"row": "not a row"}') == b":0\r\n"
        pending, claimed = await store.claim_webhooks(10, 60.0)
        assert pending == 2 and [d.delivery_id for d in claimed] == [kept]
        assert f"webhook {damaged}: its stored body cannot be read" in caplog.text
    finally:
        await closed(store)
