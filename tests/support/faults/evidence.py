"""What the fault harness's reasoners leave behind, and the checks of the invariants that
read it (the checker runs them with the others).

The evidenced reasoners of tests/apps/tests_app.py append one line per event to a file per
execution: `KIND ATTEMPT [DETAIL...] REPLICA PID TIME` (TIME: the wall clock). The kinds:
`run` (a non-resumable body began), `begin` (a resumable one began), `step`, `asked`,
`answered`, `got QUESTION ANSWER` (an ask returned), `start KEY` and `end KEY` (a limited or
session body began and left; KEY its tenant or session). The checks here are pure functions
of those lines, the final records and a few facts of the history.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.apps.tests_app import EVIDENCED_LIMIT, evidenced_reply


@dataclass(frozen=True)
class Violation:
    invariant: str
    execution_id: str | None
    detail: str

    def __str__(self) -> str:
        where = f" {self.execution_id}" if self.execution_id else ""
        return f"[{self.invariant}]{where}: {self.detail}"


@dataclass(frozen=True)
class Final:
    """An execution as a live replica reads it at the end: its HTTP status and body."""

    status: int | None
    body: dict[str, Any] | None

    @property
    def state(self) -> str:
        if self.body is not None:
            return str(self.body["status"])
        return "absent (404)" if self.status == 404 else f"unreadable ({self.status})"

    @property
    def attempt(self) -> int:
        return int((self.body or {}).get("attempt") or 1)

    @property
    def reasoner(self) -> str:
        return str((self.body or {}).get("reasoner") or "")


@dataclass(frozen=True)
class Evidence:
    """One line of an evidenced reasoner's own account of one execution."""

    kind: str
    attempt: int
    step: int | None
    count: int | None
    replica: str
    pid: int
    at: float
    detail: tuple[str, ...] = ()


def parse_evidence(line: str) -> Evidence | None:
    words = line.split()
    if len(words) < 5:
        return None  # a line cut short by a kill: the kernel had only part of it
    kind, attempt, *detail = words[:-3]
    replica, pid, at = words[-3:]
    step = int(detail[0]) if kind == "step" else None
    count = int(detail[1]) if kind == "step" else None
    return Evidence(kind, int(attempt), step, count, replica, int(pid), float(at), tuple(detail))


def read_evidence(directory: Path) -> dict[str, list[Evidence]]:
    found: dict[str, list[Evidence]] = {}
    for path in sorted(directory.iterdir()):
        lines = [parse_evidence(line) for line in path.read_text().splitlines()]
        found[path.name] = [line for line in lines if line is not None]
    return found


def failed_unrun(
    final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """Accepted work is never failed unrun: a `failed` execution's failing attempt began its
    body (every evidenced reasoner notes its start); none of them has a stated limit (no
    timeout) that could fail an attempt before it began."""
    for execution_id, record in sorted(final.items()):
        if record.state != "failed":
            continue
        began = sorted({line.attempt for line in evidence.get(execution_id, [])})
        if record.attempt not in began:
            error = (record.body or {}).get("error") or {}
            yield Violation(
                "failed-unrun",
                execution_id,
                f"{record.reasoner} failed@{record.attempt} ({error.get('type')}: "
                f"{str(error.get('message'))[:160]}); its body began at attempts {began or 'none'}",
            )


def ask_answers(
    final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """An ask never returns another question's answer: every answer an `evidenced_two_asks`
    was handed names the question it asked (the clients derive it from the prompt), and a
    succeeded one returns both, each its own."""
    for execution_id, lines in sorted(evidence.items()):
        wrong = [
            line
            for line in lines
            if line.kind == "got"
            and len(line.detail) == 2
            and line.detail[1] != evidenced_reply(line.detail[0], execution_id)
        ]
        if wrong:
            question, answer = wrong[0].detail
            yield Violation(
                "ask-answer",
                execution_id,
                f"asked {question!r} at attempt {wrong[0].attempt} on {wrong[0].replica}, "
                f"handed {answer!r}" + (f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""),
            )
    for execution_id, record in sorted(final.items()):
        if record.reasoner != "evidenced_two_asks" or record.state != "succeeded":
            continue
        result = (record.body or {}).get("result")
        expected = {q: evidenced_reply(q, execution_id) for q in ("first", "second")}
        if result != expected:
            yield Violation("ask-answer", execution_id, f"succeeded with {result!r}")


def interval_stops(nemesis: list[Any], wall0: float) -> dict[str, list[float]]:
    """Per replica id, the wall-clock moments it was killed or paused (the fault's begin)."""
    stops: dict[str, list[float]] = defaultdict(list)
    for event in nemesis:
        if event.phase == "begin" and event.kind in ("kill9", "pause-replica"):
            stops[event.target].append(wall0 + event.time)
    return stops


def _finished(record: Final | None) -> float | None:
    text = (record.body or {}).get("finished_at") if record is not None else None
    try:
        return datetime.fromisoformat(str(text)).timestamp() if text else None
    except ValueError:
        return None


def _intervals(
    execution_id: str,
    lines: list[Evidence],
    record: Final | None,
    stops: Mapping[str, list[float]],
) -> list[tuple[float, float, int]]:
    """(start, end, attempt) of each body of a limited or session execution. A body with no
    `end` was killed: it ends at its replica's kill (else at the record's end, else at its
    start). A body of an execution judged `lost` ends where its replica was stopped, though
    it may write its `end` after a pause: it was no attempt of the execution any more."""
    found = []
    for start in (line for line in lines if line.kind == "start"):
        ends = [
            line.at
            for line in lines
            if line.kind == "end" and line.attempt == start.attempt and line.pid == start.pid
        ]
        stopped = [t for t in stops.get(start.replica, ()) if t >= start.at]
        end = min(ends) if ends else None
        if stopped and (end is None or (record is not None and record.state == "lost")):
            end = min(stopped) if end is None else min(end, min(stopped))
        if end is None:
            end = _finished(record) or start.at
        found.append((start.at, max(start.at, end), start.attempt))
    del execution_id
    return found


def limits(
    final: Mapping[str, Final],
    evidence: Mapping[str, list[Evidence]],
    stops: Mapping[str, list[float]],
    limit: int = EVIDENCED_LIMIT,
) -> Iterator[Violation]:
    """A limit is never exceeded: at no moment do more than `limit` bodies of
    `evidenced_limited` run for one `X-Tenant` (their `start`..`end` intervals), whatever
    session or policy a start carried."""
    by_key: dict[str, list[tuple[float, int, str]]] = defaultdict(list)
    for execution_id, lines in evidence.items():
        record = final.get(execution_id)
        starts = [line for line in lines if line.kind == "start"]
        if not starts or record is None or record.reasoner != "evidenced_limited":
            continue
        key = starts[0].detail[0] if starts[0].detail else "-"
        for start, end, attempt in _intervals(execution_id, lines, record, stops):
            by_key[key].append((start, 1, f"{execution_id}@{attempt}"))
            by_key[key].append((end, -1, f"{execution_id}@{attempt}"))
    for key, events in sorted(by_key.items()):
        running: set[str] = set()
        worst: tuple[int, float, list[str]] = (0, 0.0, [])
        for at, change, name in sorted(events, key=lambda e: (e[0], e[1])):
            if change > 0:
                running.add(name)
                if len(running) > max(limit, worst[0]):
                    worst = (len(running), at, sorted(running))
            else:
                running.discard(name)
        if worst[0] > limit:
            yield Violation(
                "limit",
                None,
                f"X-Tenant {key}: {worst[0]} bodies ran at once (limit {limit}) at "
                f"{worst[1]:.3f}: {', '.join(worst[2])}",
            )


def session_order(
    accepted: Mapping[str, list[tuple[float, str]]],
    final: Mapping[str, Final],
    evidence: Mapping[str, list[Evidence]],
    stops: Mapping[str, list[float]],
) -> Iterator[Violation]:
    """A session's messages run in order: the bodies of the messages one client enqueued in
    a session (`accepted`: when each was first answered with its execution, and its id)
    begin in the order they were accepted, each once every earlier one has ended (its last
    attempt included: a retry is earlier work of the session)."""
    for session, seen in sorted(accepted.items()):
        order: list[str] = []
        for _, execution_id in sorted(seen):
            if execution_id not in order:
                order.append(execution_id)
        spans = {}
        for execution_id in order:
            found = _intervals(
                execution_id, evidence.get(execution_id, []), final.get(execution_id), stops
            )
            if found:
                spans[execution_id] = (min(s for s, _, _ in found), max(e for _, e, _ in found))
        ran = [execution_id for execution_id in order if execution_id in spans]
        by_start = sorted(ran, key=lambda i: spans[i][0])
        if by_start != ran:
            yield Violation(
                "session-order",
                None,
                f"session {session}: accepted {[i[:8] for i in ran]}, began "
                f"{[i[:8] for i in by_start]}",
            )
            continue
        for earlier, later in itertools.pairwise(ran):
            if spans[later][0] < spans[earlier][1]:
                yield Violation(
                    "session-order",
                    later,
                    f"session {session}: began {spans[earlier][1] - spans[later][0]:.3f}s "
                    f"before the earlier message {earlier} ended",
                )
