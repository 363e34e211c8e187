"""The checker of a fault run: `check`, a pure function of the history, the final records,
the reasoners' evidence and the replicas' logs, returns the violations of the invariants."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from tests.apps.tests_app import (
    EVIDENCED_STEPS_MAX_ATTEMPTS,
    evidenced_answer,
)
from tests.support.faults.evidence import (
    Evidence,
    Final,
    Violation,
    ask_answers,
    failed_unrun,
    interval_stops,
    limits,
    session_order,
)
from tests.support.faults.history import (
    REASONER_PATH,
    TERMINAL,
    Call,
    Exchange,
    History,
    NemesisEvent,
)

#: What no replica's log may hold.
LOG_ERRORS = re.compile(
    r"Traceback|Task exception was never retrieved|unobserved task error"
    r"|Exception in ASGI application"
)
#: The evidenced reasoners that are resumable (EVIDENCED_STEPS_MAX_ATTEMPTS attempts each).
RESUMABLE = frozenset({"evidenced_steps", "evidenced_asking", "evidenced_two_asks"})


INVARIANTS = {
    "told-means-final": "1. a terminal status a client was told is the final one",
    "living-judged": "2. no execution lost or retried while its owner lived",
    "accepted-vanished": "3/7. accepted never vanishes: every execution answered (200, 202,"
    " ...) is readable at the end (no 404 on any read) and ends visibly (terminal)",
    "accepted-runs": "3. an accepted execution that succeeded ran; a resumable one is lost only"
    " with no attempt left",
    "one-per-key": "4. one execution per idempotency key",
    "runs-once": "5. a non-resumable body never runs twice",
    "steps": "6. a resumable loses no step, repeats at most one per extra attempt",
    "log-errors": "8. no traceback or unobserved task error in a replica's log",
    "failed-by-server": "an execution failed with an error its reasoner never raises (a store"
    " error: a transient refusal that failed it instead of being retried)",
    "answers": "9. every answer is one the API documents; no client call gives up, unless"
    " it ran out of time refused in spans when no told write could be acknowledged (no Redis"
    " replica in sync, or one the sentinels could promote out of sync), never refused 5 s on"
    " end outside them",
    "answer-taken": "10. an execution waiting for input returns the answer it was given, and"
    " none times out once an answer was accepted (202)",
    "delayed": "11. a delayed start's body never runs before its delay has passed",
    "failed-unrun": "12. accepted work is never failed unrun: a failed execution's failing"
    " attempt began its body",
    "ask-answer": "13. an ask never returns another question's answer",
    "limit": "14. a concurrency limit is never exceeded (bodies of one key at once)",
    "session-order": "15. a session's enqueued messages run one at a time, in the order they"
    " were accepted",
    "harness": "the harness itself: a replica that would not start or be ready again",
}


#: Seconds a healed cluster may take to answer a call retrying through a span in which no
#: told write could be acknowledged: the client's longest backoff (2 s), a told write's
#: `WAIT` and the look at the sentinels after it (1 s), a synchronous run's body (2 s here).
HEALED_WITHIN = 5.0


def unreplicated(events: list[NemesisEvent]) -> list[tuple[float, float]]:
    """The spans in which no told write could be acknowledged: no Redis replica in sync with
    the primary, or one the sentinels could promote out of sync (the history's
    `unreplicated` begin and end; one still open at the end excuses nothing)."""
    spans: list[tuple[float, float]] = []
    began: float | None = None
    for event in sorted(events, key=lambda e: e.time):
        if event.kind != "unreplicated":
            continue
        if event.phase == "begin":
            began = event.time
        elif event.phase == "end" and began is not None:
            spans.append((began, event.time))
            began = None
    return spans


def _refused(exchange: Exchange) -> bool:
    """No answer, or a refusal with no execution in it (503 in doubt among them)."""
    return exchange.status is None or (
        exchange.status in (429, 502, 503, 504) and not exchange.is_execution
    )


def refused_for(call: Call, exchanges: list[Exchange]) -> list[tuple[float, float]] | None:
    """The stretches a call spent refused: from each refusal (or request unanswered) to its
    next request, or to when it gave up. None when it was given an answer that is neither
    an execution, a refusal nor a success (then it gave up on that answer, not for want of
    time). A client thread makes one call at a time: its exchanges within the call's time
    are the call's (`exchanges` in the order they were sent)."""
    mine = [
        e
        for e in exchanges
        if e.client == call.client and call.invoked <= e.invoked <= call.answered
    ]
    stretches: list[tuple[float, float]] = []
    for exchange, after in zip(mine, [*mine[1:], None], strict=True):
        if not _refused(exchange):
            if exchange.status is not None and exchange.status >= 400 and not exchange.is_execution:
                return None
            continue
        until = call.answered if after is None else after.invoked
        if stretches and stretches[-1][1] >= exchange.invoked:
            stretches[-1] = (stretches[-1][0], until)
        else:
            stretches.append((exchange.invoked, until))
    return stretches


def gave_up_unreplicated(
    call: Call, exchanges: list[Exchange], spans: list[tuple[float, float]]
) -> bool:
    """A call gave up honestly if, refused, it ran out of time within spans in which no told
    write could be acknowledged (`unreplicated`; docs/replicas.md, "How long in doubt
    lasts"): its refusals overlapped such spans and none of them went on for HEALED_WITHIN
    seconds outside the spans. Refused that long in a healed cluster, it should have been
    answered."""
    stretches = refused_for(call, exchanges) if call.failed else None
    if not stretches:
        return False
    overlapped = False
    for begin, end in stretches:
        healed_from = begin
        for low, high in sorted(spans):
            if high <= begin or low >= end:
                continue
            overlapped = True
            if low - healed_from >= HEALED_WITHIN:
                return False
            healed_from = max(healed_from, high)
        if end - healed_from >= HEALED_WITHIN:
            return False
    return overlapped


@dataclass
class _Faulted:
    """When each replica id was killed, paused or rolled (end times of those actions)."""

    killed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    paused: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rolled: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rollouts: dict[str, list[tuple[float, str]]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, events: list[NemesisEvent]) -> _Faulted:
        faulted = cls()
        for event in events:
            if event.phase != "end":
                continue
            if event.kind == "kill9":
                faulted.killed[event.target].append(event.time)
            elif event.kind == "pause-replica":
                faulted.paused[event.target].append(event.time)
            elif event.kind == "rollout":
                faulted.rollouts[event.target].append((event.time, event.detail))
                if event.detail.startswith("forced"):
                    faulted.killed[event.target].append(event.time)
                else:
                    faulted.rolled[event.target].append(event.time)
        return faulted

    def may_be_judged(self, replica: str, since: float) -> bool:
        """Killed or paused past its lease after `since`: its running work may read lost."""
        return any(
            t >= since for t in (*self.killed.get(replica, ()), *self.paused.get(replica, ()))
        )

    def may_hand_off(self, replica: str, since: float) -> bool:
        """Killed, paused or rolled after `since`: its attempt may be followed by another."""
        return self.may_be_judged(replica, since) or any(
            t >= since for t in self.rolled.get(replica, ())
        )


#: The head of a log record (the text format): time, level, logger.
_LOG_HEAD = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [A-Z]+ ")
#: A reasoner's own failure, logged with its traceback by design: its record is judged.
#: (Any of the server's loggers: the line, not the module that writes it, says what it is.)
_REASONER_FAILED = re.compile(r" agent_server\.[\w.]+: execution [0-9a-f]{32} \(\S+\) failed$")
#: The line of a traceback that names the exception.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Group)\b")


def log_errors(replica: str, text: str) -> list[Violation]:
    """Log records of one replica that hold a traceback, an exception never retrieved or an
    unobserved task error, grouped by their head and last exception line. A reasoner's own
    failure (logged with its traceback, by design) is left to the check of its record."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if _LOG_HEAD.match(line) or not records:
            records.append([line])
        else:
            records[-1].append(line)
    found: Counter[str] = Counter()
    sample: dict[str, list[str]] = {}
    for record in records:
        if not any(LOG_ERRORS.search(line) for line in record):
            continue
        if _REASONER_FAILED.search(record[0]):
            continue
        head = _LOG_HEAD.sub("", record[0])
        head = re.sub(r"[0-9a-f]{32}", "<id>", head)[:160]
        last = next((line for line in reversed(record) if _EXCEPTION_LINE.match(line)), "")
        last = re.sub(r"0x[0-9a-f]+", "0x...", last)  # addresses differ, the error is one
        summary = f"{head} ... {last[:200]}" if last else head
        found[summary] += 1
        # The head and the innermost frames: where it was raised, and what.
        shown = record if len(record) <= 12 else [*record[:2], "  ...", *record[-10:]]
        sample.setdefault(summary, shown)
    return [
        Violation(
            "log-errors",
            None,
            f"{replica}: {n}x {summary}\n      " + "\n      ".join(sample[summary]),
        )
        for summary, n in found.items()
    ]


_OWNER = re.compile(r"replica (\S+)")


@dataclass
class _Index:
    """The history arranged for the checks: answers by execution and by key, when each
    execution may have begun, which replicas were faulted when."""

    exchanges: list[Exchange]
    by_id: dict[str, list[Exchange]]
    by_key: dict[str, list[Exchange]]
    first: dict[str, float]
    reasoner_of: dict[str, str]
    faulted: _Faulted

    @classmethod
    def of(cls, history: History) -> _Index:
        exchanges = sorted(history.exchanges, key=lambda e: e.invoked)
        by_id: dict[str, list[Exchange]] = defaultdict(list)
        by_key: dict[str, list[Exchange]] = defaultdict(list)
        reasoner_of: dict[str, str] = {}
        for exchange in exchanges:
            if exchange.execution_id is not None:
                by_id[exchange.execution_id].append(exchange)
                found = REASONER_PATH.match(exchange.path)
                if found is not None:
                    reasoner_of[exchange.execution_id] = found.group(1)
            if exchange.key is not None:
                by_key[exchange.key].append(exchange)
        # An execution may have begun with the first request of its key (whose answer may
        # have been lost), or the first naming it.
        first = {i: min(e.invoked for e in seen) for i, seen in by_id.items()}
        for seen in by_key.values():
            began = min(e.invoked for e in seen)
            for e in seen:
                if e.is_execution and e.execution_id is not None:
                    first[e.execution_id] = min(first[e.execution_id], began)
        return cls(exchanges, by_id, by_key, first, reasoner_of, _Faulted.of(history.nemesis))

    def sessions(self) -> dict[str, list[tuple[float, str]]]:
        """Per session of `evidenced_session`, when each start was answered with its
        execution, and its id."""
        found: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for e in self.exchanges:
            if (
                e.session is not None
                and e.is_execution
                and e.execution_id is not None
                and e.path.startswith("/reasoners/evidenced_session")
            ):
                found[e.session].append((e.answered, e.execution_id))
        return found

    def accepted(self) -> list[str]:
        """Every execution some answer carried (202, 200, 500, 409, 503 with its body)."""
        return sorted(i for i, seen in self.by_id.items() if any(e.is_execution for e in seen))

    def timeline(self, execution_id: str, limit: int = 12) -> str:
        seen = self.by_id.get(execution_id, [])
        shown = [e.describe() for e in seen[:limit]]
        if len(seen) > limit:
            shown.append(f"... {len(seen) - limit} more")
        return "\n      " + "\n      ".join(shown)


def _attempt(record: Final) -> int:
    return int((record.body or {}).get("attempt") or 1)


def _told_means_final(index: _Index, final: Mapping[str, Final]) -> Iterator[Violation]:
    """1. Every terminal status (and attempt) a client was told is the final record's, and
    no answer to a request sent after the first such answer says otherwise."""
    for execution_id, seen in index.by_id.items():
        told = [e for e in seen if e.is_execution and e.body_status in TERMINAL]
        if not told:
            continue
        record = final.get(execution_id)
        if record is not None and record.body is not None:
            wrong = [
                e for e in told if (e.body_status, e.attempt) != (record.state, _attempt(record))
            ]
            if wrong:
                yield Violation(
                    "told-means-final",
                    execution_id,
                    f"told {wrong[0].body_status}@{wrong[0].attempt}, final record "
                    f"{record.state}@{_attempt(record)} on {record.body.get('replica') or '-'}"
                    + index.timeline(execution_id),
                )
                continue
        first_told = min(told, key=lambda e: e.answered)
        later = [
            e
            for e in seen
            if e.is_execution
            and e.invoked > first_told.answered
            and (e.body_status, e.attempt) != (first_told.body_status, first_told.attempt)
        ]
        if later:
            yield Violation(
                "told-means-final",
                execution_id,
                f"told {first_told.body_status}@{first_told.attempt} at "
                f"t={first_told.answered:.3f}, then {later[0].describe()}",
            )


def _accepted_runs(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """3. Every accepted execution is readable at the end and terminal after quiescence (7:
    accepted never vanishes), and ran if it succeeded; a resumable one is lost only with no
    attempt left. Also: nothing fails with an error its reasoner never raises (a store error
    that was not retried)."""
    for execution_id in index.accepted():
        record = final.get(execution_id)
        if record is None or record.body is None:
            yield Violation(
                "accepted-vanished",
                execution_id,
                f"final read: {record.state if record else 'never read'}"
                + index.timeline(execution_id),
            )
            continue
        body = record.body
        reasoner = body.get("reasoner") or index.reasoner_of.get(execution_id)
        if record.state not in TERMINAL:
            yield Violation(
                "accepted-vanished",
                execution_id,
                f"{reasoner} still {record.state}@{_attempt(record)} on "
                f"{body.get('replica') or '-'} after quiescence" + index.timeline(execution_id),
            )
        if record.state == "succeeded" and not evidence.get(execution_id):
            yield Violation(
                "accepted-runs",
                execution_id,
                f"{reasoner} ended {record.state} but its body never ran",
            )
        error = body.get("error") or {}
        if record.state == "failed" and error.get("type") != "ValueError":
            yield Violation(
                "failed-by-server",
                execution_id,
                f"{reasoner} failed@{_attempt(record)} on {body.get('replica')}: "
                f"{error.get('type')}: {str(error.get('message'))[:200]}",
            )
        if (
            reasoner in RESUMABLE
            and record.state == "lost"
            and _attempt(record) < EVIDENCED_STEPS_MAX_ATTEMPTS
        ):
            yield Violation(
                "accepted-runs",
                execution_id,
                f"resumable, lost at attempt {_attempt(record)} of "
                f"{EVIDENCED_STEPS_MAX_ATTEMPTS}: {error.get('message')}",
            )


def _living_judged(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """2. An execution reads lost only if its owner was killed or paused past its lease
    after the execution began; a next attempt follows one only if the replica that ran it
    was killed, paused or rolled after the execution began."""
    faulted = index.faulted
    for execution_id in index.accepted():
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        since = index.first.get(execution_id, 0.0)
        if record.state == "lost":
            message = str((record.body.get("error") or {}).get("message", ""))
            named = _OWNER.search(message)
            owner = named.group(1) if named else str(record.body.get("replica") or "")
            if not faulted.may_be_judged(owner, since):
                rolled = [
                    f"t={t:.3f} ({how})" for t, how in faulted.rollouts.get(owner, ()) if t >= since
                ]
                yield Violation(
                    "living-judged",
                    execution_id,
                    f"lost ({message}) though {owner} was never killed or paused after it "
                    f"began (t={since:.3f})"
                    + (f"; {owner} was rolled at {', '.join(rolled)}" if rolled else "")
                    + index.timeline(execution_id),
                )
        lines = evidence.get(execution_id, [])
        attempts = max([_attempt(record), *(e.attempt for e in lines)])
        for attempt in range(1, attempts):
            kinds = {e.kind for e in lines if e.attempt == attempt}
            if "asked" in kinds and "answered" not in kinds:
                continue  # it parked waiting for input: the answer queued the next attempt
            if "end" in kinds and record.reasoner == "evidenced_session":
                continue  # its body failed (on purpose): its retry policy queued the next
            for replica in sorted({e.replica for e in lines if e.attempt == attempt}):
                if not faulted.may_hand_off(replica, since):
                    yield Violation(
                        "living-judged",
                        execution_id,
                        f"attempt {attempt} ran on {replica}, never killed, paused or rolled "
                        f"after it began (t={since:.3f}), yet attempt {attempt + 1} followed "
                        f"(final {record.state}@{_attempt(record)})",
                    )


def _one_per_key(index: _Index) -> Iterator[Violation]:
    """4. Every answer to one Idempotency-Key names the same execution."""
    for key, seen in index.by_key.items():
        named = sorted({e.execution_id for e in seen if e.is_execution and e.execution_id})
        if len(named) > 1:
            yield Violation(
                "one-per-key", None, f"key {key} answered {len(named)} executions: {named}"
            )


def _evidence(
    final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """5. A non-resumable body runs at most once per execution. 6. A succeeded resumable
    one ran every step; steps repeat at most once per extra attempt."""
    for execution_id, lines in sorted(evidence.items()):
        runs = [e for e in lines if e.kind == "run"]
        starts = Counter(e.attempt for e in lines if e.kind == "start")
        if len(runs) > 1 or any(n > 1 for n in starts.values()):
            runs += [e for e in lines if e.kind == "start"]
            yield Violation(
                "runs-once",
                execution_id,
                f"body ran {len(runs)} times: "
                + "; ".join(f"attempt {e.attempt} on {e.replica} pid {e.pid}" for e in runs),
            )
        steps = [e for e in lines if e.kind == "step"]
        if not steps:
            continue
        record = final.get(execution_id)
        state = record.state if record is not None else "never read"
        attempt = _attempt(record) if record is not None else 1
        attempts = max(attempt, *(e.attempt for e in steps))
        done = Counter(e.step for e in steps)
        missing = sorted(set(range(steps[0].count or 0)) - set(done))
        if state == "succeeded" and missing:
            yield Violation(
                "steps", execution_id, f"succeeded@{attempt} without running steps {missing}"
            )
        repeats = sum(n - 1 for n in done.values())
        if repeats > attempts - 1:
            yield Violation(
                "steps",
                execution_id,
                f"{repeats} steps repeated over {attempts} attempts: "
                + ", ".join(f"{e.step}@{e.attempt} on {e.replica}" for e in steps),
            )


def _refused_policy(exchange: Exchange) -> bool:
    """A 400 to a limited start that carried a session policy: a server may refuse the
    policy on a limited reasoner (it starts nothing) rather than keep both."""
    return (
        exchange.status == 400
        and exchange.session is not None
        and exchange.path.startswith("/reasoners/evidenced_limited")
    )


def _answers(
    index: _Index, calls: list[Call], spans: list[tuple[float, float]]
) -> Iterator[Violation]:
    """7. No 404 for an execution (the test deletes none). 9. Every answer is one the API
    documents (an execution with 200, 202, 409, 500 or 503; a refusal: 429, 502, 503, 504),
    and no client call gives up or raises, unless it gave up retrying through spans in which
    no told write could be acknowledged (`gave_up_unreplicated`)."""
    missing: dict[str, list[Exchange]] = defaultdict(list)
    for exchange in index.exchanges:
        status = exchange.status
        if status is None:  # no answer: the client retried (the history has it)
            continue
        if status == 404 and exchange.execution_id is not None:
            missing[exchange.execution_id].append(exchange)
            continue
        if exchange.is_execution and status in (200, 202, 409, 500, 503):
            continue
        if not exchange.is_execution and status in (429, 502, 503, 504):
            continue
        if exchange.op == "input" and status == 409:  # its answer taken by an earlier try
            continue
        if _refused_policy(exchange):
            continue
        yield Violation("answers", exchange.execution_id, exchange.describe())
    for execution_id, seen in missing.items():
        more = f" (and {len(seen) - 1} more 404s)" if len(seen) > 1 else ""
        yield Violation("accepted-vanished", execution_id, seen[0].describe() + more)
    for call in calls:
        if call.failed and not gave_up_unreplicated(call, index.exchanges, spans):
            yield Violation(
                "answers",
                call.execution_id,
                f"{call.client} {call.op} {call.reasoner} at t={call.invoked:.3f}: "
                f"{call.outcome[:300]}",
            )


def _answer_taken(index: _Index, final: Mapping[str, Final]) -> Iterator[Violation]:
    """10. A succeeded `evidenced_asking` returns the answer its clients sent (derived from
    its id); one whose answer was accepted (a 202 to its input) never times out waiting."""
    for execution_id, seen in index.by_id.items():
        if index.reasoner_of.get(execution_id) != "evidenced_asking":
            continue
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        body = record.body
        if record.state == "succeeded" and body.get("result") != {
            "answer": evidenced_answer(execution_id)
        }:
            yield Violation("answer-taken", execution_id, f"succeeded with {body.get('result')!r}")
        accepted = [e for e in seen if e.op == "input" and e.status == 202]
        message = str((body.get("error") or {}).get("message", ""))
        if record.state == "failed" and accepted and "no answer in time" in message:
            yield Violation(
                "answer-taken",
                execution_id,
                f"timed out though its answer was accepted at t={accepted[0].answered:.3f}"
                + index.timeline(execution_id),
            )


def _delayed(
    index: _Index, final: Mapping[str, Final], evidence: Mapping[str, list[Evidence]]
) -> Iterator[Violation]:
    """11. No run of a delayed start's body before its creation plus the delay (the
    evidence and the record's time are this machine's clock; 50 ms of rounding allowed)."""
    delays: dict[str, float] = {}
    for key_seen in index.by_key.values():
        asked = [e.delay for e in key_seen if e.delay is not None]
        for e in key_seen:
            if asked and e.execution_id is not None:
                delays[e.execution_id] = max(asked)
    for execution_id, delay in delays.items():
        record = final.get(execution_id)
        if record is None or record.body is None:
            continue
        created = datetime.fromisoformat(str(record.body["created_at"])).timestamp()
        for line in evidence.get(execution_id, []):
            if line.at < created + delay - 0.05:
                yield Violation(
                    "delayed",
                    execution_id,
                    f"ran {line.at - created:.3f}s after its creation, delayed {delay}s",
                )


def excused(history: History) -> list[str]:
    """The calls that gave up within spans in which no told write could be acknowledged,
    which `check` does not count as violations, each described with its refusals and the
    spans."""
    spans = unreplicated(history.nemesis)
    exchanges = sorted(history.exchanges, key=lambda e: e.invoked)
    found = []
    for call in history.calls:
        if gave_up_unreplicated(call, exchanges, spans):
            refused = refused_for(call, exchanges) or []
            within = [
                (low, high) for low, high in spans for b, e in refused if high > b and low < e
            ]
            found.append(
                f"{call.client} {call.op} {call.reasoner} at t={call.invoked:.3f}: "
                f"{call.outcome[:120]}; refused "
                + ", ".join(f"{b:.1f}-{e:.1f}" for b, e in refused)
                + "; unreplicated "
                + ", ".join(f"{low:.1f}-{high:.1f}" for low, high in sorted(set(within)))
            )
    return found


def check(
    history: History,
    final: Mapping[str, Final],
    evidence: Mapping[str, list[Evidence]],
    logs: Mapping[str, str],
) -> list[Violation]:
    """The violations of the invariants (INVARIANTS) in one run: a pure function of the
    history, the final records, the reasoners' evidence and the replicas' logs."""
    index = _Index.of(history)
    stops = interval_stops(history.nemesis, history.wall0)
    violations = [
        *_told_means_final(index, final),
        *_living_judged(index, final, evidence),
        *_accepted_runs(index, final, evidence),
        *_one_per_key(index),
        *_evidence(final, evidence),
        *_answers(index, history.calls, unreplicated(history.nemesis)),
        *_answer_taken(index, final),
        *_delayed(index, final, evidence),
        *failed_unrun(final, evidence),
        *ask_answers(final, evidence),
        *limits(final, evidence, stops),
        *session_order(index.sessions(), final, evidence, stops),
    ]
    for replica, text in logs.items():
        violations.extend(log_errors(replica, text))
    violations.extend(
        Violation("harness", None, f"t={note.time:.3f} {note.kind}: {note.detail[:600]}")
        for note in history.notes
    )
    return violations
