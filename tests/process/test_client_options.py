"""Every option of the HTTP API from the Python client and `agent-server call` (docs/client.md),
against real servers over loopback: `delay`, `session_policy`, `webhook_url`,
extra headers (a `concurrency_key="header:X-Tenant"` limit driven per tenant), and the
server and token read from AGENT_SERVER_URL and AGENT_SERVER_API_TOKEN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_server.client import AgentClient, AsyncAgentClient, Conflict, InvalidInput, Unauthorized
from tests.support.process import ServerProcess
from tests.support.webhooks import HOOKS, Receiver

WAIT = 20.0
Start = Callable[..., ServerProcess]


@pytest.fixture
def scheduling(server_factory: Start) -> ServerProcess:
    return server_factory("scheduling_app:agent", *HOOKS)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("AGENT_SERVER_"):
            monkeypatch.delenv(name)
    return monkeypatch


def starts(server: ServerProcess) -> list[dict[str, Any]]:
    path = Path(server.marker_dir, "starts.log")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def spans(server: ServerProcess, tenant: str) -> list[tuple[float, float]]:
    """Each run of `tenant` (`gate`'s marks): its start and end times, in start order."""
    marks = [m for m in starts(server) if m.get("tenant") == tenant]
    begun = {m["id"]: m["at"] for m in marks if m["event"] == "start"}
    ended = {m["id"]: m["at"] for m in marks if m["event"] == "end"}
    return sorted((begun[i], ended[i]) for i in begun)


def test_headers_drive_a_concurrency_key_per_tenant(
    scheduling: ServerProcess, clean_env: pytest.MonkeyPatch
) -> None:
    """`gate` runs one at a time per X-Tenant: two of tenant a in turn, b's beside a's
    first. Without the header every start would share one value, and b would wait."""
    clean_env.setenv("AGENT_SERVER_URL", scheduling.url)
    with AgentClient(timeout=WAIT, retry_for=WAIT) as client:  # the URL from the environment
        handles = [
            client.start("gate", {"tenant": tenant, "seconds": 0.5}, headers={"X-Tenant": tenant})
            for tenant in ("a", "a", "b")
        ]
        for handle in handles:
            assert handle.wait(WAIT).status == "succeeded"
    (a1, a2), (b,) = spans(scheduling, "a"), spans(scheduling, "b")
    assert a2[0] >= a1[1], "tenant a ran two at once"
    assert b[0] < a1[1], "tenant b waited for tenant a"


def test_delay_session_policy_and_webhook_url(
    scheduling: ServerProcess, receiver: Receiver, clean_env: pytest.MonkeyPatch
) -> None:
    with AgentClient(scheduling.url, timeout=WAIT, retry_for=WAIT) as client:
        delayed = client.start("chat", {"text": "later", "seconds": 0}, delay=30)
        assert delayed.execution.status == "queued"
        assert delayed.execution.json["scheduled_at"] is not None
        assert delayed.cancel().status == "cancelled"
        busy = client.start("chat", {"text": "first", "seconds": 3}, session="s1")
        with pytest.raises(Conflict):
            client.start("chat", {"text": "second"}, session="s1", session_policy="reject")
        queued = client.start("chat", {"text": "after"}, session="s1", session_policy="enqueue")
        assert queued.execution.status == "queued"
        busy.cancel()
        assert queued.wait(WAIT).result == "after"
        hooked = client.run("chat", {"text": "hook", "seconds": 0}, webhook_url=receiver.url)
        assert hooked == "hook"
        deadline = time.monotonic() + WAIT
        while not receiver.delivered("execution.finished") and time.monotonic() < deadline:
            time.sleep(0.05)
        delivered = receiver.delivered("execution.finished")
        assert len(delivered) == 1, receiver.requests
        assert delivered[0]["body"]["data"]["result"] == "hook"


async def test_the_async_client_takes_the_same_options(
    scheduling: ServerProcess, clean_env: pytest.MonkeyPatch
) -> None:
    async with AsyncAgentClient(scheduling.url, timeout=WAIT, retry_for=WAIT) as client:
        delayed = await client.start("chat", {"text": "x"}, delay=60, headers={"X-Tenant": "t"})
        assert delayed.execution.status == "queued"
        await delayed.cancel()
        with pytest.raises(InvalidInput, match="X-Tenant") as refused:
            await client.start("gate", {"tenant": "z"}, headers={"X-Tenant": ""})
        assert refused.value.status == 400  # sent, and the server names its header
        with pytest.raises(InvalidInput, match="cannot be sent") as unsendable:
            await client.start("gate", {"tenant": "z"}, headers={"X-Tenant": "a\nb"})
        assert unsendable.value.status is None  # refused at once, not retried for retry_for


def test_the_token_comes_from_the_environment(
    server_factory: Start, clean_env: pytest.MonkeyPatch
) -> None:
    secured = server_factory("tests_app:agent", "--api-token", "s3cret-token-for-tests")
    clean_env.setenv("AGENT_SERVER_URL", secured.url)
    with AgentClient(retry_for=1) as anonymous, pytest.raises(Unauthorized):
        anonymous.run("no_params")
    clean_env.setenv("AGENT_SERVER_API_TOKEN", "s3cret-token-for-tests")
    with AgentClient(retry_for=1) as client:
        assert client.run("no_params") == "ok"
    with AgentClient(token="wrong-token-given", retry_for=1) as given, pytest.raises(Unauthorized):
        given.run("no_params")  # a token given wins over the environment's


# -- the CLI ------------------------------------------------------------------------------------


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")}
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        env={**environment, **(env or {})},
        check=False,
    )


def test_call_takes_delay_policy_header_and_webhook_url(
    scheduling: ServerProcess, receiver: Receiver
) -> None:
    env = {"AGENT_SERVER_URL": scheduling.url}
    delayed = cli("call", "chat", '{"text": "d"}', "--async", "--delay", "30", env=env)
    assert delayed.returncode == 0, delayed.stderr
    record = json.loads(delayed.stdout)
    assert record["status"] == "queued" and record["scheduled_at"] is not None
    assert cli("cancel", record["execution_id"], env=env).returncode == 0
    soon = cli("call", "chat", '{"text": "soon", "seconds": 0}', "--delay", "0.2", env=env)
    assert soon.returncode == 0, soon.stderr
    assert json.loads(soon.stdout)["result"] == "soon"
    busy = cli(
        "call", "chat", '{"text": "busy", "seconds": 3}', "--async", "--session", "c", env=env
    )
    assert busy.returncode == 0, busy.stderr
    refused = cli("call", "chat", '{"text": "no"}', "--session", "c", "--policy", "reject", env=env)
    assert refused.returncode == 6, refused.stderr
    assert "409" in refused.stderr or "busy" in refused.stderr.lower(), refused.stderr
    assert cli("cancel", json.loads(busy.stdout)["execution_id"], env=env).returncode == 0
    blank = cli("call", "gate", '{"tenant": "x"}', "--header", "X-Tenant: \t", env=env)
    assert blank.returncode == 2, blank.stderr  # sent, and refused by the server: 400
    assert "X-Tenant" in blank.stderr
    tenant = cli("call", "gate", '{"tenant": "x"}', "--header", "X-Tenant:x", env=env)
    assert tenant.returncode == 0, tenant.stderr
    bad = cli("call", "gate", "{}", "--header", "no colon here", env=env)
    assert bad.returncode == 2 and "NAME:VALUE" in bad.stderr
    hooked = cli(
        "call", "chat", '{"text": "h", "seconds": 0}', "--webhook-url", receiver.url, env=env
    )
    assert hooked.returncode == 0, hooked.stderr
    deadline = time.monotonic() + WAIT
    while not receiver.delivered("execution.finished") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(receiver.delivered("execution.finished")) == 1
