"""The request path in process: the demo agent's ASGI app called directly, no HTTP, no wrk.

Over loopback on two cores shared with the load generator, two servers running the same code
differ by 10 to 25% (RESULTS.md, "The request path after issues 22 and 23"); called in
process, a tree's cost per request is steady to a few percent, so a change to the code path
shows. Each tree runs in a child interpreter of its own (`PYTHONPATH` = the tree), the trees
alternate, and each pass is `--requests` requests; the best pass counts.

Scenarios: a sync run (`POST /reasoners/echo`) and a status read (`GET /executions/{id}` of a
finished execution), with the memory store.

`--sampler` compares this tree with itself, the loop-lag sampler
(`agent_server.runtime.loop_lag`) on and off (its `start` and `stop` made no-ops in the
child), alternating as trees do: what the sampler costs a request.

`--instructions` counts instructions instead of time (valgrind's callgrind, `PYTHONHASHSEED=0`):
per scenario, the difference between a child that makes N requests and one that makes 1,000
more, divided by 1,000, averaged over N = `--requests` and N = `--requests` + 200 (where the
garbage collector runs moves a single window's figure by up to 2%). Children run two at a
time; the count does not depend on the load, where time moves by 10% and more.

`--tracing` adds this tree with traces on: `OTEL_EXPORTER_OTLP_ENDPOINT` pointed at a sink in
this process (a loopback HTTP server that reads each export and answers 200, as a collector
would), so the spans are made, batched, encoded and sent as in production. With `--compare`
it is measured beside both trees, traces off.

Usage: python -m bench.inprocess [--compare DIR | --sampler] [--tracing] [--passes 12]
    [--requests 1500]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from bench.common import ROOT

CHILD = r"""
import asyncio, json, sys, time
try:
    from agent_server.app.demo import agent
except ImportError:  # a tree from before the layers were folders (--compare)
    from agent_server.demo import agent

if len(sys.argv) > 3 and sys.argv[3] == "off":  # --sampler: the same tree without it
    import agent_server.runtime.loop_lag as loop_lag

    async def _stopped(self):
        pass

    loop_lag.LoopLagSampler.start = lambda self: None
    loop_lag.LoopLagSampler.stop = _stopped

app = agent.asgi()
passes, requests = int(sys.argv[1]), int(sys.argv[2])
only = sys.argv[4] if len(sys.argv) > 4 else None  # --instructions: one scenario


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
        if only is not None and name != only:
            continue
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


#: The standard variables that turn traces on (cleared for every other variant).
def _otel_env(endpoint: str) -> dict[str, str]:
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "bench"}


class _Sink(BaseHTTPRequestHandler):
    """A collector that keeps nothing: reads each export and answers 200."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def otlp_sink() -> Iterator[str]:
    """The endpoint of a sink served by a thread of this process while the block runs."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def measure(
    tree: Path,
    passes: int,
    requests: int,
    sampler: str = "on",
    extra_env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Microseconds per request of each scenario, best pass, for the tree at `tree`
    (`sampler` "off": with the loop-lag sampler's start and stop made no-ops; `extra_env`:
    the OTEL_* variables of traces on, none otherwise)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra_env or {}, PYTHONPATH=str(tree))
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


SCENARIOS = ("sync", "get")


def instructions(tree: Path, requests: int, scenario: str, extra_env: dict[str, str]) -> int:
    """Instructions callgrind counts for a child making `requests` requests of `scenario`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra_env, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    done = subprocess.run(
        [
            "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-c", CHILD, "1", str(requests), "on", scenario,
        ],
        cwd=tree, env=env, capture_output=True, text=True, check=True, timeout=1800,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    assert found is not None, done.stderr[-2000:]
    return int(found.group(1))


def count(compare: Path | None, requests: int, traced: str | None) -> dict[str, Any]:
    """Instructions per request of each scenario, for this tree, `compare`, and this tree
    with traces on (exported to `traced`)."""
    variants: list[tuple[str, Path, dict[str, str]]] = [(str(ROOT), ROOT, {})]
    if compare is not None:
        variants.append((str(compare), compare, {}))
    if traced is not None:
        variants.append(("traces on", ROOT, _otel_env(traced)))
    starts = (requests, requests + 200)
    jobs = [
        (label, scenario, n, tree, env)
        for label, tree, env in variants
        for scenario in SCENARIOS
        for start in starts
        for n in (start, start + 1000)
    ]
    with ThreadPoolExecutor(2) as pool:
        counted = list(pool.map(lambda job: instructions(job[3], job[2], job[1], job[4]), jobs))
    total = {
        (label, scenario, n): c for (label, scenario, n, _, _), c in zip(jobs, counted, strict=True)
    }
    best = {
        label: {
            scenario: sum(
                total[label, scenario, start + 1000] - total[label, scenario, start]
                for start in starts
            )
            / (1000 * len(starts))
            for scenario in SCENARIOS
        }
        for label, _, _ in variants
    }
    return {"trees": [label for label, _, _ in variants], "best_us": best, "unit": "instructions"}


def run(
    compare: Path | None,
    passes: int,
    requests: int,
    repeat: int,
    sampler: bool = False,
    traced: str | None = None,
) -> dict[str, Any]:
    """Each variant (a tree, this tree with the sampler on and off, or with traces on and
    exported to `traced`) `repeat` times, alternating; the best pass of each."""
    Variant = tuple[str, Path, str, dict[str, str]]
    variants: list[Variant]
    if sampler:
        variants = [("sampler on", ROOT, "on", {}), ("sampler off", ROOT, "off", {})]
    else:
        trees = [ROOT] if compare is None else [ROOT, compare]
        variants = [(str(tree), tree, "on", {}) for tree in trees]
    if traced is not None:
        variants.append(("traces on", ROOT, "on", _otel_env(traced)))
    seen: dict[str, list[dict[str, float]]] = {label: [] for label, _, _, _ in variants}
    for turn in range(repeat):
        for label, tree, state, env in variants if turn % 2 == 0 else variants[::-1]:
            seen[label].append(measure(tree, passes, requests, state, env))
    best = {
        label: {name: min(run[name] for run in runs) for name in runs[0]}
        for label, runs in seen.items()
    }
    return {"trees": [label for label, _, _, _ in variants], "best_us": best, "runs": seen}


def markdown(data: dict[str, Any]) -> str:
    trees = data["trees"]
    best = data["best_us"]
    others = trees[1:]
    unit = data.get("unit", "us")
    head = " | ".join(f"{Path(t).name} ({unit})" for t in trees)
    ratios = " | ".join(f"{Path(trees[0]).name} / {Path(t).name}" for t in others)
    lines = [f"| scenario | {head} | {ratios} |"]
    lines.append("|---|" + "---|" * (len(trees) + len(others)))
    for name in best[trees[0]]:
        values = [best[tree][name] for tree in trees]
        shown = " | ".join(f"{v:,.1f}" for v in values)
        quotients = " | ".join(f"{values[0] / v:.2f}" for v in values[1:])
        lines.append(f"| {name} | {shown} | {quotients} |")
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
    parser.add_argument(
        "--tracing", action="store_true", help="also this tree with traces on (OTLP to a sink)"
    )
    parser.add_argument(
        "--instructions", action="store_true", help="instructions per request (callgrind)"
    )
    args = parser.parse_args()
    if args.sampler and args.compare is not None:
        parser.error("--sampler compares this tree with itself: no --compare")
    with otlp_sink() as endpoint:
        traced = endpoint if args.tracing else None
        if args.instructions:
            data = count(args.compare, args.requests, traced)
        else:
            data = run(args.compare, args.passes, args.requests, args.repeat, args.sampler, traced)
    print(markdown(data))


if __name__ == "__main__":
    main()
