"""A start whose record a shared store has not confirmed when the listener closes: the close
cancels the request's own task while it waits (no task of its own races the close), and the
request answers 503 + Location; only the close's cancellation is taken back, never the
server's or the client's, and a start that ends on its own despite the close is answered
with its result. The request task is left with no cancellation pending either way."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from agent_server.http.routing import refusal_error
from agent_server.model.execution import Execution
from agent_server.model.waiting import Closing
from agent_server.service.refusals import Refusal, Why
from agent_server.service.starts import Starts

SCOPE: dict[str, Any] = {"root_path": "/agent"}


def _starts() -> tuple[Starts, Closing]:
    """Starts whose only part `answered_before_close` reads: the listener's close."""
    starts = Starts.__new__(Starts)
    starts.closing = Closing()
    return starts, starts.closing


async def _held(execution: Execution, announced: list[Execution], go: asyncio.Event) -> Any:
    """A start announced at once whose store write is held until `go` (a paused Redis)."""
    announced.append(execution)
    await go.wait()
    return execution, True


async def test_the_close_answers_a_start_still_unconfirmed_with_where_to_read_it() -> None:
    runs, closing = _starts()
    execution, announced, go = Execution("echo", None, "A"), [], asyncio.Event()
    waiting = asyncio.ensure_future(
        runs.answered_before_close(_held(execution, announced, go), announced)
    )
    await asyncio.sleep(0)
    closing.set()
    with pytest.raises(Refusal) as raised:
        await waiting
    assert raised.value.why is Why.SHUTTING_DOWN
    assert raised.value.execution_id == execution.execution_id
    answered = refusal_error(SCOPE, raised.value)  # as REST answers it
    assert answered.status_code == 503
    assert answered.headers is not None
    assert answered.headers["Location"] == f"/agent/executions/{execution.execution_id}"
    assert answered.headers["Connection"] == "close"
    assert answered.extra == {"execution_id": execution.execution_id, "in_doubt": True}
    assert not waiting.cancelled() and waiting.cancelling() == 0
    assert not closing.waiters  # nothing of the request is left with the close


async def test_a_start_that_ends_on_its_own_despite_the_close_is_answered() -> None:
    runs, closing = _starts()
    execution, announced = Execution("echo", None, "A"), []

    async def stubborn() -> Any:
        announced.append(execution)
        with contextlib.suppress(asyncio.CancelledError):  # its write was answered, say
            await asyncio.sleep(10)
        return execution, True

    async def request() -> tuple[Any, int]:
        started = await runs.answered_before_close(stubborn(), announced)
        task = asyncio.current_task()
        assert task is not None
        return started, task.cancelling()

    waiting = asyncio.ensure_future(request())
    await asyncio.sleep(0)
    closing.set()
    started, cancelling = await asyncio.wait_for(waiting, 5)
    assert started == (execution, True) and cancelling == 0


@pytest.mark.parametrize("with_close", [False, True])
async def test_the_server_s_cancellation_is_never_taken_for_the_close_s(with_close: bool) -> None:
    runs, closing = _starts()
    execution, announced, go = Execution("echo", None, "A"), [], asyncio.Event()
    waiting = asyncio.ensure_future(
        runs.answered_before_close(_held(execution, announced, go), announced)
    )
    await asyncio.sleep(0)
    if with_close:
        closing.set()
        await asyncio.sleep(0)  # the close's cancellation is delivered first
    waiting.cancel()  # uvicorn's --timeout-graceful-shutdown, or the request's own end
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert waiting.cancelled()
    assert not closing.waiters


async def test_a_start_after_the_close_never_begins() -> None:
    runs, closing = _starts()
    closing.set()
    began: list[bool] = []

    async def start() -> Any:
        began.append(True)
        return None, True

    with pytest.raises(Refusal) as raised:
        await runs.answered_before_close(start(), [])
    assert raised.value.why is Why.SHUTTING_DOWN and began == []
    assert refusal_error(SCOPE, raised.value).status_code == 503
