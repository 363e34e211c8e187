"""The cost of scheduling to a start (docs/scheduling.md): a synchronous run of a trivial
reasoner with no limit, with a concurrency limit that never binds, and in a session with
policy `enqueue`, each as a ratio to no limit in the same rounds; and, with 1,000 queued
behind a limit of one, the time from a slot freeing (an end) to the next queued attempt
running, p50/p99. On the memory store and on a real Redis (`redis-server` on a free port).

    python -m bench.scheduling [--rounds 5] [--runs 200] [--queued 1000]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import ServerProcess, agent_server_argv, free_port

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0


def serve(store: str, marks: Path) -> ServerProcess:
    port = free_port()
    env = {"SCHEDULING_BENCH_MARKS": str(marks), "PYTHONPATH": str(ROOT)}
    flags = ("--store", store, "--log-level", "warning", "--max-inflight", "10000")
    app = "bench.apps.scheduling_bench_app:agent"
    server = ServerProcess("agent-server", agent_server_argv(port, app, *flags), port, env=env)
    try:
        server.wait_ready(TIMEOUT)
    except RuntimeError:
        server.stop()
        raise SystemExit(f"{server.url} not ready") from None
    return server


def latencies(client: httpx.Client, path: str, runs: int, headers: dict[str, str]) -> list[float]:
    found = []
    for _ in range(runs):
        began = time.perf_counter()
        response = client.post(path, json={}, headers=headers)
        found.append(time.perf_counter() - began)
        assert response.status_code == 200, response.text
    return found


def start_costs(url: str, rounds: int, runs: int) -> dict[str, float]:
    """p50 of each kind of start over every round, the kinds alternating within a round."""
    kinds = {
        "no limit": ("/reasoners/free", {}),
        "max_concurrency (never binds)": ("/reasoners/limited", {}),
        "session policy enqueue": (
            "/reasoners/free",
            {"X-Session-ID": "bench", "X-Session-Policy": "enqueue"},
        ),
    }
    samples: dict[str, list[float]] = {kind: [] for kind in kinds}
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        latencies(client, "/reasoners/free", 50, {})  # warm up
        for round_ in range(rounds):
            order = list(kinds) if round_ % 2 == 0 else list(reversed(kinds))
            for kind in order:
                path, headers = kinds[kind]
                samples[kind] += latencies(client, path, runs, headers)
    return {kind: statistics.median(values) for kind, values in samples.items()}


def slot_handover(url: str, marks: Path, queued: int) -> tuple[float, float]:
    """Queue `queued` runs behind a limit of one; the gaps from each end to the next start."""
    marks.write_text("")
    with httpx.Client(base_url=url, timeout=TIMEOUT) as client:
        ids = [client.post("/reasoners/one/async", json={}).json()["execution_id"]
               for _ in range(queued)]  # fmt: skip
        for execution_id in ids:
            while client.get(f"/executions/{execution_id}", params={"wait": 30}).json()[
                "status"
            ] in ("queued", "running"):
                pass
    lines = [line.split() for line in marks.read_text().splitlines()]
    ends = [float(t) for kind, t in lines if kind == "end"]
    starts = [float(t) for kind, t in lines if kind == "start"]
    gaps = sorted(b - a for a, b in zip(ends, starts[1:], strict=False))
    return statistics.median(gaps), gaps[int(len(gaps) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--queued", type=int, default=1000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        redis_port = free_port()
        redis = subprocess.Popen(
            ["redis-server", "--port", str(redis_port), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.3)
            for store in ("memory", f"redis://127.0.0.1:{redis_port}/0"):
                marks = Path(tmp) / "marks"
                with serve(store, marks) as server:
                    costs = start_costs(server.url, args.rounds, args.runs)
                    p50, p99 = slot_handover(server.url, marks, args.queued)
                name = "memory" if store == "memory" else "redis"
                base = costs["no limit"]
                print(f"\n{name}: sync run p50, {args.rounds} rounds x {args.runs}")
                print("| start | p50 ms | ratio to no limit |\n|---|---|---|")
                for kind, value in costs.items():
                    print(f"| {kind} | {value * 1000:.3f} | {value / base:.2f} |")
                print(
                    f"slot freed -> next queued attempt running, {args.queued} queued behind "
                    f"max_concurrency=1: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms"
                )
        finally:
            redis.terminate()
            redis.wait(timeout=TIMEOUT)


if __name__ == "__main__":
    main()
