"""`DELETE /sessions/{id}` without `?timeout=`: the documented default bounds the wait (a
reasoner that swallows its cancellation is abandoned then), it is not a wait without end."""

from __future__ import annotations

import asyncio
import re

import httpx
import pytest

from agent_server.http import sessions


async def _running(client: httpx.AsyncClient) -> float:
    text = (await client.get("/metrics")).text
    return sum(
        float(v) for v in re.findall(r"^agent_server_executions_inflight\{.*\} (\S+)$", text, re.M)
    )


async def test_a_release_without_a_timeout_gives_up_at_the_default(
    app_client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions, "RELEASE_TIMEOUT", 0.3, raising=False)
    started = await app_client.post(
        "/reasoners/swallow/async", json={"seconds": 1.5}, headers={"X-Session-ID": "default"}
    )
    assert started.status_code == 202, started.text
    async with asyncio.timeout(10):
        released = await app_client.delete("/sessions/default")
    assert released.status_code == 200, released.text
    # Given up at the default: the reasoner still runs, abandoned (it ends at 1.5 s).
    assert released.json()["abandoned"] == 1, released.json()
    assert released.json()["elapsed_seconds"] < 1.5
    for _ in range(200):  # its task ends before the test's loop closes (10 s at most)
        if not await _running(app_client):
            break
        await asyncio.sleep(0.05)
    assert not await _running(app_client)
