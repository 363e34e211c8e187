"""The execution record is declared once (agent_server/model/record.py): its JSON, its schema and
what a synchronous run answers follow that declaration and the state table."""

from __future__ import annotations

import jsonschema
import pytest

from agent_server.http.openapi import EXECUTION_SCHEMA
from agent_server.http.runs import SYNC_ANSWER
from agent_server.model import record
from agent_server.model.execution import Execution
from agent_server.model.status import TERMINAL, CancelReason, ExecutionStatus


def _executions() -> list[Execution]:
    running = Execution("echo", "s-1", replica="r-1")
    succeeded = Execution("echo", None, replica="r-1")
    succeeded.finish(ExecutionStatus.SUCCEEDED, result={"text": "hi"})
    failed = Execution("echo", None, replica="r-1")
    failed.finish(ExecutionStatus.FAILED, error={"type": "ValueError", "message": "no"})
    cancelled = Execution("echo", None, replica="r-1")
    cancelled.finish(ExecutionStatus.CANCELLED, reason=CancelReason.SHUTDOWN)
    queued = Execution("echo", None, replica="r-1", attempt=2)
    queued.mark_queued()
    lost = Execution.restore(
        execution_id="f" * 32, reasoner="echo", session_id=None, replica="r-2", attempt=1,
        status=ExecutionStatus.LOST, created_at=1.5, finished_at=2.25, duration_seconds=0.75,
    )  # fmt: skip
    return [running, succeeded, failed, cancelled, queued, lost]


@pytest.mark.parametrize("execution", _executions(), ids=lambda e: e.status.value)
def test_the_json_is_the_declared_fields_in_order_and_fits_the_schema(
    execution: Execution,
) -> None:
    body = execution.to_json()
    assert tuple(body) == record.JSON_FIELDS
    jsonschema.validate(body, EXECUTION_SCHEMA, format_checker=jsonschema.FormatChecker())


def test_the_schema_is_made_from_the_declaration() -> None:
    assert EXECUTION_SCHEMA["required"] == list(record.JSON_FIELDS)
    assert set(EXECUTION_SCHEMA["properties"]) == set(record.JSON_FIELDS)
    assert "abandoned" not in record.JSON_FIELDS  # kept by the store, not shown
    assert EXECUTION_SCHEMA["properties"]["status"]["enum"] == [s.value for s in ExecutionStatus]


def test_a_queued_execution_names_no_replica_and_times_are_rfc3339() -> None:
    queued = _executions()[4]
    assert queued.to_json()["replica"] == ""
    lost = _executions()[5].to_json()
    assert lost["created_at"] == "1970-01-01T00:00:01.500000Z"
    assert lost["finished_at"] == "1970-01-01T00:00:02.250000Z"


def test_a_synchronous_run_has_an_answer_for_every_status_it_can_end_in() -> None:
    assert set(SYNC_ANSWER) == TERMINAL | {ExecutionStatus.QUEUED, ExecutionStatus.INPUT_REQUIRED}
    assert SYNC_ANSWER[ExecutionStatus.INPUT_REQUIRED] == 202
    assert SYNC_ANSWER[ExecutionStatus.SUCCEEDED] == 200
    assert SYNC_ANSWER[ExecutionStatus.FAILED] == 500


def test_the_client_reads_every_declared_field_back() -> None:
    """The client's model has the record's fields (agent_server/model/record.py) and reads each."""
    from agent_server.client import Execution as ClientExecution

    server_side = _executions()[3].to_json()
    read = ClientExecution.from_json(server_side)
    assert {name: getattr(read, name) for name in record.JSON_FIELDS} == server_side
