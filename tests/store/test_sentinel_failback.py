"""A planned failover back to a primary that was killed and restarted: no start is told while
the failover is under way, and none a client was told is lost (section 12, "What a client is
told survives a failover").

A primary and ONE replica (AOF, a password), three sentinels, two real `agent-server run`
replicas under a light load of idempotent async starts whose every answer is kept (when it
was sent, when it was answered). The primary is killed with SIGKILL (the sentinels promote
the replica), started again on its files as it was (a primary: the sentinels turn it into a
replica of the new one, as they do a restarted pod), and once it is in sync `SENTINEL
FAILOVER` moves the primary back to it. From the moment the failover begins until every
sentinel names one primary again with no failover under way, the old primary's `WAIT`
proves nothing: a start it takes must be answered 503 + Location (in doubt), never 202.

The second test pins down one way Sentinel itself makes `WAIT` lie: a sentinel that last
looked at the restarted node while it was still a primary (its look at a replica comes every
10 s) sees it a primary again once promoted and, not yet told of the failover, converts it
back into the old primary's replica; it resyncs, acknowledges the old primary's writes, and
the failover ends only by its timeout. Here the failover's leader is paused a moment as the
replica is promoted (a loaded machine's), so that the other sentinel looks first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent_server.store.redis.sentinel import confirms
from tests.store.test_sentinel import (
    PASSWORD,
    POLL,
    SERVICE,
    WAIT,
    Node,
    Redises,
    announced,
    every_sentinel_names,
    missing_on,
    start_agents,
    started_redises,
    wait_until,
)
from tests.support.process import ServerProcess
from tests.support.sentinel import SentinelProcess

pytestmark = pytest.mark.redis

#: Clients of the light load, each one start at a time, PACE seconds apart.
STARTERS = 4
PACE = 0.1
#: Bound on the sentinels turning a restarted or deposed primary into a replica and its sync
#: (they take about ten seconds, more on a loaded machine).
CONVERTED = 45.0
#: The sentinels' `down-after-milliseconds` once the killed primary's failover is done (from
#: the file's 1000): a node is seen down only past it.
DOWN_AFTER_MS = 10000
#: The pinned failover's timeout (ms): it ends by it, the promoted replica having been
#: converted back; long enough for that replica's resync to end well within it.
PINNED_TIMEOUT_MS = 12000


@dataclass
class Answers:
    """Every start's answer: each 202 with when it was sent and answered, each 503."""

    accepted: dict[str, tuple[float, float]] = field(default_factory=dict)
    in_doubt: dict[str, float] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    grew: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, done: Callable[[], bool]) -> None:
        """Until `done()` holds, looked at after each answer (the caller bounds it)."""
        while not done():
            self.grew.clear()
            await self.grew.wait()

    def accepted_within(self, spans: list[tuple[float, float]]) -> list[str]:
        """The 202s whose request was sent and answered within one of `spans`."""
        return [
            execution_id
            for execution_id, (sent, answered) in self.accepted.items()
            if any(begin <= sent and answered <= end for begin, end in spans)
        ]


async def starter(
    client: httpx.AsyncClient, bases: list[str], name: str, answers: Answers, stop: asyncio.Event
) -> None:
    """Async starts, each retried under its own Idempotency-Key (on the next agent replica)
    until a 202; a 503 must say whether it may have been recorded (Location) or not."""
    number = 0
    while not stop.is_set():
        number += 1
        attempt = 0
        while not stop.is_set():
            base = bases[(number + attempt) % len(bases)]
            attempt += 1
            sent = time.monotonic()
            try:
                response = await client.post(
                    f"{base}/reasoners/sleep/async",
                    json={"seconds": 0.05},
                    headers={"Idempotency-Key": f"{name}-{number}"},
                )
            except httpx.TransportError:
                await asyncio.sleep(0.05)
                continue
            now = time.monotonic()
            answers.statuses[response.status_code] = (
                answers.statuses.get(response.status_code, 0) + 1
            )
            answers.grew.set()
            if response.status_code == 202:
                answers.accepted[response.json()["execution_id"]] = (sent, now)
                break
            assert response.status_code == 503, response.text
            if "location" in response.headers:
                execution_id = response.json()["execution_id"]
                assert response.headers["location"] == f"/executions/{execution_id}"
                answers.in_doubt[execution_id] = now
            await asyncio.sleep(0.05)
        await asyncio.sleep(PACE)


async def load(agents: list[ServerProcess], answers: Answers, fault: Callable[[], Any]) -> None:
    """STARTERS clients of starts; `fault()` once 20 are accepted; two seconds more after."""
    stop = asyncio.Event()
    bases = [agent.url for agent in agents]
    async with httpx.AsyncClient(timeout=WAIT) as client:
        tasks = [
            asyncio.create_task(starter(client, bases, f"s{i}", answers, stop))
            for i in range(STARTERS)
        ]
        try:
            async with asyncio.timeout(WAIT):
                await answers.until(lambda: len(answers.accepted) >= 20)
            await fault()
            await asyncio.sleep(2.0)  # the load, running past the fault's end
        finally:
            stop.set()
            await asyncio.gather(*tasks)


def in_sync_with(node: Node, primary: Node) -> bool:
    found = node.info("replication")
    return (
        found.get("role") == "slave"
        and int(found.get("master_port") or 0) == primary.port
        and found.get("master_link_status") == "up"
    )


def settled(redises: Redises, nodes: tuple[Node, Node]) -> tuple[Node, Node] | None:
    """(primary, replica) once every sentinel names one of `nodes` with no failover under
    way and sees the other its replica, in sync; None until then."""
    for primary, replica in (nodes, nodes[::-1]):
        if not in_sync_with(replica, primary):
            continue
        for sentinel in redises.sentinels:
            master = sentinel.ask("master", SERVICE)
            if (
                not isinstance(master, dict)
                or int(master.get("port") or 0) != primary.port
                or "failover_in_progress" in master.get("flags", "")
                or not sentinel.sees_replica(replica.port, primary.port)
            ):
                return None
        return primary, replica
    return None


def role_reported(sentinel: SentinelProcess, port: int) -> str | None:
    """The role a sentinel last saw the node on `port` report (its last INFO of it)."""
    for found in sentinel.ask("replicas", SERVICE) or []:
        if int(found["port"]) == port:
            return str(found.get("role-reported"))
    return None


class FailoverWatch:
    """A thread looking at the sentinels every POLL: the spans during which a failover was
    seen under way (on any sentinel) or the sentinels named different primaries. Each span
    lies within the true one (it is seen late and left early by at most a poll)."""

    def __init__(self, redises: Redises) -> None:
        self.redises = redises
        self.spans: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover-watch")

    def failing(self) -> bool:
        named: set[Any] = set()
        for sentinel in self.redises.sentinels:
            master = sentinel.ask("master", SERVICE)
            if not isinstance(master, dict) or "failover_in_progress" in master.get("flags", ""):
                return True
            named.add((master.get("ip"), int(master.get("port") or 0)))
        return len(named) != 1

    def _run(self) -> None:
        began: float | None = None
        last = 0.0
        while not self._stop.is_set():
            failing = self.failing()
            now = time.monotonic()
            if failing and began is None:
                began = now
            elif not failing and began is not None:
                self.spans.append((began, last))
                began = None
            last = now
            time.sleep(POLL)
        if began is not None:
            self.spans.append((began, last))

    @contextlib.contextmanager
    def running(self) -> Iterator[FailoverWatch]:
        self._thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            self._thread.join(timeout=WAIT)


async def kill_and_restart(redises: Redises) -> None:
    """SIGKILL to the primary, the replica promoted; the killed one started again as it was
    (a primary), for the sentinels to convert."""
    first, second = redises.primary, redises.replica
    await asyncio.to_thread(first.kill)
    await announced(redises, ("127.0.0.1", first.port))
    await asyncio.to_thread(every_sentinel_names, redises, second.port)
    # From here on the only failover is the one the test asks for: on a loaded machine a
    # promoted node slow to answer for DOWN_AFTER_MS was seen down, and the sentinels failed
    # over a second time, back to the restarted node, before the test had set anything up.
    for sentinel in redises.sentinels:
        sentinel.client.execute_command(
            "SENTINEL", "SET", SERVICE, "down-after-milliseconds", str(DOWN_AFTER_MS)
        )
    await asyncio.to_thread(first.start, None)


async def told_again(answers: Answers, more: int = 10) -> None:
    count = len(answers.accepted)
    async with asyncio.timeout(WAIT):
        await answers.until(lambda: len(answers.accepted) >= count + more)


def check(
    redises: Redises, agents: list[ServerProcess], answers: Answers, watch: FailoverWatch
) -> list[str]:
    """Every 202 on the primary the sentinels agree on and read 200 by every agent replica;
    none answered within a span of a failover. Prints what was seen."""
    named = redises.sentinels[0].primary()
    assert named is not None
    (primary,) = [node for node in (redises.primary, redises.replica) if node.port == named[1]]
    every_sentinel_names(redises, primary.port)
    lost = missing_on(primary, agents, sorted(answers.accepted))
    during = answers.accepted_within(watch.spans)
    spans = ", ".join(f"{end - begin:.2f} s" for begin, end in watch.spans)
    print(
        f"\nfailover spans {spans}; answers {answers.statuses}; accepted "
        f"{len(answers.accepted)}, {len(during)} of them within a failover; in doubt "
        f"{len(answers.in_doubt)}; lost {len(lost)}"
    )
    for agent in agents:
        assert PASSWORD not in agent.stderr()
        assert "Traceback" not in agent.stderr(), agent.stderr()
    assert watch.spans, "no failover was seen"
    return [*(f"lost {each}" for each in lost), *(f"told during a failover: {e}" for e in during)]


def test_a_failover_back_to_a_restarted_primary_tells_nothing_until_it_is_done(
    tmp_path: Path,
) -> None:
    with started_redises(tmp_path / "redis", 1) as redises:
        first, second = redises.primary, redises.replica
        agents = start_agents(tmp_path, redises.url())
        answers = Answers()
        watch = FailoverWatch(redises)

        async def fault() -> None:
            await kill_and_restart(redises)
            # Converted, the restarted node is the replica; should the sentinels still fail
            # over a second time, back to it (the promoted node seen down past DOWN_AFTER_MS),
            # the planned failover goes from the primary they settle on to the other node.
            primary, replica = await asyncio.to_thread(
                wait_until,
                lambda: settled(redises, (first, second)),
                what="one primary named by every sentinel, the other node its replica in sync",
                timeout=CONVERTED,
                log=lambda: f"{first.log()}\n{second.log()}",
            )
            await told_again(answers)
            with watch.running():
                assert redises.sentinels[0].client.execute_command("SENTINEL", "FAILOVER", SERVICE)
                await announced(redises, ("127.0.0.1", primary.port))
                await asyncio.to_thread(
                    wait_until,
                    lambda: in_sync_with(primary, replica),
                    what="the deposed primary demoted, in sync",
                    timeout=CONVERTED,
                    log=primary.log,
                )
                await asyncio.to_thread(every_sentinel_names, redises, replica.port)

        try:
            asyncio.run(load(agents, answers, fault))
            assert check(redises, agents, answers, watch) == []
        finally:
            for agent in agents:
                agent.close()


def test_a_promoted_replica_converted_back_by_a_sentinel_not_yet_told_tells_nothing(
    tmp_path: Path,
) -> None:
    with started_redises(tmp_path / "redis", 1) as redises:
        first, second = redises.primary, redises.replica
        leader, _, late = redises.sentinels
        agents = start_agents(tmp_path, redises.url())
        answers = Answers()
        watch = FailoverWatch(redises)
        seen: dict[str, float] = {}

        async def fault() -> None:
            await kill_and_restart(redises)
            # `late` has seen the restarted node a primary; it looks again only when told to.
            await asyncio.to_thread(
                wait_until,
                lambda: role_reported(late, first.port) == "master",
                what="a sentinel seeing the restarted node a primary",
                log=late.log,
            )
            late.client.execute_command("SENTINEL", "DEBUG", "info-period", "600000")
            await asyncio.to_thread(
                wait_until,
                lambda: in_sync_with(first, second),
                what="the restarted primary converted into a replica, in sync",
                timeout=CONVERTED,
                log=first.log,
            )
            for sentinel in redises.sentinels:
                sentinel.client.execute_command(
                    "SENTINEL", "SET", SERVICE, "failover-timeout", str(PINNED_TIMEOUT_MS)
                )
            await told_again(answers)
            with watch.running():
                assert leader.client.execute_command("SENTINEL", "FAILOVER", SERVICE)
                await asyncio.to_thread(
                    wait_until,
                    lambda: first.info("replication").get("role") == "master",
                    what="the replica promoted",
                )
                leader.proc.send_signal(signal.SIGSTOP)  # well under Sentinel's TILT (2 s)
                try:
                    late.client.execute_command("SENTINEL", "DEBUG", "info-period", "100")
                    await asyncio.to_thread(
                        wait_until,
                        lambda: first.info("replication").get("role") == "slave",
                        what="the promoted replica converted back by the sentinel not told",
                        timeout=1.5,
                        log=late.log,
                    )
                finally:
                    leader.proc.send_signal(signal.SIGCONT)
                seen["converted back"] = time.monotonic()
                # It resyncs from the old primary and acknowledges its writes while the
                # failover is under way, until its timeout ends it.
                await asyncio.to_thread(
                    wait_until,
                    lambda: in_sync_with(first, second),
                    what="the converted replica in sync",
                    timeout=CONVERTED,
                )
                seen["in sync"] = time.monotonic()
                await asyncio.to_thread(
                    wait_until,
                    lambda: not watch.failing(),
                    what="the failover ended by its timeout",
                    timeout=CONVERTED,
                    log=leader.log,
                )

        try:
            asyncio.run(load(agents, answers, fault))
            assert seen["in sync"] < watch.spans[-1][1], "the failover ended before the resync"
            assert check(redises, agents, answers, watch) == []
        finally:
            for agent in agents:
                agent.close()


def test_a_look_confirms_only_a_node_more_than_half_name_with_no_failover() -> None:
    here, there = ("10.0.0.1", 6379), ("10.0.0.2", 6379)
    assert confirms([(here, False), (here, False), None], here)
    assert not confirms([(here, False), None, None], here)  # half or fewer answered
    assert not confirms([(here, False), (there, False), (here, False)], here)  # one disagrees
    assert not confirms([(here, False), (here, True), (here, False)], here)  # a leader's failover
    assert not confirms([(here, False)] * 3, None)  # the write's node unknown
    assert confirms([(here, False)], here)
