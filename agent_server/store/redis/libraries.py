"""The scripts' Redis function libraries on a node: loaded where they are missing, and
those of versions no replica of this agent has loaded for a day deleted.

A library is named by its script and a digest of its code (scripts.py `library`), so a
library of that name already loaded is this one, and two versions of the server on one
Redis (a rollout) each call their own. Redis keeps functions in its snapshot and AOF and
sends them to its replicas, so without this every release would leave its libraries
behind. The registry (a hash: library name -> when a replica last loaded it, Redis ms)
says which are idle; deleting one still in use is safe, only slower: its callers find
their function missing and load it again, which marks it in use.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from redis.exceptions import ResponseError

from agent_server.store.redis import scripts

#: A library no replica of this agent has loaded for this long (ms) is deleted by the next
#: replica that loads its own: longer than any rollout keeps two versions running.
IDLE_MS = 24 * 3600 * 1000

Call = Callable[..., Awaitable[Any]]


async def load(call: Call, registry: str) -> None:
    """Every library of this version loaded on the node `call` reaches, marked in use in
    `registry`; then the idle ones deleted."""
    ours = [function for function, _ in scripts.LIBRARIES.values()]
    for _, code in scripts.LIBRARIES.values():
        try:
            await call("FUNCTION", "LOAD", code)
        except ResponseError as error:
            if "already exists" not in str(error):
                raise
    seconds, micros = await call("TIME")
    now = int(seconds) * 1000 + int(micros) // 1000
    await call("HSET", registry, *(value for name in ours for value in (name, now)))
    marked = await call("HGETALL", registry)
    if isinstance(marked, dict):  # redis-py's client answers a dict, the link a list
        pairs = list(marked.items())
    else:
        pairs = list(zip(marked[::2], marked[1::2], strict=True))
    idle = [_text(name) for name, at in pairs if int(at) < now - IDLE_MS]
    for name in idle:
        try:
            await call("FUNCTION", "DELETE", name)
        except ResponseError as error:
            if "not found" not in str(error).lower():
                raise
    if idle:
        await call("HDEL", registry, *idle)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
