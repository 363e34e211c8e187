"""The rules of webhooks that need no process: which targets are refused, what a URL and a
secret may be, and the backoff's bounds (the deliveries themselves: tests/process)."""

from __future__ import annotations

import base64
import ipaddress
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from agent_server.execution import Execution, ExecutionStatus
from agent_server.store import MemoryStore, memory
from agent_server.store.base import Delivery
from agent_server.webhooks import (
    MAX_RETRY_DELAY,
    AllowList,
    WebhookSender,
    check_secret,
    check_url,
    first_retry_delay,
    retry_delay,
)


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
