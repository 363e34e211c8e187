"""A real server process on loopback: started from a command line, known to listen once its
log says so, signalled, and awaited with a bound. The one launcher of `agent-server run` for
the tests, the benchmarks and the drill, so the command, the listening line and the bounded
waits are written once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO

#: uvicorn's start-up line names the port it bound (over HTTP or HTTPS).
LISTENING = re.compile(r"running on https?://127\.0\.0\.1:(\d+)")
HOST = "127.0.0.1"
#: How often a wait that cannot be told (a log line, a readiness answer) looks again.
POLL = 0.01


def run_command(app: str | None = None, *flags: str, port: int | None = 0) -> list[str]:
    """`python -m agent_server run [APP] FLAGS --port PORT` with this interpreter, as a user
    starts it; port 0 lets the server bind a free one (no race), None leaves the flag out."""
    target = [] if app is None else [app]
    ported = [] if port is None else ["--port", str(port)]
    return [sys.executable, "-m", "agent_server", "run", *target, *flags, *ported]


def _ephemeral_low() -> int:
    """The first port the kernel hands to outgoing connections (Linux's default otherwise)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


#: Ports `free_port` gives: below the ephemeral range, from a random start per process, so a
#: port told ahead is not taken by an outgoing connection's local port before the server binds
#: it, nor given again soon by this process, nor likely the one another process picks.
PORTS_LOW = 10_000
_ports = itertools.count(random.randrange(PORTS_LOW, max(PORTS_LOW + 1000, _ephemeral_low())))


def free_port(host: str = HOST) -> int:
    """A port free on loopback now (for servers that must be told theirs in advance, or be
    started again on the one they had)."""
    high = _ephemeral_low()
    if high - PORTS_LOW < 1000:  # no room below the ephemeral range: the kernel's own pick
        with socket.socket() as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])
    for _ in range(high - PORTS_LOW):
        port = PORTS_LOW + (next(_ports) - PORTS_LOW) % (high - PORTS_LOW)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on {host} between {PORTS_LOW} and {high}")


class LaunchError(RuntimeError):
    """The process exited before it listened (`code`), or did not listen in time (None)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.code = code


class Launched:
    """One child process with its stderr kept in a file (named or anonymous), read without
    moving the offset the child writes at."""

    def __init__(
        self,
        command: Sequence[str],
        *,
        cwd: Path | str | None = None,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        stdin: int | None = None,
        new_session: bool = False,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.command = list(command)
        self.log_path = log
        self._log: IO[bytes] = (
            log.open("w+b") if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
        )
        full_env = {**os.environ, **(env or {})}
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            self.proc = subprocess.Popen(
                self.command,
                cwd=cwd,
                env=full_env,
                stdin=stdin,
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                start_new_session=new_session,
                preexec_fn=preexec_fn,  # the benchmarks' CPU mask only: it takes no lock
            )
        except BaseException:
            self._log.close()
            raise
        #: Monotonic time of the first signal sent (None: never signalled).
        self.signalled_at: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        """Everything the child wrote on stderr so far (a named log is still read once
        closed)."""
        if self._log.closed:
            return "" if self.log_path is None else self.log_path.read_text(errors="replace")
        self._log.flush()
        fd = self._log.fileno()
        chunks, offset = [], 0
        while chunk := os.pread(fd, 1 << 16, offset):
            chunks.append(chunk)
            offset += len(chunk)
        return b"".join(chunks).decode(errors="replace")

    def listened(self) -> int | None:
        """The port the log says the server bound, if it said so yet."""
        found = LISTENING.search(self.log_text())
        return None if found is None else int(found.group(1))

    def _not_listening(self, deadline: float, timeout: float) -> LaunchError | None:
        code = self.proc.poll()
        if code is not None and self.listened() is None:
            return LaunchError(f"the server exited {code} before it listened", code)
        if time.monotonic() > deadline:
            return LaunchError(f"the server did not listen within {timeout:g} s", None)
        return None

    def listening_port(self, timeout: float) -> int:
        """The port, once the server listens; LaunchError if it exits first or is late."""
        deadline = time.monotonic() + timeout
        while (port := self.listened()) is None:
            if (error := self._not_listening(deadline, timeout)) is not None:
                raise error
            time.sleep(POLL)
        return port

    async def listening(self, timeout: float) -> int:
        """`listening_port` for a caller on an event loop."""
        deadline = time.monotonic() + timeout
        while (port := self.listened()) is None:
            if (error := self._not_listening(deadline, timeout)) is not None:
                raise error
            await asyncio.sleep(POLL)
        return port

    def wait_until(self, ready: Callable[[], bool], timeout: float, interval: float) -> None:
        """Ask `ready` until it says yes; LaunchError if the process exits or time runs out
        first (what `ready` raises is the caller's: a refused connection is its to swallow)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise LaunchError(f"the server exited {code} early", code)
            if ready():
                return
            time.sleep(interval)
        raise LaunchError(f"the server was not ready in {timeout:g} s", None)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        """Send `sig`; the first signal starts the clock of `wait_exit`."""
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds from the first signal to the exit (a pidfd turns readable
        the moment it ends: no polling step in the figure); past `timeout` seconds from now
        it is killed and TimeoutError raised."""
        deadline = time.monotonic() + timeout
        try:
            fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            fd = None
        try:
            if fd is not None:
                readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
                ended = time.monotonic()
                if not readable:
                    raise TimeoutError
                code = self.proc.wait(timeout=5)
            else:
                code = self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                ended = time.monotonic()
        except (TimeoutError, subprocess.TimeoutExpired):
            self.kill()
            raise TimeoutError(f"the server did not exit within {timeout:g} s") from None
        finally:
            if fd is not None:
                os.close(fd)
        return code, ended - (self.signalled_at if self.signalled_at is not None else ended)

    async def exited(self, timeout: float) -> tuple[int, float]:
        """`wait_exit` for a caller on an event loop (the pidfd watched by the loop)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[float] = loop.create_future()
        try:
            fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):  # already reaped, or no pidfd here
            return await asyncio.to_thread(self.wait_exit, timeout)

        def readable() -> None:
            if not done.done():
                done.set_result(time.monotonic())

        loop.add_reader(fd, readable)
        try:
            ended = await asyncio.wait_for(asyncio.shield(done), timeout)
        except TimeoutError:
            self.kill()
            raise TimeoutError(f"the server did not exit within {timeout:g} s") from None
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        code = self.proc.wait(timeout=5)
        return code, ended - (self.signalled_at if self.signalled_at is not None else ended)

    def kill(self) -> None:
        """SIGKILL, and reap it (bounded)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=10)

    def close(self) -> None:
        """Kill it if it still runs; close the log (a named one stays on disk)."""
        self.kill()
        with contextlib.suppress(OSError):
            self._log.close()
