"""A rolling restart under load, on loopback: a bounded load generator drives a real
`agent-server run` process, which gets SIGTERM in the middle while its replacement is
already serving. Every request is counted and classified; nothing accepted may be lost."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from agent_server.model.status import TERMINAL, ExecutionStatus
from tests.support.process import ServerProcess

#: The old process's budget: 0.5 unready + 2 drain + 1 cancel + 1 http + 1 margin <= 6.
OLD_ARGS = (
    "--unready-delay", "0.5", "--drain-timeout", "2", "--cancel-timeout", "1",
    "--http-timeout", "1", "--grace-period", "6", "--log-format", "json",
)  # fmt: skip
GRACE = 6.0
WORKERS = 48
#: Load lasts this long (seconds), SIGTERM comes this far into it; bounded in count too.
LOAD_SECONDS = 4.0
SIGNAL_AFTER = 1.5
MAX_REQUESTS = 6000
#: Bound on any single request (seconds); long-polls ask for less than this.
REQUEST_TIMEOUT = 10.0
POLL_WAIT = 5.0
#: Ended, and not lost: a lost execution is a fault here, never an end.
ENDED = TERMINAL - {ExecutionStatus.LOST}
START_ROUTES = ("/reasoners/sleep", "/reasoners/sleep/async")
#: How often one request may meet the keep-alive race (see `Load.request`).
IDLE_RACE_RETRIES = 1


def _idempotent(method: str, path: str) -> bool:
    """A read, or a cancel (asking twice is asking once): safe to send again."""
    return method == "GET" or (method == "POST" and path.endswith("/cancel"))


@dataclass
class Seen:
    """One execution as a client saw it: where it ran and its last known state."""

    server: str
    execution_id: str
    body: dict[str, Any]


@dataclass
class Tally:
    """Every request, by outcome, and every execution a client was handed."""

    outcomes: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    executions: dict[str, Seen] = field(default_factory=dict)
    requests: int = 0


class Load:
    """Virtual users behind a load balancer that sends new work to the old process until it
    refuses (503) or is gone (connection refused), then to the replacement."""

    def __init__(self, old: str, new: str, seed: int) -> None:
        self.urls = {"old": old, "new": new}
        self.clients = {
            name: httpx.AsyncClient(base_url=url, timeout=REQUEST_TIMEOUT)
            for name, url in self.urls.items()
        }
        self.random = random.Random(seed)
        self.tally = Tally()
        self.switched = False
        self.stop_at = 0.0

    async def close(self) -> None:
        for client in self.clients.values():
            await client.aclose()

    @property
    def target(self) -> str:
        return "new" if self.switched else "old"

    def _violation(self, server: str, method: str, path: str, exc: Exception) -> None:
        self.tally.outcomes[f"{server} {type(exc).__name__}"] += 1
        self.tally.violations.append(f"{method} {server}{path}: {type(exc).__name__} {exc}")

    async def request(
        self, server: str, method: str, path: str, idle_races: int = 0, **kwargs: Any
    ) -> Any:
        """One counted request: the response, or None when the connection was refused."""
        self.tally.requests += 1
        try:
            response = await self.clients[server].request(method, path, **kwargs)
        except httpx.ConnectError:  # the listener is closed: nothing was accepted
            self.tally.outcomes[f"{server} connect refused"] += 1
            if server == "old":
                self.switched = True
            return None
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            if not (_idempotent(method, path) and idle_races < IDLE_RACE_RETRIES):
                return self._violation(server, method, path, exc)
            # HTTP/1.1's keep-alive race: a request sent on an idle connection just as the
            # server closes it (when its listener closes) is never read, and the client sees
            # the close without an answer. RFC 9112 9.3.1 lets a client send an idempotent
            # request again on a new connection, as agent_server.client does: so does this
            # one. Anything else (a non-idempotent request, a timeout, a second race) counts.
            self.tally.outcomes[f"{server} keep-alive race, sent again"] += 1
            return await self.request(server, method, path, idle_races + 1, **kwargs)
        except httpx.TransportError as exc:  # reset, protocol error or timeout: not allowed
            return self._violation(server, method, path, exc)
        self.tally.outcomes[f"{server} {response.status_code}"] += 1
        if response.status_code in (429, 503) and "execution_id" not in response.text:
            self.tally.refusals[f"{server} {path.split('?')[0]} {response.status_code}"] += 1
            if "retry-after" not in response.headers:
                self.tally.violations.append(f"{server}{path}: refusal without Retry-After")
            if server == "old" and response.status_code == 503:
                self.switched = True
        elif response.status_code >= 400 and response.status_code != 409:
            self.tally.violations.append(f"{method} {server}{path}: {response.status_code}")
        return response

    async def start(self, path: str, body: dict[str, Any]) -> tuple[str, Any]:
        """Start work where the balancer points; on a refusal, retry once at the replacement."""
        server = self.target
        response = await self.request(server, "POST", path, json=body)
        refused = response is None or (
            response.status_code in (429, 503) and "execution_id" not in response.text
        )
        if refused and server == "old":
            server = "new"
            response = await self.request(server, "POST", path, json=body)
        return server, response

    def remember(self, server: str, body: dict[str, Any]) -> None:
        """Keep the latest state; a read answered late never hides an end already read."""
        known = self.tally.executions.get(body["execution_id"])
        if known is None or known.body["status"] not in ENDED:
            self.tally.executions[body["execution_id"]] = Seen(server, body["execution_id"], body)

    async def sync_run(self) -> None:
        server, response = await self.start("/reasoners/sleep", {"seconds": self._short()})
        if response is not None and "execution_id" in response.text:
            self.remember(server, response.json())  # 200, or 503 cancelled by shutdown

    async def async_run(self, seconds: float, cancel_after: float | None) -> None:
        started = await self.begin_async(seconds)
        if started is not None:
            await self.follow(*started, cancel_after)

    async def begin_async(self, seconds: float) -> tuple[str, str] | None:
        """Start in the background: the server and the Location, or None if refused."""
        server, response = await self.start("/reasoners/sleep/async", {"seconds": seconds})
        if response is None or response.status_code != 202:
            return None
        self.remember(server, response.json())
        return server, response.headers["location"]

    async def follow(self, server: str, location: str, cancel_after: float | None) -> None:
        """Optionally cancel, then long-poll the owning server until the end is read."""
        if cancel_after is not None:
            await asyncio.sleep(cancel_after)  # a user changing their mind, not a sync point
            await self.request(server, "POST", f"{location}/cancel")
        for _ in range(10):  # bounded: each poll waits at most POLL_WAIT
            if time.monotonic() > self.stop_at and cancel_after is None and server == "new":
                await self.request(server, "POST", f"{location}/cancel")  # end of the test
            polled = await self.request(server, "GET", location, params={"wait": POLL_WAIT})
            if polled is None or polled.status_code != 200:
                return  # counted above; the execution stays non-terminal and fails the test
            body = polled.json()
            self.remember(server, body)
            if body["status"] in ENDED:
                return

    def _short(self) -> float:
        return round(self.random.uniform(0.0, 0.02), 4)

    async def read(self) -> None:
        """A status read without waiting: a dashboard or a client checking in."""
        if self.tally.executions and self.random.random() < 0.7:
            seen = self.random.choice(list(self.tally.executions.values()))
            polled = await self.request(seen.server, "GET", f"/executions/{seen.execution_id}")
            if polled is not None and polled.status_code == 200:
                self.remember(seen.server, polled.json())
        else:
            await self.request(self.target, "GET", "/executions", params={"limit": 5})

    async def user(self) -> None:
        while time.monotonic() < self.stop_at and self.tally.requests < MAX_REQUESTS:
            choice = self.random.random()
            if choice < 0.45:
                await self.sync_run()
            elif choice < 0.65:
                await self.read()
            elif choice < 0.85:
                await self.async_run(round(self.random.uniform(0.02, 0.5), 3), None)
            elif choice < 0.95:
                await self.async_run(4.0, round(self.random.uniform(0.05, 0.3), 3))
            else:
                await self.async_run(3.0, None)  # on the old process: cancelled by shutdown

    async def run(self, old: ServerProcess) -> float:
        started = time.monotonic()
        self.stop_at = started + LOAD_SECONDS

        async def terminate() -> None:
            await asyncio.sleep(SIGNAL_AFTER)  # the rollout's moment, not a sync point
            # Work that outlives any drain, started just before the signal: it is cancelled
            # by the shutdown, and its clients must still read that end.
            outliving = await asyncio.gather(*(self.begin_async(30.0) for _ in range(3)))
            old.signal(signal.SIGTERM)
            await asyncio.gather(*(self.follow(*s, None) for s in outliving if s is not None))

        await asyncio.gather(terminate(), *(self.user() for _ in range(WORKERS)))
        return time.monotonic() - started


def _json_lines(stderr: str) -> list[dict[str, Any]]:
    lines = []
    for line in stderr.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_rolling_restart_under_load_loses_nothing(server_factory: Any) -> None:
    old = server_factory("tests_app:agent", *OLD_ARGS, ready=False)
    new = server_factory("tests_app:agent", ready=False)
    old.wait_ready()
    new.wait_ready()

    load = Load(old.url, new.url, seed=7)

    async def drive() -> float:
        try:
            return await load.run(old)
        finally:
            await load.close()

    elapsed = asyncio.run(drive())
    code, exit_seconds = old.wait_exit(timeout=GRACE + 5)
    tally = load.tally
    stderr = old.stderr()
    summary = (
        f"{tally.requests} requests in {elapsed:.1f}s ({tally.requests / elapsed:.0f}/s), "
        f"{len(tally.executions)} executions; outcomes {dict(tally.outcomes)}; "
        f"refusals {dict(tally.refusals)}"
    )
    print(summary)

    # Nothing went wrong on the wire, and every refusal was clean.
    assert tally.violations == [], f"{tally.violations[:20]}\n{summary}"
    assert tally.requests >= 300, summary
    assert tally.refusals, f"the rollout was never seen by a client: {summary}"
    assert set(tally.refusals) <= {f"old {route} 503" for route in START_ROUTES}, summary

    # Every execution a client was handed reached a terminal status the client read.
    unfinished = [s for s in tally.executions.values() if s.body["status"] not in ENDED]
    assert unfinished == [], f"{[(s.server, s.body) for s in unfinished[:10]]}\n{summary}"
    on_old = [s.body for s in tally.executions.values() if s.server == "old"]
    assert any(b["status_reason"] == "shutdown" for b in on_old), summary

    # The old process ended inside its budget, and its report matches what the clients saw.
    assert code == 0, stderr
    assert exit_seconds < GRACE, stderr
    records = _json_lines(stderr)
    began = next(r for r in records if r["message"].startswith("shutdown began"))
    report = next(r["report"] for r in records if r["message"] == "shutdown report")
    print(f"shutdown report: {report}")
    t0 = _instant(began["timestamp"])
    after = [b for b in on_old if _instant(b["finished_at"]) >= t0]
    by_shutdown = [b for b in after if b["status_reason"] == "shutdown"]
    refused = sum(count for key, count in tally.refusals.items() if key.startswith("old"))
    assert report["abandoned"] == 0, report
    assert report["cancelled"] == len(by_shutdown), (report, summary)
    assert report["finished"] == len(after) - len(by_shutdown), (report, summary)
    assert report["rejected"] == refused, (report, summary)
    for text in ("Task exception was never retrieved", "Task was destroyed but it is pending"):
        assert text not in stderr

    # The replacement served the rest and shuts down cleanly too.
    assert httpx.get(f"{new.url}/readyz", timeout=5).status_code == 200
    new.signal(signal.SIGTERM)
    assert new.wait_exit(timeout=GRACE + 30)[0] == 0, new.stderr()
