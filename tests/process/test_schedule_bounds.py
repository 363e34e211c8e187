"""Schedules bounded per tenant, paged, and read by change (docs/schedules.md#limits), on
real `agent-server run` processes over the memory store and replicas sharing a real Redis.

Invariants attacked:
- a tenant holds at most `--max-schedules` schedules made through the API and no input past
  `--max-schedule-input-size` bytes of JSON: one more is 409, a larger input 413, and a
  refusal changes nothing, however many replicas take creates at once;
- `GET /schedules` is paged like `GET /executions` (limit, cursor, `Link`), by id, and each
  page stops at 4 MiB (`X-Truncated`): following the links shows every schedule once;
- a change makes the other replicas read the changed schedule only, never every tenant's
  documents (the reads counted at Redis itself, through MONITOR);
- the resource `@agent.authorize` is asked about for `schedule` names the schedule's owner.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

APP = "schedules_app:agent"
NEVER = "0 0 1 1 *"  # once a year: nothing fires while a test runs
TOKENS = (
    "token-a alice acme own\n"
    "token-d dave acme own\n"
    "token-e erin acme\n"
    "token-b bob globex\n"
    "token-x ops - admin\n"
)


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def server(tmp_path: Path, name: str, *args: str) -> ServerProcess:
    """A ready replica of the schedules app that declares no schedule."""
    (tmp_path / name).mkdir()
    env = {"SCHEDULE_MARKS": str(tmp_path), "SCHEDULES": ""}
    process = ServerProcess([APP, *args], env, tmp_path / name)
    try:
        process.wait_ready()
    except BaseException:
        process.close()
        raise
    return process


@pytest.fixture
def tokens(tmp_path: Path) -> Path:
    path = tmp_path / "tokens"
    path.write_text(TOKENS)
    return path


def make(client: httpx.Client, headers: dict[str, str] | None = None, **body: Any) -> Any:
    return client.post(
        "/schedules", json={"reasoner": "tick", "cron": NEVER, **body}, headers=headers or {}
    )


def every_page(client: httpx.Client, url: str, headers: dict[str, str]) -> list[list[Any]]:
    """The pages `url` and its `Link`s give, bounded."""
    pages: list[list[Any]] = []
    next_url: str | None = url
    while next_url is not None:
        assert len(pages) < 500, "the links never end"
        answer = client.get(next_url, headers=headers)
        assert answer.status_code == 200, answer.text
        pages.append(answer.json())
        next_url = answer.links.get("next", {}).get("url")
    return pages


def assert_bounded_per_tenant(urls: list[str], limit: int, size: int) -> None:
    """`limit` schedules a tenant and inputs of `size` bytes at most, whichever replica
    (of `urls`) takes each create; refusals change nothing."""
    a, b = auth("token-a"), auth("token-b")
    clients = [httpx.Client(base_url=url, timeout=10) for url in urls]
    try:
        # Creates racing on every replica: exactly `limit` are made.
        with ThreadPoolExecutor(8) as pool:
            answers = list(
                pool.map(
                    lambda i: make(clients[i % len(clients)], a, input={"tag": str(i)}),
                    range(limit + 7),
                )
            )
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [201] * limit + [409] * 7, [a.text for a in answers]
        refused = next(answer for answer in answers if answer.status_code == 409)
        assert refused.json() == {
            "detail": f"the tenant has {limit} schedules, as many as --max-schedules "
            "allows: delete one first"
        }
        for client in clients:
            listed = client.get("/schedules", params={"limit": 1000}, headers=a).json()
            assert len(listed) == limit, listed
        # Another tenant's count is its own.
        assert make(clients[-1], b).status_code == 201
        # The input's bound: 413, nothing made, nothing changed.
        big = {"tag": "x" * size}
        over = make(clients[0], b, input=big)
        assert over.status_code == 413, over.text[:200]
        assert over.json()["detail"].startswith("input: ")
        assert "--max-schedule-input-size" in over.json()["detail"]
        assert len(clients[0].get("/schedules", headers=b).json()) == 1
        sid = next(x.json()["schedule_id"] for x in answers if x.status_code == 201)
        changed = clients[-1].patch(f"/schedules/{sid}", json={"input": big}, headers=a)
        assert changed.status_code == 413, changed.text
        assert clients[0].get(f"/schedules/{sid}", headers=a).json()["input"] != big
        just = {"tag": "x" * (size - len(json.dumps({"tag": ""}, separators=(",", ":"))))}
        assert clients[0].patch(f"/schedules/{sid}", json={"input": just}, headers=a).is_success
        # Deleting one makes room for one, on any replica.
        assert clients[0].delete(f"/schedules/{sid}", headers=a).status_code == 204
        assert make(clients[-1], a).status_code == 201
        assert make(clients[0], a).status_code == 409
    finally:
        for client in clients:
            client.close()


def test_schedules_are_bounded_per_tenant_on_the_memory_store(tmp_path: Path, tokens: Path) -> None:
    one = server(
        tmp_path,
        "a",
        *("--api-tokens-file", str(tokens)),
        *("--max-schedules", "4", "--max-schedule-input-size", "2048"),
    )
    try:
        assert_bounded_per_tenant([one.url], 4, 2048)
    finally:
        one.close()


@pytest.mark.redis
def test_schedules_are_bounded_per_tenant_across_replicas_sharing_redis(
    tmp_path: Path, tokens: Path, own_redis: RedisServer
) -> None:
    flags = (
        *("--store", own_redis.url, "--api-tokens-file", str(tokens)),
        *("--max-schedules", "5", "--max-schedule-input-size", "4096"),
    )
    first = server(tmp_path, "a", *flags, "--replica-id", "a")
    try:
        second = server(tmp_path, "b", *flags, "--replica-id", "b")
        try:
            assert_bounded_per_tenant([first.url, second.url], 5, 4096)
        finally:
            second.close()
    finally:
        first.close()


def test_the_default_bounds_refuse_a_large_input(tmp_path: Path) -> None:
    """64 KiB of JSON by default: the 0.9 MB inputs once accepted are 413."""
    one = server(tmp_path, "a")
    try:
        with httpx.Client(base_url=one.url, timeout=10) as client:
            over = make(client, input={"tag": "x" * 65_536})
            assert over.status_code == 413, over.text[:200]
            fits = make(client, input={"tag": "x" * 65_000})
            assert fits.status_code == 201, fits.text[:200]
            assert len(client.get("/schedules").json()) == 1
    finally:
        one.close()


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_the_list_is_paged_by_id_without_gaps_or_repeats_and_capped_in_bytes(
    tmp_path: Path, store: str, request: pytest.FixtureRequest
) -> None:
    flags = [] if store == "memory" else ["--store", request.getfixturevalue("redis_url")]
    one = server(tmp_path, "a", *flags)
    try:
        with httpx.Client(base_url=one.url, timeout=30) as client:
            made = {make(client, input={"tag": str(i)}).json()["schedule_id"] for i in range(23)}
            pages = every_page(client, "/schedules?limit=5", {})
            assert [len(page) for page in pages] == [5, 5, 5, 5, 3]
            ids = [item["schedule_id"] for page in pages for item in page]
            assert ids == sorted(made)
            first = client.get("/schedules", params={"limit": 5})
            assert first.headers.get("X-Truncated") is None
            assert 'rel="next"' in first.headers["Link"]
            assert client.get("/schedules", params={"cursor": "../x"}).status_code == 400
            assert client.get("/schedules", params={"limit": 0}).status_code == 422
            assert client.get("/schedules", params={"limit": 1001}).status_code == 422
            # Inputs of 60 KB: the default page of 100 passes 4 MiB, so it is cut.
            big = {"tag": "y" * 60_000}
            made |= {make(client, input=big).json()["schedule_id"] for _ in range(75)}
            cut = client.get("/schedules", params={"limit": 1000})
            assert cut.headers.get("X-Truncated") == "true"
            assert len(cut.content) <= 4 * 1024 * 1024
            assert 0 < len(cut.json()) < len(made)
            pages = every_page(client, "/schedules?limit=1000", {})
            ids = [item["schedule_id"] for page in pages for item in page]
            assert ids == sorted(made)
    finally:
        one.close()


def test_the_client_and_the_cli_follow_the_pages(tmp_path: Path) -> None:
    from agent_server.client import AgentClient

    one = server(tmp_path, "a")
    try:
        with AgentClient(one.url) as client:
            made = [
                client.create_schedule("tick", NEVER, {"input": {"tag": str(i)}})["schedule_id"]
                for i in range(12)
            ]
            assert [s["schedule_id"] for s in client.schedules(limit=5)] == sorted(made)[:5]
            assert [s["schedule_id"] for s in client.iter_schedules(limit=5)] == sorted(made)

        def cli(*args: str) -> Any:
            done = subprocess.run(
                [sys.executable, "-m", "agent_server", "schedules", "list", *args],
                capture_output=True,
                text=True,
                timeout=30,
                env={**os.environ, "AGENT_SERVER_URL": one.url},
            )
            assert done.returncode == 0, done.stderr
            return [item["schedule_id"] for item in json.loads(done.stdout)]

        assert cli("--limit", "5") == sorted(made)[:5]
        assert cli("--limit", "5", "--all") == sorted(made)
    finally:
        one.close()


def test_the_schedule_action_names_its_owner_so_authorize_decides_per_owner(
    tmp_path: Path, tokens: Path
) -> None:
    """`own` (tests/apps/schedules_app.py): a member may act on its own schedules only."""
    one = server(tmp_path, "a", "--api-tokens-file", str(tokens))
    alice, dave, erin = auth("token-a"), auth("token-d"), auth("token-e")
    try:
        with httpx.Client(base_url=one.url, timeout=10) as client:
            made = make(client, alice)
            assert made.status_code == 201, made.text
            shown = made.json()
            assert (shown["owner"], shown["tenant"]) == ("alice", "acme")
            sid = shown["schedule_id"]
            for method, path, body in [
                ("GET", f"/schedules/{sid}", None),
                ("PATCH", f"/schedules/{sid}", {"enabled": False}),
                ("POST", f"/schedules/{sid}/trigger", None),
                ("DELETE", f"/schedules/{sid}", None),
            ]:
                denied = client.request(method, path, json=body, headers=dave)
                assert denied.status_code == 403, (method, denied.text)
                assert denied.json() == {"detail": "not allowed to schedule"}
                if method != "DELETE":  # a member without the rule reaches it
                    allowed = client.request(method, path, json=body, headers=erin)
                    assert allowed.is_success, (method, allowed.text)
            assert client.get(f"/schedules/{sid}", headers=alice).json()["enabled"] is False
            assert client.head(f"/schedules/{sid}", headers=alice).status_code == 200
            assert client.head(f"/schedules/{sid}", headers=dave).status_code == 403
            listed = client.get("/schedules", headers=dave).json()
            assert [(s["schedule_id"], s["owner"]) for s in listed] == [(sid, "alice")]
            assert client.delete(f"/schedules/{sid}", headers=alice).status_code == 204
    finally:
        one.close()


# -- what a change costs the other replicas ------------------------------------------------

_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')


class Monitor:
    """Every command Redis runs while it is open (MONITOR on a connection of its own), read
    by a thread: what the replicas read, counted at Redis itself."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.sendall(b"MONITOR\r\n")
        self.lines: list[list[str]] = []
        self._buffer = b""
        self._ok = threading.Event()
        self._seen = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._ok.wait(10), "MONITOR never answered"

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            self._buffer += data
            *whole, self._buffer = self._buffer.split(b"\r\n")
            for line in whole:
                if line == b"+OK":
                    self._ok.set()
                else:
                    text = line.decode("utf-8", "replace")
                    self.lines.append(_ARGUMENT.findall(text))
                    self._seen.set()

    def close(self) -> list[list[str]]:
        """Returns once every command run before it is read: Redis feeds its monitors in the
        order it runs commands, so a marker sent last and seen means nothing is in flight."""
        marker = f"monitor-fence-{uuid.uuid4().hex}"
        with socket.create_connection(self.sock.getpeername()[:2], timeout=10) as other:
            other.sendall(f"ECHO {marker}\r\n".encode())
            assert other.recv(1024).startswith(b"$"), "ECHO never answered"
        deadline = time.monotonic() + 10
        while not any(marker in line for line in self.lines):
            assert time.monotonic() < deadline, "the monitor never saw its fence"
            self._seen.wait(0.05)
            self._seen.clear()
        self.sock.close()
        self._thread.join(5)
        return list(self.lines)


@pytest.mark.redis
def test_a_change_makes_the_other_replicas_read_only_the_changed_schedule(
    tmp_path: Path, own_redis: RedisServer
) -> None:
    flags = ("--store", own_redis.url)
    first = server(tmp_path, "a", *flags, "--replica-id", "a")
    try:
        second = server(tmp_path, "b", *flags, "--replica-id", "b")
        try:
            with (
                httpx.Client(base_url=first.url, timeout=10) as a,
                httpx.Client(base_url=second.url, timeout=10) as b,
            ):
                made = [make(a, input={"tag": "z" * 2000}).json()["schedule_id"] for _ in range(30)]
                assert len(b.get("/schedules", params={"limit": 1000}).json()) == 30
                target = made[7]
                watch = Monitor(own_redis.port)
                try:
                    changed = a.patch(f"/schedules/{target}", json={"input": {"tag": "new"}})
                    assert changed.status_code == 200, changed.text
                    # The other replica reads it (its request syncs first), then ticks on.
                    assert b.get(f"/schedules/{target}").json()["input"] == {"tag": "new"}
                    assert len(b.get("/schedules", params={"limit": 1000}).json()) == 30
                finally:
                    commands = watch.close()
        finally:
            second.close()
    finally:
        first.close()
    documents_read = [
        line
        for line in commands
        if len(line) > 1
        and line[0].upper() in ("HGETALL", "HMGET", "HGET", "HSCAN", "HVALS")
        and line[1].endswith(":schedules")
    ]
    assert documents_read, "no replica read the changed document"
    for line in documents_read:
        assert line[0].upper() == "HMGET", f"every document read: {line[:2]}"
        assert [key for key in line[2:]] == [target], line[:4]
    # Read by the other replica once; the writer holds the version it wrote (at most a sync
    # of its own, racing its write, reads it back).
    assert len(documents_read) <= 2, documents_read
