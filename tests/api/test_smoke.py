"""The smallest end-to-end checks: in-process and a real process with a real SIGTERM."""

from __future__ import annotations

import signal

import httpx


async def test_echo_in_process(app_client: httpx.AsyncClient) -> None:
    response = await app_client.post("/reasoners/echo", json={"text": "hi"})
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "succeeded"
    assert body["result"] == {"text": "hi"}


def test_idle_process_exits_on_sigterm(server_factory) -> None:  # type: ignore[no-untyped-def]
    server = server_factory("tests_app:agent")
    assert httpx.post(f"{server.url}/reasoners/echo", json={"text": "x"}).status_code == 200
    server.signal(signal.SIGTERM)
    code, elapsed = server.wait_exit(timeout=10)
    assert elapsed < 5, server.stderr()
    assert code == 0, server.stderr()
    assert "shutdown report" in server.stderr()
