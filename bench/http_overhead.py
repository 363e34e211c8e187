"""Items 1 and 2: what agent-server costs per request, against a bare Starlette route doing the
same work under the same uvicorn settings, with AgentField's own server side by side.

Scenarios: `sync` (POST /reasoners/echo), `async` (POST /reasoners/echo/async), `get`
(GET /executions/{id} of a finished execution). Every round measures every server twice, half
the duration each, in a rotated order and then in the reverse order (A B C C B A), so drift on
a shared machine hits all of them alike; ratios are taken within a round, then their median
and range reported. After each run the next waits until the server measured is quiet again
(`settle`): the CPU it spends on work deferred past its answers counts in its CPU per
request and does not slow the next server down.

`--compare DIR` adds one more server: `agent-server run` from another source tree (DIR holds
an `agent_server/` package, e.g. a copy taken before a change), measured in the same rounds as
`agent-server@DIR`, so a change is judged before/after under the same machine noise.

`floor` (sync only) is the baseline app doing what the contract requires of a sync run
(bench/baseline_app.py `--floor`): a sync run is held to at least 0.9 of its requests/s.

`--pin` puts the servers on one CPU and wrk on another; by default the scheduler places them.

Usage: python -m bench.http_overhead [--rounds 5] [--duration 5] [--connections 16]
                                     [--loader wrk|python] [--no-peers] [--compare DIR]
                                     [--pin] [--scenarios sync,async,get]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import (
    AGENTFIELD_PYTHON,
    HttpConnection,
    LoadResult,
    ServerProcess,
    Spread,
    agent_server_argv,
    agentfield_argv,
    baseline_argv,
    drive_for,
    free_port,
    have_wrk,
    http_request,
    log,
    machine_load,
    peer_version,
    run_wrk,
    settle,
    split_cpus,
    write_json,
)

ECHO_BODY = b'{"text": "hello"}'
SCENARIOS = ("sync", "async", "get")
#: Which servers take part in which scenario (AgentField has no async start or lookup route
#: without its control plane). `floor`: the baseline app doing what the contract requires of
#: a sync run (bench/baseline_app.py `--floor`), against which a sync run is held.
TARGETS = {
    "sync": ("agent-server", "floor", "baseline", "agentfield"),
    "async": ("agent-server", "baseline"),
    "get": ("agent-server", "baseline"),
}


def _finished_execution(port: int, timeout: float = 10.0) -> str:
    """Start one echo in the background and return its id once it has finished."""

    async def go() -> str:
        connection = await HttpConnection.open(port)
        try:
            status, _, body = await connection.request(
                http_request("POST", "/reasoners/echo/async", ECHO_BODY)
            )
            if status != 202:
                raise RuntimeError(f"async start answered {status}: {body[:200]!r}")
            key = str(json.loads(body)["execution_id"])
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                status, _, body = await connection.request(
                    http_request("GET", f"/executions/{key}")
                )
                if status == 200 and json.loads(body)["status"] == "succeeded":
                    return key
                await asyncio.sleep(0.01)
            raise RuntimeError("the echo execution did not finish")
        finally:
            await connection.close()

    return asyncio.run(go())


def _measure(
    server: ServerProcess,
    scenario: str,
    *,
    duration: float,
    connections: int,
    loader: str,
    cpus: set[int] | None,
) -> LoadResult:
    if scenario == "sync":
        method, path, body = "POST", "/reasoners/echo", ECHO_BODY
    elif scenario == "async":
        method, path, body = "POST", "/reasoners/echo/async", ECHO_BODY
    else:
        method, path, body = "GET", f"/executions/{_finished_execution(server.port)}", None
    cpu_before = server.cpu_seconds()
    if loader == "wrk":
        result = run_wrk(
            server.url + path,
            method=method,
            body=body,
            duration=duration,
            connections=connections,
            cpus=cpus,
        )
    else:
        raw = http_request(method, path, body)

        def make(_: int) -> bytes:
            return raw

        result = asyncio.run(
            drive_for(server.port, make, duration=duration, concurrency=connections)
        )
    result.settle_seconds = settle(server)  # its deferred work counts, and ends before the next
    if result.requests:
        result.server_cpu_us = (server.cpu_seconds() - cpu_before) / result.requests * 1e6
    return result


def _combined(parts: list[LoadResult]) -> LoadResult:
    """One result from a server's runs in one round: requests over time, mean percentiles."""
    requests = sum(part.requests for part in parts)
    statuses: dict[int, int] = {}
    for part in parts:
        for code, count in part.statuses.items():
            statuses[code] = statuses.get(code, 0) + count
    return LoadResult(
        requests=requests,
        seconds=sum(part.seconds for part in parts),
        p50_ms=sum(part.p50_ms for part in parts) / len(parts),
        p99_ms=sum(part.p99_ms for part in parts) / len(parts),
        errors=sum(part.errors for part in parts),
        statuses=statuses,
        server_cpu_us=sum(part.server_cpu_us * part.requests for part in parts) / max(1, requests),
        settle_seconds=sum(part.settle_seconds for part in parts),
    )


def run(
    *,
    rounds: int = 5,
    duration: float = 5.0,
    connections: int = 16,
    loader: str = "wrk",
    peers: bool = True,
    compare: Path | None = None,
    pin: bool = False,
    scenarios: tuple[str, ...] = SCENARIOS,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    """Run every round of `scenarios`; return raw results, per-round ratios and their
    spreads."""
    split = split_cpus() if pin else None
    server_cpus, load_cpus = (None, None) if split is None else split
    if loader == "wrk" and not have_wrk():
        raise RuntimeError("wrk is not installed (apt-get install -y wrk), or use --loader python")
    use_agentfield = peers and AGENTFIELD_PYTHON.exists()
    load_before = machine_load()
    targets = {scenario: TARGETS[scenario] for scenario in scenarios}
    other = None if compare is None else f"agent-server@{compare.name}"
    if other is not None:
        targets = {scenario: (*names, other) for scenario, names in targets.items()}
    results: dict[str, dict[str, list[LoadResult]]] = {
        scenario: {target: [] for target in targets[scenario]} for scenario in scenarios
    }
    with ExitStack() as stack:
        servers: dict[str, ServerProcess] = {}
        port = free_port()
        servers["agent-server"] = stack.enter_context(
            ServerProcess("agent-server", agent_server_argv(port), port, cpus=server_cpus)
        )
        port = free_port()
        servers["baseline"] = stack.enter_context(
            ServerProcess("baseline", baseline_argv(port), port, cpus=server_cpus)
        )
        if "sync" in scenarios:
            port = free_port()
            servers["floor"] = stack.enter_context(
                ServerProcess("floor", baseline_argv(port, "--floor"), port, cpus=server_cpus)
            )
        if use_agentfield:
            port = free_port()
            servers["agentfield"] = stack.enter_context(
                ServerProcess(
                    "agentfield",
                    agentfield_argv(port),
                    port,
                    ready_path="/health",
                    cpus=server_cpus,
                )
            )
        if other is not None and compare is not None:
            port = free_port()
            servers[other] = stack.enter_context(
                ServerProcess(other, agent_server_argv(port), port, cwd=compare, cpus=server_cpus)
            )
        for server in servers.values():
            server.wait_ready()
        progress(f"servers ready: {', '.join(servers)}; warming up")
        for scenario in scenarios:
            for target in targets[scenario]:
                if target in servers:
                    _measure(
                        servers[target],
                        scenario,
                        duration=min(1.0, duration),
                        connections=connections,
                        loader=loader,
                        cpus=load_cpus,
                    )
        for index in range(rounds):
            for scenario in scenarios:
                present = [t for t in targets[scenario] if t in servers]
                shift = index % len(present)
                order = present[shift:] + present[:shift]
                halves: dict[str, list[LoadResult]] = {target: [] for target in order}
                for target in order + order[::-1]:  # A B C C B A: drift cancels out
                    result = _measure(
                        servers[target],
                        scenario,
                        duration=duration / 2,
                        connections=connections,
                        loader=loader,
                        cpus=load_cpus,
                    )
                    halves[target].append(result)
                    progress(
                        f"round {index + 1}/{rounds} {scenario:5} {target:12} "
                        f"{result.rps:8.0f} req/s p50 {result.p50_ms:6.2f} ms "
                        f"p99 {result.p99_ms:6.2f} ms errors {result.errors}"
                    )
                for target, pair in halves.items():
                    results[scenario][target].append(_combined(pair))
    return _summarise(
        results,
        config={
            "rounds": rounds,
            "duration": duration,
            "connections": connections,
            "loader": loader,
            "compare": None if compare is None else str(compare),
            "server_cpus": None if server_cpus is None else sorted(server_cpus),
            "load_cpus": None if load_cpus is None else sorted(load_cpus),
        },
        versions={
            "agentfield": peer_version(AGENTFIELD_PYTHON, "agentfield") if use_agentfield else None
        },
        load=(load_before, machine_load()),
    )


def _summarise(
    results: dict[str, dict[str, list[LoadResult]]],
    *,
    config: dict[str, Any],
    versions: dict[str, Any],
    load: tuple[list[float], list[float]],
) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for scenario, by_target in results.items():
        measured = {t: runs for t, runs in by_target.items() if runs}
        entry: dict[str, Any] = {"targets": {}, "ratios": {}}
        for target, runs in measured.items():
            entry["targets"][target] = {
                "rps": Spread.of([r.rps for r in runs]).as_dict(),
                "p50_ms": Spread.of([r.p50_ms for r in runs]).as_dict(),
                "p99_ms": Spread.of([r.p99_ms for r in runs]).as_dict(),
                "cpu_us": Spread.of([r.server_cpu_us for r in runs]).as_dict(),
                "settle_s": Spread.of([r.settle_seconds for r in runs]).as_dict(),
                "errors": sum(r.errors for r in runs),
                "runs": [asdict(r) | {"rps": r.rps} for r in runs],
            }
        pairs = [("agent-server", "baseline"), ("agent-server", "floor"), ("floor", "baseline")]
        pairs.append(("agentfield", "baseline"))
        pairs.append(("agent-server", "agentfield"))
        pairs += [(t, "baseline") for t in measured if t.startswith("agent-server@")]
        pairs += [("agent-server", t) for t in measured if t.startswith("agent-server@")]
        for top, bottom in pairs:
            if top in measured and bottom in measured:
                top_runs, bottom_runs = measured[top], measured[bottom]
                name = f"{top}/{bottom}"
                entry["ratios"][name] = {
                    "rps": Spread.of(
                        [a.rps / b.rps for a, b in zip(top_runs, bottom_runs, strict=True)]
                    ).as_dict(),
                    "p50": Spread.of(
                        [a.p50_ms / b.p50_ms for a, b in zip(top_runs, bottom_runs, strict=True)]
                    ).as_dict(),
                    "p99": Spread.of(
                        [a.p99_ms / b.p99_ms for a, b in zip(top_runs, bottom_runs, strict=True)]
                    ).as_dict(),
                    "cpu": Spread.of(
                        [
                            a.server_cpu_us / b.server_cpu_us
                            for a, b in zip(top_runs, bottom_runs, strict=True)
                            if b.server_cpu_us > 0
                        ]
                        or [0.0]
                    ).as_dict(),
                }
        summary[scenario] = entry
    return {
        "benchmark": "http_overhead",
        "config": config,
        "versions": versions,
        "load_before": load[0],
        "load_after": load[1],
        "scenarios": summary,
    }


def markdown(data: dict[str, Any]) -> str:
    """The results as RESULTS.md table rows: medians with [min-max] over the rounds."""

    def spread(d: dict[str, float], digits: int = 2) -> str:
        return f"{d['median']:.{digits}f} [{d['low']:.{digits}f}-{d['high']:.{digits}f}]"

    lines = [
        "| scenario | server | req/s | p50 ms | p99 ms | server CPU us/req | settle s | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for scenario, entry in data["scenarios"].items():
        for target, figures in entry["targets"].items():
            lines.append(
                f"| {scenario} | {target} | {spread(figures['rps'], 0)} | "
                f"{spread(figures['p50_ms'])} | {spread(figures['p99_ms'])} | "
                f"{spread(figures['cpu_us'], 0)} | {spread(figures['settle_s'], 1)} | "
                f"{figures['errors']} |"
            )
    lines += [
        "",
        "| scenario | ratio | req/s | p50 | p99 | server CPU/req |",
        "|---|---|---|---|---|---|",
    ]
    for scenario, entry in data["scenarios"].items():
        for name, ratio in entry["ratios"].items():
            lines.append(
                f"| {scenario} | {name} | {spread(ratio['rps'])} | {spread(ratio['p50'])} | "
                f"{spread(ratio['p99'])} | {spread(ratio['cpu'])} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--loader", choices=("wrk", "python"), default="wrk")
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument("--compare", type=Path, default=None)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument(
        "--pin",
        action="store_true",
        help="servers on one CPU and wrk on another (default: the scheduler places them)",
    )
    args = parser.parse_args()
    data = run(
        rounds=args.rounds,
        duration=args.duration,
        connections=args.connections,
        loader=args.loader,
        peers=not args.no_peers,
        compare=args.compare,
        pin=args.pin,
        scenarios=tuple(args.scenarios.split(",")),
    )
    data["raw_file"] = str(write_json("http_overhead", data))
    print(markdown(data))
    print(f"\nload average before {data['load_before']} after {data['load_after']}")
    print(f"versions: {data['versions']}; raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
