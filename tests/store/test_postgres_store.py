"""What only a shared store has, on Postgres: `lost` judged once on the database's clock,
fenced writes, the outbox through an outage, hand-offs and queued work claimed once, keys
and limits across replicas, events capped, and the schema's versions.

The Redis twins of these tests are in test_store_contract.py; here two or three
`PostgresStore`s with different replica ids share one real Postgres (started by the
fixtures as an unprivileged user) and one agent name. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_server.model.context import StaleAttempt
from agent_server.model.events import Event
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.store import ExecutionStore, SchemaTooNew, StoreUnavailable
from agent_server.store.base import Idempotency, IdempotencyForgotten, IdempotencyMismatch
from agent_server.store.postgres import PostgresStore
from tests.support.faults import CutProxy
from tests.support.postgres_server import PostgresServer
from tests.support.process import free_port
from tests.support.stores import (
    AGENT,
    COMMITTED,
    Recorder,
    closed,
    eventually,
    open_postgres,
    proxied,
    resumable,
)


async def terminal(store: ExecutionStore, execution_id: str) -> Execution | None:
    found = await store.get(execution_id)
    return found if found is not None and found.is_terminal else None


async def wait_status(
    store: ExecutionStore, execution_id: str, status: ExecutionStatus
) -> Execution:
    async def reached() -> Execution | None:
        found = await store.get(execution_id)
        return found if found is not None and found.status is status else None

    found: Execution = await eventually(reached)
    return found


OWNER = """
import asyncio, pathlib, sys
from agent_server.model.execution import Execution
from agent_server.store.postgres import PostgresStore

async def main():
    store = PostgresStore(sys.argv[1], replica_id="doomed", agent_name=sys.argv[2], lease_ttl=0.3)
    await store.open()
    execution = Execution("sleep", "s1", "doomed")
    await store.create(execution)
    pathlib.Path(sys.argv[3]).write_text(execution.execution_id)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.fixture
def doomed(postgres_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    started = tmp_path / "started"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, postgres_url, AGENT, str(started)])
    yield owner, started
    owner.kill()
    owner.wait(timeout=5.0)


async def test_a_killed_owner_s_work_reads_lost_once(
    postgres_url: str, doomed: tuple[subprocess.Popen[bytes], Path]
) -> None:
    """kill -9 of the owner: two other replicas reading concurrently both see `lost`
    within a lease (and slack), and the move is counted once between them."""
    owner, started = doomed
    b_seen, c_seen = Recorder(), Recorder()
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=0.3)
    c = open_postgres(postgres_url, "C", c_seen, lease_ttl=0.3)
    try:
        await eventually(lambda: asyncio.sleep(0, started.exists()), timeout=15.0)
        execution_id = started.read_text()
        await b.open()
        await c.open()
        running = await b.get(execution_id)
        assert running is not None and running.status is ExecutionStatus.RUNNING
        owner.kill()
        await eventually(lambda: asyncio.sleep(0, owner.poll() is not None))
        killed = time.monotonic()
        found_b, found_c = await asyncio.gather(
            eventually(lambda: terminal(b, execution_id)),
            eventually(lambda: terminal(c, execution_id)),
        )
        assert time.monotonic() - killed < 0.3 + 1.5
        for found in (found_b, found_c):
            assert found.status is ExecutionStatus.LOST
            assert found.error == {
                "type": "ExecutionLost",
                "message": "replica doomed stopped renewing its liveness",
            }
            assert found.finished_at is not None
        assert [e.execution_id for e in await b.session("s1")] == [execution_id]
        lost = await c.list_executions(status=ExecutionStatus.LOST, limit=10)
        assert [e.execution_id for e in lost] == [execution_id]
        renewed = len(b_seen.alive), len(c_seen.alive)
        await eventually(
            lambda: asyncio.sleep(
                0, len(b_seen.alive) > renewed[0] + 2 and len(c_seen.alive) > renewed[1] + 2
            )
        )
        assert len(b_seen.lost) + len(c_seen.lost) == 1
    finally:
        await closed(b)
        await closed(c)


async def test_the_sweep_shows_lost_without_a_read(postgres_url: str) -> None:
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(postgres_url, "A", a_seen)
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=0.3)
    await a.open()
    await b.open()
    try:
        executions = [Execution("sleep", None, "A") for _ in range(3)]
        for execution in executions:
            await a.create(execution)
        await eventually(lambda: asyncio.sleep(0, 2 in b_seen.alive))
        await closed(a)  # its liveness ends now; its running work is lost
        await eventually(lambda: asyncio.sleep(0, len(b_seen.lost) == 3))
        assert sorted(b_seen.lost) == sorted(e.execution_id for e in executions)
        await eventually(lambda: asyncio.sleep(0, b_seen.alive[-1] == 1))
        lost = await b.list_executions(status=ExecutionStatus.LOST, limit=10)
        assert len(lost) == 3 and len(b_seen.lost) == 3
    finally:
        await closed(a)
        await closed(b)


async def test_a_replica_judges_others_only_after_a_whole_lease_up(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    """Right after it reached Postgres a replica does not yet declare others' work lost:
    their owners renew first."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(postgres_url, "A", a_seen, lease_ttl=60.0)
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=1.0)
    await a.open()
    opened = time.monotonic()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        expire(postgres_server, "A", "1970-01-01 00:00:01+00")
        early = await b.get(execution.execution_id)
        assert early is not None
        assert early.status is ExecutionStatus.RUNNING or time.monotonic() - opened >= 1.0
        await wait_status(b, execution.execution_id, ExecutionStatus.LOST)
        assert time.monotonic() - opened >= 1.0
        assert b_seen.lost == [execution.execution_id]
    finally:
        await closed(a)
        await closed(b)


def expire(server: PostgresServer, replica: str, when: str) -> None:
    """The replica's lease lapsed (as if time had passed), behind the store's back."""
    server.admin(
        f"UPDATE replicas SET expires_at = '{when}' WHERE replica = '{replica}'",
        database="agents",
    )


async def test_an_end_written_after_lost_is_refused_and_counted(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(postgres_url, "A", a_seen, lease_ttl=60.0)
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=0.3)
    await a.open()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        expire(postgres_server, "A", "epoch")
        await wait_status(b, execution.execution_id, ExecutionStatus.LOST)
        assert b_seen.lost == [execution.execution_id]
        execution.finish(ExecutionStatus.SUCCEEDED, result="late")
        a.end(execution)
        assert not await a.recorded(execution, 5.0)
        assert a_seen.fenced == [execution.execution_id]
        again = await b.get(execution.execution_id)
        assert again is not None and again.status is ExecutionStatus.LOST
        assert again.result is None
        assert await a.flush(time.monotonic() + 1.0) == []  # refused is not unrecorded
    finally:
        await closed(a)
        await closed(b)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A Postgres of this test's own, which it may stop, kill and start again."""
    server = PostgresServer()
    yield server
    server.remove()


async def test_ends_wait_in_the_outbox_during_an_outage(own_postgres: PostgresServer) -> None:
    """Postgres stops; reads fail fast (StoreUnavailable), readiness goes down; the end
    waits locally; Postgres comes back (same data) and the end is written, fenced as
    usual, and readiness is back."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(own_postgres.url, "A", a_seen)
    b = open_postgres(own_postgres.url, "B", b_seen)
    await a.open()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        assert a.up
        own_postgres.kill()
        with pytest.raises(StoreUnavailable):
            await b.get(execution.execution_id)
        assert not b.up and b_seen.ups[-1] is False
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            await b.create(Execution("echo", None, "B"))
        assert time.monotonic() - started < 6.0
        execution.finish(ExecutionStatus.SUCCEEDED, result="kept")
        a.end(execution)
        await eventually(lambda: asyncio.sleep(0, not a.up))
        own_postgres.start()
        back = time.monotonic()

        async def written() -> Execution | None:
            try:
                return await terminal(b, execution.execution_id)
            except StoreUnavailable:
                return None

        found = await eventually(written, timeout=10.0)
        assert found.status is ExecutionStatus.SUCCEEDED and found.result == "kept"
        await eventually(lambda: asyncio.sleep(0, a.up and b.up), timeout=10.0)
        assert time.monotonic() - back < 10.0
        assert a_seen.ups[-2:] == [False, True]
        assert a_seen.fenced == []
        assert await a.flush(time.monotonic() + 1.0) == []
    finally:
        await closed(a)
        await closed(b)


async def test_flush_returns_what_could_not_be_written_by_its_deadline(
    own_postgres: PostgresServer,
) -> None:
    a = open_postgres(own_postgres.url, "A", Recorder())
    await a.open()
    try:
        first, second = Execution("sleep", None, "A"), Execution("sleep", None, "A")
        await a.create(first)
        await a.create(second)
        own_postgres.kill()
        for execution in (first, second):
            execution.finish(ExecutionStatus.SUCCEEDED)
            a.end(execution)
        started = time.monotonic()
        unrecorded = await a.flush(started + 0.5)
        assert time.monotonic() - started < 2.0
        assert {e.execution_id for e in unrecorded} == {first.execution_id, second.execution_id}
    finally:
        await closed(a)


async def test_open_fails_fast_naming_the_host_never_the_password() -> None:
    port = free_port()  # nothing listens there
    store = PostgresStore(
        f"postgresql://user:s3cret-pw@127.0.0.1:{port}/agents", replica_id="A", agent_name=AGENT
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    assert time.monotonic() - started < 8.0
    message = str(caught.value)
    assert f"127.0.0.1:{port}/agents" in message
    assert "s3cret" not in message and "user" not in message
    assert not store.up
    await store.close()


async def test_a_hand_off_is_claimed_once_with_its_body_and_checkpoint(postgres_url: str) -> None:
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(postgres_url, "A", a_seen)
    b = open_postgres(postgres_url, "B", b_seen)
    c = open_postgres(postgres_url, "C", Recorder())
    for store in (a, b, c):
        await store.open()
    try:
        execution = resumable("A")
        await a.create(execution)
        await a.checkpoint(execution, '{"done": 2}')
        execution.mark_queued()
        a.hand_off(execution)
        queued = await wait_status(b, execution.execution_id, ExecutionStatus.QUEUED)
        assert (queued.attempt, queued.replica) == (2, "")
        claims = await asyncio.gather(b.claim(), c.claim())  # concurrently: one takes it
        claimed = [found for found in claims if found is not None]
        assert len(claimed) == 1
        taken = claimed[0]
        assert taken.execution_id == execution.execution_id
        assert (taken.attempt, taken.status) == (2, ExecutionStatus.RUNNING)
        assert taken.body == {"count": 3} and taken.checkpoint == '{"done": 2}'
        assert await a.claim() is None
        with pytest.raises(StaleAttempt):
            await a.checkpoint(execution, '{"done": 3}')
        assert a_seen.fenced == [execution.execution_id]
        owner = b if claims[0] is not None else c
        assert await owner.begin(taken)
        taken.finish(ExecutionStatus.SUCCEEDED, result="fresh")
        owner.end(taken)
        ended = await wait_status(a, execution.execution_id, ExecutionStatus.SUCCEEDED)
        assert ended.result == "fresh"
    finally:
        for store in (a, b, c):
            await closed(store)


async def test_a_dead_owner_s_resumable_work_is_queued_as_its_next_attempt(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    a = open_postgres(postgres_url, "A", Recorder(), lease_ttl=60.0)
    b_seen = Recorder()
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=0.3)
    await a.open()
    await b.open()
    try:
        execution = resumable("A")
        await a.create(execution)
        expire(postgres_server, "A", "epoch")
        queued = await wait_status(b, execution.execution_id, ExecutionStatus.QUEUED)
        assert (queued.attempt, queued.replica) == (2, "")
        assert b_seen.lost == []
        taken = await eventually(b.claim, timeout=10.0)  # a loaded machine renews late
        assert taken.execution_id == execution.execution_id and taken.attempt == 2
    finally:
        await closed(a)
        await closed(b)


async def test_a_queued_execution_is_cancelled_by_any_replica(postgres_url: str) -> None:
    a = open_postgres(postgres_url, "A", Recorder())
    b = open_postgres(postgres_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        execution = resumable("A")
        await a.create(execution)
        execution.mark_queued()
        a.hand_off(execution)
        queued = await wait_status(b, execution.execution_id, ExecutionStatus.QUEUED)
        await b.request_cancel(queued, CancelReason.REQUEST, None)
        cancelled = await b.get(execution.execution_id)
        assert cancelled is not None
        assert (cancelled.status, cancelled.status_reason) == (
            ExecutionStatus.CANCELLED,
            CancelReason.REQUEST,
        )
        assert await a.claim() is None
    finally:
        await closed(a)
        await closed(b)


async def test_queued_work_of_a_session_being_released_is_not_claimed(postgres_url: str) -> None:
    a = open_postgres(postgres_url, "A", Recorder())
    b = open_postgres(postgres_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        execution = resumable("A", "s-rel")
        await a.create(execution)
        execution.mark_queued()
        a.hand_off(execution)
        await wait_status(b, execution.execution_id, ExecutionStatus.QUEUED)
        await b.begin_release("s-rel", 5.0)
        assert await b.claim() is None
        found = await b.get(execution.execution_id)
        assert found is not None
        assert (found.status, found.status_reason) == (
            ExecutionStatus.CANCELLED,
            CancelReason.SESSION_RELEASED,
        )
    finally:
        await closed(a)
        await closed(b)


async def test_a_delayed_start_is_due_no_sooner_than_its_delay_after_a_wait_for_its_turn(
    postgres_url: str,
) -> None:
    """A delayed start of a session waits in its transaction for the session's lock (another
    enqueue of a burst holds it): it is still due no sooner than its delay after it was
    asked, and no claim takes it before. `now()` is the transaction's start: a due time of
    `now()` plus what was left of the delay once the lock was got (or any slow statement
    before the insert) came early by that wait (`python -m bench.faults --store postgres`,
    five of seeds 301-310: bodies ran 50 to 130 ms before their delay)."""
    import psycopg

    a = open_postgres(postgres_url, "A", Recorder())
    await a.open()
    try:
        execution = Execution("echo", "s-burst", "A")
        asked = time.time()
        execution.enqueue(asked + 0.5)
        async with await psycopg.AsyncConnection.connect(postgres_url) as holder:
            await holder.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"{AGENT}\x1fsession\x1fs-burst",),
            )
            creating = asyncio.ensure_future(a.create(execution, max_queued=10))
            await asyncio.sleep(0.3)  # the other enqueue's transaction, holding the lock
            assert not creating.done()
            await holder.commit()
        await asyncio.wait_for(creating, 5.0)
        async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
            cursor = await conn.execute(
                "SELECT extract(epoch FROM due_at) FROM executions WHERE id = %s",
                (execution.execution_id,),
            )
            row = await cursor.fetchone()
        assert row is not None and row[0] is not None
        assert float(row[0]) >= asked + 0.5 - 0.005, float(row[0]) - asked
        assert execution.scheduled_at is not None
        assert execution.scheduled_at >= asked + 0.5 - 0.005
        while time.time() < asked + 0.45:
            claimed = await a.claim()
            assert claimed is None, f"claimed {time.time() - asked:.3f}s after it was asked"
            await asyncio.sleep(0.02)
    finally:
        await closed(a)


async def test_idempotency_keys_across_replicas(postgres_url: str) -> None:
    """The same key on two replicas at once starts one execution; a key used for another
    request is refused until it expires; a key whose execution was forgotten starts
    nothing."""
    a = open_postgres(postgres_url, "A", Recorder())
    b = open_postgres(postgres_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        key = Idempotency("k", "fingerprint", 60.0)
        first, second = Execution("echo", None, "A"), Execution("echo", None, "B")
        answers = await asyncio.gather(a.create(first, key), b.create(second, key))
        started = [e for e, answer in zip((first, second), answers, strict=True) if answer is None]
        assert len(started) == 1
        winner = started[0]
        assert {answer.execution_id for answer in answers if answer is not None} == {
            winner.execution_id
        }
        with pytest.raises(IdempotencyMismatch):
            await b.create(Execution("echo", None, "B"), Idempotency("k", "other", 60.0))
        winner.finish(ExecutionStatus.SUCCEEDED, result=1)
        (a if winner is first else b).end(winner)
        await eventually(lambda: terminal(a, winner.execution_id))
        assert await b.forget(winner.execution_id)
        with pytest.raises(IdempotencyForgotten):
            await a.create(Execution("echo", None, "A"), key)
        short = Idempotency("short", "one", 0.3)
        assert await a.create(Execution("echo", None, "A"), short) is None
        later = Execution("echo", None, "B")

        async def reusable() -> bool:
            try:
                return await b.create(later, Idempotency("short", "two", 0.3)) is None
            except IdempotencyMismatch:
                return False

        assert await eventually(reusable)
    finally:
        await closed(a)
        await closed(b)


async def test_a_concurrency_limit_holds_across_replicas(postgres_url: str) -> None:
    """Five queued executions of one key with a limit of two: three replicas claiming at
    once take two; an end frees a slot for one more."""
    stores = [open_postgres(postgres_url, name, Recorder()) for name in "ABC"]
    for store in stores:
        await store.open()
    try:
        made = []
        for _ in range(5):
            execution = Execution("limited", None, "")
            execution.concurrency_key, execution.concurrency_limit = "limit:limited:", 2
            execution.enqueue(None)
            await stores[0].create(execution, max_queued=100)
            made.append(execution)
        taken = [e for e in await asyncio.gather(*(s.claim() for s in stores)) if e is not None]
        taken += [e for e in await asyncio.gather(*(s.claim() for s in stores)) if e is not None]
        assert len(taken) == 2
        owner = next(s for s in stores if s.replica_id == taken[0].replica)
        taken[0].finish(ExecutionStatus.SUCCEEDED)
        owner.end(taken[0])
        assert await owner.recorded(taken[0], 5.0)
        third = [e for e in await asyncio.gather(*(s.claim() for s in stores)) if e is not None]
        assert len(third) == 1
    finally:
        for store in stores:
            await closed(store)


async def test_events_are_capped_per_execution_and_read_from_any_replica(
    postgres_url: str,
) -> None:
    a = open_postgres(postgres_url, "A", Recorder(), max_events=50)
    b = open_postgres(postgres_url, "B", Recorder(), max_events=50)
    await a.open()
    await b.open()
    try:
        execution = Execution("chatter", None, "A")
        await a.create(execution)
        for n in range(1, 121):
            a.emit(execution, Event(n, "progress", str(n)))
        execution.finish(ExecutionStatus.SUCCEEDED, result="ok")
        a.end(execution)
        assert await a.recorded(execution, 5.0)
        missed, kept = await b.events_since(execution.execution_id, 0, 1000)
        assert [e.id for e in kept] == list(range(71, 121))
        assert missed == 70
        assert kept[-1] == Event(120, "progress", "120")
    finally:
        await closed(a)
        await closed(b)


async def test_a_parked_ask_is_queued_by_its_answer_from_any_replica(postgres_url: str) -> None:
    from agent_server.model.asks import Found, Question

    a = open_postgres(postgres_url, "A", Recorder())
    b = open_postgres(postgres_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        execution = resumable("A")
        await a.create(execution)
        request = {"request_id": 1, "prompt": "ok?", "schema": None}
        reply = await a.ask(execution, Question(request, "ok", "ok?"), True, None)
        assert reply.found is Found.PARKED
        parked = await wait_status(b, execution.execution_id, ExecutionStatus.INPUT_REQUIRED)
        assert parked.owned_by_nobody and parked.input_request == request
        assert await b.answer(parked, 1, {"yes": True}) is not None
        assert await b.answer(parked, 1, {"no": True}) is None  # exactly one answer
        taken = await eventually(a.claim)
        assert taken.execution_id == execution.execution_id
        again = await a.ask(taken, Question(request, "ok", "ok?"), True, None)
        assert again.found is Found.ANSWERED and again.value == {"yes": True}
    finally:
        await closed(a)
        await closed(b)


async def test_schedule_marks_fire_once_across_replicas(postgres_url: str) -> None:
    a = open_postgres(postgres_url, "A", Recorder())
    b = open_postgres(postgres_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        marks = await asyncio.gather(a.schedule_marks("nightly", 100.0), b.schedule_marks(
            "nightly", 200.0))  # fmt: skip
        assert marks[0].created == marks[1].created
        await a.schedule_fired("nightly", 300.0, True)
        await b.schedule_fired("nightly", 250.0, True)  # a mark never goes back
        kept = await b.schedule_marks("nightly", 400.0)
        assert (kept.handled, kept.started) == (300.0, 300.0)
        before = await a.schedules_version()
        await b.put_schedule("nightly", '{"cron": "0 3 * * *"}')
        assert await a.schedules_version() not in (before, "")
        assert await a.schedule_documents() == {"nightly": '{"cron": "0 3 * * *"}'}
        assert await a.delete_schedule("nightly") and not await b.delete_schedule("nightly")
    finally:
        await closed(a)
        await closed(b)


async def test_a_schema_newer_than_the_code_is_refused(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    a = open_postgres(postgres_url, "A", Recorder())
    await a.open()  # an empty database: the schema is made
    await closed(a)
    postgres_server.admin(
        "INSERT INTO agent_server_schema (version, name) VALUES (9999, '9999_later.sql')",
        database="agents",
    )
    b = open_postgres(postgres_url, "B", Recorder())
    with pytest.raises(SchemaTooNew, match="9999"):
        await b.open()
    await closed(b)


def test_the_store_role_is_no_superuser(postgres_server: PostgresServer, postgres_url: str) -> None:
    rows = postgres_server.admin("SELECT rolsuper FROM pg_roles WHERE rolname = 'agent'")
    assert rows == [(False,)]


async def test_a_pause_of_postgres_past_every_lease_judges_no_live_owner(
    own_postgres: PostgresServer,
) -> None:
    """Invariant 2 of section 12: a pause of the store (SIGSTOP, longer than every lease)
    stops every renewal alike; once it answers again nobody judges until each live replica
    has renewed for a whole lease, so the running work of a live owner is never lost."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_postgres(own_postgres.url, "A", a_seen, lease_ttl=0.6)
    b = open_postgres(own_postgres.url, "B", b_seen, lease_ttl=0.6)
    await a.open()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        own_postgres.pause()
        try:
            await asyncio.sleep(2.0)  # the fault itself: three leases without an answer
        finally:
            own_postgres.resume()

        async def renewed_twice() -> bool:
            return len(a_seen.alive) >= 3 and len(b_seen.alive) >= 3

        await eventually(renewed_twice, timeout=15.0)
        await asyncio.sleep(1.5)  # more than a whole lease of renewals: judging allowed now
        found = await b.get(execution.execution_id)
        assert found is not None and found.status is ExecutionStatus.RUNNING
        assert a_seen.lost == b_seen.lost == []
        execution.finish(ExecutionStatus.SUCCEEDED, result="alive")
        a.end(execution)
        assert await a.recorded(execution, 10.0)
    finally:
        await closed(a)
        await closed(b)


async def test_an_owner_whose_lease_lapsed_takes_no_new_work_until_it_renews(
    postgres_url: str, postgres_server: PostgresServer
) -> None:
    seen = Recorder()
    a = open_postgres(postgres_url, "A", seen, lease_ttl=60.0)
    await a.open()
    try:
        expire(postgres_server, "A", "epoch")
        # A pass of its liveness after the lapse: the open's renewal was its lease, so the
        # pass renews nothing (it once renewed at once, and could land before the create).
        passes = seen.operations.count(("judge", True))
        await eventually(lambda: asyncio.sleep(0, seen.operations.count(("judge", True)) > passes))
        with pytest.raises(StoreUnavailable, match="lease lapsed"):
            await a.create(Execution("echo", None, "A"))

        async def accepted() -> bool:
            try:
                return await a.create(Execution("echo", None, "A")) is None
            except StoreUnavailable:
                return False

        assert await eventually(accepted)  # renewed at its next pass, not a lease later
    finally:
        await closed(a)


async def test_without_listen_the_poll_wakes_waiters_and_delivers_cancels_within_its_bound(
    postgres_url: str,
) -> None:
    """`--store-notify poll` (a pooler in transaction mode forbids LISTEN): no connection
    listens, and the bounded poll (at most a second) still wakes a waiter on another
    replica at the end and delivers a cancel to the owner."""
    cancels: list[tuple[str, CancelReason, float | None]] = []
    a = open_postgres(postgres_url, "A", Recorder(), notify="poll")
    b = open_postgres(postgres_url, "B", Recorder(), notify="poll")
    a.deliver_cancels(lambda *args: cancels.append(args))
    await a.open()
    await b.open()
    try:
        assert all(task.get_name() != "store-listen" for task in (*a._tasks, *b._tasks))
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        seen = await b.get(execution.execution_id)
        assert seen is not None
        await b.request_cancel(seen, CancelReason.REQUEST, None)
        began = time.monotonic()
        await eventually(lambda: asyncio.sleep(0, bool(cancels)))
        assert time.monotonic() - began < 1.0 + 0.8  # the poll's bound, and slack
        waiter = asyncio.create_task(b.wait(seen, 10.0))
        await eventually(lambda: asyncio.sleep(0, execution.execution_id in b._notices.waiters))
        execution.finish(ExecutionStatus.CANCELLED, reason=CancelReason.REQUEST)
        a.end(execution)
        ended = time.monotonic()
        found = await asyncio.wait_for(waiter, 5.0)
        assert found.status is ExecutionStatus.CANCELLED
        assert time.monotonic() - ended < 1.0 + 0.8
    finally:
        await closed(a)
        await closed(b)


async def test_retention_weighs_as_well_as_counts(postgres_url: str) -> None:
    """`--max-retained-bytes`: finished records past the budget of results and errors go,
    oldest first; the newest stays even when it alone is over. Big ends leave the outbox in
    transactions of a few MiB each."""
    store = open_postgres(postgres_url, "A", Recorder(), max_retained_bytes=1_000_000)
    await store.open()
    try:
        ids = []
        for index in range(12):  # 12 x 200 kB: 2.4 MB of results
            execution = Execution("sleep", None, "A")
            await store.create(execution)
            execution.finish(ExecutionStatus.SUCCEEDED, result="r" * 200_000 + str(index))
            store.end(execution)
            assert await store.recorded(execution, 10.0)
            ids.append(execution.execution_id)
        kept = [e.execution_id for e in await store.list_executions(limit=100)]
        assert 3 <= len(kept) <= 5, len(kept)
        assert kept == list(reversed(ids))[: len(kept)]
        huge = [Execution("sleep", None, "A") for _ in range(4)]
        for execution in huge:
            await store.create(execution)
        batches = [len(store._owner._batch())]
        for execution in huge:
            execution.finish(ExecutionStatus.SUCCEEDED, result="h" * 3_000_000)
            store.end(execution)
        batches.append(len(store._owner._batch()))
        assert batches[1] <= 2  # 4 MiB a transaction: two 3 MB ends at most
        for execution in huge:
            assert await store.recorded(execution, 20.0)
        listed = [e.execution_id for e in await store.list_executions(limit=100)]
        assert listed == [huge[-1].execution_id]
        found = await store.get(huge[-1].execution_id)
        assert found is not None and found.result == "h" * 3_000_000
    finally:
        await closed(store)


async def test_a_create_cut_as_it_commits_is_put_back_by_the_close_not_judged_lost(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """A's create commits while its caller is cut (the reply to its COMMIT held, then the
    task cancelled), and A's liveness stops before its repair could run: the row is
    `running` under A, which runs nothing for it. A's close puts it back on the queue for
    its first run, with its body, before its lease ends; left to the judge, a create (its
    body may have begun, for all the row says) would end `lost` unrun."""
    proxy = CutProxy(postgres_server.port)
    proxy.start()
    a = open_postgres(proxied(postgres_url, proxy.port), "A", Recorder(), lease_ttl=8.0)
    b_seen = Recorder()
    b = open_postgres(postgres_url, "B", b_seen, lease_ttl=8.0)
    await a.open()
    await b.open()
    try:
        a.deliver_orphans(lambda _: False, lambda _: False)
        execution = Execution("sleep", None, "A")
        execution.body = {"seconds": 0.25}
        # Its liveness stops first (only the close is left to repair), so the one reply the
        # stall holds is the create's: a renewal's held on another pooled connection would
        # hold the liveness's cancellation until its reply came.
        for task in a._tasks:
            task.cancel()
        await asyncio.gather(*a._tasks, return_exceptions=True)
        proxy.stall(COMMITTED, 3.0)
        create = asyncio.create_task(a.create(execution))
        await wait_status(b, execution.execution_id, ExecutionStatus.RUNNING)
        create.cancel()
        with pytest.raises(asyncio.CancelledError):
            await create
        proxy.unstall()
        found = await b.get(execution.execution_id)
        assert found is not None and (found.status, found.replica) == (
            ExecutionStatus.RUNNING,
            "A",
        )
        await closed(a)
        found = await b.get(execution.execution_id)  # at once: put back before the lease ended
        assert found is not None
        assert (found.status, found.replica, found.attempt) == (ExecutionStatus.QUEUED, "", 1)
        claimed = await b.claim()
        assert claimed is not None and (claimed.attempt, claimed.body) == (1, execution.body)
        assert b_seen.lost == []
    finally:
        await closed(b)
        await closed(a)
        proxy.stop()
