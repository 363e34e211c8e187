"""`GET /executions/{id}/history`: the moves that neither made nor ended an execution, on
every store (docs/console.md, "An execution").

The invariants: every store records the same moves for the same life, each naming the
attempt it begins (to `running`) or leaves (any other) and its replica, in time order within
the record's own start and end; the last status.py KEPT_MOVES are kept, whatever the store;
an execution run once, start to end, keeps none; it is read as the record is (a 404 for an
unknown id). A real `agent-server run scheduling_app:agent` per store (test_scheduling.py's
servers), driven by httpx.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import httpx

from agent_server.model.status import KEPT_MOVES
from tests.process.test_scheduling import WAIT, Served, redis_for_module, served

__all__ = ["redis_for_module", "served"]


def history(served: Served, execution_id: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{served.url}/executions/{execution_id}/history", timeout=WAIT)
    assert response.status_code == 200, response.text
    moves: list[dict[str, Any]] = response.json()
    return moves


def when(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def assert_framed(record: dict[str, Any], moves: list[dict[str, Any]]) -> None:
    """In time order, within the record's start and end; each names its replica (but a
    move from `parked`: nobody owns a parked record)."""
    times = [when(move["at"]) for move in moves]
    assert times == sorted(times), moves
    assert when(record["created_at"]) - 0.01 <= times[0], (record, moves)
    assert times[-1] <= when(record["finished_at"]) + 0.01, (record, moves)
    for move in moves:
        assert move["replica"] or move["from"] == "parked", move
        assert set(move) == {"at", "move", "from", "to", "attempt", "replica", "version"}, move
        if move["to"] == "running":
            assert move["version"] is None, move


def test_an_execution_run_once_keeps_no_moves_and_an_unknown_one_is_404(served: Served) -> None:
    execution_id = served.start("stamp")["execution_id"]
    assert served.ended(execution_id)["status"] == "succeeded"
    assert history(served, execution_id) == []
    unknown = httpx.get(f"{served.url}/executions/{'0' * 32}/history", timeout=WAIT)
    assert unknown.status_code == 404, unknown.text
    assert unknown.json()["detail"]


def test_each_retry_leaves_its_attempt_and_each_claim_begins_the_next(served: Served) -> None:
    execution_id = served.start("flaky")["execution_id"]
    record = served.ended(execution_id)
    assert (record["status"], record["attempt"]) == ("succeeded", 3), record
    moves = history(served, execution_id)
    assert [(m["move"], m["from"], m["to"], m["attempt"]) for m in moves] == [
        ("retry", "running", "queued", 1),
        ("claim", "queued", "running", 2),
        ("retry", "running", "queued", 2),
        ("claim", "queued", "running", 3),
    ], moves
    assert moves[-1]["replica"] == record["replica"]
    assert_framed(record, moves)
    # Each retry waits its backoff: 0.2 s, then 0.4 s, from the attempt it leaves.
    assert when(moves[1]["at"]) - when(moves[0]["at"]) >= 0.15, moves
    assert when(moves[3]["at"]) - when(moves[2]["at"]) >= 0.35, moves


def test_a_history_keeps_the_last_moves_on_every_store(served: Served) -> None:
    execution_id = served.start("persistent")["execution_id"]
    record = served.ended(execution_id)
    assert (record["status"], record["attempt"]) == ("succeeded", 27), record
    moves = history(served, execution_id)
    # 26 retries and 26 claims: 52 moves, of which the last KEPT_MOVES.
    every = [
        pair
        for attempt in range(1, 27)
        for pair in (
            ("retry", "running", "queued", attempt),
            ("claim", "queued", "running", attempt + 1),
        )
    ]
    assert len(every) > KEPT_MOVES
    shown = [(m["move"], m["from"], m["to"], m["attempt"]) for m in moves]
    assert shown == every[-KEPT_MOVES:]
    assert_framed(record, moves)


def test_an_ask_and_its_answer_are_moves_of_one_attempt(served: Served) -> None:
    execution_id = served.start("patient")["execution_id"]
    waiting = httpx.get(
        f"{served.url}/executions/{execution_id}", params={"wait": WAIT}, timeout=WAIT + 5
    ).json()
    assert waiting["status"] == "input_required", waiting
    answered = httpx.post(
        f"{served.url}/executions/{execution_id}/input", json={"value": "yes"}, timeout=WAIT
    )
    assert answered.status_code == 202, answered.text
    record = served.ended(execution_id)
    moves = history(served, execution_id)
    assert [(m["move"], m["from"], m["to"], m["attempt"]) for m in moves] == [
        ("ask", "running", "input_required", 1),
        ("resume", "input_required", "running", 1),
    ], moves
    assert_framed(record, moves)


def test_a_parked_execution_shows_its_park_and_its_answer(served: Served) -> None:
    """On a shared store a resumable ask ends its task: `parked`, then queued by its answer
    for any replica to claim; on the memory store its task waits (`input_required`)."""
    execution_id = served.start("parks")["execution_id"]
    deadline = time.monotonic() + WAIT
    while True:  # bounded: the record says when it waits
        waiting = httpx.get(
            f"{served.url}/executions/{execution_id}", params={"wait": 5}, timeout=10
        ).json()
        if waiting["status"] == "input_required":
            break
        assert time.monotonic() < deadline, waiting
    answered = httpx.post(
        f"{served.url}/executions/{execution_id}/input", json={"value": 7}, timeout=WAIT
    )
    assert answered.status_code == 202, answered.text
    record = served.ended(execution_id)
    assert (record["status"], record["result"]) == ("succeeded", 7), record
    moves = [(m["move"], m["from"], m["to"]) for m in history(served, execution_id)]
    assert moves in (
        [("ask", "running", "input_required"), ("resume", "input_required", "running")],
        [
            ("park", "running", "parked"),
            ("answer", "parked", "queued"),
            ("claim", "queued", "running"),
        ],
    ), moves
    assert_framed(record, history(served, execution_id))
