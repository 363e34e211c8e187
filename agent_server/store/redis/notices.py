"""Notices: this replica's one pub/sub connection, and who waits on what it brings.

End notices wake the waiters of an execution (with its record when the notice carries it,
else one read for every waiter woken together), event notices wake readers of its events,
`queued` wakes the queue taker, and cancel requests reach the registry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import orjson

from agent_server.model.execution import CancelReason, Execution
from agent_server.store.base import StoreUnavailable
from agent_server.store.redis.codec import RowCodec, loads
from agent_server.store.redis.failures import UNREACHABLE
from agent_server.store.redis.link import Link
from agent_server.store.redis.outbox import BACKOFF_FIRST, BACKOFF_MAX
from agent_server.store.redis.scripts import FIELDS

logger = logging.getLogger("agent_server.store")

#: A waiter re-reads the record at least this often (covers a missed notice, a lost owner).
REREAD_SECONDS = 1.0
#: Waiters woken together are read in batches of this many ids (one script call each).
WAKE_BATCH = 100
#: End notices remembered, for a waiter that registers just after its notice.
RECENT_ENDS = 10_000

#: Reads records by id (one script call), None for an unknown one.
Reader = Callable[[Sequence[str]], Awaitable[list[Execution | None]]]


def resolve(futures: Iterable[asyncio.Future[Any]], value: Any) -> None:
    """Hand `value` to every waiter still waiting (one may have timed out meanwhile)."""
    for future in futures:
        if not future.done():
            future.set_result(value)


class Notices:
    """The subscriber and the waiters it wakes."""

    def __init__(
        self,
        link: Link,
        codec: RowCodec,
        *,
        replica_id: str,
        ends: str,
        events: str,
        queued: str,
        cancels: str,
        read: Reader,
        cancel: Callable[[str, CancelReason, float | None], object],
        answer: Callable[[str, int, Any], object] | None = None,
    ) -> None:
        self._link = link
        self._codec = codec
        self._replica_id = replica_id
        self._ends_channel = ends
        self._events_channel = events
        self._queued_channel = queued
        self._cancel_channel = cancels
        self._read = read
        self._cancel = cancel
        self._answer = answer
        self.waiters: dict[str, set[asyncio.Future[Execution | None]]] = {}
        self.event_waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: Ids whose end notice woke waiters, read together by `read_woken`.
        self._woken: set[str] = set()
        self._read_due = asyncio.Event()
        #: The last RECENT_ENDS ids whose end was noticed (a waiter that registers just
        #: after its notice reads at once instead of at the next re-read).
        #: An OrderedDict: dropping the oldest is O(1) (a dict's first key, once many were
        #: popped, is found by a scan over the holes they left).
        self._recent_ends: OrderedDict[str, None] = OrderedDict()
        #: Ids whose cancel request was delivered (the last RECENT_ENDS), and whether the
        #: renewal delivered it: the renewal's copy of a request (tick.lua) and its
        #: published one are delivered once between them.
        self._cancels_seen: OrderedDict[str, bool] = OrderedDict()
        #: Set when work may be queued: the queue taker looks.
        self.queued = asyncio.Event()
        #: Work waits for a slot of its concurrency key: every end wakes the taker too.
        self.wake_on_ends = False

    # -- waiting ---------------------------------------------------------------------------

    async def wait(
        self, execution: Execution, timeout: float | None, asked: bool = False
    ) -> Execution:
        """Woken when the end is written: one read for every waiter woken together
        (`read_woken`), none of its own. `execution` is a copy the caller has just read; an
        end noticed since is re-read at once, and a re-read every REREAD_SECONDS covers a
        missed notice or an owner that died. With `asked`, waiting for input counts as an
        end of the wait."""
        if execution.reached_end(asked):
            return execution
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        latest = execution
        key = execution.execution_id
        read_now = key in self._recent_ends  # ended between the caller's read and now
        while True:
            future: asyncio.Future[Execution | None] = loop.create_future()
            waiters = self.waiters.setdefault(key, set())
            waiters.add(future)
            try:
                if read_now:
                    try:
                        found = (await self._read([key]))[0]
                    except StoreUnavailable:
                        if not self._link.is_open:
                            raise
                        found = latest  # keep waiting: the next re-read may reach it
                    if found is None or found.reached_end(asked):
                        return found or latest
                    latest = found
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return latest
                pause = REREAD_SECONDS if remaining is None else min(REREAD_SECONDS, remaining)
                await asyncio.wait({future}, timeout=pause)
                woken = future.result() if future.done() and not future.cancelled() else None
                if woken is not None:
                    if woken.reached_end(asked):
                        return woken
                    latest = woken
                read_now = woken is None  # a notice without a record, or a timed re-read
            finally:
                waiters.discard(future)
                if not waiters and self.waiters.get(key) is waiters:
                    del self.waiters[key]

    async def wait_queued(self, timeout: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self.queued.wait()
        self.queued.clear()

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        self.event_waiters.setdefault(execution_id, set()).add(waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self.event_waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self.event_waiters[execution_id]

    def written(self, execution: Execution) -> None:
        """Its end is in Redis, written here: what the end notice does on other replicas is
        done here, without a read (the notice itself is skipped when it comes back)."""
        key = execution.execution_id
        self._noticed(key)
        resolve(self.waiters.get(key, ()), execution)
        resolve(self.event_waiters.get(key, ()), None)

    def wake_all(self) -> None:
        for futures in self.waiters.values():
            resolve(futures, None)

    def _noticed(self, execution_id: str) -> None:
        """Remember an end for a waiter that registers just after it (the last RECENT_ENDS)."""
        recent = self._recent_ends
        recent[execution_id] = None
        if len(recent) > RECENT_ENDS:
            recent.popitem(last=False)

    # -- the subscriber --------------------------------------------------------------------

    async def subscribe(self) -> asyncio.Future[None]:
        """Subscribe the subscriber link; the future is done when its connection is lost."""
        assert self._link.subscriber is not None
        return await self._link.subscriber.subscribe(
            (self._ends_channel, self._cancel_channel, self._queued_channel, self._events_channel),
            self.dispatch,
        )

    async def listen(self, subscribed: asyncio.Future[None] | None) -> None:
        """The one pub/sub connection of this replica. Reconnects after an outage, then
        wakes every waiter to re-read (notices may have been missed meanwhile)."""
        link = self._link
        backoff = BACKOFF_FIRST
        while True:
            try:
                if subscribed is None:
                    subscribed = await self.subscribe()
                    # What may have been missed meanwhile: every waiter re-reads its record,
                    # the taker looks at the queue, and the renewal returns the cancel
                    # requests kept for this replica (tick.lua) now.
                    self.wake_all()
                    self.queued.set()
                    link.renew_now.set()
                backoff = BACKOFF_FIRST
                await asyncio.shield(subscribed)  # until the connection is lost
                logger.debug("pub/sub connection to %s lost", link.where)
            except UNREACHABLE as exc:
                logger.debug("pub/sub connection to %s lost: %s", link.where, exc)
            except Exception as exc:  # a bug, not an outage: say so, and reconnect
                logger.warning(
                    "pub/sub connection to %s lost (%s: %s); reconnecting",
                    link.where,
                    type(exc).__name__,
                    exc,
                )
            # The probe says whether Redis is reachable: one lost connection is not an
            # outage, and what was missed meanwhile is read again above.
            link.renew_now.set()
            subscribed = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def dispatch(self, channel: str, data: str) -> None:
        """One message of this replica's subscriber; never raises (a bad one is logged)."""
        try:
            self._dispatched(channel, data)
        except Exception:
            logger.exception("a message on %s could not be handled: %r", channel, data[:200])

    def _dispatched(self, channel: str, data: str) -> None:
        if channel == self._ends_channel:
            if self.wake_on_ends:
                self.queued.set()
            for execution_id, row in self._ends(data):
                self._noticed(execution_id)
                if execution_id in self.waiters:
                    found = None if row is None else self._codec.from_notice(row)
                    if found is None:
                        self._woken.add(execution_id)  # read with the others woken
                    else:
                        resolve(self.waiters[execution_id], found)
                resolve(self.event_waiters.get(execution_id, ()), None)
            if self._woken:
                self._read_due.set()
            return
        if channel == self._events_channel:
            for execution_id in data.split():
                resolve(self.event_waiters.get(execution_id, ()), None)
            return
        if channel == self._queued_channel:
            self.queued.set()
            return
        if '"request_id"' in data:  # an answer (answer.lua) on the owner's channel
            self._answered(data)
            return
        self._cancel_request(data)

    def _cancel_request(self, data: str, renewal: bool = False) -> None:
        """`{"id", "reason", "settle_within"}`: to the registry, once per id."""
        try:
            request = orjson.loads(data)
            reason = CancelReason(request["reason"])
            settle_within = request["settle_within"]
            execution_id = str(request["id"])
        except (ValueError, KeyError, TypeError):
            logger.warning("ignored a malformed cancel request: %r", data[:200])
            return
        # One request comes both ways (published, and kept for the renewal): delivered by
        # whichever comes first. A later request published again is delivered again.
        seen = self._cancels_seen
        earlier = seen.get(execution_id)
        if renewal and earlier is not None:
            return  # delivered already (published, or an earlier renewal's)
        seen[execution_id] = renewal
        seen.move_to_end(execution_id)
        if len(seen) > RECENT_ENDS:
            seen.popitem(last=False)
        if earlier is True:
            return  # the publish of the request the renewal delivered
        if renewal:
            logger.info(
                "the cancel request for execution %s reached replica %s through its renewal "
                "(its subscriber had not delivered it)",
                execution_id,
                self._replica_id,
            )
        try:
            self._cancel(execution_id, reason, settle_within)
        except Exception:
            logger.exception("cancel of execution %s failed", execution_id)

    def missed_cancel(self, data: str) -> None:
        """A cancel request kept for this replica (cancel.lua), returned by its renewal: one
        its subscriber missed is delivered now; one delivered already is not again."""
        try:
            self._cancel_request(data, renewal=True)
        except Exception:
            logger.exception("a kept cancel request could not be handled: %r", data[:200])

    def _answered(self, data: str) -> None:
        """`{"id", "request_id", "value"}`: to the `ctx.ask` waiting here. The value is read
        as requests are (integers past 64 bits kept exact)."""
        try:
            message = loads(data)
            execution_id = str(message["id"])
            request_id = int(message["request_id"])
            value = message["value"]
        except (ValueError, KeyError, TypeError):
            logger.warning("ignored a malformed answer: %r", data[:200])
            return
        if self._answer is not None:
            try:
                self._answer(execution_id, request_id, value)
            except Exception:
                logger.exception("the answer to execution %s failed", execution_id)

    def _ends(self, data: str) -> list[tuple[str, list[Any] | None]]:
        """An end notice: ids separated by spaces (a script's), or the `end` script's
        `@{writer} [records and ids]`; each id with its record when the notice carries it.
        This replica's own notices are skipped: `written` handled those ends."""
        if data.startswith("@"):
            writer, _, data = data[1:].partition(" ")
            if writer == self._replica_id:
                return []
        if not data.startswith("["):
            return [(execution_id, None) for execution_id in data.split()]
        try:
            items = orjson.loads(data)
        except ValueError:
            logger.warning("ignored a malformed end notice: %r", data[:200])
            return []
        ends: list[tuple[str, list[Any] | None]] = []
        for item in items:
            if isinstance(item, str):
                ends.append((item, None))
            elif isinstance(item, list) and len(item) == len(FIELDS) and item:
                ends.append((str(item[0]), item))
        return ends

    async def read_woken(self) -> None:
        """One read (many ids) for every waiter woken by end notices since the last one;
        each waiter gets its record without a read of its own."""
        while True:
            await self._read_due.wait()
            self._read_due.clear()
            ids, self._woken = list(self._woken), set()
            for start in range(0, len(ids), WAKE_BATCH):
                batch = ids[start : start + WAKE_BATCH]
                try:
                    rows = await self._read(batch)
                except StoreUnavailable:
                    rows = [None] * len(batch)  # the waiters re-read on their own
                for execution_id, found in zip(batch, rows, strict=True):
                    resolve(self.waiters.get(execution_id, ()), found)
