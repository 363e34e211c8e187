"""What Sentinel's `WAIT` costs a start (docs/replicas.md, Sentinel).

Under `--store redis+sentinel://...` a start is answered 202 only once a Redis replica holds
its record (`WAIT n` on the told writes' own connection, n every replica the sentinels
could promote, shared by the writes sent while one is in flight). This measures that
against the same start on plain `redis://`, in one run on one Redis: a primary and its
replicas (`--replicaof`, two by default: `--replicas`), one `redis-sentinel` naming the
primary, and two `agent-server run` (the demo agent) side by side, one with
`--store redis://primary/0`, the other with `--store redis+sentinel://sentinel/SERVICE/1`.
Each round drives N async starts (`POST /reasoners/echo/async`, C keep-alive clients) on each
server in mirrored order (plain, sentinel, sentinel, plain), waiting for quiet after each
run; the ratios (sentinel / plain) are per round. With one client each start waits for a
`WAIT` of its own; with many, the starts sent while one blocks share the next. The
primary's `INFO commandstats` gives the WAITs run per start (a start's and its end's).

Usage: python -m bench.sentinel [--starts 2000] [--clients 32,1] [--rounds 3] [--quick]
       [--replicas 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    HOST,
    LoadResult,
    ServerProcess,
    Spread,
    agent_server_argv,
    drive,
    free_port,
    http_request,
    log,
    machine_load,
    settle,
    write_json,
)
from bench.store import ECHO_BODY, RedisServer

SERVICE = "bench"
#: Bound on each run of starts (seconds), whatever N.
RUN_TIMEOUT = 120.0


class SentinelProcess:
    """One `redis-sentinel` (quorum 1) naming the primary; every wait bounded."""

    def __init__(self, primary: int, replicas: int = 1) -> None:
        self.replicas = replicas
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="bench-sentinel-"))
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind {HOST}\ndir {self.directory}\n"
            f"logfile {self.directory / 'sentinel.log'}\n"
            f"sentinel monitor {SERVICE} {HOST} {primary} 1\n"
        )
        self.proc = subprocess.Popen(
            ["redis-sentinel", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def __enter__(self) -> SentinelProcess:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                reply = subprocess.run(
                    ["redis-cli", "-p", str(self.port), "SENTINEL", "replicas", SERVICE],
                    capture_output=True,
                    timeout=2,
                    check=False,
                ).stdout
                if reply.count(b"master-link-status") >= self.replicas:  # it found them all
                    return self
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("redis-sentinel did not find the replicas in 10 s")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.directory, ignore_errors=True)


def waits(primary: RedisServer) -> float:
    return primary.commandstats().get("wait", {}).get("calls", 0.0)


async def starts(server: ServerProcess, count: int, clients: int) -> LoadResult:
    request = http_request("POST", "/reasoners/echo/async", ECHO_BODY)
    return await drive(
        server.port, lambda _: request, count=count, concurrency=clients, timeout=RUN_TIMEOUT
    )


def one_run(
    server: ServerProcess, primary: RedisServer, count: int, clients: int
) -> dict[str, Any]:
    before = waits(primary)
    result = asyncio.run(starts(server, count, clients))
    quiet = settle(server)  # its ends written before the next run
    if result.errors or result.requests < count:
        raise RuntimeError(f"{server.name}: {result.requests} of {count}, {result.statuses}")
    return {
        "rps": result.rps,
        "p50_ms": result.p50_ms,
        "p99_ms": result.p99_ms,
        "waits_per_start": (waits(primary) - before) / count,
        "settle_s": quiet,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=2000, help="async starts per run")
    parser.add_argument(
        "--clients", default="32,1", help="keep-alive clients at once, one set of rounds each"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="300 starts, one round")
    parser.add_argument(
        "--replicas", type=int, default=2, help="Redis replicas (told writes wait for each)"
    )
    args = parser.parse_args()
    count, rounds = (300, 1) if args.quick else (args.starts, args.rounds)
    clients = [int(each) for each in args.clients.split(",")]
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(RedisServer())
        replicas = [
            stack.enter_context(RedisServer("--replicaof", HOST, str(primary.port)))
            for _ in range(args.replicas)
        ]
        deadline = time.monotonic() + 10
        while any(r.info("replication").get("master_link_status") != "up" for r in replicas):
            if time.monotonic() > deadline:
                raise RuntimeError("the replicas did not sync in 10 s")
            time.sleep(0.05)
        sentinel = stack.enter_context(SentinelProcess(primary.port, args.replicas))
        servers = {
            "plain": ServerProcess(
                "plain",
                agent_server_argv(
                    port := free_port(), None, "--log-level", "warning",
                    "--store", primary.url, "--replica-id", "plain",
                ),
                port,
            ),
            "sentinel": ServerProcess(
                "sentinel",
                agent_server_argv(
                    port := free_port(), None, "--log-level", "warning", "--store",
                    f"redis+sentinel://{HOST}:{sentinel.port}/{SERVICE}/1",
                    "--replica-id", "sentinel",
                ),
                port,
            ),
        }  # fmt: skip
        try:
            for server in servers.values():
                server.wait_ready()
                one_run(server, primary, min(count, 300), clients[0])  # warm-up, unkept
            runs: list[dict[str, Any]] = []
            for many in clients:
                for number in range(1, rounds + 1):
                    for mode in ("plain", "sentinel", "sentinel", "plain"):
                        figures = one_run(servers[mode], primary, count, many)
                        log(f"{many} clients, round {number} {mode}: {figures}")
                        runs.append({"clients": many, "round": number, "store": mode,
                                     **figures})  # fmt: skip
        finally:
            for server in servers.values():
                server.stop()
    print(
        f"{count} async starts per run, {args.replicas} replicas; median [range] over rounds; "
        f"load {machine_load()}"
    )
    for many in clients:
        report([r for r in runs if r["clients"] == many], many)
    write_json("sentinel", {"starts": count, "runs": runs})


def report(runs: list[dict[str, Any]], clients: int) -> None:
    def mean(number: int, mode: str, key: str) -> float:
        mine = [r[key] for r in runs if r["round"] == number and r["store"] == mode]
        return sum(mine) / len(mine)

    numbers = sorted({r["round"] for r in runs})
    print(f"\n{clients} clients\n")
    print("| store | starts/s | p50 ms | p99 ms | WAITs per start (start + end) |")
    print("|---|---|---|---|---|")
    for mode in ("plain", "sentinel"):
        row = [Spread.of([mean(n, mode, key) for n in numbers]) for key in
               ("rps", "p50_ms", "p99_ms", "waits_per_start")]  # fmt: skip
        print(f"| {mode} | {row[0].fmt(0)} | {row[1].fmt(1)} | {row[2].fmt(1)} | {row[3].fmt(2)} |")

    def ratio(key: str) -> Spread:
        return Spread.of([mean(n, "sentinel", key) / mean(n, "plain", key) for n in numbers])

    throughput, latency = ratio("rps"), ratio("p50_ms")
    print(f"\nsentinel / plain per round: starts/s {throughput.fmt()}, p50 {latency.fmt()}")


if __name__ == "__main__":
    main()
