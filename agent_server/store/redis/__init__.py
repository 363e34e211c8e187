"""The execution store shared by every replica through one Redis (section 8 of the design).

One concept per module: `store.py` holds `RedisStore`, the facade that composes the rest;
its operations are its base classes, one module each (`starts.py`, `owner_writes.py`,
`inputs.py`, `reads.py`, `webhooks.py`, over the attributes `part.py` declares);
`keys.py` names every key; `link.py` the connections (the scripts' link, its probe and
subscriber twins, redis-py's pool) and whether Redis is up; `failures.py` what a failure
means; `outbox.py` the writes owed to Redis; `notices.py` pub/sub and its waiters;
`liveness.py` the renewal and repair; `releases.py` session releases; `codec.py` records to
and from the scripts; `scripts.py` and `lua/` the Lua scripts, one file each. The connection
the scripts share is `agent_server.store.redis.resp`, and Sentinel's locator
`agent_server.store.redis.sentinel`.
"""

from __future__ import annotations

from agent_server.store.redis.codec import describe_url
from agent_server.store.redis.failures import transient_reason
from agent_server.store.redis.link import COMMAND_TIMEOUT
from agent_server.store.redis.outbox import EVENTS_PENDING, NOTICE_RECORD_MAX, OUTBOX_LIMIT
from agent_server.store.redis.store import RedisStore

__all__ = [
    "COMMAND_TIMEOUT",
    "EVENTS_PENDING",
    "NOTICE_RECORD_MAX",
    "OUTBOX_LIMIT",
    "RedisStore",
    "describe_url",
    "transient_reason",
]
