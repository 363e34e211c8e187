"""The user's own routes, middleware and lifespan beside the reasoners, the Agent mounted
under a prefix, and plain uvicorn's cut-off at its --timeout-graceful-shutdown: on real
processes (`agent-server run` and `python -m uvicorn`) with real signals.

`conventions_app`'s lifespan writes `lifespan.json` as it exits, after the shutdown
sequence: whether the report came first, and how its `tracked` executions ended.
"""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.served import Served, Start, launcher, run_command
from tests.support.shutdown import (
    BUDGET,
    CLIENT_TIMEOUT,
    FAST,
    finish,
    shutdown_report,
    start_async,
    wait_until,
)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    yield from launcher(tmp_path)


def uvicorn_command(app: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "uvicorn", app, "--port", "0", *args]


#: The same app under both servers: `agent-server run` drives the shutdown from the signal;
#: under plain uvicorn the agent's lifespan runs it.
SERVERS = {
    "agent-server-run": (run_command("conventions_app:agent", "--port", "0", *FAST), {}),
    "plain-uvicorn": (uvicorn_command("conventions_app:agent"), BUDGET),
}


def lifespan_exit(server: Served) -> dict[str, Any]:
    summary: dict[str, Any] = json.loads((server.marker_dir / "lifespan.json").read_text())
    return summary


@pytest.mark.parametrize("served_by", list(SERVERS))
def test_own_routes_middleware_and_lifespan(start: Start, served_by: str) -> None:
    command, env = SERVERS[served_by]
    server = start(command, env=env)
    # Entered before the first request: readiness was answered, so it has run.
    assert (server.marker_dir / "lifespan-entered").exists()
    with server.client() as client:
        hello = client.get("/hello")
        assert hello.status_code == 200
        assert hello.json() == {"greeting": "hello from the lifespan"}  # its state
        assert hello.headers["x-stamp"] == "user"
        assert client.get("/reasoners").headers["x-stamp"] == "user"  # the API's too
        boom = client.post("/boom")
        assert boom.status_code == 500
        assert boom.json() == {"detail": "internal server error"}
        assert client.get("/nowhere").json() == {"detail": "Not Found"}  # still JSON
        assert client.get("/hello").status_code == 200  # the server goes on
    assert "the user's route failed" in server.stderr()  # the operator sees it
    start_async(server, "tracked", {"seconds": 600})
    server.wait_marker("tracked")
    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == (0 if served_by == "agent-server-run" else -signal.SIGTERM), server.stderr()
    assert shutdown_report(server)["cancelled"] == 1
    summary = lifespan_exit(server)
    # Exited after the shutdown sequence: the report was out, the execution had ended.
    assert summary["report_logged_before"] is True
    [record] = summary["executions"]
    assert (record["status"], record["status_reason"]) == ("cancelled", "shutdown")


@pytest.mark.parametrize("served_by", list(SERVERS))
def test_a_lifespan_that_raises(start: Start, served_by: str) -> None:
    """On entry: the start fails (exit 1 under `agent-server run`, uvicorn's 3 under plain
    uvicorn), the user's error in the log. On exit: logged, and the shutdown ends as usual."""
    command, env = SERVERS[served_by]
    failed = start(command, env={**env, "CONVENTIONS_FAIL": "enter"}, ready=False)
    code, _ = finish(failed, timeout=15)
    assert code == (1 if served_by == "agent-server-run" else 3), failed.stderr()
    assert "the user's client cannot connect" in failed.stderr()
    server = start(command, env={**env, "CONVENTIONS_FAIL": "exit"})
    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == (0 if served_by == "agent-server-run" else -signal.SIGTERM), server.stderr()
    text = server.stderr()
    assert "the lifespan of agent 'conventions' raised on exit" in text, text
    assert "the user's client failed to close" in text  # with its traceback
    assert shutdown_report(server)["exit_code"] == 0


def test_a_websocket_route_is_refused_when_the_agent_is_made() -> None:
    from starlette.routing import WebSocketRoute

    from agent_server import Agent

    async def chat(websocket: Any) -> None:  # pragma: no cover - never served
        pass

    with pytest.raises(ValueError, match="WebSocket route"):
        Agent("ws", routes=[WebSocketRoute("/chat", chat)])


def test_a_mounted_agent_hands_out_paths_under_its_prefix_and_reports(start: Start) -> None:
    server = start(uvicorn_command("conventions_app:mounted"), env=BUDGET, ready=False)
    server.port  # noqa: B018 - listening
    with server.client() as client:
        assert client.get("/agent/readyz").status_code == 200
        started = client.post("/agent/reasoners/tracked/async", json={"seconds": 600})
        assert started.status_code == 202, started.text
        execution_id = started.json()["execution_id"]
        location = started.headers["location"]
        assert location == f"/agent/executions/{execution_id}"
        assert client.get(location).json()["status"] == "running"  # it leads there
        assert client.get("/agent/hello").json()["greeting"] == "hello from the lifespan"
        assert client.get("/agent/openapi.json").json()["servers"] == [{"url": "/agent"}]
        docs = client.get("/agent/docs").text  # its links are relative: under the prefix
        assert 'src="docs/swagger-ui-bundle.js"' in docs
        assert client.get("/agent/docs/swagger-ui-bundle.js").status_code == 200
    server.signal()
    code, _ = finish(server, timeout=15)
    assert code == -signal.SIGTERM, server.stderr()
    assert shutdown_report(server)["cancelled"] == 1
    assert lifespan_exit(server)["report_logged_before"] is True


def test_a_bare_mount_says_the_lifespan_did_not_run(start: Start) -> None:
    """Starlette runs no mounted app's lifespan: the agent says so, once, on its first
    request, and how to give it one."""
    server = start(uvicorn_command("conventions_app:mounted_alone"), env=BUDGET, ready=False)
    server.port  # noqa: B018 - listening
    with server.client() as client:
        for _ in range(2):
            assert client.get("/agent/healthz").status_code == 200
    server.signal()
    finish(server, timeout=15)
    text = server.stderr()
    assert text.count("its lifespan has not run") == 1, text
    assert "lifespan=agent.lifespan" in text


def test_plain_uvicorn_cuts_open_requests_without_tracebacks(start: Start) -> None:
    """At its --timeout-graceful-shutdown uvicorn cancels the requests still open: a
    synchronous run (its client is cut off, so the run is cancelled as
    client_disconnected) and an event stream each end with one line and a whole HTTP
    answer, not with a CancelledError traceback each."""
    server = start(
        uvicorn_command("conventions_app:agent", "--timeout-graceful-shutdown", "1"), env=BUDGET
    )
    background = start_async(server, "sleep", {"seconds": 600, "marker": "held"})
    server.wait_marker("held")
    with ThreadPoolExecutor(2) as pool, server.client() as client:
        sync = pool.submit(client.post, "/reasoners/tracked", json={"seconds": 600})
        server.wait_marker("tracked")

        def stream() -> int:
            with client.stream(
                "GET", f"/executions/{background}/events", headers={"Accept": "text/event-stream"}
            ) as events:
                for _ in events.iter_bytes():  # an incomplete chunked end would raise
                    pass
                return events.status_code

        events = pool.submit(stream)
        wait_until(lambda: streams_open(client) == 1, "the stream open", server, CLIENT_TIMEOUT)
        server.signal()
        answer = sync.result(timeout=CLIENT_TIMEOUT)
        assert answer.status_code == 503, answer.text
        assert answer.json() == {"detail": "server is shutting down"}
        assert answer.headers["retry-after"] == "1"
        assert events.result(timeout=CLIENT_TIMEOUT) == 200
    code, _ = finish(server, timeout=15)
    assert code == -signal.SIGTERM, server.stderr()
    text = server.stderr()
    assert "Traceback" not in text and "CancelledError" not in text, text
    assert text.count("cancelled by the server") == 2, text
    [record] = lifespan_exit(server)["executions"]
    assert (record["status"], record["status_reason"]) == ("cancelled", "client_disconnected")


def streams_open(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("agent_server_event_streams_open "):
            return float(line.split()[1])
    raise AssertionError("no agent_server_event_streams_open in /metrics")


def test_a_client_that_goes_away_cancels_its_run_under_plain_uvicorn(start: Start) -> None:
    """Under plain uvicorn as under `agent-server run`: a synchronous run whose client goes
    away is cancelled as client_disconnected."""
    server = start(uvicorn_command("conventions_app:agent"), env=BUDGET)
    with server.client() as client:
        with pytest.raises(httpx.ReadTimeout):
            client.post("/reasoners/tracked", json={"seconds": 600}, timeout=1.0)
        server.wait_marker("tracked")
    server.signal()
    finish(server, timeout=15)
    [record] = lifespan_exit(server)["executions"]
    assert (record["status"], record["status_reason"]) == ("cancelled", "client_disconnected")
