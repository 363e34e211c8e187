"""Traces: OpenTelemetry spans for requests and attempts, on when the standard `OTEL_*`
variables ask for them, and free when they do not.

Off (the default), `Tracing` is a front that does nothing and imports nothing of
OpenTelemetry: each call site costs one attribute check (`tracing.enabled`). On
(`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
`OTEL_TRACES_EXPORTER` set, and `pip install 'agent-server[otel]'`), `OtelTracing` makes a
server span per request (named by its route template), and a span `execution {reasoner}`
per attempt, a child of the span of the request that started the execution.

The record keeps that request's span context (`Execution.trace`, a W3C `traceparent`), so
an attempt that runs elsewhere later (a hand-off, a retry after its owner died) joins the
same trace. Each attempt's span id is derived from the execution id and the attempt number
(`attempt_span_id`): the next attempt links to the previous one, and a webhook names the
span of the attempt that ended (`traceparent`), without the store writing anything per
attempt.

This module is the front (traces off, and what both sides derive); traces on are
`otel.py` (`tracing_from`, `OtelTracing`), the SDK's setup `otel_setup.py`, the attempts'
span ids `otel_ids.py`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Coroutine, Mapping
from typing import Any

from starlette.types import ASGIApp

from agent_server.model.events import Event
from agent_server.model.execution import Execution
from agent_server.store.base import Delivery

#: An attempt's task body.
Run = Coroutine[Any, Any, None]

#: The request headers that carry a caller's trace context (W3C trace context and baggage):
#: what the server span reads, and what a browser page may send (CORS).
TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate", "baggage")
TRACE_CONTEXT_KEYS = tuple(name.encode() for name in TRACE_CONTEXT_HEADERS)
#: A W3C trace context `traceparent` of version 00: trace id, parent span id, flags.
TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
#: Span events recorded per attempt for `ctx.emit` (the first ones; the rest are counted in
#: the span's `agent_server.events_dropped` attribute).
MAX_SPAN_EVENTS = 100
#: Exporters this package can configure from `OTEL_TRACES_EXPORTER`.
EXPORTERS = ("otlp", "console")
#: Attribute names of an attempt's span.
ATTRIBUTE_PREFIX = "agent_server."


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces: an OTLP endpoint, or an exporter named
    other than `none`; never with `OTEL_SDK_DISABLED=true`."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
        or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    )


def attempt_span_id(execution_id: str, attempt: int) -> int:
    """The span id of an attempt: 64 bits of a hash of the execution id and the attempt, so
    any replica names an earlier attempt's span without having stored it."""
    digest = hashlib.blake2b(f"{execution_id}/{attempt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def traceparent(trace: str | None, execution_id: str, attempt: int) -> str | None:
    """The `traceparent` header naming the span of an attempt, from the trace context its
    record keeps (`Execution.trace`, the Redis record's `trace` field); None when it keeps
    none (started with traces off). What a webhook about that attempt's end sends."""
    parsed = TRACEPARENT.fullmatch(trace or "")
    if parsed is None:
        return None
    span = attempt_span_id(execution_id, attempt)
    return f"00-{parsed[1]}-{span:016x}-{parsed[3]}"


def webhook_headers(delivery: Delivery) -> list[tuple[str, str]]:
    """A webhook's `traceparent`: the span of the attempt whose move it reports, so the
    receiver's work joins the execution's trace. Derived from what the delivery carries,
    whichever replica sends it and whether or not it traces itself."""
    header = traceparent(delivery.trace, str(delivery.data["execution_id"]), delivery.attempt)
    return [] if header is None else [("traceparent", header)]


class Tracing:
    """Traces off: every method does nothing. Call sites check `enabled` first where even a
    call would cost (the start of an execution, each emitted event)."""

    enabled = False

    def server(self, app: ASGIApp) -> ASGIApp:
        """`app` with a server span per request (off: `app` itself)."""
        return app

    def start_context(self) -> str | None:
        """The trace context a new execution's record keeps: the current request's span."""
        return None

    def attempt(self, execution: Execution, run: Run) -> Run:
        """`run` (an attempt's task body) inside the attempt's span."""
        return run

    def emitted(self, execution: Execution, event: Event) -> None:
        """An event of a running attempt, as an event of its span."""

    async def flush(self, deadline: float) -> None:
        """Export the spans ended so far, by `deadline` (monotonic)."""
