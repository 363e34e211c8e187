"""Where execution records live: the interface and its two implementations."""

from __future__ import annotations

from agent_server.model.asks import MAX_ANSWER_BYTES
from agent_server.store.base import (
    BadCursor,
    CancelHandler,
    ExecutionRunning,
    ExecutionStore,
    ListCursor,
    Page,
    SchemaTooNew,
    SessionReleasing,
    StoreInDoubt,
    StoreObserver,
    StoreUnavailable,
)
from agent_server.store.memory import MemoryStore

__all__ = [
    "BadCursor",
    "CancelHandler",
    "ExecutionRunning",
    "ExecutionStore",
    "ListCursor",
    "MemoryStore",
    "Page",
    "SchemaTooNew",
    "SessionReleasing",
    "StoreInDoubt",
    "StoreObserver",
    "StoreUnavailable",
    "open_store",
]


def open_store(
    url: str,
    *,
    replica_id: str,
    agent_name: str,
    result_ttl: float,
    max_retained: int,
    lease_ttl: float,
    max_retained_bytes: int = 256 * 1024 * 1024,
    max_events: int = 1000,
    observer: StoreObserver | None = None,
    max_answer_bytes: int = MAX_ANSWER_BYTES,
    max_inflight: int = 0,
    pool_size: int = 10,
    notify: str = "listen",
) -> ExecutionStore:
    """The store `--store` names: `memory`, a `redis://`, `rediss://` or `redis+sentinel://`
    URL, or a `postgresql://` (`postgres://`) URL. Redis's outbox keeps an end for every
    execution that may be in flight (`max_inflight`), and at least OUTBOX_LIMIT; Postgres
    holds at most `pool_size` connections (and one more to LISTEN, unless `notify` is
    `poll`)."""
    if url == "memory":
        return MemoryStore(
            replica_id,
            result_ttl=result_ttl,
            max_retained=max_retained,
            max_retained_bytes=max_retained_bytes,
            max_answer_bytes=max_answer_bytes,
        )
    if url.startswith(("postgresql://", "postgres://")):
        # Only when asked for: it needs psycopg.
        from agent_server.store.postgres import PostgresStore

        return PostgresStore(
            url,
            replica_id=replica_id,
            agent_name=agent_name,
            result_ttl=result_ttl,
            max_retained=max_retained,
            max_retained_bytes=max_retained_bytes,
            lease_ttl=lease_ttl,
            observer=observer,
            max_events=max_events,
            max_answer_bytes=max_answer_bytes,
            pool_size=pool_size,
            notify=notify,
        )
    # Only when asked for: it needs redis-py.
    from agent_server.store.redis import OUTBOX_LIMIT, RedisStore

    return RedisStore(
        url,
        replica_id=replica_id,
        agent_name=agent_name,
        result_ttl=result_ttl,
        max_retained=max_retained,
        max_retained_bytes=max_retained_bytes,
        lease_ttl=lease_ttl,
        observer=observer,
        max_events=max_events,
        max_answer_bytes=max_answer_bytes,
        outbox_limit=max(OUTBOX_LIMIT, max_inflight),
    )
