"""What the server says matches what it does (issue 43's list): a count of one is singular
(the shutdown's lines, the client's error, a cron refused), `?wait` names the bound it really
has (any finite number of seconds from 0, capped at 60), not "from 0 to inf", every
refused query parameter names its whole rule, whatever was wrong with it, the start line says
what it knows, and a start the store did not answer says it may run all the same."""

from __future__ import annotations

import signal
import socket
from typing import Any

import httpx
import pytest

from agent_server.client import AgentClient, Unavailable
from tests.support.process import agent_server_cli, free_port

WAIT = 10.0


def test_wait_names_its_real_bound(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    started = httpx.post(f"{server.url}/reasoners/no_params", json={}, timeout=WAIT)
    execution_id = started.json()["execution_id"]
    for value in ("nan", "inf", "-1", "soon"):
        answer = httpx.get(f"{server.url}/executions/{execution_id}?wait={value}", timeout=WAIT)
        assert answer.status_code == 422, answer.text
        detail = answer.json()["detail"]
        assert "inf" not in detail, detail
        assert detail.startswith("wait must be a"), detail
    capped = httpx.get(f"{server.url}/executions/{execution_id}?wait=1e9", timeout=WAIT)
    assert capped.status_code == 200


def test_one_execution_is_one_in_the_shutdown_lines(server_factory: Any) -> None:
    server = server_factory("tests_app:agent", *("--grace-period", "10", "--drain-timeout", "0.5"))
    started = httpx.post(
        f"{server.url}/reasoners/sleep/async",
        json={"seconds": 60, "marker": "one"},
        timeout=WAIT,
    )
    assert started.status_code == 202, started.text
    server.wait_marker("one")
    server.signal(signal.SIGTERM)
    server.wait_exit(WAIT)
    log = server.stderr()
    assert "1 execution in flight" in log, log
    assert "cancelling 1 execution" in log, log
    assert "1 executions" not in log, log


def test_the_start_line_names_no_address_it_does_not_know(tmp_path: Any) -> None:
    """Under plain uvicorn the agent's settings are not uvicorn's: its start line named
    `agent-server run`'s default 127.0.0.1:8000 whatever port uvicorn bound."""
    from tests.process.test_uvicorn_lifespan import UvicornProcess

    server = UvicornProcess([], {}, tmp_path)
    try:
        server.wait_ready()
        line = next(x for x in server.stderr().splitlines() if "agent 'tests'" in x)
        assert "8000" not in line, line
        assert "to listen on the ASGI server's address" in line, line
        # Its budget counts from the lifespan's shutdown, after uvicorn's own wait for open
        # connections (docs/shutdown.md, "Plain uvicorn"): not "within 30s" of the signal.
        assert "s of the ASGI server's lifespan shutdown (unready" in line, line
    finally:
        server.close()


def test_a_bind_that_fails_was_never_said_to_serve(tmp_path: Any) -> None:
    """The start line comes before the bind (the lifespan starts first): it says the agent
    is starting, and the line after it why it could not listen."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = str(taken.getsockname()[1])
        done = agent_server_cli("run", "tests_app:agent", "--port", port)
    finally:
        taken.close()
    assert done.returncode != 0, done.stderr
    assert "serving" not in done.stderr, done.stderr
    assert "starting with" in done.stderr and f"to listen on 127.0.0.1:{port}" in done.stderr
    assert "; shutdown within 30s (unready" in done.stderr, done.stderr
    assert "address already in use" in done.stderr.lower(), done.stderr


def test_a_refused_query_parameter_names_its_whole_rule(server_factory: Any) -> None:
    """`limit=-1` was "limit must be an integer" (it is one), `timeout=inf` named its bound
    as 3.1536e+07 and not `none`: one rule per parameter, whatever broke it."""
    server = server_factory("tests_app:agent")
    for value in ("-1", "0", "1001", "1.5", "abc", "", "99999999999999999999999"):
        answer = httpx.get(f"{server.url}/executions?limit={value}", timeout=WAIT)
        assert answer.status_code == 422, (value, answer.text)
        assert answer.json() == {"detail": "limit must be an integer from 1 to 1000"}, value
    for value in ("-1", "inf", "nan", "1e9", "soon", "31536000.5"):
        answer = httpx.delete(f"{server.url}/sessions/s?timeout={value}", timeout=WAIT)
        assert answer.status_code == 422, (value, answer.text)
        assert answer.json() == {
            "detail": "timeout must be a finite number of seconds from 0 to 31536000, or none"
        }, value
    for value in ("31536000", "none", "0"):  # its bounds are taken as named
        answer = httpx.delete(f"{server.url}/sessions/s?timeout={value}", timeout=WAIT)
        assert answer.status_code == 200, (value, answer.text)


def test_one_try_is_one_attempt_in_the_clients_error() -> None:
    """With nothing listening and `retry_for=0` the client gives up after one try, and its
    error said "1 attempts"; the CLI says the same through its `--retry-for`."""
    url = f"http://127.0.0.1:{free_port()}"
    with AgentClient(url, retry_for=0) as client, pytest.raises(Unavailable) as refused:
        client.get("0" * 32)
    assert "no answer after 1 attempt in " in str(refused.value), refused.value
    done = agent_server_cli("get", "0" * 32, "--url", url, "--retry-for", "0")
    assert done.returncode == 5, done.stderr
    assert "after 1 attempt in " in done.stderr, done.stderr


def test_a_cron_of_one_field_is_one_field(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    for cron, said in (("*", "has 1 field:"), ("* *", "has 2 fields:")):
        refused = httpx.post(
            f"{server.url}/schedules", json={"reasoner": "no_params", "cron": cron}, timeout=WAIT
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith(f"cron: {said}"), refused.text


def test_a_start_the_store_did_not_answer_says_it_may_run(
    server_factory: Any, own_redis: Any
) -> None:
    """A start refused 503 because the store did not answer may have been recorded, and then
    runs (docs/api.md, Errors): its answer says so and points to `Idempotency-Key`, where it
    said only "execution store unavailable". A read refused so stays as it was."""
    server = server_factory("tests_app:agent", "--store", own_redis.url)
    known = httpx.post(f"{server.url}/reasoners/no_params/async", json={}, timeout=WAIT).json()
    own_redis.stop()
    for route in ("/reasoners/no_params", "/reasoners/no_params/async"):
        refused = httpx.post(
            f"{server.url}{route}", json={}, headers={"Idempotency-Key": "k-1"}, timeout=WAIT
        )
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"]
        detail = refused.json()["detail"]
        assert detail.startswith("execution store unavailable: this start may have been"), detail
        assert "same Idempotency-Key" in detail, detail
    read = httpx.get(f"{server.url}/executions/{known['execution_id']}", timeout=WAIT)
    assert read.status_code == 503, read.text
    assert read.json() == {"detail": "execution store unavailable"}
