"""The Postgres driver: psycopg 3 (what the store uses: async, pooled) against asyncpg, on the
three statements of an execution's life as the store sends them (the start's INSERT, the end's
UPDATE that notifies, the read's SELECT), one round trip each, against a real Postgres on
loopback. Client CPU per life (the driver's whole cost on the server's side) and lives/s, at
1 and 16 at once, the two drivers interleaved over rounds. docs/postgres.md keeps psycopg unless
asyncpg measures 1.3x.

asyncpg is not a dependency of agent-server: `pip install asyncpg` first.

Usage: PYTHONPATH=. python -m bench.pgdriver [--lives 3000] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from bench.common import Spread, log, write_json
from tests.support.postgres_server import PostgresServer

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS lives (agent text NOT NULL, id text NOT NULL,"
    " status text NOT NULL, replica text NOT NULL, attempt integer NOT NULL,"
    " created_at double precision NOT NULL, finished timestamptz, doc text NOT NULL,"
    " PRIMARY KEY (agent, id))"
)
DOC = json.dumps({"reasoner": "echo", "body": {"text": "hello"}, "status": "running"})
END = json.dumps({"reasoner": "echo", "result": {"echo": "hello"}, "status": "succeeded"})

PSYCOPG = (
    "INSERT INTO lives (agent, id, status, replica, attempt, created_at, doc)"
    " VALUES (%s, %s, 'running', 'A', 1, %s, %s)",
    "WITH done AS (UPDATE lives SET status = 'succeeded', doc = %s, finished = now()"
    " WHERE agent = %s AND id = %s AND replica = 'A' AND attempt = 1 AND status = 'running'"
    " RETURNING id) SELECT count(*), count(pg_notify('bench', 'e:' || id)) FROM done",
    "SELECT status, replica, attempt, doc FROM lives WHERE agent = %s AND id = %s",
)
ASYNCPG = tuple(
    statement.replace("%s", "${}").format(*range(1, statement.count("%s") + 1))
    for statement in PSYCOPG
)


async def psycopg_lives(url: str, lives: int, concurrency: int) -> tuple[float, float]:
    from psycopg_pool import AsyncConnectionPool

    async with AsyncConnectionPool(
        url, min_size=concurrency, max_size=concurrency, kwargs={"autocommit": True}
    ) as pool:

        async def life() -> None:
            key = uuid.uuid4().hex
            async with pool.connection() as conn:
                await conn.execute(PSYCOPG[0], ("bench", key, time.time(), DOC))
            async with pool.connection() as conn:
                await (await conn.execute(PSYCOPG[1], (END, "bench", key))).fetchone()
            async with pool.connection() as conn:
                await (await conn.execute(PSYCOPG[2], ("bench", key))).fetchone()

        return await measure(life, lives, concurrency)


async def asyncpg_lives(url: str, lives: int, concurrency: int) -> tuple[float, float]:
    import asyncpg

    pool = await asyncpg.create_pool(url, min_size=concurrency, max_size=concurrency)
    try:

        async def life() -> None:
            key = uuid.uuid4().hex
            async with pool.acquire() as conn:
                await conn.execute(ASYNCPG[0], "bench", key, time.time(), DOC)
            async with pool.acquire() as conn:
                await conn.fetchrow(ASYNCPG[1], END, "bench", key)
            async with pool.acquire() as conn:
                await conn.fetchrow(ASYNCPG[2], "bench", key)

        return await measure(life, lives, concurrency)
    finally:
        await pool.close()


async def measure(
    life: Callable[[], Awaitable[None]], lives: int, concurrency: int
) -> tuple[float, float]:
    """(client CPU us per life, lives/s) over `lives`, `concurrency` at once, after a warm-up."""
    for _ in range(50):
        await life()
    left = lives

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await life()

    cpu, wall = time.process_time(), time.perf_counter()
    async with asyncio.timeout(120):
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return cpu / lives * 1e6, lives / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lives", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    postgres = PostgresServer()
    results: dict[str, dict[int, list[tuple[float, float]]]] = {
        "psycopg": {1: [], 16: []},
        "asyncpg": {1: [], 16: []},
    }
    try:
        postgres.admin(SCHEMA, database="agents")
        postgres.admin("ALTER TABLE lives OWNER TO agent", database="agents")
        runs: dict[str, Callable[[str, int, int], Awaitable[tuple[float, float]]]] = {
            "psycopg": psycopg_lives,
            "asyncpg": asyncpg_lives,
        }
        for index in range(args.rounds):
            order = ["psycopg", "asyncpg"] if index % 2 == 0 else ["asyncpg", "psycopg"]
            for concurrency in (1, 16):
                for name in order:
                    found = asyncio.run(runs[name](postgres.url, args.lives, concurrency))
                    results[name][concurrency].append(found)
                    log(
                        f"round {index + 1} {name} x{concurrency}: {found[0]:.0f} us CPU per "
                        f"life, {found[1]:.0f} lives/s"
                    )
    finally:
        postgres.remove()
    data: dict[str, Any] = {"lives": args.lives, "rounds": args.rounds, "drivers": {}}
    for name, by in results.items():
        data["drivers"][name] = {
            str(c): {
                "cpu_us": Spread.of([r[0] for r in rows]).as_dict(),
                "lives_per_s": Spread.of([r[1] for r in rows]).as_dict(),
            }
            for c, rows in by.items()
        }
    print("| driver | at once | client CPU per life | lives/s |")
    print("|---|---|---|---|")
    for name, by in data["drivers"].items():
        for c, figures in by.items():
            print(
                f"| {name} | {c} | {figures['cpu_us']['median']:.0f} us "
                f"| {figures['lives_per_s']['median']:.0f} |"
            )
    for c in ("1", "16"):
        ratio = Spread.of(
            [
                a[0] / b[0]
                for a, b in zip(results["psycopg"][int(c)], results["asyncpg"][int(c)], strict=True)
            ]
        )
        data[f"cpu_ratio_{c}"] = ratio.as_dict()
        print(f"psycopg / asyncpg CPU per life at {c}: {ratio.fmt()}")
    data["raw_file"] = str(write_json("pgdriver", data))


if __name__ == "__main__":
    main()
