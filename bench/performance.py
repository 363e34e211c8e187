"""Regenerate the tables of docs/performance.md: one command, one machine, one date.

Each table is measured here, now, against its baseline in the same run, and written between
the page's `<!-- performance:NAME -->` and `<!-- /performance:NAME -->` markers (the prose
around them stays). What it runs:

- `sync`: sync runs per second against the bare echo route and against the contract's
  floor (bench/baseline_app.py `--floor`), and the server's CPU per run, pinned
  (bench.http_overhead's sync scenario);
- `stores`: execution lives per second per replica on memory, Redis and Postgres, a life's
  p50 and p99 (its start to its end, as its client sees it), the server's and the store's
  CPU per life, and store round trips per life (bench.pgstore items 1 and 2);
- `drain`: the drain of N in flight (90% cooperative, 10% that swallow cancellation) on each
  store: seconds from SIGTERM to exit over the bound, every end recorded (bench.scale's mix);
- `instructions`: the instructions Redis runs per life, all and in the script calls alone,
  plain, with tenants and behind Sentinel (bench.redis_cpu; valgrind's callgrind);
- `replicas`: lives per second and the store's CPU per life with 1, 2 and 3 replicas
  sharing one Redis, and one Postgres;
- `postgres`: rows and bytes per parked execution, and a list's first pages at 1,000,000
  records (bench.pgstore items 3 and 4);
- `driver`: psycopg against asyncpg on the store's statements (bench.pgdriver; needs
  `pip install asyncpg`).

Usage: PYTHONPATH=. python -m bench.performance [--parts sync,stores,drain,instructions,
                                                        replicas,postgres,driver]
                                               [--quick] [--drain-scales 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import http_overhead, pgstore, redis_cpu, scale
from bench import store as bench_store
from bench.common import ROOT, Spread, log, write_json
from bench.store import RedisServer
from tests.support.postgres_server import PostgresServer, bindir

PAGE = ROOT / "docs" / "performance.md"
PARTS = ("sync", "stores", "drain", "instructions", "replicas", "postgres", "driver")
#: A sync run holds at least this share of the contract's floor's requests/s (docs/performance.md).
FLOOR_SHARE = 0.9


def hardware() -> str:
    """The machine, as the page names it."""
    model = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    version = re.search(r"v=(\S+)", redis.stdout)
    postgres = subprocess.run(
        [str(bindir() / "postgres"), "--version"], capture_output=True, text=True
    )
    return (
        f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}; Redis {version.group(1) if version else '?'}; "
        f"{postgres.stdout.strip() or 'PostgreSQL ?'}"
    )


def part_sync(quick: bool) -> str:
    """A sync run against the bare echo and against the contract's floor, pinned."""
    rounds, duration = (1, 1.0) if quick else (5, 6.0)
    data = http_overhead.run(
        rounds=rounds, duration=duration, pin=True, peers=False, scenarios=("sync",)
    )
    entry = data["scenarios"]["sync"]
    names = {
        "agent-server": "agent-server sync run",
        "floor": "the contract's floor",
        "baseline": "bare echo",
    }
    rows = [
        "| server | sync runs/s | p50 / p99 ms | server CPU per run |",
        "|---|---|---|---|",
    ]
    for target, label in names.items():
        figures = entry["targets"][target]
        rate, cpu = Spread.from_dict(figures["rps"]), Spread.from_dict(figures["cpu_us"])
        rows.append(
            f"| {label} | {rate.fmt(0)} | {figures['p50_ms']['median']:.2f} / "
            f"{figures['p99_ms']['median']:.2f} | {cpu.fmt(0)} us |"
        )
    held = Spread.from_dict(entry["ratios"]["agent-server/floor"]["rps"])
    bare = Spread.from_dict(entry["ratios"]["agent-server/baseline"]["rps"])
    floor = Spread.from_dict(entry["ratios"]["floor/baseline"]["rps"])
    verdict = "holds" if held.median >= FLOOR_SHARE else "does not hold"
    rows += [
        "",
        "| ratio of requests/s, within each round | median [range] |",
        "|---|---|",
        f"| sync run / the contract's floor (held to {FLOOR_SHARE}) | **{held.fmt(2)}** |",
        f"| sync run / bare echo | {bare.fmt(2)} |",
        f"| the contract's floor / bare echo | {floor.fmt(2)} |",
        "",
        f"The sync run {verdict} at {FLOOR_SHARE} of the floor. {rounds} rounds of "
        f"{duration:.0f} s per server (A B C C B A), wrk with {data['config']['connections']} "
        "connections on one core, each server alone on the other; memory store, `echo`.",
    ]
    return "\n".join(rows)


def part_stores(quick: bool) -> str:
    lives, rounds, trips = (400, 1, 50) if quick else (4000, 3, 500)
    with pgstore.stores(pgstore.STORES) as servers:
        one = pgstore.item_lives(ROOT, servers, count=lives, rounds=rounds, concurrency=16)
        two = pgstore.item_round_trips(ROOT, servers, count=trips)
    rows = [
        "| store | lives/s per replica | against Redis | life p50 / p99 ms | server CPU per life "
        "| store CPU per life | store round trips per life |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, figures in one["stores"].items():
        rate = figures["lives_per_s"]
        ratio = one["ratio_to_redis"][name]
        trips_per = f"{two[name]['per_life']:.2f}" if name in two else "none (in process)"
        rows.append(
            f"| {name} | {rate['median']:.0f} [{rate['low']:.0f}-{rate['high']:.0f}] "
            f"| {ratio['median']:.2f} "
            f"| {figures['p50_ms']['median']:.1f} / {figures['p99_ms']['median']:.1f} "
            f"| {figures['server_cpu_us']['median']:.0f} us "
            f"| {figures['store_cpu_us']['median']:.0f} us | {trips_per} |"
        )
    rows += [
        "",
        f"A life: an async start of `echo` and a `GET ?wait=5` for its end, 16 at once, "
        f"{lives} lives a round, {rounds} rounds, the stores interleaved (ABBA); round trips "
        f"one life at a time, less what the idle replica sends in the same time.",
    ]
    return "\n".join(rows)


def part_drain(quick: bool, scales: tuple[int, ...]) -> str:
    rounds = 1 if quick else 3
    rows = [
        "| store | in flight | exit / bound (drain + cancel) | exit codes "
        "| finished/cancelled/abandoned | ends unrecorded |",
        "|---|---|---|---|---|---|",
    ]
    with contextlib.ExitStack() as stack:
        redis = stack.enter_context(RedisServer())
        postgres = PostgresServer()
        stack.callback(postgres.remove)
        urls: dict[str, str | None] = {"memory": None, "redis": redis.url, "postgres": postgres.url}
        for n in scales:
            for name, url in urls.items():
                runs = [scale.run_mix(n, store=url) for _ in range(rounds)]
                ratio = Spread.of([r["ratio"] for r in runs])
                report = runs[-1]["report"]
                log(f"drain {name} n={n}: {ratio.fmt(3)}")
                rows.append(
                    f"| {name} | {n:,} | {ratio.fmt(3)} "
                    f"| {sorted({r['exit_code'] for r in runs})} "
                    f"| {report['finished']}/{report['cancelled']}/{report['abandoned']} "
                    f"| {sum(r['unrecorded'] for r in runs)} |"
                )
    rows += ["", f"Drain 2 s, cancel 1 s; {rounds} runs each, a fresh process and empty store."]
    return "\n".join(rows)


def part_instructions(quick: bool) -> str:
    """Redis's instructions per life, by case (bench.redis_cpu): a count, not a time."""
    count = 200 if quick else 1000
    data = redis_cpu.run({"this tree": ROOT}, list(redis_cpu.CASES), count, 16)
    rows = [
        "| case | instructions per life, all of Redis | of which in the script calls |",
        "|---|---|---|",
    ]
    for case, by_tree in data["cases"].items():
        figures = by_tree["this tree"]
        rows.append(f"| {case} | {figures['per_life']:,.0f} | {figures['scripts_per_life']:,.0f} |")
    rows += [
        "",
        f"{count} lives, 16 at once, after {redis_cpu.WARM_UP}; redis-server under valgrind's "
        "callgrind (`python -m bench.redis_cpu`, which also compares a tree before).",
    ]
    return "\n".join(rows)


def part_replicas(quick: bool) -> str:
    """Lives per second and the store's CPU per life with 1, 2 and 3 replicas on one Redis,
    and on one Postgres."""
    count, rounds = (300, 1) if quick else (3000, 3)
    rows = [
        "| store | replicas on it | lives/s, all replicas | store CPU per life |",
        "|---|---|---|---|",
    ]
    for store in ("redis", "postgres"):
        for replicas in (1, 2, 3):
            rates: list[float] = []
            store_us: list[float] = []
            for _ in range(rounds):
                rate, us = _replicas_round(store, replicas, count)
                rates.append(rate)
                store_us.append(us)
            rate_spread, us_spread = Spread.of(rates), Spread.of(store_us)
            log(f"{store} replicas {replicas}: {rate_spread.fmt(0)} lives/s, {us_spread.fmt(0)} us")
            rows.append(f"| {store} | {replicas} | {rate_spread.fmt(0)} | {us_spread.fmt(0)} us |")
    rows += [
        "",
        f"{count} lives a round split among the replicas, each driven by 16 clients at once, "
        f"{rounds} rounds, a fresh store each; the store's CPU from its processes' times "
        "(`redis-server`'s, every Postgres process's). Every replica, the store and the load "
        "share the machine's cores.",
    ]
    return "\n".join(rows)


def _replicas_round(store: str, replicas: int, count: int) -> tuple[float, float]:
    with pgstore.stores((store,)) as found, contextlib.ExitStack() as stack:
        holder = found[store]  # the store's own server: its CPU is the figure
        url = pgstore.store_url(store, holder)
        flags = [bench_store.redis_flags(url, f"r{i}") for i in range(replicas)]
        servers = [
            stack.enter_context(bench_store.agent_server(f"r{i}", ROOT, *each))
            for i, each in enumerate(flags)
        ]
        for server in servers:
            server.wait_ready()

        async def all_at_once(each: int) -> list[Any]:
            return list(
                await asyncio.gather(
                    *(bench_store.lives(server.port, each, 16, 300) for server in servers)
                )
            )

        asyncio.run(all_at_once(100))
        before = pgstore.store_cpu(store, holder)
        began = time.perf_counter()
        done = asyncio.run(all_at_once(count // replicas))
        seconds = time.perf_counter() - began
        used = pgstore.store_cpu(store, holder) - before
    lived = sum(result.requests for result in done)
    if lived != (count // replicas) * replicas or any(result.errors for result in done):
        raise RuntimeError(f"{replicas} replicas: {[r.statuses for r in done]}")
    return lived / seconds, used / lived * 1e6


def part_postgres(quick: bool) -> str:
    parked, records, rounds = (20, 2000, 5) if quick else (1000, 1_000_000, 40)
    with pgstore.stores(("postgres",)) as servers:
        three = pgstore.item_parked(ROOT, servers["postgres"], count=parked)
    with pgstore.stores(("postgres",)) as servers:
        four = pgstore.item_first_page(ROOT, servers["postgres"], count=records, rounds=rounds)
    rows = [
        f"Parked executions ({parked}): "
        + ", ".join(f"{n:g} `{t}` row" for t, n in three["rows_per_parked"].items())
        + f" and {three['bytes_per_parked']:,.0f} bytes of database each.",
        "",
        f"| page, at {four['records']:,} records | p50 ms | p99 ms |",
        "|---|---|---|",
    ]
    for name, ms in four["ms"].items():
        rows.append(f"| {name} | {ms['p50']:.1f} | {ms['p99']:.1f} |")
    rows += ["", f"{rounds} reads of each over loopback (client time included)."]
    return "\n".join(rows)


def part_driver(quick: bool) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bench.pgdriver", "--lives", "500" if quick else "3000",
         "--rounds", "1" if quick else "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"bench.pgdriver failed:\n{done.stderr[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith(("|", "psycopg /"))]
    return "\n".join(lines)


def write_part(page: str, name: str, table: str) -> str:
    begin, end = f"<!-- performance:{name} -->", f"<!-- /performance:{name} -->"
    if begin not in page or end not in page:
        raise SystemExit(f"{PAGE} has no markers for {name}")
    head, rest = page.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--quick", action="store_true", help="smoke size (not for the page)")
    parser.add_argument("--drain-scales", default="10000")
    args = parser.parse_args()
    parts = tuple(args.parts.split(","))
    scales = tuple(int(n) for n in args.drain_scales.split(","))
    runners: dict[str, Callable[[], str]] = {
        "sync": lambda: part_sync(args.quick),
        "stores": lambda: part_stores(args.quick),
        "drain": lambda: part_drain(args.quick, scales),
        "instructions": lambda: part_instructions(args.quick),
        "replicas": lambda: part_replicas(args.quick),
        "postgres": lambda: part_postgres(args.quick),
        "driver": lambda: part_driver(args.quick),
    }
    began = time.monotonic()
    tables: dict[str, Any] = {}
    for name in parts:
        log(f"part {name}")
        tables[name] = runners[name]()
    page = PAGE.read_text()
    stamp = (
        f"Measured {time.strftime('%Y-%m-%d')} on {hardware()}, by "
        f"`PYTHONPATH=. python -m bench.performance --parts {','.join(parts)}"
        f"{f' --drain-scales {args.drain_scales}' if 'drain' in parts else ''}"
        f"{' --quick' if args.quick else ''}` ({time.monotonic() - began:.0f} s)."
    )
    for name, table in tables.items():
        page = write_part(page, name, f"{stamp}\n\n{table}")
    if not args.quick:
        PAGE.write_text(page)
    write_json("performance", {"tables": tables, "stamp": stamp})
    print(page if args.quick else f"{PAGE} written")


if __name__ == "__main__":
    main()
