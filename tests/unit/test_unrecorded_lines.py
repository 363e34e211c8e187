"""The report names every end not written to the store, and still comes before the
watchdog: a line each while there is time, then one line with the ids of the rest (at
100,000 in flight on a slow Redis, a line each took longer than the watchdog left)."""

from __future__ import annotations

import json
import logging
import time

import pytest

from agent_server.model.execution import Execution, ExecutionStatus
from agent_server.runtime.shutdown import name_unrecorded


def _ended(count: int) -> list[Execution]:
    executions = [Execution("echo", None, "A") for _ in range(count)]
    for execution in executions:
        execution.finish(ExecutionStatus.SUCCEEDED, result="secret-sized result")
    return executions


def test_a_line_each_while_there_is_time(caplog: pytest.LogCaptureFixture) -> None:
    executions = _ended(300)
    with caplog.at_level(logging.ERROR, logger="agent_server.shutdown"):
        name_unrecorded(executions, time.monotonic() + 60)
    lines = [r for r in caplog.records if r.getMessage().startswith("end not written")]
    assert [r.unrecorded_execution["execution_id"] for r in lines] == [  # type: ignore[attr-defined]
        e.execution_id for e in executions
    ]
    assert all("result" not in r.unrecorded_execution for r in lines)  # type: ignore[attr-defined]
    assert len(caplog.records) == 300


def test_past_the_deadline_the_rest_in_one_line_with_their_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A deadline that passes while the lines are written: the ones after it are named in
    one line, none left out, none named twice, in a bounded time."""
    executions = _ended(50_000)
    began = time.monotonic()
    with caplog.at_level(logging.ERROR, logger="agent_server.shutdown"):
        name_unrecorded(executions, began + 0.1)
    took = time.monotonic() - began
    each = [
        r.unrecorded_execution["execution_id"]  # type: ignore[attr-defined]
        for r in caplog.records
        if r.getMessage().startswith("end not written")
    ]
    (summary,) = [r for r in caplog.records if r.getMessage().startswith("ends not written")]
    rest = summary.unrecorded_ids  # type: ignore[attr-defined]
    assert 0 < len(rest) < len(executions)
    assert each + rest == [e.execution_id for e in executions]
    assert json.loads(summary.getMessage().split(": ", 1)[1]) == rest
    assert took < 0.1 + 1.0, took


def test_the_lines_leave_what_follows_the_report_its_time() -> None:
    """After the flush's deadline the lines get the http phase's first half at most: the
    listener's close, open responses and the exit keep the rest and the exit reserve."""
    from agent_server.runtime.shutdown import EXIT_RESERVE, FLUSH_AT_LEAST, ShutdownPlan

    plan = ShutdownPlan(
        unready_delay=0, drain_timeout=2, cancel_timeout=1, http_timeout=1, grace_period=10
    )
    t0 = 1000.0
    lines = plan.lines_deadline(t0)
    assert plan.flush_deadline(t0, t0 + 3) < lines
    assert lines == plan.hard_end(t0) - EXIT_RESERVE - FLUSH_AT_LEAST
    long_http = ShutdownPlan(
        unready_delay=0, drain_timeout=2, cancel_timeout=1, http_timeout=4, grace_period=10
    )
    assert long_http.lines_deadline(t0) == long_http.hard_end(t0) - EXIT_RESERVE - 2
