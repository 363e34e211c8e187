"""Run every benchmark once the machine is quiet, and print the tables for bench/RESULTS.md.

Waits (bounded by --quiet-timeout) for the 1-minute load average to fall below --max-load;
if it never does, runs anyway and says so in the output.

`--compare DIR` adds agent-server from another source tree (a copy of `agent_server/` from
before a change) to the request-overhead rounds and to the drain runs, for before/after.

Usage: python -m bench.run_all [--max-load 1.0] [--quiet-timeout 3600] [--quick] [--compare DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from bench import http_overhead, scale, session_release
from bench.common import OUT_DIR, log, wait_for_quiet, write_json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--quiet-timeout", type=float, default=3600.0)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller scales")
    parser.add_argument("--compare", type=Path, default=None)
    args = parser.parse_args()
    gate = wait_for_quiet(args.max_load, args.quiet_timeout)
    log(f"quiet gate: {gate}")
    sections = [f"quiet gate: {gate}"]
    if args.quick:
        overhead = http_overhead.run(rounds=2, duration=2, compare=args.compare)
        release = session_release.run(repeat=5)
        scaled = scale.run(scales=(1_000, 10_000), rounds=1, compare=args.compare)
    else:
        overhead = http_overhead.run(compare=args.compare)
        release = session_release.run()
        scaled = scale.run()  # drain before/after: bench.scale --compare, run on its own
    for name, data in (
        ("http_overhead", overhead),
        ("session_release", release),
        ("scale", scaled),
    ):
        log(f"raw {name}: {write_json(name, data)}")
    sections += [
        "## Items 1-2: request overhead",
        http_overhead.markdown(overhead),
        f"load {overhead['load_before']} -> {overhead['load_after']}",
        "## Item 4: session release",
        session_release.markdown(release),
        f"load {release['load_before']} -> {release['load_after']}",
        "## Items 3, 5, 6: scale",
        scale.markdown(scaled),
        f"load {scaled['load_before']} -> {scaled['load_after']}",
    ]
    text = "\n\n".join(sections)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    path = OUT_DIR / f"results-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(text + "\n")
    print(text)
    log(f"written to {path}")


if __name__ == "__main__":
    main()
