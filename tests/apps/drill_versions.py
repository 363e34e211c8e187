"""Two versions of one app for `agent-server drill OLD --next NEW`
(tests/process/test_drill.py): `drill_versions:old` (version v1) and `drill_versions:new`
(v2), whose resumable reasoners meet v1's checkpoints each by another rule: `pinned` keeps
its own version r1 in both (same version), `compat` declares v1 compatible, `migrating`
migrates, `restarting` restarts, `failing` fails (the default), `removed` is gone from v2,
and `plain` is not resumable (nothing is handed off). `drill_versions:from_env` takes its
version from AGENT_SERVER_VERSION, as a deployment sets it from the image tag."""

from __future__ import annotations

from typing import Any

from agent_server import Agent, ExecutionContext

old = Agent("old", version="v1")
new = Agent("new", version="v2")
from_env = Agent("from_env")


async def step(ctx: ExecutionContext, n: int = 1) -> dict[str, int]:
    """One checkpoint, then done: quick, so the drill's rehearsal is."""
    await ctx.checkpoint({"done": n})
    return {"done": n}


async def plain(n: int = 1) -> int:
    return n


def to_v2(state: Any, from_version: str | None) -> Any:
    """v1's `{"done": n}` as v2's `{"steps": n}`."""
    return {"steps": state["done"]}


for name in ("pinned", "compat", "migrating", "restarting", "failing", "removed"):
    old.reasoner(name, resumable=True, version="r1" if name == "pinned" else None)(step)
old.reasoner("plain")(plain)

new.reasoner("pinned", resumable=True, version="r1")(step)
new.reasoner("compat", resumable=True, compatible=("v1",))(step)
new.reasoner("migrating", resumable=True, migrate=to_v2)(step)
new.reasoner("restarting", resumable=True, on_version_change="restart")(step)
new.reasoner("failing", resumable=True)(step)
new.reasoner("plain")(plain)

from_env.reasoner("job", resumable=True)(step)
