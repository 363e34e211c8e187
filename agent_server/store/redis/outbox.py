"""The outbox: ends, hand-offs and events owed to Redis, written in order by one writer, and
held while Redis is unreachable or refusing them (section 12, invariant 4)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from agent_server.model.execution import Execution, log_fields
from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.redis.failures import Refused, on_a_replica, transient_reason
from agent_server.store.redis.link import REPLICA_WAIT_MS, Link

logger = logging.getLogger("agent_server.store")

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


def recorded(execution: Execution, written: bool) -> None:
    """Tell whoever waits on `RedisStore.recorded` whether the end is in Redis."""
    future = execution.recorded
    if future is not None and not future.done():
        future.set_result(written)


class Write:
    """One write owed to Redis: the script and its keys and arguments, taken when queued."""

    __slots__ = ("args", "execution", "keys", "script")

    def __init__(
        self, execution: Execution, script: str, keys: Sequence[str], args: list[str | bytes]
    ) -> None:
        self.execution = execution
        self.script = script
        self.keys = keys
        self.args = args


class Outbox:
    """Writes owed to Redis, oldest first, and the one writer that sends them."""

    def __init__(
        self,
        link: Link,
        *,
        end_keys: Sequence[str],
        events_channel: str,
        replicated: bool,
        observer: StoreObserver | None,
        limit: int,
        on_written: Callable[[Execution], None],
    ) -> None:
        self._link = link
        #: The keys a call of the `end` script opens with, before each end's own.
        self._end_keys = end_keys
        self._events_channel = events_channel
        #: Behind Sentinel a failover can lose writes the old primary acknowledged but no
        #: replica had: a batch is followed by `WAIT 1 <ms>` on the scripts' link.
        self._replicated = replicated
        self._observer = observer
        self.limit = limit
        self._on_written = on_written
        self._writes: deque[Write] = deque()
        self._pending_events = 0
        #: Ends past the limit, and ends Redis refused for good: both unrecorded.
        self.overflow: list[Execution] = []
        self.failed: list[Execution] = []
        self.fenced = 0
        self.events_dropped = 0
        self._writing = asyncio.Lock()
        self.wake = asyncio.Event()

    def __len__(self) -> int:
        return len(self._writes)

    def owed(self) -> list[Execution]:
        """The ends and hand-offs not recorded: still queued, past the limit, or refused."""
        queued = [write.execution for write in self._writes if write.script != "emit"]
        return [*queued, *self.overflow, *self.failed]

    def unwritten(self, script: str) -> list[str]:
        """The ids of the writes of `script` still queued."""
        return [write.execution.execution_id for write in self._writes if write.script == script]

    def owed_ids(self) -> set[str]:
        """Every execution with a write queued or kept aside."""
        owed = {write.execution.execution_id for write in self._writes}
        owed.update(execution.execution_id for execution in (*self.overflow, *self.failed))
        return owed

    def wake_if_owed(self) -> None:
        if self._writes:
            self.wake.set()

    def put(
        self, execution: Execution, script: str, keys: Sequence[str], args: list[str | bytes]
    ) -> None:
        """Ends and hand-offs are bounded by `limit`, events by EVENTS_PENDING on their
        own, so a burst of events never stands in an end's way. Past its bound an end is
        kept aside, logged and reported by `flush` as unrecorded; an event is dropped
        (counted and logged: readers see the gap as `missed`)."""
        if script == "emit":
            if self._pending_events < EVENTS_PENDING:
                self._pending_events += 1
                self._writes.append(Write(execution, script, keys, args))
                self.wake.set()
                return
            self.events_dropped += 1
            if self.events_dropped % 1000 == 1:
                logger.warning(
                    "store outbox full: events not written to %s (%d so far)",
                    self._link.where,
                    self.events_dropped,
                )
            return
        if len(self._writes) - self._pending_events >= self.limit:
            self.overflow.append(execution)
            recorded(execution, False)
            if len(self.overflow) == 1 or len(self.overflow) % 1000 == 0:
                logger.error(
                    "store outbox full (%d writes waiting for %s): %s of execution %s not "
                    "recorded (%d so far)",
                    len(self._writes),
                    self._link.where,
                    script,
                    execution.execution_id,
                    len(self.overflow),
                )
            return
        self._writes.append(Write(execution, script, keys, args))
        self.wake.set()

    async def run(self) -> None:
        """Write queued ends as they come; after an outage retry with a bounded backoff."""
        backoff = BACKOFF_FIRST
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self._writes:
                try:
                    await self.write()
                    backoff = BACKOFF_FIRST
                except StoreUnavailable as exc:
                    self.retrying(exc)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, BACKOFF_MAX)
                except Exception:  # a bug, not an outage: say so, keep the ends, go on
                    logger.exception("writing ends to %s failed", self._link.where)
                    await asyncio.sleep(BACKOFF_MAX)

    async def flush(self, deadline: float) -> list[Execution]:
        """Write until `deadline` (monotonic); what is left is unrecorded."""
        backoff = BACKOFF_FIRST
        while self._writes and self._link.is_open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                async with asyncio.timeout(remaining):
                    await self.write()
                backoff = BACKOFF_FIRST
            except TimeoutError:
                break
            except StoreUnavailable as exc:
                self.retrying(exc)
                await asyncio.sleep(max(0.0, min(backoff, deadline - time.monotonic())))
                backoff = min(backoff * 2, BACKOFF_MAX)
        return self.owed()

    def _commands(self, pending: list[Write]) -> tuple[list[list[Any]], list[tuple[int, int]]]:
        """The pipeline for `pending`: each run of ends one call of the `end` script, each
        event or hand-off one call, then the events notice (and `WAIT`); with the writes
        each command carries: [start, stop)."""
        link = self._link
        calls: list[tuple[str, list[str], list[Any]]] = []
        spans: list[tuple[int, int]] = []
        emitted: dict[str, None] = {}
        for index, write in enumerate(pending):
            if write.script == "end" and spans and pending[spans[-1][0]].script == "end":
                calls[-1][1].extend(write.keys)
                calls[-1][2].extend(write.args)
                spans[-1] = (spans[-1][0], index + 1)
                continue
            if write.script == "end":
                calls.append(
                    ("end", [*self._end_keys, *write.keys], [NOTICE_RECORD_MAX, *write.args])
                )
            else:
                calls.append((write.script, list(write.keys), list(write.args)))
            spans.append((index, index + 1))
            if write.script == "emit":
                emitted[write.execution.execution_id] = None
        commands = [link.command(script, keys, args) for script, keys, args in calls]
        # One notice per batch for every replica, not one per event.
        if emitted:
            commands.append(["PUBLISH", self._events_channel, " ".join(emitted)])
        if self._replicated:  # acknowledged only once the replicas have them
            commands.append(["WAIT", self._link.replicas_needed, REPLICA_WAIT_MS])
        return commands, spans

    async def write(self) -> None:
        """One pipeline for the oldest queued writes. An end refused (the record is lost,
        or another owner or attempt holds it) is logged and counted; nothing leaves the
        outbox unless Redis answered for it."""
        link = self._link
        async with self._writing:
            pending = self.batch()
            later: list[Write] = []
            reasons: list[str] = []
            for _ in range(2):  # a second pass only after Redis forgot its scripts
                if not pending:
                    break
                with link.operation("end"):
                    needed = link.replicas_needed
                    commands, spans = self._commands(pending)
                    answers = await link.scripts.pipeline(commands)
                needed = max(needed, link.replicas_needed)
                if self._replicated and not on_a_replica(answers[-1], needed):
                    # A failover could lose them: they stay in the outbox (every script is
                    # idempotent for the same attempt) and are written again.
                    self.count_retry("noreplicas")
                    link.set_up(False)
                    raise Refused(f"not every replica of {link.where} acknowledged the writes")
                replies: list[Any] = []
                for (start, stop), answer in zip(spans, answers, strict=False):
                    if isinstance(answer, Exception):
                        replies.extend([answer] * (stop - start))
                    elif pending[start].script == "end":
                        replies.extend(zip(answer[0::2], answer[1::2], strict=True))
                    else:
                        replies.append(answer)
                for _ in pending:  # the oldest in the outbox: only this method removes
                    if self._writes.popleft().script == "emit":
                        self._pending_events -= 1
                retry: list[Write] = []
                for write, reply in zip(pending, replies, strict=True):
                    self._answered(write, reply, retry, later, reasons)
                self._requeue(retry)
                if retry:
                    with link.operation("load_scripts"):
                        await link.load_scripts(link.scripts)
                pending = retry
            if later:  # refused for now: back to the front, in their order, and retried
                self._requeue(later)
                for reason in reasons:
                    self.count_retry(reason)
                link.set_up(False)
                raise Refused(
                    f"Redis at {link.where} refused {len(later)} writes for now ({reasons[0]})"
                )

    def _answered(
        self, write: Write, reply: Any, retry: list[Write], later: list[Write], reasons: list[str]
    ) -> None:
        execution, script = write.execution, write.script
        if isinstance(reply, NoScriptError):
            retry.append(write)
        elif isinstance(reply, Exception) and (reason := transient_reason(reply)):
            later.append(write)
            reasons.append(reason)
        elif isinstance(reply, Exception) and script == "emit":
            logger.warning(
                "event of execution %s not written: %s",
                execution.execution_id,
                reply,
                extra={"fields": log_fields(execution)},
            )
        elif isinstance(reply, Exception):
            logger.error(
                "%s of execution %s could not be written: %s",
                script,
                execution.execution_id,
                reply,
                extra={"fields": log_fields(execution)},
            )
            self.failed.append(execution)
            recorded(execution, False)
        elif not int(reply[0]):
            self.fence(script, execution, reply[1])
            recorded(execution, False)
        elif script == "end":
            recorded(execution, True)
            self._on_written(execution)

    def _requeue(self, writes: list[Write]) -> None:
        """Back to the front of the outbox, in their order."""
        self._writes.extendleft(reversed(writes))
        self._pending_events += sum(1 for write in writes if write.script == "emit")

    def batch(self) -> list[Write]:
        """The oldest writes of the outbox, at most END_BATCH of them and about
        END_BATCH_BYTES (always one): a hundred ends of 12 MB are not one 1.2 GB pipeline
        that no command timeout could let through."""
        batch: list[Write] = []
        size = 0
        for write in itertools.islice(self._writes, END_BATCH):
            size += sum(len(arg) for arg in write.args)
            if batch and size > END_BATCH_BYTES:
                break
            batch.append(write)
        return batch

    def retrying(self, error: StoreUnavailable) -> None:
        """A whole batch failed to reach Redis: it stays in the outbox; count why."""
        if not isinstance(error, Refused):
            self.count_retry(transient_reason(error) or "connection")

    def count_retry(self, reason: str) -> None:
        if self._observer is not None:
            self._observer.write_retried(reason)

    def fence(self, write: str, execution: Execution, found: str) -> None:
        """A fenced write: this attempt no longer owns the record. Logged and counted."""
        self.fenced += 1
        logger.warning(
            "%s of execution %s (replica %s, attempt %d) refused: the record is %s",
            write,
            execution.execution_id,
            execution.replica,
            execution.attempt,
            found or "unknown (expired, deleted, or Redis lost its data)",
            extra={"fields": log_fields(execution)},
        )
        if self._observer is not None:
            self._observer.fenced_write(execution)
