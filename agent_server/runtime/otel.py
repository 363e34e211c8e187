"""Traces on: `OtelTracing`, through the OpenTelemetry SDK (imported only here, and only
when the `OTEL_*` variables ask for traces: `tracing_from`), with a server span per request
(`_ServerSpans`) and a span per attempt."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus, log_fields
from agent_server.runtime.logs import LOG_PRINCIPAL, LOG_SPAN, StatusSend
from agent_server.runtime.otel_ids import AttemptIds
from agent_server.runtime.otel_setup import (
    BATCH,
    DEFAULT_BATCH,
    DEFAULT_LIMITS,
    EXPORTER,
    LIMITS,
    PROPAGATORS,
    RESOURCE,
    SAMPLER,
    SDK,
    Off,
    Setup,
    configured_propagator,
    default_propagator,
    span_exporter,
)
from agent_server.runtime.tracing import (
    EXPORTERS,
    MAX_SPAN_EVENTS,
    TRACE_CONTEXT_KEYS,
    TRACEPARENT,
    Run,
    Tracing,
    attempt_span_id,
    wanted,
)

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span

logger = logging.getLogger("agent_server.tracing")


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
    setup = Setup(environ)
    try:
        return setup.part(SDK, lambda: OtelTracing(service, replica, exporter, setup), Tracing)
    except Off:  # said why, once
        return Tracing()
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
    delay, sampler, resource attributes). Each part is built through `Setup`: a value the
    SDK refuses or complains of is one warning naming its variable, and that part runs
    with its defaults (traces off only when no exporter can be built)."""

    enabled = True

    def __init__(self, service: str, replica: str, exporter: str, setup: Setup) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import DEFAULT_ON

        made = setup.part(EXPORTER, lambda: span_exporter(exporter), lambda: None)
        if made is None:
            raise Off
        propagator = setup.part(PROPAGATORS, configured_propagator, default_propagator)
        resource = setup.part(RESOURCE, Resource.create, lambda: Resource({}))
        own: dict[str, str] = {"service.instance.id": replica}
        if str(resource.attributes.get("service.name", "unknown_service")).startswith(
            "unknown_service"
        ):
            own["service.name"] = service  # OTEL_SERVICE_NAME, if set, names it instead
        limits = setup.part(LIMITS, SpanLimits, lambda: SpanLimits(**DEFAULT_LIMITS))
        self._ids = AttemptIds()

        def provider(sampler: Any = None) -> TracerProvider:
            # Not shut down at the interpreter's exit (its exporter's timeout could outlast
            # the watchdog): the shutdown sequence flushes it within its budget (`flush`).
            return TracerProvider(
                sampler=sampler,  # None: the SDK's, from OTEL_TRACES_SAMPLER
                resource=resource.merge(Resource(own)),
                id_generator=cast("IdGenerator", self._ids),  # its interface, not its import
                span_limits=limits,
                shutdown_on_exit=False,
            )

        self.provider: TracerProvider = setup.part(SAMPLER, provider, lambda: provider(DEFAULT_ON))
        self.provider.add_span_processor(
            setup.part(
                BATCH,
                lambda: BatchSpanProcessor(made),
                lambda: BatchSpanProcessor(made, **DEFAULT_BATCH),
            )
        )
        if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
            # The reasoners' own `trace.get_tracer(...)` spans go the same way (once per
            # process: the API keeps one global provider).
            trace.set_tracer_provider(self.provider)
        self.tracer = self.provider.get_tracer("agent_server")
        self.replica = replica
        self._trace = trace
        self._context = context
        self._propagator = propagator
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
    """The lines this task logs from now on name `span` (agent_server.runtime.logs)."""
    context = span.get_span_context()
    LOG_SPAN.set((f"{context.trace_id:032x}", f"{context.span_id:016x}"))


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
            if name in TRACE_CONTEXT_KEYS
        }
        parent = tracing._propagator.extract(carrier)
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
            who = LOG_PRINCIPAL.get()  # set in this task by authentication, as for logs
            if who is not None:
                span.set_attribute("agent_server.identity", who[0])
                span.set_attribute("agent_server.tenant", who[1])
            status = answer.status or 500
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.end()
            tracing._context.detach(token)
