"""Three real `agent-server run` replicas on one real Redis (or Postgres) behind a real
haproxy, as a Kubernetes Service spreads requests over pods and follows their readiness; and
the polls and metric reads the multi-replica tests make of them."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tests.support.haproxy import Haproxy
from tests.support.postgres_server import PostgresServer
from tests.support.process import ServerProcess, free_port, need
from tests.support.redis_server import RedisServer

#: Bound on every wait here (seconds) unless it says otherwise.
WAIT = 10.0
LEASE = 1.0


class Replica(ServerProcess):
    """`agent-server run tests_app:agent` (or `app`) on a fixed loopback port with the redis
    store."""

    def __init__(
        self,
        port: int,
        replica_id: str,
        store: str,
        marker_dir: Path,
        extra: list[str],
        env: dict[str, str] | None = None,
        app: str = "tests_app:agent",
    ) -> None:
        self.replica_id = replica_id
        args = [
            app,
            "--store",
            store,
            "--replica-id",
            replica_id,
            "--lease-ttl",
            str(LEASE),
            *extra,
        ]
        super().__init__(args, env or {}, marker_dir, port=port)


class Cluster:
    """Three replicas, one Redis (or one Postgres: `redis` is then that server), one haproxy;
    replicas can be restarted on their port."""

    def __init__(
        self,
        tmp_path: Path,
        redis: RedisServer | PostgresServer,
        extra: list[str],
        env: dict[str, str] | None = None,
        app: str = "tests_app:agent",
        store: str | None = None,
    ) -> None:
        need("haproxy", package="haproxy")  # before any replica starts, so none is left behind
        self.tmp_path = tmp_path
        self.redis = redis
        #: The replicas' `--store`: the server's own URL, or another store (a Postgres while
        #: `redis` stays the tests' witness).
        self.store = store or redis.url
        self.extra = extra
        self.env = env or {}
        self.app = app
        self.ports = [free_port() for _ in range(3)]
        self.incarnations = 0
        self.replicas = [self.start(index) for index in range(3)]
        proxy: Haproxy | None = None
        try:
            for replica in self.replicas:
                replica.wait_ready()
            proxy = Haproxy(tmp_path, self.ports)
            proxy.start()
        except BaseException:  # no process outlives a cluster that never came up
            if proxy is not None:
                proxy.stop()
            for replica in self.replicas:
                replica.close()
            raise
        self.proxy = proxy

    def start(self, index: int) -> Replica:
        self.incarnations += 1
        marker_dir = self.tmp_path / f"replica{index}-{self.incarnations}"
        marker_dir.mkdir()
        return Replica(
            self.ports[index],
            f"r{index}-{self.incarnations}",
            self.store,
            marker_dir,
            self.extra,
            self.env,
            self.app,
        )

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def close(self) -> None:
        self.proxy.stop()
        for replica in self.replicas:
            replica.close()


@contextlib.contextmanager
def started_cluster(
    tmp_path: Path,
    redis: RedisServer | PostgresServer,
    *flags: str,
    env: dict[str, str] | None = None,
    app: str = "tests_app:agent",
    store: str | None = None,
) -> Iterator[Cluster]:
    """Three replicas of `app` with `flags` on `redis` behind haproxy, closed at the end
    whatever happened: the body of every cluster fixture."""
    cluster = Cluster(tmp_path, redis, list(flags), env, app, store)
    try:
        yield cluster
    finally:
        cluster.close()


def wait_for(predicate: Any, timeout: float = WAIT, what: str = "condition") -> Any:
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout}s")
        time.sleep(0.02)


def metric(url: str, name: str, **labels: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total
