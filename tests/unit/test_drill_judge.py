"""How `agent-server drill` reads each execution on and judges where it ended: every status
of the one enum (agent_server/model/status.py) has a way to be followed and a verdict on either
store, and following is bounded whatever a server answers."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from agent_server.model.status import TERMINAL, ExecutionStatus
from agent_server.process.drill import (
    MAX_FOLLOW_REQUESTS,
    Follow,
    Outcome,
    Started,
    follow_by,
    follow_one,
    outcome,
    status_of,
)

S = ExecutionStatus


@pytest.mark.parametrize("status", list(ExecutionStatus))
def test_every_status_is_followed_and_only_the_terminal_ones_are_done(
    status: ExecutionStatus,
) -> None:
    assert (follow_by(status) is Follow.DONE) == (status in TERMINAL)
    assert status_of({"status": status.value}) is status
    for shared in (False, True):
        for replica in ("", "r-1"):
            for handed_off in (False, True):
                record = {"status": status.value, "replica": replica}
                assert isinstance(outcome(status, record, shared, handed_off), Outcome)


def test_a_status_the_drill_does_not_know_is_unended() -> None:
    assert status_of({"status": "dormant"}) is None
    assert status_of({}) is None
    assert outcome(None, {"status": "dormant"}, False, False) is Outcome.UNENDED


@pytest.mark.parametrize(
    ("status", "replica", "handed_off", "memory", "shared"),
    [
        (S.QUEUED, "", False, Outcome.STRANDED, Outcome.LEFT_QUEUED),
        (S.QUEUED, "r-1", True, Outcome.STRANDED, Outcome.HANDED_OFF),
        (S.CANCELLED, "", False, Outcome.UNRUN, Outcome.UNRUN),
        (S.CANCELLED, "r-1", False, Outcome.ENDED, Outcome.ENDED),
        (S.INPUT_REQUIRED, "", False, Outcome.UNENDED, Outcome.PARKED),
        (S.INPUT_REQUIRED, "r-1", False, Outcome.UNENDED, Outcome.UNENDED),
        (S.RUNNING, "r-1", False, Outcome.UNENDED, Outcome.UNENDED),
        (S.LOST, "r-1", False, Outcome.LOST, Outcome.LOST),
        (S.SUCCEEDED, "r-1", False, Outcome.ENDED, Outcome.ENDED),
    ],
)
def test_the_queue_and_a_wait_for_input_are_judged_by_the_stores_kind(
    status: ExecutionStatus, replica: str, handed_off: bool, memory: Outcome, shared: Outcome
) -> None:
    """Memory: queued work ends cancelled unrun at shutdown (still queued is stranded), a
    wait for input is running work. Shared: queued waits for another replica, a wait with
    no owner is parked."""
    record = {"status": status.value, "replica": replica}
    assert outcome(status, record, False, handed_off) is memory
    assert outcome(status, record, True, handed_off) is shared


def _record(status: str, attempt: int = 1, replica: str = "r-1") -> dict[str, Any]:
    return {"execution_id": "e1", "status": status, "attempt": attempt, "replica": replica}


async def _followed(handler: Any, first: dict[str, Any]) -> tuple[Started, list[str]]:
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(
            request.url.path + ("?" + request.url.query.decode() if request.url.query else "")
        )
        response: httpx.Response = handler(request, len(seen))
        return response

    started = Started("r", "e1", first)
    transport = httpx.MockTransport(answer)
    async with httpx.AsyncClient(transport=transport, base_url="http://drill") as http:
        await follow_one(http, started, 1.0)
    assert started.requests == len(seen)
    return started, seen


def _events(*lines: str) -> httpx.Response:
    body = "".join(line + "\n" for line in lines)
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


async def test_a_wait_for_input_is_followed_through_its_event_stream_to_its_end() -> None:
    ended = {**_record("cancelled"), "status_reason": "shutdown"}

    def server(request: httpx.Request, n: int) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return _events(
                "event: input_required", 'data: {"request_id": 1}', "",
                ": heartbeat", "",
                "event: end", "data: " + json.dumps(ended), "",
            )  # fmt: skip
        return httpx.Response(200, json=_record("input_required"))

    started, seen = await _followed(server, _record("running"))
    assert seen == ["/executions/e1?wait=1", "/executions/e1/events"]
    assert started.record == ended and started.waited


async def test_a_stream_that_ends_without_an_end_stops_the_following() -> None:
    """A parked wait (or the listener's close): one stream, then the record as last seen."""

    def server(request: httpx.Request, n: int) -> httpx.Response:
        if request.url.path.endswith("/events"):
            return _events("retry: 1000", "")
        return httpx.Response(200, json=_record("input_required", replica=""))

    started, seen = await _followed(server, _record("queued", replica=""))
    assert len(seen) == 2
    assert started.record["status"] == "input_required" and not started.waited


@pytest.mark.parametrize("via", ["long-poll", "events"])
async def test_following_is_bounded_whatever_the_server_answers(via: str) -> None:
    """A server that answers at once, with a change every time, never settles: the drill
    stops after MAX_FOLLOW_REQUESTS, with the record as last seen."""

    def server(request: httpx.Request, n: int) -> httpx.Response:
        status = "running" if via == "long-poll" else "input_required"
        changed = _record(status, attempt=n + 1)
        if request.url.path.endswith("/events"):
            return _events("event: end", "data: " + json.dumps(changed), "")
        return httpx.Response(200, json=changed)

    started, seen = await _followed(server, _record("queued"))
    assert len(seen) == MAX_FOLLOW_REQUESTS
    assert started.record["attempt"] == MAX_FOLLOW_REQUESTS + 1


async def test_a_long_poll_that_brings_no_change_stops_the_following() -> None:
    """The listener closed (or the wait ran out): the record as it is, no second poll."""

    def server(request: httpx.Request, n: int) -> httpx.Response:
        return httpx.Response(200, json=_record("running"), headers={"Connection": "close"})

    started, seen = await _followed(server, _record("running"))
    assert seen == ["/executions/e1?wait=1"]
    assert started.record["status"] == "running"
