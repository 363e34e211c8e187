"""The Redis store's outbox alone: N executions created, then all ended at once (a drain's
backlog), timed until every end is written, against a redis-server of its own on loopback.

Figures: seconds to queue the ends (`end`: the arguments encoded), seconds until every end
is written (the flush), pipelines and end-script calls sent, and Redis's own time in the end
script per end (`INFO commandstats` after `CONFIG RESETSTAT`, with the commands the script
ran, each per end). No HTTP and no drain: what the outbox and Redis cost per end.

`--source DIR` runs the outbox of another checkout (DIR holds `agent_server/`): run this
script once per tree, alternating, for before/after under the same noise.

Usage: python -m bench.outbox [--ends 9000] [--source DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from typing import Any

from bench.common import ROOT, machine_load
from bench.store import RedisServer

#: Creates in flight at once while preparing (the scripts' connection takes them all).
CREATES = 50


async def measure(url: str, ends: int) -> dict[str, Any]:
    """Create `ends` executions, end them all at once, flush; Redis's figures after."""
    import redis

    from agent_server.model.execution import Execution, ExecutionStatus
    from agent_server.store.redis import RedisStore

    store = RedisStore(
        url, replica_id="A", agent_name="bench", max_retained=10 * ends, outbox_limit=10 * ends
    )
    await store.open()
    try:
        executions = [Execution("sleep", None, "A") for _ in range(ends)]
        for start in range(0, ends, CREATES):
            await asyncio.gather(*(store.create(e) for e in executions[start : start + CREATES]))
        sent: list[int] = []
        link = store._link.scripts
        original = link.pipeline if not hasattr(link, "send") else link.send

        async def counted(commands: Any) -> Any:
            sent.append(sum(1 for c in commands if c[0] in (b"EVALSHA", b"FCALL")))
            return await original(commands)

        setattr(link, "send" if hasattr(link, "send") else "pipeline", counted)
        if hasattr(link, "send_now"):  # a backlog's pipelines sent within the turn
            now = link.send_now

            def counted_now(commands: Any) -> Any:
                futures = now(commands)
                if futures is not None:
                    sent.append(sum(1 for c in commands if c[0] in (b"EVALSHA", b"FCALL")))
                return futures

            link.send_now = counted_now
        with redis.Redis.from_url(url) as client:
            client.config_resetstat()
            for execution in executions:
                execution.finish(ExecutionStatus.SUCCEEDED, result="ok")
            began = time.perf_counter()
            for execution in executions:
                store.end(execution)
            queued = time.perf_counter() - began
            left = await store.flush(time.monotonic() + 120)
            written = time.perf_counter() - began
            stats = client.info("commandstats")
    finally:
        await store.close()
    calls = ("cmdstat_evalsha", "cmdstat_fcall")
    script = sum(stats.get(k, {}).get("usec", 0) for k in calls)
    inner = sum(v["usec"] for k, v in stats.items() if k not in calls)
    return {
        "ends": ends,
        "left": len(left),
        "queue_seconds": round(queued, 3),
        "written_seconds": round(written, 3),
        "pipelines": len(sent),
        "end_calls": sum(sent),
        "redis_script_us_per_end": round(script / ends, 1),
        "redis_commands_us_per_end": round(inner / ends, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ends", type=int, default=9000)
    parser.add_argument("--source", default=None, help="a checkout holding agent_server/")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:  # in the process whose agent_server is the tree's
        print(asyncio.run(measure(args.child, args.ends)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([args.source or str(ROOT), str(ROOT)]))
    load = machine_load()
    with RedisServer() as server:
        argv = [sys.executable, "-m", "bench.outbox", "--ends", str(args.ends)]
        subprocess.run([*argv, "--child", server.url], env=env, cwd=args.source or ROOT, check=True)
    print(f"tree {args.source or ROOT}; load average before {load} after {machine_load()}")


if __name__ == "__main__":
    main()
