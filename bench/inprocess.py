"""The request path in process: the demo agent's ASGI app called directly, no HTTP, no wrk.

Over loopback on two cores shared with the load generator, two servers running the same code
differ by 10 to 25% (RESULTS.md, "The request path after issues 22 and 23"); called in
process, a tree's cost per request is steady to a few percent, so a change to the code path
shows. Each tree runs in a child interpreter of its own (`PYTHONPATH` = the tree), the trees
alternate, and each pass is `--requests` requests; the best pass counts.

Scenarios: a sync run (`POST /reasoners/echo`) and a status read (`GET /executions/{id}` of a
finished execution), with the memory store.

`--sampler` compares this tree with itself, the loop-lag sampler (`agent_server.loop_lag`) on
and off (its `start` and `stop` made no-ops in the child), alternating as trees do: what the
sampler costs a request.

Usage: python -m bench.inprocess [--compare DIR | --sampler] [--passes 12] [--requests 1500]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import ROOT

CHILD = r"""
import asyncio, json, sys, time
from agent_server.demo import agent

if len(sys.argv) > 3 and sys.argv[3] == "off":  # --sampler: the same tree without it
    import agent_server.loop_lag as loop_lag

    async def _stopped(self):
        pass

    loop_lag.LoopLagSampler.start = lambda self: None
    loop_lag.LoopLagSampler.stop = _stopped

app = agent.asgi()
passes, requests = int(sys.argv[1]), int(sys.argv[2])


async def call(method, path, body=b""):
    sent = []
    delivered = False

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
    if body:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "headers": headers, "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80), "state": {}, "extensions": {},
    }
    await app(scope, receive, send)
    return sent


async def main():
    queue = asyncio.Queue()
    await queue.put({"type": "lifespan.startup"})
    replies = asyncio.Queue()

    async def lifespan_send(message):
        await replies.put(message)

    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.create_task(app(scope, queue.get, lifespan_send))
    started = await replies.get()
    assert started["type"] == "lifespan.startup.complete", started
    body = json.dumps({"text": "hello"}).encode()
    results = {}
    for name, method, path, payload in (
        ("sync", "POST", "/reasoners/echo", body),
        ("get", "GET", "/executions/{id}", b""),
    ):
        if name == "get":  # started now: the sync runs before would have it pruned
            first = await call("POST", "/reasoners/echo/async", body)
            path = path.format(id=json.loads(first[1]["body"])["execution_id"])
            await asyncio.sleep(0.05)
        status = (await call(method, path, payload))[0]["status"]
        assert status == 200, (name, status)
        best = float("inf")
        for _ in range(passes):
            began = time.perf_counter()
            for _ in range(requests):
                await call(method, path, payload)
            best = min(best, (time.perf_counter() - began) / requests)
        results[name] = best * 1e6
    print(json.dumps(results))
    task.cancel()


asyncio.run(main())
"""


def measure(tree: Path, passes: int, requests: int, sampler: str = "on") -> dict[str, float]:
    """Microseconds per request of each scenario, best pass, for the tree at `tree`
    (`sampler` "off": with the loop-lag sampler's start and stop made no-ops)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(passes), str(requests), sampler],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    figures: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return figures


def run(
    compare: Path | None, passes: int, requests: int, repeat: int, sampler: bool = False
) -> dict[str, Any]:
    """Each variant (a tree, or this tree with the sampler on and off) `repeat` times,
    alternating; the best pass of each."""
    if sampler:
        variants = [("sampler on", ROOT, "on"), ("sampler off", ROOT, "off")]
    else:
        trees = [ROOT] if compare is None else [ROOT, compare]
        variants = [(str(tree), tree, "on") for tree in trees]
    seen: dict[str, list[dict[str, float]]] = {label: [] for label, _, _ in variants}
    for turn in range(repeat):
        for label, tree, state in variants if turn % 2 == 0 else list(reversed(variants)):
            seen[label].append(measure(tree, passes, requests, state))
    best = {
        label: {name: min(run[name] for run in runs) for name in runs[0]}
        for label, runs in seen.items()
    }
    return {"trees": [label for label, _, _ in variants], "best_us": best, "runs": seen}


def markdown(data: dict[str, Any]) -> str:
    trees = data["trees"]
    best = data["best_us"]
    lines = ["| scenario | " + " | ".join(f"{Path(t).name} (us)" for t in trees) + " | ratio |"]
    lines.append("|---|" + "---|" * (len(trees) + 1))
    for name in best[trees[0]]:
        values = [best[tree][name] for tree in trees]
        ratio = f"{values[0] / values[1]:.2f}" if len(values) == 2 else ""
        lines.append(f"| {name} | " + " | ".join(f"{v:.1f}" for v in values) + f" | {ratio} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--compare", type=Path, default=None)
    parser.add_argument("--passes", type=int, default=12)
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each tree, alternating")
    parser.add_argument(
        "--sampler", action="store_true", help="this tree with the loop-lag sampler on and off"
    )
    args = parser.parse_args()
    if args.sampler and args.compare is not None:
        parser.error("--sampler compares this tree with itself: no --compare")
    data = run(args.compare, args.passes, args.requests, args.repeat, args.sampler)
    print(markdown(data))


if __name__ == "__main__":
    main()
