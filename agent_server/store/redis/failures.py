"""What a failure to reach Redis means: an outage (a 503 and a retry, never a 500), a write
refused for a while (kept and retried, section 12 invariant 4), or a bug."""

from __future__ import annotations

from typing import Any

from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_server.store.base import StoreUnavailable
from agent_server.store.redis.resp import NoReply

#: What "Redis cannot be reached now" looks like: a 503 and a retry, never a 500.
UNREACHABLE: tuple[type[Exception], ...] = (
    ConnectionError,  # AuthenticationError and BusyLoadingError are ConnectionErrors
    RedisTimeoutError,
    OSError,
    TimeoutError,
    BusyLoadingError,
    ReadOnlyError,  # a replica after a failover, until the client follows the new primary
    TryAgainError,
    OutOfMemoryError,  # maxmemory with noeviction: writes refused until memory frees up
)
OPEN_FAILURES: tuple[type[Exception], ...] = (StoreUnavailable, *UNREACHABLE)

#: Error replies (by their first word) with which Redis refuses a write for a while: during
#: a failover, while full, loading, busy with a script, or without its replicas. Such a
#: write stays in the outbox and is retried (section 12, invariant 4).
_TRANSIENT_REPLIES = {
    "READONLY": "readonly",
    "OOM": "oom",
    "LOADING": "loading",
    "BUSY": "busy",
    "MASTERDOWN": "masterdown",
    "TRYAGAIN": "tryagain",
    "NOREPLICAS": "noreplicas",
}


def transient_reason(error: BaseException) -> str | None:
    """Why Redis refused or missed a write for a while (a `WRITE_RETRY_REASONS` value), or
    None when the failure is not transient (a bug: retrying would not help)."""
    if isinstance(error, StoreUnavailable) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, RedisError):
        first = str(error).split(" ", 1)[0]
        if first in _TRANSIENT_REPLIES:
            return _TRANSIENT_REPLIES[first]
    if isinstance(error, (RedisTimeoutError, TimeoutError)) or str(error).startswith("no reply"):
        return "timeout"
    if isinstance(error, (ConnectionError, OSError)):
        return "connection"
    return None


def refused_for_now(error: BaseException) -> bool:
    """An error reply with which Redis refuses a command for a while (no replicas to write
    to, a primary down, a script running, a failover), which redis-py raises as a plain
    ResponseError: the store is unavailable for it (a 503 and a retry), not broken."""
    return isinstance(error, ResponseError) and (str(error).split(" ", 1)[0] in _TRANSIENT_REPLIES)


class Refused(StoreUnavailable):
    """Redis refused some writes of a batch for a transient reason: they are back in the
    outbox (counted), and the writer backs off."""


def slow(error: BaseException) -> bool:
    """No answer in time, which a slow command gives as well as a paused or cut-off Redis:
    a timeout, the scripts' link dropped for want of a reply, or no free connection in the
    pool within its wait."""
    if isinstance(error, TimeoutError | RedisTimeoutError | NoReply):
        return True
    return isinstance(error, ConnectionError) and isinstance(error.__cause__, TimeoutError)


def reset(error: BaseException | None) -> bool:
    """A connection reset that surfaces as another error than ConnectionError: uvloop's
    `RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the
    handler is closed` when redis-py writes on a transport a reset closed."""
    return isinstance(error, RuntimeError) and "closed" in str(error)


def on_a_replica(reply: Any, needed: int) -> bool:
    """A `WAIT n` reply: at least `needed` replicas have the writes before it."""
    return isinstance(reply, int) and reply >= needed
