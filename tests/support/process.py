"""Real `agent-server run` processes and what they need: the directory their apps are served
from, free loopback ports, the programs outside Python a test needs (skipped when absent, failed
under AGENT_SERVER_TESTS_REQUIRE_ALL=1), and the one-shot CLI."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

from agent_server.process.launcher import Launched, LaunchError, run_command
from agent_server.process.launcher import free_port as free_port

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
#: Where the served apps live (`tests_app:agent`, `hostile_app:agent`, `conventions_app:agent`):
#: the working directory of every server process the tests start, as a user's app directory.
APPS_DIR = ROOT / "tests" / "apps"
#: Every wait in the end-to-end tests is bounded by this (seconds) unless it says otherwise:
#: long enough for several servers started at once on a shared machine of two cores at load
#: 13 (three fault-run replicas missed 15 s there, logging nothing yet).
STARTUP_TIMEOUT = 30.0


#: Set by `.ci/run`, which installs every program the tests need: there a missing one fails the
#: test instead of skipping it, so nothing is skipped silently where it could have run.
REQUIRE_ALL = "AGENT_SERVER_TESTS_REQUIRE_ALL"


def need(program: str, *, package: str, source: str = "Debian") -> str:
    """The path of `program`; when it is not on PATH, skip the test naming the package that
    gives it (or fail it, under AGENT_SERVER_TESTS_REQUIRE_ALL=1)."""
    path = shutil.which(program)
    if path is None:
        how = f"apt-get install {package}" if source == "Debian" else f"{source} installs {package}"
        unavailable(f"needs {program}, which is not on PATH ({how})")
    return path


def unavailable(reason: str) -> NoReturn:
    """Skip the test for want of something outside Python, or fail it where CI installed it."""
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(f"{reason}; {REQUIRE_ALL}=1 makes this an error", pytrace=False)
    pytest.skip(reason)


def agent_server_cli(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m agent_server ARGS` from the apps' directory, expected to answer and exit
    at once (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        cwd=APPS_DIR,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def one_line(stderr: str) -> str:
    """The one line a CLI command that did not end 0 writes on stderr (no traceback)."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("agent-server: ")
    return lines[0]


class ServerProcess:
    """A real `agent-server run` child process on a free loopback port (the package's launcher,
    with the tests' marker directory, stderr file and assertions)."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        marker_dir: Path,
        cwd: Path = APPS_DIR,
        *,
        port: int = 0,
        new_session: bool = False,
    ) -> None:
        self._port: int | None = None
        #: The port it is told (0: it binds a free one and says which in its log).
        self.fixed_port = port
        self.marker_dir = marker_dir
        self.stderr_path = marker_dir / "stderr.log"
        self.launched = Launched(
            self.command(args),
            cwd=cwd,
            env={**env, "TESTS_MARKER_DIR": str(marker_dir)},
            log=self.stderr_path,
            new_session=new_session,
        )
        self.proc = self.launched.proc

    def command(self, args: list[str]) -> list[str]:
        """The command line; subclasses run the server another way (PID 1, plain uvicorn)."""
        return run_command(None, *args, port=self.fixed_port)

    @property
    def signalled_at(self) -> float | None:
        """Monotonic time of the first signal (None: not signalled yet)."""
        return self.launched.signalled_at

    @signalled_at.setter
    def signalled_at(self, value: float | None) -> None:
        self.launched.signalled_at = value

    @property
    def port(self) -> int:
        """The port the server bound (it is given port 0, so no other process can race it)."""
        if self._port is None:
            try:
                self._port = self.launched.listening_port(STARTUP_TIMEOUT)
            except LaunchError:
                raise AssertionError(f"server never listened:\n{self.stderr()}") from None
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        """A client of this server (a subclass serving HTTPS gives its own)."""
        return httpx.Client(base_url=self.url)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        with self.client() as client:

            def ready() -> bool:
                try:
                    return client.get("/readyz", timeout=1.0).status_code == 200
                except httpx.TransportError:
                    return False

            try:
                self.launched.wait_until(ready, timeout, interval=0.02)
            except LaunchError as exc:
                if exc.code is not None:
                    raise AssertionError(f"server exited early:\n{self.stderr()}") from None
                raise AssertionError(f"server not ready in {timeout}s:\n{self.stderr()}") from None

    def wait_marker(self, name: str, timeout: float = 10.0) -> None:
        """Wait until a reasoner touched its marker file (it has really started)."""
        path = self.marker_dir / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"marker {name} not seen in {timeout}s:\n{self.stderr()}")
            time.sleep(0.01)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.launched.signal(sig)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds from the first signal to exit; fails fast on a hang."""
        try:
            return self.launched.wait_exit(timeout)
        except TimeoutError:
            raise AssertionError(f"server did not exit in {timeout}s:\n{self.stderr()}") from None

    def stderr(self) -> str:
        return self.launched.log_text()

    def close(self) -> None:
        self.launched.close()


@contextlib.contextmanager
def serving(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *args: str,
    env: dict[str, str] | None = None,
) -> Iterator[ServerProcess]:
    """One ready `agent-server run ARGS` for a module's tests (its marker directory named
    after `name`), closed at the end whatever happened: the body of every module fixture."""
    process = ServerProcess(list(args), env or {}, tmp_path_factory.mktemp(name))
    try:
        process.wait_ready()
        yield process
    finally:
        process.close()


def server_errors(exposition: str) -> dict[str, float]:
    """Answers with a 5xx status other than 503 (refusals), by series, from `/metrics` text:
    the series exist at 0 from the start, so only their counts tell."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if family.name != "agent_server_http_requests":
            continue
        for sample in family.samples:
            status = sample.labels.get("status", "")
            if status.startswith("5") and status != "503" and sample.value:
                found[repr(sample.labels)] = sample.value
    return found
