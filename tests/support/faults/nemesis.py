"""The nemesis of a fault run: a seeded schedule of faults, dealt one at a time, each healed
(and every replica ready again, bounded) before the calm that precedes the next."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from tests.support.faults.cluster import (
    FAULT_KINDS,
    LEASE_TTL,
    READY_TIMEOUT,
    REPLICAS,
    ROLLOUT_TIMEOUT,
    FaultCluster,
)
from tests.support.faults.history import (
    History,
)
from tests.support.faults.postgres_parts import PostgresPair
from tests.support.faults.redis_parts import (
    SentinelRedis,
)


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int  # the replica's index (the Redis node's, for pause-redis and restart-redis)
    seconds: float  # how long a pause or a cut lasts
    mode: str  # a cut's: refuse or reset
    gap: float  # seconds of calm before it


def schedule(seed: int, kinds_of_faults: tuple[str, ...] = FAULT_KINDS) -> Iterator[Fault]:
    """The seeded faults, without end: rounds of the kinds, each round in its own seeded
    order, so every kind comes once in every round."""
    rng = random.Random(seed)
    while True:
        kinds = list(kinds_of_faults)
        rng.shuffle(kinds)
        for kind in kinds:
            target = rng.randrange(REPLICAS)
            if kind == "pause-replica":
                seconds = rng.uniform(1.3, 2.2) * LEASE_TTL  # past the lease
            elif kind in ("pause-redis", "pause-postgres"):
                seconds = rng.uniform(1.0, 4.0)
            elif kind == "cut":
                seconds = rng.uniform(1.0, 3.0)
            else:
                seconds = 0.0
            yield Fault(
                kind, target, seconds, rng.choice(("refuse", "reset")), rng.uniform(1.5, 3.5)
            )


class Nemesis:
    """Runs the faults one at a time; each is healed (and every replica ready again, bounded)
    before the calm that precedes the next. It stops once `seconds` have passed and every
    kind has come (a round can outlast a short schedule: a failover waits for the sentinels
    to make the deposed primary a replica again)."""

    def __init__(self, cluster: FaultCluster, history: History, log: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.history = history
        self.log = log
        self.counts: Counter[str] = Counter()
        if isinstance(cluster.redis, SentinelRedis):
            cluster.redis.watch_replication(self._replicated)

    def _replicated(self, replicated: bool, detail: str) -> None:
        """The spans in which no Redis replica is in sync with the primary, or one the
        sentinels could promote is not (no told write can be acknowledged): in the history,
        where the checker excuses the calls that gave up within them."""
        phase = "end" if replicated else "begin"
        self.history.nemesis_event("unreplicated", "redis", phase, detail)

    def run(self, seed: int, seconds: float) -> None:
        until = time.monotonic() + seconds
        for number, fault in enumerate(schedule(seed, self.cluster.kinds)):
            calm_until = time.monotonic() + fault.gap
            if calm_until >= until and number >= len(self.cluster.kinds):
                break  # past its time, once every kind has come
            time.sleep(fault.gap)  # pacing of the schedule, not a synchronisation
            self.apply(fault)
            self.counts[fault.kind] += 1
            unready = self.cluster.wait_all_ready()
            if unready:
                self.history.note(
                    "unready", f"{', '.join(unready)} not ready {READY_TIMEOUT:g}s after {fault}"
                )

    def apply(self, fault: Fault) -> None:
        cluster, event = self.cluster, self.history.nemesis_event
        self.log(f"nemesis: {fault.kind} {fault}")
        if fault.kind in ("kill9", "rollout", "pause-replica"):
            replica = cluster.replicas[fault.target]
            if replica.proc.poll() is not None:  # it died of itself: that is worth a look
                self.history.note(
                    "exited", f"{replica.replica_id} exited {replica.proc.returncode} unasked"
                )
                replica.close()
                self._replace(fault.target)
                return
            rid = replica.replica_id
            if fault.kind == "kill9":
                event("kill9", rid, "begin")
                replica.proc.kill()
                replica.proc.wait(timeout=10)
                event("kill9", rid, "end", f"exit {replica.proc.returncode}")
                replica.close()
                self._replace(fault.target)
            elif fault.kind == "rollout":
                event("rollout", rid, "begin")
                replica.signal(signal.SIGTERM)
                try:
                    code = replica.proc.wait(timeout=ROLLOUT_TIMEOUT)
                    event("rollout", rid, "end", f"exit {code}")
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait(timeout=10)
                    event("rollout", rid, "end", "forced: killed after the rollout bound")
                replica.close()
                self._replace(fault.target)
            else:
                event("pause-replica", rid, "begin", f"{fault.seconds:.2f}s")
                os.kill(replica.proc.pid, signal.SIGSTOP)
                try:
                    time.sleep(fault.seconds)
                finally:
                    os.kill(replica.proc.pid, signal.SIGCONT)
                event("pause-replica", rid, "end")
        elif fault.kind == "pause-postgres" and isinstance(cluster.store, PostgresPair):
            # The primary's postmaster and every backend, stopped: connections stay open.
            primary, name = cluster.store.pause()
            event("pause-postgres", "postgres", "begin", f"{name} {fault.seconds:.2f}s")
            primary.send(signal.SIGSTOP)
            try:
                time.sleep(fault.seconds)
            finally:
                primary.send(signal.SIGCONT)
            event("pause-postgres", "postgres", "end")
        elif fault.kind in ("kill-postgres", "failover-postgres") and isinstance(
            cluster.store, PostgresPair
        ):
            event(fault.kind, "postgres", "begin")
            if fault.kind == "kill-postgres":
                detail = cluster.store.kill_restart()
            else:
                detail = cluster.store.failover()
            event(fault.kind, "postgres", "end", detail)
        elif fault.kind == "pause-redis" and not isinstance(cluster.store, PostgresPair):
            # Any one node, by the schedule's index: the primary or (under Sentinel) a replica.
            node, name = cluster.store.pick(fault.target)
            event("pause-redis", "redis", "begin", f"{name} {fault.seconds:.2f}s")
            node.send(signal.SIGSTOP)
            try:
                time.sleep(fault.seconds)
            finally:
                node.send(signal.SIGCONT)
            event("pause-redis", "redis", "end")
        elif fault.kind == "restart-redis":
            event("restart-redis", "redis", "begin")
            assert not isinstance(cluster.store, PostgresPair)
            event("restart-redis", "redis", "end", cluster.store.restart(fault.target))
        elif fault.kind == "cut":
            event("cut", "proxy", "begin", f"{fault.mode} {fault.seconds:.2f}s")
            cluster.store.cut(fault.mode)
            try:
                time.sleep(fault.seconds)
            finally:
                cluster.store.restore()
            event("cut", "proxy", "end")
        elif fault.kind in ("failover", "kill-primary", "failback") and isinstance(
            cluster.store, SentinelRedis
        ):
            event(fault.kind, "redis", "begin")
            if fault.kind == "failover":
                detail = cluster.store.failover()
            elif fault.kind == "failback":
                detail = cluster.store.failback(early=fault.mode == "reset")
            else:
                detail = cluster.store.kill_primary()
            # The fault is over once a replica is in sync again (a told write needs one):
            # a failover the sentinels aborted can leave its chosen replica a primary alone.
            detail += f"; {cluster.store.settle() or 'settled'}"
            event(fault.kind, "redis", "end", detail)
        else:
            raise AssertionError(f"unknown fault {fault.kind}")

    def _replace(self, index: int) -> None:
        try:
            fresh = self.cluster.replace(index)
        except AssertionError as exc:
            self.history.note("start-failed", f"replica {index}: {exc}"[:2000])
            return
        self.history.nemesis_event("start", fresh.replica_id, "note", f"index {index}")

    def heal(self) -> None:
        """Everything back: the store running and not paused, its proxies open, every replica
        running and not paused, and ready."""
        cluster = self.cluster
        unsettled = cluster.store.heal()
        if unsettled:
            self.history.note("store-unsettled", f"at the heal: {unsettled}")
        for index, replica in enumerate(cluster.replicas):
            if replica.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(replica.proc.pid, signal.SIGCONT)
            else:
                self.history.note(
                    "exited", f"{replica.replica_id} exited {replica.proc.returncode}"
                )
                self._replace(index)
        self.history.nemesis_event("heal", "all", "note")
        unready = cluster.wait_all_ready()
        if unready:
            self.history.note("unready", f"{', '.join(unready)} not ready after the heal")
