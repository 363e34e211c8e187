"""The shared store under the faults of section 12, one invariant at a time, in process
against a real redis-server: a pause (SIGSTOP), a full Redis (maxmemory), a demoted primary
(REPLICAOF), a create whose answer is lost. Each test names the invariant it attacks.

The whole-system version (several replicas, a load balancer, a seeded nemesis and a checker)
is tests/process/test_faults.py.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerOptions
from agent_server.model.waiting import Closing
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store.base import StoreUnavailable
from agent_server.store.redis import COMMAND_TIMEOUT, RedisStore
from tests.support.faults import CutProxy
from tests.support.redis_server import RedisServer
from tests.support.stores import Recorder, closed, eventually, open_redis

pytestmark = pytest.mark.redis

#: Bound on every wait here (seconds).
BOUND = 10.0
LEASE = 0.6


def pause(redis: RedisServer) -> None:
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGSTOP)


def resume(redis: RedisServer) -> None:
    assert redis.proc is not None
    redis.proc.send_signal(signal.SIGCONT)


@pytest.fixture
async def stores(own_redis: RedisServer) -> AsyncIterator[Callable[..., Awaitable[RedisStore]]]:
    """`await stores("A", lease_ttl=...)`: an open store of its own; all closed at the end
    (Redis resumed first, so closing is never stuck behind a pause)."""
    opened: list[RedisStore] = []

    async def make(replica_id: str, **options: Any) -> RedisStore:
        store = open_redis(own_redis.url, replica_id, Recorder(), **options)
        await store.open()
        opened.append(store)
        return store

    yield make
    resume(own_redis)
    for store in opened:
        await closed(store)


def seen(store: RedisStore) -> Recorder:
    assert isinstance(store.observer, Recorder)
    return store.observer


# -- invariant 2: the living are not judged ----------------------------------------------------


async def test_a_pause_of_redis_past_every_lease_judges_no_live_owner(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """Every lease lapses on Redis's clock during a pause; commands queued before it (each
    of B's reads) run after it. None may move A's running work to lost: A is alive and
    renews as soon as Redis answers again."""
    a = await stores("A", lease_ttl=LEASE)
    b = await stores("B", lease_ttl=LEASE)
    execution = Execution("sleep", None, "A")
    await a.create(execution)
    # B has renewed continuously for a whole lease: before the pause it may judge.
    await asyncio.sleep(LEASE * 1.5)
    pause(own_redis)
    try:
        # Reads sent during the pause run after it, when A's lease has lapsed.
        reads = [asyncio.ensure_future(b.get(execution.execution_id)) for _ in range(5)]
        await asyncio.sleep(LEASE * 3)
    finally:
        resume(own_redis)
    outcomes = await asyncio.gather(*reads, return_exceptions=True)
    assert all(
        isinstance(o, StoreUnavailable) or o.status is ExecutionStatus.RUNNING for o in outcomes
    )
    # For two leases after the pause, B reads A's execution over and over: still running.
    deadline = time.monotonic() + LEASE * 2
    while time.monotonic() < deadline:
        try:
            found = await b.get(execution.execution_id)
        except StoreUnavailable:
            continue  # the reconnection
        assert found is not None and found.status is ExecutionStatus.RUNNING, (
            found and found.to_json()
        )
        await asyncio.sleep(0.02)
    assert seen(b).lost == [] and seen(a).lost == []


async def test_a_dead_owner_is_still_judged_after_a_pause(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """Not judging the living must not spare the dead: an owner that never renews again is
    judged once the judge has renewed continuously for a whole lease after the pause."""
    b = await stores("B", lease_ttl=LEASE)
    doomed = open_redis(own_redis.url, "doomed", Recorder(), lease_ttl=LEASE)
    await doomed.open()
    execution = Execution("sleep", None, "doomed")
    await doomed.create(execution)
    for task in doomed._tasks:  # it dies: no renewal, no close
        task.cancel()
    await asyncio.gather(*doomed._tasks, return_exceptions=True)
    doomed._tasks = []
    pause(own_redis)
    await asyncio.sleep(LEASE * 2)
    resumed = time.monotonic()
    resume(own_redis)

    async def lost() -> bool:
        try:
            found = await b.get(execution.execution_id)
        except StoreUnavailable:
            return False
        return found is not None and found.status is ExecutionStatus.LOST

    await eventually(lost, timeout=BOUND)
    assert time.monotonic() - resumed >= LEASE * 0.9  # B renewed a whole lease first
    # Counted once, by B: the move may be its renewal's, whose reply (on the probe's own
    # connection) can come a moment after the read that saw it.
    await eventually(lambda: asyncio.sleep(0, bool(seen(b).lost)))
    assert seen(b).lost == [execution.execution_id]
    await closed(doomed)


# -- invariant 4: transient refusals are retried, never dropped --------------------------------


@pytest.mark.parametrize("refusal", ["oom", "readonly"])
async def test_an_end_refused_for_a_while_is_written_once_redis_accepts_it(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]], refusal: str
) -> None:
    a = await stores("A")
    b = await stores("B")
    execution = Execution("sleep", None, "A")
    await a.create(execution)
    if refusal == "oom":
        assert own_redis.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
        assert own_redis.command("CONFIG", "SET", "maxmemory", "1") == b"+OK\r\n"
    else:  # a primary demoted during a failover; the dead port keeps it a replica
        assert own_redis.command("REPLICAOF", "127.0.0.1", "1") == b"+OK\r\n"
    try:
        execution.finish(ExecutionStatus.SUCCEEDED, result={"big": "x" * 10_000})
        a.end(execution)
        await eventually(lambda: asyncio.sleep(0, refusal in seen(a).retries))
        assert not await a.recorded(execution, 0.2)
        assert len(a._outbox), "the end left the outbox while Redis refused it"
        assert not a.up  # readiness 503 while writes are refused
    finally:
        if refusal == "oom":
            own_redis.command("CONFIG", "SET", "maxmemory", "0")
        else:
            own_redis.command("REPLICAOF", "NO", "ONE")
    assert await a.recorded(execution, BOUND)
    found = await b.get(execution.execution_id)
    assert found is not None and found.status is ExecutionStatus.SUCCEEDED
    assert a._outbox.failed == [] and a.fenced == 0
    assert await a.flush(time.monotonic() + 1) == []


# -- invariant 1: told means final ------------------------------------------------------------


async def test_recorded_tells_written_from_fenced(
    stores: Callable[..., Awaitable[RedisStore]], own_redis: RedisServer
) -> None:
    a = await stores("A")
    written, fenced = Execution("sleep", None, "A"), Execution("sleep", None, "A")
    await a.create(written)
    await a.create(fenced)
    # Another attempt took `fenced` over meanwhile: this attempt's end must not count.
    key = a.keys.record(fenced.execution_id)
    assert own_redis.command("HSET", key, "attempt", "2")
    for execution in (written, fenced):
        execution.finish(ExecutionStatus.SUCCEEDED, result=1)
        a.end(execution)
    assert await a.recorded(written, BOUND) is True
    assert await a.recorded(fenced, BOUND) is False
    assert a.fenced == 1


# -- invariant 3: accepted means it runs --------------------------------------------------------


@pytest.mark.parametrize("adopted", [True, False])
async def test_a_create_whose_answer_was_lost_runs_or_ends_visibly(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]], adopted: bool
) -> None:
    """A create sent while Redis is paused times out (the start answers 503), but Redis
    runs it on resume: the record exists, `running` under a live owner. The owner either
    runs it after all (its registry still has it) or, its body never having started, puts
    it on the queue for its first run on any replica, with the body the registry kept;
    never `running` for good with no task anywhere, never `failed` unrun. (The lease
    outlasts the pause: past it, the create would be refused when it runs, A's lease
    having lapsed.)"""
    a = await stores("A", lease_ttl=8.0)
    b = await stores("B", lease_ttl=8.0)
    adoptions: list[str] = []

    def adopt(execution_id: str) -> bool:
        adoptions.append(execution_id)
        return adopted

    a.deliver_orphans(lambda execution_id: execution_id in adoptions and adopted, adopt)
    execution = Execution("sleep", None, "A")
    pause(own_redis)
    try:
        with pytest.raises(StoreUnavailable):
            await a.create(execution)
    finally:
        resume(own_redis)
    execution.body = {"seconds": 0.25}  # as the registry keeps it for a start refused so

    async def settled() -> Execution | None:
        try:
            found = await b.get(execution.execution_id)
        except StoreUnavailable:
            return None
        if adopted:
            return found if adoptions else None
        return found if found is not None and found.status is ExecutionStatus.QUEUED else None

    found = await eventually(settled, timeout=BOUND)
    assert adoptions == [execution.execution_id]
    if adopted:
        assert found.status is ExecutionStatus.RUNNING and found.replica == "A"
    else:
        assert (found.replica, found.attempt) == ("", 1)
        claimed = await b.claim()
        assert claimed is not None and claimed.execution_id == execution.execution_id
        assert (claimed.replica, claimed.attempt, claimed.body) == ("B", 1, {"seconds": 0.25})


async def needs_key(key: str) -> dict[str, str]:
    """A reasoner whose input has a required field: run with no input, it fails to bind."""
    return {"key": key}


@pytest.mark.parametrize("put_back_by", ["repair", "close"])
async def test_a_start_cut_while_redis_runs_its_create_runs_once_elsewhere_with_its_input(
    own_redis: RedisServer, put_back_by: str
) -> None:
    """Accepted work runs with the input it was accepted with. A synchronous start of a
    plain reasoner (not resumable) whose request is cut while its create is on its way (the
    listener's close at shutdown cuts it: 503 + Location; or its client left), Redis
    running the create all the same: the record is `running` under A with no task. Put back
    on the queue by A's repair while A lives, or at A's close (a rolled replica), its first
    run elsewhere binds the request's own input: never no input at all (which fails a
    required field, `failed` though nothing of it ran)."""
    proxy = CutProxy(own_redis.port)
    proxy.start()
    a = open_redis(proxy.url, "A", Recorder(), lease_ttl=8.0)
    b = open_redis(own_redis.url, "B", Recorder(), lease_ttl=8.0)
    await a.open()
    await b.open()
    try:
        registry = InFlightRegistry(a, max_inflight=10)
        a.deliver_orphans(registry.runs, registry.adopt)
        reasoner = Reasoner(needs_key, ReasonerOptions("needs_key"))
        body = {"key": "k-1"}
        announced: list[Execution] = []
        proxy.stall(b"", 1.0)  # every reply A reads is late: its create's too
        start = asyncio.create_task(
            registry.start_once(reasoner, reasoner.bind(body), body=body, announce=announced.append)
        )

        async def created() -> Execution | None:  # by Redis, read past the proxy
            return None if not announced else await b.get(announced[0].execution_id)

        record = await eventually(created, timeout=BOUND)
        assert record.status is ExecutionStatus.RUNNING and not start.done()
        start.cancel()  # the caller is cut: its create's answer is never read
        with pytest.raises(asyncio.CancelledError):
            await start
        proxy.unstall()
        if put_back_by == "close":
            await closed(a)

        async def queued() -> Execution | None:
            found = await b.get(record.execution_id)
            assert found is not None
            return found if found.status is ExecutionStatus.QUEUED else None

        found = await eventually(queued, timeout=BOUND)
        assert (found.replica, found.attempt) == ("", 1)
        assert not registry.runs(record.execution_id)
        claimed = await b.claim()
        assert claimed is not None and claimed.execution_id == record.execution_id
        assert (claimed.attempt, claimed.body) == (1, body)
        assert reasoner.bind(claimed.body) == {"key": "k-1"}
    finally:
        await closed(b)
        await closed(a)
        proxy.stop()


@pytest.mark.parametrize("body", [{"seconds": 0.25}, None])
async def test_a_claim_redis_ran_after_its_answer_was_given_up_is_queued_again(
    own_redis: RedisServer,
    stores: Callable[..., Awaitable[RedisStore]],
    body: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Accepted work is never failed unrun: a claim sent while Redis is paused gets no
    answer (the taker starts nothing), but Redis runs it on resume and marks the queued
    start `running` under A. A's repair knows the claim by its token: the execution goes
    back to the queue with its attempt unchanged, and the next claim takes it as attempt 1
    with its body; never handed to attempt 2 (which a non-resumable reasoner refuses) nor
    `failed`. (The lease outlasts the pause: past it the claim would be refused when it
    runs, A's lease having lapsed.)"""
    a = await stores("A", lease_ttl=8.0)
    b = await stores("B", lease_ttl=8.0)
    a.deliver_orphans(lambda _: False, lambda _: pytest.fail("nothing to adopt"))
    execution = Execution("sleep", None, "B")
    execution.body = body
    execution.enqueue(None)
    assert await b.create(execution, max_queued=10) is None
    pause(own_redis)
    try:
        with pytest.raises(StoreUnavailable):
            await a.claim()
    finally:
        resume(own_redis)

    async def repaired() -> Execution | None:
        # A's repair has found it (a line naming it), and written what it decided.
        if not any(execution.execution_id in line for line in caplog.messages):
            return None
        try:
            found = await b.get(execution.execution_id)
        except StoreUnavailable:
            return None
        return None if found is None or found.status is ExecutionStatus.RUNNING else found

    found = await eventually(repaired, timeout=BOUND)
    assert (found.status, found.replica, found.attempt) == (ExecutionStatus.QUEUED, "", 1)
    claimed = await b.claim()
    assert claimed is not None and claimed.execution_id == execution.execution_id
    assert (claimed.replica, claimed.attempt, claimed.body) == ("B", 1, body)


async def test_a_create_that_never_reached_redis_stays_absent(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """Settling a create that got no answer voids it: even if the command were to run
    later, no record would appear for a start the client was refused."""
    a = await stores("A", lease_ttl=LEASE)
    execution = Execution("sleep", None, "A")
    execution.take = a._liveness.start_token()  # the create sent, never answered
    a._liveness.doubt(execution, 1)
    a.deliver_orphans(lambda _: False, lambda _: pytest.fail("nothing to adopt"))
    await eventually(lambda: asyncio.sleep(0, not a._liveness.in_doubt), timeout=BOUND)
    with pytest.raises(StoreUnavailable):
        await a.create(execution)
    assert await a.get(execution.execution_id) is None


async def test_an_owner_whose_lease_lapsed_takes_no_new_work_until_it_renews(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """A replica paused past its lease is being judged; work it accepted on waking, before
    its first renewal, would be judged at once. Its create is refused (a 503 the client
    retries) and it renews at once."""
    a = await stores("A", lease_ttl=30.0)  # no renewal of its own during the test
    # The renewal at open and the one the keep-alive makes at once have both been made
    # (a later one would undo what follows).
    await eventually(lambda: asyncio.sleep(0, len(seen(a).alive) >= 2))
    assert own_redis.command("ZADD", a.keys.replicas, "1", "A")
    with pytest.raises(StoreUnavailable, match="lease lapsed"):
        await a.create(Execution("sleep", None, "A"))
    assert await a.claim() is None

    async def created() -> bool:
        try:
            await a.create(Execution("sleep", None, "A"))
        except StoreUnavailable:
            return False
        return True

    assert await eventually(created, timeout=BOUND)
    assert not a._liveness.in_doubt  # a refusal is an answer: nothing to settle


# -- the pub/sub reader survives ---------------------------------------------------------------


async def test_the_subscriber_survives_a_reset_and_rereads(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """The subscriber's connection is reset (a proxy cutting it, Redis killing it): it
    reconnects, and every waiter re-reads, so an end whose notice was lost still wakes it;
    a message it cannot handle is logged, never the end of the reader."""
    a = await stores("A")
    b = await stores("B")
    reader = next(task for task in b._tasks if task.get_name() == "store-pubsub")
    execution = Execution("sleep", None, "A")
    await a.create(execution)
    waiting = asyncio.ensure_future(b.wait(execution, BOUND))
    await eventually(lambda: asyncio.sleep(0, execution.execution_id in b._notices.waiters))
    b._notices.dispatch(b.keys.ends, "[not json")  # a malformed notice: logged, nothing more
    b._notices.dispatch(b.keys.cancel(b.replica_id), "{}")
    assert own_redis.command("CLIENT", "KILL", "TYPE", "pubsub")  # every subscriber reset
    execution.finish(ExecutionStatus.SUCCEEDED, result=2)
    a.end(execution)
    ended = await asyncio.wait_for(waiting, BOUND)
    assert ended.status is ExecutionStatus.SUCCEEDED
    assert not reader.done()
    await eventually(lambda: asyncio.sleep(0, b.up))


# -- invariant 5: no request takes a replica out ------------------------------------------


async def test_a_slow_command_fails_alone_and_the_store_stays_up(
    own_redis: RedisServer,
) -> None:
    """Readiness is reachability, not one request's cost: a read whose reply is held past
    the command timeout fails (503 for its caller), while the store stays up and every other
    command is served; only the probe failing (Redis paused) turns the store down."""
    proxy = CutProxy(own_redis.port)
    proxy.start()
    a = open_redis(proxy.url, "A", Recorder(), lease_ttl=LEASE)
    try:
        await a.open()
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        a.emit(execution, Event(1, "progress", '"slow-reply-marker"'))
        await eventually(lambda: a.events_since(execution.execution_id, 0, 10))
        proxy.stall(b"slow-reply-marker", COMMAND_TIMEOUT + 1.0)
        read = asyncio.create_task(a.events_since(execution.execution_id, 0, 10))
        samples = 0
        while not read.done():  # bounded: the read times out after COMMAND_TIMEOUT
            assert a.up, "a slow read turned the store down"
            assert await a.get(execution.execution_id) is not None  # the others flow
            samples += 1
            await asyncio.sleep(0.05)
        with pytest.raises(StoreUnavailable):
            await read
        assert proxy.stalled >= 1 and samples > 10
        assert a.up and False not in seen(a).ups
        # The probe's failure is what turns it down: Redis paused.
        pause(own_redis)
        await eventually(lambda: asyncio.sleep(0, not a.up), timeout=LEASE + 3 * COMMAND_TIMEOUT)
        resume(own_redis)
        await eventually(lambda: asyncio.sleep(0, a.up), timeout=LEASE + 2 * COMMAND_TIMEOUT)
    finally:
        resume(own_redis)
        await closed(a)
        proxy.stop()


async def test_a_list_page_stops_at_its_byte_budget_in_the_script(
    stores: Callable[..., Awaitable[RedisStore]],
) -> None:
    """Redis stops reading records once the page's bytes are spent (one record past the
    budget at most), instead of sending every big result for the API to cut; a session's
    release reads statuses only."""
    a = await stores("A")
    big = "x" * 300_000
    for _ in range(30):  # 9 MB of results
        execution = Execution("sleep", "s1", "A")
        await a.create(execution)
        execution.finish(ExecutionStatus.SUCCEEDED, result=big)
        a.end(execution)
        assert await a.recorded(execution, BOUND)
    page = await a.list_executions(limit=1000, max_bytes=1_000_000)
    assert 3 <= len(page) <= 5, len(page)
    assert all(e.result == big for e in page)
    assert len(await a.list_executions(limit=1000)) == 30  # no budget: everything
    session = await a.session("s1")
    assert len(session) == 30 and all(e.result is None for e in session)


@pytest.mark.parametrize("kind", ["memory", "redis"])
async def test_retention_weighs_as_well_as_counts(
    kind: str, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """`--max-retained-bytes`: finished records past the budget of results and errors go,
    oldest first, on both stores; the newest stays even when it alone is over."""
    from agent_server.store.base import ExecutionStore
    from agent_server.store.memory import MemoryStore

    budget = 1_000_000
    store: ExecutionStore
    if kind == "memory":
        store = MemoryStore("A", max_retained_bytes=budget)
    else:
        store = await stores("A", max_retained_bytes=budget)
    ids = []
    for index in range(12):  # 12 x 200 kB: 2.4 MB of results
        execution = Execution("sleep", None, "A")
        await store.create(execution)
        execution.finish(ExecutionStatus.SUCCEEDED, result="r" * 200_000 + str(index))
        store.end(execution)
        assert await store.recorded(execution, BOUND)
        ids.append(execution.execution_id)
    kept = [e.execution_id for e in await store.list_executions(limit=100)]
    assert 3 <= len(kept) <= 5, len(kept)
    assert kept == list(reversed(ids))[: len(kept)]  # the newest, newest first
    huge = Execution("sleep", None, "A")
    await store.create(huge)
    huge.finish(ExecutionStatus.SUCCEEDED, result="h" * 3_000_000)
    store.end(huge)
    assert await store.recorded(huge, BOUND)
    found = await store.get(huge.execution_id)
    assert found is not None and found.result == "h" * 3_000_000
    assert [e.execution_id for e in await store.list_executions(limit=100)] == [huge.execution_id]


async def test_big_ends_leave_the_outbox_in_bounded_batches(
    stores: Callable[..., Awaitable[RedisStore]],
) -> None:
    """Twenty ends of 3 MB finishing together: written in pipelines of about 4 MiB, each
    within the command timeout, not one of 60 MB that times out and turns the replica
    unready (and then again, for ever)."""
    a = await stores("A")
    executions = [Execution("sleep", None, "A") for _ in range(20)]
    for execution in executions:
        await a.create(execution)
    batches: list[int] = []
    original = a._outbox.batch

    def watched(*args: Any) -> list[Any]:
        batch = original(*args)
        batches.append(len(batch))
        return batch

    a._outbox.batch = watched  # type: ignore[method-assign]
    for execution in executions:
        execution.finish(ExecutionStatus.SUCCEEDED, result="y" * 3_000_000)
        a.end(execution)
    for execution in executions:
        assert await a.recorded(execution, BOUND)
    assert max(batches) <= 2, batches
    assert a.up and not a._outbox.failed


async def test_the_listener_s_close_ends_a_wait_for_an_end_still_owed(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """`recorded` with the close as its way out: an end owed to a paused Redis is not told
    once the listener closes (False at the close, long before the timeout, and at once when
    it closed already), and the wait leaves nothing with the close; once written, it is."""
    a = await stores("A")
    execution = Execution("sleep", None, "A")
    await a.create(execution)
    pause(own_redis)
    try:
        execution.finish(ExecutionStatus.SUCCEEDED, result={"n": 1})
        a.end(execution)
        closing = Closing()
        waiting = asyncio.ensure_future(a.recorded(execution, 60.0, closing))
        await asyncio.sleep(0.05)
        assert not waiting.done() and len(closing.waiters) == 1
        began = time.monotonic()
        closing.set()
        assert await asyncio.wait_for(waiting, 5) is False
        assert time.monotonic() - began < 1.0 and not closing.waiters
        assert await asyncio.wait_for(a.recorded(execution, 60.0, closing), 1) is False
    finally:
        resume(own_redis)
    assert await a.recorded(execution, BOUND, Closing())


async def _created(store: RedisStore, count: int) -> list[Execution]:
    """`count` executions of A's, created fifty at a time."""
    executions = [Execution("sleep", None, "A") for _ in range(count)]
    for start in range(0, count, 50):
        await asyncio.gather(*(store.create(e) for e in executions[start : start + 50]))
    return executions


async def test_a_backlog_of_ends_leaves_in_few_round_trips_of_short_calls(
    stores: Callable[..., Awaitable[RedisStore]],
) -> None:
    """A drain's backlog, ends owed at once: they go many calls to a round trip (not one
    round trip per hundred ends, the rate that left ends unrecorded at shutdown), while each
    call of the end script stays short (at most END_CALL ends and about END_CALL_BYTES of
    arguments: a script holds Redis for every other client) and each pipeline within about
    END_BATCH_BYTES."""
    from agent_server.store.redis.outbox import (
        END_BATCH_BYTES,
        END_CALL,
        END_CALL_BYTES,
    )
    from agent_server.store.redis.scripts import FCALL

    a = await stores("A")
    small = await _created(a, 1_500)
    big = await _created(a, 24)
    pipelines: list[list[tuple[int, int]]] = []  # per pipeline, (ends, bytes) of each call
    original = a._link.scripts.send

    original_now = a._link.scripts.send_now

    def watch(commands: Any) -> None:
        calls = []
        for command in commands:
            if tuple(command[:2]) == FCALL["end"]:
                ends = (command[2] - 6) // 3
                size = sum(len(arg) for arg in command[3 + command[2] + 4 :])
                calls.append((ends, size))
        pipelines.append(calls)

    async def watched(commands: Any) -> list[Any]:
        watch(commands)
        return await original(commands)

    def watched_now(commands: Any) -> list[Any] | None:
        futures = original_now(commands)
        if futures is not None:  # sent within the turn that owed them
            watch(commands)
        return futures

    a._link.scripts.send = watched  # type: ignore[method-assign]
    a._link.scripts.send_now = watched_now  # type: ignore[method-assign]
    for index, execution in enumerate(small):
        execution.finish(ExecutionStatus.SUCCEEDED, result=index)
        a.end(execution)
        if index % 500 == 250:  # big ends among the small: each call still bounded in bytes
            for other in big[index // 500 * 8 : index // 500 * 8 + 8]:
                other.finish(ExecutionStatus.SUCCEEDED, result="z" * 400_000)
                a.end(other)
    for execution in (*small, *big):
        assert await a.recorded(execution, BOUND)
    calls = [call for pipeline in pipelines for call in pipeline]
    assert sum(ends for ends, _ in calls) == len(small) + len(big)
    assert len(pipelines) <= 6, [len(p) for p in pipelines]  # 1,524 ends: 16 before
    assert max(ends for ends, _ in calls) <= END_CALL
    assert all(size <= END_CALL_BYTES or ends == 1 for ends, size in calls), calls
    assert all(sum(size for _, size in p) <= END_BATCH_BYTES for p in pipelines)
    assert a.up and not a._outbox.failed and not a._outbox.overflow


def _recorded_now(redis: RedisServer, store: RedisStore) -> int:
    """How many ends Redis holds now (`finished`), asked on a connection of its own and
    without the loop: the test's own turn is still going on."""
    reply = redis.command("ZCARD", store.keys.finished)
    assert reply is not None and reply.startswith(b":"), reply
    return int(reply[1:].strip())


async def test_a_backlog_owed_in_one_loop_turn_is_written_while_the_turn_goes_on(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """A drain ends tens of thousands of executions in one loop turn (every reasoner waiting
    for the drain returns in it: seconds at 100,000). Their ends reach Redis while that turn
    goes on, not after it: otherwise the turn's length is added to the flush's, and at
    100,000 the two no longer fit the bound (bench/RESULTS.md, D43)."""
    from agent_server.store.redis.outbox import EAGER_BATCH

    a = await stores("A")
    executions = await _created(a, 3_000)
    for index, execution in enumerate(executions):
        execution.finish(ExecutionStatus.SUCCEEDED, result={"n": index})
    assert _recorded_now(own_redis, a) == 0
    for execution in executions:  # one loop turn, from here ...
        a.end(execution)
    deadline = time.monotonic() + BOUND
    while _recorded_now(own_redis, a) < len(executions) - EAGER_BATCH:
        assert time.monotonic() < deadline, _recorded_now(own_redis, a)
        time.sleep(0.01)  # noqa: ASYNC251 - ... to here: the loop held since the first end
    for execution in executions:
        assert await a.recorded(execution, BOUND)
    assert _recorded_now(own_redis, a) == len(executions)
    assert len(a._outbox) == 0 and not a._outbox.failed and a.fenced == 0


async def test_a_backlog_in_flight_when_its_connection_drops_is_written_again(
    own_redis: RedisServer, stores: Callable[..., Awaitable[RedisStore]]
) -> None:
    """Writes a loop turn sent itself, unanswered when the connection drops: Redis may have
    run some of them. Each stays owed until Redis answers for it, and is written again
    (the same attempt's end again is a success, never a fence): every end recorded once,
    as sent, nothing set aside."""
    a = await stores("A")
    executions = await _created(a, 2_000)
    for index, execution in enumerate(executions):
        execution.finish(ExecutionStatus.SUCCEEDED, result={"n": index})
    for execution in executions:
        a.end(execution)
    assert a._outbox._flight, "the backlog was not sent within the turn"
    killed = own_redis.command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
    assert killed is not None and killed.startswith(b":"), killed
    for execution in executions:
        assert await a.recorded(execution, BOUND)
    assert _recorded_now(own_redis, a) == len(executions)
    assert a.fenced == 0 and not a._outbox.failed and not a._outbox.overflow
    for execution in (executions[0], executions[999], executions[-1]):
        got = await a.get(execution.execution_id)
        assert got is not None and got.status is ExecutionStatus.SUCCEEDED
        assert got.result == execution.result


async def test_the_outbox_holds_an_end_for_every_execution_that_may_be_in_flight(
    own_redis: RedisServer,
) -> None:
    """More executions in flight than OUTBOX_LIMIT (`--max-inflight` above it) all ending
    while Redis cannot answer: every end waits in the outbox (none set aside as unrecorded)
    and is written once Redis answers again."""
    from agent_server.store import open_store
    from agent_server.store.redis import OUTBOX_LIMIT

    count = OUTBOX_LIMIT + 300
    store = open_store(
        own_redis.url,
        replica_id="A",
        agent_name="faults",
        result_ttl=600.0,
        max_retained=2 * count,
        lease_ttl=30.0,
        max_inflight=count,
    )
    assert isinstance(store, RedisStore)
    await store.open()
    try:
        executions = await _created(store, count)
        pause(own_redis)
        try:
            for execution in executions:
                execution.finish(ExecutionStatus.SUCCEEDED, result="kept")
                store.end(execution)
            assert not store._outbox.overflow
            assert not any(e.recorded is not None and e.recorded.done() for e in executions)
        finally:
            resume(own_redis)
        for execution in executions:
            assert await store.recorded(execution, 30.0)
        assert await store.flush(time.monotonic() + 1.0) == []
    finally:
        await closed(store)
