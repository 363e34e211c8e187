"""The connections of the postgres store: a bounded pool (psycopg_pool) for the statements,
whether Postgres is up, and what a failure means.

Every operation is one transaction on a pooled connection, bounded by COMMAND_TIMEOUT: a
connection refused, reset or silent is StoreUnavailable (readiness turns 503, new work 503 +
Retry-After, the owner's writes wait in the outbox), and the store is down until a probe
(`SELECT 1` after the pool dropped its broken connections) succeeds again.

The pool's connections are in autocommit: an operation that is one statement (a read, a
plain create, one end) is one round trip (`tx(..., one=True)`; a statement is atomic on its
own), and one of several statements pays BEGIN and COMMIT (`conn.transaction()`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.postgres.codec import describe_url, scrub

logger = logging.getLogger("agent_server.store")
# The pool's own reconnect warnings repeat every attempt during an outage: the store says
# once that Postgres cannot be reached, and once that it is back.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)

#: Seconds a connection may take to open, and a statement's transaction to finish.
CONNECT_TIMEOUT = 3.0
COMMAND_TIMEOUT = 5.0
#: Connections per replica unless --store-pool-size says otherwise.
POOL_SIZE = 10

#: What says Postgres cannot be reached (or answer) now.
FAILURES: tuple[type[BaseException], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    PoolTimeout,
    PoolClosed,  # closing at shutdown while a request still reads: 503, never a 500
    TimeoutError,
    OSError,
)

Conn = psycopg.AsyncConnection[Any]


class Link:
    """The pool, the up flag and the observer's timings."""

    def __init__(
        self,
        url: str,
        *,
        pool_size: int,
        observer: StoreObserver | None,
        on_up: Callable[[], object],
    ) -> None:
        self.url = url
        self.where = describe_url(url)
        self.pool_size = max(2, pool_size)
        self.observer = observer
        self.on_up = on_up
        self.up = False
        self.pool: AsyncConnectionPool[Conn] | None = None

    def scrub(self, text: str) -> str:
        return scrub(self.url, text)

    def set_up(self, up: bool) -> None:
        if up == self.up:
            return
        self.up = up
        if self.observer is not None:
            self.observer.store_up(up)
        if up:
            logger.info("Postgres at %s is reachable again", self.where)
            self.on_up()
        else:
            logger.warning("Postgres at %s cannot be reached", self.where)

    async def open(self) -> None:
        """The pool, filled to its size in the background once one connection answers. A
        pool that grew on demand grew in the drain, when the outbox's writes and the
        shutdown's statements first ran at once: each new connection's handshake (SCRAM)
        competed with the ends being written (bench/RESULTS.md, "PG9")."""
        self.pool = AsyncConnectionPool(
            self.url,
            min_size=self.pool_size,
            max_size=self.pool_size,
            open=False,
            timeout=COMMAND_TIMEOUT,
            reconnect_timeout=3600 * 24 * 365,
            kwargs={"connect_timeout": max(1, round(CONNECT_TIMEOUT)), "autocommit": True},
            name="agent-server-store",
        )
        await self.pool.open(wait=False)
        # Reachable once one connection is (the store's open closes the pool otherwise).
        async with asyncio.timeout(CONNECT_TIMEOUT + 1), self.pool.connection():
            pass

    async def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            await pool.close(timeout=COMMAND_TIMEOUT)

    @property
    def is_open(self) -> bool:
        return self.pool is not None

    def unavailable(self, exc: BaseException) -> StoreUnavailable:
        reason = self.scrub(str(exc).strip() or type(exc).__name__)
        return StoreUnavailable(f"cannot reach Postgres at {self.where}: {reason}")

    @asynccontextmanager
    async def tx(self, operation: str, *, one: bool = False) -> AsyncIterator[Conn]:
        """One transaction (committed at the end of the block, rolled back on an error),
        bounded; a failure to reach Postgres is StoreUnavailable and marks it down. With
        `one`, the block runs a single statement, atomic by itself: no BEGIN, no COMMIT."""
        pool = self.pool
        if pool is None:
            raise StoreUnavailable(f"the store at {self.where} is closed")
        started = time.monotonic()
        ok = False
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT), pool.connection() as conn:
                if one:
                    yield conn
                else:
                    async with conn.transaction():
                        yield conn
            ok = True
        except FAILURES as exc:
            self.set_up(False)
            raise self.unavailable(exc) from None
        finally:
            if self.observer is not None:
                self.observer.store_operation(operation, time.monotonic() - started, ok)
        self.set_up(True)

    async def probe(self) -> bool:
        """Whether Postgres answers now (the pool's broken connections replaced first)."""
        pool = self.pool
        if pool is None:
            return False
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                await pool.check()
                async with pool.connection() as conn:
                    await conn.execute("SELECT 1")
        except FAILURES:
            self.set_up(False)
            return False
        self.set_up(True)
        return True
