"""The app of tests/process/test_conventions.py: an Agent with the user's own routes, middleware and
lifespan (`conventions_app:agent`), and the same agent mounted under `/agent` in a Starlette
app (`conventions_app:mounted`), or mounted without running its lifespan
(`conventions_app:mounted_alone`). cwd: tests/apps/.

The lifespan writes `lifespan.json` to TESTS_MARKER_DIR when it exits: whether the shutdown
report came first, and the records of the executions `tracked` ran, read from the store
then (so a test sees how they ended after the process has gone).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from tests_app import sleep

from agent_server import Agent, ExecutionContext

#: The execution ids `tracked` ran, in order.
TRACKED: list[str] = []


def _marker(name: str) -> Path | None:
    folder = os.environ.get("TESTS_MARKER_DIR")
    return Path(folder, name) if folder else None


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
    """The user's own client would be opened here; `greeting` stands for it.
    CONVENTIONS_FAIL=enter or =exit makes it raise there."""
    fail = os.environ.get("CONVENTIONS_FAIL")
    if fail == "enter":
        raise RuntimeError("the user's client cannot connect")
    entered = _marker("lifespan-entered")
    if entered is not None:
        entered.touch()
    yield {"greeting": "hello from the lifespan"}
    if fail == "exit":
        raise RuntimeError("the user's client failed to close")
    records = []
    for execution_id in TRACKED:
        execution = await agent.store.get(execution_id)
        records.append(None if execution is None else execution.to_json())
    exited = _marker("lifespan.json")
    if exited is not None:
        report = agent.shutdown.report
        summary = {"report_logged_before": report is not None, "executions": records}
        exited.write_text(json.dumps(summary))


async def hello(request: Request) -> Response:
    return JSONResponse({"greeting": request.state.greeting})


async def boom(request: Request) -> Response:
    raise RuntimeError("the user's route failed")


class Stamp:
    """The user's middleware: stamps every answer, the API's and the user's routes'."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-stamp", b"user")]
            await send(message)

        await self.app(scope, receive, stamped)


agent = Agent(
    "conventions",
    routes=[Route("/hello", hello), Route("/boom", boom, methods=["POST"])],
    middleware=[Middleware(Stamp)],
    lifespan=lifespan,
)
agent.reasoner()(sleep)


@agent.reasoner()
async def tracked(ctx: ExecutionContext, seconds: float = 600.0) -> str:
    """Sleeps; its id is kept so the lifespan's exit can report how it ended."""
    TRACKED.append(ctx.execution_id)
    marker = _marker("tracked")
    if marker is not None:
        marker.touch()
    await asyncio.sleep(seconds)
    return "slept"


#: The agent under a prefix, its lifespan run by the app it is mounted in.
mounted = Starlette(routes=[Mount("/agent", agent)], lifespan=agent.lifespan)
#: The same, without running the agent's lifespan (what Starlette does for a bare mount).
mounted_alone = Starlette(routes=[Mount("/agent", agent)])
