"""The app the end-to-end tests serve: `agent-server run tests_app:agent` (cwd: tests/apps/)."""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from agent_server import Agent, ExecutionContext, InputTimeout, RetryPolicy, Settings


class Text(BaseModel):
    text: str


def _mark(name: str) -> None:
    """Touch a marker file so a test can synchronise on a reasoner having started."""
    folder = os.environ.get("TESTS_MARKER_DIR")
    if folder:
        Path(folder, name).touch()


async def echo(message: Text) -> Text:
    return message


async def sleep(seconds: float = 1.0, marker: str | None = None) -> dict[str, float]:
    if marker:
        _mark(marker)
    await asyncio.sleep(seconds)
    return {"slept": seconds}


async def cooperative(ctx: ExecutionContext, seconds: float = 60.0) -> dict[str, object]:
    """Returns early, with a partial result, once the server begins to drain."""
    started = time.monotonic()
    drain = asyncio.ensure_future(ctx.wait_for_drain())
    try:
        await asyncio.wait({drain}, timeout=seconds)
    finally:
        drain.cancel()
    return {"stopped_early": ctx.draining, "seconds": time.monotonic() - started}


async def swallow(seconds: float = 600.0) -> str:
    """Catches every CancelledError and keeps going: can only be abandoned."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            await asyncio.sleep(deadline - time.monotonic())
        except asyncio.CancelledError:
            continue
    return "outlived"


async def deferred_cleanup(cleanup: float = 0.35) -> str:
    """On cancellation, spends `cleanup` seconds cleaning up, then ends cancelled."""
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.sleep(cleanup))
        raise
    return "not reached"


async def block_loop(seconds: float = 600.0, marker: str | None = None) -> str:
    """Blocks the event loop: only the watchdog can end the process."""
    if marker:
        _mark(marker)
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    return "woke"


async def block_at_drain(ctx: ExecutionContext, after: float = 0.3, seconds: float = 600.0) -> str:
    """Blocks the event loop `after` seconds into the drain (the others' ends owed by then):
    the loop turn that outlasts the grace period, which only the watchdog ends."""
    await ctx.wait_for_drain()
    await asyncio.sleep(after)
    time.sleep(seconds)  # noqa: ASYNC251 - blocking the loop is the point
    return "woke"


async def fail(message: str = "boom") -> None:
    raise ValueError(message)


def thread_sleep(seconds: float = 0.1) -> float:
    time.sleep(seconds)
    return seconds


REASONERS = [echo, sleep, cooperative, swallow, deferred_cleanup, block_loop, block_at_drain]
REASONERS += [fail, thread_sleep]


class Report(BaseModel):
    when: datetime
    tags: tuple[str, ...]


async def whoami(ctx: ExecutionContext) -> dict[str, object]:
    """Shows what the injected context carries."""
    return {
        "execution_id": ctx.execution_id,
        "reasoner": ctx.reasoner,
        "session_id": ctx.session_id,
        "draining": ctx.draining,
    }


def thread_whoami(ctx: ExecutionContext, label: str = "x") -> dict[str, str]:
    """A `def` reasoner with a context: proves it ran in a worker thread."""
    return {"thread": threading.current_thread().name, "execution_id": ctx.execution_id}


async def no_params() -> str:
    return "ok"


async def report(year: int = 2026) -> Report:
    """Serialised by its annotation: the datetime and tuple become JSON."""
    return Report(when=datetime(year, 1, 2, 3, 4, 5, tzinfo=UTC), tags=("a", "b"))


async def swallow_then_fail(linger: float = 0.5, marker: str | None = None) -> str:
    """Swallows every CancelledError for `linger` seconds after the first, then raises."""
    if marker:
        _mark(marker)
    first_cancel: float | None = None
    while True:
        try:
            if first_cancel is None:
                await asyncio.sleep(600)
                continue
            remaining = first_cancel + linger - time.monotonic()
            if remaining <= 0:
                raise RuntimeError("gave up after swallowing cancellation")
            await asyncio.sleep(remaining)
        except asyncio.CancelledError:
            if first_cancel is None:
                first_cancel = time.monotonic()


REASONERS += [whoami, thread_whoami, no_params, report, swallow_then_fail]

#: Tasks user code left behind (kept referenced, as careless code often does by accident).
_STRAY_TASKS: set[asyncio.Task[None]] = set()


async def _stubborn() -> None:
    while True:
        try:
            await asyncio.sleep(600)
        except asyncio.CancelledError:
            continue


async def spawn_stubborn_task() -> str:
    """Leaves a task the registry does not own, which swallows every cancellation."""
    _STRAY_TASKS.add(asyncio.create_task(_stubborn()))
    return "spawned"


async def to_thread_sleep(seconds: float = 600.0, marker: str | None = None) -> float:
    """Sleeps in the default executor: cancelling the await leaves the thread running."""
    if marker:
        _mark(marker)
    await asyncio.to_thread(time.sleep, seconds)
    return seconds


REASONERS += [spawn_stubborn_task, to_thread_sleep]


# -- misbehaving reasoners: each must be contained by the server ----------------------------


async def cleanup_raises(marker: str | None = None) -> str:
    """Its cleanup raises when cancelled: the execution ends failed, with that error."""
    if marker:
        _mark(marker)
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        raise RuntimeError("cleanup failed") from None
    return "not reached"


async def _raise_later(delay: float) -> None:
    await asyncio.sleep(delay)
    raise LookupError("raised by a task nobody awaited")


async def _raise_on_cancel() -> None:
    try:
        await asyncio.sleep(600)
    except asyncio.CancelledError:
        raise LookupError("raised while being cancelled") from None


async def spawn_failing_task(delay: float = 0.05, on_cancel: bool = False) -> str:
    """Starts a task it never keeps or awaits, which raises later (or when cancelled)."""
    orphan = _raise_on_cancel() if on_cancel else _raise_later(delay)
    asyncio.create_task(orphan)  # noqa: RUF006 - dropping the task is the misbehaviour
    return "spawned"


async def spawn_forgotten_task() -> str:
    """Starts a task waiting on an event only it references: it can only be collected."""
    asyncio.create_task(asyncio.Event().wait())  # noqa: RUF006 - the misbehaviour
    return "spawned"


class LibraryStop(BaseException):
    """A library's own BaseException subclass, as some async libraries define."""


async def raise_base(kind: str = "generator_exit") -> None:
    """Raises a BaseException that is not a cancellation."""
    if kind == "generator_exit":
        raise GeneratorExit("generator closed")
    if kind == "group":
        raise BaseExceptionGroup("several", [LibraryStop("inner"), ValueError("also")])
    if kind == "keyboard":
        raise KeyboardInterrupt("interrupted")
    if kind == "system_exit":
        raise SystemExit(3)
    raise LibraryStop("library stopped")


async def raise_cancelled(after: float = 0.0) -> None:
    """Raises CancelledError from its own code, with nobody asking for a cancellation."""
    await asyncio.sleep(after)
    raise asyncio.CancelledError("raised by the reasoner")


async def renamed_swallow(
    marker: str | None = None, name: str = "my-own-name", seconds: float = 600.0
) -> str:
    """Renames its own task, then swallows every cancellation: only abandonment ends it."""
    task = asyncio.current_task()
    assert task is not None
    task.set_name(name)
    if marker:
        _mark(marker)
    return await swallow(seconds)


def collect_garbage() -> int:
    """Runs the cycle collector now, so a test need not wait for it."""
    return gc.collect()


async def unserialisable(kind: str = "object") -> Any:
    """Returns a value no JSON can carry."""
    cycle: dict[str, object] = {}
    cycle["self"] = cycle
    values: dict[str, object] = {"object": object(), "cycle": cycle, "bytes": b"\xff\xfe"}
    return values[kind]


async def nan_result(value: str = "nan") -> float:
    """A float result that is not JSON: NaN or an infinity."""
    return float(value)


async def big_result(kilobytes: int = 256) -> str:
    """A large result: the server keeps at most `max_retained` of them."""
    return "x" * (kilobytes * 1024)


_LEAKED: list[bytearray] = []


async def leak(megabytes: int = 64) -> int:
    """Keeps `megabytes` more memory per call, forever: a leak in user code."""
    _LEAKED.append(bytearray(megabytes * 1024 * 1024))
    return len(_LEAKED)


class Label(BaseModel):
    name: Annotated[str, Field(pattern=r"^[a-z]+$", max_length=8)]
    kind: Literal["a", "b"] = "a"


async def labelled(label: Label, note: Annotated[str, Field(min_length=2)] = "ok") -> str:
    """Constrained strings, a literal and a nested model: inputs for 422 details."""
    return f"{label.name}:{label.kind}:{note}"


REASONERS += [
    labelled,
    cleanup_raises,
    spawn_failing_task,
    spawn_forgotten_task,
    collect_garbage,
    unserialisable,
    nan_result,
    big_result,
    leak,
    raise_base,
    raise_cancelled,
    renamed_swallow,
]


# -- resumable reasoners (durable executions) --------------------------------------------


async def _record_step(ctx: ExecutionContext, step: int) -> None:
    """Tell the test (through its Redis, when it gives one) which attempt did which step,
    in which process: its own account, independent of the server's records."""
    url = os.environ.get("TESTS_REDIS_URL")
    if not url:
        return
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        entry = f"{ctx.attempt}:{step}:{os.getpid()}:{time.time():.6f}"
        await client.rpush(f"tests:steps:{ctx.execution_id}", entry)
    finally:
        await client.aclose()


async def steps(
    ctx: ExecutionContext, count: int = 20, pause: float = 0.2, marker: str | None = None
) -> dict[str, int]:
    """A long job of `count` steps that checkpoints after each: a later attempt resumes
    after the last step recorded."""
    if marker:
        _mark(marker)
    _evidence(ctx, "begin", ctx.attempt)
    state = ctx.checkpoint_state or {"done": 0}
    for step in range(int(state["done"]), count):
        await asyncio.sleep(pause)
        await _record_step(ctx, step)
        await ctx.checkpoint({"done": step + 1})
    return {"steps": count, "attempt": ctx.attempt}


async def slow_first_attempt(ctx: ExecutionContext, first: float = 2.0) -> str:
    """The first attempt is slow (its owner may be paused meanwhile) and then tries to
    checkpoint and finish; later attempts finish at once."""
    if ctx.attempt == 1:
        _mark("first-attempt")
        await asyncio.sleep(first)
        await ctx.checkpoint({"late": True})
        return "stale"
    return "fresh"


# -- reasoners that emit events ------------------------------------------------------------


async def chatter(
    ctx: ExecutionContext, count: int = 5, pause: float = 0.0, fail_at: int | None = None
) -> dict[str, int]:
    """Emits `count` progress events, `pause` seconds apart; fails after `fail_at` of them."""
    for n in range(count):
        if fail_at is not None and n == fail_at:
            raise RuntimeError(f"failed after {n} events")
        await ctx.emit({"n": n}, event="progress")
        if pause:
            await asyncio.sleep(pause)
    return {"emitted": count}


async def tokens(ctx: ExecutionContext, text: str = "hello world", pause: float = 0.05) -> str:
    """Streams its words as `token` events, as a model streams tokens."""
    for word in text.split():
        await ctx.emit(word, event="token")
        await asyncio.sleep(pause)
    return text


REASONERS += [chatter, tokens]


# -- a reasoner that counts its runs ------------------------------------------------------


async def counted(key: str, seconds: float = 0.0) -> dict[str, Any]:
    """Counts each run in the test's Redis (TESTS_REDIS_URL), under `tests:runs:{key}`,
    then sleeps `seconds`: the test's own count of how often a start really ran."""
    runs = 0
    url = os.environ.get("TESTS_REDIS_URL")
    if url:
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(url)
        try:
            runs = int(await client.incr(f"tests:runs:{key}"))
        finally:
            await client.aclose()
    if seconds:
        await asyncio.sleep(seconds)
    return {"key": key, "runs": runs}


REASONERS += [counted]


# -- reasoners that leave evidence: the fault harness's own account (tests/support/faults/) ---

#: The directory, shared by every replica of one test, where the evidenced reasoners note each
#: run of their body: one file per execution, one line per run (or step).
EVIDENCE_DIR_ENV = "TESTS_EVIDENCE_DIR"
#: This process's `--replica-id`, written in each line of evidence.
REPLICA_ID_ENV = "TESTS_REPLICA_ID"
#: Attempts `evidenced_steps` may take (owners killed, paused past their lease, rolled).
EVIDENCED_STEPS_MAX_ATTEMPTS = 4


def _evidence(ctx: ExecutionContext, *fields: object) -> None:
    """Append one line to this execution's evidence file. One write with O_APPEND per line,
    so the lines of processes writing at once never interleave, and a process killed right
    after still leaves its line (the kernel has it)."""
    folder = os.environ.get(EVIDENCE_DIR_ENV)
    if not folder:
        return
    replica = os.environ.get(REPLICA_ID_ENV, "-")
    words = [*fields, replica, os.getpid(), f"{time.time():.6f}"]
    line = " ".join(str(word) for word in words) + "\n"
    fd = os.open(Path(folder, ctx.execution_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def evidenced(
    ctx: ExecutionContext, seconds: float = 0.2, fail: bool = False
) -> dict[str, float]:
    """Not resumable: notes each run of its body (`run ATTEMPT ...`), sleeps `seconds`, then
    returns, or raises ValueError when `fail`."""
    _evidence(ctx, "run", ctx.attempt)
    await asyncio.sleep(seconds)
    if fail:
        raise ValueError("failed on purpose")
    return {"slept": seconds}


async def evidenced_steps(
    ctx: ExecutionContext, count: int = 5, pause: float = 0.2
) -> dict[str, int]:
    """Resumable: `count` steps of `pause` seconds, each noted once done (`step ATTEMPT STEP
    COUNT ...`) and then checkpointed; a later attempt resumes after the last checkpoint."""
    _evidence(ctx, "begin", ctx.attempt)
    state = ctx.checkpoint_state or {"done": 0}
    for step in range(int(state["done"]), count):
        await asyncio.sleep(pause)
        _evidence(ctx, "step", ctx.attempt, step, count)
        await ctx.checkpoint({"done": step + 1})
    return {"steps": count, "attempt": ctx.attempt}


#: How long `evidenced_asking` waits for its answer: past it, it fails with ValueError.
EVIDENCED_ASK_TIMEOUT = 30.0


def evidenced_answer(execution_id: str) -> str:
    """What the fault harness's clients answer an `evidenced_asking` execution: derived from
    its id, so the checker knows what its result must hold."""
    return f"answer-{execution_id[:12]}"


async def evidenced_asking(ctx: ExecutionContext, pause: float = 0.1) -> dict[str, str]:
    """Resumable: asks once for input (parked on a shared store: the next attempt takes the
    answer) and returns it. Notes `asked ATTEMPT` before the ask and `answered ATTEMPT`
    after; no answer in time fails it with ValueError."""
    _evidence(ctx, "begin", ctx.attempt)
    await asyncio.sleep(pause)
    _evidence(ctx, "asked", ctx.attempt)
    try:
        answer = await ctx.ask({"question": "the word"}, timeout=EVIDENCED_ASK_TIMEOUT)
    except InputTimeout:
        raise ValueError("no answer in time") from None
    _evidence(ctx, "answered", ctx.attempt)
    return {"answer": str(answer)}


def evidenced_reply(question: str, execution_id: str) -> str:
    """What the fault harness's clients answer `question` of an `evidenced_two_asks`
    execution: the answer names its question, so a reasoner handed another question's
    answer shows it."""
    return f"{question}-{execution_id[:12]}"


async def _asked(ctx: ExecutionContext, question: str) -> str:
    _evidence(ctx, "asked", ctx.attempt, question)
    try:
        answer = await ctx.ask({"question": question}, timeout=EVIDENCED_ASK_TIMEOUT)
    except InputTimeout:
        raise ValueError("no answer in time") from None
    text = str(answer).replace(" ", "_") or "-"
    _evidence(ctx, "got", ctx.attempt, question, text)
    return str(answer)


async def evidenced_two_asks(
    ctx: ExecutionContext, from_top: bool = False, pause: float = 0.05
) -> dict[str, str]:
    """Resumable: asks `first`, checkpoints its answer, asks `second`, and returns both.
    Notes `asked ATTEMPT QUESTION` before each ask and `got ATTEMPT QUESTION ANSWER` for every
    answer it is handed. `from_top`: a resumed
    attempt asks again from the first question rather than skipping what its checkpoint
    keeps (the re-ask must be handed the first answer again, never the second)."""
    _evidence(ctx, "begin", ctx.attempt)
    await asyncio.sleep(pause)
    state = ctx.checkpoint_state or {}
    first = state.get("first") if not from_top else None
    if first is None:
        first = await _asked(ctx, "first")
        await ctx.checkpoint({"first": first})
    second = await _asked(ctx, "second")
    return {"first": str(first), "second": second}


#: `evidenced_limited`: at most this many bodies at once per value of its `X-Tenant` header.
EVIDENCED_LIMIT = 2
EVIDENCED_LIMIT_HEADER = "X-Tenant"


async def evidenced_limited(
    ctx: ExecutionContext, tenant: str = "-", seconds: float = 0.2
) -> dict[str, float]:
    """Limited to EVIDENCED_LIMIT at once per `X-Tenant` (its clients send the same value
    as `tenant`): notes `start ATTEMPT TENANT` when its body begins and `end ATTEMPT TENANT`
    when it leaves, however it leaves, so the checker sees every interval of a slot."""
    _evidence(ctx, "start", ctx.attempt, tenant)
    try:
        await asyncio.sleep(seconds)
    finally:
        _evidence(ctx, "end", ctx.attempt, tenant)
    return {"slept": seconds}


async def evidenced_session(
    ctx: ExecutionContext, seconds: float = 0.1, fail_first: bool = False
) -> dict[str, float]:
    """Started with `X-Session-ID` and `X-Session-Policy: enqueue`: notes `start ATTEMPT
    SESSION` and `end ATTEMPT SESSION`; `fail_first` fails attempt 1 with ValueError, so a
    retry (due later) is earlier work of the session the next message must wait for."""
    session = ctx.session_id or "-"
    _evidence(ctx, "start", ctx.attempt, session)
    try:
        await asyncio.sleep(seconds)
        if fail_first and ctx.attempt == 1:
            raise ValueError("failed on purpose, retried")
    finally:
        _evidence(ctx, "end", ctx.attempt, session)
    return {"slept": seconds}


REASONERS += [evidenced]


def _limit_address_space() -> None:
    """TESTS_MEMORY_HEADROOM_MB caps the address space at its current size plus that much,
    so a leaking reasoner meets a real MemoryError instead of the machine's memory."""
    headroom = os.environ.get("TESTS_MEMORY_HEADROOM_MB")
    if not headroom:
        return
    status = Path("/proc/self/status").read_text()
    current_kb = next(int(line.split()[1]) for line in status.splitlines() if "VmSize" in line)
    limit = (current_kb * 1024) + int(headroom) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))


_limit_address_space()


#: Every reasoner name make_agent registers: the plain ones and the resumable ones.
RESUMABLE_NAMES = {
    "steps",
    "steps_once",
    "slow_first_attempt",
    "evidenced_steps",
    "evidenced_asking",
    "evidenced_two_asks",
}
#: The ones registered with scheduling options (a limit, a retry policy).
SCHEDULED_NAMES = {"evidenced_limited", "evidenced_session"}


def reasoner_names() -> set[str]:
    return {func.__name__ for func in REASONERS} | RESUMABLE_NAMES | SCHEDULED_NAMES


def make_agent(settings: Settings | None = None) -> Agent:
    """A fresh agent (own registry and metrics) with every test reasoner."""
    fresh = Agent("tests", settings)
    for func in REASONERS:
        fresh.reasoner()(func)
    fresh.reasoner(resumable=True, max_attempts=3)(steps)
    fresh.reasoner(name="steps_once", resumable=True, max_attempts=1)(steps)
    fresh.reasoner(resumable=True, max_attempts=3)(slow_first_attempt)
    fresh.reasoner(resumable=True, max_attempts=EVIDENCED_STEPS_MAX_ATTEMPTS)(evidenced_steps)
    fresh.reasoner(resumable=True, max_attempts=EVIDENCED_STEPS_MAX_ATTEMPTS)(evidenced_asking)
    fresh.reasoner(resumable=True, max_attempts=EVIDENCED_STEPS_MAX_ATTEMPTS)(evidenced_two_asks)
    fresh.reasoner(
        max_concurrency=EVIDENCED_LIMIT, concurrency_key=f"header:{EVIDENCED_LIMIT_HEADER}"
    )(evidenced_limited)
    fresh.reasoner(retry=RetryPolicy(max_attempts=2, initial_delay=0.3, retry_on=(ValueError,)))(
        evidenced_session
    )
    return fresh


agent = make_agent()


# -- the fuzzing target: reasoners whose every valid input ends quickly and succeeds --------


class Ticket(BaseModel):
    title: str = Field(min_length=1, max_length=200)
    priority: Literal["low", "normal", "high"] = "normal"
    tags: list[str] = Field(default_factory=list, max_length=10)
    estimate_hours: float | None = Field(default=None, ge=0, le=1000)


class Triage(BaseModel):
    title: str
    urgent: bool
    tag_count: int


async def triage(ticket: Ticket) -> Triage:
    """A pydantic model in and out, with constraints the fuzzer must respect."""
    return Triage(title=ticket.title, urgent=ticket.priority == "high", tag_count=len(ticket.tags))


async def add(a: int, b: int = 0) -> int:
    """Plain parameters, bound from a JSON object."""
    return a + b


async def pause(seconds: Annotated[float, Field(ge=0, le=0.05)] = 0.0) -> dict[str, float]:
    """A short bounded sleep, so async starts can be polled and cancelled while running."""
    await asyncio.sleep(seconds)
    return {"slept": seconds}


FUZZ_REASONERS = [echo, whoami, no_params, thread_whoami, triage, add, pause]


def make_fuzz_agent() -> Agent:
    """Served to the fuzzer: `agent-server run tests_app:fuzz_agent`."""
    fresh = Agent("fuzz")
    for func in FUZZ_REASONERS:
        fresh.reasoner()(func)
    return fresh


fuzz_agent = make_fuzz_agent()
