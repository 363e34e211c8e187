"""Reasoners the MCP tests call as tools (tests/process/test_mcp.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from agent_server import Agent, ExecutionContext

agent = Agent("mcp-tests")


class Approval(BaseModel):
    approved: bool
    note: str = ""


@agent.reasoner()
async def add(a: int, b: int) -> dict[str, int]:
    """Adds two integers."""
    return {"sum": a + b}


@agent.reasoner()
async def shout(text: str) -> str:
    """A string result: structuredContent wraps it."""
    return text.upper()


@agent.reasoner()
async def nap(seconds: float = 60.0) -> str:
    """Sleeps, to be cancelled."""
    await asyncio.sleep(seconds)
    return "rested"


@agent.reasoner()
async def broken() -> str:
    """Fails: a tool error."""
    raise ValueError("it broke")


@agent.reasoner(resumable=True)
async def approve(ctx: ExecutionContext, amount: int = 100) -> dict[str, Any]:
    """Asks for an approval (a flat object schema)."""
    answer = await ctx.ask({"question": f"approve {amount}?"}, schema=Approval)
    return {"approved": answer.approved, "note": answer.note, "amount": amount}


@agent.reasoner(resumable=True)
async def pick(ctx: ExecutionContext) -> list[int]:
    """Asks for a list (not a flat object: the elicitation wraps it as value)."""
    return list(await ctx.ask("which numbers?", schema=list[int]))


@agent.reasoner(max_concurrency=1, concurrency_key="header:X-Tenant")
async def per_tenant(seconds: float = 60.0) -> str:
    """One at a time per X-Tenant (the POST's header, as on the API's routes)."""
    await asyncio.sleep(seconds)
    return "done"
