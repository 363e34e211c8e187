"""Webhooks on real processes: `agent-server run` POSTs signed deliveries to a real HTTP
receiver on loopback, which verifies every signature with the Standard Webhooks library.
Retries keep one `webhook-id`; a target that is not allowed is never contacted; with two
replicas on one real Redis, a delivery owed by a replica killed (SIGKILL) while the receiver
was down is made by the other."""

from __future__ import annotations

import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from agent_server import Settings
from tests.support.cluster import metric, wait_for
from tests.support.process import ServerProcess, agent_server_cli, serving
from tests.support.raw_http import rss_kib
from tests.support.shutdown import assert_clean_stderr, shutdown_report
from tests.support.webhooks import HOOKS, SECRET, WAIT, Receiver


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One memory-store server for the module's tests."""
    with serving(tmp_path_factory, "hooks", "input_app:agent", *HOOKS) as process:
        yield process
        assert_clean_stderr(process)


def start(server: ServerProcess, name: str, url: str, body: Any = None) -> str:
    response = httpx.post(
        f"{server.url}/reasoners/{name}/async",
        json=body or {},
        headers={"X-Webhook-URL": url},
        timeout=WAIT,
    )
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


def test_an_ask_and_an_end_are_delivered_signed(server: ServerProcess, receiver: Receiver) -> None:
    """To a host allowed by name: the connection goes to the address checked, and the
    request still names the host."""
    url = receiver.url.replace("127.0.0.1", "localhost")
    execution_id = start(server, "approve", url, {"amount": 7})
    asked = wait_for(
        lambda: [
            r
            for r in receiver.delivered("execution.input_required")
            if r["body"]["data"]["execution_id"] == execution_id
        ],
        WAIT,
        "the input_required delivery",
    )[0]
    assert asked["body"]["data"]["status"] == "input_required"
    assert asked["body"]["data"]["input_request"]["prompt"] == {"question": "approve 7?"}
    answer = httpx.post(
        f"{server.url}/executions/{execution_id}/input",
        json={"value": {"approved": True}},
        timeout=WAIT,
    )
    assert answer.status_code == 202, answer.text
    done = wait_for(
        lambda: [
            r
            for r in receiver.delivered("execution.finished")
            if r["body"]["data"]["execution_id"] == execution_id
        ],
        WAIT,
        "the finished delivery",
    )[0]
    data = done["body"]["data"]
    assert data["status"] == "succeeded"
    assert data["result"] == {"approved": True, "note": "", "amount": 7}
    assert done["body"]["timestamp"].endswith("Z")
    assert done["id"] != asked["id"]
    assert done["headers"]["webhook-signature"].startswith("v1,")
    assert done["headers"]["host"] == url.split("/")[2]
    assert receiver.unverified == []
    # The URL is kept by the store, never shown: it may carry the receiver's token.
    shown = httpx.get(f"{server.url}/executions/{execution_id}", timeout=WAIT).json()
    assert "token=t" not in json.dumps(shown)
    assert set(shown) == set(data)
    document = httpx.get(f"{server.url}/openapi.json", timeout=WAIT).json()
    for path in ("/reasoners/approve", "/reasoners/approve/async"):
        names = {p["name"] for p in document["paths"][path]["post"]["parameters"]}
        assert "X-Webhook-URL" in names


def test_retries_keep_one_webhook_id(server: ServerProcess) -> None:
    flaky = Receiver(failures=2)
    try:
        before = metric(server.url, "agent_server_webhook_deliveries_total", outcome="retried")
        execution_id = start(server, "impatient", flaky.url, {"timeout": 0.05})
        finished = wait_for(
            lambda: flaky.delivered("execution.finished"), WAIT, "the third attempt"
        )
        attempts = [r for r in flaky.requests if r["id"] == finished[0]["id"]]
        assert [r["status"] for r in attempts] == [503, 503, 200]
        assert {r["body"]["data"]["execution_id"] for r in attempts} == {execution_id}
        stamps = [r["headers"]["webhook-timestamp"] for r in attempts]
        assert stamps == sorted(stamps)  # each attempt signed when it is made
        assert flaky.unverified == []
        retried = metric(server.url, "agent_server_webhook_deliveries_total", outcome="retried")
        assert retried - before >= 2
    finally:
        flaky.close()


def test_a_target_not_allowed_is_never_contacted(server: ServerProcess) -> None:
    """127.0.0.2 is loopback, and only 127.0.0.1 is allowed."""
    private = Receiver(host="127.0.0.2")
    try:
        before = metric(server.url, "agent_server_webhook_deliveries_total", outcome="refused")
        start(server, "impatient", private.url, {"timeout": 0.05})
        wait_for(
            lambda: (
                metric(server.url, "agent_server_webhook_deliveries_total", outcome="refused")
                >= before + 2
            ),
            WAIT,
            "two refusals (the ask and the end)",
        )
        assert private.requests == []
        assert "127.0.0.2 is not a public address" in server.stderr()
    finally:
        private.close()


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/x",
        "/relative",
        "http://",
        "not a url",
        "http://h:99999/",
        pytest.param("http://example.com/" + "x" * 3000, id="too-long"),
    ],
)
def test_a_bad_webhook_url_is_400_and_starts_nothing(server: ServerProcess, url: str) -> None:
    before = len(httpx.get(f"{server.url}/executions", timeout=WAIT).json())
    response = httpx.post(
        f"{server.url}/reasoners/approve/async",
        json={},
        headers={"X-Webhook-URL": url},
        timeout=WAIT,
    )
    assert response.status_code == 400, response.text
    assert "X-Webhook-URL" in response.json()["detail"]
    assert len(httpx.get(f"{server.url}/executions", timeout=WAIT).json()) == before


def test_bad_webhook_settings_stop_the_start(tmp_path: Path) -> None:
    """Checked with the settings (one process shows the exit code; the rest in-process)."""
    result = agent_server_cli("run", "input_app:agent", "--webhook-secret", "not-whsec")
    assert result.returncode == 2, result.stderr
    assert "whsec_" in result.stderr and "not-whsec" not in result.stderr
    for fields, said in (
        ({"webhook_url": "http://127.0.0.1:9/x"}, "webhook-url needs webhook-secret"),
        ({"webhook_secret_file": str(tmp_path / "absent")}, "cannot be read"),
        ({"webhook_secret": SECRET, "webhook_allow": ("a b",)}, "neither a host name"),
        ({"webhook_secret": SECRET, "webhook_url": "ftp://x/"}, "absolute http"),
        ({"webhook_secret": SECRET, "webhook_url": "http://x..y/"}, "host has an empty label"),
    ):
        with pytest.raises(ValidationError, match=said):
            Settings(**fields)


def test_deliveries_owed_at_shutdown_get_a_last_attempt(tmp_path: Path) -> None:
    """Memory store: two receivers refuse connections; one comes up just before SIGTERM and
    gets its two deliveries in the shutdown's last attempt; the other's two are reported."""
    dead, revived = socket.socket(), socket.socket()
    receiver: Receiver | None = None
    process = ServerProcess(["input_app:agent", *HOOKS], {}, tmp_path)
    try:
        for holder in (dead, revived):  # bound, never listening: connections are refused
            holder.bind(("127.0.0.1", 0))
        process.wait_ready()
        for holder in (dead, revived):
            start(
                process,
                "impatient",
                f"http://127.0.0.1:{holder.getsockname()[1]}/",
                {"timeout": 0.05},
            )
        wait_for(
            lambda: (
                metric(process.url, "agent_server_webhook_deliveries_total", outcome="retried") >= 8
            ),
            WAIT,
            "every delivery tried twice",
        )
        port = revived.getsockname()[1]
        revived.close()
        receiver = Receiver(port=port)
        process.signal(signal.SIGTERM)
        code, _ = process.wait_exit(WAIT)
        assert code == 0, process.stderr()
        assert shutdown_report(process)["webhooks_undelivered"] == 2
        assert len({r["id"] for r in receiver.requests if r["status"] == 200}) == 2
        assert receiver.unverified == []
        assert_clean_stderr(process)
    finally:
        dead.close()
        revived.close()
        if receiver is not None:
            receiver.close()
        process.close()


# -- two replicas on one Redis ---------------------------------------------------------------


@pytest.mark.redis
def test_a_replica_killed_while_the_receiver_was_down(tmp_path: Path, redis_url: str) -> None:
    """A records an ask and an end with their deliveries (ask.lua, end.lua) and fails to
    deliver them: the receiver refuses connections. A second execution waits for input on A
    when A is killed; B judges it lost (judge.lua), which owes its end too. The receiver comes
    up, and B delivers all four, each signed, under the webhook-ids they were given."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))  # bound, not listening: the receiver is down
    port = holder.getsockname()[1]
    url = f"http://127.0.0.1:{port}/hooks"
    replicas = []
    for name in ("A", "B"):
        folder = tmp_path / name
        folder.mkdir()
        args = ["input_app:agent", "--store", redis_url, "--replica-id", name, *HOOKS]
        replicas.append(ServerProcess([*args, "--lease-ttl", "1"], {}, folder))
    a, b = replicas
    receiver: Receiver | None = None

    def retried() -> float:
        return sum(
            metric(r.url, "agent_server_webhook_deliveries_total", outcome="retried")
            for r in replicas
            if r.proc.poll() is None
        )

    try:
        for replica in replicas:
            replica.wait_ready()
        ended = start(a, "impatient", url, {"timeout": 0.05})
        # A long-poll also returns at input_required (the ask before its 50 ms timeout).
        deadline = time.monotonic() + WAIT
        while True:
            polled = httpx.get(
                f"{a.url}/executions/{ended}", params={"wait": WAIT}, timeout=WAIT + 5
            )
            if polled.json()["status"] != "input_required" or time.monotonic() > deadline:
                break
        assert polled.json()["status"] == "succeeded", polled.text
        waiting = start(a, "guarded", url)
        wait_for(lambda: retried() >= 3, WAIT, "three deliveries tried and failed")
        a.proc.send_signal(signal.SIGKILL)
        a.proc.wait(timeout=WAIT)
        wait_for(
            lambda: (
                httpx.get(f"{b.url}/executions/{waiting}", timeout=WAIT).json()["status"] == "lost"
            ),
            WAIT,
            "the waiting execution judged lost by B",
        )
        holder.close()
        receiver = Receiver(port=port)
        wanted = {
            f"{ended}.finished",
            f"{ended}.input.1.1",
            f"{waiting}.input.1.1",
            f"{waiting}.finished",
        }
        wait_for(
            lambda: {r["id"] for r in receiver.requests if r["status"] == 200} == wanted,
            30.0,
            "the four deliveries made by B",
        )
        assert {r["id"] for r in receiver.requests} == wanted
        assert receiver.unverified == []
        assert metric(b.url, "agent_server_webhook_deliveries_total", outcome="delivered") == 4
        wait_for(lambda: metric(b.url, "agent_server_webhooks_pending") == 0, WAIT, "nothing owed")
        by_id = {r["id"]: r["body"] for r in receiver.requests}
        assert by_id[f"{ended}.finished"]["data"]["status"] == "succeeded"
        assert by_id[f"{ended}.finished"]["data"]["replica"] == "A"
        assert by_id[f"{waiting}.input.1.1"]["type"] == "execution.input_required"
        assert by_id[f"{waiting}.input.1.1"]["data"]["input_request"]["prompt"] == "never answered"
        gone = by_id[f"{waiting}.finished"]["data"]
        assert (gone["status"], gone["error"]["type"]) == ("lost", "ExecutionLost")
    finally:
        holder.close()
        if receiver is not None:
            receiver.close()
        for replica in replicas:
            replica.close()


# -- hostile values, on both stores: secrets in URLs, hosts no resolver takes, endless answers


@pytest.fixture(scope="module", params=["memory", "redis"])
def stored(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """One server per store for the hostile cases; `::1` allowed too."""
    store = "memory"
    if request.param == "redis":
        store = request.getfixturevalue("redis_server").url
    args = ["input_app:agent", "--store", store, *HOOKS, "--webhook-allow", "::1"]
    process = ServerProcess(args, {}, tmp_path_factory.mktemp(f"hostile-{request.param}"))
    process.wait_ready()
    yield process
    assert_clean_stderr(process)
    process.close()


def finished_at(receiver: Receiver, execution_id: str) -> list[dict[str, Any]]:
    return [
        r
        for r in receiver.delivered("execution.finished")
        if r["body"]["data"]["execution_id"] == execution_id
    ]


#: Secrets a receiver's URL carries, each where a service puts it.
SECRETS = ("hunter2", "XXXXSECRET", "qs-secret", "f3a9c2e1", "IncomingWebhook")


def test_no_secret_of_a_webhook_url_reaches_the_log(stored: ServerProcess) -> None:
    """Userinfo, a query token, a Slack- and a Teams-style token in the path, to an IPv4 and
    an IPv6 receiver that fail each delivery once: every attempt's lines (the server's, and
    httpx's own `HTTP Request:` line) show scheme, host (IPv6 in brackets) and port only."""
    receivers = [
        Receiver(failures=1, path="/services/T000/B000/XXXXSECRET?token=qs-secret"),
        Receiver(host="::1", failures=1, path="/webhookb2/f3a9c2e1@ab/IncomingWebhook/f3a9c2e1"),
    ]
    try:
        started = []
        for receiver in receivers:
            url = receiver.url.replace("http://", "http://user:hunter2@")
            started.append((receiver, start(stored, "impatient", url, {"timeout": 0.05})))
        for receiver, execution_id in started:
            wait_for(
                lambda r=receiver, e=execution_id: finished_at(r, e), WAIT, "the end delivered"
            )
            assert receiver.unverified == []
        log = stored.stderr()
        for secret in SECRETS:
            assert secret not in log, secret
        v6 = receivers[1].url.split("/")[2].rpartition("@")[2]  # [::1]:port
        assert f"to http://{v6}/… (attempt 1): HTTP 503" in log
        assert f"HTTP Request: POST http://{v6}/… " in log
        v4 = receivers[0].url.split("/")[2]
        assert f"HTTP Request: POST http://{v4}/… " in log
    finally:
        for receiver in receivers:
            receiver.close()


@pytest.mark.parametrize(
    "host",
    ["b" * 64 + ".example.com", "x..y", ".".join(["c" * 60] * 5), "xn--zz.example"],
    ids=["label-64", "empty-label", "254-chars", "bad-idna"],
)
def test_a_host_no_resolver_takes_is_400_and_starts_nothing(
    stored: ServerProcess, host: str
) -> None:
    before = httpx.get(f"{stored.url}/executions", timeout=WAIT).json()
    response = httpx.post(
        f"{stored.url}/reasoners/impatient/async",
        json={"timeout": 0.05},
        headers={"X-Webhook-URL": f"https://{host}/hook"},
        timeout=WAIT,
    )
    assert response.status_code == 400, response.text
    assert "X-Webhook-URL's host" in response.json()["detail"]
    assert httpx.get(f"{stored.url}/executions", timeout=WAIT).json() == before


def test_an_endless_answer_does_not_grow_the_server(stored: ServerProcess) -> None:
    """Eight deliveries to a receiver whose 200 answers never end: each is delivered at once
    (only the bound is read, then the connection is closed) and the server's resident
    memory grows by less than 40 MiB in all (unbounded, one answer alone grew it by
    hundreds of MiB over its 10 s)."""
    endless = Receiver(endless=True)
    try:
        before = metric(stored.url, "agent_server_webhook_deliveries_total", outcome="delivered")
        rss = rss_kib(stored.proc.pid)
        for _ in range(4):  # an ask and an end each
            start(stored, "impatient", endless.url, {"timeout": 0.05})
        wait_for(
            lambda: (
                metric(stored.url, "agent_server_webhook_deliveries_total", outcome="delivered")
                >= before + 8
            ),
            WAIT,
            "eight deliveries",
        )
        grown = rss_kib(stored.proc.pid) - rss
        assert grown < 40 * 1024, f"grew {grown} KiB"
        wait_for(lambda: len(endless.sent) == 8, WAIT, "every answer's connection closed")
        assert max(endless.sent) < 64 * 2**20, endless.sent
    finally:
        endless.close()


def test_a_retry_is_sent_when_the_log_says_not_at_the_next_poll(server_factory: Any) -> None:
    """A failed attempt logs "next in X s"; the retry went out at the sender's next poll (up
    to a second later) whatever X was. With --webhook-retry-for 30 a first retry is due
    within 0.3 s: it must leave within X and a margin the machine keeps, never a poll."""
    flaky = Receiver(failures=1)
    try:
        server = server_factory("tests_app:agent", *HOOKS)
        for n in range(3):
            answer = httpx.post(
                f"{server.url}/reasoners/no_params",
                json={},
                headers={"X-Webhook-URL": flaky.url},
                timeout=WAIT,
            )
            assert answer.status_code == 200, answer.text
            wait_for(lambda n=n: len(flaky.delivered("execution.finished")) > n, WAIT, "sent")
        stated = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"webhook (\S+) retried .*; next in ([0-9.]+) s", server.stderr())
        }
        assert len(stated) == 3, server.stderr()
        for delivery_id, next_in in stated.items():
            first, second = [r["at"] for r in flaky.requests if r["id"] == delivery_id][:2]
            assert second - first <= next_in + 0.5, (delivery_id, next_in, second - first)
    finally:
        flaky.close()
