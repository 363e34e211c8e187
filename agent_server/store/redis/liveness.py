"""This replica's liveness, and the repair of what an unanswered command may have left.

The renewal is one script call every lease_ttl/3, whatever the number of executions, and
also sweeps the running work of dead replicas; it goes through the probe's connection, so
its outcome says whether Redis is reachable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from typing import Any

from agent_server.model.execution import Execution, ExecutionStatus, log_fields
from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.redis.codec import RowCodec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import COMMAND_TIMEOUT, Link
from agent_server.store.redis.notices import WAKE_BATCH
from agent_server.store.redis.scripts import Row

logger = logging.getLogger("agent_server.store")

#: Records of dead replicas moved to `lost` per sweep (the sweep runs every lease_ttl/3).
SWEEP_LIMIT = 100
#: Owned records looked at per repair; the rest wait for the next one.
ORPHAN_SCAN = 10_000
#: Claims without an answer remembered (each a token of 16 characters), the oldest first:
#: they keep the repair due while Redis may yet run them (what the repair decides rests on
#: the record, not on this memory).
UNANSWERED_CLAIMS = 10_000
#: Seconds the token of a claim Redis ran but no replica was seen to hold is remembered: a
#: failover can bring that claim back (a replica got it after the `WAIT`) until the record
#: is written again, for as long as a Sentinel failover takes (its defaults: a primary down
#: after 30 s, a failover given 180 s).
UNHELD_CLAIM_SECONDS = 300.0
#: What follows the incarnation in a create's token (a claim's is hex alone).
START = "s"


class Liveness:
    """The renewal loop, and what it repairs after each renewal (section 12, invariant 3)."""

    def __init__(
        self,
        link: Link,
        codec: RowCodec,
        keys: Keys,
        *,
        replica_id: str,
        lease_ttl: float,
        observer: StoreObserver | None,
        renew_now: asyncio.Event,
        queued: asyncio.Event,
        owed: Callable[[], set[str]],
        end: Callable[[Execution], None],
        hand_off: Callable[[Execution], None],
        unclaim: Callable[[Execution, str], None],
        cancel: Callable[[str], None],
    ) -> None:
        self._link = link
        self._codec = codec
        self._keys = keys
        self._replica_id = replica_id
        self._lease_ttl = lease_ttl
        self._observer = observer
        self.renew_now = renew_now
        self._queued = queued
        self._owed = owed
        self._end = end
        self._hand_off = hand_off
        self._unclaim = unclaim
        self._cancel = cancel
        #: This process among those that used its replica id: every take (a create, a
        #: claim) writes a token opening with it into the record (`claim`), so the repair
        #: knows what this process took, hence whether it began the body (`repair`).
        self.incarnation = os.urandom(4).hex()
        self._running: Callable[[], Collection[str]] = tuple
        self._vanish: Callable[[str], object] | None = None
        #: Tokens of claims sent without an answer or not held by a replica, with until
        #: when each may yet show in a record (monotonic): the repair stays due meanwhile.
        self._unanswered: OrderedDict[str, float] = OrderedDict()
        #: Creates sent without an answer (Redis may run them yet), settled by `repair`,
        #: by their take's token: a schedule's firing tried again sends its id again.
        self.in_doubt: dict[str, Execution] = {}
        #: Ids whose create is on its way: not orphans, whatever the store says.
        self.creating: set[str] = set()
        #: Tokens of claims on their way: what one took is not an orphan, whatever the
        #: store says (its answer, read after the repair's, may yet start it here).
        self.claiming: set[str] = set()
        #: Whether this replica may own running records it runs nothing for: after a create
        #: or claim that got no answer, and at open (a replica id used before).
        self.repair_due = True
        self._runs: Callable[[str], bool] | None = None
        self._adopt: Callable[[str], bool] | None = None
        #: This replica's versions (versions.py `advert`), shown to the others' claims by
        #: each renewal while `advertising` (until its admission closes).
        self.advert = ""
        self.advertising = True
        #: How this replica describes itself (`GET /replicas`), written with each renewal.
        self.state: Callable[[], dict[str, Any]] | None = None
        #: A claim found this replica's lease lapsed: the next renewal wakes the taker.
        self._wake_taker = False

    def token(self) -> str:
        """A claim's token (16 characters): this process's, and this claim's own (a late
        `unclaim` of an earlier claim of the same attempt is fenced)."""
        return self.incarnation + os.urandom(4).hex()

    def start_token(self) -> str:
        """A create's token: this process's, `START`, then this create's own. Its own, as
        a settle voids one create, not an id another request may send again."""
        return f"{self.incarnation}{START}{os.urandom(4).hex()}"

    def wake_on_renewal(self) -> None:
        """A claim took nothing because this replica's lease had lapsed where it ran (a
        pause, or a new primary that last saw the lease long ago): renew now, and wake the
        taker once that lands, whatever is due; it would otherwise sleep until a notice."""
        self._wake_taker = True
        self.renew_now.set()

    def doubt(self, execution: Execution, limit: int) -> None:
        """A create (its token `execution.take`) got no answer it can trust: Redis may run
        it yet. The repair settles it (at most `limit` remembered)."""
        if len(self.in_doubt) < limit:
            self.in_doubt[execution.take] = execution
        self.repair_due = True

    def unanswered(self, token: str, *, held: bool = True) -> None:
        """A claim got no answer in time: Redis may run it yet, for this replica, which
        will never start what it took. The repair looks (for as long as Redis could still
        run it: its lease check refuses it past this replica's lease). One answered but not
        `held` by a replica (Sentinel) may come back with a failover: looked for longer."""
        seconds = self._lease_ttl + COMMAND_TIMEOUT if held else UNHELD_CLAIM_SECONDS
        self._unanswered[token] = time.monotonic() + seconds
        while len(self._unanswered) > UNANSWERED_CLAIMS:
            self._unanswered.popitem(last=False)
        self.repair_due = True

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._runs = runs
        self._adopt = adopt

    def deliver_vanished(
        self, running: Callable[[], Collection[str]], vanish: Callable[[str], object]
    ) -> None:
        self._running = running
        self._vanish = vanish

    async def keep_alive(self) -> None:
        """Renew every lease_ttl/3, or at once when asked (`renew_now`)."""
        interval = self._lease_ttl / 3
        next_tick = time.monotonic() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_tick - time.monotonic())):
                    await self.renew_now.wait()
            self.renew_now.clear()
            next_tick = time.monotonic() + interval
            try:
                await self.tick()
                await self.repair()
            except StoreUnavailable:
                pass  # counted; the next tick retries
            except Exception:  # a bug, not an outage: say so, and keep renewing
                logger.exception("renewing the liveness of replica %s failed", self._replica_id)

    async def tick(self) -> None:
        link = self._link
        lease_ms = max(1, round(self._lease_ttl * 1000))
        running = self._running()
        with link.operation("renew", probe=True):
            reply = await link.script(
                "tick",
                self._keys.script.for_tick(),
                lease_ms,
                SWEEP_LIMIT,
                len(running),
                self.advert,
                "1" if self.advertising else "0",
                via=link.probe,
            )
            if self.state is not None:  # what GET /replicas shows of this one elsewhere
                text = json.dumps(self.state(), separators=(",", ":"))
                via = link.scripts if link.probe is None else link.probe
                await via.call(b"HSET", self._keys.states, self._replica_id, text)
        if self._observer is not None:
            self._observer.replicas_alive(int(reply[0]))
        if int(reply[1]) or self._wake_taker:  # queued work, in case its notice was
            self._wake_taker = False  # missed, or a claim that waited for this renewal
            self._queued.set()
        for request in reply[3]:  # cancel requests kept for this replica (cancel.lua)
            self._cancel(str(request))
        for row in reply[4:]:
            self._codec.restore(row)
        if int(reply[2]) and running:
            await self.vanished(running)

    async def vanished(self, running: Collection[str]) -> None:
        """This replica's `owned` set holds fewer ids than it runs tasks for: a record may
        have vanished (Redis restarted without persistence, FLUSHALL). Each task whose
        record is gone ends `lost` and frees its slot (a waiter in `ctx.ask` would
        otherwise wait for an answer nobody can give, holding its slot for good)."""
        ids = list(running)
        for start in range(0, len(ids), WAKE_BATCH):
            batch = ids[start : start + WAKE_BATCH]
            with self._link.operation("exists"):
                found = await self._link.scripts.pipeline(
                    [["EXISTS", self._keys.record(execution_id)] for execution_id in batch]
                )
            for execution_id, exists in zip(batch, found, strict=True):
                if exists == 0 and self._vanish is not None:
                    logger.error(
                        "execution %s: its record vanished from Redis at %s (Redis lost its "
                        "data); its task ends lost",
                        execution_id,
                        self._link.where,
                    )
                    self._vanish(execution_id)

    async def repair(self) -> None:
        """Accepted means it runs (section 12, invariant 3). A create that got no answer is
        settled: run here if Redis recorded it after all (with Sentinel, once a replica
        holds it: a body never starts on a record a failover can undo), else that create
        (its take, not its id: a firing's retry sends the id again) is voided so it never
        will be; a recorded one not run here goes back to the queue for its first run.
        Then every running record this replica owns with no task here and no write owed is
        an orphan, judged by whether its body began, which the record says: its take's
        token (`claim`) names the process that took it. One this process took never began
        (a body this process began has its task here, or its end or hand-off owed or
        written): it goes back to the queue, its attempt unchanged, for its first run,
        resumable or not, however long Redis took to answer (accepted work is never failed
        unrun). One an earlier process of this replica id took may have begun, and that
        process is gone: judged as a dead owner's, its next attempt queued if it has
        attempts left (resumable), else `lost`; never `running` for good."""
        await self._settle_doubted()
        if not self.repair_due or self.claiming or self.creating or self._runs is None:
            return
        self.repair_due = False
        # Claims that may yet show in a record (Redis could still run them, or a failover
        # bring them back) keep the repair due: found at a next renewal.
        now = time.monotonic()
        for token in [token for token, until in self._unanswered.items() if until < now]:
            del self._unanswered[token]
        try:
            with self._link.operation("owned"):
                rows = await self._link.script(
                    "owned", self._keys.script.for_owned(self._replica_id), ORPHAN_SCAN
                )
        except StoreUnavailable:
            self.repair_due = True
            raise
        if self._unanswered:
            self.repair_due = True
        self._judge_orphans(rows)

    async def _settle_doubted(self) -> None:
        """Each create that got no answer, settled: run here if Redis recorded it after all
        (with Sentinel, once a replica holds it), else voided; a recorded one not run here
        goes back to the queue for its first run."""
        link = self._link
        while self.in_doubt:
            takes = self._doubted()
            keys, args = self._settle_args(takes)
            with link.operation("settle"):
                rows, held = await link.told("settle", keys, *args)
            if not held:  # Sentinel: a record read now may not survive a failover (nor run)
                self.repair_due = True
                return
            for (token, execution), row in zip(takes, rows, strict=True):
                self.in_doubt.pop(token, None)
                # Only the record this create made: the same id made by another create
                # (a firing tried again) is that one's, and runs or is settled as its own.
                mine = (
                    bool(row)
                    and row[Row.STATUS] == ExecutionStatus.RUNNING
                    and row[Row.REPLICA] == self._replica_id
                )
                if not mine:
                    continue
                execution_id = execution.execution_id
                if self._adopt is not None and self._adopt(execution_id):
                    logger.warning(
                        "execution %s: its start got no answer from Redis in time but was "
                        "recorded; it runs now",
                        execution_id,
                    )
                else:  # not run here (draining, or forgotten): its first run is anyone's
                    self._requeue_unstarted(execution, token)

    def _judge_orphans(self, rows: list[Any]) -> None:
        """The running records this replica owns with no task here, each judged by whether
        its body began (`repair`); one whose take or write is still on its way is looked at
        again at a next renewal."""
        assert self._runs is not None
        owed = self._owed()
        doubted = {execution.execution_id for execution in self.in_doubt.values()}
        for row, max_attempts, token, unbegun in rows:
            execution = self._codec.restore(row)
            key = execution.execution_id
            if self._runs(key):
                continue
            if key in owed or key in self.creating or key in doubted or token in self.claiming:
                # Its take on its way (a claim or create sent while the scan ran, answered
                # after it), in doubt still (settled once a replica holds it), or a write
                # owed (an unclaim Redis may fence, its record taken again meanwhile): the
                # repair looks again at a next renewal.
                self.repair_due = True
                continue
            if token.startswith(self.incarnation):  # taken here: its body never began
                self._requeue_unstarted(execution, token)
            elif unbegun == "1" and execution.status is ExecutionStatus.RUNNING:
                # An earlier process's claim whose body never began (begin.lua never cleared
                # its mark): the same attempt goes back, as judge.lua puts a dead owner's.
                self._requeue_unstarted(execution, token)
            elif int(max_attempts or 0) > 1:
                logger.warning(
                    "execution %s (%s): replica %s owns attempt %d, taken by an earlier "
                    "process of this replica id, and runs no task for it; its next attempt "
                    "is queued",
                    key,
                    execution.reasoner,
                    self._replica_id,
                    execution.attempt,
                    extra={"fields": log_fields(execution)},
                )
                self._hand_off(execution)
            else:
                self._lose_orphan(execution)

    async def release_takes(self) -> None:
        """At close, before this replica's liveness ends: every take of this process whose
        body never began (a create in doubt, a claim unanswered, one that landed while
        draining) goes back to the queue for its first run elsewhere; left owned by a
        replica that stops renewing, it would be judged `lost`, its body never run
        (section 12: accepted work is never failed unrun). A create in doubt is put back
        whether or not a replica holds the settle: nothing starts here, and the claim that
        takes it elsewhere waits for a replica like any. Its unclaims go to the outbox,
        which the caller writes. Raises StoreUnavailable when Redis cannot say. A store no
        registry runs (`deliver_orphans` never called) knows of no task: it leaves all."""
        link = self._link
        if self._runs is None:
            return
        while self.in_doubt:
            takes = self._doubted()
            keys, args = self._settle_args(takes)
            with link.operation("settle"):
                rows, _ = await link.told("settle", keys, *args)
            for (token, execution), row in zip(takes, rows, strict=True):
                self.in_doubt.pop(token, None)
                if (
                    row
                    and row[Row.STATUS] == ExecutionStatus.RUNNING
                    and row[Row.REPLICA] == self._replica_id
                    and not self._runs(execution.execution_id)
                ):
                    self._requeue_unstarted(execution, token)
        with link.operation("owned"):
            rows = await link.script(
                "owned", self._keys.script.for_owned(self._replica_id), ORPHAN_SCAN
            )
        owed = self._owed()
        for row, _, token, _ in rows:
            execution = self._codec.restore(row)
            key = execution.execution_id
            if not self._runs(key) and key not in owed and token.startswith(self.incarnation):
                self._requeue_unstarted(execution, token)
        self._unanswered.clear()
        self.repair_due = False

    def unsettled(self) -> str:
        """What `release_takes` could not settle, for the line that names it."""
        unanswered = len(self._unanswered)
        doubted = sorted({execution.execution_id for execution in self.in_doubt.values()})
        return f"starts in doubt {doubted or 'none'}; claims unanswered {unanswered}"

    def _doubted(self) -> list[tuple[str, Execution]]:
        """The next batch of creates in doubt: (token, execution)."""
        return list(itertools.islice(self.in_doubt.items(), WAKE_BATCH))

    def _settle_args(self, takes: list[tuple[str, Execution]]) -> tuple[list[str], list[str]]:
        """settle.lua's keys, then its arguments: each create's id and token."""
        pairs = [(execution.execution_id, token) for token, execution in takes]
        return self._keys.script.for_settle(pairs), [part for pair in pairs for part in pair]

    def _requeue_unstarted(self, execution: Execution, token: str) -> None:
        """Taken by this process, which never began its body: back to the queue, its
        attempt unchanged, for a first run of that attempt on any replica (resumable or
        not: nothing of it ran)."""
        logger.warning(
            "execution %s (%s): replica %s took attempt %d but never began it (its %s got "
            "no answer from Redis in time), so it never started; it goes back to the queue "
            "for its first run",
            execution.execution_id,
            execution.reasoner,
            self._replica_id,
            execution.attempt,
            "start" if token.startswith(self.incarnation + START) else "claim",
            extra={"fields": log_fields(execution)},
        )
        self._unclaim(execution, token)

    def _lose_orphan(self, execution: Execution) -> None:
        """Taken by an earlier process of this replica id, which is gone: its body may have
        begun there, so it is not run again; `lost`, as the judge has a dead owner's."""
        logger.warning(
            "execution %s (%s): replica %s owns it but runs no task for it (an earlier "
            "process of this replica id took it and is gone); it ends lost",
            execution.execution_id,
            execution.reasoner,
            self._replica_id,
            extra={"fields": log_fields(execution)},
        )
        execution.started_monotonic = time.monotonic() - max(
            0.0, time.time() - execution.created_at
        )
        execution.finish(
            ExecutionStatus.LOST,
            error={
                "type": "ExecutionLost",
                "message": f"an earlier process of replica {self._replica_id} took it and is gone",
            },
        )
        self._end(execution)
