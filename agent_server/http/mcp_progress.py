"""An execution's live events as MCP progress notifications (docs/protocols.md, "Events"):
a `tools/call` that carries a `progressToken` in its `_meta` gets, on its stream, one
`notifications/progress` per event of its execution before its answer: `progress` the
event's number (1, 2, 3...: a gap is events no longer kept), `message` the event's data as
JSON text (a string's own text for a string), and the event's name in `_meta`.

The events are read as SSE reads them (`event_feed.py`); every event the execution wrote
before its end (or its ask) is sent before the call's answer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

from mcp.server.context import ServerRequestContext
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params

from agent_server.http.event_feed import EventFeed, relay
from agent_server.http.mcp_requests import notify
from agent_server.model import jsoncodec
from agent_server.model.events import Event
from agent_server.store.base import ExecutionStore

T = TypeVar("T")

logger = logging.getLogger("agent_server.mcp")

#: The `_meta` key naming the event a progress notification carries.
EVENT_META = "io.agent-server/event"
#: The `_meta` key giving the event's number, where `progress` is a count (a listen).
EVENT_ID_META = "io.agent-server/eventId"
#: The `_meta` key naming the task a notification is about (MCP 2025-11-25's).
RELATED_TASK = "io.modelcontextprotocol/related-task"


def progress_token(ctx: ServerRequestContext[Any]) -> str | int | None:
    """The request's `_meta.progressToken` (a string or an integer), if it gave one."""
    return progress_token_from_params(ctx.params)


def progress_params(token: str | int, event: Event) -> dict[str, Any]:
    """`notifications/progress` params for one event."""
    value = jsoncodec.loads(event.data.encode("utf-8", "surrogatepass"))
    message = value if isinstance(value, str) else event.data
    return {
        "progressToken": token,
        "progress": event.id,
        "message": message,
        "_meta": {EVENT_META: event.event},
    }


async def with_progress(
    ctx: ServerRequestContext[Any],
    token: str | int,
    feed: EventFeed,
    work: Awaitable[T],
) -> T:
    """`work`'s outcome (the call following its execution), the execution's events sent as
    progress while it runs and, once it is done, the rest of them (those written before the
    end it came to). When `work` fails (the client left, or worse), the relay stops with it."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    async def deliver(events: list[Event]) -> None:
        for event in events:
            await notify(ctx, "notifications/progress", progress_params(token, event))

    pump = asyncio.ensure_future(relay(feed, deliver, done))
    try:
        outcome = await work
    except BaseException:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        raise
    done.set_result(None)
    try:
        await pump
    except Exception as exc:  # the events could not be read (a store down): the answer stands
        logger.warning("progress of a tools/call stopped: %s", type(exc).__name__)
    except BaseException:
        pump.cancel()
        await asyncio.gather(pump, return_exceptions=True)
        raise
    return outcome


class Count:
    """The progress of one listen: notifications sent on it so far (one token, several
    tasks: the count rises with each, as progress must)."""

    __slots__ = ("sent",)

    def __init__(self) -> None:
        self.sent = 0


async def task_progress(
    ctx: ServerRequestContext[Any],
    token: str | int,
    feed: EventFeed,
    store: ExecutionStore,
    count: Count,
) -> None:
    """A listened task's events as progress on the listen's stream until the task ends (its
    kept events first): `progress` the listen's count, the task in `_meta` under
    RELATED_TASK, the event's name and number beside it."""
    task_id = feed.execution.execution_id
    ended = asyncio.ensure_future(store.wait(feed.execution, None))

    async def deliver(events: list[Event]) -> None:
        for event in events:
            count.sent += 1
            params = progress_params(token, event)
            params["progress"] = count.sent
            params["_meta"] |= {RELATED_TASK: {"taskId": task_id}, EVENT_ID_META: event.id}
            await notify(ctx, "notifications/progress", params)

    try:
        await relay(feed, deliver, ended)
    finally:
        ended.cancel()
        await asyncio.gather(ended, return_exceptions=True)
