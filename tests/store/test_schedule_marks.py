"""A schedule's marks in a real Redis, written by several replicas at once.

Invariant: `handled` and `started` never go back. A replica writes the fire time it handled
only when it is later than the one kept, whichever replica's write lands last; `created` is
set once, by the first replica that looks. A replica coming up starts after `handled`: were
it to go back, the firings between would be handled again.
"""

from __future__ import annotations

import asyncio
import random

from tests.support.stores import Recorder, closed, open_redis

REPLICAS = 4
ROUNDS = 30


async def test_marks_never_go_back_whichever_replica_writes_last(redis_url: str) -> None:
    stores = [open_redis(redis_url, f"r{n}", Recorder()) for n in range(REPLICAS)]
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
