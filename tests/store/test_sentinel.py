"""Sentinel: `--store redis+sentinel://...` finds the primary through real `redis-sentinel`
processes and follows a failover.

A primary `redis-server` and one replica (both with AOF and a password), three sentinels
(quorum 2, `down-after-milliseconds 1000`), two real `agent-server run` replicas. Under a load
of starts (async with an Idempotency-Key, and sync runs) whose answers are kept in a history,
the primary is killed with SIGKILL: the sentinels promote the replica, every agent replica is
ready again shortly after the new primary is announced, everything accepted ends readable
and terminal, and no terminal answer a client was given is contradicted by a later read.
Every wait is bounded; waits poll for readiness or process exit, never sleep blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError, ReadOnlyError

from agent_server.model.asks import Question
from agent_server.model.execution import CancelReason
from agent_server.model.status import TERMINAL
from agent_server.process.launcher import run_command
from agent_server.store import StoreInDoubt, StoreUnavailable
from agent_server.store.redis import RedisStore, describe_url
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import COMMAND_TIMEOUT
from agent_server.store.redis.resp import Address, RedisLink
from agent_server.store.redis.sentinel import parse_url, promotable
from tests.apps.tests_app import EVIDENCE_DIR_ENV, REPLICA_ID_ENV
from tests.support.process import ServerProcess, free_port, need
from tests.support.redis_server import AOF, RedisServer, redis_command
from tests.support.sentinel import SentinelProcess

pytestmark = pytest.mark.redis

SERVICE = "agents"
PASSWORD = "s3cret-Pw"
#: Bound on each wait of this file (seconds) unless it says otherwise.
WAIT = 20.0
#: Seconds from the new primary being announced to every agent replica being ready: what
#: the test allows (the design aims at one; the measured time is printed).
READY_BOUND = 3.0
POLL = 0.02
#: Clients of the load: async starters and sync runners, spread over the agent replicas.
STARTERS = 8
RUNNERS = 4


class Node:
    """A real `redis-server` with AOF and a password; a replica of `primary` if given."""

    def __init__(self, directory: Path, primary: int | None = None) -> None:
        directory.mkdir()
        self.directory = directory
        self.port = free_port()
        self.log_path = directory / "redis.log"
        self.start(primary)

    def start(self, primary: int | None, *options: str) -> None:
        """Start (or start again, on its files and port) and wait until it answers."""
        command = redis_command(
            self.port,
            self.directory,
            self.log_path,
            *AOF,
            *("--requirepass", PASSWORD, "--masterauth", PASSWORD),
            *options,
        )
        if primary is not None:
            command += ["--replicaof", "127.0.0.1", str(primary)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(
            port=self.port, password=PASSWORD, socket_timeout=1.0, decode_responses=True
        )
        try:
            wait_until(self.answers, what=f"redis-server on {self.port}", log=self.log)
        except BaseException:
            self.kill()
            raise

    def rejoin(self, primary: int, *, promotable: bool = True) -> None:
        """A killed node back as a replica of `primary` (a restarted pod), in sync. Not
        `promotable` (`replica-priority 0`): after a failover to a replica that was
        stopped, a sentinel on a loaded machine can still take the new primary for down
        for a moment and fail over again, to this node mid-sync; the tests that stop a
        replica attack one failover, not that one."""
        self.start(primary, *(() if promotable else ("--replica-priority", "0")))
        wait_until(
            lambda: self.info("replication").get("master_link_status") == "up",
            what=f"node {self.port} in sync with {primary}",
            log=self.log,
        )

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited:\n{self.log()}")
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def info(self, section: str) -> dict[str, Any]:
        found: dict[str, Any] = self.client.info(section)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=WAIT)
        self.client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


def start_sentinel(directory: Path, primary: int) -> SentinelProcess:
    """A sentinel of this file (quorum 2, `down-after-milliseconds` 1000), answering."""
    started = SentinelProcess(
        directory, primary, service=SERVICE, port=free_port(), password=PASSWORD
    )
    try:
        wait_until(started.answers, what=f"redis-sentinel on {started.port}", log=started.log)
    except BaseException:
        started.stop()
        raise
    return started


def wait_until(predicate: Any, *, what: str, timeout: float = WAIT, log: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout}s\n{log() if log else ''}")
        time.sleep(POLL)


@dataclass
class Redises:
    primary: Node
    replicas: list[Node]
    sentinels: list[SentinelProcess]

    @property
    def replica(self) -> Node:
        return self.replicas[0]

    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://:{PASSWORD}@{hosts}/{SERVICE}/0"


@contextlib.contextmanager
def started_redises(directory: Path, replicas: int) -> Iterator[Redises]:
    """A primary, `replicas` replicas in sync, and three sentinels that know them all."""
    need("redis-server", package="redis-server")
    need("redis-sentinel", package="redis-sentinel")
    directory.mkdir(exist_ok=True)
    started: list[Node | SentinelProcess] = []
    try:
        primary = Node(directory / "primary")
        started.append(primary)
        nodes: list[Node] = []
        for index in range(replicas):
            nodes.append(Node(directory / f"replica{index or ''}", primary=primary.port))
            started.append(nodes[-1])
        for node in nodes:
            wait_until(
                lambda node=node: node.info("replication").get("master_link_status") == "up",
                what=f"replica {node.port} in sync",
                log=node.log,
            )
        sentinels: list[SentinelProcess] = []
        for index in range(3):
            sentinels.append(start_sentinel(directory / f"sentinel{index}", primary.port))
            started.append(sentinels[-1])
        for sentinel in sentinels:
            for node in nodes:
                wait_until(
                    lambda sentinel=sentinel, node=node: sentinel.knows([node.port], 2),
                    what=f"sentinel {sentinel.port} knowing replica {node.port} and the others",
                    log=sentinel.log,
                )
        yield Redises(primary, nodes, sentinels)
    finally:
        for process in reversed(started):
            if isinstance(process, SentinelProcess):
                process.stop()
            else:
                process.kill()


@pytest.fixture
def redises(tmp_path: Path) -> Iterator[Redises]:
    with started_redises(tmp_path, 1) as started:
        yield started


@pytest.fixture
def two_replicas(tmp_path: Path) -> Iterator[Redises]:
    with started_redises(tmp_path, 2) as started:
        yield started


# -- the URL never shows its password ---------------------------------------------------------


async def test_no_reachable_sentinel_fails_fast_naming_hosts_never_the_password() -> None:
    ports = [free_port(), free_port()]  # nothing listens there
    url = f"redis+sentinel://user:{PASSWORD}@127.0.0.1:{ports[0]},localhost:{ports[1]}/{SERVICE}/2"
    where = describe_url(url)
    assert where == f"redis+sentinel://127.0.0.1:{ports[0]},localhost:{ports[1]}/{SERVICE}/2"
    store = RedisStore(url, replica_id="A", agent_name="sentinel")
    assert store.replicated_writes
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert where in message, message
    assert PASSWORD not in message and "user" not in message, message
    assert not store.up
    await store.close()
    assert not RedisStore("redis://127.0.0.1:1/0", replica_id="A", agent_name="x").replicated_writes


@pytest.mark.parametrize(
    ("url", "names"),
    [
        (f"redis+sentinel://:{PASSWORD}@/svc/0", "has no host"),
        (f"redis+sentinel://:{PASSWORD}@h1:26379,h2:port/svc", "port of sentinel 'h2'"),
        (f"redis+sentinel://:{PASSWORD}@h1:26379,[nope]:1/svc", "IPv6"),
        (f"redis+sentinel://:{PASSWORD}@h1:26379", "service"),
        (f"redis+sentinel://:{PASSWORD}@h1/svc/zero", "db"),
        (f"redis+sentinel://:{PASSWORD}@h1/svc/0?ssl=1", "options"),
        ("redis+sentinel://:pa55/w0rd@h1:26379/svc/0", "%2F"),
    ],
)
def test_a_malformed_url_says_what_is_wrong_never_the_password(url: str, names: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_url(url)
    message = str(caught.value)
    assert names in message, message
    for secret in (PASSWORD, "pa55", "w0rd"):
        assert secret not in message, message
    assert PASSWORD not in describe_url(url)


def test_the_url_parses_as_redis_py_and_celery_write_it() -> None:
    target = parse_url("redis+sentinel://:p%40ss@h1:26380,h2,[::1]:26381/my-service/3")
    assert target.sentinels == (("h1", 26380), ("h2", 26379), ("::1", 26381))
    assert (target.service, target.db, target.password, target.username) == (
        "my-service",
        3,
        "p@ss",
        None,
    )
    assert "p@ss" not in repr(target)
    assert parse_url("redis+sentinel://h1/svc").db == 0


def test_a_malformed_url_exits_2_at_start_without_the_password(tmp_path: Path) -> None:
    done = subprocess.run(
        run_command(
            "tests_app:agent",
            "--store",
            f"redis+sentinel://:{PASSWORD}@127.0.0.1:26379,127.0.0.1:x/{SERVICE}/0",
        ),
        cwd=Path(__file__).parent,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 2, done.stderr
    assert "port of sentinel '127.0.0.1'" in done.stderr, done.stderr
    assert PASSWORD not in done.stderr + done.stdout


# -- the link follows the primary -------------------------------------------------------------


@dataclass
class FixedLocator:
    """A locator naming one real redis-server, remembering what it was told."""

    address: Address
    refuted: list[Address] = field(default_factory=list)

    async def primary(self) -> Address:
        return self.address

    def not_primary(self, address: Address) -> None:
        self.refuted.append(address)


async def test_a_demoted_primary_is_dropped_and_its_role_checked_again(
    own_redis: RedisServer,
) -> None:
    locator = FixedLocator(("127.0.0.1", own_redis.port))
    link = RedisLink("redis://primary/0", connect_timeout=2.0, timeout=2.0, locator=locator)
    dead = free_port()
    try:
        async with asyncio.timeout(WAIT):
            assert await link.call("SET", "k", "1") == "OK"
            # Demoted (a replica of a port nobody listens on): writes answer READONLY.
            assert own_redis.command("REPLICAOF", "127.0.0.1", str(dead)) == b"+OK\r\n"
            with pytest.raises(ReadOnlyError):
                await link.call("SET", "k", "2")
            # That connection is dropped: the next call connects again and ROLE refuses it.
            with pytest.raises(ConnectionError, match="ROLE slave"):
                await link.call("GET", "k")
            assert locator.refuted == [locator.address]
            assert own_redis.command("REPLICAOF", "NO", "ONE") == b"+OK\r\n"
            assert await link.call("SET", "k", "3") == "OK"
    finally:
        own_redis.command("REPLICAOF", "NO", "ONE")
        await link.close()


async def test_the_link_and_the_client_reach_the_primary_through_the_sentinels(
    redises: Redises,
) -> None:
    store = RedisStore(redises.url(), replica_id="A", agent_name="sentinel-direct")
    await store.open()
    try:
        assert store.up
        replicas = redises.primary.client.zscore(store.keys.replicas, "A")
        assert replicas is not None  # the liveness went to the primary, through both paths
        # WAIT on the scripts' link: the one replica has the writes made there.
        link = store._link.scripts
        assert await link.call("SET", "w", "1") == "OK"
        assert await link.call("WAIT", 1, 1000) == 1
    finally:
        await store.close()


async def test_an_end_counts_as_recorded_only_once_a_replica_has_it(redises: Redises) -> None:
    """Asynchronous replication acknowledges what no replica has yet, and a failover then
    loses it: with Sentinel an end is recorded (and a synchronous caller answered) only
    once `WAIT 1` says a replica has it; until then it stays in the outbox."""
    from agent_server.model.execution import Execution, ExecutionStatus

    store = RedisStore(redises.url(), replica_id="A", agent_name="sentinel-wait")
    await store.open()
    try:
        execution = Execution("sleep", None, "A")
        await store.create(execution)
        assert redises.replica.proc is not None
        redises.replica.proc.send_signal(signal.SIGSTOP)  # the replica stops acknowledging
        try:
            execution.finish(ExecutionStatus.SUCCEEDED, result="replicated")
            store.end(execution)
            assert not await store.recorded(execution, 1.5)
            assert len(store._outbox), "an end no replica has left the outbox"
        finally:
            redises.replica.proc.send_signal(signal.SIGCONT)
        assert await store.recorded(execution, WAIT)
        assert store.fenced == 0 and store._outbox.failed == []
        key = store.keys.record(execution.execution_id)
        assert redises.replica.client.hget(key, "status") == "succeeded"
    finally:
        await store.close()


async def test_every_told_write_no_replica_holds_is_in_doubt(redises: Redises) -> None:
    """With the replica stopped, Redis runs each told write but no replica holds it: a
    start, a cancel of a queued execution, an answer and a DELETE raise StoreInDoubt naming
    the execution (503 + Location), a release's end StoreUnavailable, each within the
    command timeout, never a success a failover could take back. Reads still answer."""
    from agent_server.model.execution import Execution, ExecutionStatus

    store = RedisStore(redises.url(), replica_id="A", agent_name="told")
    await store.open()
    try:
        asking, queued, ended = (Execution("sleep", None, "A") for _ in range(3))
        queued.enqueue(None)
        for execution in (asking, queued, ended):
            assert await store.create(execution, max_queued=10) is None
        ended.finish(ExecutionStatus.SUCCEEDED, result=1)
        store.end(ended)
        assert await store.recorded(ended, WAIT)
        request = {"request_id": 1, "prompt": "go on?", "schema": None, "asked_at": time.time()}
        question = Question({**request, "expires_at": None}, "go-on", "go on?")
        await store.ask(asking, question, False, None)
        waiting = await store.get(asking.execution_id)
        assert waiting is not None and waiting.status is ExecutionStatus.INPUT_REQUIRED
        assert await store.begin_release("s", 5.0) is None
        redises.replica.proc.send_signal(signal.SIGSTOP)
        try:
            fresh = Execution("sleep", None, "A")
            writes: list[tuple[str, Any]] = [
                (fresh.execution_id, store.create(fresh)),
                (queued.execution_id, store.request_cancel(queued, CancelReason.REQUEST, None)),
                (asking.execution_id, store.answer(waiting, None, "yes")),
                (ended.execution_id, store.forget(ended.execution_id)),
            ]
            for execution_id, write in writes:
                began = time.monotonic()
                with pytest.raises(StoreInDoubt) as caught:
                    await write
                assert caught.value.execution_id == execution_id
                assert time.monotonic() - began < COMMAND_TIMEOUT + 1.0
            with pytest.raises(StoreUnavailable) as refused:
                await store.end_release("s", {"cancelled": 0})
            assert not isinstance(refused.value, StoreInDoubt)
            # On the primary (settled, never voided): running here until the repair finds no
            # task here to adopt it, then queued for its first run.
            found = await store.get(fresh.execution_id)
            assert found is not None, fresh.execution_id
            assert found.status in (ExecutionStatus.RUNNING, ExecutionStatus.QUEUED), found.status
            assert found.attempt == 1
        finally:
            redises.replica.proc.send_signal(signal.SIGCONT)
        key = store.keys.record(fresh.execution_id)
        wait_until(lambda: redises.replica.client.exists(key), what="the replica catching up")
        again = Execution("sleep", None, "A")
        assert await store.create(again) is None  # held: acknowledged once more
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("replica", "counted"),
    [
        ({"flags": "slave", "master-link-status": "ok"}, True),
        ({"flags": "s_down,slave", "master-link-status": "ok"}, False),
        ({"flags": "slave,disconnected"}, False),
        ({"flags": "o_down,slave"}, False),
        ({"flags": "slave", "slave-priority": "0"}, False),
        ({"flags": "slave", "replica-priority": "0"}, False),
        ({"flags": "slave", "master-link-status": "err", "master-link-down-time": "9000"}, True),
        ({"flags": "slave", "master-link-status": "err", "master-link-down-time": "10001"}, False),
    ],
)
def test_a_replica_counts_while_sentinel_could_promote_it(
    replica: dict[str, str], counted: bool
) -> None:
    """Sentinel's own choice (`down-after-milliseconds` 1000 here): not down, not priority
    0, its link to the primary down at most ten times `down-after`."""
    assert promotable(replica, 1000) is counted


async def test_told_writes_wait_for_fewer_replicas_only_once_the_lower_count_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A promoted replica leaves the old primary's count before the sentinels announce the
    new primary: a lower count applies only after COUNT_HOLD seconds, never while a
    failover shows; a higher one at once."""
    from agent_server.store.redis import link as link_module

    now = [100.0]
    monkeypatch.setattr(link_module.time, "monotonic", lambda: now[0])
    link = link_module.Link(
        "redis://127.0.0.1:1/0",
        where="here",
        common=(),
        observer=None,
        on_up=lambda: None,
        renew_now=asyncio.Event(),
        libraries="libraries",
        acked_channel="acked",
    )
    link.need_replicas(2)
    assert link.replicas_needed == 2 and b"WAIT" in link.acknowledgement.packed
    link.need_replicas(1)
    now[0] += link_module.COUNT_HOLD - 0.1
    link.need_replicas(1)
    assert link.replicas_needed == 2
    link.need_replicas(1, failing_over=True)
    now[0] += 10
    link.need_replicas(1, failing_over=True)
    assert link.replicas_needed == 2, "a failover under way never lowers the count"
    link.need_replicas(1)
    now[0] += link_module.COUNT_HOLD
    link.need_replicas(1)
    assert link.replicas_needed == 1
    link.need_replicas(0)
    assert link.replicas_needed == 1, "at least one replica"
    link.need_replicas(3)
    assert link.replicas_needed == 3


async def test_a_told_write_waits_for_every_replica_the_sentinels_could_promote(
    two_replicas: Redises,
) -> None:
    """A failover may promote any replica the sentinels see up, the one that is behind
    included: a told write held by one of two replicas is in doubt, never told, until the
    sentinels stop counting the other (down past `down-after-milliseconds`); then one is
    enough, and once it is back both are needed again."""
    from agent_server.model.execution import Execution

    store = RedisStore(two_replicas.url(), replica_id="A", agent_name="every-replica")
    await store.open()
    link = store._link
    try:
        await asyncio.to_thread(
            wait_until, lambda: link.replicas_needed == 2, what="the store counting two replicas"
        )
        assert await store.create(Execution("sleep", None, "A")) is None
        behind = two_replicas.replicas[1]
        assert behind.proc is not None
        behind.proc.send_signal(signal.SIGSTOP)  # behind, still counted by the sentinels
        try:
            lagging = Execution("sleep", None, "A")
            with pytest.raises(StoreInDoubt) as caught:
                await store.create(lagging)
            assert caught.value.execution_id == lagging.execution_id
            assert link.replicas_needed == 2
            await asyncio.to_thread(
                wait_until,
                lambda: link.replicas_needed == 1,
                what="the sentinels no longer counting the stopped replica",
            )
            assert await store.create(Execution("sleep", None, "A")) is None
        finally:
            behind.proc.send_signal(signal.SIGCONT)
        await asyncio.to_thread(
            wait_until, lambda: link.replicas_needed == 2, what="the replica counted again"
        )
        assert await store.create(Execution("sleep", None, "A")) is None
    finally:
        await store.close()


async def port_of(link: RedisLink, client: aioredis.Redis) -> tuple[int, int]:
    """The port of the node each of the store's connections reaches."""
    by_link = await link.call("CONFIG", "GET", "port")
    by_client = await client.config_get("port")
    return int(by_link[1]), int(by_client["port"])


async def test_a_planned_failover_is_followed_though_the_old_primary_stays_up(
    redises: Redises,
) -> None:
    """`SENTINEL FAILOVER` breaks no connection, and the old primary takes writes for
    seconds more: the watch moves both connections to the new primary."""
    store = RedisStore(redises.url(), replica_id="A", agent_name="planned")
    await store.open()
    try:
        link, client = store._link.scripts, store._link.redis
        old, new = redises.primary.port, redises.replica.port
        assert await port_of(link, client) == (old, old)
        assert redises.sentinels[0].client.execute_command("SENTINEL", "FAILOVER", SERVICE)
        announced_at = await announced(redises, ("127.0.0.1", old))
        async with asyncio.timeout(WAIT):
            while True:
                with contextlib.suppress(redis.RedisError, OSError):
                    if await port_of(link, client) == (new, new):
                        break
                await asyncio.sleep(POLL)
        followed = time.monotonic() - announced_at
        old_role = redises.primary.client.execute_command("ROLE")[0]
        print(f"\nfollowed {followed:.3f} s after the announcement (old primary: {old_role})")
        assert followed < 1.5, followed
        await store._liveness.tick()  # the liveness is written where the sentinels say
        assert redises.replica.client.zscore(store.keys.replicas, "A") is not None
        assert store.up
    finally:
        await store.close()


# -- a failover under load --------------------------------------------------------------------


@dataclass
class History:
    """What each client was told, in the order it was told."""

    #: (Idempotency-Key, execution id) of every 202.
    accepted_async: list[tuple[str, str]] = field(default_factory=list)
    #: Execution ids of every sync 200 with its terminal answer (status, result).
    told: dict[str, tuple[str, Any]] = field(default_factory=dict)
    #: Execution ids a 503 named in its Location: accepted, to be read later.
    located: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    accepted_at: list[float] = field(default_factory=list)
    grew: asyncio.Event = field(default_factory=asyncio.Event)

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def accepted(self) -> None:
        self.accepted_at.append(time.monotonic())
        self.grew.set()

    async def accepted_count(self, count: int) -> None:
        """Until `count` starts have been accepted in all."""
        while len(self.accepted_at) < count:
            self.grew.clear()
            await self.grew.wait()


def terminal(status: str) -> bool:
    return status in TERMINAL


async def starter(
    client: httpx.AsyncClient,
    bases: list[str],
    name: str,
    history: History,
    stop: asyncio.Event,
) -> None:
    """Async starts, each retried under its own Idempotency-Key until accepted, each retry
    on the next agent replica; every third accepted one is long-polled briefly, and a
    terminal read is recorded as told."""
    number = 0
    while not stop.is_set():
        number += 1
        key = f"{name}-{number}"
        attempt = 0
        while not stop.is_set():
            base = bases[(number + attempt) % len(bases)]
            attempt += 1
            try:
                response = await client.post(
                    f"{base}/reasoners/sleep/async",
                    json={"seconds": 0.2},
                    headers={"Idempotency-Key": key},
                )
            except httpx.TransportError:
                await asyncio.sleep(0.05)
                continue
            history.count(response.status_code)
            if response.status_code == 202:
                execution_id = response.json()["execution_id"]
                history.accepted_async.append((key, execution_id))
                history.accepted()
                if number % 3 == 0:
                    with contextlib.suppress(httpx.TransportError):
                        read = await client.get(
                            f"{base}/executions/{execution_id}", params={"wait": 1}
                        )
                        if read.status_code == 200 and terminal(read.json()["status"]):
                            body = read.json()
                            history.told[execution_id] = (body["status"], body.get("result"))
                break
            assert response.status_code == 503, response.text
            await asyncio.sleep(0.05)


async def runner(
    client: httpx.AsyncClient, base: str, history: History, stop: asyncio.Event
) -> None:
    """Sync runs: a 200 is a terminal answer; a 503 with Location an accepted execution."""
    while not stop.is_set():
        try:
            response = await client.post(f"{base}/reasoners/sleep", json={"seconds": 0.1})
        except httpx.TransportError:
            await asyncio.sleep(0.05)
            continue
        history.count(response.status_code)
        if response.status_code == 200:
            body = response.json()
            history.told[body["execution_id"]] = (body["status"], body.get("result"))
            history.accepted()
        elif response.status_code == 503 and "location" in response.headers:
            history.located.append(response.headers["location"].rsplit("/", 1)[-1])
        else:
            assert response.status_code == 503, response.text
            await asyncio.sleep(0.05)


def every_sentinel_names(redises: Redises, port: int) -> None:
    """Until every sentinel names the primary on `port`: a node that rejoins before one of
    them has switched can be taken for the primary by it, and promoted back (a loaded
    machine's slow sentinel)."""

    def names() -> bool:
        for sentinel in redises.sentinels:
            client = redis.Redis(port=sentinel.port, socket_timeout=1.0)
            try:
                found = client.execute_command("SENTINEL", "get-master-addr-by-name", SERVICE)
            except (redis.RedisError, OSError):
                return False
            finally:
                client.close()
            if found is None or int(found[1]) != port:
                return False
        return True

    wait_until(names, what=f"every sentinel naming the primary on {port}")


async def announced(redises: Redises, old: Address) -> float:
    """The moment the first sentinel names a primary other than `old` (bounded)."""
    clients = [aioredis.Redis(port=s.port, socket_timeout=1.0) for s in redises.sentinels]
    try:
        async with asyncio.timeout(WAIT):
            while True:
                for client in clients:
                    with contextlib.suppress(redis.RedisError, OSError):
                        host, port = await client.execute_command(
                            "SENTINEL", "get-master-addr-by-name", SERVICE
                        )
                        if (host.decode(), int(port)) != old:
                            return time.monotonic()
                await asyncio.sleep(POLL)
    finally:
        for client in clients:
            await client.aclose()


async def ready_again(client: httpx.AsyncClient, base: str, after: float) -> float:
    """The first moment past `after` at which /readyz answered 200, having answered 503
    since the primary was killed (bounded)."""
    seen_unready = False
    async with asyncio.timeout(WAIT):
        while True:
            try:
                status = (await client.get(f"{base}/readyz", timeout=1.0)).status_code
            except httpx.TransportError:
                status = 0
            now = time.monotonic()
            if status == 503:
                seen_unready = True
            elif status == 200 and seen_unready and now >= after:
                return now
            await asyncio.sleep(POLL)


def test_a_failover_under_load_loses_nothing_accepted(tmp_path: Path, redises: Redises) -> None:
    url = redises.url()
    agents: list[ServerProcess] = []
    try:
        for index in range(2):
            marker_dir = tmp_path / f"agent{index}"
            marker_dir.mkdir()
            agents.append(
                ServerProcess(
                    [
                        "tests_app:agent",
                        "--store",
                        url,
                        "--lease-ttl",
                        "2",
                        "--replica-id",
                        f"agent{index}",
                    ],
                    {},
                    marker_dir,
                )
            )
        for agent in agents:
            agent.wait_ready()
        history = History()
        old = ("127.0.0.1", redises.primary.port)
        measured = asyncio.run(failover(redises, agents, history, old))
        print(
            f"\nreplica promoted {measured['announced']:.2f} s after the kill; ready again "
            f"{', '.join(f'{s:.3f}' for s in measured['ready'])} s after the announcement; "
            f"answers by status {history.statuses}"
        )

        # The sentinels promoted the replica, and all of them say so.
        new = ("127.0.0.1", redises.replica.port)
        for sentinel in redises.sentinels:
            wait_until(lambda s=sentinel: s.primary() == new, what="every sentinel agreeing")
        assert redises.replica.client.execute_command("ROLE")[0] == "master"
        assert all(seconds < READY_BOUND for seconds in measured["ready"]), measured

        # The load straddled the failover.
        assert any(at < measured["killed_at"] for at in history.accepted_at)
        assert any(at > measured["announced_at"] for at in history.accepted_at)
        assert history.statuses.get(503, 0) > 0, history.statuses

        # One execution per Idempotency-Key.
        by_key: dict[str, set[str]] = {}
        for key, execution_id in history.accepted_async:
            by_key.setdefault(key, set()).add(execution_id)
        assert all(len(ids) == 1 for ids in by_key.values()), by_key

        # Everything accepted is readable and terminal; nothing told is contradicted.
        accepted = {execution_id for _, execution_id in history.accepted_async}
        accepted |= set(history.told) | set(history.located)
        problems: list[str] = []
        with httpx.Client(timeout=WAIT) as client:
            for number, execution_id in enumerate(sorted(accepted)):
                base = agents[number % len(agents)].url
                read = client.get(f"{base}/executions/{execution_id}", params={"wait": 10})
                if read.status_code != 200 or not terminal(read.json()["status"]):
                    problems.append(f"{execution_id}: {read.status_code} {read.text}")
                    continue
                body = read.json()
                told = history.told.get(execution_id)
                if told is not None and told != (body["status"], body.get("result")):
                    problems.append(f"{execution_id}: told {told}, read {read.text}")
        assert problems == [], problems
        assert len(accepted) >= 20, history.statuses
        for agent in agents:
            assert PASSWORD not in agent.stderr()
            assert "Traceback" not in agent.stderr(), agent.stderr()
    finally:
        for agent in agents:
            agent.close()


async def failover(
    redises: Redises, agents: list[ServerProcess], history: History, old: Address
) -> dict[str, Any]:
    """Load, kill -9 of the primary, the announcement, readiness again, more load."""
    stop = asyncio.Event()
    bases = [agent.url for agent in agents]
    async with httpx.AsyncClient(timeout=WAIT) as client:
        load = [
            asyncio.create_task(starter(client, bases, f"c{i}", history, stop))
            for i in range(STARTERS)
        ]
        load += [
            asyncio.create_task(runner(client, bases[i % len(bases)], history, stop))
            for i in range(RUNNERS)
        ]
        try:
            async with asyncio.timeout(WAIT):
                await history.accepted_count(40)  # the load is under way
            await asyncio.to_thread(redises.primary.kill)
            killed_at = time.monotonic()
            announcing = asyncio.create_task(announced(redises, old))
            readiness = [
                asyncio.create_task(ready_again(client, agent.url, killed_at)) for agent in agents
            ]
            announced_at = await announcing
            # The new primary has no replica to hold what clients are told (starts answer
            # 503 + Location meanwhile): the killed node comes back as its replica, as a
            # restarted pod does.
            # Not promotable: this test attacks one failover, and a sentinel on a loaded
            # machine may otherwise fail over again to this node mid-sync (`rejoin`).
            await asyncio.to_thread(
                functools.partial(redises.primary.rejoin, redises.replica.port, promotable=False)
            )
            ready_at = await asyncio.gather(*readiness)
            async with asyncio.timeout(WAIT):  # some more accepted on the new primary
                await history.accepted_count(len(history.accepted_at) + 40)
        finally:
            stop.set()
            await asyncio.gather(*load)
    return {
        "killed_at": killed_at,
        "announced_at": announced_at,
        "announced": announced_at - killed_at,
        "ready": [at - announced_at for at in ready_at],
    }


# -- what a client is told survives a failover ------------------------------------------------


@dataclass
class Told:
    """The answers of async starts: every 202 (when), every 503 naming a Location."""

    accepted: dict[str, float] = field(default_factory=dict)
    in_doubt: dict[str, float] = field(default_factory=dict)
    statuses: dict[int, int] = field(default_factory=dict)
    #: Seconds from each request to its 503 + Location.
    doubt_seconds: list[float] = field(default_factory=list)
    grew: asyncio.Event = field(default_factory=asyncio.Event)

    async def until(self, done: Any) -> None:
        """Until `done()` holds, looked at after each answer (the caller bounds it)."""
        while not done():
            self.grew.clear()
            await self.grew.wait()

    def since(self, at: float) -> int:
        """202s and in-doubt 503s answered after `at`."""
        return sum(1 for when in (*self.accepted.values(), *self.in_doubt.values()) if when > at)


async def told_starter(
    client: httpx.AsyncClient, bases: list[str], name: str, told: Told, stop: asyncio.Event
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
            told.statuses[response.status_code] = told.statuses.get(response.status_code, 0) + 1
            told.grew.set()
            if response.status_code == 202:
                told.accepted[response.json()["execution_id"]] = now
                break
            assert response.status_code == 503, response.text
            if "location" in response.headers:
                body = response.json()
                assert response.headers["location"] == f"/executions/{body['execution_id']}"
                assert response.headers["retry-after"] == "1"
                told.in_doubt[body["execution_id"]] = now
                told.doubt_seconds.append(now - sent)
            await asyncio.sleep(0.05)


def start_agents(
    tmp_path: Path,
    url: str,
    count: int = 2,
    app: str = "tests_app:agent",
    env: dict[str, str] | None = None,
) -> list[ServerProcess]:
    agents: list[ServerProcess] = []
    try:
        for index in range(count):
            marker_dir = tmp_path / f"agent{index}"
            marker_dir.mkdir()
            agents.append(
                ServerProcess(
                    [app, "--store", url, "--replica-id", f"agent{index}"],
                    {**(env or {}), REPLICA_ID_ENV: f"agent{index}"},
                    marker_dir,
                )
            )
        for agent in agents:
            agent.wait_ready()
    except BaseException:
        for agent in agents:
            agent.close()
        raise
    return agents


def missing_on(node: Node, agents: list[ServerProcess], ids: list[str]) -> list[str]:
    """The ids the node (the new primary) lacks, or any agent replica reads as 404."""
    keys = Keys("tests")
    problems = [i for i in ids if not node.client.exists(keys.record(i))]
    with httpx.Client(timeout=WAIT) as client:
        for number, execution_id in enumerate(ids):
            url = f"{agents[number % len(agents)].url}/executions/{execution_id}"
            deadline = time.monotonic() + WAIT
            while (read := client.get(url)).status_code == 503 and time.monotonic() < deadline:
                time.sleep(POLL)  # the agent replica reconnecting to the new primary
            if read.status_code != 200:
                problems.append(f"{execution_id}: {read.status_code} {read.text}")
    return problems


async def told_load(
    agents: list[ServerProcess], told: Told, fault: Any, *, after: float
) -> dict[str, float]:
    """Async starts from 8 clients; `fault()` once 30 are accepted; the load goes on for
    `after` seconds past the new primary's announcement."""
    stop = asyncio.Event()
    bases = [agent.url for agent in agents]
    async with httpx.AsyncClient(timeout=WAIT) as client:
        load = [
            asyncio.create_task(told_starter(client, bases, f"t{i}", told, stop))
            for i in range(STARTERS)
        ]
        try:
            async with asyncio.timeout(WAIT):
                await told.until(lambda: len(told.accepted) >= 30)
            measured = await fault(told)
            await asyncio.sleep(after)  # the load, running past the announcement
        finally:
            stop.set()
            await asyncio.gather(*load)
    return measured


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_planned_failover_loses_no_start_a_client_was_told(tmp_path: Path, replicas: int) -> None:
    """Invariant 1 under `SENTINEL FAILOVER`: the replica is promoted while the old primary
    stays writable, and the agent replicas write there until they follow the announcement.
    Every 202 must be on the new primary afterwards: a start is answered 202 only once the
    replicas hold it, else 503 + Location (in doubt). With two replicas one holding a start
    is not enough: the sentinels may promote the other, and the one not promoted drops what
    the new primary lacks when it resyncs (WAIT 1 lost hundreds here)."""
    with started_redises(tmp_path / "redis", replicas) as redises:
        agents = start_agents(tmp_path, redises.url())
        old = ("127.0.0.1", redises.primary.port)
        told = Told()

        async def fail_over(told: Told) -> dict[str, float]:
            began = time.monotonic()
            assert redises.sentinels[0].client.execute_command("SENTINEL", "FAILOVER", SERVICE)
            announced_at = await announced(redises, old)
            return {"began": began, "announced": announced_at - began}

        try:
            measured = asyncio.run(told_load(agents, told, fail_over, after=2.0))
            named = redises.sentinels[0].primary()
            assert named is not None
            (primary,) = [node for node in redises.replicas if node.port == named[1]]
            lost = missing_on(primary, agents, sorted(told.accepted))
            print(
                f"\nannounced {measured['announced']:.2f} s after SENTINEL FAILOVER; answers "
                f"{told.statuses}; accepted {len(told.accepted)}, since the failover began "
                f"{told.since(measured['began'])}; in doubt {len(told.in_doubt)}; "
                f"lost {len(lost)}"
            )
            assert lost == [], lost
            assert told.since(measured["began"]) > 0, "no start was answered during the failover"
            for agent in agents:
                assert "Traceback" not in agent.stderr(), agent.stderr()
        finally:
            for agent in agents:
                agent.close()


def test_a_killed_primary_whose_replica_lags_loses_no_start_a_client_was_told(
    tmp_path: Path, redises: Redises
) -> None:
    """Invariant 1 under kill -9: the replica is stopped (SIGSTOP) and cut from the primary
    (`CLIENT KILL TYPE replica`), so nothing written meanwhile reaches it; the primary is
    then killed and the stale replica promoted. A start answered 202 in that window would
    be lost: it must be answered 503 + Location instead, within the command timeout."""
    agents = start_agents(tmp_path, redises.url())
    old = ("127.0.0.1", redises.primary.port)
    told = Told()
    replica, primary = redises.replica, redises.primary

    async def stall_then_kill(told: Told) -> dict[str, float]:
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            primary.client.client_kill_filter(_type="replica")
            await asyncio.to_thread(
                wait_until,
                lambda: primary.info("replication")["connected_slaves"] == 0,
                what="the replica cut off",
            )
            stalled = time.monotonic()
            async with asyncio.timeout(WAIT):  # starts answered while no replica has them
                await told.until(lambda: told.since(stalled) >= 8)
            await asyncio.to_thread(primary.kill)
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        killed = time.monotonic()
        announced_at = await announced(redises, old)
        return {"stalled": stalled, "killed": killed, "announced": announced_at - killed}

    try:
        measured = asyncio.run(told_load(agents, told, stall_then_kill, after=0.5))
        lost = missing_on(replica, agents, sorted(told.accepted))
        stalled = {i for i, at in told.in_doubt.items() if at > measured["stalled"]}
        print(
            f"\npromoted {measured['announced']:.2f} s after the kill; answers {told.statuses}; "
            f"accepted {len(told.accepted)}; in doubt {len(told.in_doubt)} (slowest "
            f"{max(told.doubt_seconds, default=0):.2f} s); lost {len(lost)}"
        )
        assert lost == [], lost
        assert stalled, "no start was answered in doubt while the replica lagged"
        assert max(told.doubt_seconds) < 2 * COMMAND_TIMEOUT + 1, told.doubt_seconds
        for agent in agents:
            assert PASSWORD not in agent.stderr()
            assert "Traceback" not in agent.stderr(), agent.stderr()
    finally:
        for agent in agents:
            agent.close()


def test_each_told_route_answers_in_doubt_while_no_replica_holds_its_write(
    tmp_path: Path, redises: Redises
) -> None:
    """Over HTTP, with the replica stopped: a start, an answer, a cancel of a queued
    execution and a DELETE answer 503 + `Retry-After` + `Location` naming the execution, a
    session release 503 + `Retry-After`; once the replica goes on, each record says what
    became of the write (the answer was taken, the start runs)."""
    (agent,) = start_agents(tmp_path, redises.url(), 1, "input_app:agent")
    try:
        with httpx.Client(base_url=agent.url, timeout=WAIT) as client:

            def started(path: str) -> str:
                response = client.post(path, json={})
                assert response.status_code == 202, response.text
                return str(response.json()["execution_id"])

            def read(execution_id: str, until: Any) -> dict[str, Any]:
                deadline = time.monotonic() + WAIT
                while not until(body := client.get(f"/executions/{execution_id}").json()):
                    assert time.monotonic() < deadline, body
                    time.sleep(POLL)
                return body

            asking = started("/reasoners/twice/async")
            read(asking, lambda body: body["status"] == "input_required")
            queued = started("/reasoners/twice/async?delay=600")
            ended = started("/reasoners/impatient/async")
            read(ended, lambda body: body["status"] == "succeeded")
            redises.replica.proc.send_signal(signal.SIGSTOP)
            try:
                answers = {
                    asking: client.post(f"/executions/{asking}/input", json={"value": "a"}),
                    queued: client.post(f"/executions/{queued}/cancel"),
                    ended: client.delete(f"/executions/{ended}"),
                }
                start = client.post("/reasoners/twice/async", json={})
                answers[start.json().get("execution_id", "?")] = start
                release = client.delete("/sessions/s1", params={"timeout": 1})
            finally:
                redises.replica.proc.send_signal(signal.SIGCONT)
            for execution_id, response in answers.items():
                assert response.status_code == 503, response.text
                assert response.headers["location"] == f"/executions/{execution_id}"
                assert response.headers["retry-after"] == "1"
                assert response.json()["execution_id"] == execution_id
            assert release.status_code == 503 and "location" not in release.headers
            # Settled later: the answer was taken (the second request is pending), the
            # start runs (adopted by the repair), the cancel and the DELETE took place.
            second = read(asking, lambda body: (body["input_request"] or {}).get("request_id"))
            assert second["input_request"]["request_id"] == 2, second
            fresh = start.json()["execution_id"]
            read(fresh, lambda body: body["status"] == "input_required")
            assert read(queued, lambda body: True)["status"] == "cancelled"
            assert client.get(f"/executions/{ended}").status_code == 404
            assert client.delete("/sessions/s1").status_code == 200
        assert PASSWORD not in agent.stderr()
    finally:
        agent.close()


#: Seconds a delayed start waits before it is due: room to cut the replica off first.
CLAIM_DELAY = 2.5


def test_a_claim_no_replica_holds_never_starts_a_body_a_failover_would_run_again(
    tmp_path: Path, redises: Redises
) -> None:
    """Section 12 (runs once): a non-resumable body never runs twice for one execution. A
    delayed start is accepted (held by the replica); the replica is then stopped and cut off,
    so the claim that takes it when it falls due reaches the primary only; the primary is
    killed and the stale replica, where it is still queued, promoted. Had its body started on
    that claim, the new primary would have it run again at attempt 1: the claim must wait for
    a replica like any told write, and one no replica holds starts nothing (the repair puts
    it back). The execution then runs once, on the new primary, and ends succeeded."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    agents = start_agents(tmp_path, redises.url(), env={EVIDENCE_DIR_ENV: str(evidence)})
    replica, primary = redises.replica, redises.primary
    old = ("127.0.0.1", primary.port)
    try:
        with httpx.Client(timeout=WAIT) as client:
            accepted = client.post(
                f"{agents[0].url}/reasoners/evidenced/async",
                params={"delay": CLAIM_DELAY},
                json={"seconds": 0.1},
            )
            sent = time.monotonic()
            assert accepted.status_code == 202, accepted.text
            execution_id = accepted.json()["execution_id"]
            runs = evidence / execution_id

            def claimed() -> bool:
                """Its body ran on that claim, or the claim was put back unstarted."""
                put_back = "so it never started; it goes back to the queue"
                return runs.exists() or any(put_back in agent.stderr() for agent in agents)

            replica.proc.send_signal(signal.SIGSTOP)
            try:
                primary.client.client_kill_filter(_type="replica")
                wait_until(
                    lambda: primary.info("replication")["connected_slaves"] == 0,
                    what="the replica cut off",
                )
                assert time.monotonic() - sent < CLAIM_DELAY, "cut off after it fell due"
                assert primary.client.hget(Keys("tests").record(execution_id), "status") == (
                    "queued"
                )
                wait_until(claimed, what="a claim of the due execution on the primary")
                primary.kill()
            finally:
                replica.proc.send_signal(signal.SIGCONT)
            asyncio.run(announced(redises, old))
            every_sentinel_names(redises, replica.port)
            # The new primary needs a replica of its own for a claim to be held there.
            primary.rejoin(replica.port, promotable=False)

            deadline = time.monotonic() + WAIT
            while True:
                read = client.get(f"{agents[1].url}/executions/{execution_id}")
                if read.status_code == 200 and read.json()["status"] == "succeeded":
                    break
                assert time.monotonic() < deadline, read.text + "".join(
                    f"\n{a.stderr()[-4000:]}" for a in agents
                )
                time.sleep(POLL)
        lines = runs.read_text().splitlines()
        print(f"\nbody runs: {lines}")
        assert [line.split()[:2] for line in lines] == [["run", "1"]], lines
        for agent in agents:
            assert PASSWORD not in agent.stderr()
            assert "Traceback" not in agent.stderr(), agent.stderr()
    finally:
        for agent in agents:
            agent.close()


def settles(agent: ServerProcess) -> float:
    """Settle operations (the repair reading creates that were in doubt), from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{agent.url}/metrics", timeout=WAIT).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "agent_server_store_operation_duration_seconds_count"
        and sample.labels.get("operation") == "settle"
    )


def test_a_start_in_doubt_is_not_adopted_before_a_replica_holds_it(
    tmp_path: Path, redises: Redises
) -> None:
    """A start answered 503 + Location (recorded on the primary, no replica holds it) is
    not run by the repair that finds it there: with the replica stopped and cut off, then
    the primary killed and the stale replica promoted, the record is gone, so a body run for
    it would be a run nobody can read, and the client's retry under the same key runs the
    request again. Its body never starts; the retry is the one run."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    (agent,) = start_agents(tmp_path, redises.url(), 1, env={EVIDENCE_DIR_ENV: str(evidence)})
    replica, primary = redises.replica, redises.primary
    old = ("127.0.0.1", primary.port)
    key = {"Idempotency-Key": "once"}
    try:
        with httpx.Client(base_url=agent.url, timeout=WAIT) as client:
            replica.proc.send_signal(signal.SIGSTOP)
            try:
                primary.client.client_kill_filter(_type="replica")
                wait_until(
                    lambda: primary.info("replication")["connected_slaves"] == 0,
                    what="the replica cut off",
                )
                before = settles(agent)
                doubt = client.post("/reasoners/evidenced/async", json={}, headers=key)
                assert doubt.status_code == 503, doubt.text
                vanished = doubt.json()["execution_id"]
                assert primary.client.exists(Keys("tests").record(vanished))
                # Two repairs since (the first may have begun before the 503), or its body.
                wait_until(
                    lambda: (evidence / vanished).exists() or settles(agent) >= before + 2,
                    what="a repair after the start in doubt",
                )
                primary.kill()
            finally:
                replica.proc.send_signal(signal.SIGCONT)
            asyncio.run(announced(redises, old))
            every_sentinel_names(redises, replica.port)
            primary.rejoin(replica.port, promotable=False)
            deadline = time.monotonic() + WAIT
            while (read := client.get(f"/executions/{vanished}")).status_code != 404:
                assert time.monotonic() < deadline, read.text  # 503 while reconnecting
                time.sleep(POLL)
            while (
                retry := client.post("/reasoners/evidenced/async", json={}, headers=key)
            ).status_code != 202:
                assert retry.status_code == 503 and time.monotonic() < deadline, retry.text
                time.sleep(POLL)
            execution_id = retry.json()["execution_id"]
            while (read := client.get(f"/executions/{execution_id}")).json()["status"] != (
                "succeeded"
            ):
                assert time.monotonic() < deadline, read.text
                time.sleep(POLL)
        ran = sorted(path.name for path in evidence.iterdir())
        print(f"\nbodies run for: {ran}; vanished {vanished}, retried as {execution_id}")
        assert ran == [execution_id], ran
        assert (evidence / execution_id).read_text().count("run 1") == 1
        assert "Traceback" not in agent.stderr(), agent.stderr()
    finally:
        agent.close()


@pytest.mark.parametrize("route", ["/reasoners/evidenced/async", "/reasoners/evidenced"])
def test_a_start_in_doubt_when_its_replica_shuts_down_runs_its_first_run_elsewhere(
    tmp_path: Path, redises: Redises, route: str
) -> None:
    """Section 12, accepted work is never failed unrun. A start (async, or sync) answered
    503 + Location because no Redis replica held its create is recorded on the primary,
    running under the agent replica that will never begin it (its repair has not settled
    it: the next renewal is a long lease's third away). That agent replica is then rolled
    (SIGTERM, exit 0) with the Redis replica back: its close must put the start back on
    the queue before its liveness ends, so a replica started after runs it as its first
    run and it succeeds, rather than reading `lost` ("stopped renewing"), its body never
    run anywhere."""
    evidence = tmp_path / "evidence"
    evidence.mkdir()
    replica, primary = redises.replica, redises.primary
    env = {EVIDENCE_DIR_ENV: str(evidence)}

    def agent(name: str) -> ServerProcess:
        marker_dir = tmp_path / name
        marker_dir.mkdir()
        args = ["tests_app:agent", "--store", redises.url(), "--replica-id", name]
        args += ["--lease-ttl", "30", "--unready-delay", "0"]
        return ServerProcess(args, {**env, REPLICA_ID_ENV: name}, marker_dir)

    first = agent("rolled")
    second: ServerProcess | None = None
    try:
        first.wait_ready()
        replica.proc.send_signal(signal.SIGSTOP)
        try:
            primary.client.client_kill_filter(_type="replica")
            wait_until(
                lambda: primary.info("replication")["connected_slaves"] == 0,
                what="the replica cut off",
            )
            before = settles(first)
            doubt = httpx.post(f"{first.url}{route}", json={"seconds": 0.1}, timeout=WAIT)
            # The repair the answer asked for has read it, unheld: the next is ten
            # seconds away (a third of the lease).
            wait_until(lambda: settles(first) >= before + 1, what="the repair after the 503")
        finally:
            replica.proc.send_signal(signal.SIGCONT)
        assert doubt.status_code == 503, doubt.text
        execution_id = doubt.json()["execution_id"]
        assert doubt.headers["location"] == f"/executions/{execution_id}"
        wait_until(
            lambda: primary.info("replication")["connected_slaves"] == 1,
            what="the replica back",
        )
        record = Keys("tests").record(execution_id)
        # Held by the rolled replica, never begun: its repair has not settled it yet.
        assert primary.client.hmget(record, "status", "replica") == ["running", "rolled"]
        assert not (evidence / execution_id).exists()
        first.signal(signal.SIGTERM)
        code, _ = first.wait_exit(WAIT)
        assert code == 0, first.stderr()
        second = agent("after")
        second.wait_ready()
        deadline = time.monotonic() + WAIT
        while True:
            body = httpx.get(f"{second.url}/executions/{execution_id}", timeout=WAIT).json()
            if body["status"] not in ("queued", "running"):
                break
            assert time.monotonic() < deadline, body
            time.sleep(POLL)
        assert (body["status"], body["attempt"]) == ("succeeded", 1), body
        lines = (evidence / execution_id).read_text().splitlines()
        assert [line.split()[:3] for line in lines] == [["run", "1", "after"]], lines
        assert "goes back to the queue for its first run" in first.stderr(), first.stderr()
        for process in (first, second):
            assert PASSWORD not in process.stderr()
            assert "Traceback" not in process.stderr(), process.stderr()
    finally:
        first.close()
        if second is not None:
            second.close()
