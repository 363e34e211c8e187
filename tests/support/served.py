"""Server processes of the convention tests: any command, any working directory, a process
group of its own (Ctrl+C), HTTP or HTTPS."""

from __future__ import annotations

import json
import os
import signal
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from agent_server.process.launcher import run_command as launcher_command
from tests.support.process import APPS_DIR, ServerProcess

#: Every client call is bounded (as in test_shutdown).
CLIENT_TIMEOUT = 15.0


class Served(ServerProcess):
    """A server process of these tests: any command line (`agent-server run`, `python -m
    uvicorn`), in any working directory, in a session of its own (so a test can press
    Ctrl+C: SIGINT to its whole process group), over HTTP or HTTPS."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        marker_dir: Path,
        *,
        cwd: Path = APPS_DIR,
        verify: ssl.SSLContext | None = None,
    ) -> None:
        self.verify = verify
        super().__init__(command, env, marker_dir, cwd, new_session=True)

    def command(self, args: list[str]) -> list[str]:
        """The command line as given (`agent-server run`, `python -m uvicorn`, ...)."""
        return args

    @property
    def url(self) -> str:
        scheme = "http" if self.verify is None else "https"
        return f"{scheme}://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=CLIENT_TIMEOUT, verify=self.verify or True)

    def press_ctrl_c(self) -> None:
        """What a terminal does on Ctrl+C: SIGINT to every process of the group."""
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        os.killpg(self.proc.pid, signal.SIGINT)

    def json_lines(self) -> list[dict[str, Any]]:
        """The JSON log lines of stderr (`--log-format json`)."""
        lines = []
        for line in self.stderr().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines


Start = Callable[..., Served]


def run_command(*args: str) -> list[str]:
    return launcher_command(None, *args, port=None)


def launcher(tmp_path: Path) -> Iterator[Start]:
    """A fixture's body: `start(command, env=..., cwd=..., verify=..., ready=True)`; every
    process it started is killed at the end, with its process group."""
    started: list[Served] = []

    def launch(
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: Path = APPS_DIR,
        verify: ssl.SSLContext | None = None,
        ready: bool = True,
    ) -> Served:
        marker_dir = tmp_path / f"served{len(started)}"
        marker_dir.mkdir()
        server = Served(command, env or {}, marker_dir, cwd=cwd, verify=verify)
        started.append(server)
        if ready:
            server.wait_ready()
        return server

    yield launch
    for server in started:
        if server.proc.poll() is None:  # the whole group: a --reload worker too
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait()
        server.close()
