"""Shared fixtures: an in-process client for the ASGI app, real server processes, and a real
Redis. What they are built from lives in tests/support/; the apps they serve in tests/apps/."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.apps.tests_app import make_agent
from tests.support.postgres_server import PostgresServer
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[object]:
    """Start servers with `server_factory(*args, env={...})`; all are killed at the end."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> ServerProcess:
        marker_dir = tmp_path / f"server{len(started)}"
        marker_dir.mkdir()
        server = ServerProcess(list(args), env or {}, marker_dir)
        started.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
async def app_client() -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for a fresh agent with the tests app's reasoners."""
    agent = make_agent()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        yield client


# -- a real Redis for the store tests ---------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real `redis-server` per test module (Debian's package; `.ci/run` installs it)."""
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[object]:
    """A redis-server of this test's own, which the test may stop, pause (SIGSTOP: SIGKILL
    still ends it) or start again on the same port."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server: object) -> str:
    """The module's Redis, emptied for this test (FLUSHALL)."""
    assert isinstance(redis_server, RedisServer)
    if not redis_server.ping():  # a test stopped it: start it again
        redis_server.start()
    assert redis_server.command("FLUSHALL") == b"+OK\r\n"
    return redis_server.url


# -- a real PostgreSQL for the store tests ----------------------------------------------------


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[object]:
    """One real `postgres` per test module (Debian's package; `.ci/run` installs it), run
    as the unprivileged `postgres` user; the store connects as an ordinary role."""
    server = PostgresServer()
    yield server
    server.remove()


@pytest.fixture
def postgres_url(postgres_server: object) -> str:
    """The module's Postgres with an empty database for this test."""
    assert isinstance(postgres_server, PostgresServer)
    if postgres_server.proc is None or not postgres_server.ready():
        postgres_server.start()
    postgres_server.reset()
    return postgres_server.url


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "postgres"])
def shared_store(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`shared_store(replica_id, observer, **options)`: a store shared by replicas (not yet
    open), on the test's own empty Redis or Postgres: a suite written with it runs on both."""
    from tests.support.stores import open_postgres, open_redis

    url = request.getfixturevalue(f"{request.param}_url")
    opener = open_redis if request.param == "redis" else open_postgres

    def make(replica_id: str, seen: Any, **options: Any) -> Any:
        return opener(url, replica_id, seen, **options)

    return make


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis), "postgres"])
async def any_store(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each store, open (Redis and Postgres on the test's own empty one), closed after the
    test: a test written with it runs on memory, Redis and Postgres alike."""
    from tests.support.stores import one_store

    url = None if request.param == "memory" else request.getfixturevalue(f"{request.param}_url")
    async with one_store(request.param, url) as opened:
        yield opened


@pytest.fixture(params=[pytest.param("redis", marks=pytest.mark.redis), "postgres"])
def store_url(request: pytest.FixtureRequest) -> str:
    """The URL of an empty shared store, Redis then Postgres: a suite of real replicas
    written with it runs on both."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url
