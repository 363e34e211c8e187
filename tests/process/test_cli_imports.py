"""The CLI's client verbs import none of the server (docs/client.md): `agent-server get
--help`, every other verb's help, and a real `call` against a server load the client, httpx
and click, never the app, its HTTP layer, its runtime, its stores, uvicorn, starlette or
pydantic. The time this saves is in bench/RESULTS.md (`python -m bench.cli_start`); no timing
is asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.support.process import APPS_DIR

#: What a client verb must not load: the server's packages and the libraries under them.
SERVER = (
    "agent_server.app",
    "agent_server.http",
    "agent_server.runtime",
    "agent_server.store",
    "agent_server.process.cli_server",
    "agent_server.process.runner",
    "uvicorn",
    "starlette",
    "pydantic",
    "redis",
    "prometheus_client",
)
VERBS = ["call", "input", "get", "list", "cancel", "events", "release"]

#: Runs `agent-server ARGS` in this interpreter, then prints the modules it loaded as JSON.
PROBE = """
import json, sys
from agent_server.process.cli import main
try:
    main(sys.argv[1:], prog_name="agent-server")
except SystemExit as exit:
    code = exit.code
print("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def loaded(*args: str) -> tuple[Any, list[str]]:
    """The exit code of `agent-server ARGS` and every module it imported."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        cwd=APPS_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_SERVER_")},
    )
    line = done.stdout.rsplit("MODULES ", 1)
    assert len(line) == 2, done.stderr
    found = json.loads(line[1])
    return found["code"], found["modules"]


def server_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(s + ".") for s in SERVER)]


@pytest.mark.parametrize("verb", VERBS)
def test_a_client_verbs_help_imports_no_server(verb: str) -> None:
    code, modules = loaded(verb, "--help")
    assert code == 0
    assert "httpx" in modules and "agent_server.client" in modules
    assert server_modules(modules) == []


def test_a_real_call_imports_no_server(server_factory: Any) -> None:
    server = server_factory("tests_app:agent")
    code, modules = loaded("call", "no_params", "--url", server.url)
    assert code == 0
    assert server_modules(modules) == []
    code, modules = loaded("get", "nope", "--url", "http://127.0.0.1:9", "--retry-for", "0")
    assert code == 5  # unreachable
    assert server_modules(modules) == []


def test_the_server_commands_still_load_the_server() -> None:
    """The probe sees what a command imports: `run --help` loads the server."""
    code, modules = loaded("run", "--help")
    assert code == 0
    assert "agent_server.process.cli_server" in modules and "pydantic" in modules
