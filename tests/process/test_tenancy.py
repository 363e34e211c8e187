"""Tenants on real `agent-server run` processes over loopback, on the memory store and on
three replicas sharing one Redis: two tenants and an admin through every route.

The invariants: a tenant reaches nothing of another's (every route answers another tenant's
execution with the very bytes of an unknown one: existence is not revealed); the names a
client chooses (`X-Session-ID`, `Idempotency-Key`, a concurrency key's value) are its
tenant's, so two tenants using the same one never meet; lists hold the caller's tenant only,
page after page, full, and a cursor leads nowhere else; an admin reaches all; a principal the
app's `@agent.authorize` refuses an action gets 403 on its own tenant's work, still 404 on
another's; and no token reaches a log line.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.client import AgentClient, Forbidden, NotFound
from tests.support.cluster import started_cluster
from tests.support.process import ServerProcess, agent_server_cli
from tests.support.redis_server import RedisServer

WAIT = 15.0
APP = "tenancy_app:agent"

ALICE = "tok-alice-3f9a1c2e7b6d4058a1b2c3d4e5f60718"  # tenant acme
ANN = "tok-ann-8c7b6a5f4e3d2c1b0a99887766554433"  # tenant acme too
BOB = "tok-bob-0f1e2d3c4b5a69788796a5b4c3d2e1f0"  # tenant globex
READER = "tok-reader-5566778899aabbccddeeff0011223344"  # acme, scope readonly
ROOT = "tok-root-a1b2c3d4e5f6a7b8c9d0e1f2a3b4c5d6"  # tenant ops, admin
ANSWERER = "tok-answerer-1a2b3c4d5e6f708192a3b4c5d6e7f809"  # acme, scope nocancel
BLIND = "tok-blind-9f8e7d6c5b4a39281706f5e4d3c2b1a0"  # acme, scope noread
NAMESAKE = "tok-namesake-0a1b2c3d4e5f60718293a4b5c6d7e8f9"  # identity acme, no tenant
SCRAPER = "tok-scraper-f0e1d2c3b4a5968778695a4b3c2d1e0f"  # its own tenant, scope metrics
TOKENS = [ALICE, ANN, BOB, READER, ROOT, ANSWERER, BLIND, NAMESAKE, SCRAPER]
UNKNOWN_ID = "0123456789abcdef0123456789abcdef"


def tokens_file(directory: Path) -> Path:
    path = directory / "tokens"
    path.write_text(
        f"{ALICE} alice acme\n{ANN} ann acme\n{BOB} bob globex\n"
        f"{READER} reader acme readonly\n{ROOT} root ops admin\n"
        f"{ANSWERER} answerer acme nocancel\n{BLIND} blind acme noread\n{NAMESAKE} acme\n"
        f"{SCRAPER} prometheus - metrics\n"
    )
    return path


@dataclass
class Deployment:
    """Where to send requests: `urls[i]` (three replicas, or one server three times), and
    every process's whole output so far."""

    urls: list[str]
    outputs: Callable[[], str]
    shared: bool


@pytest.fixture(params=["memory", "redis"])
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, redis_server: RedisServer
) -> Iterator[Deployment]:
    flags = [
        "--api-tokens-file",
        str(tokens_file(tmp_path)),
        "--log-level",
        "debug",
        "--access-log",
    ]
    if request.param == "memory":
        marker = tmp_path / "memory"
        marker.mkdir()
        server = ServerProcess([APP, *flags, "--log-format", "json"], {}, marker)
        try:
            server.wait_ready()
            yield Deployment([server.url] * 3, server.stderr, False)
        finally:
            server.close()
        return
    with started_cluster(
        tmp_path, redis_server, *flags, "--log-format", "json", app=APP
    ) as cluster:
        yield Deployment(
            [cluster.url(i) for i in range(3)],
            lambda: "\n".join(r.stderr() for r in cluster.replicas),
            True,
        )


class Caller:
    """One principal's requests, spread over the replicas in turn."""

    def __init__(self, deployment: Deployment, token: str) -> None:
        self.urls = deployment.urls
        self.headers = {"Authorization": f"Bearer {token}"}
        self.turn = 0

    def request(
        self, method: str, path: str, *, at: int | None = None, **kw: Any
    ) -> httpx.Response:
        if at is None:
            at, self.turn = self.turn % 3, self.turn + 1
        headers = {**self.headers, **kw.pop("headers", {})}
        return httpx.request(method, self.urls[at] + path, headers=headers, timeout=WAIT, **kw)

    def start(self, reasoner: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
        response = self.request("POST", f"/reasoners/{reasoner}/async", json=body, **kw)
        assert response.status_code == 202, response.text
        started: dict[str, Any] = response.json()
        return started

    def status(self, execution_id: str) -> str:
        response = self.request("GET", f"/executions/{execution_id}")
        assert response.status_code == 200, response.text
        status: str = response.json()["status"]
        return status

    def until(self, execution_id: str, *statuses: str) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT
        while True:
            response = self.request("GET", f"/executions/{execution_id}")
            assert response.status_code == 200, response.text
            if response.json()["status"] in statuses:
                found: dict[str, Any] = response.json()
                return found
            assert time.monotonic() < deadline, f"{execution_id} never {statuses}: {response.text}"
            time.sleep(0.05)

    def listed(self, **given: Any) -> list[str]:
        """Every id of the list, page after page; each page full but the last."""
        ids: list[str] = []
        path = "/executions"
        limit = given.get("limit")
        params: dict[str, Any] | None = given
        while True:
            response = self.request("GET", path, params=params)
            assert response.status_code == 200, response.text
            page = [e["execution_id"] for e in response.json()]
            link = response.headers.get("link")
            if link is not None and limit is not None:
                assert len(page) == limit, f"a short page before the last: {page}"
            ids.extend(page)
            if link is None:
                return ids
            path = link.split(";")[0].strip("<>")
            path = path[path.index("/executions") :]
            params = None  # the link's query is the next page's


def as_unknown(caller: Caller, method: str, path: str, **kw: Any) -> bytes:
    """The answer to another tenant's execution: 404, the very bytes of an unknown id's."""
    theirs = caller.request(method, path, **kw)
    unknown = caller.request(method, path.replace(path.split("/")[2], UNKNOWN_ID), **kw)
    assert theirs.status_code == 404, (method, path, theirs.status_code, theirs.text)
    assert theirs.content == unknown.content, (method, path, theirs.text, unknown.text)
    assert theirs.headers["content-type"] == unknown.headers["content-type"]
    return theirs.content


def test_two_tenants_and_an_admin_through_every_route(deployment: Deployment) -> None:
    alice, ann, bob = Caller(deployment, ALICE), Caller(deployment, ANN), Caller(deployment, BOB)
    reader, root = Caller(deployment, READER), Caller(deployment, ROOT)

    held = alice.start("hold", {"seconds": 60})
    asked = alice.start("question", {})
    done = alice.start("echo", {"text": "mine"})
    hid, qid, did = held["execution_id"], asked["execution_id"], done["execution_id"]
    assert (held["owner"], held["tenant"]) == ("alice", "acme")
    alice.until(qid, "input_required")
    alice.until(did, "succeeded")

    # Another tenant: every route answers as for an unknown id.
    for execution_id in (hid, qid, did):
        as_unknown(bob, "GET", f"/executions/{execution_id}")
        as_unknown(bob, "GET", f"/executions/{execution_id}", params={"wait": 1})
        as_unknown(bob, "GET", f"/executions/{execution_id}/events")
        as_unknown(bob, "POST", f"/executions/{execution_id}/cancel")
        as_unknown(bob, "POST", f"/executions/{execution_id}/input", json={"value": 1})
        as_unknown(bob, "DELETE", f"/executions/{execution_id}")
    assert alice.status(hid) == "running"
    assert alice.status(qid) == "input_required"
    assert alice.status(did) == "succeeded"

    # The same tenant, another identity: its tenant's work is its own.
    assert ann.request("GET", f"/executions/{did}").json()["result"] == {"text": "mine"}
    events = ann.request("GET", f"/executions/{did}/events")
    assert events.status_code == 200 and "event: end" in events.text

    # A refused action on a visible execution: 403; on another tenant's: still 404.
    assert reader.request("GET", f"/executions/{hid}").status_code == 200
    for method, path, kw in (
        ("POST", f"/executions/{hid}/cancel", {}),
        ("POST", f"/executions/{qid}/input", {"json": {"value": 1}}),
        ("DELETE", f"/executions/{did}", {}),
    ):
        denied = reader.request(method, path, **kw)
        assert denied.status_code == 403, (path, denied.text)
        assert set(denied.json()) == {"detail"}
    refused_start = reader.request("POST", "/reasoners/echo/async", json={"text": "x"})
    assert refused_start.status_code == 403, refused_start.text
    refused_release = reader.request("DELETE", "/sessions/s-1")
    assert refused_release.status_code == 403, refused_release.text
    theirs = bob.start("hold", {"seconds": 60})
    as_unknown(reader, "POST", f"/executions/{theirs['execution_id']}/cancel")

    # The answer, on another replica than the one that asked; the cancel too.
    answered = ann.request("POST", f"/executions/{qid}/input", json={"value": 42}, at=2)
    assert answered.status_code in (200, 202), answered.text
    assert alice.until(qid, "succeeded")["result"] == 42
    cancelled = ann.request("POST", f"/executions/{hid}/cancel", at=1)
    assert cancelled.status_code in (200, 202), cancelled.text
    alice.until(hid, "cancelled")

    # The admin reaches every tenant: reads, lists and cancels bob's on any replica.
    bid = theirs["execution_id"]
    assert root.request("GET", f"/executions/{bid}", at=0).json()["tenant"] == "globex"
    assert root.request("POST", f"/executions/{bid}/cancel", at=2).status_code in (200, 202)
    bob.until(bid, "cancelled")
    everyone = set(root.listed())
    assert {hid, qid, did, bid} <= everyone
    assert set(alice.listed()) == {hid, qid, did}
    assert set(bob.listed()) == {bid}

    # Deleting: the owner's tenant may, another tenant found nothing to delete.
    assert ann.request("DELETE", f"/executions/{did}").status_code == 204
    assert alice.request("GET", f"/executions/{did}").status_code == 404

    # Metrics never take an identity or a tenant as a label.
    exposition = root.request("GET", "/metrics").text
    assert "agent_server_" in exposition
    assert not [name for name in ("alice", "ann", "bob", "acme", "globex") if name in exposition]

    output = deployment.outputs()
    leaked = [token[:10] for token in TOKENS if token in output]
    assert not leaked, f"tokens in the log: {leaked}"
    lines = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    said = [line for line in lines if line.get("identity") == "bob"]
    assert said and all(line.get("tenant") == "globex" for line in said), said[:3]


def test_an_identity_named_like_a_tenant_is_not_that_tenants(deployment: Deployment) -> None:
    """A caller without a tenant is its own tenant (`~acme`), never the tenant `acme` its
    identity happens to spell, on every route, list and name."""
    alice, namesake = Caller(deployment, ALICE), Caller(deployment, NAMESAKE)
    theirs = alice.start("hold", {"seconds": 60}, headers={"X-Session-ID": "shared"})
    execution_id = theirs["execution_id"]
    for method, path in (
        ("GET", f"/executions/{execution_id}"),
        ("GET", f"/executions/{execution_id}/events"),
        ("POST", f"/executions/{execution_id}/cancel"),
    ):
        as_unknown(namesake, method, path)
    assert execution_id not in namesake.listed()
    mine = namesake.start("hold", {"seconds": 60}, headers={"X-Session-ID": "shared"})
    assert (mine["owner"], mine["tenant"]) == ("acme", "~acme")
    assert mine["execution_id"] not in alice.listed()
    assert alice.status(execution_id) == "running"
    for caller, started in ((alice, theirs), (namesake, mine)):
        cancelled = caller.request("POST", f"/executions/{started['execution_id']}/cancel")
        assert cancelled.status_code == 202, cancelled.text


def test_the_metrics_are_a_scrapers_or_an_admins(deployment: Deployment) -> None:
    """`/metrics` counts every tenant's work (what waits for input, runs, fails): a tenant's
    token reads none of it; a scraper's (scope `metrics`) and an admin's do."""
    for token, status in (
        (ALICE, 403),
        (READER, 403),
        (NAMESAKE, 403),
        (SCRAPER, 200),
        (ROOT, 200),
    ):
        answer = Caller(deployment, token).request("GET", "/metrics")
        assert answer.status_code == status, (token[:10], answer.text[:200])
        if status == 403:
            assert answer.json() == {
                "detail": "not allowed to read the metrics (scope metrics or admin)"
            }
        else:
            assert "agent_server_executions_started_total" in answer.text


def test_lists_are_the_tenants_own_page_after_page(deployment: Deployment) -> None:
    alice, bob, root = Caller(deployment, ALICE), Caller(deployment, BOB), Caller(deployment, ROOT)
    mine, theirs = [], []
    for i in range(7):  # interleaved, so a page of one tenant spans the other's records
        mine.append(alice.start("echo", {"text": f"a{i}"})["execution_id"])
        theirs.append(bob.start("echo", {"text": f"b{i}"})["execution_id"])
        theirs.append(bob.start("echo", {"text": f"c{i}"})["execution_id"])
    assert alice.listed(limit=2) == mine[::-1]
    assert bob.listed(limit=3) == theirs[::-1]
    assert set(root.listed(limit=4)) >= set(mine) | set(theirs)
    # A cursor of bob's pages leads alice to none of bob's records.
    first = bob.request("GET", "/executions", params={"limit": 3})
    link = first.headers["link"].split(";")[0].strip("<>")
    followed = alice.request("GET", link[link.index("/executions") :])
    assert followed.status_code in (200, 400), followed.text
    if followed.status_code == 200:
        assert not {e["execution_id"] for e in followed.json()} & set(theirs)
    # Filters stay within the tenant.
    only = alice.request("GET", "/executions", params={"reasoner": "echo", "limit": 100})
    assert {e["execution_id"] for e in only.json()} == set(mine)


def test_names_are_per_tenant(deployment: Deployment) -> None:
    alice, ann, bob = Caller(deployment, ALICE), Caller(deployment, ANN), Caller(deployment, BOB)
    # The same Idempotency-Key: each tenant's own execution, and each repeat its tenant's.
    key = {"Idempotency-Key": "order-7"}
    first = alice.start("echo", {"text": "alice"}, headers=key)
    other = bob.start("echo", {"text": "bob"}, headers=key)
    assert other["execution_id"] != first["execution_id"]
    again = ann.start("echo", {"text": "alice"}, headers=key)  # the tenant's key: shared
    assert again["execution_id"] == first["execution_id"]
    mismatch = ann.request("POST", "/reasoners/echo/async", json={"text": "x"}, headers=key)
    assert mismatch.status_code == 422, mismatch.text
    assert bob.until(other["execution_id"], "succeeded")["result"] == {"text": "bob"}

    # The same session id: bob's start is not refused by alice's busy session.
    session = {"X-Session-ID": "chat-1"}
    busy = alice.start("turn", {"seconds": 60}, headers=session)
    alice.until(busy["execution_id"], "running")
    refused = ann.request("POST", "/reasoners/turn/async", json={}, headers=session)
    assert refused.status_code == 409, refused.text  # alice's tenant: the same session
    beside = bob.start("turn", {"seconds": 60}, headers=session)
    bob.until(beside["execution_id"], "running")
    listed = bob.request("GET", "/executions", params={"session_id": "chat-1"}).json()
    assert [e["execution_id"] for e in listed] == [beside["execution_id"]]
    # Releasing bob's session leaves alice's be.
    released = bob.request("DELETE", "/sessions/chat-1")
    assert released.status_code == 200, released.text
    assert (released.json()["cancelled"], released.json()["forgotten"]) == (1, 1)
    assert bob.request("GET", f"/executions/{beside['execution_id']}").status_code == 404
    assert alice.status(busy["execution_id"]) == "running"

    # The same concurrency key value: one at a time per tenant, not across them.
    value = {"X-Key": "shared"}
    holding = alice.start("limited", {"seconds": 60}, headers=value)
    alice.until(holding["execution_id"], "running")
    waiting = ann.start("limited", {"seconds": 60}, headers=value)
    bobs = bob.start("limited", {"seconds": 60}, headers=value)
    bob.until(bobs["execution_id"], "running")
    assert alice.status(waiting["execution_id"]) == "queued"

    # The same session under a policy that queues: each tenant's session has its own turn.
    line = {"X-Session-ID": "line-1"}
    first = alice.start("in_line", {"seconds": 60}, headers=line)
    alice.until(first["execution_id"], "running")
    behind = ann.start("in_line", {"seconds": 60}, headers=line)
    apart = bob.start("in_line", {"seconds": 60}, headers=line)
    bob.until(apart["execution_id"], "running")
    assert alice.status(behind["execution_id"]) == "queued"
    # Its turn comes when the tenant's own earlier one ends, not bob's.
    alice.request("POST", f"/executions/{first['execution_id']}/cancel")
    alice.until(behind["execution_id"], "running")

    # ctx.principal: the reasoner is told whom it runs for.
    ran = bob.request("POST", "/reasoners/whoami", json={})
    assert ran.json()["result"] == {"identity": "bob", "tenant": "globex"}
    for caller, execution_id in (
        (alice, busy["execution_id"]),
        (alice, holding["execution_id"]),
        (alice, waiting["execution_id"]),
        (bob, bobs["execution_id"]),
        (alice, behind["execution_id"]),
        (bob, apart["execution_id"]),
    ):
        caller.request("POST", f"/executions/{execution_id}/cancel")


def test_an_open_server_keeps_no_owner(server_factory: Any) -> None:
    server = server_factory(APP)
    started = httpx.post(f"{server.url}/reasoners/echo", json={"text": "x"}, timeout=WAIT).json()
    assert (started["owner"], started["tenant"]) == (None, None)
    server.signal(signal.SIGTERM)
    assert server.wait_exit(timeout=15)[0] == 0


def test_the_cli_is_each_callers_own(tmp_path: Path, server_factory: Any) -> None:
    """Every verb of the CLI sends the token it is given (a file or the environment): the
    caller's tenant is what it reaches."""
    server = server_factory(APP, "--api-tokens-file", str(tokens_file(tmp_path)))
    alice_token, bob_token = tmp_path / "alice", tmp_path / "bob"
    alice_token.write_text(ALICE + "\n")
    bob_token.write_text(BOB + "\n")
    base = ["--url", server.url]
    started = agent_server_cli(
        "call", "echo", '{"text": "a"}', *base, "--token-file", str(alice_token)
    )
    assert started.returncode == 0, started.stderr
    execution_id = json.loads(started.stdout.splitlines()[-1])["execution_id"]
    as_bob = {"AGENT_SERVER_API_TOKEN": BOB}
    for verb in (["get", execution_id], ["cancel", execution_id], ["events", execution_id]):
        theirs = agent_server_cli(*verb, *base, env=as_bob)
        assert theirs.returncode != 0 and "404" in theirs.stderr, (verb, theirs.stderr)
    listed = agent_server_cli("list", *base, "--token-file", str(bob_token))
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stderr
    mine = agent_server_cli("get", execution_id, *base, env={"AGENT_SERVER_API_TOKEN": ALICE})
    assert json.loads(mine.stdout)["owner"] == "alice", mine.stderr
    released = agent_server_cli("release", "s-9", *base, env=as_bob)
    assert released.returncode == 0, released.stderr
    no_token = agent_server_cli("list", *base)
    assert no_token.returncode != 0 and "401" in no_token.stderr
    # The Python client: another tenant's is NotFound, a refused action Forbidden.
    with AgentClient(server.url, token=BOB, retry_for=0) as client, pytest.raises(NotFound):
        client.get(execution_id)
    with AgentClient(server.url, token=READER, retry_for=0) as client:
        assert client.get(execution_id).owner == "alice"
        with pytest.raises(Forbidden):
            client.cancel(execution_id)
