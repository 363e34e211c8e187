"""What every benchmark shares: real server processes on loopback, two load generators (wrk and
a small keep-alive HTTP/1.1 client), the quiet-machine gate, and median/spread statistics.

Every wait is bounded; every load loop is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_server.process.launcher import Launched, LaunchError, run_command
from agent_server.process.launcher import free_port as free_port

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "out"
#: Peer frameworks live in their own virtual environments, outside the repository.
PEERS_DIR = Path(os.environ.get("BENCH_PEERS_DIR", "/work/peers"))
AGENTFIELD_PYTHON = PEERS_DIR / "agentfield-venv" / "bin" / "python"
MAF_PYTHON = PEERS_DIR / "maf-venv" / "bin" / "python"
HOST = "127.0.0.1"
STARTUP_TIMEOUT = 60.0


def split_cpus() -> tuple[set[int], set[int]] | None:
    """One CPU for the servers and another for the load generator, when there are two.

    Pinned, each server measured has one core to itself and wrk the other, the same for every
    server. An option, not the default, so default runs compare with the earlier ones; with
    the wait for quiet (`settle`) pinned and unpinned runs agree (bench/RESULTS.md, G and H).
    """
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return {cpus[0]}, {cpus[1]}


def _pin(cpus: set[int] | None) -> Callable[[], None] | None:
    """A `preexec_fn` that pins the child, so every thread it starts is pinned too."""
    if cpus is None:
        return None
    chosen = set(cpus)
    return lambda: os.sched_setaffinity(0, chosen)


def log(message: str) -> None:
    """Progress goes to stderr so stdout stays the results."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# -- server processes ------------------------------------------------------------------------


def agent_server_argv(port: int, app: str | None = None, *flags: str) -> list[str]:
    """`agent-server run [APP]` exactly as a user starts it."""
    return run_command(app or None, "--port", str(port), *flags, port=None)


def baseline_argv(port: int, *flags: str) -> list[str]:
    return [sys.executable, "-m", "bench.baseline_app", "--port", str(port), *flags]


def agentfield_argv(port: int) -> list[str]:
    return [str(AGENTFIELD_PYTHON), str(ROOT / "bench" / "peer_agentfield_app.py"), str(port)]


def peer_version(python: Path, distribution: str) -> str | None:
    """The installed version of a peer package in its own environment, or None if absent."""
    if not python.exists():
        return None
    code = f"import importlib.metadata as m; print(m.version({distribution!r}))"
    try:
        done = subprocess.run(
            [str(python), "-c", code], capture_output=True, text=True, timeout=60, check=True
        )
    except (subprocess.SubprocessError, OSError):
        return None
    return done.stdout.strip()


class ServerProcess:
    """One real server process on a loopback port (the package's launcher); stopped (bounded)
    when the block ends."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        port: int,
        *,
        ready_path: str = "/readyz",
        env: dict[str, str] | None = None,
        cwd: Path = ROOT,
        cpus: set[int] | None = None,
    ) -> None:
        self.name = name
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.ready_path = ready_path
        self.launched = Launched(
            argv,
            cwd=cwd,
            env={**(env or {}), "PYTHONUNBUFFERED": "1"},
            preexec_fn=_pin(cpus),  # sets only the CPU mask: no lock is taken
        )
        self.proc = self.launched.proc

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def signalled_at(self) -> float | None:
        return self.launched.signalled_at

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> None:
        def ready() -> bool:
            try:
                with urllib.request.urlopen(self.url + self.ready_path, timeout=1.0) as reply:
                    return bool(reply.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            self.launched.wait_until(ready, timeout, interval=0.05)
        except LaunchError as exc:
            said = "exited early" if exc.code is not None else f"not ready in {timeout}s"
            raise RuntimeError(f"{self.name} {said}:\n{self.stderr()[-4000:]}") from None

    def rss_bytes(self) -> int:
        """Resident set size from /proc (VmRSS)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("VmRSS not found")

    def cpu_seconds(self) -> float:
        """User + system CPU time the process has used (clock ticks, so 10 ms resolution)."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat.rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.launched.signal(sig)

    def wait_exit(self, timeout: float) -> tuple[int, float]:
        """Exit code and seconds from the first signal to the exit, to the millisecond;
        `timeout` counts from the signal."""
        started = self.signalled_at if self.signalled_at is not None else time.monotonic()
        try:
            return self.launched.wait_exit(max(0.0, started + timeout - time.monotonic()))
        except TimeoutError:
            raise TimeoutError(f"{self.name} did not exit within {timeout}s") from None

    def stderr(self) -> str:
        return self.launched.log_text()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it does not end in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.launched.close()


def shutdown_report(stderr: str) -> dict[str, Any]:
    """The structured shutdown report agent-server logs once (text log format)."""
    marker = "shutdown report: "
    for line in stderr.splitlines():
        if marker in line:
            report: dict[str, Any] = json.loads(line.split(marker, 1)[1])
            return report
    raise RuntimeError(f"no shutdown report in the log:\n{stderr[-4000:]}")


# -- statistics ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """Median and range of repeated measurements."""

    median: float
    low: float
    high: float
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        if not values:
            raise ValueError("no values")
        return cls(statistics.median(values), min(values), max(values), len(values))

    @classmethod
    def from_dict(cls, data: dict[str, float]) -> Spread:
        """A spread as `as_dict` wrote it."""
        return cls(data["median"], data["low"], data["high"], int(data["n"]))

    def fmt(self, digits: int = 2) -> str:
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"

    def as_dict(self) -> dict[str, float]:
        return {"median": self.median, "low": self.low, "high": self.high, "n": self.n}


def slope(points: Sequence[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    mean_x = statistics.fmean(xs)
    mean_y = statistics.fmean(ys)
    denominator = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / denominator


# -- the quiet-machine gate ------------------------------------------------------------------


def wait_for_quiet(
    max_load: float = 1.0, timeout: float = 3600.0, poll: float = 15.0
) -> dict[str, Any]:
    """Wait (bounded) until the 1-minute load average is below `max_load`."""
    started = time.monotonic()
    load = os.getloadavg()[0]
    while load >= max_load and time.monotonic() - started < timeout:
        log(f"load average {load:.2f} >= {max_load}: waiting")
        time.sleep(min(poll, max(0.0, timeout - (time.monotonic() - started))))
        load = os.getloadavg()[0]
    return {
        "settled": load < max_load,
        "load_1min": round(load, 2),
        "waited_seconds": round(time.monotonic() - started, 1),
    }


def machine_load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


# -- load generators -------------------------------------------------------------------------


@dataclass
class LoadResult:
    """Throughput and latency of one bounded load run."""

    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    statuses: dict[int, int] = field(default_factory=dict)
    #: Server CPU seconds spent during the run, per request, in microseconds (0: not measured).
    server_cpu_us: float = 0.0
    #: Seconds the server kept working after the run ended (see `settle`).
    settle_seconds: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


#: A server is quiet once it uses less than this share of a CPU over `QUIET_WINDOW` seconds.
QUIET_SHARE = 0.05
QUIET_WINDOW = 0.5


def settle(server: ServerProcess, limit: float = 60.0) -> float:
    """Wait until `server` stops using CPU after a load run (at most `limit` seconds); the
    seconds waited.

    A server may defer work past its answers (AgentField goes on using a whole CPU for about
    5 s per second of load): measured next, another server would share the machine with it.
    """
    started = time.monotonic()
    last = server.cpu_seconds()
    while time.monotonic() - started < limit:
        time.sleep(QUIET_WINDOW)
        now = server.cpu_seconds()
        if now - last < QUIET_SHARE * QUIET_WINDOW:
            break
        last = now
    return time.monotonic() - started


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


_WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK_JSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, '
    .. '"connect": %d, "read": %d, "write": %d, "status": %d, "timeout": %d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def run_wrk(
    url: str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    duration: float = 5.0,
    connections: int = 16,
    threads: int = 1,
    cpus: set[int] | None = None,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """One wrk run (bounded by `duration`); non-2xx/3xx answers and socket errors are errors.
    `headers` are sent with every request, beside the body's Content-Type."""
    script = [f'wrk.method = "{method}"']
    script += [f'wrk.headers["{name}"] = "{value}"' for name, value in (headers or {}).items()]
    if body is not None:
        escaped = body.decode().replace("\\", "\\\\").replace('"', '\\"')
        script.append(f'wrk.body = "{escaped}"')
        script.append('wrk.headers["Content-Type"] = "application/json"')
    for name, value in (headers or {}).items():
        script.append(f'wrk.headers["{name}"] = "{value}"')
    script.append(_WRK_DONE)
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as handle:
        handle.write("\n".join(script))
        path = handle.name
    try:
        seconds = max(1, round(duration))
        done = subprocess.run(
            [
                "wrk",
                f"-t{threads}",
                f"-c{connections}",
                f"-d{seconds}s",
                "--timeout",
                "10s",
                "-s",
                path,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=True,
            preexec_fn=_pin(cpus),  # sets only the CPU mask: no lock is taken
        )
    finally:
        os.unlink(path)
    for line in done.stdout.splitlines():
        if line.startswith("WRK_JSON "):
            data = json.loads(line.removeprefix("WRK_JSON "))
            errors = sum(data[k] for k in ("connect", "read", "write", "status", "timeout"))
            return LoadResult(
                requests=data["requests"],
                seconds=data["duration_us"] / 1e6,
                p50_ms=data["p50_us"] / 1000,
                p99_ms=data["p99_us"] / 1000,
                errors=errors,
            )
    raise RuntimeError(f"wrk printed no summary:\n{done.stdout}\n{done.stderr}")


class HttpConnection:
    """A minimal keep-alive HTTP/1.1 client connection (Content-Length bodies only)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int, host: str = HOST) -> HttpConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def request(self, raw: bytes) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = await self.reader.readexactly(length) if length else b""
        return status, headers, body

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


def http_request(
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str = HOST,
) -> bytes:
    """The raw bytes of one keep-alive request."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    for name, value in (headers or {}).items():
        lines.append(f"{name}: {value}")
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


async def drive(
    port: int,
    make_request: Callable[[int], bytes],
    *,
    count: int,
    concurrency: int,
    timeout: float,
    keep: Callable[[int, bytes], None] | None = None,
) -> LoadResult:
    """Send `count` requests over `concurrency` keep-alive connections, within `timeout`.

    `make_request(i)` gives the i-th request; `keep(status, body)` sees every answer.
    """
    deadline = time.monotonic() + timeout
    issued = 0
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    errors = 0

    async def worker() -> None:
        nonlocal issued, errors
        connection = await HttpConnection.open(port)
        try:
            while issued < count and time.monotonic() < deadline:
                index = issued
                issued += 1
                sent = time.perf_counter()
                try:
                    status, _, body = await connection.request(make_request(index))
                except (OSError, asyncio.IncompleteReadError):
                    errors += 1
                    await connection.close()
                    connection = await HttpConnection.open(port)
                    continue
                latencies.append(time.perf_counter() - sent)
                statuses[status] += 1
                if not 200 <= status < 400:
                    errors += 1
                if keep is not None:
                    keep(status, body)
        finally:
            await connection.close()

    started = time.perf_counter()
    workers = [asyncio.create_task(worker()) for _ in range(max(1, min(concurrency, count)))]
    try:
        async with asyncio.timeout(timeout + 10):
            await asyncio.gather(*workers)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    seconds = time.perf_counter() - started
    latencies.sort()
    return LoadResult(
        requests=len(latencies),
        seconds=seconds,
        p50_ms=_percentile(latencies, 0.50) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        errors=errors,
        statuses=dict(statuses),
    )


async def drive_for(
    port: int, make_request: Callable[[int], bytes], *, duration: float, concurrency: int
) -> LoadResult:
    """Load for `duration` seconds (count-bounded too): the Python stand-in for wrk."""
    return await drive(
        port, make_request, count=10_000_000, concurrency=concurrency, timeout=duration
    )


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


def write_json(name: str, data: dict[str, Any]) -> Path:
    """Keep the raw figures of a run under bench/out/ (not committed)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
