"""Accepted work runs with the input it was accepted with, and nothing is left `running`
with no task: a create or a claim the store ran while its answer was lost, on Redis and on
Postgres alike.

A `CutProxy` (a plain TCP proxy) stands between replica A and the store, and holds the
reply to A's write while replica B, connected directly, already reads what it wrote: on
Postgres the reply that says the write is done (`COMMIT`, or a plain start's one-statement
`INSERT`), so the write reached the server and its answer is what is
lost; on Redis every reply. Then the caller is cut (its task cancelled: the listener's close
at shutdown, a client gone) or the connection is reset. The row is `running` under A, which
runs nothing for it; it must run here after all, or go back to the queue for its first run
(attempt unchanged, its body kept), while A lives and at A's close at the latest. A take of
an earlier process of A's replica id is judged as a dead owner's. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerOptions
from agent_server.runtime.registry import InFlightRegistry
from agent_server.store import ExecutionStore, StoreUnavailable
from tests.support.faults import CutProxy
from tests.support.stores import (
    COMMITTED,
    Recorder,
    closed,
    eventually,
    open_postgres,
    open_redis,
    proxied,
)

#: Bound on every wait here (seconds).
BOUND = 10.0
#: A lease that outlasts every held reply: the owner stays alive throughout.
LEASE = 8.0

Opener = Callable[..., Awaitable[Any]]


def hold_answers(proxy: CutProxy, url: str) -> None:
    """Hold the store's answers to A: on Postgres the replies that say a write is done
    (COMMIT, or a plain start's INSERT: the write is on the server, its answer on its way),
    on Redis every reply."""
    if url.startswith("postgres"):
        proxy.stall(COMMITTED, 3.0)
    else:
        proxy.stall(b"", 1.0)


@pytest.fixture
async def pair(store_url: str) -> AsyncIterator[tuple[Any, Any, CutProxy, Opener]]:
    """(A through a proxy, B direct, the proxy, `opener(replica_id)` for one more store on
    the store directly); all closed at the end."""
    port = urlsplit(store_url).port
    assert port is not None
    proxy = CutProxy(port)
    proxy.start()
    make = open_postgres if store_url.startswith("postgres") else open_redis
    opened: list[ExecutionStore] = []

    async def opener(replica_id: str, url: str = store_url) -> Any:
        store = make(url, replica_id, Recorder(), lease_ttl=LEASE)
        await store.open()
        opened.append(store)
        return store

    a = await opener("A", proxied(store_url, proxy.port))
    b = await opener("B")
    try:
        yield a, b, proxy, opener
    finally:
        proxy.unstall()
        proxy.restore()
        for store in reversed(opened):
            await closed(store)
        proxy.stop()


async def needs_key(key: str) -> dict[str, str]:
    """A reasoner whose input has a required field: run with no input, it fails to bind."""
    return {"key": key}


async def status_of(store: ExecutionStore, execution_id: str, status: ExecutionStatus) -> Any:
    """The record once it reads `status` (bounded; the failure names the last one read)."""
    last: list[Execution | None] = [None]

    async def reached() -> Execution | None:
        try:
            last[0] = found = await store.get(execution_id)
        except StoreUnavailable:
            return None
        return found if found is not None and found.status is status else None

    try:
        return await eventually(reached, timeout=BOUND)
    except AssertionError:
        seen = last[0]
        raise AssertionError(f"not {status.value}: {seen and seen.to_json()}") from None


@pytest.mark.parametrize("put_back_by", ["repair", "close"])
async def test_a_start_cut_while_its_create_commits_runs_once_elsewhere_with_its_input(
    pair: tuple[Any, Any, CutProxy, Opener], store_url: str, put_back_by: str
) -> None:
    """A synchronous start of a plain reasoner (not resumable) whose caller is cut while
    its create is on its way (the listener's close at shutdown; a client gone), the store
    having recorded it: `running` under A with no task. Put back on the queue by A's repair
    while A lives, or at A's close, its first run elsewhere binds the request's input:
    never `running` for good, never `lost` or `failed` unrun."""
    a, b, proxy, _ = pair
    registry = InFlightRegistry(a, max_inflight=10)
    a.deliver_orphans(registry.runs, registry.adopt)
    reasoner = Reasoner(needs_key, ReasonerOptions("needs_key"))
    body = {"key": "k-1"}
    announced: list[Execution] = []
    hold_answers(proxy, store_url)
    start = asyncio.create_task(
        registry.start_once(reasoner, reasoner.bind(body), body=body, announce=announced.append)
    )

    async def created() -> Execution | None:  # by the store, read past the proxy
        return None if not announced else await b.get(announced[0].execution_id)

    record = await eventually(created, timeout=BOUND)
    assert record.status is ExecutionStatus.RUNNING and record.replica == "A"
    assert not start.done()
    start.cancel()  # the caller is cut: its create's answer is never read
    with pytest.raises(asyncio.CancelledError):
        await start
    proxy.unstall()
    if put_back_by == "close":
        await closed(a)
    found = await status_of(b, record.execution_id, ExecutionStatus.QUEUED)
    assert (found.replica, found.attempt) == ("", 1)
    assert not registry.runs(record.execution_id)
    claimed = await b.claim()
    assert claimed is not None and claimed.execution_id == record.execution_id
    assert (claimed.attempt, claimed.body) == (1, body)
    assert reasoner.bind(claimed.body) == {"key": "k-1"}


@pytest.mark.parametrize("adopted", [True, False])
async def test_a_create_whose_answer_was_lost_runs_here_or_is_queued_for_its_first_run(
    pair: tuple[Any, Any, CutProxy, Opener], store_url: str, adopted: bool
) -> None:
    """The connection is reset once the store recorded the create, before its answer came
    (the start answers 503). The owner runs it after all (its registry still has it) or
    puts it on the queue for its first run on any replica, with its body; never `running`
    for good with no task anywhere."""
    a, b, proxy, _ = pair
    adoptions: list[str] = []

    def adopt(execution_id: str) -> bool:
        adoptions.append(execution_id)
        return adopted

    a.deliver_orphans(lambda execution_id: execution_id in adoptions and adopted, adopt)
    execution = Execution("sleep", None, "A")
    execution.body = {"seconds": 0.25}  # every record keeps its start's body
    hold_answers(proxy, store_url)
    create = asyncio.create_task(a.create(execution))

    async def recorded() -> Execution | None:
        return await b.get(execution.execution_id)

    await eventually(recorded, timeout=BOUND)
    assert not create.done()
    proxy.cut("reset")  # the answer is lost with the connection
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(create, BOUND)
    proxy.unstall()
    proxy.restore()
    if adopted:
        await eventually(lambda: asyncio.sleep(0, bool(adoptions)), timeout=BOUND)
        found = await b.get(execution.execution_id)
        assert found is not None
        assert (found.status, found.replica) == (ExecutionStatus.RUNNING, "A")
    else:
        found = await status_of(b, execution.execution_id, ExecutionStatus.QUEUED)
        assert (found.replica, found.attempt) == ("", 1)
        claimed = await b.claim()
        assert claimed is not None and claimed.execution_id == execution.execution_id
        assert (claimed.replica, claimed.attempt, claimed.body) == ("B", 1, {"seconds": 0.25})
    assert adoptions == [execution.execution_id]


async def test_a_claim_whose_answer_was_lost_is_queued_again_for_its_first_run(
    pair: tuple[Any, Any, CutProxy, Opener], store_url: str
) -> None:
    """A claim the store ran, its answer lost with the connection: A never starts what it
    took, and the row says `running` under A. A's repair, while A lives, puts it back with
    its attempt unchanged: the next claim takes it as attempt 1 with its body (never
    attempt 2, which a non-resumable reasoner refuses, nor `lost`)."""
    a, b, proxy, _ = pair
    a.deliver_orphans(lambda _: False, lambda _: pytest.fail("nothing to adopt"))
    execution = Execution("sleep", None, "B")
    execution.body = {"seconds": 0.25}
    execution.enqueue(None)
    assert await b.create(execution, max_queued=10) is None
    hold_answers(proxy, store_url)
    claim = asyncio.create_task(a.claim())
    taken = await status_of(b, execution.execution_id, ExecutionStatus.RUNNING)
    assert taken.replica == "A" and not claim.done()
    proxy.cut("reset")
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(claim, BOUND)
    proxy.unstall()
    proxy.restore()
    found = await status_of(b, execution.execution_id, ExecutionStatus.QUEUED)
    assert (found.replica, found.attempt) == ("", 1)
    claimed = await b.claim()
    assert claimed is not None and claimed.execution_id == execution.execution_id
    assert (claimed.replica, claimed.attempt, claimed.body) == ("B", 1, {"seconds": 0.25})


@pytest.mark.parametrize("attempts", [1, 3])
async def test_a_begun_take_of_an_earlier_process_of_the_replica_id_is_judged_as_a_dead_owners(
    pair: tuple[Any, Any, CutProxy, Opener], attempts: int
) -> None:
    """A replica id used again (a pod restarted under its name): the new process finds a
    running record the id owns, which an earlier process claimed and began, and runs no
    task for it. Its lease is the new process's and stays live, so nobody else judges it:
    the new process does, as a dead owner's: the next attempt queued while attempts are
    left, else `lost`; never `running` for good."""
    _, b, _, opener = pair
    earlier = await opener("C")
    execution = Execution("sleep", None, "B")
    execution.body, execution.max_attempts = {"seconds": 0.25}, attempts
    execution.resumable = attempts > 1
    execution.enqueue(None)
    assert await b.create(execution, max_queued=10) is None
    taken = await earlier.claim()
    assert taken is not None and taken.execution_id == execution.execution_id
    assert await earlier.begin(taken)  # its body began in that process
    later = await opener("C")  # the same id, a new process
    later.deliver_orphans(lambda _: False, lambda _: pytest.fail("nothing to adopt"))

    async def judged() -> Execution | None:
        found = await b.get(execution.execution_id)
        return None if found is None or found.status is ExecutionStatus.RUNNING else found

    found = await eventually(judged, timeout=BOUND)
    if attempts > 1:
        assert (found.status, found.replica, found.attempt) == (ExecutionStatus.QUEUED, "", 2)
    else:
        assert (found.status, found.attempt) == (ExecutionStatus.LOST, 1), found.to_json()
        assert found.error is not None and found.error["type"] == "ExecutionLost"


async def test_an_earlier_process_s_claim_never_begun_runs_as_its_first_run(
    pair: tuple[Any, Any, CutProxy, Opener],
) -> None:
    """A replica id used again: the earlier process claimed a queued start but never began
    it (its begin never written), and is gone. The record says so (its `unbegun` mark): the
    new process's repair puts it back with its attempt unchanged, as the judge does a dead
    owner's unbegun take; not attempt 2 (a plain reasoner refuses it), nor `lost`."""
    _, b, _, opener = pair
    earlier = await opener("C")
    execution = Execution("sleep", None, "B")
    execution.body = {"seconds": 0.25}
    execution.enqueue(None)
    assert await b.create(execution, max_queued=10) is None
    taken = await earlier.claim()
    assert taken is not None and taken.execution_id == execution.execution_id
    later = await opener("C")  # the same id, a new process; `earlier` never begins it
    later.deliver_orphans(lambda _: False, lambda _: pytest.fail("nothing to adopt"))

    async def requeued() -> Execution | None:
        found = await b.get(execution.execution_id)
        return found if found is not None and found.status is ExecutionStatus.QUEUED else None

    found = await eventually(requeued, timeout=BOUND)
    assert (found.replica, found.attempt) == ("", 1)
    claimed = await b.claim()
    assert claimed is not None and (claimed.attempt, claimed.body) == (1, execution.body)
    assert not await earlier.begin(taken)  # fenced: the take is no longer its
