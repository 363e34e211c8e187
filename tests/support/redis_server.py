"""A real `redis-server` child process on a free loopback port, for the store tests.

No fake Redis: the redis store is tested against the server it will run against. Every
wait is bounded; `stop` can save first so a restart on the same port and directory comes
back with the same data (an outage, not a data loss).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

from tests.support.process import free_port, need

#: Seconds to wait for the server to answer PING, or to exit.
START_TIMEOUT = 10.0


#: Append-only persistence as production runs it (what `deploy/` ships).
AOF = ("--appendonly", "yes", "--appendfsync", "everysec")


def redis_command(port: int, directory: Path, log_path: Path, *extra: str) -> list[str]:
    """`redis-server` on 127.0.0.1:`port`, its files in `directory`, no RDB snapshots."""
    return [
        "redis-server",
        *("--port", str(port), "--bind", "127.0.0.1", "--save", ""),
        *("--dir", str(directory), "--logfile", str(log_path)),
        *extra,
    ]


class RedisServer:
    """`redis-server` with no persistence of its own, bound to 127.0.0.1."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        need("redis-server", package="redis-server")  # skips (or fails, in CI) the test
        self.directory = directory
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = directory / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    #: How it keeps its data: nothing of its own here (AOF in the fault and Sentinel tests).
    persistence: tuple[str, ...] = ("--appendonly", "no")

    def start(self) -> None:
        """Start it and wait (bounded) until it answers PING (not while it loads its AOF)."""
        command = redis_command(self.port, self.directory, self.log_path, *self.persistence)
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + START_TIMEOUT
        while not self.ping():
            if self.proc.poll() is not None:
                raise AssertionError(f"redis-server exited early:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"redis-server silent for {START_TIMEOUT}s:\n{self.log()}")
            time.sleep(0.01)

    def ping(self) -> bool:
        return self.command("PING") == b"+PONG\r\n"

    def command(self, *args: str) -> bytes | None:
        """Send one command (RESP) and return the raw reply; None if it cannot connect."""
        request = f"*{len(args)}\r\n".encode()
        for arg in args:
            data = arg.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
                sock.sendall(request)
                return sock.recv(65536)
        except OSError:
            return None

    def stop(self, *, save: bool = False) -> None:
        """Stop it (saving its data first if asked, for a restart) and wait for the exit."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.command("SHUTDOWN", "SAVE" if save else "NOSAVE")
            try:
                self.proc.wait(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""
