"""Real `agent-server run` processes and what they need: the directory their apps are served
from, free loopback ports, the programs outside Python a test needs (skipped when absent, failed
under AGENT_SERVER_TESTS_REQUIRE_ALL=1), and the one-shot CLI."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

#: The repository's root.
ROOT = Path(__file__).resolve().parents[2]
#: Where the served apps live (`tests_app:agent`, `hostile_app:agent`, `conventions_app:agent`):
#: the working directory of every server process the tests start, as a user's app directory.
APPS_DIR = ROOT / "tests" / "apps"
#: Every wait in the end-to-end tests is bounded by this (seconds) unless it says otherwise.
STARTUP_TIMEOUT = 15.0


#: uvicorn's start-up line names the port it bound (over HTTP or HTTPS).
LISTENING = re.compile(r"running on https?://127\.0\.0\.1:(\d+)")


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    """A real `agent-server run` child process on a free loopback port."""

    def __init__(
        self, args: list[str], env: dict[str, str], marker_dir: Path, cwd: Path = APPS_DIR
    ) -> None:
        self._port: int | None = None
        self.marker_dir = marker_dir
        self.stderr_path = marker_dir / "stderr.log"
        self._stderr = self.stderr_path.open("wb")
        full_env = {**os.environ, **env, "TESTS_MARKER_DIR": str(marker_dir)}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            self.command(args),
            cwd=cwd,
            env=full_env,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
        )
        self.signalled_at: float | None = None

    def command(self, args: list[str]) -> list[str]:
        """The command line; subclasses run the server another way (PID 1, plain uvicorn)."""
        return [sys.executable, "-m", "agent_server", "run", *args, "--port", "0"]

    @property
    def port(self) -> int:
        """The port the server bound (it is given port 0, so no other process can race it)."""
        if self._port is None:
            deadline = time.monotonic() + STARTUP_TIMEOUT
            while self._port is None:
                found = LISTENING.search(self.stderr())
                if found is not None:
                    self._port = int(found.group(1))
                elif self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"server never listened:\n{self.stderr()}")
                else:
                    time.sleep(0.01)
        return self._port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        """A client of this server (a subclass serving HTTPS gives its own)."""
        return httpx.Client(base_url=self.url)

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise AssertionError(f"server exited early:\n{self.stderr()}")
                try:
                    if client.get("/readyz", timeout=1.0).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.02)
        raise AssertionError(f"server not ready in {timeout}s:\n{self.stderr()}")

    def wait_marker(self, name: str, timeout: float = 10.0) -> None:
        """Wait until a reasoner touched its marker file (it has really started)."""
        path = self.marker_dir / name
        deadline = time.monotonic() + timeout
        while not path.exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"marker {name} not seen in {timeout}s:\n{self.stderr()}")
            time.sleep(0.01)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds from the first signal to exit; fails fast on a hang."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"server did not exit in {timeout}s:\n{self.stderr()}") from None
        elapsed = time.monotonic() - (self.signalled_at or time.monotonic())
        return code, elapsed

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._stderr.close()


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
