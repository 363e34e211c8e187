"""Item 4: session release precision, against agent-framework-core side by side.

agent-server: a real `agent-server run bench.bench_app:agent`; each round starts one
`deferred_cleanup` execution in a fresh session (`X-Session-ID`), then
`DELETE /sessions/{id}?timeout=T`. The figure is elapsed / T, with elapsed as the server
measured it (`elapsed_seconds` in the answer) and as the client saw it (one HTTP round trip
more). The peer: `BackgroundAgentsProvider.release_session(session, timeout=T)` over a real
`Agent` whose chat client cleans up the same way (bench/peer_maf_release.py, its own venv).

Two cleanup styles: `robust` (the cleanup completes even when cancelled again; the headline)
and `interruptible` (a second cancellation cuts it short).

Usage: python -m bench.session_release [--repeat 20] [--timeout 0.03] [--cleanup 0.35]
                                       [--no-peers]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

from bench.common import (
    MAF_PYTHON,
    ROOT,
    HttpConnection,
    ServerProcess,
    Spread,
    agent_server_argv,
    free_port,
    http_request,
    log,
    machine_load,
    write_json,
)

STYLES = ("robust", "interruptible")


async def _agent_server_rounds(
    port: int, repeat: int, timeout: float, cleanup: float, robust: bool
) -> list[dict[str, float]]:
    body = json.dumps({"cleanup": cleanup, "robust": robust}).encode()
    rounds: list[dict[str, float]] = []
    connection = await HttpConnection.open(port)
    try:
        async with asyncio.timeout(60 + repeat * (cleanup + 5)):
            for index in range(repeat):
                session = f"bench-{'r' if robust else 'i'}-{index}-{time.monotonic_ns()}"
                status, _, answer = await connection.request(
                    http_request(
                        "POST",
                        "/reasoners/deferred_cleanup/async",
                        body,
                        {"X-Session-ID": session},
                    )
                )
                if status != 202:
                    raise RuntimeError(f"start answered {status}: {answer[:200]!r}")
                execution = json.loads(answer)["execution_id"]
                status, _, answer = await connection.request(
                    http_request("GET", f"/executions/{execution}")
                )
                if json.loads(answer)["status"] != "running":
                    raise RuntimeError(f"execution not running before the release: {answer!r}")
                sent = time.perf_counter()
                status, _, answer = await connection.request(
                    http_request("DELETE", f"/sessions/{session}?timeout={timeout}")
                )
                client = time.perf_counter() - sent
                if status != 200:
                    raise RuntimeError(f"release answered {status}: {answer[:200]!r}")
                release = json.loads(answer)
                rounds.append(
                    {
                        "server_seconds": float(release["elapsed_seconds"]),
                        "client_seconds": client,
                        "cancelled": release["cancelled"],
                        "abandoned": release["abandoned"],
                    }
                )
                await asyncio.sleep(cleanup + 0.05)  # let the abandoned cleanup end
    finally:
        await connection.close()
    return rounds


def _peer(repeat: int, timeout: float, cleanup: float, robust: bool) -> dict[str, Any]:
    argv = [
        str(MAF_PYTHON),
        str(ROOT / "bench" / "peer_maf_release.py"),
        "--repeat",
        str(repeat),
        "--timeout",
        str(timeout),
        "--cleanup",
        str(cleanup),
    ]
    if not robust:
        argv.append("--interruptible")
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120 + repeat * (cleanup + 5),
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(
    *,
    repeat: int = 20,
    timeout: float = 0.03,
    cleanup: float = 0.35,
    peers: bool = True,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    use_peer = peers and MAF_PYTHON.exists()
    load_before = machine_load()
    styles: dict[str, Any] = {}
    port = free_port()
    with ServerProcess(
        "agent-server", agent_server_argv(port, "bench.bench_app:agent"), port
    ) as server:
        server.wait_ready()
        for style in STYLES:
            robust = style == "robust"
            rounds = asyncio.run(_agent_server_rounds(port, repeat, timeout, cleanup, robust))
            entry: dict[str, Any] = {
                "agent-server": {
                    "server_ratio": Spread.of(
                        [r["server_seconds"] / timeout for r in rounds]
                    ).as_dict(),
                    "client_ratio": Spread.of(
                        [r["client_seconds"] / timeout for r in rounds]
                    ).as_dict(),
                    "abandoned": sum(r["abandoned"] for r in rounds),
                    "rounds": rounds,
                }
            }
            progress(
                f"{style}: agent-server ratio "
                f"{entry['agent-server']['server_ratio']['median']:.2f} (server), "
                f"{entry['agent-server']['client_ratio']['median']:.2f} (client)"
            )
            if use_peer:
                peer = _peer(repeat, timeout, cleanup, robust)
                entry["agent-framework-core"] = {
                    "ratio": Spread.of([e / timeout for e in peer["elapsed"]]).as_dict(),
                    "version": peer["version"],
                    "api": peer["api"],
                    "elapsed": peer["elapsed"],
                }
                progress(
                    f"{style}: agent-framework-core ratio "
                    f"{entry['agent-framework-core']['ratio']['median']:.2f}"
                )
            styles[style] = entry
    return {
        "benchmark": "session_release",
        "config": {"repeat": repeat, "timeout": timeout, "cleanup": cleanup},
        "load_before": load_before,
        "load_after": machine_load(),
        "styles": styles,
    }


def markdown(data: dict[str, Any]) -> str:
    def spread(d: dict[str, float]) -> str:
        return f"{d['median']:.2f} [{d['low']:.2f}-{d['high']:.2f}]"

    lines = [
        "| cleanup | agent-server elapsed/timeout (server) | (client, + HTTP round trip) "
        "| agent-framework-core elapsed/timeout |",
        "|---|---|---|---|",
    ]
    for style, entry in data["styles"].items():
        peer = entry.get("agent-framework-core")
        peer_text = spread(peer["ratio"]) if peer else "not run"
        lines.append(
            f"| {style} | {spread(entry['agent-server']['server_ratio'])} | "
            f"{spread(entry['agent-server']['client_ratio'])} | {peer_text} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=0.03)
    parser.add_argument("--cleanup", type=float, default=0.35)
    parser.add_argument("--no-peers", action="store_true")
    args = parser.parse_args()
    data = run(
        repeat=args.repeat, timeout=args.timeout, cleanup=args.cleanup, peers=not args.no_peers
    )
    data["raw_file"] = str(write_json("session_release", data))
    print(markdown(data))
    print(f"\nload average before {data['load_before']} after {data['load_after']}")
    print(f"raw: {data['raw_file']}")


if __name__ == "__main__":
    main()
