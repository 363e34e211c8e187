"""The execution store shared by every replica through one Redis (section 8 of the design).

`store.py` holds `RedisStore`; `scripts.py` and `lua/` its Lua scripts, one file each; the
connection it multiplexes its scripts on is `agent_server.store.resp`, and Sentinel's
locator `agent_server.store.sentinel`.
"""

from __future__ import annotations

from agent_server.store.redis.store import (
    COMMAND_TIMEOUT,
    EVENTS_PENDING,
    NOTICE_RECORD_MAX,
    RedisStore,
    describe_url,
    transient_reason,
)

__all__ = [
    "COMMAND_TIMEOUT",
    "EVENTS_PENDING",
    "NOTICE_RECORD_MAX",
    "RedisStore",
    "describe_url",
    "transient_reason",
]
