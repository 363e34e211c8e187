"""An app whose reasoners return, raise and emit what no codec or log line should trust:
`agent-server run hostile_app:agent` (cwd: tests/apps/), for tests/process/test_hostile.py."""

from __future__ import annotations

from typing import Any

from agent_server import Agent, ExecutionContext, Schedule

agent = Agent("hostile")


class Unprintable(Exception):
    """An exception whose message cannot be taken: `str()` and `repr()` both raise."""

    def __str__(self) -> str:
        raise RuntimeError("no text for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


class NotText(Exception):
    """`str()` answers something that is not a string."""

    def __str__(self) -> str:
        return 42  # type: ignore[return-value]


@agent.reasoner()
async def unprintable(kind: str = "raises") -> None:
    if kind == "raises":
        raise Unprintable()
    if kind == "not-text":
        raise NotText()
    raise ValueError("x" * 100_000)  # a message too long to keep whole


@agent.reasoner()
async def huge(digits: int = 6000, nested: int = 0, value: str = "int") -> Any:
    """Untyped results the JSON codec cannot read back: an integer past the parser's digit
    limit, nesting past the limit, or NaN/infinity (which pydantic would make null)."""
    result: Any = 10**digits if value == "int" else float(value)
    for _ in range(nested):
        result = [result]
    return {"result": result}


@agent.reasoner()
async def bad_event(ctx: ExecutionContext, value: str = "nan") -> str:
    await ctx.emit({"x": float(value)})
    return "emitted"


@agent.reasoner(resumable=True, max_attempts=2)
async def bad_checkpoint(ctx: ExecutionContext, value: str = "inf") -> str:
    await ctx.checkpoint({"x": [float(value)]})
    return "checkpointed"


@agent.reasoner(resumable=True, max_attempts=2)
async def keep(anything: Any = None) -> str:
    """A resumable reasoner that takes any body (kept in the store for a later attempt)."""
    return "kept"


@agent.reasoner()
async def slow(ctx: ExecutionContext, seconds: float = 30.0) -> str:
    """Emits once, then runs a while: a stream on another replica waits on it."""
    import asyncio

    await ctx.emit({"began": True})
    await asyncio.sleep(seconds)
    return "slept"


@agent.reasoner(schedules=[Schedule("0 0 1 1 *", input={"note": "new year"})])
async def yearly(note: str = "") -> str:
    """Declared with a schedule that fires once a year (never during a test): `/schedules`
    refuses to delete it or to change more than `enabled`."""
    return note
