"""The outbox: ends, hand-offs and events owed to Redis, written in order by one writer, and
held while Redis is unreachable or refusing them (section 12, invariant 4)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from agent_server.model.execution import Execution, log_fields
from agent_server.store.base import StoreObserver, StoreUnavailable
from agent_server.store.redis.failures import Refused, on_a_replica, transient_reason
from agent_server.store.redis.link import REPLICA_WAIT_MS, Link
from agent_server.store.redis.resp import replies

logger = logging.getLogger("agent_server.store")

#: Ends kept locally while Redis is unreachable (or slower than they come), at least: a
#: replica keeps one for every execution it may run (`open_store` takes `--max-inflight`
#: when larger); past it they are counted, never dropped.
OUTBOX_LIMIT = 10_000
#: Events waiting for Redis; past it, new events are dropped (never an end).
EVENTS_PENDING = 10_000
#: Ends per call of the `end` script, and about the most bytes of their arguments: a
#: script holds Redis for every other client while it runs (some tens of microseconds an
#: end), so one call stays within a few milliseconds.
END_CALL = 100
END_CALL_BYTES = 512 * 1024
#: Writes per pipeline (one round trip), and about the most bytes of their arguments: a
#: backlog (a drain's ends) goes many calls a round trip, each call short, and the
#: pipeline within the command timeout.
END_BATCH = 2_000
END_BATCH_BYTES = 4 * 1024 * 1024
#: Pipelines in flight at once while a backlog lasts (one connection: run in order).
WINDOW = 2
#: A loop turn that ends many executions at once (a drain: every reasoner waiting for it
#: returns in the same turn, seconds of work at 100,000) does not wait for its end to write:
#: once this many writes are owed and unsent, `put` sends them itself, in the turn, while
#: the socket takes them at once (Redis runs them while the turn goes on; their replies,
#: some bytes an end, are read after it). What is in flight is bounded by the outbox's own
#: limit: a write in flight is still owed, its arguments kept until Redis answers.
EAGER_BATCH = 500
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

    __slots__ = ("args", "execution", "keys", "script", "size")

    def __init__(
        self, execution: Execution, script: str, keys: Sequence[str], args: list[str | bytes]
    ) -> None:
        self.execution = execution
        self.script = script
        self.keys = keys
        self.args = args
        #: The bytes (or characters) of its arguments, which bound a call and a pipeline.
        self.size = sum(map(len, args))


class _Pipeline:
    """Writes sent in one round trip: their commands, which writes each command carries
    ([start, stop)), the replicas WAIT needed when made, and the replies' futures."""

    __slots__ = ("commands", "futures", "needed", "sent", "spans", "writes")

    def __init__(
        self,
        writes: list[Write],
        commands: list[list[Any]],
        spans: list[tuple[int, int]],
        needed: int,
    ) -> None:
        self.writes = writes
        self.commands = commands
        self.spans = spans
        self.needed = needed
        self.futures: list[asyncio.Future[Any]] = []
        #: When it was sent (`time.perf_counter()`): its round trip is timed from there.
        self.sent = time.perf_counter()


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
        #: Writes not sent yet, oldest first (those in flight are older: `_flight`).
        self._writes: deque[Write] = deque()
        #: Events owed, sent or not.
        self._pending_events = 0
        #: Ends past the limit, and ends Redis refused for good: both unrecorded.
        self.overflow: list[Execution] = []
        self.failed: list[Execution] = []
        self.fenced = 0
        self.events_dropped = 0
        self._writing = asyncio.Lock()
        self.wake = asyncio.Event()
        #: Pipelines sent and not yet read, oldest first, and the writes they carry: the
        #: oldest writes of the outbox, which only the writer takes out once answered.
        self._flight: deque[_Pipeline] = deque()
        self._flying = 0
        #: How many writes of each execution are in flight: the next pipeline stops before
        #: the first write of one of them.
        self._busy: dict[str, int] = {}
        #: Whether `put` may send a backlog itself: not while the writer waits to connect,
        #: takes back refused writes, or reads what is in flight after a failure.
        self._eager = True

    def __len__(self) -> int:
        return self._flying + len(self._writes)

    def owed_count(self) -> int:
        """Writes owed (events included) and ends kept aside, from lengths alone: another
        thread may read it while the loop runs."""
        return len(self) + len(self.overflow) + len(self.failed)

    def _owed_writes(self) -> Iterator[Write]:
        """Every write not answered yet, oldest first: in flight, then unsent."""
        for pipeline in self._flight:
            yield from pipeline.writes
        yield from self._writes

    def owed(self) -> list[Execution]:
        """The ends and hand-offs not recorded: still queued, past the limit, or refused."""
        queued = [write.execution for write in self._owed_writes() if write.script != "emit"]
        return [*queued, *self.overflow, *self.failed]

    def unwritten(self, script: str) -> list[str]:
        """The ids of the writes of `script` still queued."""
        return [w.execution.execution_id for w in self._owed_writes() if w.script == script]

    def owed_ids(self) -> set[str]:
        """Every execution with a write queued or kept aside."""
        owed = {write.execution.execution_id for write in self._owed_writes()}
        owed.update(execution.execution_id for execution in (*self.overflow, *self.failed))
        return owed

    def wake_if_owed(self) -> None:
        if len(self):
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
        if len(self) - self._pending_events >= self.limit:
            self.overflow.append(execution)
            recorded(execution, False)
            if len(self.overflow) == 1 or len(self.overflow) % 1000 == 0:
                logger.error(
                    "store outbox full (%d writes waiting for %s): %s of execution %s not "
                    "recorded (%d so far)",
                    len(self),
                    self._link.where,
                    script,
                    execution.execution_id,
                    len(self.overflow),
                )
            return
        self._writes.append(Write(execution, script, keys, args))
        self.wake.set()
        if len(self._writes) >= EAGER_BATCH and self._eager:
            self._send_eager()

    def _send_eager(self) -> None:
        """Send the next writes now, within this loop turn (see EAGER_BATCH); nothing when
        as many writes as the outbox holds are in flight, the link is down or its socket is
        still full."""
        link = self._link
        if self._flying >= self.limit or not (link.up and link.scripts.writable):
            return
        try:
            # Fewer: the rest waits behind an execution's write in flight, for the writer.
            pipeline = self._send_next(self._flight, EAGER_BATCH, least=EAGER_BATCH // 2)
            if pipeline is None:
                return
            futures = link.scripts.send_now(pipeline.commands)
        except Exception:  # never an end's failure: the writer meets it, and says so
            return
        if futures is not None:
            pipeline.futures = futures
            self._fly(pipeline)

    def _fly(self, pipeline: _Pipeline) -> None:
        """A pipeline sent: its writes, the oldest unsent, are in flight."""
        for _ in pipeline.writes:
            self._writes.popleft()
        self._flight.append(pipeline)
        self._flying += len(pipeline.writes)
        busy = self._busy
        for write in pipeline.writes:
            key = write.execution.execution_id
            busy[key] = busy.get(key, 0) + 1

    def _landed(self) -> None:
        pipeline = self._flight.popleft()
        self._flying -= len(pipeline.writes)
        busy = self._busy
        for write in pipeline.writes:
            key = write.execution.execution_id
            if busy[key] == 1:
                del busy[key]
            else:
                busy[key] -= 1

    async def run(self) -> None:
        """Write queued ends as they come; after an outage retry with a bounded backoff."""
        backoff = BACKOFF_FIRST
        while True:
            await self.wake.wait()
            self.wake.clear()
            while len(self):
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
        while len(self) and self._link.is_open:
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
        """The pipeline for `pending`: each run of ends calls of the `end` script of at most
        END_CALL ends and about END_CALL_BYTES (always one), each event or hand-off one
        call, then the events notice (and `WAIT`); with the writes each command carries:
        [start, stop)."""
        link = self._link
        calls: list[tuple[str, list[str], list[Any]]] = []
        spans: list[tuple[int, int]] = []
        emitted: dict[str, None] = {}
        call_size = 0
        for index, write in enumerate(pending):
            if (
                write.script == "end"
                and spans
                and pending[spans[-1][0]].script == "end"
                and index - spans[-1][0] < END_CALL
                and call_size + write.size <= END_CALL_BYTES
            ):
                calls[-1][1].extend(write.keys)
                calls[-1][2].extend(write.args)
                spans[-1] = (spans[-1][0], index + 1)
                call_size += write.size
                continue
            call_size = write.size
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
        """Pipelines of the oldest queued writes, up to WINDOW in flight: with a backlog the
        next is sent before the replies of the one before are read, so Redis works while
        this process reads them. Pipelines in flight together share no execution, so a
        refusal never lets an execution's later write pass its earlier one. An end refused
        (the record is lost, or another owner or attempt holds it) is logged and counted;
        nothing leaves the outbox unless Redis answered for it."""
        link = self._link
        async with self._writing:
            held: list[Write] = []  # answered "not now" or NOSCRIPT: back to the front
            reasons: list[str] = []
            noscript = False
            flight = self._flight  # `put` may have sent some already (EAGER_BATCH)
            try:
                while True:
                    while len(flight) < WINDOW and (not flight or link.scripts.connected):
                        pipeline = self._send_next(flight)
                        if pipeline is None:
                            break
                        self._eager = False  # `send` may wait to connect: nothing overtakes
                        try:
                            pipeline.futures = await link.scripts.send(pipeline.commands)
                        except Exception:
                            with link.operation("end"):  # reported, and said as an outage
                                raise
                        finally:
                            self._eager = True
                        self._fly(pipeline)
                    if not flight:
                        break
                    pipeline = flight[0]
                    with link.operation("end", since=pipeline.sent):
                        answers = await replies(pipeline.futures)
                    noscript |= self._answered_all(pipeline, answers, held, reasons)
                    self._landed()  # answered (a raise above leaves it in flight: unread)
                    if held:  # no more sent: what is in flight is read, then these go back
                        self._eager = False
                        while flight:
                            pipeline = flight[0]
                            with link.operation("end", since=pipeline.sent):
                                answers = await replies(pipeline.futures)
                            noscript |= self._answered_all(pipeline, answers, held, reasons)
                            self._landed()
                        break
            finally:
                unread: list[Write] = []  # their writes stay, to be written again
                for pipeline in flight:
                    for future in pipeline.futures:
                        future.cancel()
                    unread.extend(pipeline.writes)
                flight.clear()
                self._flying = 0
                self._busy.clear()
                self._writes.extendleft(reversed(unread))  # older than the unsent ones
                self._requeue(held)  # and these older still
                self._eager = True
            if noscript:  # Redis forgot its scripts (a restart): loaded, the writes go again
                with link.operation("load_scripts"):
                    await link.load_scripts(link.scripts)
            if reasons:  # refused for now: back at the front, in their order, and retried
                for reason in reasons:
                    self.count_retry(reason)
                link.set_up(False)
                raise Refused(
                    f"Redis at {link.where} refused {len(reasons)} writes for now ({reasons[0]})"
                )

    def _send_next(
        self, flight: deque[_Pipeline], most: int = END_BATCH, least: int = 1
    ) -> _Pipeline | None:
        """The pipeline of at most `most` writes after those in flight, up to the first of
        an execution in flight (None when there are fewer than `least` to send)."""
        pending = self.batch(self._busy if flight else None, most)
        if len(pending) < least:
            return None
        commands, spans = self._commands(pending)
        return _Pipeline(pending, commands, spans, self._link.replicas_needed)

    def _answered_all(
        self, pipeline: _Pipeline, answers: list[Any], held: list[Write], reasons: list[str]
    ) -> bool:
        """A pipeline's replies, to each of its writes (the oldest in the outbox: they leave
        it here); whether Redis had forgotten its scripts."""
        link = self._link
        pending, spans = pipeline.writes, pipeline.spans
        needed = max(pipeline.needed, link.replicas_needed)
        if self._replicated and not on_a_replica(answers[-1], needed):
            # A failover could lose them: they stay in the outbox (every script is
            # idempotent for the same attempt) and are written again.
            self.count_retry("noreplicas")
            link.set_up(False)
            raise Refused(f"not every replica of {link.where} acknowledged the writes")
        replies_: list[Any] = []
        for (start, stop), answer in zip(spans, answers, strict=False):
            if isinstance(answer, Exception):
                replies_.extend([answer] * (stop - start))
            elif pending[start].script == "end":
                replies_.extend(zip(answer[0::2], answer[1::2], strict=True))
            else:
                replies_.append(answer)
        self._pending_events -= sum(1 for write in pending if write.script == "emit")
        retry: list[Write] = []
        later: list[Write] = []
        for write, reply in zip(pending, replies_, strict=True):
            self._answered(write, reply, retry, later, reasons)
        # Back in their order (both kinds go again; the NOSCRIPT ones after a load).
        back = {id(write) for write in (*retry, *later)}
        held.extend(write for write in pending if id(write) in back)
        return bool(retry)

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

    def batch(self, busy: Container[str] | None = None, most: int = END_BATCH) -> list[Write]:
        """The oldest unsent writes of the outbox, at most `most` of them and about
        END_BATCH_BYTES (always one), up to the first of an execution in `busy`:
        a hundred ends of 12 MB are not one 1.2 GB pipeline that no command timeout could
        let through."""
        batch: list[Write] = []
        size = 0
        for write in itertools.islice(self._writes, most):
            if busy is not None and write.execution.execution_id in busy:
                break
            size += write.size
            if batch and size > END_BATCH_BYTES:
                break
            batch.append(write)
        return batch

    def retrying(self, error: StoreUnavailable) -> None:
        """A whole batch failed to reach Redis: it stays in the outbox; count why."""
        if not isinstance(error, Refused):
            self.count_retry(transient_reason(error) or "connection")

    async def waiting_out(self, name: str, keys: Sequence[str], *args: str | bytes) -> Any:
        """One script call of an owner's own write that does not wait its turn here (a
        checkpoint, an ask), Redis unreachable or refusing for a while waited out (a bounded
        backoff, as the writer's; a cancellation still ends the wait): what the reasoner does
        next depends on it being written."""
        backoff = BACKOFF_FIRST
        while True:
            try:
                with self._link.operation(name):
                    return await self._link.script(name, keys, *args)
            except StoreUnavailable as exc:
                if not self._link.is_open:
                    raise  # closed: nothing will write it
                self.count_retry(transient_reason(exc) or "connection")
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

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
