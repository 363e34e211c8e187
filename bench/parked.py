"""Parked waits (issue 25 "Bench"), against real processes and a real `redis-server` on
loopback.

1. Memory per waiting execution. Two batches of `--executions` starts of the resumable
   `asking` reasoner (bench/apps/durable_app.py), which asks at once; per execution, the
   growth over the second batch (the first's transient allocations are there to reuse):
   - redis store: each is parked (no task): Redis `used_memory` (less the bench's own stamp
     key) and the server's RSS, once every one is in `parked`; and `MEMORY USAGE` of one
     record and its event stream;
   - memory store: each waits in its task (nowhere to park): the server's RSS, once
     `executions_waiting` counts them all.
   Also: how long the parking replica takes to exit on SIGTERM with a drain timeout of 60 s
   (a parked execution is not waited for).
2. Resume latency: after that exit, replica B alone on the same Redis; `--answers` of the
   parked executions answered one at a time through B; latency = the next attempt's
   recorded start (its first statement writes `time.time()`) - the moment before the
   answer was sent. p50/p99.

`--source DIR` serves agent-server from another checkout. `--quick` is the smoke size.

Usage: python -m bench.parked [--quick] [--executions 10000] [--answers 500]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, HttpConnection, http_request, log, machine_load, write_json
from bench.durable import _stamps, durable_server
from bench.store import RedisServer, _quantile, redis_flags, start_many, tree_commit

AGENT = "bench-durable"
PARKED_KEY = f"{{agent-server:{AGENT}}}:parked"
LONG_DRAIN = ("--unready-delay", "0", "--drain-timeout", "60", "--grace-period", "90")


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


def _waiting(port: int) -> int:
    """`executions_waiting` summed over reasoners, from the server's own metrics."""

    async def scrape() -> bytes:
        connection = await HttpConnection.open(port)
        try:
            _, _, body = await connection.request(http_request("GET", "/metrics"))
            return body
        finally:
            await connection.close()

    total = 0.0
    for line in asyncio.run(scrape()).decode().splitlines():
        if line.startswith("agent_server_executions_waiting{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def memory_store(source: Path, redis: RedisServer, executions: int) -> dict[str, Any]:
    flags = ("--store", "memory", "--max-inflight", str(2 * executions + 100), *LONG_DRAIN)
    with durable_server("memory", source, redis.url, *flags) as server:
        server.wait_ready()
        rss: list[int] = []
        for batch in (1, 2):
            asyncio.run(
                start_many(server.port, executions, reasoner="asking", body=lambda _: b"{}")
            )
            _wait(
                lambda: _waiting(server.port) >= batch * executions,  # noqa: B023
                120,
                "every execution waiting",
            )
            rss.append(server.rss_bytes())
    return {"store": "memory", "rss_per_execution": (rss[1] - rss[0]) / executions}


def redis_store(source: Path, redis: RedisServer, executions: int, answers: int) -> dict[str, Any]:
    """Two batches: the second's growth is what a parked execution keeps (the first's
    transient allocations are there to be reused)."""
    flags = ("--max-inflight", str(executions + 100), *LONG_DRAIN)
    owner = durable_server("A", source, redis.url, *redis_flags(redis.url, "A"), *flags)
    with owner:
        owner.wait_ready()
        used: list[int] = []
        rss: list[int] = []
        ids: list[str] = []
        for batch in (1, 2):
            ids += asyncio.run(
                start_many(owner.port, executions, reasoner="asking", body=lambda _: b"{}")
            )
            _wait(
                lambda: int(redis.command("ZCARD", PARKED_KEY)) >= batch * executions,  # noqa: B023
                120,
                "every execution parked",
            )
            used.append(int(redis.info("memory")["used_memory"]))
            rss.append(owner.rss_bytes())
        owner.signal(signal.SIGTERM)
        code, exit_seconds = owner.wait_exit(100)
    one = ids[-1]
    usage = {
        name: int(redis.command("MEMORY", "USAGE", key))
        for name, key in (
            ("record", f"{{agent-server:{AGENT}}}:x:{one}"),
            ("events", f"{{agent-server:{AGENT}}}:ev:{one}"),
            ("bench_stamp", f"bench:attempt:{one}"),
        )
    }
    # The stamps (bench:attempt:{id}) are the bench's own: not the store's cost.
    taker = durable_server("B", source, redis.url, *redis_flags(redis.url, "B"))
    latencies: list[float] = []
    with taker:
        taker.wait_ready()

        async def answer_all() -> None:
            connection = await HttpConnection.open(taker.port)
            try:
                for execution_id in ids[:answers]:
                    sent = time.time()
                    status, _, body = await connection.request(
                        http_request("POST", f"/executions/{execution_id}/input", b'{"value": 1}')
                    )
                    if status != 202:
                        raise RuntimeError(f"answer {status}: {body[:200]!r}")
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:
                        stamp = _stamps(redis, [execution_id], 2).get(execution_id)
                        if stamp is not None:
                            latencies.append(stamp[0] - sent)
                            break
                        await asyncio.sleep(0.001)
                    else:
                        raise RuntimeError(f"{execution_id} not resumed within 10 s")
            finally:
                await connection.close()

        asyncio.run(answer_all())
    latencies.sort()
    return {
        "store": "redis",
        "redis_bytes_per_parked": (used[1] - used[0]) / executions - usage["bench_stamp"],
        "key_bytes": usage,
        "rss_per_parked": (rss[1] - rss[0]) / executions,
        "exit_code": code,
        "exit_seconds_with_all_parked": exit_seconds,
        "resume_p50_ms": _quantile(latencies, 0.5) * 1000,
        "resume_p99_ms": _quantile(latencies, 0.99) * 1000,
        "answers": len(latencies),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--answers", type=int, default=500)
    parser.add_argument("--source", type=Path, default=ROOT)
    args = parser.parse_args()
    executions, answers = (200, 20) if args.quick else (args.executions, args.answers)
    results: dict[str, Any] = {"commit": tree_commit(args.source), "load": machine_load()}
    with RedisServer() as redis:
        results["redis"] = redis_store(args.source, redis, executions, answers)
        log(f"redis: {results['redis']}")
    with RedisServer() as redis:
        results["memory"] = memory_store(args.source, redis, executions)
        log(f"memory: {results['memory']}")
    write_json("parked", results)


if __name__ == "__main__":
    main()
