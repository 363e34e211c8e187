"""The Postgres store beside Redis and memory, measured in one run on real servers on loopback
(docs/postgres.md, docs/performance.md).

1. Execution lives per second per replica: one `agent-server run` per store (memory, Redis,
   Postgres), all up together, each measured twice per round in mirrored order; a life is an
   async start of `echo` and a `GET ?wait=5` for its end (bench.store's `lives`). Beside the
   rate: the server's CPU per life and the store server's (redis-server's process; every
   process of the Postgres cluster, backends included).
2. Round trips to the store per life, one life at a time: a relay between agent-server and
   the store counts the client's bursts (a round trip begins when the client sends on a
   connection where the server has answered since it last sent; a pipeline is one), less
   what the same replica sends in the same time idle (its renewals and polls).
3. Rows and bytes per parked execution: N executions of a resumable reasoner that asks and
   parks (nobody owns them while they wait), the rows each table gained and the database's
   size gained per parked execution.
4. A list's first page at 1,000,000 records: the records written straight into the
   `executions` table (COPY of real documents made by the store's own codec), then
   `GET /executions?limit=50` (newest, and filtered by status and by reasoner) timed over
   loopback against a bare `GET /healthz` of the same server.

Usage: PYTHONPATH=. python -m bench.pgstore [--items 1,2,3,4] [--lives 4000] [--rounds 3]
                                           [--records 1000000] [--parked 1000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.common import HOST, ROOT, Spread, free_port, log, settle, write_json
from bench.store import RedisServer, agent_server, lives
from tests.support.postgres_server import PostgresServer

ITEMS = (1, 2, 3, 4)
#: Lives one at a time before item 2 counts: enough for every pooled connection to have
#: prepared each of a life's statements (with 50, about 0.05 round trips a life were those).
WARM_LIVES = 300
STORES = ("memory", "redis", "postgres")


# -- the store servers ---------------------------------------------------------------------


def cluster_cpu_seconds(postgres: PostgresServer) -> float:
    """CPU of every process of the cluster: the postmaster and its children (backends,
    writers: each leads a process group of its own, so they are found by parent), and those
    already reaped (the postmaster's children's times)."""
    assert postgres.proc is not None
    postmaster = postgres.proc.pid
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError):
            fields = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()
            if int(entry) == postmaster:
                total += sum(int(f) for f in fields[11:15])
            elif int(fields[1]) == postmaster:  # ppid
                total += int(fields[11]) + int(fields[12])
    return total / tick


@contextlib.contextmanager
def stores(wanted: tuple[str, ...]) -> Iterator[dict[str, Any]]:
    """Each store's server, started on loopback and stopped at the end: {name: server}."""
    with contextlib.ExitStack() as stack:
        found: dict[str, Any] = {"memory": None}
        if "redis" in wanted:
            found["redis"] = stack.enter_context(RedisServer())
        if "postgres" in wanted:
            postgres = PostgresServer()
            stack.callback(postgres.remove)
            found["postgres"] = postgres
        yield found


def store_url(name: str, server: Any, port: int | None = None) -> str:
    """The store's URL, through `port` (a relay) when given."""
    if name == "memory":
        return "memory"
    url: str = server.url
    if port is not None:
        original = server.port
        url = url.replace(f":{original}/", f":{port}/")
    return url


def store_cpu(name: str, server: Any) -> float:
    if name == "redis":
        return float(server.cpu_seconds())
    if name == "postgres":
        return cluster_cpu_seconds(server)
    return 0.0


# -- item 1: lives per second --------------------------------------------------------------


def item_lives(
    source: Path, servers: dict[str, Any], *, count: int, rounds: int, concurrency: int
) -> dict[str, Any]:
    rates: dict[str, list[float]] = {name: [] for name in servers}
    cpu: dict[str, list[float]] = {name: [] for name in servers}
    store_us: dict[str, list[float]] = {name: [] for name in servers}
    p50: dict[str, list[float]] = {name: [] for name in servers}
    p99: dict[str, list[float]] = {name: [] for name in servers}
    errors: dict[str, int] = dict.fromkeys(servers, 0)
    with contextlib.ExitStack() as stack:
        running = {
            name: stack.enter_context(
                agent_server(
                    f"agent-server {name}",
                    source,
                    "--store",
                    store_url(name, server),
                    "--replica-id",
                    f"bench-{name}",
                )
            )
            for name, server in servers.items()
        }
        for process in running.values():
            process.wait_ready()
        for process in running.values():  # warm-up
            asyncio.run(lives(process.port, min(count, 300), concurrency, 30.0))
            settle(process)
        names = list(running)
        for index in range(rounds):
            order = names if index % 2 == 0 else names[::-1]
            for name in order + order[::-1]:
                process, server = running[name], servers[name]
                cpu_before, store_before = process.cpu_seconds(), store_cpu(name, server)
                result = asyncio.run(lives(process.port, count // 2, concurrency, 120.0))
                settle(process)
                done = max(1, result.requests)
                rates[name].append(result.rps)
                cpu[name].append((process.cpu_seconds() - cpu_before) / done * 1e6)
                store_us[name].append((store_cpu(name, server) - store_before) / done * 1e6)
                p50[name].append(result.p50_ms)
                p99[name].append(result.p99_ms)
                errors[name] += result.errors
                log(
                    f"item 1 round {index + 1}/{rounds} {name:8} {result.rps:7.0f} lives/s "
                    f"p50 {result.p50_ms:.2f} ms, errors {result.errors}"
                )
    return {
        "count_per_round": count,
        "concurrency": concurrency,
        "stores": {
            name: {
                "lives_per_s": Spread.of(rates[name]).as_dict(),
                "server_cpu_us": Spread.of(cpu[name]).as_dict(),
                "store_cpu_us": Spread.of(store_us[name]).as_dict(),
                "p50_ms": Spread.of(p50[name]).as_dict(),
                "p99_ms": Spread.of(p99[name]).as_dict(),
                "errors": errors[name],
            }
            for name in servers
        },
        "ratio_to_redis": {
            name: Spread.of(
                [a / b for a, b in zip(rates[name], rates["redis"], strict=True) if b > 0]
            ).as_dict()
            for name in servers
            if "redis" in rates
        },
    }


# -- item 2: round trips per life ----------------------------------------------------------


class BurstRelay:
    """A TCP relay on its own thread counting the client's bursts per connection: a round
    trip begins when the client sends after the server has sent (or on a new connection)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target_port = target_port
        self.lock = threading.Lock()
        self.round_trips = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="relay", daemon=True)
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None

    def __enter__(self) -> BurstRelay:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the relay did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)

    def count(self) -> int:
        with self.lock:
            return self.round_trips

    def _main(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)
            try:
                await self._relay(reader, writer)
            finally:
                tasks.discard(task)

        server = await asyncio.start_server(accept, HOST, self.port)
        self._ready.set()
        async with server:
            await self._stop.wait()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(HOST, self.target_port)
        answered = [True]  # a connection's first send begins a round trip

        async def upstream() -> None:
            while data := await reader.read(65536):
                if answered[0]:
                    answered[0] = False
                    with self.lock:
                        self.round_trips += 1
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                answered[0] = True
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            with contextlib.suppress(OSError):
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            writer.close()
            up_writer.close()


def item_round_trips(source: Path, servers: dict[str, Any], *, count: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, server in servers.items():
        if name == "memory":
            continue
        with (
            BurstRelay(server.port) as relay,
            agent_server(
                f"agent-server {name} (relayed)",
                source,
                "--store",
                store_url(name, server, relay.port),
                "--replica-id",
                f"bench-rt-{name}",
            ) as process,
        ):
            process.wait_ready()
            # Warm: connections made, and each statement prepared on each pooled connection
            # (psycopg prepares at a statement's fifth use there, one round trip more).
            asyncio.run(lives(process.port, WARM_LIVES, 1, 60.0))
            settle(process)
            before, began = relay.count(), time.monotonic()
            result = asyncio.run(lives(process.port, count, 1, 120.0))
            busy = relay.count() - before
            seconds = time.monotonic() - began
            before = relay.count()
            # Idle for twice the time, counted as one time's worth: renewals, polls,
            # listens and repairs come at intervals, and a window as short as the busy one
            # caught from 45 to 68 of them (bench/RESULTS.md, PG11).
            time.sleep(2 * seconds)
            idle = round((relay.count() - before) / 2)
        per_life = (busy - idle) / max(1, result.requests)
        found[name] = {
            "lives": result.requests,
            "round_trips": busy,
            "idle_round_trips": idle,
            "per_life": per_life,
            "errors": result.errors,
        }
        log(f"item 2 {name}: {per_life:.2f} round trips per life ({busy} - {idle} idle)")
    return found


# -- item 3: rows and bytes per parked execution -------------------------------------------


def _table_rows(postgres: PostgresServer) -> dict[str, int]:
    rows = postgres.admin(
        "SELECT relname, n_live_tup FROM pg_stat_user_tables ORDER BY relname",
        database="agents",
    )
    return {str(name): int(count) for name, count in rows}  # type: ignore[misc]


def _database_bytes(postgres: PostgresServer) -> int:
    (size,) = postgres.admin("SELECT pg_database_size('agents')")[0]  # type: ignore[index,misc]
    return int(size)


def item_parked(source: Path, postgres: PostgresServer, *, count: int) -> dict[str, Any]:
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "apps"), str(ROOT)])}
    with agent_server(
        "agent-server postgres (parked)",
        source,
        "input_app:agent",
        "--store",
        postgres.url,
        "--replica-id",
        "bench-park",
        env=env,
    ) as process:
        process.wait_ready()
        postgres.admin("ANALYZE", database="agents")
        rows_before, bytes_before = _table_rows(postgres), _database_bytes(postgres)
        with httpx.Client(base_url=f"http://{HOST}:{process.port}", timeout=30) as client:
            ids = [
                client.post("/reasoners/email/async", json={}).json()["execution_id"]
                for _ in range(count)
            ]
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                page = client.get(
                    "/executions", params={"status": "input_required", "limit": 1000}
                ).json()
                if len(page) >= count:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError("the executions never all parked")
        postgres.admin("CHECKPOINT", "ANALYZE", database="agents")
        rows_after, bytes_after = _table_rows(postgres), _database_bytes(postgres)
    gained = {
        table: (rows_after.get(table, 0) - rows_before.get(table, 0)) / count
        for table in rows_after
        if rows_after.get(table, 0) != rows_before.get(table, 0)
    }
    per = (bytes_after - bytes_before) / count
    log(f"item 3: {gained} rows and {per:.0f} bytes per parked execution ({len(ids)} parked)")
    return {"parked": count, "rows_per_parked": gained, "bytes_per_parked": per}


# -- item 4: a first page at 1,000,000 records ---------------------------------------------

PAGES = {
    "healthz (baseline)": "/healthz",
    "executions, newest 50": "/executions?limit=50",
    "executions, status=failed": "/executions?limit=50&status=failed",
    "executions, reasoner=echo": "/executions?limit=50&reasoner=echo",
}


def _fill(postgres: PostgresServer, count: int, agent: str) -> float:
    """`count` finished records COPYed into `executions`, each the store's own document
    (every tenth `failed`, the rest `succeeded`; half `echo`, half `sleep`). Seconds taken."""
    import psycopg

    from agent_server.model.execution import Execution, ExecutionStatus
    from agent_server.store.postgres import codec

    began = time.monotonic()
    now = time.time()
    columns = (
        "agent, id, status, reasoner, created_at, replica, attempt, finished, expires_at, "
        "result_bytes, doc"
    )
    with (
        psycopg.connect(postgres.url, autocommit=False) as conn,
        conn.cursor() as cursor,
        cursor.copy(f"COPY executions ({columns}) FROM STDIN") as copy,
    ):
        for index in range(count):
            execution = Execution("echo" if index % 2 else "sleep", None, "bench-fill")
            execution.created_at = now - (count - index) * 0.001
            execution.body = {"text": f"record {index}"}
            failed = index % 10 == 0
            execution.finish(
                ExecutionStatus.FAILED if failed else ExecutionStatus.SUCCEEDED,
                result=None if failed else {"echo": f"record {index}"},
                error={"type": "ValueError", "message": "no"} if failed else None,
            )
            copy.write_row(
                (
                    agent,
                    execution.execution_id,
                    execution.status.value,
                    execution.reasoner,
                    execution.created_at,
                    "",
                    1,
                    "now()",
                    "infinity",
                    codec.result_bytes(execution),
                    codec.encode(execution),
                )
            )
    postgres.admin("VACUUM ANALYZE executions", database="agents")
    return time.monotonic() - began


def item_first_page(
    source: Path, postgres: PostgresServer, *, count: int, rounds: int
) -> dict[str, Any]:
    with agent_server(
        "agent-server postgres (pages)",
        source,
        "--store",
        postgres.url,
        "--replica-id",
        "bench-pages",
        "--result-ttl",
        "31536000",
        "--max-retained",
        str(count * 2),
        "--max-retained-bytes",
        str(1 << 40),
    ) as process:
        process.wait_ready()
        agent = _agent_of(postgres)
        seconds = _fill(postgres, count, agent)
        log(f"item 4: {count} records written in {seconds:.0f} s")
        (total,) = postgres.admin(  # type: ignore[misc]
            f"SELECT count(*) FROM executions WHERE agent = '{agent}'", database="agents"
        )[0]
        timings: dict[str, list[float]] = {name: [] for name in PAGES}
        with httpx.Client(base_url=f"http://{HOST}:{process.port}", timeout=30) as client:
            for _ in range(rounds):
                for name, path in PAGES.items():
                    began = time.perf_counter()
                    response = client.get(path)
                    timings[name].append((time.perf_counter() - began) * 1000)
                    if response.status_code != 200:
                        raise RuntimeError(f"{path}: {response.status_code} {response.text}")
                    if path != "/healthz" and len(response.json()) != 50:
                        raise RuntimeError(f"{path}: not a full page")
    return {
        "records": int(total),  # type: ignore[call-overload]
        "fill_seconds": seconds,
        "rounds": rounds,
        "ms": {
            name: {
                "p50": statistics.median(values),
                "p99": sorted(values)[max(0, round(len(values) * 0.99) - 1)],
                "max": max(values),
            }
            for name, values in timings.items()
        },
    }


def _agent_of(postgres: PostgresServer) -> str:
    """The agent name the server's rows carry (its replica's row says it)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        rows = postgres.admin("SELECT DISTINCT agent FROM replicas", database="agents")
        if rows:
            return str(rows[0][0])  # type: ignore[index]
        time.sleep(0.1)
    raise RuntimeError("no replica row")


# -- the run -------------------------------------------------------------------------------


def markdown(data: dict[str, Any]) -> str:
    lines = [f"`{data['command']}` ({data['date']}, {data['machine']})", ""]
    items = data["items"]
    if "1" in items:
        one = items["1"]
        lines += [
            "| store | lives/s per replica | vs Redis | server CPU per life | store CPU per life |",
            "|---|---|---|---|---|",
        ]
        for name, figures in one["stores"].items():
            ratio = one["ratio_to_redis"].get(name, {})
            lines.append(
                f"| {name} | {figures['lives_per_s']['median']:.0f} "
                f"[{figures['lives_per_s']['low']:.0f}-{figures['lives_per_s']['high']:.0f}] "
                f"| {ratio.get('median', 0):.2f} "
                f"| {figures['server_cpu_us']['median']:.0f} us "
                f"| {figures['store_cpu_us']['median']:.0f} us |"
            )
        lines.append("")
    if "2" in items:
        lines += ["| store | round trips per life (one at a time) |", "|---|---|"]
        for name, figures in items["2"].items():
            lines.append(f"| {name} | {figures['per_life']:.2f} |")
        lines.append("")
    if "3" in items:
        three = items["3"]
        lines.append(
            f"Parked ({three['parked']}): rows per parked execution "
            f"{json.dumps(three['rows_per_parked'])}, {three['bytes_per_parked']:.0f} bytes."
        )
        lines.append("")
    if "4" in items:
        four = items["4"]
        lines += [
            f"First pages at {four['records']:,} records ({four['rounds']} rounds):",
            "",
            "| page | p50 ms | p99 ms |",
            "|---|---|---|",
        ]
        for name, ms in four["ms"].items():
            lines.append(f"| {name} | {ms['p50']:.1f} | {ms['p99']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default=",".join(map(str, ITEMS)))
    parser.add_argument("--lives", type=int, default=4000, help="item 1: lives per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--trips", type=int, default=500, help="item 2: lives, one at a time")
    parser.add_argument("--parked", type=int, default=1000)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--page-rounds", type=int, default=40)
    parser.add_argument("--quick", action="store_true", help="smoke size")
    parser.add_argument("--source", type=Path, default=ROOT)
    args = parser.parse_args()
    if args.quick:
        args.lives, args.rounds, args.trips, args.parked, args.records = 400, 1, 50, 20, 2000
        args.page_rounds = 5
    items = {int(i) for i in args.items.split(",")}
    began = time.monotonic()
    data: dict[str, Any] = {
        "command": "PYTHONPATH=. python -m bench.pgstore "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "source"),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {socket.gethostname()}",
        "items": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-pgstore-"):
        with stores(STORES) as servers:
            if 1 in items:
                data["items"]["1"] = item_lives(
                    args.source,
                    servers,
                    count=args.lives,
                    rounds=args.rounds,
                    concurrency=args.concurrency,
                )
            if 2 in items:
                data["items"]["2"] = item_round_trips(args.source, servers, count=args.trips)
        if 3 in items:
            with stores(("postgres",)) as servers:
                data["items"]["3"] = item_parked(
                    args.source, servers["postgres"], count=args.parked
                )
        if 4 in items:
            with stores(("postgres",)) as servers:
                data["items"]["4"] = item_first_page(
                    args.source, servers["postgres"], count=args.records, rounds=args.page_rounds
                )
    data["seconds"] = time.monotonic() - began
    data["raw_file"] = str(write_json("pgstore", data))
    print(markdown(data))


if __name__ == "__main__":
    main()
