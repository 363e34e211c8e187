"""What the store tests share: the agent name their stores serve, an observer that records
what a store tells it, bounded polls and closes, the redis store opened on a test's Redis, and
a resumable execution.

(The store contract itself is tests/store/test_store_contract.py; the faults suite and the
durable tests build on these parts.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from agent_server.model.execution import Execution
from agent_server.store import ExecutionStore, MemoryStore
from agent_server.store.postgres import PostgresStore
from agent_server.store.redis import RedisStore

AGENT = "contract"
#: What Postgres answers once a write is on the server: a transaction's COMMIT, or a plain
#: start's INSERT (one statement in autocommit: its own commit). A proxy holding replies that
#: carry either holds the answer of a write that is done.
COMMITTED = (b"COMMIT\x00", b"INSERT 0 1\x00")
#: Bound of every poll of the store tests unless a test says otherwise.
BOUND = 5.0


@dataclass
class Recorder:
    """A StoreObserver that remembers what it was told."""

    lost: list[str] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)
    ups: list[bool] = field(default_factory=list)
    alive: list[int] = field(default_factory=list)
    operations: list[tuple[str, bool]] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)

    def store_operation(self, operation: str, seconds: float, ok: bool) -> None:
        assert seconds >= 0
        self.operations.append((operation, ok))

    def store_up(self, up: bool) -> None:
        self.ups.append(up)

    def execution_lost(self, execution: Execution) -> None:
        self.lost.append(execution.execution_id)

    def fenced_write(self, execution: Execution) -> None:
        self.fenced.append(execution.execution_id)

    def replicas_alive(self, count: int) -> None:
        self.alive.append(count)

    def write_retried(self, reason: str) -> None:
        self.retries.append(reason)


async def eventually(probe: Callable[[], Awaitable[Any]], timeout: float = BOUND) -> Any:
    """Poll `probe` until it returns something truthy, failing after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s")
        await asyncio.sleep(0.01)


async def closed(store: ExecutionStore) -> None:
    """Close it, bounded: a hang shows here, not as the whole run's timeout."""
    await asyncio.wait_for(store.close(), 10.0)


def open_redis(url: str, replica_id: str, seen: Recorder, **options: Any) -> RedisStore:
    return RedisStore(url, replica_id=replica_id, agent_name=AGENT, observer=seen, **options)


def open_postgres(url: str, replica_id: str, seen: Recorder, **options: Any) -> PostgresStore:
    return PostgresStore(url, replica_id=replica_id, agent_name=AGENT, observer=seen, **options)


@asynccontextmanager
async def one_store(
    kind: str, url: str | None, replica_id: str = "r1"
) -> AsyncIterator[ExecutionStore]:
    """A store of each kind ("memory", "redis", "postgres" at `url`), open, then closed: a
    contract test's fixture, parametrized by kind."""
    opened: ExecutionStore
    if kind == "memory":
        opened = MemoryStore(replica_id)
    elif kind == "redis":
        assert url is not None
        opened = open_redis(url, replica_id, Recorder())
    else:
        assert url is not None
        opened = open_postgres(url, replica_id, Recorder())
    await opened.open()
    try:
        yield opened
    finally:
        await closed(opened)


def proxied(url: str, port: int) -> str:
    """A store's `url` with `port` (a proxy's, in front of the store) in place of its own."""
    parts = urlsplit(url)
    host = parts.netloc.rpartition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{host}:{port}"))


def resumable(replica: str, session_id: str | None = None) -> Execution:
    execution = Execution("steps", session_id, replica)
    execution.resumable = True
    execution.body = {"count": 3}
    execution.max_attempts = 3
    return execution
