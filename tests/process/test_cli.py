"""The command line conventions uvicorn users expect, and flags made from `Settings`.

Every `run` flag comes from a Settings field, so a field added later (with a description)
gets its flag, help, default and environment twin without touching the CLI.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click
import httpx
import pytest
from click.testing import CliRunner
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_server import Settings
from agent_server.process.cli_server import run, settings_options
from agent_server.process.launcher import run_command
from tests.support.process import APPS_DIR, ServerProcess, agent_server_cli, one_line

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture(autouse=True)
def _no_inherited_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("AGENT_SERVER_"):
            monkeypatch.delenv(name)


cli = agent_server_cli


def test_no_arguments_prints_help_and_exits_0() -> None:
    result = cli()
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout and "run" in result.stdout


def test_version_and_short_help() -> None:
    version = cli("--version")
    assert version.returncode == 0
    assert version.stdout.startswith("agent-server, version ")
    for args in (("-h",), ("run", "-h")):
        result = cli(*args)
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout


@pytest.mark.parametrize("form", [("--workers", "4"), ("--workers=2",)])
def test_workers_exits_2_pointing_to_replicas(form: tuple[str, ...]) -> None:
    """uvicorn's habit: one line saying why not and what instead (docs/settings.md), never
    click's "Did you mean '--store'?" nor its usage, and no server started."""
    result = cli("run", *form)
    assert result.returncode == 2, result.stderr
    error = one_line(result.stderr)
    assert "replicas" in error and "docs/replicas.md" in error
    assert "Did you mean" not in result.stderr
    assert "--workers" not in cli("run", "--help").stdout


def test_run_has_a_flag_and_a_named_twin_for_every_setting() -> None:
    result = cli("run", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # help wraps lines anywhere
    for field in Settings.model_fields:
        flag = "--" + field.replace("_", "-")
        assert flag in text, flag
        assert f"[env: AGENT_SERVER_{field.upper()}]" in text, field
    assert "--access-log / --no-access-log" in text
    assert "[default: 8000]" in text and "[default: off]" in text
    assert "[critical|error|warning|info|debug]" in text


def test_a_field_added_later_gets_its_flag_from_its_description() -> None:
    class Later(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="AGENT_SERVER_")
        store: str = Field(default="memory", description="Where records live.")
        lease_ttl: float = Field(default=10.0, gt=0, description="Seconds a lease lasts.")
        replica_id: str | None = Field(default=None, description="This replica's name.")
        mode: Literal["a", "b"] | None = Field(default=None, description="A or B.")
        verbose: bool = Field(default=True, description="Say more.")
        token: str = Field(default_factory=lambda: "random", description="Made per run.")

    seen: dict[str, Any] = {}

    @click.command()
    @settings_options(Later)
    def command(**flags: Any) -> None:
        seen.update(flags)

    runner = CliRunner()
    result = runner.invoke(
        command, ["--lease-ttl", "2.5", "--mode", "b", "--no-verbose", "--store", "redis://x"]
    )
    assert result.exit_code == 0, result.output
    assert seen == {
        "store": "redis://x",
        "lease_ttl": 2.5,
        "replica_id": None,
        "mode": "b",
        "verbose": False,
        "token": None,
    }
    assert runner.invoke(command, ["--mode", "c"]).exit_code == 2
    text = " ".join(runner.invoke(command, ["--help"]).output.split())
    assert "Seconds a lease lasts. [default: 10] [env: AGENT_SERVER_LEASE_TTL]" in text
    assert "--verbose / --no-verbose" in text
    assert "Made per run. [env: AGENT_SERVER_TOKEN]" in text


def test_absent_flags_leave_settings_to_the_environment() -> None:
    """The generated flags have no default of their own: nothing overrides the twin."""
    assert all(param.default is None for param in run.params if param.name != "app")


def test_missing_app_attribute_says_so() -> None:
    result = cli("run", "tests_app:no_such_agent")
    assert result.returncode == 2
    assert "module 'tests_app' has no attribute 'no_such_agent'" in result.stderr


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ('raise RuntimeError("the config is missing")\n', "raised RuntimeError: the config"),
        ("import a_dependency_nobody_installed\n", "No module named 'a_dependency_nobody"),
        (
            "class Broken(Exception):\n    def __str__(self):\n        raise ValueError\n"
            "raise Broken()\n",
            "raised Broken",
        ),
    ],
    ids=["raises", "missing-dependency", "unprintable"],
)
def test_an_app_whose_import_raises_exits_2_with_its_own_traceback(
    tmp_path: Path, source: str, says: str
) -> None:
    """One rule for every APP that cannot be served: exit 2 and one line; when the user's
    module raised, its own frames above it, none of agent-server's or importlib's."""
    (tmp_path / "broken_app.py").write_text(source)
    result = cli("run", "broken_app:agent", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("agent-server: ") and says in lines[-1], result.stderr
    assert "broken_app.py" in result.stderr  # the user's frame
    assert "agent_server" not in result.stderr.replace("agent-server:", "")
    assert "importlib" not in result.stderr


def test_settings_errors_carry_one_prefix() -> None:
    result = cli("run", "tests_app:agent", "--grace-period", "2")
    assert result.returncode == 2
    assert result.stderr.startswith("agent-server: invalid settings: shutdown budget")
    assert "settings:" not in result.stderr.removeprefix("agent-server: invalid settings:")


def test_bad_environment_variable_is_named_as_written() -> None:
    result = cli("run", "tests_app:agent", env={"AGENT_SERVER_LOG_LEVEL": "loud"})
    assert result.returncode == 2
    assert "AGENT_SERVER_LOG_LEVEL: Input should be" in result.stderr
    assert "--log-level" not in result.stderr


@pytest.mark.parametrize("enabled", [True, False])
def test_access_log_is_off_by_default_and_can_be_turned_on(
    server_factory: ServerFactory, enabled: bool
) -> None:
    server = server_factory("tests_app:agent", *(["--access-log"] if enabled else []))
    assert httpx.get(f"{server.url}/reasoners", timeout=5).status_code == 200
    server.signal()
    server.wait_exit(15)
    assert ('"GET /reasoners HTTP/1.1" 200' in server.stderr()) is enabled


def test_a_store_unreachable_at_start_exits_1_in_one_line() -> None:
    """docs/shutdown.md's exit 1: the reason in one line, without a traceback (uvicorn logs
    what the lifespan's failure message says)."""
    from tests.support.process import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    result = subprocess.run(
        run_command(None, "--store", url),
        capture_output=True,
        text=True,
        timeout=60,
        cwd=APPS_DIR,
    )
    assert result.returncode == 1, result.stderr
    assert f"cannot start: cannot reach Redis at {url}" in result.stderr
    assert "Traceback" not in result.stderr
