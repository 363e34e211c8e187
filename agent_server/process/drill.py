"""`agent-server drill [APP]`: rehearse a shutdown before deploying.

APP runs as a real `agent-server run` child on a free loopback port with the shutdown flags
given; background executions of its reasoners are started; SIGTERM follows; the child's exit
is awaited (bounded by its grace period and a margin); then each reasoner is judged: did its
work finish in the drain, settle once cancelled, swallow the cancellation (abandoned), or
block the event loop?

How the outcome of each execution is learnt. With the memory store the records die with
the child, so they are read while it shuts down: every execution is long-polled (`GET
/executions/{id}?wait=`) from before the signal; the listener stays open until the report,
so each long-poll answers with the record as it ended, the moment it ends. What a record
cannot say is read from the child's log (`--log-format json`): the shutdown report (when
the cancellation came, the phases), the `abandoned` WARNING lines (an abandoned execution
reads `cancelled` like a settled one) and the loop-stall lines (what held the loop). Both
sources are ones the server keeps anyway, for its clients and its operators; nothing is
added to the server for the drill but fields on lines it already logs. Scraping `/metrics`
instead would race the listener's close, and its counters are not per execution.

Every status of `ExecutionStatus` is followed and judged by an exhaustive match (a new
status is a type error in `follow_by` and `outcome`, never a guess): `queued` and `running`
are long-polled (the server waits through them); `input_required` is answered by the
long-poll at once, so its event stream is read instead, which ends with the record as it
ended; a request that brings no change ends the following, and MAX_FOLLOW_REQUESTS bounds
it whatever the server answers. Where the last record stood is judged by the store's kind:
with the memory store queued work ends cancelled unrun at the shutdown and a wait for input
is running work (drained, then cancelled); with a shared store queued work is left for
another replica, and a resumable wait is parked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, assert_never

import httpx

from agent_server.model.status import CancelReason, ExecutionStatus, parked
from agent_server.runtime.exits import ExitCode
from agent_server.runtime.settings import Settings
from agent_server.runtime.shutdown import ShutdownPlan

#: The flags of `run` the drill passes on: the terms of the shutdown budget, derived from
#: the plan's fields that are settings (all but the fixed margin).
SHUTDOWN_FIELDS: tuple[str, ...] = tuple(
    item.name for item in dataclasses.fields(ShutdownPlan) if item.name in Settings.model_fields
)
#: Seconds the child may take to listen (importing an app can be slow).
STARTUP_TIMEOUT = 30.0
#: Seconds a start (`POST /reasoners/{name}/async`) may take: a blocked loop answers late.
START_TIMEOUT = 10.0
#: The child's exit is awaited for its grace period plus this; then it is killed.
EXIT_MARGIN = 3.0
#: After the exit, unanswered long-polls get this long to see their connection end.
POLL_SETTLE = 1.0
#: Requests that follow one execution, at most: each must bring a change (a request that
#: brings none ends the following), so a drill where nobody answers takes two or three; the
#: bound holds whatever a server answers.
MAX_FOLLOW_REQUESTS = 10
#: A stall over this is a fault (the server's own threshold for its WARNING).
STALL_FAULT = 1.0
#: uvicorn's start-up line names the port it bound.
LISTENING = re.compile(r"running on https?://127\.0\.0\.1:(\d+)")
EXIT_MEANINGS = {
    int(ExitCode.OK): "ok",
    int(ExitCode.STARTUP_FAILED): "the server could not start",
    int(ExitCode.INVALID_SETTINGS): "invalid settings",
    int(ExitCode.ABANDONED): "work was abandoned",
    int(ExitCode.WATCHDOG): "the watchdog ended the process (the event loop was blocked)",
    int(ExitCode.FORCED): "a third signal forced the exit",
    int(ExitCode.UNRECORDED): "ends were not written to the store",
}


class DrillError(Exception):
    """Arguments that cannot be drilled, found once the app is known: exit 2, one line."""


@dataclass(frozen=True)
class DrillArgs:
    """What the command line asked for; `settings` validated (the child reads the same)."""

    app: str | None
    reasoners: tuple[str, ...]
    inputs: Mapping[str, Any]
    executions: int
    signal_after: float
    flags: Mapping[str, Any]
    settings: Settings


@dataclass
class Started:
    """One execution the drill started, its record as last seen, and how it was followed."""

    reasoner: str
    execution_id: str
    record: dict[str, Any]
    requests: int = 0  # GETs that followed it (the start not counted)
    waited: bool = False  # seen waiting for input inside its task (`ctx.ask`, not parked)


@dataclass(frozen=True)
class Stall:
    """One stall of the loop from the child's log: its length and what held the loop."""

    seconds: float
    ended_at: float | None  # Unix time the loop turned again; None: it never did
    reasoner: str | None
    where: str | None  # "function at file:line"

    @property
    def described(self) -> str:
        length = f"{self.seconds:.2f} s"
        if self.ended_at is None:
            length = f"at least {length}"
        said = f"{length} in {self.where}" if self.where else length
        return said if self.ended_at is not None else f"{said}, until the process ended"


@dataclass
class ChildLog:
    """The child's stderr: its JSON lines, and the rest as text."""

    records: list[dict[str, Any]] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        if line.startswith("{"):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                self.records.append(record)
                return
        if line.strip():
            self.text.append(line)

    def report(self) -> tuple[dict[str, Any], float] | None:
        """The shutdown report and the Unix time of the first signal, by the child's clock."""
        for record in self.records:
            report = record.get("report")
            if record.get("message") == "shutdown report" and isinstance(report, dict):
                logged = datetime.fromisoformat(str(record["timestamp"])).timestamp()
                return report, logged - float(report.get("duration_seconds", 0.0))
        return None

    def abandoned(self) -> dict[str, bool]:
        """Abandoned execution ids, each with whether it ran in a thread (a `def`)."""
        found = {
            str(record["abandoned_execution"]): bool(record.get("in_thread"))
            for record in self.records
            if "abandoned_execution" in record
        }
        for record in self.records:  # past the first lines, one line names the rest
            threads = set(record.get("in_threads") or ())
            for execution_id in record.get("abandoned_executions") or ():
                found[str(execution_id)] = execution_id in threads
        return found

    def handed_off(self) -> set[str]:
        """Execution ids whose attempt here was handed off at the drain deadline (a queued
        record does not say whether it ran before)."""
        return {
            str(record["execution_id"])
            for record in self.records
            if record.get("handed_off") is True and "execution_id" in record
        }

    def stalls(self, until: float | None = None) -> list[Stall]:
        """Every stall: those that ended (with their length), then any still going when
        the process ended at `until` (a WARNING without its end line)."""
        warned = [r for r in self.records if "blocked_seconds" in r]
        ended = [r for r in self.records if "stall_seconds" in r]
        found = [
            Stall(
                float(r["stall_seconds"]), _unix(r.get("timestamp")), r.get("reasoner"), _where(r)
            )
            for r in ended
        ]
        for record in warned[len(ended) :]:
            seconds = float(record["blocked_seconds"])
            warned_at = _unix(record.get("timestamp"))
            if until is not None and warned_at is not None:  # it lasted until the exit
                seconds = max(seconds, until - (warned_at - seconds))
            found.append(Stall(seconds, None, record.get("reasoner"), _where(record)))
        return found

    def lags(self) -> list[tuple[float, float]]:
        """The longest lags the sampler kept, (seconds, Unix time the loop turned again)."""
        for record in self.records:
            kept = record.get("longest_lags")
            if isinstance(kept, list):
                return [(float(seconds), float(at)) for seconds, at in kept]
        return []

    def last_words(self, lines: int = 3) -> str:
        """The last lines a failed start wrote: the one that says why."""
        shown = self.text[-lines:] or [str(r.get("message")) for r in self.records[-lines:]]
        return "\n".join(shown)


def _unix(stamp: object) -> float | None:
    if not isinstance(stamp, str):
        return None
    try:
        return datetime.fromisoformat(stamp).timestamp()
    except ValueError:
        return None


def _where(record: Mapping[str, Any]) -> str | None:
    if "function" not in record:
        return None
    path = str(record.get("file", "?"))
    with contextlib.suppress(ValueError):
        relative = os.path.relpath(path)
        path = path if relative.startswith("..") else relative
    return f"{record['function']} at {path}:{record.get('line', '?')}"


# -- inputs ------------------------------------------------------------------------------------


def parse_input(text: str) -> tuple[str, Any]:
    """`NAME=JSON` of `--input`; ValueError says what is wrong."""
    from agent_server.model import jsoncodec

    name, sep, raw = text.partition("=")
    if not sep or not name:
        raise ValueError(f"{text!r} is not NAME=JSON")
    try:
        value = jsoncodec.loads(raw.encode())
        jsoncodec.check(value, "the input")
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"the input of {name!r} is not valid JSON: {exc}") from None
    return name, value


def example_input(reasoner: str, schema: Mapping[str, Any]) -> dict[str, Any]:
    """An input from the schema's examples and defaults; a required field with neither is
    a DrillError naming it."""
    examples = schema.get("examples")
    if isinstance(examples, list) and examples and isinstance(examples[0], dict):
        return dict(examples[0])
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    body: dict[str, Any] = {}
    for name, prop in properties.items():
        prop = prop if isinstance(prop, dict) else {}
        if isinstance(prop.get("examples"), list) and prop["examples"]:
            body[name] = prop["examples"][0]
        elif "example" in prop:
            body[name] = prop["example"]
        elif "default" in prop:
            body[name] = prop["default"]
        elif name in required:
            raise DrillError(
                f"reasoner {reasoner!r}: input field {name!r} is required and its schema gives "
                f"neither an example nor a default; give one with "
                f"--input {reasoner}='{{\"{name}\": ...}}'"
            )
    return body


def choose(
    described: Sequence[Mapping[str, Any]],
    wanted: Sequence[str],
    inputs: Mapping[str, Any],
) -> dict[str, Any]:
    """The reasoners to drill, in the app's order, each with its input."""
    schemas = {str(item["name"]): item.get("input_schema") or {} for item in described}
    if not schemas:
        raise DrillError("the app has no reasoners to drill")
    known = ", ".join(schemas)
    for name in [*wanted, *inputs]:
        if name not in schemas:
            raise DrillError(f"unknown reasoner {name!r} (the app has: {known})")
    names = [name for name in schemas if not wanted or name in wanted]
    for name in inputs:
        if name not in names:
            raise DrillError(f"--input names {name!r}, which --reasoner leaves out")
    return {
        name: inputs[name] if name in inputs else example_input(name, schemas[name])
        for name in names
    }


# -- the child ---------------------------------------------------------------------------------


class Child:
    """The `agent-server run` child: started, its stderr read line by line, ended."""

    def __init__(self, args: DrillArgs) -> None:
        self.args = args
        self.log = ChildLog()
        self.process: asyncio.subprocess.Process | None = None
        self._port: asyncio.Future[int] | None = None
        self._reader: asyncio.Task[None] | None = None

    def command(self) -> list[str]:
        flags: list[str] = []
        for name, value in self.args.flags.items():
            flags += [
                "--" + name.replace("_", "-"),
                f"{value:g}" if isinstance(value, float) else str(value),
            ]
        app = [] if self.args.app is None else [self.args.app]
        return [
            sys.executable, "-m", "agent_server", "run", *app,
            "--host", "127.0.0.1", "--port", "0", "--log-format", "json", "--log-level", "info",
            "--no-reload", *flags,
        ]  # fmt: skip

    async def start(self) -> None:
        self._port = asyncio.get_running_loop().create_future()
        self.process = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = asyncio.create_task(self._read(), name="drill-child-log")

    async def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        stream = self.process.stderr
        while True:
            raw = await stream.readline()
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip("\n")
            self.log.add(line)
            found = LISTENING.search(line)
            if found and self._port is not None and not self._port.done():
                self._port.set_result(int(found.group(1)))
        if self._port is not None and not self._port.done():
            self._port.set_exception(EOFError())

    async def port(self) -> int:
        """The port it listens on, once it does; DrillError (exit 2) when it exits 2 first,
        RuntimeError when it cannot start otherwise."""
        assert self._port is not None and self.process is not None
        try:
            return await asyncio.wait_for(asyncio.shield(self._port), STARTUP_TIMEOUT)
        except EOFError:
            code = await self.process.wait()
            if self._reader is not None:
                await self._reader
            why = self.log.last_words()
            if code == ExitCode.INVALID_SETTINGS:
                raise DrillError(f"the app cannot be served (exit 2):\n{why}") from None
            raise RuntimeError(f"the app did not start (exit {code}):\n{why}") from None
        except TimeoutError:
            raise RuntimeError(f"the app did not listen within {STARTUP_TIMEOUT:g} s") from None

    def signal(self) -> None:
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> int | None:
        """Its exit code, or None if it had to be killed after `timeout` seconds."""
        assert self.process is not None
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
            return None

    async def close(self) -> None:
        """End it if it still runs (the drill went wrong: SIGKILL); read its last lines."""
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._reader, POLL_SETTLE)


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Run:
    """What one drill observed, before it is judged."""

    app: str
    started: list[Started]
    log: ChildLog
    exit_code: int | None  # None: killed after its grace period and the margin
    shutdown_seconds: float
    signalled_at: float  # Unix time the drill sent SIGTERM
    ended_at: float  # Unix time the child had exited
    grace_period: float
    refused: dict[str, str] = field(default_factory=dict)  # reasoner -> why a start failed
    shared: bool = False  # the child's store is shared (Redis), not its memory


async def run_drill(args: DrillArgs) -> Run:
    """Start the child, the executions and their long-polls; signal; wait for the exit."""
    child = Child(args)
    await child.start()
    try:
        port = await child.port()
        headers = {}
        token = args.settings.bearer_token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        grace = args.settings.grace_period
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers=headers,
            timeout=START_TIMEOUT,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        ) as http:
            listed = await http.get("/reasoners")
            if listed.status_code != 200:
                raise RuntimeError(f"GET /reasoners answered {listed.status_code}: {listed.text}")
            plan = choose(listed.json(), args.reasoners, args.inputs)
            started, refused = await _start_all(http, plan, args.executions)
            wait = min(60.0, grace + EXIT_MARGIN)
            polls = [asyncio.create_task(_follow(http, one, wait)) for one in started]
            await asyncio.sleep(args.signal_after)
            signalled_at = time.time()
            began = time.monotonic()
            child.signal()
            code = await child.wait(grace + EXIT_MARGIN)
            shutdown_seconds = time.monotonic() - began
            ended_at = time.time()
            if polls:
                _, pending = await asyncio.wait(polls, timeout=POLL_SETTLE)
                for poll in pending:
                    poll.cancel()
                await asyncio.gather(*polls, return_exceptions=True)
    finally:
        await child.close()
    agent = next(
        (str(r["agent"]) for r in child.log.records if "agent" in r and "reasoners" in r),
        args.app or "demo",
    )
    return Run(
        agent,
        started,
        child.log,
        code,
        shutdown_seconds,
        signalled_at,
        ended_at,
        grace,
        refused,
        shared=args.settings.store_url != "memory",
    )


async def _start_all(
    http: httpx.AsyncClient, plan: Mapping[str, Any], executions: int
) -> tuple[list[Started], dict[str, str]]:
    """Start every execution in the background, all at once (a loop one of them blocks
    answers the others late, not never); a 400 or 422 is a DrillError (bad input, exit 2),
    any other refusal or silence is noted and the drill goes on."""
    jobs = [(name, body) for name, body in plan.items() for _ in range(executions)]
    answers = await asyncio.gather(
        *(_start(http, name, body) for name, body in jobs), return_exceptions=True
    )
    started: list[Started] = []
    refused: dict[str, str] = {}
    for (name, _), answer in zip(jobs, answers, strict=True):
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, Started):
            started.append(answer)
        else:
            refused.setdefault(name, answer)
    return started, refused


async def _start(http: httpx.AsyncClient, name: str, body: Any) -> Started | str:
    """One start: the execution, or why it did not start."""
    try:
        answer = await http.post(f"/reasoners/{name}/async", json=body)
    except httpx.TimeoutException:
        return f"its start was not answered within {START_TIMEOUT:g} s"
    except httpx.TransportError as exc:
        return f"its start failed: {type(exc).__name__}: {exc}"
    if answer.status_code in (400, 422):
        raise DrillError(f"reasoner {name!r} refused its input {json.dumps(body)}: {answer.text}")
    if answer.status_code != 202:
        return f"its start answered {answer.status_code}: {answer.text[:200]}"
    record = answer.json()
    return Started(name, str(record["execution_id"]), record)


class Follow(enum.Enum):
    """How the drill reads an execution on from a status."""

    #: Terminal: nothing more will happen to it.
    DONE = "done"
    #: The long-poll (`GET /executions/{id}?wait=`) waits through it, for an end or a wait
    #: for input, and answers as it is when the listener closes.
    LONG_POLL = "long-poll"
    #: The long-poll answers it at once (someone must answer before it can end): its event
    #: stream waits instead, and ends with `event: end` and the record as it ended.
    EVENTS = "events"


def follow_by(status: ExecutionStatus) -> Follow:
    """How to read on from `status`; exhaustive over the statuses, so a new one is a type
    error here (mypy), never a long-poll that spins or a verdict guessed."""
    match status:
        case ExecutionStatus.SUCCEEDED | ExecutionStatus.FAILED | ExecutionStatus.CANCELLED:
            return Follow.DONE
        case ExecutionStatus.LOST:
            return Follow.DONE
        case ExecutionStatus.QUEUED | ExecutionStatus.RUNNING:
            return Follow.LONG_POLL
        case ExecutionStatus.INPUT_REQUIRED:
            return Follow.EVENTS
        case _:
            assert_never(status)


def status_of(record: Mapping[str, Any]) -> ExecutionStatus | None:
    """The record's status; None for one this drill does not know (judged unknown)."""
    try:
        return ExecutionStatus(str(record.get("status")))
    except ValueError:
        return None


async def _follow(http: httpx.AsyncClient, execution: Started, wait: float) -> None:
    """Read the execution on until it ends, or its server stops answering: the record as
    it ended is kept in `execution.record`. Each request must bring a change of status (or
    attempt); one that brings none (the listener closed, a parked wait) ends the following,
    and MAX_FOLLOW_REQUESTS bounds them whatever the server answers."""
    while execution.requests < MAX_FOLLOW_REQUESTS:
        status = status_of(execution.record)
        if status is None:
            return
        how = follow_by(status)
        if how is Follow.DONE:
            return
        owner = str(execution.record.get("replica") or "")
        if status is ExecutionStatus.INPUT_REQUIRED and not parked(status, owner):
            execution.waited = True  # in its task
        before = (status, execution.record.get("attempt"))
        execution.requests += 1
        try:
            if how is Follow.LONG_POLL:
                record = await _long_poll(http, execution.execution_id, wait)
            else:
                record = await _until_end(http, execution.execution_id, wait)
        except (httpx.TransportError, ValueError):
            return  # the listener closed, or the process ended
        if record is None:
            return
        execution.record = record
        if (status_of(record), record.get("attempt")) == before:
            return


async def _long_poll(
    http: httpx.AsyncClient, execution_id: str, wait: float
) -> dict[str, Any] | None:
    """The record once it ends or waits for input (or as it is when the listener closes)."""
    answer = await http.get(
        f"/executions/{execution_id}",
        params={"wait": f"{wait:g}"},
        timeout=wait + START_TIMEOUT,
    )
    if answer.status_code != 200:
        return None
    record = answer.json()
    return record if isinstance(record, dict) else None


async def _until_end(
    http: httpx.AsyncClient, execution_id: str, wait: float
) -> dict[str, Any] | None:
    """The record its event stream ends with (`event: end`); None when the stream ends
    without one (the listener closed, or the execution left this replica)."""
    async with http.stream(
        "GET", f"/executions/{execution_id}/events", timeout=wait + START_TIMEOUT
    ) as answer:
        if answer.status_code != 200:
            return None
        event, data = "", []
        async for line in answer.aiter_lines():
            if line.startswith("event:"):
                event = line[len("event:") :].strip()
            elif line.startswith("data:"):
                data.append(line[len("data:") :].lstrip())
            elif not line:
                if event == "end" and data:
                    record = json.loads("\n".join(data))
                    return record if isinstance(record, dict) else None
                event, data = "", []
    return None


# -- the verdict -------------------------------------------------------------------------------


class Outcome(enum.Enum):
    """Where an execution's attempt here stood when the process ended, from its last
    record (and the store's kind)."""

    ENDED = "ended"  # terminal after running here: finished or cancelled, by its timing
    UNRUN = "unrun"  # cancelled while queued, never run: the memory store's queue at shutdown
    LEFT_QUEUED = "left queued"  # queued in a shared store, for another replica to take
    HANDED_OFF = "handed off"  # ran here, queued at the drain deadline (shared, resumable)
    PARKED = "parked"  # waiting for input with no task (shared store, resumable)
    STRANDED = "stranded"  # queued in the memory store as the process ended: a fault
    LOST = "lost"  # judged lost: its owner stopped renewing (shared store): a fault
    UNENDED = "unended"  # running, or waiting for input in its task, as the process ended


def outcome(
    status: ExecutionStatus | None, record: Mapping[str, Any], shared: bool, handed_off: bool
) -> Outcome:
    """The outcome of a last record: every status judged explicitly (a new one is a type
    error here), the queue and a wait for input by the store's kind (sections 13, 14)."""
    if status is None:
        return Outcome.UNENDED
    match status:
        case ExecutionStatus.SUCCEEDED | ExecutionStatus.FAILED:
            return Outcome.ENDED
        case ExecutionStatus.CANCELLED:
            return Outcome.ENDED if record.get("replica") else Outcome.UNRUN
        case ExecutionStatus.LOST:
            return Outcome.LOST
        case ExecutionStatus.QUEUED:
            if not shared:
                return Outcome.STRANDED
            return Outcome.HANDED_OFF if handed_off else Outcome.LEFT_QUEUED
        case ExecutionStatus.INPUT_REQUIRED:
            left = shared and parked(status, str(record.get("replica") or ""))
            return Outcome.PARKED if left else Outcome.UNENDED
        case ExecutionStatus.RUNNING:
            return Outcome.UNENDED
        case _:
            assert_never(status)


#: What an abandoned execution says of its reasoner, by what ran it.
ABANDONED_FAULTS = {
    "task": "swallows cancellation",
    "thread": "runs past the drain in a thread, which cannot be cancelled (a def reasoner)",
}


@dataclass
class ReasonerVerdict:
    """One reasoner's executions at the shutdown, and its faults."""

    name: str
    started: int = 0
    finished: int = 0
    failed: int = 0  # of `finished`: ended failed on their own (not a shutdown fault)
    cancelled: int = 0
    settle_seconds: float | None = None  # the longest time from the cancel to the settle
    abandoned: int = 0
    handed_off: int = 0
    #: Parked waiting for input (a resumable reasoner on a shared store): no task held.
    parked: int = 0
    #: Seen waiting for input inside their task (`ctx.ask`; counted again by how they
    #: ended: the drain waits for them as running work).
    waiting: int = 0
    #: Still queued at the shutdown: cancelled unrun (memory store) or left in the queue
    #: for another replica (shared store).
    queued: int = 0
    stranded: int = 0  # of `queued`: still queued in the memory store as it ended
    lost: int = 0
    unknown: int = 0  # no end seen before the process ended
    requests: int = 0  # GETs the drill made to follow its executions
    longest_stall: float = 0.0  # the longest loop lag while any of its executions ran
    stall: Stall | None = None  # the longest stall over 1 s its code caused
    faults: list[str] = field(default_factory=list)
    #: Abandoned executions by what ran them: "task" (async) or "thread" (a def).
    abandoned_kinds: dict[str, int] = field(default_factory=dict)

    @property
    def safe(self) -> bool:
        return not self.faults

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stall"] = None if self.stall is None else dataclasses.asdict(self.stall)
        del data["abandoned_kinds"]
        data["safe"] = self.safe
        return data


@dataclass
class Verdict:
    """The whole drill: per reasoner, the shutdown, and the exit code (0 safe, 1 not)."""

    app: str
    executions: int
    signal_after: float
    reasoners: list[ReasonerVerdict]
    shutdown_seconds: float
    grace_period: float
    exit_code: int | None
    report: dict[str, Any] | None
    faults: list[str]  # every fault, "name: fault", the app's own included

    @property
    def within_grace(self) -> bool:
        return self.exit_code is not None and self.shutdown_seconds <= self.grace_period

    @property
    def code(self) -> int:
        return 1 if self.faults else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "executions": self.executions,
            "signal_after": self.signal_after,
            "reasoners": [r.as_dict() for r in self.reasoners],
            "shutdown": {
                "seconds": round(self.shutdown_seconds, 4),
                "grace_period": self.grace_period,
                "within_grace_period": self.within_grace,
                "exit_code": self.exit_code,
                "report": self.report,
            },
            "faults": self.faults,
            "safe": not self.faults,
            "exit_code": self.code,
        }


def judge(run: Run, executions: int, signal_after: float) -> Verdict:
    """Per execution: finished (before the cancellation), cancelled and settled, abandoned,
    queued (cancelled unrun, or left for another replica), handed off, parked, lost or
    unknown; per reasoner: its faults; and the shutdown's."""
    found = run.log.report()
    report, t0 = (found[0], found[1]) if found else (None, run.signalled_at)
    cancel_at = None
    if report is not None and "cancelling" in report.get("phases", {}):
        cancel_at = t0 + float(report["phases"]["cancelling"])
    abandoned = run.log.abandoned()
    handed_off = run.log.handed_off()
    stalls = run.log.stalls(run.ended_at)
    lags = [*run.log.lags(), *((s.seconds, s.ended_at) for s in stalls if s.ended_at)]
    verdicts: dict[str, ReasonerVerdict] = {}
    for name in dict.fromkeys([*(s.reasoner for s in run.started), *run.refused]):
        verdicts[name] = ReasonerVerdict(name)
    windows: dict[str, list[tuple[float, float]]] = {name: [] for name in verdicts}
    for one in run.started:
        verdict = verdicts[one.reasoner]
        verdict.started += 1
        record = one.record
        created = _unix(record.get("created_at")) or run.signalled_at
        finished = _unix(record.get("finished_at"))
        windows[one.reasoner].append((created, finished or run.ended_at))
        verdict.requests += one.requests
        verdict.waiting += one.waited
        kind = outcome(status_of(record), record, run.shared, one.execution_id in handed_off)
        if one.execution_id in abandoned:  # it reads cancelled like a settled one
            verdict.abandoned += 1
            ran = "thread" if abandoned[one.execution_id] else "task"
            verdict.abandoned_kinds[ran] = verdict.abandoned_kinds.get(ran, 0) + 1
            continue
        match kind:
            case Outcome.ENDED if finished is None:
                verdict.unknown += 1
            case Outcome.ENDED:
                assert finished is not None
                by_cancel = record.get("status_reason") == CancelReason.SHUTDOWN
                if cancel_at is not None and (by_cancel or finished > cancel_at + 0.001):
                    verdict.cancelled += 1
                    settle = max(0.0, finished - cancel_at)
                    verdict.settle_seconds = max(verdict.settle_seconds or 0.0, settle)
                else:
                    verdict.finished += 1
                    verdict.failed += record.get("status") == ExecutionStatus.FAILED
            case Outcome.UNRUN | Outcome.LEFT_QUEUED | Outcome.STRANDED:
                verdict.queued += 1
                verdict.stranded += kind is Outcome.STRANDED
            case Outcome.HANDED_OFF:
                verdict.handed_off += 1
            case Outcome.PARKED:
                verdict.parked += 1  # waiting for input with no task: no drain waits for it
            case Outcome.LOST:
                verdict.lost += 1
            case Outcome.UNENDED:
                verdict.unknown += 1
            case _:
                assert_never(kind)
    app_faults: list[str] = []
    for stall in stalls:
        owner = verdicts.get(stall.reasoner or "")
        if stall.ended_at is not None and stall.seconds <= STALL_FAULT:
            continue  # the watch saw it late, the task measured it just under: not a fault
        if owner is None:
            app_faults.append(f"blocks the event loop ({stall.described})")
        elif owner.stall is None or stall.seconds > owner.stall.seconds:
            owner.stall = stall
    for name, verdict in verdicts.items():
        verdict.longest_stall = max(
            (seconds for seconds, at in lags if _overlaps(at - seconds, at, windows[name])),
            default=0.0,
        )
        if verdict.stall is not None:
            verdict.longest_stall = max(verdict.longest_stall, verdict.stall.seconds)
            verdict.faults.insert(0, f"blocks the event loop ({verdict.stall.described})")
        for ran, count in verdict.abandoned_kinds.items():
            what = ABANDONED_FAULTS[ran]
            verdict.faults.append(f"{what} ({count} of {verdict.started} abandoned)")
        if verdict.unknown:
            verdict.faults.append(
                f"{verdict.unknown} of {verdict.started} had not ended when the process did"
            )
        if verdict.stranded:
            verdict.faults.append(
                f"{verdict.stranded} of {verdict.started} were still queued in the memory "
                "store when the process ended: nothing will run them"
            )
        if verdict.lost:
            verdict.faults.append(
                f"{verdict.lost} of {verdict.started} were judged lost (their owner stopped "
                "renewing)"
            )
    for name, why in run.refused.items():
        app_faults.append(f"{name}: {why}")
    if run.exit_code is None:
        app_faults.append(
            f"the server had not exited {run.grace_period:g} s + {EXIT_MARGIN:g} s after "
            "SIGTERM: killed"
        )
    else:
        if run.shutdown_seconds > run.grace_period:
            app_faults.append(
                f"the shutdown took {run.shutdown_seconds:.2f} s, past the grace period "
                f"({run.grace_period:g} s)"
            )
        if run.exit_code != 0:
            meaning = EXIT_MEANINGS.get(run.exit_code, "unexpected")
            app_faults.append(f"the server exited {run.exit_code} ({meaning})")
        if report is None:
            app_faults.append("the server logged no shutdown report")
    faults = [f"{v.name}: {fault}" for v in verdicts.values() for fault in v.faults]
    faults += [f"(server) {fault}" for fault in app_faults]
    return Verdict(
        run.app,
        executions,
        signal_after,
        list(verdicts.values()),
        run.shutdown_seconds,
        run.grace_period,
        run.exit_code,
        report,
        faults,
    )


def _overlaps(start: float, end: float, windows: Iterable[tuple[float, float]]) -> bool:
    return any(start < until and end > since for since, until in windows)


# -- the table ---------------------------------------------------------------------------------

COLUMNS = (
    "reasoner", "started", "finished", "cancelled", "settled in", "abandoned", "handed off",
    "parked", "waiting", "queued", "longest stall", "verdict",
)  # fmt: skip


def _row(verdict: ReasonerVerdict) -> list[str]:
    settle = "-" if verdict.settle_seconds is None else f"{verdict.settle_seconds:.2f} s"
    if verdict.faults:
        said = "FAULT"
    elif verdict.failed:
        said = f"ok ({verdict.failed} failed on its own)"
    else:
        said = "ok"
    return [
        verdict.name,
        str(verdict.started),
        str(verdict.finished),
        str(verdict.cancelled),
        settle,
        str(verdict.abandoned),
        str(verdict.handed_off),
        str(verdict.parked),
        str(verdict.waiting),
        str(verdict.queued),
        f"{verdict.longest_stall:.3f} s",
        said,
    ]


def table(verdict: Verdict) -> str:
    """The drill as text: a line saying what ran, a row per reasoner, the shutdown, the
    faults (if any) and the verdict."""
    rows = [list(COLUMNS), *(_row(r) for r in verdict.reasoners)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        f"drill of {verdict.app!r}: {len(verdict.reasoners)} reasoners x "
        f"{verdict.executions} execution{'s' if verdict.executions != 1 else ''}, "
        f"SIGTERM after {verdict.signal_after:g} s",
        "",
    ]
    lines += [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.append("")
    code = "killed" if verdict.exit_code is None else f"exit code {verdict.exit_code}"
    within = "within" if verdict.within_grace else "NOT within"
    lines.append(
        f"shutdown: {verdict.shutdown_seconds:.2f} s, {within} the grace period "
        f"({verdict.grace_period:g} s); {code}"
    )
    if verdict.faults:
        lines.append("faults:")
        lines += [f"  {fault}" for fault in verdict.faults]
        lines.append("verdict: NOT shutdown-safe")
    else:
        lines.append("verdict: shutdown-safe")
    return "\n".join(lines)


def drill_and_print(args: DrillArgs, *, as_json: bool) -> int:
    """Run the drill, print it, and return its exit code (DrillError is the caller's)."""
    run = asyncio.run(run_drill(args))
    verdict = judge(run, args.executions, args.signal_after)
    if as_json:
        print(json.dumps(verdict.as_dict(), sort_keys=False))
    else:
        print(table(verdict))
    return verdict.code
