"""Profile a real `agent-server run` under wrk load with py-spy (sampling, no instrumentation).

Prints the functions with the most samples, inclusive (on the stack) and self (at the top),
as a share of all samples, and keeps the collapsed stacks under bench/out/ for a flame graph.

Usage: python -m bench.profile_server [--scenario sync|async|get] [--duration 10]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import threading
from collections import Counter
from pathlib import Path

from bench.common import (
    OUT_DIR,
    ServerProcess,
    agent_server_argv,
    free_port,
    log,
    run_wrk,
)
from bench.http_overhead import ECHO_BODY, _finished_execution

Ranked = list[tuple[str, int]]


def collapsed_top(path: Path, limit: int = 25) -> tuple[int, Ranked, Ranked]:
    """Total samples, top inclusive frames and top self frames of a collapsed-stack file."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        total += count
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return total, inclusive.most_common(limit), own.most_common(limit)


def profile(scenario: str, duration: float, connections: int) -> Path:
    if shutil.which("py-spy") is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    port = free_port()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    output = OUT_DIR / f"profile-{scenario}.collapsed"
    with ServerProcess("agent-server", agent_server_argv(port), port) as server:
        server.wait_ready()
        if scenario == "sync":
            method, path, body = "POST", "/reasoners/echo", ECHO_BODY
        elif scenario == "async":
            method, path, body = "POST", "/reasoners/echo/async", ECHO_BODY
        else:
            method, path, body = "GET", f"/executions/{_finished_execution(port)}", None
        run_wrk(server.url + path, method=method, body=body, duration=1, connections=connections)
        load = threading.Thread(
            target=run_wrk,
            args=(server.url + path,),
            kwargs={
                "method": method,
                "body": body,
                "duration": duration + 2,
                "connections": connections,
            },
        )
        load.start()
        try:
            subprocess.run(
                [
                    "py-spy",
                    "record",
                    "--pid",
                    str(server.proc.pid),
                    "--duration",
                    str(int(duration)),
                    "--rate",
                    "500",
                    "--format",
                    "raw",
                    "--output",
                    str(output),
                    "--nonblocking",
                ],
                check=True,
                capture_output=True,
                timeout=duration + 60,
            )
        finally:
            load.join(timeout=duration + 120)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scenario", choices=("sync", "async", "get"), default="sync")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--limit", type=int, default=30)
    args = parser.parse_args()
    output = profile(args.scenario, args.duration, args.connections)
    log(f"collapsed stacks: {output}")
    total, inclusive, own = collapsed_top(output, args.limit)
    print(f"{total} samples ({args.scenario})\n\ninclusive:")
    for frame, count in inclusive:
        print(f"{100 * count / total:6.1f}%  {frame}")
    print("\nself:")
    for frame, count in own:
        print(f"{100 * count / total:6.1f}%  {frame}")


if __name__ == "__main__":
    main()
