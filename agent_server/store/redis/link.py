"""The store's connections to one Redis, and whether it is up.

The scripts go through one multiplexed connection (`resp.RedisLink`), the renewal through a
twin of its own (the probe: it never waits behind other commands' replies), pub/sub through
a third; the rare commands through redis-py's pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.redis import libraries, scripts, sentinel
from agent_server.store.redis.codec import scrub
from agent_server.store.redis.failures import (
    UNREACHABLE,
    on_a_replica,
    refused_for_now,
    reset,
    slow,
)
from agent_server.store.redis.resp import Acknowledgement, RedisLink

logger = logging.getLogger("agent_server.store")

#: Bounded waits: an unreachable Redis never hangs a request.
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 2.0
#: Seconds the probe goes unanswered before the store turns down (a refused or reset
#: connection turns it down at once): longer than one command timeout, so one slow reply
#: never does, and a Redis gone is said within two.
SUSTAINED = 1.5 * COMMAND_TIMEOUT
#: Connections to Redis per replica; past it, an operation waits (bounded) for one.
MAX_CONNECTIONS = 64
#: With Sentinel, how long a write waits for the replicas to hold it (`WAIT n <ms>`): a
#: quarter of COMMAND_TIMEOUT, since what is sent behind a `WAIT` on its connection waits too.
REPLICA_WAIT_MS = round(COMMAND_TIMEOUT * 1000 / 4)
#: Seconds a lower count of replicas to wait for must hold before told writes wait for
#: fewer: a replica the sentinels just promoted drops out of the old primary's count before
#: they announce it (about 1 s, ../notes) and the store follows; writes the old primary
#: takes meanwhile, held only by the others, would be lost in their resync.
COUNT_HOLD = 2.0


class Operation:
    """`Link.operation`: a plain context manager (it awaits nothing itself), on the path of
    every store call. Only the probe's failure, or a connection Redis refused or reset,
    turns the store down: a command that is merely slow (a big read, a full pool) fails
    alone and has the probe ask again now (readiness is reachability, not one request's
    cost), and the probe itself going unanswered turns it down only when the probe asked
    again at once goes unanswered too (`Link.probe_slow`)."""

    __slots__ = ("link", "name", "probe", "since", "started")

    def __init__(
        self, link: Link, name: str, probe: bool = False, since: float | None = None
    ) -> None:
        self.link = link
        self.name = name
        self.probe = probe
        #: When it began, if before the block (a pipeline sent earlier, its replies read now).
        self.since = since
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter() if self.since is None else self.since

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        link = self.link
        if error is None:
            link.report(self.name, self.started, True)
            if self.probe:
                link.slow_since = None
            link.set_up(True)
            return
        if isinstance(error, Exception):
            link.report(self.name, self.started, False)
        if isinstance(error, UNREACHABLE) or reset(error):
            if not slow(error):
                link.set_up(False)
            elif self.probe:
                link.probe_slow(self.started)
            else:
                link.renew_now.set()
            raise StoreUnavailable(f"Redis at {link.where}: {link.scrub(str(error))}") from error
        if refused_for_now(error):  # Redis answers, and refuses this for now: not down
            raise StoreUnavailable(f"Redis at {link.where}: {link.scrub(str(error))}") from error


class Link:
    """The connections, opened together and closed together, and the up/down state their
    outcomes decide."""

    def __init__(
        self,
        url: str,
        *,
        where: str,
        common: tuple[bytes | int, ...],
        observer: StoreObserver | None,
        on_up: Callable[[], None],
        renew_now: asyncio.Event,
        libraries: str,
        acked_channel: str | None = None,
    ) -> None:
        self.url = url
        #: The registry of the scripts' libraries (libraries.py).
        self.libraries = libraries
        #: With Sentinel: the channel published to before each `WAIT` of a told write.
        self.acked_channel = acked_channel
        self.where = where
        #: The arguments every script takes first, as bytes: packed as they are.
        self.common = common
        self.observer = observer
        self._on_up = on_up
        #: Set to have the probe ask again now (the renewal waits on it).
        self.renew_now = renew_now
        self.client: aioredis.Redis | None = None
        #: The scripts' connection (one, multiplexed); redis-py's pool serves the rest.
        self.link: RedisLink | None = None
        #: The subscriber (a twin of `link`): end notices, cancel requests, queued work.
        self.subscriber: RedisLink | None = None
        #: The probe's own connection (another twin): the renewal, which decides whether
        #: the store is up, never waits behind other commands' replies.
        self.probe: RedisLink | None = None
        #: With Sentinel, the told writes' connection (another twin): each write is answered
        #: once the replicas hold it (`told`), and no other command waits behind its `WAIT`.
        self.acked: RedisLink | None = None
        #: With Sentinel, the sentinels asked after each `WAIT` whether it can be trusted:
        #: a failover under way, or another primary named, makes the write in doubt.
        self.lookout: sentinel.Lookout | None = None
        #: With Sentinel, how many replicas hold a write before it is told: every one the
        #: sentinels could promote (at least one), as their watch last counted.
        self.replicas_needed = 1
        self.acknowledgement = Acknowledgement(self.acknowledging(1))
        #: Since when (monotonic) the sentinels have counted fewer replicas than needed.
        self._fewer_since: float | None = None
        self.up = False
        #: When the probe's unbroken run of unanswered renewals began (perf_counter), None
        #: while it is answered.
        self.slow_since: float | None = None

    @property
    def is_open(self) -> bool:
        return self.client is not None

    @property
    def redis(self) -> aioredis.Redis:
        if self.client is None:
            raise StoreUnavailable(f"the store at {self.where} is not open")
        return self.client

    @property
    def scripts(self) -> RedisLink:
        if self.link is None:
            raise StoreUnavailable(f"the store at {self.where} is not open")
        return self.link

    def scrub(self, text: str) -> str:
        return scrub(self.url, text)

    def connect(self) -> None:
        """Make the connections (each connects on first use)."""
        try:
            if sentinel.is_sentinel_url(self.url):  # both find the primary through Sentinel
                client, link = sentinel.connect(
                    self.url,
                    max_connections=MAX_CONNECTIONS,
                    timeout=COMMAND_TIMEOUT,
                    connect_timeout=CONNECT_TIMEOUT,
                    on_replicas=self.need_replicas,
                )
            else:
                # A bounded pool that makes an operation wait (at most COMMAND_TIMEOUT) for a
                # free connection: a burst past the bound is queued, not refused as an outage.
                pool = aioredis.BlockingConnectionPool.from_url(
                    self.url,
                    max_connections=MAX_CONNECTIONS,
                    timeout=COMMAND_TIMEOUT,
                    socket_connect_timeout=CONNECT_TIMEOUT,
                    socket_timeout=COMMAND_TIMEOUT,
                    socket_keepalive=True,
                    decode_responses=True,
                    retry=Retry(NoBackoff(), 0),  # our callers retry; a command fails fast
                )
                client = aioredis.Redis.from_pool(pool)  # closing the client closes its pool
                link = RedisLink(self.url, connect_timeout=CONNECT_TIMEOUT, timeout=COMMAND_TIMEOUT)
        except ValueError as exc:
            reason = self.scrub(str(exc))
            raise StoreUnavailable(f"invalid store URL for {self.where}: {reason}") from None
        self.client = client
        self.link = link
        self.subscriber = link.twin()
        self.probe = link.twin()
        if self.acked_channel is not None:
            self.acked = link.twin(ack=self.acknowledgement)
            if sentinel.is_sentinel_url(self.url):
                budget = REPLICA_WAIT_MS / 1000
                self.lookout = sentinel.Lookout(sentinel.parse_url(self.url), budget)

    def acknowledging(self, replicas: int) -> list[list[str | int]]:
        """The commands after a group of told writes: a publish (so a write-free `WAIT`
        still has an offset to wait for) and `WAIT replicas <ms>`."""
        return [["PUBLISH", self.acked_channel or "", ""], ["WAIT", replicas, REPLICA_WAIT_MS]]

    def need_replicas(self, promotable: int, failing_over: bool = False) -> None:
        """The sentinels' count of replicas they could promote: told writes wait for each.
        A higher count applies at once; a lower one only once it has held COUNT_HOLD
        seconds with no failover under way."""
        needed = max(1, promotable)
        if needed >= self.replicas_needed or failing_over:
            self._fewer_since = None
        if needed == self.replicas_needed or (needed < self.replicas_needed and failing_over):
            return
        if needed < self.replicas_needed:
            now = time.monotonic()
            if self._fewer_since is None:
                self._fewer_since = now
            if now - self._fewer_since < COUNT_HOLD:
                return
            self._fewer_since = None
        logger.info(
            "told writes wait for %d replica%s of %s", needed, "s"[: needed - 1], self.where
        )
        self.replicas_needed = needed
        self.acknowledgement.set(self.acknowledging(needed))

    async def ping(self) -> None:
        """Reach Redis and load the scripts."""
        await cast(Awaitable[Any], self.redis.ping())
        await self.load_scripts()

    def detach(self) -> aioredis.Redis | None:
        """The pool's client, taken: from now on the store reads as closed."""
        client, self.client = self.client, None
        return client

    async def disconnect(self, client: aioredis.Redis | None) -> None:
        if client is not None:
            with contextlib.suppress(Exception):
                await client.aclose()
        for each in (self.link, self.subscriber, self.probe, self.acked):
            if each is not None:
                with contextlib.suppress(Exception):
                    await each.close()
        self.link = self.subscriber = self.probe = self.acked = None
        lookout, self.lookout = self.lookout, None
        if lookout is not None:
            await lookout.close()

    def operation(self, name: str, probe: bool = False, since: float | None = None) -> Operation:
        """Time and report one operation (from `since`, a `time.perf_counter()`, if given);
        an unreachable Redis becomes StoreUnavailable. The probe's failure, or a refused or
        reset connection, turns the store down until an operation succeeds again."""
        return Operation(self, name, probe, since)

    def report(self, name: str, started: float, ok: bool) -> None:
        if self.observer is not None:
            self.observer.store_operation(name, time.perf_counter() - started, ok)

    def probe_slow(self, started: float) -> None:
        """The probe went unanswered past the command timeout: a slow reply (Redis busy
        with one long command, a connection held up) as well as a Redis gone. The first
        time, it asks again at once on a fresh connection; the store turns down only when
        Redis has left the probe unanswered for SUSTAINED seconds (two timeouts in a row):
        readiness reflects reachability, not one slow operation (section 12, invariant 5)."""
        if self.slow_since is None:
            self.slow_since = started
        if time.perf_counter() - self.slow_since >= SUSTAINED:
            self.set_up(False)
        else:
            self.renew_now.set()

    def set_up(self, up: bool) -> None:
        if up == self.up:
            return
        self.up = up
        if up:
            self.renew_now.set()  # renew this replica's liveness now
            logger.info("store %s reachable", self.where)
            self._on_up()
        else:
            logger.warning("store %s unreachable", self.where)
        if self.observer is not None:
            self.observer.store_up(up)

    async def load_scripts(self, via: RedisLink | None = None) -> None:
        """Load every script's library on the node `via` is connected to (the pool's client
        when None), and delete those no replica of this agent loaded for a day. A missing
        function is answered on the node that said so: after a failover the pool's client
        may still name the old primary while the link already follows the new one."""
        call = via.call if via is not None else self.redis.execute_command
        await libraries.load(call, self.libraries)

    def command(self, name: str, keys: Sequence[str | bytes], args: Sequence[Any]) -> list[Any]:
        """The FCALL of script `name` with its keys and arguments (common ones first)."""
        return [*scripts.FCALL[name], len(keys), *keys, *self.common, *args]

    async def script(
        self, name: str, keys: Sequence[str | bytes], *args: Any, via: RedisLink | None = None
    ) -> Any:
        """FCALL (on the scripts' link, or `via`), loading the libraries again if Redis has
        none of this script's (a new Redis, or one whose functions were flushed)."""
        link = self.scripts if via is None else via
        try:
            return await link.call(*self.command(name, keys, args))
        except NoScriptError:
            await self.load_scripts(link)
            return await link.call(*self.command(name, keys, args))

    async def told(self, name: str, keys: Sequence[str | bytes], *args: Any) -> tuple[Any, bool]:
        """A write whose outcome a client is told: the script's reply, and whether the
        replicas hold it. Without Sentinel (no `acked` connection) always True, as there is
        no replica to promote. With it, False when `WAIT` found fewer than every replica the
        sentinels could promote within REPLICA_WAIT_MS (or the connection went before it
        answered): the write may survive or vanish. A count that changed meanwhile is met
        only at its larger value. Even then False unless the sentinels, asked after the
        `WAIT` answered, show no failover under way and name the node the write went to the
        primary (`sentinel.Lookout`): from a failover's beginning until every sentinel names
        the new primary, the old one's `WAIT` proves nothing."""
        link = self.acked
        if link is None:
            return await self.script(name, keys, *args), True
        needed = self.replicas_needed
        try:
            reply, acked, where = await link.call_acked_at(*self.command(name, keys, args))
        except NoScriptError:
            await self.load_scripts(link)
            reply, acked, where = await link.call_acked_at(*self.command(name, keys, args))
        held = on_a_replica(acked, max(needed, self.replicas_needed))
        if held and self.lookout is not None:
            held = await self.lookout.confirm(where)
        return reply, held
