"""Redis Sentinel: the store finds the primary through the sentinels and follows a failover.

`redis+sentinel://[[user]:password@]host1:26379,host2:26379/SERVICE[/DB]`, redis-py's and
Celery's convention: the hosts are sentinels (asked without a password), the password and the
db are the data nodes'. Both of the store's connections ask the sentinels on every connect:

- the scripts' link (`resp.RedisLink`) through `SentinelLocator`: `SENTINEL
  get-master-addr-by-name`, each sentinel in turn, then `ROLE` on the node it names; a
  `READONLY` reply (a demoted primary) retires the connection, so the next call asks again;
- redis-py's client (pub/sub and the rare commands) through redis-py's own
  `Sentinel.master_for`, bounded like the pool of a plain URL.

While the primary is gone every call fails as unreachable (the outbox keeps the ends,
readiness is 503); the first connect after the new primary is announced reaches it. A
failover that leaves the old primary up and still writable for a while (`SENTINEL FAILOVER`,
a healed partition) drops no connection, so a watch asks the sentinels every WATCH_INTERVAL
and moves both connections off a node they no longer name.

The same watch counts the replicas the sentinels could promote (`promotable`): a told write
is acknowledged once every one of them holds it (`WAIT n`), since a failover may promote any
of them, the one that is behind included (bench/RESULTS.md, "the hole in `WAIT 1`"). And a
`WAIT` is trusted only once a look at every sentinel, begun after it answered, names the node
the primary with no failover under way (`Lookout`): during a failover the old primary's
`WAIT` proves nothing (docs/replicas.md, "A failover under way tells nothing").
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import re
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel, SentinelConnectionPool
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_server.store.redis.resp import Address, RedisLink

logger = logging.getLogger("agent_server.store")

SCHEME = "redis+sentinel"
_PREFIX = SCHEME + "://"
DEFAULT_PORT = 26379
FORM = f"{_PREFIX}[[user]:password@]host:port[,host:port...]/SERVICE[/DB]"
#: Seconds between two looks at where the sentinels say the primary is.
WATCH_INTERVAL = 0.5
#: A replica's link to its primary down longer than this many `down-after-milliseconds`
#: makes Sentinel pass it over when it picks one to promote (sentinel.c, `sentinelSelectSlave`).
LINK_DOWN_FACTOR = 10
#: Sentinel flags that keep a replica from being promoted.
NOT_PROMOTED = frozenset({"s_down", "o_down", "disconnected"})
#: Flags of a failover under way (on the primary as its leader sees it, or on a replica
#: being promoted or moved): while one shows, a replica may vanish from the count only
#: because it stopped following the old primary, not because it cannot be promoted.
FAILING_OVER = frozenset(
    {"failover_in_progress", "promoted", "reconf_sent", "reconf_inprog", "reconf_done"}
)
#: A host name or IPv4 address; an IPv6 address goes in brackets.
_HOST = re.compile(r"[A-Za-z0-9_.-]+")


def is_sentinel_url(url: str) -> bool:
    return url[: len(_PREFIX)].lower() == _PREFIX


def host_port(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class SentinelURL:
    """A parsed `redis+sentinel://` URL; its repr leaves the credentials out."""

    sentinels: tuple[Address, ...]
    service: str
    db: int
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)

    def describe(self) -> str:
        """For messages and logs: the sentinels, the service and the db, never the password."""
        hosts = ",".join(host_port(address) for address in self.sentinels)
        return f"{_PREFIX}{hosts}/{urllib.parse.quote(self.service, safe='')}/{self.db}"

    def node_url(self) -> str:
        """A redis:// URL carrying the data nodes' credentials and db for `RedisLink`; its
        host is a placeholder, as the locator says where to connect."""
        userinfo = ""
        if self.username is not None or self.password is not None:
            userinfo = urllib.parse.quote(self.username or "", safe="")
            if self.password is not None:
                userinfo += ":" + urllib.parse.quote(self.password, safe="")
            userinfo += "@"
        return f"redis://{userinfo}primary/{self.db}"


def parse_url(url: str) -> SentinelURL:
    """Parse, or raise ValueError saying what is wrong. The message names hosts and ports
    only once they parsed as such: never a piece of the URL that may be its password."""
    if not is_sentinel_url(url):
        raise ValueError(f"not a {_PREFIX} URL")
    netloc, _, tail = url[len(_PREFIX) :].partition("/")
    if "?" in netloc or "#" in netloc or "?" in tail or "#" in tail:
        raise ValueError(f"a {_PREFIX} URL takes no options after '?' or '#' (form: {FORM})")
    userinfo, at, hosts = netloc.rpartition("@")
    if "@" in tail:
        raise ValueError(
            f"'@' after the hosts of a {_PREFIX} URL: a '/' in the password is written %2F"
        )
    username = password = None
    if at:
        user, colon, secret = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(secret) if colon else None
    sentinels = tuple(_sentinel(piece, index) for index, piece in enumerate(hosts.split(","), 1))
    path = tail.split("/")
    service = urllib.parse.unquote(path[0])
    if not service:
        raise ValueError(f"a {_PREFIX} URL names the Sentinel service after the hosts ({FORM})")
    db_text = path[1] if len(path) > 1 else ""
    if len(path) > 2 and any(path[2:]):
        raise ValueError(f"a {_PREFIX} URL has at most a service and a db in its path ({FORM})")
    if db_text and not (db_text.isascii() and db_text.isdigit()):
        raise ValueError(f"the db of a {_PREFIX} URL is a whole number ({FORM})")
    return SentinelURL(sentinels, service, int(db_text or 0), username, password)


def _sentinel(piece: str, index: int) -> Address:
    """One `host[:port]` of the host list; `index` counts from 1, for messages."""
    which = f"sentinel {index} of the {_PREFIX} URL"
    if piece.startswith("["):
        host, closed, after = piece[1:].partition("]")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"{which}: brackets hold an IPv6 address") from None
        if not closed or (after and not after.startswith(":")):
            raise ValueError(f"{which}: write an IPv6 address as [address]:port")
        port_text = after[1:] if after else None
    else:
        host, colon, rest = piece.partition(":")
        if not host:
            raise ValueError(f"{which} has no host ({FORM})")
        if not _HOST.fullmatch(host) or ":" in rest:
            raise ValueError(f"{which} is not a host name or address (IPv6 goes in brackets)")
        port_text = rest if colon else None
    if port_text is None:
        return host, DEFAULT_PORT
    if not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
        raise ValueError(f"the port of sentinel {host!r} is not a number from 1 to 65535")
    return host, int(port_text)


def describe(url: str) -> str:
    """`SentinelURL.describe`, or a placeholder for a URL that does not parse."""
    try:
        return parse_url(url).describe()
    except ValueError:
        return f"{_PREFIX}(malformed URL)"


class SentinelLocator:
    """`resp.Locator` for a link: where the sentinels say the primary of `service` is.

    Each sentinel is asked in turn, each given a share of the connect timeout (a share is
    left for the node itself); the one that answered is asked first next time, and moves to
    the back when the node it named says it is not the primary (its view may be behind)."""

    def __init__(self, target: SentinelURL, *, connect_timeout: float) -> None:
        self.service = target.service
        self.sentinels = list(target.sentinels)
        self.connect_timeout = connect_timeout

    async def primary(self) -> Address:
        share = self.connect_timeout / (len(self.sentinels) + 1)
        failures: list[str] = []
        for sentinel in list(self.sentinels):
            where = host_port(sentinel)
            try:
                reply = await _ask(sentinel, share, "get-master-addr-by-name", self.service)
            except TimeoutError:
                failures.append(f"{where}: no answer in {share:.2g} s")
                continue
            except (ConnectionError, ResponseError, OSError) as exc:
                failures.append(f"{where}: {exc}")
                continue
            if not (isinstance(reply, list) and len(reply) == 2 and str(reply[1]).isdigit()):
                failures.append(f"{where}: no primary known for {self.service!r}")
                continue
            self.sentinels.remove(sentinel)
            self.sentinels.insert(0, sentinel)
            return str(reply[0]), int(reply[1])
        raise ConnectionError(
            f"no sentinel named the primary of {self.service!r}: {'; '.join(failures)}"
        )

    def not_primary(self, address: Address) -> None:
        if len(self.sentinels) > 1:
            self.sentinels.append(self.sentinels.pop(0))

    async def promotable(self) -> tuple[int, bool]:
        """How many replicas of the primary the sentinel asked first (the one that last
        named the primary) could promote now, and whether it sees a failover under way;
        ConnectionError when it cannot say."""
        sentinel = self.sentinels[0]
        try:
            async with asyncio.timeout(self.connect_timeout):
                replicas, primary = await _ask_all(
                    sentinel,
                    self.connect_timeout,
                    ("SENTINEL", "replicas", self.service),
                    ("SENTINEL", "master", self.service),
                )
        except (TimeoutError, ResponseError, OSError) as exc:
            raise ConnectionError(f"{host_port(sentinel)}: {exc}") from None
        if isinstance(replicas, Exception) or isinstance(primary, Exception):
            raise ConnectionError(f"{host_port(sentinel)}: no replicas known for {self.service!r}")
        state = _fields(primary)
        down_after = int(state.get("down-after-milliseconds", "0") or 0)
        seen = [_fields(replica) for replica in replicas]
        flags = {flag for each in (state, *seen) for flag in each.get("flags", "").split(",")}
        return sum(promotable(each, down_after) for each in seen), bool(FAILING_OVER & flags)


def _fields(reply: Any) -> dict[str, str]:
    """A Sentinel reply of alternating names and values, as a mapping."""
    items = [str(item) for item in reply] if isinstance(reply, list) else []
    return dict(zip(items[::2], items[1::2], strict=False))


def promotable(replica: Mapping[str, str], down_after_ms: int) -> bool:
    """Whether Sentinel could pick this replica (one entry of `SENTINEL REPLICAS`) to
    promote: seen up, not given priority 0, and its link to the primary not down for long."""
    if NOT_PROMOTED & set(replica.get("flags", "").split(",")):
        return False
    if replica.get("slave-priority", replica.get("replica-priority", "1")) == "0":
        return False
    if replica.get("master-link-status", "ok") == "ok":
        return True
    down_ms = replica.get("master-link-down-time", "0")
    return not down_ms.isdigit() or int(down_ms) <= LINK_DOWN_FACTOR * down_after_ms


async def _ask_all(sentinel: Address, budget: float, *commands: tuple[str, ...]) -> list[Any]:
    """Several commands in one write on a connection of their own, bounded by `budget`."""
    link = RedisLink(f"redis://{host_port(sentinel)}/0", connect_timeout=budget, timeout=budget)
    try:
        async with asyncio.timeout(budget):
            return await link.pipeline(commands)
    finally:
        await link.close()


async def _ask(sentinel: Address, budget: float, *command: str) -> Any:
    """One SENTINEL command on a connection of its own, bounded by `budget`."""
    link = RedisLink(f"redis://{host_port(sentinel)}/0", connect_timeout=budget, timeout=budget)
    try:
        async with asyncio.timeout(budget):
            return await link.call("SENTINEL", *command)
    finally:
        await link.close()


#: What one sentinel said in a look: the primary it names, and whether it shows a failover
#: under way; None when it did not answer in time.
Seen = tuple[Address, bool] | None


def confirms(seen: Sequence[Seen], address: Address | None) -> bool:
    """Whether a look lets a write acknowledged on `address` be told: more than half the
    sentinels answered, each names `address` the primary, and none shows a failover."""
    answered = [each for each in seen if each is not None]
    if address is None or 2 * len(answered) <= len(seen):
        return False
    return all(named == address and not failing for named, failing in answered)


class Lookout:
    """Every sentinel of the URL asked at once where the primary is and whether a failover
    is under way (`SENTINEL MASTER`): a told write's `WAIT` is trusted only if a look begun
    after its reply confirms the node it went to (`confirms`).

    A failover begins on its leader alone (`failover_in_progress` on the primary it sees)
    before a replica is promoted, and the others learn of it only from its announcement: the
    old primary's `WAIT` counts are no proof from then until every sentinel names the new
    primary, since a replica may be promoted, converted back by a sentinel that has not heard
    (its last look at it a primary), or resynced, while the old primary goes on taking
    writes. Looks are shared: one at a time, and every write acknowledged while one runs
    waits for the next, which begins after them."""

    def __init__(self, target: SentinelURL, budget: float) -> None:
        self.service = target.service
        self.budget = budget
        self.links = [
            RedisLink(f"redis://{host_port(each)}/0", connect_timeout=budget, timeout=budget)
            for each in target.sentinels
        ]
        self._running: asyncio.Task[list[Seen]] | None = None
        self._next: asyncio.Future[list[Seen]] | None = None

    async def confirm(self, address: Address | None) -> bool:
        """A look begun now, or after the one running: whether it confirms `address`."""
        return confirms(await asyncio.shield(self._fresh()), address)

    def _fresh(self) -> asyncio.Future[list[Seen]]:
        if self._running is None:
            return self._start()
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        return self._next

    def _start(self) -> asyncio.Task[list[Seen]]:
        task = asyncio.ensure_future(self._look())
        self._running = task
        task.add_done_callback(self._ran)
        return task

    def _ran(self, task: asyncio.Task[list[Seen]]) -> None:
        self._running = None
        waiting, self._next = self._next, None
        if waiting is None:
            return
        following = self._start()

        def hand_on(done: asyncio.Task[list[Seen]]) -> None:
            if waiting.done():
                return
            if done.cancelled():
                waiting.cancel()
            elif done.exception() is not None:
                waiting.set_exception(cast(BaseException, done.exception()))
            else:
                waiting.set_result(done.result())

        following.add_done_callback(hand_on)

    async def _look(self) -> list[Seen]:
        return list(await asyncio.gather(*(self._ask(link) for link in self.links)))

    async def _ask(self, link: RedisLink) -> Seen:
        try:
            async with asyncio.timeout(self.budget):
                reply = await link.call("SENTINEL", "MASTER", self.service)
        except (TimeoutError, ConnectionError, ResponseError, OSError):
            return None
        state = _fields(reply)
        if not state.get("port", "").isdigit():
            return None
        flags = set(state.get("flags", "").split(","))
        return (state.get("ip", ""), int(state["port"])), bool(FAILING_OVER & flags)

    async def close(self) -> None:
        for task in (self._running, self._next):
            if task is not None:
                task.cancel()
        for link in self.links:
            with contextlib.suppress(Exception):
                await link.close()


class _Sentinel(Sentinel):
    """redis-py's Sentinel, whose failure to find the primary names each sentinel by host
    and port and says why (redis-py's own message prints its clients' whole reprs)."""

    async def discover_master(self, service_name: str) -> Any:
        failures: list[str] = []
        for index, sentinel in enumerate(self.sentinels):
            options = sentinel.connection_pool.connection_kwargs
            where = host_port((str(options["host"]), int(options["port"])))
            try:
                masters = cast(dict[str, Any], await sentinel.sentinel_masters())
            except (ConnectionError, RedisTimeoutError) as exc:
                failures.append(f"{where}: {exc}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[index] = sentinel, self.sentinels[0]
                return state["ip"], state["port"]
            failures.append(f"{where}: {'no primary up for' if state else 'no'} {service_name!r}")
        raise MasterNotFoundError(
            f"no sentinel named the primary of {service_name!r}: {'; '.join(failures)}"
        )


class _SentinelPool(SentinelConnectionPool, aioredis.BlockingConnectionPool):
    """redis-py's Sentinel pool, bounded and waiting (at most its `timeout`) for a free
    connection, as the pool of a plain URL does: a burst is queued, not an outage."""


class _SentinelRedis(aioredis.Redis):
    """Closing the client stops its watch and closes its connections to the sentinels."""

    watcher: asyncio.Task[None] | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.cancel()
            await asyncio.wait({watcher})
        try:
            await super().aclose(close_connection_pool)
        finally:
            pool = self.connection_pool
            if isinstance(pool, SentinelConnectionPool):
                await pool.sentinel_manager.aclose()


async def _watch(
    locator: SentinelLocator,
    link: RedisLink,
    pool: SentinelConnectionPool,
    on_replicas: Callable[[int, bool], None] | None,
) -> None:
    """Every WATCH_INTERVAL (the first time at once), where the sentinels say the primary
    is, and how many replicas they could promote (to `on_replicas`); a connection to another
    node is dropped (the link's once its replies are in), so the next use reaches the new
    primary. A kill needs none of this (the connections break); a planned failover does."""
    while True:
        try:
            await _follow(locator, link, pool)
            if on_replicas is not None:
                on_replicas(*await locator.promotable())
        except ConnectionError:
            pass  # nobody can say: the connections fail or stay as they are
        except Exception:  # a bug, not an outage: say so, keep watching
            logger.exception("watching the sentinels failed")
        await asyncio.sleep(WATCH_INTERVAL)


async def _follow(locator: SentinelLocator, link: RedisLink, pool: SentinelConnectionPool) -> None:
    address = await locator.primary()
    moved = False
    if any(elsewhere != address for elsewhere in link.addresses()):
        link.retire()  # and its twin, the subscriber
        moved = True
    known = pool.master_address
    if known is not None and (str(known[0]), int(known[1])) != address:
        pool.master_address = address
        with contextlib.suppress(Exception):  # each connection reconnects when next used
            await pool.disconnect(inuse_connections=True)
        moved = True
    if moved:
        logger.info("the sentinels name %s the primary: reconnecting", host_port(address))


def connect(
    url: str,
    *,
    max_connections: int,
    timeout: float,
    connect_timeout: float,
    on_replicas: Callable[[int, bool], None] | None = None,
) -> tuple[aioredis.Redis, RedisLink]:
    """The store's two connections for a sentinel URL (neither connects yet): redis-py's
    client of the primary, and the scripts' link; in the event loop, as it starts the watch
    that closing the client stops (and that tells `on_replicas` how many replicas could be
    promoted, and whether a failover is under way). ValueError for a malformed URL."""
    target = parse_url(url)
    socket_options: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout,
        "socket_timeout": timeout,
        "socket_keepalive": True,
    }
    manager = _Sentinel(  # type: ignore[no-untyped-call,unused-ignore]  # typed from redis-py 8
        list(target.sentinels),
        sentinel_kwargs={**socket_options, "retry": Retry(NoBackoff(), 0)},
    )
    client: aioredis.Redis = manager.master_for(
        target.service,
        redis_class=_SentinelRedis,
        connection_pool_class=_SentinelPool,
        max_connections=max_connections,
        timeout=timeout,
        db=target.db,
        username=target.username,
        password=target.password,
        decode_responses=True,
        retry=Retry(NoBackoff(), 0),  # the store's callers retry; a command fails fast
        **socket_options,
    )
    locator = SentinelLocator(target, connect_timeout=connect_timeout)
    link = RedisLink(
        target.node_url(), connect_timeout=connect_timeout, timeout=timeout, locator=locator
    )
    if isinstance(client, _SentinelRedis) and isinstance(client.connection_pool, _SentinelPool):
        client.watcher = asyncio.create_task(
            _watch(locator, link, client.connection_pool, on_replicas),
            name="store-sentinel-watch",
        )
    return client, link
