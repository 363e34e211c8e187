"""How long a client verb of the CLI takes to start: `python -m agent_server get --help`
against `python -c 'import httpx, click'` (what the verb cannot do without), alternated in
the same rounds, as wall-clock medians and their ratio; also `agent-server run --help`,
which loads the server. Run from the repository root: `python -m bench.cli_start`."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

COMMANDS = {
    "import httpx, click": [sys.executable, "-c", "import httpx, click"],
    "agent-server get --help": [sys.executable, "-m", "agent_server", "get", "--help"],
    "agent-server run --help": [sys.executable, "-m", "agent_server", "run", "--help"],
}


def once(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True, timeout=60)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    rounds = parser.parse_args().rounds
    seconds: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for n in range(rounds):
        names = list(COMMANDS) if n % 2 == 0 else list(reversed(COMMANDS))
        for name in names:
            seconds[name].append(once(COMMANDS[name]))
    base = statistics.median(seconds["import httpx, click"])
    print("| command | median s | min s | ratio to `import httpx, click` |")
    print("|---|---|---|---|")
    for name, taken in seconds.items():
        median = statistics.median(taken)
        print(f"| `{name}` | {median:.3f} | {min(taken):.3f} | {median / base:.2f} |")


if __name__ == "__main__":
    main()
