"""uvicorn's own cost for a held request: a bare ASGI app that answers a response head and
then holds the request open, served by uvicorn with its own httptools protocol on the same
loop (uvloop). What one held connection costs here is what uvicorn costs before any
application code; agent-server's protocol trims some of it (bench/events.py item 2's
reference)."""

from __future__ import annotations

from typing import Any


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    if scope["path"] == "/readyz":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream")],
        }
    )
    while (await receive())["type"] != "http.disconnect":
        pass
