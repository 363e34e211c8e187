"""A real haproxy in front of several replicas, as a Kubernetes Service would be.

It picks a replica per request (`balance random`, one request per server connection) and
routes only to replicas whose `/readyz` answers 200, checked every 100 ms, as the
endpoints of a Service follow readiness. Bound to loopback; every wait is bounded.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import httpx

from tests.support.process import free_port, need

START_TIMEOUT = 10.0


CONFIG = """\
global
    maxconn 4096

defaults
    mode http
    timeout connect 1s
    timeout client 60s
    timeout server 60s
    timeout queue 5s
    option http-server-close
    retries 2
    option redispatch

frontend service
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance random
    option httpchk GET /readyz
    default-server inter 100ms fall 1 rise 1
{servers}
"""


class Haproxy:
    """haproxy on a free loopback port, balancing over `backends` (loopback ports)."""

    def __init__(self, directory: Path, backends: list[int]) -> None:
        need("haproxy", package="haproxy")  # skips (or fails, in CI) the test
        self.directory = directory
        self.port = free_port()
        self.config_path = directory / "haproxy.cfg"
        servers = "\n".join(
            f"    server r{index} 127.0.0.1:{port} check" for index, port in enumerate(backends)
        )
        self.config_path.write_text(CONFIG.format(port=self.port, servers=servers))
        self.log_path = directory / "haproxy.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        check = subprocess.run(
            ["haproxy", "-c", "-f", str(self.config_path)], capture_output=True, timeout=10
        )
        assert check.returncode == 0, check.stderr.decode()
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                ["haproxy", "-db", "-f", str(self.config_path)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"haproxy not serving:\n{self.log()}")
            time.sleep(0.02)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None
