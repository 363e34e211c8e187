"""The verdict of a drill: where each execution stood as the process ended (`outcome`,
exhaustive over the statuses), each reasoner's faults and the shutdown's (`judge`)."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, assert_never

from agent_server.model.status import CancelReason, ExecutionStatus, parked
from agent_server.process.drill.follow import status_of
from agent_server.process.drill.log import Stall, unix_time
from agent_server.process.drill.run import EXIT_MARGIN, Run
from agent_server.process.drill.versions import NextVersion
from agent_server.runtime.exits import ExitCode

#: A stall over this is a fault (the server's own threshold for its WARNING).
STALL_FAULT = 1.0
EXIT_MEANINGS = {
    int(ExitCode.OK): "ok",
    int(ExitCode.STARTUP_FAILED): "the server could not start",
    int(ExitCode.INVALID_SETTINGS): "invalid settings",
    int(ExitCode.ABANDONED): "work was abandoned",
    int(ExitCode.WATCHDOG): "the watchdog ended the process (the event loop was blocked)",
    int(ExitCode.FORCED): "a third signal forced the exit",
    int(ExitCode.UNRECORDED): "ends were not written to the store",
}


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
    #: With `--next`, a resumable reasoner: what the next version makes of its handed-off
    #: work (drill/versions.py); None otherwise.
    next_version: NextVersion | None = None

    @property
    def safe(self) -> bool:
        return not self.faults

    def as_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["stall"] = None if self.stall is None else dataclasses.asdict(self.stall)
        del data["abandoned_kinds"]
        data["next_version"] = None if self.next_version is None else self.next_version.as_dict()
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
    next_app: str | None = None  # `--next`: the app the reasoners' next_version is met by

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
            "next": self.next_app,
            "faults": self.faults,
            "safe": not self.faults,
            "exit_code": self.code,
        }


def judge(run: Run, executions: int, signal_after: float) -> Verdict:
    """Per execution: finished (before the cancellation), cancelled and settled, abandoned,
    queued (cancelled unrun, or left for another replica), handed off, parked, lost or
    unknown; per reasoner: its faults, and with `--next` what the next version makes of its
    handed-off work (a fault when it fails it); and the shutdown's."""
    found = run.log.report()
    report, t0 = (found[0], found[1]) if found else (None, run.signalled_at)
    cancel_at = None
    if report is not None and "cancelling" in report.get("phases", {}):
        cancel_at = t0 + float(report["phases"]["cancelling"])
    verdicts, windows = _tally(run, cancel_at)
    stalls = run.log.stalls(run.ended_at)
    lags = [*run.log.lags(), *((s.seconds, s.ended_at) for s in stalls if s.ended_at)]
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
        _reasoner_faults(verdict, run)
    app_faults += [f"{name}: {why}" for name, why in run.refused.items()]
    app_faults += _server_faults(run, report)
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
        run.next_app,
    )


def _tally(
    run: Run, cancel_at: float | None
) -> tuple[dict[str, ReasonerVerdict], dict[str, list[tuple[float, float]]]]:
    """Each reasoner's executions counted by what became of them, and the windows in
    which they ran (created to finished, or to the run's end)."""
    abandoned = run.log.abandoned()
    handed_off = run.log.handed_off()
    verdicts: dict[str, ReasonerVerdict] = {}
    for name in dict.fromkeys([*(s.reasoner for s in run.started), *run.refused]):
        verdicts[name] = ReasonerVerdict(name)
    windows: dict[str, list[tuple[float, float]]] = {name: [] for name in verdicts}
    for one in run.started:
        verdict = verdicts[one.reasoner]
        verdict.started += 1
        record = one.record
        created = unix_time(record.get("created_at")) or run.signalled_at
        finished = unix_time(record.get("finished_at"))
        windows[one.reasoner].append((created, finished or run.ended_at))
        verdict.requests += one.requests
        verdict.waiting += one.waited
        if one.execution_id in abandoned:  # it reads cancelled like a settled one
            verdict.abandoned += 1
            ran = "thread" if abandoned[one.execution_id] else "task"
            verdict.abandoned_kinds[ran] = verdict.abandoned_kinds.get(ran, 0) + 1
            continue
        kind = outcome(status_of(record), record, run.shared, one.execution_id in handed_off)
        _count(verdict, kind, record, finished, cancel_at)
    return verdicts, windows


def _count(
    verdict: ReasonerVerdict,
    kind: Outcome,
    record: dict[str, Any],
    finished: float | None,
    cancel_at: float | None,
) -> None:
    """One execution that was not abandoned, counted by what became of it."""
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


def _reasoner_faults(verdict: ReasonerVerdict, run: Run) -> None:
    """A reasoner's faults, from its counts, its stall and the next version's verdict."""
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
            f"{verdict.lost} of {verdict.started} were judged lost (their owner stopped renewing)"
        )
    verdict.next_version = (run.next_versions or {}).get(verdict.name)
    if verdict.next_version is not None and verdict.next_version.fault is not None:
        verdict.faults.append(verdict.next_version.fault)


def _server_faults(run: Run, report: dict[str, Any] | None) -> list[str]:
    """The shutdown's own faults: killed, past the grace period, a bad exit, no report."""
    if run.exit_code is None:
        return [
            f"the server had not exited {run.grace_period:g} s + {EXIT_MARGIN:g} s after "
            "SIGTERM: killed"
        ]
    faults = []
    if run.shutdown_seconds > run.grace_period:
        faults.append(
            f"the shutdown took {run.shutdown_seconds:.2f} s, past the grace period "
            f"({run.grace_period:g} s)"
        )
    if run.exit_code != 0:
        meaning = EXIT_MEANINGS.get(run.exit_code, "unexpected")
        faults.append(f"the server exited {run.exit_code} ({meaning})")
    if report is None:
        faults.append("the server logged no shutdown report")
    return faults


def _overlaps(start: float, end: float, windows: Iterable[tuple[float, float]]) -> bool:
    return any(start < until and end > since for since, until in windows)
