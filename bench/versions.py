"""What versions cost a claim (issue 42, docs/durable.md "Versions"): claims of queued
resumable executions that have a checkpoint, through a real `RedisStore` on a real
`redis-server` (loopback), with versions against without, in the same rounds.

Cases, each claiming `--count` executions (handed off with a checkpoint, attempt 2), one
claim at a time as a replica's queue taker claims:

  a. the tree before versions (`--before DIR`; by default `git archive` of the commit
     before versions, 81b13f6^): the claim without any version logic (the baseline);
  b. this tree, an unversioned agent (its advert sent with every claim, unversioned
     checkpoints): what unversioned users pay;
  c. this tree, version v1 claiming v1 checkpoints (`same`);
  d. this tree, v2 claiming v1 checkpoints it declares `compatible`;
  e. as c, with `--others` (3) live replicas advertising v0 and `--waiting` executions whose v0
     checkpoints wait in a version queue for them: every claim scans `vqs` and reads the
     live replicas' adverts.

Each case runs in its own process (bench/apps/version_claims.py) with its tree's
`agent_server` on PYTHONPATH and its own agent name (its own keys), all on one Redis; each
seeds its executions first, then the cases claim in turns of `--batch` claims, in a rotated
order per turn, reversed every other turn, so the machine's noise falls on every case alike.
Reported: claims/s (median over rounds) and the median of the per-round ratios to (a); per
claim, redis-server's CPU, the claim script's own time (`INFO commandstats` usec of
EVALSHA), the commands it ran and their time, the client's CPU. `--compare DIR` runs (b)
and (c) from another tree as well (a change to the claim, measured in the same rounds).
`--callgrind N` first runs redis-server under valgrind's callgrind, one case at a time,
counting only inside EVALSHA: the claim script's instructions per claim over N claims, a
figure the machine's other work does not move. `--quick` is the smoke size.

    python -m bench.versions [--quick] [--rounds 5] [--count 2000] [--batch 250] [--before DIR]
        [--source DIR] [--compare DIR] [--callgrind N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.common import HOST, ROOT, Spread, log, machine_load, write_json
from bench.store import RedisServer, tree_commit

WORKER = ROOT / "bench" / "apps" / "version_claims.py"
#: The commit that brought versions: its parent is the baseline tree.
VERSIONS_COMMIT = "81b13f6"
CASES = {
    "a": "before versions (81b13f6^)",
    "b": "unversioned agent",
    "c": "v1 claims v1 (same)",
    "d": "v2 claims v1 (compatible)",
    "e": "v1 claims v1, live v0 replicas, work waiting for v0",
}
#: Commands that are not the claim script's (the worker's own reads, connection set-up).
NOT_CLAIM = {"evalsha", "fcall", "info", "config", "hello", "client", "ping"}
TIMEOUT = 120.0
#: Bound of a worker's seeding (every case seeds at once).
SEED_TIMEOUT = 600.0
#: Claims before callgrind counts (caches, Lua's first runs of the script).
WARM_UP = 50
#: The cases `--compare DIR` runs from that tree as well, labelled `b*`, `c*`.
COMPARED = ("b", "c")


def archive_before(into: Path) -> Path:
    """`agent_server/` of the commit before versions, extracted (no worktree is made)."""
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", f"{VERSIONS_COMMIT}^", "agent_server"],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    archive = into / "before.tar"
    archive.write_bytes(data)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into


class Worker:
    """One case's process (bench/apps/version_claims.py), its tree's `agent_server` on
    PYTHONPATH; it claims when told, one batch at a time."""

    def __init__(self, label: str, case: str, tree: Path, redis_url: str, **sizes: int) -> None:
        self.label, self.case, self.tree = label, case, tree
        argv = [sys.executable, str(WORKER), "--redis", redis_url, "--case", case]
        argv += ["--agent", f"vbench-{label.replace('*', '-compare')}"]
        for name, value in sizes.items():
            argv += [f"--{name}", str(value)]
        self.proc = subprocess.Popen(
            argv,
            env={**os.environ, "PYTHONPATH": str(tree)},
            cwd=tree,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ready: dict[str, Any] = {}

    def read(self, timeout: float) -> dict[str, Any]:
        """Its next JSON line, waited for at most `timeout` seconds."""
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate(timeout=10)
            raise SystemExit(f"case {self.label} ({self.tree}) gave no answer:\n{err[-3000:]}")
        data: dict[str, Any] = json.loads(line)
        return data

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_ready(self) -> None:
        self.ready = self.read(SEED_TIMEOUT)
        expected = str(self.tree.resolve() / "agent_server")
        if not self.ready["agent_server"].startswith(expected):
            raise SystemExit(f"case {self.label} imported {self.ready['agent_server']}")

    def finish(self) -> int:
        """Tell it to stop; what it left queued (nothing, when every claim took one)."""
        self.send("quit")
        left = int(self.read(TIMEOUT)["left_queued"])
        self.proc.wait(timeout=TIMEOUT)
        return left

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def redis_cpu(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def batch(worker: Worker, client: redis.Redis, claims: int) -> dict[str, Any]:
    """`claims` claims by `worker`, with redis-server's CPU and commandstats around them."""
    client.config_resetstat()
    cpu = redis_cpu(client)
    worker.send(f"claim {claims}")
    figures = worker.read(TIMEOUT)
    figures["redis_cpu"] = redis_cpu(client) - cpu
    stats: dict[str, Any] = client.info("commandstats")
    figures["commands"] = {
        name.removeprefix("cmdstat_"): (int(row["calls"]), int(row["usec"]))
        for name, row in stats.items()
    }
    return figures


def run(
    *,
    rounds: int,
    count: int,
    batch_size: int,
    others: int,
    waiting: int,
    source: Path,
    before: Path,
    compare: Path | None = None,
    callgrind_count: int = 0,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    """The timed rounds; with `callgrind_count`, first the claim script's instructions per
    claim (`callgrind`)."""
    # label -> (case, tree): the cases, and with `compare` (b) and (c) from that tree too.
    labels = {case: (case, source if case != "a" else before) for case in CASES}
    if compare is not None:
        labels |= {f"{case}*": (case, compare) for case in COMPARED}
    counted = callgrind(labels, callgrind_count, others, waiting) if callgrind_count else {}
    order = list(labels)
    warm_up = min(batch_size, count)
    sizes = {"count": rounds * count + warm_up, "others": others, "waiting": waiting}
    # Per label, per round: the batches' figures summed.
    totals = {label: [Totals() for _ in range(rounds)] for label in labels}
    load = [machine_load()]
    with RedisServer() as server:
        client = redis.Redis(host=HOST, port=server.port, decode_responses=True)
        workers = [Worker(label, case, tree, server.url, **sizes)
                   for label, (case, tree) in labels.items()]  # fmt: skip
        try:
            progress(f"seeding {sizes['count']} executions per case, {len(workers)} cases")
            for worker in workers:
                worker.wait_ready()
            by_label = {worker.label: worker for worker in workers}
            for label in order:  # warm-up, not counted: caches, and Redis after the seeding
                batch(by_label[label], client, warm_up)
            step = 0
            for round_ in range(rounds):
                done = 0
                while done < count:
                    claims = min(batch_size, count - done)
                    shift = step // 2 % len(order)
                    rotated = order[shift:] + order[:shift]
                    for label in rotated if step % 2 == 0 else reversed(rotated):
                        totals[label][round_].add(batch(by_label[label], client, claims))
                    done += claims
                    step += 1
                progress(
                    f"round {round_ + 1}: "
                    + ", ".join(f"{label} {totals[label][round_].rate():.0f}" for label in order)
                    + " claims/s"
                )
            left = {worker.label: worker.finish() for worker in workers}
            ready = {worker.label: worker.ready for worker in workers}
        finally:
            for worker in workers:
                worker.stop()
        load.append(machine_load())
        info: dict[str, Any] = client.info("server")
        client.close()
    return {
        "rounds": rounds,
        "count": count,
        "batch": batch_size,
        "others": others,
        "waiting": waiting,
        "source": str(source),
        "source_commit": tree_commit(source),
        "before": str(before),
        "compare": None if compare is None else str(compare),
        "compare_commit": None if compare is None else tree_commit(compare),
        "load": load,
        "redis_version": info["redis_version"],
        "left_queued": left,
        "ready": ready,
        "rounds_figures": {label: [t.as_dict() for t in per] for label, per in totals.items()},
        "summary": summary(totals, ready),
        "callgrind_count": callgrind_count,
        "instructions_per_claim": counted,
    }


def callgrind(
    labels: dict[str, tuple[str, Path]],
    count: int,
    others: int,
    waiting: int,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    """redis-server under callgrind, counting only inside EVALSHA: the instructions the
    claim script runs per claim, case by case (Redis emptied between), after a warm-up of
    WARM_UP claims. A count, not a time: the machine's other work does not move it."""
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-versions-cg-") as tmp:
        wrapper = (
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--collect-atstart=no",
            "--toggle-collect=evalShaCommand",
            "--toggle-collect=fcallCommand",
            f"--callgrind-out-file={tmp}/cg.out",
        )
        with RedisServer(wrapper=wrapper) as server:
            assert server.proc is not None
            pid = str(server.proc.pid)

            def control(*args: str) -> None:
                subprocess.run(
                    ["callgrind_control", *args, pid], check=True, capture_output=True, timeout=60
                )

            for label, (case, tree) in labels.items():
                server.command("FLUSHALL")
                worker = Worker(
                    label, case, tree, server.url, count=count + WARM_UP, others=others,
                    waiting=waiting,
                )  # fmt: skip
                try:
                    worker.wait_ready()
                    worker.send(f"claim {WARM_UP}")
                    worker.read(TIMEOUT)
                    dumps = set(Path(tmp).glob("cg.out.*"))
                    control("--zero")
                    control("--instr=on")
                    worker.send(f"claim {count}")
                    worker.read(TIMEOUT)
                    control("--instr=off")
                    control(f"--dump={label}")
                    worker.finish()
                finally:
                    worker.stop()
                (dump,) = set(Path(tmp).glob("cg.out.*")) - dumps
                found = re.search(r"^totals: (\d+)", dump.read_text(), re.MULTILINE)
                assert found is not None, dump
                figures[label] = int(found.group(1)) / count
                progress(f"callgrind: {label} {figures[label]:.0f} instructions per claim")
    return figures


@dataclass
class Totals:
    """One label's batches in one round, summed."""

    claims: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    redis_cpu: float = 0.0
    commands: Counter[str] = field(default_factory=Counter)
    usec: Counter[str] = field(default_factory=Counter)
    #: Each batch's claims/s.
    batches: list[float] = field(default_factory=list)

    def add(self, figures: dict[str, Any]) -> None:
        self.batches.append(figures["claims"] / figures["seconds"])
        self.claims += int(figures["claims"])
        self.seconds += float(figures["seconds"])
        self.cpu += float(figures["cpu"])
        self.redis_cpu += float(figures["redis_cpu"])
        for name, (calls, usec) in figures["commands"].items():
            self.commands[name] += calls
            self.usec[name] += usec

    def rate(self) -> float:
        return self.claims / self.seconds

    def script_us(self) -> float:
        """The claim script's own time in Redis per claim (EVALSHA's usec)."""
        call = "fcall" if self.commands.get("fcall") else "evalsha"
        return self.usec[call] / self.commands[call]

    def by_command(self) -> dict[str, float]:
        """The commands the claim script ran, per claim, by name."""
        return {
            name: calls / self.claims
            for name, calls in sorted(self.commands.items())
            if name.split("|", 1)[0] not in NOT_CLAIM
        }

    def as_dict(self) -> dict[str, Any]:
        return {
            "claims": self.claims,
            "seconds": self.seconds,
            "cpu": self.cpu,
            "redis_cpu": self.redis_cpu,
            "commands": dict(self.commands),
            "usec": dict(self.usec),
            "batches": self.batches,
        }


def best(per_round: list[Totals]) -> float:
    """The 90th percentile of its batches' claims/s: what a claim costs when the machine's
    other work leaves it alone (a shared machine's noise only ever slows a batch)."""
    rates = sorted(rate for t in per_round for rate in t.batches)
    return rates[min(len(rates) - 1, int(len(rates) * 0.9))]


def summary(totals: dict[str, list[Totals]], ready: dict[str, Any]) -> dict[str, Any]:
    base = totals["a"]
    out: dict[str, Any] = {}
    best_base = best(base)
    for label, per_round in totals.items():
        by_command = per_round[0].by_command()
        out[label] = {
            "best_batch": best(per_round),
            "best_ratio": best(per_round) / best_base,
            "claims_per_s": Spread.of([t.rate() for t in per_round]).as_dict(),
            "ratio_to_a": Spread.of(
                [t.rate() / b.rate() for t, b in zip(per_round, base, strict=True)]
            ).as_dict(),
            "redis_cpu_us": Spread.of([t.redis_cpu / t.claims * 1e6 for t in per_round]).as_dict(),
            "script_us": Spread.of([t.script_us() for t in per_round]).as_dict(),
            "client_cpu_us": Spread.of([t.cpu / t.claims * 1e6 for t in per_round]).as_dict(),
            "commands_per_claim": sum(by_command.values()),
            "by_command": by_command,
            "command_us": {
                name: per_round[0].usec[name] / per_round[0].claims for name in by_command
            },
            "waiting": ready[label]["waiting_in_version_queues"],
        }
    return out


def markdown(data: dict[str, Any]) -> str:
    s = data["summary"]
    lines = [
        f"{data['count']} claims per case and round in batches of {data['batch']}, the cases "
        f"alternating batch by batch, {data['rounds']} rounds, Redis {data['redis_version']}; "
        "median [min-max] over rounds; fast batches: the 90th percentile of the batches' "
        "claims/s",
        "",
        "| case | claims/s | ratio to (a) | fast batches: claims/s, ratio | redis CPU us/claim "
        "| script us/claim | commands/claim | client CPU us/claim |",
        "|---|---|---|---|---|---|---|---|",
    ]
    titles = {label: CASES[label[0]] + (" on --compare" if label.endswith("*") else "")
              for label in s}  # fmt: skip
    for case, title in titles.items():
        row = s[case]
        spread = {k: Spread(**row[k]) for k in ("claims_per_s", "ratio_to_a", "redis_cpu_us",
                                                 "script_us", "client_cpu_us")}  # fmt: skip
        lines.append(
            f"| ({case}) {title} | {spread['claims_per_s'].fmt(0)} | "
            f"{spread['ratio_to_a'].fmt(2)} | {row['best_batch']:.0f}, {row['best_ratio']:.2f} | "
            f"{spread['redis_cpu_us'].fmt(0)} | "
            f"{spread['script_us'].fmt(1)} | {row['commands_per_claim']:.1f} | "
            f"{spread['client_cpu_us'].fmt(0)} |"
        )
    counted = data["instructions_per_claim"]
    if counted:
        lines += [
            "",
            f"The claim script's instructions in redis-server per claim (callgrind, inside "
            f"EVALSHA, {data['callgrind_count']} claims after {WARM_UP}, one case at a time):",
            "",
            "| case | instructions/claim | ratio to (a) |",
            "|---|---|---|",
        ]
        lines += [
            f"| ({label}) | {value:,.0f} | {value / counted['a']:.3f} |"
            for label, value in counted.items()
        ]
    lines += [
        "",
        "The claim script per claim (first round): commands run, by name, and their time in "
        "Redis (us); the script's time outside its commands (Lua) last:",
        "",
        "| command | " + " | ".join(f"({case})" for case in s) + " |",
        "|---|" + "---|" * len(s),
    ]
    names = sorted({name for row in s.values() for name in row["by_command"]})
    for name in names:
        cells = [
            f"{s[case]['by_command'].get(name, 0):.2f} / {s[case]['command_us'].get(name, 0):.1f}"
            for case in s
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lua = [s[case]["script_us"]["median"] - sum(s[case]["command_us"].values()) for case in s]
    lines.append("| (Lua, outside commands) | " + " | ".join(f"{v:.1f}" for v in lua) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the smoke size")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=2000, help="claims per case and round")
    parser.add_argument("--batch", type=int, default=250, help="claims per turn of a case")
    parser.add_argument("--others", type=int, default=3, help="case e: other live replicas")
    parser.add_argument("--waiting", type=int, default=100, help="case e: work waiting")
    parser.add_argument("--source", type=Path, default=ROOT, help="the tree with versions")
    parser.add_argument("--before", type=Path, help="the tree before versions")
    parser.add_argument(
        "--compare", type=Path, help="another tree with versions: (b) and (c) from it as well"
    )
    parser.add_argument(
        "--callgrind",
        type=int,
        default=0,
        metavar="N",
        help="first count the claim script's instructions over N claims per case (valgrind)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.count, args.batch, args.waiting = 1, 100, 50, 10
    with tempfile.TemporaryDirectory(prefix="bench-versions-") as tmp:
        before = args.before or archive_before(Path(tmp))
        data = run(
            rounds=args.rounds,
            count=args.count,
            batch_size=args.batch,
            others=args.others,
            waiting=args.waiting,
            source=args.source,
            before=before,
            compare=args.compare,
            callgrind_count=args.callgrind,
        )
    print(markdown(data))
    print(f"raw: {write_json('versions', data)}")


if __name__ == "__main__":
    main()
