"""Waiting for input across replicas: two real `agent-server run` processes on one real
Redis, and (each test given `pair` or `store_url`) on one real Postgres. The ask is recorded
on its owner (A), any replica answers (B), exactly one answer per request wins when replicas
race (decided in one Lua script, or one transaction), and the answer reaches the owner's
waiting `ctx.ask` through pub/sub (a notice and a row); cancel, DELETE, timeouts and events as
in one process.

Parked waits (section 13): a resumable reasoner that asks holds no task. The asking
replica's drain never waits for the person, the record is owned by nobody (never judged
`lost`, whoever dies), the answer queues it and any replica resumes it from its last
checkpoint with the earlier answers replayed; a parked request times out, is cancelled, and
takes exactly one answer, as a waiting one does."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import redis

from tests.support.process import ServerProcess
from tests.support.shutdown import shutdown_report

WAIT = 20.0
Start = Callable[..., ServerProcess]


#: A short lease, so that a dead owner is judged within a test.
LEASE = ("--lease-ttl", "1")
#: A drain that ends soon, so that a resumable execution is handed off within a test.
SHORT_DRAIN = ("--unready-delay", "0", "--drain-timeout", "0.5", "--grace-period", "8")


@pytest.fixture
def pair(server_factory: Start, store_url: str) -> tuple[ServerProcess, ServerProcess]:
    a = server_factory(
        "input_app:agent", "--store", store_url, "--replica-id", "A", *LEASE, *SHORT_DRAIN
    )
    b = server_factory(
        "input_app:agent", "--store", store_url, "--replica-id", "B", *LEASE, *SHORT_DRAIN
    )
    return a, b


def start(server: ServerProcess, name: str, body: Any = None) -> str:
    response = httpx.post(f"{server.url}/reasoners/{name}/async", json=body or {}, timeout=WAIT)
    assert response.status_code == 202, response.text
    return str(response.json()["execution_id"])


def poll(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    response = httpx.get(
        f"{server.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def ended(server: ServerProcess, execution_id: str) -> dict[str, Any]:
    """Once terminal: its event stream ends with `end` (a long-poll stops at asks too).
    Bounded as a whole: heartbeats keep a stream's reads inside any read timeout."""
    deadline = time.monotonic() + WAIT
    url = f"{server.url}/executions/{execution_id}/events"
    with httpx.stream("GET", url, timeout=WAIT) as stream:
        at_end = False
        for line in stream.iter_lines():
            assert time.monotonic() < deadline, f"{execution_id} did not end in {WAIT} s"
            if line == "event: end":
                at_end = True
            elif at_end and line.startswith("data: "):
                body: dict[str, Any] = json.loads(line[6:])
                return body
    raise AssertionError(f"the stream of {execution_id} closed without its end")


def answer(server: ServerProcess, execution_id: str, body: Any) -> httpx.Response:
    return httpx.post(f"{server.url}/executions/{execution_id}/input", json=body, timeout=WAIT)


def test_asked_on_a_answered_on_b_succeeds_on_a(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "approve", {"amount": 12})
    waiting = poll(b, execution_id)  # B's long-poll is woken at input_required
    assert (waiting["status"], waiting["replica"]) == ("input_required", "A")
    assert waiting["input_request"]["prompt"] == {"question": "approve 12?"}
    refused = answer(b, execution_id, {"value": {"approved": "yes"}})  # B checks the schema
    assert refused.status_code == 422, refused.text
    taken = answer(b, execution_id, {"request_id": 1, "value": {"approved": True, "note": "B"}})
    assert taken.status_code == 202, taken.text
    assert taken.json()["status"] in ("running", "succeeded")
    assert (
        answer(a, execution_id, {"request_id": 1, "value": {"approved": False}}).status_code == 409
    )
    done = ended(b, execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", "A")
    assert done["result"] == {"approved": True, "note": "B", "amount": 12}
    assert done["input_request"] is None


def test_answers_racing_on_both_replicas_one_wins(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "twice")
    assert poll(a, execution_id)["status"] == "input_required"
    with ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda i: (i, answer((a, b)[i % 2], execution_id, {"request_id": 1, "value": i})),
                range(16),
            )
        )
    codes = sorted(response.status_code for _, response in answers)
    assert codes == [202] + [409] * 15, codes
    winner = next(i for i, response in answers if response.status_code == 202)
    second = poll(b, execution_id)
    assert second["input_request"]["request_id"] == 2
    assert second["input_request"]["prompt"] == {"after": winner}
    assert answer(b, execution_id, {"value": "last"}).status_code == 202
    assert ended(a, execution_id)["result"] == [winner, "last"]


def test_a_waiting_execution_is_cancelled_from_another_replica(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "guarded")
    assert poll(b, execution_id)["status"] == "input_required"
    refused = httpx.delete(f"{b.url}/executions/{execution_id}", timeout=WAIT)
    assert refused.status_code == 409
    assert httpx.post(f"{b.url}/executions/{execution_id}/cancel", timeout=WAIT).status_code == 202
    done = ended(b, execution_id)
    assert (done["status"], done["status_reason"]) == ("cancelled", "request")
    assert answer(b, execution_id, {"value": 1}).status_code == 409
    stream = httpx.get(f"{b.url}/executions/{execution_id}/events", timeout=WAIT).text
    assert "event: input_required" in stream and "event: note" in stream


def test_a_timeout_closes_the_request_in_the_store(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "impatient", {"timeout": 0.3})
    done = ended(b, execution_id)
    assert done["result"] == {"timed_out": True, "request_id": 1}
    assert answer(b, execution_id, {"value": 1}).status_code == 409
    answered = start(a, "impatient", {"timeout": 30})
    assert poll(b, answered)["status"] == "input_required"
    assert answer(b, answered, {"value": 7}).status_code == 202
    assert ended(a, answered)["result"] == {"timed_out": False, "answer": 7}


def test_a_synchronous_run_answers_202_and_goes_on(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    response = httpx.post(f"{a.url}/reasoners/approve", json={}, timeout=WAIT)
    assert response.status_code == 202, response.text
    execution_id = response.json()["execution_id"]
    assert response.headers["location"] == f"/executions/{execution_id}"
    assert answer(b, execution_id, {"value": {"approved": False}}).status_code == 202
    assert ended(b, execution_id)["result"]["approved"] is False


def test_an_owner_that_died_while_its_execution_waited_leaves_it_lost(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    a, b = pair
    execution_id = start(a, "approve")
    assert poll(b, execution_id)["status"] == "input_required"
    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=WAIT)
    body = ended(b, execution_id)  # B's renewal judges A's work once A's lease lapsed
    assert (body["status"], body["error"]["type"]) == ("lost", "ExecutionLost")
    assert body["input_request"] is None
    assert answer(b, execution_id, {"value": {"approved": True}}).status_code == 409


def test_a_request_answered_before_a_hand_off_is_not_asked_again(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """Attempt 1 parks; the answer resumes attempt 2 (on either replica), which replays it
    and is handed off by its replica's drain; attempt 3 asks request 1 again and gets the
    kept answer at once."""
    replicas = dict(zip("AB", pair, strict=True))
    a, b = pair
    execution_id = start(a, "asked_once")
    assert poll(b, execution_id)["status"] == "input_required"
    assert answer(b, execution_id, {"value": "yes"}).status_code == 202
    with httpx.stream("GET", f"{b.url}/executions/{execution_id}/events", timeout=WAIT) as events:
        for line in events.iter_lines():  # attempt 2 has the answer
            if line == "event: got":
                break
    holder = httpx.get(f"{b.url}/executions/{execution_id}", timeout=WAIT).json()["replica"]
    other = "B" if holder == "A" else "A"
    replicas[holder].signal(signal.SIGTERM)
    code, _ = replicas[holder].wait_exit(WAIT)
    assert code == 0, replicas[holder].stderr()
    done = ended(replicas[other], execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", other)
    assert done["result"] == {"answer": "yes", "attempt": 3}


#: A drain that would wait a minute for running work: an exit within seconds shows that a
#: parked execution is not waited for.
LONG_DRAIN = ("--unready-delay", "0.5", "--drain-timeout", "60", "--grace-period", "90")


def test_a_parked_wait_holds_no_drain_and_resumes_on_another_replica(
    server_factory: Start, store_url: str
) -> None:
    a = server_factory(
        "input_app:agent", "--store", store_url, "--replica-id", "A", *LEASE, *LONG_DRAIN
    )
    b = server_factory("input_app:agent", "--store", store_url, "--replica-id", "B", *LEASE)
    execution_id = start(a, "approve_later", {"amount": 7})
    waiting = poll(b, execution_id)
    assert waiting["status"] == "input_required"
    assert not waiting["replica"]  # parked: nobody owns it, nothing runs it
    assert waiting["attempt"] == 2  # the attempt its answer resumes
    assert waiting["input_request"]["prompt"] == {"question": "approve 7?"}

    a.signal(signal.SIGTERM)
    code, seconds = a.wait_exit(WAIT)
    assert code == 0, a.stderr()
    assert seconds < 30, f"A's drain waited {seconds:.1f} s for a parked execution"
    assert "drain deadline" not in a.stderr()  # nothing was left to cancel

    # A's liveness has ended: an owned execution would now read lost; a parked one waits.
    still = httpx.get(f"{b.url}/executions/{execution_id}", timeout=WAIT).json()
    assert (still["status"], still["error"]) == ("input_required", None)

    refused = answer(b, execution_id, {"value": {"approved": "maybe"}})  # the JSON schema
    assert refused.status_code == 422, refused.text
    taken = answer(b, execution_id, {"request_id": 1, "value": {"approved": True}})
    assert taken.status_code == 202, taken.text
    assert taken.json()["status"] in ("queued", "running")  # the answer queued it
    again = answer(b, execution_id, {"request_id": 1, "value": {"approved": False}})
    assert again.status_code == 409, again.text
    done = ended(b, execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", "B")
    assert done["result"] == {"approved": True, "amount": 7, "attempt": 2}


def test_two_asks_with_a_kill_between_the_answers(server_factory: Start, store_url: str) -> None:
    """Request 1's answer resumes attempt 2, which checkpoints past it and parks at request
    2; A is killed; request 2's answer resumes attempt 3 on B, which starts from the
    checkpoint, so only request 2 is replayed (numbered on from the checkpoint)."""
    a = server_factory("input_app:agent", "--store", store_url, "--replica-id", "A", *LEASE)
    b = server_factory("input_app:agent", "--store", store_url, "--replica-id", "B", *LEASE)
    execution_id = start(a, "stepwise")
    assert poll(b, execution_id)["input_request"]["request_id"] == 1
    assert answer(b, execution_id, {"value": 3}).status_code == 202
    second = poll(b, execution_id)  # returns once attempt 2 asked request 2
    assert second["status"] == "input_required", second
    assert second["input_request"]["request_id"] == 2
    assert second["input_request"]["prompt"] == {"after": 3}

    a.proc.send_signal(signal.SIGKILL)
    a.proc.wait(timeout=WAIT)
    assert answer(b, execution_id, {"request_id": 2, "value": 4}).status_code == 202
    done = ended(b, execution_id)
    assert (done["status"], done["replica"]) == ("succeeded", "B"), done
    assert done["result"] == {"first": 3, "second": 4, "attempt": 3}


def test_a_parked_request_times_out_and_a_parked_one_is_cancelled(
    server_factory: Start, store_url: str
) -> None:
    b = server_factory(
        "input_app:agent", "--store", store_url, "--replica-id", "B", *LEASE, *SHORT_DRAIN
    )
    impatient = start(b, "patient", {"timeout": 0.5})
    held = start(b, "approve_later")
    assert poll(b, held)["status"] == "input_required"
    # The tick that finds the expired request queues it; the resumed ask raises.
    timed_out = ended(b, impatient)
    assert timed_out["status"] == "succeeded", timed_out
    assert timed_out["result"] == {"timed_out": True, "request_id": 1, "attempt": 2}

    cancelled = httpx.post(f"{b.url}/executions/{held}/cancel", timeout=WAIT)
    assert cancelled.status_code == 200, cancelled.text  # nobody runs it: it ends at once
    assert (cancelled.json()["status"], cancelled.json()["status_reason"]) == (
        "cancelled",
        "request",
    )
    assert answer(b, held, {"value": {"approved": True}}).status_code == 409

    in_session = httpx.post(
        f"{b.url}/reasoners/approve_later/async",
        json={},
        headers={"X-Session-ID": "parked-session"},
        timeout=WAIT,
    ).json()["execution_id"]
    assert poll(b, in_session)["status"] == "input_required"
    released = httpx.delete(f"{b.url}/sessions/parked-session", timeout=WAIT)
    assert released.status_code == 200, released.text
    assert (released.json()["cancelled"], released.json()["abandoned"]) == (1, 0)
    gone = httpx.get(f"{b.url}/executions/{in_session}", timeout=WAIT)
    assert gone.status_code == 404  # released: cancelled where it waited, then forgotten

    start(b, "asks_at_drain")
    b.signal(signal.SIGTERM)  # it asks once the drain begins, and parks: nothing to wait for
    code, _ = b.wait_exit(WAIT)
    assert code == 0, b.stderr()
    report = shutdown_report(b)
    assert (report["parked"], report["finished"], report["cancelled"]) == (1, 0, 0), report


def test_a_replica_draining_with_a_parked_execution_leaves_it_to_the_next(
    server_factory: Start, store_url: str
) -> None:
    """What parked during a drain is resumed by a replica that starts later."""
    a = server_factory(
        "input_app:agent", "--store", store_url, "--replica-id", "A", *LEASE, *LONG_DRAIN
    )
    execution_id = start(a, "asks_at_drain")
    a.signal(signal.SIGTERM)
    code, _ = a.wait_exit(WAIT)
    assert code == 0, a.stderr()
    assert shutdown_report(a)["parked"] == 1
    b = server_factory("input_app:agent", "--store", store_url, "--replica-id", "B", *LEASE)
    assert poll(b, execution_id)["input_request"]["prompt"] == "still there?"
    assert answer(b, execution_id, {"value": "yes"}).status_code == 202
    done = ended(b, execution_id)
    assert (done["status"], done["result"], done["replica"]) == ("succeeded", "yes", "B")


@pytest.mark.redis
def test_a_stream_on_the_replica_that_parks_sends_its_reader_elsewhere(
    server_factory: Start, redis_url: str
) -> None:
    """A stream read from the task's own log ends once it parks, with a retry hint: the
    next events are written by whichever replica resumes it, and the reconnection (with
    its Last-Event-ID) reads them from the store."""
    a = server_factory(
        "input_app:agent",
        "--store",
        redis_url,
        "--replica-id",
        "A",
        *LEASE,
        env={"INPUT_APP_REDIS": redis_url},
    )
    execution_id = start(a, "asks_when_told")
    deadline = time.monotonic() + WAIT
    lines: list[str] = []
    with httpx.stream("GET", f"{a.url}/executions/{execution_id}/events", timeout=WAIT) as out:
        for line in out.iter_lines():
            assert time.monotonic() < deadline, lines
            lines.append(line)
            if line == "event: ready":  # its task runs: this stream reads A's own log
                redis.Redis.from_url(redis_url).rpush(f"go:{execution_id}", 1)
    assert "event: input_required" in lines, lines
    assert any(line.startswith("retry: ") for line in lines), lines
    assert "event: end" not in lines, lines
    assert answer(a, execution_id, {"value": "now"}).status_code == 202
    done = ended(a, execution_id)  # read from the store: the next attempt wrote its end
    assert (done["status"], done["result"], done["attempt"]) == ("succeeded", "now", 2)


# -- an ask is matched by what it asks (section 13) -------------------------------------------


def test_asking_again_from_the_top_gets_each_answer_back_in_order(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """Attempt 3 resumes from a checkpoint taken after request 1 but asks request 1's
    question again: it is matched to request 1 (not handed request 2's answer), and request
    2's question then gets request 2's answer, whichever replica answers and resumes."""
    a, b = pair
    execution_id = start(a, "from_top")
    assert poll(b, execution_id)["input_request"]["prompt"] == "first?"
    assert answer(b, execution_id, {"request_id": 1, "value": "one"}).status_code == 202
    second = poll(a, execution_id)
    assert second["input_request"]["prompt"] == {"second": "?"}, second
    assert answer(a, execution_id, {"request_id": 2, "value": "two"}).status_code == 202
    done = ended(b, execution_id)
    assert done["status"] == "succeeded", done
    assert done["result"] == {"first": "one", "second": "two", "attempt": 3}


@pytest.mark.redis
def test_a_changed_question_fails_with_ask_mismatch_never_the_old_answer(
    server_factory: Start, redis_url: str
) -> None:
    """A rollout changes the question between attempts: the answer given to the old one
    resumes an attempt that asks the new one, which fails with AskMismatch naming both."""
    a = server_factory(
        "input_app:agent",
        "--store",
        redis_url,
        "--replica-id",
        "A",
        *LEASE,
        env={"INPUT_APP_QUESTION": "ship the old build?"},
    )
    execution_id = start(a, "changing")
    assert poll(a, execution_id)["input_request"]["prompt"] == {"question": "ship the old build?"}
    a.signal(signal.SIGTERM)  # parked: it exits at once, and the next code answers
    assert a.wait_exit(WAIT)[0] == 0, a.stderr()
    b = server_factory(
        "input_app:agent",
        "--store",
        redis_url,
        "--replica-id",
        "B",
        *LEASE,
        env={"INPUT_APP_QUESTION": "delete the database?"},
    )
    assert answer(b, execution_id, {"request_id": 1, "value": True}).status_code == 202
    done = ended(b, execution_id)
    assert (done["status"], done["error"]["type"]) == ("failed", "AskMismatch"), done
    assert "ship the old build?" in done["error"]["message"]
    assert "delete the database?" in done["error"]["message"]
    assert done["attempt"] == 2  # failed once: a retry would ask the same


def test_a_key_names_a_question_whose_prompt_changes(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """The prompt names the attempt; with a key the resumed attempt gets its answer, without
    one it is another question (AskMismatch)."""
    a, b = pair
    named = start(a, "keyed", {"key": "approval"})
    unnamed = start(a, "keyed", {"key": None})
    for execution_id in (named, unnamed):
        assert poll(b, execution_id)["input_request"]["prompt"]["attempt"] == 1
        assert answer(b, execution_id, {"request_id": 1, "value": "yes"}).status_code == 202
    assert ended(a, named)["result"] == {"answer": "yes", "attempt": 2}
    assert ended(a, unnamed)["error"]["type"] == "AskMismatch"


# -- answers are bounded, and go with the execution -----------------------------------------


def record_fields(redis_url: str, execution_id: str) -> dict[str, bytes]:
    """The execution's record hash in Redis, as the store keeps it."""
    client = redis.Redis.from_url(redis_url)
    try:
        key = f"{{agent-server:input-tests}}:x:{execution_id}"
        return {name.decode(): value for name, value in client.hgetall(key).items()}
    finally:
        client.close()


def kept_answer_bytes(fields: dict[str, bytes]) -> int:
    return sum(len(value) for name, value in fields.items() if name.startswith("answer:"))


@pytest.mark.redis
def test_answers_are_bounded_in_bytes_and_deleted_at_the_end(
    server_factory: Start, redis_url: str
) -> None:
    """A chat loop of 8 turns of ~30 KB answers with --max-answer-bytes 100000: the record
    never keeps more than the bound (the oldest answers go first), the loop still ends with
    every turn in order, an answer alone over the bound is 413, and at the end no answer,
    nor any request's identity, is left in the record."""
    bound = ("--max-answer-bytes", "100000")
    a = server_factory("input_app:agent", "--store", redis_url, "--replica-id", "A", *LEASE, *bound)
    b = server_factory("input_app:agent", "--store", redis_url, "--replica-id", "B", *LEASE, *bound)
    execution_id = start(a, "chat", {"turns": 8})
    too_big = poll(b, execution_id)
    refused = answer(b, execution_id, {"request_id": 1, "value": "x" * 100_001})
    assert refused.status_code == 413, refused.text
    assert poll(a, execution_id)["input_request"]["request_id"] == 1  # nothing changed
    assert too_big["status"] == "input_required"
    for turn in range(1, 9):
        waiting = poll((a, b)[turn % 2], execution_id)
        assert waiting["input_request"]["request_id"] == turn, waiting
        taken = answer((b, a)[turn % 2], execution_id, {"request_id": turn, "value": "y" * 30_000})
        assert taken.status_code == 202, taken.text
        fields = record_fields(redis_url, execution_id)
        assert kept_answer_bytes(fields) <= 100_000, sorted(fields)
        assert f"answer:{turn}" in fields or turn == 8  # the newest is kept (until the end)
    done = ended(a, execution_id)
    assert done["status"] == "succeeded", done
    assert done["result"] == {"turn": 8, "sizes": [30_000] * 8}
    left = [
        name
        for name in record_fields(redis_url, execution_id)
        if name.split(":")[0] in ("answer", "ident", "label", "expired", "answer_bytes")
    ]
    assert left == [], left


# -- one validation on every replica --------------------------------------------------------


def test_an_answer_is_valid_or_not_whichever_replica_takes_it(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """`"true"` is not a JSON boolean: 422 on the owner (whose task waits) as on the other
    replica; a value that fits is taken by either."""
    a, b = pair
    execution_id = start(a, "approve")
    assert poll(a, execution_id)["replica"] == "A"
    for replica in (a, b):
        for wrong in ({"approved": "true"}, {"approved": 1}, {"approved": True, "note": 5}):
            refused = answer(replica, execution_id, {"request_id": 1, "value": wrong})
            assert refused.status_code == 422, (replica.url, wrong, refused.text)
            assert refused.json()["detail"][0]["loc"][:2] == ["body", "value"]
    assert (
        answer(a, execution_id, {"request_id": 1, "value": {"approved": True}}).status_code == 202
    )
    assert ended(b, execution_id)["result"]["approved"] is True


def test_a_hostile_pattern_answer_cannot_stall_a_replica(
    pair: tuple[ServerProcess, ServerProcess],
) -> None:
    """An ordinary e-mail pattern and a long run of letters that does not end like an
    address: Python's `re` would take seconds (doubling with each letter) holding the event
    loop. Each replica answers 422 at once and serves /healthz meanwhile; an address fits."""
    a, b = pair
    parked = start(a, "email")
    held = start(a, "email_held")
    for execution_id, replica in ((parked, b), (held, b), (held, a)):
        assert poll(replica, execution_id)["status"] == "input_required"
        hostile = {"request_id": 1, "value": "a" * 40 + "!"}
        with ThreadPoolExecutor(1) as pool:
            sent = pool.submit(answer, replica, execution_id, hostile)
            deadline = time.monotonic() + 15
            while not sent.done():  # the loop serves while the answer is checked
                assert time.monotonic() < deadline, "the answer was not checked in 15 s"
                health = httpx.get(f"{replica.url}/healthz", timeout=1.0)
                assert health.status_code == 200
            refused = sent.result()
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"][0]["type"] == "schema_pattern"
    for execution_id in (parked, held):
        fits = {"request_id": 1, "value": "sam.smith@example.org"}
        assert answer(b, execution_id, fits).status_code == 202
        assert ended(a, execution_id)["result"] == "sam.smith@example.org"


@pytest.mark.redis
def test_a_waiter_whose_record_vanished_ends_and_frees_its_slot(
    server_factory: Start, redis_server: Any, redis_url: str
) -> None:
    """Redis loses its data (FLUSHALL, as a restart without persistence does) while an
    execution waits in `ctx.ask` in its task, holding the replica's one `--max-inflight`
    slot. Nobody can answer, cancel or read it any more: at its next renewal the owner finds
    its record gone, ends the task `lost` (logged, counted in
    `executions_finished_total{status="lost"}`) and frees the slot, so a new start is
    accepted again rather than 429 for good. A running task (no ask) ends the same way."""
    server = server_factory(
        "input_app:agent",
        "--store",
        redis_url,
        "--replica-id",
        "A",
        "--max-inflight",
        "2",
        *LEASE,
    )
    waiting = start(server, "approve", {"amount": 7})
    assert poll(server, waiting)["status"] == "input_required"
    # A second slot, taken by a task that waits in its own way (a later request of twice's).
    second = start(server, "twice")
    assert poll(server, second)["status"] == "input_required"
    full = httpx.post(f"{server.url}/reasoners/approve/async", json={}, timeout=WAIT)
    assert full.status_code == 429
    assert redis_server.command("FLUSHALL") == b"+OK\r\n"

    def accepted() -> str | None:
        response = httpx.post(f"{server.url}/reasoners/approve/async", json={}, timeout=WAIT)
        return str(response.json()["execution_id"]) if response.status_code == 202 else None

    deadline = time.monotonic() + WAIT
    fresh = accepted()
    while fresh is None and time.monotonic() < deadline:
        time.sleep(0.1)
        fresh = accepted()
    assert fresh is not None, "the slots stayed taken by executions whose records vanished"
    # Both vanished tasks ended, each said once.
    log = server.stderr()
    for execution_id in (waiting, second):
        line = f"execution {execution_id}: its record vanished from Redis"
        assert log.count(line) == 1, log[-3000:]
    metrics = httpx.get(f"{server.url}/metrics", timeout=WAIT).text
    assert 'agent_server_executions_finished_total{reasoner="approve",status="lost"} 1.0' in metrics
    assert 'agent_server_executions_finished_total{reasoner="twice",status="lost"} 1.0' in metrics
    # The replica works on: the new one waits for input as usual and is answered.
    assert poll(server, fresh)["status"] == "input_required"
    taken = answer(server, fresh, {"value": {"approved": True}})
    assert taken.status_code == 202, taken.text
    assert ended(server, fresh)["status"] == "succeeded"
