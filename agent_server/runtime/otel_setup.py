"""Builds OpenTelemetry's SDK from the `OTEL_*` variables so that none can stop a replica:
each part (the SDK itself, exporter, propagators, resource, span limits, sampler, batch
processor) is built through `Setup`, which turns what the SDK raises or logs while building
it into one warning naming the variable, and runs that part with its defaults."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from opentelemetry.propagators.textmap import TextMapPropagator
    from opentelemetry.sdk.trace.export import SpanExporter

logger = logging.getLogger("agent_server.tracing")

T = TypeVar("T")


class Off(Exception):
    """No exporter could be built: traces are off (the warning said why)."""


class Part:
    """A part of the SDK's setup: the variables it reads (names, or prefixes ending in
    '_') and what runs when it cannot be built from them."""

    __slots__ = ("instead", "variables")

    def __init__(self, variables: tuple[str, ...], instead: str) -> None:
        self.variables = variables
        self.instead = instead


#: The SDK as a whole: importing it reads some variables (a span limit) and raises.
SDK = Part(("OTEL_",), "traces are off")
EXPORTER = Part(("OTEL_EXPORTER_OTLP_",), "traces are off")
PROPAGATORS = Part(("OTEL_PROPAGATORS",), "requests' context is read as tracecontext,baggage")
RESOURCE = Part(
    ("OTEL_RESOURCE_ATTRIBUTES", "OTEL_SERVICE_NAME", "OTEL_EXPERIMENTAL_RESOURCE_DETECTORS"),
    "spans name only the service and the replica",
)
LIMITS = Part(
    ("OTEL_SPAN_", "OTEL_ATTRIBUTE_", "OTEL_EVENT_", "OTEL_LINK_"),
    "spans have the default limits",
)
SAMPLER = Part(
    ("OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG"),
    "every trace is sampled (parentbased_always_on)",
)
BATCH = Part(("OTEL_BSP_",), "the batch processor runs with its defaults")
#: The SDK's defaults, given explicitly: the SDK reads no variable for a value it is given.
DEFAULT_LIMITS: dict[str, Any] = {
    "max_attributes": 128,
    "max_events": 128,
    "max_links": 128,
    "max_span_attributes": 128,
    "max_event_attributes": 128,
    "max_link_attributes": 128,
    "max_attribute_length": -1,  # SpanLimits.UNSET: no limit
    "max_span_attribute_length": -1,
}
DEFAULT_BATCH: dict[str, Any] = {
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


class Setup:
    """Builds the SDK's parts from `OTEL_*` variables so that none can stop a replica: a
    part the SDK refuses to build (it raises) runs with its defaults instead, and a value
    the SDK complains of (it logs, some with a traceback) and replaces itself is reported
    too; either way one WARNING line that names the variables and says what runs instead.
    Caught where each part is built, whatever the value: never a list of bad inputs."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        #: The part being built: only its handler hears the SDK (parts nest in `SDK`).
        self._heard: _Heard | None = None

    def part(self, part: Part, build: Callable[[], T], fallback: Callable[[], T]) -> T:
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
            except (Off, ImportError):  # said already / said by the caller
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

    def _warn(self, part: Part, said: list[str], failed: bool) -> None:
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


def span_exporter(kind: str) -> SpanExporter:
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter

    if kind == "console":
        return ConsoleSpanExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def configured_propagator() -> TextMapPropagator:
    """What `OTEL_PROPAGATORS` names (the API reads it when `propagate` is first imported,
    and raises for one that is not installed)."""
    from opentelemetry import propagate

    return propagate.get_global_textmap()


def default_propagator() -> TextMapPropagator:
    from opentelemetry.baggage.propagation import W3CBaggagePropagator
    from opentelemetry.propagators.composite import CompositePropagator
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
