"""A schedule's marks in a real Redis and a real Postgres, written by several replicas at once.

Invariant: `handled` and `started` never go back. A replica writes the fire time it handled
only when it is later than the one kept, whichever replica's write lands last; `created` is
set once, by the first replica that looks. A replica coming up starts after `handled`: were
it to go back, the firings between would be handled again.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

from tests.support.stores import Recorder, closed

#: Opens a store shared by replicas (the `shared_store` fixture: Redis, then Postgres).
Shared = Callable[..., Any]
REPLICAS = 4
ROUNDS = 30


async def test_marks_never_go_back_whichever_replica_writes_last(
    shared_store: Callable[..., Any],
) -> None:
    stores = [shared_store(f"r{n}", Recorder()) for n in range(REPLICAS)]
    for store in stores:
        await store.open()
    shuffle = random.Random(7)
    try:
        first = await asyncio.gather(
            *(s.schedule_marks("nightly", 1000.0 + n) for n, s in enumerate(stores))
        )
        assert len({marks.created for marks in first}) == 1  # one creation, seen by all
        highest = 0.0
        for round_ in range(ROUNDS):
            # Each replica writes a fire time of its own at once, in a shuffled order.
            times = [2000.0 + round_ * 10 + n for n in range(REPLICAS)]
            shuffle.shuffle(times)
            await asyncio.gather(
                *(
                    s.schedule_fired("nightly", at, at % 2 == 0)
                    for s, at in zip(stores, times, strict=True)
                )
            )
            highest = max(highest, *times)
            marks = await stores[0].schedule_marks("nightly", 0.0)
            assert marks.handled == highest, (round_, marks, times)
            assert marks.started == max(t for t in times if t % 2 == 0), (round_, marks, times)
            assert marks.created == first[0].created
        # An earlier fire time written late changes nothing.
        await stores[1].schedule_fired("nightly", 1500.0, True)
        assert (await stores[2].schedule_marks("nightly", 0.0)).handled == highest
    finally:
        for store in stores:
            await closed(store)


async def test_a_trigger_moves_started_only_and_both_stores_agree(
    shared_store: Callable[..., Any],
) -> None:
    """A trigger's time is no fire time: it becomes the latest started (what every
    replica's overlap decision reads) and leaves `handled` (where catch-up starts) alone;
    neither goes back. The process's store keeps the same rule."""
    from agent_server.store.memory import MemoryStore

    shared = shared_store("r0", Recorder())
    await shared.open()
    try:
        for store in (shared, MemoryStore("m")):
            await store.schedule_marks("hourly", 1000.0)
            await store.schedule_fired("hourly", 3600.0, True)
            await store.schedule_fired("hourly", 4000.5, True, handled=False)  # a trigger
            marks = await store.schedule_marks("hourly", 0.0)
            assert (marks.handled, marks.started) == (3600.0, 4000.5), store
            await store.schedule_fired("hourly", 3900.0, True, handled=False)  # written late
            await store.schedule_fired("hourly", 7200.0, False)  # a skipped firing
            marks = await store.schedule_marks("hourly", 0.0)
            assert (marks.handled, marks.started) == (7200.0, 4000.5), store
    finally:
        await closed(shared)


async def test_marks_handled_with_another_cron_move_on_to_the_change(
    shared_store: Callable[..., Any],
) -> None:
    """A replica whose schedule has another timing (cron and zone) than the one the marks
    were handled with (a release changed a declared cron) moves `handled` on to its now:
    the new cron's fire times start at the change. Marks kept before timings were kept
    just take it; the same timing moves nothing."""
    from agent_server.store.memory import MemoryStore

    shared = shared_store("r0", Recorder())
    await shared.open()
    try:
        for store in (shared, MemoryStore("m")):
            await store.schedule_marks("legacy", 1000.0)
            await store.schedule_fired("legacy", 1200.0, True)
            marks = await store.schedule_marks("legacy", 5000.0, "0 7 * * *\x1fUTC")
            assert marks.handled == 1200.0, store  # no timing kept: taken, nothing moved
            marks = await store.schedule_marks("legacy", 6000.0, "0 7 * * *\x1fUTC")
            assert marks.handled == 1200.0, store  # the same timing
            marks = await store.schedule_marks("legacy", 7000.0, "* * * * *\x1fUTC")
            assert (marks.handled, marks.started) == (7000.0, 1200.0), store
            # A PATCH records its moment and its timing at once.
            await store.schedule_fired("legacy", 7500.0, False, timing="0 * * * *\x1fUTC")
            marks = await store.schedule_marks("legacy", 9000.0, "0 * * * *\x1fUTC")
            assert marks.handled == 7500.0, store
    finally:
        await closed(shared)
