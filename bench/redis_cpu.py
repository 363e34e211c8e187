"""Redis's CPU per execution life, counted in instructions: what one life (an async start of
`echo` and a `GET ?wait=5` for its end) costs the Redis that holds the records, with and
without Sentinel and tenancy, against the tree before (`--before DIR`) in the same run.

Each case runs a fresh `redis-server` under valgrind's callgrind with instrumentation off,
one real `agent-server run` on it, WARM_UP lives, then instrumentation on for N lives (16 at
once, or `--clients`), and a dump. A count, not a time: the machine's other work does not
move it. Two figures per case: every instruction Redis ran in the window (reading requests,
the scripts, replies, the replication stream) and those inside the script calls alone
(EVALSHA or FCALL, with the commands they ran).

- `plain`: `--store redis://`, no callers named.
- `tenancy`: a tokens file of ten tenants; each request carries one tenant's token, so each
  record is its tenant's (its index, the tenant read before a record is returned).
- `sentinel`: `--store redis+sentinel://` over this primary, one replica and one sentinel:
  each start is answered once the replica holds it (`WAIT 1`).

Usage: PYTHONPATH=. python -m bench.redis_cpu [--lives 1000] [--clients 16]
                                              [--cases plain,tenancy,sentinel] [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import HOST, ROOT, log, write_json
from bench.sentinel import SERVICE, SentinelProcess
from bench.store import RedisServer, agent_server, lives, redis_flags

WARM_UP = 200
CASES = ("plain", "tenancy", "sentinel")
#: The script calls' own functions in redis-server (a tree before functions, and after).
SCRIPT_CALLS = ("evalShaCommand", "fcallCommand")
TENANTS = 10


def _tokens(directory: Path) -> tuple[Path, str]:
    path = directory / "tokens"
    lines = [f"bench-cpu-{i:04d}-aaaaaaaaaaaaaaaa m{i} t{i % TENANTS}" for i in range(100)]
    path.write_text("\n".join(lines) + "\n")
    return path, lines[0].split()[0]


@contextlib.contextmanager
def _sentinel(primary: RedisServer) -> Iterator[str]:
    """One replica of `primary` in sync and a sentinel naming it: the store's URL."""
    with RedisServer("--replicaof", HOST, str(primary.port)) as replica:
        deadline = time.monotonic() + 60
        while replica.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync in 60 s")
            time.sleep(0.1)
        with SentinelProcess(primary.port, 1) as sentinel:
            yield f"redis+sentinel://{HOST}:{sentinel.port}/{SERVICE}/0"


def _inclusive(dump: Path, function: str) -> int:
    """The instructions run inside `function` (inclusive), from callgrind_annotate."""
    done = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(dump)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    for line in done.stdout.splitlines():
        if re.search(rf"[:\s]{function}\b", line):
            return int(line.split()[0].replace(",", ""))
    return 0


def one_case(source: Path, case: str, count: int, clients: int) -> dict[str, Any]:
    """Instructions per life in Redis for one case of one tree."""
    with tempfile.TemporaryDirectory(prefix="bench-redis-cpu-") as tmp:
        out = Path(tmp) / "cg.out"
        wrapper = (
            "valgrind", "--tool=callgrind", "--instr-atstart=no",
            f"--callgrind-out-file={out}",
        )  # fmt: skip
        with RedisServer(wrapper=wrapper) as redis, contextlib.ExitStack() as stack:
            assert redis.proc is not None
            pid = str(redis.proc.pid)
            url = stack.enter_context(_sentinel(redis)) if case == "sentinel" else redis.url
            flags = redis_flags(url, "cpu")
            headers: dict[str, str] | None = None
            if case == "tenancy":
                tokens, token = _tokens(Path(tmp))
                flags += ["--api-tokens-file", str(tokens)]
                headers = {"Authorization": f"Bearer {token}"}
            server = stack.enter_context(agent_server(f"redis-cpu {case}", source, *flags))
            server.wait_ready(120)

            def control(*args: str) -> None:
                subprocess.run(
                    ["callgrind_control", *args, pid], check=True, capture_output=True, timeout=120
                )

            warm = asyncio.run(lives(server.port, WARM_UP, clients, 300, headers))
            if warm.errors:
                raise RuntimeError(f"{case}: {warm.errors} warm-up lives failed {warm.statuses}")
            before = set(Path(tmp).glob("cg.out.*"))
            control("--zero")
            control("--instr=on")
            done = asyncio.run(lives(server.port, count, clients, 600, headers))
            control("--instr=off")
            control("--dump=lives")
            if done.errors or done.requests != count:
                raise RuntimeError(f"{case}: {done.requests} of {count} lives {done.statuses}")
            (dump,) = set(Path(tmp).glob("cg.out.*")) - before
            total = re.search(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
            assert total is not None, dump
            scripts = sum(_inclusive(dump, name) for name in SCRIPT_CALLS)
    return {"per_life": int(total.group(1)) / count, "scripts_per_life": scripts / count}


def run(trees: dict[str, Path], cases: list[str], count: int, clients: int) -> dict[str, Any]:
    found: dict[str, Any] = {"lives": count, "clients": clients, "cases": {}}
    for case in cases:
        found["cases"][case] = {}
        for label, source in trees.items():
            figures = one_case(source, case, count, clients)
            found["cases"][case][label] = figures
            log(
                f"{case} {label}: {figures['per_life']:,.0f} instructions per life in Redis, "
                f"{figures['scripts_per_life']:,.0f} in the script calls"
            )
    return found


def markdown(data: dict[str, Any]) -> str:
    trees = list(next(iter(data["cases"].values())))
    rows = [
        f"Instructions redis-server ran per life ({data['lives']} lives, {data['clients']} "
        f"clients; callgrind, after {WARM_UP} lives):",
        "",
        "| case | "
        + " | ".join(f"{t}: all / in scripts" for t in trees)
        + (" | this tree / before (all) |" if len(trees) > 1 else " |"),
        "|---|" + "---|" * (len(trees) + (1 if len(trees) > 1 else 0)),
    ]
    for case, by_tree in data["cases"].items():
        cells = [f"{f['per_life']:,.0f} / {f['scripts_per_life']:,.0f}" for f in by_tree.values()]
        ratio = ""
        if len(trees) > 1:
            ratio = f" | {by_tree[trees[0]]['per_life'] / by_tree[trees[1]]['per_life']:.2f}"
        rows.append(f"| {case} | " + " | ".join(cells) + ratio + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lives", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree measured")
    parser.add_argument("--before", type=Path, help="a checkout of the tree before, beside it")
    args = parser.parse_args()
    trees = {"this tree": args.source}
    if args.before is not None:
        trees["before"] = args.before
    data = run(trees, args.cases.split(","), args.lives, args.clients)
    path = write_json("redis-cpu", data)
    print(markdown(data))
    print(f"\nraw: {path}")


if __name__ == "__main__":
    main()
