"""What turns traces on, and the trace context kept with a record: the standard variables,
the derived span id of an attempt, the `traceparent` a webhook sends, and the log scope."""

from __future__ import annotations

import json
import logging

import pytest

from agent_server.model.execution import Execution
from agent_server.runtime.logs import LOG_EXECUTION, LOG_SPAN, JsonFormatter
from agent_server.runtime.tracing import Tracing, attempt_span_id, traceparent, tracing_from, wanted


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
    ],
)
def test_the_standard_variables_decide(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


def test_an_exporter_or_protocol_not_packaged_leaves_traces_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    for environ in (
        {"OTEL_TRACES_EXPORTER": "zipkin"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
    ):
        with caplog.at_level(logging.WARNING, logger="agent_server.tracing"):
            tracing = tracing_from(environ, "svc", "r1")
        assert type(tracing) is Tracing and not tracing.enabled
    assert len(caplog.records) == 2


def test_an_attempts_span_id_is_derived_and_named_by_traceparent() -> None:
    first, second = attempt_span_id("abc", 1), attempt_span_id("abc", 2)
    assert first != second and 0 < first < 2**64
    assert attempt_span_id("abc", 1) == first  # any replica derives the same
    trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert traceparent(trace, "abc", 2) == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{second:016x}-01"
    assert traceparent(None, "abc", 1) is None
    assert traceparent("not a traceparent", "abc", 1) is None


def test_a_line_in_an_executions_scope_carries_its_fields() -> None:
    execution = Execution("chatter", "s-1", "r1", attempt=2)
    record = logging.LogRecord("mine", logging.INFO, "", 0, "hello %s", ("you",), None)
    token, span = LOG_EXECUTION.set(execution), LOG_SPAN.set(("a" * 32, "b" * 16))
    try:
        line = json.loads(JsonFormatter().format(record))
    finally:
        LOG_EXECUTION.reset(token)
        LOG_SPAN.reset(span)
    assert line == {
        "timestamp": line["timestamp"],
        "level": "info",
        "logger": "mine",
        "message": "hello you",
        "execution_id": execution.execution_id,
        "reasoner": "chatter",
        "attempt": 2,
        "replica": "r1",
        "session_id": "s-1",
        "trace_id": "a" * 32,
        "span_id": "b" * 16,
    }
    assert "execution_id" not in json.loads(JsonFormatter().format(record))  # outside it
