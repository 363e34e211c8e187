"""A request the server cancels (uvicorn's --timeout-graceful-shutdown) under `Agent.__call__`
still ends as a whole HTTP answer: a 503 if it had not begun, else the end of its body."""

from __future__ import annotations

import contextlib
import logging

from starlette.types import Message, Scope, Send

from agent_server.http.routing import RETRY_AFTER_SECONDS
from agent_server.model import jsoncodec

logger = logging.getLogger("agent_server.agent")

#: What a request cut off before its answer began is told.
CUT_OFF_BODY = jsoncodec.dumps({"detail": "server is shutting down"})


class Answer:
    """The `send` of one request under `Agent.__call__`: notes how far the answer got, so a
    request the server cancels still ends as a whole HTTP answer."""

    __slots__ = ("ended", "send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.ended = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.ended = True
        await self.send(message)

    async def cut_off(self, scope: Scope) -> None:
        """End the answer of a request the server cancelled: a 503 (retry elsewhere) if it
        had not begun, else the end of its body (an event stream ends; its client resumes)."""
        if self.ended:
            return
        method, path = scope["method"], scope["path"]
        if not self.started:
            logger.warning(
                "%s %s cancelled by the server before it was answered (its shutdown stopped "
                "waiting for open requests): answered 503",
                method,
                path,
            )
            await self.send(
                {
                    "type": "http.response.start",
                    "status": 503,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", b"%d" % len(CUT_OFF_BODY)),
                        (b"retry-after", RETRY_AFTER_SECONDS.encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await self.send({"type": "http.response.body", "body": CUT_OFF_BODY})
            return
        logger.warning(
            "%s %s cancelled by the server while answering (its shutdown stopped waiting for "
            "open requests): answer ended",
            method,
            path,
        )
        with contextlib.suppress(RuntimeError):  # a body shorter than its Content-Length
            await self.send({"type": "http.response.body", "body": b"", "more_body": False})
