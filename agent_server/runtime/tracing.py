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
from collections.abc import Callable, Coroutine, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

from starlette.types import ASGIApp, Receive, Scope, Send

from agent_server.model.events import Event
from agent_server.model.execution import Execution, ExecutionStatus, log_fields
from agent_server.runtime.logs import LOG_SPAN, StatusSend
from agent_server.store.base import Delivery

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.id_generator import IdGenerator
    from opentelemetry.trace import Span

logger = logging.getLogger("agent_server.tracing")

#: An attempt's task body.
Run = Coroutine[Any, Any, None]
T = TypeVar("T")

#: The request headers that carry a caller's trace context (W3C trace context and baggage):
#: what the server span reads, and what a browser page may send (CORS).
TRACE_CONTEXT_HEADERS = ("traceparent", "tracestate", "baggage")
_TRACE_CONTEXT_KEYS = tuple(name.encode() for name in TRACE_CONTEXT_HEADERS)
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
    setup = _Setup(environ)
    try:
        return setup.part(_SDK, lambda: OtelTracing(service, replica, exporter, setup), Tracing)
    except _Off:  # said why, once
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
    delay, sampler, resource attributes). Each part is built through `_Setup`: a value the
    SDK refuses or complains of is one warning naming its variable, and that part runs
    with its defaults (traces off only when no exporter can be built)."""

    enabled = True

    def __init__(self, service: str, replica: str, exporter: str, setup: _Setup) -> None:
        from opentelemetry import context, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import DEFAULT_ON

        made = setup.part(_EXPORTER, lambda: _exporter(exporter), lambda: None)
        if made is None:
            raise _Off
        propagator = setup.part(_PROPAGATORS, _configured_propagator, _default_propagator)
        resource = setup.part(_RESOURCE, Resource.create, lambda: Resource({}))
        own: dict[str, str] = {"service.instance.id": replica}
        if str(resource.attributes.get("service.name", "unknown_service")).startswith(
            "unknown_service"
        ):
            own["service.name"] = service  # OTEL_SERVICE_NAME, if set, names it instead
        limits = setup.part(_LIMITS, SpanLimits, lambda: SpanLimits(**_DEFAULT_LIMITS))
        self._ids = _AttemptIds()

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

        self.provider: TracerProvider = setup.part(_SAMPLER, provider, lambda: provider(DEFAULT_ON))
        self.provider.add_span_processor(
            setup.part(
                _BATCH,
                lambda: BatchSpanProcessor(made),
                lambda: BatchSpanProcessor(made, **_DEFAULT_BATCH),
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


class _Off(Exception):
    """No exporter could be built: traces are off (the warning said why)."""


class _Part:
    """A part of the SDK's setup: the variables it reads (names, or prefixes ending in
    '_') and what runs when it cannot be built from them."""

    __slots__ = ("instead", "variables")

    def __init__(self, variables: tuple[str, ...], instead: str) -> None:
        self.variables = variables
        self.instead = instead


#: The SDK as a whole: importing it reads some variables (a span limit) and raises.
_SDK = _Part(("OTEL_",), "traces are off")
_EXPORTER = _Part(("OTEL_EXPORTER_OTLP_",), "traces are off")
_PROPAGATORS = _Part(("OTEL_PROPAGATORS",), "requests' context is read as tracecontext,baggage")
_RESOURCE = _Part(
    ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"),
    "spans name only the service and the replica",
)
_LIMITS = _Part(
    ("OTEL_SPAN_", "OTEL_ATTRIBUTE_", "OTEL_EVENT_", "OTEL_LINK_"),
    "spans have the default limits",
)
_SAMPLER = _Part(
    ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"),
    "every trace is sampled (parentbased_always_on)",
)
_BATCH = _Part(("OTEL_BSP_",), "the batch processor runs with its defaults")
#: The SDK's defaults, given explicitly: the SDK reads no variable for a value it is given.
_DEFAULT_LIMITS: dict[str, Any] = {
    "max_attributes": 128,
    "max_events": 128,
    "max_links": 128,
    "max_span_attributes": 128,
    "max_event_attributes": 128,
    "max_link_attributes": 128,
    "max_attribute_length": -1,  # SpanLimits.UNSET: no limit
    "max_span_attribute_length": -1,
}
_DEFAULT_BATCH: dict[str, Any] = {
    "max_queue_size": 2048,
    "schedule_delay_millis": 5000,
    "max_export_batch_size": 512,
    "export_timeout_millis": 30000,
}


class _Heard(logging.Handler):
    """What the SDK logs (warnings and errors, some with a traceback) while a part is built:
    its reasons, said again in our one warning."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.said.append(record.getMessage())
        except Exception:  # a message the SDK formats badly: still a problem to report
            self.said.append(str(record.msg))


class _Setup:
    """Builds the SDK's parts from `OTEL_*` variables so that none can stop a replica: a
    part the SDK refuses to build (it raises) runs with its defaults instead, and a value
    the SDK complains of (it logs, some with a traceback) and replaces itself is reported
    too; either way one WARNING line that names the variables and says what runs instead.
    Caught where each part is built, whatever the value: never a list of bad inputs."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        #: The part being built: only its handler hears the SDK (parts nest in `_SDK`).
        self._heard: _Heard | None = None

    def part(self, part: _Part, build: Callable[[], T], fallback: Callable[[], T]) -> T:
        heard, outer = _Heard(), self._heard
        sdk = logging.getLogger("opentelemetry")
        propagates = sdk.propagate
        if outer is not None:
            sdk.removeHandler(outer)
        sdk.addHandler(heard)
        self._heard = heard
        sdk.propagate = False
        failed = False
        try:
            try:
                return build()
            except (_Off, ImportError):  # said already / said by the caller
                raise
            except Exception as exc:
                failed = True
                heard.said.append(str(exc) or type(exc).__name__)
                return fallback()
        finally:
            sdk.removeHandler(heard)
            sdk.propagate = propagates
            self._heard = outer
            if outer is not None:
                sdk.addHandler(outer)
            if heard.said:
                self._warn(part, heard.said, failed)

    def _warn(self, part: _Part, said: list[str], failed: bool) -> None:
        given = sorted(
            name
            for name in self.environ
            if any(name == v or (v.endswith("_") and name.startswith(v)) for v in part.variables)
        )
        reasons = self._scrubbed("; ".join(dict.fromkeys(s.strip().rstrip(".") for s in said)))
        named = [name for name in given if name in reasons] or given or list(part.variables)
        logger.warning(
            "%s: %s; %s",
            ", ".join(named),
            reasons[:500],
            part.instead if failed else "the SDK uses its default for what it could not read",
        )

    def _scrubbed(self, text: str) -> str:
        """Header values (credentials, often) never reach a log: a reason that quotes any
        part of one is not shown."""
        for name, value in self.environ.items():
            quoted = any(p.strip() in text for p in (value, *value.split(",")) if p.strip())
            if name.startswith("OTEL_") and name.endswith("_HEADERS") and quoted:
                return "a value it could not read (not shown: headers may hold credentials)"
        return text


def _exporter(kind: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if kind == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def _configured_propagator() -> TextMapPropagator:
    """What `OTEL_PROPAGATORS` names (the API reads it when `propagate` is first imported,
    and raises for one that is not installed)."""
    from opentelemetry import propagate

    return propagate.get_global_textmap()


def _default_propagator() -> TextMapPropagator:
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])


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
            if name in _TRACE_CONTEXT_KEYS
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
            status = answer.status or 500
            span.set_attribute("http.response.status_code", status)
            if status >= 500:
                span.set_status(trace.Status(trace.StatusCode.ERROR))
            span.end()
            tracing._context.detach(token)
