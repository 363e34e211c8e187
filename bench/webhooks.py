"""Webhooks: what a delivery per execution costs (docs/webhooks.md).

Sync echo (`POST /reasoners/echo`, wrk) on `agent-server run` (the demo agent, memory store)
with `--webhook-url` set for every execution, against the same server without webhooks,
each measured twice per round in mirrored order (off on on off). A receiver on loopback
(uvicorn, this module's `receiver`) answers 200 and counts. Per run: req/s, server CPU per
request, and the deliveries made (and how long the backlog took to drain after the load).

Usage: python -m bench.webhooks [--rounds 2] [--duration 5]
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time
from typing import Any

import httpx

from bench.common import (
    ServerProcess,
    agent_server_argv,
    free_port,
    have_wrk,
    log,
    run_wrk,
    write_json,
)

SECRET = "whsec_" + base64.b64encode(b"bench webhook secret 32 bytes..").decode()
_count = 0


async def receiver(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """200 to every POST, counted; `GET /count` answers the count."""
    global _count
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b""
    if scope["method"] == "GET":
        body = str(_count).encode()
    else:
        _count += 1
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def count(url: str) -> int:
    return int(httpx.get(f"{url}/count", timeout=5).text)


def one_run(hooks: str | None, duration: float) -> dict[str, float]:
    port = free_port()
    flags = ["--log-level", "warning"]
    if hooks is not None:
        flags += ["--webhook-secret", SECRET, "--webhook-url", f"{hooks}/hook"]
        flags += ["--webhook-allow", "127.0.0.1"]
    with ServerProcess("agent-server", agent_server_argv(port, None, *flags), port) as server:
        server.wait_ready()
        before = count(hooks) if hooks else 0
        cpu = server.cpu_seconds()
        started = time.monotonic()
        result = run_wrk(
            f"{server.url}/reasoners/echo", method="POST", body=b'{"text": "hi"}',
            duration=duration,
        )  # fmt: skip
        cpu = server.cpu_seconds() - cpu
        delivered, drained = 0, 0.0
        if hooks:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                delivered = count(hooks) - before
                if delivered >= result.requests:
                    break
                time.sleep(0.2)
            drained = time.monotonic() - started
        return {
            "rps": result.rps,
            "requests": result.requests,
            "cpu_us_per_request": cpu / max(1, result.requests) * 1e6,
            "delivered": delivered,
            "deliveries_per_s": delivered / drained if drained else 0.0,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    if not have_wrk():
        sys.exit("needs wrk (apt-get install -y wrk)")
    port = free_port()
    receiving = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.webhooks:receiver", "--port", str(port),
         "--log-level", "warning", "--no-access-log"],
        env={**os.environ}, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    hooks = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                count(hooks)
                break
            except httpx.TransportError:
                time.sleep(0.05)
        runs: list[dict[str, Any]] = []
        for round_ in range(args.rounds):
            for mode in ("off", "on", "on", "off"):
                figures = one_run(hooks if mode == "on" else None, args.duration)
                log(f"round {round_ + 1} webhooks {mode}: {figures}")
                runs.append({"round": round_ + 1, "webhooks": mode, **figures})
    finally:
        receiving.terminate()
        receiving.wait(10)
    print("| webhooks | req/s | server CPU us/request | delivered | deliveries/s |")
    print("|---|---|---|---|---|")
    for mode in ("off", "on"):
        mine = [r for r in runs if r["webhooks"] == mode]
        mean = {k: sum(r[k] for r in mine) / len(mine) for k in mine[0] if k not in ("webhooks",)}
        print(
            f"| {mode} | {mean['rps']:.0f} | {mean['cpu_us_per_request']:.0f} | "
            f"{mean['delivered']:.0f} of {mean['requests']:.0f} | {mean['deliveries_per_s']:.0f} |"
        )
    write_json("webhooks", {"runs": runs})


if __name__ == "__main__":
    main()
