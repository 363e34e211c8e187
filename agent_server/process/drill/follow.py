"""The executions a drill starts, and how each is read on through the shutdown until it
ends (long-polled, or through its event stream while it waits for input), bounded."""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, assert_never

import httpx

from agent_server.model.status import ExecutionStatus, parked
from agent_server.process.drill.plan import DrillError

#: Seconds a start (`POST /reasoners/{name}/async`) may take: a blocked loop answers late.
START_TIMEOUT = 10.0
#: Requests that follow one execution, at most: each must bring a change (a request that
#: brings none ends the following), so a drill where nobody answers takes two or three; the
#: bound holds whatever a server answers.
MAX_FOLLOW_REQUESTS = 10


@dataclass
class Started:
    """One execution the drill started, its record as last seen, and how it was followed."""

    reasoner: str
    execution_id: str
    record: dict[str, Any]
    requests: int = 0  # GETs that followed it (the start not counted)
    waited: bool = False  # seen waiting for input inside its task (`ctx.ask`, not parked)


async def start_all(
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


async def follow_one(http: httpx.AsyncClient, execution: Started, wait: float) -> None:
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
