"""The parts of a fault run: three `agent-server run tests_app:agent` replicas on fixed
loopback ports, on the store under test (Redis, or Postgres: through cuttable proxies either
way), behind haproxy; and the kinds of fault they can be dealt."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.apps.tests_app import (
    EVIDENCE_DIR_ENV,
    REPLICA_ID_ENV,
)
from tests.support.faults.postgres_parts import PostgresPair
from tests.support.faults.redis_parts import (
    REDIS_REPLICAS,
    PlainRedis,
    RedisUnderTest,
    SentinelRedis,
    stable_port,
)
from tests.support.haproxy import Haproxy
from tests.support.process import APPS_DIR, ServerProcess

#: Seconds a replica's liveness lasts unrenewed: short, so pauses past it stay short.
LEASE_TTL = 2.0
#: The replicas' shutdown budget: drain 1.5 + cancel 1 + http 1 + margin 1 <= grace 5.
REPLICA_FLAGS = [
    "--grace-period",
    "5",
    "--drain-timeout",
    "1.5",
    "--cancel-timeout",
    "1",
    "--http-timeout",
    "1",
]
#: Bound on a rollout: SIGTERM to exit; past it the replica is killed (and counted so).
ROLLOUT_TIMEOUT = 10.0
#: Bound on a replica's (or all replicas') readiness after a start or a healed fault.
READY_TIMEOUT = 15.0
REPLICAS = 3

REPLICA_KINDS = ("kill9", "rollout", "pause-replica")
#: Every kind of fault, with Sentinel; one Redis has no failover (PlainRedis.kinds).
FAULT_KINDS = (*REPLICA_KINDS, *SentinelRedis.kinds)
#: The stores a fault run can put under the replicas.
STORES = ("redis", "postgres")

StoreUnderTest = RedisUnderTest | PostgresPair


def fault_kinds(sentinel: bool, store: str = "redis") -> tuple[str, ...]:
    if store == "postgres":
        return (*REPLICA_KINDS, *PostgresPair.kinds)
    return (*REPLICA_KINDS, *(SentinelRedis if sentinel else PlainRedis).kinds)


class FaultReplica(ServerProcess):
    """`agent-server run tests_app:agent` on a fixed loopback port, on the proxied store."""

    def __init__(
        self, port: int, replica_id: str, store: str, marker_dir: Path, env: dict[str, str]
    ) -> None:
        self.replica_id = replica_id
        args = [
            "tests_app:agent",
            "--store",
            store,
            "--replica-id",
            replica_id,
            "--lease-ttl",
            str(LEASE_TTL),
            *REPLICA_FLAGS,
        ]
        super().__init__(args, {**env, REPLICA_ID_ENV: replica_id}, marker_dir, port=port)

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False


class FaultCluster:
    """The store (Redis with AOF, or a Postgres primary and its synchronous standby) <-
    proxies <- three replicas <- haproxy, all on loopback. `close` ends every process it
    started, whatever state the run left them in (paused ones included)."""

    def __init__(
        self,
        directory: Path,
        source: Path | None = None,
        *,
        sentinel: bool = True,
        redis_replicas: int = REDIS_REPLICAS,
        store: str = "redis",
    ) -> None:
        assert store in STORES, store
        self.directory = directory
        self.store: StoreUnderTest
        if store == "postgres":
            self.store = PostgresPair(directory)
        elif sentinel:
            self.store = SentinelRedis(directory, redis_replicas)
        else:
            self.store = PlainRedis(directory)
        self.evidence_dir = directory / "evidence"
        self.evidence_dir.mkdir()
        self.env = {EVIDENCE_DIR_ENV: str(self.evidence_dir)}
        if source is not None:
            path = os.environ.get("PYTHONPATH")
            self.env["PYTHONPATH"] = str(source) + (os.pathsep + path if path else "")
        self.ports = [stable_port() for _ in range(REPLICAS)]
        self.kinds = fault_kinds(sentinel, store)
        self.replicas: list[FaultReplica] = []
        #: Every replica ever started, in order (their logs are checked).
        self.started: list[FaultReplica] = []
        self.haproxy: Haproxy | None = None
        self.incarnations = 0

    @property
    def redis(self) -> StoreUnderTest:
        """The store under test, by the name the Redis-only parts of the harness use (a
        Postgres pair is no `SentinelRedis`: their checks of it pass it by)."""
        return self.store

    def server_module(self) -> str:
        """Which agent_server the replicas import (the path of its package)."""
        run = subprocess.run(
            [sys.executable, "-c", "import agent_server; print(agent_server.__file__)"],
            cwd=APPS_DIR,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
        )
        return run.stdout.strip() or run.stderr.strip()

    def open(self) -> None:
        self.store.open()
        self.replicas = [self.start(index) for index in range(REPLICAS)]
        for replica in self.replicas:
            replica.wait_ready(READY_TIMEOUT)
        haproxy_dir = self.directory / "haproxy"
        haproxy_dir.mkdir()
        self.haproxy = Haproxy(haproxy_dir, self.ports)
        self.haproxy.start()

    @property
    def url(self) -> str:
        assert self.haproxy is not None
        return self.haproxy.url

    def start(self, index: int) -> FaultReplica:
        self.incarnations += 1
        replica_id = f"r{index}-{self.incarnations}"
        marker_dir = self.directory / replica_id
        marker_dir.mkdir()
        replica = FaultReplica(self.ports[index], replica_id, self.store.url, marker_dir, self.env)
        self.started.append(replica)
        return replica

    def replace(self, index: int) -> FaultReplica:
        """A fresh replica (a new id) on the port of `index`, once it is ready; one more try
        if the first fails to start."""
        for tries_left in (1, 0):
            fresh = self.start(index)
            self.replicas[index] = fresh
            try:
                fresh.wait_ready(READY_TIMEOUT)
                return fresh
            except AssertionError:
                fresh.close()
                if not tries_left:
                    raise
        raise AssertionError("unreachable")

    def wait_all_ready(self, timeout: float = READY_TIMEOUT) -> list[str]:
        """Wait (bounded) until every replica is ready; the ids of those that were not."""
        deadline = time.monotonic() + timeout
        waiting = list(self.replicas)
        while waiting and time.monotonic() < deadline:
            waiting = [replica for replica in waiting if not replica.ready()]
            if waiting:
                time.sleep(0.05)
        return [replica.replica_id for replica in waiting]

    def live_urls(self) -> list[str]:
        return [replica.url for replica in self.replicas if replica.proc.poll() is None]

    def close(self) -> None:
        for replica in self.started:
            if replica.proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
            replica.close()
        if self.haproxy is not None:
            self.haproxy.stop()
        self.store.close()
