"""Two versions of one app, for tests/process/test_versions.py: `AGENT_SERVER_VERSION` says
which this process is, `TESTS_V2_RULE` what v2 declares about v1's checkpoints.

v1 checkpoints `{"done": n}`; v2 changed the shape to `{"steps": n}`. Every body notes to
the test's Redis (TESTS_REDIS_URL) what it began from: its version, attempt and the
checkpoint it was handed. That note is the witness: v2 must never begin from `{"done": n}`
unless it declared it reads v1 (`compatible`), where its code reads both shapes.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from agent_server import Agent, ExecutionContext

VERSION = os.environ.get("AGENT_SERVER_VERSION")
RULE = os.environ.get("TESTS_V2_RULE", "fail")

agent = Agent("versions")


def migrate(state: Any, from_version: str | None) -> Any:
    """v1's `{"done": n}` as v2's `{"steps": n}`; `migrate_raising` refuses."""
    if RULE == "migrate_raising":
        raise ValueError(f"cannot migrate a checkpoint of {from_version}")
    return {"steps": state["done"], "migrated_from": from_version}


def _declared() -> dict[str, Any]:
    if VERSION != "v2":
        return {}
    if RULE == "compatible":
        return {"compatible": ("v1",)}
    if RULE in ("migrate", "migrate_raising"):
        return {"migrate": migrate}
    if RULE == "restart":
        return {"on_version_change": "restart"}
    return {"on_version_change": "fail"}


async def _note(ctx: ExecutionContext, what: str) -> None:
    url = os.environ.get("TESTS_REDIS_URL")
    if not url:
        return
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        entry = json.dumps(
            {
                "what": what,
                "version": VERSION,
                "attempt": ctx.attempt,
                "state": ctx.checkpoint_state,
                "pid": os.getpid(),
            }
        )
        await client.rpush(f"tests:versions:{ctx.execution_id}", entry)
    finally:
        await client.aclose()


@agent.reasoner(resumable=True, max_attempts=5, **_declared())
async def job(ctx: ExecutionContext, count: int = 40, pause: float = 0.1) -> dict[str, Any]:
    """`count` steps of `pause` seconds, checkpointed after each in this version's shape."""
    await _note(ctx, "begin")
    state = ctx.checkpoint_state
    if VERSION == "v2":  # reads its own shape, and v1's only where it declared so
        done = 0 if state is None else int(state["steps"] if "steps" in state else state["done"])
    else:
        done = 0 if state is None else int(state["done"])
    for step in range(done, count):
        await asyncio.sleep(pause)
        await ctx.checkpoint({"steps": step + 1} if VERSION == "v2" else {"done": step + 1})
    return {"count": count, "version": VERSION, "resumed_from": done}


@agent.reasoner()
async def hold(seconds: float = 5.0) -> str:
    """Keeps this replica full (--max-inflight 1): it takes nothing from the queue."""
    await asyncio.sleep(seconds)
    return "held"


if VERSION == "v1":  # the next release drops this reasoner

    @agent.reasoner()
    async def old_only(n: int = 0) -> dict[str, Any]:
        """Served by v1 only: its work is v1's while a v1 replica is alive."""
        return {"n": n, "version": VERSION}
