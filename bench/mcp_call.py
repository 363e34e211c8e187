"""What MCP costs per call: `tools/call` of the trivial `echo` reasoner at `/mcp` (2026-07-28,
one self-contained POST each) against the plain sync route `POST /reasoners/echo`, on the
same `agent-server run --mcp` in the same run (docs/protocols.md).

Each round runs both twice, half the duration each, mirrored (A B B A), waiting after each run
until the server is quiet (`settle`); the ratio is taken within a round, then its median and
range reported with each one's throughput, latency and server CPU per request.

Usage: python -m bench.mcp_call [--rounds 3] [--duration 4] [--connections 16]
"""

from __future__ import annotations

import argparse
import json
import urllib.request
from typing import Any

from bench.common import (
    LoadResult,
    ServerProcess,
    Spread,
    agent_server_argv,
    free_port,
    have_wrk,
    log,
    machine_load,
    run_wrk,
    settle,
    write_json,
)

ECHO = {"text": "hello"}
#: A `tools/call` as the SDK's client sends it on 2026-07-28: the envelope in `_meta`, the
#: routing headers beside it.
CALL = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "tools/call",
    "params": {
        "name": "echo",
        "arguments": ECHO,
        "_meta": {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
        },
    },
}
MCP_HEADERS = {
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "echo",
}


def _check(server: ServerProcess) -> None:
    """One call of each, answered as expected, before any load."""
    body = json.dumps(CALL).encode()
    request = urllib.request.Request(
        f"{server.url}/mcp",
        data=body,
        headers={**MCP_HEADERS, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as reply:
        answer = json.loads(reply.read())
    if answer.get("result", {}).get("structuredContent") != ECHO:
        raise RuntimeError(f"tools/call answered {answer}")
    plain = urllib.request.Request(
        f"{server.url}/reasoners/echo",
        data=json.dumps(ECHO).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(plain, timeout=10) as reply:
        if json.loads(reply.read()).get("result") != ECHO:
            raise RuntimeError("the sync route answered otherwise")


def _run(server: ServerProcess, which: str, duration: float, connections: int) -> LoadResult:
    before = server.cpu_seconds()
    if which == "mcp":
        result = run_wrk(
            f"{server.url}/mcp",
            method="POST",
            body=json.dumps(CALL, separators=(",", ":")).encode(),
            duration=duration,
            connections=connections,
            headers=MCP_HEADERS,
        )
    else:
        result = run_wrk(
            f"{server.url}/reasoners/echo",
            method="POST",
            body=json.dumps(ECHO).encode(),
            duration=duration,
            connections=connections,
        )
    result.settle_seconds = settle(server)
    used = server.cpu_seconds() - before
    result.server_cpu_us = used / result.requests * 1e6 if result.requests else 0.0
    if result.errors:
        raise RuntimeError(f"{which}: {result.errors} errors")
    return result


def run(rounds: int, duration: float, connections: int) -> dict[str, Any]:
    """The rounds, and what they measured (the JSON `main` prints)."""
    port = free_port()
    argv = agent_server_argv(port, "bench.bench_app:agent", "--mcp", "--log-level", "warning")
    runs: dict[str, list[LoadResult]] = {"sync": [], "mcp": []}
    ratios: list[float] = []
    load = machine_load()
    with ServerProcess("agent-server --mcp", argv, port) as server:
        server.wait_ready()
        _check(server)
        for which in ("sync", "mcp"):  # warm both paths before measuring
            _run(server, which, 1.0, connections)
        for round_ in range(rounds):
            order = ("sync", "mcp") if round_ % 2 == 0 else ("mcp", "sync")
            measured: dict[str, list[LoadResult]] = {"sync": [], "mcp": []}
            for which in (*order, *reversed(order)):
                result = _run(server, which, duration / 2, connections)
                measured[which].append(result)
                runs[which].append(result)
                log(f"round {round_ + 1} {which}: {result.rps:.0f} req/s")
            rps = {w: sum(r.rps for r in rs) / len(rs) for w, rs in measured.items()}
            ratios.append(rps["mcp"] / rps["sync"])
    report: dict[str, Any] = {"load_at_start": load, "load_at_end": machine_load()}
    for which, results in runs.items():
        report[which] = {
            "rps": Spread.of([r.rps for r in results]).as_dict(),
            "p50_ms": Spread.of([r.p50_ms for r in results]).as_dict(),
            "p99_ms": Spread.of([r.p99_ms for r in results]).as_dict(),
            "server_cpu_us": Spread.of([r.server_cpu_us for r in results]).as_dict(),
        }
    report["mcp_over_sync_rps"] = Spread.of(ratios).as_dict()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--connections", type=int, default=16)
    args = parser.parse_args()
    if not have_wrk():
        raise SystemExit("wrk is needed (Debian's package)")
    report = run(args.rounds, args.duration, args.connections)
    path = write_json("mcp_call", report)
    print(json.dumps(report, indent=2))
    log(f"written to {path}")


if __name__ == "__main__":
    main()
