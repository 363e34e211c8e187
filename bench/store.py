"""The execution store: what the redis store costs, measured against real processes and a real
`redis-server` on loopback (docs/replicas.md, what one life costs in script calls).

1. Redis round trips and commands per execution life (an async start, its end, one status
   read). Commands are counted twice: by Redis itself (`INFO commandstats` after `CONFIG
   RESETSTAT`, which also counts the commands run inside the Lua scripts), and by a relay
   between agent-server and Redis that reads every command the client sends. The relay
   counts round trips: a round trip is a run of bytes the client sends on one connection
   before Redis answers on it, so a pipeline of several EVALSHAs is one.
2. Background start + wait throughput (`POST /reasoners/echo/async`, then
   `GET /executions/{id}?wait=5`) with the redis store against the memory store: both servers
   up together, each measured twice per round in mirrored order (A B B A), ratio per round.
3. Sync echo with the memory store against the tree before the store change (`--before DIR`,
   a checkout holding `agent_server/`), with bench.http_overhead's measurement (wrk, a wait
   for quiet after every run), the bare Starlette route beside them, mirrored order.
4. Renewal cost with 1, 100, 1,000, 10,000 executions in flight on one replica: Redis
   commands per liveness tick and Redis time per tick, with a short `--lease-ttl`.
5. Cross-replica long-poll wake: executions started on replica A all end at about the same
   wall-clock time; one `GET ?wait=30` per execution waits on replica B; latency is when the
   poll returned minus the execution's recorded `finished_at` (one machine, one clock). The
   same with one memory-store process, for reference.
6. Redis memory per retained small execution: `used_memory` before and after N finished
   echo executions.
7. Sync echo throughput (`POST /reasoners/echo`, bench.http_overhead's sync scenario and
   measurement) with the redis store against the memory store: both servers up together,
   each measured twice per round in mirrored order (A B B A), ratio per round; server and
   redis-server CPU per request. A sync run on Redis answers once its end is recorded.

`--source DIR` serves agent-server from another checkout (default: this repository), so a
run can measure a commit while the working tree changes. `--quick` is the smoke size.

Usage: python -m bench.store [--quick] [--items 1,2,3,4,5,6,7] [--source DIR] [--before DIR]
                             [--rounds 4] [--waiters 1000] ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import select
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    HOST,
    ROOT,
    HttpConnection,
    LoadResult,
    ServerProcess,
    Spread,
    agent_server_argv,
    baseline_argv,
    free_port,
    have_wrk,
    http_request,
    log,
    machine_load,
    settle,
    write_json,
)

#: The demo agent (`agent-server run` with no APP) serves every item: `echo` and `sleep`.
#: Its keys, under their hash tag (agent_server/store/redis/keys.py).
PREFIX = "{agent-server:demo}:"
ECHO_BODY = b'{"text": "hello"}'
#: Commands a connection sends when it opens (redis-py), not part of any execution's life.
SETUP_COMMANDS = frozenset({"CLIENT", "HELLO", "AUTH", "SELECT", "PING", "SCRIPT"})
#: Scripts a replica runs on its own clock, not for any one execution: the liveness tick and,
#: where the tree has durable executions, the queue taker's claim poll.
BACKGROUND_SCRIPTS = frozenset({"script tick", "script claim"})
#: This harness's own commands, left out of the counts.
OWN_COMMANDS = ("cmdstat_info", "cmdstat_config|resetstat")
#: How a client calls a script: by its SHA (a tree before functions), or its function.
SCRIPT_CALLS = frozenset({"EVALSHA", "FCALL"})


def scripted(stats: dict[str, Any]) -> dict[str, float]:
    """The calls and time of every script call in `commandstats` (EVALSHA or FCALL; their
    time includes the commands their scripts ran)."""
    rows = [stats[k] for k in ("evalsha", "fcall") if k in stats]
    return {
        "calls": float(sum(r["calls"] for r in rows)),
        "usec": float(sum(r["usec"] for r in rows)),
    }


# -- redis-server ----------------------------------------------------------------------------


class RedisServer:
    """`redis-server` on a free loopback port, no persistence; every wait bounded (the same
    approach as tests/support/redis_server.py)."""

    def __init__(self, *extra: str, wrapper: tuple[str, ...] = ()) -> None:
        self.port = free_port()
        #: What runs redis-server (`valgrind ...`), if anything.
        self.wrapper = wrapper
        self.directory = Path(tempfile.mkdtemp(prefix="bench-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None
        #: More flags (`--replicaof HOST PORT` for a replica).
        self.extra = extra

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def __enter__(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [
                *self.wrapper,
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                HOST,
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--logfile",
                str(self.directory / "redis.log"),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                if self.command("PING") == "PONG":
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.01)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError, RuntimeError):  # no reply: it has exited
                self.command("SHUTDOWN", "NOSAVE")
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)

    def command(self, *args: str) -> Any:
        """One command on a fresh connection; the decoded reply (strings, ints, lists)."""
        request = b"*%d\r\n" % len(args)
        for arg in args:
            data = arg.encode()
            request += b"$%d\r\n%s\r\n" % (len(data), data)
        with socket.create_connection((HOST, self.port), timeout=5.0) as sock:
            sock.sendall(request)
            stream = sock.makefile("rb")
            return _read_reply(stream)

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def info(self, section: str) -> dict[str, str]:
        text = self.command("INFO", section)
        found: dict[str, str] = {}
        for line in text.splitlines():
            if ":" in line and not line.startswith("#"):
                key, value = line.split(":", 1)
                found[key] = value
        return found

    def commandstats(self) -> dict[str, dict[str, float]]:
        """calls and usec per command since the last reset, without this harness's own."""
        stats: dict[str, dict[str, float]] = {}
        for key, value in self.info("commandstats").items():
            if key in OWN_COMMANDS:
                continue
            parts = dict(item.split("=", 1) for item in value.split(","))
            stats[key.removeprefix("cmdstat_")] = {
                "calls": float(parts["calls"]),
                "usec": float(parts["usec"]),
            }
        return stats

    def reset_stats(self) -> None:
        self.command("CONFIG", "RESETSTAT")


def _read_reply(stream: Any) -> Any:
    line = stream.readline()
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest.decode()
    if kind == b"-":
        raise RuntimeError(rest.decode())
    if kind == b":":
        return int(rest)
    if kind == b"$":
        length = int(rest)
        return None if length < 0 else stream.read(length + 2)[:-2].decode()
    if kind == b"*":
        length = int(rest)
        return None if length < 0 else [_read_reply(stream) for _ in range(length)]
    raise RuntimeError(f"unexpected reply {line!r}")


def script_names(source: Path) -> dict[str, str]:
    """SHA1 or function name -> script name of the store's Lua scripts in the tree under test."""
    code = (
        "import json; from agent_server.store.redis import scripts as s; "
        "n = {v: k for k, v in getattr(s, 'SHAS', {}).items()}; "
        "n.update({f: k for k, (f, _) in getattr(s, 'LIBRARIES', {}).items()}); "
        "print(json.dumps(n))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=source, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        return {}
    names: dict[str, str] = json.loads(done.stdout)
    return names


# -- a relay that counts round trips ---------------------------------------------------------


def _keys(arguments: list[bytes]) -> int:
    """The number of keys of an EVALSHA (its third argument)."""
    return int(arguments[2]) if len(arguments) > 2 and arguments[2].isdigit() else 0


class _Commands:
    """Reads RESP commands from a byte stream as it arrives; keeps each command's first two
    arguments (the name, and the SHA of an EVALSHA)."""

    def __init__(self, keep: int = 2) -> None:
        self.buffer = bytearray()
        self.keep = keep
        #: How many arguments each command of the last `feed` had in all.
        self.sizes: list[int] = []

    def feed(self, data: bytes) -> list[list[bytes]]:
        self.buffer += data
        found: list[list[bytes]] = []
        self.sizes = []
        position = 0
        while (parsed := self._one(position)) is not None:
            arguments, position = parsed
            found.append(arguments)
        del self.buffer[:position]
        return found

    def _one(self, position: int) -> tuple[list[bytes], int] | None:
        buffer = self.buffer
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        if buffer[position : position + 1] != b"*":  # an inline command
            words = bytes(buffer[position:end]).split()
            self.sizes.append(len(words))
            return words[:2], end + 2
        count = int(buffer[position + 1 : end])
        position = end + 2
        arguments: list[bytes] = []
        for _ in range(count):
            end = buffer.find(b"\r\n", position)
            if end < 0:
                return None
            length = int(buffer[position + 1 : end])
            start = end + 2
            if len(buffer) < start + length + 2:
                return None
            if len(arguments) < self.keep:
                arguments.append(bytes(buffer[start : start + length]))
            position = start + length + 2
        self.sizes.append(count)
        return arguments, position


@dataclass
class _Flight:
    """The commands a client sent on one connection before Redis answered."""

    commands: list[str] = field(default_factory=list)
    #: Ends written by its `end` scripts (one call writes a run of them, 10 arguments each).
    ends: int = 0


class CountingRelay:
    """A TCP relay between agent-server and Redis, on its own thread, that counts the
    commands the client sends (EVALSHA by script name) and its round trips: a round trip
    begins when the client sends on a connection where Redis has answered everything sent
    before, so one pipeline is one round trip however many commands it holds."""

    def __init__(self, target_port: int, scripts: dict[str, str]) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.scripts = scripts
        self.lock = threading.Lock()
        self.commands: Counter[str] = Counter()
        self.round_trips: Counter[str] = Counter()  # "work" or "setup"
        self.batch_sizes: Counter[int] = Counter()  # commands per work round trip
        self.ends_answered = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="relay", daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def __enter__(self) -> CountingRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def reset(self) -> None:
        with self.lock:
            self.commands.clear()
            self.round_trips.clear()
            self.batch_sizes.clear()
            self.ends_answered = 0

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {
                "commands": dict(self.commands),
                "round_trips": dict(self.round_trips),
                "batch_sizes": dict(self.batch_sizes),
                "ends_answered": self.ends_answered,
            }

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.ensure_future(self._connection(reader, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        server = await asyncio.start_server(accept, HOST, self.port)
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _name(self, arguments: list[bytes]) -> str:
        name = arguments[0].decode(errors="replace").upper() if arguments else "?"
        if name in SCRIPT_CALLS and len(arguments) > 1:
            sha = arguments[1].decode(errors="replace")
            return f"script {self.scripts.get(sha, sha[:8])}"
        return name

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection(HOST, self.target_port)
        parser = _Commands(keep=3)  # the name, the SHA and the number of keys
        flight: list[_Flight | None] = [None]

        def answered() -> None:
            current = flight[0]
            if current is None:
                return
            flight[0] = None
            base = {name.split(" ", 1)[0] for name in current.commands}
            if base <= SETUP_COMMANDS:
                kind = "setup"
            elif set(current.commands) <= BACKGROUND_SCRIPTS:
                kind = "background"
            else:
                kind = "work"
            self.round_trips[kind] += 1
            if kind == "work":
                self.batch_sizes[len(current.commands)] += 1
            self.ends_answered += current.ends

        async def outbound() -> None:
            while data := await reader.read(65536):
                commands = parser.feed(data)
                names = [self._name(a) for a in commands]
                with self.lock:
                    current = flight[0]
                    if current is None:
                        current = flight[0] = _Flight()
                    current.commands.extend(names)
                    current.ends += sum(
                        # EVALSHA, sha, numkeys, the keys, the common arguments (three, or
                        # four with the prefix of a tree before the hash tag) and the size
                        # bound, then ten per end.
                        (size - 7 - _keys(arguments)) // 10
                        for size, arguments, name in zip(parser.sizes, commands, names, strict=True)
                        if name == "script end"
                    )
                    self.commands.update(names)
                upstream_writer.write(data)
                await upstream_writer.drain()

        async def inbound() -> None:
            while data := await upstream_reader.read(65536):
                with self.lock:
                    answered()
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(outbound()), asyncio.ensure_future(inbound())]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for stream in (writer, upstream_writer):
                stream.close()

    def wait_ends(self, count: int, timeout: float) -> bool:
        """Until Redis has answered `count` end scripts since the reset (bounded)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.ends_answered >= count:
                    return True
            time.sleep(0.0005)
        return False


class EndNotices:
    """A subscriber of the store's `ends` channel on its own thread: when each end notice
    reached a client of Redis (wall clock), to split a waiter's latency into the part before
    the notice (the owner's outbox and Redis) and the part after (the waiting replica)."""

    def __init__(self, port: int, channel: str) -> None:
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._sock = socket.create_connection((HOST, port), timeout=5.0)
        data = channel.encode()
        self._sock.sendall(b"*2\r\n$9\r\nSUBSCRIBE\r\n$%d\r\n%s\r\n" % (len(data), data))
        self._parser = _Commands(keep=3)
        self._thread = threading.Thread(target=self._read, name="ends", daemon=True)

    def __enter__(self) -> EndNotices:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()

    def _read(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select([self._sock], [], [], 0.1)
            if not readable:
                continue
            chunk = self._sock.recv(1 << 20)
            now = time.time()
            if not chunk:
                return
            for message in self._parser.feed(chunk):
                if len(message) == 3 and message[0] == b"message":
                    for execution_id in _noticed_ids(message[2].decode()):
                        self.seen.setdefault(execution_id, now)


def _noticed_ids(data: str) -> list[str]:
    """The ids of an end notice: space-separated ids, or `@{writer} ` and a JSON list of
    records and ids."""
    if data.startswith("@"):
        data = data.partition(" ")[2]
    if not data.startswith("["):
        return data.split()
    return [item if isinstance(item, str) else str(item[0]) for item in json.loads(data)]


class Monitor:
    """`MONITOR` on its own connection and thread: every command Redis runs, in order, so the
    commands a script runs (logged as `lua`) are counted against the EVALSHA that ran them."""

    def __init__(self, port: int, scripts: dict[str, str]) -> None:
        self.port = port
        self.scripts = scripts
        self.groups: Counter[str] = Counter()  # top-level command -> calls
        self.inner: Counter[str] = Counter()  # top-level command -> commands its script ran
        self._current: str | None = None
        self._stop = threading.Event()
        self._sock = socket.create_connection((HOST, port), timeout=5.0)
        self._sock.sendall(b"*1\r\n$7\r\nMONITOR\r\n")
        self._buffer = b""
        while b"\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise RuntimeError("MONITOR refused")
            self._buffer += chunk
        first, self._buffer = self._buffer.split(b"\r\n", 1)
        if first != b"+OK":
            raise RuntimeError(f"MONITOR refused: {first!r}")
        self._thread = threading.Thread(target=self._read, name="monitor", daemon=True)

    def __enter__(self) -> Monitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self._sock.close()

    def _read(self) -> None:
        buffer = self._buffer
        while not self._stop.is_set():
            readable, _, _ = select.select([self._sock], [], [], 0.1)
            if not readable:
                continue
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                return
            buffer += chunk
            *lines, buffer = buffer.split(b"\r\n")
            for line in lines:
                self._line(line.decode(errors="replace"))

    def _line(self, line: str) -> None:
        # +1796057917.527159 [0 127.0.0.1:59096] "evalsha" "<sha>" "0" ...
        _, _, rest = line.partition("[")
        source, _, command = rest.partition("] ")
        words = command.split('"')
        name = words[1].upper() if len(words) > 1 else "?"
        if source.endswith(" lua"):
            if self._current is not None:
                self.inner[self._current] += 1
            return
        if name in SCRIPT_CALLS and len(words) > 3:
            name = f"script {self.scripts.get(words[3], words[3][:8])}"
        if name in ("INFO", "CONFIG", "MONITOR"):
            self._current = None
            return
        self._current = name
        self.groups[name] += 1

    def snapshot(self) -> dict[str, dict[str, int]]:
        time.sleep(0.1)  # the last lines arrive
        return {"calls": dict(self.groups), "inner": dict(self.inner)}

    def reset(self) -> None:
        time.sleep(0.1)
        self.groups.clear()
        self.inner.clear()


# -- servers and clients ---------------------------------------------------------------------


def agent_server(
    name: str, source: Path, *flags: str, env: dict[str, str] | None = None
) -> ServerProcess:
    port = free_port()
    argv = agent_server_argv(port, None, "--log-level", "warning", *flags)
    return ServerProcess(name, argv, port, cwd=source, env=env)


def redis_flags(url: str, replica: str, *more: str) -> list[str]:
    return ["--store", url, "--replica-id", replica, *more]


def _json_body(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)
    return data


async def start_many(
    port: int,
    count: int,
    *,
    reasoner: str = "echo",
    body: Callable[[int], bytes] = lambda _: ECHO_BODY,
    concurrency: int = 32,
    timeout: float = 120.0,
    sync: bool = False,
) -> list[str]:
    """`count` starts over keep-alive connections (bounded in count and time); their ids
    (async) or nothing (sync, every answer checked)."""
    ids: list[str] = []
    issued = 0
    deadline = time.monotonic() + timeout
    path = f"/reasoners/{reasoner}" if sync else f"/reasoners/{reasoner}/async"
    expected = 200 if sync else 202

    async def worker() -> None:
        nonlocal issued
        connection = await HttpConnection.open(port)
        try:
            while issued < count and time.monotonic() < deadline:
                index = issued
                issued += 1
                status, _, answer = await connection.request(
                    http_request("POST", path, body(index))
                )
                if status != expected:
                    raise RuntimeError(f"start answered {status}: {answer[:200]!r}")
                if not sync:
                    ids.append(str(_json_body(answer)["execution_id"]))
        finally:
            await connection.close()

    async with asyncio.timeout(timeout + 10):
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, count)))))
    if issued < count:
        raise RuntimeError(f"only {issued} of {count} starts within {timeout}s")
    return ids


async def get_many(
    port: int, ids: list[str], *, concurrency: int = 16, timeout: float = 60.0
) -> Counter[str]:
    """One status read per id; the statuses read."""
    statuses: Counter[str] = Counter()
    queue = list(reversed(ids))
    deadline = time.monotonic() + timeout

    async def worker() -> None:
        connection = await HttpConnection.open(port)
        try:
            while queue and time.monotonic() < deadline:
                key = queue.pop()
                status, _, body = await connection.request(
                    http_request("GET", f"/executions/{key}")
                )
                statuses[str(_json_body(body)["status"]) if status == 200 else str(status)] += 1
        finally:
            await connection.close()

    async with asyncio.timeout(timeout + 10):
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, len(ids))))))
    return statuses


async def lives(
    port: int,
    count: int,
    concurrency: int,
    timeout: float,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """`count` lives of `echo` (an async start, then `GET ?wait=5`), `concurrency` clients at
    once, each on its own keep-alive connection (every request with `headers`: a caller's
    token); bounded in count and time."""
    deadline = time.monotonic() + timeout
    issued = 0
    errors = 0
    latencies: list[float] = []
    statuses: Counter[int] = Counter()

    async def worker() -> None:
        nonlocal issued, errors
        connection = await HttpConnection.open(port)
        try:
            while issued < count and time.monotonic() < deadline:
                issued += 1
                began = time.perf_counter()
                status, _, body = await connection.request(
                    http_request("POST", "/reasoners/echo/async", ECHO_BODY, headers)
                )
                statuses[status] += 1
                if status != 202:
                    errors += 1
                    continue
                key = _json_body(body)["execution_id"]
                status, _, body = await connection.request(
                    http_request("GET", f"/executions/{key}?wait=5", None, headers)
                )
                statuses[status] += 1
                if status != 200 or _json_body(body)["status"] != "succeeded":
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - began)
        finally:
            await connection.close()

    began = time.perf_counter()
    async with asyncio.timeout(timeout + 10):
        await asyncio.gather(*(worker() for _ in range(max(1, min(concurrency, count)))))
    seconds = time.perf_counter() - began
    latencies.sort()
    return LoadResult(
        requests=len(latencies),
        seconds=seconds,
        p50_ms=_quantile(latencies, 0.50) * 1000,
        p99_ms=_quantile(latencies, 0.99) * 1000,
        errors=errors,
        statuses=dict(statuses),
    )


def _quantile(values: list[float], fraction: float) -> float:
    """Nearest rank on sorted values."""
    if not values:
        return 0.0
    return values[min(len(values) - 1, round(fraction * (len(values) - 1)))]


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# -- item 1: round trips per life ------------------------------------------------------------


def item_round_trips(source: Path, n: int, progress: Callable[[str], None]) -> dict[str, Any]:
    """Four kinds of life, each over `n` executions: round trips and client commands by the
    relay, the commands each script ran by MONITOR, totals by `INFO commandstats`."""
    scripts = script_names(source)
    found: dict[str, Any] = {"n": n, "scenarios": {}}
    with (
        RedisServer() as redis,
        CountingRelay(redis.port, scripts) as relay,
        Monitor(redis.port, scripts) as monitor,
    ):
        # A long lease: no liveness tick falls inside the counted window (item 4 counts those).
        flags = redis_flags(relay.url, "bench-a", "--lease-ttl", "600")
        with agent_server("agent-server redis", source, *flags) as server:
            server.wait_ready()

            def counted(name: str, lives_counted: int, body: Callable[[], dict[str, Any]]) -> None:
                monitor.reset()
                redis.reset_stats()
                relay.reset()
                extra = body()
                time.sleep(0.05)  # the last replies reach the relay
                stats = redis.commandstats()
                seen = relay.snapshot()
                ran = monitor.snapshot()
                life = {
                    k: c
                    for k, c in seen["commands"].items()
                    if k not in BACKGROUND_SCRIPTS and k.split(" ", 1)[0] not in SETUP_COMMANDS
                }
                inner = sum(ran["inner"].get(k, 0) for k in life)
                per = float(lives_counted)
                entry = {
                    "lives": lives_counted,
                    "round_trips_per_life": seen["round_trips"].get("work", 0) / per,
                    "evalsha_per_life": sum(c for k, c in life.items() if k.startswith("script "))
                    / per,
                    "client_commands_per_life": sum(life.values()) / per,
                    "commands_in_scripts_per_life": inner / per,
                    "by_command_per_life": {k: c / per for k, c in sorted(life.items())},
                    "commands_per_script_call": {
                        k: 1 + ran["inner"].get(k, 0) / ran["calls"][k]
                        for k in sorted(life)
                        if ran["calls"].get(k)
                    },
                    "background": {
                        k: c for k, c in seen["commands"].items() if k in BACKGROUND_SCRIPTS
                    },
                    "background_round_trips": seen["round_trips"].get("background", 0),
                    "setup_round_trips": seen["round_trips"].get("setup", 0),
                    "setup_commands": {
                        k: c
                        for k, c in seen["commands"].items()
                        if k.split(" ", 1)[0] in SETUP_COMMANDS
                    },
                    # EVALSHA time includes the commands its script ran (those rows count them
                    # again); the background scripts in the window are in it too.
                    "redis_usec_per_life": scripted(stats)["usec"] / per,
                    "check_commandstats_calls": sum(s["calls"] for s in stats.values()),
                    "check_monitor_calls": sum(ran["calls"].values()) + sum(ran["inner"].values()),
                    "batch_sizes": seen["batch_sizes"],
                    "commandstats": stats,
                    **extra,
                }
                found["scenarios"][name] = entry
                progress(
                    f"item 1 {name}: {entry['round_trips_per_life']:.2f} round trips, "
                    f"{entry['evalsha_per_life']:.2f} script calls, "
                    f"{entry['commands_in_scripts_per_life']:.1f} commands in scripts per life"
                )

            def one_by_one() -> dict[str, Any]:
                async def go() -> Counter[str]:
                    statuses: Counter[str] = Counter()
                    connection = await HttpConnection.open(server.port)
                    try:
                        for index in range(n):
                            (key,) = await start_many(server.port, 1, concurrency=1)
                            if not await asyncio.to_thread(relay.wait_ends, index + 1, 10.0):
                                raise RuntimeError("an end was not written within 10 s")
                            status, _, body = await connection.request(
                                http_request("GET", f"/executions/{key}")
                            )
                            read = _json_body(body)["status"] if status == 200 else status
                            statuses[str(read)] += 1
                    finally:
                        await connection.close()
                    return statuses

                return {"statuses": dict(asyncio.run(go()))}

            def concurrent() -> dict[str, Any]:
                ids = asyncio.run(start_many(server.port, n, concurrency=16))
                if not relay.wait_ends(n, 30.0):
                    raise RuntimeError("ends were not written within 30 s")
                return {"statuses": dict(asyncio.run(get_many(server.port, ids)))}

            def sync_runs() -> dict[str, Any]:
                asyncio.run(start_many(server.port, n, concurrency=1, sync=True))
                relay.wait_ends(n, 30.0)
                return {}

            def long_polls() -> dict[str, Any]:
                async def go() -> Counter[str]:
                    statuses: Counter[str] = Counter()
                    connection = await HttpConnection.open(server.port)
                    try:
                        for _ in range(polls):
                            (key,) = await start_many(
                                server.port,
                                1,
                                reasoner="sleep",
                                body=lambda _: b'{"seconds": 0.05}',
                                concurrency=1,
                            )
                            status, _, body = await connection.request(
                                http_request("GET", f"/executions/{key}?wait=5")
                            )
                            read = _json_body(body)["status"] if status == 200 else status
                            statuses[str(read)] += 1
                    finally:
                        await connection.close()
                    return statuses

                return {"statuses": dict(asyncio.run(go()))}

            polls = max(5, n // 4)
            counted("start, end, GET (one at a time)", n, one_by_one)
            counted("start, end, GET (16 clients)", n, concurrent)
            counted("sync POST /reasoners/echo (one at a time)", n, sync_runs)
            counted("start, GET ?wait=5 of a 0.05 s sleep (one at a time)", polls, long_polls)
    return found


# -- profiles (--profile) --------------------------------------------------------------------


class Spy:
    """`py-spy record` of one server process for `seconds` (sampling, no instrumentation),
    collapsed stacks to bench/out/; `top()` ranks its frames (bench.profile_server)."""

    def __init__(
        self, server: ServerProcess, seconds: float, name: str, delay: float = 0.0
    ) -> None:
        from bench.common import OUT_DIR

        OUT_DIR.mkdir(parents=True, exist_ok=True)
        self.path = OUT_DIR / f"profile-store-{name}-{time.strftime('%H%M%S')}.collapsed"
        self.server = server
        self.seconds = seconds
        self.proc: subprocess.Popen[bytes] | None = None
        if delay > 0:  # from `delay` seconds from now (a timer thread), not attached before
            self._timer: threading.Timer | None = threading.Timer(delay, self._start)
            self._timer.start()
        else:
            self._timer = None
            self._start()
            time.sleep(0.5)  # attached before the load begins

    def _start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "py-spy",
                "record",
                "--pid",
                str(self.server.proc.pid),
                "--duration",
                str(max(1, round(self.seconds))),
                "--rate",
                "250",
                "--format",
                "raw",
                "--nonblocking",
                "--output",
                str(self.path),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def top(self, limit: int = 20) -> dict[str, Any]:
        from bench.profile_server import collapsed_top

        if self._timer is not None:
            self._timer.join()
        if self.proc is None:
            return {"error": "py-spy did not start"}
        try:
            self.proc.wait(timeout=self.seconds + 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        if not self.path.exists():
            return {"error": "py-spy wrote nothing"}
        total, inclusive, own = collapsed_top(self.path, 100_000)
        ours = [(frame, n) for frame, n in inclusive if "agent_server/" in frame]
        return {
            "file": str(self.path),
            "samples": total,
            "inclusive": ours[:limit],  # agent_server's own frames, inclusive of callees
            "self": own[:limit],
        }


def have_spy() -> bool:
    return shutil.which("py-spy") is not None


# -- item 2: start + wait throughput, redis against memory ----------------------------------


def item_throughput(
    source: Path,
    *,
    rounds: int,
    count: int,
    concurrency: int,
    progress: Callable[[str], None],
    profile: bool = False,
) -> dict[str, Any]:
    runs: dict[str, list[LoadResult]] = {"memory": [], "redis": []}
    redis_cpu: dict[str, list[float]] = {"memory": [], "redis": []}
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        servers = {
            "memory": stack.enter_context(agent_server("agent-server memory", source)),
            "redis": stack.enter_context(
                agent_server("agent-server redis", source, *redis_flags(redis.url, "bench-a"))
            ),
        }
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():  # warm-up
            asyncio.run(lives(server.port, min(count, 200), concurrency, 30.0))
            settle(server)
        for index in range(rounds):
            order = ["memory", "redis"] if index % 2 == 0 else ["redis", "memory"]
            halves: dict[str, list[tuple[LoadResult, float]]] = {name: [] for name in order}
            for name in order + order[::-1]:
                server = servers[name]
                cpu_before, redis_before = server.cpu_seconds(), redis.cpu_seconds()
                result = asyncio.run(lives(server.port, count // 2, concurrency, 60.0))
                result.settle_seconds = settle(server)
                if result.requests:
                    result.server_cpu_us = (
                        (server.cpu_seconds() - cpu_before) / result.requests * 1e6
                    )
                redis_us = (redis.cpu_seconds() - redis_before) / max(1, result.requests) * 1e6
                halves[name].append((result, redis_us))
                progress(
                    f"item 2 round {index + 1}/{rounds} {name:6} {result.rps:7.0f} lives/s "
                    f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms "
                    f"errors {result.errors}"
                )
            for name, pair in halves.items():
                requests = sum(r.requests for r, _ in pair)
                runs[name].append(
                    LoadResult(
                        requests=requests,
                        seconds=sum(r.seconds for r, _ in pair),
                        p50_ms=sum(r.p50_ms for r, _ in pair) / 2,
                        p99_ms=sum(r.p99_ms for r, _ in pair) / 2,
                        errors=sum(r.errors for r, _ in pair),
                        server_cpu_us=sum(r.server_cpu_us * r.requests for r, _ in pair)
                        / max(1, requests),
                    )
                )
                redis_cpu[name].append(sum(u * r.requests for r, u in pair) / max(1, requests))
        profiles: dict[str, Any] = {}
        if profile and have_spy():  # after the measured rounds: py-spy's sampling costs CPU
            for name in ("redis", "memory"):
                spy = Spy(servers[name], 4.0, f"lives-{name}")
                asyncio.run(lives(servers[name].port, count * 4, concurrency, 3.5))
                profiles[name] = spy.top()
                progress(f"item 2 profile of {name}: {profiles[name].get('file')}")
    return {
        "profiles": profiles,
        "count_per_round": count,
        "concurrency": concurrency,
        "targets": _targets(runs, redis_cpu, rate="lives_per_s", count="lives"),
        "ratio": {
            "lives_per_s": Spread.of(
                [a.rps / b.rps for a, b in zip(runs["redis"], runs["memory"], strict=True)]
            ).as_dict(),
            "server_cpu": Spread.of(
                [
                    a.server_cpu_us / b.server_cpu_us
                    for a, b in zip(runs["redis"], runs["memory"], strict=True)
                    if b.server_cpu_us > 0
                ]
                or [0.0]
            ).as_dict(),
        },
    }


def _targets(
    runs: dict[str, list[LoadResult]], redis_cpu: dict[str, list[float]], *, rate: str, count: str
) -> dict[str, dict[str, Any]]:
    """Each store's spreads over its rounds (`rate` and `count` name the rate and the total,
    lives for item 2, requests for item 7)."""
    return {
        name: {
            rate: Spread.of([r.rps for r in results]).as_dict(),
            "p50_ms": Spread.of([r.p50_ms for r in results]).as_dict(),
            "p99_ms": Spread.of([r.p99_ms for r in results]).as_dict(),
            "server_cpu_us": Spread.of([r.server_cpu_us for r in results]).as_dict(),
            "redis_cpu_us": Spread.of(redis_cpu[name]).as_dict(),
            "errors": sum(r.errors for r in results),
            count: sum(r.requests for r in results),
        }
        for name, results in runs.items()
    }


def _ratio(
    results: dict[str, list[LoadResult]], top: str, bottom: str, attribute: str
) -> dict[str, float]:
    """`attribute` of `top` over `bottom`, round by round (the rounds are mirrored pairs)."""
    pairs = zip(results[top], results[bottom], strict=True)
    values = [getattr(a, attribute) / getattr(b, attribute) for a, b in pairs]
    return Spread.of([v for v in values if v > 0] or [0.0]).as_dict()


# -- item 3: sync echo against the tree before the store -------------------------------------


def item_sync_before(
    source: Path,
    before: Path,
    *,
    rounds: int,
    duration: float,
    loader: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    from bench.http_overhead import _combined, _measure

    names = ("now", "before", "baseline")
    results: dict[str, list[LoadResult]] = {name: [] for name in names}
    with contextlib.ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        port = free_port()
        servers["now"] = stack.enter_context(
            ServerProcess("now", agent_server_argv(port), port, cwd=source)
        )
        port = free_port()
        servers["before"] = stack.enter_context(
            ServerProcess("before", agent_server_argv(port), port, cwd=before)
        )
        port = free_port()
        servers["baseline"] = stack.enter_context(
            ServerProcess("baseline", baseline_argv(port), port)
        )
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():
            _measure(
                server,
                "sync",
                duration=min(1.0, duration),
                connections=16,
                loader=loader,
                cpus=None,
            )
        for index in range(rounds):
            shift = index % len(names)
            order = list(names[shift:] + names[:shift])
            halves: dict[str, list[LoadResult]] = {name: [] for name in order}
            for name in order + order[::-1]:
                result = _measure(
                    servers[name],
                    "sync",
                    duration=duration / 2,
                    connections=16,
                    loader=loader,
                    cpus=None,
                )
                halves[name].append(result)
                progress(
                    f"item 3 round {index + 1}/{rounds} {name:8} {result.rps:7.0f} req/s "
                    f"errors {result.errors}"
                )
            for name, pair in halves.items():
                results[name].append(_combined(pair))

    def ratio(top: str, bottom: str, attribute: str) -> dict[str, float]:
        return _ratio(results, top, bottom, attribute)

    return {
        "before": str(before),
        "loader": loader,
        "rounds": rounds,
        "duration": duration,
        "targets": {
            name: {
                "rps": Spread.of([r.rps for r in runs]).as_dict(),
                "server_cpu_us": Spread.of([r.server_cpu_us for r in runs]).as_dict(),
                "errors": sum(r.errors for r in runs),
            }
            for name, runs in results.items()
        },
        "ratios": {
            "now/before": {
                "rps": ratio("now", "before", "rps"),
                "cpu": ratio("now", "before", "server_cpu_us"),
            },
            "now/baseline": {
                "rps": ratio("now", "baseline", "rps"),
                "cpu": ratio("now", "baseline", "server_cpu_us"),
            },
            "before/baseline": {
                "rps": ratio("before", "baseline", "rps"),
                "cpu": ratio("before", "baseline", "server_cpu_us"),
            },
        },
    }


# -- item 4: renewal cost with N in flight ---------------------------------------------------


def item_renewal(
    source: Path,
    *,
    levels: tuple[int, ...],
    lease: float,
    window: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    interval = lease / 3
    scripts = script_names(source)
    rows: list[dict[str, Any]] = []
    with RedisServer() as redis:
        flags = redis_flags(
            redis.url,
            "bench-a",
            "--lease-ttl",
            str(lease),
            "--max-inflight",
            str(max(levels) + 100),
            "--drain-timeout",
            "0.5",
            "--cancel-timeout",
            "1",
        )
        with agent_server("agent-server redis", source, *flags) as server:
            server.wait_ready()
            in_flight = 0
            for level in levels:
                began = time.monotonic()
                asyncio.run(
                    start_many(
                        server.port,
                        level - in_flight,
                        reasoner="sleep",
                        body=lambda _: b'{"seconds": 3600}',
                        concurrency=32,
                        timeout=300.0,
                    )
                )
                started_in = time.monotonic() - began
                in_flight = level
                running = redis.command("ZCARD", PREFIX + "running")
                time.sleep(interval)  # a tick between the starts and the window
                with Monitor(redis.port, scripts) as monitor:
                    redis.reset_stats()
                    time.sleep(window)
                    stats = redis.commandstats()
                    ran = monitor.snapshot()
                evalsha = scripted(stats)
                ticks = ran["calls"].get("script tick", 0)
                claims = ran["calls"].get("script claim", 0)
                row = {
                    "in_flight": level,
                    "running_in_redis": running,
                    "start_seconds": round(started_in, 2),
                    "window_seconds": window,
                    "expected_ticks": window / interval,
                    "ticks": ticks,
                    "commands_per_tick": 1 + ran["inner"].get("script tick", 0) / ticks
                    if ticks
                    else 0.0,
                    "claims": claims,
                    "commands_per_claim": 1 + ran["inner"].get("script claim", 0) / claims
                    if claims
                    else 0.0,
                    "other_calls": {
                        k: c for k, c in ran["calls"].items() if k not in BACKGROUND_SCRIPTS
                    },
                    "redis_usec_per_evalsha": evalsha["usec"] / evalsha["calls"]
                    if evalsha["calls"]
                    else 0.0,
                    "commandstats_calls": sum(s["calls"] for s in stats.values()),
                    "monitor_calls": sum(ran["calls"].values()) + sum(ran["inner"].values()),
                    "commandstats": stats,
                }
                rows.append(row)
                progress(
                    f"item 4 {level:6} in flight: {ticks} ticks ({row['commands_per_tick']:.1f} "
                    f"commands each), {claims} claim polls, "
                    f"{row['redis_usec_per_evalsha']:.0f} us of Redis per script call"
                )
    return {"lease_ttl": lease, "tick_interval": interval, "rows": rows}


# -- item 5: long-poll wake latency ----------------------------------------------------------


#: Long-polls opened at once, and the pause between batches (1,000 polls in 2 s).
OPEN_BATCH = 25
OPEN_PAUSE = 0.05


async def _wake(
    start_port: int, poll_port: int, waiters: int, margin: float, notices: dict[str, float]
) -> dict[str, Any]:
    """`waiters` sleeps on one server ending together `margin` seconds from now, one long
    poll each on the other (opened in small batches); `notices` fills with when each end
    notice reached a subscriber of Redis."""
    end_at = time.time() + margin
    began = time.time()
    ids = await start_many(
        start_port,
        waiters,
        reasoner="sleep",
        body=lambda _: json.dumps({"seconds": max(0.0, end_at - time.time())}).encode(),
        concurrency=32,
        timeout=margin + 30,
    )
    started = time.time()
    opened = 0
    sent_last = 0.0

    async def poll(key: str) -> tuple[float, float, dict[str, Any]] | int:
        nonlocal opened, sent_last
        connection = await HttpConnection.open(poll_port)
        try:
            sent = time.time()
            sent_last = max(sent_last, sent)
            opened += 1
            async with asyncio.timeout(40):
                status, _, body = await connection.request(
                    http_request("GET", f"/executions/{key}?wait=30")
                )
            returned = time.time()
            if status != 200:
                failures[f"{status} {body[:120].decode(errors='replace')}"] += 1
                return status
            return sent, returned, _json_body(body)
        finally:
            await connection.close()

    failures: Counter[str] = Counter()
    # Opened in small batches, as in every run since the first: until 38ee9a9 a replica's
    # redis-py pool refused past 100 connections, and a long-poll's first read needs one.
    polls: list[asyncio.Task[tuple[float, float, dict[str, Any]] | int]] = []
    for first in range(0, len(ids), OPEN_BATCH):
        polls += [asyncio.ensure_future(poll(key)) for key in ids[first : first + OPEN_BATCH]]
        await asyncio.sleep(OPEN_PAUSE)
    answers = await asyncio.gather(*polls, return_exceptions=True)
    latencies: list[float] = []
    to_notice: list[float] = []
    early = 0
    failed = 0
    statuses: Counter[str] = Counter()
    for key, answer in zip(ids, answers, strict=True):
        if isinstance(answer, BaseException):
            failures[repr(answer)[:160]] += 1
        if not isinstance(answer, tuple):
            failed += 1
            continue
        sent, returned, body = answer
        statuses[str(body["status"])] += 1
        if body["status"] != "succeeded" or not body.get("finished_at"):
            failed += 1
            continue
        finished = _epoch(body["finished_at"])
        if sent >= finished:  # the poll was not waiting when the execution ended
            early += 1
            continue
        latencies.append(returned - finished)
        if key in notices:
            to_notice.append(notices[key] - finished)
    latencies.sort()
    to_notice.sort()
    return {
        "waiters": waiters,
        "measured": len(latencies),
        "not_waiting_at_end": early,
        "failed": failed,
        "failures": dict(failures),
        "over_1s": sum(1 for value in latencies if value > 1.0),
        "statuses": dict(statuses),
        "starts_seconds": round(started - began, 3),
        "slack_seconds": round(end_at - sent_last, 3),  # last poll sent -> planned end
        "p50_ms": _quantile(latencies, 0.50) * 1000,
        "p90_ms": _quantile(latencies, 0.90) * 1000,
        "p99_ms": _quantile(latencies, 0.99) * 1000,
        "max_ms": (latencies[-1] * 1000) if latencies else 0.0,
        "notice_p50_ms": _quantile(to_notice, 0.50) * 1000,
        "notice_p99_ms": _quantile(to_notice, 0.99) * 1000,
        "notices": len(to_notice),
        "min_ms": (latencies[0] * 1000) if latencies else 0.0,
    }


def item_wake(
    source: Path,
    *,
    waiters: int,
    rounds: int,
    margin: float,
    progress: Callable[[str], None],
    profile: bool = False,
) -> dict[str, Any]:
    """Replica A starts, replica B long-polls; the one-process memory store beside them.

    (Until 38ee9a9 a third pair ran with an injected blocking pool as a what-if; the store
    now builds a blocking pool of its own.)
    """
    capacity = ("--max-inflight", str(waiters + 100))
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        pairs: dict[str, tuple[ServerProcess, ServerProcess]] = {}
        a = stack.enter_context(
            agent_server("replica a", source, *redis_flags(redis.url, "bench-a"), *capacity)
        )
        b = stack.enter_context(
            agent_server("replica b", source, *redis_flags(redis.url, "bench-b"), *capacity)
        )
        pairs["cross-replica (redis)"] = (a, b)
        memory = stack.enter_context(agent_server("memory", source, *capacity))
        pairs["one process (memory)"] = (memory, memory)
        found: dict[str, list[dict[str, Any]]] = {name: [] for name in pairs}
        for server in {s for pair in pairs.values() for s in pair}:
            server.wait_ready()
        for index in range(rounds):
            for name, (starts, polls) in pairs.items():
                spies = (
                    {
                        # the wake only: from 0.5 s before the planned end, for 2 s
                        role: Spy(server, 2.0, f"wake-{role}-{index + 1}", delay=margin - 0.5)
                        for role, server in (("starts", starts), ("polls", polls))
                    }
                    if profile and have_spy() and starts is not polls
                    else {}
                )
                with EndNotices(redis.port, PREFIX + "ends") as ends:
                    result = asyncio.run(_wake(starts.port, polls.port, waiters, margin, ends.seen))
                if spies:
                    result["profiles"] = {role: spy.top() for role, spy in spies.items()}
                result["store_unreachable_logged"] = polls.stderr().count("unreachable")
                found[name].append(result)
                progress(
                    f"item 5 round {index + 1}/{rounds} {name}: p50 {result['p50_ms']:.1f} ms "
                    f"p99 {result['p99_ms']:.1f} ms max {result['max_ms']:.1f} ms "
                    f"({result['measured']}/{waiters} measured, {result['over_1s']} over 1 s, "
                    f"failures {result['failures']}, slack {result['slack_seconds']:.2f} s)"
                )
                for server in (starts, polls):
                    settle(server)
    return {"waiters": waiters, "margin": margin, "rounds": found}


# -- item 6: Redis memory per retained execution ---------------------------------------------


def item_memory(source: Path, *, n: int, progress: Callable[[str], None]) -> dict[str, Any]:
    points: list[dict[str, Any]] = []
    with RedisServer() as redis:
        flags = redis_flags(redis.url, "bench-a", "--max-retained", str(n + 1000))
        with agent_server("agent-server redis", source, *flags) as server:
            server.wait_ready()
            redis.command("MEMORY", "PURGE")
            base = int(redis.info("memory")["used_memory"])
            base_keys = redis.command("DBSIZE")
            done = 0
            for target in (n // 2, n):
                asyncio.run(
                    start_many(server.port, target - done, concurrency=16, sync=True, timeout=300)
                )
                done = target
                deadline = time.monotonic() + 60
                while redis.command("ZCARD", PREFIX + "finished") < target:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the ends were not all written within 60 s")
                    time.sleep(0.05)
                redis.command("MEMORY", "PURGE")
                used = int(redis.info("memory")["used_memory"])
                keys = redis.command("DBSIZE")
                sample = redis.command("ZRANGE", PREFIX + "all", "0", "0")
                record = (
                    redis.command("MEMORY", "USAGE", f"{PREFIX}x:{sample[0]}") if sample else None
                )
                point = {
                    "retained": target,
                    "used_memory_delta": used - base,
                    "bytes_per_execution": (used - base) / target,
                    "keys_added": keys - base_keys,
                    "record_hash_bytes": record,
                    "index_bytes": {
                        name: redis.command("MEMORY", "USAGE", PREFIX + name)
                        for name in ("all", "finished")
                    },
                }
                points.append(point)
                progress(
                    f"item 6 {target} retained: {point['bytes_per_execution']:.0f} B each "
                    f"(record hash {record} B)"
                )
    first, last = points[0], points[-1]
    marginal = (last["used_memory_delta"] - first["used_memory_delta"]) / max(
        1, last["retained"] - first["retained"]
    )
    return {"points": points, "marginal_bytes": marginal}


# -- item 7: sync echo throughput, redis against memory --------------------------------------


def item_sync_stores(
    source: Path,
    *,
    rounds: int,
    duration: float,
    loader: str,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """`POST /reasoners/echo` (bench.http_overhead's sync scenario) with the redis store
    against the memory store: both up together, each measured twice per round in mirrored
    order (A B B A), ratio per round. With the redis store a sync run answers only once its
    end is recorded in Redis, so every request waits for the outbox's write."""
    from bench.http_overhead import _combined, _measure

    names = ("memory", "redis")
    results: dict[str, list[LoadResult]] = {name: [] for name in names}
    redis_cpu: dict[str, list[float]] = {name: [] for name in names}
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        servers = {
            "memory": stack.enter_context(agent_server("agent-server memory", source)),
            "redis": stack.enter_context(
                agent_server("agent-server redis", source, *redis_flags(redis.url, "bench-a"))
            ),
        }
        for server in servers.values():
            server.wait_ready()
        for server in servers.values():  # warm-up
            _measure(
                server,
                "sync",
                duration=min(1.0, duration),
                connections=16,
                loader=loader,
                cpus=None,
            )
        for index in range(rounds):
            shift = index % len(names)
            order = list(names[shift:] + names[:shift])
            halves: dict[str, list[tuple[LoadResult, float]]] = {name: [] for name in order}
            for name in order + order[::-1]:
                redis_before = redis.cpu_seconds()
                result = _measure(
                    servers[name],
                    "sync",
                    duration=duration / 2,
                    connections=16,
                    loader=loader,
                    cpus=None,
                )
                redis_us = (redis.cpu_seconds() - redis_before) / max(1, result.requests) * 1e6
                halves[name].append((result, redis_us))
                progress(
                    f"item 7 round {index + 1}/{rounds} {name:6} {result.rps:7.0f} req/s "
                    f"p50 {result.p50_ms:.2f} ms p99 {result.p99_ms:.2f} ms "
                    f"errors {result.errors}"
                )
            for name, pair in halves.items():
                combined = _combined([r for r, _ in pair])
                results[name].append(combined)
                redis_cpu[name].append(
                    sum(u * r.requests for r, u in pair) / max(1, combined.requests)
                )

    def ratio(attribute: str) -> dict[str, float]:
        return _ratio(results, "redis", "memory", attribute)

    return {
        "loader": loader,
        "rounds": rounds,
        "duration": duration,
        "connections": 16,
        "targets": _targets(results, redis_cpu, rate="rps", count="requests"),
        "ratio": {
            "rps": ratio("rps"),
            "server_cpu": ratio("server_cpu_us"),
            "p50": ratio("p50_ms"),
        },
    }


# -- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    lives: int = 200
    rounds: int = 4
    throughput: int = 4000
    concurrency: int = 8
    #: Items 3 and 7 (the sync echo): rounds, and seconds per server per round.
    sync_rounds: int = 6
    sync_duration: float = 4.0
    loader: str = "wrk"
    levels: tuple[int, ...] = (1, 100, 1_000, 10_000)
    lease: float = 1.5
    window: float = 3.0
    waiters: int = 1000
    wake_rounds: int = 3
    margin: float = 6.0
    retained: int = 10_000


QUICK = Sizes(
    lives=12,
    rounds=1,
    throughput=60,
    concurrency=4,
    sync_rounds=1,
    sync_duration=0.5,
    loader="python",
    levels=(1, 20),
    lease=0.9,
    window=0.6,
    waiters=20,
    wake_rounds=1,
    margin=1.0,
    retained=200,
)

ITEMS = (1, 2, 3, 4, 5, 6, 7)


def tree_commit(source: Path) -> str:
    try:
        head = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--", "agent_server"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return "unknown"
    return head + (" with uncommitted changes in agent_server/" if dirty else "")


def run(
    *,
    sizes: Sizes = Sizes(),
    items: tuple[int, ...] = ITEMS,
    source: Path = ROOT,
    before: Path | None = None,
    progress: Callable[[str], None] = log,
    profile: bool = False,
) -> dict[str, Any]:
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
    loader = sizes.loader if have_wrk() else "python"
    data: dict[str, Any] = {
        "benchmark": "store",
        "source": str(source),
        "commit": tree_commit(source),
        "redis": subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, timeout=10
        ).stdout.strip(),
        "sizes": sizes.__dict__ | {"loader": loader},
        "load_before": machine_load(),
        "items": {},
    }
    began = time.monotonic()
    if 1 in items:
        data["items"]["1"] = item_round_trips(source, sizes.lives, progress)
    if 2 in items:
        data["items"]["2"] = item_throughput(
            source,
            rounds=sizes.rounds,
            count=sizes.throughput,
            concurrency=sizes.concurrency,
            progress=progress,
            profile=profile,
        )
    if 3 in items:
        if before is None or not (before / "agent_server").is_dir():
            data["items"]["3"] = {"skipped": f"no agent_server/ under --before {before}"}
        else:
            data["items"]["3"] = item_sync_before(
                source,
                before,
                rounds=sizes.sync_rounds,
                duration=sizes.sync_duration,
                loader=loader,
                progress=progress,
            )
            data["items"]["3"]["before_commit"] = tree_commit(before)
    if 4 in items:
        data["items"]["4"] = item_renewal(
            source, levels=sizes.levels, lease=sizes.lease, window=sizes.window, progress=progress
        )
    if 5 in items:
        data["items"]["5"] = item_wake(
            source,
            waiters=sizes.waiters,
            rounds=sizes.wake_rounds,
            margin=sizes.margin,
            progress=progress,
            profile=profile,
        )
    if 6 in items:
        data["items"]["6"] = item_memory(source, n=sizes.retained, progress=progress)
    if 7 in items:
        data["items"]["7"] = item_sync_stores(
            source,
            rounds=sizes.sync_rounds,
            duration=sizes.sync_duration,
            loader=loader,
            progress=progress,
        )
    data["load_after"] = machine_load()
    data["seconds"] = round(time.monotonic() - began, 1)
    return data


# -- the tables ------------------------------------------------------------------------------


def _spread(d: dict[str, float], digits: int = 2) -> str:
    return f"{d['median']:.{digits}f} [{d['low']:.{digits}f}-{d['high']:.{digits}f}]"


def _profile_tables(items: dict[str, Any], limit: int = 12) -> list[str]:
    """The top frames of every py-spy profile taken (--profile), share of samples."""
    found: list[tuple[str, dict[str, Any]]] = []
    for name, entry in items.get("2", {}).get("profiles", {}).items():
        found.append((f"item 2, {name} store, start + wait lives", entry))
    for where, results in items.get("5", {}).get("rounds", {}).items():
        for index, result in enumerate(results, 1):
            for role, entry in result.get("profiles", {}).items():
                found.append((f"item 5, {where}, round {index}, replica that {role}", entry))
    out: list[str] = []
    for title, entry in found:
        if not entry.get("samples"):
            continue
        total = entry["samples"]
        out += [f"#### Profile: {title} ({total} samples, `{entry['file']}`)", ""]
        out += [
            "| self % | frame | | inclusive % | agent_server frame (with callees) |",
            "|---|---|---|---|---|",
        ]
        for (own, own_n), (inc, inc_n) in zip(
            entry["self"][:limit], entry["inclusive"][:limit], strict=False
        ):
            out.append(
                f"| {100 * own_n / total:.1f} | `{own}` | | {100 * inc_n / total:.1f} | `{inc}` |"
            )
        out.append("")
    return out


def markdown(data: dict[str, Any]) -> str:
    items = data["items"]
    out: list[str] = []
    if "1" in items:
        found = items["1"]
        out += [
            "### Item 1: Redis round trips and commands per execution life",
            "",
            "| life | lives | round trips | script calls | commands sent | commands run in the "
            "scripts | Redis us in scripts | statuses read |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, entry in found["scenarios"].items():
            out.append(
                f"| {name} | {entry['lives']} | **{entry['round_trips_per_life']:.2f}** | "
                f"{entry['evalsha_per_life']:.2f} | {entry['client_commands_per_life']:.2f} | "
                f"{entry['commands_in_scripts_per_life']:.1f} | "
                f"{entry['redis_usec_per_life']:.0f} | {entry.get('statuses', '')} |"
            )
        out += ["", "| life | per life | commands per script call | background, set-up |"]
        out.append("|---|---|---|---|")
        for name, entry in found["scenarios"].items():
            by = ", ".join(f"{k} {v:.2f}" for k, v in entry["by_command_per_life"].items())
            per_call = ", ".join(
                f"{k.removeprefix('script ')} {v:.1f}"
                for k, v in entry["commands_per_script_call"].items()
            )
            out.append(
                f"| {name} | {by} | {per_call} | background {entry['background']} in "
                f"{entry['background_round_trips']} round trips; set-up "
                f"{entry['setup_round_trips']} round trips |"
            )
        sizes = {name: entry["batch_sizes"] for name, entry in found["scenarios"].items()}
        out += ["", f"commands per round trip (size: count): {json.dumps(sizes)}", ""]
    if "2" in items:
        found = items["2"]
        out += [
            "### Item 2: background start + wait (`POST .../echo/async`, `GET ?wait=5`)",
            "",
            f"{found['count_per_round']} lives per server per round, "
            f"{found['concurrency']} clients.",
            "",
            "| store | lives/s | p50 ms | p99 ms | server CPU us/life | redis-server CPU us/life "
            "| errors |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, t in found["targets"].items():
            out.append(
                f"| {name} | {_spread(t['lives_per_s'], 0)} | {_spread(t['p50_ms'])} | "
                f"{_spread(t['p99_ms'])} | {_spread(t['server_cpu_us'], 0)} | "
                f"{_spread(t['redis_cpu_us'], 0)} | {t['errors']} |"
            )
        ratio = found["ratio"]
        out += [
            "",
            f"redis / memory: lives/s **{_spread(ratio['lives_per_s'])}**, server CPU per "
            f"life {_spread(ratio['server_cpu'])} (target: lives/s >= 0.5)",
            "",
        ]
    if "3" in items:
        found = items["3"]
        out.append("### Item 3: sync echo, memory store, now against before the store change")
        out.append("")
        if "skipped" in found:
            out += [f"skipped: {found['skipped']}", ""]
        else:
            out += [
                f"before: `{found['before']}` ({found.get('before_commit', '?')}), "
                f"loader {found['loader']}, {found['rounds']} rounds of "
                f"{found['duration']} s per server",
                "",
                "| server | req/s | server CPU us/req | errors |",
                "|---|---|---|---|",
            ]
            for name, t in found["targets"].items():
                out.append(
                    f"| {name} | {_spread(t['rps'], 0)} | {_spread(t['server_cpu_us'], 0)} | "
                    f"{t['errors']} |"
                )
            out += ["", "| ratio | req/s | server CPU/req |", "|---|---|---|"]
            for name, r in found["ratios"].items():
                out.append(f"| {name} | **{_spread(r['rps'])}** | {_spread(r['cpu'])} |")
            out.append("")
    if "4" in items:
        found = items["4"]
        out += [
            "### Item 4: renewal cost with N executions in flight on one replica",
            "",
            f"`--lease-ttl {found['lease_ttl']}`: a tick every {found['tick_interval']:.2f} s.",
            "",
            "| in flight | running in Redis | ticks (expected) | commands per tick | "
            "claim polls (commands each) | other commands | Redis us per script call |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in found["rows"]:
            out.append(
                f"| {row['in_flight']:,} | {row['running_in_redis']:,} | "
                f"{row['ticks']} ({row['expected_ticks']:.1f}) | "
                f"**{row['commands_per_tick']:.1f}** | "
                f"{row['claims']} ({row['commands_per_claim']:.1f}) | {row['other_calls']} | "
                f"{row['redis_usec_per_evalsha']:.0f} |"
            )
        out.append("")
    if "5" in items:
        found = items["5"]
        out += [
            f"### Item 5: long-poll wake latency, {found['waiters']} waiters ending together",
            "",
            "| where | round | measured | p50 ms | p90 ms | p99 ms | max ms | end notice p50 / "
            "p99 ms | over 1 s | 503s | 'store unreachable' logged (cumulative) | slack s |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, results in found["rounds"].items():
            for index, r in enumerate(results, 1):
                notice = (
                    f"{r['notice_p50_ms']:.1f} / {r['notice_p99_ms']:.1f}" if r["notices"] else "-"
                )
                out.append(
                    f"| {name} | {index} | {r['measured']}/{r['waiters']} | {r['p50_ms']:.1f} | "
                    f"{r['p90_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
                    f"{notice} | {r['over_1s']} | "
                    f"{r['failed']} | {r['store_unreachable_logged']} | "
                    f"{r['slack_seconds']:.2f} |"
                )
            if results:
                out.append(
                    f"| {name} | median | | "
                    f"{Spread.of([r['p50_ms'] for r in results]).fmt(1)} | "
                    f"{Spread.of([r['p90_ms'] for r in results]).fmt(1)} | "
                    f"**{Spread.of([r['p99_ms'] for r in results]).fmt(1)}** | "
                    f"{Spread.of([r['max_ms'] for r in results]).fmt(1)} | | | | | |"
                )
        out.append("")
    if "6" in items:
        found = items["6"]
        out += [
            "### Item 6: Redis memory per retained small execution",
            "",
            "| retained | used_memory delta | B per execution | keys added | one record hash B "
            "| `all` / `finished` index B |",
            "|---|---|---|---|---|---|",
        ]
        for p in found["points"]:
            index = p["index_bytes"]
            out.append(
                f"| {p['retained']:,} | {p['used_memory_delta']:,} | "
                f"{p['bytes_per_execution']:.0f} | {p['keys_added']:,} | "
                f"{p['record_hash_bytes']} | {index['all']:,} / {index['finished']:,} |"
            )
        out += ["", f"marginal: **{found['marginal_bytes']:.0f} B** per retained execution", ""]
    if "7" in items:
        found = items["7"]
        out += [
            "### Item 7: sync echo (`POST /reasoners/echo`), redis store against memory store",
            "",
            f"loader {found['loader']}, {found['connections']} connections, {found['rounds']} "
            f"rounds of {found['duration']} s per server",
            "",
            "| store | req/s | p50 ms | p99 ms | server CPU us/req | redis-server CPU us/req "
            "| errors |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, t in found["targets"].items():
            out.append(
                f"| {name} | {_spread(t['rps'], 0)} | {_spread(t['p50_ms'])} | "
                f"{_spread(t['p99_ms'])} | {_spread(t['server_cpu_us'], 0)} | "
                f"{_spread(t['redis_cpu_us'], 0)} | {t['errors']} |"
            )
        ratio = found["ratio"]
        out += [
            "",
            f"redis / memory: req/s **{_spread(ratio['rps'])}**, server CPU per request "
            f"{_spread(ratio['server_cpu'])}, p50 {_spread(ratio['p50'])} "
            "(target: req/s >= 0.5)",
            "",
        ]
    out += _profile_tables(items)
    out.append(
        f"source {data['source']} at {data['commit']}; {data['redis']}; load "
        f"{data['load_before']} -> {data['load_after']}; {data['seconds']} s"
    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke size, about 30 s")
    parser.add_argument("--items", default=",".join(map(str, ITEMS)))
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout served")
    parser.add_argument(
        "--before", type=Path, default=None, help="checkout before the store (item 3)"
    )
    parser.add_argument("--lives", type=int, default=None, help="item 1: lives per kind")
    parser.add_argument("--rounds", type=int, default=None, help="item 2: rounds")
    parser.add_argument("--throughput", type=int, default=None, help="item 2: lives per run")
    parser.add_argument("--sync-rounds", type=int, default=None, help="items 3, 7: rounds")
    parser.add_argument("--waiters", type=int, default=None, help="item 5: waiters")
    parser.add_argument("--wake-rounds", type=int, default=None, help="item 5: rounds")
    parser.add_argument("--retained", type=int, default=None, help="item 6: executions")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="py-spy: items 2 (one extra run per store, after the rounds) and 5 (both "
        "replicas, 2 s around the wake, every round: its latencies carry the cost)",
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    overrides = {
        "lives": args.lives,
        "rounds": args.rounds,
        "throughput": args.throughput,
        "sync_rounds": args.sync_rounds,
        "waiters": args.waiters,
        "wake_rounds": args.wake_rounds,
        "retained": args.retained,
    }
    sizes = Sizes(**(sizes.__dict__ | {k: v for k, v in overrides.items() if v is not None}))
    items = tuple(int(item) for item in args.items.split(",") if item.strip())
    data = run(
        sizes=sizes,
        items=items,
        source=args.source.resolve(),
        before=args.before,
        profile=args.profile,
    )
    data["command"] = shlex.join(["python", "-m", "bench.store", *sys.argv[1:]])
    data["raw_file"] = str(write_json("store", data))
    print(f"`{data['command']}`\n")
    print(markdown(data))
    print(f"raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
