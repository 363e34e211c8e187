"""The execution store's contract, one suite for both implementations.

Every test of the shared part runs against the memory store and against the redis store on
a real `redis-server`. With redis, `a` and `b` are two stores with different replica ids on
one Redis and one agent name (two replicas): `a` owns and ends the executions, `b` reads,
waits and cancels, so each test also shows that any replica answers. With memory, `a` and
`b` are the same store. The redis-only tests at the end cover what only a shared store has:
`lost`, fencing, the outbox during an outage, and a bounded, password-free failure to open.
Every wait is bounded; nothing sleeps to synchronise (polls carry deadlines).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agent_server.model.asks import Found, Question, Reply
from agent_server.model.execution import CancelReason, Execution, ExecutionStatus
from agent_server.store import (
    BadCursor,
    ExecutionRunning,
    ExecutionStore,
    ListCursor,
    MemoryStore,
    SessionReleasing,
    StoreUnavailable,
)
from agent_server.store.postgres import PostgresStore, codec
from agent_server.store.redis import RedisStore
from tests.support.process import free_port
from tests.support.redis_server import RedisServer
from tests.support.stores import (
    AGENT,
    BOUND,
    Recorder,
    closed,
    eventually,
    open_postgres,
    open_redis,
    resumable,
)

#: Marks the tests that need a real redis-server (skipped when it is missing; failed in CI).
needs_redis = pytest.mark.redis


@dataclass
class Replicas:
    """`a` runs the work (its cancel handler records what reaches it); `b` is another
    replica of the same agent (the same store, for memory)."""

    kind: str
    a: ExecutionStore
    b: ExecutionStore
    a_seen: Recorder
    b_seen: Recorder
    cancels: list[tuple[str, CancelReason, float | None]]

    def new(self, reasoner: str = "echo", session_id: str | None = None) -> Execution:
        return Execution(reasoner, session_id, self.a.replica_id)

    async def ended(self, execution: Execution) -> Execution:
        """End it on `a` and return it as `b` reads it once the end is written."""
        self.a.end(execution)
        return await eventually(lambda: terminal(self.b, execution.execution_id))


Factory = Callable[..., Awaitable[Replicas]]


async def terminal(store: ExecutionStore, execution_id: str) -> Execution | None:
    found = await store.get(execution_id)
    return found if found is not None and found.is_terminal else None


def is_waiting(store: ExecutionStore, execution: Execution) -> bool:
    """Whether a waiter for the execution is registered (private state, read only)."""
    if isinstance(store, RedisStore):
        return execution.execution_id in store._notices.waiters
    if isinstance(store, PostgresStore):
        return execution.execution_id in store._notices.waiters
    return execution._done is not None


@pytest.fixture(
    params=["memory", pytest.param("redis", marks=needs_redis), pytest.param("postgres")]
)
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[Factory]:
    """`await replicas(result_ttl=..., max_retained=..., lease_ttl=...)`: two open replicas
    of one agent; everything opened is closed at the end."""
    opened: list[ExecutionStore] = []

    async def make(
        result_ttl: float = 3600.0,
        max_retained: int = 10_000,
        lease_ttl: float = 10.0,
        max_answer_bytes: int = 16 * 1024 * 1024,
        max_retained_bytes: int = 256 * 1024 * 1024,
    ) -> Replicas:
        cancels: list[tuple[str, CancelReason, float | None]] = []
        a_seen, b_seen = Recorder(), Recorder()
        a: ExecutionStore
        b: ExecutionStore
        if request.param == "memory":
            a = b = MemoryStore(
                "A",
                result_ttl=result_ttl,
                max_retained=max_retained,
                max_answer_bytes=max_answer_bytes,
                max_retained_bytes=max_retained_bytes,
            )
        else:
            options = {
                "result_ttl": result_ttl,
                "max_retained": max_retained,
                "lease_ttl": lease_ttl,
                "max_answer_bytes": max_answer_bytes,
                "max_retained_bytes": max_retained_bytes,
            }
            shared = open_redis if request.param == "redis" else open_postgres
            url = request.getfixturevalue(f"{request.param}_url")
            a = shared(url, "A", a_seen, **options)
            b = shared(url, "B", b_seen, **options)
        a.deliver_cancels(lambda *args: cancels.append(args))
        for store in {id(a): a, id(b): b}.values():
            await store.open()
            opened.append(store)
        return Replicas(request.param, a, b, a_seen, b_seen, cancels)

    yield make
    for store in opened:
        await closed(store)


# -- requests for input: matched by identity, answers bounded -------------------------------


def question(number: int, identity: str, after: int = 0) -> Question:
    request = {"request_id": number, "prompt": identity, "schema": None}
    return Question(request, identity, f"label {identity}", after)


async def asked_and_answered(
    r: Replicas, execution: Execution, number: int, identity: str, value: Any
) -> None:
    """`a` records the request (its task waits); `b` takes the answer."""
    asked = question(number, identity)
    assert (await r.a.ask(execution, asked, False, None)).found is Found.WAIT
    execution.ask(asked.request)

    async def waiting() -> Execution | None:
        seen = await r.b.get(execution.execution_id)
        waits = seen is not None and seen.status is ExecutionStatus.INPUT_REQUIRED
        return seen if waits else None

    seen = await eventually(waiting)
    assert await r.b.answer(seen, number, value) is not None
    execution.resume()  # what the waiting ctx.ask does once handed the answer


async def kept_requests(store: ExecutionStore, execution: Execution) -> list[str]:
    """The requests' fields of the record (`answer:N`, `ident:N`, `label:N`), on Redis; in
    the ledger's row on Postgres, named alike."""
    if isinstance(store, PostgresStore):
        async with store._link.tx("test") as conn:
            cursor = await conn.execute(
                "SELECT ledger FROM executions WHERE id = %s", (execution.execution_id,)
            )
            row = await cursor.fetchone()
        ledger = codec.ledger_loads(None if row is None else row[0])
        return [f"ident:{n}" for n in ledger.entries] + [
            f"answer:{n}" for n, entry in ledger.entries.items() if entry.answered
        ]
    if not isinstance(store, RedisStore):
        ledger = execution.ledger
        return (
            []
            if ledger is None
            else [f"ident:{n}" for n in ledger.entries]
            + [f"answer:{n}" for n, entry in ledger.entries.items() if entry.answered]
        )
    fields = await store._link.redis.hkeys(store.keys.record(execution.execution_id))
    return [str(f) for f in fields if str(f).split(":")[0] in ("answer", "ident", "label")]


async def test_a_replayed_ask_is_matched_by_its_identity(replicas: Factory) -> None:
    """Requests 1 "a" and 2 "b" answered: an ask of "a" numbered 2 gets request 1's answer,
    one of "b" request 2's, one of "c" a mismatch naming "b"; the oldest answer goes past the
    bound and its ask is asked again; at the end nothing of them is left."""
    r = await replicas(max_answer_bytes=100)
    r.a.deliver_answers(lambda *args: True)  # the waiting ctx.ask takes it
    execution = r.new()
    await r.a.create(execution)
    await asked_and_answered(r, execution, 1, "a", "A" * 38)  # 40 bytes as JSON
    await asked_and_answered(r, execution, 2, "b", "B" * 38)
    replay = await r.a.ask(execution, question(2, "a"), False, None)
    assert replay == Reply(Found.ANSWERED, 1, "A" * 38)
    assert await r.a.ask(execution, question(2, "b"), False, None) == Reply(
        Found.ANSWERED, 2, "B" * 38
    )
    assert await r.a.ask(execution, question(2, "a", after=1), False, None) == Reply(
        Found.MISMATCH, 2, other="label b"
    )
    await asked_and_answered(r, execution, 3, "c", "C" * 38)  # 120 bytes: request 1's goes
    again = await r.a.ask(execution, question(2, "a"), False, None)
    assert again == Reply(Found.AGAIN, 1)
    assert await r.a.ask(execution, question(3, "c"), False, None) == Reply(
        Found.ANSWERED, 3, "C" * 38
    )
    assert set(await kept_requests(r.a, execution)) >= {"ident:1", "answer:2", "answer:3"}
    execution.finish(ExecutionStatus.SUCCEEDED, result=None)
    await r.ended(execution)
    if isinstance(r.a, (RedisStore, PostgresStore)):
        assert await kept_requests(r.a, execution) == []
    else:
        assert execution.ledger is None


# -- records, reads and lists -----------------------------------------------------------------


async def test_create_then_get_from_any_replica(replicas: Factory) -> None:
    r = await replicas()
    execution = r.new("echo", "s1")
    await r.a.create(execution)
    found = await r.b.get(execution.execution_id)
    assert found is not None
    assert found.to_json() == execution.to_json()
    assert found.replica == "A" and found.attempt == 1
    assert found.status is ExecutionStatus.RUNNING and not found.is_terminal
    assert await r.b.get("0" * 32) is None


async def test_end_then_get(replicas: Factory) -> None:
    r = await replicas()
    ok, bad = r.new(), r.new("boom")
    await r.a.create(ok)
    await r.a.create(bad)
    ok.finish(ExecutionStatus.SUCCEEDED, result={"text": "hé", "n": [1, 2**70, 0.5]})
    bad.finish(ExecutionStatus.FAILED, error={"type": "ValueError", "message": "no"})
    for execution in (ok, bad):
        found = await r.ended(execution)
        assert found.to_json() == execution.to_json()
    cancelled = r.new()
    await r.a.create(cancelled)
    cancelled.abandoned = True
    cancelled.finish(ExecutionStatus.CANCELLED, reason=CancelReason.SHUTDOWN)
    found = await r.ended(cancelled)
    assert found.status_reason is CancelReason.SHUTDOWN and found.abandoned


async def test_the_input_a_start_kept_is_read_by_any_replica(replicas: Factory) -> None:
    """`input_of` (GET /executions/{id}/input): the body it was created with, as another
    replica finds it, running or ended; None for a start without one; a record forgotten
    since it was found is gone (False) where the body is read apart."""
    r = await replicas()
    body = {"text": "hé \u2028", "n": [1, 2**70, 0.5], "nested": {"deep": [None, True]}}
    kept, bare = r.new(), r.new()
    kept.body = body
    for execution in (kept, bare):
        await r.a.create(execution)
    found = await r.b.get(kept.execution_id)
    assert found is not None and await r.b.input_of(found) == (True, body)
    kept.finish(ExecutionStatus.SUCCEEDED, result="done")
    ended = await r.ended(kept)
    assert await r.b.input_of(ended) == (True, body)
    no_body = await r.b.get(bare.execution_id)
    assert no_body is not None and await r.b.input_of(no_body) == (True, None)
    assert await r.a.forget(kept.execution_id)
    if r.kind == "redis":
        assert await r.b.input_of(ended) == (False, None)


async def test_list_newest_first_with_filters_and_limit(replicas: Factory) -> None:
    r = await replicas()
    base = time.time()
    made: list[Execution] = []
    for i in range(6):
        execution = r.new("echo" if i % 2 else "sleep", "s1" if i < 3 else "s2")
        execution.created_at = base + i  # distinct and increasing, as created
        await r.a.create(execution)
        made.append(execution)
    for execution in made[:2]:
        execution.finish(ExecutionStatus.SUCCEEDED, result=1)
        await r.ended(execution)

    def ids(executions: list[Execution]) -> list[str]:
        return [e.execution_id for e in executions]

    newest_first = ids(made[::-1])
    assert ids(await r.b.list_executions(limit=100)) == newest_first
    assert ids(await r.b.list_executions(limit=2)) == newest_first[:2]
    running = await r.b.list_executions(status=ExecutionStatus.RUNNING, limit=100)
    assert ids(running) == ids(made[:1:-1])
    succeeded = await r.b.list_executions(status=ExecutionStatus.SUCCEEDED, limit=100)
    assert ids(succeeded) == [made[1].execution_id, made[0].execution_id]
    assert ids(await r.b.list_executions(reasoner="echo", limit=100)) == ids(made[1::2][::-1])
    in_s1 = await r.b.list_executions(session_id="s1", limit=100)
    assert ids(in_s1) == ids(made[2::-1])
    both = await r.b.list_executions(session_id="s1", reasoner="echo", limit=100)
    assert ids(both) == [made[1].execution_id]
    combined = await r.b.list_executions(
        status=ExecutionStatus.RUNNING, reasoner="sleep", session_id="s2", limit=1
    )
    assert ids(combined) == [made[4].execution_id]
    assert await r.b.list_executions(session_id="nobody", limit=100) == []
    assert await r.b.list_executions(status=ExecutionStatus.LOST, limit=100) == []


async def test_pages_follow_cursors_to_the_oldest_with_any_of_several_statuses(
    replicas: Factory,
) -> None:
    """Every record is on exactly one page, in order, whatever the page size, for one
    index or another; several statuses match any of them; a cursor no page gave is
    refused."""
    r = await replicas()
    base = time.time()
    made: list[Execution] = []
    for i in range(11):
        execution = r.new("echo" if i % 3 else "sleep", "s1" if i % 2 else None)
        execution.created_at = base + i
        await r.a.create(execution)
        made.append(execution)
    for execution in made[:4]:
        status = ExecutionStatus.SUCCEEDED if execution.reasoner == "echo" else None
        execution.finish(status or ExecutionStatus.FAILED, result=1)
        await r.ended(execution)

    async def every(**filters: Any) -> list[str]:
        return await every_page(r.b, 50, **filters)  # bounded: 11 records

    newest_first = [e.execution_id for e in made[::-1]]
    for limit in (1, 3, 4, 11, 100):
        assert await every(limit=limit) == newest_first
    in_s1 = [e.execution_id for e in made[::-1] if e.session_id == "s1"]
    assert await every(limit=2, session_id="s1") == in_s1
    ended = frozenset((ExecutionStatus.SUCCEEDED, ExecutionStatus.FAILED))
    assert await every(limit=1, statuses=ended) == [e.execution_id for e in made[3::-1]]
    running = frozenset((ExecutionStatus.RUNNING,))
    assert await every(limit=2, statuses=running) == [e.execution_id for e in made[:3:-1]]
    # A page cut short continues from the last execution shown.
    first = await r.b.page(limit=5)
    rest = await r.b.page(limit=100, after=ListCursor.read(first.cursors[1]))
    assert [e.execution_id for e in rest.executions] == newest_first[2:]
    # Every cursor a page gave reads back as itself; what none gave is refused by the one
    # reader (tests/process/test_abuse.py sends such cursors to both stores).
    assert all(str(ListCursor.read(c)) == c for c in first.cursors)
    for bad in ("", "x", "1:2", f"nan:{made[0].execution_id}", "1:" + "g" * 32):
        with pytest.raises(BadCursor):
            ListCursor.read(bad)


async def test_a_schedules_executions_page_through_exactly_once_in_order(
    replicas: Factory,
) -> None:
    """The store filters by schedule, as by reasoner: paging through many executions of two
    schedules (one id a prefix of the other) mixed with unscheduled ones and another
    tenant's, every execution of a schedule is on exactly one page, newest first, whatever
    the page size, in a tenant's index, with a status filter and in the whole list."""
    r = await replicas()
    base = time.time()
    made: list[Execution] = []
    for i in range(90):
        execution = r.new("echo" if i % 2 else "sleep", "chat" if i % 7 == 0 else None)
        execution.schedule_id = ("night", "night-1", None)[i % 3]
        if i % 5 == 0:
            execution.owner, execution.tenant = "id-globex", "globex"
        execution.created_at = base + i / 10
        await r.a.create(execution)
        made.append(execution)
    for execution in made[:30]:
        execution.finish(ExecutionStatus.SUCCEEDED, result=1)
        await r.ended(execution)

    async def every(**filters: Any) -> list[str]:
        return await every_page(r.b, 200, **filters)  # bounded: 90 records

    def expected(schedule_id: str, keep: Callable[[Execution], bool] = lambda e: True) -> list[str]:
        return [e.execution_id for e in made[::-1] if e.schedule_id == schedule_id and keep(e)]

    for schedule_id in ("night", "night-1"):
        for limit in (1, 4, 7, 100):
            assert await every(limit=limit, schedule_id=schedule_id) == expected(schedule_id)
        assert await every(limit=3, schedule_id=schedule_id, tenant="globex") == expected(
            schedule_id, lambda e: e.tenant == "globex"
        )
        ended = frozenset((ExecutionStatus.SUCCEEDED,))
        assert await every(limit=2, schedule_id=schedule_id, statuses=ended) == expected(
            schedule_id, lambda e: e.is_terminal
        )
        assert await every(limit=2, schedule_id=schedule_id, reasoner="echo") == expected(
            schedule_id, lambda e: e.reasoner == "echo"
        )
        assert await every(limit=2, schedule_id=schedule_id, session_id="chat") == expected(
            schedule_id, lambda e: e.session_id == "chat" and e.tenant is None
        )
    assert await every(limit=5, schedule_id="nightly") == []
    # No filter: every execution, scheduled or not.
    assert await every(limit=9) == [e.execution_id for e in made[::-1]]


# -- waiting --------------------------------------------------------------------------------


async def test_wait_is_woken_by_the_end(replicas: Factory) -> None:
    r = await replicas()
    execution = r.new()
    await r.a.create(execution)
    seen = await r.b.get(execution.execution_id)
    assert seen is not None
    waiter = asyncio.create_task(r.b.wait(seen, 10.0))
    await eventually(lambda: asyncio.sleep(0, is_waiting(r.b, seen)))
    execution.finish(ExecutionStatus.SUCCEEDED, result="done")
    ended = time.monotonic()
    r.a.end(execution)
    found = await asyncio.wait_for(waiter, BOUND)
    woke = time.monotonic() - ended
    assert found.status is ExecutionStatus.SUCCEEDED and found.result == "done"
    # Well inside the 1 s re-read: the notice woke it (100 ms in the contract; slack for
    # a shared, loaded test machine).
    assert woke < 0.5, woke


@pytest.mark.parametrize("side", ["owner", "other"])
async def test_a_wait_begun_after_the_end_landed_returns_at_once(
    replicas: Factory, side: str
) -> None:
    """A long-poll reads the record (running), and its end lands and is told before the
    wait begins (the owner's write, or another replica's notice, comes between the read
    and the wait): the wait returns the end at once, not at the next re-read a second
    later. On the owner (`a`) the end is its own write; elsewhere (`b`) a notice."""
    r = await replicas()
    execution = r.new()
    await r.a.create(execution)
    reader = r.a if side == "owner" else r.b
    seen = await reader.get(execution.execution_id)
    assert seen is not None and seen.status is ExecutionStatus.RUNNING
    execution.finish(ExecutionStatus.SUCCEEDED, result="done")
    r.a.end(execution)
    assert await r.a.recorded(execution, BOUND)
    if side == "other":  # the notice has reached b: a read there finds the end
        await eventually(lambda: terminal(r.b, execution.execution_id))
    began = time.monotonic()
    found = await reader.wait(seen, 10.0)
    took = time.monotonic() - began
    assert found.status is ExecutionStatus.SUCCEEDED and found.result == "done"
    assert took < 0.5, took  # the re-read is a second away


async def test_wait_times_out_with_the_execution_as_it_is(replicas: Factory) -> None:
    r = await replicas()
    execution = r.new()
    await r.a.create(execution)
    seen = await r.b.get(execution.execution_id)
    assert seen is not None
    started = time.monotonic()
    found = await r.b.wait(seen, 0.3)
    elapsed = time.monotonic() - started
    assert found.status is ExecutionStatus.RUNNING
    assert 0.25 <= elapsed < 2.0, elapsed
    assert await r.b.wait(await r.ended(_finished(execution)), 5.0) is not None


def _finished(execution: Execution) -> Execution:
    execution.finish(ExecutionStatus.SUCCEEDED, result=None)
    return execution


# -- forget ---------------------------------------------------------------------------------


async def test_forget(replicas: Factory) -> None:
    r = await replicas()
    assert await r.b.forget("0" * 32) is False
    execution = r.new("echo", "s1")
    await r.a.create(execution)
    with pytest.raises(ExecutionRunning):
        await r.b.forget(execution.execution_id)
    assert await r.b.get(execution.execution_id) is not None
    await r.ended(_finished(execution))
    assert await r.b.forget(execution.execution_id) is True
    assert await r.b.get(execution.execution_id) is None
    assert await r.a.get(execution.execution_id) is None
    assert await r.b.list_executions(limit=100) == []
    assert await r.b.session("s1") == []
    assert await r.b.forget(execution.execution_id) is False


# -- sessions -------------------------------------------------------------------------------


async def test_sessions_and_release_refusal(replicas: Factory) -> None:
    r = await replicas()
    one, two, other = r.new("echo", "s1"), r.new("echo", "s1"), r.new("echo", "s2")
    for execution in (one, two, other):
        await r.a.create(execution)
    ids = {e.execution_id for e in await r.b.session("s1")}
    assert ids == {one.execution_id, two.execution_id}
    assert await r.b.session("unknown") == []

    await r.b.begin_release("s1", 30.0)  # on one replica, refused on the other
    with pytest.raises(SessionReleasing):
        await r.a.create(r.new("echo", "s1"))
    await r.a.create(r.new("echo", "s2"))  # other sessions and none go on
    await r.a.create(r.new("echo", None))
    await r.b.end_release("s1")
    await r.a.create(r.new("echo", "s1"))
    assert len(await r.b.session("s1")) == 3


async def test_a_release_expires_when_its_replica_does_not_end_it(replicas: Factory) -> None:
    r = await replicas()
    if r.kind == "memory":
        pytest.skip("one process: the release ends with it")
    await r.b.begin_release("s1", 0.2)
    with pytest.raises(SessionReleasing):
        await r.a.create(r.new("echo", "s1"))

    async def accepted() -> bool:
        try:
            await r.a.create(r.new("echo", "s1"))
        except SessionReleasing:
            return False
        return True

    await eventually(accepted)


# -- cancel ---------------------------------------------------------------------------------


async def test_request_cancel_reaches_the_owner(replicas: Factory) -> None:
    r = await replicas()
    execution = r.new()
    await r.a.create(execution)
    seen = await r.b.get(execution.execution_id)
    assert seen is not None
    await r.b.request_cancel(seen, CancelReason.SESSION_RELEASED, 2.5)

    async def delivered() -> bool:
        return bool(r.cancels)

    await eventually(delivered)
    assert r.cancels == [(execution.execution_id, CancelReason.SESSION_RELEASED, 2.5)]
    await r.a.request_cancel(execution, CancelReason.REQUEST, None)  # the owner itself
    await eventually(lambda: asyncio.sleep(0, len(r.cancels) == 2))
    assert r.cancels[1] == (execution.execution_id, CancelReason.REQUEST, None)


# -- retention ------------------------------------------------------------------------------


async def test_results_expire_after_result_ttl(replicas: Factory) -> None:
    r = await replicas(result_ttl=0.3)
    execution = r.new("echo", "s1")
    await r.a.create(execution)
    running = r.new()
    await r.a.create(running)
    await r.ended(_finished(execution))

    async def gone() -> bool:
        return await r.b.get(execution.execution_id) is None

    await eventually(gone)
    assert [e.execution_id for e in await r.b.list_executions(limit=10)] == [running.execution_id]
    assert await r.b.session("s1") == []
    assert await r.b.get(running.execution_id) is not None  # running work never expires


async def test_max_retained_drops_the_oldest_finished(replicas: Factory) -> None:
    r = await replicas(max_retained=2)
    running = r.new()
    await r.a.create(running)
    made = [r.new("echo", "s1") for _ in range(3)]
    for execution in made:
        await r.a.create(execution)
    for execution in made:
        execution.finish(ExecutionStatus.SUCCEEDED)
        r.a.end(execution)
    await eventually(lambda: terminal(r.b, made[2].execution_id))

    async def trimmed() -> bool:
        return await r.b.get(made[0].execution_id) is None

    await eventually(trimmed)
    for execution in made[1:]:
        assert await r.b.get(execution.execution_id) is not None
    assert await r.b.get(running.execution_id) is not None
    listed = {e.execution_id for e in await r.b.list_executions(limit=10)}
    assert listed == {running.execution_id, made[1].execution_id, made[2].execution_id}
    assert {e.execution_id for e in await r.b.session("s1")} == listed - {running.execution_id}


async def test_retained_bytes_count_what_a_record_keeps_its_input_too(
    replicas: Factory,
) -> None:
    """Every record keeps its start's input: `max_retained_bytes` weighs it with the result
    and error, so records of big inputs and small results cannot outgrow the budget. Four
    ends of 40 kB inputs against a 100 kB budget: the oldest go, the newest stay."""
    r = await replicas(max_retained_bytes=100_000)
    made = [r.new() for _ in range(4)]
    for index, execution in enumerate(made):
        execution.body = {"text": str(index) * 40_000}
        await r.a.create(execution)
    for execution in made:
        execution.finish(ExecutionStatus.SUCCEEDED, result="ok")
        r.a.end(execution)
        await eventually(lambda e=execution: terminal(r.b, e.execution_id))

    async def trimmed() -> bool:
        return all([await r.b.get(e.execution_id) is None for e in made[:2]])

    await eventually(trimmed)
    for execution in made[2:]:
        found = await r.b.get(execution.execution_id)
        assert found is not None and found.result == "ok"


# -- redis only: lost, fencing, outage --------------------------------------------------------

OWNER = """
import asyncio, pathlib, sys
from agent_server.model.execution import Execution
from agent_server.store.redis import RedisStore

async def main():
    store = RedisStore(sys.argv[1], replica_id="doomed", agent_name=sys.argv[2], lease_ttl=0.3)
    await store.open()
    execution = Execution("sleep", "s1", "doomed")
    await store.create(execution)
    pathlib.Path(sys.argv[3]).write_text(execution.execution_id)
    await asyncio.sleep(60)

asyncio.run(main())
"""


@pytest.fixture
def doomed(redis_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A replica in a process of its own that runs one execution until it is killed; and
    the file where it writes that execution's id once recorded."""
    started = tmp_path / "started"
    owner = subprocess.Popen([sys.executable, "-c", OWNER, redis_url, AGENT, str(started)])
    yield owner, started
    owner.kill()
    owner.wait(timeout=5.0)


@needs_redis
async def test_a_killed_owner_s_work_reads_lost_once(
    redis_url: str, doomed: tuple[subprocess.Popen[bytes], Path]
) -> None:
    """kill -9 of the owner: two other replicas reading concurrently both see `lost` within
    a lease, and the move is counted once between them."""
    owner, started = doomed
    b_seen, c_seen = Recorder(), Recorder()
    b = open_redis(redis_url, "B", b_seen, lease_ttl=0.3)
    c = open_redis(redis_url, "C", c_seen, lease_ttl=0.3)
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

        async def lost_on(store: RedisStore) -> Execution:
            found: Execution = await eventually(lambda: terminal(store, execution_id))
            return found

        found_b, found_c = await asyncio.gather(lost_on(b), lost_on(c))
        elapsed = time.monotonic() - killed
        assert elapsed < 0.3 + 1.0, elapsed  # one lease, plus slack for a loaded machine
        for found in (found_b, found_c):
            assert found.status is ExecutionStatus.LOST
            assert found.error == {
                "type": "ExecutionLost",
                "message": "replica doomed stopped renewing its liveness",
            }
            assert found.finished_at is not None
        # The move may be a renewal's (its sweep), whose reply its task reads after these
        # reads' replies: counted by then, once; and never again by the reads and renewals
        # after it.
        await eventually(lambda: asyncio.sleep(0, b_seen.lost or c_seen.lost))
        assert [e.execution_id for e in await b.session("s1")] == [execution_id]
        lost = await c.list_executions(status=ExecutionStatus.LOST, limit=10)
        assert [e.execution_id for e in lost] == [execution_id]
        assert await b.list_executions(status=ExecutionStatus.RUNNING, limit=10) == []
        renewed = len(b_seen.alive), len(c_seen.alive)
        await eventually(
            lambda: asyncio.sleep(
                0, len(b_seen.alive) > renewed[0] and len(c_seen.alive) > renewed[1]
            )
        )
        assert len(b_seen.lost) + len(c_seen.lost) == 1
    finally:
        await closed(b)
        await closed(c)


@needs_redis
async def test_the_sweep_shows_lost_without_a_read(redis_url: str) -> None:
    """A closed owner's running work is moved to lost by another replica's periodic sweep,
    with nobody reading it; counted once."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_redis(redis_url, "A", a_seen)
    b = open_redis(redis_url, "B", b_seen, lease_ttl=0.3)
    await a.open()
    await b.open()
    try:
        executions = [Execution("sleep", None, "A") for _ in range(3)]
        for execution in executions:
            await a.create(execution)
        await eventually(lambda: asyncio.sleep(0, 2 in b_seen.alive))
        await closed(a)  # its liveness ends now; its running work is lost
        await eventually(lambda: asyncio.sleep(0, len(b_seen.lost) == 3), timeout=BOUND)
        assert sorted(b_seen.lost) == sorted(e.execution_id for e in executions)
        assert b_seen.alive[-1] == 1
        lost = await b.list_executions(status=ExecutionStatus.LOST, limit=10)
        assert len(lost) == 3 and len(b_seen.lost) == 3
    finally:
        await closed(a)
        await closed(b)


@needs_redis
async def test_a_replica_judges_others_only_after_a_whole_lease_up(
    redis_url: str, redis_server: RedisServer
) -> None:
    """Right after it reached Redis (at start, or after an outage, when no replica could
    renew), a replica does not yet declare others' work lost: their owners renew first."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_redis(redis_url, "A", a_seen, lease_ttl=60.0)
    b = open_redis(redis_url, "B", b_seen, lease_ttl=1.0)
    await a.open()
    opened = time.monotonic()  # B's first renewal is part of its open
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        # A's lease lapsed long ago (1 ms after the epoch; 0 would say A closed it itself),
        # set once A's renewals at open are made (a later one would undo it).
        await eventually(lambda: asyncio.sleep(0, len(a_seen.alive) >= 2))
        assert redis_server.command("ZADD", a.keys.replicas, "1", "A")
        early = await b.get(execution.execution_id)
        assert early is not None
        assert early.status is ExecutionStatus.RUNNING or time.monotonic() - opened >= 1.0

        async def lost() -> bool:
            found = await b.get(execution.execution_id)
            return found is not None and found.status is ExecutionStatus.LOST

        await eventually(lost)
        assert time.monotonic() - opened >= 1.0
        # Counted once, by B (its renewal's reply may come just after the read's).
        await eventually(lambda: asyncio.sleep(0, bool(b_seen.lost)))
        assert b_seen.lost == [execution.execution_id]
    finally:
        await closed(a)
        await closed(b)


@needs_redis
async def test_an_end_written_after_lost_is_refused_and_counted(
    redis_url: str, redis_server: RedisServer
) -> None:
    """A paused owner (its lease expired: here set so, as if time had passed) comes back
    and ends its execution: the write is refused, the record stays lost."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_redis(redis_url, "A", a_seen, lease_ttl=60.0)  # no renewal during the test
    b = open_redis(redis_url, "B", b_seen, lease_ttl=0.3)  # judges others after 0.3 s up
    await a.open()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        await eventually(lambda: asyncio.sleep(0, len(a_seen.alive) >= 2))  # renewed at open
        assert redis_server.command("ZADD", a.keys.replicas, "0", "A")

        async def lost() -> bool:
            found = await b.get(execution.execution_id)
            return found is not None and found.status is ExecutionStatus.LOST

        await eventually(lost)
        await eventually(lambda: asyncio.sleep(0, bool(b_seen.lost)))  # as above
        assert b_seen.lost == [execution.execution_id]

        execution.finish(ExecutionStatus.SUCCEEDED, result="late")
        a.end(execution)
        await eventually(lambda: asyncio.sleep(0, a_seen.fenced == [execution.execution_id]))
        again = await b.get(execution.execution_id)
        assert again is not None and again.status is ExecutionStatus.LOST
        assert again.result is None
        assert await a.flush(time.monotonic() + 1.0) == []  # refused is not unrecorded
    finally:
        await closed(a)
        await closed(b)


async def test_ends_wait_in_the_outbox_during_an_outage(own_redis: RedisServer) -> None:
    """Redis stops; the end waits locally; Redis comes back (same data) and the end is
    written, fenced as usual, waking a waiter on another replica."""
    a_seen, b_seen = Recorder(), Recorder()
    a = open_redis(own_redis.url, "A", a_seen)
    b = open_redis(own_redis.url, "B", b_seen)
    await a.open()
    await b.open()
    try:
        execution = Execution("sleep", None, "A")
        await a.create(execution)
        assert a.up
        own_redis.stop(save=True)
        with pytest.raises(StoreUnavailable):
            await b.get(execution.execution_id)
        assert not b.up and b_seen.ups[-1] is False
        execution.finish(ExecutionStatus.SUCCEEDED, result="kept")
        a.end(execution)
        await eventually(lambda: asyncio.sleep(0, not a.up))
        own_redis.start()  # same port, same directory: the saved data comes back

        async def written() -> Execution | None:
            try:
                return await terminal(b, execution.execution_id)
            except StoreUnavailable:
                return None

        found = await eventually(written, timeout=10.0)
        assert found.status is ExecutionStatus.SUCCEEDED and found.result == "kept"
        await eventually(lambda: asyncio.sleep(0, a.up))
        assert a_seen.ups[-2:] == [False, True]
        assert a_seen.fenced == []
        assert await a.flush(time.monotonic() + 1.0) == []
    finally:
        await closed(a)
        await closed(b)


async def test_flush_returns_what_could_not_be_written_by_its_deadline(
    own_redis: RedisServer,
) -> None:
    a = open_redis(own_redis.url, "A", Recorder(), outbox_limit=1)
    await a.open()
    try:
        first, second = Execution("sleep", None, "A"), Execution("sleep", None, "A")
        await a.create(first)
        await a.create(second)
        own_redis.stop()
        for execution in (first, second):  # the second is past the outbox bound
            execution.finish(ExecutionStatus.SUCCEEDED)
            a.end(execution)
        started = time.monotonic()
        unrecorded = await a.flush(started + 0.5)
        elapsed = time.monotonic() - started
        assert {e.execution_id for e in unrecorded} == {
            first.execution_id,
            second.execution_id,
        }
        assert elapsed < 2.0, elapsed
        with pytest.raises(StoreUnavailable):
            await a.create(Execution("sleep", None, "A"))
        assert not a.up
    finally:
        await closed(a)


@needs_redis
async def test_open_fails_fast_naming_the_host_never_the_password() -> None:
    port = free_port()  # nothing listens there
    store = RedisStore(
        f"redis://user:s3cret-pw@127.0.0.1:{port}/3",
        replica_id="A",
        agent_name=AGENT,
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        await store.open()
    assert time.monotonic() - started < 5.0
    message = str(caught.value)
    assert f"127.0.0.1:{port}/3" in message
    assert "s3cret" not in message and "user" not in message
    assert not store.up
    await store.close()


# -- durable executions on the shared store ----------------------------------------------------


async def wait_status(store: ExecutionStore, execution_id: str, status: ExecutionStatus) -> Any:
    async def reached() -> Any:
        found = await store.get(execution_id)
        return found if found is not None and found.status is status else None

    return await eventually(reached)


@needs_redis
async def test_a_hand_off_is_claimed_once_with_its_body_and_checkpoint(redis_url: str) -> None:
    a_seen, b_seen = Recorder(), Recorder()
    a = open_redis(redis_url, "A", a_seen)
    b = open_redis(redis_url, "B", b_seen)
    await a.open()
    await b.open()
    try:
        execution = resumable("A")
        await a.create(execution)
        await a.checkpoint(execution, '{"done": 2}')
        execution.mark_queued()
        a.hand_off(execution)
        queued = await wait_status(b, execution.execution_id, ExecutionStatus.QUEUED)
        assert (queued.attempt, queued.replica) == (2, "")
        claimed = await b.claim()
        assert claimed is not None and claimed.execution_id == execution.execution_id
        assert (claimed.attempt, claimed.replica, claimed.status) == (
            2,
            "B",
            ExecutionStatus.RUNNING,
        )
        assert claimed.body == {"count": 3} and claimed.checkpoint == '{"done": 2}'
        assert await a.claim() is None  # taken once
        # The old attempt can write neither a checkpoint nor an end any more.
        from agent_server.model.context import StaleAttempt

        with pytest.raises(StaleAttempt):
            await a.checkpoint(execution, '{"done": 3}')
        claimed.finish(ExecutionStatus.SUCCEEDED, result="fresh")
        b.end(claimed)
        ended = await wait_status(a, execution.execution_id, ExecutionStatus.SUCCEEDED)
        assert ended.result == "fresh"
    finally:
        await closed(a)
        await closed(b)


@needs_redis
async def test_a_queued_execution_is_cancelled_by_any_replica(redis_url: str) -> None:
    a = open_redis(redis_url, "A", Recorder())
    b = open_redis(redis_url, "B", Recorder())
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
        assert await a.claim() is None  # it left the queue
    finally:
        await closed(a)
        await closed(b)


@needs_redis
async def test_queued_work_of_a_session_being_released_is_not_claimed(redis_url: str) -> None:
    a = open_redis(redis_url, "A", Recorder())
    b = open_redis(redis_url, "B", Recorder())
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


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=needs_redis)])
async def test_a_key_whose_execution_was_forgotten_starts_nothing(
    kind: str, redis_url: str
) -> None:
    from agent_server.store.base import Idempotency, IdempotencyForgotten

    store: ExecutionStore = (
        MemoryStore("A") if kind == "memory" else open_redis(redis_url, "A", Recorder())
    )
    await store.open()
    try:
        key = Idempotency("k", "fingerprint", 60.0)
        first = Execution("echo", None, "A")
        assert await store.create(first, key) is None
        first.finish(ExecutionStatus.SUCCEEDED, result=1)
        store.end(first)
        await eventually(lambda: terminal(store, first.execution_id))
        again = await store.create(Execution("echo", None, "A"), key)
        assert again is not None and again.execution_id == first.execution_id
        assert await store.forget(first.execution_id)
        with pytest.raises(IdempotencyForgotten):
            await store.create(Execution("echo", None, "A"), key)
    finally:
        await closed(store)


@needs_redis
async def test_a_burst_of_events_never_stands_in_an_ends_way(redis_url: str) -> None:
    """More events than the outbox keeps for them: the surplus is dropped and counted,
    while every end is written (Redis is up all along)."""
    from agent_server.model.events import Event
    from agent_server.store.redis import EVENTS_PENDING

    a = open_redis(redis_url, "A", Recorder(), outbox_limit=100)
    await a.open()
    try:
        noisy, quiet = Execution("chatter", None, "A"), Execution("echo", None, "A")
        for execution in (noisy, quiet):
            await a.create(execution)
        for n in range(1, EVENTS_PENDING + 2_001):
            a.emit(noisy, Event(n, "progress", str(n)))
        for execution in (noisy, quiet):
            execution.finish(ExecutionStatus.SUCCEEDED, result="ok")
            a.end(execution)
        for execution in (noisy, quiet):
            await wait_status(a, execution.execution_id, ExecutionStatus.SUCCEEDED)
        assert a.events_dropped >= 2_000
        missed, kept = await a.events_since(noisy.execution_id, 0, 2_000)
        assert len(kept) == 1000  # the stream's cap (max_events)
        assert missed == kept[0].id - 1  # what the cap trimmed reads as missed
        assert kept[-1].id == EVENTS_PENDING  # the ones past the outbox's bound were dropped
        assert await a.flush(time.monotonic() + 1.0) == []  # nothing owed: no end unrecorded
    finally:
        await closed(a)


@pytest.mark.parametrize("kind", ["memory", pytest.param("redis", marks=needs_redis)])
async def test_a_key_for_another_request_is_refused_and_expires(kind: str, redis_url: str) -> None:
    from agent_server.store.base import Idempotency, IdempotencyMismatch

    store: ExecutionStore = (
        MemoryStore("A") if kind == "memory" else open_redis(redis_url, "A", Recorder())
    )
    await store.open()
    try:
        first = Execution("echo", None, "A")
        assert await store.create(first, Idempotency("k", "one", 0.3)) is None
        with pytest.raises(IdempotencyMismatch):
            await store.create(Execution("echo", None, "A"), Idempotency("k", "two", 0.3))
        second = Execution("echo", None, "A")

        async def reusable() -> bool:  # the key expires after its TTL: a new request may use it
            try:
                return await store.create(second, Idempotency("k", "two", 0.3)) is None
            except IdempotencyMismatch:
                return False

        assert await eventually(reusable, timeout=5.0)
        assert await store.get(second.execution_id) is not None
    finally:
        await closed(store)


async def test_an_end_notice_carries_the_record_so_waiters_elsewhere_need_no_read(
    redis_url: str,
) -> None:
    """B's waiters get the records from the notice itself: no `get` on B after the end;
    a record too large for a notice goes by id and B reads it."""
    from agent_server.store.redis import NOTICE_RECORD_MAX

    a, b_seen = open_redis(redis_url, "A", Recorder()), Recorder()
    b = open_redis(redis_url, "B", b_seen)
    await a.open()
    await b.open()
    try:
        small = Execution("echo", "s-1", "A")
        large = Execution("echo", None, "A")
        for execution in (small, large):
            await a.create(execution)
        seen = [await b.get(e.execution_id) for e in (small, large)]
        waiters = [asyncio.create_task(b.wait(e, 10.0)) for e in seen if e is not None]
        for execution in (small, large):
            await eventually(lambda e=execution: asyncio.sleep(0, is_waiting(b, e)))
        reads_before = b_seen.operations.count(("get", True))
        small.finish(ExecutionStatus.SUCCEEDED, result={"text": "é" * 10})
        large.finish(
            ExecutionStatus.FAILED, error={"type": "X", "message": "x" * NOTICE_RECORD_MAX}
        )
        a.end(small)
        a.end(large)
        got_small, got_large = await asyncio.wait_for(asyncio.gather(*waiters), BOUND)
        assert got_small.to_json() == small.to_json()
        assert got_large.to_json() == large.to_json()
        # One read, for the large one; the small one came with its notice.
        assert b_seen.operations.count(("get", True)) - reads_before == 1
        read = await b.get(small.execution_id)
        assert read is not None and read.to_json() == got_small.to_json()
    finally:
        await closed(a)
        await closed(b)


async def test_a_malformed_end_notice_is_read_instead_and_the_listener_lives_on(
    redis_url: str, redis_server: RedisServer
) -> None:
    """A notice whose record does not parse wakes its waiter to read the record; one that is
    not JSON is ignored; either way the pub/sub reader goes on serving later notices."""
    a, b = open_redis(redis_url, "A", Recorder()), open_redis(redis_url, "B", Recorder())
    await a.open()
    await b.open()
    try:
        first, second = Execution("echo", None, "A"), Execution("echo", None, "A")
        for execution in (first, second):
            await a.create(execution)
        seen = await b.get(first.execution_id)
        assert seen is not None
        waiter = asyncio.create_task(b.wait(seen, 10.0))
        await eventually(lambda: asyncio.sleep(0, is_waiting(b, first)))
        # The end written behind the store's back (no notice of its own), then two bad notices.
        record = b.keys.record(first.execution_id)
        fields = ("status", "succeeded", "result", '"one"', "finished_at", repr(time.time()))
        assert redis_server.command("HSET", record, *fields) is not None
        channel = b.keys.ends
        bad_row = [first.execution_id, *["?"] * 12]  # status "?" is no status
        for data in ("[not json", json.dumps([bad_row])):
            assert redis_server.command("PUBLISH", channel, data) is not None
        found = await asyncio.wait_for(waiter, BOUND)
        assert found.status is ExecutionStatus.SUCCEEDED and found.result == "one"
        seen = await b.get(second.execution_id)
        assert seen is not None
        later = asyncio.create_task(b.wait(seen, 10.0))
        await eventually(lambda: asyncio.sleep(0, is_waiting(b, second)))
        second.finish(ExecutionStatus.SUCCEEDED, result="two")
        a.end(second)
        found = await asyncio.wait_for(later, BOUND)
        assert found.result == "two"
        assert all(task.get_name() != "store-pubsub" or not task.done() for task in b._tasks)
    finally:
        await closed(a)
        await closed(b)


async def every_page(store: ExecutionStore, most: int, **filters: Any) -> list[str]:
    """Every id the list gives, page after page through its cursors (at most `most` pages),
    each page's cursors one per execution."""
    seen: list[str] = []
    after: str | None = None
    for _ in range(most):
        cursor = None if after is None else ListCursor.read(after)
        page = await store.page(after=cursor, **filters)
        assert len(page.cursors) == len(page.executions)
        seen += [e.execution_id for e in page.executions]
        if page.next is None:
            return seen
        after = page.next
    raise AssertionError("pages never ended")
