"""What the parts of `RedisStore` share: the settings and parts its `__init__` makes.

Each concept of the store (starts, the owner's writes, input, reads, webhooks) is a base
class of its own module, typed against the attributes declared here; `RedisStore` (store.py)
sets them and combines the parts.
"""

from __future__ import annotations

from agent_server.store.base import ExecutionStore, StoreObserver
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link
from agent_server.store.redis.liveness import Liveness
from agent_server.store.redis.notices import Notices
from agent_server.store.redis.outbox import Outbox
from agent_server.store.redis.releases import Releases


class StorePart(ExecutionStore):
    """The attributes a part of `RedisStore` reads, all set by `RedisStore.__init__`."""

    replica_id: str
    max_answer_bytes: int
    url: str
    where: str
    keys: Keys
    replicated_writes: bool
    result_ttl: float
    max_retained: int
    lease_ttl: float
    observer: StoreObserver | None
    max_events: int
    #: When the next scheduled execution is due (the loop's clock), as the last claim said;
    #: None when nothing waits for a time.
    _due_at: float | None
    _codec: RowCodec
    _link: Link
    _notices: Notices
    _outbox: Outbox
    _releases: Releases
    _liveness: Liveness
