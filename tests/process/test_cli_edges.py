"""The CLI's and the client's edges on a real server (tests/apps/edges_app.py): every verb
ends in one line on stderr with its exit code, the schedules verbs included when their answer
is lost on the way (the client raises its own error, never httpx's); an error message that
spans lines (pydantic's) is one line; `--catchup-window` says and enforces the server's
bound; an unknown reasoner's 404 names the reasoners there are (a bounded list)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

from agent_server.client import AgentClient, Unavailable
from agent_server.model.schedule_fields import MAX_CATCHUP_WINDOW
from tests.apps.edges_app import FILLERS, OWN
from tests.process.test_client import CuttingProxy
from tests.support.process import ServerProcess, one_line

WAIT = 20.0
Start = Callable[..., ServerProcess]


@pytest.fixture
def server(server_factory: Start) -> ServerProcess:
    return server_factory("edges_app:agent")


def verb(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m agent_server ARGS`, without the token variables of the environment."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")}
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        capture_output=True,
        text=True,
        timeout=WAIT + 10,
        env=environment,
    )


def schedules_of(server: ServerProcess) -> list[dict[str, object]]:
    listed = httpx.get(f"{server.url}/schedules", timeout=WAIT)
    assert listed.status_code == 200, listed.text
    found: list[dict[str, object]] = listed.json()
    return found


def test_a_schedule_create_whose_answer_is_lost_says_so_in_one_line(
    server: ServerProcess,
) -> None:
    """The POST may have made the schedule (here it did), so it is not sent again: one line
    saying what may have happened and what to do, exit 5 (as any verb left without an
    answer), never a traceback."""
    proxy = CuttingProxy(server.port)
    try:
        made = verb(
            "schedules", "create", "add", "0 3 * * *", "--input", '{"a": 1, "b": 2}',
            "--url", proxy.url, "--retry-for", "2",
        )  # fmt: skip
    finally:
        proxy.close()
    assert made.returncode == 5, made.stderr[-2000:]
    said = one_line(made.stderr)
    assert "POST /schedules" in said and "may have been made" in said, said
    assert [s["reasoner"] for s in schedules_of(server)] == ["add"]  # it was, once


def test_a_schedule_trigger_whose_answer_is_lost_says_so_in_one_line(
    server: ServerProcess,
) -> None:
    with AgentClient(server.url, timeout=WAIT) as client:
        schedule = client.create_schedule("add", "0 3 * * *", {"input": {"a": 2, "b": 3}})
    schedule_id = str(schedule["schedule_id"])
    proxy = CuttingProxy(server.port)
    try:
        fired = verb("schedules", "trigger", schedule_id, "--url", proxy.url)
    finally:
        proxy.close()
    assert fired.returncode == 5, fired.stderr[-2000:]
    said = one_line(fired.stderr)
    assert "may have fired" in said and schedule_id in said, said
    runs = httpx.get(
        f"{server.url}/executions", params={"schedule_id": schedule_id}, timeout=WAIT
    ).json()
    assert len(runs) == 1  # it did, once: not sent again


@pytest.mark.parametrize("call", ["create", "trigger"])
def test_the_client_raises_its_own_error_when_a_schedule_answer_is_lost(
    server: ServerProcess, call: str
) -> None:
    with AgentClient(server.url, timeout=WAIT) as direct:
        schedule = direct.create_schedule("add", "0 3 * * *", {"input": {"a": 1, "b": 1}})
    proxy = CuttingProxy(server.port)
    try:
        with (
            AgentClient(proxy.url, timeout=WAIT, retry_for=2) as client,
            pytest.raises(Unavailable) as lost,
        ):
            if call == "create":
                client.create_schedule("add", "0 4 * * *", {"input": {"a": 1, "b": 1}})
            else:
                client.trigger_schedule(str(schedule["schedule_id"]))
    finally:
        proxy.close()
    assert isinstance(lost.value.__cause__, httpx.TransportError)
    assert "the answer was lost" in str(lost.value)


def test_a_multi_line_error_is_one_line(server: ServerProcess) -> None:
    """pydantic's ValidationError spans four lines (a header, the field, its message, a
    link): the verb's line holds what went wrong, once, on one line."""
    done = verb("call", "invalid", "--url", server.url)
    assert done.returncode == 1, done.stderr
    said = one_line(done.stderr)
    assert "ValidationError" in said and "count" in said, said
    assert "Input should be a valid integer" in said, said
    assert "errors.pydantic.dev" not in said
    assert json.loads(done.stdout)["status"] == "failed"


def test_catchup_window_says_and_enforces_the_servers_bound() -> None:
    helped = verb("schedules", "create", "--help")
    assert helped.returncode == 0
    option = helped.stdout.split("--catchup-window", 1)[1].split("  --", 1)[0]
    assert f"0<=x<={MAX_CATCHUP_WINDOW}]" in option, option
    assert "31536000" not in option, option
    # Refused before any request (the URL answers nothing: a request would exit 5).
    past = verb(
        "schedules", "create", "add", "* * * * *", "--catchup-window",
        f"{MAX_CATCHUP_WINDOW + 1:g}", "--url", "http://127.0.0.1:9", "--retry-for", "0.3",
    )  # fmt: skip
    assert past.returncode == 2, past.stderr
    assert "catchup-window" in past.stderr


def test_an_unknown_reasoner_names_the_reasoners_there_are(server: ServerProcess) -> None:
    done = verb("call", "nope", "{}", "--url", server.url)
    assert done.returncode == 6, done.stderr
    said = one_line(done.stderr)
    assert "'nope'" in said and "add" in said and "confirm" in said, said
    assert f"and {FILLERS + OWN - 20} more" in said, said
