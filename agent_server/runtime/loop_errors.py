"""The event loop's exception handler: errors nobody observed become one log line of ours.

The registry observes every execution it owns. A reasoner can still start tasks of its own
and drop them: when such a task raises and is garbage-collected, or is collected while still
pending, asyncio's default handler prints an unstructured message with no execution in
sight. This handler logs it through our logging instead (text or JSON, like every other
line), naming the task and its coroutine, so log pipelines and alerts see it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger("agent_server.loop")


def _describe(source: object) -> str:
    """The task's name and coroutine, or the callback's repr: what points at the culprit."""
    if isinstance(source, asyncio.Task):
        coro = source.get_coro()
        qualname = getattr(coro, "__qualname__", type(coro).__name__)
        return f"task {source.get_name()!r} ({qualname})"
    if source is None:
        return "the event loop"
    text = repr(source)
    return text if len(text) <= 200 else text[:200] + "..."


def log_loop_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """Log an error the loop found nobody to hand to (set with `loop.set_exception_handler`)."""
    exception = context.get("exception")
    source = context.get("task") or context.get("future") or context.get("handle")
    where = _describe(source)
    if isinstance(exception, BaseException):
        logger.error(
            "unobserved task error in %s: %s: %s",
            where,
            type(exception).__name__,
            exception,
            exc_info=exception,
        )
    elif isinstance(source, asyncio.Future) and not source.done():
        logger.error(
            "unobserved task error in %s: garbage-collected while still pending "
            "(nothing referenced it, so it never ran to its end)",
            where,
        )
    else:
        logger.error("unobserved task error in %s: %s", where, context.get("message", "unknown"))


def install_loop_error_handler() -> None:
    """Install the handler on the running loop unless the application installed its own."""
    loop = asyncio.get_running_loop()
    if loop.get_exception_handler() is None:
        loop.set_exception_handler(log_loop_error)
