"""The cost of the schedule tick (docs/schedules.md): 10,000 schedules in one process on
the memory store, each firing once a minute at its own second (about 167 firings a second),
with a trivial reasoner: the CPU time of each tick (the firings it started included), the
tick's cost per firing, the first tick (every schedule primed), and the lag from fire time to start,
p50/p99.

    python -m bench.schedules [--schedules 10000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from agent_server import Agent, Schedule, Settings
from agent_server.service.schedule_ticker import ScheduleTicker


def build(count: int) -> Agent:
    agent = Agent("schedule-bench", Settings(max_inflight=100_000, log_level="warning"))
    schedules = [Schedule(f"{i % 60} * * * * *", input={"n": i}) for i in range(count)]

    @agent.reasoner(schedules=schedules)
    async def work(n: int) -> int:
        return n

    return agent


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(count: int, seconds: float) -> None:
    agent = build(count)
    lags: list[float] = []
    ticks: list[tuple[float, int]] = []
    idle: list[float] = []
    original = agent.metrics.schedule_fired

    def observe(outcome: str, lag: float | None = None) -> None:
        original(outcome, lag)
        if lag is not None:
            lags.append(lag)

    ticker: ScheduleTicker = agent._ticker()
    ticker._observe = observe
    tick = ticker.tick

    async def timed_tick() -> None:
        before, started = time.process_time(), len(lags)
        await tick()
        spent, fired = time.process_time() - before, len(lags) - started
        (ticks.append((spent, fired)) if fired else idle.append(spent))

    ticker.tick = timed_tick  # type: ignore[method-assign]
    async with agent.lifespan(None):
        await asyncio.sleep(seconds)
    firing = [spent / fired for spent, fired in ticks if fired]
    print(f"schedules: {count}, seconds: {seconds:g}, firings started: {len(lags)}")
    print(
        f"tick CPU with firings: median {statistics.median(t for t, _ in ticks) * 1e3:.2f} ms "
        f"for a median {statistics.median(f for _, f in ticks):.0f} firings; "
        f"per firing {statistics.median(firing) * 1e6:.0f} us"
    )
    first, rest = idle[:1], idle[1:]
    if first:
        print(
            f"first tick CPU (every schedule's marks read, next fire computed): "
            f"{first[0] * 1e3:.0f} ms"
        )
    if rest:
        print(f"idle tick CPU: median {statistics.median(rest) * 1e6:.1f} us ({len(rest)} ticks)")
    print(
        f"lag fire time -> start: p50 {percentile(lags, 0.5) * 1e3:.1f} ms, "
        f"p99 {percentile(lags, 0.99) * 1e3:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    asyncio.run(measure(args.schedules, args.seconds))


if __name__ == "__main__":
    main()
