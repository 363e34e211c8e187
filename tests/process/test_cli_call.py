"""`agent-server call` end to end: a real server, the real command, its output and exit
codes (0 succeeded, 1 failed, 2 invalid, 3 cancelled, 4 lost, 5 unreachable, 6 refused,
7 timeout)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.process import ServerProcess, one_line

WAIT = 20.0
Start = Callable[..., ServerProcess]


@pytest.fixture
def server(server_factory: Start) -> ServerProcess:
    return server_factory("tests_app:agent")


def call(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_API_TOKEN")
    }
    return subprocess.run(
        [sys.executable, "-m", "agent_server", "call", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={**environment, **(env or {})},
    )


def test_succeeded_prints_the_execution_and_exits_0(server: ServerProcess) -> None:
    result = call("echo", '{"text": "hi"}', "--url", server.url, "--session", "cli-s")
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert (body["status"], body["result"], body["session_id"]) == (
        "succeeded",
        {"text": "hi"},
        "cli-s",
    )
    assert result.stderr == ""


def test_the_url_comes_from_the_environment(server: ServerProcess) -> None:
    result = call("no_params", env={"AGENT_SERVER_URL": server.url})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["result"] == "ok"


def test_failed_exits_1_with_the_execution_and_one_line(server: ServerProcess) -> None:
    result = call("fail", '{"message": "broken"}', "--url", server.url)
    assert result.returncode == 1
    body = json.loads(result.stdout)
    assert body["error"] == {"type": "ValueError", "message": "broken"}
    assert "ValueError: broken" in one_line(result.stderr)


@pytest.mark.parametrize(
    "args",
    [
        ("echo", "{not json"),  # not JSON: refused before any request
        ("echo", '{"text": 1}'),  # 422 from the server
        ("echo", "--async", "--stream"),  # usage
    ],
)
def test_invalid_input_exits_2(server: ServerProcess, args: tuple[str, ...]) -> None:
    result = call(*args, "--url", server.url)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.strip()


def test_cancelled_exits_3(server: ServerProcess) -> None:
    running = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agent_server",
            "call",
            "sleep",
            '{"seconds": 30, "marker": "cli-sleep"}',
            "--session",
            "cli-doomed",
            "--url",
            server.url,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        server.wait_marker("cli-sleep")
        released = httpx.delete(f"{server.url}/sessions/cli-doomed", timeout=WAIT)
        assert released.json()["cancelled"] == 1
        stdout, stderr = running.communicate(timeout=WAIT)
    finally:
        running.kill()
    assert running.returncode == 3
    assert json.loads(stdout)["status_reason"] == "session_released"
    assert "session_released" in one_line(stderr)


def test_unreachable_exits_5() -> None:
    result = call("echo", "--url", "http://127.0.0.1:9", "--retry-for", "0.3")
    assert result.returncode == 5
    assert "ConnectError" in one_line(result.stderr)


def test_unknown_reasoner_and_unauthorized_exit_6(server_factory: Start, tmp_path: Path) -> None:
    secured = server_factory("tests_app:agent", "--api-token", "cli-token")
    unauthorized = call("echo", '{"text": "x"}', "--url", secured.url)
    assert unauthorized.returncode == 6
    assert "401" in one_line(unauthorized.stderr)

    token_file = tmp_path / "token"
    token_file.write_text("cli-token\n")
    with_file = call("echo", '{"text": "x"}', "--url", secured.url, "--token-file", str(token_file))
    assert with_file.returncode == 0, with_file.stderr
    with_env = call(
        "echo", '{"text": "y"}', "--url", secured.url, env={"AGENT_SERVER_API_TOKEN": "cli-token"}
    )
    assert with_env.returncode == 0, with_env.stderr

    unknown = call("nope", "--url", secured.url, "--token-file", str(token_file))
    assert unknown.returncode == 6
    assert "404" in one_line(unknown.stderr)


def test_timeout_exits_7(server: ServerProcess) -> None:
    result = call("sleep", '{"seconds": 30}', "--url", server.url, "--timeout", "0.5")
    assert result.returncode == 7
    assert "0.5 s" in one_line(result.stderr)


def test_async_prints_the_started_execution(server: ServerProcess) -> None:
    result = call("sleep", '{"seconds": 0.2}', "--async", "--url", server.url)
    assert result.returncode == 0, result.stderr
    started = json.loads(result.stdout)
    assert started["status"] in ("queued", "running")
    ended = httpx.get(
        f"{server.url}/executions/{started['execution_id']}", params={"wait": 5}, timeout=WAIT
    ).json()
    assert ended["status"] == "succeeded"


def test_stream_prints_one_json_line_per_event(server: ServerProcess) -> None:
    result = call("chatter", '{"count": 3}', "--stream", "--url", server.url)
    assert result.returncode == 0, result.stderr
    lines: list[dict[str, Any]] = [json.loads(line) for line in result.stdout.splitlines()]
    progress = [line for line in lines if line["event"] == "progress"]
    assert [(line["id"], line["data"]) for line in progress] == [
        (1, {"n": 0}),
        (2, {"n": 1}),
        (3, {"n": 2}),
    ]
    assert lines[-1]["event"] == "end"
    assert lines[-1]["data"]["result"] == {"emitted": 3}

    failing = call("chatter", '{"count": 3, "fail_at": 1}', "--stream", "--url", server.url)
    assert failing.returncode == 1
    assert json.loads(failing.stdout.splitlines()[-1])["data"]["status"] == "failed"
    assert "RuntimeError" in one_line(failing.stderr)


def test_help_names_the_exit_codes() -> None:
    result = call("--help")
    assert result.returncode == 0
    for line in ("0  succeeded", "1  failed", "3  cancelled", "4  lost", "5  unreachable"):
        assert line in result.stdout, line


@pytest.mark.redis
def test_lost_exits_4(tmp_path: Path, redis_url: str, redis_server: Any) -> None:
    """A run whose replica is killed: the call finds its execution again through another
    replica (same Idempotency-Key) and follows it until it reads lost."""
    from tests.support.cluster import Cluster

    cluster = Cluster(tmp_path, redis_server, ["--grace-period", "8"])
    try:
        running = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agent_server",
                "call",
                "sleep",
                '{"seconds": 60, "marker": "cli-lost"}',
                "--url",
                cluster.proxy.url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            owner = _wait_for_marker(cluster.replicas, "cli-lost")[0]
            owner.signal(signal.SIGKILL)
            stdout, stderr = running.communicate(timeout=WAIT)
        finally:
            running.kill()
    finally:
        cluster.close()
    assert running.returncode == 4, stderr
    body = json.loads(stdout)
    assert (body["status"], body["replica"]) == ("lost", owner.replica_id)
    assert "lost" in one_line(stderr)


def _wait_for_marker(replicas: list[Any], name: str) -> list[Any]:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        found = [replica for replica in replicas if (replica.marker_dir / name).exists()]
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"marker {name} never appeared")


@pytest.mark.parametrize("text", ['{"text": NaN}', '{"text": Infinity}', "[" * 300 + "]" * 300])
def test_input_the_server_would_refuse_exits_2_before_any_request(text: str) -> None:
    """Strict JSON, as the server reads it: `NaN` is no JSON, and nesting past the limit
    could not be written back; the CLI says so (exit 2), no traceback."""
    result = call("echo", text, "--url", "http://127.0.0.1:1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("agent-server: JSON input"), result.stderr
    assert "Traceback" not in result.stderr


def test_stream_timeout_bounds_the_whole_stream_and_exits_7(server: ServerProcess) -> None:
    """`--stream --timeout 1` against a run of 4 s: the stream ends at the timeout (exit 7,
    one line naming it), and the execution goes on to its end."""
    result = call("sleep", '{"seconds": 4}', "--stream", "--timeout", "1", "--url", server.url)
    assert result.returncode == 7, (result.stdout, result.stderr)
    assert "did not end within 1 s" in one_line(result.stderr)
    assert result.stdout == ""  # a sleep emits nothing before its end
    listed = httpx.get(f"{server.url}/executions", params={"reasoner": "sleep"}, timeout=WAIT)
    (running,) = listed.json()
    ended = httpx.get(
        f"{server.url}/executions/{running['execution_id']}", params={"wait": 10}, timeout=WAIT
    ).json()
    assert ended["status"] == "succeeded"


def test_usage_errors_are_one_line(server: ServerProcess) -> None:
    for args in (("echo", "--async", "--stream"), ("echo", "--timeout", "0"), ("echo", "--nope")):
        result = call(*args, "--url", server.url)
        assert result.returncode == 2, result.stderr
        one_line(result.stderr)
