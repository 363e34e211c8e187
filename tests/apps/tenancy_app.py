"""The app of the tenancy tests: `agent-server run tenancy_app:agent` with a tokens file of
two tenants and an admin. Its reasoners hold (until cancelled), ask, run under a concurrency
limit keyed by a header, and say whom they run for (`ctx.principal`); `@agent.authorize`
lets a principal with the scope `readonly` read and list only (`nocancel`: all but cancel;
`noread`: all but read)."""

from __future__ import annotations

import asyncio
from typing import Any

from agent_server import Agent, ExecutionContext, Principal

agent = Agent("tenancy-tests")

#: What `secret` answers: a value no caller sends, so a test sees whether a result was shown.
SECRET = "only-readers-see-this-5c0d9e"

#: What a `readonly` principal may do.
READ_ONLY_ACTIONS = frozenset({"read", "list"})


@agent.authorize
async def read_only(principal: Principal, action: str, resource: dict[str, Any]) -> bool:
    """A `readonly` principal reads and lists its tenant's work and does nothing else; a
    `nocancel` one does all but cancel, a `noread` one all but read."""
    if "readonly" in principal.scopes:
        return action in READ_ONLY_ACTIONS
    if "nocancel" in principal.scopes:
        return action != "cancel"
    if "noread" in principal.scopes:
        return action != "read"
    return True


@agent.reasoner()
async def echo(text: str) -> dict[str, str]:
    return {"text": text}


@agent.reasoner()
async def secret() -> dict[str, str]:
    """A result of its own, shown only to who may read it."""
    return {"secret": SECRET}


@agent.reasoner()
async def sized(size: int) -> str:
    """A result of `size` characters: what reading its record whole costs shows."""
    return "x" * size


@agent.reasoner()
async def hold(seconds: float = 60.0) -> str:
    """Runs until cancelled (or `seconds`)."""
    await asyncio.sleep(seconds)
    return "held"


@agent.reasoner()
async def question(ctx: ExecutionContext) -> Any:
    return await ctx.ask("what now?", timeout=120)


@agent.reasoner(max_concurrency=1, concurrency_key="header:X-Key")
async def limited(seconds: float = 60.0) -> str:
    """One at a time per value of X-Key (per tenant)."""
    await asyncio.sleep(seconds)
    return "done"


@agent.reasoner(session_policy="reject")
async def turn(seconds: float = 60.0) -> str:
    """Refused while its session has work that is not terminal."""
    await asyncio.sleep(seconds)
    return "done"


@agent.reasoner()
async def whoami(ctx: ExecutionContext) -> dict[str, Any]:
    principal = ctx.principal
    if principal is None:
        return {"identity": None}
    return {"identity": principal.identity, "tenant": principal.tenant}


@agent.reasoner(session_policy="enqueue")
async def in_line(seconds: float = 60.0) -> str:
    """Runs once every earlier execution of its session ended."""
    await asyncio.sleep(seconds)
    return "done"
