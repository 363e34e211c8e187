"""Live execution events (issue 16 "Benchmarks"), against real processes on loopback.

1. Fan-out: one `burst` execution emits `count` small events as fast as it can (the loop runs
   after every event, as a model's tokens arriving over a socket would let it), read live by
   0, 1, 100 and 1,000 `GET /executions/{id}/events` streams on the same process (memory
   store). Events per second = count / (the last reader's last event - the first emit); the
   baseline is the same emitter with no reader, in the same round. Levels run in a rotated
   order and then in the reverse order each round. The same across replicas with the redis
   store (emitter on replica A, readers on replica B, which read the events from Redis).
2. Memory per open stream: the server's RSS before and after N idle streams on one
   long-running `hold` execution (no event, heartbeats far apart), at 1,000 and 10,000
   streams on one process: bytes per stream, and the marginal bytes between the two points.
   The streams are opened by this process with bare asyncio connections.
3. (2 at 10,000 is issue 16's "10,000 idle streams on one process", target < 10 KiB each.)
4. `await ctx.emit(data)` with no reader against a bare `asyncio.Queue.put_nowait` of the
   same data, in-process (bench/apps/emit_micro.py): ns per call, ratio, and the parts.

`--source DIR` serves agent-server from another checkout (a worktree of a commit); the bench
app (bench/apps/events_app.py) is put on the server's PYTHONPATH. `--quick` is the smoke size.

5. A burst of 20,000 events with no reader on a redis replica, and 20 one-event runs ending
   while it is written: which ends replica B reads, how many events reach Redis. The burst
   outruns the writer of the store's outbox, whose bound (10,000 writes) events and ends
   share; item 1's bursts across replicas stay at 5,000 events so they measure speed.

Usage: python -m bench.events [--quick] [--items 1,2,4,5] [--source DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import (
    HOST,
    ROOT,
    HttpConnection,
    ServerProcess,
    Spread,
    agent_server_argv,
    free_port,
    http_request,
    log,
    machine_load,
    settle,
    write_json,
)
from bench.store import RedisServer, Spy, have_spy, redis_flags, tree_commit

APPS = ROOT / "bench" / "apps"
PROGRESS = b"event: progress\n"
END = b"event: end\n"
MISSED = b"event: missed\n"
#: Events per burst across replicas: half the store's outbox bound (10,000 writes), which a
#: faster burst overfills (item 5).
REDIS_MAX_COUNT = 5000


def events_server(
    name: str, source: Path, *flags: str, env: dict[str, str] | None = None
) -> ServerProcess:
    """`agent-server run events_app:agent` from `source`, the bench app on PYTHONPATH."""
    port = free_port()
    argv = agent_server_argv(port, "events_app:agent", "--log-level", "warning", *flags)
    path = os.pathsep.join(p for p in (str(APPS), os.environ.get("PYTHONPATH", "")) if p)
    return ServerProcess(name, argv, port, cwd=source, env={"PYTHONPATH": path, **(env or {})})


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def _request(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    connection = await HttpConnection.open(port)
    try:
        raw = None if body is None else json.dumps(body).encode()
        status, _, answer = await connection.request(http_request(method, path, raw))
    finally:
        await connection.close()
    return status, json.loads(answer) if answer else None


# -- a lean SSE reader -----------------------------------------------------------------------


@dataclass
class StreamRead:
    status: int = 0
    headers_at: float = 0.0
    progress: int = 0
    missed_events: int = 0
    last_at: float = 0.0
    ended: bool = False
    error: str | None = None


async def read_stream(port: int, key: str, expected: int, timeout: float) -> StreamRead:
    """One `GET /executions/{key}/events` read to its end (bounded by `timeout`): counts the
    progress events without parsing them (a pattern count over the raw bytes, a tail kept
    across reads), and when the `expected`-th arrived."""
    found = StreamRead()
    keep = len(PROGRESS) - 1
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                writer.write(http_request("GET", f"/executions/{key}/events"))
                head = await reader.readuntil(b"\r\n\r\n")
                found.headers_at = time.time()
                found.status = int(head.split(b" ", 2)[1])
                if found.status != 200:
                    return found
                tail = b""
                while chunk := await reader.read(1 << 18):
                    data = tail + chunk
                    count = data.count(PROGRESS)
                    if count:
                        found.progress += count
                        if found.progress >= expected and not found.last_at:
                            found.last_at = time.time()
                    found.missed_events += data.count(MISSED)
                    if END in data:
                        found.ended = True
                        break
                    tail = data[-keep:]
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
        found.error = repr(exc)[:120]
    return found


# -- item 1: fan-out -------------------------------------------------------------------------


async def _fanout(
    emit_port: int, read_port: int, readers: int, count: int, timeout: float
) -> dict[str, Any]:
    delay = 0.3 + readers * 0.002 if readers else 0.0
    status, started = await _request(
        emit_port,
        "POST",
        "/reasoners/burst/async",
        {"count": count, "delay": delay, "yield_every": 1},
    )
    if status != 202:
        raise RuntimeError(f"burst start answered {status}: {started}")
    key = started["execution_id"]
    tasks: list[asyncio.Task[StreamRead]] = []
    for first in range(0, readers, 100):
        tasks += [
            asyncio.ensure_future(read_stream(read_port, key, count, timeout))
            for _ in range(min(100, readers - first))
        ]
        await asyncio.sleep(0)
    reads = list(await asyncio.gather(*tasks))
    status, done = await _request(read_port, "GET", f"/executions/{key}?wait=20")
    if status != 200 or done.get("status") != "succeeded":  # see item 5
        return {"readers": readers, "count": count, "not_ended": f"{status} {done}"[:300]}
    began, ended = done["result"]["began"], done["result"]["ended"]
    complete = [r for r in reads if r.progress >= count and r.last_at]
    last = max((r.last_at for r in complete), default=ended)
    seconds = (last if readers else ended) - began
    return {
        "readers": readers,
        "count": count,
        "complete": len(complete),
        "ended": sum(1 for r in reads if r.ended),
        "late": sum(1 for r in reads if r.headers_at > began),
        "missed_events": sum(r.missed_events for r in reads),
        "errors": sorted(
            {r.error for r in reads if r.error}
            | {str(r.status) for r in reads if r.status not in (0, 200)}
        ),
        "emit_seconds": ended - began,
        "seconds": seconds,
        "events_per_s": count / seconds if seconds > 0 else 0.0,
        "deliveries_per_s": readers * count / seconds if seconds > 0 else 0.0,
    }


def item_fanout(
    source: Path,
    *,
    levels: tuple[int, ...],
    redis_levels: tuple[int, ...],
    deliveries: int,
    redis_deliveries: int,
    max_count: int,
    rounds: int,
    progress: Callable[[str], None],
    profile: bool = False,
) -> dict[str, Any]:
    def count_for(readers: int, budget: int) -> int:
        cap = max_count if budget == deliveries else min(max_count, REDIS_MAX_COUNT)
        return max(100, min(cap, budget // max(1, readers)))

    flags = ("--max-events", str(max_count), "--sse-heartbeat", "60")
    found: dict[str, Any] = {}
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        memory = stack.enter_context(events_server("memory", source, *flags))
        targets: dict[str, tuple[ServerProcess, ServerProcess, tuple[int, ...], int]] = {
            "one process (memory)": (memory, memory, levels, deliveries)
        }
        if redis_levels:
            a = stack.enter_context(
                events_server("replica a", source, *flags, *redis_flags(redis.url, "bench-a"))
            )
            b = stack.enter_context(
                events_server("replica b", source, *flags, *redis_flags(redis.url, "bench-b"))
            )
            targets["cross-replica (redis)"] = (a, b, redis_levels, redis_deliveries)
        for server in {s for t in targets.values() for s in t[:2]}:
            server.wait_ready()
        for name, (emitter, reading, target_levels, budget) in targets.items():
            runs: dict[int, list[dict[str, Any]]] = {n: [] for n in (0, *target_levels)}
            ratios: dict[int, list[float]] = {n: [] for n in target_levels}
            # warm-up: one small burst read by one stream
            asyncio.run(_fanout(emitter.port, reading.port, 1, 200, 60.0))
            for index in range(rounds):
                ordered = [0, *target_levels]
                shift = index % len(ordered)
                ordered = ordered[shift:] + ordered[:shift]
                this_round: dict[int, list[dict[str, Any]]] = {n: [] for n in ordered}
                for readers in ordered + ordered[::-1]:
                    cpu = {s: s.cpu_seconds() for s in {emitter, reading}}
                    result = asyncio.run(
                        _fanout(
                            emitter.port,
                            reading.port,
                            readers,
                            count_for(readers, budget),
                            timeout=60.0,
                        )
                    )
                    if "not_ended" in result:
                        raise RuntimeError(f"{name}: a burst's end was not read: {result}")
                    result["server_cpu_seconds"] = sum(
                        s.cpu_seconds() - before for s, before in cpu.items()
                    )
                    deliveries_made = max(1, readers) * result["count"]
                    result["server_cpu_us_per_delivery"] = (
                        result["server_cpu_seconds"] / deliveries_made * 1e6
                    )
                    this_round[readers].append(result)
                    progress(
                        f"item 1 {name} round {index + 1}/{rounds} {readers:5} readers x "
                        f"{result['count']} events: {result['events_per_s']:9.0f} events/s, "
                        f"{result['deliveries_per_s']:9.0f} deliveries/s, "
                        f"complete {result['complete']}/{readers}, late {result['late']}, "
                        f"missed {result['missed_events']}, errors {result['errors']}"
                    )
                    for server in {emitter, reading}:
                        settle(server, 20.0)
                for readers, pair in this_round.items():
                    runs[readers].extend(pair)
                base = sum(r["events_per_s"] for r in this_round[0]) / len(this_round[0])
                for readers in target_levels:
                    rate = sum(r["events_per_s"] for r in this_round[readers]) / 2
                    ratios[readers].append(rate / base if base else 0.0)
            profiles: dict[str, Any] = {}
            if profile and have_spy():  # after the measured rounds: sampling costs CPU
                readers = max(target_levels)
                for role, server in {"emits": emitter, "reads": reading}.items():
                    if role == "reads" and reading is emitter:
                        continue
                    spy = Spy(server, 3.0, f"events-{role}")
                    asyncio.run(
                        _fanout(
                            emitter.port,
                            reading.port,
                            readers,
                            count_for(readers, budget),
                            timeout=120.0,
                        )
                    )
                    profiles[role] = spy.top(25)
                    progress(f"item 1 {name} profile ({role}): {profiles[role].get('file')}")
            found[name] = {
                "profiles": profiles,
                "levels": {
                    str(readers): {
                        "count": results[0]["count"],
                        "events_per_s": Spread.of([r["events_per_s"] for r in results]).as_dict(),
                        "deliveries_per_s": Spread.of(
                            [r["deliveries_per_s"] for r in results]
                        ).as_dict(),
                        "server_cpu_us_per_delivery": Spread.of(
                            [r["server_cpu_us_per_delivery"] for r in results]
                        ).as_dict(),
                        "ratio_to_no_reader": Spread.of(ratios[readers]).as_dict()
                        if readers
                        else None,
                        "incomplete": sum(readers - r["complete"] for r in results),
                        "late": sum(r["late"] for r in results),
                        "missed_events": sum(r["missed_events"] for r in results),
                        "errors": sorted({e for r in results for e in r["errors"]}),
                        "runs": results,
                    }
                    for readers, results in runs.items()
                },
            }
    return found


# -- item 2: memory per open idle stream -----------------------------------------------------


_STREAMS_OPEN = re.compile(rb"^\w*event_streams_open(?:\{[^}]*\})? ([0-9.e+]+)$", re.M)


async def _streams_open(port: int) -> int:
    connection = await HttpConnection.open(port)
    try:
        _, _, body = await connection.request(http_request("GET", "/metrics"))
    finally:
        await connection.close()
    found = _STREAMS_OPEN.search(body)
    return -1 if found is None else round(float(found.group(1)))


async def _open_idle(
    port: int, key: str, n: int, batch: int = 250, kind: str = "stream"
) -> list[asyncio.StreamWriter]:
    """`n` streams on `key`, each read to its response head, then left open; or (`kind`
    "long-poll") `n` `GET ?wait=60` on it, sent and left waiting."""

    async def one() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(HOST, port)
        if kind == "long-poll":
            writer.write(http_request("GET", f"/executions/{key}?wait=60"))
            await writer.drain()
            return writer
        if kind == "bare":
            writer.write(http_request("GET", "/"))
            await reader.readuntil(b"\r\n\r\n")
            return writer
        writer.write(http_request("GET", f"/executions/{key}/events"))
        head = await reader.readuntil(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n", 1)[0]:
            raise RuntimeError(f"stream refused: {head[:200]!r}")
        return writer

    writers: list[asyncio.StreamWriter] = []
    async with asyncio.timeout(60 + n / 100):
        for first in range(0, n, batch):
            writers += await asyncio.gather(*(one() for _ in range(min(batch, n - first))))
    return writers


async def _close_all(writers: list[asyncio.StreamWriter], port: int | None = None) -> float:
    """Close them; with `port`, until the server's metric says no stream is open (at most
    30 s): the seconds that took."""
    began = time.monotonic()
    for writer in writers:
        writer.close()
    await asyncio.sleep(0.5)
    while port is not None and time.monotonic() - began < 30:
        if await _streams_open(port) == 0:
            break
        await asyncio.sleep(0.25)
    return time.monotonic() - began


def item_idle(
    source: Path, *, points: tuple[int, ...], progress: Callable[[str], None]
) -> dict[str, Any]:
    """Idle event streams, and (the reference, on a fresh server) as many idle long-polls."""
    found = _idle(source, points=points, kind="stream", progress=progress)
    found["long_poll"] = _idle(source, points=points[-1:], kind="long-poll", progress=progress)
    found["bare"] = _idle(source, points=points[-1:], kind="bare", progress=progress)
    return found


def _idle_server(kind: str, source: Path, flags: tuple[str, ...]) -> ServerProcess:
    """agent-server for streams and long-polls; for `bare`, uvicorn with bench/apps/idle_app.py
    on the same loop and parser."""
    if kind != "bare":
        return events_server("memory", source, *flags)
    port = free_port()
    argv = [sys.executable, "-m", "uvicorn", "idle_app:app", "--port", str(port)]
    argv += ["--host", HOST, "--loop", "uvloop", "--http", "httptools", "--log-level", "warning"]
    return ServerProcess("bare uvicorn", argv, port, env={"PYTHONPATH": str(APPS)})


def _idle(
    source: Path, *, points: tuple[int, ...], kind: str, progress: Callable[[str], None]
) -> dict[str, Any]:
    limit = raise_fd_limit()
    if max(points) + 200 > limit:
        raise RuntimeError(f"{max(points)} streams need more than the fd limit {limit}")
    flags = ("--sse-heartbeat", "600", "--max-inflight", "100")
    rows: list[dict[str, Any]] = []
    with _idle_server(kind, source, flags) as server:
        server.wait_ready()

        async def go() -> dict[str, Any]:
            key = "bare"
            if kind != "bare":
                status, started = await _request(server.port, "POST", "/reasoners/hold/async", {})
                if status != 202:
                    raise RuntimeError(f"hold answered {status}")
                key = started["execution_id"]
            await _close_all(await _open_idle(server.port, key, 200, kind=kind))  # warm-up
            await asyncio.sleep(1.0)
            base = server.rss_bytes()
            writers: list[asyncio.StreamWriter] = []
            for target in points:
                began = time.monotonic()
                writers += await _open_idle(server.port, key, target - len(writers), kind=kind)
                opened_in = time.monotonic() - began
                await asyncio.sleep(1.0)
                rss = server.rss_bytes()
                open_now = await _streams_open(server.port) if kind != "bare" else target
                cpu_before = server.cpu_seconds()
                await asyncio.sleep(2.0)
                idle_cpu = (server.cpu_seconds() - cpu_before) / 2.0
                row = {
                    "streams": target,
                    "streams_open_metric": open_now,
                    "open_seconds": round(opened_in, 2),
                    "rss_before": base,
                    "rss": rss,
                    "bytes_per_stream": (rss - base) / target,
                    "idle_cpu_share": idle_cpu,
                }
                rows.append(row)
                progress(
                    f"item 2 {target} idle {kind}s: {row['bytes_per_stream']:.0f} B each "
                    f"(metric says {open_now} open), opened in {opened_in:.1f} s, "
                    f"idle CPU {100 * idle_cpu:.1f}%"
                )
            closed_in = await _close_all(writers, server.port if kind == "stream" else None)
            return {
                "close_seconds": closed_in,
                "rss_after_close": server.rss_bytes(),
                "streams_open_after_close": (
                    await _streams_open(server.port) if kind != "bare" else 0
                ),
                "base": base,
            }

        after = asyncio.run(go())
    first, last = rows[0], rows[-1]
    marginal = (last["rss"] - first["rss"]) / max(1, last["streams"] - first["streams"])
    return {"rows": rows, "marginal_bytes": marginal, "fd_limit": limit, **after}


# -- item 5: a burst past the redis store's outbox bound ------------------------------------


def item_overflow(
    source: Path, *, count: int, others: int, progress: Callable[[str], None]
) -> dict[str, Any]:
    """One `burst` of `count` events with no reader on replica A (redis store) and, ending
    while it is written, `others` one-event bursts; then, read on replica B: which ends
    were recorded, and how many of the big burst's events Redis holds."""
    flags = ("--max-events", str(count), "--sse-heartbeat", "60")
    with RedisServer() as redis, contextlib.ExitStack() as stack:
        a = stack.enter_context(
            events_server("replica a", source, *flags, *redis_flags(redis.url, "bench-a"))
        )
        b = stack.enter_context(
            events_server("replica b", source, *flags, *redis_flags(redis.url, "bench-b"))
        )
        for server in (a, b):
            server.wait_ready()

        async def go() -> dict[str, Any]:
            status, big = await _request(
                a.port, "POST", "/reasoners/burst/async", {"count": count, "delay": 0.5}
            )
            assert status == 202, big
            small: list[str] = []
            for index in range(others):
                status, started = await _request(
                    a.port,
                    "POST",
                    "/reasoners/burst/async",
                    {"count": 1, "delay": 0.5 + index * 1.0 / max(1, others)},
                )
                assert status == 202, started
                small.append(started["execution_id"])
            ends: dict[str, int] = {}
            for key in [big["execution_id"], *small]:
                status, found = await _request(b.port, "GET", f"/executions/{key}?wait=10")
                ends[found.get("status", str(status))] = ends.get(found.get("status"), 0) + 1
            _, last = await _request(a.port, "GET", f"/executions/{big['execution_id']}")
            return {
                "big_status_on_b": ends,
                "big_status_on_a": last.get("status"),
                "statuses_read_on_b": ends,
                "big_id": big["execution_id"],
            }

        found = asyncio.run(go())
        stream = redis.command("XLEN", f"{{agent-server:bench-events}}:ev:{found['big_id']}")
        log_a = a.stderr()
    result = {
        "count": count,
        "others": others,
        "statuses_read_on_b": found["statuses_read_on_b"],
        "big_status_on_a": found["big_status_on_a"],
        "events_in_redis": stream,
        "events_not_written_logged": log_a.count("events not written"),
        "ends_not_recorded_logged": log_a.count("not recorded"),
        "log_lines": [line for line in log_a.splitlines() if "outbox full" in line][-3:],
    }
    progress(
        f"item 5 burst of {count} + {others} one-event runs on A: read on B "
        f"{result['statuses_read_on_b']}; {stream} of {count} events in Redis; "
        f"A logged {result['ends_not_recorded_logged']} 'not recorded'"
    )
    return result


# -- item 4: ctx.emit against Queue.put_nowait -----------------------------------------------


def item_emit(source: Path, *, loops: int, repeats: int, keep: int) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(APPS / "emit_micro.py"), str(loops), str(repeats), str(keep)],
        cwd=source,
        env={**os.environ, "PYTHONPATH": str(source)},
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    rounds: int = 3
    levels: tuple[int, ...] = (1, 100, 1000)
    redis_levels: tuple[int, ...] = (1, 100)
    deliveries: int = 200_000
    redis_deliveries: int = 40_000
    max_count: int = 20_000
    idle: tuple[int, ...] = (1000, 10_000)
    loops: int = 200_000
    repeats: int = 7
    overflow: int = 20_000
    others: int = 20


QUICK = Sizes(
    rounds=1,
    levels=(1, 10),
    redis_levels=(1,),
    deliveries=2000,
    redis_deliveries=1000,
    max_count=1000,
    idle=(20, 50),
    loops=2000,
    repeats=2,
    overflow=200,
    others=2,
)
ITEMS = (1, 2, 4, 5)


def run(
    *,
    sizes: Sizes = Sizes(),
    items: tuple[int, ...] = ITEMS,
    source: Path = ROOT,
    progress: Callable[[str], None] = log,
    profile: bool = False,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "benchmark": "events",
        "source": str(source),
        "commit": tree_commit(source),
        "sizes": sizes.__dict__,
        "load_before": machine_load(),
        "items": {},
    }
    began = time.monotonic()
    if 1 in items:
        data["items"]["1"] = item_fanout(
            source,
            levels=sizes.levels,
            redis_levels=sizes.redis_levels,
            deliveries=sizes.deliveries,
            redis_deliveries=sizes.redis_deliveries,
            max_count=sizes.max_count,
            rounds=sizes.rounds,
            progress=progress,
            profile=profile,
        )
    if 2 in items:
        data["items"]["2"] = item_idle(source, points=sizes.idle, progress=progress)
    if 4 in items:
        data["items"]["4"] = item_emit(
            source, loops=sizes.loops, repeats=sizes.repeats, keep=sizes.max_count
        )
        progress(f"item 4 emit / put_nowait: {data['items']['4']['ratio_emit_to_put']:.1f}")
    if 5 in items:
        data["items"]["5"] = item_overflow(
            source, count=sizes.overflow, others=sizes.others, progress=progress
        )
    data["load_after"] = machine_load()
    data["seconds"] = round(time.monotonic() - began, 1)
    return data


def _spread(d: dict[str, float] | None, digits: int = 2) -> str:
    if not d:
        return "-"
    return f"{d['median']:,.{digits}f} [{d['low']:,.{digits}f}-{d['high']:,.{digits}f}]"


def markdown(data: dict[str, Any]) -> str:
    items = data["items"]
    out: list[str] = []
    if "1" in items:
        out += [
            "### Item 1: events per second from one reasoner, fanned out",
            "",
            "| where | readers | events per burst | events/s | deliveries/s | / no reader | "
            "server CPU us per delivery | incomplete | late | missed | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for where, entry in items["1"].items():
            for readers, level in entry["levels"].items():
                out.append(
                    f"| {where} | {int(readers):,} | {level['count']:,} | "
                    f"{_spread(level['events_per_s'], 0)} | "
                    f"{_spread(level['deliveries_per_s'], 0) if int(readers) else '-'} | "
                    f"**{_spread(level['ratio_to_no_reader'])}** | "
                    f"{_spread(level['server_cpu_us_per_delivery'], 1)} | "
                    f"{level['incomplete']} | {level['late']} | {level['missed_events']} | "
                    f"{level['errors'] or ''} |"
                )
        out.append("")
        for where, entry in items["1"].items():
            for role, spied in entry.get("profiles", {}).items():
                if not spied.get("samples"):
                    continue
                total = spied["samples"]
                out += [
                    f"#### Profile: {where}, the replica that {role} ({total} samples, "
                    f"`{spied['file']}`)",
                    "",
                    "| self % | frame | | inclusive % | agent_server frame (with callees) |",
                    "|---|---|---|---|---|",
                ]
                for (own, own_n), (inc, inc_n) in zip(
                    spied["self"][:15], spied["inclusive"][:15], strict=False
                ):
                    out.append(
                        f"| {100 * own_n / total:.1f} | `{own}` | | {100 * inc_n / total:.1f} "
                        f"| `{inc}` |"
                    )
                out.append("")
    if "2" in items:
        found = items["2"]
        out += [
            "### Items 2 and 3: memory per open idle stream (one `hold` execution)",
            "",
            "| streams | open (metric) | opened in s | RSS delta | B per stream | idle CPU |",
            "|---|---|---|---|---|---|",
        ]
        for row in found["rows"]:
            out.append(
                f"| {row['streams']:,} | {row['streams_open_metric']:,} | "
                f"{row['open_seconds']} | {row['rss'] - row['rss_before']:,} | "
                f"**{row['bytes_per_stream']:,.0f}** | {100 * row['idle_cpu_share']:.1f}% |"
            )
        out += [
            "",
            f"marginal: **{found['marginal_bytes']:,.0f} B** per stream (target < 10 KiB = "
            f"10,240 B); after closing all: {found['streams_open_after_close']} open after "
            f"{found['close_seconds']:.1f} s, RSS {found['rss_after_close'] - found['base']:+,} "
            "B against before (freed memory stays with the process)",
            "",
        ]
        if "long_poll" in found:
            (ref,) = found["long_poll"]["rows"]
            per_poll = ref["bytes_per_stream"]
            ratio = f"{found['rows'][-1]['bytes_per_stream'] / per_poll:.2f}" if per_poll else "n/a"
            out += [
                f"Reference, a fresh server: {ref['streams']:,} idle `GET ?wait=60` on the same "
                f"kind of execution: **{per_poll:,.0f} B** each; a stream / a "
                f"long-poll: **{ratio}**",
                "",
            ]
        if "bare" in found:
            (bare,) = found["bare"]["rows"]
            stream = found["rows"][-1]["bytes_per_stream"]
            held = bare["bytes_per_stream"]
            share = "n/a (too few to move RSS)"
            if stream > 0 and held > 0:
                share = f"{stream / held:.0%}"
            out += [
                f"Reference, a fresh bare uvicorn with its own protocol (bench/apps/idle_app.py, "
                f"uvloop + httptools) holding {bare['streams']:,} requests open: "
                f"**{held:,.0f} B** each; a stream here takes {share} of that",
                "",
            ]
    if "4" in items:
        found = items["4"]
        put = found["ns_per_call"]["asyncio.Queue.put_nowait"]["median"]
        out += [
            "### Item 4: `await ctx.emit` with no reader against `asyncio.Queue.put_nowait`",
            "",
            f"{found['loops']:,} calls per repeat, {found['repeats']} repeats, Python "
            f"{found['python']}",
            "",
            "| what | ns per call | / put_nowait |",
            "|---|---|---|",
        ]
        for name, value in found["ns_per_call"].items():
            out.append(f"| {name} | {_spread(value, 0)} | {value['median'] / put:.1f} |")
        out += [
            "",
            f"emit / put_nowait per repeat: **{Spread.of(found['ratios']).fmt(1)}**",
            "",
        ]
    if "5" in items:
        found = items["5"]
        out += [
            "### Item 5: one burst past the redis store's outbox bound",
            "",
            f"A burst of {found['count']:,} events with no reader on replica A, and "
            f"{found['others']} one-event runs ending while it is written: statuses read on "
            f"replica B after `?wait=10`: **{found['statuses_read_on_b']}** (a GET on A reads "
            f"{found['big_status_on_a']!r} for the burst); events of the burst in Redis: "
            f"{found['events_in_redis']:,}; A logged 'events not written' "
            f"{found['events_not_written_logged']} times and 'not recorded' "
            f"{found['ends_not_recorded_logged']} times.",
            "",
        ]
    out.append(
        f"source {data['source']} at {data['commit']}; load {data['load_before']} -> "
        f"{data['load_after']}; {data['seconds']} s"
    )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smoke size, under 60 s")
    parser.add_argument("--items", default=",".join(map(str, ITEMS)))
    parser.add_argument("--source", type=Path, default=ROOT, help="checkout served")
    parser.add_argument("--rounds", type=int, default=None, help="item 1: rounds")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="item 1: py-spy of the servers over one more burst at the largest fan-out, "
        "after the rounds",
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    if args.rounds is not None:
        sizes = Sizes(**(sizes.__dict__ | {"rounds": args.rounds}))
    items = tuple(int(item) for item in args.items.split(",") if item.strip())
    data = run(sizes=sizes, items=items, source=args.source.resolve(), profile=args.profile)
    data["command"] = shlex.join(["python", "-m", "bench.events", *sys.argv[1:]])
    data["raw_file"] = str(write_json("events", data))
    print(f"`{data['command']}`\n")
    print(markdown(data))
    print(f"raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
