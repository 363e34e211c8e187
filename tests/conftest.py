"""Shared fixtures: an in-process client for the ASGI app, and real server processes."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import NoReturn

import httpx
import pytest

TESTS_DIR = Path(__file__).parent
#: Every wait in the end-to-end tests is bounded by this (seconds) unless it says otherwise.
STARTUP_TIMEOUT = 15.0

sys.path.insert(0, str(TESTS_DIR))

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
    """`python -m agent_server ARGS` from the tests' directory, expected to answer and exit
    at once (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "agent_server", *args],
        cwd=TESTS_DIR,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


class ServerProcess:
    """A real `agent-server run` child process on a free loopback port."""

    def __init__(
        self, args: list[str], env: dict[str, str], marker_dir: Path, cwd: Path = TESTS_DIR
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


@pytest.fixture
def server_factory(tmp_path: Path) -> Iterator[object]:
    """Start servers with `server_factory(*args, env={...})`; all are killed at the end."""
    started: list[ServerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None, ready: bool = True) -> ServerProcess:
        marker_dir = tmp_path / f"server{len(started)}"
        marker_dir.mkdir()
        server = ServerProcess(list(args), env or {}, marker_dir)
        started.append(server)
        if ready:
            server.wait_ready()
        return server

    yield start
    for server in started:
        server.close()


@pytest.fixture
async def app_client() -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client for a fresh agent with the tests app's reasoners."""
    from tests_app import make_agent

    agent = make_agent()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        yield client


# -- a real Redis for the store tests ---------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real `redis-server` per test module (Debian's package; `.ci/run` installs it)."""
    from redis_server import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[object]:
    """A redis-server of this test's own, which the test may stop, pause (SIGSTOP: SIGKILL
    still ends it) or start again on the same port."""
    from redis_server import RedisServer

    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture
def redis_url(redis_server: object) -> str:
    """The module's Redis, emptied for this test (FLUSHALL)."""
    from redis_server import RedisServer

    assert isinstance(redis_server, RedisServer)
    if not redis_server.ping():  # a test stopped it: start it again
        redis_server.start()
    assert redis_server.command("FLUSHALL") == b"+OK\r\n"
    return redis_server.url


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
