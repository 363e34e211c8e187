"""What the console's views ask of a server holding 10,000 executions, on each store.

The console (docs/console.md) reads the REST API: its executions view asks for the newest
page (`GET /executions?limit=50`), filtered pages (a status, a reasoner), and its schedules
and replicas views `GET /schedules` and `GET /replicas`. Each is timed here over loopback
(the time includes the client's, so it bounds the server's from above) against a bare
`GET /healthz` of the same server in the same run, with 10,000 finished executions kept, on
memory, Redis and Postgres. The target (issue 54): a first page within 300 ms.

    PYTHONPATH=. python -m bench.console_pages [--executions 10000] [--rounds 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.postgres_server import PostgresServer
from tests.support.process import ServerProcess
from tests.support.redis_server import RedisServer

#: Seconds the whole fill may take on one store (bounded, whatever the machine).
FILL_BOUND = 600.0
VIEWS = {
    "healthz (baseline)": "/healthz",
    "executions, newest 50": "/executions?limit=50",
    "executions, status=succeeded": "/executions?limit=50&status=succeeded",
    "executions, reasoner=echo": "/executions?limit=50&reasoner=echo",
    "executions, 5th page": None,  # followed by its cursors
    "schedules": "/schedules",
    "replicas": "/replicas",
}


@contextmanager
def store(kind: str, work: Path) -> Iterator[str]:
    """The store's URL, its server started here on loopback and stopped at the end."""
    if kind == "memory":
        yield "memory"
    elif kind == "redis":
        (work / "redis").mkdir()
        redis = RedisServer(work / "redis")
        redis.start()
        try:
            yield redis.url
        finally:
            redis.stop()
    else:
        postgres = PostgresServer()
        try:
            yield postgres.url
        finally:
            postgres.stop()


async def fill(url: str, count: int) -> None:
    """`count` executions of a trivial reasoner, started 64 at a time, each awaited to its
    end (bounded by FILL_BOUND)."""
    limit = asyncio.Semaphore(64)
    deadline = time.monotonic() + FILL_BOUND

    async def one(client: httpx.AsyncClient, index: int) -> None:
        async with limit:
            if time.monotonic() > deadline:
                raise TimeoutError("the fill ran past its bound")
            answer = await client.post("/reasoners/echo", json={"text": f"n{index}"})
            if answer.status_code != 200:
                raise AssertionError(f"start {index}: {answer.status_code} {answer.text}")

    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        await asyncio.gather(*(one(client, index) for index in range(count)))


def fifth_page(client: httpx.Client) -> str:
    """The path of the 5th page of 50, by the Link headers of the four before it."""
    path = "/executions?limit=50"
    for _ in range(4):
        following = client.get(path).links.get("next")
        if following is None:
            raise AssertionError("fewer than five pages")
        path = str(httpx.URL(following["url"]).raw_path, "ascii")
    return path


def timed(client: httpx.Client, path: str, rounds: int) -> list[float]:
    seconds = []
    for _ in range(rounds):
        began = time.perf_counter()
        answer = client.get(path)
        seconds.append(time.perf_counter() - began)
        if answer.status_code != 200:
            raise AssertionError(f"{path}: {answer.status_code} {answer.text[:200]}")
    return seconds


def measure(kind: str, executions: int, rounds: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory(prefix="console-pages-") as scratch:
        work = Path(scratch)
        with store(kind, work) as url:
            extra = ["--store", url, "--max-retained", str(executions * 2)]
            server = ServerProcess(["bench.bench_app:agent", *extra], {}, work, cwd=ROOT)
            try:
                server.wait_ready(60)
                began = time.monotonic()
                asyncio.run(fill(server.url, executions))
                print(f"{kind}: {executions} executions in {time.monotonic() - began:.1f} s")
                with httpx.Client(base_url=server.url, timeout=30) as client:
                    found: dict[str, list[float]] = {}
                    for name, path in VIEWS.items():
                        timed(client, path or fifth_page(client), 3)  # warm
                        found[name] = timed(client, path or fifth_page(client), rounds)
                return found
            finally:
                server.signal()
                server.wait_exit(60)
                server.close()


ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--executions", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--stores", default="memory,redis,postgres")
    options = parser.parse_args()
    print(f"# console pages at {options.executions} executions, {options.rounds} rounds each")
    print("| store | view | p50 ms | p99 ms | p50 / baseline |")
    print("|---|---|---|---|---|")
    for kind in options.stores.split(","):
        found = measure(kind, options.executions, options.rounds)
        base = statistics.median(found["healthz (baseline)"])
        for name, seconds in found.items():
            ordered = sorted(seconds)
            p50 = statistics.median(ordered)
            p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
            print(f"| {kind} | {name} | {p50 * 1000:.1f} | {p99 * 1000:.1f} | {p50 / base:.1f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
