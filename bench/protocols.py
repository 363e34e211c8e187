"""The protocols' cost: an A2A `SendMessage` (blocking) of a trivial reasoner against the plain
synchronous route that runs the same reasoner, on one `agent-server run --a2a` (the demo
agent, memory store), in the same run.

Each round measures each scenario twice, in mirrored order (sync a2a a2a sync), with wrk at a
fixed body: `POST /reasoners/echo` with `{"text": "hello"}`, and `POST /a2a` with a v1.0
`SendMessage` whose data part is that body and whose `metadata.skill` is `echo`. Per
scenario: req/s, p50/p99 latency and the server's CPU per request, and the ratio of each to
the sync route's in the same round (docs/protocols.md; bench/RESULTS.md).

Usage: python -m bench.protocols [--rounds 2] [--duration 5] [--connections 16] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
from statistics import median
from typing import Any

from bench.common import (
    LoadResult,
    ServerProcess,
    agent_server_argv,
    free_port,
    have_wrk,
    log,
    run_wrk,
    settle,
    write_json,
)

ECHO = {"text": "hello"}
SEND_MESSAGE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "SendMessage",
    "params": {
        "message": {
            "messageId": "bench",
            "role": "ROLE_USER",
            "parts": [{"data": ECHO}],
            "metadata": {"skill": "echo"},
        }
    },
}
#: Each scenario: its path, its body and its headers.
SCENARIOS: dict[str, tuple[str, bytes, dict[str, str]]] = {
    "sync": ("/reasoners/echo", json.dumps(ECHO).encode(), {}),
    "a2a": ("/a2a", json.dumps(SEND_MESSAGE).encode(), {"A2A-Version": "1.0"}),
}


def check(server: ServerProcess) -> None:
    """Each scenario answers what it should before it is measured."""
    import httpx

    for name, (path, body, headers) in SCENARIOS.items():
        answer = httpx.post(
            server.url + path,
            content=body,
            headers={"Content-Type": "application/json", **headers},
            timeout=10,
        )
        answer.raise_for_status()
        if name == "a2a":
            task = answer.json()["result"]["task"]
            assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
            assert task["artifacts"][0]["parts"][0]["data"] == ECHO, task


def one(server: ServerProcess, name: str, args: argparse.Namespace) -> LoadResult:
    path, body, headers = SCENARIOS[name]
    cpu = server.cpu_seconds()
    result = run_wrk(
        server.url + path,
        method="POST",
        body=body,
        duration=args.duration,
        connections=args.connections,
        headers=headers,
    )
    result.server_cpu_us = (server.cpu_seconds() - cpu) / max(1, result.requests) * 1e6
    result.settle_seconds = settle(server)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="one round of 1 s, 2 connections")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.duration, args.connections = 1, 1.0, 2
    if not have_wrk():
        sys.exit("needs wrk (apt-get install -y wrk)")
    port = free_port()
    argv = agent_server_argv(port, None, "--a2a", "--log-level", "warning")
    runs: list[dict[str, Any]] = []
    with ServerProcess("agent-server", argv, port) as server:
        server.wait_ready()
        check(server)
        for round_ in range(args.rounds):
            for name in ("sync", "a2a", "a2a", "sync"):
                result = one(server, name, args)
                if result.errors:
                    sys.exit(f"{name}: {result.errors} errors in {result.requests} requests")
                figures = {
                    "rps": result.rps,
                    "p50_ms": result.p50_ms,
                    "p99_ms": result.p99_ms,
                    "cpu_us": result.server_cpu_us,
                }
                log(f"round {round_ + 1} {name}: {figures}")
                runs.append({"round": round_ + 1, "scenario": name, **figures})
    print("| scenario | req/s | p50 ms | p99 ms | server CPU us/req | req/s / sync | CPU / sync |")
    print("|---|---|---|---|---|---|---|")
    for name in SCENARIOS:
        mine = [r for r in runs if r["scenario"] == name]
        ratios = []
        for round_ in range(1, args.rounds + 1):
            here = [r for r in mine if r["round"] == round_]
            base = [r for r in runs if r["scenario"] == "sync" and r["round"] == round_]
            rps = sum(r["rps"] for r in here) / sum(r["rps"] for r in base)
            cpu = sum(r["cpu_us"] for r in here) / sum(r["cpu_us"] for r in base)
            ratios.append((rps, cpu))
        print(
            f"| {name} | {median(r['rps'] for r in mine):.0f} | "
            f"{median(r['p50_ms'] for r in mine):.2f} | {median(r['p99_ms'] for r in mine):.2f} | "
            f"{median(r['cpu_us'] for r in mine):.0f} | {median(r[0] for r in ratios):.2f} | "
            f"{median(r[1] for r in ratios):.2f} |"
        )
    print(f"raw: {write_json('protocols', {'runs': runs})}")


if __name__ == "__main__":
    main()
