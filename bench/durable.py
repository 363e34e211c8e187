"""Durable executions (issue 15 "Benchmarks"), against real processes and a real
`redis-server` on loopback.

1. Hand-off latency: 100 `stamped` executions (resumable; each attempt writes `time.time()`
   of its start to the benchmark's Redis before anything else) run on replica A; replicas B
   and C idle on the same Redis. A gets SIGTERM with a short `--unready-delay` and
   `--drain-timeout`; at the drain deadline it cancels them and hands them off. Latency per
   execution = its attempt 2's start - the drain deadline, read from the time of A's own
   "drain deadline: cancelling" log line (JSON log, microseconds); the planned deadline
   (SIGTERM + unready + drain) is reported beside it. A fresh A each round; p50/p99 per
   round and over every round (target: p99 < 1 s).
2. Redis commands added by an `Idempotency-Key` (a first use, and a repeat that finds the
   execution) and per `ctx.checkpoint`: sync starts of the resumable `checkpoints` reasoner
   one at a time, counted by `INFO commandstats` (every command, those run inside scripts
   included), `MONITOR` (the commands each script ran) and bench.store's relay (commands
   sent and round trips); each figure is a difference against the same life without the
   key or with 0 checkpoints, in the same run.

`--source DIR` serves agent-server from another checkout; the bench app
(bench/apps/durable_app.py) goes on the server's PYTHONPATH. `--quick` is the smoke size.

Usage: python -m bench.durable [--quick] [--items 1,2] [--source DIR] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    HttpConnection,
    ServerProcess,
    Spread,
    agent_server_argv,
    free_port,
    http_request,
    log,
    machine_load,
    write_json,
)
from bench.store import (
    BACKGROUND_SCRIPTS,
    SETUP_COMMANDS,
    CountingRelay,
    Monitor,
    RedisServer,
    _quantile,
    redis_flags,
    script_names,
    start_many,
    tree_commit,
)

APPS = ROOT / "bench" / "apps"
DEADLINE_LINE = "drain deadline: cancelling"


def durable_server(
    name: str, source: Path, redis_url: str, *flags: str, log_info: bool = False
) -> ServerProcess:
    """`agent-server run durable_app:agent` from `source`, the bench app on PYTHONPATH."""
    port = free_port()
    level = (
        ("--log-level", "info", "--log-format", "json")
        if log_info
        else (
            "--log-level",
            "warning",
        )
    )
    argv = agent_server_argv(port, "durable_app:agent", *level, *flags)
    path = os.pathsep.join(p for p in (str(APPS), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "BENCH_REDIS_URL": redis_url}
    return ServerProcess(name, argv, port, cwd=source, env=env)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def deadline_logged(stderr: str) -> float | None:
    """When the owner logged its drain deadline (JSON log line), as epoch seconds."""
    for line in stderr.splitlines():
        if DEADLINE_LINE in line and line.startswith("{"):
            return _epoch(json.loads(line)["timestamp"])
    return None


# -- item 1: hand-off latency ----------------------------------------------------------------


def _stamps(redis: RedisServer, ids: list[str], attempt: int) -> dict[str, tuple[float, int]]:
    """Attempt `attempt`'s recorded start (time, pid) per id, where written."""
    found: dict[str, tuple[float, int]] = {}
    for key in ids:
        value = redis.command("HGET", f"bench:attempt:{key}", str(attempt))
        if value:
            at, pid = value.split()
            found[key] = (float(at), int(pid))
    return found


def _wait_stamps(
    redis: RedisServer, ids: list[str], attempt: int, timeout: float
) -> dict[str, tuple[float, int]]:
    deadline = time.monotonic() + timeout
    found = _stamps(redis, ids, attempt)
    while len(found) < len(ids) and time.monotonic() < deadline:
        time.sleep(0.1)
        found = _stamps(redis, ids, attempt)
    return found


async def _ends(port: int, ids: list[str]) -> dict[str, int]:
    statuses: dict[str, int] = {}
    connection = await HttpConnection.open(port)
    try:
        for key in ids:
            _, _, body = await connection.request(http_request("GET", f"/executions/{key}?wait=10"))
            status = json.loads(body).get("status", "?")
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        await connection.close()
    return statuses


def item_handoff(
    source: Path,
    *,
    executions: int,
    rounds: int,
    takers: int,
    unready: float,
    drain: float,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    shutdown = (
        *("--unready-delay", str(unready), "--drain-timeout", str(drain)),
        *("--cancel-timeout", "2", "--max-inflight", str(executions + 100)),
    )
    results: list[dict[str, Any]] = []
    with RedisServer() as redis:
        taking = [
            durable_server(
                f"taker {i}", source, redis.url, *redis_flags(redis.url, f"bench-t{i}"), *shutdown
            )
            for i in range(takers)
        ]
        try:
            for server in taking:
                server.wait_ready()
            pids = {server.proc.pid: server.name for server in taking}
            for index in range(rounds):
                owner = durable_server(
                    "owner",
                    source,
                    redis.url,
                    *redis_flags(redis.url, f"bench-owner-{index}"),
                    *shutdown,
                    log_info=True,
                )
                with owner:
                    owner.wait_ready()
                    ids = asyncio.run(
                        start_many(
                            owner.port,
                            executions,
                            reasoner="stamped",
                            body=lambda _: b'{"seconds": 600}',
                            concurrency=16,
                        )
                    )
                    first = _wait_stamps(redis, ids, 1, 30.0)
                    if len(first) < len(ids):
                        raise RuntimeError(f"{len(ids) - len(first)} first attempts not seen")
                    time.sleep(0.5)
                    signalled = time.time()
                    owner.signal(signal.SIGTERM)
                    code, exit_seconds = owner.wait_exit(60.0)
                    logged = deadline_logged(owner.stderr())
                second = _wait_stamps(redis, ids, 2, 30.0)
                planned = signalled + unready + drain
                deadline = logged if logged is not None else planned
                latencies = sorted(second[key][0] - deadline for key in second)
                by_taker: dict[str, int] = {}
                for _, pid in second.values():
                    name = pids.get(pid, f"pid {pid}")
                    by_taker[name] = by_taker.get(name, 0) + 1
                statuses = asyncio.run(_ends(taking[0].port, ids))
                result = {
                    "executions": executions,
                    "handed_over": len(second),
                    "owner_exit_code": code,
                    "owner_exit_seconds": round(exit_seconds, 3),
                    "deadline_logged_minus_planned_ms": None
                    if logged is None
                    else (logged - planned) * 1000,
                    "latencies_ms": [value * 1000 for value in latencies],
                    "p50_ms": _quantile(latencies, 0.50) * 1000,
                    "p90_ms": _quantile(latencies, 0.90) * 1000,
                    "p99_ms": _quantile(latencies, 0.99) * 1000,
                    "min_ms": latencies[0] * 1000 if latencies else 0.0,
                    "max_ms": latencies[-1] * 1000 if latencies else 0.0,
                    "by_taker": by_taker,
                    "statuses": statuses,
                }
                results.append(result)
                progress(
                    f"item 1 round {index + 1}/{rounds}: {len(second)}/{executions} handed "
                    f"over, p50 {result['p50_ms']:.0f} ms p99 {result['p99_ms']:.0f} ms max "
                    f"{result['max_ms']:.0f} ms; takers {by_taker}; ends {statuses}; owner "
                    f"exit {code} after {exit_seconds:.2f} s"
                )
        finally:
            for server in taking:
                server.stop()
    pooled = sorted(value for r in results for value in r["latencies_ms"])
    return {
        "executions": executions,
        "takers": takers,
        "unready_delay": unready,
        "drain_timeout": drain,
        "rounds": results,
        "pooled": {
            "n": len(pooled),
            "p50_ms": _quantile(pooled, 0.50),
            "p99_ms": _quantile(pooled, 0.99),
            "max_ms": pooled[-1] if pooled else 0.0,
        },
    }


# -- item 2: commands per idempotency key and per checkpoint ---------------------------------


def item_commands(source: Path, *, lives: int, progress: Callable[[str], None]) -> dict[str, Any]:
    scripts = script_names(source)
    scenarios: dict[str, dict[str, Any]] = {}
    with (
        RedisServer() as redis,
        CountingRelay(redis.port, scripts) as relay,
        Monitor(redis.port, scripts) as monitor,
    ):
        flags = redis_flags(relay.url, "bench-a", "--lease-ttl", "600")
        with durable_server("agent-server", source, relay.url, *flags) as server:
            server.wait_ready()

            async def sync_starts(count: int, keys: Callable[[int], str | None]) -> int:
                connection = await HttpConnection.open(server.port)
                ok = 0
                try:
                    for index in range(lives):
                        key = keys(index)
                        headers = {} if key is None else {"Idempotency-Key": key}
                        raw = json.dumps({"count": count}).encode()
                        status, _, _ = await connection.request(
                            http_request("POST", "/reasoners/checkpoints", raw, headers)
                        )
                        ok += status == 200
                finally:
                    await connection.close()
                return ok

            def counted(name: str, count: int, keys: Callable[[int], str | None]) -> None:
                monitor.reset()
                redis.reset_stats()
                relay.reset()
                ok = asyncio.run(sync_starts(count, keys))
                if not name.startswith("repeat"):  # a repeat writes no end
                    relay.wait_ends(lives, 10.0)
                time.sleep(0.1)
                stats = redis.commandstats()
                seen = relay.snapshot()
                ran = monitor.snapshot()
                life = {
                    k: c
                    for k, c in seen["commands"].items()
                    if k not in BACKGROUND_SCRIPTS and k.split(" ", 1)[0] not in SETUP_COMMANDS
                }
                total = sum(
                    s["calls"]
                    for k, s in stats.items()
                    if k.upper() not in SETUP_COMMANDS and not k.startswith(("client", "hello"))
                )
                background_inner = sum(
                    ran["calls"].get(k, 0) + ran["inner"].get(k, 0) for k in BACKGROUND_SCRIPTS
                )
                scenarios[name] = {
                    "lives": lives,
                    "ok": ok,
                    "round_trips_per_life": seen["round_trips"].get("work", 0) / lives,
                    "commands_sent_per_life": sum(life.values()) / lives,
                    "by_command_per_life": {k: c / lives for k, c in sorted(life.items())},
                    "commands_run_per_life": (total - background_inner) / lives,
                    "commands_per_script_call": {
                        k: 1 + ran["inner"].get(k, 0) / ran["calls"][k]
                        for k in sorted(life)
                        if ran["calls"].get(k)
                    },
                    "background": {
                        k: c for k, c in seen["commands"].items() if k in BACKGROUND_SCRIPTS
                    },
                    "commandstats": stats,
                }
                entry = scenarios[name]
                progress(
                    f"item 2 {name}: {entry['round_trips_per_life']:.2f} round trips, "
                    f"{entry['commands_run_per_life']:.1f} commands run per life, ok {ok}"
                )

            run_id = uuid.uuid4().hex[:8]
            counted("no key, 0 checkpoints", 0, lambda _: None)
            counted("a new Idempotency-Key, 0 checkpoints", 0, lambda i: f"{run_id}-{i}")
            counted("repeat of a used Idempotency-Key", 0, lambda i: f"{run_id}-{i}")
            counted("no key, 10 checkpoints", 10, lambda _: None)
    base = scenarios["no key, 0 checkpoints"]

    def added(name: str, per: float = 1.0) -> dict[str, float]:
        entry = scenarios[name]
        return {
            "round_trips": (entry["round_trips_per_life"] - base["round_trips_per_life"]) / per,
            "commands_sent": (entry["commands_sent_per_life"] - base["commands_sent_per_life"])
            / per,
            "commands_run": (entry["commands_run_per_life"] - base["commands_run_per_life"]) / per,
        }

    return {
        "lives": lives,
        "scenarios": scenarios,
        "added": {
            "per new Idempotency-Key": added("a new Idempotency-Key, 0 checkpoints"),
            "per checkpoint": added("no key, 10 checkpoints", 10.0),
        },
        "repeat": {
            "round_trips": scenarios["repeat of a used Idempotency-Key"]["round_trips_per_life"],
            "commands_run": scenarios["repeat of a used Idempotency-Key"]["commands_run_per_life"],
        },
    }


# -- the run ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sizes:
    executions: int = 100
    rounds: int = 3
    takers: int = 2
    unready: float = 0.2
    drain: float = 0.5
    lives: int = 100


QUICK = Sizes(executions=10, rounds=1, takers=1, lives=10)
ITEMS = (1, 2)


def run(
    *,
    sizes: Sizes = Sizes(),
    items: tuple[int, ...] = ITEMS,
    source: Path = ROOT,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "benchmark": "durable",
        "source": str(source),
        "commit": tree_commit(source),
        "sizes": sizes.__dict__,
        "load_before": machine_load(),
        "items": {},
    }
    began = time.monotonic()
    if 1 in items:
        data["items"]["1"] = item_handoff(
            source,
            executions=sizes.executions,
            rounds=sizes.rounds,
            takers=sizes.takers,
            unready=sizes.unready,
            drain=sizes.drain,
            progress=progress,
        )
    if 2 in items:
        data["items"]["2"] = item_commands(source, lives=sizes.lives, progress=progress)
    data["load_after"] = machine_load()
    data["seconds"] = round(time.monotonic() - began, 1)
    return data


def markdown(data: dict[str, Any]) -> str:
    items = data["items"]
    out: list[str] = []
    if "1" in items:
        found = items["1"]
        out += [
            f"### Item 1: hand-off latency, {found['executions']} executions per drain, "
            f"{found['takers']} replicas taking",
            "",
            f"`--unready-delay {found['unready_delay']} --drain-timeout "
            f"{found['drain_timeout']}`; latency = attempt 2's start - the owner's logged drain "
            "deadline.",
            "",
            "| round | handed over | p50 ms | p90 ms | p99 ms | min / max ms | by taker | ends | "
            "logged - planned deadline ms | owner exit |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for index, r in enumerate(found["rounds"], 1):
            skew = r["deadline_logged_minus_planned_ms"]
            out.append(
                f"| {index} | {r['handed_over']}/{r['executions']} | {r['p50_ms']:.0f} | "
                f"{r['p90_ms']:.0f} | **{r['p99_ms']:.0f}** | {r['min_ms']:.0f} / "
                f"{r['max_ms']:.0f} | {r['by_taker']} | {r['statuses']} | "
                f"{'-' if skew is None else f'{skew:.0f}'} | {r['owner_exit_code']} in "
                f"{r['owner_exit_seconds']} s |"
            )
        if found["rounds"]:
            p99s = [r["p99_ms"] for r in found["rounds"]]
            p50s = [r["p50_ms"] for r in found["rounds"]]
            out.append(
                f"| median of rounds | | {Spread.of(p50s).fmt(0)} | | **{Spread.of(p99s).fmt(0)}**"
                " | | | | | |"
            )
        pooled = found["pooled"]
        out += [
            "",
            f"all {pooled['n']}: p50 {pooled['p50_ms']:.0f} ms, p99 **{pooled['p99_ms']:.0f} "
            f"ms**, max {pooled['max_ms']:.0f} ms (target: p99 < 1,000 ms)",
            "",
        ]
    if "2" in items:
        found = items["2"]
        out += [
            f"### Item 2: Redis commands per Idempotency-Key and per checkpoint "
            f"({found['lives']} sync starts of `checkpoints` per row, one at a time)",
            "",
            "| life | round trips | commands sent | commands Redis ran | per script call |",
            "|---|---|---|---|---|",
        ]
        for name, entry in found["scenarios"].items():
            calls = ", ".join(
                f"{k.removeprefix('script ')} {v:.1f}"
                for k, v in entry["commands_per_script_call"].items()
            )
            sent = ", ".join(f"{k} {v:.2f}" for k, v in entry["by_command_per_life"].items())
            out.append(
                f"| {name} | {entry['round_trips_per_life']:.2f} | {sent} | "
                f"{entry['commands_run_per_life']:.1f} | {calls} |"
            )
        out += ["", "| added | round trips | commands sent | commands Redis ran |"]
        out.append("|---|---|---|---|")
        for name, entry in found["added"].items():
            out.append(
                f"| {name} | **{entry['round_trips']:.2f}** | {entry['commands_sent']:.2f} | "
                f"**{entry['commands_run']:.1f}** |"
            )
        out.append("")
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
    parser.add_argument("--rounds", type=int, default=None, help="item 1: drains")
    parser.add_argument("--executions", type=int, default=None, help="item 1: per drain")
    args = parser.parse_args()
    sizes = QUICK if args.quick else Sizes()
    overrides = {"rounds": args.rounds, "executions": args.executions}
    sizes = Sizes(**(sizes.__dict__ | {k: v for k, v in overrides.items() if v is not None}))
    items = tuple(int(item) for item in args.items.split(",") if item.strip())
    data = run(sizes=sizes, items=items, source=args.source.resolve())
    data["command"] = shlex.join(["python", "-m", "bench.durable", *sys.argv[1:]])
    data["raw_file"] = str(write_json("durable", data))
    print(f"`{data['command']}`\n")
    print(markdown(data))
    print(f"raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
