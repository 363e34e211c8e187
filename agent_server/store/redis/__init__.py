"""The execution store shared by every replica through one Redis (section 8 of the design).

One concept per module: `store.py` holds `RedisStore`, composed of the rest: plain parts its
`__init__` makes, each given what it uses, and one part per role of the interface
(`records.py`, `claims.py`, `inputs.py`, `reads.py`, `webhooks.py`, `schedule_marks.py`),
which `ComposedStore` (store/composed.py) forwards the role's calls to; `owner_writes.py` the
owner's writes through the outbox; `keys.py` names every key; `link.py` the connections (the
scripts' link, its probe and subscriber twins, redis-py's pool) and whether Redis is up;
`failures.py` what a failure means; `outbox.py` the writes owed to Redis; `notices.py`
pub/sub and its waiters; `liveness.py` the renewal and repair; `releases.py` session
releases; `codec.py` records to and from the scripts; `scripts.py` and `lua/` the Lua
scripts, one file each. The connection the scripts share is `agent_server.store.redis.resp`,
and Sentinel's locator `agent_server.store.redis.sentinel`.
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
