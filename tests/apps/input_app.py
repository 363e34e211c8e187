"""Reasoners that wait for input (`ctx.ask`), for tests/api/test_input.py and
tests/process/test_input.py."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated, Any

from pydantic import BaseModel, StringConstraints

from agent_server import Agent, ExecutionContext, InputTimeout, RetryPolicy, Settings

#: An ordinary e-mail pattern that Python's `re` matches in exponential time on a long run
#: of letters that does not end like an address.
EMAIL_PATTERN = (
    r"^([a-zA-Z0-9])(([\-.]|[_]+)?([a-zA-Z0-9]+))*(@){1}[a-z0-9]+[.]{1}"
    r"(([a-z]{2,3})|([a-z]{2,3}[.]{1}[a-z]{2,3}))$"
)
Email = Annotated[str, StringConstraints(pattern=EMAIL_PATTERN)]


class Approval(BaseModel):
    approved: bool
    note: str = ""


async def approve(ctx: ExecutionContext, amount: int = 100) -> dict[str, Any]:
    """One approval step: the answer must be an Approval."""
    answer = await ctx.ask({"question": f"approve {amount}?"}, schema=Approval)
    return {"approved": answer.approved, "note": answer.note, "amount": amount}


async def twice(ctx: ExecutionContext) -> list[Any]:
    """Two requests in a row, any JSON each."""
    first = await ctx.ask("first?")
    second = await ctx.ask({"after": first})
    return [first, second]


async def impatient(ctx: ExecutionContext, timeout: float = 0.2) -> dict[str, Any]:
    """Asks with a timeout and says how the wait ended."""
    try:
        answer = await ctx.ask("quick?", schema=int, timeout=timeout)
    except InputTimeout as exc:
        return {"timed_out": True, "request_id": exc.request_id}
    return {"timed_out": False, "answer": answer}


async def guarded(ctx: ExecutionContext) -> str:
    """Asks, and records a cancellation while waiting by its event."""
    try:
        await ctx.ask("never answered")
    except asyncio.CancelledError:
        await ctx.emit({"cancelled": True}, event="note")
        raise
    return "answered"


async def asked_once(ctx: ExecutionContext, hold_attempt: int = 2) -> dict[str, Any]:
    """Resumable: asks (parked with a shared store: its answer resumes attempt 2, which
    replays it); attempt `hold_attempt` then waits until the drain cancels it (handed off),
    and the next attempt asks the same request again."""
    answer = await ctx.ask("go?")
    if ctx.attempt == hold_attempt:
        await ctx.emit({"answer": answer}, event="got")
        await ctx.wait_for_drain()
        await asyncio.Event().wait()  # until the drain deadline cancels it
    return {"answer": answer, "attempt": ctx.attempt}


async def approve_later(ctx: ExecutionContext, amount: int = 100) -> dict[str, Any]:
    """Resumable `approve`: with a shared store it is parked while it waits."""
    answer = await ctx.ask({"question": f"approve {amount}?"}, schema=Approval)
    return {"approved": answer.approved, "amount": amount, "attempt": ctx.attempt}


async def stepwise(ctx: ExecutionContext) -> dict[str, Any]:
    """Resumable, two requests with a checkpoint between them: a later attempt resumes past
    the first (its answer is in the checkpoint) and replays only the second."""
    state = ctx.checkpoint_state or {}
    if "first" not in state:
        first = await ctx.ask("first?", schema=int)
        state = {"first": first}
        await ctx.checkpoint(state)
    second = await ctx.ask({"after": state["first"]}, schema=int)
    return {"first": state["first"], "second": second, "attempt": ctx.attempt}


async def patient(ctx: ExecutionContext, timeout: float = 1.0) -> dict[str, Any]:
    """Resumable `impatient`: a parked request that expires is resumed to raise."""
    try:
        answer = await ctx.ask("quick?", schema=int, timeout=timeout)
    except InputTimeout as exc:
        return {"timed_out": True, "request_id": exc.request_id, "attempt": ctx.attempt}
    return {"timed_out": False, "answer": answer}


async def asks_at_drain(ctx: ExecutionContext) -> Any:
    """Resumable: once its first replica drains, asks (parked with a shared store); the
    attempt its answer resumes asks again, and gets the answer at once."""
    if ctx.attempt == 1:
        await ctx.wait_for_drain()
    return await ctx.ask("still there?")


async def asks_when_told(ctx: ExecutionContext) -> Any:
    """Resumable: says `ready`, and asks once the test pushes to `go:{id}` in the Redis named by
    INPUT_APP_REDIS (a list it pops: a reader can attach while its task still runs)."""
    import redis.asyncio as aioredis

    if ctx.attempt == 1:
        client = aioredis.Redis.from_url(os.environ["INPUT_APP_REDIS"])
        try:
            await ctx.emit({}, event="ready")
            await client.blpop([f"go:{ctx.execution_id}"], timeout=60)
        finally:
            await client.aclose()
    return await ctx.ask("now?")


async def from_top(ctx: ExecutionContext) -> dict[str, Any]:
    """Resumable, two requests with a checkpoint between them, asked again from the top on
    resume (it does not skip what its checkpoint keeps): each ask must get its own answer."""
    first = await ctx.ask("first?")
    await ctx.checkpoint({"first": first})
    second = await ctx.ask({"second": "?"})
    return {"first": first, "second": second, "attempt": ctx.attempt}


async def changing(ctx: ExecutionContext) -> Any:
    """Resumable: its question is INPUT_APP_QUESTION's (a rollout that changes the code
    between attempts)."""
    return await ctx.ask({"question": os.environ.get("INPUT_APP_QUESTION", "old")})


async def keyed(ctx: ExecutionContext, key: str | None = "approval") -> dict[str, Any]:
    """Resumable: a prompt that changes with each attempt, named by `key` (None: by its
    prompt, so a later attempt asks another question)."""
    answer = await ctx.ask({"question": "approve?", "attempt": ctx.attempt}, key=key)
    return {"answer": answer, "attempt": ctx.attempt}


async def chat(ctx: ExecutionContext, turns: int = 3) -> dict[str, Any]:
    """Resumable: asks the same prompt each turn and checkpoints each turn (the turns seen,
    not the answers): a chat loop."""
    state = ctx.checkpoint_state or {"turn": 0, "sizes": []}
    while state["turn"] < turns:
        said = await ctx.ask("next?", schema=str)
        state = {"turn": state["turn"] + 1, "sizes": [*state["sizes"], len(said)]}
        await ctx.checkpoint(state)
    return state


async def email(ctx: ExecutionContext) -> str:
    """Resumable: asks for an address (parked with a shared store: any replica checks the
    answer against the JSON schema's pattern)."""
    return str(await ctx.ask("your e-mail?", schema=Email))


async def email_held(ctx: ExecutionContext) -> str:
    """`email`, waiting in its task on its owner."""
    return str(await ctx.ask("your e-mail?", schema=Email))


class Flaky(Exception):
    """The first attempt of `retried` fails with it."""


async def retried(ctx: ExecutionContext, change: bool = False) -> dict[str, Any]:
    """Asks, then fails its first attempt; the retry asks again: the same question (its
    kept answer, at once) or, with `change`, another (AskMismatch)."""
    question = "again?" if change and ctx.attempt > 1 else "first?"
    answer = await ctx.ask(question)
    if ctx.attempt == 1:
        raise Flaky("the first attempt fails after its answer")
    return {"answer": answer, "attempt": ctx.attempt}


async def keyed_retry(ctx: ExecutionContext, key: str | None = None) -> dict[str, Any]:
    """`retried` whose prompt names the attempt: the same question only when `key` names it."""
    answer = await ctx.ask({"question": "approve?", "attempt": ctx.attempt}, key=key)
    if ctx.attempt == 1:
        raise Flaky("the first attempt fails after its answer")
    return {"answer": answer, "attempt": ctx.attempt}


def make_agent(settings: Settings | None = None) -> Agent:
    """A fresh agent with these reasoners (each in-process test gets its own)."""
    fresh = Agent("input-tests", settings)
    for reasoner in (approve, twice, impatient, guarded, email_held):
        fresh.reasoner()(reasoner)
    for flaky in (retried, keyed_retry):
        fresh.reasoner(retry=RetryPolicy(max_attempts=3, initial_delay=0.05, retry_on=(Flaky,)))(
            flaky
        )
    for resumable in (
        asked_once,
        approve_later,
        stepwise,
        patient,
        asks_at_drain,
        asks_when_told,
        from_top,
        changing,
        keyed,
        chat,
        email,
    ):
        fresh.reasoner(resumable=True)(resumable)
    return fresh


agent = make_agent()
