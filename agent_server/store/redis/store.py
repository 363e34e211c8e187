"""The redis store: the records of one agent shared by its replicas through one Redis.

Redis is the engine: every transition of a record is one Lua script (atomic, one round
trip), results expire with a Redis TTL, completion notices and cancel requests travel by
pub/sub, and each replica's liveness is one entry of a sorted set scored by its expiry on
Redis's own clock (no replica's clock decides another's fate). The scripts are files of
their own (`lua/`, loaded by `scripts.py`), each opening with its contract. A single Redis,
Sentinel or a managed Redis is the target; the scripts derive key names from the prefix, so
Redis Cluster is not (docs/architecture.md).

Keys (prefix `agent-server:{agent name}:`):

- `x:{id}`: the record, a hash of `FIELDS`; finished ones expire after `result_ttl`.
- `all`, `session:{sid}`, `running`: ids scored by `created_at` (lists, newest first).
- `finished`: `{id}|{sid}` scored by the Redis time of the end (us, strictly increasing),
  for TTL pruning and `max_retained` trimming, which also clear the other indexes.
- `owned:{replica}`: the ids a replica runs, for the sweep of a dead replica's work.
- `replicas`: replica ids scored by their liveness expiry (ms, Redis time); 0 once closed.
- `releasing:{sid}`: present while the session is being released; `released:{release
  id}`, its answer for the releases that joined it (a minute).
- `renewals`: per replica, its last renewal and when its unbroken run of them began.
- `void:{id}`: an id whose creator gave up on it (settle.lua); `sizes`: result and error
  bytes per finished record, their total under `#`; `queue`: queued ids, oldest first;
  `ev:{id}`: an execution's events (a capped stream); `idem:{key}`: an Idempotency-Key.
- channels `ends` (ends written: a JSON list of records, or of ids for large ones; a bare
  id from a script that moved a record to lost) and `cancel:{replica}` (cancel requests).

The scripts go through one multiplexed connection (`resp.RedisLink`), the renewal through
a twin of its own (the probe), pub/sub through a third; the rare commands through redis-py's
pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import re
import time
import urllib.parse
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    BusyLoadingError,
    ConnectionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from agent_server import jsoncodec
from agent_server.events import Event
from agent_server.execution import (
    CancelReason,
    Execution,
    ExecutionStatus,
    StaleAttempt,
    new_execution_id,
)
from agent_server.store import sentinel
from agent_server.store.base import (
    BadCursor,
    ExecutionRunning,
    ExecutionStore,
    Idempotency,
    IdempotencyForgotten,
    IdempotencyMismatch,
    Page,
    SessionReleasing,
    StoreObserver,
    StoreUnavailable,
)
from agent_server.store.redis import scripts
from agent_server.store.redis.scripts import FIELDS, Create, Forget, Moved, Row
from agent_server.store.resp import NoReply, RedisLink
from agent_server.waiting import Wakeup

logger = logging.getLogger("agent_server.store")

#: What "Redis cannot be reached now" looks like: a 503 and a retry, never a 500.
_UNREACHABLE: tuple[type[Exception], ...] = (
    ConnectionError,  # AuthenticationError and BusyLoadingError are ConnectionErrors
    RedisTimeoutError,
    OSError,
    TimeoutError,
    BusyLoadingError,
    ReadOnlyError,  # a replica after a failover, until the client follows the new primary
    TryAgainError,
    OutOfMemoryError,  # maxmemory with noeviction: writes refused until memory frees up
)
_OPEN_FAILURES: tuple[type[Exception], ...] = (StoreUnavailable, *_UNREACHABLE)

#: Error replies (by their first word) with which Redis refuses a write for a while: during
#: a failover, while full, loading, busy with a script, or without its replicas. Such a
#: write stays in the outbox and is retried (section 12, invariant 4).
_TRANSIENT_REPLIES = {
    "READONLY": "readonly",
    "OOM": "oom",
    "LOADING": "loading",
    "BUSY": "busy",
    "MASTERDOWN": "masterdown",
    "TRYAGAIN": "tryagain",
    "NOREPLICAS": "noreplicas",
}


def transient_reason(error: BaseException) -> str | None:
    """Why Redis refused or missed a write for a while (a `WRITE_RETRY_REASONS` value), or
    None when the failure is not transient (a bug: retrying would not help)."""
    if isinstance(error, StoreUnavailable) and error.__cause__ is not None:
        error = error.__cause__
    if isinstance(error, RedisError):
        first = str(error).split(" ", 1)[0]
        if first in _TRANSIENT_REPLIES:
            return _TRANSIENT_REPLIES[first]
    if isinstance(error, (RedisTimeoutError, TimeoutError)) or str(error).startswith("no reply"):
        return "timeout"
    if isinstance(error, (ConnectionError, OSError)):
        return "connection"
    return None


class _Refused(StoreUnavailable):
    """Redis refused some writes of a batch for a transient reason: they are back in the
    outbox (counted), and the writer backs off."""


#: Bounded waits: an unreachable Redis never hangs a request.
CONNECT_TIMEOUT = 2.0
COMMAND_TIMEOUT = 2.0
#: A waiter re-reads the record at least this often (covers a missed notice, a lost owner).
REREAD_SECONDS = 1.0
#: Waiters woken together are read in batches of this many ids (one script call each).
WAKE_BATCH = 100
#: End notices remembered, for a waiter that registers just after its notice.
RECENT_ENDS = 10_000
#: Connections to Redis per replica; past it, an operation waits (bounded) for one.
MAX_CONNECTIONS = 64
#: Ends kept locally while Redis is unreachable; past it they are counted, never dropped.
OUTBOX_LIMIT = 10_000
#: Events waiting for Redis; past it, new events are dropped (never an end).
EVENTS_PENDING = 10_000
#: Ends written per pipeline, and about the most bytes of their arguments.
END_BATCH = 100
END_BATCH_BYTES = 4 * 1024 * 1024
#: An end notice carries a record whose result and error take up to this many bytes; a
#: larger one goes by id, and the replicas waiting for it read it.
NOTICE_RECORD_MAX = 4096
#: Retry pacing of the outbox and the pub/sub reader after an outage.
BACKOFF_FIRST = 0.05
BACKOFF_MAX = 1.0
#: Records of dead replicas moved to `lost` per sweep (the sweep runs every lease_ttl/3).
SWEEP_LIMIT = 100
#: With Sentinel, how long a batch of writes waits for a replica to have it (`WAIT`): well
#: under COMMAND_TIMEOUT, since the replies behind it on the shared connection wait too.
REPLICA_WAIT_MS = 500
#: Owned records looked at per repair (`_repair`); the rest wait for the next one.
ORPHAN_SCAN = 10_000
#: Executions read per session (release, listing by session).
SESSION_LIMIT = 10_000
#: How often a release that joined another replica's reads its answer.
RELEASE_POLL = 0.05
#: How long a release with no deadline holds its session (the releasing replica may die).
RELEASE_HOLD_SECONDS = 24 * 3600.0

#: A list cursor: the index score (the creation time, as Redis writes a double) and the id.
_CURSOR = re.compile(r"(-?[0-9][0-9.]{0,24}(?:e[+-]?[0-9]{1,3})?):([0-9a-f]{32})")


class _Operation:
    """`RedisStore._operation`: a plain context manager (it awaits nothing itself), on the
    path of every store call. Only the probe's failure, or a connection Redis refused or
    reset, turns the store down: a command that is merely slow (a big read, a full pool)
    fails alone and has the probe ask again now (readiness is reachability, not one
    request's cost)."""

    __slots__ = ("name", "probe", "started", "store")

    def __init__(self, store: RedisStore, name: str, probe: bool = False) -> None:
        self.store = store
        self.name = name
        self.probe = probe
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        store = self.store
        if error is None:
            store._report(self.name, self.started, True)
            store._set_up(True)
            return
        if isinstance(error, Exception):
            store._report(self.name, self.started, False)
        if isinstance(error, _UNREACHABLE) or _reset(error):
            if self.probe or not _slow(error):
                store._set_up(False)
            else:
                store._tick_now.set()
            raise StoreUnavailable(f"Redis at {store.where}: {store._scrub(str(error))}") from error


def _slow(error: BaseException) -> bool:
    """No answer in time, which a slow command gives as well as a paused or cut-off Redis:
    a timeout, the scripts' link dropped for want of a reply, or no free connection in the
    pool within its wait."""
    if isinstance(error, TimeoutError | RedisTimeoutError | NoReply):
        return True
    return isinstance(error, ConnectionError) and isinstance(error.__cause__, TimeoutError)


def _reset(error: BaseException | None) -> bool:
    """A connection reset that surfaces as another error than ConnectionError: uvloop's
    `RuntimeError: unable to perform operation on <TCPTransport closed=True ...>; the
    handler is closed` when redis-py writes on a transport a reset closed."""
    return isinstance(error, RuntimeError) and "closed" in str(error)


def _on_a_replica(reply: Any) -> bool:
    """A `WAIT 1` reply: at least one replica has the writes before it."""
    return isinstance(reply, int) and reply >= 1


def _recorded(execution: Execution, written: bool) -> None:
    """Tell whoever waits on `RedisStore.recorded` whether the end is in Redis."""
    future = execution.recorded
    if future is not None and not future.done():
        future.set_result(written)


def _resolve(futures: Iterable[asyncio.Future[Any]], value: Any) -> None:
    """Hand `value` to every waiter still waiting (one may have timed out meanwhile)."""
    for future in futures:
        if not future.done():
            future.set_result(value)


def describe_url(url: str) -> str:
    """Where the store is, for messages and logs: scheme, host, port and db, never the
    user name or password the URL may carry; for Sentinel, the sentinels and the service."""
    if sentinel.is_sentinel_url(url):
        return sentinel.describe(url)
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "unix":
        return f"unix://{parts.path}"
    host = parts.hostname or "localhost"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port or 6379
    except ValueError:
        port = 6379
    db = parts.path.lstrip("/") or "0"
    return f"{parts.scheme}://{host}:{port}/{db}"


def _json(value: Any) -> bytes:
    return jsoncodec.dumps(value)


def _unjson(text: str) -> Any:
    """The standard library's parser, as for requests: it keeps integers past 64 bits exact
    (orjson would turn them into floats)."""
    return jsoncodec.loads(text.encode())


def _number(text: str) -> float | None:
    return float(text) if text else None


class RedisStore(ExecutionStore):
    """Records in Redis, shared by every replica of the agent; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        replica_id: str,
        agent_name: str,
        result_ttl: float = 3600.0,
        max_retained: int = 10_000,
        max_retained_bytes: int = 256 * 1024 * 1024,
        lease_ttl: float = 10.0,
        observer: StoreObserver | None = None,
        outbox_limit: int = OUTBOX_LIMIT,
        max_events: int = 1000,
    ) -> None:
        self.replica_id = replica_id
        self.url = url
        self.where = describe_url(url)
        #: Behind Sentinel a failover can lose writes the old primary acknowledged but no
        #: replica had: writers may follow theirs with `WAIT 1 <ms>` on the scripts' link.
        self.replicated_writes = sentinel.is_sentinel_url(url)
        self.prefix = f"agent-server:{agent_name}:"
        self.result_ttl = result_ttl
        self.max_retained = max_retained
        self.lease_ttl = lease_ttl
        self.observer = observer
        self.outbox_limit = outbox_limit
        self.max_events = max_events
        self.events_dropped = 0
        self._pending_events = 0
        self._event_waiters: dict[str, set[asyncio.Future[None]]] = {}
        #: Ids whose end notice woke waiters, read together by `_read_woken`.
        self._woken: set[str] = set()
        self._read_due = asyncio.Event()
        #: The last RECENT_ENDS ids whose end was noticed (a waiter that registers just
        #: after its notice reads at once instead of at the next re-read).
        #: An OrderedDict: dropping the oldest is O(1) (a dict's first key, once many were
        #: popped, is found by a scan over the holes they left).
        self._recent_ends: OrderedDict[str, None] = OrderedDict()
        #: The id of each release this replica has under way, by session.
        self._releases: dict[str, str] = {}
        #: The arguments every script takes (the caller's id lets a script decide, when it
        #: runs, whether this replica may judge others: `judged`), as bytes: packed as they
        #: are, on the path of every script call.
        self._args: tuple[bytes | int, ...] = (
            self.prefix.encode(),
            max(1, round(result_ttl * 1000)),
            f"{max(0, max_retained)}:{max(0, max_retained_bytes)}".encode(),
            replica_id.encode(),
        )
        self._client: aioredis.Redis | None = None
        #: The scripts' connection (one, multiplexed); redis-py's pool serves the rest.
        self._link: RedisLink | None = None
        #: The subscriber (a twin of `_link`): end notices, cancel requests, queued work.
        self._subscriber: RedisLink | None = None
        #: The probe's own connection (another twin): the renewal, which decides whether
        #: the store is up, never waits behind other commands' replies.
        self._probe: RedisLink | None = None
        self._up = False
        self._tick_now = asyncio.Event()
        #: Writes owed to Redis, oldest first: the execution, the script (`end` or
        #: `handoff`) and its arguments, taken when the write was queued.
        self._outbox: deque[tuple[Execution, str, list[str | bytes]]] = deque()
        self._queued = asyncio.Event()
        self._overflow: list[Execution] = []
        self._failed: list[Execution] = []
        self._writing = asyncio.Lock()
        self._wake = asyncio.Event()
        self._waiters: dict[str, set[asyncio.Future[Execution | None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.fenced = 0
        #: Creates sent without an answer (Redis may run them yet), settled by `_repair`.
        self._in_doubt: dict[str, Execution] = {}
        #: Ids whose create is on its way: not orphans, whatever the store says.
        self._creating: set[str] = set()
        self._claiming = 0
        #: Whether this replica may own running records it runs nothing for: after a create
        #: or claim that got no answer, and at open (a replica id used before).
        self._repair_due = True
        self._runs: Callable[[str], bool] | None = None
        self._adopt: Callable[[str], bool] | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def up(self) -> bool:
        return self._up

    @property
    def _redis(self) -> aioredis.Redis:
        if self._client is None:
            raise StoreUnavailable(f"the store at {self.where} is not open")
        return self._client

    async def open(self) -> None:
        """Connect (bounded), load the scripts, announce this replica, subscribe, and start
        the renewal, the outbox writer and the pub/sub reader. Cancel requests for this
        replica go where `deliver_cancels` said."""
        try:
            if sentinel.is_sentinel_url(self.url):  # both find the primary through Sentinel
                client, link = sentinel.connect(
                    self.url,
                    max_connections=MAX_CONNECTIONS,
                    timeout=COMMAND_TIMEOUT,
                    connect_timeout=CONNECT_TIMEOUT,
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
            reason = self._scrub(str(exc))
            raise StoreUnavailable(f"invalid store URL for {self.where}: {reason}") from None
        self._client = client
        self._link = link
        self._subscriber = link.twin()
        self._probe = link.twin()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT + COMMAND_TIMEOUT):
                await cast(Awaitable[Any], client.ping())
                await self._load_scripts()
                await self._tick()
                subscribed = await self._subscribe()
        except _OPEN_FAILURES as exc:
            self._client = None
            with contextlib.suppress(Exception):
                await client.aclose()
            for each in (self._link, self._subscriber, self._probe):
                with contextlib.suppress(Exception):
                    await each.close()
            self._link = self._subscriber = self._probe = None
            reason = self._scrub(str(exc) or type(exc).__name__)
            raise StoreUnavailable(f"cannot reach Redis at {self.where}: {reason}") from None
        self._set_up(True)
        self._tasks = [
            asyncio.create_task(self._keep_alive(), name="store-liveness"),
            asyncio.create_task(self._write_outbox(), name="store-outbox"),
            asyncio.create_task(self._listen(subscribed), name="store-pubsub"),
            asyncio.create_task(self._read_woken(), name="store-wakes"),
        ]
        if self._outbox:
            self._wake.set()

    async def close(self) -> None:
        """Stop the background tasks (observing them), end this replica's liveness so its
        remaining running records read lost at once, and disconnect."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:  # bounded: a task that ignores its cancellation is named, not waited for
            _, late = await asyncio.wait(tasks, timeout=COMMAND_TIMEOUT)
            for task in late:
                logger.error("store task %s did not stop when cancelled", task.get_name())
        for task in tasks:
            outcome = task.exception() if task.done() and not task.cancelled() else None
            if outcome is not None:
                logger.error("store task %s failed", task.get_name(), exc_info=outcome)
        client, self._client = self._client, None
        if client is None:
            return
        try:
            async with asyncio.timeout(COMMAND_TIMEOUT):
                async with client.pipeline(transaction=True) as pipe:
                    pipe.zadd(self.prefix + "replicas", {self.replica_id: 0})
                    pipe.hdel(self.prefix + "renewals", self.replica_id)
                    await pipe.execute()
        except Exception as exc:  # unreachable, or a reset surfacing as uvloop's RuntimeError
            logger.warning(
                "could not end the liveness of replica %s (%s): it lapses within its lease",
                self.replica_id,
                type(exc).__name__,
            )
        with contextlib.suppress(Exception):
            await client.aclose()
        for link in (self._link, self._subscriber, self._probe):
            if link is not None:
                with contextlib.suppress(Exception):
                    await link.close()
        self._link = self._subscriber = self._probe = None
        self._wake_all()

    async def flush(self, deadline: float) -> list[Execution]:
        """Write the outbox until `deadline` (monotonic); what is left is unrecorded."""
        backoff = BACKOFF_FIRST
        while self._outbox and self._client is not None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self._write_ends()
                backoff = BACKOFF_FIRST
            except TimeoutError:
                break
            except StoreUnavailable as exc:
                self._retrying(exc)
                await asyncio.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
                backoff = min(backoff * 2, BACKOFF_MAX)
        owed = [entry[0] for entry in self._outbox if entry[1] != "emit"]
        return [*owed, *self._overflow, *self._failed]

    # -- records ---------------------------------------------------------------------------

    @property
    def shared(self) -> bool:
        return True

    def emit(self, execution: Execution, event: Event) -> None:
        """Through the outbox, in order with the end: XADD to the execution's capped stream
        (fenced by owner and attempt) and a notice to readers on other replicas."""
        self._enqueue(
            execution,
            "emit",
            [
                execution.execution_id,
                execution.replica,
                str(execution.attempt),
                str(event.id),
                event.event,
                event.data,
                str(self.max_events),
            ],
        )

    async def events_since(
        self, execution_id: str, cursor: int, limit: int
    ) -> tuple[int, list[Event]]:
        """One XRANGE after `cursor` (exclusive). Numbers are contiguous: a gap before the
        first one read is what the cap trimmed."""
        with self._operation("events"):
            rows = await cast(
                Awaitable[Any],
                self._redis.xrange(
                    f"{self.prefix}ev:{execution_id}", min=f"({cursor}-1", count=limit
                ),
            )
        events = [
            Event(
                int(entry_id.split("-", 1)[0]), fields.get("e", "message"), fields.get("d", "null")
            )
            for entry_id, fields in rows
        ]
        missed = events[0].id - cursor - 1 if events else 0
        return max(0, missed), events

    def event_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        """`waiter` is completed at the `events` (or `ends`) notice for this execution on
        this replica's one pub/sub connection."""
        self._event_waiters.setdefault(execution_id, set()).add(waiter)

    def drop_notice(self, execution_id: str, waiter: asyncio.Future[None]) -> None:
        waiters = self._event_waiters.get(execution_id)
        if waiters is not None:
            waiters.discard(waiter)
            if not waiters:
                del self._event_waiters[execution_id]

    async def create(
        self, execution: Execution, idempotency: Idempotency | None = None
    ) -> Execution | None:
        """One script: refused while the session is released; with an idempotency key
        already used for the same request, the execution it started; else the record, its
        index entries, and the key (set if absent, atomically: one execution per key)."""
        session_id = execution.session_id or ""
        pairs = self._new_record(execution)  # the values, in FIELDS order: the script names them
        if execution.resumable:
            pairs.extend(
                ("body", _json(execution.body), "max_attempts", str(execution.max_attempts))
            )
        key = "" if idempotency is None else idempotency.key
        fingerprint = "" if idempotency is None else idempotency.fingerprint
        key_ttl = 1 if idempotency is None else max(1, round(idempotency.ttl * 1000))
        execution_id = execution.execution_id
        self._creating.add(execution_id)
        try:
            with self._operation("create"):
                reply = await self._script(
                    "create",
                    execution_id,
                    session_id,
                    repr(execution.created_at),
                    execution.replica,
                    key,
                    fingerprint,
                    key_ttl,
                    *pairs,
                )
        except StoreUnavailable:
            # Sent, perhaps: Redis may run it yet (a pause). `_repair` settles it.
            if len(self._in_doubt) < self.outbox_limit:
                self._in_doubt[execution_id] = execution
            self._repair_due = True
            raise
        finally:
            self._creating.discard(execution_id)
        code = Create(int(reply[0]))
        if code is Create.VOIDED:
            raise StoreUnavailable(f"the create of execution {execution_id} was given up")
        if code is Create.LEASE_LAPSED:
            self._tick_now.set()
            raise StoreUnavailable(f"replica {execution.replica}'s lease lapsed: renewing first")
        if code is Create.RELEASING:
            raise SessionReleasing(session_id)
        if code is Create.KEY_MISMATCH:
            raise IdempotencyMismatch(key)
        if code is Create.KEY_FORGOTTEN:
            raise IdempotencyForgotten(key)
        if code is Create.EXISTING:
            return self._restore(reply[1])
        return None

    async def checkpoint(self, execution: Execution, state: str) -> None:
        """One script, fenced by owner and attempt like an end. Redis unreachable or
        refusing for a while is waited out (retried with a bounded backoff, as the outbox
        does; a cancellation still ends the wait): a reasoner's progress is written before
        it goes on, and an outage does not fail it (section 12, invariant 4)."""
        backoff = BACKOFF_FIRST
        while True:
            try:
                with self._operation("checkpoint"):
                    reply = await self._script(
                        "checkpoint",
                        execution.execution_id,
                        execution.replica,
                        str(execution.attempt),
                        state,
                    )
                break
            except StoreUnavailable as exc:
                if self._client is None:
                    raise  # closed: nothing will write it
                self._count_retry(transient_reason(exc) or "connection")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)
        if not int(reply[0]):
            self._refused("checkpoint", execution, reply[1])
            raise StaleAttempt(
                f"attempt {execution.attempt} of execution {execution.execution_id} no longer "
                f"owns it (the record is {reply[1] or 'gone'})"
            )

    def hand_off(self, execution: Execution) -> None:
        """Through the outbox, fenced: the record goes to `queued` with attempt + 1."""
        self._enqueue(
            execution,
            "handoff",
            [execution.execution_id, execution.replica, str(execution.attempt)],
        )

    async def claim(self) -> Execution | None:
        """One script: the oldest queued execution, now running here, with its body and
        last checkpoint; None when nothing is queued."""
        self._claiming += 1
        try:
            with self._operation("claim"):
                reply = await self._script("claim", self.replica_id)
        except StoreUnavailable:
            self._repair_due = True  # it may have been claimed here all the same
            raise
        finally:
            self._claiming -= 1
        if not reply:
            return None
        row, (body, checkpoint, max_attempts, last_event) = reply
        execution = self._restore(row)
        # Its events go on numbering where the last attempt stopped.
        execution.event_log(self.max_events).last_id = int(str(last_event).split("-", 1)[0])
        execution.body = _unjson(body) if body else None
        execution.checkpoint = checkpoint or None
        execution.max_attempts = int(max_attempts or 1)
        execution.resumable = True
        # Its duration runs from its creation, across attempts.
        execution.started_monotonic = time.monotonic() - max(
            0.0, time.time() - execution.created_at
        )
        return execution

    async def wait_queued(self, timeout: float) -> None:
        """Woken by the `queued` notice on this replica's pub/sub connection."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._queued.wait()
        self._queued.clear()

    def end(self, execution: Execution) -> None:
        """Queue the end for the outbox writer (its arguments taken now); `recorded` tells
        when it is in Redis."""
        execution.recorded = asyncio.get_running_loop().create_future()
        self._enqueue(execution, "end", self._end_args(execution))

    async def recorded(self, execution: Execution, timeout: float) -> bool:
        """Whether the end is in Redis within `timeout` seconds: False when it was refused
        (fenced), could not be kept, or is still owed."""
        future = execution.recorded
        if future is None:
            return False
        if not future.done():  # one future and one timer, not asyncio.wait's set and task
            waiter = Wakeup(loop=asyncio.get_running_loop())
            timer = waiter.get_loop().call_later(timeout, waiter, None)
            future.add_done_callback(waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                future.remove_done_callback(waiter)
        return future.done() and future.result()

    def _enqueue(self, execution: Execution, script: str, args: list[str | bytes]) -> None:
        """Ends and hand-offs are bounded by `outbox_limit`, events by EVENTS_PENDING on their
        own, so a burst of events never stands in an end's way. Past its bound an end is
        kept aside, logged and reported by `flush` as unrecorded; an event is dropped
        (counted and logged: readers see the gap as `missed`)."""
        if script == "emit":
            if self._pending_events < EVENTS_PENDING:
                self._pending_events += 1
                self._outbox.append((execution, script, args))
                self._wake.set()
                return
            self.events_dropped += 1
            if self.events_dropped % 1000 == 1:
                logger.warning(
                    "store outbox full: events not written to %s (%d so far)",
                    self.where,
                    self.events_dropped,
                )
            return
        if len(self._outbox) - self._pending_events >= self.outbox_limit:
            self._overflow.append(execution)
            _recorded(execution, False)
            if len(self._overflow) == 1 or len(self._overflow) % 1000 == 0:
                logger.error(
                    "store outbox full (%d writes waiting for %s): %s of execution %s not "
                    "recorded (%d so far)",
                    len(self._outbox),
                    self.where,
                    script,
                    execution.execution_id,
                    len(self._overflow),
                )
            return
        self._outbox.append((execution, script, args))
        self._wake.set()

    async def get(self, execution_id: str) -> Execution | None:
        """One script: the record, moved to lost first if its owner stopped renewing."""
        with self._operation("get"):
            rows = await self._script("get", execution_id)
        row = rows[0] if rows else None
        return None if not row else self._restore(row)

    async def wait(self, execution: Execution, timeout: float | None) -> Execution:
        """Woken by this replica's one pub/sub connection when the end is written: one read
        for every waiter woken together (`_read_woken`), none of its own. `execution` is a
        copy the caller has just read; an end noticed since is re-read at once, and a re-read
        every REREAD_SECONDS covers a missed notice or an owner that died."""
        if execution.is_terminal:
            return execution
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        latest = execution
        key = execution.execution_id
        read_now = key in self._recent_ends  # ended between the caller's read and now
        while True:
            future: asyncio.Future[Execution | None] = loop.create_future()
            waiters = self._waiters.setdefault(key, set())
            waiters.add(future)
            try:
                if read_now:
                    try:
                        found = await self.get(key)
                    except StoreUnavailable:
                        if self._client is None:
                            raise
                        found = latest  # keep waiting: the next re-read may reach it
                    if found is None or found.is_terminal:
                        return found or latest
                    latest = found
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return latest
                pause = REREAD_SECONDS if remaining is None else min(REREAD_SECONDS, remaining)
                await asyncio.wait({future}, timeout=pause)
                woken = future.result() if future.done() and not future.cancelled() else None
                if woken is not None:
                    if woken.is_terminal:
                        return woken
                    latest = woken
                read_now = woken is None  # a notice without a record, or a timed re-read
            finally:
                waiters.discard(future)
                if not waiters and self._waiters.get(key) is waiters:
                    del self._waiters[key]

    async def page(
        self,
        *,
        statuses: frozenset[ExecutionStatus] = frozenset(),
        reasoner: str | None = None,
        session_id: str | None = None,
        limit: int = 100,
        max_bytes: int = 0,
        after: str | None = None,
    ) -> Page:
        """One script. Bounded work: it reads at most max(limit * 10, 1000) ids of one
        index (the session's, the running ones, or all, newest first), so a rare filter
        may return fewer than `limit` while `next` says older ones may match. A cursor is
        the index score and id of the last record looked at."""
        if session_id is not None:
            index = f"session:{session_id}"
        elif statuses == {ExecutionStatus.RUNNING}:
            index = "running"
        else:
            index = "all"
        return await self._list(
            "list",
            index,
            max(limit * 10, 1000),
            limit,
            ",".join(sorted(statuses)),
            reasoner or "",
            budget=max_bytes,
            after=after,
        )

    async def forget(self, execution_id: str) -> bool:
        """One script: False when unknown, ExecutionRunning while active, else deleted."""
        with self._operation("forget"):
            reply = await self._script("forget", execution_id)
        code = Forget(int(reply[0]))
        if code is Forget.UNKNOWN:
            return False
        found = self._restore(reply[1])  # counts a move to lost made on the way
        if code is Forget.ACTIVE:
            raise ExecutionRunning(execution_id, found.status.value)
        return True

    async def request_cancel(
        self, execution: Execution, reason: CancelReason, settle_within: float | None
    ) -> None:
        """Straight to the local registry when this replica owns it, else one PUBLISH to
        the owner's channel (nothing listens there once the owner is gone: it reads lost)."""
        owner = execution.replica
        if execution.status is ExecutionStatus.QUEUED:  # nobody runs it: it ends here
            with self._operation("request_cancel"):
                reply = await self._script("cancel_queued", execution.execution_id, reason.value)
            if int(reply[0]) or not reply[1]:
                return
            owner = reply[1]  # claimed meanwhile: the request goes to its new owner
        if owner == self.replica_id:
            if self.on_cancel is not None:
                self.on_cancel(execution.execution_id, reason, settle_within)
            return
        message = orjson.dumps(
            {"id": execution.execution_id, "reason": reason.value, "settle_within": settle_within}
        )
        with self._operation("request_cancel"):
            await cast(
                Awaitable[Any],
                self._redis.publish(f"{self.prefix}cancel:{owner}", message),
            )

    async def session(self, session_id: str) -> list[Execution]:
        """One script: the session's executions (at most SESSION_LIMIT), newest first,
        without their results (a release reads statuses: 10,000 big results would be a
        read of gigabytes)."""
        found = await self._list(
            "session", f"session:{session_id}", SESSION_LIMIT, SESSION_LIMIT, "", "", bare=True
        )
        return found.executions

    async def begin_release(self, session_id: str, seconds: float | None) -> str | None:
        """One SET NX with an expiry (a replica dying mid-release does not hold the session
        for ever), holding this release's id; when another replica's release holds it, its
        id (a second round trip)."""
        hold = RELEASE_HOLD_SECONDS if seconds is None else seconds
        release_id = new_execution_id()
        key = f"{self.prefix}releasing:{session_id}"
        with self._operation("begin_release"):
            began = await cast(
                Awaitable[Any],
                self._redis.set(key, release_id, px=max(1, round(hold * 1000)), nx=True),
            )
            other = None if began else await cast(Awaitable[Any], self._redis.get(key))
        if began or not other:
            if not began:  # it ended between the two commands: begin again
                return await self.begin_release(session_id, seconds)
            self._releases[session_id] = release_id
            return None
        return str(other)

    async def end_release(self, session_id: str, answer: dict[str, Any] | None = None) -> None:
        """Publish the answer for the releases that joined this one (kept a minute), then
        free the session: one script."""
        release_id = self._releases.pop(session_id, "")
        with self._operation("end_release"):
            await self._script(
                "end_release", session_id, release_id, _json(answer) if answer else ""
            )

    async def shared_release(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        """Read the other release's answer every RELEASE_POLL seconds until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._operation("shared_release"):
                found = await cast(
                    Awaitable[Any], self._redis.get(f"{self.prefix}released:{release_id}")
                )
            if found:
                answer: dict[str, Any] = _unjson(found)
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(RELEASE_POLL, remaining))

    # -- background work -------------------------------------------------------------------

    async def _keep_alive(self) -> None:
        """Renew the liveness every lease_ttl/3 (one script call, whatever the number of
        executions), which also sweeps the running work of dead replicas."""
        interval = self.lease_ttl / 3
        next_tick = time.monotonic() + interval
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_tick - time.monotonic())):
                    await self._tick_now.wait()
            self._tick_now.clear()
            next_tick = time.monotonic() + interval
            try:
                await self._tick()
                await self._repair()
            except StoreUnavailable:
                pass  # counted; the next tick retries
            except Exception:  # a bug, not an outage: say so, and keep renewing
                logger.exception("renewing the liveness of replica %s failed", self.replica_id)

    def deliver_orphans(self, runs: Callable[[str], bool], adopt: Callable[[str], bool]) -> None:
        self._runs = runs
        self._adopt = adopt

    async def _repair(self) -> None:
        """Accepted means it runs (section 12, invariant 3). A create that got no answer is
        settled: run here if Redis recorded it after all, else voided so it never will be.
        Then every running record this replica owns with no task here and no write owed
        is an orphan (a claim that got no answer, a replica id used before): a resumable
        one is handed back to the queue, any other ends `failed`, visibly, never `running`
        for good."""
        while self._in_doubt:
            ids = list(itertools.islice(self._in_doubt, WAKE_BATCH))
            with self._operation("settle"):
                rows = await self._script("settle", *ids)
            for execution_id, row in zip(ids, rows, strict=True):
                self._in_doubt.pop(execution_id, None)
                mine = (
                    bool(row)
                    and row[Row.STATUS] == ExecutionStatus.RUNNING
                    and row[Row.REPLICA] == self.replica_id
                )
                if mine and self._adopt is not None and self._adopt(execution_id):
                    logger.warning(
                        "execution %s: its start got no answer from Redis in time but was "
                        "recorded; it runs now",
                        execution_id,
                    )
            self._repair_due = True  # what was recorded and not adopted is an orphan
        if not self._repair_due or self._claiming or self._creating or self._runs is None:
            return
        self._repair_due = False
        try:
            with self._operation("owned"):
                rows = await self._script("owned", ORPHAN_SCAN)
        except StoreUnavailable:
            self._repair_due = True
            raise
        owed = {entry[0].execution_id for entry in self._outbox}
        owed.update(execution.execution_id for execution in (*self._overflow, *self._failed))
        for row, max_attempts in rows:
            execution = self._restore(row)
            key = execution.execution_id
            if key in owed or key in self._creating or self._runs(key):
                continue
            if max_attempts:
                logger.warning(
                    "execution %s (%s): replica %s owns attempt %d but runs no task for it; "
                    "its next attempt is queued",
                    key,
                    execution.reasoner,
                    self.replica_id,
                    execution.attempt,
                )
                self.hand_off(execution)
                continue
            logger.warning(
                "execution %s (%s): replica %s owns it but runs no task for it (its start got "
                "no answer in time); it ends failed",
                key,
                execution.reasoner,
                self.replica_id,
            )
            execution.started_monotonic = time.monotonic() - max(
                0.0, time.time() - execution.created_at
            )
            execution.finish(
                ExecutionStatus.FAILED,
                error={
                    "type": "ExecutionNotStarted",
                    "message": f"replica {self.replica_id} accepted it while Redis did not "
                    "answer, and could not start it",
                },
            )
            self.end(execution)

    async def _tick(self) -> None:
        lease_ms = max(1, round(self.lease_ttl * 1000))
        with self._operation("renew", probe=True):
            reply = await self._script("tick", lease_ms, SWEEP_LIMIT, via=self._probe)
        if self.observer is not None:
            self.observer.replicas_alive(int(reply[0]))
        if int(reply[1]):  # queued work, in case its notice was missed: the taker looks
            self._queued.set()
        for row in reply[2:]:
            self._restore(row)

    async def _write_outbox(self) -> None:
        """Write queued ends as they come; after an outage retry with a bounded backoff."""
        backoff = BACKOFF_FIRST
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._outbox:
                try:
                    await self._write_ends()
                    backoff = BACKOFF_FIRST
                except StoreUnavailable as exc:
                    self._retrying(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                except Exception:  # a bug, not an outage: say so, keep the ends, go on
                    logger.exception("writing ends to %s failed", self.where)
                    await asyncio.sleep(BACKOFF_MAX)

    async def _write_ends(self) -> None:
        """One pipeline for the oldest queued writes: each run of ends is one call of the
        fenced `end` script, each event or hand-off one call. An end refused (the record is
        lost, or another owner or attempt holds it) is logged and counted; nothing leaves
        the outbox unless Redis answered for it."""
        async with self._writing:
            pending = self._batch()
            later: list[tuple[Execution, str, list[str | bytes]]] = []
            reasons: list[str] = []
            for _ in range(2):  # a second pass only after Redis forgot its scripts
                if not pending:
                    break
                with self._operation("end"):
                    common = self._args
                    commands: list[list[str | bytes | int]] = []
                    #: The outbox entries each command writes: [start, stop).
                    spans: list[tuple[int, int]] = []
                    emitted: dict[str, None] = {}
                    for index, (execution, script, args) in enumerate(pending):
                        if script == "end" and spans and pending[spans[-1][0]][1] == "end":
                            commands[-1].extend(args)
                            spans[-1] = (spans[-1][0], index + 1)
                            continue
                        command = [b"EVALSHA", scripts.EVALSHA[script], 0, *common]
                        if script == "end":
                            command.append(NOTICE_RECORD_MAX)
                        commands.append([*command, *args])
                        spans.append((index, index + 1))
                        if script == "emit":
                            emitted[execution.execution_id] = None
                    # One notice per batch for every replica, not one per event.
                    if emitted:
                        commands.append(["PUBLISH", self._events_channel, " ".join(emitted)])
                    if self.replicated_writes:  # acknowledged only once a replica has them
                        commands.append(["WAIT", 1, REPLICA_WAIT_MS])
                    answers = await self._scripts.pipeline(commands)
                if self.replicated_writes and not _on_a_replica(answers[-1]):
                    # A failover could lose them: they stay in the outbox (every script is
                    # idempotent for the same attempt) and are written again.
                    self._count_retry("noreplicas")
                    self._set_up(False)
                    raise _Refused(f"no replica of {self.where} acknowledged the writes")
                replies: list[Any] = []
                for (start, stop), answer in zip(spans, answers, strict=False):
                    if isinstance(answer, Exception):
                        replies.extend([answer] * (stop - start))
                    elif pending[start][1] == "end":
                        replies.extend(zip(answer[0::2], answer[1::2], strict=True))
                    else:
                        replies.append(answer)
                for _ in pending:  # the oldest in the outbox: only this method removes
                    if self._outbox.popleft()[1] == "emit":
                        self._pending_events -= 1
                retry: list[tuple[Execution, str, list[str | bytes]]] = []
                for entry, reply in zip(pending, replies, strict=True):
                    execution, script, _ = entry
                    if isinstance(reply, NoScriptError):
                        retry.append(entry)
                    elif isinstance(reply, Exception) and (reason := transient_reason(reply)):
                        later.append(entry)
                        reasons.append(reason)
                    elif isinstance(reply, Exception) and script == "emit":
                        logger.warning(
                            "event of execution %s not written: %s", execution.execution_id, reply
                        )
                    elif isinstance(reply, Exception):
                        logger.error(
                            "%s of execution %s could not be written: %s",
                            script,
                            execution.execution_id,
                            reply,
                        )
                        self._failed.append(execution)
                        _recorded(execution, False)
                    elif not int(reply[0]):
                        self._refused(script, execution, reply[1])
                        _recorded(execution, False)
                    elif script == "end":
                        self._written(execution)
                self._outbox.extendleft(reversed(retry))
                self._pending_events += sum(1 for entry in retry if entry[1] == "emit")
                if retry:
                    with self._operation("load_scripts"):
                        await self._load_scripts()
                pending = retry
            if later:  # refused for now: back to the front, in their order, and retried
                self._outbox.extendleft(reversed(later))
                self._pending_events += sum(1 for entry in later if entry[1] == "emit")
                for reason in reasons:
                    self._count_retry(reason)
                self._set_up(False)
                raise _Refused(
                    f"Redis at {self.where} refused {len(later)} writes for now ({reasons[0]})"
                )

    def _batch(self) -> list[tuple[Execution, str, list[str | bytes]]]:
        """The oldest writes of the outbox, at most END_BATCH of them and about
        END_BATCH_BYTES (always one): a hundred ends of 12 MB are not one 1.2 GB pipeline
        that no command timeout could let through."""
        batch: list[tuple[Execution, str, list[str | bytes]]] = []
        size = 0
        for entry in itertools.islice(self._outbox, END_BATCH):
            size += sum(len(arg) for arg in entry[2])
            if batch and size > END_BATCH_BYTES:
                break
            batch.append(entry)
        return batch

    def _written(self, execution: Execution) -> None:
        """Its end is in Redis: what the end notice does on other replicas is done here,
        without a read (the notice itself is skipped when it comes back)."""
        _recorded(execution, True)
        key = execution.execution_id
        self._noticed(key)
        _resolve(self._waiters.get(key, ()), execution)
        _resolve(self._event_waiters.get(key, ()), None)

    def _noticed(self, execution_id: str) -> None:
        """Remember an end for a waiter that registers just after it (the last RECENT_ENDS)."""
        recent = self._recent_ends
        recent[execution_id] = None
        if len(recent) > RECENT_ENDS:
            recent.popitem(last=False)

    def _retrying(self, error: StoreUnavailable) -> None:
        """A whole batch failed to reach Redis: it stays in the outbox; count why."""
        if not isinstance(error, _Refused):
            self._count_retry(transient_reason(error) or "connection")

    def _count_retry(self, reason: str) -> None:
        if self.observer is not None:
            self.observer.write_retried(reason)

    def _refused(self, write: str, execution: Execution, found: str) -> None:
        """A fenced write: this attempt no longer owns the record. Logged and counted."""
        self.fenced += 1
        logger.warning(
            "%s of execution %s (replica %s, attempt %d) refused: the record is %s",
            write,
            execution.execution_id,
            execution.replica,
            execution.attempt,
            found or "unknown (expired, deleted, or Redis lost its data)",
        )
        if self.observer is not None:
            self.observer.fenced_write(execution)

    async def _subscribe(self) -> asyncio.Future[None]:
        """Subscribe the subscriber link; the future is done when its connection is lost."""
        assert self._subscriber is not None
        return await self._subscriber.subscribe(
            (self._ends_channel, self._cancel_channel, self._queued_channel, self._events_channel),
            self._dispatch,
        )

    async def _listen(self, subscribed: asyncio.Future[None] | None) -> None:
        """The one pub/sub connection of this replica: end notices wake its waiters, cancel
        requests reach its registry. Reconnects after an outage, then wakes every waiter
        to re-read (notices may have been missed meanwhile)."""
        backoff = BACKOFF_FIRST
        while True:
            try:
                if subscribed is None:
                    subscribed = await self._subscribe()
                    self._set_up(True)
                    # What may have been missed meanwhile: every waiter re-reads its record,
                    # the taker looks at the queue.
                    self._wake_all()
                    self._queued.set()
                backoff = BACKOFF_FIRST
                await asyncio.shield(subscribed)  # until the connection is lost
                logger.debug("pub/sub connection to %s lost", self.where)
                self._set_up(False)
            except _UNREACHABLE as exc:
                logger.debug("pub/sub connection to %s lost: %s", self.where, exc)
                self._set_up(False)
            except Exception as exc:  # a bug, not an outage: say so, and reconnect
                logger.warning(
                    "pub/sub connection to %s lost (%s: %s); reconnecting",
                    self.where,
                    type(exc).__name__,
                    exc,
                )
                self._set_up(False)
            subscribed = None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX)

    def _dispatch(self, channel: str, data: str) -> None:
        """One message of this replica's subscriber; never raises (a bad one is logged)."""
        try:
            self._dispatched(channel, data)
        except Exception:
            logger.exception("a message on %s could not be handled: %r", channel, data[:200])

    def _dispatched(self, channel: str, data: str) -> None:
        if channel == self._ends_channel:
            for execution_id, row in self._ends(data):
                self._noticed(execution_id)
                if execution_id in self._waiters:
                    found = None if row is None else self._from_notice(row)
                    if found is None:
                        self._woken.add(execution_id)  # read with the others woken
                    else:
                        _resolve(self._waiters[execution_id], found)
                _resolve(self._event_waiters.get(execution_id, ()), None)
            if self._woken:
                self._read_due.set()
            return
        if channel == self._events_channel:
            for execution_id in data.split():
                _resolve(self._event_waiters.get(execution_id, ()), None)
            return
        if channel == self._queued_channel:
            self._queued.set()
            return
        try:
            request = orjson.loads(data)
            reason = CancelReason(request["reason"])
            settle_within = request["settle_within"]
            execution_id = str(request["id"])
        except (ValueError, KeyError, TypeError):
            logger.warning("ignored a malformed cancel request: %r", data[:200])
            return
        if self.on_cancel is not None:
            try:
                self.on_cancel(execution_id, reason, settle_within)
            except Exception:
                logger.exception("cancel of execution %s failed", execution_id)

    def _from_notice(self, row: list[Any]) -> Execution | None:
        """A record from an end notice; None (it is read instead) if it does not parse."""
        try:
            return self._restore([*row, 0])
        except (ValueError, TypeError, KeyError) as exc:
            logger.warning("an end notice's record did not parse (%s): it is read instead", exc)
            return None

    def _ends(self, data: str) -> list[tuple[str, list[Any] | None]]:
        """An end notice: ids separated by spaces (a script's), or the `end` script's
        `@{writer} [records and ids]`; each id with its record when the notice carries it.
        This replica's own notices are skipped: `_written` handled those ends."""
        if data.startswith("@"):
            writer, _, data = data[1:].partition(" ")
            if writer == self.replica_id:
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

    async def _read_woken(self) -> None:
        """One read (the `get` script, many ids) for every waiter woken by end notices
        since the last one; each waiter gets its record without a read of its own."""
        while True:
            await self._read_due.wait()
            self._read_due.clear()
            ids, self._woken = list(self._woken), set()
            for start in range(0, len(ids), WAKE_BATCH):
                batch = ids[start : start + WAKE_BATCH]
                try:
                    with self._operation("get"):
                        rows = await self._script("get", *batch)
                except StoreUnavailable:
                    rows = [None] * len(batch)  # the waiters re-read on their own
                for execution_id, row in zip(batch, rows, strict=True):
                    found = self._restore(row) if row else None
                    _resolve(self._waiters.get(execution_id, ()), found)

    def _wake_all(self) -> None:
        for futures in self._waiters.values():
            _resolve(futures, None)

    # -- helpers ---------------------------------------------------------------------------

    @property
    def _ends_channel(self) -> str:
        return self.prefix + "ends"

    @property
    def _events_channel(self) -> str:
        return self.prefix + "events"

    @property
    def _queued_channel(self) -> str:
        return self.prefix + "queued"

    @property
    def _cancel_channel(self) -> str:
        return f"{self.prefix}cancel:{self.replica_id}"

    def _operation(self, name: str, probe: bool = False) -> _Operation:
        """Time and report one operation; an unreachable Redis becomes StoreUnavailable. The
        probe's failure, or a refused or reset connection, turns the store down until an
        operation succeeds again."""
        return _Operation(self, name, probe)

    def _report(self, name: str, started: float, ok: bool) -> None:
        if self.observer is not None:
            self.observer.store_operation(name, time.perf_counter() - started, ok)

    def _set_up(self, up: bool) -> None:
        if up == self._up:
            return
        self._up = up
        if up:
            self._tick_now.set()  # renew this replica's liveness now
            logger.info("store %s reachable", self.where)
            if self._outbox:
                self._wake.set()
        else:
            logger.warning("store %s unreachable", self.where)
        if self.observer is not None:
            self.observer.store_up(up)

    def _scrub(self, text: str) -> str:
        """Never let a password in the URL reach a message."""
        try:
            password = urllib.parse.urlsplit(self.url).password
        except ValueError:  # brackets holding no address: the URL is refused as malformed
            password = None
        if password:
            text = text.replace(password, "***")
            text = text.replace(urllib.parse.unquote(password), "***")
        return text

    async def _load_scripts(self) -> None:
        for text in scripts.SCRIPTS.values():
            await cast(Awaitable[Any], self._redis.script_load(text))

    @property
    def _scripts(self) -> RedisLink:
        if self._link is None:
            raise StoreUnavailable(f"the store at {self.where} is not open")
        return self._link

    async def _script(self, name: str, *args: Any, via: RedisLink | None = None) -> Any:
        """EVALSHA (on the scripts' link, or `via`), loading the scripts again if Redis has
        forgotten them (a restart)."""
        link = self._scripts if via is None else via
        try:
            return await link.call(b"EVALSHA", scripts.EVALSHA[name], 0, *self._args, *args)
        except NoScriptError:
            await self._load_scripts()
            return await link.call(b"EVALSHA", scripts.EVALSHA[name], 0, *self._args, *args)

    async def _list(
        self,
        operation: str,
        index: str,
        scan: int,
        limit: int,
        statuses: str,
        reasoner: str,
        *,
        budget: int = 0,
        bare: bool = False,
        after: str | None = None,
    ) -> Page:
        since, since_id = "", ""
        if after is not None:
            cursor = _CURSOR.fullmatch(after)
            if cursor is None:
                raise BadCursor(after)
            since, since_id = cursor.groups()
        with self._operation(operation):
            reply = await self._script(
                "list",
                index,
                scan,
                limit,
                statuses,
                reasoner,
                budget,
                "1" if bare else "0",
                since,
                since_id,
            )
        found: list[Execution] = []
        cursors: list[str] = []
        for row in reply[:-1]:
            execution = self._restore(row)
            if int(row[Row.MATCHED]):
                found.append(execution)
                cursors.append(str(row[Row.CURSOR]))
        return Page(found, cursors, str(reply[-1]) or None)

    def _restore(self, row: list[Any]) -> Execution:
        """The record as a script returned it; a move to lost it made is counted here."""
        (
            execution_id,
            reasoner,
            session_id,
            replica,
            attempt,
            status,
            status_reason,
            result,
            error,
            created_at,
            finished_at,
            duration,
            abandoned,
        ) = row[: len(FIELDS)]
        execution = Execution.restore(
            execution_id,
            reasoner,
            session_id or None,
            replica=replica,
            attempt=int(attempt),
            status=ExecutionStatus(status),
            created_at=float(created_at),
            status_reason=CancelReason(status_reason) if status_reason else None,
            result=_unjson(result) if result else None,
            error=_unjson(error) if error else None,
            finished_at=_number(finished_at),
            duration_seconds=_number(duration),
            abandoned=abandoned == "1",
        )
        moved = Moved(int(row[Row.MOVED]))
        if moved is Moved.LOST and self.observer is not None:
            self.observer.execution_lost(execution)
        elif moved is Moved.QUEUED:
            logger.warning(
                "execution %s (%s): its owner stopped renewing its liveness; attempt %d queued",
                execution.execution_id,
                execution.reasoner,
                execution.attempt,
            )
        return execution

    def _new_record(self, execution: Execution) -> list[str | bytes]:
        """The hash values in FIELDS order, for a record being created: nothing ended yet,
        so no result, error or end to encode (on the path of every start)."""
        return [
            execution.execution_id,
            execution.reasoner,
            execution.session_id or "",
            execution.replica,
            str(execution.attempt),
            execution.status.value,
            "",
            b"null",
            b"null",
            repr(execution.created_at),
            "",
            "",
            "0",
        ]

    def _end_args(self, execution: Execution) -> list[str | bytes]:
        """An end's arguments of the `end` script: who writes it, then what it records."""
        duration = execution.duration_seconds
        return [
            execution.execution_id,
            execution.replica,
            str(execution.attempt),
            execution.status.value,
            execution.status_reason.value if execution.status_reason else "",
            _json(execution.result),
            b"null" if execution.error is None else _json(execution.error),
            "" if execution.finished_at is None else repr(execution.finished_at),
            "" if duration is None else repr(duration),
            "1" if execution.abandoned else "0",
        ]
