"""The fault-injection test (docs/replicas.md): three replicas behind haproxy on a Redis
primary and one replica (AOF) under three real sentinels, a load of clients keeping a history
(runs, starts, cancels, parked asks of one and two questions, delayed starts, limited starts,
session-enqueued messages), a short seeded schedule of faults (kill -9, rollouts, replicas
paused past their lease, a Redis node paused and restarted, a planned failover, a
kill -9 of the primary, a failback (the primary killed, restarted as it was, converted by the
sentinels, then failed over to), the links to Redis cut), then the checker of tests/support/faults/.
A failure prints the seed and every violation.

`AGENT_SERVER_FAULT_SEED` runs another seed's schedule, `AGENT_SERVER_FAULT_SECONDS` a longer
one, `AGENT_SERVER_FAULT_REDIS_REPLICAS` more Redis replicas; `python -m bench.faults --seconds
N --seeds A-B` runs long ones (on two Redis replicas by default).
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.apps.tests_app import EVIDENCED_LIMIT, evidenced_answer, evidenced_reply
from tests.support.faults import (
    FAULT_KINDS,
    Call,
    Evidence,
    Exchange,
    Final,
    History,
    NemesisEvent,
    Violation,
    check,
    run_faults,
)
from tests.support.process import need

SEED = int(os.environ.get("AGENT_SERVER_FAULT_SEED", "1"))
#: Seconds of faults; the schedule goes on past them until each of the nine kinds has come
#: once (a failover's settling counts in its fault).
SECONDS = float(os.environ.get("AGENT_SERVER_FAULT_SECONDS", "70"))
#: Redis replicas under Sentinel here: one. With two (the harness's default, as in production,
#: which `bench.faults` runs) a planned failover loses told writes: while the sentinels promote
#: one replica, the old primary goes on taking writes and the other replica, still its replica
#: until the sentinels reconfigure it, acknowledges their `WAIT 1`; it then resyncs from the
#: promoted one in full and drops them (seed 1: told `failed`, final `succeeded`, bodies run
#: twice, 404 for accepted executions). `WAIT 1` holds only with one replica to promote.
REDIS_REPLICAS = int(os.environ.get("AGENT_SERVER_FAULT_REDIS_REPLICAS", "1"))
#: The reasoners of the load, each of which must have run in the short schedule too.
LOAD = (
    "evidenced",
    "evidenced_steps",
    "evidenced_asking",
    "evidenced_two_asks",
    "evidenced_limited",
    "evidenced_session",
)


@pytest.mark.redis
@pytest.mark.timeout(SECONDS + 300)
def test_what_clients_are_told_stays_true_under_faults(tmp_path: Path) -> None:
    need("redis-server", package="redis-server")
    need("redis-sentinel", package="redis-sentinel")
    need("haproxy", package="haproxy")
    run = run_faults(SEED, SECONDS, tmp_path, clients=6, redis_replicas=REDIS_REPLICAS)
    report = run.report(limit=20)
    print(report)
    assert not run.violations, (
        f"seed {SEED} broke invariants (AGENT_SERVER_FAULT_SEED={SEED} replays its schedule; "
        f"the history is in {tmp_path / 'history.jsonl'}):\n{report}"
    )
    # It proved something: a real load of every kind, and every kind of fault at least once
    # (the schedule gives each kind once in every round).
    assert run.executions >= 100, run.summary()
    assert all(run.reasoners[name] >= 3 for name in LOAD), run.reasoners
    assert sum(run.faults.values()) >= len(FAULT_KINDS), run.summary()
    assert set(run.faults) == set(FAULT_KINDS), run.summary()
    # The kills, restarts and failovers left spans in which no told write could be
    # acknowledged, each seen to end (the calls they excuse are in the report).
    assert len(run.unreplicated) >= 3, run.unreplicated


# -- the checker itself, on histories written by hand --------------------------------------

ID = "a" * 32
OTHER = "b" * 32


def answer(
    path: str,
    status: int,
    state: str | None,
    at: float,
    *,
    execution_id: str = ID,
    attempt: int = 1,
    replica: str = "r0-1",
    key: str | None = None,
    client: str = "raw1",
) -> Exchange:
    op = "start" if path.endswith("/async") else "run" if path.startswith("/reasoners") else "get"
    return Exchange(
        client=client,
        op=op,
        method="POST" if path.startswith("/reasoners") else "GET",
        path=path,
        key=key,
        execution_id=execution_id,
        invoked=at,
        answered=at + 0.1,
        status=status,
        body_status=state,
        attempt=None if state is None else attempt,
        replica=None if state is None else replica,
    )


def record(state: str, attempt: int = 1, replica: str = "r0-1", **extra: Any) -> Final:
    body = {"execution_id": ID, "reasoner": "evidenced", "status": state, "attempt": attempt}
    return Final(200, {**body, "replica": replica, **extra})


LOST = {"type": "ExecutionLost", "message": "replica r0-1 stopped renewing its liveness"}
RAN = {ID: [Evidence("run", 1, None, None, "r0-1", 10, 0.0)]}


def invariants(violations: list[Violation]) -> set[str]:
    return {violation.invariant for violation in violations}


def test_the_checker_passes_a_clean_history() -> None:
    history = History()
    history.exchanges.append(answer("/reasoners/evidenced", 200, "succeeded", 1.0, key="k"))
    history.exchanges.append(answer(f"/executions/{ID}", 200, "succeeded", 2.0))
    assert check(history, {ID: record("succeeded")}, RAN, {"r0-1": "all quiet\n"}) == []


def test_the_checker_finds_a_contradicted_answer_and_a_living_owner_judged() -> None:
    history = History()
    history.exchanges.append(answer("/reasoners/evidenced", 200, "succeeded", 1.0, key="k"))
    final = {ID: record("lost", error=LOST)}
    assert invariants(check(history, final, RAN, {})) == {"told-means-final", "living-judged"}
    # Killed after the execution began, its owner may be judged; the answer is still wrong.
    history.nemesis.append(NemesisEvent(3.0, "kill9", "r0-1", "end", "exit -9"))
    assert invariants(check(history, final, RAN, {})) == {"told-means-final"}
    # Killed before it began, it is no excuse.
    history.nemesis[0] = NemesisEvent(0.5, "kill9", "r0-1", "end", "exit -9")
    assert "living-judged" in invariants(check(history, final, RAN, {}))


def test_the_checker_finds_a_later_read_that_contradicts_an_answer() -> None:
    history = History()
    history.exchanges.append(answer("/reasoners/evidenced", 500, "failed", 1.0, key="k"))
    history.exchanges.append(answer(f"/executions/{ID}", 200, "running", 2.0, attempt=2))
    found = check(history, {ID: record("failed", error={"type": "ValueError"})}, RAN, {})
    assert invariants(found) == {"told-means-final"}, found


def test_the_checker_finds_work_accepted_that_never_ends_or_vanishes() -> None:
    history = History()
    history.exchanges.append(answer("/reasoners/evidenced/async", 202, "running", 1.0, key="k"))
    assert invariants(check(history, {ID: record("running")}, RAN, {})) == {"accepted-vanished"}
    assert invariants(check(history, {ID: Final(404, None)}, {}, {})) == {"accepted-vanished"}
    # Succeeded without its body ever running.
    assert invariants(check(history, {ID: record("succeeded")}, {}, {})) == {"accepted-runs"}
    # Failed with an error of the server's rather than its own.
    failed = record("failed", error={"type": "StoreUnavailable", "message": "no reply"})
    assert invariants(check(history, {ID: failed}, RAN, {})) == {"failed-by-server"}
    # Failed at an attempt whose body never began (a repair of a claim lost in a fault).
    unrun = record("failed", attempt=2, error={"type": "LookupError", "message": "not here"})
    assert invariants(check(history, {ID: unrun}, RAN, {})) == {
        "failed-by-server",
        "failed-unrun",
        "living-judged",  # and attempt 2 followed though no replica was faulted
    }
    own = record("failed", error={"type": "ValueError", "message": "failed on purpose"})
    assert invariants(check(history, {ID: own}, {}, {})) == {"failed-unrun"}


def test_the_checker_finds_two_executions_for_one_key() -> None:
    history = History()
    history.exchanges.append(answer("/reasoners/evidenced/async", 202, "running", 1.0, key="k"))
    history.exchanges.append(
        answer("/reasoners/evidenced/async", 202, "running", 2.0, key="k", execution_id=OTHER)
    )
    final = {ID: record("succeeded"), OTHER: record("succeeded")}
    evidence = {**RAN, OTHER: RAN[ID]}
    assert invariants(check(history, final, evidence, {})) == {"one-per-key"}


def test_the_checker_finds_a_body_run_twice_and_steps_lost_or_repeated() -> None:
    history = History()
    twice = {ID: [*RAN[ID], Evidence("run", 1, None, None, "r1-2", 11, 1.0)]}
    assert invariants(check(history, {ID: record("succeeded")}, twice, {})) == {"runs-once"}
    gap = {ID: [Evidence("step", 1, step, 3, "r0-1", 10, 0.0) for step in (0, 2)]}
    assert invariants(check(history, {ID: record("succeeded")}, gap, {})) == {"steps"}
    repeated = {ID: [Evidence("step", 1, 0, 1, "r0-1", 10, 0.0)] * 3}
    final = {ID: record("succeeded", attempt=2)}
    assert "steps" in invariants(check(history, final, repeated, {}))


def test_the_checker_reads_logs_but_leaves_a_reasoners_own_failure_to_its_record() -> None:
    own = (
        "2026-12-01 20:39:19,257 ERROR agent_server.runtime.registry: execution "
        f"{ID} (evidenced) failed\nTraceback (most recent call last):\n"
        '  File "tests_app.py", line 1, in evidenced\nValueError: failed on purpose\n'
    )
    server = (
        "2026-12-01 20:39:20,000 ERROR agent_server.store: store task store-pubsub failed\n"
        'Traceback (most recent call last):\n  File "redis.py", line 2, in listen\n'
        "RuntimeError: unable to perform operation on <TCPTransport closed=True 0x55d1>\n"
    )
    assert check(History(), {}, {}, {"r0-1": own}) == []
    found = check(History(), {}, {}, {"r0-1": own + server + server.replace("0x55d1", "0x66e2")})
    assert [v.invariant for v in found] == ["log-errors"]
    assert "2x" in found[0].detail and "store-pubsub" in found[0].detail


def test_the_checker_finds_an_answer_lost_or_changed_and_a_parked_attempt_is_no_hand_off() -> None:
    asking = "/reasoners/evidenced_asking/async"
    history = History()
    history.exchanges.append(answer(asking, 202, "running", 1.0, key="k"))
    taken = answer(f"/executions/{ID}/input", 202, "queued", 2.0)
    history.exchanges.append(Exchange(**{**taken.__dict__, "op": "input", "method": "POST"}))
    # Parked at attempt 1 (asked, never answered there), resumed as attempt 2 elsewhere.
    parked = {
        ID: [
            Evidence("asked", 1, None, None, "r0-1", 10, 0.0),
            Evidence("asked", 2, None, None, "r1-1", 11, 3.0),
            Evidence("answered", 2, None, None, "r1-1", 11, 3.0),
        ]
    }
    result = {"answer": evidenced_answer(ID)}
    good = {ID: record("succeeded", attempt=2, replica="r1-1", result=result)}
    assert check(history, good, parked, {}) == []
    changed = {ID: record("succeeded", attempt=2, replica="r1-1", result={"answer": "other"})}
    assert invariants(check(history, changed, parked, {})) == {"answer-taken"}
    timed_out = record(
        "failed", error={"type": "ValueError", "message": "no answer in time"}, attempt=2
    )
    assert invariants(check(history, {ID: timed_out}, parked, {})) == {"answer-taken"}


def test_the_checker_finds_a_delayed_start_run_early() -> None:
    history = History()
    start = answer("/reasoners/evidenced/async", 202, "queued", 1.0, key="k")
    history.exchanges.append(Exchange(**{**start.__dict__, "delay": 1.0}))
    created = "2026-12-02T10:00:00+00:00"
    at = datetime.fromisoformat(created).timestamp()
    final = {ID: record("succeeded", created_at=created)}
    on_time = {ID: [Evidence("run", 1, None, None, "r0-1", 10, at + 1.01)]}
    assert check(history, final, on_time, {}) == []
    early = {ID: [Evidence("run", 1, None, None, "r0-1", 10, at + 0.5)]}
    assert invariants(check(history, final, early, {})) == {"delayed"}


def test_the_checker_finds_an_ask_handed_another_questions_answer() -> None:
    def got(question: str, answer: str, attempt: int) -> Evidence:
        return Evidence("got", attempt, None, None, "r0-1", 10, 1.0, (question, answer))

    first, second = evidenced_reply("first", ID), evidenced_reply("second", ID)
    body = {"reasoner": "evidenced_two_asks", "attempt": 3}
    good = {ID: record("succeeded", result={"first": first, "second": second}, **body)}
    right = {ID: [got("first", first, 2), got("first", first, 3), got("second", second, 3)]}
    assert check(History(), good, right, {}) == []
    # Resumed past its checkpoint, the second ask was handed the first question's answer.
    crossed = {ID: [got("first", first, 2), got("second", first, 3)]}
    wrong = {ID: record("succeeded", result={"first": first, "second": first}, **body)}
    found = check(History(), wrong, crossed, {})
    assert {v.invariant for v in found} == {"ask-answer"} and len(found) == 2, found


def limited(execution_id: str, tenant: str, start: float, end: float | None, replica: str = "r0-1"):
    lines = [Evidence("start", 1, None, None, replica, 10, start, (tenant,))]
    if end is not None:
        lines.append(Evidence("end", 1, None, None, replica, 10, end, (tenant,)))
    return execution_id, lines


def test_the_checker_finds_a_limit_exceeded_but_not_a_slot_handed_on() -> None:
    ids = [f"{n:032x}" for n in range(EVIDENCED_LIMIT + 2)]
    final = {i: Final(200, {"status": "succeeded", "reasoner": "evidenced_limited"}) for i in ids}
    # Back to back: each starts once one of the earlier has ended; another tenant beside.
    handed = dict(
        [
            *(limited(i, "t0", 10.0 * n, 10.0 * n + 5.0) for n, i in enumerate(ids)),
            limited("f" * 32, "t1", 1.0, 30.0),
        ]
    )
    final["f" * 32] = final[ids[0]]
    assert check(History(), final, handed, {}) == []
    # One more than the limit at once for t0.
    at_once = dict(
        limited(i, "t0", 1.0 + n, 20.0) for n, i in enumerate(ids[: EVIDENCED_LIMIT + 1])
    )
    found = check(History(), final, at_once, {})
    assert [v.invariant for v in found] == ["limit"], found
    assert f"{EVIDENCED_LIMIT + 1} bodies" in found[0].detail
    # A body whose replica was killed holds its slot until then, not for ever.
    history = History()
    history.wall0 = 0.0
    history.nemesis.append(NemesisEvent(4.0, "kill9", "r9-9", "begin"))
    killed = dict(
        [
            limited(ids[0], "t0", 1.0, None, replica="r9-9"),
            *(limited(i, "t0", 5.0 + n, 20.0) for n, i in enumerate(ids[1 : EVIDENCED_LIMIT + 1])),
        ]
    )
    assert check(history, final, killed, {}) == []


def test_the_checker_finds_session_messages_out_of_order_or_overlapping() -> None:
    ids = ["1" * 32, "2" * 32, "3" * 32]
    history = History()
    for n, i in enumerate(ids):
        start = answer("/reasoners/evidenced_session/async", 202, "queued", float(n), key=f"k{n}")
        history.exchanges.append(Exchange(**{**start.__dict__, "execution_id": i, "session": "s"}))
    final = {i: Final(200, {"status": "succeeded", "reasoner": "evidenced_session"}) for i in ids}

    def ran(spans: list[tuple[float, float]]) -> dict[str, list[Evidence]]:
        return {
            i: [
                Evidence("start", 1, None, None, "r0-1", 10, start, ("s",)),
                Evidence("end", 1, None, None, "r0-1", 10, end, ("s",)),
            ]
            for i, (start, end) in zip(ids, spans, strict=True)
        }

    assert check(history, final, ran([(1, 2), (2.5, 3), (3, 4)]), {}) == []
    swapped = check(history, final, ran([(3, 4), (1, 2), (4.5, 5)]), {})
    assert [v.invariant for v in swapped] == ["session-order"], swapped
    overlapping = check(history, final, ran([(1, 3), (2, 4), (5, 6)]), {})
    assert [v.invariant for v in overlapping] == ["session-order"], overlapping


def test_the_checker_excuses_a_call_given_up_only_within_spans_without_a_replica() -> None:
    history = History()
    # Refused (503 in doubt) from t=10 until it gave up at t=40.5.
    history.exchanges.extend(answer("/reasoners/evidenced", 503, None, t + 10.0) for t in range(31))
    history.calls.append(Call("raw1", "run", "evidenced", None, 10.0, 40.5, "no execution", True))

    def judged(*spans: tuple[float, float]) -> set[str]:
        history.nemesis[:] = [
            NemesisEvent(at, "unreplicated", "redis", phase)
            for low, high in spans
            for at, phase in ((low, "begin"), (high, "end"))
        ]
        return invariants(check(history, {}, {}, {}))

    assert judged() == {"answers"}
    # Under 5 s outside the spans (a failback's two, the healed moment between them).
    assert judged((12.0, 30.0), (30.5, 38.0)) == set()
    # Healed 6.5 s before it gave up: it should have been answered.
    assert judged((12.0, 30.0), (30.5, 34.0)) == {"answers"}
    # Answered 400 at the end (no refusal, no execution): it gave up on that, not on time.
    history.exchanges.append(answer("/reasoners/evidenced", 400, None, 40.2))
    assert judged((5.0, 45.0)) == {"answers"}
