"""Put on PYTHONPATH of a benchmarked server by `bench.store` (item 5, a what-if): the redis
store's client gets a *blocking* connection pool of `BENCH_REDIS_POOL_SIZE` connections
(default 100) with a 2 s wait, instead of redis-py's default pool, which raises
`MaxConnectionsError` (a `ConnectionError`) as soon as 100 commands are in flight at once.

Nothing in agent_server/ changes; only the pool class `redis.asyncio.Redis.from_url` builds.
"""

from __future__ import annotations

import os
from typing import Any

try:
    import redis.asyncio.client as _client
    from redis.asyncio.connection import BlockingConnectionPool
except ImportError:  # not a server with redis-py: nothing to do
    pass
else:
    _SIZE = int(os.environ.get("BENCH_REDIS_POOL_SIZE", "100"))

    class _WaitingPool(BlockingConnectionPool):
        def __init__(self, **kwargs: Any) -> None:
            kwargs.setdefault("max_connections", _SIZE)
            kwargs.setdefault("timeout", 2.0)
            super().__init__(**kwargs)

    setattr(_client, "ConnectionPool", _WaitingPool)  # noqa: B010 - the name from_url reads
