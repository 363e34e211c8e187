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
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import re
import threading
import time
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any, cast

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.events import Event
from agent_server.execution import Execution, ExecutionStatus, log_fields
from agent_server.logs import LOG_SPAN, StatusSend
from agent_server.store.base import Delivery

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span

logger = logging.getLogger("agent_server.tracing")

#: An attempt's task body.
Run = Coroutine[Any, Any, None]

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


def tracing_from(environ: Mapping[str, str], service: str, replica: str) -> Tracing:
    """Tracing as the environment asks: off unless `wanted`; off with a warning when the
    SDK is not installed or the exporter is not one this package configures."""
    if not wanted(environ):
        return Tracing()
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    if exporter not in EXPORTERS:
        logger.warning(
            "OTEL_TRACES_EXPORTER=%s is not one of %s: traces are off", exporter, EXPORTERS
        )
        return Tracing()
    protocol = environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    if exporter == "otlp" and protocol.strip() not in ("", "http/protobuf"):
        logger.warning(
            "OTLP protocol %r: only http/protobuf is packaged (agent-server[otel]): traces are off",
            protocol,
        )
        return Tracing()
    try:
        return OtelTracing(service, replica, exporter)
    except ImportError as exc:
        logger.warning(
            "traces asked for (OTEL_*) but OpenTelemetry is not installed (%s): traces are off; "
            "pip install 'agent-server[otel]'",
            exc,
        )
        return Tracing()


class OtelTracing(Tracing):
    """Traces on, through the OpenTelemetry SDK: a batch processor and the exporter the
    `OTEL_*` variables configure (the SDK reads them: endpoint, headers, timeout, batch
    delay, sampler, resource attributes)."""

    enabled = True

    def __init__(self, service: str, replica: str, exporter: str) -> None:
        from opentelemetry import context, propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

        made: SpanExporter
        if exporter == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            made = ConsoleSpanExporter()
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            made = OTLPSpanExporter()
        resource = Resource.create()
        own: dict[str, str] = {"service.instance.id": replica}
        if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
            own["service.name"] = service  # OTEL_SERVICE_NAME, if set, names it instead
        self._ids = _AttemptIds()
        # Not shut down at the interpreter's exit (its exporter's timeout could outlast the
        # watchdog): the shutdown sequence flushes it within its budget (`flush`).
        self.provider: TracerProvider = TracerProvider(
            resource=resource.merge(Resource(own)),
            id_generator=cast("IdGenerator", self._ids),  # its interface, without its import
            shutdown_on_exit=False,
        )
        self.provider.add_span_processor(BatchSpanProcessor(made))
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            # The reasoners' own `trace.get_tracer(...)` spans go the same way (once per
            # process: the API keeps one global provider).
            trace.set_tracer_provider(self.provider)
        self.tracer = self.provider.get_tracer("agent_server")
        self.replica = replica
        self._trace = trace
        self._context = context
        self._propagate = propagate
        #: The span of each attempt running here, by execution id (for its events).
        self._attempts: dict[str, _Attempt] = {}

    def server(self, app: ASGIApp) -> ASGIApp:
        return _ServerSpans(app, self)

    def start_context(self) -> str | None:
        span = self._trace.get_current_span().get_span_context()
        if not span.is_valid:
            return None
        return f"00-{span.trace_id:032x}-{span.span_id:016x}-{int(span.trace_flags):02x}"

    def attempt(self, execution: Execution, run: Run) -> Run:
        return self._run_attempt(execution, run)

    async def _run_attempt(self, execution: Execution, run: Run) -> None:
        """Runs in the attempt's own task: its span is current there (and in the threads of a
        `def` reasoner, which get a copy of the task's context), so the reasoner's own spans
        nest under it, and its log lines carry the span's ids."""
        trace = self._trace
        parent = self._context.Context()
        links = []
        stored = TRACEPARENT.fullmatch(execution.trace or "")
        if stored is not None:
            trace_id, flags = int(stored[1], 16), trace.TraceFlags(int(stored[3], 16))
            start = trace.SpanContext(trace_id, int(stored[2], 16), True, flags)
            parent = trace.set_span_in_context(trace.NonRecordingSpan(start))
            if execution.attempt > 1:
                earlier = attempt_span_id(execution.execution_id, execution.attempt - 1)
                previous = trace.SpanContext(trace_id, earlier, True, flags)
                links.append(trace.Link(previous, {"agent_server.link": "previous_attempt"}))
        # The same fields as its log lines carry, under the project's attribute prefix.
        attributes = {f"agent_server.{k}": v for k, v in log_fields(execution).items()}
        with self._ids.preset(attempt_span_id(execution.execution_id, execution.attempt)):
            span = self.tracer.start_span(
                f"execution {execution.reasoner}",
                context=parent,
                links=links,
                attributes=attributes,
            )
        token = self._context.attach(trace.set_span_in_context(span))
        _scope_ids(span)
        attempt = _Attempt(span)
        self._attempts[execution.execution_id] = attempt
        try:
            await run
        finally:
            if self._attempts.get(execution.execution_id) is attempt:
                del self._attempts[execution.execution_id]
            self._end(span, execution, attempt.dropped)
            self._context.detach(token)

    def _end(self, span: Span, execution: Execution, dropped: int) -> None:
        status = execution.status
        span.set_attribute("agent_server.status", status.value)
        if execution.status_reason is not None:
            span.set_attribute("agent_server.status_reason", execution.status_reason.value)
        if dropped:
            span.set_attribute("agent_server.events_dropped", dropped)
        if status is ExecutionStatus.FAILED:
            error = execution.error or {}
            span.set_status(
                self._trace.Status(
                    self._trace.StatusCode.ERROR,
                    f"{error.get('type', 'error')}: {error.get('message', '')}"[:512],
                )
            )
        span.end()

    def emitted(self, execution: Execution, event: Event) -> None:
        attempt = self._attempts.get(execution.execution_id)
        if attempt is None:
            return
        if attempt.events >= MAX_SPAN_EVENTS:
            attempt.dropped += 1
            return
        attempt.events += 1
        attempt.span.add_event(event.event, {"agent_server.event_id": event.id})

    async def flush(self, deadline: float) -> None:
        """The SDK's flush blocks: it runs in a daemon thread of its own (never the loop's
        default executor, which `asyncio.run` would wait for), awaited until `deadline`."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()

        def flushing() -> None:
            flushed = self.provider.force_flush(max(1, int(remaining * 1000)))
            loop.call_soon_threadsafe(_resolve, done, flushed)

        began = time.monotonic()
        threading.Thread(target=flushing, name="span-flush", daemon=True).start()
        try:
            flushed = await asyncio.wait_for(asyncio.shield(done), remaining)
        except TimeoutError:
            flushed = False
        if not flushed:
            logger.warning(
                "spans not all exported within the shutdown budget (%.3fs)",
                time.monotonic() - began,
            )


class _Attempt:
    """The span of one running attempt, and how many of its events it recorded."""

    __slots__ = ("dropped", "events", "span")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.events = 0
        self.dropped = 0


def _resolve(future: asyncio.Future[bool], value: bool) -> None:
    if not future.done():
        future.set_result(value)


def _scope_ids(span: Span) -> None:
    """The lines this task logs from now on name `span` (agent_server.logs)."""
    context = span.get_span_context()
    LOG_SPAN.set((f"{context.trace_id:032x}", f"{context.span_id:016x}"))


def _id_generator_base() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    return RandomIdGenerator


class _AttemptIds:
    """The SDK's random ids, except the span id of an attempt, given just before its span
    starts (in a context variable: other threads' spans are not affected)."""

    def __init__(self) -> None:
        self._random = _id_generator_base()()
        self._next: contextvars.ContextVar[int] = contextvars.ContextVar(
            "agent_server_next_span_id", default=0
        )

    def preset(self, span_id: int) -> _Preset:
        return _Preset(self._next, span_id)

    def generate_span_id(self) -> int:
        preset = self._next.get()
        if preset:
            self._next.set(0)
            return preset
        return int(self._random.generate_span_id())

    def generate_trace_id(self) -> int:
        return int(self._random.generate_trace_id())

    def is_trace_id_random(self) -> bool:
        return True


class _Preset:
    """`with ids.preset(span_id):` the next span started in this context gets `span_id`."""

    __slots__ = ("_token", "_var", "span_id")

    def __init__(self, var: contextvars.ContextVar[int], span_id: int) -> None:
        self._var = var
        self.span_id = span_id
        self._token: contextvars.Token[int] | None = None

    def __enter__(self) -> None:
        self._token = self._var.set(self.span_id)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            self._var.reset(self._token)


class _ServerSpans:
    """ASGI middleware: one SERVER span per HTTP request, a child of the request's
    `traceparent` (W3C, through the configured propagators), named `METHOD /route/{template}`
    once the router has matched it; current while the request runs, so the start of an
    execution records it and the access line carries its ids."""

    def __init__(self, app: ASGIApp, tracing: OtelTracing) -> None:
        self.app = app
        self.tracing = tracing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        tracing = self.tracing
        trace = tracing._trace
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in scope.get("headers", ())
            if name in (b"traceparent", b"tracestate", b"baggage")
        }
        parent = tracing._propagate.extract(carrier)
        method = scope["method"]
        span = tracing.tracer.start_span(
            method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        )
        token = tracing._context.attach(trace.set_span_in_context(span, parent))
        _scope_ids(span)
        answer = StatusSend(send)
        try:
            await self.app(scope, receive, answer)
        finally:
            route = getattr(scope.get("route"), "path", None)
            if route:
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            status = answer.status or 500
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.end()
            tracing._context.detach(token)
