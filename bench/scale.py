"""Items 3, 5 and 6: drain precision, memory per execution and cost growth at scale.

For each scale N (default 1,000 / 10,000 / 100,000) and round, fresh real processes:

- `mix` (item 3): `agent-server run` with N in flight, 90% cooperative sleepers and 10% that
  swallow cancellation forever, `--drain-timeout 2 --cancel-timeout 1`. Figures: seconds from
  SIGTERM to process exit divided by the configured bound (drain + cancel), and the shutdown
  report's counts (finished + cancelled + abandoned must equal N).
- `park` (items 5 and 6): N executions that return as soon as the drain begins, on
  agent-server and on the baseline app (bare tasks). Figures: start cost (bulk seconds per
  start, and the p50 latency of one more start with N in flight), resident memory per
  in-flight execution, and drain time (SIGTERM to exit).
- `retained` (item 5): N finished echo executions (small result) kept, on both servers;
  resident memory per retained execution.

Memory per execution is the least-squares slope of (RSS at N - RSS before any work) over
the scales. Growth: the start cost per execution at each scale against the next smaller scale
(1.0 is linear), and the drain's marginal cost per added execution between scales (constant
is linear; rising is worse than linear).

`--compare DIR` runs the mix a second time per scale and round with agent-server from another
source tree (DIR holds an `agent_server/` package), for before/after under the same noise.

`--gc-log` (mix) adds the garbage-collection pauses the server spent after SIGTERM.

Usage: python -m bench.scale [--scales 1000,10000,100000] [--rounds 3] [--parts mix,park,retained]
                             [--compare DIR] [--gc-log] [--redis | --postgres] [--grace S]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import (
    OUT_DIR,
    ROOT,
    HttpConnection,
    LoadResult,
    ServerProcess,
    Spread,
    agent_server_argv,
    baseline_argv,
    drive,
    free_port,
    http_request,
    log,
    machine_load,
    shutdown_report,
    slope,
    write_json,
)
from bench.store import RedisServer

APP = "bench.bench_app:agent"
#: Starts sampled one at a time (on one connection) once the bulk is in flight.
SAMPLED_STARTS = 200
CONCURRENCY = 32
#: Generous bounds: every loop and wait below ends by these even when a server misbehaves.
START_RATE_FLOOR = 100.0  # starts per second below which a bulk start gives up
EXIT_TIMEOUT = 120.0
SETTLE_SECONDS = 0.5
MIX_DRAIN = 2.0
MIX_CANCEL = 1.0
PARK_DRAIN = 60.0


def _agent_flags(
    n: int, *, drain: float, cancel: float, store: str | None = None, grace: float | None = None
) -> list[str]:
    grace = drain + cancel + 1 + 1 + 5 if grace is None else grace
    return [
        *(() if store is None else ("--store", store)),
        "--max-inflight",
        str(max(1000, n + SAMPLED_STARTS)),
        "--max-retained",
        str(max(10_000, n + SAMPLED_STARTS)),
        "--drain-timeout",
        str(drain),
        "--cancel-timeout",
        str(cancel),
        "--grace-period",
        str(grace),
    ]


def _start(
    server: ServerProcess,
    requests: Callable[[int], bytes],
    count: int,
    *,
    retry_unavailable: bool = False,
) -> tuple[LoadResult, list[str]]:
    """Start `count` executions in bulk; every answer must be 202. Returns their ids too.
    With `retry_unavailable`, starts answered 503 (a shared store slow to answer on a busy
    machine) are sent again, as a client following `Retry-After` would, a few times at most;
    the count sent again is logged."""
    ids: list[str] = []
    refused: list[bytes] = []

    def keep(status: int, body: bytes) -> None:
        if status == 202:
            ids.append(json.loads(body)["execution_id"])
        elif status == 503 and len(refused) < 3:
            refused.append(body)

    timeout = 30 + count / START_RATE_FLOOR
    missing = count
    result: LoadResult | None = None
    for attempt in range(5 if retry_unavailable else 1):
        if attempt:
            log(f"{server.name}: {missing} starts answered 503 ({refused[0]!r}): sent again")
            time.sleep(1.0)
        sent = len(ids)
        result = asyncio.run(
            drive(
                server.port,
                lambda index, sent=sent: requests(sent + index),
                count=missing,
                concurrency=CONCURRENCY,
                timeout=timeout,
                keep=keep,
            )
        )
        missing = count - len(ids)
        if not missing or set(result.statuses) - {202, 503}:
            break
    assert result is not None
    if missing:
        raise RuntimeError(f"{server.name}: starts answered {result.statuses}, wanted {count}")
    return result, ids


def _sample(server: ServerProcess, raw: bytes, count: int) -> list[float]:
    """Latencies (ms) of `count` starts one after another on one connection."""

    async def go() -> list[float]:
        connection = await HttpConnection.open(server.port)
        latencies: list[float] = []
        try:
            async with asyncio.timeout(30 + count):
                for _ in range(count):
                    sent = time.perf_counter()
                    status, _, body = await connection.request(raw)
                    latencies.append((time.perf_counter() - sent) * 1000)
                    if status != 202:
                        raise RuntimeError(f"sampled start answered {status}: {body[:200]!r}")
        finally:
            await connection.close()
        return latencies

    return asyncio.run(go())


def _warm(server: ServerProcess) -> None:
    """A few requests so lazily built state exists before the memory baseline is read."""

    def ready(_: int) -> bytes:
        return http_request("GET", "/readyz")

    asyncio.run(drive(server.port, ready, count=200, concurrency=4, timeout=30))
    time.sleep(SETTLE_SECONDS)


def _wait_finished(server: ServerProcess, execution_id: str, timeout: float = 60.0) -> None:
    async def go() -> None:
        connection = await HttpConnection.open(server.port)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                _, _, body = await connection.request(
                    http_request("GET", f"/executions/{execution_id}")
                )
                if json.loads(body)["status"] != "running":
                    return
                await asyncio.sleep(0.05)
            raise RuntimeError(f"{execution_id} still running after {timeout}s")
        finally:
            await connection.close()

    asyncio.run(go())


def _launch(
    target: str,
    n: int,
    *,
    drain: float,
    cancel: float,
    tree: Path | None = None,
    gc_log: bool = False,
    store: str | None = None,
    grace: float | None = None,
) -> ServerProcess:
    """A fresh server; `tree`: run agent-server from another source tree (bench from ROOT);
    `gc_log`: log every garbage-collection pause over 10 ms (bench/gc_pauses)."""
    paths = [str(ROOT / "bench" / "gc_pauses")] if gc_log else []
    if tree is not None:
        paths.append(str(ROOT))
    env = {"PYTHONPATH": os.pathsep.join(paths)} if paths else None
    port = free_port()
    if target == "agent-server":
        argv = agent_server_argv(
            port, APP, *_agent_flags(n, drain=drain, cancel=cancel, store=store, grace=grace)
        )
    else:
        argv = baseline_argv(port, "--max-retained", str(max(10_000, n + SAMPLED_STARTS)))
    server = ServerProcess(target, argv, port, cwd=tree or ROOT, env=env)
    server.wait_ready()
    return server


def run_mix(
    n: int,
    *,
    drain: float = MIX_DRAIN,
    cancel: float = MIX_CANCEL,
    tree: Path | None = None,
    gc_log: bool = False,
    store: str | None = None,
    grace: float | None = None,
) -> dict[str, Any]:
    """Item 3 at scale n (`tree`: agent-server from another source tree; `store`: a shared
    store's URL, whose ends then go through its outbox; `grace`: the grace period, if not
    the bound's plus 7 s)."""
    swallowers = n // 10  # every tenth start
    cooperative = http_request("POST", "/reasoners/cooperative/async", b"{}")
    swallow = http_request("POST", "/reasoners/swallow/async", b"{}")

    def request(index: int) -> bytes:
        return swallow if index % 10 == 9 else cooperative

    if store is not None:  # each run on an empty store: the runs before leave their records
        empty(store)
    launched = _launch(
        "agent-server",
        n,
        drain=drain,
        cancel=cancel,
        tree=tree,
        gc_log=gc_log,
        store=store,
        grace=grace,
    )
    with launched as server:
        started = time.perf_counter()
        _start(server, request, n, retry_unavailable=True)
        start_seconds = time.perf_counter() - started
        time.sleep(SETTLE_SECONDS)
        server.signal()
        code, elapsed = server.wait_exit(EXIT_TIMEOUT)
        stderr = server.stderr()
        kept = OUT_DIR / f"scale-mix-{n}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        OUT_DIR.mkdir(parents=True, exist_ok=True)
        kept.write_text(stderr)  # the server's log, for what the report does not say
        signalled = server.signalled_at or 0.0
    pauses = [
        float(line.split()[3])
        for line in stderr.splitlines()
        if line.startswith("GC_PAUSE ") and float(line.split()[2]) >= signalled
    ]
    bound = drain + cancel
    try:
        report = shutdown_report(stderr)
    except RuntimeError:  # the watchdog ended the process before the report (exit code 4)
        report = {k: 0 for k in ("finished", "cancelled", "abandoned", "rejected")}
        report["duration_seconds"] = None
    counted = report["finished"] + report["cancelled"] + report["abandoned"]
    return {
        "n": n,
        "tree": None if tree is None else str(tree),
        "swallowers": swallowers,
        "exit_code": code,
        "exit_seconds": elapsed,
        "bound_seconds": bound,
        "ratio": elapsed / bound,
        "report": {k: report[k] for k in ("finished", "cancelled", "abandoned", "rejected")},
        "report_duration_seconds": report["duration_seconds"],
        # Each phase's time (reports from before they carried it: none), and what followed
        # the report: the listener, the http phase, the push and the exit.
        "phase_seconds": report.get("phase_seconds") or {},
        # With a shared store: ends the flush could not write, as the report counts them and
        # as the log names them (one line each).
        "unrecorded": report.get("unrecorded", 0),
        "unrecorded_lines": stderr.count("end not written to the store: "),
        "after_report_seconds": None
        if report["duration_seconds"] is None
        else elapsed - report["duration_seconds"],
        "counted": counted,
        "adds_up": counted == n,
        "gc_pause_after_signal": sum(pauses) if gc_log else None,
        "start_seconds": start_seconds,
    }


def run_park(target: str, n: int) -> dict[str, Any]:
    """Items 5 (in flight) and 6 at scale n on one server."""
    raw = http_request("POST", "/reasoners/park/async", b"{}")
    bulk = n - min(SAMPLED_STARTS, max(1, n // 5))
    with _launch(target, n, drain=PARK_DRAIN, cancel=1.0) as server:
        _warm(server)
        rss_before = server.rss_bytes()
        result, _ = _start(server, lambda _: raw, bulk)
        latencies = sorted(_sample(server, raw, n - bulk))
        time.sleep(SETTLE_SECONDS)
        rss_after = server.rss_bytes()
        server.signal()
        code, drain_seconds = server.wait_exit(EXIT_TIMEOUT)
        report = shutdown_report(server.stderr()) if target == "agent-server" else None
    return {
        "target": target,
        "n": n,
        "bulk_starts": bulk,
        "bulk_seconds": result.seconds,
        "start_us_per_execution": result.seconds / bulk * 1e6 if bulk else 0.0,
        "sampled_start_p50_ms": latencies[len(latencies) // 2],
        "sampled_start_p99_ms": latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)],
        "rss_before": rss_before,
        "rss_after": rss_after,
        "rss_delta": rss_after - rss_before,
        "exit_code": code,
        "drain_seconds": drain_seconds,
        "drain_us_per_execution": drain_seconds / n * 1e6,
        "report_finished": None if report is None else report["finished"],
    }


def run_retained(target: str, n: int) -> dict[str, Any]:
    """Item 5 (retained) at scale n on one server."""
    raw = http_request("POST", "/reasoners/echo/async", b'{"text": "hello"}')
    with _launch(target, n, drain=PARK_DRAIN, cancel=1.0) as server:
        _warm(server)
        rss_before = server.rss_bytes()
        _, ids = _start(server, lambda _: raw, n)
        _wait_finished(server, ids[-1])
        time.sleep(SETTLE_SECONDS)
        rss_after = server.rss_bytes()
    return {
        "target": target,
        "n": n,
        "rss_before": rss_before,
        "rss_after": rss_after,
        "rss_delta": rss_after - rss_before,
    }


def run(
    *,
    scales: tuple[int, ...] = (1_000, 10_000, 100_000),
    rounds: int = 3,
    parts: tuple[str, ...] = ("mix", "park", "retained"),
    mix_drain: float = MIX_DRAIN,
    mix_cancel: float = MIX_CANCEL,
    compare: Path | None = None,
    gc_log: bool = False,
    store: str | None = None,
    grace: float | None = None,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    load_before = machine_load()
    raw: dict[str, list[dict[str, Any]]] = {"mix": [], "park": [], "retained": []}
    for index in range(rounds):
        for n in scales:
            if "mix" in parts:
                for tree in (None,) if compare is None else (None, compare):
                    mix = run_mix(
                        n,
                        drain=mix_drain,
                        cancel=mix_cancel,
                        tree=tree,
                        gc_log=gc_log,
                        store=store,
                        grace=grace,
                    )
                    raw["mix"].append(mix)
                    progress(
                        f"round {index + 1} mix n={n} tree {tree}: exit "
                        f"{mix['exit_seconds']:.3f}s ratio {mix['ratio']:.3f} "
                        f"code {mix['exit_code']} report {mix['report']} "
                        f"GC pause after SIGTERM {mix['gc_pause_after_signal']}"
                    )
            for target in ("agent-server", "baseline"):
                if "park" in parts:
                    park = run_park(target, n)
                    raw["park"].append(park)
                    progress(
                        f"round {index + 1} park {target} n={n}: "
                        f"start {park['start_us_per_execution']:.0f} us/exec, p50 "
                        f"{park['sampled_start_p50_ms']:.2f} ms, "
                        f"rss +{park['rss_delta'] / n:.0f} B/exec, "
                        f"drain {park['drain_seconds']:.3f}s code {park['exit_code']}"
                    )
                if "retained" in parts:
                    kept = run_retained(target, n)
                    raw["retained"].append(kept)
                    progress(
                        f"round {index + 1} retained {target} n={n}: "
                        f"rss +{kept['rss_delta'] / n:.0f} B/exec"
                    )
    return summarise(raw, scales, load=(load_before, machine_load()))


def summarise(
    raw: dict[str, list[dict[str, Any]]],
    scales: tuple[int, ...],
    *,
    load: tuple[list[float], list[float]],
) -> dict[str, Any]:
    summary: dict[str, Any] = {"mix": {}, "park": {}, "memory": {}, "growth": {}}
    for n, tree in itertools.product(scales, sorted({r["tree"] or "" for r in raw["mix"]})):
        runs = [r for r in raw["mix"] if r["n"] == n and (r["tree"] or "") == tree]
        if runs:
            summary["mix"][f"{n}@{tree}" if tree else n] = {
                "ratio": Spread.of([r["ratio"] for r in runs]).as_dict(),
                "exit_seconds": Spread.of([r["exit_seconds"] for r in runs]).as_dict(),
                "reports": [r["report"] for r in runs],
                "unrecorded": [(r["unrecorded"], r["unrecorded_lines"]) for r in runs],
                "all_add_up": all(r["adds_up"] for r in runs),
                "exit_codes": sorted({r["exit_code"] for r in runs}),
                "gc_pause_after_signal": [r["gc_pause_after_signal"] for r in runs],
                "phases": {
                    phase: Spread.of([r["phase_seconds"][phase] for r in runs]).as_dict()
                    for phase in runs[0]["phase_seconds"]
                    if all(phase in r["phase_seconds"] for r in runs)
                },
                "after_report": Spread.of(
                    [r["after_report_seconds"] for r in runs if r["after_report_seconds"]] or [0.0]
                ).as_dict(),
            }
    for target in ("agent-server", "baseline"):
        per_scale: dict[int, Any] = {}
        for n in scales:
            runs = [r for r in raw["park"] if r["n"] == n and r["target"] == target]
            if runs:
                per_scale[n] = {
                    key: Spread.of([r[key] for r in runs]).as_dict()
                    for key in (
                        "start_us_per_execution",
                        "sampled_start_p50_ms",
                        "drain_seconds",
                        "drain_us_per_execution",
                    )
                }
        if per_scale:
            summary["park"][target] = per_scale
        for part, key in (("park", "in_flight"), ("retained", "retained")):
            runs = [r for r in raw[part] if r["target"] == target]
            if len({r["n"] for r in runs}) >= 2:
                points = [(float(r["n"]), float(r["rss_delta"])) for r in runs]
                summary["memory"].setdefault(target, {})[key] = {
                    "slope_bytes": slope(points),
                    "per_scale_bytes": {
                        n: Spread.of([r["rss_delta"] / n for r in runs if r["n"] == n]).as_dict()
                        for n in scales
                        if any(r["n"] == n for r in runs)
                    },
                }
    memory = summary["memory"]
    for key in ("in_flight", "retained"):
        if key in memory.get("agent-server", {}) and key in memory.get("baseline", {}):
            memory.setdefault("ratio", {})[key] = (
                memory["agent-server"][key]["slope_bytes"] / memory["baseline"][key]["slope_bytes"]
            )
    for target, per_scale in summary["park"].items():
        ordered = sorted(per_scale)
        growth: dict[int, Any] = {}
        for previous, n in itertools.pairwise(ordered):
            low, high = per_scale[previous], per_scale[n]
            start_low = low["start_us_per_execution"]["median"]
            drain_marginal = (
                (high["drain_seconds"]["median"] - low["drain_seconds"]["median"])
                / (n - previous)
                * 1e6
            )
            growth[n] = {
                "from": previous,
                "start_per_execution_ratio": high["start_us_per_execution"]["median"] / start_low
                if start_low
                else None,
                "drain_marginal_us": drain_marginal,
            }
        summary["growth"][target] = growth
    return {
        "benchmark": "scale",
        "scales": list(scales),
        "load_before": load[0],
        "load_after": load[1],
        "summary": summary,
        "raw": raw,
    }


def markdown(data: dict[str, Any]) -> str:
    def spread(d: dict[str, float], digits: int = 2) -> str:
        return f"{d['median']:.{digits}f} [{d['low']:.{digits}f}-{d['high']:.{digits}f}]"

    summary = data["summary"]
    lines: list[str] = []
    if summary["mix"]:
        lines += [
            "| in flight | exit s after SIGTERM | / bound (drain + cancel) | exit codes "
            "| report finished/cancelled/abandoned | adds up |",
            "|---|---|---|---|---|---|",
        ]
        for n, entry in summary["mix"].items():
            reports = "; ".join(
                f"{r['finished']}/{r['cancelled']}/{r['abandoned']}" for r in entry["reports"]
            )
            pauses = [p for p in entry.get("gc_pause_after_signal", []) if p is not None]
            gc_text = f" GC pause after SIGTERM (s): {', '.join(f'{p:.2f}' for p in pauses)}"
            lines.append(
                f"| {n} | {spread(entry['exit_seconds'], 3)} | {spread(entry['ratio'], 3)} | "
                f"{entry['exit_codes']} | {reports}{gc_text if pauses else ''} | "
                f"{entry['all_add_up']} |"
            )
        lines += [
            "",
            "| in flight | unready s | draining s | cancelling s | flushing s | reporting s "
            "| after the report s | unrecorded (as logged) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n, entry in summary["mix"].items():
            phases = entry.get("phases", {})
            cells = [
                spread(phases[p], 3) if p in phases else "-"
                for p in ("unready", "draining", "cancelling", "flushing", "reporting")
            ]
            unrecorded = ", ".join(f"{a} ({b} lines)" for a, b in entry.get("unrecorded", []))
            lines.append(
                f"| {n} | {' | '.join(cells)} | {spread(entry['after_report'], 3)} | {unrecorded} |"
            )
        lines.append("")
    if summary["park"]:
        lines += [
            "| server | in flight | start us/execution (bulk) | start p50 ms at N "
            "| drain s | drain us/execution |",
            "|---|---|---|---|---|---|",
        ]
        for target, per_scale in summary["park"].items():
            for n, f in per_scale.items():
                lines.append(
                    f"| {target} | {n} | {spread(f['start_us_per_execution'], 0)} | "
                    f"{spread(f['sampled_start_p50_ms'])} | {spread(f['drain_seconds'], 3)} | "
                    f"{spread(f['drain_us_per_execution'], 1)} |"
                )
        lines.append("")
    if summary["growth"]:
        lines += [
            "| server | from -> to | start us/execution, ratio to the smaller scale "
            "| drain: marginal us per added execution |",
            "|---|---|---|---|",
        ]
        for target, per_scale in summary["growth"].items():
            for n, g in per_scale.items():
                ratio = g["start_per_execution_ratio"]
                ratio_text = "-" if ratio is None else f"{ratio:.2f}"
                lines.append(
                    f"| {target} | {g['from']} -> {n} | {ratio_text} | "
                    f"{g['drain_marginal_us']:.1f} |"
                )
        lines.append("")
    memory = summary["memory"]
    if memory:
        lines += [
            "| server | kind | slope B/execution | per scale B/execution (median [range]) |",
            "|---|---|---|---|",
        ]
        for target in ("agent-server", "baseline"):
            for key, entry in memory.get(target, {}).items():
                scales_text = ", ".join(
                    f"{n}: {spread(s, 0)}" for n, s in entry["per_scale_bytes"].items()
                )
                lines.append(f"| {target} | {key} | {entry['slope_bytes']:.0f} | {scales_text} |")
        for key, ratio in memory.get("ratio", {}).items():
            lines.append(f"| agent-server/baseline | {key} | {ratio:.2f} | |")
    return "\n".join(lines)


def empty(store: str) -> None:
    """Empty the shared store at `store`: every Redis key, or every Postgres table's rows
    (the schema stays)."""
    if store.startswith("redis"):
        import redis

        with redis.Redis.from_url(store) as client:
            client.flushall()
        return
    import psycopg

    with psycopg.connect(store, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " AND tablename <> 'agent_server_schema'"
            )
        ]
        if tables:
            conn.execute(f"TRUNCATE {', '.join(tables)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scales", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--parts", default="mix,park,retained")
    parser.add_argument("--compare", type=Path, default=None, help="mix: another source tree")
    parser.add_argument("--gc-log", action="store_true", help="mix: log GC pauses")
    parser.add_argument(
        "--redis", action="store_true", help="mix: the Redis store, on a redis-server of its own"
    )
    parser.add_argument(
        "--postgres", action="store_true", help="mix: the Postgres store, on a server of its own"
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=None,
        help="mix: the grace period (default: drain + cancel + 7 s); a longer one shows how "
        "long the flush takes when the budget is not the limit",
    )
    args = parser.parse_args()
    scales = tuple(int(s) for s in args.scales.split(","))
    with contextlib.ExitStack() as stack:
        store = stack.enter_context(RedisServer()).url if args.redis else None
        if args.postgres:
            from tests.support.postgres_server import PostgresServer

            postgres = PostgresServer()
            stack.callback(postgres.remove)
            store = postgres.url
        data = run(
            scales=scales,
            rounds=args.rounds,
            parts=tuple(args.parts.split(",")),
            compare=args.compare,
            gc_log=args.gc_log,
            store=store,
            grace=args.grace,
        )
    data["raw_file"] = str(write_json("scale", data))
    print(markdown(data))
    print(f"\nload average before {data['load_before']} after {data['load_after']}")
    print(f"raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
