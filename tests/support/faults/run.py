"""One fault run: the parts started, load and faults for a while, everything healed, the
load stopped, the store quiesced and read back, and the history checked."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from tests.support.faults.checker import check, excused, unreplicated
from tests.support.faults.cluster import LEASE_TTL, FaultCluster, FaultReplica
from tests.support.faults.evidence import (
    Final,
    Violation,
    read_evidence,
)
from tests.support.faults.history import (
    TERMINAL,
    History,
    execution_of,
)
from tests.support.faults.load import OP_TIMEOUT, RETRY_FOR, LoadClient
from tests.support.faults.nemesis import Nemesis
from tests.support.faults.redis_parts import REDIS_REPLICAS


def _log_nothing(message: str) -> None:
    del message


def read_record(urls: list[str], execution_id: str, timeout: float = 10.0) -> Final:
    """GET /executions/{id} from the live replicas in turn, through refusals (bounded)."""
    deadline = time.monotonic() + timeout
    status: int | None = None
    turn = 0
    while True:
        url = urls[turn % len(urls)]
        turn += 1
        try:
            response = httpx.get(f"{url}/executions/{execution_id}", timeout=5.0)
            status = response.status_code
            body = execution_of(response)
            if body is not None or status == 404:
                return Final(status, body)
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            return Final(status, None)
        time.sleep(0.1)


def quiesce(
    urls: list[str], ids: set[str], timeout: float, log: Callable[[str], None]
) -> dict[str, Final]:
    """Read every execution until each is terminal, or `timeout` has passed; the last reads."""
    final: dict[str, Final] = {}
    pending = sorted(ids)
    deadline = time.monotonic() + timeout
    while True:
        for execution_id in pending:
            final[execution_id] = read_record(urls, execution_id)
        pending = [
            i for i in pending if final[i].body is not None and final[i].state not in TERMINAL
        ]
        if not pending or time.monotonic() > deadline:
            break
        log(f"quiesce: {len(pending)} executions not terminal yet")
        time.sleep(0.5)
    return final


def read_logs(replicas: list[FaultReplica]) -> dict[str, str]:
    logs: dict[str, str] = {}
    for replica in replicas:
        try:
            logs[replica.replica_id] = replica.stderr_path.read_text(errors="replace")
        except OSError as exc:
            logs[replica.replica_id] = f"(log unreadable: {exc})"
    return logs


@dataclass
class FaultRun:
    seed: int
    seconds: float
    server: str  # which agent_server the replicas ran
    calls: int
    exchanges: int
    executions: int
    faults: Counter[str]
    kinds: tuple[str, ...]
    violations: list[Violation]
    outcomes: Counter[str]
    reasoners: Counter[str]  # the executions of each reasoner
    elapsed: float
    #: Calls that gave up within spans without a Redis replica in sync (no violation).
    excused: list[str] = field(default_factory=list)
    #: The spans in which no told write could be acknowledged (Sentinel only): no Redis
    #: replica in sync, or one the sentinels could promote out of sync.
    unreplicated: list[tuple[float, float]] = field(default_factory=list)

    def by_invariant(self) -> Counter[str]:
        return Counter(v.invariant for v in self.violations)

    def summary(self) -> str:
        faults = " ".join(f"{kind}={self.faults.get(kind, 0)}" for kind in self.kinds)
        broken = " ".join(f"{k}={n}" for k, n in sorted(self.by_invariant().items())) or "none"
        return (
            f"seed {self.seed}: {self.seconds:g}s of faults, {self.elapsed:.0f}s in all; "
            f"{self.calls} calls, {self.exchanges} HTTP exchanges, {self.executions} "
            f"executions; faults: {faults}; violations: {len(self.violations)} ({broken})"
            + (f"; gave up unreplicated: {len(self.excused)}" if self.excused else "")
        )

    def report(self, limit: int = 8) -> str:
        """The seed, the counts and the violations (at most `limit` of each invariant)."""
        lines = [self.summary(), f"server: {self.server}"]
        lines.extend(f"  (gave up unreplicated) {each}" for each in self.excused)
        shown: Counter[str] = Counter()
        for violation in self.violations:
            shown[violation.invariant] += 1
            if shown[violation.invariant] <= limit:
                lines.append(f"  {violation}")
        for invariant, count in sorted(shown.items()):
            if count > limit:
                lines.append(f"  [{invariant}] ... {count - limit} more")
        return "\n".join(lines)


def write_history(history: History, final: Mapping[str, Final], path: Path) -> None:
    """The whole history and the final records, one JSON object a line, for a post-mortem."""
    with path.open("w") as out:
        out.write(json.dumps({"type": "start", "wall_clock": history.wall0}) + "\n")
        for kind, items in (
            ("nemesis", history.nemesis),
            ("note", history.notes),
            ("exchange", history.exchanges),
            ("call", history.calls),
        ):
            for item in items:
                out.write(json.dumps({"type": kind, **asdict(item)}) + "\n")
        for execution_id, record in sorted(final.items()):
            line = {"type": "final", "execution_id": execution_id, **asdict(record)}
            out.write(json.dumps(line) + "\n")


def run_faults(
    seed: int,
    seconds: float,
    directory: Path,
    *,
    clients: int = 6,
    source: Path | None = None,
    sentinel: bool = True,
    redis_replicas: int = REDIS_REPLICAS,
    store: str = "redis",
    log: Callable[[str], None] = _log_nothing,
) -> FaultRun:
    """One run: start the parts, load and faults for `seconds`, heal, stop the load,
    quiesce, read back, check. Every process it started is ended, whatever happens.
    `sentinel`: Redis is a primary and `redis_replicas` replicas under Sentinel (else one
    redis-server); `store="postgres"`: a Postgres primary and its synchronous standby
    instead (`sentinel` and `redis_replicas` unused)."""
    began = time.monotonic()
    history = History()
    cluster = FaultCluster(
        directory, source, sentinel=sentinel, redis_replicas=redis_replicas, store=store
    )
    stop = threading.Event()
    threads: list[LoadClient] = []
    try:
        server = cluster.server_module()
        log(f"seed {seed}: replicas import {server}")
        cluster.open()
        nemesis = Nemesis(cluster, history, log)
        until = time.monotonic() + seconds + OP_TIMEOUT + 30
        threads = [
            LoadClient(
                f"{'client' if n % 2 == 0 else 'raw'}{n}",
                "client" if n % 2 == 0 else "raw",
                cluster.url,
                history,
                seed,
                stop,
                until,
            )
            for n in range(clients)
        ]
        for thread in threads:
            thread.start()
        nemesis.run(seed, seconds)
        log("nemesis done: healing")
        nemesis.heal()
        stop.set()
        joined_by = time.monotonic() + OP_TIMEOUT + RETRY_FOR + 10
        for thread in threads:
            thread.join(timeout=max(0.0, joined_by - time.monotonic()))
            if thread.is_alive():
                history.note("client-stuck", f"{thread.name} still running after its bound")
        ids = {e.execution_id for e in history.exchanges if e.execution_id is not None}
        log(f"load stopped: {len(ids)} executions; quiescing")
        final = quiesce(cluster.live_urls(), ids, 3 * LEASE_TTL + 15, log)
        evidence = read_evidence(cluster.evidence_dir)
        logs = read_logs(cluster.started)
        violations = check(history, final, evidence, logs)
        write_history(history, final, directory / "history.jsonl")
        return FaultRun(
            seed=seed,
            seconds=seconds,
            server=server,
            calls=len(history.calls),
            exchanges=len(history.exchanges),
            executions=len(ids),
            faults=nemesis.counts,
            kinds=cluster.kinds,
            violations=violations,
            outcomes=Counter(f.state for f in final.values()),
            reasoners=Counter(f.reasoner or "-" for f in final.values()),
            elapsed=time.monotonic() - began,
            excused=excused(history),
            unreplicated=unreplicated(history.nemesis),
        )
    except Exception as exc:
        raise RuntimeError(
            f"seed {seed}: the harness failed (its parts are in {directory})"
        ) from exc
    finally:
        stop.set()
        cluster.close()
