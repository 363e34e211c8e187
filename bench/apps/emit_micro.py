"""In-process cost of `await ctx.emit(data)` with no reader, against a bare
`asyncio.Queue.put_nowait` of the same data (bench.events, item 4).

Run by bench.events with `PYTHONPATH` naming the checkout measured. The context is the one
the server builds for a reasoner that asks for one: the execution's own event log (room for
`--max-events`), and the registry's emit observer (the store's `emit`, a no-op on the memory
store and an enqueue on the outbox with Redis; the metrics' `events_emitted_total`). Each
variant runs `loops` times per repeat, in one coroutine, alternated over `repeats` rounds;
the figure per variant is the median ns per call, with its range. Prints one JSON object.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
import time
from typing import Any

from agent_server.model.context import EVENT_NAME, ExecutionContext
from agent_server.model.events import EventLog, encode_data
from agent_server.model.execution import Execution
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.memory import MemoryStore

DATA = {"n": 1}


async def main(loops: int, repeats: int, keep: int) -> dict[str, Any]:
    store = MemoryStore("bench", result_ttl=300.0, max_retained=10)
    registry = InFlightRegistry(store, max_events=keep, observer=Metrics())
    drain = asyncio.Event()

    def context(observed: bool) -> ExecutionContext:
        execution = Execution("burst", None, "bench")
        execution.event_log(keep)
        return ExecutionContext(
            execution, drain, None, 65_536, registry._emitted if observed else None
        )

    async def put_nowait() -> float:
        queue: asyncio.Queue[Any] = asyncio.Queue()
        put = queue.put_nowait
        began = time.perf_counter_ns()
        for _ in range(loops):
            put(DATA)
        return (time.perf_counter_ns() - began) / loops

    async def emit() -> float:
        ctx = context(True)
        began = time.perf_counter_ns()
        for _ in range(loops):
            await ctx.emit(DATA)
        return (time.perf_counter_ns() - began) / loops

    async def emit_no_observer() -> float:
        ctx = context(False)
        began = time.perf_counter_ns()
        for _ in range(loops):
            await ctx.emit(DATA)
        return (time.perf_counter_ns() - began) / loops

    async def encode_only() -> float:
        began = time.perf_counter_ns()
        for _ in range(loops):
            encode_data(DATA)
        return (time.perf_counter_ns() - began) / loops

    async def append_only() -> float:
        log = EventLog(keep)
        text = encode_data(DATA)
        began = time.perf_counter_ns()
        for _ in range(loops):
            log.append("progress", text)
        return (time.perf_counter_ns() - began) / loops

    async def nothing() -> None:
        return None

    async def await_empty() -> float:
        began = time.perf_counter_ns()
        for _ in range(loops):
            await nothing()
        return (time.perf_counter_ns() - began) / loops

    async def name_check() -> float:
        match = EVENT_NAME.fullmatch
        began = time.perf_counter_ns()
        for _ in range(loops):
            match("progress")
        return (time.perf_counter_ns() - began) / loops

    async def observer_only() -> float:
        ctx = context(True)
        execution = ctx._execution
        event = execution.event_log(keep).append("progress", encode_data(DATA))
        observe = registry._emitted
        began = time.perf_counter_ns()
        for _ in range(loops):
            observe(execution, event)
        return (time.perf_counter_ns() - began) / loops

    variants = {
        "asyncio.Queue.put_nowait": put_nowait,
        "await ctx.emit (as served: log + observer)": emit,
        "await ctx.emit (log only, no observer)": emit_no_observer,
        "encode_data alone (JSON)": encode_only,
        "EventLog.append alone": append_only,
        "the observer alone (store.emit + metrics)": observer_only,
        "event name check alone (regex fullmatch)": name_check,
        "await of an empty coroutine": await_empty,
    }
    found: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, variant in variants.items():
            gc.collect()
            found[name].append(await variant())
    return {
        "loops": loops,
        "repeats": repeats,
        "keep": keep,
        "python": sys.version.split()[0],
        "ns_per_call": {
            name: {
                "median": statistics.median(values),
                "low": min(values),
                "high": max(values),
                "n": len(values),
            }
            for name, values in found.items()
        },
        "ratio_emit_to_put": statistics.median(
            e / p
            for e, p in zip(
                found["await ctx.emit (as served: log + observer)"],
                found["asyncio.Queue.put_nowait"],
                strict=True,
            )
        ),
        "ratios": [
            e / p
            for e, p in zip(
                found["await ctx.emit (as served: log + observer)"],
                found["asyncio.Queue.put_nowait"],
                strict=True,
            )
        ],
    }


if __name__ == "__main__":
    loops, repeats, keep = (int(arg) for arg in sys.argv[1:4])
    print(json.dumps(asyncio.run(main(loops, repeats, keep))))
