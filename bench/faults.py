"""Long fault-injection runs (docs/replicas.md): the harness of tests/support/faults/ (three
replicas behind haproxy on a Redis primary and two replicas under three sentinels, or with
`--plain` on one Redis, AOF either way; a load of clients keeping a history; a seeded
schedule of kills, rollouts, pauses, Redis restarts, failovers, failbacks (the primary
killed, restarted as it was, then failed over to) and cuts; then the checker), for longer
and over several seeds. Prints per seed the counts (calls, executions, each kind
of fault, violations by invariant) and the violations, and the calls that gave up only
within spans in which no told write could be acknowledged (no Redis replica in sync, or one
the sentinels could promote out of sync; no violation: docs/replicas.md, "How long in doubt
lasts"); the exit code is 1 if any seed broke an invariant.

A passing seed's directory is removed; a failing one's is kept under bench/out/faults/ (its
`history.jsonl` holds every exchange, nemesis action and final record, and each replica's
log is in its own directory). `--source DIR` runs the replicas on the agent_server of another
checkout (put first on their PYTHONPATH).

`--store postgres` runs the same replicas, load, history and checker on a Postgres primary
and its synchronous streaming standby (tests/support/faults/postgres_parts.py), with the
replica-level faults and Postgres's own: kill -9 and restart of the primary, a pause of it,
cuts of the proxies, and a failover to the standby (the old primary fenced and re-seeded).

Usage: python -m bench.faults [--seconds 120] [--seed 1 | --seeds 1-20] [--clients 6]
       [--plain] [--redis-replicas 2] [--store redis|postgres] [--source DIR] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from bench.common import OUT_DIR, ROOT, log

#: Times a seed is started before a failure of the harness itself ends the run: on a shared
#: machine a replica can miss its start-up bound (the traceback of each is printed).
STARTS = 3


def seeds(seed: int, span: str | None) -> list[int]:
    if span is None:
        return [seed]
    first, _, last = span.partition("-")
    low, high = int(first), int(last or first)
    if high < low:
        raise SystemExit(f"--seeds {span}: the last seed is below the first")
    return list(range(low, high + 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0, help="seconds of faults per seed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seeds", help="a range of seeds, A-B (inclusive); overrides --seed")
    parser.add_argument("--clients", type=int, default=6, help="client threads (half raw httpx)")
    parser.add_argument("--source", type=Path, help="a checkout whose agent_server to run")
    parser.add_argument("--keep", action="store_true", help="keep passing seeds' directories")
    parser.add_argument(
        "--plain", action="store_true", help="one redis-server, no Sentinel (and no failover)"
    )
    parser.add_argument(
        "--store",
        choices=("redis", "postgres"),
        default="redis",
        help="the store under the replicas: Redis (Sentinel unless --plain) or a Postgres "
        "primary with a synchronous standby",
    )
    parser.add_argument(
        "--redis-replicas",
        type=int,
        default=2,
        help="Redis replicas under Sentinel (a primary and two, as in production, by default)",
    )
    args = parser.parse_args(argv)

    sys.path.insert(0, str(ROOT))  # the tests' package, as `python -m pytest` imports it
    from tests.support import faults  # the harness and its checker

    out = OUT_DIR / "faults"
    out.mkdir(parents=True, exist_ok=True)
    failed: list[int] = []
    totals: dict[str, int] = {}
    for seed in seeds(args.seed, args.seeds):
        for chance in range(1, STARTS + 1):
            directory = out / f"seed-{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
            directory.mkdir()
            log(f"seed {seed}: {args.seconds:g}s of faults on {args.store} in {directory}")
            try:
                run = faults.run_faults(
                    seed,
                    args.seconds,
                    directory,
                    clients=args.clients,
                    source=args.source.resolve() if args.source else None,
                    sentinel=not args.plain,
                    redis_replicas=args.redis_replicas,
                    store=args.store,
                    log=log,
                )
                break
            except RuntimeError as exc:  # the harness itself failed: the seed runs again
                log(f"seed {seed}: {exc}" + ("; starting it again" if chance < STARTS else ""))
                if chance == STARTS:
                    raise
        print(run.report(limit=10), flush=True)
        print(f"  outcomes: {dict(sorted(run.outcomes.items()))}", flush=True)
        for invariant, count in run.by_invariant().items():
            totals[invariant] = totals.get(invariant, 0) + count
        if run.violations:
            failed.append(seed)
            print(f"  kept: {directory}", flush=True)
        elif not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    ran = len(seeds(args.seed, args.seeds))
    broken = ", ".join(f"{k}={n}" for k, n in sorted(totals.items())) or "none"
    print(f"{ran - len(failed)} of {ran} seeds passed; failed: {failed or 'none'}; {broken}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
