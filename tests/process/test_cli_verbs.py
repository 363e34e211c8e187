"""`agent-server get`, `list`, `cancel`, `events` and `release` end to end: a real server,
the real commands, their JSON output and their exit codes, which are `call`'s (0 ok, 1
failed, 2 invalid, 3 cancelled, 4 lost, 5 unreachable, 6 refused, 7 timeout), each end but 0
with one line on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from agent_server.client import AgentClient, InvalidInput, NotFound
from agent_server.process.cli import main
from agent_server.process.cli_client import ClientCommand
from tests.support.process import ServerProcess, one_line

WAIT = 20.0
Start = Callable[..., ServerProcess]
VERBS = ("call", "get", "list", "cancel", "events", "release", "input")


@pytest.fixture
def server(server_factory: Start) -> ServerProcess:
    return server_factory("tests_app:agent")


@pytest.fixture
def client(server: ServerProcess) -> Iterator[AgentClient]:
    with AgentClient(server.url, timeout=WAIT, retry_for=WAIT) as client:
        yield client


def verb(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m agent_server ARGS`, without the token variables of the environment."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")}
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={**environment, **(env or {})},
    )


def ok(*args: str, env: dict[str, str] | None = None) -> Any:
    """The JSON a verb printed, which must have exited 0 without a word on stderr."""
    result = verb(*args, env=env)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    return json.loads(result.stdout)


def test_every_verb_shares_the_server_options_and_the_exit_codes() -> None:
    """One declaration of --url, --token-file and --retry-for serves every verb."""
    for name in VERBS:
        command = main.commands[name]
        assert isinstance(command, ClientCommand), name
        options = {param.name for param in command.params}
        assert {"url", "token_file", "retry_for"} <= options, name
        shown = verb(name, "--help")
        assert shown.returncode == 0
        for line in ("0  succeeded", "3  cancelled", "6  refused", "7  --timeout"):
            assert line in shown.stdout, (name, line)


def test_get_prints_the_execution_with_its_ends_exit_code(
    server: ServerProcess, client: AgentClient
) -> None:
    done = client.run_execution("echo", {"text": "got"})
    assert ok("get", done.execution_id, "--url", server.url)["result"] == {"text": "got"}

    failed = client.run_execution("fail", {"message": "broken"})
    result = verb("get", failed.execution_id, "--url", server.url)
    assert result.returncode == 1
    assert json.loads(result.stdout)["status"] == "failed"
    assert "ValueError: broken" in one_line(result.stderr)

    running = client.start("sleep", {"seconds": 30, "marker": "got"})
    server.wait_marker("got")
    assert ok("get", running.execution_id, "--url", server.url)["status"] == "running"

    unknown = verb("get", "0" * 32, "--url", server.url)
    assert (unknown.returncode, unknown.stdout) == (6, "")
    assert "404" in one_line(unknown.stderr)


def test_get_wait_long_polls_and_exits_7_when_it_passes(
    server: ServerProcess, client: AgentClient
) -> None:
    running = client.start("sleep", {"seconds": 30})
    timed_out = verb("get", running.execution_id, "--wait", "0.5", "--url", server.url)
    assert timed_out.returncode == 7
    assert json.loads(timed_out.stdout)["status"] == "running"  # as it was when it passed
    assert "still running" in one_line(timed_out.stderr)

    short = client.start("sleep", {"seconds": 0.5})
    assert ok("get", short.execution_id, "--wait", "10", "--url", server.url)["result"] == {
        "slept": 0.5
    }


def test_cancel_then_get_reads_it_cancelled(server: ServerProcess, client: AgentClient) -> None:
    running = client.start("sleep", {"seconds": 30, "marker": "to-cancel"})
    server.wait_marker("to-cancel")
    answered = ok("cancel", running.execution_id, "--url", server.url)
    assert answered["execution_id"] == running.execution_id
    ended = verb("get", running.execution_id, "--wait", "10", "--url", server.url)
    assert ended.returncode == 3
    assert json.loads(ended.stdout)["status_reason"] == "request"
    assert "cancelled (request)" in one_line(ended.stderr)
    # Cancelling what has ended already answers it as it is.
    assert ok("cancel", running.execution_id, "--url", server.url)["status"] == "cancelled"
    unknown = verb("cancel", "0" * 32, "--url", server.url)
    assert unknown.returncode == 6
    assert "404" in one_line(unknown.stderr)


def test_list_filters_on_statuses_reasoner_session_and_limit(
    server: ServerProcess, client: AgentClient
) -> None:
    echoed = client.run_execution("echo", {"text": "listed"}, session="cli-list")
    failed = client.run_execution("fail", session="cli-list")
    running = client.start("sleep", {"seconds": 30}, session="cli-list")
    url = ("--url", server.url)

    def ids(*args: str) -> list[str]:
        return [item["execution_id"] for item in ok("list", *args, *url)]

    newest_first = [running.execution_id, failed.execution_id, echoed.execution_id]
    assert ids("--session", "cli-list") == newest_first
    assert ids("--session", "cli-list", "--status", "running", "--status", "succeeded") == [
        running.execution_id,
        echoed.execution_id,
    ]
    assert ids("--session", "cli-list", "--status", "failed") == [failed.execution_id]
    assert ids("--session", "cli-list", "--reasoner", "echo") == [echoed.execution_id]
    assert ids("--session", "cli-list", "--limit", "1") == [running.execution_id]
    assert ok("list", "--session", "nobody", *url) == []

    for bad in (("--status", "sleeping"), ("--limit", "0")):
        refused = verb("list", *bad, *url)
        assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
        one_line(refused.stderr)


def test_events_print_one_json_line_each_through_the_end(
    server: ServerProcess, client: AgentClient
) -> None:
    handle = client.start("chatter", {"count": 3})
    result = verb("events", handle.execution_id, "--url", server.url)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(line["id"], line["event"]) for line in lines] == [
        (1, "progress"),
        (2, "progress"),
        (3, "progress"),
        (None, "end"),
    ]
    assert lines[-1]["data"]["result"] == {"emitted": 3}

    failing = client.start("chatter", {"count": 3, "fail_at": 1})
    failed = verb("events", failing.execution_id, "--url", server.url)
    assert failed.returncode == 1
    assert json.loads(failed.stdout.splitlines()[-1])["data"]["status"] == "failed"
    assert "RuntimeError" in one_line(failed.stderr)

    slow = client.start("sleep", {"seconds": 4})
    timed_out = verb("events", slow.execution_id, "--timeout", "1", "--url", server.url)
    assert (timed_out.returncode, timed_out.stdout) == (7, "")
    assert "did not end within 1 s" in one_line(timed_out.stderr)


def test_release_cancels_waits_and_forgets_unless_kept_running(
    server: ServerProcess, client: AgentClient
) -> None:
    client.run("echo", {"text": "kept"}, session="cli-release")
    running = client.start("sleep", {"seconds": 30, "marker": "released"}, session="cli-release")
    server.wait_marker("released")
    url = ("--url", server.url)

    kept = verb("release", "cli-release", "--keep-running", *url)
    assert (kept.returncode, kept.stdout) == (6, "")
    assert "409" in one_line(kept.stderr)
    assert client.get(running.execution_id).status == "running"  # nothing changed

    released = ok("release", "cli-release", "--timeout", "5", *url)
    assert released["session_id"] == "cli-release"
    assert (released["cancelled"], released["abandoned"], released["forgotten"]) == (1, 0, 2)
    assert ok("list", "--session", "cli-release", *url) == []


def test_the_token_comes_from_the_file_or_the_environment(
    server_factory: Start, tmp_path: Path
) -> None:
    secured = server_factory("tests_app:agent", "--api-token", "verb-token")
    url = ("--url", secured.url)
    refused = verb("list", *url)
    assert refused.returncode == 6
    assert "401" in one_line(refused.stderr)

    token_file = tmp_path / "token"
    token_file.write_text("verb-token\n")
    assert ok("list", *url, "--token-file", str(token_file)) == []
    assert ok("list", *url, env={"AGENT_SERVER_API_TOKEN_FILE": str(token_file)}) == []
    assert ok("list", *url, env={"AGENT_SERVER_API_TOKEN": "verb-token"}) == []

    missing = verb("list", *url, "--token-file", str(tmp_path / "absent"))
    assert (missing.returncode, missing.stdout) == (2, "")
    one_line(missing.stderr)


def test_unreachable_exits_5() -> None:
    result = verb("list", "--url", "http://127.0.0.1:9", "--retry-for", "0.3")
    assert result.returncode == 5
    assert "ConnectError" in one_line(result.stderr)


#: Seconds no verb can wait: not finite, negative, past a year (the server's bound).
BAD_SECONDS = ("nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1", "31536001", "0x10")
#: A verb and its option in seconds, each of them.
SECONDS_OPTIONS = [
    ("get", "x", "--wait"),
    ("call", "echo", "--timeout"),
    ("events", "x", "--timeout"),
    ("release", "s", "--timeout"),
    ("list", "--retry-for"),
]


def test_seconds_that_are_not_finite_are_usage_errors() -> None:
    """nan and inf are floats to click: `--timeout nan` broke the verb with a traceback
    (exit 1, which means "failed"). Each is exit 2 with one line naming the option, before
    any request (the URL here answers nothing: a request would exit 5). In-process through
    the real command group, then two as real processes."""
    runner = CliRunner()
    for *args, option in SECONDS_OPTIONS:
        for value in BAD_SECONDS:
            result = runner.invoke(main, [*args, option, value, "--url", "http://127.0.0.1:9"])
            assert result.exit_code == 2, (args, option, value, result.output)
            assert option in one_line(result.stderr), (option, value)
    result = runner.invoke(main, ["list", "--limit", "5000", "--url", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--limit" in one_line(result.stderr)
    for args in (("call", "echo", "--timeout", "nan"), ("release", "s", "--timeout", "inf")):
        done = verb(*args, "--url", "http://127.0.0.1:9", "--retry-for", "0")
        assert done.returncode == 2, done.stderr
        assert args[-2] in one_line(done.stderr)


def test_a_usage_error_under_schedules_is_one_line_naming_the_verb() -> None:
    """docs/client.md: "Anything but 0 also writes one line to stderr, a usage error
    included". `schedules nope` printed click's usage, its hint and a blank line; `schedules
    create x` named its verb `create`. Real processes, nothing listening at the URL."""
    for args, named in (
        (("schedules", "nope"), "agent-server: schedules: No such command 'nope'"),
        (("schedules", "--nope"), "agent-server: schedules: No such option"),
        (("schedules", "create", "x"), "agent-server: schedules create: Missing argument"),
        (("schedules", "show", "s", "--nope"), "agent-server: schedules show: No such option"),
        (("get", "--nope"), "agent-server: get: No such option"),
    ):
        done = verb(*args, "--url", "http://127.0.0.1:9", "--retry-for", "0")
        assert done.returncode == 2, (args, done.stderr)
        assert one_line(done.stderr).startswith(named), (args, done.stderr)


#: Ids and names that would walk to another route unencoded; the exit code and the line
#: each verb must end with (the path as sent).
WALKS = [
    (("get", "../metrics"), 6, "GET /executions/..%2Fmetrics: 404"),
    (("cancel", "../reasoners/echo"), 6, "POST /executions/..%2Freasoners%2Fecho/cancel: 404"),
    (("release", ".."), 2, "DELETE /sessions/%2E%2E: 400"),
    (("release", "."), 2, "DELETE /sessions/%2E: 400"),
    (("get", "a b?c#d%2F"), 6, "GET /executions/a%20b%3Fc%23d%252F: 404"),
    (("events", "../../healthz"), 6, "GET /executions/..%2F..%2Fhealthz/events: 404"),
    (("input", "../readyz", "1"), 6, "GET /executions/..%2Freadyz: 404"),  # its request
    (("call", "../healthz", "{}"), 6, "POST /reasoners/..%2Fhealthz: 404"),
    (("call", "..", "{}"), 6, "POST /reasoners/%2E%2E: 404"),
]


def test_ids_and_names_are_one_path_segment_each(server: ServerProcess) -> None:
    """Every id and name is percent-encoded as one path segment (dot segments too): `get
    ../metrics` fetched /metrics and `release ..` sent `DELETE /`. Each here reaches the
    route it names and is refused there as unknown or invalid, on a real server."""
    for args, code, line in WALKS:
        result = verb(*args, "--url", server.url, "--retry-for", "0")
        assert result.returncode == code, (args, result.stdout, result.stderr)
        assert result.stdout == ""
        assert one_line(result.stderr).startswith(f"agent-server: {line}"), result.stderr
    empty = verb("get", "", "--url", server.url)  # names no execution
    assert empty.returncode == 2
    assert "ID" in one_line(empty.stderr)


def test_the_python_client_encodes_each_segment(server: ServerProcess, client: AgentClient) -> None:
    """The same through the library: an id or name is one segment wherever a URL is built."""
    with pytest.raises(NotFound, match=r"GET /executions/\.\.%2Fmetrics: 404"):
        client.get("../metrics")
    with pytest.raises(NotFound, match=r"POST /reasoners/\.\.%2Fhealthz: 404"):
        client.run_execution("../healthz", {})
    with pytest.raises(NotFound, match=r"DELETE /executions/%2E%2E: 404"):
        client.forget("..")
    with pytest.raises(InvalidInput, match=r"DELETE /sessions/%2E%2E: 400"):
        client.release_session("..", 0)
    with pytest.raises(ValueError, match="empty"):
        client.cancel("")
    done = client.run_execution("echo", {"text": "still served"})
    assert client.get(done.execution_id).result == {"text": "still served"}
