"""Run every benchmark once the machine is quiet, and print the tables for bench/RESULTS.md.

Waits (bounded by --quiet-timeout) for the 1-minute load average to fall below --max-load;
if it never does, runs anyway and says so in the output.

Usage: python -m bench.run_all [--max-load 1.0] [--quiet-timeout 3600] [--quick]
"""

from __future__ import annotations

import argparse
import time

from bench import http_overhead, scale, session_release
from bench.common import OUT_DIR, log, wait_for_quiet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--max-load", type=float, default=1.0)
    parser.add_argument("--quiet-timeout", type=float, default=3600.0)
    parser.add_argument("--quick", action="store_true", help="fewer rounds, smaller scales")
    args = parser.parse_args()
    gate = wait_for_quiet(args.max_load, args.quiet_timeout)
    log(f"quiet gate: {gate}")
    sections = [f"quiet gate: {gate}"]
    if args.quick:
        overhead = http_overhead.run(rounds=2, duration=2)
        release = session_release.run(repeat=5)
        scaled = scale.run(scales=(1_000, 10_000), rounds=1)
    else:
        overhead = http_overhead.run()
        release = session_release.run()
        scaled = scale.run()
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
