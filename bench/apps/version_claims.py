"""One case of bench.versions in its own process: claims of queued resumable executions
that have a checkpoint, through a real `RedisStore`, as a replica's queue taker makes them
(one at a time). Run with the `agent_server` of the tree measured first on PYTHONPATH, so
the tree from before versions (no `version` anywhere) runs the same code path.

    python bench/apps/version_claims.py --redis URL --case c --agent NAME --count 2000

Cases (bench/versions.py): `a` the tree before versions (nothing advertised, nothing
versioned); `b` an unversioned agent (its advert, as `QueueTaker` builds it, sent with
every claim); `c` version v1 claiming v1 checkpoints; `d` v2 claiming v1 checkpoints it
declares `compatible`; `e` as `c` with 3 other live replicas advertising v0 and `--waiting`
executions whose v0 checkpoints wait in a version queue for them (every claim scans it).

It seeds `--count` (+1) executions, claims one untimed and prints a `ready` JSON line; then
for each `claim K` line on stdin it makes K claims and prints their wall time and this
process's CPU, so bench.versions can alternate the cases batch by batch on one Redis
(redis-server's CPU and `INFO commandstats` are read there, around each batch).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

import redis

import agent_server
from agent_server.model.execution import Execution
from agent_server.store.redis import RedisStore

#: Long enough that no renewal runs while the claims are timed (one every lease/3).
LEASE = 900.0
CHECKPOINT = '{"done": 2}'
BODY = {"count": 3}
SEED_BATCH = 50
REASONER = "steps"


def advert_of(version: str | None, compatible: tuple[str, ...] = ()) -> str:
    """What `QueueTaker` advertises for an agent whose one reasoner is `steps`."""
    from agent_server.model.versions import advert, version_rule

    return advert({REASONER: version_rule(None, version, compatible, None, "fail")})


#: Per case: the claimer's advert (None: the tree has no versions), the version of the code
#: that wrote the checkpoints it claims.
CASES: dict[str, tuple[tuple[str | None, tuple[str, ...]] | None, str | None]] = {
    "a": (None, None),
    "b": ((None, ()), None),
    "c": (("v1", ()), "v1"),
    "d": (("v2", ("v1",)), "v1"),
    "e": (("v1", ()), "v1"),
}


def store(url: str, agent: str, replica: str) -> RedisStore:
    return RedisStore(url, replica_id=replica, agent_name=agent, lease_ttl=LEASE)


async def seed(
    url: str, agent: str, count: int, version: str | None, versioned: bool, queue: str
) -> None:
    """`count` executions run by a replica `seed`, checkpointed and handed off: queued,
    attempt 2, with a body and a checkpoint (written by `version`), as a SIGTERM leaves them."""
    seeder = store(url, agent, "seed")
    await seeder.open()
    client = redis.Redis.from_url(url)
    try:
        before = int(client.llen(queue))

        async def one() -> None:
            execution = Execution(REASONER, None, "seed")
            execution.resumable = True
            execution.body = BODY
            execution.max_attempts = 3
            if versioned:
                execution.version = version
            await seeder.create(execution)
            await seeder.checkpoint(execution, CHECKPOINT)
            execution.mark_queued()
            seeder.hand_off(execution)

        for start in range(0, count, SEED_BATCH):
            await asyncio.gather(*(one() for _ in range(min(SEED_BATCH, count - start))))
        deadline = time.monotonic() + 60
        while int(client.llen(queue)) < before + count:  # the hand-offs go through the outbox
            if time.monotonic() > deadline:
                raise SystemExit(f"seeding: {client.llen(queue)} of {before + count} queued")
            await asyncio.sleep(0.01)
    finally:
        client.close()
        await seeder.close()


async def run(args: argparse.Namespace) -> None:
    """Seed, claim once (untimed), say `ready`; then per `claim K` line on stdin, K claims
    and one JSON line with their wall time and this process's CPU; `quit` ends it."""
    mine, checkpoint_version = CASES[args.case]
    versioned = mine is not None
    agent = args.agent
    queue = "{agent-server:" + agent + "}:queue"
    others: list[RedisStore] = []
    if args.case == "e":  # live replicas of v0, and work with v0 checkpoints waiting for them
        for index in range(args.others):
            other = store(args.redis, agent, f"v0-{index}")
            other.advertise(advert_of("v0"))
            await other.open()
            others.append(other)
        await seed(args.redis, agent, args.waiting, "v0", True, queue)
    await seed(args.redis, agent, args.count + 1, checkpoint_version, versioned, queue)
    claimer = store(args.redis, agent, "claimer")
    if mine is not None:
        claimer.advertise(advert_of(*mine))
    await claimer.open()
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    loop = asyncio.get_running_loop()
    try:
        # Untimed: the first claim (in case e it leaves the v0 work in its version queue).
        first = await claimer.claim()
        assert first is not None and first.checkpoint == CHECKPOINT, first
        vqs = list(client.smembers("{agent-server:" + agent + "}:vqs"))
        waiting = sum(int(client.llen("{agent-server:" + agent + "}:" + q)) for q in vqs)
        say(
            {
                "ready": True,
                "agent_server": agent_server.__file__,
                "waiting_in_version_queues": waiting,
                "live_others": len(others),
            }
        )
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] != "claim":
                break
            count = int(line[1])
            cpu = time.process_time()
            began = time.perf_counter()
            for _ in range(count):
                claimed = await claimer.claim()
                assert claimed is not None and claimed.checkpoint == CHECKPOINT, claimed
            seconds = time.perf_counter() - began
            say({"claims": count, "seconds": seconds, "cpu": time.process_time() - cpu})
        say({"left_queued": int(client.llen(queue))})
    finally:
        client.close()
        await claimer.close()
        for other in others:
            await other.close()


def say(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis", required=True)
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--agent", required=True, help="the agent name: its own keys")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--others", type=int, default=3)
    parser.add_argument("--waiting", type=int, default=100)
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
